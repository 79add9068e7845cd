"""Causal linear attention, the recurrent reference (Katharopoulos et al. 2020, eq. 9 without feature map or
normaliser), one token at a time.  ``mode="recurrent"`` of :func:`seqmem.ops.linear_attention`; it shares no
casting or state helper with ``chunk.py``.  Inputs are assumed valid (the public op checks them first)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__: list[str] = []


def linear_attention_naive(
    q: Tensor, k: Tensor, v: Tensor, scale: float, initial_state: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """q, k (B, T, H, Dk), v (B, T, H, Dv), state (B, H, Dk, Dv); returns (o in v's dtype, final state)."""
    dt = torch.float64 if any(x is not None and x.dtype == torch.float64 for x in (q, k, v, initial_state)) \
        else torch.float32
    B, T, H, Dk = q.shape
    S = torch.zeros(B, H, Dk, v.shape[-1], dtype=dt, device=q.device) if initial_state is None \
        else initial_state.to(dt)
    outs = []
    # unbind once: slicing inside the loop would make autograd scatter into a full-size zero tensor per step
    for qt, kt, vt in zip((q.to(dt) * scale).unbind(1), k.to(dt).unbind(1), v.to(dt).unbind(1)):
        # 1. S_t = S_{t-1} + k_t v_tᵀ
        S = S + kt[..., :, None] * vt[..., None, :]
        # 2. o_t = S_tᵀ (scale · q_t)
        outs.append(torch.einsum("bhk,bhkv->bhv", qt, S))
    o = torch.stack(outs, 1) if outs else torch.zeros(B, 0, H, v.shape[-1], dtype=dt, device=q.device)
    return o.to(v.dtype), S
