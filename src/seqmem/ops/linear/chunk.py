"""Causal linear attention (Katharopoulos et al., 2020), the chunkwise form; flash-linear-attention conventions.

``S_t = S_{t-1} + k_t v_t^T`` (state ``(batch, heads, d_k, d_v)``), ``o_t = S_t^T (scale * q_t)``.
No feature map and no normaliser inside the op (apply the feature map to ``q``/``k`` before calling; a
normaliser ``phi(q_t) . sum_i phi(k_i)`` is obtained exactly by appending a column of ones to ``v``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from seqmem.ops import _backends, _triton
from seqmem.ops._common import (
    check_qkv_op,
    compute_dtype,
    from_chunks,
    full_precision,
    state_tensor,
    to_chunks,
)
from seqmem.ops.linear.naive import linear_attention_naive

__all__ = ["linear_attention"]


def linear_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    scale: float | None = None,
    initial_state: dict[str, Tensor] | None = None,
    mode: str = "chunk",
    chunk_size: int = 64,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Causal (unnormalised) linear attention.

    Args:
        q, k: ``(batch, time, heads, d_k)``; v: ``(batch, time, heads, d_v)``.
        scale: multiplies ``q`` (default ``d_k ** -0.5``).
        initial_state: the state dict below, or None (zeros); a bare ``S`` tensor (the former form) still works,
            with a DeprecationWarning.
        mode: ``"recurrent"`` (per-token loop) or ``"chunk"`` (chunkwise-parallel, exact).
        chunk_size: chunk length of ``mode="chunk"`` (any sequence length works).

    Returns:
        ``(o, state)``: ``o`` ``(batch, time, heads, d_v)`` in ``v``'s dtype, and the state

        * ``"S"``: the memory ``S_t = S_0 + Σ_i k_i v_iᵀ`` (batch, heads, d_k, d_v), in the compute dtype (float64
          for float64 inputs, else float32).

        Float16 / bfloat16 inputs, and any inputs under ``torch.autocast``, are computed in float32 with autocast
        off (both modes) by the PyTorch forms; on CUDA a GPU kernel of :mod:`seqmem.backends` (on by default where
        installed; bfloat16 only here) computes as its kernels do (per-chunk states in bfloat16).  Where no backend
        applies, a CUDA call of more than one token (Triton kernels on: :func:`seqmem.ops._triton.use_triton`, no
        float64) runs seqmem's chunked simple-GLA Triton kernel (``ops/vort/chunk_simple_gla.py``) with zero
        gates: float32 calls multiply in full float32, half ones in TF32, with float32 sums and states.
    """
    op = "linear_attention"
    initial_state = state_tensor(op, initial_state)
    scale = check_qkv_op(op, q, k, v, initial_state, scale, mode, chunk_size)[-1]
    if mode == "chunk" and (be := _backends.select(op, q, k, v, initial_state)) is not None:  # a GPU kernel
        _backends.note_form(op, be.name)  # (seqmem.backends)
        o, S = be.fn(q, k, v, scale, initial_state, chunk_size)
        return o, {"S": S}
    if mode == "chunk" and q.shape[1] > 1 and _triton.use_float_kernel(q, k, v, initial_state):
        _backends.note_form(op, "triton")
        from seqmem.ops.vort.chunk_simple_gla import chunk_simple_gla

        with full_precision(q.device):
            cd = compute_dtype(q, k, v, initial_state)
            g = q.new_zeros(q.shape[:3], dtype=torch.float32)  # no decay
            o, S = chunk_simple_gla(q, k, v, g, scale=scale, initial_state=initial_state, output_final_state=True)
        return o.to(v.dtype), {"S": S.to(cd)}
    # half inputs or autocast: computed in float32 with autocast off (the state, an undecayed sum, and the
    # read-out grow with t: under float16 autocast the chunk products overflowed after ~40k tokens)
    with full_precision(q.device):
        if mode == "recurrent":
            o, S = linear_attention_naive(q, k, v, scale, initial_state)
        else:
            _backends.note_form(op, "pytorch")
            o, S = _linear_attention_chunk(q, k, v, scale, initial_state, chunk_size)
    return o, {"S": S}


def _linear_attention_chunk(q, k, v, scale, initial_state, chunk_size):
    """The chunkwise form (autocast off); returns ``(o in v's dtype, S)``."""
    b, t, h, dk = q.shape
    dv = v.shape[-1]
    cd = compute_dtype(q, k, v, initial_state)

    qh = q.to(cd).transpose(1, 2) * scale  # (b, h, t, dk)
    kh = k.to(cd).transpose(1, 2)
    vh = v.to(cd).transpose(1, 2)
    S = q.new_zeros(b, h, dk, dv, dtype=cd) if initial_state is None else initial_state.to(cd)

    if t == 0:
        return v.new_zeros(b, 0, h, dv), S
    C = min(chunk_size, t)  # short inputs (e.g. decoding one token) need no padding to a full chunk
    qc, kc, vc = (to_chunks(x, C) for x in (qh, kh, vh))  # (b, h, n, C, d)
    causal = torch.tril(torch.ones(C, C, dtype=torch.bool, device=q.device))
    attn = (qc @ kc.transpose(-1, -2)).masked_fill(~causal, 0.0)
    o_intra = attn @ vc
    kv = kc.transpose(-1, -2) @ vc  # (b, h, n, dk, dv): each chunk's contribution to the state
    # state at the start of every chunk: S0 + exclusive cumulative sum of the chunk contributions
    csum = torch.cumsum(kv, dim=2)
    starts = S[:, :, None] + torch.cat([torch.zeros_like(kv[:, :, :1]), csum[:, :, :-1]], dim=2)
    o = o_intra + qc @ starts
    final = S + csum[:, :, -1]
    return from_chunks(o, t).transpose(1, 2).to(v.dtype), final
