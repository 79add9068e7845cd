"""Chunked scalar-gated linear attention as Triton kernels: VORT's SOE channels on CUDA without flash-linear-attention.

Each SOE channel of eqs. (14)-(15) is a linear attention with one scalar log-gate per token and head
(``gla.py`` reduces the whole SOE retention to one such call with the channels as heads).  The recurrence, per
batch and head, with ``h (K × V)``:

    h_t = e^{g_t} h_{t-1} + k_t v_tᵀ,        o_t = scale · h_tᵀ q_t

is computed in chunks of ``BT`` tokens.  With the chunk-local cumulative gate ``γ_i = Σ_{j ≤ i, j in chunk} g_j``
and ``Γ = γ`` of the chunk's last token, the state entering chunk ``c`` is ``h_c`` and

    o_i     = scale · ( e^{γ_i} q_iᵀ h_c + Σ_{j ≤ i in chunk} e^{γ_i − γ_j} (q_i·k_j) v_j )          (inter + intra)
    h_{c+1} = e^{Γ} h_c + Σ_{j in chunk} e^{Γ − γ_j} k_j v_jᵀ

Forward: ``_fwd_h`` walks the chunks in order and stores every ``h_c`` (one program per key block × value block of
the state: its rows evolve independently); ``_fwd_o`` computes every chunk's outputs in parallel.  Backward:
``_bwd_dh`` walks the chunks in reverse and stores the gradient of every ``h_{c+1}`` (``dH_c``; the last one is the
final state's gradient),

    dH_{c-1} = e^{Γ_c} dH_c + scale · Σ_{i in chunk c} e^{γ_i} q_i do_iᵀ,

then ``_bwd_dqk`` (summing over the value blocks) and ``_bwd_dv`` (over the key blocks) compute each chunk's
``dq, dk`` and ``dv`` in parallel from ``h_c``, ``dH_c`` and the chunk's tokens.  The gates' gradient needs no
kernel: with ``B_t = Σ_{s ≤ t} g_s`` the outputs and the final state depend on the gates only through
``e^{B_t} q_t``, ``e^{−B_s} k_s`` and ``e^{B_T}``, so ``∂L/∂B_t = q_t·dq_t − k_t·dk_t`` (plus ``⟨dh_T, h_T⟩`` at
the last token), and ``dg_t = Σ_{u ≥ t} ∂L/∂B_u``.

Computed in float32.  Float32 inputs are multiplied in full float32 (``input_precision="ieee"``, as torch's
float32 matmuls: the kernel agrees with the PyTorch forms to float32 rounding, not TF32's 1e-3); half inputs are
read as they are and multiplied in TF32.  Sums, states and gates stay in float32; the outputs come in ``q``'s
dtype, the final state in float32.  Chunks and the key and value blocks are 64 wide for half inputs and 32 for
float32 ones (their full-precision products take more registers: ptxas spilled them at 64), so any head size
runs.
CUDA tensors, or CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``).  The signature is that of
flash-linear-attention's ``chunk_simple_gla``, so ``gla.py`` takes either.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from seqmem.ops._common import first_order_backward
from seqmem.ops._triton import check_device, device_guard, num_warps

__all__ = ["chunk_simple_gla"]


# Tiles of one (batch, head): q, k (T, K) and v, o, do (T, V) rows of stride H·K / H·V; the states (NT, K, V) per
# (batch, head); the gates γ (NT·BT,) of stride H.  Loads past the ends read zeros; stores stop at the ends.
@triton.jit
def _rows(x, i_b, i_h, T, H, D, c, i_d, BT: tl.constexpr, BD: tl.constexpr):
    o_t = c * BT + tl.arange(0, BT)
    o_d = i_d * BD + tl.arange(0, BD)
    # the chunk's first row in 64-bit (i_b is), the offsets inside it in 32-bit: fewer registers per tile
    p = x + ((i_b * T + c * BT) * H + i_h) * D + tl.arange(0, BT)[:, None] * (H * D) + o_d[None, :]
    return p, (o_t < T)[:, None] & (o_d < D)[None, :]


@triton.jit
def _cols(x, i_b, i_h, T, H, D, c, i_d, BT: tl.constexpr, BD: tl.constexpr):  # the same rows, transposed (BD, BT)
    o_t = c * BT + tl.arange(0, BT)
    o_d = i_d * BD + tl.arange(0, BD)
    p = x + ((i_b * T + c * BT) * H + i_h) * D + tl.arange(0, BT)[None, :] * (H * D) + o_d[:, None]
    return p, (o_t < T)[None, :] & (o_d < D)[:, None]


@triton.jit
def _state(x, i_bh, NT, c, K, V, i_k, i_v, BK: tl.constexpr, BV: tl.constexpr):
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    p = x + (i_bh * NT + c) * K * V + o_k[:, None] * V + o_v[None, :]
    return p, (o_k < K)[:, None] & (o_v < V)[None, :]


@triton.jit
def _dot(a, b, PREC: tl.constexpr):
    return tl.dot(a, b, input_precision=PREC)


@triton.jit
def _ld(pm):
    return tl.load(pm[0], mask=pm[1], other=0.0).to(tl.float32)


@triton.jit
def _st(pm, x):
    tl.store(pm[0], x, mask=pm[1])


@triton.jit
def _gates(gc, i_b, i_h, H, NT, c, BT: tl.constexpr):
    """γ of chunk c's tokens and Γ, its last (padded positions carry the last real γ)."""
    base = gc + (i_b * NT * BT + c * BT) * H + i_h
    return tl.load(base + tl.arange(0, BT) * H), tl.load(base + (BT - 1) * H)


