"""Elastic Memory's trapezoidal attention, the reference: one query at a time.

``trapezoidal_attention_token`` is one query against the visible keys of its block and the block's memory tokens,
the per-token step of the Elastic Memory mixer's ``impl="reference"``; ``trapezoidal_attention_naive`` loops it
over every query of every block (``mode="recurrent"`` of :func:`seqmem.ops.trapezoidal_attention`).  They share
no mask or layout helper with ``chunk.py``.  Inputs are assumed valid (the public op checks them first).
Equation numbers are those of the Elastic Memory paper (Song et al.).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__: list[str] = []  # the public entry point is trapezoidal_attention(mode="recurrent")


def trapezoidal_attention_token(
    q: Tensor, k: Tensor, v: Tensor, k_mem: Tensor | None = None, v_mem: Tensor | None = None,
    mem_valid: Tensor | None = None, scale: float | None = None,
) -> Tensor:
    """``q`` (b, h, d) against the visible block keys ``k``, ``v`` (b, n, h, d) and the memory tokens ``k_mem``,
    ``v_mem`` (b, M, h, d) (None: no memory), of which ``mem_valid`` (b, M) are visible.  Returns (b, h, d)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    # 1. scores of the block keys: q·k_j · scale                                                       (Eq. 9)
    s = torch.einsum("bhd,bjhd->bhj", q, k) * scale
    if k_mem is not None:
        # 2. scores of the memory tokens, −∞ where the memory is empty (block 0)                       (Eq. 9)
        s_mem = (torch.einsum("bhd,bmhd->bhm", q, k_mem) * scale).masked_fill(~mem_valid[:, None, :], float("-inf"))
        s = torch.cat([s_mem, s], -1)
        v = torch.cat([v_mem, v], 1)
    # 3. one joint softmax over [memory tokens; block keys]                                           (Eq. 10)
    p = torch.softmax(s, -1)
    # 4. o = Σ_j p_j v_j                                                                               (Eq. 10)
    return torch.einsum("bhj,bjhd->bhd", p, v)


def trapezoidal_attention_naive(
    q: Tensor, k: Tensor, v: Tensor, k_mem: Tensor | None, v_mem: Tensor | None, mem_valid: Tensor | None,
    offset: int, scale: float | None,
) -> Tensor:
    """Every query ``i`` of block ``c`` (at in-block position ``offset + i``) sees block keys ``0..offset + i`` and
    the valid memory tokens of block ``c``.  Layout (b, n_blocks, length, h, d); returns q's shape."""
    outs = []
    for c in range(q.shape[1]):
        mem = (None, None, None) if k_mem is None else (k_mem[:, c], v_mem[:, c], mem_valid[:, c])
        outs.append(torch.stack([
            trapezoidal_attention_token(q[:, c, i], k[:, c, : offset + i + 1], v[:, c, : offset + i + 1], *mem,
                                        scale=scale)
            for i in range(q.shape[2])
        ], 1))  # fmt: skip
    return torch.stack(outs, 1)
