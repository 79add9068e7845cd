"""`seqmem repro vort --scale smoke` end to end (tiny budgets), and the task generators' layouts."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from seqmem.repro import vort as repro_vort
from seqmem.tasks.vort_tasks import EntityLabelCopy, ZipfLagRetrieval, lag_bin


def test_repro_vort_smoke(tmp_path):
    args = argparse.Namespace(scale="smoke", out=tmp_path, seed=0, experiments="kernel,table1,table2", threads=1)
    assert repro_vort.run(args) == 0
    for name in ("kernel_soe_error", "table1_zipf", "table2_entity", "table1_zipf_lambda_sweep"):
        md = (tmp_path / f"{name}.md").read_text()
        assert "ours" in md and "Scale" in md, name
        assert json.loads((tmp_path / f"{name}.json").read_text())["rows"], name
    t1 = json.loads((tmp_path / "table1_zipf.json").read_text())["rows"]
    assert t1[0]["paper long"] == 79.4 and 0 <= t1[0]["ours long"] <= 100
    kern = json.loads((tmp_path / "kernel_soe_error.json").read_text())["rows"]
    s15 = next(r for r in kern if r["S"] == 15)
    assert s15["ours corrected"] < 1e-3 < 4e-3  # Fig. 4b is reproduced exactly (no training)
    for png in ("kernel.png", "table1_zipf.png", "table2_entity.png"):
        assert (tmp_path / png).stat().st_size > 1000


def test_repro_vort_rejects_unknown_experiment(tmp_path):
    args = argparse.Namespace(scale="smoke", out=tmp_path, seed=0, experiments="table9", threads=1)
    with pytest.raises(ValueError):
        repro_vort.run(args)


def test_zipf_generator_layout():
    task = ZipfLagRetrieval(seq_len=500, beta=1.0, n_queries=40, n_keys=1000)
    b = task.sample(3, torch.Generator().manual_seed(0))
    for i in range(3):
        q = (b["target"][i] >= 0).nonzero()[:, 0]
        assert len(q) == 40
        for t in q.tolist():
            a = t - int(b["lag"][i, t])
            assert 0 <= a < t
            assert b["mem_key"][i, a] == b["query_key"][i, t] and b["mem_label"][i, a] == b["target"][i, t]
        keys = b["mem_key"][i][b["mem_key"][i] >= 0]
        assert len(keys.unique()) == len(keys)  # unique anchors
        assert ((b["filler"][i] >= 0) == ((b["mem_key"][i] < 0) & (b["query_key"][i] < 0))).all()
    # β = 1 has mass at long lags; β = 2 almost none
    lags1 = ZipfLagRetrieval(2000, 1.0, 200).sample(4, torch.Generator().manual_seed(1))["lag"]
    lags2 = ZipfLagRetrieval(2000, 2.0, 200).sample(4, torch.Generator().manual_seed(1))["lag"]
    assert (lags1 > 200).float().sum() > 5 * (lags2 > 200).float().sum()
    with pytest.raises(ValueError):
        ZipfLagRetrieval(seq_len=10, n_queries=8)


def test_entity_generator_layout_and_bins():
    task = EntityLabelCopy(seq_len=400, n_entities=5, mentions=6, n_names=50)
    b = task.sample(2, torch.Generator().manual_seed(0))
    assert int((b["target"] >= 0).sum()) == 2 * 5 * 5
    assert int((b["mem_label"] >= 0).sum()) == 2 * 5
    for i in range(2):
        for t in (b["target"][i] >= 0).nonzero()[:, 0].tolist():
            first = t - int(b["lag"][i, t])
            assert b["mem_key"][i, first] == b["query_key"][i, t] and b["mem_label"][i, first] == b["target"][i, t]
    assert torch.equal(task.eval_data(2, 5)["lag"], task.eval_data(2, 5)["lag"])
    lag = torch.tensor([-1, 0, 5, 6, 50, 51])
    assert lag_bin(lag, (5, 50)).tolist() == [-1, 0, 0, 1, 1, 2]
    with pytest.raises(ValueError):
        EntityLabelCopy(seq_len=10, n_entities=5, mentions=5)


def test_repro_vort_table3_smoke(tmp_path):
    args = argparse.Namespace(scale="smoke", out=tmp_path, seed=0, experiments="table3", threads=1)
    assert repro_vort.run(args) == 0
    rows = json.loads((tmp_path / "table3_lm.json").read_text())["rows"]
    assert len(rows) == 4 and all(0 < r["ours bpb (all)"] < 9 for r in rows)
    assert "paper" in (tmp_path / "table3_lm.md").read_text()


def test_train_eval_on_the_shared_trainer_matches_a_plain_loop():
    """train_eval runs seqmem.train.train; it must give the weights of the plain loop it replaced (AdamW, no weight
    decay, linear warm-up over steps // 10 then constant, clip 1, data seeded seed + 17)."""
    import torch.nn.functional as F

    cfg = dict(repro_vort.CONFIGS["smoke"], steps=12)
    task = ZipfLagRetrieval(seq_len=128, beta=1.0, n_queries=8)
    val, test = task.eval_data(2, seed=1), task.eval_data(2, seed=2)
    label, mixer, opts = repro_vort.model_specs(cfg, task.seq_len)[1]  # Exp

    def model():
        torch.manual_seed(0)
        o = dict(opts)
        sharp = o.pop("sharpness")
        return repro_vort.RetrievalModel(mixer, task.n_keys, task.n_labels, task.n_filler, cfg["d"],
                                         sharpness=sharp, **o)

    ref = model()
    opt = torch.optim.AdamW(ref.parameters(), lr=cfg["lr"], weight_decay=0.0)
    g = torch.Generator().manual_seed(0 + 17)
    for step in range(cfg["steps"]):
        b = task.sample(cfg["batch"], g)
        logits = ref(b)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b["target"].reshape(-1), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        for pg in opt.param_groups:
            pg["lr"] = cfg["lr"] * min(1.0, (step + 1) / max(1, cfg["steps"] // 10))
        opt.step()
    ours = model()
    r = repro_vort.train_eval(task, ours, cfg, 0, val, test, (12.8, 128.0))
    for a, b in zip(ref.parameters(), ours.parameters()):
        assert torch.allclose(a, b, rtol=0, atol=1e-6)
    assert r["val"] == repro_vort.evaluate(ref, val, (12.8, 128.0))
    assert "diverged" not in r and r["final_train_loss"] > 0