@triton.jit
def _fwd_h_kernel(k, v, gc, h0, h, ht, T, H, NT, K, V,
                  BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                  USE_H0: tl.constexpr, PREC: tl.constexpr):
    # one (key block, value block) of the state per program: its rows evolve independently of the others
    i_bh = tl.program_id(0).to(tl.int64)  # batch·heads on axis 0 (up to 2³¹ − 1; axes 1-2 stop at 65,535)
    i_k = tl.program_id(1)
    i_v = tl.program_id(2)
    i_b = i_bh // H
    i_h = i_bh % H
    if USE_H0:
        b_h = _ld(_state(h0, i_bh, 1, 0, K, V, i_k, i_v, BK, BV))
    else:
        b_h = tl.zeros([BK, BV], dtype=tl.float32)
    for c in range(0, NT):
        _st(_state(h, i_bh, NT, c, K, V, i_k, i_v, BK, BV), b_h)
        b_kt = _ld(_cols(k, i_b, i_h, T, H, K, c, i_k, BT, BK))
        b_v = _ld(_rows(v, i_b, i_h, T, H, V, c, i_v, BT, BV))
        b_g, g_last = _gates(gc, i_b, i_h, H, NT, c, BT)
        b_h = b_h * tl.exp(g_last) + _dot(b_kt * tl.exp(g_last - b_g)[None, :], b_v, PREC)
    _st(_state(ht, i_bh, 1, 0, K, V, i_k, i_v, BK, BV), b_h)  # the backward's gate gradient reads it too


