"""swa's two fast paths (dense-mask SDPA for few keys, banded blocks for many) against its per-token loop."""

from __future__ import annotations

import pytest
import torch

import seqmem


@pytest.mark.parametrize("band_min_keys", [0, 10**9])  # 0: always banded blocks; huge: always dense SDPA
@pytest.mark.parametrize("window", [1, 4, 9])
def test_swa_fast_paths_equal_the_loop_and_stream(band_min_keys, window, monkeypatch):
    torch.manual_seed(window)
    fast = seqmem.build_mixer("swa", 16, n_heads=2, window=window).double()
    ref = seqmem.build_mixer("swa", 16, n_heads=2, window=window, impl="reference").double()
    ref.load_state_dict(fast.state_dict())
    monkeypatch.setattr(type(fast), "band_min_keys", band_min_keys)
    assert type(fast).band_min_keys == band_min_keys
    x = torch.randn(2, 75, 16, dtype=torch.float64, requires_grad=True)
    y, st = fast(x)
    y_ref, st_ref = ref(x)
    torch.testing.assert_close(y, y_ref, rtol=1e-10, atol=1e-12)
    for a, b in zip(torch.autograd.grad(y.square().sum(), x), torch.autograd.grad(y_ref.square().sum(), x)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    # streaming across pieces that cut the blocks, with the cache of window - 1 keys
    ys, s = [], None
    for a, b in ((0, 7), (7, 40), (40, 41), (41, 75)):
        yp, s = fast(x[:, a:b].detach(), s)
        ys.append(yp)
    torch.testing.assert_close(torch.cat(ys, 1), y.detach(), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(s["k"], st["k"])


def test_state_of_another_window_is_refused():
    """A window-8 layer's state (the last 7 keys at pos 12) given to a full-attention layer, or the reverse, or a
    hand-truncated cache: the cache must hold min(pos, window - 1) tokens (every token without a window)."""
    torch.manual_seed(0)
    full = seqmem.build_mixer("attention", 16, n_heads=2)
    swa = seqmem.build_mixer("swa", 16, n_heads=2, window=8)
    swa.load_state_dict(full.state_dict())
    x = torch.randn(1, 20, 16)
    _, s_swa = swa(x[:, :12])
    _, s_full = full(x[:, :12])
    with pytest.raises(ValueError, match="expected 12"):
        full(x[:, 12:], s_swa)
    with pytest.raises(ValueError, match="expected 7"):
        swa(x[:, 12:], s_full)
    with pytest.raises(ValueError, match="expected 12"):
        full(x[:, 12:], {"k": s_full["k"][:, :, -3:], "v": s_full["v"][:, :, -3:], "pos": s_full["pos"]})
    y, _ = full(x[:, 12:], s_full)  # the right state still continues
    assert y.shape == (1, 8, 16)
