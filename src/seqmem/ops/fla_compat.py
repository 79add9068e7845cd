"""seqmem's ops under flash-linear-attention's names, argument order and return convention.

For code written against ``fla.ops`` (``from seqmem.ops.fla_compat import chunk_gated_delta_rule``): the same
positional tensors in fla's order (``q, k, v, g, beta`` for the gated delta rule: ``g`` *before* ``beta``, where
seqmem's own :func:`~seqmem.ops.gated_delta_rule` takes both by keyword), the same defaults and the same
``(o, final_state)`` return:

* tensors ``(batch, time, heads, dim)`` (fla's ``head_first=False``; ``head_first=True`` is refused);
* ``g`` is the log decay (``a_t = exp(g_t)``), ``beta`` (batch, time, heads);
* ``scale`` defaults to ``d_k ** -0.5``; q and k are *not* normalised unless ``use_qk_l2norm_in_kernel=True``
  (then ``x / sqrt(sum x^2 + 1e-6)`` on the last dimension, as fla's kernel does);
* ``initial_state`` and ``final_state`` are bare tensors ``(N, heads, d_k, d_v)``; ``final_state`` is ``None``
  unless ``output_final_state=True`` — except linear attention with ``normalize=True``, whose state is a pair
  ``(S or None, z)`` (``z`` the running key sum its normaliser needs to continue a split sequence; fla keeps none,
  so its normalised form cannot be continued);
* ``cu_seqlens`` (``N + 1`` offsets, batch 1): ``N`` packed sequences, each starting from its own initial state
  (zeros or ``initial_state[n]``), the final state one row per sequence.

``chunk_*`` run seqmem's exact chunked form, ``fused_recurrent_*`` its recurrent reference, in the compute dtype
(float64 for float64 inputs, else float32); outputs come back in ``q``'s dtype, states in the compute dtype.  The
arguments after the tensors are keyword-only: fla's optional arguments have changed order between releases, and a
positional call that lands on the wrong one would compute something else silently.  fla options seqmem has no
math for (gate-in-kernel, ``gk``/``gv``, ``g_gamma``, negative eigenvalues, ...) are not accepted: a ``TypeError``
names them.  Only the forms seqmem computes are here: the delta rule, the gated delta rule and linear attention
(fla's ``chunk_simple_gla`` — a per-token scalar decay without the delta rule's correction — has no seqmem op).
"""

from __future__ import annotations

import torch
from torch import Tensor

from seqmem.ops.delta.chunk import delta_rule as _delta_rule
from seqmem.ops.delta.chunk import gated_delta_rule as _gated_delta_rule
from seqmem.ops.linear.chunk import linear_attention as _linear_attention

#: The fla names this module provides (it is not re-exported into :mod:`seqmem.ops`, whose names keep seqmem's
#: order and conventions).
FLA_NAMES = ("chunk_delta_rule", "chunk_gated_delta_rule", "chunk_linear_attn", "fused_recurrent_delta_rule",
             "fused_recurrent_gated_delta_rule", "fused_recurrent_linear_attn")