@triton.jit
def _fwd_o_kernel(q, k, v, gc, h, o, scale, T, H, NT, K, V,
                  BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    i_bh = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    i_v = tl.program_id(2)
    i_b = i_bh // H
    i_h = i_bh % H
    b_s = tl.zeros([BT, BT], dtype=tl.float32)
    b_o = tl.zeros([BT, BV], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BK)):  # q·k and q·h_c summed over the key blocks
        b_q = _ld(_rows(q, i_b, i_h, T, H, K, c, i_k, BT, BK))
        b_kt = _ld(_cols(k, i_b, i_h, T, H, K, c, i_k, BT, BK))
        b_h = _ld(_state(h, i_bh, NT, c, K, V, i_k, i_v, BK, BV))
        b_s += _dot(b_q, b_kt, PREC)
        b_o += _dot(b_q, b_h, PREC)
    b_g, g_last = _gates(gc, i_b, i_h, H, NT, c, BT)
    o_t = tl.arange(0, BT)
    causal = o_t[:, None] >= o_t[None, :]
    b_s = b_s * tl.exp(tl.where(causal, b_g[:, None] - b_g[None, :], float("-inf")))  # 0 above the diagonal
    b_v = _ld(_rows(v, i_b, i_h, T, H, V, c, i_v, BT, BV))
    b_o = b_o * tl.exp(b_g)[:, None] + _dot(b_s, b_v, PREC)
    _st(_rows(o, i_b, i_h, T, H, V, c, i_v, BT, BV), b_o * scale)


@triton.jit
def _bwd_dh_kernel(q, do, gc, dht, dh, dh0, scale, T, H, NT, K, V,
                   BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                   USE_DHT: tl.constexpr, STORE_DH0: tl.constexpr, PREC: tl.constexpr):
    i_bh = tl.program_id(0).to(tl.int64)  # batch·heads on axis 0 (up to 2³¹ − 1; axes 1-2 stop at 65,535)
    i_k = tl.program_id(1)
    i_v = tl.program_id(2)
    i_b = i_bh // H
    i_h = i_bh % H
    if USE_DHT:
        b_dh = _ld(_state(dht, i_bh, 1, 0, K, V, i_k, i_v, BK, BV))
    else:
        b_dh = tl.zeros([BK, BV], dtype=tl.float32)
    for j in range(0, NT):
        c = NT - 1 - j
        _st(_state(dh, i_bh, NT, c, K, V, i_k, i_v, BK, BV), b_dh)  # dH_c
        b_qt = _ld(_cols(q, i_b, i_h, T, H, K, c, i_k, BT, BK))
        b_do = _ld(_rows(do, i_b, i_h, T, H, V, c, i_v, BT, BV))
        b_g, g_last = _gates(gc, i_b, i_h, H, NT, c, BT)
        b_dh = b_dh * tl.exp(g_last) + _dot(b_qt * (tl.exp(b_g) * scale)[None, :], b_do, PREC)
    if STORE_DH0:
        _st(_state(dh0, i_bh, 1, 0, K, V, i_k, i_v, BK, BV), b_dh)


