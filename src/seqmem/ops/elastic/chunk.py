"""Elastic Memory's trapezoidal attention, all blocks at once: one masked ``scaled_dot_product_attention`` call
over ``[memory tokens; block keys]`` of every block (the mixer's ``impl="fast"``); ``mode="recurrent"`` runs the
per-query reference in ``naive.py``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from seqmem.ops.elastic.naive import trapezoidal_attention_naive

__all__ = ["trapezoidal_attention"]


def _check(q, k, v, k_mem, v_mem, mem_valid, offset, mode):
    if mode not in ("recurrent", "chunk"):
        raise ValueError(f"trapezoidal_attention: mode must be 'recurrent' or 'chunk', got {mode!r}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor) or x.dim() != 5:
            raise ValueError(f"trapezoidal_attention: {name} must be a (batch, blocks, length, heads, dim) tensor")
    b, nb, lq, h, d = q.shape
    lk = k.shape[2]
    if k.shape[:2] != (b, nb) or k.shape[3:] != (h, d) or v.shape[:4] != k.shape[:4]:
        raise ValueError(f"trapezoidal_attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
                         "disagree")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0 or offset + lq > lk:
        raise ValueError(f"trapezoidal_attention: offset must be an integer with 0 <= offset and offset + "
                         f"{lq} queries <= {lk} keys, got {offset!r}")
    if (k_mem is None) != (v_mem is None) or (k_mem is None) != (mem_valid is None):
        raise ValueError("trapezoidal_attention: k_mem, v_mem and mem_valid are given together or not at all")
    if k_mem is not None:
        M = k_mem.shape[2] if k_mem.dim() == 5 else -1
        if k_mem.shape != (b, nb, M, h, d) or v_mem.shape[:4] != (b, nb, M, h) or mem_valid.shape != (b, nb, M):
            raise ValueError("trapezoidal_attention: k_mem, v_mem must be (batch, blocks, M, heads, dim) and "
                             "mem_valid (batch, blocks, M)")
        if mem_valid.dtype != torch.bool:
            raise ValueError(f"trapezoidal_attention: mem_valid must be a bool tensor, got {mem_valid.dtype}")


def trapezoidal_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    k_mem: Tensor | None = None,
    v_mem: Tensor | None = None,
    mem_valid: Tensor | None = None,
    *,
    offset: int = 0,
    scale: float | None = None,
    mode: str = "chunk",
) -> Tensor:
    """Elastic Memory's trapezoidal attention (Eqs. 9–10): per block, one joint softmax over the block's memory
    tokens (every query sees every valid one, no positional encoding) and its own keys (causal).

    Args:
        q: ``(batch, blocks, lq, heads, dim)``, the queries of each block at in-block positions
            ``offset .. offset + lq − 1``; k, v: ``(batch, blocks, lk, heads, dim)`` the block's keys / values
            (RoPE, if any, already applied to ``q`` and ``k``).
        k_mem, v_mem: ``(batch, blocks, M, heads, dim)`` memory tokens read by each block, or None (no memory).
        mem_valid: ``(batch, blocks, M)`` bool, False where the memory is empty (block 0).
        offset: in-block position of the first query.
        scale: score scale, default ``dim ** -0.5``.
        mode: ``"chunk"`` (one masked SDPA call) or ``"recurrent"`` (one query at a time, the reference).

    Returns:
        ``(batch, blocks, lq, heads, dim)``.
    """
    _check(q, k, v, k_mem, v_mem, mem_valid, offset, mode)
    if mode == "recurrent":
        return trapezoidal_attention_naive(q, k, v, k_mem, v_mem, mem_valid, offset, scale)
    qh, kh, vh = (z.permute(0, 3, 1, 2, 4) for z in (q, k, v))  # (b, h, nb, L, d)
    b, _, nb, lq, _ = qh.shape
    lk = kh.shape[3]
    qi = torch.arange(lq, device=q.device)[:, None] + offset
    mask = (torch.arange(lk, device=q.device)[None, :] <= qi).expand(b, 1, nb, lq, lk)  # causal in the block
    if k_mem is not None:
        km, vm = k_mem.permute(0, 3, 1, 2, 4), v_mem.permute(0, 3, 1, 2, 4)  # (b, h, nb, M, d)
        M = km.shape[3]
        kh, vh = torch.cat([km, kh], 3), torch.cat([vm, vh], 3)
        mask = torch.cat([mem_valid[:, None, :, None, :].expand(b, 1, nb, lq, M), mask], -1)
    y = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
    return y.permute(0, 2, 3, 1, 4)
