"""A sixth mechanism added the way README's "Adding a mixer" says, and nothing else: an op (a recurrent reference
and a chunked form), and a registered mixer whose ``facts`` carry its state-growth promise, numerics bounds and
gradcheck case.  The generic tests pick it up from the registry without being edited: the contract tests
(``tests/test_contract.py``), the numerics tests (``tests/test_numerics.py``) and the gradcheck
(``tests/ops/test_gradcheck_all.py``).  The toy is registered only while these tests run.

The toy: a per-channel exponential moving average ``h_t = a h_{t-1} + (1 − a) x_t`` with a learned decay
``a = σ(θ)``, between an input and an output projection.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from seqmem import Mixer, list_mixers, register
from seqmem.registry import mixer_facts, unregister

NAME = "toy_ema"


# ---------------------------------------------------------------------------------- 1. the op: naive and chunk
def toy_ema_naive(x: Tensor, a: Tensor, h0: Tensor | None = None) -> tuple[Tensor, dict[str, Tensor]]:
    """x (B, T, D), a (D,) in (0, 1): the recurrence, one token at a time."""
    h = torch.zeros_like(x[:, 0]) if h0 is None else h0
    ys = []
    for xt in x.unbind(1):
        h = a * h + (1 - a) * xt  # 1. h_t = a h_{t-1} + (1 − a) x_t
        ys.append(h)
    return torch.stack(ys, 1), {"h": h}


def toy_ema_chunk(x: Tensor, a: Tensor, h0: Tensor | None = None, chunk_size: int = 4):
    """The same in chunks: ``h_t = a^{t+1} h_0 + Σ_{s≤t} a^{t−s} (1 − a) x_s`` inside each chunk."""
    h = torch.zeros_like(x[:, 0]) if h0 is None else h0
    log_a = torch.log(a)
    ys = []
    for xc in x.split(chunk_size, 1):
        c = xc.shape[1]
        idx = torch.arange(c, device=x.device)
        diff = (idx[:, None] - idx[None, :]).to(x.dtype)  # t − s
        decay = torch.exp(diff[..., None] * log_a).masked_fill((diff < 0)[..., None], 0.0)  # (c, c, D)
        y = torch.einsum("tsd,bsd->btd", decay, (1 - a) * xc) + torch.exp((idx[:, None] + 1) * log_a) * h[:, None]
        h = y[:, -1]
        ys.append(y)
    return torch.cat(ys, 1), {"h": h}


def toy_ema(x: Tensor, a: Tensor, h0: Tensor | None = None, mode: str = "chunk", chunk_size: int = 4):
    return toy_ema_naive(x, a, h0) if mode == "recurrent" else toy_ema_chunk(x, a, h0, chunk_size)


def _gradcheck_case(mode: str):
    def make():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(1, 5, 3, generator=g, dtype=torch.float64)
        a = torch.rand(3, generator=g, dtype=torch.float64) * 0.8 + 0.1
        h0 = torch.randn(1, 3, generator=g, dtype=torch.float64)
        return (lambda x, a, h0: toy_ema(x, a, h0, mode=mode, chunk_size=2)), (x, a, h0)

    return make


# ------------------------------------------------------------------------------- 2. the mixer, with its facts
class ToyEMA(Mixer):
    """Toy mechanism: a per-channel exponential moving average between two projections."""

    contract_configs = [{"chunk_size": 4}]

    def __init__(self, d_model: int, n_heads: int = 4, impl: str = "fast", chunk_size: int = 8) -> None:
        super().__init__(d_model, n_heads, impl)
        self.chunk_size = chunk_size
        self.in_proj = nn.Linear(d_model, d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)
        self.theta = nn.Parameter(torch.linspace(-1.0, 2.0, d_model))

    def _forward(self, x: Tensor, state):
        a = torch.sigmoid(self.theta)
        mode = "recurrent" if self.impl == "reference" else "chunk"
        h, new_state = toy_ema(self.in_proj(x), a, None if state is None else state["h"], mode, self.chunk_size)
        return self.out_proj(h), new_state

    def state_size(self, seq_len: int) -> int:
        return self.d_model

    def state_keys(self) -> set[str]:
        return {"h"}


FACTS = dict(
    state_promise=("bounded", "a convex combination of past inputs (decay a < 1)"),
    numerics_smoke=(6e-7, 1.5e-2, 2e-3),  # measured 1.7e-7, 4.6e-3, 6.7e-4
    numerics_full=((6e-7, 6e-7), (1.5e-2, 1.5e-2), (2e-3, 2e-3)),  # not measured at 64k (the slow test)
    gradcheck={f"toy_ema/{m}": _gradcheck_case(m) for m in ("recurrent", "chunk")},
)


def _load(rel: str, modname: str):
    spec = importlib.util.spec_from_file_location(modname, Path(__file__).parent / rel)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def toy():
    register(NAME, facts=FACTS)(ToyEMA)
    try:
        yield NAME
    finally:
        unregister(NAME)


def test_registered_with_its_facts(toy):
    assert toy in list_mixers()
    assert mixer_facts(toy)["state_promise"][0] == "bounded"


def test_naive_equals_chunk():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 11, 5, generator=g, dtype=torch.float64)
    a = torch.rand(5, generator=g, dtype=torch.float64) * 0.9 + 0.05
    y1, s1 = toy_ema(x, a, mode="recurrent")
    y2, s2 = toy_ema(x, a, mode="chunk", chunk_size=3)
    torch.testing.assert_close(y2, y1, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s2["h"], s1["h"], rtol=1e-12, atol=1e-12)


def test_contract_picks_it_up(toy):
    tc = _load("test_contract.py", "_toy_test_contract")
    for cfg in ToyEMA.contract_configs:
        for dtype in (torch.float64, torch.float32):
            tc.test_causality(toy, cfg, dtype)
            tc.test_token_by_token_decoding(toy, cfg, dtype)
            tc.test_reference_equals_fast(toy, cfg, dtype)
            for impl in ("fast", "reference"):
                tc.test_streaming_splits(toy, cfg, impl, dtype)
        tc.test_state_size_and_portability(toy, cfg)
        tc.test_batch_independence_and_t1(toy, cfg)
        tc.test_bad_input_raises(toy, cfg)


def test_numerics_picks_it_up(toy):
    tn = _load("test_numerics.py", "_toy_test_numerics")
    tn.test_facts_cover_every_mixer(toy)
    tn.test_low_precision_smoke(toy)


def test_gradcheck_picks_it_up(toy):
    tg = _load("ops/test_gradcheck_all.py", "_toy_test_gradcheck_all")
    cases = [c for c in tg.fact_cases() if c[1].startswith(f"{toy}:")]
    assert {cid for _, cid, _ in cases} == {f"{toy}:toy_ema/recurrent", f"{toy}:toy_ema/chunk"}
    for op, cid, make in cases:
        tg._check(op, cid, make, fast=True)
