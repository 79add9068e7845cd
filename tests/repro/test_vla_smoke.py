"""`seqmem repro vla --scale smoke` end to end (tiny budgets), and the copy task's layout."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from seqmem.repro import vla as repro_vla
from seqmem.tasks.copy_half import CopyHalfTask


def test_repro_vla_smoke(tmp_path):
    args = argparse.Namespace(scale="smoke", out=tmp_path, seed=0, lr_sweep=None, threads=1,
                              experiments=",".join(repro_vla.EXPERIMENTS), models=",".join(repro_vla.MODELS))
    assert repro_vla.run(args) == 0
    for name in ("stability", "jacobian", "latency", "copy", "mqar_capacity", "long_context", "ood"):
        md = (tmp_path / f"{name}.md").read_text()
        assert "paper" in md and "ours" in md and "scale" in md.lower(), name
        rows = json.loads((tmp_path / f"{name}.json").read_text())["rows"]
        assert rows, name
    for png in ("stability.png", "latency.png", "mqar_capacity.png"):
        assert (tmp_path / png).stat().st_size > 1000
    stab = {r["quantity"]: r["ours"] for r in json.loads((tmp_path / "stability.json").read_text())["rows"]}
    assert stab["ratio linear / VLA"] > 1  # VLA's state is smaller than linear attention's
    jac = json.loads((tmp_path / "jacobian.json").read_text())["rows"]
    assert all(r["ours max ‖J‖₂"] > 1.0 and r["ours max |spectral radius − 1|"] < 1e-9 for r in jac)
    cap = json.loads((tmp_path / "mqar_capacity.json").read_text())["rows"]
    assert {r["model"] for r in cap} == set(repro_vla.MODELS)
    assert all(0.0 <= r["ours"] <= 1.0 for r in cap)
    runs = json.loads((tmp_path / "runs.json").read_text())["runs"]
    assert all(r["steps"] == 3 for r in runs)
    ood = json.loads((tmp_path / "ood.json").read_text())["rows"]
    assert all(r["ours OOD"] is not None for r in ood)
    # Table 7's DeltaNet is the paper's eq. 4 (deltanet_paper): canonical deltanet has no paper value
    copy = {r["model"]: r for r in json.loads((tmp_path / "copy.json").read_text())["rows"]}
    assert copy["deltanet"]["paper final acc"] is None and copy["deltanet_paper"]["paper final acc"] == 1.0


def test_repro_vla_rejects_unknown_experiment(tmp_path):
    args = argparse.Namespace(scale="smoke", out=tmp_path, seed=0, experiments="nope", models="vla",
                              lr_sweep=None, threads=1)
    with pytest.raises(ValueError, match="unknown experiment"):
        repro_vla.run(args)


def test_copy_task_layout():
    task = CopyHalfTask(vocab_size=20, seq_len=12)
    x, y = task.sample(4, torch.Generator().manual_seed(0))
    m = 5
    assert x.shape == y.shape == (4, 12)
    assert (x[:, m] == 19).all() and (x[:, :m] < 19).all()
    assert torch.equal(x[:, m + 1 : 2 * m + 1], x[:, :m])
    assert torch.equal(y[:, m : 2 * m], x[:, :m])  # SEP predicts c_1, ..., copy of c_{m-1} predicts c_m
    assert (y[:, :m] == -100).all() and (y[:, 2 * m :] == -100).all()
    xe, _ = task.eval_data(3)
    assert torch.equal(xe, task.eval_data(3)[0])
    with pytest.raises(ValueError):
        CopyHalfTask(vocab_size=2)


def test_copy_half_identity_targets():
    """``targets="identity"``: the copied half is scored against its own input tokens (the other reading of the
    paper's Table 7); the default config is unchanged, so runs recorded before the option keep their identity."""
    m = 5
    ident = CopyHalfTask(vocab_size=20, seq_len=12, targets="identity")
    x, y = ident.sample(4, torch.Generator().manual_seed(0))
    nxt_x, nxt_y = CopyHalfTask(vocab_size=20, seq_len=12).sample(4, torch.Generator().manual_seed(0))
    assert torch.equal(x, nxt_x)  # same inputs, only the scored targets differ
    assert torch.equal(y[:, m + 1 : 2 * m + 1], x[:, m + 1 : 2 * m + 1])
    assert (y[:, : m + 1] == -100).all() and (y[:, 2 * m + 1 :] == -100).all()
    assert int((y != -100).sum()) == int((nxt_y != -100).sum()) == 4 * m
    assert ident.config()["targets"] == "identity" and "targets" not in CopyHalfTask().config()
    with pytest.raises(ValueError, match="targets"):
        CopyHalfTask(targets="self")