def _l2norm(x: Tensor) -> Tensor:
    """fla's in-kernel L2 norm of the last dimension: ``x / sqrt(sum x^2 + 1e-6)``."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)


def _check(name: str, q: Tensor, initial_state: Tensor | None, cu_seqlens: Tensor | None, head_first: bool,
           others: dict[str, Tensor | None] | None = None) -> int:
    """The number of sequences ``N`` after fla's checks (clear ``ValueError`` s).  ``others``: k, v and the gates,
    which must share q's batch, time and heads (they are sliced by q's spans: a longer one would be cut silently)."""
    if head_first:
        raise ValueError(f"{name}: head_first=True is not supported; pass (batch, time, heads, dim) tensors "
                         "(fla's default, head_first=False)")
    if not isinstance(q, Tensor) or q.dim() != 4:
        raise ValueError(f"{name}: q must be a (batch, time, heads, dim) tensor, got "
                         f"{tuple(q.shape) if isinstance(q, Tensor) else type(q).__name__}")
    for n_, t in (others or {}).items():
        if t is None:
            continue
        if not isinstance(t, Tensor) or t.dim() < 3 or t.shape[:3] != q.shape[:3]:
            got = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name}: {n_} must have q's (batch, time, heads) = {tuple(q.shape[:3])} in front, "
                             f"got {got}")
    if cu_seqlens is None:
        n = q.shape[0]
    else:
        if not isinstance(cu_seqlens, Tensor) or cu_seqlens.dtype not in (torch.int32, torch.int64):
            got = cu_seqlens.dtype if isinstance(cu_seqlens, Tensor) else type(cu_seqlens).__name__
            raise ValueError(f"{name}: cu_seqlens must be an int32 or int64 tensor of offsets (as in fla), got {got}")
        if q.shape[0] != 1:
            raise ValueError(f"{name}: with cu_seqlens the batch size must be 1 (packed sequences), got {q.shape[0]}")
        cu = cu_seqlens.tolist()
        if cu_seqlens.dim() != 1 or len(cu) < 2 or cu[0] != 0 or cu[-1] != q.shape[1] or any(
                a > b for a, b in zip(cu, cu[1:])):
            raise ValueError(f"{name}: cu_seqlens must be non-decreasing offsets from 0 to the length "
                             f"{q.shape[1]}, got {cu}")
        n = len(cu) - 1
    if initial_state is not None:
        want = (n, q.shape[2], q.shape[3], (others or {}).get("v", q).shape[-1])
        if not isinstance(initial_state, Tensor) or tuple(initial_state.shape) != want:
            got = tuple(initial_state.shape) if isinstance(initial_state, Tensor) else type(initial_state).__name__
            raise ValueError(f"{name}: initial_state must be (N, heads, d_k, d_v) = {want} for {n} sequence(s), "
                             f"got {got}")
    return n


def _run(name: str, fn, tensors: dict[str, Tensor | None], scale: float | None,  # noqa: ANN001
         initial_state: Tensor | None, output_final_state: bool, cu_seqlens: Tensor | None, head_first: bool,
         l2norm: bool, mode: str) -> tuple[Tensor, Tensor | None]:
    """``fn(q, k, v, **gates, scale=, initial_state=, mode=)`` (a seqmem op) per sequence of ``cu_seqlens`` (or on
    the whole batch), returned the fla way."""
    q, k, v = tensors.pop("q"), tensors.pop("k"), tensors.pop("v")
    _check(name, q, initial_state, cu_seqlens, head_first, {"k": k, "v": v, **tensors})
    if l2norm:
        q, k = _l2norm(q), _l2norm(k)
    if scale is None:
        scale = k.shape[-1] ** -0.5
    gates = {n: t for n, t in tensors.items() if t is not None}
    if cu_seqlens is None:
        spans, states = [(0, q.shape[1])], [initial_state]
    else:
        cu = cu_seqlens.tolist()
        spans = list(zip(cu, cu[1:]))
        states = [None if initial_state is None else initial_state[i : i + 1] for i in range(len(spans))]
    outs, finals = [], []
    for (a, b), s0 in zip(spans, states):
        if b == a:  # an empty sequence: no output, its state unchanged
            d_k, d_v = k.shape[-1], v.shape[-1]
            h = q.shape[2]
            cd = torch.float64 if q.dtype == torch.float64 else torch.float32
            finals.append(s0.to(cd) if s0 is not None else q.new_zeros((1, h, d_k, d_v), dtype=cd))
            continue
        sl = slice(a, b)
        o, st = fn(q[:, sl], k[:, sl], v[:, sl], **{n: t[:, sl] for n, t in gates.items()}, scale=scale,
                   initial_state=None if s0 is None else {"S": s0}, mode=mode)
        outs.append(o)
        finals.append(st["S"])
    o = torch.cat(outs, 1) if outs else v.new_zeros(v.shape)
    return o.to(q.dtype), (torch.cat(finals, 0) if output_final_state else None)


def chunk_gated_delta_rule(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float | None = None,
    initial_state: Tensor | None = None, output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Tensor | None = None, head_first: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``chunk_gated_delta_rule(q, k, v, g, beta, ...)``: ``S_t = e^{g_t} (I - b_t k_t k_tᵀ) S_{t-1} +
    b_t k_t v_tᵀ``, ``o_t = S_tᵀ (scale q_t)`` (Gated DeltaNet, eq. 10), by seqmem's exact chunked form.
    Returns ``(o, final_state)``; see the module docstring for the conventions."""
    return _run("chunk_gated_delta_rule", _gated_delta_rule, {"q": q, "k": k, "v": v, "beta": beta, "g": g}, scale,
                initial_state, output_final_state, cu_seqlens, head_first, use_qk_l2norm_in_kernel, "chunk")


