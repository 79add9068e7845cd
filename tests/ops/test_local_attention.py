"""sliding_window_attention: the blocked form against the per-query loop and a dense masked softmax; state."""

from __future__ import annotations

import pytest
import torch

from seqmem.ops import sliding_window_attention


def _dense(q, k, v, window, scale):
    """Independent reference: full softmax with a banded causal mask."""
    T = q.shape[1]
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    mask = (j <= i) & (j > i - window)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    p = torch.softmax(s.masked_fill(~mask, float("-inf")), -1)
    return torch.einsum("bhqk,bkhd->bqhd", p, v)


@pytest.mark.parametrize("window,chunk", [(1, 4), (4, 4), (5, 3), (8, 16), (30, 7)])
def test_blocks_equal_loop_and_dense_mask(window, chunk):
    g = torch.Generator().manual_seed(window + chunk)
    q, k = (torch.randn(2, 29, 3, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    v = torch.randn(2, 29, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    ref = _dense(q, k, v, window, 0.5)
    results = {m: sliding_window_attention(q, k, v, window, mode=m, chunk_size=chunk)[0]
               for m in ("recurrent", "chunk", "parallel")}  # fmt: skip
    gref = torch.autograd.grad((ref * ref).sum(), (q, k, v))
    for m, o in results.items():
        torch.testing.assert_close(o, ref, rtol=1e-12, atol=1e-12, msg=m)
        for a, b in zip(torch.autograd.grad((o * o).sum(), (q, k, v)), gref):
            torch.testing.assert_close(a, b, rtol=1e-11, atol=1e-12, msg=m)


@pytest.mark.parametrize("split", [1, 6, 13])
def test_streaming_with_the_returned_state(split):
    g = torch.Generator().manual_seed(split)
    q, k, v = (torch.randn(1, 20, 2, 4, generator=g, dtype=torch.float64) for _ in range(3))
    full, st_full = sliding_window_attention(q, k, v, 5, chunk_size=3)
    a, st = sliding_window_attention(q[:, :split], k[:, :split], v[:, :split], 5, chunk_size=3)
    assert st["k"].shape[1] == min(split, 4)
    b, st2 = sliding_window_attention(q[:, split:], k[:, split:], v[:, split:], 5, initial_state=st, chunk_size=3)
    torch.testing.assert_close(torch.cat([a, b], 1), full, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(st2["k"], st_full["k"])
    torch.testing.assert_close(st2["v"], v[:, -4:])


def test_bad_arguments():
    q = torch.randn(1, 4, 2, 3)
    for kw in ({"window": 0}, {"window": 2, "mode": "fast"}, {"window": 2, "chunk_size": 0}):
        with pytest.raises(ValueError):
            sliding_window_attention(q, q, q, **kw)
    with pytest.raises(ValueError):
        sliding_window_attention(q, q[:, :3], q, 2)
    with pytest.raises(ValueError):
        sliding_window_attention(q, q, q, 2, initial_state={"k": q})  # "v" missing
    with pytest.raises(ValueError):
        sliding_window_attention(q, q, q, 2, initial_state={"k": q[:, :, :1], "v": q})  # past with other heads
    with pytest.raises(ValueError), pytest.warns(DeprecationWarning):
        sliding_window_attention(q, q, q, 2, past_k=q)  # the deprecated form: past_v missing
