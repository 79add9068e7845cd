"""RMSNorm and the gated RMSNorm used by Gated DeltaNet and Mamba-2 (private helpers of the baselines)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_HALF = (torch.float16, torch.bfloat16)


def _up(t: Tensor) -> Tensor:
    """``t`` in float32 if it is float16 / bfloat16, else ``t`` itself."""
    return t.float() if t.dtype in _HALF else t


def rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dim, without overflow in ``mean(x^2)``.

    The sum of squares overflows long before ``x`` does (a row of 64 equal values: at 2.3e18 in float32, at 32 in
    float16); the plain formula then gives ``rsqrt(inf) = 0``, an all-zero row.  A row whose max could overflow it is
    divided by a power of two ``s`` (its max then lies in [1, 2)) and normalised as ``(x/s) / sqrt(mean((x/s)^2) +
    eps/s^2)``: the same function (``s`` cancels), and dividing by a power of two is exact.  Rows below that bound
    are not scaled, so their result is bit-identical to the plain formula.

    On the CPU (where reading a flag back costs no pipeline stall) the plain formula runs first and the scaled form
    only when some row's mean of squares is not finite: the guard's extra passes cost as much as the norm itself.

    Float16 / bfloat16 ``x`` (and ``weight``) are normalised in float32 and the result rounded once to the dtype
    the formula gives (``x``'s and ``weight``'s promoted): in float16 the backward of ``rsqrt`` scales by
    ``(mean(x²) + eps)^{-3/2}``, which overflows for rows of RMS below ~1e-2 (every gradient of DeltaNet under
    float16 autocast was NaN), and ``eps = 1e-5`` is subnormal there.
    """
    if x.dtype in _HALF or (weight is not None and weight.dtype in _HALF):
        out = x.dtype if weight is None else torch.promote_types(x.dtype, weight.dtype)
        return rms_norm(_up(x), None if weight is None else _up(weight), eps).to(out)
    if x.device.type == "cpu" and not torch.compiler.is_compiling():
        ms = x.pow(2).mean(-1, keepdim=True)
        if bool(torch.isfinite(ms).all()):
            y = x * torch.rsqrt(ms + eps)
            return y if weight is None else y * weight
    return _rms_norm_scaled(x, weight, eps)


def _rms_norm_scaled(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """:func:`rms_norm` with rows that could overflow ``mean(x^2)`` scaled by a power of two first."""
    with torch.no_grad():
        _, e = torch.frexp(x.detach().abs().amax(-1, keepdim=True))  # max = m·2^e, m in [0.5, 1)
        # below 2^top the sum of d squares stays under the dtype's max (2^maxexp): d·2^(2·top) < 2^(maxexp - 1)
        top = (math.frexp(torch.finfo(x.dtype).max)[1] - 1 - math.ceil(math.log2(max(x.shape[-1], 1)))) // 2
        s = torch.exp2(torch.where(e > top, e - 1, 0).to(x.dtype))
    xs = x / s
    y = xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + eps / (s * s))
    return y if weight is None else y * weight


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension with a learnable scale (Zhang & Sennrich, 2019)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


class GatedRMSNorm(nn.Module):
    """Gated RMSNorm with a SiLU gate ``z``.

    ``norm_before_gate=True`` (Gated DeltaNet / fla ``FusedRMSNormGated``): ``rmsnorm(x) * w * silu(z)``;
    ``norm_before_gate=False`` (Mamba-2 ``RMSNormGated``): ``rmsnorm(x * silu(z)) * w``.
    """

    def __init__(self, dim: int, eps: float = 1e-5, norm_before_gate: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.norm_before_gate = norm_before_gate
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, z: Tensor) -> Tensor:
        """Float16 / bfloat16 ``x``, ``z`` are gated and normalised in float32 (see :func:`rms_norm`), the result
        rounded once to the promoted dtype of ``x``, ``z`` and the weight."""
        out = torch.promote_types(torch.promote_types(x.dtype, z.dtype), self.weight.dtype)
        x, z = _up(x), _up(z)
        if self.norm_before_gate:
            y = rms_norm(x, self.weight, self.eps) * F.silu(z)
        else:
            y = rms_norm(x * F.silu(z), self.weight, self.eps)
        return y.to(out)