@triton.jit
def _bwd_dqk_kernel(q, k, v, gc, h, dh, do, dq, dk, scale, T, H, NT, K, V,
                    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    # one key block of a chunk's dq and dk; dA = do vᵀ, do h_cᵀ and v dH_cᵀ summed over the value blocks
    i_bh = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    i_k = tl.program_id(2)
    i_b = i_bh // H
    i_h = i_bh % H
    b_da = tl.zeros([BT, BT], dtype=tl.float32)
    b_dq = tl.zeros([BT, BK], dtype=tl.float32)
    b_dk = tl.zeros([BT, BK], dtype=tl.float32)
    for i_v in range(0, tl.cdiv(V, BV)):
        b_do = _ld(_rows(do, i_b, i_h, T, H, V, c, i_v, BT, BV))
        b_v = _ld(_rows(v, i_b, i_h, T, H, V, c, i_v, BT, BV))
        b_h = _ld(_state(h, i_bh, NT, c, K, V, i_k, i_v, BK, BV))
        b_dh = _ld(_state(dh, i_bh, NT, c, K, V, i_k, i_v, BK, BV))
        b_da += _dot(b_do, tl.trans(b_v), PREC)
        b_dq += _dot(b_do, tl.trans(b_h), PREC)
        b_dk += _dot(b_v, tl.trans(b_dh), PREC)
    b_g, g_last = _gates(gc, i_b, i_h, H, NT, c, BT)
    o_t = tl.arange(0, BT)
    causal = o_t[:, None] >= o_t[None, :]
    b_da = b_da * tl.exp(tl.where(causal, b_g[:, None] - b_g[None, :], float("-inf"))) * scale
    # dq_i = Σ_j dA_ij k_j + scale e^{γ_i} h_c do_i;  dk_j = Σ_i dA_ij q_i + e^{Γ − γ_j} dH_c v_j
    b_k = _ld(_rows(k, i_b, i_h, T, H, K, c, i_k, BT, BK))
    _st(_rows(dq, i_b, i_h, T, H, K, c, i_k, BT, BK), _dot(b_da, b_k, PREC) + b_dq * (tl.exp(b_g) * scale)[:, None])
    b_q = _ld(_rows(q, i_b, i_h, T, H, K, c, i_k, BT, BK))
    _st(_rows(dk, i_b, i_h, T, H, K, c, i_k, BT, BK),
        _dot(tl.trans(b_da), b_q, PREC) + b_dk * tl.exp(g_last - b_g)[:, None])


@triton.jit
def _bwd_dv_kernel(q, k, gc, dh, do, dv, scale, T, H, NT, K, V,
                   BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr):
    # dv_j = Σ_{i ≥ j} A_ij do_i + e^{Γ − γ_j} dH_cᵀ k_j, with A_ij = scale e^{γ_i − γ_j} q_i·k_j
    i_bh = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1)
    i_v = tl.program_id(2)
    i_b = i_bh // H
    i_h = i_bh % H
    b_at = tl.zeros([BT, BT], dtype=tl.float32)  # Aᵀ before its decay and scale
    b_dv = tl.zeros([BT, BV], dtype=tl.float32)
    for i_k in range(0, tl.cdiv(K, BK)):
        b_k = _ld(_rows(k, i_b, i_h, T, H, K, c, i_k, BT, BK))
        b_qt = _ld(_cols(q, i_b, i_h, T, H, K, c, i_k, BT, BK))
        b_dh = _ld(_state(dh, i_bh, NT, c, K, V, i_k, i_v, BK, BV))
        b_at += _dot(b_k, b_qt, PREC)
        b_dv += _dot(b_k, b_dh, PREC)
    b_g, g_last = _gates(gc, i_b, i_h, H, NT, c, BT)
    o_t = tl.arange(0, BT)
    causal_t = o_t[:, None] <= o_t[None, :]  # (j, i): i ≥ j
    b_at = b_at * tl.exp(tl.where(causal_t, b_g[None, :] - b_g[:, None], float("-inf"))) * scale
    b_do = _ld(_rows(do, i_b, i_h, T, H, V, c, i_v, BT, BV))
    b_dv = b_dv * tl.exp(g_last - b_g)[:, None] + _dot(b_at, b_do, PREC)
    _st(_rows(dv, i_b, i_h, T, H, V, c, i_v, BT, BV), b_dv)


def _blocks(K: int, V: int, prec: str) -> tuple[int, int]:
    """Key and value block sizes: 64 for TF32 products (tensor cores), 32 for full float32 ones (FMA), whose
    operand tiles take more registers (ptxas spilled them at 64: docs/results/bench/kernels_compile.md)."""
    cap = 64 if prec == "tf32" else 32
    return min(cap, max(16, triton.next_power_of_2(K))), min(cap, max(16, triton.next_power_of_2(V)))


def _precision(*xs: Tensor) -> str:
    """``tl.dot``'s input precision: full float32 products ("ieee", as torch's float32 matmuls) for float32 inputs;
    TF32 for half inputs, whose products it represents exactly enough (the sums stay in float32)."""
    return "ieee" if all(x.dtype == torch.float32 for x in xs) else "tf32"


