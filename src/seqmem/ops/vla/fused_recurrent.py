"""VLA, the fused recurrent Triton kernels: :func:`fused_recurrent_vla` (Algorithm 1 / eqs. 8-11) and
:func:`fused_recurrent_vla_paper_delta_rule` (the paper's eq. 4), both exact.

Two kernels, because the two recurrences couple different dimensions:

* **Sherman–Morrison** (eq. 9-10): ``z = A u``, ``δ = max(1 + uᵀz, ε)``, ``A ← A − z zᵀ/δ`` (``+ ηI`` on a refresh
  position), ``α = A k̂``.  ``z`` sums over a whole row of ``A`` and ``δ`` over all of ``z``, so one program per
  (batch, head) holds all of ``A (D×D)`` in registers.  It depends on the keys only.
* **The residual write** (eq. 10-11): ``e = v − S k̂``, ``S ← g S + e α̂ᵀ`` (``g = 1`` for VLA, the decay β of
  eq. 4 for the paper's DeltaNet), ``o = S φ(q)``.  Every row of ``S (Dv×D)`` evolves on its own, so the grid is
  (batch·heads) × (value blocks of ``BV`` rows), each program holding ``BV×D`` of the state.

The features (``φ``, ``k̂``, ``u``), ``α̂ = α/‖α‖`` and the normaliser ``max(φ(q)ᵀz, ε)`` are elementwise or cumulative
sums and stay in PyTorch (autograd differentiates them).

Backward of both kernels: the forward saves the state every ``chunk_size`` tokens; the backward kernel walks the
chunks in reverse, re-runs each from its checkpoint (its input states go to a per-program scratch buffer), then
walks it backwards through the hand-derived VJP of the step.  The value-block kernel writes its partial gradients
of ``φ(q), k̂, α̂`` per block; they are summed in PyTorch.

Computed in float32 (the ops cast half inputs to float32 first); CUDA tensors, or CPU tensors under Triton's
interpreter (``TRITON_INTERPRET=1``).  Limits: ``D, Dv ≤ 128``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch import Tensor

from seqmem.ops._common import first_order_backward
from seqmem.ops._triton import check_device, device_guard, num_warps

__all__ = ["MAX_DIM", "fused_recurrent_vla", "fused_recurrent_vla_paper_delta_rule"]

MAX_DIM = 128


# --------------------------------------------------------------------------------------- Sherman–Morrison (A)
@triton.jit
def _sm_fwd_kernel(
    u, kh, eh, a0, alpha, a_out, ckpt, T, H, C, EPS,
    D: tl.constexpr, BD: tl.constexpr, SAVE: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)  # 64-bit offsets: B·H·T·d·m passes 2³¹ at long T
    i_b = i_bh // H
    i_h = i_bh % H
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    m_a = m_d[:, None] & m_d[None, :]
    o_a = o_d[:, None] * D + o_d[None, :]
    eye = tl.where((o_d[:, None] == o_d[None, :]) & m_a, 1.0, 0.0)
    A = tl.load(a0 + i_bh * D * D + o_a, mask=m_a, other=0.0).to(tl.float32)
    p_x = i_b * T * H * D + i_h * D + o_d
    n_ck = tl.cdiv(T, C)
    t = 0
    while t < T:
        if SAVE:
            if t % C == 0:  # a checkpoint at each chunk's first step
                tl.store(ckpt + (i_bh * n_ck + t // C) * D * D + o_a, A, mask=m_a)
        u_t = tl.load(u + p_x, mask=m_d, other=0.0)
        k_t = tl.load(kh + p_x, mask=m_d, other=0.0)
        e_t = tl.load(eh + i_b * T + t)
        z = tl.sum(A * u_t[None, :], 1)  # z = A u
        delta = tl.maximum(1.0 + tl.sum(u_t * z, 0), EPS)  # δ = max(1 + uᵀz, ε)
        A = A - z[:, None] * z[None, :] / delta + e_t * eye  # Sherman–Morrison, then the +ηI refresh
        tl.store(alpha + p_x, tl.sum(A * k_t[None, :], 1), mask=m_d)  # α = A k̂ (post-update A)
        p_x += H * D
        t += 1
    tl.store(a_out + i_bh * D * D + o_a, A, mask=m_a)


@triton.jit
def _sm_bwd_kernel(
    u, kh, eh, ckpt, scratch, dalpha, da_out, du, dkh, da0, T, H, C, EPS,
    D: tl.constexpr, BD: tl.constexpr, HAS_DA: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)  # 64-bit offsets: B·H·T·d·m passes 2³¹ at long T
    i_b = i_bh // H
    i_h = i_bh % H
    o_d = tl.arange(0, BD)
    m_d = o_d < D
    m_a = m_d[:, None] & m_d[None, :]
    o_a = o_d[:, None] * D + o_d[None, :]
    eye = tl.where((o_d[:, None] == o_d[None, :]) & m_a, 1.0, 0.0)
    if HAS_DA:
        G = tl.load(da_out + i_bh * D * D + o_a, mask=m_a, other=0.0)
    else:
        G = tl.zeros([BD, BD], dtype=tl.float32)
    base = i_b * T * H * D + i_h * D + o_d
    sx = (i_bh * 0 + H) * D  # a token's stride, 64-bit (t · H · D in 32 bits overflows at long T)
    p_scr = scratch + i_bh * C * D * D + o_a
    n_ck = tl.cdiv(T, C)
    c = n_ck - 1
    while c >= 0:
        c0 = c * C
        c1 = tl.minimum(c0 + C, T)
        A = tl.load(ckpt + (i_bh * n_ck + c) * D * D + o_a, mask=m_a, other=0.0)
        t = c0
        while t < c1:  # re-run the chunk; scratch[j] = A before token c0 + j
            tl.store(p_scr + (t - c0) * D * D, A, mask=m_a)
            u_t = tl.load(u + base + t * sx, mask=m_d, other=0.0)
            z = tl.sum(A * u_t[None, :], 1)
            delta = tl.maximum(1.0 + tl.sum(u_t * z, 0), EPS)
            A = A - z[:, None] * z[None, :] / delta + tl.load(eh + i_b * T + t) * eye
            t += 1
        tl.debug_barrier()
        t = c1 - 1
        while t >= c0:
            A_in = tl.load(p_scr + (t - c0) * D * D, mask=m_a, other=0.0)
            u_t = tl.load(u + base + t * sx, mask=m_d, other=0.0)
            k_t = tl.load(kh + base + t * sx, mask=m_d, other=0.0)
            da_t = tl.load(dalpha + base + t * sx, mask=m_d, other=0.0)
            z = tl.sum(A_in * u_t[None, :], 1)
            den = 1.0 + tl.sum(u_t * z, 0)
            delta = tl.maximum(den, EPS)
            A_out = A_in - z[:, None] * z[None, :] / delta + tl.load(eh + i_b * T + t) * eye
            # α = A_out k̂
            G += da_t[:, None] * k_t[None, :]
            tl.store(dkh + base + t * sx, tl.sum(A_out * da_t[:, None], 0), mask=m_d)
            # A_out = A_in − z zᵀ/δ (+ ηI)
            Gz = tl.sum(G * z[None, :], 1)
            dz = -(Gz + tl.sum(G * z[:, None], 0)) / delta
            d_delta = tl.sum(z * Gz, 0) / (delta * delta)
            live = (den >= EPS).to(tl.float32)  # the clamp passes no gradient where it binds
            dz += live * d_delta * u_t
            # z = A_in u, δ = 1 + uᵀz
            tl.store(du + base + t * sx, tl.sum(A_in * dz[:, None], 0) + live * d_delta * z, mask=m_d)
            G += dz[:, None] * u_t[None, :]
            t -= 1
        tl.debug_barrier()
        c -= 1
    tl.store(da0 + i_bh * D * D + o_a, G, mask=m_a)


class _ShermanMorrison(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u, kh, eh, a0, chunk, eps, grad):  # noqa: ANN001, ANN205
        B, T, H, D = kh.shape
        N = B * H
        chunk = max(1, min(chunk, T))
        save = grad and any(ctx.needs_input_grad[:4])  # checkpoints only when a backward can follow
        n_ck = triton.cdiv(T, chunk)
        alpha = torch.empty_like(kh)
        a_out = torch.empty(B, H, D, D, dtype=torch.float32, device=kh.device)
        ckpt = torch.empty(N, n_ck if save else 1, D, D, dtype=torch.float32, device=kh.device)
        with device_guard(kh):
            _sm_fwd_kernel[(N,)](u, kh, eh, a0, alpha, a_out, ckpt, T, H, chunk, eps,
                                 D=D, BD=triton.next_power_of_2(D), SAVE=save,
                                 num_warps=num_warps(triton.next_power_of_2(D) ** 2))  # fmt: skip
        ctx.save_for_backward(u, kh, eh, ckpt)
        ctx.chunk, ctx.eps = chunk, eps
        return alpha, a_out

    @staticmethod
    @first_order_backward("fused_recurrent_vla (Sherman–Morrison)")
    def backward(ctx, dalpha, da_out):  # noqa: ANN001, ANN205
        u, kh, eh, ckpt = ctx.saved_tensors
        B, T, H, D = kh.shape
        N, C = B * H, ctx.chunk
        dalpha = torch.zeros_like(kh) if dalpha is None else dalpha.float().contiguous()
        du, dkh = torch.empty_like(kh), torch.empty_like(kh)
        da0 = torch.empty(B, H, D, D, dtype=torch.float32, device=kh.device)
        scratch = torch.empty(N, C, D, D, dtype=torch.float32, device=kh.device)
        with device_guard(kh):
            _sm_bwd_kernel[(N,)](
                u, kh, eh, ckpt, scratch, dalpha, da0 if da_out is None else da_out.float().contiguous(), du, dkh,
                da0, T, H, C, ctx.eps, D=D, BD=triton.next_power_of_2(D), HAS_DA=da_out is not None,
                num_warps=num_warps(2 * triton.next_power_of_2(D) ** 2),
            )  # fmt: skip
        return du, dkh, None, da0, None, None, None


# -------------------------------------------------------------------------------------- the residual write (S)
@triton.jit
def _gdr_fwd_kernel(
    q, a, b, v, g, s0, o, s_out, ckpt, T, H, C,
    D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, HAS_G: tl.constexpr,
    SAVE: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)  # batch·heads on axis 0: CUDA caps axis 1 at 65,535 programs
    i_v = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    n_v = tl.num_programs(1)
    o_k = tl.arange(0, BD)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < D
    m_v = o_v < DV
    m_s = m_v[:, None] & m_k[None, :]
    o_s = o_v[:, None] * D + o_k[None, :]
    S = tl.load(s0 + i_bh * DV * D + o_s, mask=m_s, other=0.0).to(tl.float32)
    p_k = i_b * T * H * D + i_h * D + o_k
    p_v = i_b * T * H * DV + i_h * DV + o_v
    p_g = i_b * T * H + i_h
    n_ck = tl.cdiv(T, C)
    t = 0
    while t < T:
        if SAVE:
            if t % C == 0:  # a checkpoint at each chunk's first step
                tl.store(ckpt + ((i_bh * n_v + i_v) * n_ck + t // C) * BV * D + (o_v[:, None] - i_v * BV) * D
                         + o_k[None, :], S, mask=m_s)  # fmt: skip
        a_t = tl.load(a + p_k, mask=m_k, other=0.0)
        b_t = tl.load(b + p_k, mask=m_k, other=0.0)
        q_t = tl.load(q + p_k, mask=m_k, other=0.0)
        v_t = tl.load(v + p_v, mask=m_v, other=0.0)
        e = v_t - tl.sum(S * a_t[None, :], 1)  # e = v − S k̂
        if HAS_G:
            S = tl.load(g + p_g) * S
        S += e[:, None] * b_t[None, :]  # S ← g S + e α̂ᵀ
        tl.store(o + p_v, tl.sum(S * q_t[None, :], 1), mask=m_v)  # o = S φ(q)
        p_k += H * D
        p_v += H * DV
        p_g += H
        t += 1
    tl.store(s_out + i_bh * DV * D + o_s, S, mask=m_s)


@triton.jit
def _gdr_bwd_kernel(
    q, a, b, v, g, ckpt, scratch, do, ds_out, dq, da, db, dv, dg, ds0, T, H, C,
    D: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BV: tl.constexpr, HAS_G: tl.constexpr,
    HAS_DS: tl.constexpr,
):
    i_bh = tl.program_id(0).to(tl.int64)  # batch·heads on axis 0: CUDA caps axis 1 at 65,535 programs
    i_v = tl.program_id(1).to(tl.int64)
    i_b = i_bh // H
    i_h = i_bh % H
    n_v = tl.num_programs(1)
    o_k = tl.arange(0, BD)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < D
    m_v = o_v < DV
    m_s = m_v[:, None] & m_k[None, :]
    o_s = o_v[:, None] * D + o_k[None, :]
    o_blk = (o_v[:, None] - i_v * BV) * D + o_k[None, :]
    if HAS_DS:
        G = tl.load(ds_out + i_bh * DV * D + o_s, mask=m_s, other=0.0)
    else:
        G = tl.zeros([BV, BD], dtype=tl.float32)
    base_k = i_b * T * H * D + i_h * D + o_k
    base_v = i_b * T * H * DV + i_h * DV + o_v
    base_g = i_b * T * H + i_h
    sg = i_bh * 0 + H  # a token's strides, 64-bit (t · H · D in 32 bits overflows at long T)
    sk, sv = sg * D, sg * DV
    part = i_v * tl.num_programs(0) * T * D  # the value block's slice of the partial-gradient buffers
    p_scr = scratch + (i_bh * n_v + i_v) * C * BV * D + o_blk
    n_ck = tl.cdiv(T, C)
    c = n_ck - 1
    while c >= 0:
        c0 = c * C
        c1 = tl.minimum(c0 + C, T)
        S = tl.load(ckpt + ((i_bh * n_v + i_v) * n_ck + c) * BV * D + o_blk, mask=m_s, other=0.0)
        t = c0
        while t < c1:  # re-run the chunk; scratch[j] = S before token c0 + j
            tl.store(p_scr + (t - c0) * BV * D, S, mask=m_s)
            a_t = tl.load(a + base_k + t * sk, mask=m_k, other=0.0)
            b_t = tl.load(b + base_k + t * sk, mask=m_k, other=0.0)
            v_t = tl.load(v + base_v + t * sv, mask=m_v, other=0.0)
            e = v_t - tl.sum(S * a_t[None, :], 1)
            if HAS_G:
                S = tl.load(g + base_g + t * sg) * S
            S += e[:, None] * b_t[None, :]
            t += 1
        tl.debug_barrier()
        t = c1 - 1
        while t >= c0:
            S_in = tl.load(p_scr + (t - c0) * BV * D, mask=m_s, other=0.0)
            a_t = tl.load(a + base_k + t * sk, mask=m_k, other=0.0)
            b_t = tl.load(b + base_k + t * sk, mask=m_k, other=0.0)
            q_t = tl.load(q + base_k + t * sk, mask=m_k, other=0.0)
            v_t = tl.load(v + base_v + t * sv, mask=m_v, other=0.0)
            do_t = tl.load(do + base_v + t * sv, mask=m_v, other=0.0)
            e = v_t - tl.sum(S_in * a_t[None, :], 1)
            if HAS_G:
                g_t = tl.load(g + base_g + t * sg)
                S_out = g_t * S_in + e[:, None] * b_t[None, :]
            else:
                S_out = S_in + e[:, None] * b_t[None, :]
            # o = S_out q
            G += do_t[:, None] * q_t[None, :]
            p_kt = part + (i_b * T + t) * H * D + i_h * D + o_k
            tl.store(dq + p_kt, tl.sum(S_out * do_t[:, None], 0), mask=m_k)
            # S_out = g S_in + e bᵀ,  e = v − S_in a
            de = tl.sum(G * b_t[None, :], 1)
            tl.store(db + p_kt, tl.sum(G * e[:, None], 0), mask=m_k)
            tl.store(dv + base_v + t * sv, de, mask=m_v)
            tl.store(da + p_kt, -tl.sum(S_in * de[:, None], 0), mask=m_k)
            if HAS_G:
                tl.store(dg + i_v * tl.num_programs(0) * T + base_g + t * sg, tl.sum(tl.sum(G * S_in, 1), 0))
                G = g_t * G - de[:, None] * a_t[None, :]
            else:
                G = G - de[:, None] * a_t[None, :]
            t -= 1
        tl.debug_barrier()
        c -= 1
    tl.store(ds0 + i_bh * DV * D + o_s, G, mask=m_s)


def _block_v(DV: int) -> int:
    return min(triton.next_power_of_2(DV), 32)


class _ResidualWrite(torch.autograd.Function):
    """``S_t = g_t S_{t-1} + (v_t − S_{t-1} a_t) b_tᵀ``, ``o_t = S_t q_t``; tensors (B, T, H, ·), S (B, H, Dv, D)."""

    @staticmethod
    def forward(ctx, q, a, b, v, g, s0, chunk, grad):  # noqa: ANN001, ANN205
        B, T, H, D = a.shape
        DV = v.shape[-1]
        N, BV = B * H, _block_v(DV)
        n_v = triton.cdiv(DV, BV)
        chunk = max(1, min(chunk, T))
        save = grad and any(ctx.needs_input_grad[:6])  # checkpoints only when a backward can follow
        n_ck = triton.cdiv(T, chunk)
        o = torch.empty_like(v)
        s_out = torch.empty(B, H, DV, D, dtype=torch.float32, device=v.device)
        ckpt = torch.empty(N, n_v, n_ck if save else 1, BV, D, dtype=torch.float32, device=v.device)
        with device_guard(v):
            _gdr_fwd_kernel[(N, n_v)](
                q, a, b, v, g if g is not None else v, s0, o, s_out, ckpt, T, H, chunk,
                D=D, DV=DV, BD=triton.next_power_of_2(D), BV=BV, HAS_G=g is not None, SAVE=save,
            )  # fmt: skip
        ctx.save_for_backward(q, a, b, v, g, ckpt)
        ctx.chunk = chunk
        return o, s_out

    @staticmethod
    @first_order_backward("fused_recurrent_vla (residual write)")
    def backward(ctx, do, ds_out):  # noqa: ANN001, ANN205
        q, a, b, v, g, ckpt = ctx.saved_tensors
        B, T, H, D = a.shape
        DV = v.shape[-1]
        N, BV, C = B * H, _block_v(DV), ctx.chunk
        n_v = triton.cdiv(DV, BV)
        f32, dev = torch.float32, v.device
        do = torch.zeros_like(v) if do is None else do.float().contiguous()
        dq, da, db = (torch.empty(n_v, B, T, H, D, dtype=f32, device=dev) for _ in range(3))
        dv = torch.empty_like(v)
        dg = torch.empty(n_v, B, T, H, dtype=f32, device=dev) if g is not None else dv
        ds0 = torch.empty(B, H, DV, D, dtype=f32, device=dev)
        scratch = torch.empty(N, n_v, C, BV, D, dtype=f32, device=dev)
        with device_guard(v):
            _gdr_bwd_kernel[(N, n_v)](
                q, a, b, v, g if g is not None else v, ckpt, scratch, do,
                ds0 if ds_out is None else ds_out.float().contiguous(), dq, da, db, dv, dg, ds0, T, H, C,
                D=D, DV=DV, BD=triton.next_power_of_2(D), BV=BV, HAS_G=g is not None, HAS_DS=ds_out is not None,
            )  # fmt: skip
        return dq.sum(0), da.sum(0), db.sum(0), dv, None if g is None else dg.sum(0), ds0, None, None


# ------------------------------------------------------------------------------------------------- the ops
def _check(op: str, q: Tensor, k: Tensor, v: Tensor, *others: Tensor | None) -> None:
    for x in (q, k, v, *others):  # the kernels load without casting: another dtype does not compile on a GPU
        if x is not None and x.dtype != torch.float32:
            raise ValueError(f"{op}: the Triton kernel computes in float32, got {x.dtype} (the op casts half "
                             "inputs)")
    if max(k.shape[-1], v.shape[-1]) > MAX_DIM:
        raise ValueError(f"{op}: head dims {k.shape[-1]}, {v.shape[-1]} must be <= {MAX_DIM}")
    check_device(op, _gdr_fwd_kernel, q, k, v, *others)


def _unit(x: Tensor) -> Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def _readout(o: Tensor, qf: Tensor, kf: Tensor, z: Tensor | None, eps: float) -> tuple[Tensor, Tensor | None]:
    """``o / max(φ(q_t)ᵀ z_t, ε)`` with ``z_t = z + Σ_{s≤t} φ(k_s)`` (eq. 11); z None: ``o`` as is."""
    if z is None:
        return o, None
    zc = z[:, None] + torch.cumsum(kf, dim=1)  # (B, T, H, D)
    return o / torch.clamp((qf * zc).sum(-1), min=eps)[..., None], zc[:, -1]


def fused_recurrent_vla(
    q: Tensor, k: Tensor, v: Tensor, w_u: Tensor, *, lam0: float = 0.1, u_scale: float | None = None,
    refresh_period: int | None = 20, refresh_eta: float = 1e-3, eps: float = 1e-4, normalizer: str = "paper",
    normalize_key: bool = True, normalize_alpha: bool = True, fixed_A: bool = False,  # noqa: N803
    initial_state: dict[str, Tensor] | None = None, chunk_size: int = 64,
) -> tuple[Tensor, dict[str, Tensor]]:
    """:func:`seqmem.ops.vla_attention` in the Triton kernels (float32; arguments and state as there, already
    checked by it).  ``chunk_size``: the backward's checkpoint interval."""
    _check("fused_recurrent_vla", q, k, v, w_u)
    B, T, H, D = k.shape
    Dv = v.shape[-1]
    st = initial_state or {}
    dev = k.device
    kf = F.elu(k) + 1.0  # φ(k) (§2.2)
    kh = _unit(kf) if normalize_key else kf
    qf = F.elu(q) + 1.0
    pos = st["pos"].long() if "pos" in st else torch.zeros(B, dtype=torch.long, device=dev)
    if fixed_A:
        alpha, A = kh / lam0, None
    else:
        scale = 1.0 / math.sqrt(D) if u_scale is None else float(u_scale)
        u = F.normalize(torch.einsum("hed,bthd->bthe", w_u, k), dim=-1, eps=1e-12) * scale  # eq. 8
        period = refresh_period or 0
        gpos = pos[:, None] + torch.arange(1, T + 1, device=dev)[None, :]
        eh = (refresh_eta * (gpos % period == 0)) if period else torch.zeros(B, T, device=dev)
        A0 = st["A"] if "A" in st else (torch.eye(D, device=dev) / lam0).expand(B, H, D, D)
        alpha, A = _ShermanMorrison.apply(u.contiguous(), kh.contiguous(), eh.float().contiguous(),
                                          A0.float().contiguous(), int(chunk_size), float(eps),
                                          torch.is_grad_enabled())  # fmt: skip
    ah = _unit(alpha) if normalize_alpha else alpha  # eq. 10
    S0 = st["S"] if "S" in st else torch.zeros(B, H, Dv, D, device=dev)
    o, S = _ResidualWrite.apply(qf.contiguous(), kh.contiguous(), ah.contiguous(), v.contiguous(), None,
                                S0.float().contiguous(), int(chunk_size), torch.is_grad_enabled())  # fmt: skip
    use_z = normalizer == "paper"
    z0 = (st["z"] if "z" in st else torch.zeros(B, H, D, device=dev)) if use_z else None
    o, z = _readout(o, qf, kf, z0, eps)
    state = {"S": S, "pos": pos + T}
    if A is not None:
        state["A"] = A
    if use_z:
        state["z"] = z
    return o, state


