"""VLA — Variational Linear Attention (Pandey & Singh 2026, arXiv:2605.11196) as functional ops.

Per head (Algorithm 1, "VLAv3 Sequential Forward Pass"; eqs. 8-11 of the paper)::

    k_feat = φ(k_raw) = ELU(k_raw) + 1,  k̂ = k_feat / ‖k_feat‖
    u = L2norm(W_u k_raw) · u_scale                          (u_scale = 1/√d_h in Algorithm 1)
    z_sm = A u,  δ = max(1 + uᵀ z_sm, ε),  A ← A − z_sm z_smᵀ / δ   (Sherman–Morrison, eq. 9; A_0 = I/λ0)
    A ← A + η I   if the 1-based position t is a multiple of the refresh period (20; η = 1e-3)
    α̂ = A k̂ / ‖A k̂‖                                        (post-update A, eq. 10)
    S ← S + (v − S k̂) α̂ᵀ                                     (residual write, eq. 10)
    z ← z + k_feat;   o = S φ(q) / max(φ(q)ᵀ z, ε)           (readout, eq. 11)

``mode="recurrent"`` is that loop, written out step by step in ``naive.py`` (the reference).
On CUDA tensors ``mode="chunk"`` runs the fused recurrent Triton kernels instead (``fused_recurrent.py``; when
``triton`` is importable and not switched off by :func:`seqmem.ops._triton.set_triton` / ``SEQMEM_TRITON=0``).
``mode="chunk"`` is the exact chunked form in this file (not in the paper; derived in docs/vla.md):

* A-part: the A-loop depends only on the keys, so a run of c rank-1 Sherman–Morrison updates is one
  Cholesky step: ``G = I + U A₀ Uᵀ = L Lᵀ``, ``Z = L⁻¹ U A₀`` (row i = z_i/√δ_i),
  ``α_t = A₀k̂_t − Σ_{i≤t} (k̂_t·Z_i) Z_i``, ``A_next = A₀ − ZᵀZ``.  The +ηI refresh is not low rank, so
  runs are cut right after every refresh position (positions are counted from the sequence start via the
  state's ``pos``), which makes the form exact for ANY chunk size and any alignment of the refresh.
* S-part: ``S_t = S_{t-1}(I − k̂_t α̂_tᵀ) + v_t α̂_tᵀ`` is an identity-plus-rank-1 ("generalised delta
  rule") transition with a WY/UT chunk form: ``(I + strict_tril(K̂ Âᵀ)) W = V − K̂ S₀ᵀ``,
  ``O = Q S₀ᵀ + tril(Q Âᵀ) W``, ``S_next = S₀ + Wᵀ Â``.  The same kernel (with a per-token decay g_t)
  runs the paper's "DeltaNet" (eq. 4).

The paper's own parallel form (eq. 12 / Algorithm 2: a Blelloch scan of ``F_t = I − α̂_t k̂_tᵀ``,
``G_t = e_t α̂_tᵀ``) is wrong (G_t depends on S_{t-1}; F_t acts from the wrong side); see docs/vla.md.

Tensors are ``(batch, time, heads, dim)``; the state is a dict ``{"S": (B,H,Dv,D), "A": (B,H,D,D),
"z": (B,H,D), "pos": (B,) int64}`` ("A" absent with ``fixed_A``, "z" absent with ``normalizer="none"``).

Precision: both ops compute in float32 for float16 / bfloat16 inputs (float64 stays float64), with autocast
turned off inside — the Cholesky factor and triangular solves have no half-precision CPU kernels, and the
normaliser z = Σ φ(k) passes float16's maximum after ~10⁵ tokens.  The state is stored in that compute dtype
(float32 for half inputs); ``o`` is returned in ``v``'s dtype (the practice of flash-linear-attention).
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F
from torch import Tensor

from seqmem.ops import _backends, _triton
from seqmem.ops._common import (
    check_chunk_size,
    check_mode,
    check_number,
    check_same_device,
    check_state_dict,
    check_values,
    floor,
    values_checked,
)
from seqmem.ops._common import compute_dtype as _compute_dtype
from seqmem.ops._common import full_precision as _full_precision
from seqmem.ops.vla.naive import vla_attention_naive, vla_paper_delta_rule_naive

__all__ = [
    "vla_attention",
    "vla_paper_delta_rule",
    "vla_jacobian_norm_closed_form",
    "vla_generalized_delta_chunk",
]

NORMALIZERS = ("paper", "none")
_KERNEL_CHUNK = 64  # the Triton kernels' checkpoint interval (tokens)
_TINY = 1e-12


def _phi(x: Tensor) -> Tensor:
    """ELU+1 feature map (the paper's φ, §2.2)."""
    return F.elu(x) + 1.0


def _state_tensors(state) -> list[Tensor]:
    """The floating-point tensors of a state dict (none for anything else: the ops report a bad state)."""
    if not isinstance(state, dict):
        return []
    return [t for t in state.values() if isinstance(t, Tensor) and t.is_floating_point()]


def _state_to(state, dtype: torch.dtype):
    """``state`` with its floating-point tensors cast to ``dtype`` (anything else is passed through)."""
    if not isinstance(state, dict):
        return state
    return {n: t.to(dtype) if isinstance(t, Tensor) and t.is_floating_point() else t for n, t in state.items()}


def _in_compute_dtype(body, q: Tensor, k: Tensor, v: Tensor, w: Tensor, initial_state, **options):
    """``body(q, k, v, w, initial_state=..., **options)`` on the inputs and state cast to the compute dtype, with
    autocast off; returns ``(o in v's dtype, state)`` (``w``: the op's fourth tensor, ``w_u`` or ``beta``)."""
    cd = _compute_dtype(q, k, v, w, *_state_tensors(initial_state))
    with _full_precision(q.device):
        o, state = body(q.to(cd), k.to(cd), v.to(cd), w.to(cd), initial_state=_state_to(initial_state, cd), **options)
    return o.to(v.dtype), state


def _solve_error(G: Tensor) -> ValueError:
    """A clear error for a failed Cholesky solve: NaN/Inf reached it (from the input or state), or it lost
    positive definiteness."""
    if not bool(torch.isfinite(G).all()):
        return ValueError("vla: NaN/Inf reached the Sherman-Morrison solve (the input q/k/v or the state holds "
                          "NaN/Inf); clean the input, or turn on seqmem.mixers.base.set_check_finite(True) to find it")
    return ValueError("vla: the Sherman-Morrison system lost positive definiteness (inputs too large for this "
                      "dtype?); compute in float64 or lower the input scale")


def _unit(x: Tensor) -> Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(floor(_TINY, x.dtype))


def _features(q: Tensor, k: Tensor, v: Tensor, normalize_key: bool = True) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(φ(k), k̂, φ(q), v)`` of both chunked ops, each (B, H, T, ·): k̂ is φ(k) made unit (with ``normalize_key``,
    else φ(k) itself)."""
    kf = _phi(k).transpose(1, 2)
    return kf, (_unit(kf) if normalize_key else kf), _phi(q).transpose(1, 2), v.transpose(1, 2)


def _normaliser(qf: Tensor, kf: Tensor, z: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """The readout's denominators ``max(φ(q_t)ᵀ z_t, ε)`` (B, H, T) with ``z_t = z + Σ_{s≤t} φ(k_s)``, and the last
    ``z_t`` (the state's new ``z``)."""
    zc = z[:, :, None] + torch.cumsum(kf, dim=2)
    return torch.clamp((qf * zc).sum(-1), min=eps), zc[:, :, -1]


def _read_out(pieces: list[Tensor], den: Tensor | None) -> Tensor:
    """The chunks' outputs (B, H, c, Dv) joined on time, divided by the denominators ``den`` (None: no
    normaliser), as (B, T, H, Dv)."""
    o = torch.cat(pieces, 2)
    if den is not None:
        o = o / den[..., None]
    return o.transpose(1, 2)


def vla_jacobian_norm_closed_form(c: Tensor | float) -> Tensor:
    """‖I − a bᵀ‖₂ for unit vectors a, b with c = aᵀb (erratum to Prop. 2: it is 1 only when c = 1).

    The singular values of I − a bᵀ are 1 (d−2 times) and the roots of σ⁴ − (3 − 2c)σ² + (1 − c)² = 0.
    """
    c = torch.as_tensor(c, dtype=torch.float64)
    return torch.sqrt((3 - 2 * c + torch.sqrt(5 - 4 * c)) / 2)


# ----------------------------------------------------------------------------------------------------
# the generalised delta rule chunk kernel:  S_t = S_{t-1}(g_t I − a_t b_tᵀ) + v_t b_tᵀ,  o_t = S_t q_t
# ----------------------------------------------------------------------------------------------------
def vla_generalized_delta_chunk(
    q: Tensor, a: Tensor, b: Tensor, v: Tensor, S0: Tensor, log_g: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """One chunk of ``S_t = S_{t-1}(g_t I − a_t b_tᵀ) + v_t b_tᵀ`` and ``o_t = S_t q_t`` (UT/WY form).

    q, a, b: (..., c, Dk); v: (..., c, Dv); S0: (..., Dv, Dk); log_g: (..., c) or None (g = 1).
    Returns (o (..., c, Dv), S_c).  With Γ_t = Π_{s≤t} g_s and w_t = v_t − S_{t-1} a_t (effective residual):
    ``(I + L) W = V − diag(Γ_{t-1}) A S₀ᵀ`` with ``L[t,i] = Γ_{t-1}/Γ_i · a_tᵀ b_i`` (i < t),
    ``o_t = Γ_t S₀ q_t + Σ_{i≤t} Γ_t/Γ_i (b_iᵀ q_t) w_i``, ``S_c = Γ_c S₀ + Σ_i Γ_c/Γ_i w_i b_iᵀ``.
    """
    c = q.shape[-2]
    dev = q.device
    incl = torch.ones(c, c, dtype=torch.bool, device=dev).tril()
    strict = incl.tril(-1)
    eye = torch.eye(c, dtype=q.dtype, device=dev)
    S0t = S0.transpose(-1, -2)
    ab = a @ b.transpose(-1, -2)  # [t, i] = a_t · b_i
    qb = q @ b.transpose(-1, -2)  # [t, i] = q_t · b_i
    if log_g is None:
        lower = ab.masked_fill(~strict, 0)
        rhs = v - a @ S0t
        W = torch.linalg.solve_triangular(eye + lower, rhs, upper=False, unitriangular=True)
        o = q @ S0t + qb.masked_fill(~incl, 0) @ W
        S_next = S0 + W.transpose(-1, -2) @ b
        return o, S_next
    lg = torch.cumsum(log_g, dim=-1)  # log Γ_t
    lg_prev = lg - log_g  # log Γ_{t-1}
    diff_prev = (lg_prev[..., :, None] - lg[..., None, :]).masked_fill(~strict, float("-inf"))
    diff_incl = (lg[..., :, None] - lg[..., None, :]).masked_fill(~incl, float("-inf"))
    lower = ab * diff_prev.exp()
    rhs = v - lg_prev.exp()[..., None] * (a @ S0t)
    W = torch.linalg.solve_triangular(eye + lower, rhs, upper=False, unitriangular=True)
    o = lg.exp()[..., None] * (q @ S0t) + (qb * diff_incl.exp()) @ W
    last = lg[..., -1:]  # log Γ_c
    decay_to_end = (last - lg).exp()  # Γ_c / Γ_i
    S_next = last.exp()[..., None] * S0 + (W * decay_to_end[..., None]).transpose(-1, -2) @ b
    return o, S_next


# ----------------------------------------------------------------------------------------------------
# VLA
# ----------------------------------------------------------------------------------------------------
def _check_inputs(
    q: Tensor, k: Tensor, v: Tensor, mode: str, chunk_size: int, normalizer: str, eps: float, fn: str
) -> tuple[int, int, int, int]:
    """The checks both VLA ops share (q / k / v, mode, chunk_size, normalizer, eps); returns ``k``'s shape."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, Tensor) or x.dim() != 4:
            raise ValueError(f"{fn}: {name} must be a (batch, time, heads, dim) tensor")
        if not x.is_floating_point():
            raise ValueError(f"{fn}: {name} must be floating point, got {x.dtype}")
    if q.shape != k.shape:
        raise ValueError(f"{fn}: q {tuple(q.shape)} and k {tuple(k.shape)} must have the same shape")
    if v.shape[:3] != k.shape[:3]:
        raise ValueError(f"{fn}: v {tuple(v.shape)} must match k {tuple(k.shape)} in (batch, time, heads)")
    check_mode(fn, mode)
    check_chunk_size(fn, chunk_size)
    if normalizer not in NORMALIZERS:
        raise ValueError(f"{fn}: normalizer must be one of {list(NORMALIZERS)}, got {normalizer!r}")
    check_number(fn, "eps", eps, positive=True)
    return k.shape


_STATE_DIMS = {"S": "batch, heads, d_v, d", "A": "batch, heads, d, d", "z": "batch, heads, d", "pos": "batch"}


def _check_state(
    initial_state, B: int, H: int, D: int, Dv: int, fixed_A: bool, use_z: bool,
) -> None:
    """Raise unless ``initial_state`` is None or a dict with exactly the keys and shapes this call needs."""
    want = {"S": (B, H, Dv, D), "pos": (B,)}
    if not fixed_A:
        want["A"] = (B, H, D, D)
    if use_z:
        want["z"] = (B, H, D)
    check_state_dict("vla_attention", initial_state, want, _STATE_DIMS)


def _vla_init_state(
    initial_state: dict[str, Tensor] | None, B: int, H: int, D: int, Dv: int, lam0: float, fixed_A: bool,
    use_z: bool, like: Tensor,
) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor]:
    _check_state(initial_state, B, H, D, Dv, fixed_A, use_z)
    if initial_state is None:
        S = like.new_zeros(B, H, Dv, D)
        eye = torch.eye(D, dtype=like.dtype, device=like.device)
        A = None if fixed_A else (eye / lam0).expand(B, H, D, D)
        z = like.new_zeros(B, H, D) if use_z else None
        pos = torch.zeros(B, dtype=torch.long, device=like.device)
        return S, A, z, pos
    A = None if fixed_A else initial_state["A"]
    z = initial_state["z"] if use_z else None
    return initial_state["S"], A, z, initial_state["pos"].to(torch.long)


def _check_vla_args(
    q: Tensor, k: Tensor, v: Tensor, w_u, *, lam0, u_scale, refresh_period, refresh_eta, eps, normalizer, mode,
    chunk_size, return_trace, fixed_A, initial_state,
) -> None:
    fn = "vla_attention"
    B, T, H, D = _check_inputs(q, k, v, mode, chunk_size, normalizer, eps, fn)
    if w_u is None and fixed_A:  # the fixed-A ablation has no penalty direction to map
        pass
    elif not isinstance(w_u, Tensor) or w_u.shape != (H, D, D):
        raise ValueError(f"{fn}: w_u must have shape (heads, dim, dim) = {(H, D, D)}"
                         + ("" if fixed_A else " (None only with fixed_A=True)"))
    check_number(fn, "lam0", lam0, positive=True)
    if u_scale is not None:  # None = 1/√D (Algorithm 1)
        check_number(fn, "u_scale", u_scale, positive=True)
    check_number(fn, "refresh_eta", refresh_eta, nonnegative=True)  # η < 0 could leave A indefinite
    if refresh_period is not None and (isinstance(refresh_period, bool)
                                       or not isinstance(refresh_period, numbers.Integral) or refresh_period < 0):
        raise ValueError(f"{fn}: refresh_period must be None or an integer >= 0, got {refresh_period!r}")
    if return_trace and mode != "recurrent":
        raise ValueError(f"{fn}: return_trace needs mode='recurrent'")
    _check_state(initial_state, B, H, D, v.shape[-1], fixed_A, normalizer == "paper")
    check_same_device(fn, q=q, k=k, v=v, w_u=w_u, **_state_by_name(initial_state))


def _state_by_name(state) -> dict[str, Tensor]:
    """The tensors of a (checked) state dict by the names an error gives them."""
    return {f"initial_state[{key!r}]": t for key, t in (state or {}).items()}


def _empty(v: Tensor, state: dict[str, Tensor], cd: torch.dtype) -> tuple[Tensor, dict[str, Tensor]]:
    """T = 0: an empty output and ``state`` unchanged (its floating tensors in the compute dtype ``cd``)."""
    B, _, H, Dv = v.shape
    return v.new_zeros((B, 0, H, Dv)), {key: (t.to(cd) if t.is_floating_point() else t) for key, t in state.items()}


def vla_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    w_u: Tensor,
    *,
    lam0: float = 0.1,
    u_scale: float | None = None,
    refresh_period: int | None = 20,
    refresh_eta: float = 1e-3,
    eps: float = 1e-4,
    normalizer: str = "paper",
    normalize_key: bool = True,
    normalize_alpha: bool = True,
    fixed_A: bool = False,
    initial_state: dict[str, Tensor] | None = None,
    mode: str = "chunk",
    chunk_size: int = 20,
    return_trace: bool = False,
):
    """Variational linear attention (Algorithm 1 / eqs. 8-11), recurrent or exact chunked.

    q, k: raw (pre-feature-map) queries and keys (B, T, H, D); v: values (B, T, H, Dv); w_u: (H, D, D),
    the learned penalty-direction map applied to the raw key (u = L2norm(W_u k_raw)·u_scale; u_scale None →
    1/√D as in Algorithm 1, 1.0 → eq. 8); None with ``fixed_A`` (which never reads u).  ``refresh_period``
    None/0 disables the +ηI refresh.
    Variants: ``normalize_alpha=False`` (VLAv2-style unnormalised write α = A k̂), ``fixed_A=True`` (the
    "A_t = 10 I fixed" ablation: no SM update, no A state), ``normalize_key=False`` (the "no k̂ norm"
    ablation, read as k̂ ← φ(k): the feature ELU(k) + 1 unnormalised, not the raw key),
    ``normalizer="none"`` (o = S φ(q)).
    Returns ``(o (B,T,H,Dv), state)``; with ``return_trace`` (recurrent mode only) also a dict of per-step
    tensors (S, A, alpha_hat, k_hat, e, delta, each (B, T, H, ...)).

    State (``initial_state`` and the returned one; None = ``S = 0``, ``A = I/lam0``, ``z = 0``, ``pos = 0``):

    * ``"S"``: the memory ``S_t`` (B, H, Dv, D), read as ``S_t φ(q_t)``;
    * ``"A"``: the inverse penalty ``A_t ≈ M_t⁻¹`` (eq. 8's ``M_t``; exactly ``M_t⁻¹`` with ``refresh_period=None``)
      kept by Sherman-Morrison (B, H, D, D); absent with ``fixed_A``;
    * ``"z"``: the normaliser ``Σ φ(k_s)`` (B, H, D); absent with ``normalizer="none"``;
    * ``"pos"``: tokens seen so far (B,) int64 (it times the ``refresh_period`` refresh).
    float16 / bfloat16 inputs are computed in float32 with autocast off (the state is float32; ``o`` is in
    ``v``'s dtype); float32 and float64 are computed as given.
    """
    _check_vla_args(q, k, v, w_u, lam0=lam0, u_scale=u_scale, refresh_period=refresh_period,
                    refresh_eta=refresh_eta, eps=eps, normalizer=normalizer, mode=mode, chunk_size=chunk_size,
                    return_trace=return_trace, fixed_A=fixed_A, initial_state=initial_state)
    if w_u is None:  # fixed_A: no Sherman-Morrison step reads u; zeros stand in for the map
        w_u = q.new_zeros((k.shape[2], k.shape[3], k.shape[3]))
    if q.shape[1] == 0 and return_trace:
        raise ValueError("vla_attention: return_trace needs at least one token (the trace is per step)")
    if q.shape[1] == 0:  # an empty piece: no output, the state unchanged
        cd = _compute_dtype(q, k, v, w_u, *_state_tensors(initial_state))
        B, _, H, D = k.shape
        if initial_state is None:
            S, A, z, pos = _vla_init_state(None, B, H, D, v.shape[-1], lam0, fixed_A, normalizer == "paper",
                                           k.new_zeros((), dtype=cd))
            initial_state = {"S": S, "pos": pos, **({} if A is None else {"A": A.clone()}),
                             **({} if z is None else {"z": z})}
        return _empty(v, initial_state, cd)
    if mode == "recurrent":
        return vla_attention_naive(
            q, k, v, w_u, lam0=lam0, u_scale=u_scale, refresh_period=refresh_period, refresh_eta=refresh_eta,
            eps=eps, normalizer=normalizer, normalize_key=normalize_key, normalize_alpha=normalize_alpha,
            fixed_A=fixed_A, initial_state=initial_state, return_trace=return_trace,
        )
    return _in_compute_dtype(
        _triton_form("vla", q, k, v, w_u, initial_state) or _vla_attention, q, k, v, w_u, initial_state,
        lam0=lam0, u_scale=u_scale, refresh_period=refresh_period, refresh_eta=refresh_eta, eps=eps,
        normalizer=normalizer, normalize_key=normalize_key, normalize_alpha=normalize_alpha, fixed_A=fixed_A,
        chunk_size=chunk_size,
    )  # fmt: skip


def _triton_form(op: str, q: Tensor, k: Tensor, v: Tensor, w: Tensor, initial_state):
    """The fused recurrent Triton body of ``op`` (``"vla"`` or ``"paper_delta_rule"``) when it applies — CUDA
    tensors, triton importable and not switched off (:func:`seqmem.ops._triton.use_triton`), float32 compute,
    head dims <= 128 — else None (the chunked PyTorch body runs)."""
    floats = [q, k, v, w, *_state_tensors(initial_state)]
    name = "vla_attention" if op == "vla" else "vla_paper_delta_rule"
    if not (_triton.use_triton(*floats) and _compute_dtype(*floats) == torch.float32
            and max(k.shape[-1], v.shape[-1]) <= 128):
        _backends.note_form(name, "pytorch")
        return None
    _backends.note_form(name, "triton")
    from seqmem.ops.vla import fused_recurrent as fr

    def body(q, k, v, w, *, chunk_size, **options):  # the kernels' checkpoint interval, not the chunk length
        fn = fr.fused_recurrent_vla if op == "vla" else fr.fused_recurrent_vla_paper_delta_rule
        return fn(q, k, v, w, chunk_size=_KERNEL_CHUNK, **options)

    return body


def _vla_attention(
    q: Tensor, k: Tensor, v: Tensor, w_u: Tensor, *, lam0: float, u_scale: float | None, refresh_period: int | None,
    refresh_eta: float, eps: float, normalizer: str, normalize_key: bool, normalize_alpha: bool, fixed_A: bool,
    initial_state: dict[str, Tensor] | None, chunk_size: int,
):
    """The chunked body of :func:`vla_attention` (inputs checked and already in the compute dtype; the public
    function's arguments, no defaults of its own)."""
    B, T, H, D = k.shape
    Dv = v.shape[-1]
    period = refresh_period or 0
    u_scale = 1.0 / math.sqrt(D) if u_scale is None else float(u_scale)
    use_z = normalizer == "paper"
    S, A, z, pos = _vla_init_state(initial_state, B, H, D, Dv, lam0, fixed_A, use_z, k)

    kf, kh, qf, vv = _features(q, k, v, normalize_key)
    u = F.normalize(torch.einsum("hed,bthd->bhte", w_u, k), dim=-1, eps=_TINY) * u_scale
    # 1-based global positions and refresh masks (B, T)
    gpos = pos[:, None] + torch.arange(1, T + 1, device=k.device)[None, :]
    refresh = (gpos % period == 0) if (period and not fixed_A) else torch.zeros_like(gpos, dtype=torch.bool)
    eye = torch.eye(D, dtype=k.dtype, device=k.device)

    den, z = _normaliser(qf, kf, z, eps) if use_z else (None, None)
    any_refresh = refresh.any(0).tolist()
    pieces = []
    # split once (slices of the full-length tensors inside the loop would give each chunk a backward that
    # zero-fills a full-length gradient: O(T^2 / chunk) memory traffic); the Sherman–Morrison runs below
    # slice within one chunk
    splits = zip(*(x.split(chunk_size, dim=2) for x in (kh, qf, vv, u)))
    for s, (K, qc, vc, uc) in zip(range(0, T, chunk_size), splits):
        e_ = s + K.shape[2]
        if fixed_A:
            alpha = K / lam0
        else:
            alphas = []
            a0 = s
            for j in range(s, e_):
                if j == e_ - 1 or any_refresh[j]:  # cut the Sherman–Morrison run after each refresh
                    Uc, Kc = uc[:, :, a0 - s : j + 1 - s], K[:, :, a0 - s : j + 1 - s]
                    c = j + 1 - a0
                    UA = Uc @ A  # A symmetric
                    G = torch.eye(c, dtype=k.dtype, device=k.device) + UA @ Uc.transpose(-1, -2)
                    L, info = torch.linalg.cholesky_ex(G)
                    if bool((info > 0).any()):
                        raise _solve_error(G)
                    Z = torch.linalg.solve_triangular(L, UA, upper=False)  # rows z_i / sqrt(δ_i)
                    kz = (Kc @ Z.transpose(-1, -2)).tril()
                    al = Kc @ A - kz @ Z
                    A = A - Z.transpose(-1, -2) @ Z
                    if any_refresh[j]:
                        m = (refresh_eta * refresh[:, j].to(k.dtype))[:, None, None]
                        al = torch.cat([al[:, :, :-1], al[:, :, -1:] + m[..., None] * Kc[:, :, -1:]], 2)
                        A = A + m[..., None] * eye
                    alphas.append(al)
                    a0 = j + 1
            alpha = torch.cat(alphas, 2)
        ah = _unit(alpha) if normalize_alpha else alpha
        oc, S = vla_generalized_delta_chunk(qc, K, ah, vc, S)
        pieces.append(oc)
    o = _read_out(pieces, den)
    state = {"S": S, "pos": pos + T}
    if not fixed_A:
        state["A"] = A.contiguous()
    if use_z:
        state["z"] = z
    return o, state


# ----------------------------------------------------------------------------------------------------
# the paper's "DeltaNet" (eq. 4):  S_t = β_t S_{t-1} + (v_t − S_{t-1} k̂_t) k̂_tᵀ
# ----------------------------------------------------------------------------------------------------
def vla_paper_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    *,
    eps: float = 1e-4,
    normalizer: str = "paper",
    initial_state: dict[str, Tensor] | None = None,
    mode: str = "chunk",
    chunk_size: int = 32,
):
    """The VLA paper's DeltaNet baseline, eq. (4): ``S_t = β_t S_{t-1} + (v_t − S_{t-1} k̂_t) k̂_tᵀ``.

    β_t ∈ [0, 1] (B, T, H), floating point, is a per-step *decay* of the old state (as the paper defines it;
    canonical DeltaNet uses β as a write strength instead; the paper's range is (0, 1)): β = 1 keeps the state,
    β = 0 (a sigmoid saturated at 0) forgets it.  A β outside [0, 1] is refused (a NaN propagates): the chunked
    form reads β through log max(β, tiny), the recurrent one as given, so the two disagreed on a negative β, and
    β > 1 grows the state without bound.  At β = 0 exactly the chunked form's gradient with respect to β is 0 (the
    clamp; a saturated sigmoid's derivative is 0 there too).  Keys k̂ = L2norm(ELU(k)+1) (with unnormalised keys
    eq. 4 diverges), readout as VLA: ``S_t φ(q_t) / max(φ(q_t)ᵀ Σ φ(k_s), ε)``.
    State (``initial_state`` and the returned one; None = zeros):

    * ``"S"``: the memory ``S_t`` (B, H, Dv, D);
    * ``"z"``: the normaliser ``Σ φ(k_s)`` (B, H, D); absent with ``normalizer="none"``.

    float16 / bfloat16 inputs are computed (and the state kept) in float32 with autocast off, ``o`` is in ``v``'s
    dtype.
    """
    fn = "vla_paper_delta_rule"
    B, T, H, D = _check_inputs(q, k, v, mode, chunk_size, normalizer, eps, fn)
    if not isinstance(beta, Tensor) or beta.shape != (B, T, H):
        got = tuple(beta.shape) if isinstance(beta, Tensor) else type(beta).__name__
        raise ValueError(f"{fn}: beta must have shape (batch, time, heads) = {(B, T, H)}, got {got}")
    if not beta.is_floating_point():
        raise ValueError(f"{fn}: beta must be a floating-point tensor, got dtype {beta.dtype}")
    want = {"S": (B, H, v.shape[-1], D)}
    if normalizer == "paper":
        want["z"] = (B, H, D)
    check_state_dict(fn, initial_state, want, _STATE_DIMS)
    check_same_device(fn, q=q, k=k, v=v, beta=beta, **_state_by_name(initial_state))
    if values_checked():
        # a decay: below 0 the chunked form (log β, clamped at the dtype's tiny) and the recurrent one (β as given)
        # silently disagree, and β > 1 grows the state without bound; β = 0, a saturated sigmoid, is exact in both
        check_values(fn, "beta", beta, ~((beta < 0) | (beta > 1)), "in [0, 1] (eq. 4: a per-step decay)")
    if T == 0:  # an empty piece: no output, the state unchanged (zeros when none is given)
        cd = _compute_dtype(q, k, v, beta, *_state_tensors(initial_state))
        if initial_state is None:
            initial_state = {key: k.new_zeros(shape, dtype=cd) for key, shape in want.items()}
        return _empty(v, initial_state, cd)
    if mode == "recurrent":
        return vla_paper_delta_rule_naive(q, k, v, beta, eps=eps, normalizer=normalizer, initial_state=initial_state)
    body = _triton_form("paper_delta_rule", q, k, v, beta, initial_state) or _vla_paper_delta_rule
    return _in_compute_dtype(body, q, k, v, beta, initial_state, eps=eps, normalizer=normalizer, chunk_size=chunk_size)


def _vla_paper_delta_rule(
    q: Tensor, k: Tensor, v: Tensor, beta: Tensor, *, eps: float, normalizer: str,
    initial_state: dict[str, Tensor] | None, chunk_size: int,
):
    """The chunked body of :func:`vla_paper_delta_rule` (inputs checked and already in the compute dtype; the
    public function's arguments, no defaults of its own)."""
    B, T, H, D = k.shape
    Dv = v.shape[-1]
    use_z = normalizer == "paper"
    if initial_state is None:
        S = k.new_zeros(B, H, Dv, D)
        z = k.new_zeros(B, H, D) if use_z else None
    else:
        S, z = initial_state["S"], initial_state.get("z")
    kf, kh, qf, vv = _features(q, k, v)
    bt = beta.transpose(1, 2)  # (B, H, T)
    log_g = torch.log(bt.clamp_min(torch.finfo(bt.dtype).tiny))
    den, z = _normaliser(qf, kf, z, eps) if use_z else (None, None)
    pieces = []
    for K, qc, vc, gc in zip(*(x.split(chunk_size, dim=2) for x in (kh, qf, vv, log_g))):  # split once (above)
        oc, S = vla_generalized_delta_chunk(qc, K, K, vc, S, gc)
        pieces.append(oc)
    o = _read_out(pieces, den)
    state = {"S": S}
    if use_z:
        state["z"] = z
    return o, state