def _chunk_gates(g: Tensor, BT: int) -> tuple[Tensor, int]:
    """The chunk-local cumulative gates γ in float32, ``(B, NT·BT, H)``; padded positions (gate 0) repeat the last
    real γ of their chunk."""
    B, T, H = g.shape
    NT = triton.cdiv(T, BT)
    gp = torch.nn.functional.pad(g.float(), (0, 0, 0, NT * BT - T))
    return gp.view(B, NT, BT, H).cumsum(2).view(B, NT * BT, H).contiguous(), NT


class _ChunkSimpleGLA(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, g: Tensor, h0: Tensor | None, scale: float, BT: int,
                want_ht: bool) -> tuple[Tensor, Tensor | None]:
        B, T, H, K = q.shape
        V = v.shape[-1]
        prec = _precision(q, k, v)
        BK, BV = _blocks(K, V, prec)
        gc, NT = _chunk_gates(g, BT)
        h = q.new_empty(B, H, NT, K, V, dtype=torch.float32)
        ht = q.new_empty(B, H, K, V, dtype=torch.float32)
        o = q.new_empty(B, T, H, V, dtype=torch.float32)
        nk, nv = triton.cdiv(K, BK), triton.cdiv(V, BV)
        w = num_warps(BK * BV)
        with device_guard(q):
            _fwd_h_kernel[(B * H, nk, nv)](k, v, gc, h0 if h0 is not None else ht, h, ht, T, H, NT, K, V,
                                           BT=BT, BK=BK, BV=BV, USE_H0=h0 is not None, PREC=prec,
                                           num_warps=w)
            _fwd_o_kernel[(B * H, NT, nv)](q, k, v, gc, h, o, scale, T, H, NT, K, V, BT=BT, BK=BK, BV=BV,
                                           PREC=prec, num_warps=w)
        ctx.save_for_backward(q, k, v, gc, h, ht, h0)
        ctx.scale, ctx.BT, ctx.g_dtype, ctx.prec = scale, BT, g.dtype, prec
        return o.to(q.dtype), (ht if want_ht else None)

    @staticmethod
    @first_order_backward("chunk_simple_gla")
    def backward(ctx, do: Tensor, dht: Tensor | None):
        q, k, v, gc, h, ht, h0 = ctx.saved_tensors
        scale, BT, prec = ctx.scale, ctx.BT, ctx.prec
        B, T, H, K = q.shape
        V = v.shape[-1]
        NT = h.shape[2]
        BK, BV = _blocks(K, V, prec)
        nk, nv = triton.cdiv(K, BK), triton.cdiv(V, BV)
        w = num_warps(BK * BV)
        wb = 2 * w if prec == "ieee" else w  # dq, dk: float32 FMA products of four operand tiles spilled at 4 warps
        do = do.contiguous()
        dht = None if dht is None else dht.float().contiguous()
        dh = q.new_empty(B, H, NT, K, V, dtype=torch.float32)
        dh0 = q.new_empty(B, H, K, V, dtype=torch.float32)  # written only with an initial state
        dq = q.new_empty(B, T, H, K, dtype=torch.float32)
        dk = q.new_empty(B, T, H, K, dtype=torch.float32)
        dv = q.new_empty(B, T, H, V, dtype=torch.float32)
        with device_guard(q):
            _bwd_dh_kernel[(B * H, nk, nv)](q, do, gc, dht if dht is not None else dh0, dh, dh0, scale, T, H, NT, K,
                                            V, BT=BT, BK=BK, BV=BV, USE_DHT=dht is not None, STORE_DH0=h0 is not None,
                                            PREC=prec, num_warps=w)
            _bwd_dqk_kernel[(B * H, NT, nk)](q, k, v, gc, h, dh, do, dq, dk, scale, T, H, NT, K, V,
                                                  BT=BT, BK=BK, BV=min(BV, 32), PREC=prec,  # 3 sums: 64 spilled
                                                  num_warps=wb)
            _bwd_dv_kernel[(B * H, NT, nv)](q, k, gc, dh, do, dv, scale, T, H, NT, K, V, BT=BT, BK=BK, BV=BV,
                                            PREC=prec, num_warps=w)
        # ∂L/∂B_t = q_t·dq_t − k_t·dk_t (+ ⟨dh_T, h_T⟩ at the last token); dg_t = Σ_{u ≥ t} ∂L/∂B_u
        db = (q.float() * dq).sum(-1) - (k.float() * dk).sum(-1)
        if dht is not None:
            db[:, -1] += (dht * ht).sum((-2, -1))
        dg = db.flip(1).cumsum(1).flip(1)
        return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dg.to(ctx.g_dtype),
                None if h0 is None else dh0.to(h0.dtype), None, None, None)


