"""Lattice building blocks: the one-token step (closed forms of the paper's updates), the sphere projection, the
L1 prox, random orthonormal slots, and the argument handling shared by the fast forms (``scan.py``,
``minibatch.py``).  The recurrent reference ``naive.py`` uses none of this (it writes the same math out itself),
so the test that compares it with the fast scan can catch a bug in either.

Per head the state ``S ∈ R^{d×m}`` holds ``m`` memory slots (columns ``s_i``); see :mod:`seqmem.ops.lattice`.
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

from seqmem.io import check_int
from seqmem.ops._common import check_number, check_same_device, check_tensor, check_values, floor, values_checked

__all__ = ["LATTICE_OBJECTIVES", "lattice_step", "orthonormal_slots", "soft_threshold", "sphere_retract"]

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
        check_int(name, val, prefix="orthonormal_slots: ")
    if m > d:
        raise ValueError(
            f"orthonormal_slots: m={m} slots cannot be orthonormal in dimension d={d} "
            "(the paper's S_0 needs m <= d)"
        )
    a = torch.randn(n, d, m, generator=generator, dtype=torch.float64)
    qm, r = torch.linalg.qr(a)
    qm = qm * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    return qm.to(dtype)


def projection_problem(objective: str, normalize: bool) -> str | None:
    """Why ``objective`` cannot take ``normalize`` (the sphere projection), or None: TTT and DeltaNet (eqs. 19-20)
    have none.  One text for the op and the Lattice mixer, which refuse the pair."""
    if objective in ("ttt", "delta") and normalize:
        return (f"objective={objective!r} (eq. {19 if objective == 'ttt' else 20}) has no sphere projection (eq. 14 "
                "is Lattice's): pass normalize=False")
    return None


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
            n = torch.linalg.vector_norm(S, dim=-2)
            tiny = floor(eps, S.dtype)
            # 1/‖s_i‖, and 0 for a zero slot (one the L1 prox emptied): φ(0) is undefined and a clamped 1/‖s_i‖
            # would make its step ~1/eps; a zero slot takes no step and reads nothing
            inv_n = torch.where(n > tiny, 1.0 / n.clamp_min(tiny), torch.zeros_like(n))
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
def _check(q, k, v, gamma, initial_state, objective, normalize, forget, l1, mode, chunk_size, op="lattice_scan",
           **more: Tensor | None):
    """The checks shared by ``lattice_scan`` and ``lattice_minibatch`` (each error names ``op`` and the argument):
    shapes, floating dtypes and one device for every tensor (``more``: further tensors of the op, by name) before
    any kernel runs (the C++ kernel reads raw pointers: a tensor on another device crashed the process).
    Returns ``(B, T, H, m, d)``."""
    if objective not in LATTICE_OBJECTIVES:
        raise ValueError(f"{op}: objective must be one of {list(LATTICE_OBJECTIVES)}, got {objective!r}")
    if mode not in _MODES:
        hint = " (non-linear recurrence: no exact chunk form; see lattice_minibatch)" if mode == "chunk" else ""
        raise ValueError(f"{op}: mode must be one of {list(_MODES)}, got {mode!r}{hint}")
    check_tensor(op, "q", q, (None, None, None, None), "batch, time, heads, m")
    B, T, H, m = q.shape
    check_tensor(op, "k", k, (B, T, H, m), "batch, time, heads, m")
    check_tensor(op, "v", v, (B, T, H, None), "batch, time, heads, d")
    d = v.shape[-1]
    if B == 0:
        raise ValueError(f"{op}: empty batch (batch must be >= 1), got q of shape {tuple(q.shape)}")
    if (why := projection_problem(objective, normalize)) is not None:
        raise ValueError(f"{op}: {why}")
    if objective in _OSR and m > d:
        raise ValueError(f"{op}: slots m={m} > slot dimension d={d}: orthonormal S_0 needs m <= d (the identity "
                         "S_0 would start with empty slots)")
    if isinstance(gamma, Tensor):
        if gamma.shape not in ((B, T, H), (B, T, H, m)):
            raise ValueError(f"{op}: gamma must be (B, T, H)=({B}, {T}, {H}) or (B, T, H, m), got "
                             f"{tuple(gamma.shape)}")
        if not gamma.is_floating_point():
            raise ValueError(f"{op}: gamma must be a floating-point tensor, got dtype {gamma.dtype}")
    elif not isinstance(gamma, numbers.Real) or isinstance(gamma, bool):
        raise ValueError(f"{op}: gamma must be a tensor or a number, got {gamma!r}")
    else:
        check_number(op, "gamma", gamma)
    if forget is not None:
        if not isinstance(forget, Tensor) or forget.shape != (B, T, H):
            raise ValueError(f"{op}: forget must be a (B, T, H)=({B}, {T}, {H}) tensor or None, got {forget!r:.80}")
        check_tensor(op, "forget", forget, (B, T, H), "batch, time, heads")
    if l1 is not None:
        if isinstance(l1, Tensor):
            if l1.shape != (B, T, H):
                raise ValueError(f"{op}: l1 must be (B, T, H)=({B}, {T}, {H}) or a float, got {tuple(l1.shape)}")
            if not l1.is_floating_point():
                raise ValueError(f"{op}: l1 must be a floating-point tensor, got dtype {l1.dtype}")
        elif isinstance(l1, bool) or not isinstance(l1, numbers.Real):
            raise ValueError(f"{op}: l1 must be a non-negative float or a tensor, got {l1!r}")
        else:
            check_number(op, "l1", l1, nonnegative=True)
    if initial_state is not None:
        if not isinstance(initial_state, Tensor) or initial_state.shape != (B, H, d, m):
            got = tuple(initial_state.shape) if isinstance(initial_state, Tensor) else initial_state
            raise ValueError(f"{op}: initial_state['S'] must be (B, H, d, m)=({B}, {H}, {d}, {m}), got {got}")
        check_tensor(op, "initial_state['S']", initial_state, (B, H, d, m), "batch, heads, d, m")
    check_int("chunk_size", chunk_size, prefix=f"{op}: ")
    tensors = {"q": q, "k": k, "v": v, "gamma": gamma, "forget": forget, "l1": l1,
               "initial_state['S']": initial_state, **more}
    check_same_device(op, **{n: t for n, t in tensors.items() if isinstance(t, Tensor)})
    # value checks last (one reduction each; skipped inside torch.compile, a graph break); NaN propagates
    if isinstance(gamma, Tensor) and values_checked():
        check_values(op, "gamma", gamma, ~torch.isinf(gamma), "finite")
    if initial_state is not None and objective in _OSR and not normalize and values_checked():
        # φ(s) = s/‖s‖ (eq. 6) is undefined for an empty slot (the fused kernels would divide by ~0)
        norms = torch.linalg.vector_norm(initial_state.detach(), dim=-2)
        check_values(op, "initial_state['S']'s slot norms", norms, ~(norms <= 0),
                     "> 0 without normalize (φ(s) = s/‖s‖, eq. 6, is undefined for an empty slot)")
    if forget is not None and values_checked():  # eq. 16's μ_t = 1 − γλ ∈ [0, 1]
        check_values(op, "forget", forget, ~((forget < 0) | (forget > 1)), "in [0, 1] (eq. 16's μ_t)")
    if isinstance(l1, Tensor) and values_checked():  # the threshold γλ of eq. 18: a negative λ grows every entry
        check_values(op, "l1", l1, ~((l1 < 0) | torch.isinf(l1)), "finite and >= 0 (eq. 18's λ_t)")
    return B, T, H, m, d


def _prepare(q, k, v, gamma, initial_state, normalize, forget, l1, objective, eps=1e-12):
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
        S0 = sphere_retract(S0, eps)  # the slots live on the sphere (a no-op up to rounding for unit slots)
    mu = None if forget is None else tf(forget)
    lam = None
    if l1 is not None:
        lam = l1 if isinstance(l1, Tensor) else torch.full((B, T, H), float(l1), dtype=dt, device=k.device)
        lam = tf(lam).unsqueeze(-1)  # (T, N, 1)
    return tf(q), tf(k), tf(v), tf(gamma), S0, mu, lam

