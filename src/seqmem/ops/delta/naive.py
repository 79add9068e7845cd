"""The delta rule and gated delta rule, the recurrent reference, one token at a time.

``mode="recurrent"`` of :func:`seqmem.ops.delta_rule` / :func:`seqmem.ops.gated_delta_rule`; it shares no casting
or state helper with ``chunk.py``.  Inputs are assumed valid (the public ops check them first).
DeltaNet (Schlag et al. 2021, eq. 7; Yang et al. 2024, eq. 1) and Gated DeltaNet (Yang et al. 2025, eq. 10).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__: list[str] = []


def gated_delta_rule_naive(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None, scale: float,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """q, k (B, T, H, Dk), v (B, T, H, Dv), beta and g (B, T, H) (g None: no decay), state (B, H, Dk, Dv)."""
    dt = torch.float64 if any(x is not None and x.dtype == torch.float64 for x in (q, k, v, beta, g, initial_state)) \
        else torch.float32
    B, T, H, Dk = q.shape
    S = torch.zeros(B, H, Dk, v.shape[-1], dtype=dt, device=q.device) if initial_state is None \
        else initial_state.to(dt)
    outs = []
    gs = g.to(dt).unbind(1) if g is not None else [None] * T
    # unbind once: slicing inside the loop would make autograd scatter into a full-size zero tensor per step
    for qt, kt, vt, bt, gt in zip((q.to(dt) * scale).unbind(1), k.to(dt).unbind(1), v.to(dt).unbind(1),
                                  beta.to(dt)[..., None].unbind(1), gs):
        # 1. S ← e^{g_t} S                                               (gated form only)
        if gt is not None:
            S = torch.exp(gt)[..., None, None] * S
        # 2. S_t = S + β_t k_t (v_t − Sᵀ k_t)ᵀ   = (I − β_t k_t k_tᵀ) S + β_t k_t v_tᵀ
        S = S + kt[..., :, None] * (bt * (vt - torch.einsum("bhkv,bhk->bhv", S, kt)))[..., None, :]
        # 3. o_t = S_tᵀ (scale · q_t)
        outs.append(torch.einsum("bhk,bhkv->bhv", qt, S))
    o = torch.stack(outs, 1) if outs else torch.zeros(B, 0, H, v.shape[-1], dtype=dt, device=q.device)
    return o.to(v.dtype), S
