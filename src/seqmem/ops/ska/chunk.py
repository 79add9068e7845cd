"""Spectral Koopman Attention (SKA), the chunked (parallel) form and the operator core on fixed statistics.

``mode="chunk"`` of :func:`spectral_koopman_attention` is :func:`_ska_chunk` here: per-chunk sums, exclusive
prefix sums over chunks (eqs. 8–10) and one operator per (batch, chunk, head), read by every query of the chunk
through the collapse :func:`ska_readout`.  ``mode="recurrent"`` runs the per-token reference in ``naive.py``.
The model, the collapse identity and the key normalisations are described in :mod:`seqmem.ops.ska`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from seqmem.io import check_int
from seqmem.ops._common import (
    check_action_mask,
    check_choice,
    check_mode,
    check_number,
    check_same_device,
    check_state_dict,
    check_tensor,
    floor,
    full_precision,
    values_checked,
)
from seqmem.ops.ska.naive import jittered_cholesky, ska_naive

__all__ = [
    "ska_sequence_decode",
    "ska_sequence_operator",
    "ska_spectral_scale",
    "ska_readout",
    "ska_ridge_readout",
    "ska_statistics",
    "spectral_koopman_attention",
    "ska_init_state",
]

NORMS = ("prefix_max", "seqmax", "none")
OPERATOR_FORMS = ("whitened", "unwhitened")
MODES = ("chunk", "recurrent")
STATE_KEYS = ("G", "M", "Cv", "z_prev", "m", "G_pend", "M_pend", "Cv_pend", "m_pend", "pos")


# ----------------------------------------------------------------------------------------------------
# operator core on fixed statistics
# ----------------------------------------------------------------------------------------------------
def ska_spectral_scale(A: Tensor, iters: int = 6) -> Tensor:
    """``1 / max(σ_max(A), 1)`` by ``iters`` detached power iterations from ``v₀ = 1/√r`` (eq. 12, App. D.2).

    ``A``: (..., r, r).  Returns (..., 1, 1), a constant for autograd ("straight-through").  Six iterations
    underestimate σ_max, so Prop. D.2's bound holds only approximately; ``iters`` is exposed.
    """
    with torch.no_grad():
        A = A.detach()
        r = A.shape[-1]
        v = torch.full(A.shape[:-1] + (1,), 1.0 / math.sqrt(r), dtype=A.dtype, device=A.device)
        for _ in range(iters):
            u = A @ v
            u = u / u.norm(dim=-2, keepdim=True).clamp_min(floor(1e-30, u.dtype))
            v = A.mT @ u
            v = v / v.norm(dim=-2, keepdim=True).clamp_min(floor(1e-30, v.dtype))
        sigma = (A @ v).norm(dim=-2, keepdim=True)
        return 1.0 / sigma.clamp_min(1.0)


def _cholesky(Gt: Tensor) -> Tensor:
    """Cholesky of the symmetrised ``G̃`` with the paper's jittered fallback ``G̃ + 1e-4 I`` where it
    fails."""
    return jittered_cholesky(0.5 * (Gt + Gt.mT))


def _solve_lower(L: Tensor, B: Tensor) -> Tensor:
    return torch.linalg.solve_triangular(L, B, upper=False)


def _solve_upper_t(L: Tensor, B: Tensor) -> Tensor:
    """``L⁻ᵀ B``."""
    return torch.linalg.solve_triangular(L.mT, B, upper=True)


def _whitened_operator(L: Tensor, M: Tensor) -> Tensor:
    """``A_w = L⁻¹ M L⁻ᵀ`` (eq. 22 / 62)."""
    Y = _solve_lower(L, M)
    return _solve_lower(L, Y.mT).mT


def ska_readout(
    Gt: Tensor,
    M: Tensor,
    Cv: Tensor,
    q: Tensor,
    power: int = 2,
    gamma: Tensor | float = 1.0,
    eta: Tensor | float = 1.0,
    spec_iters: int = 6,
    operator_form: str = "whitened",
) -> Tensor:
    """SKA readout on fixed statistics via the collapse ``ŷ = η cᴷ C_v (G̃⁻¹M)ᴷ G̃⁻¹ q`` (fast form).

    ``Gt`` = ``G + εI`` (..., r, r), ``M`` (..., r, r), ``Cv`` (..., P, r), ``q`` (..., r, n) (n queries).
    Returns (..., P, n).  ``operator_form="unwhitened"`` normalises ``M G̃⁻¹`` (eq. 11 reading) instead of
    ``L⁻¹ M L⁻ᵀ``: same eigenvalues, different σ_max, so only the scalar ``c`` changes — i.e.
    ``ŷ = η C_v G̃⁻¹ (c'·M G̃⁻¹)ᴷ q`` with ``c' = γ / max(σ_max(M G̃⁻¹), 1)``, wholly in unwhitened coordinates (not a
    mixed form that applies ``M G̃⁻¹`` between whitening maps).
    """
    L = _cholesky(Gt)
    Aw = _whitened_operator(L, M)
    if power > 0:
        if operator_form == "whitened":
            c = ska_spectral_scale(Aw, spec_iters) * gamma
        else:
            Ae = torch.cholesky_solve(M.mT, L).mT  # M G̃⁻¹
            c = ska_spectral_scale(Ae, spec_iters) * gamma
        u = _solve_lower(L, q)
        for _ in range(power):
            u = c * (Aw @ u)
        x = _solve_upper_t(L, u)
    else:
        x = torch.cholesky_solve(q, L)
    return eta * (Cv @ x)


def ska_ridge_readout(Gt: Tensor, Cv: Tensor, q: Tensor) -> Tensor:
    """Ridge-regression retrieval ``C_v G̃⁻¹ q`` = ``B* q`` with ``B* = argmin Σ‖v−Bk‖² + ε‖B‖²`` (Prop.
    I.2)."""
    return Cv @ torch.linalg.solve(Gt, q)


def ska_statistics(
    k: Tensor, v: Tensor, mask: Tensor | None = None, eps: float = 1e-3
) -> tuple[Tensor, Tensor, Tensor]:
    """Prefix / masked statistics, eqs. (4)–(6) and (53): ``(G̃, M, C_v)`` over all (masked) tokens.

    ``k`` (B, T, H, r), ``v`` (B, T, H, P), ``mask`` (B, T) in {0, 1} (bool, integer or floating; None: all
    ones; any other value is refused: it would weight the statistics silently).  Keys are used as given
    (normalise them first if wanted).  ``eps`` > 0, finite: the ridge of ``G̃ = G + εI``.  Returns ``G̃``
    (B, H, r, r), ``M`` (B, H, r, r), ``C_v`` (B, H, P, r).
    """
    if k.dim() != 4 or v.dim() != 4 or k.shape[:3] != v.shape[:3]:
        raise ValueError(
            f"ska_statistics: k (B,T,H,r) and v (B,T,H,P) must agree, got {tuple(k.shape)}, {tuple(v.shape)}"
        )
    eps = check_number("ska_statistics", "eps", eps, positive=True)
    if mask is not None:  # eq. 53: m_t in {0, 1} (the values are read outside torch.compile only)
        check_action_mask(mask, tuple(k.shape[:2]), k.device, "ska_statistics", values=values_checked())
    w = torch.ones(k.shape[:2], dtype=k.dtype, device=k.device) if mask is None else mask.to(k.dtype)
    r = k.shape[-1]
    G = torch.einsum("bt,bthr,bths->bhrs", w, k, k) + eps * torch.eye(r, dtype=k.dtype, device=k.device)
    M = torch.einsum("bt,bthr,bths->bhrs", w[:, 1:] * w[:, :-1], k[:, 1:], k[:, :-1])
    Cv = torch.einsum("bt,bthp,bthr->bhpr", w, v, k)
    return G, M, Cv


# ----------------------------------------------------------------------------------------------------
# chunk-causal SKA over a sequence, with a streaming state
# ----------------------------------------------------------------------------------------------------
def ska_init_state(
    batch: int, heads: int, rank: int, head_dim: int, dtype=torch.float32, device=None
) -> dict:
    """Empty SKA state: committed raw statistics, pending sums of the partial chunk, previous key, norms,
    position."""
    z = dict(dtype=dtype, device=device)
    return {
        "G": torch.zeros(batch, heads, rank, rank, **z),
        "M": torch.zeros(batch, heads, rank, rank, **z),
        "Cv": torch.zeros(batch, heads, head_dim, rank, **z),
        "z_prev": torch.zeros(batch, heads, rank, **z),
        "m": torch.zeros(batch, heads, **z),
        "G_pend": torch.zeros(batch, heads, rank, rank, **z),
        "M_pend": torch.zeros(batch, heads, rank, rank, **z),
        "Cv_pend": torch.zeros(batch, heads, head_dim, rank, **z),
        "m_pend": torch.zeros(batch, heads, **z),
        "pos": torch.zeros(batch, dtype=torch.long, device=device),
    }


def _norm_scale(m: Tensor, norm: str) -> Tensor:
    """The divisor used for keys/queries: ``m`` clamped at 1e-6 (eq. 3); 1 where no key has been seen yet."""
    if norm == "none":
        return torch.ones_like(m)
    return torch.where(m > 0, m.clamp_min(1e-6), torch.ones_like(m))


_OP = "spectral_koopman_attention"


def _validate(q, k, v, chunk_size, power, eps, norm, spec_iters, operator_form, mode, gamma=None, eta=None,
              initial_state=None):
    check_tensor(_OP, "q", q, (None, None, None, None), "batch, time, heads, r")
    check_tensor(_OP, "k", k, tuple(q.shape), "batch, time, heads, r")
    check_tensor(_OP, "v", v, (*q.shape[:3], None), "batch, time, heads, P")
    check_int("chunk_size", chunk_size, prefix=f"{_OP}: ")
    check_int("power (K)", power, 0, prefix=f"{_OP}: ")
    check_number(_OP, "eps", eps, positive=True)
    check_int("spec_iters", spec_iters, prefix=f"{_OP}: ")
    check_choice(_OP, "norm", norm, NORMS)
    check_choice(_OP, "operator_form", operator_form, OPERATOR_FORMS)
    check_mode(_OP, mode, MODES)
    extra = {f"initial_state[{key!r}]": t for key, t in (initial_state or {}).items() if isinstance(t, Tensor)}
    check_same_device(_OP, q=q, k=k, v=v, **{n: t for n, t in (("gamma", gamma), ("eta", eta))
                                              if isinstance(t, Tensor)}, **extra)


_STATE_DIMS = {"G": "batch, heads, r, r", "M": "batch, heads, r, r", "Cv": "batch, heads, P, r",
               "z_prev": "batch, heads, r", "m": "batch, heads", "pos": "batch"}


def _check_state(state, B: int, T: int, H: int, r: int, P: int) -> None:
    """Raise unless ``state`` is a dict of exactly :data:`STATE_KEYS`, each a tensor of the shape
    :func:`ska_init_state` gives (B, H, ...) (floating point; ``"pos"`` (B,) integer): a state of another batch
    size broadcast silently in the recurrent form (and failed with a bare RuntimeError in the chunked one)."""
    shapes = {"G": (B, H, r, r), "M": (B, H, r, r), "Cv": (B, H, P, r), "z_prev": (B, H, r), "m": (B, H),
              "pos": (B,)}
    base = {key: key.removesuffix("_pend") for key in STATE_KEYS}  # a pending sum has its committed twin's shape
    check_state_dict("spectral_koopman_attention", state, {k: shapes[b] for k, b in base.items()},
                     {k: _STATE_DIMS[b] for k, b in base.items()})


def spectral_koopman_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    chunk_size: int = 64,
    power: int = 2,
    eps: float = 1e-3,
    gamma: Tensor | float = 1.0,
    eta: Tensor | float = 1.0,
    norm: str = "prefix_max",
    spec_iters: int = 6,
    operator_form: str = "whitened",
    initial_state: dict | None = None,
    mode: str = "chunk",
    mask: Tensor | None = None,
    _pos0: int | None = None,
) -> tuple[Tensor, dict]:
    """Chunk-causal SKA (eqs. 7–10 + App. F), ``q, k`` (B, T, H, r), ``v`` (B, T, H, P) → ``(o (B,T,H,P), state)``.

    Token ``t`` (global position ``pos``) reads the statistics of all tokens in chunks before
    ``pos // chunk_size``.  Statistics are accumulated, and the readout solved, in the promoted dtype of q, k and
    v and at least float32, with autocast off (under ``torch.autocast`` too; ``o`` is in ``v``'s dtype).  T = 0
    returns an empty ``o`` and the state unchanged.  ``mode="recurrent"`` is the
    per-token loop (App. F steps per token, commits at chunk boundaries; ``naive.py``); ``mode="chunk"`` the
    parallel form (exclusive prefix sums + collapse).

    State (``initial_state`` and the returned one; None = :func:`ska_init_state`), raw (unnormalised) sums:

    * ``"G"``: committed key Gram ``Σ z_t z_tᵀ`` (B, H, r, r), eq. (4), without the ridge ``εI``;
    * ``"M"``: committed lag-one cross term ``Σ z_t z_{t-1}ᵀ`` (B, H, r, r), eq. (5);
    * ``"Cv"``: committed value cross term ``Σ v_t z_tᵀ`` (B, H, P, r), eq. (6);
    * ``"z_prev"``: the last key seen (B, H, r), the ``z_{t-1}`` of the next ``M`` term (times its mask, below);
    * ``"m"``: the key norm the committed statistics are read with (B, H) (see ``norm``);
    * ``"G_pend"``, ``"M_pend"``, ``"Cv_pend"``: the same sums over the current partial chunk, not yet read;
    * ``"m_pend"``: the running key-norm maximum including the partial chunk (B, H);
    * ``"pos"``: tokens seen so far (B,) int64, equal across the batch.

    ``mask`` (B, T) in {0, 1} (bool, integer or floating; None = all ones, the same computation as without a
    mask): the App. F action mask ``m_t`` of eq. (53) in this chunk-causal form.  Only tokens with ``m_t = 1``
    add to the statistics: ``G += m_t z_t z_tᵀ``, ``C_v += m_t v_t z_tᵀ`` and ``M += m_t m_{t-1} z_t z_{t-1}ᵀ``
    (a lag pair counts only when both of its tokens are in, eq. 53; across a chunk boundary and across calls
    too).  Every token is still a query and gets an output, and the key norm ``m`` of ``norm`` is still taken
    over every key (App. F normalises in step 2, before the masked accumulation of step 3).  Causal: a token's
    output uses the mask of earlier chunks only.  In the state, ``"z_prev"`` is then ``m_{t-1} z_{t-1}`` (the
    previous key if it was in, else 0), so a split sequence with its mask split alike equals one call.

    ``_pos0`` (internal): the given state's position where the caller knows it on the host (the SKA mixer, for the
    state it returned last); ``initial_state["pos"]`` is then not read (on CUDA a read is a wait for the GPU).
    """
    _validate(q, k, v, chunk_size, power, eps, norm, spec_iters, operator_form, mode, gamma, eta,
              initial_state if isinstance(initial_state, dict) else None)
    if mask is not None:
        mask = check_action_mask(mask, tuple(k.shape[:2]), k.device, "spectral_koopman_attention")
    pos0 = 0  # the stream's position: a given state's, read from the device once
    if initial_state is not None:
        _check_state(initial_state, *k.shape, v.shape[-1])
        if _pos0 is None:
            ps = initial_state["pos"].reshape(-1).tolist()
            if any(p != ps[0] for p in ps):
                raise ValueError("spectral_koopman_attention: all sequences in a batch must be at the same position")
            pos0 = ps[0] if ps else 0
        else:  # the caller knows it on the host (the SKA mixer: the state it returned last), not read again
            pos0 = _pos0
    # computed in the promoted dtype of q, k and v, at least float32 (o in v's dtype)
    out_dtype = v.dtype
    cdt = torch.promote_types(torch.promote_types(q.dtype, k.dtype), torch.promote_types(v.dtype, torch.float32))
    B, T, H, r = k.shape
    if T == 0:  # an empty piece: no output, the state unchanged (the empty state when none is given)
        st = initial_state if initial_state is not None else ska_init_state(B, H, r, v.shape[-1], cdt, k.device)
        return v.new_zeros((B, 0, H, v.shape[-1])), {key: (val.to(cdt) if val.is_floating_point() else val)
                                                     for key, val in st.items()}
    q, k, v = q.to(cdt), k.to(cdt), v.to(cdt)
    kw = dict(power=power, gamma=gamma, eta=eta, spec_iters=spec_iters, operator_form=operator_form)
    # autocast off: the statistics, the Cholesky solves and the power iterations in float32 (or float64).  Under
    # bfloat16 autocast the einsums and matmuls ran in bfloat16, and on keys spanning few directions (repeated
    # tokens) the ridge solve amplified that rounding: outputs 1e4 times too large, with no error raised
    with full_precision(k.device):
        if mode == "recurrent":
            o, st = ska_naive(q, k, v, initial_state, chunk_size=chunk_size, eps=eps, norm=norm, mask=mask,
                              _pos0=pos0, **kw)
        else:
            o, st = _ska_chunk_op(q, k, v, initial_state, chunk_size, eps, norm, mask, kw, pos0)
    return o.to(out_dtype), st


def _ska_chunk_op(q, k, v, initial_state, chunk_size, eps, norm, mask, kw, pos0):
    """``mode="chunk"`` of :func:`spectral_koopman_attention` on checked inputs (autocast off); ``pos0`` the given
    state's position (0 without one)."""
    B, T, H, r = k.shape
    P = v.shape[-1]
    out_dtype = v.dtype
    cdt = torch.promote_types(v.dtype, torch.float32)
    q, k, v = q.to(cdt), k.to(cdt), v.to(cdt)
    st = initial_state if initial_state is not None else ska_init_state(B, H, r, P, cdt, k.device)
    st = {key: (val.to(cdt) if val.is_floating_point() else val) for key, val in st.items()}
    if norm == "seqmax":
        # paper eq. (3): one max over the whole (first) input, frozen afterwards (§3.5); non-causal.
        m_fixed = k.norm(dim=-1).amax(dim=1) if pos0 == 0 else st["m"]
    else:
        m_fixed = None
    o, st = _ska_chunk(q, k, v, st, pos0, chunk_size, eps, norm, m_fixed, kw, mask)
    return o.to(out_dtype), st


def _normalised_stats(G, M, Cv, m, eps, norm):
    """Raw statistics and norm ``m`` → (G̃, M̂, Ĉ_v, divisor) of the normalised keys (the adaptive-ridge identity,
    docs/echo.md)."""
    s = _norm_scale(m, norm)
    s2 = (s * s)[..., None, None]
    eye = torch.eye(G.shape[-1], dtype=G.dtype, device=G.device)
    return G / s2 + eps * eye, M / s2, Cv / s[..., None, None], s


def _ska_chunk(q, k, v, st, pos0, S, eps, norm, m_fixed, kw, mask=None):
    """Parallel chunk-causal form: per-chunk sums, exclusive prefix sums over chunks (eqs. 8–10), one
    operator per
    (batch, chunk, head) read by all queries of that chunk with the collapse :func:`ska_readout`.  ``mask``: the
    action mask (eq. 53), applied to the keys that enter the statistics (``m_t z_t``; with ``m_t`` in {0, 1},
    ``(m_t z_t)(m_t z_t)ᵀ = m_t z_t z_tᵀ`` and ``(m_t z_t)(m_{t-1} z_{t-1})ᵀ`` is eq. 53's lag term)."""
    B, T, H, r = k.shape
    P = v.shape[-1]
    off = pos0 % S
    n_ch = (off + T + S - 1) // S
    pad_r = n_ch * S - off - T
    ks = k if mask is None else k * mask.to(k.dtype)[:, :, None, None]  # the keys the statistics see
    zp = torch.cat([st["z_prev"][:, None], ks[:, :-1]], 1)  # previous (masked) key of every token (0 at t = 0)

    def chunks(x: Tensor) -> Tensor:
        x = torch.nn.functional.pad(x, (0,) * (2 * (x.dim() - 2)) + (off, pad_r))
        return x.reshape(B, n_ch, S, *x.shape[2:])

    kc, ksc, zpc, vc, qc = chunks(k), chunks(ks), chunks(zp), chunks(v), chunks(q)
    Gc = torch.einsum("bcthr,bcths->bchrs", ksc, ksc)
    Mc = torch.einsum("bcthr,bcths->bchrs", ksc, zpc)
    Cc = torch.einsum("bcthp,bcthr->bchpr", vc, ksc)
    Gc = torch.cat([Gc[:, :1] + st["G_pend"][:, None], Gc[:, 1:]], 1)
    Mc = torch.cat([Mc[:, :1] + st["M_pend"][:, None], Mc[:, 1:]], 1)
    Cc = torch.cat([Cc[:, :1] + st["Cv_pend"][:, None], Cc[:, 1:]], 1)
    incl_G, incl_M, incl_C = Gc.cumsum(1), Mc.cumsum(1), Cc.cumsum(1)
    G_read = st["G"][:, None] + incl_G - Gc  # exclusive prefix sums (8)–(10)
    M_read = st["M"][:, None] + incl_M - Mc
    C_read = st["Cv"][:, None] + incl_C - Cc
    if norm == "prefix_max":
        nc = kc.norm(dim=-1).amax(dim=2)  # (B, C, H) chunk maxima
        nc = torch.cat([torch.maximum(nc[:, :1], st["m_pend"][:, None]), nc[:, 1:]], 1)
        run = torch.cat([st["m"][:, None], nc], 1).cummax(dim=1).values  # (B, C+1, H)
        m_read = run[:, :-1]
    elif norm == "seqmax":
        m_read = m_fixed[:, None].expand(B, n_ch, H)
    else:
        m_read = torch.ones(B, n_ch, H, dtype=k.dtype, device=k.device)
    Gt, Mn, Cn, s = _normalised_stats(G_read, M_read, C_read, m_read, eps, norm)
    Q = qc.permute(0, 1, 3, 4, 2) / s[..., None, None]  # (B, C, H, r, S)
    Y = ska_readout(Gt, Mn, Cn, Q, **kw)  # (B, C, H, P, S)
    o = Y.permute(0, 1, 4, 2, 3).reshape(B, n_ch * S, H, P)[:, off : off + T]
    # final state: chunks with index < n_full are complete (committed); chunk n_full (if any) is pending
    n_full = (off + T) // S
    zero_rr = torch.zeros(B, H, r, r, dtype=k.dtype, device=k.device)
    if n_full > 0:
        G, M, Cv = (
            st["G"] + incl_G[:, n_full - 1],
            st["M"] + incl_M[:, n_full - 1],
            st["Cv"] + incl_C[:, n_full - 1],
        )
    else:
        G, M, Cv = st["G"], st["M"], st["Cv"]
    if n_full < n_ch:
        Gp, Mp, Cp = Gc[:, n_full], Mc[:, n_full], Cc[:, n_full]
    else:
        Gp, Mp, Cp = zero_rr, zero_rr.clone(), torch.zeros(B, H, P, r, dtype=k.dtype, device=k.device)
    if norm == "prefix_max":
        m = run[:, n_full]
        mp = nc[:, n_full] if n_full < n_ch else torch.zeros_like(st["m_pend"])
    elif norm == "seqmax":
        m, mp = m_fixed, st["m_pend"]
    else:
        m, mp = st["m"], st["m_pend"]
    new = {
        "G": G,
        "M": M,
        "Cv": Cv,
        "z_prev": ks[:, -1],
        "m": m,
        "G_pend": Gp,
        "M_pend": Mp,
        "Cv_pend": Cp,
        "m_pend": mp,
        "pos": st["pos"] + T,
    }
    return o, new


# one operator per sequence (App. F eq. 53; eqs. 4-6 without a mask), NON-CAUSAL:
# the ska mixer's operator_scope="sequence"
def ska_sequence_operator(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, eps: float, norm: str,
                          kw: dict) -> tuple[Tensor, dict[str, Tensor]]:
    """The one-operator form: keys and queries divided by the key norm ``m`` (with ``prefix_max`` the maximum over
    every key up to the row's last ``m_t = 1`` token; the ``ska`` mixer's ``operator_scope="sequence"``),
    ``(G̃, M, C_v) = ska_statistics(k̂, v, mask)`` (eq. 53) and ``ska_readout`` of every query (eq. 13, App. F).
    ``q, k`` (B, T, H, r), ``v`` (B, T, H, P) → ``(o (B, T, H, P), state)``; computed in at least float32 with
    autocast off, ``o`` in ``v``'s dtype."""
    with full_precision(k.device):  # autocast off, as spectral_koopman_attention
        return _ska_sequence_operator(q, k, v, mask, eps, norm, kw)


def _ska_sequence_operator(q, k, v, mask, eps, norm, kw):
    B, T, H, r = k.shape
    out_dtype, cdt = v.dtype, torch.promote_types(v.dtype, torch.float32)  # statistics in at least float32
    q, k, v = q.to(cdt), k.to(cdt), v.to(cdt)
    if norm == "none":
        m = torch.zeros(B, H, dtype=cdt, device=k.device)
    else:
        norms = k.norm(dim=-1)  # (B, T, H): every key, masked-out ones included (App. F step 2)
        if norm == "prefix_max" and mask is not None:
            # the keys up to the row's last m_t = 1 token: a reversed running max of the mask
            reach = mask.to(cdt).flip(1).cummax(1).values.flip(1)
            norms = norms * reach[..., None]
        m = norms.amax(1)
    s = _norm_scale(m, norm)[:, None, :, None]  # (B, 1, H, 1); 1 where no key counts (eq. 3's clamp otherwise)
    kh, qh = k / s, q / s
    Gt, M, Cv = ska_statistics(kh, v, None if mask is None else mask.to(cdt), eps=eps)  # eqs. (4)-(6), (53)
    o = ska_readout(Gt, M, Cv, qh.permute(0, 2, 3, 1), **kw).permute(0, 3, 1, 2)  # (B, H, P, T) → (B, T, H, P)
    eye = torch.eye(r, dtype=cdt, device=k.device)
    last = kh[:, -1] if mask is None else mask[:, -1].to(cdt)[:, None, None] * kh[:, -1]  # m_T ẑ_T, for eq. (5)
    state = {"G": Gt - eps * eye, "M": M, "Cv": Cv, "z_prev": last, "m": m,
             "pos": torch.full((B,), T, dtype=torch.long, device=k.device)}
    return o.to(out_dtype), state


# the prefix mode continued (§3.5): the ska mixer's operator_scope="sequence" with prefix_decode=True
def ska_sequence_decode(q: Tensor, k: Tensor, v: Tensor, state: dict[str, Tensor], mask: Tensor | None,
                        eps: float, norm: str, kw: dict) -> tuple[Tensor, dict[str, Tensor]]:
    """§3.5's decoding of the prefix mode: the tokens after a prefix update its statistics incrementally and each is
    read through the operator that includes it (``G_t = G_prefix + Σ_{s≤t} m_s ẑ_s ẑ_sᵀ``, ``M`` and ``C_v``
    alike, eqs. 4-6 / 53 continued), with the prefix's key norm ``m`` frozen (§3.2.1: "during autoregressive
    decoding, m is frozen at the prefill value").  ``state`` is the one-operator
    state (``G, M, C_v`` without ``εI``, ``z_prev``, ``m``, ``pos``) of :func:`ska_sequence_operator` or of an
    earlier call of this one, so a continuation split into calls equals one call.  Fast form: inclusive prefix sums
    of the outer products and one batched readout per (batch, token, head).  ``q, k`` (B, T, H, r), ``v``
    (B, T, H, P) → ``(o (B, T, H, P), state)``; at least float32, autocast off, ``o`` in ``v``'s dtype."""
    with full_precision(k.device):
        return _ska_sequence_decode(q, k, v, state, mask, eps, norm, kw)


def _ska_sequence_decode(q, k, v, st, mask, eps, norm, kw):
    B, T, H, r = k.shape
    out_dtype, cdt = v.dtype, torch.promote_types(v.dtype, torch.float32)
    q, k, v = q.to(cdt), k.to(cdt), v.to(cdt)
    s = _norm_scale(st["m"].to(cdt), norm)[:, None, :, None]  # the prefix's norm, frozen (§3.2.1)
    z = k / s if mask is None else mask.to(cdt)[:, :, None, None] * (k / s)  # m_t ẑ_t
    z_prev = torch.cat([st["z_prev"].to(cdt)[:, None], z[:, :-1]], 1)
    G = st["G"].to(cdt)[:, None] + torch.einsum("bthr,bths->bthrs", z, z).cumsum(1)
    M = st["M"].to(cdt)[:, None] + torch.einsum("bthr,bths->bthrs", z, z_prev).cumsum(1)
    Cv = st["Cv"].to(cdt)[:, None] + torch.einsum("bthp,bthr->bthpr", v, z).cumsum(1)
    eye = torch.eye(r, dtype=cdt, device=k.device)
    o = ska_readout(G + eps * eye, M, Cv, (q / s)[..., None], **kw)[..., 0]  # (B, T, H, P)
    new = {"G": G[:, -1], "M": M[:, -1], "Cv": Cv[:, -1], "z_prev": z[:, -1], "m": st["m"],
           "pos": st["pos"] + T}
    return o.to(out_dtype), new
