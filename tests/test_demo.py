"""`seqmem demo` (a preset of the sweep runner): option scaling, argument checks, resumption, and (slow) the
attention target at the default size."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from seqmem.demo import DemoConfig, demo_options, demo_spec, train_one
from seqmem.sweep import LENGTH_RULE, load_spec


def test_elastic_memory_scaled_with_block():
    # the paper's N/L = 540/2048 is kept: block 8 of a 32-token demo, 8 HiPPO coefficients
    assert demo_options("elastic", 32) == {"block_len": 8, "hippo_n": 8}
    assert demo_options("memorizing", 32) == {"block_len": 8, "n_queue": 16}
    assert set(LENGTH_RULE) == {"window", "block", "memory", "queue", "chunk"}


def test_ska_sees_its_context_in_the_demo():
    # SKA is chunk-causal: with its default 64-token chunk every query of a 32-token demo saw no context at all
    assert demo_options("ska", 32) == {"chunk_size": 4}
    spec = load_spec(demo_spec(DemoConfig(), ["ska", "vort"]))
    opts = {p.mixer: p.run_spec["model"]["mixer_options"] for p in spec.points()}
    assert opts == {"ska": {"chunk_size": 4}, "vort": {"local_window": 8}}


@pytest.mark.parametrize(
    "extra",
    [["--vocab-size", "0"], ["--batch-size", "-1"], ["--lr", "0"], ["--vocab-size", "6", "--num-pairs", "4"]],
)
def test_demo_bad_sizes_exit_2(extra, tmp_path):
    argv = ["demo", "--mixers", "attention", "--steps", "1", "--out", str(tmp_path / "d"), *extra]
    p = subprocess.run([sys.executable, "-m", "seqmem", *argv], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert len([line for line in p.stderr.splitlines() if line.strip()]) == 1
    assert not (tmp_path / "d").exists()


@pytest.mark.slow
def test_default_demo_size_attention_reaches_099():
    """The README promise: at the default demo size attention reaches >= 0.99 per-query accuracy."""
    row = train_one("attention", DemoConfig())
    assert row["error"] is None
    assert row["accuracy"] >= 0.99, row


def test_peak_state_counts_the_partial_block():
    from seqmem.demo import peak_state
    from seqmem.models import LanguageModel, LMConfig

    m = LanguageModel(LMConfig(vocab_size=16, d_model=16, n_layers=1, n_heads=2, mixer="block_attention",
                               mixer_options={"block_len": 8}))
    # after 8 tokens the block buffer is empty; after 7 it holds 7 keys and 7 values of width 16 (+ a counter)
    assert m.state_size(8) == 1
    assert peak_state(m, 8) == 2 * 16 * 7 + 1


def test_melodi_summary_tokens_scaled_like_elastic_memory():
    # Melodi's summary tokens and Elastic's HiPPO coefficients are both "memory tokens": equal at the demo size
    assert demo_options("melodi", 32) == {"block_len": 8, "n_summary": 8}
    assert demo_options("melodi", 32)["n_summary"] == demo_options("elastic", 32)["hippo_n"]


def test_runner_starts_the_slowest_runs_first_within_a_slice(monkeypatch):
    import seqmem.sweep.runner as runner

    spec = load_spec(demo_spec(DemoConfig(d_model=16, steps=2, batch_size=2), ["attention", "deltanet", "swa"]))
    fake = {"attention": 0.1, "deltanet": 0.3, "swa": 0.2}
    monkeypatch.setattr(runner, "estimate_costs", lambda pts, log=None, **kw: {p: fake[p.mixer] for p in pts})
    lines: list[str] = []
    runner.run_sweep(spec, Path("/nonexistent-dry-run"), dry_run=True, log=lines.append)
    order = [line.split("/")[1] for line in lines if "would run" in line]
    assert order == ["deltanet", "swa", "attention"]


def test_demo_reuses_finished_runs(tmp_path):
    cfg = DemoConfig(d_model=16, steps=3, batch_size=4, eval_examples=16)
    from seqmem.demo import run_demo

    first: list[str] = []
    rows = run_demo(cfg, ["attention"], tmp_path, log=first.append)
    assert rows[0]["error"] is None and (tmp_path / "results.md").exists() and (tmp_path / "report.md").exists()
    again: list[str] = []
    rows2 = run_demo(cfg, ["attention"], tmp_path, log=again.append)
    assert any("1 finished, 0 to run" in line for line in again)
    assert rows2[0]["accuracy"] == rows[0]["accuracy"]
