"""Hardening (issue #16): each case first reproduced the failure it guards against.

The per-case map of what is tested where is in docs/reliability.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from seqmem.cli import main

TRAIN = ["train", "--task", "mqar", "--mixer", "deltanet", "--layers", "1", "--d-model", "16", "--heads", "2",
         "--steps", "4", "--batch-size", "4", "--vocab", "32", "--num-pairs", "2", "--seq-len", "16",
         "--eval-examples", "8", "--no-progress", "--checkpoint-every", "2"]


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _fails_one_line(argv: list[str], capsys, match: str) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    text = capsys.readouterr().err
    err = [line for line in text.splitlines() if "error" in line.lower()]
    assert "Traceback" not in text and len(err) == 1, text
    assert err[0].startswith("seqmem: error:") and match in err[0], err
    return err[0]


def _final(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


# ------------------------------------------------------------------------------- 1. no lost or mixed runs
def test_rerun_into_existing_run_is_refused_unless_resume_or_overwrite(tmp_path, capsys):
    run = tmp_path / "run"
    assert main([*TRAIN, "--out", str(run)]) == 0
    before = _snapshot(run)
    # the same or another run into the directory: refused, nothing changes (it used to overwrite run.json,
    # truncate metrics.jsonl and keep the old checkpoints, so eval reported the old weights under the new config)
    _fails_one_line([*TRAIN, "--out", str(run)], capsys, "--overwrite")
    _fails_one_line([*TRAIN, "--seed", "1", "--steps", "6", "--out", str(run)], capsys, "--resume")
    _fails_one_line([*TRAIN, "--out", str(run), "--resume", "--overwrite"], capsys, "not both")
    # --overwrite with arguments that fail validation leaves the old run alone
    _fails_one_line([*TRAIN, "--mixer-option", "bogus=1", "--out", str(run), "--overwrite"], capsys, "bogus")
    assert _snapshot(run) == before

    assert main([*TRAIN, "--seed", "1", "--steps", "6", "--out", str(run), "--overwrite"]) == 0
    final = _final(capsys)
    spec = json.loads((run / "run.json").read_text())
    assert spec["train"]["seed"] == 1 and spec["train"]["steps"] == 6
    cks = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert cks == ["ckpt-00000004", "ckpt-00000006"]  # only the new run's checkpoints
    assert [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())][-1] == 6
    assert not [p for p in run.iterdir() if p.name.startswith(".")]  # no leftovers of the old run
    assert main(["eval", "--run", str(run), "--examples", "8"]) == 0
    ev = _final(capsys)
    assert ev["checkpoint"].endswith("ckpt-00000006") and ev["loss"] == pytest.approx(final["eval_loss"], rel=1e-6)


def test_library_train_refuses_to_mix_runs(tmp_path):
    from seqmem.models import LanguageModel, LMConfig
    from seqmem.tasks.mqar import MQARTask
    from seqmem.train import TrainConfig, train

    def setup():
        torch.manual_seed(0)
        task = MQARTask(vocab_size=32, num_pairs=2, seq_len=16)
        return LanguageModel(LMConfig(vocab_size=32, d_model=16, n_layers=1, n_heads=2, mixer="deltanet")), task

    cfg = TrainConfig(steps=2, batch_size=4, eval_examples=8, checkpoint_every=1)
    train(*setup(), cfg, out_dir=tmp_path)
    with pytest.raises(ValueError, match="already holds checkpoints"):
        train(*setup(), cfg, out_dir=tmp_path)


@pytest.mark.parametrize("bad", [["--mixer", "nope"], ["--mixer-option", "bogus=1"], ["--resume"],
                                 ["--task-option", "num_pairs=999"]])
def test_failed_run_leaves_no_directory_it_created(tmp_path, capsys, bad):
    out = tmp_path / "a" / "b" / "run"
    argv = [*TRAIN, "--out", str(out)]
    if bad[0] == "--mixer":
        argv[argv.index("deltanet")] = bad[1]
    else:
        argv += bad
    capsys.readouterr()
    assert main(argv) == 2
    assert list(tmp_path.iterdir()) == []


def test_failed_run_keeps_an_existing_directory(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert main([*TRAIN, "--mixer-option", "bogus=1", "--out", str(tmp_path)]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