def fused_recurrent_vla_paper_delta_rule(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, *, eps: float = 1e-4, normalizer: str = "paper",
    initial_state: dict[str, Tensor] | None = None, chunk_size: int = 64,
) -> tuple[Tensor, dict[str, Tensor]]:
    """:func:`seqmem.ops.vla_paper_delta_rule` (eq. 4: ``S_t = β_t S_{t-1} + (v_t − S_{t-1} k̂_t) k̂_tᵀ``) in the
    residual-write kernel (float32; arguments and state as there, already checked by it)."""
    _check("fused_recurrent_vla_paper_delta_rule", q, k, v, beta)
    B, T, H, D = k.shape
    st = initial_state or {}
    kf = F.elu(k) + 1.0
    kh = _unit(kf).contiguous()
    qf = F.elu(q) + 1.0
    S0 = st["S"] if "S" in st else torch.zeros(B, H, v.shape[-1], D, device=k.device)
    o, S = _ResidualWrite.apply(qf.contiguous(), kh, kh, v.contiguous(), beta.contiguous(), S0.float().contiguous(),
                                int(chunk_size), torch.is_grad_enabled())  # fmt: skip
    z0 = (st["z"] if "z" in st else torch.zeros(B, H, D, device=k.device)) if normalizer == "paper" else None
    o, z = _readout(o, qf, kf, z0, eps)
    state = {"S": S}
    if z is not None:
        state["z"] = z
    return o, state
