"""Lattice / Orthogonal State Recurrence (Karami & Mirrokni 2025, *Lattice: Learning to Efficiently Compress
the Memory*).

Per head the state ``S ∈ R^{d×m}`` holds ``m`` memory slots (columns ``s_i``).  Each token takes ONE gradient
step on a ½-loss (the factor 2 of eq. 5 lives in the step size ``γ_t``):

* ``"dec"`` (eqs. 6-8): ½‖φ(S)k − v‖²; column i moves by −γ k_i/‖s_i‖ · P(s_i) e, e = φ(S)k − v
* ``"enc"`` (eqs. 9-10, 21): ½‖φ(S)ᵀv − k‖²; column i moves by −γ e_i/‖s_i‖ · P(s_i) v, e_i = φ_iᵀv − k_i
* ``"sim"`` (eqs. 11-12): −⟨φ(S)ᵀv, k⟩; column i moves by +γ k_i/‖s_i‖ · P(s_i) v
* ``"ttt"`` (eq. 19, the paper's model of TTT): ½‖φ(Sk) − v‖²; rank-1 update −γ (P(z)e/‖z‖) kᵀ, z = Sk
* ``"delta"`` (eq. 20, Remark 3.3): ½‖Sk − v‖²; S ← S − γ (Sk − v) kᵀ (DeltaNet)

with ``φ(S)`` the column normalisation and ``P(s) = I − ssᵀ/‖s‖²`` (general OSR form: eq. 13).
``normalize=True`` projects every slot back onto the unit sphere after the step (eq. 14, "NOSR", the Lattice
default; the slots then stay unit-norm, so ``φ(S) = S``).  ``forget`` multiplies the old state by μ_t (L2
forget gate, eq. 16).  ``l1`` applies the soft-threshold prox with threshold γ_t·λ_t after the gradient step
(ISTA, eq. 18 corrected as in docs/lattice.md: gradient at S_{t-1}, threshold γλ; order GD → prox → retraction).
The
read-out uses the UPDATED state: ``y_t = S_t q_t`` (eq. 13).

Layout (flash-linear-attention style): ``q, k: (B, T, H, m)``, ``v: (B, T, H, d)``, ``gamma: (B, T, H)``
(per head) or ``(B, T, H, m)`` (per slot), ``forget: (B, T, H)``, ``l1: (B, T, H)`` or a float; the state is
``(B, H, d, m)``.  ``mode="recurrent"`` is the plain per-token loop differentiated by autograd (the
reference).  ``mode="scan"`` is the same recurrence, exactly, with a hand-derived backward that recomputes the
states chunk by chunk (memory O(T/C·d·m + C·d·m) per head instead of O(T·d·m)); it runs in a fused C++ kernel
(``_lattice_kernel.cpp``, built on first use) or, without a compiler, in PyTorch.  The update is non-linear in
the state, so there is NO exact chunk-parallel form; :func:`lattice_chunked` is the TTT-style mini-batch
approximation (docs/lattice.md): a different model.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from seqmem.ops import _lattice_cpp
from seqmem.ops._common import floor

__all__ = [
    "LATTICE_OBJECTIVES",
    "lattice_chunked",
    "lattice_scan",
    "lattice_step",
    "orthonormal_slots",
    "soft_threshold",
    "sphere_retract",
]

LATTICE_OBJECTIVES = ("dec", "enc", "sim", "ttt", "delta")
_OSR = ("dec", "enc", "sim")
_MODES = ("recurrent", "scan")


# ------------------------------------------------------------------------------------------------------------
# building blocks
# ------------------------------------------------------------------------------------------------------------
def orthonormal_slots(
    n: int, d: int, m: int, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float32
) -> Tensor:
    """``n`` random ``d×m`` matrices with orthonormal columns (QR of a Gaussian, sign-fixed); ``m ≤ d``."""
    for name, val in (("n", n), ("d", d), ("m", m)):
        if isinstance(val, bool) or not isinstance(val, int) or val <= 0:
            raise ValueError(f"orthonormal_slots: {name} must be a positive integer, got {val!r}")
    if m > d:
        raise ValueError(
            f"orthonormal_slots: m={m} slots cannot be orthonormal in dimension d={d} "
            "(the paper's S_0 needs m <= d)"
        )
    a = torch.randn(n, d, m, generator=generator, dtype=torch.float64)
    qm, r = torch.linalg.qr(a)
    qm = qm * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    return qm.to(dtype)


def sphere_retract(u: Tensor, eps: float = 1e-12) -> Tensor:
    """Project every column of ``u (..., d, m)`` onto the unit sphere: ``u_i / ‖u_i‖`` (eq. 14).

    For ``u = s + Δ`` with ``‖s‖ = 1`` and ``Δ ⊥ s`` this equals the paper's ``(1 + ‖Δ‖²)^{-1/2} (s + Δ)``.
    """
    return u / torch.linalg.vector_norm(u, dim=-2, keepdim=True).clamp_min(floor(eps, u.dtype))


def soft_threshold(x: Tensor, tau: Tensor | float) -> Tensor:
    """``prox_{τ‖·‖₁}(x) = sign(x)·max(|x| − τ, 0)`` elementwise (eq. 18)."""
    return torch.sign(x) * torch.relu(x.abs() - tau)


def lattice_step(
    S: Tensor,
    k: Tensor,
    v: Tensor,
    gamma: Tensor,
    *,
    objective: str = "dec",
    normalize: bool = True,
    forget: Tensor | None = None,
    l1: Tensor | None = None,
    eps: float = 1e-12,
) -> Tensor:
    """One token ``S_{t-1} (..., d, m) → S_t``: eqs. 7/10/12 as eq. 13 [+16] [+18] [+14]; eq. 19; eq. 20.

    ``k (..., m)``, ``v (..., d)``, ``gamma (..., m)`` (a per-head step broadcast to the slots), ``forget
    (...)``, ``l1 (..., 1)`` (λ_t; the threshold is γ_t λ_t).  With ``normalize`` the slots are on the unit
    sphere by construction, so ``φ(S) = S``; without it ``φ`` divides by the actual column norms.
    """
    if objective in _OSR:
        if normalize:
            Sb, inv_n = S, None
        else:
            inv_n = 1.0 / torch.linalg.vector_norm(S, dim=-2).clamp_min(floor(eps, S.dtype))  # 1/‖s_i‖
            Sb = S * inv_n.unsqueeze(-2)  # φ(S)
        if objective == "dec":
            h = (Sb @ k.unsqueeze(-1)).squeeze(-1) - v  # e_t = φ(S)k − v
            c = k
        elif objective == "enc":
            h = v
            c = (Sb.transpose(-1, -2) @ v.unsqueeze(-1)).squeeze(-1) - k  # e_t = φ(S)ᵀv − k
        else:  # sim
            h = -v
            c = k
        p = (Sb.transpose(-1, -2) @ h.unsqueeze(-1)).squeeze(-1)  # ⟨φ_i, h⟩
        w = gamma * c if inv_n is None else gamma * c * inv_n  # γ c_i / ‖s_i‖
        # column i: −w_i · P(s_i) h = −w_i (h − φ_i ⟨φ_i, h⟩)
        dS = -(h.unsqueeze(-1) * w.unsqueeze(-2) - Sb * (p * w).unsqueeze(-2))
    elif objective == "ttt":
        z = (S @ k.unsqueeze(-1)).squeeze(-1)
        nz = torch.linalg.vector_norm(z, dim=-1, keepdim=True).clamp_min(floor(eps, z.dtype))
        vh = z / nz  # φ(S k)
        e = vh - v
        pe = (e - vh * (vh * e).sum(-1, keepdim=True)) / nz  # P(z) e / ‖z‖
        dS = -pe.unsqueeze(-1) * (gamma * k).unsqueeze(-2)
    elif objective == "delta":
        e = (S @ k.unsqueeze(-1)).squeeze(-1) - v
        dS = -e.unsqueeze(-1) * (gamma * k).unsqueeze(-2)
    else:
        raise ValueError(f"objective must be one of {list(LATTICE_OBJECTIVES)}, got {objective!r}")
    U = S + dS if forget is None else forget[..., None, None] * S + dS  # eq. 16: μ_t S_{t-1} − γ_t ∇
    if l1 is not None:
        U = soft_threshold(U, (gamma * l1).unsqueeze(-2))  # eq. 18: prox after the GD step
    if normalize:
        U = sphere_retract(U, eps)  # eq. 14
    return U


# ------------------------------------------------------------------------------------------------------------
# argument handling
# ------------------------------------------------------------------------------------------------------------
def _check(q, k, v, gamma, initial_state, objective, normalize, forget, l1, mode, chunk_size):
    if objective not in LATTICE_OBJECTIVES:
        raise ValueError(f"objective must be one of {list(LATTICE_OBJECTIVES)}, got {objective!r}")
    if mode not in _MODES:
        hint = " (non-linear recurrence: no exact chunk form; see lattice_chunked)" if mode == "chunk" else ""
        raise ValueError(f"mode must be one of {list(_MODES)}, got {mode!r}{hint}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            got = getattr(t, "shape", type(t).__name__)
            raise ValueError(f"{name} must be a (batch, time, heads, dim) tensor, got {got}")
        if not t.is_floating_point():
            raise ValueError(f"{name} must be floating point, got {t.dtype}")
    B, T, H, m = k.shape
    if q.shape != k.shape:
        raise ValueError(f"q must have the shape of k {tuple(k.shape)}, got {tuple(q.shape)}")
    if v.shape[:3] != (B, T, H):
        raise ValueError(f"v must be (batch={B}, time={T}, heads={H}, d), got {tuple(v.shape)}")
    d = v.shape[-1]
    if T == 0 or B == 0:
        raise ValueError("empty input (batch and time must be >= 1)")
    if objective in _OSR and normalize and m > d:
        raise ValueError(f"slots m={m} > slot dimension d={d}: unit slots from orthonormal S_0 need m <= d")
    if isinstance(gamma, Tensor):
        if gamma.shape not in ((B, T, H), (B, T, H, m)):
            raise ValueError(f"gamma must be (B, T, H)=({B}, {T}, {H}) or (B, T, H, m), got {gamma.shape}")
    elif not isinstance(gamma, (int, float)) or isinstance(gamma, bool):
        raise ValueError(f"gamma must be a tensor or a number, got {gamma!r}")
    if forget is not None and (not isinstance(forget, Tensor) or forget.shape != (B, T, H)):
        raise ValueError(f"forget must be a (B, T, H)=({B}, {T}, {H}) tensor or None, got {forget!r:.80}")
    if l1 is not None:
        if isinstance(l1, Tensor):
            if l1.shape != (B, T, H):
                raise ValueError(f"l1 must be (B, T, H)=({B}, {T}, {H}) or a float, got {tuple(l1.shape)}")
        elif isinstance(l1, bool) or not isinstance(l1, (int, float)) or l1 < 0:
            raise ValueError(f"l1 must be a non-negative float or a tensor, got {l1!r}")
    if initial_state is not None and (
        not isinstance(initial_state, Tensor) or initial_state.shape != (B, H, d, m)
    ):
        got = getattr(initial_state, "shape", initial_state)
        raise ValueError(f"initial_state must be (B, H, d, m)=({B}, {H}, {d}, {m}), got {got}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    return B, T, H, m, d


def _prepare(q, k, v, gamma, initial_state, normalize, forget, l1, objective):
    """To the internal layout: time first, (batch·heads) merged."""
    B, T, H, m = k.shape
    d = v.shape[-1]
    N = B * H
    dt = torch.promote_types(k.dtype, v.dtype)
    if not isinstance(gamma, Tensor):
        gamma = torch.full((B, T, H), float(gamma), dtype=dt, device=k.device)
    if gamma.dim() == 3:
        gamma = gamma.unsqueeze(-1).expand(B, T, H, m)

    def tf(x):  # (B, T, H, ...) -> (T, N, ...)
        return x.transpose(0, 1).reshape(T, N, *x.shape[3:])

    S0 = initial_state
    if S0 is None:
        S0 = torch.eye(d, m, dtype=dt, device=k.device).expand(N, d, m)
    else:
        S0 = S0.reshape(N, d, m)
    if normalize and objective in _OSR:
        S0 = sphere_retract(S0)  # the slots live on the sphere (a no-op up to rounding for unit slots)
    mu = None if forget is None else tf(forget)
    lam = None
    if l1 is not None:
        lam = l1 if isinstance(l1, Tensor) else torch.full((B, T, H), float(l1), dtype=dt, device=k.device)
        lam = tf(lam).unsqueeze(-1)  # (T, N, 1)
    return tf(q), tf(k), tf(v), tf(gamma), S0, mu, lam


# ------------------------------------------------------------------------------------------------------------
# the scan
# ------------------------------------------------------------------------------------------------------------
def lattice_scan(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gamma: Tensor | float,
    initial_state: Tensor | None = None,
    *,
    objective: str = "dec",
    normalize: bool = True,
    forget: Tensor | None = None,
    l1: Tensor | float | None = None,
    mode: str = "scan",
    chunk_size: int = 64,
    eps: float = 1e-12,
    backend: str = "auto",
) -> tuple[Tensor, Tensor]:
    """The Lattice / OSR recurrence over a sequence.  Returns ``(y (B,T,H,d), S_T (B,H,d,m))``.

    ``initial_state=None`` starts from the identity slots ``I_{d×m}`` (orthonormal); mixers pass their own
    random orthonormal ``S_0``.  With ``normalize`` (eq. 14) the initial slots are projected onto the sphere.
    ``mode="recurrent"``: per-token loop under autograd (reference).  ``mode="scan"``: the same model with a
    hand-derived backward that recomputes the states per chunk of ``chunk_size`` tokens.  The C++ kernel
    covers dec/enc/sim with or without the sphere projection, and delta and ttt without it, each with or
    without ``forget``; the PyTorch version covers dec/enc/sim with the projection and delta.  Other
    combinations (L1 always) run the reference step under ``torch.utils.checkpoint`` per chunk: exact and
    memory-frugal, not faster.  ``backend``: ``"cpp"`` = the
    fused C++ kernel (CPU, float32/64),
    ``"torch"`` = the PyTorch hand-VJP scan, ``"auto"`` = cpp where available, else torch.
    """
    B, T, H, m, d = _check(q, k, v, gamma, initial_state, objective, normalize, forget, l1, mode, chunk_size)
    if backend not in ("auto", "cpp", "torch"):
        raise ValueError(f"backend must be 'auto', 'cpp' or 'torch', got {backend!r}")
    if mode == "scan" and backend != "torch":
        out = _cpp_scan(q, k, v, gamma, initial_state, objective, normalize, forget, l1, chunk_size, backend)
        if out is not None:
            return out
    qt, kt, vt, gt, S0, mu, lam = _prepare(q, k, v, gamma, initial_state, normalize, forget, l1, objective)
    if mode == "recurrent":
        S = S0
        ys = []
        for t in range(T):
            S = lattice_step(
                S, kt[t], vt[t], gt[t], objective=objective, normalize=normalize,
                forget=None if mu is None else mu[t], l1=None if lam is None else lam[t], eps=eps,
            )  # fmt: skip
            ys.append((S @ qt[t].unsqueeze(-1)).squeeze(-1))  # y_t = S_t q_t
        y = torch.stack(ys, 0)
        return y.reshape(T, B, H, d).transpose(0, 1), S.reshape(B, H, d, m)
    fast = lam is None and ((objective in _OSR and normalize) or (objective == "delta" and not normalize))
    if fast:
        mu4 = None if mu is None else mu[:, :, None, None]
        y, S = _FastScan.apply(
            S0, *(x.unsqueeze(-1) for x in (qt, kt, vt, gt)), mu4, objective, chunk_size
        )  # fmt: skip
        y = y.squeeze(-1)
    else:
        y, S = _checkpointed_scan(qt, kt, vt, gt, S0, mu, lam, objective, normalize, chunk_size, eps)
    return y.reshape(T, B, H, d).transpose(0, 1), S.reshape(B, H, d, m)


def _cpp_scan(q, k, v, gamma, initial_state, objective, normalize, forget, l1, chunk_size, backend):
    """The fused C++ scan when it applies (else None; ``backend="cpp"`` then raises)."""
    B, T, H, m = k.shape
    d = v.shape[-1]
    dt = k.dtype
    ok = (
        l1 is None
        and (objective in _OSR or (objective in ("delta", "ttt") and not normalize))
        and k.device.type == "cpu"
        and dt in (torch.float32, torch.float64)
        and all(x.dtype == dt for x in (q, v))
        and (not isinstance(gamma, Tensor) or gamma.dtype == dt)
        and (forget is None or forget.dtype == dt)
        and (initial_state is None or initial_state.dtype == dt)
        and _lattice_cpp.available()
    )
    if not ok:
        if backend == "cpp":
            raise ValueError("backend='cpp' is not available for these inputs/options (or no C++ compiler)")
        return None
    N = B * H

    def nt(x):  # (B, T, H, ...) -> (N, T, ...), one copy
        return x.transpose(1, 2).reshape(N, T, -1)

    if not isinstance(gamma, Tensor):
        gamma = torch.full((B, T, H), float(gamma), dtype=dt)
    if gamma.dim() == 3:
        gamma = gamma.unsqueeze(-1).expand(B, T, H, m)
    S0 = torch.eye(d, m, dtype=dt).expand(N, d, m) if initial_state is None else initial_state.reshape(N, d, m)
    if objective in _OSR and normalize:
        S0 = sphere_retract(S0)
    mu = None if forget is None else forget.transpose(1, 2).reshape(N, T)
    code = objective if (normalize or objective not in _OSR) else f"{objective}_plain"
    y, S = _lattice_cpp.CppScan.apply(
        S0.contiguous(), nt(q), nt(k), nt(v), nt(gamma), mu, code, chunk_size
    )  # fmt: skip
    return y.reshape(B, H, T, d).transpose(1, 2), S.reshape(B, H, d, m)


def _checkpointed_scan(qt, kt, vt, gt, S0, mu, lam, objective, normalize, chunk_size, eps):
    """Exact scan of the reference step, checkpointed per chunk (stores only the chunk-boundary states)."""
    T = kt.shape[0]

    def run(S, q, k, v, g, mu_c, lam_c):
        ys = []
        for t in range(k.shape[0]):
            S = lattice_step(
                S, k[t], v[t], g[t], objective=objective, normalize=normalize,
                forget=None if mu_c is None else mu_c[t], l1=None if lam_c is None else lam_c[t], eps=eps,
            )  # fmt: skip
            ys.append((S @ q[t].unsqueeze(-1)).squeeze(-1))
        return torch.stack(ys, 0), S

    grad = torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in (qt, kt, vt, gt, S0, mu, lam)
    )
    S, ys = S0, []
    for c0 in range(0, T, chunk_size):
        sl = slice(c0, min(c0 + chunk_size, T))
        mu_c = None if mu is None else mu[sl]
        lam_c = None if lam is None else lam[sl]
        args = (S, qt[sl], kt[sl], vt[sl], gt[sl], mu_c, lam_c)
        y, S = checkpoint(run, *args, use_reentrant=False) if grad else run(*args)
        ys.append(y)
    return torch.cat(ys, 0), S


# ------------------------------------------------------------------------------------------------------------
# the PyTorch fast path: forward without a graph, backward by hand, states recomputed per chunk
# (the C++ kernel implements exactly these two functions, one head at a time)
# ------------------------------------------------------------------------------------------------------------
def _fwd_chunk(S, k, v, g, mu, objective, keep):
    """Run one chunk.  k, g: (C, N, m, 1); v: (C, N, d, 1); mu: (C, N, 1, 1) | None.

    Returns the chunk's states (list of (N, d, m)) and, if ``keep``, what the backward needs per step.
    """
    C = k.shape[0]
    states, saved = [], []
    if objective == "delta":
        w_all = g * k
        negv = -v
        for t in range(C):
            e = torch.baddbmm(negv[t], S, k[t])  # S k − v
            Sm = S if mu is None else S * mu[t]
            S = torch.baddbmm(Sm, e, w_all[t].transpose(1, 2), alpha=-1)  # μ S − e (γk)ᵀ
            states.append(S)
            if keep:
                saved.append((e,))
        return states, saved
    if objective == "dec":
        w_all = g * k
        negv = -v
    elif objective == "sim":
        w_all = g * k
        h_all = -v
    else:
        h_all = v
    for t in range(C):
        h = torch.baddbmm(negv[t], S, k[t]) if objective == "dec" else h_all[t]  # dec: e = S k − v
        p = torch.bmm(S.transpose(1, 2), h)  # (N, m, 1): ⟨s_i, h⟩
        w = g[t] * (p - k[t]) if objective == "enc" else w_all[t]  # enc: γ e, e = Sᵀv − k
        a = p * w
        b = a + 1 if mu is None else a + mu[t]  # (N, m, 1)
        bT = b.transpose(1, 2)
        U = torch.baddbmm(S * bT, h, w.transpose(1, 2), alpha=-1)  # col i: (μ + p_i w_i) s_i − w_i h
        rho = torch.linalg.vector_norm(U, dim=1, keepdim=True)  # (N, 1, m)
        S = U / rho  # eq. 14
        states.append(S)
        if keep:
            saved.append((h, p, w, bT, rho))
    return states, saved


def _bwd_chunk(S_start, states, saved, G, gy, q, k, v, g, mu, objective):
    """Reverse pass over one chunk.  G: ∂L/∂S at the chunk end (N, d, m); gy: (C, N, d, 1).

    Returns ∂L/∂S at the chunk start and the gradients of q, k, v, g (C, N, ·, 1) and mu (C, N, 1, 1) | None.
    """
    C = k.shape[0]
    St = torch.stack(states, 0)  # (C, N, d, m)
    gq = torch.matmul(St.transpose(-1, -2), gy)  # y_t = S_t q_t
    qT = q.transpose(-1, -2)
    g_h_list, g_w_list, g_k_list, g_a_list = [None] * C, [None] * C, [None] * C, [None] * C
    for t in range(C - 1, -1, -1):
        S_in = states[t - 1] if t > 0 else S_start
        G = torch.baddbmm(G, gy[t], qT[t])  # + ∂y_t/∂S_t
        if objective == "delta":
            (e,) = saved[t]
            w = g[t] * k[t]
            gS = G if mu is None else G * mu[t]
            if mu is not None:
                g_a_list[t] = (G * S_in).sum((1, 2), keepdim=True)
            g_e = -torch.bmm(G, w)  # (N, d, 1)
            g_w = -torch.bmm(G.transpose(1, 2), e)  # (N, m, 1)
            G = torch.baddbmm(gS, g_e, k[t].transpose(1, 2))
            g_k_list[t] = torch.bmm(S_in.transpose(1, 2), g_e)
            g_h_list[t], g_w_list[t] = g_e, g_w
            continue
        h, p, w, bT, rho = saved[t]
        S_out = states[t]
        # S_out = U / ρ  →  ∂U = (G − S_out ⟨G, S_out⟩_col) / ρ
        gU = torch.addcmul(G, S_out, (G * S_out).sum(1, keepdim=True), value=-1) / rho
        gS = gU * bT  # through (μ + a_i) s_i
        g_a = (gU * S_in).sum(1, keepdim=True).transpose(1, 2)  # (N, m, 1)
        g_h = -torch.bmm(gU, w)  # through − h wᵀ
        g_w = torch.baddbmm(g_a * p, gU.transpose(1, 2), h, alpha=-1)  # (N, m, 1)
        g_p = g_a * w
        if objective == "enc":
            g_p = g_p + g_w * g[t]  # w = γ (p − k)
        gS = torch.baddbmm(gS, h, g_p.transpose(1, 2))  # p = Sᵀ h
        g_h = torch.baddbmm(g_h, S_in, g_p)
        if objective == "dec":  # h = S k − v
            gS = torch.baddbmm(gS, g_h, k[t].transpose(1, 2))
            g_k_list[t] = torch.bmm(S_in.transpose(1, 2), g_h)
        if mu is not None:
            g_a_list[t] = g_a.sum(1, keepdim=True)
        g_h_list[t], g_w_list[t] = g_h, g_w
        G = gS
    g_h = torch.stack(g_h_list, 0)
    g_w = torch.stack(g_w_list, 0)
    gmu = None if mu is None else torch.stack(g_a_list, 0)
    if objective in ("dec", "delta"):
        gk, gg, gv = torch.stack(g_k_list, 0) + g_w * g, g_w * k, -g_h
    elif objective == "sim":
        gk, gg, gv = g_w * g, g_w * k, -g_h
    else:  # enc: h = v, w = γ (p − k)
        ps = torch.stack([s[1] for s in saved], 0)
        gk, gg, gv = -g_w * g, g_w * (ps - k), g_h
    return G, gq, gk, gv, gg, gmu


class _FastScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, S0, q, k, v, g, mu, objective, chunk):
        T = k.shape[0]
        S = S0
        ys, bounds = [], []
        with torch.no_grad():
            for c0 in range(0, T, chunk):
                sl = slice(c0, min(c0 + chunk, T))
                bounds.append(S)
                mu_c = None if mu is None else mu[sl]
                states, _ = _fwd_chunk(S, k[sl], v[sl], g[sl], mu_c, objective, False)
                ys.append(torch.matmul(torch.stack(states, 0), q[sl]))  # y_t = S_t q_t
                S = states[-1]
        ctx.objective, ctx.chunk, ctx.has_mu = objective, chunk, mu is not None
        ctx.save_for_backward(q, k, v, g, mu if mu is not None else q.new_empty(0), *bounds)
        return torch.cat(ys, 0), S

    @staticmethod
    def backward(ctx, gy, gS_end):
        q, k, v, g, mu, *bounds = ctx.saved_tensors
        mu = mu if ctx.has_mu else None
        T, chunk, obj = k.shape[0], ctx.chunk, ctx.objective
        N, d, m = bounds[0].shape
        G = gS_end if gS_end is not None else bounds[0].new_zeros(N, d, m)
        if gy is None:
            gy = v.new_zeros(T, N, d, 1)
        outs: dict[str, list] = {"q": [], "k": [], "v": [], "g": [], "mu": []}
        starts = list(range(0, T, chunk))
        with torch.no_grad():
            for ci in range(len(starts) - 1, -1, -1):
                sl = slice(starts[ci], min(starts[ci] + chunk, T))
                mu_c = None if mu is None else mu[sl]
                states, saved = _fwd_chunk(bounds[ci], k[sl], v[sl], g[sl], mu_c, obj, True)  # recompute
                G, gq, gk, gv, gg, gmu = _bwd_chunk(
                    bounds[ci], states, saved, G, gy[sl], q[sl], k[sl], v[sl], g[sl], mu_c, obj
                )
                for key, val in (("q", gq), ("k", gk), ("v", gv), ("g", gg), ("mu", gmu)):
                    outs[key].insert(0, val)
        cat = {key: (torch.cat(val, 0) if val and val[0] is not None else None) for key, val in outs.items()}
        return G, cat["q"], cat["k"], cat["v"], cat["g"], cat["mu"], None, None


# ------------------------------------------------------------------------------------------------------------
# TTT-style mini-batch approximation (docs/lattice.md): a DIFFERENT model, equal to the scan only for chunk_size=1
# ------------------------------------------------------------------------------------------------------------
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
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Mini-batch Lattice (NOSR with every gradient of a chunk taken at the chunk-start state; see docs/lattice.md).

    Within a chunk ``U_t = S⁰ + Σ_{j≤t} Δ_j(S⁰)``, ``S_t = colnormalize(U_t)``, ``y_t = S_t q_t``; the next
    chunk starts from ``S_C``.  A DIFFERENT model from :func:`lattice_scan` (equal only for ``chunk_size=1``).
    Chunks are counted from the sequence start: to continue a stream, pass the chunk-start state as
    ``initial_state``, the update accumulated in the current partial chunk as ``initial_update`` and the
    number of tokens already in that chunk as ``offset``.  Returns ``(y, (S_chunk_start, update))``; the
    state after the last token is ``sphere_retract(S_chunk_start + update)``.

    The per-token states ``U_t`` are never formed: ``y_t`` and the column norms ``‖U_t[:, i]‖`` come from
    causal (C×C) products and cumulative sums (:func:`_chunk_block`), O(C·(d + m) + d·m) work per token and
    head; only the chunk-end state is a (d, m) matrix (a one-token block, as in decoding, forms its one state).
    """
    return _lattice_chunked(
        q, k, v, gamma, initial_state, objective=objective, chunk_size=chunk_size,
        initial_update=initial_update, offset=offset, dense=False,
    )  # fmt: skip


def _lattice_chunked(
    q, k, v, gamma, initial_state=None, *, objective="dec", chunk_size=16, initial_update=None, offset=0,
    dense=False,
):
    """:func:`lattice_chunked`; ``dense=True`` uses :func:`_chunk_block_dense` (the per-token states, tests)."""
    if objective not in _OSR:
        raise ValueError(f"lattice_chunked supports objectives {list(_OSR)}, got {objective!r}")
    B, T, H, m, d = _check(q, k, v, gamma, initial_state, objective, True, None, None, "scan", chunk_size)
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < chunk_size:
        raise ValueError(f"offset must be an integer in [0, chunk_size={chunk_size}), got {offset!r}")
    if initial_update is not None and (
        not isinstance(initial_update, Tensor) or initial_update.shape != (B, H, d, m)
    ):
        raise ValueError(f"initial_update must be (B, H, d, m)=({B}, {H}, {d}, {m}) or None")
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