def fused_recurrent_gated_delta_rule(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, *, beta: Tensor | None = None, scale: float | None = None,
    initial_state: Tensor | None = None, output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Tensor | None = None, head_first: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``fused_recurrent_gated_delta_rule``: as :func:`chunk_gated_delta_rule` by the recurrent reference.
    ``beta`` is keyword-only (newer fla releases put ``gk, gv`` between ``g`` and ``beta``); ``None`` means
    ones, as in fla."""
    if beta is None:
        beta = torch.ones(q.shape[:3], dtype=q.dtype, device=q.device)
    return _run("fused_recurrent_gated_delta_rule", _gated_delta_rule,
                {"q": q, "k": k, "v": v, "beta": beta, "g": g}, scale, initial_state, output_final_state,
                cu_seqlens, head_first, use_qk_l2norm_in_kernel, "recurrent")


def chunk_delta_rule(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, *, scale: float | None = None,
    initial_state: Tensor | None = None, output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Tensor | None = None, head_first: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``chunk_delta_rule(q, k, v, beta, ...)``: ``S_t = (I - b_t k_t k_tᵀ) S_{t-1} + b_t k_t v_tᵀ``,
    ``o_t = S_tᵀ (scale q_t)`` (DeltaNet), by seqmem's exact chunked (UT/WY) form."""
    return _run("chunk_delta_rule", _delta_rule, {"q": q, "k": k, "v": v, "beta": beta}, scale, initial_state,
                output_final_state, cu_seqlens, head_first, use_qk_l2norm_in_kernel, "chunk")


def fused_recurrent_delta_rule(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor | None = None, *, scale: float | None = None,
    initial_state: Tensor | None = None, output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: Tensor | None = None, head_first: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """fla's ``fused_recurrent_delta_rule``: as :func:`chunk_delta_rule` by the recurrent reference; ``beta``
    ``None`` means ones, as in fla."""
    if beta is None:
        beta = torch.ones(q.shape[:3], dtype=q.dtype, device=q.device)
    return _run("fused_recurrent_delta_rule", _delta_rule, {"q": q, "k": k, "v": v, "beta": beta}, scale,
                initial_state, output_final_state, cu_seqlens, head_first, use_qk_l2norm_in_kernel, "recurrent")


def _linear_attn(name: str, mode: str, q: Tensor, k: Tensor, v: Tensor, scale: float | None,
                 initial_state: Tensor | tuple[Tensor, Tensor] | None, output_final_state: bool, normalize: bool,
                 cu_seqlens: Tensor | None, head_first: bool) -> tuple[Tensor, object]:
    """fla's linear attention: ``S_t = S_{t-1} + k_t v_tᵀ``, ``o_t = S_tᵀ (scale q_t)``, with ``normalize=True``
    (fla's default) divided by ``scale q_t · z_t + 1e-10``, ``z_t = z_0 + Σ_{i≤t} k_i``; then the initial and final
    states are ``(S, z)`` pairs, ``z`` (N, 1, heads, d_k)."""
    z0 = None
    if isinstance(initial_state, tuple):
        if not normalize:
            raise ValueError(f"{name}: initial_state is an (S, z) pair, the state of normalize=True; with "
                             "normalize=False pass S alone")
        if len(initial_state) != 2:
            raise ValueError(f"{name}: initial_state must be S or an (S, z) pair, got a tuple of {len(initial_state)}")
        initial_state, z0 = initial_state
        n = _check(name, q, None, cu_seqlens, head_first, {"k": k, "v": v})
        want = (n, 1, k.shape[2], k.shape[3])
        if z0 is not None and (not isinstance(z0, Tensor) or not z0.is_floating_point() or tuple(z0.shape) != want):
            got = (f"{tuple(z0.shape)} {z0.dtype}" if isinstance(z0, Tensor) else type(z0).__name__)
            raise ValueError(f"{name}: the normaliser state z must be a floating (N, 1, heads, d_k) = {want} tensor "
                             f"for {n} sequence(s), got {got}")
    o, S = _run(name, _linear_attention, {"q": q, "k": k, "v": v}, scale, initial_state,
                output_final_state or normalize, cu_seqlens, head_first, False, mode)
    if not normalize:
        return o, (S if output_final_state else None)
    sc = k.shape[-1] ** -0.5 if scale is None else scale
    cd = torch.float64 if q.dtype == torch.float64 else torch.float32
    spans = [(0, q.shape[1])] if cu_seqlens is None else list(zip(cu_seqlens.tolist(), cu_seqlens.tolist()[1:]))
    outs, zs = [], []
    for i, (a, b) in enumerate(spans):
        kk = k[:, a:b].to(cd)
        zc = kk.cumsum(1)
        base = None if z0 is None else (z0[i : i + 1] if cu_seqlens is not None else z0).to(cd)  # (n, 1, H, K)
        if base is not None:
            zc = zc + base
        den = (q[:, a:b].to(cd) * sc * zc).sum(-1, keepdim=True) + 1e-10
        outs.append(o[:, a:b].to(cd) / den)
        last = zc[:, -1:] if b > a else (base if base is not None else kk.new_zeros((q.shape[0], 1) + k.shape[2:]))
        zs.append(last)
    o = torch.cat(outs, 1).to(q.dtype)
    return o, ((S if output_final_state else None), torch.cat(zs, 0))


def chunk_linear_attn(
    q: Tensor, k: Tensor, v: Tensor, *, scale: float | None = None,
    initial_state: Tensor | tuple[Tensor, Tensor] | None = None, output_final_state: bool = False,
    normalize: bool = True, cu_seqlens: Tensor | None = None, head_first: bool = False,
) -> tuple[Tensor, object]:
    """fla's ``chunk_linear_attn`` (``normalize=True`` by default, as in fla): seqmem's
    :func:`~seqmem.ops.linear_attention` in its chunked form, then fla's normaliser (see :func:`_linear_attn`)."""
    return _linear_attn("chunk_linear_attn", "chunk", q, k, v, scale, initial_state, output_final_state, normalize,
                        cu_seqlens, head_first)


def fused_recurrent_linear_attn(
    q: Tensor, k: Tensor, v: Tensor, *, scale: float | None = None,
    initial_state: Tensor | tuple[Tensor, Tensor] | None = None, output_final_state: bool = False,
    reverse: bool = False, normalize: bool = False, cu_seqlens: Tensor | None = None, head_first: bool = False,
) -> tuple[Tensor, object]:
    """fla's ``fused_recurrent_linear_attn``: as :func:`chunk_linear_attn` by the recurrent reference, with fla's
    default ``normalize=False`` for this one; ``reverse=True`` (an anti-causal scan) is not supported."""
    if reverse:
        raise ValueError("fused_recurrent_linear_attn: reverse=True is not supported (seqmem's ops are causal)")
    return _linear_attn("fused_recurrent_linear_attn", "recurrent", q, k, v, scale, initial_state,
                        output_final_state, normalize, cu_seqlens, head_first)
