"""RMSNorm and the gated RMSNorm used by Gated DeltaNet and Mamba-2 (private helpers of the baselines)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def rms_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dim."""
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
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
        if self.norm_before_gate:
            return rms_norm(x, self.weight, self.eps) * F.silu(z)
        return rms_norm(x * F.silu(z), self.weight, self.eps)
