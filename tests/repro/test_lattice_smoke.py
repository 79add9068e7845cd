"""Smoke run of ``seqmem repro lattice`` end to end (tiny models, a few steps): files, tables, sane numbers."""

from __future__ import annotations

import argparse
import json

import pytest

from seqmem.repro import lattice


def test_repro_lattice_smoke(tmp_path):
    args = argparse.Namespace(scale="smoke", out=tmp_path, seed=0, experiments="speed,lm,ablation", steps=None,
                              corpus="code")  # fmt: skip
    assert lattice.run(args) == 0
    for name in ("speed", "memory", "lm", "ablation"):
        assert (tmp_path / f"{name}.md").exists() and (tmp_path / f"{name}.json").exists()
    assert (tmp_path / "lm_bpb_vs_position.png").stat().st_size > 1000
    lm = json.loads((tmp_path / "lm.json").read_text())
    assert {r["model"] for r in lm["rows"]} == set(lattice.MODELS)
    for r in lm["rows"]:
        assert 0 < r["ours_val_bpb"] < 9  # bytes: untrained ≈ 8 bits
        assert r["paper_pile2k_ppl"] > 10  # the paper's number is kept beside ours
    speed = json.loads((tmp_path / "speed.json").read_text())["rows"]
    assert speed[0]["impl"].startswith("plain loop") and all(r["tokens_per_s"] > 0 for r in speed)
    mem = {r["mode"]: r["saved_MB_per_layer"] for r in json.loads((tmp_path / "memory.json").read_text())["rows"]}
    assert mem["scan"] < 0.2 * mem["recurrent"]


def test_repro_lattice_context_smoke(tmp_path):
    """The context-length sweep: three rows at two lengths x two seeds, mean ± std tables, plot."""
    rows = ["Transformer++", "Gated-DeltaNet", "Lattice-ENC"]
    args = argparse.Namespace(scale="smoke", out=tmp_path, seed=0, experiments="context", steps=1, corpus=None,
                              contexts="32,64", seeds=2, models=",".join(rows))  # fmt: skip
    assert lattice.run(args) == 0
    ctx = json.loads((tmp_path / "context.json").read_text())
    assert ctx["lengths"] == [32, 64] and ctx["seeds"] == [0, 1]
    assert len(ctx["runs"]) == 2 * 2 * len(rows)
    assert [r["model"] for r in ctx["rows"]] == rows + ["byte bigram (reference)"]
    ref = ctx["bigram_reference"]
    assert set(ref) == {"32", "64"} and all(3 < v["bigram_bpb"] < 8 for v in ref.values())
    assert [r["model"] for r in ctx["relative_rows"]] == rows
    # the same number of training bytes at every context length
    assert {r["T"]: r["train_bytes"] for r in ctx["runs"]} == {32: 128, 64: 128}
    # near-equal parameter counts per row (GDN's output gate: +8 %), reported
    params = [r["params"] for r in ctx["rows"][:-1]]
    assert max(params) < 1.1 * min(params)
    for r in ctx["rows"][:-1]:
        assert " ± " in r["ours_bpb_T32"] and len(r["_bpb_T64"]) == 2
        assert all(0 < v < 9 for v in r["_bpb_T32"] + r["_bpb_T64"])
        assert r["paper_books_ppl_512/1k/2k/4k/8k/16k"].startswith(f"{lattice.PAPER_BOOKS[r['model']][0]:.2f}")
    enc = next(r for r in ctx["runs"] if r["model"] == "Lattice-ENC")
    assert enc["options"] == {"v_norm": True}
    md = (tmp_path / "context.md").read_text()
    assert "Last position bucket" in md and "Rank by overall val bpb" in md
    assert (tmp_path / "context_bpb_vs_context.png").stat().st_size > 1000
    # the paper's number is never in an "ours" column
    assert "19.06" not in json.dumps([{k: v for k, v in r.items() if k.startswith("ours")} for r in ctx["rows"]])


def test_repro_lattice_context_bad_arguments(tmp_path):
    base = dict(scale="smoke", out=tmp_path, seed=0, experiments="context", steps=1, corpus=None, seeds=1,
                models=None)  # fmt: skip
    for contexts in ("48", "0", "a,b"):
        with pytest.raises(ValueError, match="context"):
            lattice.run(argparse.Namespace(**base, contexts=contexts))
    with pytest.raises(ValueError, match="seeds"):
        lattice.run(argparse.Namespace(**(base | {"seeds": 0}), contexts="32"))
    with pytest.raises(ValueError, match="Lattice-DEC"):
        lattice.run(argparse.Namespace(**(base | {"models": "Lattice-XYZ"}), contexts="32"))
