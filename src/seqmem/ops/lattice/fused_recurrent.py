"""Lattice, the fused recurrent Triton kernel: :func:`fused_recurrent_lattice` (objectives dec / enc / sim with
the sphere projection of eq. 14, optional forget gate μ_t of eq. 16).

Each program holds its part of the slot matrix ``S (d×m)`` in registers and loops over time.  Every slot's
projection ``⟨s_i, h⟩`` and renormalisation ``‖u_i‖`` sum over d, so a program always holds whole slots (columns).
DEC's error ``e = Sk − v`` sums over all the slots, so for DEC one program per (batch, head) holds all of ``S``;
for ENC and SIM (``h = ±v`` does not depend on ``S``) the slots evolve independently, and the grid is
(batch·heads) × (blocks of ``SLOT_BLOCK`` = 32 slots), each block writing a partial read-out ``S_blk q_blk`` (and
partial gradients of ``v`` and μ) that are summed in PyTorch.
Per token (unit slots, ``φ(S) = S``; eqs. 7/10/12 in the form of eq. 13, then eq. 14)::

    h = S k − v (dec) | v (enc) | −v (sim);   p = Sᵀ h
    w = γ ⊙ k (dec, sim) | γ ⊙ (p − k) (enc);  b = μ + p ⊙ w
    U = S diag(b) − h wᵀ;   ρ_i = ‖u_i‖;   S ← U diag(1/ρ);   y = S q

Backward: the forward saves ``S`` every ``chunk_size`` tokens; the backward kernel walks the chunks in reverse,
re-runs each chunk forward from its checkpoint (writing the chunk's ``C`` input states to a per-program scratch
buffer), then walks it backwards with the hand-derived VJP of the step above (the same algebra as the PyTorch
scan's backward in ``scan.py``).  Memory: ``B·H·(⌈T/C⌉ + C)·d·m`` floats besides the inputs (the checkpoints are
padded to whole slot blocks).

Inputs float32 / float16 / bfloat16, computed in float32; ``y`` has ``v``'s dtype, the state is float32.
The kernel runs on CUDA tensors, or on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``).
Limits: ``d, m ≤ 128`` (the state lives in registers).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from seqmem.ops._common import first_order_backward
from seqmem.ops._triton import check_device, device_guard, num_warps

__all__ = ["MAX_DIM", "fused_recurrent_lattice"]

MAX_DIM = 128
SLOT_BLOCK = 32  # slots per program for enc / sim
_OBJ = {"dec": 0, "enc": 1, "sim": 2}


@triton.jit
def _step(S, k, v, g, mu, mask_m, OBJ: tl.constexpr):
    """One token: returns (h, p, w, b, rho, S_new)."""
    if OBJ == 0:
        h = tl.sum(S * k[None, :], 1) - v
    elif OBJ == 1:
        h = v
    else:
        h = -v
    p = tl.sum(S * h[:, None], 0)
    if OBJ == 1:
        w = g * (p - k)
    else:
        w = g * k
    b = mu + p * w
    U = S * b[None, :] - h[:, None] * w[None, :]
    rho = tl.sqrt(tl.sum(U * U, 0))
    rho = tl.where(mask_m, rho, 1.0)
    return h, p, w, b, rho, U / rho[None, :]


@triton.jit
def _fwd_kernel(
    q, k, v, g, mu, s0, y, s_out, ckpt, T, H, C,
    D: tl.constexpr, M: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, OBJ: tl.constexpr,
    HAS_MU: tl.constexpr, SAVE: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)  # 64-bit offsets: B·H·T·d·m passes 2³¹ at long T
    i_m = tl.program_id(1).to(tl.int64)  # the slot block (enc / sim: the slots evolve independently)
    n_m = tl.num_programs(1)
    i_b = i_bh // H
    i_h = i_bh % H
    o_d = tl.arange(0, BD)
    o_m = i_m * BM + tl.arange(0, BM)
    m_d = o_d < D
    m_m = o_m < M
    m_s = m_d[:, None] & m_m[None, :]
    o_s = o_d[:, None] * M + o_m[None, :]
    o_blk = o_d[:, None] * BM + tl.arange(0, BM)[None, :]  # the block in a (D, BM) checkpoint
    S = tl.load(s0 + i_bh * D * M + o_s, mask=m_s, other=0.0).to(tl.float32)
    p_qk = i_b * T * H * M + i_h * M + o_m  # (b, t, h, :) of q, k, g at t = 0
    p_v = i_b * T * H * D + i_h * D + o_d
    y += i_m * tl.num_programs(0) * T * D  # this slot block's partial read-out
    p_mu = i_b * T * H + i_h
    n_ck = tl.cdiv(T, C)
    t = 0
    while t < T:
        if SAVE:
            if t % C == 0:  # a checkpoint at each chunk's first step (a mask of a scalar & block fails on triton 3.9)
                tl.store(ckpt + ((i_bh * n_m + i_m) * n_ck + t // C) * D * BM + o_blk, S, mask=m_s)
        k_t = tl.load(k + p_qk, mask=m_m, other=0.0).to(tl.float32)
        q_t = tl.load(q + p_qk, mask=m_m, other=0.0).to(tl.float32)
        g_t = tl.load(g + p_qk, mask=m_m, other=0.0).to(tl.float32)
        v_t = tl.load(v + p_v, mask=m_d, other=0.0).to(tl.float32)
        if HAS_MU:
            mu_t = tl.load(mu + p_mu).to(tl.float32)
        else:
            mu_t = 1.0
        _, _, _, _, _, S = _step(S, k_t, v_t, g_t, mu_t, m_m, OBJ)
        y_t = tl.sum(S * q_t[None, :], 1)  # y_t = S_t q_t (updated state, eq. 13), this block's slots
        tl.store(y + p_v, y_t.to(y.dtype.element_ty), mask=m_d)
        p_qk += H * M
        p_v += H * D
        p_mu += H
        t += 1
    tl.store(s_out + i_bh * D * M + o_s, S, mask=m_s)


@triton.jit
def _bwd_kernel(
    q, k, v, g, mu, ckpt, scratch, dy, ds_out, dq, dk, dv, dg, dmu, ds0, T, H, C,
    D: tl.constexpr, M: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, OBJ: tl.constexpr,
    HAS_MU: tl.constexpr, HAS_DS: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)  # 64-bit offsets: B·H·T·d·m passes 2³¹ at long T
    i_m = tl.program_id(1).to(tl.int64)
    n_m = tl.num_programs(1)
    i_b = i_bh // H
    i_h = i_bh % H
    o_d = tl.arange(0, BD)
    o_m = i_m * BM + tl.arange(0, BM)
    m_d = o_d < D
    m_m = o_m < M
    m_s = m_d[:, None] & m_m[None, :]
    o_s = o_d[:, None] * M + o_m[None, :]
    o_blk = o_d[:, None] * BM + tl.arange(0, BM)[None, :]
    dv += i_m * tl.num_programs(0) * T * D  # this slot block's partial gradients of v and μ
    dmu += i_m * tl.num_programs(0) * T
    if HAS_DS:
        G = tl.load(ds_out + i_bh * D * M + o_s, mask=m_s, other=0.0).to(tl.float32)
    else:
        G = tl.zeros([BD, BM], dtype=tl.float32)
    n_ck = tl.cdiv(T, C)
    base_qk = i_b * T * H * M + i_h * M + o_m
    base_v = i_b * T * H * D + i_h * D + o_d
    base_mu = i_b * T * H + i_h
    s_mu = i_bh * 0 + H  # a token's strides, 64-bit (t · H · d in 32 bits overflows at long T)
    s_qk, s_v = s_mu * M, s_mu * D
    p_scr = scratch + (i_bh * n_m + i_m) * C * D * BM + o_blk
    c = n_ck - 1
    while c >= 0:
        c0 = c * C
        c1 = tl.minimum(c0 + C, T)
        # 1. re-run the chunk from its checkpoint; scratch[j] = the state before token c0 + j
        S = tl.load(ckpt + ((i_bh * n_m + i_m) * n_ck + c) * D * BM + o_blk, mask=m_s, other=0.0)
        t = c0
        while t < c1:
            tl.store(p_scr + (t - c0) * D * BM, S, mask=m_s)
            k_t = tl.load(k + base_qk + t * s_qk, mask=m_m, other=0.0).to(tl.float32)
            g_t = tl.load(g + base_qk + t * s_qk, mask=m_m, other=0.0).to(tl.float32)
            v_t = tl.load(v + base_v + t * s_v, mask=m_d, other=0.0).to(tl.float32)
            if HAS_MU:
                mu_t = tl.load(mu + base_mu + t * s_mu).to(tl.float32)
            else:
                mu_t = 1.0
            _, _, _, _, _, S = _step(S, k_t, v_t, g_t, mu_t, m_m, OBJ)
            t += 1
        tl.debug_barrier()
        # 2. walk the chunk backwards: G = ∂L/∂S_t  →  ∂L/∂S_{t-1} and the token's input gradients
        t = c1 - 1
        while t >= c0:
            S_in = tl.load(p_scr + (t - c0) * D * BM, mask=m_s, other=0.0)
            k_t = tl.load(k + base_qk + t * s_qk, mask=m_m, other=0.0).to(tl.float32)
            q_t = tl.load(q + base_qk + t * s_qk, mask=m_m, other=0.0).to(tl.float32)
            g_t = tl.load(g + base_qk + t * s_qk, mask=m_m, other=0.0).to(tl.float32)
            v_t = tl.load(v + base_v + t * s_v, mask=m_d, other=0.0).to(tl.float32)
            dy_t = tl.load(dy + base_v + t * s_v, mask=m_d, other=0.0).to(tl.float32)
            if HAS_MU:
                mu_t = tl.load(mu + base_mu + t * s_mu).to(tl.float32)
            else:
                mu_t = 1.0
            h, p, w, b, rho, S_out = _step(S_in, k_t, v_t, g_t, mu_t, m_m, OBJ)
            # y_t = S_t q_t
            G += dy_t[:, None] * q_t[None, :]
            tl.store(dq + base_qk + t * s_qk, tl.sum(S_out * dy_t[:, None], 0), mask=m_m)
            # S_t = U / ρ (per column)
            gU = (G - S_out * tl.sum(G * S_out, 0)[None, :]) / rho[None, :]
            gS = gU * b[None, :]  # U = S diag(b) − h wᵀ
            g_a = tl.sum(gU * S_in, 0)  # b = μ + a, a = p ⊙ w
            g_h = -tl.sum(gU * w[None, :], 1)
            g_w = g_a * p - tl.sum(gU * h[:, None], 0)
            g_p = g_a * w
            if OBJ == 1:
                g_p += g_w * g_t  # w = γ (p − k)
            gS += h[:, None] * g_p[None, :]  # p = Sᵀ h
            g_h += tl.sum(S_in * g_p[None, :], 1)
            if OBJ == 0:  # h = S k − v
                gS += g_h[:, None] * k_t[None, :]
                g_k = tl.sum(S_in * g_h[:, None], 0) + g_w * g_t
                g_g = g_w * k_t
                g_v = -g_h
            elif OBJ == 1:  # h = v, w = γ (p − k)
                g_k = -g_w * g_t
                g_g = g_w * (p - k_t)
                g_v = g_h
            else:  # h = −v, w = γ k
                g_k = g_w * g_t
                g_g = g_w * k_t
                g_v = -g_h
            tl.store(dk + base_qk + t * s_qk, g_k, mask=m_m)
            tl.store(dg + base_qk + t * s_qk, g_g, mask=m_m)
            tl.store(dv + base_v + t * s_v, g_v, mask=m_d)
            if HAS_MU:
                tl.store(dmu + base_mu + t * s_mu, tl.sum(g_a, 0))
            G = gS
            t -= 1
        tl.debug_barrier()
        c -= 1
    tl.store(ds0 + i_bh * D * M + o_s, G, mask=m_s)


def _slot_block(objective: str, M: int) -> int:
    """Slots per program: all of them for dec (its error sums over the slots), blocks of ``SLOT_BLOCK`` for enc
    and sim (their slots evolve independently; only the read-out ``y = S q`` sums over them)."""
    BM = triton.next_power_of_2(M)
    return BM if objective == "dec" else min(BM, SLOT_BLOCK)


class _FusedRecurrentLattice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, mu, s0, objective, chunk, grad):  # noqa: ANN001, ANN205
        B, T, H, M = k.shape
        D = v.shape[-1]
        N = B * H
        chunk = max(1, min(chunk, T))
        n_ck = triton.cdiv(T, chunk)
        BD, BM = triton.next_power_of_2(D), _slot_block(objective, M)
        n_m = triton.cdiv(M, BM)
        # one slot block writes y directly; several write float32 partial read-outs, summed below
        y = torch.empty(n_m, B, T, H, D, dtype=v.dtype if n_m == 1 else torch.float32, device=v.device)
        s_out = torch.empty(B, H, D, M, dtype=torch.float32, device=v.device)
        save = grad and any(ctx.needs_input_grad[:6])  # checkpoints only when a backward can follow
        ckpt = torch.empty(N, n_m, n_ck if save else 1, D, BM, dtype=torch.float32, device=v.device)
        with device_guard(v):
            _fwd_kernel[(N, n_m)](
                q, k, v, g, mu if mu is not None else g, s0, y, s_out, ckpt, T, H, chunk,
                D=D, M=M, BD=BD, BM=BM, OBJ=_OBJ[objective], HAS_MU=mu is not None, SAVE=save,
                num_warps=num_warps(BD * BM),
            )  # fmt: skip
        ctx.save_for_backward(q, k, v, g, mu, ckpt)
        ctx.objective, ctx.chunk, ctx.s0_dtype, ctx.BM = objective, chunk, s0.dtype, BM
        return (y[0] if n_m == 1 else y.sum(0).to(v.dtype)), s_out

    @staticmethod
    @first_order_backward("fused_recurrent_lattice")
    def backward(ctx, dy, ds_out):  # noqa: ANN001, ANN205
        q, k, v, g, mu, ckpt = ctx.saved_tensors
        B, T, H, M = k.shape
        D = v.shape[-1]
        N, C, BM = B * H, ctx.chunk, ctx.BM
        n_m = triton.cdiv(M, BM)
        dev = v.device
        f32 = torch.float32
        dy = torch.zeros(B, T, H, D, dtype=f32, device=dev) if dy is None else dy.contiguous()
        dq = torch.empty(B, T, H, M, dtype=f32, device=dev)
        dk, dg = torch.empty_like(dq), torch.empty_like(dq)
        dv = torch.empty(n_m, B, T, H, D, dtype=f32, device=dev)  # per slot block, summed below
        dmu = torch.empty(n_m, B, T, H, dtype=f32, device=dev) if mu is not None else dq
        ds0 = torch.empty(B, H, D, M, dtype=f32, device=dev)
        scratch = torch.empty(N, n_m, C, D, BM, dtype=f32, device=dev)
        with device_guard(v):
            _bwd_kernel[(N, n_m)](
                q, k, v, g, mu if mu is not None else g, ckpt, scratch, dy,
                ds_out.contiguous() if ds_out is not None else ds0, dq, dk, dv, dg, dmu, ds0, T, H, C,
                D=D, M=M, BD=triton.next_power_of_2(D), BM=BM, OBJ=_OBJ[ctx.objective], HAS_MU=mu is not None,
                HAS_DS=ds_out is not None, num_warps=num_warps(2 * triton.next_power_of_2(D) * BM),
            )  # fmt: skip
        return (dq.to(q.dtype), dk.to(k.dtype), dv.sum(0).to(v.dtype), dg.to(g.dtype),
                None if mu is None else dmu.sum(0).to(mu.dtype), ds0.to(ctx.s0_dtype), None, None, None)


def fused_recurrent_lattice(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gamma: Tensor | float,
    initial_state: Tensor | None = None,
    *,
    objective: str = "dec",
    forget: Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor]:
    """The Lattice scan with the sphere projection (``lattice_scan(normalize=True)``) in one Triton kernel.

    ``q, k (B, T, H, m)``, ``v (B, T, H, d)``, ``gamma`` a number, ``(B, T, H)`` or ``(B, T, H, m)``,
    ``initial_state`` the slots ``S_0 (B, H, d, m)`` (None: the identity slots; projected onto the sphere here),
    ``forget`` μ_t ``(B, T, H)`` or None.  ``chunk_size``: the backward's checkpoint interval.  Returns
    ``(y (B, T, H, d) in v's dtype, S_T (B, H, d, m) float32)``.  Inputs are assumed checked by
    :func:`seqmem.ops.lattice_scan` except for what only this kernel needs (objective, device, dtype, size).
    """
    op = "fused_recurrent_lattice"
    if objective not in _OBJ:
        raise ValueError(f"{op}: objective must be one of {list(_OBJ)} (the OSR objectives), got {objective!r}")
    B, T, H, M = k.shape
    D = v.shape[-1]
    if D > MAX_DIM or M > MAX_DIM:
        raise ValueError(f"{op}: d={D} and m={M} must be <= {MAX_DIM} (the slot matrix lives in registers)")
    halfs = (torch.float32, torch.float16, torch.bfloat16)
    for name, x in (("q", q), ("k", k), ("v", v), ("gamma", gamma), ("forget", forget), ("S_0", initial_state)):
        if isinstance(x, Tensor) and x.dtype not in halfs:
            raise ValueError(f"{op}: {name} must be float32, float16 or bfloat16, got {x.dtype}")
    check_device(op, _fwd_kernel, q, k, v, gamma if isinstance(gamma, Tensor) else None, forget, initial_state)
    dt = torch.float32
    if not isinstance(gamma, Tensor):
        gamma = torch.full((B, T, H, M), float(gamma), dtype=dt, device=k.device)
    elif gamma.dim() == 3:
        gamma = gamma.unsqueeze(-1).expand(B, T, H, M)
    if initial_state is None:
        S0 = torch.eye(D, M, dtype=dt, device=k.device).expand(B, H, D, M)
    else:
        S0 = initial_state.float()
    S0 = S0 / torch.linalg.vector_norm(S0, dim=-2, keepdim=True).clamp_min(1e-12)  # onto the sphere (eq. 14)
    return _FusedRecurrentLattice.apply(
        q.contiguous(), k.contiguous(), v.contiguous(), gamma.contiguous(),
        None if forget is None else forget.contiguous(), S0.contiguous(), objective, int(chunk_size),
        torch.is_grad_enabled(),
    )  # fmt: skip
