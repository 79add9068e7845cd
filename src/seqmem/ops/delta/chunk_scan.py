"""The delta rule's walk over chunks as Triton kernels: (gated) DeltaNet on CUDA without flash-linear-attention.

The chunkwise form (``chunk.py``, the UT transform) prepares every chunk's tensors at once — the pseudo-value
parts ``U'`` and ``W`` from the unit-lower-triangular solves and the keys decayed to the chunk's end ``K̃`` — and
leaves one sequential step per chunk ``c``, with ``S_c (K × V)`` the state entering it:

    U_c      = U'_c − W_c S_c                       (C × V: the chunk's pseudo-values)
    S_{c+1}  = γ_c S_c + K̃_cᵀ U_c                   (γ_c: the chunk's total decay; 1 for the plain delta rule)

after which the outputs ``O_c = Q̃_c S_c + QK_c U_c`` are batched products over every chunk.  In PyTorch the walk
is a Python loop of small matmuls per chunk, launch-bound on a GPU (hundreds of chunks at 16k tokens, each
launching kernels forward and backward).  Here it is one kernel each way, and everything else — the preparation,
the outputs, and the gradients that are products over whole chunks — stays batched in PyTorch:

* ``_fwd_kernel`` returns every ``U_c``, every entering state ``S_c`` and the last state;
* ``_bwd_kernel`` walks back with ``G``, the gradient of the state leaving the chunk (the last state's gradient
  first), given the gradients ``dU_c`` and ``dS_c`` that reach ``U_c`` and ``S_c`` from outside the walk:

      Ū_c = dU_c + K̃_c G,        G ← dS_c + γ_c G − W_cᵀ Ū_c,

  storing every ``Ū_c`` (= ∂L/∂U'_c) and every ``G`` before its update (∂L/∂S_{c+1}); then
  ``∂L/∂W_c = −Ū_c S_cᵀ``, ``∂L/∂K̃_c = U_c Gᵀ`` and ``∂L/∂γ_c = ⟨G, S_c⟩`` are batched products in PyTorch, and
  the last ``G`` is the initial state's gradient.

Memory kept for the backward: the inputs, every ``U_c`` and every entering state (``B·H·⌈T/C⌉·K·V`` floats; with
chunks of 32 twice what 64-token chunks keep); without a backward (inference) the walk runs :data:`SEGMENT` chunks
per call, so memory does not grow with the sequence.  The columns of ``S`` evolve independently, so a program holds
one block of ``BV`` columns, as up to four key blocks of ``BK`` rows.  Float32 throughout (the delta rule's ops
compute half inputs in float32), products in full float32 (``input_precision="ieee"``, as torch's float32
matmuls).  Chunks of any length up to 128 tokens (padded to a power of two ≥ 16 inside the kernels), key size up
to 128, any value size.  Tiles are at most 32 wide and the ops use chunks of 32: ptxas then keeps every launch in
registers, where 64-wide full-precision products spilled.  CUDA tensors, or CPU tensors under Triton's
interpreter (``TRITON_INTERPRET=1``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from seqmem.ops._common import backward_without_autocast, first_order_backward
from seqmem.ops._triton import check_device, device_guard

__all__ = ["MAX_CHUNK", "MAX_K", "delta_chunk_scan"]

MAX_CHUNK = 128  #: the longest chunk the kernels take
MAX_K = 128  #: the largest key size (four key blocks of 32)
PREC = "ieee"  #: tl.dot's input precision: full float32 products
#: chunks per kernel call without a backward (inference): the entering states kept for the outputs then take
#: SEGMENT·K·V floats per batch and head, not one state per chunk of the whole sequence
SEGMENT = 64


@triton.jit
def _tile(x, base, R, D, i_d, BR: tl.constexpr, BD: tl.constexpr):
    """Pointers and mask of rows ``0..R`` × column block ``i_d`` of an (R × D) row-major matrix at ``x + base``."""
    o_r = tl.arange(0, BR)
    o_d = i_d * BD + tl.arange(0, BD)
    return x + base + o_r[:, None] * D + o_d[None, :], (o_r < R)[:, None] & (o_d < D)[None, :]


@triton.jit
def _tile_t(x, base, R, D, i_d, BR: tl.constexpr, BD: tl.constexpr):
    """The same tile read transposed: (BD × BR) pointers and mask."""
    o_r = tl.arange(0, BR)
    o_d = i_d * BD + tl.arange(0, BD)
    return x + base + o_r[None, :] * D + o_d[:, None], (o_r < R)[None, :] & (o_d < D)[:, None]


@triton.jit
def _state(x, base, K, V, i_k, i_v, BK: tl.constexpr, BV: tl.constexpr):
    """Key block ``i_k`` × value block ``i_v`` of a (K × V) state at ``x + base``."""
    o_k = i_k * BK + tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    return x + base + o_k[:, None] * V + o_v[None, :], (o_k < K)[:, None] & (o_v < V)[None, :]


@triton.jit
def _ld(pm):
    return tl.load(pm[0], mask=pm[1], other=0.0)


@triton.jit
def _st(pm, x):
    tl.store(pm[0], x, mask=pm[1])


@triton.jit
def _dot(a, b, PREC: tl.constexpr):
    return tl.dot(a, b, input_precision=PREC)


@triton.jit
def _load4(x, base, K, V, i_v, NK: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """The first NK key blocks (value block ``i_v``) of a (K × V) state; the rest of the four are zero."""
    b1 = tl.zeros([BK, BV], dtype=tl.float32)
    b2 = tl.zeros([BK, BV], dtype=tl.float32)
    b3 = tl.zeros([BK, BV], dtype=tl.float32)
    b4 = tl.zeros([BK, BV], dtype=tl.float32)
    if NK > 0:
        b1 = _ld(_state(x, base, K, V, 0, i_v, BK, BV))
    if NK > 1:
        b2 = _ld(_state(x, base, K, V, 1, i_v, BK, BV))
    if NK > 2:
        b3 = _ld(_state(x, base, K, V, 2, i_v, BK, BV))
    if NK > 3:
        b4 = _ld(_state(x, base, K, V, 3, i_v, BK, BV))
    return b1, b2, b3, b4


@triton.jit
def _store4(x, base, K, V, i_v, b1, b2, b3, b4, NK: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    _st(_state(x, base, K, V, 0, i_v, BK, BV), b1)
    if NK > 1:
        _st(_state(x, base, K, V, 1, i_v, BK, BV), b2)
    if NK > 2:
        _st(_state(x, base, K, V, 2, i_v, BK, BV), b3)
    if NK > 3:
        _st(_state(x, base, K, V, 3, i_v, BK, BV), b4)


@triton.jit
def _times4(x, base, C, K, b1, b2, b3, b4, NK: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
            PREC: tl.constexpr):
    """X b = Σ_j X[:, key block j] b_j for a chunk's (C × K) matrix X and a state held as key blocks."""
    acc = _dot(_ld(_tile(x, base, C, K, 0, BC, BK)), b1, PREC)
    if NK > 1:
        acc += _dot(_ld(_tile(x, base, C, K, 1, BC, BK)), b2, PREC)
    if NK > 2:
        acc += _dot(_ld(_tile(x, base, C, K, 2, BC, BK)), b3, PREC)
    if NK > 3:
        acc += _dot(_ld(_tile(x, base, C, K, 3, BC, BK)), b4, PREC)
    return acc


