"""The delta rule (DeltaNet; Schlag et al. 2021, Yang et al. 2024) and gated delta rule (Yang et al. 2025).

flash-linear-attention conventions: tensors ``(batch, time, heads, dim)``, state ``S`` of shape
``(batch, heads, d_k, d_v)``, output ``o_t = S_t^T (scale * q_t)``; keys are *not* normalised inside the op.

* delta rule:  ``S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T``
  ``= (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``;
* gated delta rule:  ``S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T`` with ``a_t = exp(g_t)``
  (``g`` is the log decay, normally <= 0).

``mode="chunk"`` is the exact chunkwise form (Yang et al. 2024, "Parallelizing Linear Transformers with the
Delta Rule over Sequence Length", the UT transform): inside a chunk the pseudo-values
``u_t = beta_t (v_t - a_t S_{t-1}^T k_t)`` satisfy
``S_t = gamma_t S_0 + sum_{i<=t} (gamma_t / gamma_i) k_i u_i^T`` (``gamma_t`` = decay from the chunk start),
hence the unit-lower-triangular system
``(I + tril(diag(beta) (K K^T * D), -1)) U = diag(beta) V - diag(beta * gamma) K S_0`` with
``D[t, i] = gamma_t / gamma_i`` computed as ``exp`` of a segment sum of ``g`` (never a ratio of cumulative
products).  The two right-hand sides not involving ``S_0`` (``W`` and ``U'``) are solved for all chunks at
once; only ``U = U' - W S_0`` and the state update run in the loop over chunks.
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
    segsum,
    state_tensor,
    to_chunks,
)
from seqmem.ops.delta.naive import gated_delta_rule_naive

MAX_K = 128  # the Triton walk's largest key size (chunk_scan.py; imported only where triton is)
KERNEL_CHUNK = 32  # its chunk length: ptxas keeps every launch in registers there (longer chunks spilled)


def delta_chunk_scan(*args: Tensor | None) -> tuple[Tensor, Tensor]:
    """:func:`seqmem.ops.delta.chunk_scan.delta_chunk_scan`, imported on first use (triton is optional)."""
    from seqmem.ops.delta.chunk_scan import delta_chunk_scan as scan

    return scan(*args)

__all__ = ["delta_rule", "gated_delta_rule"]


def _run(
    op: str, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, g: Tensor | None, scale: float | None,
    initial_state: Tensor | None, mode: str, chunk_size: int,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Both public ops after their state is read (``g`` None: :func:`delta_rule`): the checks, then the GPU kernel
    (seqmem.backends) for ``mode="chunk"`` where one is selected, the recurrent reference or the chunked form."""
    *_, scale = check_qkv_op(op, q, k, v, initial_state, scale, mode, chunk_size, beta=beta, g=g)
    gates = (beta,) if g is None else (beta, g)
    if mode == "chunk" and (be := _backends.select(op, q, k, v, *gates, initial_state)) is not None:
        _backends.note_form(op, be.name)
        o, S = be.fn(q, k, v, *gates, scale, initial_state, chunk_size)
        return o, {"S": S}
    # half inputs or autocast: computed in float32 with autocast off (under float16 autocast the triangular
    # solves and chunk products ran in float16, and the backward overflowed)
    with full_precision(q.device):
        if mode == "recurrent":
            o, S = gated_delta_rule_naive(q, k, v, beta, g, scale, initial_state)
        else:
            kernel = (q.shape[1] > 1 and q.shape[-1] <= MAX_K
                      and _triton.use_float_kernel(q, k, v, *gates, initial_state))
            _backends.note_form(op, "triton" if kernel else "pytorch")
            C = min(chunk_size, KERNEL_CHUNK) if kernel else chunk_size  # any chunk length is exact
            o, S = _delta_core(q, k, v, beta, g, scale, initial_state, C, kernel)
    return o, {"S": S}


