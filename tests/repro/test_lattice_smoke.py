"""Smoke run of ``seqmem repro lattice`` end to end (tiny models, a few steps): files, tables, sane numbers."""

from __future__ import annotations

import argparse
import json

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
