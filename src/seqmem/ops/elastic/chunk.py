"""Elastic Memory's trapezoidal attention, all blocks at once (the mixer's ``impl="fast"``); ``mode="recurrent"``
runs the per-query reference in ``naive.py``.

Square blocks (``offset == 0``, as many queries as keys) take SDPA's causal path (``is_causal=True``, no mask
tensor, no materialised scores; the flash kernel on CPU), one batched call per run of consecutive blocks alike:
blocks without memory as causal attention over ``(batch · blocks)`` sequences; blocks whose memory is wholly
visible as a causal call in which each sequence is ``[M memory tokens; block]`` with ``M`` zero queries in
front — row ``M + i`` of that causal square sees all ``M`` memory keys and block keys ``0..i``, which is exactly
the joint softmax of Eq. 10 (the zero rows are dropped).  Other blocks (a partly visible memory), non-square
blocks (queries starting inside a block, as in decoding) and blocks of fewer than ``M / 4`` queries use one SDPA
call with an explicit mask over ``[memory; block]``.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

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
    if isinstance(offset, bool) or not isinstance(offset, numbers.Integral) or offset < 0 or offset + lq > lk:
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
    mem_kinds: Sequence[int] | None = None,
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
        mode: ``"chunk"`` (batched SDPA calls, see the module docstring) or ``"recurrent"`` (one query at a time,
            the reference).
        mem_kinds: per block, what ``mem_valid`` shows of its memory: 0 none of it, 1 all of it, 2 a part, when the
            caller knows it on the host (the block mixers do: it follows from the block's index).  Else (None) it is
            read from ``mem_valid``, a device-to-host copy that waits for the device on CUDA.  Not checked against
            ``mem_valid`` (the check would be that copy): a kind that disagrees gives a wrong answer (the block
            mixers' kinds are checked against their masks by the tests).

    Returns:
        ``(batch, blocks, lq, heads, dim)``.
    """
    _check(q, k, v, k_mem, v_mem, mem_valid, offset, mode)
    if mem_kinds is not None:
        mem_kinds = list(mem_kinds)
        if k_mem is None or len(mem_kinds) != q.shape[1] or any(
                isinstance(x, bool) or x not in (0, 1, 2) for x in mem_kinds):
            raise ValueError(f"trapezoidal_attention: mem_kinds must give each of the {q.shape[1]} blocks 0, 1 or 2 "
                             f"(and comes with a memory), got {mem_kinds!r}")
    if mode == "recurrent":
        return trapezoidal_attention_naive(q, k, v, k_mem, v_mem, mem_valid, offset, scale)
    if offset != 0 or q.shape[2] != k.shape[2] or (k_mem is not None and 4 * q.shape[2] < k_mem.shape[2]):
        # queries starting inside a block, or few queries against many memory tokens (a decode step at a block
        # start would otherwise pay for the M zero-query rows of the causal square)
        return _masked(q, k, v, k_mem, v_mem, mem_valid, offset, scale)
    if k_mem is None:
        return causal_blocks(q, k, v, scale)
    kind = mem_kinds if mem_kinds is not None else block_kinds(mem_valid)

    def run(g: int, pieces: tuple[Tensor, ...]) -> Tensor:
        qj, kj, vj, kmj, vmj, validj = pieces
        if g == 0:
            return causal_blocks(qj, kj, vj, scale)
        if g == 1:
            return _with_memory(qj, kj, vj, kmj, vmj, scale)
        return _masked(qj, kj, vj, kmj, vmj, validj, 0, scale)

    return by_runs(kind, (q, k, v, k_mem, v_mem, mem_valid), run)


def visible_kind(visible: int, n_mem: int) -> int:
    """The ``mem_kinds`` entry of a block that sees ``visible`` of its ``n_mem`` memory tokens."""
    return 0 if visible == 0 else 1 if visible == n_mem else 2


def block_kinds(mem_valid: Tensor) -> list[int]:
    """Per block, what ``mem_valid`` (batch, blocks, M) shows of its memory: 0 none of it, 1 all of it, 2 a part (in
    every row together); a read of the device."""
    nb = mem_valid.shape[1]
    full = mem_valid.flatten(2).transpose(0, 1).reshape(nb, -1)  # (blocks, batch · M)
    return torch.where(full.all(1), 1, torch.where(full.any(1), 2, 0)).tolist()


def block_runs(values: list) -> list[tuple]:
    """Runs of equal consecutive values: ``[(value, length), ...]`` (blocks handled alike form one batched call)."""
    runs: list[tuple] = []
    for x in values:
        if runs and runs[-1][0] == x:
            runs[-1] = (x, runs[-1][1] + 1)
        else:
            runs.append((x, 1))
    return runs


def by_runs(values: list, tensors: tuple[Tensor, ...], fn: Callable[[Any, tuple[Tensor, ...]], Tensor]) -> Tensor:
    """``fn(value, pieces)`` once per run of equal consecutive ``values`` (one per block), ``pieces`` the run's blocks
    of ``tensors`` (blocks on dim 1), the results concatenated on dim 1.  The tensors are split once (a slice per
    run would give each its own zero-filled gradient)."""
    runs = block_runs(values)
    sizes = [n for _, n in runs]
    pieces = zip(*(z.split(sizes, 1) for z in tensors))
    parts = [fn(value, piece) for (value, _), piece in zip(runs, pieces)]
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


def causal_blocks(q: Tensor, k: Tensor, v: Tensor, scale: float | None = None) -> Tensor:
    """Causal softmax attention inside each block: ``(batch, blocks, L, heads, dim)`` tensors, one batched SDPA
    call with ``is_causal=True`` over the ``batch · blocks`` sequences."""
    b, nb, L, h, d = q.shape
    y = _sdpa_causal(q.reshape(b * nb, L, h, d), k.reshape(b * nb, L, h, d), v.reshape(b * nb, L, h, -1), scale)
    return y.view(b, nb, L, h, -1)


def _sdpa_causal(q: Tensor, k: Tensor, v: Tensor, scale: float | None) -> Tensor:
    """(n, L, h, d) -> (n, L, h, dv); query i sees keys 0..i."""
    y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                       scale=scale)  # fmt: skip
    return y.transpose(1, 2)


def _with_memory(q: Tensor, k: Tensor, v: Tensor, km: Tensor, vm: Tensor, scale: float | None) -> Tensor:
    """Joint softmax over ``[memory; causal block]`` for blocks whose memory is wholly visible: per block, the
    causal square over ``[M zero queries; queries]`` × ``[memory; keys]``, whose last ``L`` rows are the block's."""
    b, nb, L, h, d = q.shape
    M = km.shape[2]
    n = b * nb
    qq = torch.cat([q.new_zeros(n, M, h, d), q.reshape(n, L, h, d)], 1)
    kk = torch.cat([km.reshape(n, M, h, d), k.reshape(n, L, h, d)], 1)
    vv = torch.cat([vm.reshape(n, M, h, -1), v.reshape(n, L, h, -1)], 1)
    return _sdpa_causal(qq, kk, vv, scale).split([M, L], 1)[1].reshape(b, nb, L, h, -1)


def _masked(q: Tensor, k: Tensor, v: Tensor, k_mem: Tensor | None, v_mem: Tensor | None, mem_valid: Tensor | None,
            offset: int, scale: float | None) -> Tensor:
    """One SDPA call with an explicit mask over ``[memory; block]`` (any offset, any memory visibility)."""
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