def chunk_simple_gla(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, scale: float | None = None, initial_state: Tensor | None = None,
    output_final_state: bool = False, chunk_size: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Scalar-gated causal linear attention, ``h_t = e^{g_t} h_{t-1} + k_t v_tᵀ``, ``o_t = scale · h_tᵀ q_t``.

    Args:
        q, k: ``(batch, time, heads, K)``; v: ``(batch, time, heads, V)``; g: ``(batch, time, heads)`` log-gates
            (real; VORT's are ≤ 0).
        scale: multiplies the read-out (default ``K ** -0.5``).
        initial_state: ``(batch, heads, K, V)`` or None (zeros).
        output_final_state: also return the state after the last token (float32), else None.
        chunk_size: tokens per chunk, a power of two ≥ 16 (None: 64 for half inputs, 32 for float32 ones, whose
            full-precision products take more registers).

    Returns ``(o (batch, time, heads, V) in q's dtype, final state or None)``; differentiable in ``q, k, v, g`` and
    the initial state.
    """
    op = "chunk_simple_gla"
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:3] != q.shape[:3] \
            or tuple(g.shape) != tuple(q.shape[:3]):
        raise ValueError(f"{op}: q, k (batch, time, heads, K), v (batch, time, heads, V) and g (batch, time, heads) "
                         f"must agree, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}, {tuple(g.shape)}")
    B, T, H, K = q.shape
    V = v.shape[-1]
    if chunk_size is None:
        chunk_size = 32 if _precision(q, k, v) == "ieee" else 64
    if not (isinstance(chunk_size, int) and 16 <= chunk_size <= 128 and chunk_size & (chunk_size - 1) == 0):
        raise ValueError(f"{op}: chunk_size must be a power of two from 16 to 128, got {chunk_size!r}")
    if triton.cdiv(T, chunk_size) > 65535:  # the chunks are a launch grid axis, which CUDA caps at 65,535
        raise ValueError(f"{op}: at most 65,535 chunks of {chunk_size} tokens per call ({65535 * chunk_size:,} "
                         f"tokens), got T = {T:,}: split the sequence and continue from the returned state")
    if initial_state is not None and tuple(initial_state.shape) != (B, H, K, V):
        raise ValueError(f"{op}: initial_state must be (batch, heads, K, V) = {(B, H, K, V)}, got "
                         f"{tuple(initial_state.shape)}")
    if any(x.dtype == torch.float64 for x in (q, k, v, g)):
        raise ValueError(f"{op}: the kernel computes in float32; float64 inputs take the PyTorch form")
    check_device(op, _fwd_h_kernel, q, k, v, g, initial_state)
    scale = K ** -0.5 if scale is None else float(scale)
    if T == 0:
        ht = (initial_state.float().clone() if initial_state is not None
              else q.new_zeros(B, H, K, V, dtype=torch.float32))
        return q.new_zeros(B, 0, H, V), (ht if output_final_state else None)
    h0 = None if initial_state is None else initial_state.contiguous()
    return _ChunkSimpleGLA.apply(q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), h0, scale,
                                 chunk_size, bool(output_final_state))
