"""`seqmem demo`: option scaling, argument checks, and (slow) the attention target at the default size."""

from __future__ import annotations

import subprocess
import sys

import pytest

from seqmem.demo import SCALED_OPTIONS, DemoConfig, demo_options, train_one


def test_elastic_memory_scaled_with_block():
    # the paper's N/L = 540/2048 is kept: block 8 of a 32-token demo, 8 HiPPO coefficients
    assert demo_options("elastic", 32) == {"block_len": 8, "hippo_n": 8}
    assert demo_options("memorizing", 32) == {"block_len": 8, "n_queue": 16}
    assert set(SCALED_OPTIONS) >= {"window", "block_len", "n_queue", "hippo_n"}


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


def test_longest_first_orders_by_measured_step_time(monkeypatch):
    import seqmem.demo as demo

    cfg = DemoConfig(d_model=16, n_layers=1, batch_size=2)
    # real measurements: a permutation of the input
    assert sorted(demo.longest_first(["attention", "deltanet", "swa"], cfg)) == ["attention", "deltanet", "swa"]
    fake = {"a": 0.1, "b": 0.3, "c": 0.2}
    monkeypatch.setattr(demo, "step_seconds", lambda name, cfg: fake[name])
    assert demo.longest_first(["a", "b", "c"], cfg) == ["b", "c", "a"]
    # a mixer whose probe fails is started first (its worker reports the error in the table)
    assert demo.longest_first(["a", "broken", "b"], cfg) == ["broken", "b", "a"]
