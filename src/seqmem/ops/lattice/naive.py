"""Lattice / OSR, the recurrent reference: one gradient step on the memory per token, written out step by step.

This is ``mode="recurrent"`` of :func:`seqmem.ops.lattice_scan`, differentiated by autograd.  It shares no input
handling, step or projection helper with the fast forms (``step.py``, ``scan.py``, the C++ kernel), so the test
that compares them can catch a bug in either.  Inputs are assumed valid (the public op checks them first).

Tensors are ``q, k: (B, T, H, m)``, ``v: (B, T, H, d)``, ``gamma: (B, T, H)`` or ``(B, T, H, m)`` or a number,
``forget: (B, T, H)``, ``l1: (B, T, H)`` or a number; the state ``S: (B, H, d, m)`` holds ``m`` slots (columns
``s_i``).  Equation numbers are those of Karami & Mirrokni 2025 (see :mod:`seqmem.ops.lattice`).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__: list[str] = []  # the public entry point is lattice_scan(mode="recurrent")


def lattice_naive(
    q: Tensor, k: Tensor, v: Tensor, gamma: Tensor | float, initial_state: Tensor | None = None, *,
    objective: str = "dec", normalize: bool = True, forget: Tensor | None = None, l1: Tensor | float | None = None,
    eps: float = 1e-12,
) -> tuple[Tensor, Tensor]:
    """Returns ``(y (B, T, H, d), S_T (B, H, d, m))``."""
    B, T, H, m = k.shape
    d = v.shape[-1]
    dt = torch.promote_types(k.dtype, v.dtype)
    tiny = max(float(eps), float(torch.finfo(dt).tiny))  # a norm clamp that stays positive in dt
    osr = objective in ("dec", "enc", "sim")
    # γ per slot: a number or a per-head step is broadcast to the m slots; λ per head
    if not isinstance(gamma, Tensor):
        gamma = torch.full((B, T, H), float(gamma), dtype=dt, device=k.device)
    if gamma.dim() == 3:
        gamma = gamma[..., None].expand(B, T, H, m)
    if l1 is not None and not isinstance(l1, Tensor):
        l1 = torch.full((B, T, H), float(l1), dtype=dt, device=k.device)
    S = torch.eye(d, m, dtype=dt, device=k.device).expand(B, H, d, m) if initial_state is None else initial_state
    if normalize and osr:
        S = S / S.norm(dim=-2, keepdim=True).clamp_min(tiny)  # the slots start on the unit sphere (§3.3, eq. 14)
    ys = []
    for t in range(T):
        qt, kt, vt, gt = q[:, t], k[:, t], v[:, t], gamma[:, t]  # (B,H,m), (B,H,m), (B,H,d), (B,H,m)
        if osr:
            # 1. φ(S) = [s_i/‖s_i‖]; with normalize the slots are unit, so φ(S) = S                 (eqs. 6, 14)
            #    (without it a zero slot, one the L1 prox emptied, has φ_i = 0 and takes no step: 1/‖s_i‖ → 0)
            if normalize:
                inv_n = torch.ones_like(gt)
            else:
                norm = S.norm(dim=-2)  # ‖s_i‖ (B,H,m)
                inv_n = torch.where(norm > tiny, 1.0 / norm.clamp_min(tiny), torch.zeros_like(norm))
            phi = S * inv_n[..., None, :]
            # 2. the error and the coefficient of each column's step                          (eqs. 7, 10, 12)
            if objective == "dec":  # ½‖φ(S)k − v‖²: h = e = φ(S)k − v, c_i = k_i
                h = torch.einsum("bhdm,bhm->bhd", phi, kt) - vt
                c = kt
            elif objective == "enc":  # ½‖φ(S)ᵀv − k‖²: h = v, c_i = e_i = φ_iᵀv − k_i
                h = vt
                c = torch.einsum("bhdm,bhd->bhm", phi, vt) - kt
            else:  # sim, −⟨φ(S)ᵀv, k⟩: h = −v, c_i = k_i
                h = -vt
                c = kt
            # 3. P(s_i) h = h − φ_i ⟨φ_i, h⟩  (the Jacobian of s ↦ s/‖s‖ is P(s)/‖s‖)              (eq. 8)
            Ph = h[..., :, None] - phi * torch.einsum("bhdm,bhd->bhm", phi, h)[..., None, :]
            # 4. γ∇: column i = γ_i c_i / ‖s_i‖ · P(s_i) h                                          (eq. 13)
            step = Ph * (gt * c * inv_n)[..., None, :]
        elif objective == "ttt":
            # 1'. z = S k,  e = z/‖z‖ − v                                                             (eq. 19)
            z = torch.einsum("bhdm,bhm->bhd", S, kt)
            nz = z.norm(dim=-1, keepdim=True).clamp_min(tiny)
            e = z / nz - vt
            # 2'. γ∇ = (P(z) e / ‖z‖)(γ ⊙ k)ᵀ,  P(z) e = e − ẑ ⟨ẑ, e⟩                                  (eq. 19)
            Pe = (e - (z / nz) * ((z / nz) * e).sum(-1, keepdim=True)) / nz
            step = Pe[..., :, None] * (gt * kt)[..., None, :]
        else:  # delta
            # 1''. γ∇ = (S k − v)(γ ⊙ k)ᵀ  (DeltaNet)                                                (eq. 20)
            step = (torch.einsum("bhdm,bhm->bhd", S, kt) - vt)[..., :, None] * (gt * kt)[..., None, :]
        # 5. U = μ S − γ∇  (μ = 1 without the forget gate)                                          (eq. 16)
        U = S - step if forget is None else forget[:, t, :, None, None] * S - step
        # 6. U ← sign(U) max(|U| − γλ, 0)  (the L1 prox after the gradient step)                    (eq. 18)
        if l1 is not None:
            U = torch.sign(U) * torch.relu(U.abs() - (gt * l1[:, t, :, None])[..., None, :])
        # 7. S = [u_i/‖u_i‖]  (back onto the unit sphere)                                           (eq. 14)
        S = U / U.norm(dim=-2, keepdim=True).clamp_min(tiny) if normalize else U
        # 8. y_t = S_t q_t  (the read-out uses the updated state)                                   (eq. 13)
        ys.append(torch.einsum("bhdm,bhm->bhd", S, qt))
    return torch.stack(ys, 1), S


def lattice_minibatch_naive(
    q: Tensor, k: Tensor, v: Tensor, gamma: Tensor | float, initial_state: Tensor | None = None, *,
    objective: str = "dec", chunk_size: int = 16, initial_update: Tensor | None = None, offset: int = 0,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Mini-batch Lattice, one token at a time (``mode="recurrent"`` of :func:`seqmem.ops.lattice_minibatch`).

    Every gradient of a chunk is taken at the chunk-start slots S⁰ (a different model from :func:`lattice_naive`):
    U_t = S⁰ + Σ_{j≤t} Δ_j(S⁰), S_t = U_t / ‖U_t‖ per column, y_t = S_t q_t; the chunk's last S_t starts the next
    chunk.  Returns ``(y (B, T, H, d), (S⁰ of the current chunk, its accumulated update Σ Δ))``."""
    B, T, H, m = k.shape
    d = v.shape[-1]
    if initial_state is None:
        S0 = torch.eye(d, m, dtype=k.dtype, device=k.device).expand(B, H, d, m)
    else:
        S0 = initial_state
    S0 = S0 / S0.norm(dim=-2, keepdim=True)  # the slots start on the sphere (eq. 14)
    A = torch.zeros(B, H, d, m, dtype=k.dtype, device=k.device) if initial_update is None else initial_update
    if not isinstance(gamma, Tensor):
        gamma = torch.full((B, T, H), float(gamma), dtype=k.dtype, device=k.device)
    if gamma.dim() == 3:
        gamma = gamma.unsqueeze(-1).expand_as(k)
    ys, pos = [], offset
    for t in range(T):
        kt, vt, gt = k[:, t], v[:, t], gamma[:, t]
        # 1. the objective's residual h and coefficient c, both at the chunk-start slots S⁰     (eqs. 7, 10, 12)
        if objective == "dec":  # decode v from k: h = S⁰k − v
            h, c = (S0 @ kt.unsqueeze(-1)).squeeze(-1) - vt, kt
        elif objective == "enc":  # encode k from v: c = S⁰ᵀv − k
            h, c = vt, (S0.transpose(-1, -2) @ vt.unsqueeze(-1)).squeeze(-1) - kt
        else:  # sim: maximise the similarity vᵀS⁰k
            h, c = -vt, kt
        # 2. Δ_t = −(h wᵀ − S⁰ diag(S⁰ᵀh ⊙ w)), w = γ ⊙ c: P(s⁰_i) h per column        (eqs. 8, 13)
        p = (S0.transpose(-1, -2) @ h.unsqueeze(-1)).squeeze(-1)
        w = gt * c
        A = A - (h.unsqueeze(-1) * w.unsqueeze(-2) - S0 * (p * w).unsqueeze(-2))
        # 3. S_t = U_t / ‖U_t‖ with U_t = S⁰ + Σ Δ (eq. 14); y_t = S_t q_t
        U = S0 + A
        St = U / U.norm(dim=-2, keepdim=True)
        ys.append((St @ q[:, t].unsqueeze(-1)).squeeze(-1))
        pos += 1
        if pos == chunk_size:  # 4. the chunk is complete: its last state starts the next one
            S0, A, pos = St, torch.zeros_like(A), 0
    return torch.stack(ys, 1), (S0, A)
