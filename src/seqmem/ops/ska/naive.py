"""Spectral Koopman Attention (SKA), the recurrent reference: one token at a time, App. F's readout step by step.

``ska_naive`` is ``mode="recurrent"`` of :func:`seqmem.ops.spectral_koopman_attention`; :func:`ska_readout_appf`
is App. F (steps 4–10) on fixed statistics.  Neither shares a casting, state-reading, factorisation or
power-iteration helper with the chunked form in ``chunk.py``, so the test that compares the two can catch a bug
in either.  Inputs are assumed valid (the public op checks them first).

Tensors are ``q, k: (B, T, H, r)``, ``v: (B, T, H, P)``; the state is the dict of raw statistics
``{"G", "M", "Cv"}`` committed by complete chunks, the pending sums ``{"G_pend", "M_pend", "Cv_pend"}`` of the
current partial chunk, the previous key ``"z_prev"``, the key norms ``"m"`` / ``"m_pend"`` and ``"pos"``.
Equation numbers are those of the Echo paper (see :mod:`seqmem.ops.ska`).
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import Tensor

__all__ = ["ska_readout_appf", "ska_sequence_decode_naive", "ska_sequence_operator_naive"]


#: device types on which :func:`jittered_cholesky` reads whether any factorisation failed (and computes the jittered
#: one only then); elsewhere it always computes both and selects, without the read (on CUDA a read is a wait for
#: every kernel queued before it)
READ_STATUS_ON = ("cpu",)


def jittered_cholesky(Gs: Tensor) -> Tensor:
    """Lower Cholesky factor of the symmetric ``Gs`` (..., r, r), with App. F's fallback: that of ``Gs + 1e-4 I``
    for each matrix whose factorisation fails.  The same values whether or not the failure status is read
    (:data:`READ_STATUS_ON`).  The factor returned is one factorisation of ``Gs + 1e-4·failed·I``, so the gradient
    of a rescued matrix is that of its jittered factor (selecting between two factors sent a zero gradient
    through the failed one, whose zero pivot made it NaN)."""
    if Gs.device.type in READ_STATUS_ON:
        L, info = torch.linalg.cholesky_ex(Gs)
        failed = info > 0
        if not bool(failed.any()):
            return L
    else:
        failed = torch.linalg.cholesky_ex(Gs.detach())[1] > 0
    eye = torch.eye(Gs.shape[-1], dtype=Gs.dtype, device=Gs.device)
    return torch.linalg.cholesky_ex(Gs + (1e-4 * failed.to(Gs.dtype))[..., None, None] * eye)[0]


def ska_readout_appf(
    Gt: Tensor, M: Tensor, Cv: Tensor, q: Tensor, power: int = 2, gamma: Tensor | float = 1.0,
    eta: Tensor | float = 1.0, spec_iters: int = 6, operator_form: str = "whitened",
) -> Tensor:
    """SKA readout exactly as the steps of App. F (4–10): ``B_v = C_v G̃⁻¹``, ``w_q = L⁻¹q``, ``w_f = Âᴷ w_q``,
    ``ŷ = η B_v L w_f``.

    ``Gt`` = ``G + εI`` (..., r, r), ``M`` (..., r, r), ``Cv`` (..., P, r), ``q`` (..., r, n) (n queries);
    returns (..., P, n).  Same signature and result as :func:`seqmem.ops.ska_readout` (the collapsed form)."""
    r = Gt.shape[-1]
    # 4. G̃ = L Lᵀ (symmetrised); where the factorisation fails, that of G̃ + 1e-4 I                       (App. F)
    L = jittered_cholesky(0.5 * (Gt + Gt.mT))
    # 5. A_w = L⁻¹ M L⁻ᵀ                                                                                  (eq. 22)
    Aw = torch.linalg.solve_triangular(L.mT, torch.linalg.solve_triangular(L, M, upper=False), upper=True, left=False)
    # 6. Â = γ A_w / max(σ_max, 1): σ_max of A_w (or of M G̃⁻¹, "unwhitened") by detached power iterations  (eq. 12)
    N = Aw if operator_form == "whitened" else M @ torch.cholesky_inverse(L)
    with torch.no_grad():
        N = N.detach()

        def unit(y):  # y / ‖y‖, 0 stays 0 (the clamp is positive in y's dtype: float16 under autocast)
            return y / y.norm(dim=-2, keepdim=True).clamp_min(max(1e-30, float(torch.finfo(y.dtype).tiny)))

        x = torch.full((*N.shape[:-1], 1), 1.0 / math.sqrt(r), dtype=N.dtype, device=N.device)
        for _ in range(spec_iters):
            x = unit(N.mT @ unit(N @ x))
        inv_sigma = 1.0 / (N @ x).norm(dim=-2, keepdim=True).clamp_min(1.0)
    A_hat = Aw * inv_sigma * gamma
    # 7. B_v = C_v G̃⁻¹ = C_v L⁻ᵀ L⁻¹                                                                      (App. F)
    Bv = torch.linalg.solve_triangular(L, torch.linalg.solve_triangular(L.mT, Cv, upper=True, left=False),
                                       upper=False, left=False)  # fmt: skip
    # 8. w = L⁻¹ q                                                                                        (App. F)
    w = torch.linalg.solve_triangular(L, q, upper=False)
    # 9. w ← Â w, K = power times                                                                         (eq. 13)
    for _ in range(power):
        w = A_hat @ w
    # 10. ŷ = η B_v L w                                                                                   (eq. 13)
    return eta * (Bv @ (L @ w))


def ska_naive(
    q: Tensor, k: Tensor, v: Tensor, initial_state: dict | None = None, *, chunk_size: int = 64, eps: float = 1e-3,
    norm: str = "prefix_max", power: int = 2, gamma: Tensor | float = 1.0, eta: Tensor | float = 1.0,
    spec_iters: int = 6, operator_form: str = "whitened", mask: Tensor | None = None, _pos0: int | None = None,
) -> tuple[Tensor, dict]:
    """Chunk-causal SKA token by token: read the statistics committed by earlier chunks, then add the token to the
    pending sums and commit them at the end of its chunk.  ``mask`` (B, T) in {0, 1}: the action mask of eq. (53),
    a token adds to the sums only when its ``m_t = 1`` (and to ``M`` only when ``m_{t-1} = 1`` too).  ``_pos0``:
    the state's position where the caller has read it already (else it is read here).  Returns
    ``(o (B, T, H, P), state)``."""
    B, T, H, r = k.shape
    P = v.shape[-1]
    out_dtype, dt = v.dtype, torch.promote_types(v.dtype, torch.float32)  # statistics in at least float32
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    eye = torch.eye(r, dtype=dt, device=k.device)
    st = {} if initial_state is None else initial_state

    def read(key, *shape):
        return st[key].to(dt) if key in st else torch.zeros(*shape, dtype=dt, device=k.device)

    G, M, Cv = read("G", B, H, r, r), read("M", B, H, r, r), read("Cv", B, H, P, r)
    G_pend, M_pend, Cv_pend = read("G_pend", B, H, r, r), read("M_pend", B, H, r, r), read("Cv_pend", B, H, P, r)
    z_prev, m, m_pend = read("z_prev", B, H, r), read("m", B, H), read("m_pend", B, H)  # z_prev: mask_{t-1}·z_{t-1}
    if _pos0 is not None:  # the caller read it (spectral_koopman_attention reads the device once)
        pos = _pos0
    else:
        pos = int(st["pos"].reshape(-1)[0]) if "pos" in st and st["pos"].numel() else 0
    if norm == "seqmax":  # one max over the whole first input, frozen afterwards (non-causal)   (eq. 3, §3.5)
        m = k.norm(dim=-1).amax(dim=1) if pos == 0 else m
    outs = []
    for t in range(T):
        z, zq, vt = k[:, t], q[:, t], v[:, t]  # (B,H,r), (B,H,r), (B,H,P)
        # 1. the key divisor s = max(m, 1e-6), 1 before any key (and always for norm="none")                 (eq. 3)
        s = torch.where(m > 0, m.clamp_min(1e-6), torch.ones_like(m)) if norm != "none" else torch.ones_like(m)
        s1, s2 = s[..., None, None], (s * s)[..., None, None]
        # 2. the statistics of the normalised keys: G/s² + εI, M/s², C_v/s (adaptive ridge, docs/echo.md)   (eqs. 4–6)
        # 3. ŷ_t = App. F readout of the query z^q_t / s                                                   (eq. 13)
        outs.append(ska_readout_appf(G / s2 + eps * eye, M / s2, Cv / s1, (zq / s[..., None])[..., None],
                                     power, gamma, eta, spec_iters, operator_form)[..., 0])  # fmt: skip
        # 4. pending sums of the tokens with m_t = 1: G += z zᵀ, M += z z_prevᵀ (z_prev = 0 unless m_{t-1} = 1),
        #    C_v += v zᵀ                                                                          (eqs. 4–6, 53)
        if mask is not None:
            on = mask[:, t].to(dt) != 0  # (B,)
            z_in = torch.where(on[:, None, None], z, torch.zeros_like(z))
        else:
            z_in = z
        G_pend = G_pend + z_in[..., :, None] * z_in[..., None, :]
        M_pend = M_pend + z_in[..., :, None] * z_prev[..., None, :]
        Cv_pend = Cv_pend + vt[..., :, None] * z_in[..., None, :]
        # 5. prefix max of the key norms over the pending chunk, every key (App. F step 2)        (norm="prefix_max")
        if norm == "prefix_max":
            m_pend = torch.maximum(m_pend, z.norm(dim=-1))
        z_prev = z_in
        pos += 1
        # 6. at the end of a chunk, commit: the next chunk reads G + G_pend, ...                       (eqs. 8–10)
        if pos % chunk_size == 0:
            G, M, Cv = G + G_pend, M + M_pend, Cv + Cv_pend
            G_pend, M_pend, Cv_pend = torch.zeros_like(G_pend), torch.zeros_like(M_pend), torch.zeros_like(Cv_pend)
            if norm == "prefix_max":
                m, m_pend = torch.maximum(m, m_pend), torch.zeros_like(m_pend)
    state = {"G": G, "M": M, "Cv": Cv, "z_prev": z_prev, "m": m, "G_pend": G_pend, "M_pend": M_pend,
             "Cv_pend": Cv_pend, "m_pend": m_pend, "pos": torch.full((B,), pos, dtype=torch.long, device=k.device)}
    return torch.stack(outs, 1).to(out_dtype), state


# one operator per sequence (App. F eq. 53; eqs. 4-6 without a mask), NON-CAUSAL:
# the ska mixer's operator_scope="sequence"
def ska_sequence_operator_naive(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, eps: float,
                                norm: str, kw: dict) -> tuple[Tensor, dict[str, Tensor]]:
    """The same, token by token and step by step: the key norm by a loop over the keys up to each row's last
    ``m_t = 1`` token, the eq. (53) sums ``G += m_t ẑ_t ẑ_tᵀ``, ``M += m_t m_{t-1} ẑ_t ẑ_{t-1}ᵀ``,
    ``C_v += m_t v_t ẑ_tᵀ`` one token at a time, then App. F steps 4-10 (:func:`ska_readout_appf`) for every query.
    Shares no statistics, norm or readout code with :func:`seqmem.ops.ska.chunk.ska_sequence_operator`.  Computed in
    at least float32 with autocast off (``o`` in ``v``'s dtype)."""
    dev = k.device.type
    with torch.autocast(dev, enabled=False) if torch.is_autocast_enabled(dev) else contextlib.nullcontext():
        return _sequence_operator(q, k, v, mask, eps, norm, kw)


def _divisor(m: Tensor, norm: str) -> Tensor:
    """What keys and queries are divided by: the key norm ``m`` clamped at 1e-6, 1 where it is 0 or for
    ``norm="none"``."""
    return torch.where(m > 0, torch.clamp(m, min=1e-6), torch.ones_like(m)) if norm != "none" else torch.ones_like(m)


def _add_token(G: Tensor, M: Tensor, Cv: Tensor, z_prev: Tensor, z: Tensor, v_t: Tensor
               ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One token into eq. (53)'s sums: ``G += z zᵀ``, ``M += z z_prevᵀ``, ``C_v += v zᵀ`` (``z`` = ``m_t ẑ_t``, zero
    for a masked-out token); returns the sums and ``z`` as the next ``z_prev``."""
    return (G + z[..., :, None] * z[..., None, :], M + z[..., :, None] * z_prev[..., None, :],
            Cv + v_t[..., :, None] * z[..., None, :], z)


def _sequence_operator(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, eps: float, norm: str,
                       kw: dict) -> tuple[Tensor, dict[str, Tensor]]:
    B, T, H, r = k.shape
    P = v.shape[-1]
    out_dtype, dt = v.dtype, torch.promote_types(v.dtype, torch.float32)
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    w = torch.ones(B, T, dtype=dt, device=k.device) if mask is None else mask.to(dt)
    # 1. the key norm m (eq. 3): max ‖z_t‖ over t ≤ the row's last fact (prefix_max with a mask), over every t
    #    (seqmax, or no mask), or none
    rows = []
    for b in range(B):
        on = [t for t in range(T) if float(w[b, t]) != 0]
        last = T - 1 if (norm == "seqmax" or mask is None) else (on[-1] if on else -1)
        mb = torch.zeros(H, dtype=dt, device=k.device)
        for t in range(last + 1):
            mb = torch.maximum(mb, torch.sqrt((k[b, t] ** 2).sum(-1)))
        rows.append(mb)
    m = torch.stack(rows) if norm != "none" else torch.zeros(B, H, dtype=dt, device=k.device)
    div = _divisor(m, norm)
    # 2. the masked sums of eq. (53), one token at a time
    G = torch.zeros(B, H, r, r, dtype=dt, device=k.device)
    M = torch.zeros(B, H, r, r, dtype=dt, device=k.device)
    Cv = torch.zeros(B, H, P, r, dtype=dt, device=k.device)
    z_prev = torch.zeros(B, H, r, dtype=dt, device=k.device)  # m_{t-1} ẑ_{t-1}
    for t in range(T):
        G, M, Cv, z_prev = _add_token(G, M, Cv, z_prev, w[:, t, None, None] * k[:, t] / div[..., None], v[:, t])
    # 3. App. F steps 4-10 on G + εI for every query ẑ^q_t = z^q_t / m
    Gt = G + eps * torch.eye(r, dtype=dt, device=k.device)
    Q = (q / div[:, None, :, None]).permute(0, 2, 3, 1)  # (B, H, r, T)
    o = ska_readout_appf(Gt, M, Cv, Q, **kw).permute(0, 3, 1, 2)
    state = {"G": G, "M": M, "Cv": Cv, "z_prev": z_prev, "m": m,
             "pos": torch.full((B,), T, dtype=torch.long, device=k.device)}
    return o.to(out_dtype), state


def ska_sequence_decode_naive(q: Tensor, k: Tensor, v: Tensor, state: dict[str, Tensor], mask: Tensor | None,
                              eps: float, norm: str, kw: dict) -> tuple[Tensor, dict[str, Tensor]]:
    """§3.5's prefix-mode decoding one token at a time: add ``m_t ẑ_t ẑ_tᵀ``, ``m_t m_{t-1} ẑ_t ẑ_{t-1}ᵀ``,
    ``m_t v_t ẑ_tᵀ`` to the state's sums (keys and queries divided by the state's frozen norm), then read the token's
    query through App. F steps 4-10 on the updated statistics.  The reference of
    :func:`seqmem.ops.ska.chunk.ska_sequence_decode`."""
    dev = k.device.type
    with torch.autocast(dev, enabled=False) if torch.is_autocast_enabled(dev) else contextlib.nullcontext():
        B, T, H, r = k.shape
        out_dtype, dt = v.dtype, torch.promote_types(v.dtype, torch.float32)
        q, k, v = q.to(dt), k.to(dt), v.to(dt)
        w = torch.ones(B, T, dtype=dt, device=k.device) if mask is None else mask.to(dt)
        div = _divisor(state["m"].to(dt), norm)
        G, M, Cv = state["G"].to(dt), state["M"].to(dt), state["Cv"].to(dt)
        z_prev = state["z_prev"].to(dt)
        eye = torch.eye(r, dtype=dt, device=k.device)
        outs = []
        for t in range(T):
            G, M, Cv, z_prev = _add_token(G, M, Cv, z_prev, w[:, t, None, None] * k[:, t] / div[..., None], v[:, t])
            outs.append(ska_readout_appf(G + eps * eye, M, Cv, (q[:, t] / div[..., None])[..., None], **kw)[..., 0])
        o = torch.stack(outs, 1)
        new = {"G": G, "M": M, "Cv": Cv, "z_prev": z_prev, "m": state["m"], "pos": state["pos"] + T}
        return o.to(out_dtype), new
