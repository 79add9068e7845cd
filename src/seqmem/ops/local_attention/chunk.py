"""Causal sliding-window softmax attention, the blocked form: :func:`windowed_softmax` with ``mode="chunk"`` /
``"parallel"`` (``mode="recurrent"`` runs the one-query-at-a-time reference in ``naive.py``), the argument checks
:func:`join_past` and the public op :func:`sliding_window_attention`.  See :mod:`seqmem.ops.local_attention`.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor

from seqmem.io import check_int
from seqmem.ops._common import (
    check_chunk_size,
    check_mode,
    check_same_device,
    check_scale,
    check_state_keys,
    check_tensor,
    promoted_dtype,
)
from seqmem.ops.local_attention.naive import windowed_softmax_naive

__all__ = ["sliding_window_attention"]

MODES = ("recurrent", "chunk", "parallel")


def sliding_window_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    past_k: Tensor | None = None,
    past_v: Tensor | None = None,
    *,
    initial_state: dict[str, Tensor] | None = None,
    scale: float | None = None,
    mode: str = "chunk",
    chunk_size: int = 64,
) -> tuple[Tensor, dict[str, Tensor]]:
    """``o[t] = softmax(q_t·K_w^T·scale)·V_w`` over the ``window`` most recent keys (``scale`` default dim^-1/2).

    ``q, k`` (batch, time, heads, D), ``v`` (batch, time, heads, Dv); ``initial_state`` the window cache before
    this segment, the state a previous call returned (None: the sequence starts here).  Returns ``(o, state)``,
    ``state`` the last ``min(P + T, window − 1)`` keys and values (P the cached ones, T this segment's):

    * ``"k"``: (batch, min(P + T, window − 1), heads, D) the most recent keys;
    * ``"v"``: (batch, min(P + T, window − 1), heads, Dv) their values.

    A cache of any length P is accepted (only its last ``window − 1`` entries are seen).  ``mode``: ``"chunk"``
    (blocks of ``chunk_size`` queries), ``"parallel"`` (one block of all T queries) or ``"recurrent"`` (the
    reference, one query at a time).  Tensors of mixed floating dtypes are computed in their promoted dtype;
    T = 0 returns an empty ``o`` and the cache unchanged.  ``past_k, past_v``
    (the former way to pass the cache) are read as ``initial_state={"k": past_k, "v": past_v}`` with a
    DeprecationWarning.
    """
    op = "sliding_window_attention"
    past_k, past_v = window_cache(op, initial_state, past_k, past_v)
    q, keys, vals, n_past = join_past(q, k, v, window, past_k, past_v, mode, chunk_size, op)
    if scale is not None:
        scale = check_scale(op, scale, q.shape[-1])
    if q.shape[1] == 0:  # an empty piece: no output, the cache unchanged
        return vals.new_zeros((*q.shape[:3], vals.shape[-1])), window_state(keys, vals, window)
    o, _ = windowed_softmax(q, keys, vals, window, n_past, mode=mode, chunk_size=chunk_size, scale=scale)
    return o, window_state(keys, vals, window)


def window_state(keys: Tensor, vals: Tensor, window: int) -> dict[str, Tensor]:
    """The state ``{"k", "v"}`` after a segment: the last ``min(len, window − 1)`` of ``keys``/``vals``, as copies
    (a slice would keep every key of the segment alive while the state lives)."""
    keep = min(keys.shape[1], window - 1)
    return {"k": keys[:, keys.shape[1] - keep :].clone(memory_format=torch.contiguous_format),
            "v": vals[:, vals.shape[1] - keep :].clone(memory_format=torch.contiguous_format)}


def window_cache(
    op: str, initial_state: dict[str, Tensor] | None, past_k: Tensor | None, past_v: Tensor | None
) -> tuple[Tensor | None, Tensor | None]:
    """``(past_k, past_v)`` of a sliding-window op from its ``initial_state`` dict ``{"k", "v"}``, or from the
    former ``past_k``/``past_v`` arguments with a DeprecationWarning naming the dict to pass instead."""
    if past_k is not None or past_v is not None:
        if initial_state is not None:
            raise ValueError(f"{op}: give initial_state or the deprecated past_k/past_v, not both")
        warnings.warn(f"{op}: past_k/past_v are deprecated; pass initial_state={{'k': past_k, 'v': past_v}} "
                      "(the form the op returns)", DeprecationWarning, stacklevel=3)
        return past_k, past_v
    check_state_keys(op, initial_state, ("k", "v"))
    if initial_state is None:
        return None, None
    return initial_state["k"], initial_state["v"]


def join_past(q, k, v, window, past_k, past_v, mode, chunk_size, op: str | None = None
              ) -> tuple[Tensor, Tensor, Tensor, int]:
    """Validate the arguments of a sliding-window op ``op`` (its name starts every error): shapes, floating
    dtypes, one device.  Return ``(q, keys, vals, n_past)``, the past prepended to the keys and values; tensors of
    mixed floating dtypes are cast to their promoted dtype (the output's)."""
    where = f"{op}: " if op else ""
    check_int("window", window, prefix=where)
    check_mode(op, mode, MODES)
    check_chunk_size(op, chunk_size)
    check_tensor(op, "q", q, (None, None, None, None), "batch, time, heads, D")
    B, T, H, D = q.shape
    check_tensor(op, "k", k, (B, T, H, D), "batch, time, heads, D")
    check_tensor(op, "v", v, (B, T, H, None), "batch, time, heads, Dv")
    if (past_k is None) != (past_v is None):
        raise ValueError(f"{where}give both the past keys and values (state 'k' and 'v'), or neither")
    if past_k is not None:
        check_tensor(op, "initial_state['k']", past_k, (B, None, H, D), "batch, P, heads, D")
        check_tensor(op, "initial_state['v']", past_v, (B, past_k.shape[1], H, v.shape[3]), "batch, P, heads, Dv")
    check_same_device(op or "sliding window", q=q, k=k, v=v, **{"initial_state['k']": past_k,
                                                                "initial_state['v']": past_v})
    dt = promoted_dtype(q, k, v, past_k, past_v)
    q, k, v = q.to(dt), k.to(dt), v.to(dt)  # no copies when the dtypes agree
    if past_k is None:
        return q, k, v, 0
    return q, torch.cat([past_k.to(dt), k], 1), torch.cat([past_v.to(dt), v], 1), past_k.shape[1]


def windowed_softmax(
    q: Tensor,
    keys: Tensor,
    vals: Tensor,
    window: int,
    n_past: int,
    *,
    mode: str = "chunk",
    chunk_size: int = 64,
    scale: float | None = None,
    entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Queries ``q`` (B, T, H, D) at positions ``n_past … n_past+T−1`` of ``keys``/``vals`` (B, n_past+T, H, ·).

    Returns ``(o, ent)``; ``ent`` (B, T) = mean over heads of H(a_t)/log(#visible keys) (0 when one key is
    visible), or None unless ``entropy``.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if mode == "recurrent":
        return windowed_softmax_naive(q, keys, vals, window, n_past, scale, entropy)
    return _blocks(q, keys, vals, window, n_past, q.shape[1] if mode == "parallel" else chunk_size, scale, entropy)


def _row_entropy(p: Tensor) -> Tensor:
    return -(p * torch.log(p.clamp_min(torch.finfo(p.dtype).tiny))).sum(-1)  # 0 log 0 = 0


def _blocks(q, keys, vals, window, P, C, scale, entropy):
    """All blocks of C queries at once.  In block coordinates query r sees window key l iff
    r ≤ l ≤ r + window − 1 (the same band in every block), and l must not be left padding."""
    B, T, H, D = q.shape
    # no query sees more than the P + T keys there are: a longer window is the same as one of P + T (less padding)
    W = min(window, P + T)
    C = min(C, T)
    if P > W - 1:  # only the last W − 1 past keys can be seen
        keys, vals, P = keys[:, P - (W - 1) :], vals[:, P - (W - 1) :], W - 1
    if T <= C:  # one block: its keys as they are (no padding, no unfold), the band in absolute positions
        n, C = 1, T
        kw, vw = keys.permute(0, 2, 3, 1)[:, None], vals.permute(0, 2, 3, 1)[:, None]  # (B, 1, H, ·, P + T)
        qb = q[:, None]
        i = torch.arange(P, P + T, device=q.device)[:, None]
        j = torch.arange(P + T, device=q.device)[None, :]
        vis = ((j <= i) & (j > i - W))[None]  # (1, T, P + T)
    else:
        n = -(-T // C)
        L = C + W - 1
        front, back = W - 1 - P, n * C - T
        kw = F.pad(keys, (0, 0, 0, 0, front, back)).unfold(1, L, C)  # (B, n, H, D, L)
        vw = F.pad(vals, (0, 0, 0, 0, front, back)).unfold(1, L, C)  # (B, n, H, Dv, L)
        qb = F.pad(q, (0, 0, 0, 0, 0, back)).view(B, n, C, H, D)
        r = torch.arange(C, device=q.device)
        lk = torch.arange(L, device=q.device)
        band = (lk[None, :] >= r[:, None]) & (lk[None, :] <= r[:, None] + W - 1)  # (C, L)
        real = (torch.arange(n, device=q.device)[:, None] * C + lk[None, :]) >= front  # (n, L)
        vis = band[None] & real[:, None]  # (n, C, L); every row sees at least its own key
    s = torch.einsum("bnchd,bnhdl->bnhcl", qb, kw) * scale
    p = torch.softmax(s.masked_fill(~vis[None, :, None], float("-inf")), -1)
    o = torch.einsum("bnhcl,bnhdl->bnchd", p, vw).reshape(B, n * C, H, vals.shape[-1])[:, :T]
    if not entropy:
        return o, None
    nvis = vis.sum(-1).reshape(n * C)[:T].to(q.dtype)
    ent = _row_entropy(p).mean(2).reshape(B, n * C)[:, :T]  # (B, n, H, C) -> mean over heads
    norm = torch.where(nvis > 1, torch.log(nvis.clamp_min(2)), torch.ones_like(nvis))
    return o, ent / norm * (nvis > 1)
