"""Lattice, the mini-batch approximation :func:`lattice_minibatch` (docs/lattice.md): every gradient of a chunk is
taken at the chunk-start state, as in TTT's mini-batch training.  A DIFFERENT model from
:func:`seqmem.ops.lattice_scan`, equal to it only for ``chunk_size=1``.  ``lattice_chunked`` is its former name
(deprecated; it keeps the former arguments and tuple state).
"""

from __future__ import annotations

import numbers
import warnings

import torch
from torch import Tensor

from seqmem.io import check_int
from seqmem.ops._common import check_mode, check_state_keys, check_tensor, promoted_dtype, state_dict
from seqmem.ops.lattice.naive import lattice_minibatch_naive
from seqmem.ops.lattice.step import _OSR, _check, _prepare, sphere_retract

__all__ = ["lattice_minibatch"]

STATE_KEYS = ("S", "A", "pos")


# ------------------------------------------------------------------------------------------------------------
# TTT-style mini-batch approximation (docs/lattice.md): a DIFFERENT model, equal to the scan only for chunk_size=1
# ------------------------------------------------------------------------------------------------------------
def lattice_minibatch(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gamma: Tensor | float,
    initial_state: dict[str, Tensor] | None = None,
    *,
    objective: str = "dec",
    chunk_size: int = 16,
    mode: str = "chunk",
    _offset: int | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Mini-batch Lattice (NOSR with every gradient of a chunk taken at the chunk-start state; see docs/lattice.md).

    Within a chunk ``U_t = S⁰ + Σ_{j≤t} Δ_j(S⁰)``, ``S_t = colnormalize(U_t)``, ``y_t = S_t q_t``; the next
    chunk starts from ``S_C``.  A DIFFERENT model from :func:`lattice_scan` (equal only for ``chunk_size=1``).
    Chunks are counted from the sequence start, so the state carries the position.  Returns ``(y, state)``.

    State (``initial_state`` and the returned one; None starts from the identity slots at position 0):

    * ``"S"``: the chunk-start slots ``S⁰`` (B, H, d, m);
    * ``"A"``: the update ``Σ_j Δ_j(S⁰)`` accumulated in the current chunk so far (B, H, d, m); the slots after
      the last token are ``sphere_retract(S + A)``;
    * ``"pos"``: tokens seen so far (B,) int64, equal modulo ``chunk_size`` across the batch.

    A bare ``S⁰`` tensor (the former form) still works, with a DeprecationWarning (a zero update at position 0).

    The per-token states ``U_t`` are never formed: ``y_t`` and the column norms ``‖U_t[:, i]‖`` come from
    causal (C×C) products and cumulative sums (:func:`_chunk_block`), O(C·(d + m) + d·m) work per token and
    head; only the chunk-end state is a (d, m) matrix (a one-token block, as in decoding, forms its one state).
    ``mode="recurrent"`` runs the per-token reference (``naive.py``) after the same input checks.

    ``_offset`` (internal): the given state's position modulo ``chunk_size`` where the caller knows it on the host
    (the mixer, for the state it returned last); ``initial_state["pos"]`` is then not read (on CUDA a read is a
    wait for the GPU).
    """
    check_mode("lattice_minibatch", mode)
    state = state_dict("lattice_minibatch", initial_state)
    if state is not None and set(state) == {"S"}:  # the former bare S⁰: a zero update at position 0
        state = {"S": state["S"], "A": None, "pos": None}
    check_state_keys("lattice_minibatch", state, STATE_KEYS)
    S0, A, offset = _state_parts(q, k, v, state, chunk_size, _offset)
    if k.shape[1] == 0:  # an empty piece: no output, the state unchanged (checked as any other)
        B, _, H, m, d = _lattice_minibatch_checks(q, k, v, gamma, S0, objective, chunk_size, A, offset)
        dt = promoted_dtype(q, k, v, gamma, S0, A)
        S0 = torch.eye(d, m, dtype=dt, device=k.device).expand(B, H, d, m).clone() if S0 is None else S0.to(dt)
        A = torch.zeros_like(S0) if A is None else A.to(dt)
        y = v.new_zeros((B, 0, H, d), dtype=dt)
    else:
        y, (S0, A) = _run(q, k, v, gamma, S0, objective, chunk_size, A, offset, mode)
    pos = torch.full((k.shape[0],), offset, dtype=torch.long, device=k.device) if state is None or \
        state["pos"] is None else state["pos"]
    return y, {"S": S0, "A": A, "pos": pos + k.shape[1]}


def _state_parts(q, k, v, state, chunk_size, known: int | None = None) -> tuple[Tensor | None, Tensor | None, int]:
    """``(S⁰, A, offset in the current chunk)`` of a state dict (None: identity slots, zero update, offset 0)."""
    if state is None:
        return None, None, 0
    pos = state["pos"]
    if pos is None:
        return state["S"], state["A"], 0
    B = k.shape[0] if isinstance(k, Tensor) and k.dim() == 4 else None
    if not isinstance(pos, Tensor) or pos.dtype != torch.long or pos.shape != (B,):
        got = getattr(pos, "shape", pos)
        raise ValueError(f"lattice_minibatch: initial_state['pos'] must be an int64 (batch={B},) tensor, got {got}")
    if isinstance(k, Tensor) and pos.device != k.device:  # before its value is read
        raise ValueError(f"lattice_minibatch: all tensors must be on one device, got {{'k': {k.device!r}, "
                         f"\"initial_state['pos']\": {pos.device!r}}}")
    check_int("chunk_size", chunk_size, prefix="lattice_minibatch: ")
    if known is not None:  # known on the host: not read
        return state["S"], state["A"], known
    offs = (pos % chunk_size).tolist()  # one read of the device
    if any(o != offs[0] for o in offs):
        raise ValueError("lattice_minibatch: all sequences of a batch must be at the same position in their chunk")
    return state["S"], state["A"], offs[0] if offs else 0


def lattice_chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gamma: Tensor | float,
    initial_state: Tensor | None = None,
    *,
    objective: str = "dec",
    chunk_size: int = 16,
    initial_update: Tensor | None = None,
    offset: int = 0,
    mode: str = "chunk",
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Deprecated name of :func:`lattice_minibatch`, with the former arguments and state: ``initial_state`` the
    chunk-start slots, ``initial_update`` the update of the current chunk, ``offset`` the tokens already in it;
    returns ``(y, (S_chunk_start, update))``."""
    warnings.warn("lattice_chunked is deprecated; use lattice_minibatch (state dict {'S', 'A', 'pos'})",
                  DeprecationWarning, stacklevel=2)
    check_mode("lattice_chunked", mode)
    return _run(q, k, v, gamma, initial_state, objective, chunk_size, initial_update, offset, mode)


def _run(q, k, v, gamma, S0, objective, chunk_size, A, offset, mode) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Both entry points on the former arguments (``S0`` the chunk-start slots, ``A`` the update of the current
    chunk, ``offset`` the tokens already in it): the per-token reference after the input checks, or the chunked
    form.  Inputs of mixed floating dtypes are computed in their promoted dtype (``y`` and the state in it).
    Returns ``(y, (S_chunk_start, update))``."""
    dt = promoted_dtype(q, k, v, gamma, S0, A)  # (each mode then checks the inputs; integers stay for it to refuse)
    q, k, v, gamma, S0, A = (x.to(dt) if isinstance(x, Tensor) and x.is_floating_point() else x
                             for x in (q, k, v, gamma, S0, A))
    if mode == "recurrent":
        _lattice_minibatch_checks(q, k, v, gamma, S0, objective, chunk_size, A, offset)
        return lattice_minibatch_naive(q, k, v, gamma, S0, objective=objective, chunk_size=chunk_size,
                                       initial_update=A, offset=offset)  # fmt: skip
    return _lattice_minibatch(q, k, v, gamma, S0, objective=objective, chunk_size=chunk_size, initial_update=A,
                              offset=offset, dense=False)  # fmt: skip


def _lattice_minibatch_checks(q, k, v, gamma, initial_state, objective, chunk_size, initial_update, offset):
    """The public op's input checks (both modes); returns ``(B, T, H, m, d)``."""
    if objective not in _OSR:
        raise ValueError(f"lattice_minibatch: supports objectives {list(_OSR)}, got {objective!r}")
    if initial_update is not None and not isinstance(initial_update, Tensor):
        raise ValueError(f"lattice_minibatch: the update (initial_state['A'], or initial_update) must be a tensor or "
                         f"None, got {type(initial_update).__name__}")
    B, T, H, m, d = _check(q, k, v, gamma, initial_state, objective, True, None, None, "scan", chunk_size,
                           op="lattice_minibatch", **{"initial_state['A']": initial_update})
    if isinstance(offset, bool) or not isinstance(offset, numbers.Integral) or not 0 <= offset < chunk_size:
        raise ValueError(f"lattice_minibatch: offset must be an integer in [0, chunk_size={chunk_size}), got "
                         f"{offset!r}")
    if initial_update is not None:
        if initial_update.shape != (B, H, d, m):
            raise ValueError(f"lattice_minibatch: the update (initial_state['A'], or initial_update) must be "
                             f"(B, H, d, m)=({B}, {H}, {d}, {m}) or None, got {tuple(initial_update.shape)}")
        check_tensor("lattice_minibatch", "initial_state['A']", initial_update, (B, H, d, m), "batch, heads, d, m")
    return B, T, H, m, d


def _lattice_minibatch(
    q, k, v, gamma, initial_state=None, *, objective="dec", chunk_size=16, initial_update=None, offset=0,
    dense=False,
):
    """The chunked form of :func:`lattice_minibatch` on the former arguments (``initial_state`` the chunk-start
    slots, ``initial_update``, ``offset``); ``dense=True`` uses :func:`_chunk_block_dense` (the per-token states,
    tests).  Returns ``(y, (S_chunk_start, update))``."""
    B, T, H, m, d = _lattice_minibatch_checks(q, k, v, gamma, initial_state, objective, chunk_size, initial_update,
                                            offset)
    qt, kt, vt, gt, S0, _, _ = _prepare(q, k, v, gamma, initial_state, True, None, None, objective)
    N = B * H
    A = None if initial_update is None else initial_update.reshape(N, d, m)  # None: a zero update
    if not dense:  # (T, N, ·) -> (N, T, ·): the block works on batched (C × ·) matrices
        qt, kt, vt, gt = (x.transpose(0, 1) for x in (qt, kt, vt, gt))
    # block lengths: the rest of the current chunk, whole chunks, a partial last chunk.  torch.split (not a
    # slice per block) keeps the backward linear in T: each slice's backward would zero-fill a full-length grad
    first = min(chunk_size - offset, T)
    full, rest = divmod(T - first, chunk_size)
    sizes = [first] + [chunk_size] * full + ([rest] if rest else [])
    tdim = 0 if dense else 1
    blocks = zip(*(torch.split(x, sizes, dim=tdim) for x in (qt, kt, vt, gt)))
    ys, pos = [], offset
    for n, (qb, kb, vb, gb) in zip(sizes, blocks):
        done = pos + n == chunk_size  # this block completes its chunk: its last state starts the next one
        if dense or n == 1:  # n == 1 (decoding): one token's single state is cheaper than the products
            A = torch.zeros_like(S0) if A is None else A
            args = (qb, kb, vb, gb) if dense else (x.transpose(0, 1) for x in (qb, kb, vb, gb))
            y, S_last, A = _chunk_block_dense(S0, A, *args, objective, done)
            y = y if dense else y.transpose(0, 1)
        else:
            y, S_last, A = _chunk_block(S0, A, qb, kb, vb, gb, objective, done)
        ys.append(y)
        pos += n
        if done:
            S0, A, pos = S_last, None, 0
    y = torch.cat(ys, 1 - int(dense))  # (N, T, d) or, dense, (T, N, d)
    y = y.reshape(B, H, T, d).transpose(1, 2) if not dense else y.reshape(T, B, H, d).transpose(0, 1)
    A = torch.zeros_like(S0) if A is None else A
    return y, (S0.reshape(B, H, d, m), A.reshape(B, H, d, m))


def _chunk_block(S0, A, q, k, v, g, objective, need_state, eps=1e-12):
    """Tokens of one (possibly partial) mini-batch, without forming the per-token states (exact algebra).

    ``S0 (N, d, m)`` chunk-start slots, ``A (N, d, m) | None`` the update accumulated earlier in this chunk
    (None = 0); ``q, k, g: (N, C, m)``, ``v: (N, C, d)``.  With ``h_j, w_j = γ_j c_j, p_j = S0ᵀh_j`` (rows of
    H, W, P) and ``R_t = Σ_{j≤t} p_j ⊙ w_j``, the state after token t is

        U_t = S0 + A − Σ_{j≤t} h_j w_jᵀ + S0 diag(R_t),   y_t = U_t (q_t / n_t),   n_t,i = ‖U_t[:, i]‖

    so ``Y = Q'(S0 + A)ᵀ + (R ⊙ Q') S0ᵀ − tril(Q'Wᵀ) H`` with ``Q' = Q / n``.  Expanding ``‖U_t[:, i]‖²`` with
    ``s_i = ‖S0_i‖²``, ``a_i = S0_iᵀA_i``, ``E_t = Σ_{j≤t} w_j h_jᵀ`` columnwise (``S0_iᵀE_t,i = R_t,i``):

        n² = ‖S0_i + A_i‖² + (‖E_t,i‖² − R_t,i²) − 2 A_iᵀE_t,i + (s_i − 1)(R² + 2R) + 2 R a_i

    where ``‖E‖² − R²`` (the squared norm of the part of ``E`` orthogonal to a unit slot) is accumulated by
    its increments ``w_t (2 Σ_{l<t} w_l (h_tᵀh_l − p_t p_l) + w_t (‖h_t‖² − p_t²))``; for unit slots the last
    two terms vanish.  When the ``h_j`` are nearly parallel to a slot, ``‖E‖²`` and ``R²`` are both large and
    the difference loses ``eps·‖E‖²`` absolutely (the per-token form loses only ``eps·‖E‖``), so for inputs
    below float64 the norm terms are computed in float64 from the rounded ``h`` (``p`` then matches ``h``
    exactly); ``y`` and the update stay in the input precision.
    Returns ``(y (N, C, d), S after the last token if need_state else None, update after the last token)``.
    """
    dt = q.dtype
    acc = torch.float64 if dt in (torch.float32, torch.float16, torch.bfloat16) else dt
    if objective == "dec":
        h = torch.matmul(k, S0.transpose(1, 2)) - v  # h_j = S0 k_j − v_j
    else:
        h = v if objective == "enc" else -v
    h_, S0_, g_ = h.to(acc), S0.to(acc), g.to(acc)
    p = torch.matmul(h_, S0_)  # (N, C, m) p_j = S0ᵀh_j
    c = p - k.to(acc) if objective == "enc" else k.to(acc)  # enc: e_j = S0ᵀv_j − k_j
    w = g_ * c
    pw = p * w
    R = torch.cumsum(pw, 1)
    R_prev = torch.nn.functional.pad(R[:, :-1], (0, 0, 1, 0))  # R_{t-1}
    G = torch.matmul(h_, h_.transpose(1, 2))  # (N, C, C) Gram of the h_j
    M = torch.matmul(torch.tril(G, -1), w)  # Σ_{l<t} w_l h_tᵀh_l
    hh = torch.diagonal(G, dim1=1, dim2=2).unsqueeze(-1)  # ‖h_t‖²
    perp = torch.cumsum(w * (2 * (M - p * R_prev) + w * (hh - p * p)), 1)  # ‖E_t‖² − R_t²
    s1 = S0_.pow(2).sum(1).unsqueeze(1) - 1  # (N, 1, m): s_i − 1
    n2 = perp + s1 * R * (R + 2)
    if A is None:
        n2 = n2 + (s1 + 1)
    else:
        A_ = A.to(acc)
        a = (S0_ * A_).sum(1).unsqueeze(1)
        XA = torch.cumsum(w * torch.matmul(h_, A_), 1)  # A_iᵀE_t,i
        n2 = n2 + (S0_ + A_).pow(2).sum(1).unsqueeze(1) - 2 * XA + 2 * R * a
    n = n2.clamp_min(eps * eps).sqrt()  # = sphere_retract's max(‖U_t[:, i]‖, eps)
    qp = (q.to(acc) / n).to(dt)
    w, R = w.to(dt), R.to(dt)
    y = torch.matmul(qp * (1 + R), S0.transpose(1, 2)) - torch.matmul(
        torch.tril(torch.matmul(qp, w.transpose(1, 2))), h
    )  # fmt: skip
    if A is not None:
        y = y + torch.matmul(qp, A.transpose(1, 2))
    # the update after the last token: A − Σ_j h_j w_jᵀ + S0 diag(R_C)
    A_new = S0 * R[:, -1:] - torch.matmul(h.transpose(1, 2), w)
    if A is not None:
        A_new = A_new + A
    S_last = sphere_retract(S0 + A_new, eps) if need_state else None
    return y, S_last, A_new


def _chunk_block_dense(S0, A, q, k, v, g, objective, need_state=True):
    """The per-token-state form of :func:`_chunk_block` (a (C, N, d, m) tensor; a second reference for tests).

    q, k, g: (C, N, m); v: (C, N, d).  Returns (y (C, N, d), S at the last token, new accumulated update).
    """
    if objective == "dec":
        h = torch.einsum("ndm,cnm->cnd", S0, k) - v
        c = k
    elif objective == "enc":
        h = v
        c = torch.einsum("ndm,cnd->cnm", S0, v) - k
    else:
        h = -v
        c = k
    p = torch.einsum("ndm,cnd->cnm", S0, h)
    w = g * c
    # Δ_j = −(h_j w_jᵀ − S0 diag(p_j w_j));  U_t = S0 + A + Σ_{j≤t} Δ_j
    D = -(h.unsqueeze(-1) * w.unsqueeze(-2) - S0.unsqueeze(0) * (p * w).unsqueeze(-2))  # (C, N, d, m)
    U = S0.unsqueeze(0) + A.unsqueeze(0) + torch.cumsum(D, 0)
    St = sphere_retract(U)
    y = torch.einsum("cndm,cnm->cnd", St, q)
    return y, St[-1], U[-1] - S0
