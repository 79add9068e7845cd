"""ShortConv: causal depthwise conv equals an explicit loop, and streams exactly with its cache."""

import pytest
import torch

from conftest import assert_rel_close
from seqmem.mixers._conv import ShortConv


@pytest.mark.parametrize("k", [1, 2, 4])
def test_short_conv_matches_loop_and_streams(k):
    torch.manual_seed(0)
    conv = ShortConv(5, k).double()
    x = torch.randn(2, 11, 5, dtype=torch.float64)
    y, cache = conv(x)
    assert cache.shape == (2, k - 1, 5)
    ref = torch.zeros_like(y)
    for t in range(11):
        acc = conv.bias.expand(2, 5).clone()
        for j in range(k):
            s = t - (k - 1) + j
            if s >= 0:
                acc = acc + conv.weight[:, 0, j] * x[:, s]
        ref[:, t] = acc
    assert_rel_close(y, ref, 1e-12, "conv vs loop")
    ys, c = [], None
    for a, b in ((0, 1), (1, 3), (3, 10), (10, 11)):
        yi, c = conv(x[:, a:b], c)
        ys.append(yi)
    assert_rel_close(torch.cat(ys, 1), y, 1e-12, "streamed conv")
    assert torch.equal(c, cache)


def test_short_conv_errors():
    with pytest.raises(ValueError):
        ShortConv(0, 4)
    conv = ShortConv(3, 4)
    with pytest.raises(ValueError):
        conv(torch.randn(2, 5, 4))
    with pytest.raises(ValueError):
        conv(torch.randn(2, 5, 3), torch.zeros(2, 2, 3))


@pytest.mark.parametrize("k", [1, 2, 4])
def test_short_conv_backward_is_the_autograd_of_the_loop(k):
    """The hand-written backward (one input-gradient buffer) against gradcheck and against autograd of the plain
    shifted multiply-adds, for x, the streamed cache, the weight and the bias."""
    from seqmem.mixers._conv import causal_conv1d

    g = torch.Generator().manual_seed(k)
    x = torch.randn(2, 6, 3, generator=g, dtype=torch.float64, requires_grad=True)
    cache = torch.randn(2, k - 1, 3, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 1, k, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: causal_conv1d(*a)[0], (x, w, b, cache))

    def plain(x, w, b, cache):
        xp = torch.cat([cache, x], 1)
        return sum(xp[:, j : j + x.shape[1]] * w[:, 0, j] for j in range(k)) + b

    dy = torch.randn(2, 6, 3, generator=g, dtype=torch.float64)
    got = torch.autograd.grad(causal_conv1d(x, w, b, cache)[0], (x, w, b, cache), dy)
    want = torch.autograd.grad(plain(x, w, b, cache), (x, w, b, cache), dy)
    for a, e in zip(got, want):
        assert a.shape == e.shape
        if e.numel():  # k = 1: the cache is empty
            assert_rel_close(a, e, 1e-13, "grad")
    # float32 and no-grad calls take the same values
    x32, w32 = x.detach().float(), w.detach().float()
    with torch.no_grad():
        y_ng = causal_conv1d(x32, w32)[0]
    assert torch.equal(y_ng, causal_conv1d(x32.requires_grad_(), w32)[0].detach())