@triton.jit
def _decay_add4(x, base, C, K, b1, b2, b3, b4, a1, a2, a3, a4, y, g, SIGN: tl.constexpr, NK: tl.constexpr,
                BC: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    """b_j ← g·b_j + (a_j + SIGN·X[:, key block j]ᵀ y) for the first NK key blocks of a state (the rest stay), X a
    chunk's (C × K) matrix: the forward's S ← γS + K̃ᵀU and the backward's G ← γG + (dS − WᵀŪ)."""
    b1 = b1 * g + (a1 + SIGN * _dot(_ld(_tile_t(x, base, C, K, 0, BC, BK)), y, PREC))
    if NK > 1:
        b2 = b2 * g + (a2 + SIGN * _dot(_ld(_tile_t(x, base, C, K, 1, BC, BK)), y, PREC))
    if NK > 2:
        b3 = b3 * g + (a3 + SIGN * _dot(_ld(_tile_t(x, base, C, K, 2, BC, BK)), y, PREC))
    if NK > 3:
        b4 = b4 * g + (a4 + SIGN * _dot(_ld(_tile_t(x, base, C, K, 3, BC, BK)), y, PREC))
    return b1, b2, b3, b4


@triton.jit
def _fwd_kernel(up, w, ko, gt, s0, u, sall, st, NT, C, K, V,
                BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NK: tl.constexpr, HAS_G: tl.constexpr,
                PREC: tl.constexpr):
    i_bh = tl.program_id(0).to(tl.int64)  # batch·heads on axis 0 (axis 1 stops at 65,535)
    i_v = tl.program_id(1)
    b_s1, b_s2, b_s3, b_s4 = _load4(s0, i_bh * K * V, K, V, i_v, NK, BK, BV)
    for c in range(0, NT):
        i_c = i_bh * NT + c  # 64-bit
        _store4(sall, i_c * K * V, K, V, i_v, b_s1, b_s2, b_s3, b_s4, NK, BK, BV)
        b_u = _ld(_tile(up, i_c * C * V, C, V, i_v, BC, BV)) \
            - _times4(w, i_c * C * K, C, K, b_s1, b_s2, b_s3, b_s4, NK, BC, BK, PREC)
        _st(_tile(u, i_c * C * V, C, V, i_v, BC, BV), b_u)
        b_g = tl.load(gt + i_c) if HAS_G else 1.0
        b_s1, b_s2, b_s3, b_s4 = _decay_add4(ko, i_c * C * K, C, K, b_s1, b_s2, b_s3, b_s4, 0.0, 0.0, 0.0, 0.0, b_u,
                                             b_g, 1.0, NK, BC, BK, PREC)
    _store4(st, i_bh * K * V, K, V, i_v, b_s1, b_s2, b_s3, b_s4, NK, BK, BV)


@triton.jit
def _bwd_kernel(w, ko, gt, du, dsall, dst, dup, gall, ds0, NT, C, K, V,
                BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NK: tl.constexpr, HAS_G: tl.constexpr,
                PREC: tl.constexpr):
    i_bh = tl.program_id(0).to(tl.int64)
    i_v = tl.program_id(1)
    b_g1, b_g2, b_g3, b_g4 = _load4(dst, i_bh * K * V, K, V, i_v, NK, BK, BV)  # G: ∂L/∂(the state leaving c)
    for j in range(0, NT):
        c = NT - 1 - j
        i_c = i_bh * NT + c
        _store4(gall, i_c * K * V, K, V, i_v, b_g1, b_g2, b_g3, b_g4, NK, BK, BV)
        b_du = _ld(_tile(du, i_c * C * V, C, V, i_v, BC, BV)) \
            + _times4(ko, i_c * C * K, C, K, b_g1, b_g2, b_g3, b_g4, NK, BC, BK, PREC)
        _st(_tile(dup, i_c * C * V, C, V, i_v, BC, BV), b_du)
        b_d1, b_d2, b_d3, b_d4 = _load4(dsall, i_c * K * V, K, V, i_v, NK, BK, BV)
        b_g = tl.load(gt + i_c) if HAS_G else 1.0
        b_g1, b_g2, b_g3, b_g4 = _decay_add4(w, i_c * C * K, C, K, b_g1, b_g2, b_g3, b_g4, b_d1, b_d2, b_d3, b_d4,
                                             b_du, b_g, -1.0, NK, BC, BK, PREC)
    _store4(ds0, i_bh * K * V, K, V, i_v, b_g1, b_g2, b_g3, b_g4, NK, BK, BV)


def _blocks(C: int, K: int, V: int) -> tuple[int, int, int, int]:
    """The chunk tile, key block and value block (powers of two ≥ 16, ``tl.dot``'s least) and the number of key
    blocks.  Blocks are at most 32 wide, value blocks 16 for K > 64: with chunks of 32 and 8 warps ptxas then keeps
    every launch in registers (docs/results/bench/kernels_compile.md)."""
    BK = min(32, max(16, triton.next_power_of_2(K)))
    NK = triton.cdiv(K, BK)
    return max(16, triton.next_power_of_2(C)), BK, min(16 if NK > 2 else 32, max(16, triton.next_power_of_2(V))), NK


def _launch_args(up: Tensor, w: Tensor) -> tuple[int, int, int, int, int, dict]:
    b, h, NT, C, V = up.shape
    K = w.shape[-1]
    BC, BK, BV, NK = _blocks(C, K, V)
    return b * h, NT, C, K, V, {"grid": (b * h, triton.cdiv(V, BV)),
                                "const": {"BC": BC, "BK": BK, "BV": BV, "NK": NK, "PREC": PREC,
                                          "num_warps": 8, "num_stages": 1}}  # no software pipelining: its
    # buffers for every load of the walk took shared memory and registers, and the walk's steps depend on each other


class _Walk(torch.autograd.Function):
    """``(U', W, K̃, γ, S_0) → (U, the entering states S_c, the last state)``, both ways in Triton."""

    @staticmethod
    def forward(ctx, up: Tensor, w: Tensor, ko: Tensor, gt: Tensor | None, s0: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        _, NT, C, K, V, la = _launch_args(up, w)
        b, h = up.shape[:2]
        u = torch.empty_like(up)
        sall = up.new_empty(b, h, NT, K, V)
        st = up.new_empty(b, h, K, V)
        with device_guard(up):
            _fwd_kernel[la["grid"]](up, w, ko, gt if gt is not None else st, s0, u, sall, st, NT, C, K, V,
                                    HAS_G=gt is not None, **la["const"])
        ctx.save_for_backward(w, ko, gt, u, sall)
        return u, sall, st

    @staticmethod
    @first_order_backward("delta_rule (Triton walk over chunks)")
    @backward_without_autocast  # dW, dK̃ below in float32, as the forward computed
    def backward(ctx, du: Tensor, dsall: Tensor, dst: Tensor):  # unused outputs' gradients come as zeros
        w, ko, gt, u, sall = ctx.saved_tensors
        _, NT, C, K, V, la = _launch_args(u, w)
        du, dsall, dst = (x.float().contiguous() for x in (du, dsall, dst))
        dup = torch.empty_like(u)
        gall = torch.empty_like(sall)
        ds0 = torch.empty_like(dst)
        with device_guard(u):
            _bwd_kernel[la["grid"]](w, ko, gt if gt is not None else ds0, du, dsall, dst, dup, gall, ds0, NT, C, K, V,
                                    HAS_G=gt is not None, **la["const"])
        dw = -(dup @ sall.transpose(-1, -2))  # ∂L/∂W_c = −Ū_c S_cᵀ
        dko = u @ gall.transpose(-1, -2)  # ∂L/∂K̃_c = U_c Gᵀ
        dgt = None if gt is None else torch.einsum("bhnkv,bhnkv->bhn", gall, sall)  # ⟨G, S_c⟩
        return dup, dw, dko, dgt, ds0


def delta_chunk_scan(up: Tensor, w: Tensor, q: Tensor, qk: Tensor, ko: Tensor, gt: Tensor | None,
                     s0: Tensor) -> tuple[Tensor, Tensor]:
    """The delta rule's chunkwise form after its preparation (module docstring): the walk over chunks in Triton,
    the outputs ``O_c = Q̃_c S_c + QK_c U_c`` batched; differentiable in every input.

    Args:
        up: ``U'`` (batch, heads, chunks, C, V); w: ``W`` (batch, heads, chunks, C, K); q: the decayed scaled
            queries ``Q̃`` (batch, heads, chunks, C, K); qk: the masked intra-chunk scores (batch, heads, chunks,
            C, C); ko: the keys decayed to the chunk's end ``K̃`` (batch, heads, chunks, C, K); gt: each chunk's
            total decay (batch, heads, chunks), or None (no decay); s0: the entering state (batch, heads, K, V).
            Float32.

    Returns ``(O (batch, heads, chunks, C, V), the state after the last chunk (batch, heads, K, V))``.
    """
    op = "delta_chunk_scan"
    b, h, NT, C, V = up.shape
    K = w.shape[-1]
    want = {"w": (b, h, NT, C, K), "q": (b, h, NT, C, K), "qk": (b, h, NT, C, C), "ko": (b, h, NT, C, K),
            "s0": (b, h, K, V)} | ({} if gt is None else {"gt": (b, h, NT)})
    got = {"w": w, "q": q, "qk": qk, "ko": ko, "s0": s0, "gt": gt}
    for name, shape in want.items():
        if tuple(got[name].shape) != shape:
            raise ValueError(f"{op}: {name} must be {shape}, got {tuple(got[name].shape)}")
    ts = [up, w, q, qk, ko, s0] + ([] if gt is None else [gt])
    if any(t.dtype != torch.float32 for t in ts):
        raise ValueError(f"{op}: the kernels take float32 tensors, got {sorted({str(t.dtype) for t in ts})}")
    if not (1 <= C <= MAX_CHUNK and 1 <= K <= MAX_K):
        raise ValueError(f"{op}: chunks of 1 to {MAX_CHUNK} tokens and key sizes of 1 to {MAX_K}, got C = {C}, "
                         f"K = {K}")
    check_device(op, _fwd_kernel, *ts)
    if NT > SEGMENT and not (torch.is_grad_enabled() and any(t.requires_grad for t in ts)):
        # no backward to keep the states for: walk SEGMENT chunks at a time, so that memory does not grow with T
        outs = []
        for i in range(0, NT, SEGMENT):
            part = slice(i, i + SEGMENT)
            o, s0 = delta_chunk_scan(up[:, :, part], w[:, :, part], q[:, :, part], qk[:, :, part], ko[:, :, part],
                                     None if gt is None else gt[:, :, part], s0)
            outs.append(o)
        return torch.cat(outs, 2), s0
    u, sall, st = _Walk.apply(up.contiguous(), w.contiguous(), ko.contiguous(),
                              None if gt is None else gt.contiguous(), s0.contiguous())
    return q @ sall + qk @ u, st
