"""Fuzzed streaming contract (hypothesis): random lengths (incl. 1 and lengths no chunk size divides), split points,
batch sizes, head counts and dtypes, for every registered mixer.  A small example budget runs by default; set
SEQMEM_FUZZ_EXAMPLES (or run ``-m slow``) for a larger one."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import assert_rel_close
from seqmem import build_mixer, get_entry, list_mixers

TOL = {torch.float64: 1e-9, torch.float32: 2e-4}


def _fuzz(name: str, data, max_len: int) -> None:
    cfg = dict(get_entry(name).cls.contract_configs[0])
    d = cfg.pop("d_model", 16)
    base_heads = cfg.pop("n_heads", 2)
    heads = data.draw(st.sampled_from(sorted({base_heads, 1})), label="heads")
    dtype = data.draw(st.sampled_from([torch.float64, torch.float32]), label="dtype")
    b = data.draw(st.integers(1, 3), label="batch")
    t = data.draw(st.integers(1, max_len), label="T")
    try:
        torch.manual_seed(0)
        m = build_mixer(name, d, n_heads=heads, **cfg).to(dtype)
    except ValueError:  # this head count is not valid for the mixer: that is a clear error, which is fine
        return
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    x = torch.randn(b, t, d, dtype=dtype)
    y, _ = m(x)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, t - 1)), max_size=4), label="cuts")) - {t})
    ys, state, i = [], None, 0
    for c in [*cuts, t]:
        if c <= i:
            continue
        yi, state = m(x[:, i:c], state)
        ys.append(yi)
        i = c
    assert_rel_close(torch.cat(ys, 1), y, TOL[dtype], f"{name}: heads={heads} b={b} T={t} cuts={cuts}")


N_DEFAULT = int(os.environ.get("SEQMEM_FUZZ_EXAMPLES", "4"))


@pytest.mark.parametrize("name", list_mixers())
@settings(max_examples=N_DEFAULT, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(data=st.data())
def test_fuzzed_streaming(name, data):
    _fuzz(name, data, max_len=41)


@pytest.mark.slow
@pytest.mark.parametrize("name", list_mixers())
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzzed_streaming_long(name, data):
    _fuzz(name, data, max_len=150)
