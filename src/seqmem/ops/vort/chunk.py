"""VORT retrieval ops, the fast forms (VORT paper, arXiv:2605.08966, eqs. 13–17, 24): decayed keyed linear attention
over SOE channels.  The per-token reference is ``naive.py``.

``soe_retention`` — the merged form of eqs. (14)–(16) (docs/vort.md): S' decay channels with rates ξ_s shared by
all tokens and a per-token input weight c_s(α_t),

    G_t^(s) = e^{-ξ_s} G_{t-1}^(s) + c_s(α_t) φ(k_t) v_t^T,    b_t^(s) = e^{-ξ_s} b_{t-1}^(s) + c_s(α_t) φ(k_t)
    o_t = (φ(q_t)·Σ_s G_t^(s) + c_now(α_t)(φ(q_t)·φ(k_t)) v_t) / (φ(q_t)·Σ_s b_t^(s) + c_now(…) + ε0)

(the c_now term is the λ = 0 tail lump, acting at lag 0 only).  Modes: ``"recurrent"`` (the per-token loop of
the paper, ``naive.py``), ``"chunk"`` (RetNet/GLA-style chunked form) and ``"parallel"`` (one chunk = quadratic form).
On CUDA, ``"chunk"`` without ``strict_causal`` runs a chunked simple-GLA Triton kernel with the channels as heads
(``gla.py``; the same math): flash-linear-attention's where it is installed and enabled, else seqmem's own
(``chunk_simple_gla.py``).
Normalisers: ``"kernel"`` (eq. 16, default; kernel-weighted denominator) and ``"plain"`` (eq. 13: undecayed
denominator Σ_i φ(q_t)·φ(k_i); one extra accumulator z).  ``strict_causal=True`` reads out before writing token
t (eq. 13's i < t).  Keys may be passed in scaled form, φ(k_t) = k_t e^{β_t} (``k_log_scale``): the state is then
kept relative to the running maximum of β (state key ``"m"``) and ε0 regularises the stabilised denominator
(FAVOR+'s max-subtraction), which keeps FAVOR+ features of large inputs representable.

``local_window_attention`` — causal sliding-window softmax attention (eq. 17's Attn_local) that also returns the
normalised entropy H(a_t)/log(#visible) of each row, averaged over heads (the routing feature of eq. 11), and,
with ``return_state=True``, the window cache ``{"k", "v"}`` that ``initial_state`` takes back.

``retrieval_loss`` / ``refine_alpha`` — the plasticity objective L_ret of eq. (24) and test-time projected
gradient descent on per-token α (Section 5; our reading, see docs/vort.md).
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from seqmem.io import check_int
from seqmem.ops import _backends, _triton
from seqmem.ops._common import check_choice, check_number, check_same_device, check_tensor, floor, promoted_dtype
from seqmem.ops.fractional import gl_weights, soe_coefficients
from seqmem.ops.local_attention.chunk import join_past, window_cache, window_state, windowed_softmax
from seqmem.ops.vort.gla import soe_retention_gla
from seqmem.ops.vort.naive import soe_retention_naive

__all__ = [
    "soe_retention", "kv_retention", "local_window_attention", "retrieval_loss", "refine_alpha", "soe_kernel_matrix"
]

MODES = ("recurrent", "chunk", "parallel")
#: the chunked form builds its lag-weight matrix D by a bmm over columns when batch × heads × channels reaches this,
#: by a broadcast product below it (the faster of the two on each side; both exact)
D_BMM_MIN = 256
NORMALIZERS = ("kernel", "plain")
#: the lag-kernel form (shared channel weights, no state wanted) takes this many queries per block
LAG_BLOCK = 128
#: ... and runs where T·(F + Dv) ≤ LAG_FORM_RATIO·S'·F·Dv: its work per query grows with the length T, the chunked
#: form's with the S'·F·Dv state it reads and writes.  Measured (forward + backward, batch 16, 4 heads, F 64, Dv 32,
#: FAVOR+ scaled keys, one thread, shared 2-core CPU): T 500: S' 16 lag 222 ms vs chunked 494-670, S' 5 223 vs
#: 242, S' 1 250 vs 115; T 1,000: S' 16 738 vs 1,115, S' 5 857 vs 624, S' 1 878 vs 292
LAG_FORM_RATIO = 3.0


def soe_retention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    coef: Tensor,
    xi: Tensor,
    coef_now: Tensor | None = None,
    *,
    eps0: float = 1e-6,
    normalizer: str = "kernel",
    strict_causal: bool = False,
    initial_state: dict[str, Tensor] | None = None,
    mode: str = "chunk",
    chunk_size: int = 64,
    k_log_scale: Tensor | None = None,
    output_final_state: bool = True,
) -> tuple[Tensor, dict[str, Tensor] | None]:
    """Decayed keyed linear attention over SOE channels (eqs. 14–16, merged form).

    Shapes: ``q``, ``k`` (batch, time, heads, F) already feature-mapped (φ(q), φ(k), non-negative);
    ``v`` (batch, time, heads, Dv); ``coef`` (batch, time, S') or (batch, time, heads, S') per-token channel
    weights c_s(α_t), or (S',) one set of weights for every token (a fixed order α, or the exponential
    baselines); ``xi`` (S',) non-negative decay rates (λ_s = e^{-ξ_s}); ``coef_now`` (batch, time[, heads]) the
    lag-0-only weight, a 0-d tensor with a shared ``coef``, or None.  ``k_log_scale`` (batch, time, heads),
    optional: the keys are φ(k_t) = k_t·e^{β_t}.  ``chunk_size``: tokens per chunk of the PyTorch chunked form
    (``mode="chunk"``); it changes only rounding, and the CUDA kernels and the lag-kernel form use their own
    blocking.  Returns ``(o (batch, time, heads, Dv), state)``;
    ``output_final_state=False`` returns ``(o, None)`` (training discards the state).

    Shared weights without a returned state or initial state (``mode="chunk"``, ``normalizer="kernel"``) may run the
    lag-kernel form: the kernel is then a function of the lag alone, ŵ(t−i) = Σ_s c_s e^{−ξ_s(t−i)} (+ c_now at lag
    0), and o_t = Σ_i (φ(q_t)·φ(k_i)) ŵ(t−i) v_i / (Σ_i (φ(q_t)·φ(k_i)) ŵ(t−i) + ε0) is computed in blocks of
    :data:`LAG_BLOCK` queries against every earlier key, with no S'-channel state: the same outputs (to float
    rounding) at a cost that does not grow with S' (:func:`lag_form_applies` says when it is the cheaper one).

    State (``initial_state`` and the returned one; None = zeros):

    * ``"G"``: the channel sums ``G_t^(s) = Σ_i e^{-ξ_s(t-i)} c_s(α_i) φ(k_i) v_iᵀ`` (batch, heads, S', F, Dv);
    * ``"b"``: the channel sums ``b_t^(s) = Σ_i e^{-ξ_s(t-i)} c_s(α_i) φ(k_i)`` (batch, heads, S', F);
    * ``"z"``: the undecayed key sum ``Σ_i φ(k_i)`` (batch, heads, F); only for ``normalizer="plain"``;
    * ``"m"``: the running maximum of β (batch, heads); only with ``k_log_scale``.

    With ``k_log_scale``, G, b, z are in units of e^{m} (a state without ``m`` is read as m = 0), and the read-out
    is o_t = φ(q_t)·G̃_t / (φ(q_t)·b̃_t + ε0) with ε0 added in those units.  Each key's shape is checked against
    (batch, heads, ...) above, and a key this call would not read (``"m"`` without ``k_log_scale``, ``"z"`` with
    ``normalizer="kernel"``, an unknown one) is refused rather than dropped.  Tensors of mixed floating dtypes
    are computed in their promoted dtype.  T = 0 returns an empty ``o`` and the state unchanged (with
    ``k_log_scale`` and no state given, ``"m"`` is −inf: no key scale yet).
    """
    op = "soe_retention"
    check_choice(op, "mode", mode, MODES)
    check_choice(op, "normalizer", normalizer, NORMALIZERS)
    # ε0 = 0 makes the read-out scale-free (exact comparisons use it); a row that sees no key (strict_causal's
    # first token from an empty state) is then 0 / 0 — the VORT mixer refuses ε0 = 0 with strict_causal
    check_number(op, "eps0", eps0, nonnegative=True)
    check_tensor(op, "q", q, (None, None, None, None), "batch, time, heads, F")
    B, T, H, F = q.shape
    check_tensor(op, "k", k, (B, T, H, F), "batch, time, heads, F")
    check_tensor(op, "v", v, (B, T, H, None), "batch, time, heads, Dv")
    if not isinstance(output_final_state, bool):
        raise ValueError(f"{op}: output_final_state must be True or False, got {output_final_state!r}")
    if not isinstance(coef, Tensor) or not coef.is_floating_point() or coef.dim() not in (1, 3, 4):
        got = f"shape {tuple(coef.shape)}, dtype {coef.dtype}" if isinstance(coef, Tensor) else type(coef).__name__
        raise ValueError(f"{op}: coef must be a floating-point tensor of shape (batch, time[, heads], S') or (S',), "
                         f"got {got}")
    S = coef.shape[-1]
    if coef.dim() > 1 and coef.shape[:coef.dim() - 1] != (B, T, H)[:coef.dim() - 1]:
        raise ValueError(f"{op}: coef must be (batch, time[, heads], S') = ({B}, {T}[, {H}], S'), got "
                         f"{tuple(coef.shape)}")
    check_tensor(op, "xi", xi, (S,), "S'")
    if coef_now is not None:
        if coef.dim() == 1:
            if not isinstance(coef_now, Tensor) or coef_now.dim() != 0:
                got = tuple(coef_now.shape) if isinstance(coef_now, Tensor) else type(coef_now).__name__
                raise ValueError(f"{op}: with one set of weights coef (S',), coef_now must be a 0-d tensor or None, "
                                 f"got shape {got}")
            check_tensor(op, "coef_now", coef_now, (), "a 0-d tensor")
        elif not isinstance(coef_now, Tensor) or coef_now.dim() not in (2, 3):
            got = tuple(coef_now.shape) if isinstance(coef_now, Tensor) else type(coef_now).__name__
            raise ValueError(f"{op}: coef_now must be (batch, time[, heads]) = ({B}, {T}[, {H}]), got {got}")
        else:
            check_tensor(op, "coef_now", coef_now, (B, T, H)[:coef_now.dim()], "batch, time[, heads]")
    if k_log_scale is not None:
        check_tensor(op, "k_log_scale", k_log_scale, (B, T, H), "batch, time, heads")
    check_int("chunk_size", chunk_size, prefix=f"{op}: ")
    _check_soe_state(initial_state, B, H, S, F, v.shape[-1], normalizer, k_log_scale is not None)
    state_in = {f"initial_state[{key!r}]": t for key, t in (initial_state or {}).items()}
    check_same_device(op, q=q, k=k, v=v, coef=coef, xi=xi, coef_now=coef_now, k_log_scale=k_log_scale, **state_in)
    # mixed floating dtypes: computed in their promoted dtype (no copies when they agree)
    dt = promoted_dtype(q, k, v, coef, xi, coef_now, k_log_scale, *(initial_state or {}).values())
    q, k, v, coef, xi = (x.to(dt) for x in (q, k, v, coef, xi))
    coef_now = None if coef_now is None else coef_now.to(dt)
    k_log_scale = None if k_log_scale is None else k_log_scale.to(dt)
    if initial_state is not None:
        initial_state = {key: t.to(dt) for key, t in initial_state.items()}
    scaled = k_log_scale is not None
    if T == 0:  # an empty piece: no output, the state unchanged (zeros when none is given)
        if initial_state is None:
            initial_state = {"G": q.new_zeros(B, H, S, F, v.shape[-1]), "b": q.new_zeros(B, H, S, F)}
            if normalizer == "plain":
                initial_state["z"] = q.new_zeros(B, H, F)
            if scaled:  # no key scale yet: the first key sets it (e^{-inf} units of an all-zero state)
                initial_state["m"] = q.new_full((B, H), float("-inf"))
        return v.new_zeros((B, 0, H, v.shape[-1])), (initial_state if output_final_state else None)
    shared = None  # (c (S',), c_now 0-d or None): one set of channel weights for every token
    if coef.dim() == 1:
        shared = (coef, coef_now)
        coef = coef.expand(B, T, H, coef.shape[0])
        coef_now = None if coef_now is None else coef_now.expand(B, T, H)
    if coef.dim() == 3:
        coef = coef[:, :, None, :].expand(B, T, H, coef.shape[-1])
    if coef_now is None:
        coef_now = q.new_zeros(B, T, H)
    elif coef_now.dim() == 2:
        coef_now = coef_now[:, :, None].expand(B, T, H)
    if (shared is not None and normalizer == "kernel" and mode == "chunk" and initial_state is None
            and not output_final_state and T > 1 and lag_form_applies(T, S, F, v.shape[-1])
            and _gla_form(q, k, v, coef, coef_now, None, k_log_scale) is None):
        _backends.note_form("soe_retention", "pytorch")
        return _lag_form(q, k, v, shared[0], xi, shared[1], eps0, strict_causal, k_log_scale), None
    if mode == "recurrent":
        return _final(output_final_state, *soe_retention_naive(
            q, k, v, coef, xi, coef_now, eps0=eps0, normalizer=normalizer, strict_causal=strict_causal,
            initial_state=initial_state, k_log_scale=k_log_scale,
        ))
    if T == 1 and mode != "recurrent":  # a decode step: one fused update of the state, no chunk machinery
        return _final(output_final_state, *_one_token(q, k, v, coef, xi, coef_now, eps0, normalizer, strict_causal,
                                                      initial_state, k_log_scale))
    form = None if mode != "chunk" or strict_causal else _gla_form(q, k, v, coef, coef_now, initial_state, k_log_scale)
    if form is not None:
        _backends.note_form("soe_retention", form)
        return _final(output_final_state, *soe_retention_gla(
            q, k, v, coef, xi, coef_now, eps0=eps0, normalizer=normalizer, initial_state=initial_state,
            k_log_scale=k_log_scale, gla=None if form == "fla" else _seqmem_gla()))
    _backends.note_form("soe_retention", "pytorch")
    G = b = z = m = None  # the chunked form skips the zero state's terms (None = zero)
    if initial_state is not None:
        G, b = initial_state["G"], initial_state["b"]
        z = initial_state.get("z") if normalizer == "plain" else None
        if scaled:
            m = initial_state.get("m")
            m = q.new_zeros(B, H) if m is None else m
    elif normalizer == "plain":
        z = q.new_zeros(B, H, F)
    beta = k_log_scale.transpose(1, 2).contiguous() if scaled else None
    # (batch, heads, time, ·)
    qh, kh, vh = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    if shared is not None:  # one set of weights: the chunks' lag-weight matrix and writes use it as it is
        ch, cn = shared
    else:
        ch, cn = coef.permute(0, 2, 1, 3), coef_now.transpose(1, 2)
    n = T if mode == "parallel" else chunk_size
    o, G, b, z, m = _chunked(qh, kh, vh, ch, cn, xi, G, b, z, m, beta, eps0, strict_causal, n)
    state = {"G": G, "b": b}
    if z is not None:
        state["z"] = z
    if scaled:
        state["m"] = m
    return o.transpose(1, 2), (state if output_final_state else None)


_SOE_DIMS = {"G": "batch, heads, S', F, Dv", "b": "batch, heads, S', F", "z": "batch, heads, F", "m": "batch, heads"}


def _check_soe_state(state, B: int, H: int, S: int, F: int, Dv: int, normalizer: str, scaled: bool) -> None:
    """Raise unless ``state`` is None or a dict with the keys this call reads — ``"G"``, ``"b"``, ``"z"`` with
    ``normalizer="plain"``, optionally ``"m"`` with ``k_log_scale`` — and no other, each a floating tensor of its
    (batch, heads, ...) shape.  A key this call would not read is refused rather than dropped: ``"m"`` without
    ``k_log_scale`` (G and b are then in units of e^m, read as units of 1), ``"z"`` with the kernel normaliser
    (a state of another configuration), or a misspelt one."""
    op = "soe_retention"
    if state is None:
        return
    if not isinstance(state, dict):
        raise ValueError(f"{op}: initial_state must be None or a dict of tensors, got {type(state).__name__}")
    need = ["G", "b"] + (["z"] if normalizer == "plain" else [])
    allowed = need + (["m"] if scaled else [])
    for key in need:
        if key not in state:
            why = " (normalizer='plain' reads its undecayed key sum)" if key == "z" else ""
            raise ValueError(f"{op}: initial_state has no {key!r}{why}; it needs the keys {need}"
                             f"{' (and optionally m)' if scaled else ''}, got {sorted(state)}")
    extra = sorted(set(state) - set(allowed))
    if extra:
        why = {"m": " ('m' is the key scale of a state built with k_log_scale; pass k_log_scale)",
               "z": " ('z' belongs to normalizer='plain')"}
        hint = "".join(why.get(key, "") for key in extra)
        raise ValueError(f"{op}: initial_state has keys {extra} this call does not read{hint}; expected "
                         f"{allowed}, got {sorted(state)}")
    want = {"G": (B, H, S, F, Dv), "b": (B, H, S, F), "z": (B, H, F), "m": (B, H)}
    for key in state:
        check_tensor(op, f"initial_state[{key!r}]", state[key], want[key], _SOE_DIMS[key])


def lag_form_applies(T: int, S: int, F: int, Dv: int) -> bool:
    """Whether the lag-kernel form (see :func:`soe_retention`) is the cheaper one for ``T`` tokens, ``S`` channels,
    ``F`` features and ``Dv`` value dims (:data:`LAG_FORM_RATIO`)."""
    return T * (F + Dv) <= LAG_FORM_RATIO * S * F * Dv


def _lag_form(q: Tensor, k: Tensor, v: Tensor, c: Tensor, xi: Tensor, c_now: Tensor | None, eps0: float,
              strict: bool, k_log_scale: Tensor | None) -> Tensor:
    """Eq. (16) with one kernel for every token, ŵ(l) = Σ_s c_s e^{−ξ_s l} (+ c_now at l = 0), from the lags alone.

    Blocks of :data:`LAG_BLOCK` queries: inside the block the chunked form's causal product (scaled keys read in
    each row's units e^{M_i}, M_i the running maximum of β), and against every earlier key one product
    (φ(q)·φ̃(k))·ŵ(t − i) @ [v e^{β − m}, e^{β − m}] with m the running maximum before the block, brought to the row's
    units by e^{m − M_i} ≤ 1: the units, and so the range, of the chunked form's state read.  The denominator is
    the last column of the same product.  Inputs (batch, time, heads, ·); returns o (batch, time, heads, Dv)."""
    B, T, H, F = q.shape
    Dv = v.shape[-1]
    qh, kh = q.transpose(1, 2), k.transpose(1, 2)
    v1 = torch.cat([v, v.new_ones(B, T, H, 1)], -1).transpose(1, 2)  # (b, h, T, Dv + 1): [v, 1]
    lags = torch.arange(T, device=q.device)
    w = (c[:, None] * torch.exp(-xi[:, None] * lags.to(q.dtype))).sum(0)  # (T,): ŵ(l) without the lag-0 lump
    if not strict and c_now is not None:
        w = torch.cat([w[:1] + c_now, w[1:]])
    w = torch.cat([w, w.new_zeros(1)])  # index T: an invisible pair
    scaled = k_log_scale is not None
    if scaled:
        beta = k_log_scale.transpose(1, 2)  # (b, h, T)
        incl = beta.cummax(-1).values  # max_{j ≤ i} β_j
        # row units M_i: the largest scale among the keys row i sees (strict: j < i; row 0 sees none and takes β_0)
        M_all = torch.cat([beta[..., :1], incl[..., :-1]], -1) if strict else incl
    outs = []
    for t0 in range(0, T, LAG_BLOCK):
        t1 = min(t0 + LAG_BLOCK, T)
        diff = lags[t0:t1, None] - lags[None, :t1]
        vis = diff > 0 if strict else diff >= 0
        D = w[torch.where(vis, diff, T)]  # (n, t1): ŵ(i − j) where visible, else 0
        qc = qh[:, :, t0:t1]
        QK = qc @ kh[:, :, t0:t1].transpose(-1, -2)  # the block against itself
        if scaled:
            M = M_all[..., t0:t1]
            rel = torch.where(vis[:, t0:], beta[..., None, t0:t1] - M[..., :, None], torch.full_like(QK, float("-inf")))
            QK = QK * torch.exp(rel)
        nd = (QK * D[:, t0:]) @ v1[:, :, t0:t1]
        if t0 > 0:  # every earlier key
            A = (qc @ kh[:, :, :t0].transpose(-1, -2)) * D[:, :t0]
            if scaled:
                m = incl[..., t0 - 1]  # (b, h): the running maximum before the block (≥ every earlier β, ≤ M_i)
                past = A @ (v1[:, :, :t0] * torch.exp(beta[..., :t0] - m[..., None])[..., None])
                nd = nd + past * torch.exp(m[..., None] - M)[..., None]
            else:
                nd = nd + A @ v1[:, :, :t0]
        outs.append(nd[..., :Dv] / (nd[..., Dv:] + eps0))
    return torch.cat(outs, 2).transpose(1, 2)


def _final(wanted: bool, o: Tensor, state: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor] | None]:
    return o, (state if wanted else None)


def _gla_form(q, k, v, coef, coef_now, initial_state, k_log_scale) -> str | None:
    """Which chunked simple-GLA kernel ``mode="chunk"`` runs with the channels as heads (``gla.py``), or None (the
    PyTorch forms).  Only CUDA tensors with Triton kernels on (:func:`seqmem.ops._triton.use_triton`) and no
    float64 take one: ``"fla"``, flash-linear-attention's ``chunk_simple_gla``, where the ``fla`` backend is enabled
    (:func:`seqmem.backends.use_backends` / ``SEQMEM_BACKENDS``) and installed, unless the call wants gradients on
    a machine whose fla gated backward raises (Hopper with 3.4 <= triton < 3.7.1:
    ``seqmem.ops._backends.fla_gated_refuses``); else ``"triton"``, seqmem's own
    (``chunk_simple_gla.py``)."""
    tensors = (q, k, v, coef, coef_now, k_log_scale, *(initial_state or {}).values())
    if not _triton.use_float_kernel(*tensors):
        return None
    if "fla" in _backends.enabled_backends() and _FLA_GLA.is_available() and not _backends.fla_gated_refuses(*tensors):
        return "fla"
    return "triton"


def _seqmem_gla():
    from seqmem.ops.vort.chunk_simple_gla import chunk_simple_gla

    return chunk_simple_gla


# fla's simple-GLA kernels as a backend: installed and importable, checked once (a broken install is unavailable)
_FLA_GLA = _backends.Backend("fla", "soe_retention", soe_retention_gla,
                             _backends._installed("fla", "fla.ops.simple_gla"), lambda *tensors: True)


def _one_token(q, k, v, coef, xi, coef_now, eps0, normalizer, strict, initial_state, k_log_scale):
    """Eqs. (14)–(16) for a single token with the state touched in as few passes as possible: the channel decay
    λ_s = e^{−ξ_s} and the rescale to the new key units e^{m_old − m_new} are one factor, the write is one
    multiply-add, and the read-out over the channels is one matmul of (λ_s)φ(q) against the flattened state."""
    B, _, H, F = q.shape
    qt, kt, vt, ct, cn = q[:, 0], k[:, 0], v[:, 0], coef[:, 0], coef_now[:, 0]  # (B, H, ·), ct (B, H, S)
    S, Dv = xi.shape[0], vt.shape[-1]
    st = initial_state or {}
    G, b = st.get("G"), st.get("b")
    z = None
    if normalizer == "plain":
        z = st["z"] if "z" in st else q.new_zeros(B, H, F)
    lam = torch.exp(-xi)  # (S,)
    f = lam.expand(B, H, S)  # factor applied to the state's channels: decay, times the rescale below
    r = None
    m_new = None
    if k_log_scale is not None:
        beta_t = k_log_scale[:, 0]
        m_old = st.get("m")
        if m_old is None:
            m_old = beta_t if initial_state is None else q.new_zeros(B, H)
        m_new = torch.maximum(m_old, beta_t)
        r = torch.exp(m_old - m_new)  # ≤ 1: the state (and its ε0) re-expressed in units of e^{m_new}
        f = f * r[..., None]
        kt = kt * torch.exp(beta_t - m_new)[..., None]
    if strict and G is not None:  # read out before writing token t, in the old units: Σ_s λ_s φ(q)·G_s
        qd = (lam[:, None] * qt[:, :, None, :]).flatten(-2)  # (B, H, S·F)
        num = (qd[:, :, None, :] @ G.flatten(2, 3))[:, :, 0]
        den = (qt * z).sum(-1) if z is not None else (qd * b.flatten(2)).sum(-1)
        outs = num / (den + eps0)[..., None]
    elif strict:  # nothing seen yet: the read-out of an empty state, 0 / (0 + ε0)
        outs = qt.new_zeros(B, H, Dv) / (qt.new_zeros(B, H) + eps0)[..., None]
    ck = ct[..., None] * kt[:, :, None, :]  # (B, H, S, F): c_s(α_t) φ(k_t)
    if G is None:
        G_new = ck[..., None] * vt[:, :, None, None, :]
        b_new = ck
    else:
        G_new = torch.addcmul(G * f[..., None, None], ck[..., None], vt[:, :, None, None, :])
        b_new = torch.addcmul(ck, b, f[..., None])
    z_new = None if z is None else (kt + (z if r is None else r[..., None] * z))
    if not strict:  # eq. (16): read out after writing token t, plus the lag-0 lump c_now φ(q)·φ(k) v
        qk = (qt * kt).sum(-1)
        qs = qt.repeat(1, 1, S)  # (B, H, S·F): φ(q) against every channel
        num = (qs[:, :, None, :] @ G_new.flatten(2, 3))[:, :, 0] + (cn * qk)[..., None] * vt
        den = (qt * z_new).sum(-1) if z_new is not None else (qs * b_new.flatten(2)).sum(-1) + cn * qk
        outs = num / (den + eps0)[..., None]
    state = {"G": G_new, "b": b_new}
    if z_new is not None:
        state["z"] = z_new
    if k_log_scale is not None:
        state["m"] = m_new
    return outs[:, None], state


def _running_offsets(beta: Tensor, m_prev: Tensor | None, strict: bool) -> tuple[Tensor, Tensor]:
    """Per-row key offsets M_i (b, h, n) and the chunk-end offset (b, h).

    M_i = max(m_prev, max_{j ≤ i} β_j) (``strict``: j < i, so a row is expressed in the units of the keys it
    sees; a row that sees nothing takes β_i): the units of row i's read-out and of its ε0, as in the recurrent
    form; every factor e^{β_j − M_i} of a visible key is ≤ 1."""
    incl = beta.cummax(-1).values
    if m_prev is not None:
        incl = torch.maximum(incl, m_prev[..., None])
    end = incl[..., -1]
    if not strict:
        return incl, end
    first = beta[..., :1] if m_prev is None else m_prev[..., None]
    return torch.cat([first, incl[..., :-1]], -1), end


def _chunked(q, k, v, c, cn, xi, G, b, z, m, beta, eps0, strict, n_chunk):
    """The chunked form on (batch, heads, time, ·) tensors.  ``c`` (b, h, T, S), ``cn`` (b, h, T): per-token
    weights; or ``c`` (S,), ``cn`` 0-d or None: one set of weights for every token, whose lag-weight matrix D then
    depends on the lag alone and is built once for all chunks, sequences and heads."""
    outs = []
    scaled = beta is not None
    B, H, T, F = q.shape
    S, Dv = xi.shape[0], v.shape[-1]
    shared = c.dim() == 1
    pieces = (q, k, v) + (() if shared else (c, cn)) + ((beta,) if scaled else ())
    split = [x.split(n_chunk, dim=2) for x in pieces]
    # split once: slicing inside the loop gives every chunk a backward that zero-fills a full-length gradient
    # buffer (O(T^2 / m) memory traffic; docs/BENCHMARKS.md)
    # the lag matrices depend on the chunk length only: built once (a shorter last chunk takes their top-left block)
    r_all = torch.arange(min(n_chunk, T), device=q.device, dtype=q.dtype)
    diff_all = r_all[:, None] - r_all[None, :]
    mask_all = diff_all > 0 if strict else diff_all >= 0
    E_all = torch.exp(-xi[:, None, None] * diff_all.clamp_min(0)) * mask_all  # (S, n, n): e^{-ξ_s (i - j)}, i ≥ j
    if shared:
        # D[i, j] = Σ_s c_s e^{-ξ_s (i - j)} (+ c_now at i = j): the per-token form's D of every chunk, sequence
        # and head (the same products, summed over s in the same order as its broadcast form)
        D_all = (c[:, None, None] * E_all).sum(0)  # (n, n)
        if not strict and cn is not None:
            D_all = D_all + torch.diag_embed(cn.expand(D_all.shape[0]))
    # The state is kept as (b, h, F, S·Dv) inside the loop: the read φ(q)·G_s of every channel is then one matmul
    # (b, h, n, F) @ (b, h, F, S·Dv) and the write one matmul φ(k)ᵀ @ (w ⊗ v), with no (n, S·F) expansion of q
    # or k (Dv < F for FAVOR+ features, so the S-fold tensors are the smaller ones).
    if G is not None:
        G = G.permute(0, 1, 3, 2, 4).reshape(B, H, F, S * Dv)
    for parts in zip(*split):
        qc, kc, vc = parts[:3]
        n = qc.shape[2]
        r, mask, E = r_all[:n], mask_all[:n, :n], E_all[:, :n, :n]
        if shared:
            cc, D = c, D_all[:n, :n]
        else:
            cc, cnc = parts[3:5]
            # D[i, j] = Σ_s c_s(α_j) e^{-ξ_s (i - j)}.  Many channels × sequences: for each column j a (b·h, S) @
            # (S, i) product, batched over j; few: a broadcast product and sum over (b, h, S, n, n), cheaper there
            # (einsum took a slow per-j path).  Measured (approximate, not recorded: 2-core CPU, one thread,
            # 2026-11-26), forward + backward: b·h·S = 1,024 → bmm 1.7 ms vs 7.0; 64 → 0.6 vs 0.3.
            if B * H * S >= D_BMM_MIN:
                D = torch.bmm(cc.permute(2, 0, 1, 3).reshape(n, B * H, S), E.permute(2, 0, 1))  # (j, b·h, i)
                D = D.view(n, B, H, n).permute(1, 2, 3, 0)  # (b, h, i, j)
            else:
                D = (cc.transpose(-1, -2)[..., None, :] * E).sum(-3)
            if not strict:
                D = D + torch.diag_embed(cnc)
        QK = qc @ kc.transpose(-1, -2)
        carry = None  # e^{m − M_i} ≤ 1: the state before the chunk (units e^{m}) as read by row i (units e^{M_i})
        if scaled:
            bc = parts[-1]
            M, M_end = _running_offsets(bc, m, strict)  # (b, h, n), (b, h)
            # key j seen from row i in units of e^{M_i}: e^{β_j − M_i} ≤ 1 where visible (masked before exp)
            rel = torch.where(mask, bc[..., None, :] - M[..., :, None], torch.full_like(QK, float("-inf")))
            QK = QK * torch.exp(rel)
            if m is not None:  # m exists exactly when the state G, b does
                carry = torch.exp(m[..., None] - M)[..., None]
        A = QK * D
        num = A @ vc
        den = A.sum(-1)
        if G is not None:  # contribution of the state before the chunk (None: zero)
            wq = torch.exp(-xi[None, :] * (r[:, None] + 1))  # (n, S): decay from the previous state to row r
            if carry is not None:
                wq = wq * carry  # (b, h, n, S)
            P = (qc @ G).unflatten(-1, (S, Dv))  # (b, h, n, S, Dv): φ(q_r)·G_s for every channel
            # Σ_s wq_s φ(q_r)·G_s: for S > 1 a product and a sum over s (as a (1, S) @ (S, Dv) matmul per row it was
            # b·h·n tiny matrix products, slower forward and backward); one channel keeps the matmul (nothing to sum)
            num = num + ((wq[..., None] * P).sum(-2) if S > 1 else (wq[..., None, :] @ P)[..., 0, :])
            if z is None:
                den = den + ((qc @ b.transpose(-1, -2)) * wq).sum(-1)
        if z is not None:
            zq = qc if carry is None else qc * carry
            den = (QK * mask).sum(-1) + (zq @ z[..., None])[..., 0]
        outs.append(num / (den + eps0)[..., None])
        # carry the state to the chunk end
        kw = kc
        if scaled:
            kw = kc * torch.exp(bc - M_end[..., None])[..., None]  # keys in units of e^{M_end}
            if m is not None:  # re-express the state (G, b, z) in units of e^{M_end}
                rs = torch.exp(m - M_end)  # ≤ 1
                G, b = rs[..., None, None] * G, rs[..., None, None] * b
                z = None if z is None else rs[..., None] * z
            m = M_end
        if z is not None:
            z = z + kw.sum(2)
        dk = torch.exp(-xi[None, :] * (n - 1 - r[:, None]))  # (n, S): decay from row j to the chunk end
        w = cc * dk  # (b, h, n, S); (n, S) with shared weights
        G_add = kw.transpose(-1, -2) @ (w[..., None] * vc[..., None, :]).flatten(-2)  # (b, h, F, S·Dv)
        b_add = w.transpose(-1, -2) @ kw  # (b, h, S, F)
        if G is None:
            G, b = G_add, b_add
        else:
            lam_n = torch.exp(-xi * n)  # (S,): the whole chunk's decay of each channel
            G = (G.unflatten(-1, (S, Dv)) * lam_n[:, None]).flatten(-2) + G_add
            b = lam_n[:, None] * b + b_add
    G = G.view(B, H, F, S, Dv).permute(0, 1, 3, 2, 4).contiguous()  # back to (b, h, S, F, Dv)
    return torch.cat(outs, 2), G, b, z, m


def kv_retention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    decay: Tensor,
    visible: Tensor,
    *,
    scores: str = "features",
    k_log_scale: Tensor | None = None,
    normalizer: str = "kernel",
    eps0: float = 1e-6,
) -> Tensor:
    """Keyed retention over a KV cache: eqs. (13)/(16) in parallel form, for kernels with no finite state (the exact
    GL weights, or exact softmax scores).

    ``q`` (batch, Tq, heads, ·), ``k`` (batch, Tk, heads, ·), ``v`` (batch, Tk, heads, Dv); ``decay``
    (batch, Tq, Tk) the kernel weights ŵ_{t−i} of each visible pair; ``visible`` (Tq, Tk) bool.
    ``scores="exact"``: s_ti = exp(q_t·k_i/√d) from raw ``q``, ``k``, stabilised by each row's maximum with ε0
    rescaled to match (exact).  ``scores="features"``: ``q``, ``k`` are φ(q), φ(k); with ``k_log_scale`` β the keys
    are φ(k_i)·e^{β_i}, and each row is read in units of its largest visible key scale with ε0 added there, as
    :func:`soe_retention` does.  Returns o (batch, Tq, heads, Dv)."""
    check_choice(None, "scores", scores, ("exact", "features"))
    check_choice(None, "normalizer", normalizer, NORMALIZERS)
    check_number("kv_retention", "eps0", eps0, nonnegative=True)
    if scores == "exact":
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
        s = s.masked_fill(~visible, float("-inf"))
        m = s.amax(-1, keepdim=True).detach()
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # a row that sees nothing
        P = torch.exp(s - m)
        eps = eps0 * torch.exp(-m[..., 0])
    else:
        P = torch.einsum("bqhf,bkhf->bhqk", q, k) * visible
        eps = eps0
        if k_log_scale is not None:
            rel = k_log_scale.transpose(1, 2)[:, :, None, :].expand_as(P).masked_fill(~visible, float("-inf"))
            top = rel.amax(-1, keepdim=True)
            top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))  # a row that sees nothing
            P = P * torch.exp(rel - top)
    A = P * decay[:, None]
    den = (P if normalizer == "plain" else A).sum(-1)  # eq. (13) undecayed vs eq. (16) decayed
    return torch.einsum("bhqk,bkhd->bqhd", A, v) / (den + eps).transpose(1, 2)[..., None]


def soe_kernel_matrix(
    t_pos: Tensor, i_pos: Tensor, coef: Tensor, xi: Tensor, coef_now: Tensor | None
) -> Tensor:
    """D[b, t, i] = Σ_s coef[b, i, s] e^{-ξ_s (t-i)} + coef_now[b, i]·1[t = i] for i ≤ t, else 0.

    ``t_pos`` (Tq,), ``i_pos`` (Tk,) absolute positions; ``coef`` (batch, Tk, S'); ``coef_now`` (batch, Tk).
    """
    lag = t_pos[:, None] - i_pos[None, :]
    vis = lag >= 0
    lagc = lag.clamp_min(0).to(coef.dtype)
    E = torch.exp(-xi[:, None, None] * lagc) * vis  # (S, Tq, Tk)
    D = torch.einsum("bks,sqk->bqk", coef, E)
    if coef_now is not None:
        D = D + coef_now[:, None, :] * (lag == 0)
    return D


def local_window_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    past_k: Tensor | None = None,
    past_v: Tensor | None = None,
    *,
    initial_state: dict[str, Tensor] | None = None,
    return_state: bool = False,
    mode: str = "chunk",
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor] | tuple[Tensor, Tensor, dict[str, Tensor]]:
    """Causal sliding-window softmax attention (eq. 17's Attn_local) and the routing entropy feature (eq. 11).

    ``q, k, v`` (batch, time, heads, D); ``initial_state`` the window cache before this segment, the state a
    previous call with ``return_state=True`` returned (None: the sequence starts here).  Query t sees the
    ``window`` most recent keys including itself.  Returns ``(out, ent)``: ``out`` (batch, time, heads, D);
    ``ent`` (batch, time) = mean over heads of H(a_t)/log(#visible keys) (0 when only one key is visible).
    With ``return_state=True`` it returns ``(out, ent, state)``, ``state`` the last ``min(P + T, window − 1)``
    keys and values (P the cached ones, T this segment's), as :func:`sliding_window_attention` returns it:

    * ``"k"``: (batch, min(P + T, window − 1), heads, D) the most recent keys;
    * ``"v"``: (batch, min(P + T, window − 1), heads, D) their values.

    The state is opt-in (``return_state``) rather than always returned so that the two-value return existing
    callers unpack, ``out, ent = ...``, keeps its meaning; the entropy is this op's second output, so the state
    comes third.  ``past_k, past_v`` (the former way to pass the cache) are read as
    ``initial_state={"k": past_k, "v": past_v}`` with a DeprecationWarning.  ``mode`` and the dtype rule are
    :func:`sliding_window_attention`'s (``"chunk"``, ``"parallel"`` or ``"recurrent"``; mixed floating dtypes in
    their promoted dtype); T = 0 returns empty outputs and the cache unchanged.
    """
    op = "local_window_attention"
    past_k, past_v = window_cache(op, initial_state, past_k, past_v)
    q, keys, vals, n_past = join_past(q, k, v, window, past_k, past_v, mode, chunk_size, op)
    if q.shape[1] == 0:  # an empty piece: no output, the cache unchanged
        out, ent = vals.new_zeros((*q.shape[:3], vals.shape[-1])), q.new_zeros(q.shape[:2])
    else:
        out, ent = windowed_softmax(q, keys, vals, window, n_past, mode=mode, chunk_size=chunk_size, entropy=True)
    if return_state:
        return out, ent, window_state(keys, vals, window)
    return out, ent


def retrieval_loss(
    q: Tensor,
    k: Tensor,
    alpha: Tensor,
    source: Tensor,
    *,
    n_terms: int = 15,
    horizon: int = 1024,
    eps: float = 1e-3,
    exact_kernel: bool = False,
    reduction: str = "mean",
) -> Tensor:
    """Plasticity objective L_ret = −Σ_t log p_{i*(t), t} (eq. 24).

    r_it = exp(q_t·k_i/√d) · ŵ_{t−i}^(α_i) for i < t (strict, as in Section 5), p_it = r_it / Σ_{i'<t} r_i't.
    ``q, k`` (batch, time, heads, d) (scores summed over heads, i.e. one logit per (t, i) from all heads);
    ``alpha`` (batch, time) per-token orders in (0, 1]; ``source`` (batch, time) long: the index i*(t) < t of
    the ground-truth source token, or −1 where t is not scored.  ŵ is the SOE kernel (differentiable in α) or,
    with ``exact_kernel=True``, the GL weights.  Gradients flow to ``q``, ``k`` and ``alpha``.
    """
    check_choice(None, "reduction", reduction, ("mean", "sum"))
    B, T, H, d = q.shape
    if alpha.shape != (B, T) or source.shape != (B, T):
        raise ValueError("alpha and source must be (batch, time)")
    valid = source >= 0
    if (source >= torch.arange(T, device=source.device)[None, :]).logical_and(valid).any():
        raise ValueError("source[t] must be < t (the source precedes the query)")
    logits = torch.einsum("bthd,bihd->bti", q, k) / math.sqrt(d)
    pos = torch.arange(T, device=q.device)
    lag = (pos[:, None] - pos[None, :]).clamp_min(0)
    if exact_kernel:
        W = gl_weights(alpha, torch.arange(T, device=q.device))  # (B, T_i, lag)
        w = torch.gather(W, 2, lag.t()[None].expand(B, T, T)).transpose(1, 2)  # (B, t, i)
    else:
        c, xi, c_now = soe_coefficients(alpha, n_terms, horizon, eps)
        w = soe_kernel_matrix(pos, pos, c, xi, c_now)
    strict = pos[None, :] < pos[:, None]
    logr = (logits + torch.log(w.clamp_min(floor(1e-300, w.dtype)))).masked_fill(~strict, float("-inf"))
    logp = logr - torch.logsumexp(logr, -1, keepdim=True).nan_to_num(neginf=0.0)
    src = source.clamp_min(0)
    picked = torch.gather(logp, 2, src[..., None])[..., 0]
    nll = -torch.where(valid, picked, torch.zeros_like(picked))
    return nll.sum() / valid.sum().clamp_min(1) if reduction == "mean" else nll.sum()


def refine_alpha(
    alpha: Tensor, loss_fn, *, min_alpha: float = 0.1, lr: float = 0.1, steps: int = 10
) -> tuple[Tensor, list[float]]:
    """Test-time plasticity (Section 5, our reading): projected GD α ← clip(α − η ∂F/∂α, δ, 1) for ``steps``.

    ``loss_fn(alpha) -> scalar`` (e.g. a closure over :func:`retrieval_loss`).  Returns the refined α
    (detached) and the loss history (``steps + 1`` values, the last one at the returned α).
    """
    if not (0 < min_alpha <= 1):  # NaN fails too
        raise ValueError(f"refine_alpha: min_alpha must be in (0, 1], got {min_alpha!r}")
    check_number("refine_alpha", "lr", lr, positive=True)
    if isinstance(steps, bool) or not isinstance(steps, numbers.Integral) or steps < 0:
        raise ValueError(f"refine_alpha: steps must be a non-negative integer, got {steps!r}")
    a = alpha.detach().clamp(min_alpha, 1.0).clone()
    hist = []
    for _ in range(steps):
        a.requires_grad_(True)
        f = loss_fn(a)
        (g,) = torch.autograd.grad(f, a)
        hist.append(float(f.detach()))
        a = (a.detach() - lr * g).clamp(min_alpha, 1.0)
    with torch.no_grad():
        hist.append(float(loss_fn(a)))
    return a, hist
