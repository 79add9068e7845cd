"""Short causal depthwise convolution with a streaming cache (the Based / zoology / Mamba recipe).

``conv = ShortConv(channels, kernel_size)``; ``y, cache = conv(x, cache)`` with ``x: (batch, time, channels)``
and ``cache: (batch, kernel_size - 1, channels)`` holding the last ``kernel_size - 1`` inputs seen
(``None`` = zeros, i.e. the sequence start).
``y[:, t] = bias + sum_j weight[:, 0, j] * x[:, t - (kernel_size - 1) + j]``: a causal depthwise convolution,
**no activation inside** (the caller applies SiLU if wanted).  Feeding a sequence piecewise with the returned
cache gives exactly the same ``y`` as one call, so mixers that use it stream exactly; the mixer must keep the
cache in its state dict (``(kernel_size - 1) * channels`` floats per sequence).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["ShortConv", "causal_conv1d"]


def causal_conv1d(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, cache: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Functional causal depthwise conv.

    ``x (B,T,C)``, ``weight (C,1,K)`` (``nn.Conv1d`` layout), ``bias (C,)``|None, ``cache (B,K-1,C)``|None.

    Returns ``(y (B,T,C), new_cache (B,K-1,C))``.
    """
    if x.dim() != 3:
        raise ValueError(f"causal_conv1d: x must be (batch, time, channels), got shape {tuple(x.shape)}")
    b, _, c = x.shape
    if weight.dim() != 3 or weight.shape[0] != c or weight.shape[1] != 1:
        raise ValueError(f"causal_conv1d: weight must be ({c}, 1, kernel), got shape {tuple(weight.shape)}")
    k = weight.shape[-1]
    if cache is None:
        cache = x.new_zeros(b, k - 1, c)
    elif cache.shape != (b, k - 1, c):
        raise ValueError(
            f"causal_conv1d: cache must have shape (batch={b}, kernel_size-1={k - 1}, channels={c}), "
            f"got {tuple(cache.shape)}"
        )
    xp = torch.cat([cache.to(x.dtype), x], dim=1)  # (B, K-1+T, C)
    # K shifted multiply-adds along time, channels last: with a short kernel this is several times faster than
    # F.conv1d(groups=C) on CPU (whose depthwise backward dominated the DeltaNet layer) and needs no transposes.
    t = x.shape[1]
    w = weight[:, 0, :].to(x.dtype)  # (C, K)
    y = xp[:, :t] * w[:, 0]
    for j in range(1, k):
        y = y + xp[:, j : j + t] * w[:, j]
    if bias is not None:
        y = y + bias.to(x.dtype)
    new_cache = xp[:, xp.shape[1] - (k - 1) :]
    return y, new_cache


class ShortConv(nn.Module):
    """Causal depthwise ``Conv1d`` over time with a cache of the last ``kernel_size - 1`` inputs.

    Parameters: ``weight (channels, 1, kernel_size)`` and (if ``bias``) ``bias (channels,)``, initialised like
    ``nn.Conv1d``.  ``forward(x, cache) -> (y, new_cache)``; no activation inside.
    """

    def __init__(self, channels: int, kernel_size: int = 4, bias: bool = True) -> None:
        super().__init__()
        for name, v in (("channels", channels), ("kernel_size", kernel_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"ShortConv: {name} must be a positive integer, got {v!r}")
        self.channels = channels
        self.kernel_size = kernel_size
        bound = 1.0 / math.sqrt(kernel_size)  # nn.Conv1d default: fan_in = kernel_size for a depthwise conv
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(channels).uniform_(-bound, bound)) if bias else None

    def cache_size(self) -> int:
        """Floats per sequence in the cache."""
        return (self.kernel_size - 1) * self.channels

    def forward(self, x: Tensor, cache: Tensor | None = None) -> tuple[Tensor, Tensor]:
        if x.dim() != 3 or x.shape[-1] != self.channels:
            raise ValueError(
                f"ShortConv: x must be (batch, time, {self.channels}), got shape {tuple(x.shape)}"
            )
        return causal_conv1d(x, self.weight, self.bias, cache)

    def extra_repr(self) -> str:
        return f"channels={self.channels}, kernel_size={self.kernel_size}, bias={self.bias is not None}"
