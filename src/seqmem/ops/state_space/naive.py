"""Mamba-2 SSD, the recurrent reference (Dao & Gu 2024, eq. (1) with scalar A per head), one token at a time.

``mode="recurrent"`` of :func:`seqmem.ops.ssd`; it shares no casting or state helper with ``chunk.py``.
Inputs are assumed valid (the public op checks them first).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__: list[str] = []


def ssd_naive(
    x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, initial_state: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """x (b, T, H, P), dt (b, T, H), A (H,), B and C (b, T, H, N), state (b, H, P, N)."""
    cd = torch.float64 if any(z is not None and z.dtype == torch.float64 for z in (x, dt, A, B, C, initial_state)) \
        else torch.float32
    b, T, H, P = x.shape
    h = torch.zeros(b, H, P, B.shape[-1], dtype=cd, device=x.device) if initial_state is None \
        else initial_state.to(cd)
    ys = []
    Ac = A.to(cd)  # cast once: a cast per step summed A's gradient over the steps in a half A's own dtype
    # unbind once: slicing inside the loop would make autograd scatter into a full-size zero tensor per step
    for xt, dtt, Bt, Ct in zip(x.to(cd).unbind(1), dt.to(cd).unbind(1), B.to(cd).unbind(1), C.to(cd).unbind(1)):
        # 1. Ā_t = exp(Δ_t A)                                            (zero-order hold of A)
        a = torch.exp(dtt * Ac)
        # 2. h_t = Ā_t h_{t-1} + Δ_t x_t B_tᵀ                            (eq. 1a)
        h = a[..., None, None] * h + (xt * dtt[..., None])[..., :, None] * Bt[..., None, :]
        # 3. y_t = h_t C_t                                                (eq. 1b)
        ys.append(torch.einsum("bhpn,bhn->bhp", h, Ct))
    y = torch.stack(ys, 1) if ys else torch.zeros(b, 0, H, P, dtype=cd, device=x.device)
    return y.to(x.dtype), h
