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
