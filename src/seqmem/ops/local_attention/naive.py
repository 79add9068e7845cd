"""Causal sliding-window softmax attention, the reference: one query at a time.

``mode="recurrent"`` of :func:`seqmem.ops.local_attention.windowed_softmax` (and so of
:func:`seqmem.ops.sliding_window_attention`).  It shares no padding, mask or entropy helper with the blocked form
in ``chunk.py``, so the test that compares them can catch a bug in either.  Inputs are assumed valid (the public
op checks them first).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__: list[str] = []  # the public entry points run it with mode="recurrent"


def windowed_softmax_naive(
    q: Tensor, keys: Tensor, vals: Tensor, window: int, n_past: int, scale: float, entropy: bool = False
) -> tuple[Tensor, Tensor | None]:
    """Queries ``q`` (B, T, H, D) at positions ``n_past … n_past+T−1`` of ``keys`` / ``vals`` (B, n_past+T, H, ·).

    Returns ``(o (B, T, H, Dv), ent (B, T) or None)``, ``ent`` the mean over heads of H(a_t)/log(#visible keys)."""
    B, T = q.shape[:2]
    outs, ents = [], []
    for t in range(T):
        # 1. the window: the keys at positions max(0, n_past + t − window + 1) … n_past + t (itself included)
        lo = max(0, n_past + t - window + 1)
        kk, vv = keys[:, lo : n_past + t + 1], vals[:, lo : n_past + t + 1]
        # 2. a_t = softmax(q_t · K_wᵀ · scale)
        a = torch.softmax(torch.einsum("bhd,bkhd->bhk", q[:, t], kk) * scale, -1)
        # 3. o_t = a_t V_w
        outs.append(torch.einsum("bhk,bkhd->bhd", a, vv))
        # 4. the normalised entropy of a_t, H(a_t) / log(#visible keys), 0 for one key
        if entropy:
            n = kk.shape[1]
            h = -(a * torch.log(a.clamp_min(torch.finfo(a.dtype).tiny))).sum(-1)  # (B, H); 0 log 0 = 0
            ents.append((h / math.log(n)).mean(1) if n > 1 else q.new_zeros(B))
    return torch.stack(outs, 1), (torch.stack(ents, 1) if entropy else None)