def _delta_core(q, k, v, beta, g, scale, initial_state, chunk_size, kernel=False):
    """The chunkwise form; ``g`` None means no decay (plain delta rule).  ``kernel``: the walk over chunks runs
    as Triton kernels (``chunk_scan.py``; float32 CUDA tensors), else as a loop here."""
    b, t, h, dk = q.shape
    dv = v.shape[-1]
    cd = compute_dtype(q, k, v, beta, g, initial_state)
    qh = q.to(cd).transpose(1, 2) * scale  # (b, h, t, dk)
    kh = k.to(cd).transpose(1, 2)
    vh = v.to(cd).transpose(1, 2)
    bh = beta.to(cd).transpose(1, 2)  # (b, h, t)
    gh = None if g is None else g.to(cd).transpose(1, 2)
    S = q.new_zeros(b, h, dk, dv, dtype=cd) if initial_state is None else initial_state.to(cd)

    if t == 0:
        return v.new_zeros(b, 0, h, dv), S
    C = min(chunk_size, t)  # short inputs (e.g. decoding one token) need no padding to a full chunk
    # padding: k = v = q = beta = g = 0 on the padded tail leaves the state unchanged (exact)
    qc, kc, vc = (to_chunks(x, C) for x in (qh, kh, vh))  # (b, h, n, C, d)
    bc = to_chunks(bh, C)  # (b, h, n, C)
    n = qc.shape[2]
    eye = torch.eye(C, dtype=cd, device=q.device)
    strict = torch.tril(torch.ones(C, C, dtype=torch.bool, device=q.device), diagonal=-1)
    incl = torch.tril(torch.ones(C, C, dtype=torch.bool, device=q.device))
    kk = kc @ kc.transpose(-1, -2)
    qk = qc @ kc.transpose(-1, -2)
    if gh is not None:
        gc = to_chunks(gh, C)
        decay = torch.exp(segsum(gc))  # D[t, i] = prod_{i < m <= t} a_m, 0 above the diagonal
        gamma = torch.exp(torch.cumsum(gc, dim=-1))  # decay from the chunk start to t (inclusive)
        last = decay[..., -1, :]  # decay from i to the chunk end
        kk = kk * decay
        qk = qk * decay
        k_rhs = kc * (bc * gamma)[..., None]
        q_in = qc * gamma[..., None]
        g_tot = gamma[..., -1]  # (b, h, n)
        k_out = kc * last[..., None]
    else:
        k_rhs = kc * bc[..., None]
        q_in = qc
        k_out = kc
    M = eye + (kk * bc[..., None]).masked_fill(~strict, 0.0)  # unit lower triangular
    W = torch.linalg.solve_triangular(M, k_rhs, upper=False, unitriangular=True)
    Up = torch.linalg.solve_triangular(M, vc * bc[..., None], upper=False, unitriangular=True)
    qk = qk.masked_fill(~incl, 0.0)
    if kernel:
        o, S = delta_chunk_scan(Up, W, q_in, qk, k_out, g_tot if gh is not None else None, S)
        return from_chunks(o, t).transpose(1, 2).to(v.dtype), S
    # unbind once: indexing inside the loop would make autograd scatter into a full-size zero tensor per step
    Up_, W_, q_, qk_, ko_ = (z.unbind(2) for z in (Up, W, q_in, qk, k_out.transpose(-1, -2)))
    gt_ = g_tot[..., None, None].unbind(2) if gh is not None else None
    outs = []
    for c in range(n):
        u = Up_[c] - W_[c] @ S  # (b, h, C, dv)
        outs.append(q_[c] @ S + qk_[c] @ u)
        if gt_ is not None:
            S = gt_[c] * S
        S = S + ko_[c] @ u
    o = torch.stack(outs, dim=2)
    return from_chunks(o, t).transpose(1, 2).to(v.dtype), S


def delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: dict[str, Tensor] | None = None,
    mode: str = "chunk",
    chunk_size: int = 64,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Delta rule: ``S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``, ``o_t = S_t^T (scale q_t)``.

    Args:
        q, k: ``(batch, time, heads, d_k)``; v: ``(batch, time, heads, d_v)``; beta: ``(batch, time, heads)``.
        scale: multiplies ``q`` (default ``d_k ** -0.5``).
        initial_state: the state dict below, or None (zeros); a bare ``S`` tensor (the former form) still works,
            with a DeprecationWarning.
        mode: ``"recurrent"`` (per-token loop) or ``"chunk"`` (exact UT/WY chunkwise form).
        chunk_size: chunk length of ``mode="chunk"``; any sequence length works.  On CUDA without a
            :mod:`seqmem.backends` kernel, float32 and half calls of more than one token run the walk over chunks as
            seqmem's Triton kernels (``ops/delta/chunk_scan.py``; Triton on: :func:`seqmem.ops._triton.use_triton`;
            key size ≤ 128) with chunks of at most 32 tokens; the chunk length changes only rounding.

    Returns:
        ``(o (batch, time, heads, d_v), state)`` with the state

        * ``"S"``: the memory ``S_t`` (batch, heads, d_k, d_v), in the compute dtype (float64 for float64 inputs,
          else float32).

        Float16 / bfloat16 inputs, and any inputs under ``torch.autocast``, are computed in float32 with autocast
        off (both modes; a GPU kernel of :mod:`seqmem.backends`, on by default on CUDA where installed, keeps its
        own precision).
    """
    initial_state = state_tensor("delta_rule", initial_state)
    return _run("delta_rule", q, k, v, beta, None, scale, initial_state, mode, chunk_size)


def gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *gates: Tensor,
    beta: Tensor | None = None,
    g: Tensor | None = None,
    scale: float | None = None,
    initial_state: dict[str, Tensor] | None = None,
    mode: str = "chunk",
    chunk_size: int = 64,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Gated delta rule (Gated DeltaNet, Yang et al. 2025, eq. 10).

    ``S_t = e^{g_t} (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``, ``o_t = S_t^T (scale q_t)``.

    ``beta`` and ``g`` are keyword-only: both are (batch, time, heads), and flash-linear-attention's
    ``chunk_gated_delta_rule`` takes them positionally in the other order (``g, beta``), so a positional call is
    refused rather than silently swapped; :mod:`seqmem.ops.fla_compat` has the op in fla's order and names.

    Args:
        q, k: ``(batch, time, heads, d_k)``; v: ``(batch, time, heads, d_v)``;
        beta, g: ``(batch, time, heads)``, by keyword (``g`` = log decay; the chunked form is stable for
            ``g <= 0``).
        scale, initial_state, mode, chunk_size: as in :func:`delta_rule`.

    Returns:
        ``(o (batch, time, heads, d_v), state)`` with the state

        * ``"S"``: the memory ``S_t`` (batch, heads, d_k, d_v), in the compute dtype.
    """
    if gates or beta is None or g is None:
        got = f"{len(gates)} positional gate(s)" if gates else "beta=None" if beta is None else "g=None"
        raise TypeError(f"gated_delta_rule(q, k, v, beta=..., g=...) takes beta and g by keyword (got {got}): "
                        "fla's chunk_gated_delta_rule takes (g, beta) in that order, so a positional pair is "
                        "ambiguous; seqmem.ops.fla_compat.chunk_gated_delta_rule takes fla's order")
    initial_state = state_tensor("gated_delta_rule", initial_state)
    return _run("gated_delta_rule", q, k, v, beta, g, scale, initial_state, mode, chunk_size)
