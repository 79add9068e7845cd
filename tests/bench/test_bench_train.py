"""`seqmem bench train`: one training step's cost per mixer (measured, not asserted)."""

from __future__ import annotations

import json

from seqmem.bench.train import markdown, train_step_seconds
from seqmem.cli import main


def test_train_step_record_and_table():
    r = train_step_seconds("swa", d_model=16, n_layers=1, n_heads=2, vocab=8, seq_len=8, batch=2, repeats=1,
                           warmup=0)
    assert r["seconds_per_step"] > 0 and r["tokens_per_s"] == 16 / r["seconds_per_step"]
    assert r["options"] == {"window": 2}  # the sweep's length rule at T = 8
    assert "| `swa` |" in markdown([r])


def test_cli_writes_json(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["bench", "train", "--mixers", "attention", "--d-model", "16", "--seq-len", "8", "--batch-size",
                 "2", "--repeats", "1", "--warmup", "0", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert [r["mixer"] for r in rows] == ["attention"]
    printed = capsys.readouterr().out
    # which code ran when, under what load (the payload and the header's "Run:" line)
    assert data["bench"] == "train" and data["end"]["date"] >= data["machine"]["date"]
    assert {"commit", "dirty", "seqmem", "omp_num_threads", "load_1min"} <= set(data["machine"])
    assert f"Run: seqmem {data['machine']['seqmem']}, " in printed and "load average (1 min)" in printed
    assert "tokens / s" in printed
    # the Command line repeats the run: real options only (not the raw argv the CLI keeps for records)
    assert "Command: `seqmem bench train --mixers attention" in printed and "--argv" not in printed
    assert main(["bench", "train", "--mixers", "nope"]) == 2


def test_scored_fraction_is_recorded_and_checked(tmp_path, capsys):
    import pytest

    r = train_step_seconds("attention", d_model=16, n_layers=1, n_heads=2, vocab=8, seq_len=16, batch=2, repeats=1,
                           warmup=0, scored=0.1)
    assert r["scored"] == 0.1 and r["full_head"] is False and r["seconds_per_step"] > 0
    with pytest.raises(ValueError, match="scored"):
        train_step_seconds("attention", scored=0.0)
    out = tmp_path / "t.json"
    assert main(["bench", "train", "--mixers", "attention", "--d-model", "16", "--seq-len", "8", "--batch-size",
                 "2", "--repeats", "1", "--warmup", "0", "--scored", "0.25", "--full-head", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["rows"][0]["full_head"] is True
    assert "0.25 of the positions scored, logits at every position" in capsys.readouterr().out
    assert main(["bench", "train", "--mixers", "attention", "--scored", "1.5"]) == 2
    assert "--scored must be a fraction" in capsys.readouterr().err


def test_compiled_twin_is_timed_and_tabulated(tmp_path):
    """--compile: each mixer's step is also timed through torch.compile, its one-off compile apart; the table adds
    the compiled ms / step, the ratio to eager and the compile time."""
    out = tmp_path / "t.json"
    assert main(["bench", "train", "--mixers", "attention", "--d-model", "16", "--layers", "1", "--seq-len", "8",
                 "--batch-size", "2", "--repeats", "2", "--warmup", "1", "--compile", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    twin = row["compiled_twin"]
    assert twin["seconds_per_step"] > 0 and twin["compile_seconds"] > twin["seconds_per_step"]
    table = markdown([row])
    assert "compiled / eager" in table and f"{twin['seconds_per_step'] / row['seconds_per_step']:.2f}" in table
    assert "compiled / eager" not in markdown([{k: v for k, v in row.items() if k != "compiled_twin"}])
