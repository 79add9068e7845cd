"""Mamba-2 state-space duality (SSD; Dao & Gu, 2024), scalar-decay selective SSM per head.

``h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T``, ``y_t = h_t C_t`` with ``h`` of shape
``(batch, heads, p, n)``.  ``mode="chunk"`` is the block decomposition of the semiseparable matrix
(``ssd_minimal`` of the Mamba-2 paper, Listing 1): diagonal blocks computed as masked attention with decays
``exp(segsum(dt A))``, chunk states, a recurrence over chunk states, and the off-diagonal contribution
``C_t . (decay * state)``.  No ``D`` skip here (the Mamba-2 block adds it).
"""

from __future__ import annotations

import torch
from torch import Tensor

from seqmem.ops import _backends, _triton
from seqmem.ops._common import (
    check_chunk_size,
    check_mode,
    check_same_device,
    check_tensor,
    check_values,
    compute_dtype,
    from_chunks,
    full_precision,
    segsum,
    state_tensor,
    to_chunks,
    values_checked,
)
from seqmem.ops.state_space.naive import ssd_naive

__all__ = ["ssd"]


def ssd(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    initial_state: dict[str, Tensor] | None = None,
    mode: str = "chunk",
    chunk_size: int = 64,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Selective state space with scalar decay per head (Mamba-2 SSD, paper eq. (1)/(5) and Listing 1).

    Args:
        x: ``(batch, time, heads, p)``; dt: ``(batch, time, heads)`` (already positive, e.g. after softplus);
        A: ``(heads,)`` (negative, e.g. Mamba's ``-exp(A_log)``); B, C: ``(batch, time, heads, n)`` (expand
        groups to heads before calling).  ``A > 0`` or ``dt < 0`` is refused: a decay ``exp(dt A)``
        above 1 grows the state without bound (``A_log`` passed for ``-exp(A_log)`` gave outputs of ~1e6);
        ``A = 0`` (no decay; ``-exp(A_log)`` underflowed) is allowed;
        ``dt = 0`` (a softplus saturated at 0) is a token that neither decays nor writes the state.
        initial_state: the state dict below, or None (zeros); a bare ``S`` tensor (the former form) still works,
            with a DeprecationWarning.
        mode: ``"recurrent"`` (per-token loop) or ``"chunk"`` (exact block decomposition).
        chunk_size: block length of ``mode="chunk"``; any sequence length works.

    Returns:
        ``(y (batch, time, heads, p), state)`` with the state

        * ``"S"``: the SSM state ``h_t`` (batch, heads, p, n), in the compute dtype.

    Precision: float16 / bfloat16 inputs, and any inputs under ``torch.autocast``, are computed in float32 with
    autocast off (float64 stays float64) by the PyTorch forms; ``y`` is in ``x``'s dtype.  On CUDA with
    ``mamba_ssm`` installed (:mod:`seqmem.backends`, on by default) ``mode="chunk"`` runs its kernel, float32
    calls included: TF32 matmuls (about 1e-3 relative) and per-chunk states in the input's dtype.  Otherwise on CUDA
    (``mamba_ssm`` absent or its backend off, Triton kernels on: :func:`seqmem.ops._triton.use_triton`)
    ``mode="chunk"`` with more than one token runs seqmem's chunked simple-GLA Triton kernel
    (``ops/vort/chunk_simple_gla.py``): SSD is that recurrence with queries ``C``, keys ``B``, values ``dt x`` and
    log-gates ``dt A``, the state transposed; float32 calls multiply in full float32, half ones in TF32, with float32
    sums and states (float64: the PyTorch forms).
    """
    op = "ssd"
    initial_state = state_tensor(op, initial_state)
    check_mode(op, mode)
    check_chunk_size(op, chunk_size)
    check_tensor(op, "x", x, (None, None, None, None), "batch, time, heads, p")
    b, t, h, p = x.shape
    check_tensor(op, "dt", dt, (b, t, h), "batch, time, heads")
    check_tensor(op, "A", A, (h,), "heads")
    check_tensor(op, "B", B, (b, t, h, None), "batch, time, heads, n")
    n = B.shape[-1]
    check_tensor(op, "C", C, (b, t, h, n), "batch, time, heads, n")
    if initial_state is not None:
        check_tensor(op, "initial_state['S']", initial_state, (b, h, p, n), "batch, heads, p, n")
    check_same_device(op, x=x, dt=dt, A=A, B=B, C=C, initial_state=initial_state)
    if values_checked():  # one reduction each; skipped inside torch.compile (a graph break); NaN propagates
        # A = 0 is allowed: no decay (-exp(A_log) underflows to -0.0 once A_log is very negative)
        check_values(op, "A", A, ~(A > 0), "<= 0 (the log decay rate per head: pass -exp(A_log), not A_log)")
        # dt = 0 is allowed: a token that neither decays nor writes (a saturated softplus at large inputs is 0)
        check_values(op, "dt", dt, ~(dt < 0), ">= 0 (a step size, e.g. softplus(dt_raw + dt_bias))")
    if mode == "chunk" and (be := _backends.select("ssd", x, dt, A, B, C, initial_state)) is not None:
        _backends.note_form(op, be.name)
        y, S = be.fn(x, dt, A, B, C, initial_state, chunk_size)  # a GPU kernel (seqmem.backends)
        return y, {"S": S}
    if mode == "chunk" and x.shape[1] > 1 and _triton.use_float_kernel(x, dt, A, B, C, initial_state):
        _backends.note_form(op, "triton")
        with full_precision(x.device):
            return _ssd_gla(x, dt, A, B, C, initial_state)
    # autocast off: the chunk maths (segment sums, exp, the block products) in the compute dtype, as the other ops
    # (under bfloat16 autocast its matmuls ran in bfloat16: a relative error of ~4e-2 against float64)
    with full_precision(x.device):
        if mode == "recurrent":
            y, S = ssd_naive(x, dt, A, B, C, initial_state)
            return y, {"S": S}
        _backends.note_form(op, "pytorch")
        return _ssd_chunk(x, dt, A, B, C, initial_state, chunk_size)


def _ssd_gla(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
             initial_state: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
    """:func:`ssd` as one chunked simple-GLA kernel call: ``h_t = e^{g_t} h_{t-1} + k_t v_tᵀ``, ``o_t = h_tᵀ q_t``
    with ``q = C``, ``k = B``, ``v = dt x`` (in float32), ``g = dt A``; its state ``(n, p)`` is SSD's ``S (p, n)``
    transposed.  The state comes back in the compute dtype (float32 for half inputs), as from the PyTorch forms."""
    from seqmem.ops.vort.chunk_simple_gla import chunk_simple_gla

    cd = compute_dtype(x, dt, A, B, C, initial_state)
    dtf = dt.float()
    v = x.float() * dtf[..., None]
    h0 = None if initial_state is None else initial_state.transpose(-1, -2)
    y, hT = chunk_simple_gla(C, B, v, dtf * A.float(), scale=1.0, initial_state=h0, output_final_state=True)
    return y.to(x.dtype), {"S": hT.transpose(-1, -2).to(cd).contiguous()}


def _ssd_chunk(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, initial_state: Tensor | None,
               chunk_size: int) -> tuple[Tensor, dict[str, Tensor]]:
    """The block decomposition of :func:`ssd` on checked inputs (autocast off)."""
    b, t, h, p = x.shape
    n = B.shape[-1]
    cd = compute_dtype(x, dt, A, B, C, initial_state)

    xh = x.to(cd).transpose(1, 2)  # (b, h, t, p)
    dth = dt.to(cd).transpose(1, 2)  # (b, h, t)
    Bh = B.to(cd).transpose(1, 2)  # (b, h, t, n)
    Ch = C.to(cd).transpose(1, 2)
    a = dth * A.to(cd)[None, :, None]  # log decay per step (b, h, t)
    xdt = xh * dth[..., None]
    S = x.new_zeros(b, h, p, n, dtype=cd) if initial_state is None else initial_state.to(cd)

    if t == 0:
        return x.new_zeros(b, 0, h, p), {"S": S}
    L = min(chunk_size, t)  # short inputs (e.g. decoding one token) need no padding to a full chunk
    xc, Bc, Cc = (to_chunks(z, L) for z in (xdt, Bh, Ch))  # (b, h, nc, L, .)
    ac = to_chunks(a, L)  # (b, h, nc, L); padded steps have dt = 0: decay 1 and no input (exact)
    decay = torch.exp(segsum(ac))  # (b, h, nc, L, L): lower-triangular semiseparable mask
    # 1. diagonal blocks (intra-chunk outputs)
    y_diag = ((Cc @ Bc.transpose(-1, -2)) * decay) @ xc
    # 2. each chunk's own state (from zero), decayed to the chunk end
    to_end = decay[..., -1, :]  # (b, h, nc, L)
    chunk_states = (xc * to_end[..., None]).transpose(-1, -2) @ Bc  # (b, h, nc, p, n)
    from_start = torch.exp(torch.cumsum(ac, dim=-1))  # decay from the chunk start to t (inclusive)
    chunk_decay = from_start[..., -1]  # (b, h, nc)
    # 3. recurrence over chunks, 4. off-diagonal outputs C_t . (from_start_t * state at chunk start)
    # unbind once: indexing inside the loop would make autograd scatter into a full-size zero tensor per step
    C_, fs_, cs_ = (z.unbind(2) for z in (Cc, from_start[..., None], chunk_states))
    cd_ = chunk_decay[..., None, None].unbind(2)
    ys = []
    for c in range(xc.shape[2]):
        ys.append((C_[c] @ S.transpose(-1, -2)) * fs_[c])
        S = cd_[c] * S + cs_[c]
    y = y_diag + torch.stack(ys, dim=2)
    return from_chunks(y, t).transpose(1, 2).to(x.dtype), {"S": S}
