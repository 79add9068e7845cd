"""Lattice, the exact scan: :func:`lattice_scan` (``mode="recurrent"`` runs the reference in ``naive.py``;
``mode="scan"`` the fast form here).

The fast form is the same recurrence, exactly, with a hand-derived backward that recomputes the states chunk by
chunk: the fused C++ kernel (``_kernel.cpp`` via ``_cpp.py``) or the PyTorch version below (``_FastScan``);
combinations neither covers run :func:`seqmem.ops.lattice.step.lattice_step` under ``torch.utils.checkpoint``
per chunk.  See :mod:`seqmem.ops.lattice` for the model and the layout.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from seqmem.ops import _backends
from seqmem.ops._common import (
    backward_without_autocast,
    check_number,
    check_state_keys,
    compute_dtype,
    first_order_backward,
    full_precision,
    state_dict,
)
from seqmem.ops.lattice import _cpp as _lattice_cpp
from seqmem.ops.lattice.naive import lattice_naive
from seqmem.ops.lattice.step import _OSR, _check, _prepare, lattice_step, sphere_retract

#: the eps the fused forms compute with (compiled into the C++ and Triton kernels; the PyTorch hand-VJP scan's)
FUSED_EPS = 1e-12

__all__ = ["lattice_scan"]


# ------------------------------------------------------------------------------------------------------------
# the scan
# ------------------------------------------------------------------------------------------------------------
def lattice_scan(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    gamma: Tensor | float,
    initial_state: dict[str, Tensor] | None = None,
    *,
    objective: str = "dec",
    normalize: bool = True,
    forget: Tensor | None = None,
    l1: Tensor | float | None = None,
    mode: str = "scan",
    chunk_size: int = 64,
    eps: float = 1e-12,
    backend: str = "auto",
) -> tuple[Tensor, dict[str, Tensor]]:
    """The Lattice / OSR recurrence over a sequence.  Returns ``(y (B,T,H,d), state)``.

    State (``initial_state`` and the returned one):

    * ``"S"``: the memory slots ``S_t`` (B, H, d, m), column ``i`` is slot ``s_i``.

    ``initial_state=None`` starts from the identity slots ``I_{d×m}`` (orthonormal); mixers pass their own
    random orthonormal ``S_0``; a bare ``S_0`` tensor (the former form) still works, with a DeprecationWarning.
    With ``normalize`` (eq. 14) the initial slots are projected onto the sphere.
    ``mode="recurrent"``: per-token loop under autograd (the reference, ``naive.py``).  ``mode="scan"``: the
    same model with a hand-derived backward that recomputes the states per chunk of ``chunk_size`` tokens.
    On CUDA tensors, dec/enc/sim with the sphere projection and no L1 run the fused recurrent Triton kernel
    (``fused_recurrent.py``) when ``triton`` is importable and not switched off
    (:func:`seqmem.ops.set_triton` or ``SEQMEM_TRITON=0``).
    The C++ kernel covers dec/enc/sim with or without the sphere projection, and delta and ttt without it, each
    with or without ``forget``; the PyTorch version covers dec/enc/sim with the projection and delta.  Other
    combinations (L1 always) run :func:`lattice_step` under ``torch.utils.checkpoint`` per chunk: exact and
    memory-frugal, not faster.  ``backend``: ``"cpp"`` = the fused C++ kernel (CPU, float32/64),
    ``"torch"`` = the PyTorch hand-VJP scan, ``"triton"`` = the Triton kernel (CUDA, or CPU under
    ``TRITON_INTERPRET=1``), ``"auto"`` = triton on CUDA, else cpp where available, else torch.
    ``eps`` (the floor of a slot norm; a slot below it is empty and takes no step): the fused forms compute with
    the default 1e-12 (:data:`FUSED_EPS`), so another ``eps`` runs the checkpointed PyTorch form (``"auto"`` and
    ``"torch"``; ``"cpp"`` and ``"triton"`` refuse it).
    Precision: float16 / bfloat16 inputs, and any inputs under ``torch.autocast``, are computed in float32 with
    autocast off, forward and backward (float64 stays float64): the returned state is float32 and ``y`` is in
    the dtype of k and v promoted (``torch.promote_types(k.dtype, v.dtype)``: bfloat16 ``v`` with float32 ``k``
    gives a float32 ``y``).  T = 0 returns an empty ``y`` and the state unchanged.
    :func:`seqmem.backends.record_forms` reports which form ran (``"triton"``, ``"cpp"``, ``"pytorch"``,
    ``"pytorch-checkpointed"``).
    """
    state = state_dict("lattice_scan", initial_state)
    check_state_keys("lattice_scan", state, ("S",))
    S_in = None if state is None else state["S"]
    B, T, H, m, d = _check(q, k, v, gamma, S_in, objective, normalize, forget, l1, mode, chunk_size)
    eps = check_number("lattice_scan", "eps", eps, positive=True)
    if backend not in ("auto", "cpp", "torch", "triton"):
        raise ValueError(f"backend must be 'auto', 'cpp', 'torch' or 'triton', got {backend!r}")
    if eps != FUSED_EPS and backend in ("cpp", "triton") and mode != "recurrent":
        raise ValueError(f"backend={backend!r} computes with eps = {FUSED_EPS:g} (compiled in); eps = {eps:g} runs "
                         "with backend='torch' or 'auto' (the checkpointed PyTorch form)")
    # half inputs or autocast: float32 with autocast off (a backward outside the autocast region then recomputes
    # the states in the forward's dtype; the sphere projection and the recurrence keep float32's precision)
    out_dtype = torch.promote_types(k.dtype, v.dtype)
    cd = compute_dtype(q, k, v, S_in, *(x for x in (gamma, forget, l1) if isinstance(x, Tensor)))

    def c(x):
        return x.to(cd) if isinstance(x, Tensor) else x

    if cd == torch.float32 and mode != "recurrent" and backend in ("auto", "triton") and eps == FUSED_EPS:
        # the Triton kernel reads half inputs and accumulates in float32 itself: no float32 copies of q, k, v
        with full_precision(q.device):
            out = _triton_scan(q, k, v, gamma, S_in, objective, normalize, forget, l1, chunk_size, backend)
        if out is not None:
            _backends.note_form("lattice_scan", "triton")
            return out[0].to(out_dtype), {"S": out[1]}
    if T == 0:  # an empty piece: no output, the state unchanged (the identity slots when none is given)
        S = c(S_in) if S_in is not None else torch.eye(d, m, dtype=cd, device=k.device).expand(B, H, d, m).clone()
        return v.new_zeros((B, 0, H, d), dtype=out_dtype), {"S": S}
    with full_precision(q.device):
        y, S = _scan(c(q), c(k), c(v), c(gamma), c(S_in), objective, normalize, c(forget), c(l1), mode, chunk_size,
                     eps, backend)  # fmt: skip
    return y.to(out_dtype), {"S": S}


def _scan(q, k, v, gamma, S_in, objective, normalize, forget, l1, mode, chunk_size, eps, backend):
    """:func:`lattice_scan` on checked inputs of one compute dtype; returns ``(y, S_T)``."""
    B, T, H, m = k.shape
    d = v.shape[-1]
    if mode == "recurrent":
        return lattice_naive(q, k, v, gamma, S_in, objective=objective, normalize=normalize, forget=forget, l1=l1,
                             eps=eps)  # fmt: skip
    fused = eps == FUSED_EPS  # the fused forms (Triton, C++, the PyTorch hand-VJP scan) compute with 1e-12
    if fused and backend in ("auto", "triton"):
        out = _triton_scan(q, k, v, gamma, S_in, objective, normalize, forget, l1, chunk_size, backend)
        if out is not None:
            _backends.note_form("lattice_scan", "triton")
            return out
    if fused and backend in ("auto", "cpp"):
        out = _cpp_scan(q, k, v, gamma, S_in, objective, normalize, forget, l1, chunk_size, backend)
        if out is not None:
            _backends.note_form("lattice_scan", "cpp")
            return out
    qt, kt, vt, gt, S0, mu, lam = _prepare(q, k, v, gamma, S_in, normalize, forget, l1, objective, eps)
    fast = fused and lam is None and ((objective in _OSR and normalize) or (objective == "delta" and not normalize))
    _backends.note_form("lattice_scan", "pytorch" if fast else "pytorch-checkpointed")
    if fast:
        mu4 = None if mu is None else mu[:, :, None, None]
        y, S = _FastScan.apply(
            S0, *(x.unsqueeze(-1) for x in (qt, kt, vt, gt)), mu4, objective, chunk_size
        )  # fmt: skip
        y = y.squeeze(-1)
    else:
        y, S = _checkpointed_scan(qt, kt, vt, gt, S0, mu, lam, objective, normalize, chunk_size, eps)
    return y.reshape(T, B, H, d).transpose(0, 1), S.reshape(B, H, d, m)


def _triton_scan(q, k, v, gamma, initial_state, objective, normalize, forget, l1, chunk_size, backend):
    """The fused recurrent Triton kernel when it applies (else None; ``backend="triton"`` then raises).

    ``auto`` takes it for CUDA tensors only (:func:`seqmem.ops._triton.use_triton`), so CPU runs are unchanged."""
    from seqmem.ops._triton import use_triton

    tensors = (q, k, v, gamma if isinstance(gamma, Tensor) else None, forget, initial_state)
    fits = (
        objective in _OSR and normalize and l1 is None
        and all(x.dtype in (torch.float32, torch.float16, torch.bfloat16) for x in tensors if x is not None)
        and max(k.shape[-1], v.shape[-1]) <= 128
    )  # fmt: skip
    if backend == "auto" and not (fits and use_triton(*tensors)):
        return None
    if not fits:
        raise ValueError("backend='triton' covers dec/enc/sim with normalize=True, no l1, float32/16/bfloat16 "
                         "inputs and d, m <= 128")
    from seqmem.ops.lattice.fused_recurrent import fused_recurrent_lattice

    y, S = fused_recurrent_lattice(q, k, v, gamma, initial_state, objective=objective, forget=forget,
                                   chunk_size=chunk_size)  # fmt: skip
    return y, S  # S float32 (the compute dtype: float64 never takes the kernel)


def _cpp_scan(q, k, v, gamma, initial_state, objective, normalize, forget, l1, chunk_size, backend):
    """The fused C++ scan when it applies (else None; ``backend="cpp"`` then raises)."""
    B, T, H, m = k.shape
    d = v.shape[-1]
    dt = k.dtype
    ok = (
        l1 is None
        and (objective in _OSR or (objective in ("delta", "ttt") and not normalize))
        and k.device.type == "cpu"
        and dt in (torch.float32, torch.float64)
        and all(x.dtype == dt for x in (q, v))
        and (not isinstance(gamma, Tensor) or gamma.dtype == dt)
        and (forget is None or forget.dtype == dt)
        and (initial_state is None or initial_state.dtype == dt)
        and _lattice_cpp.available()
    )
    if not ok:
        if backend == "cpp":
            raise ValueError("backend='cpp' is not available for these inputs/options (or no C++ compiler)")
        return None
    N = B * H

    def nt(x):  # (B, T, H, ...) -> (N, T, ...), one copy
        return x.transpose(1, 2).reshape(N, T, -1)

    if not isinstance(gamma, Tensor):
        gamma = torch.full((B, T, H), float(gamma), dtype=dt)
    if gamma.dim() == 3:
        gamma = gamma.unsqueeze(-1).expand(B, T, H, m)
    S0 = torch.eye(d, m, dtype=dt).expand(N, d, m) if initial_state is None else initial_state.reshape(N, d, m)
    if objective in _OSR and normalize:
        S0 = sphere_retract(S0)
    mu = None if forget is None else forget.transpose(1, 2).reshape(N, T)
    code = objective if (normalize or objective not in _OSR) else f"{objective}_plain"
    y, S = _lattice_cpp.CppScan.apply(
        S0.contiguous(), nt(q), nt(k), nt(v), nt(gamma), mu, code, chunk_size
    )  # fmt: skip
    return y.reshape(B, H, T, d).transpose(1, 2), S.reshape(B, H, d, m)


def _checkpointed_scan(qt, kt, vt, gt, S0, mu, lam, objective, normalize, chunk_size, eps):
    """Exact scan of :func:`lattice_step`, checkpointed per chunk (stores only the chunk-boundary states)."""
    T = kt.shape[0]

    def run(S, q, k, v, g, mu_c, lam_c):
        ys = []
        for t in range(k.shape[0]):
            S = lattice_step(
                S, k[t], v[t], g[t], objective=objective, normalize=normalize,
                forget=None if mu_c is None else mu_c[t], l1=None if lam_c is None else lam_c[t], eps=eps,
            )  # fmt: skip
            ys.append((S @ q[t].unsqueeze(-1)).squeeze(-1))
        return torch.stack(ys, 0), S

    grad = torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in (qt, kt, vt, gt, S0, mu, lam)
    )
    S, ys = S0, []
    for c0 in range(0, T, chunk_size):
        sl = slice(c0, min(c0 + chunk_size, T))
        mu_c = None if mu is None else mu[sl]
        lam_c = None if lam is None else lam[sl]
        args = (S, qt[sl], kt[sl], vt[sl], gt[sl], mu_c, lam_c)
        y, S = checkpoint(run, *args, use_reentrant=False) if grad else run(*args)
        ys.append(y)
    return torch.cat(ys, 0), S


# ------------------------------------------------------------------------------------------------------------
# the PyTorch fast path: forward without a graph, backward by hand, states recomputed per chunk
# (the C++ kernel implements exactly these two functions, one head at a time)
# ------------------------------------------------------------------------------------------------------------
def _fwd_chunk(S, k, v, g, mu, objective, keep):
    """Run one chunk.  k, g: (C, N, m, 1); v: (C, N, d, 1); mu: (C, N, 1, 1) | None.

    Returns the chunk's states (list of (N, d, m)) and, if ``keep``, what the backward needs per step.
    """
    C = k.shape[0]
    states, saved = [], []
    if objective == "delta":
        w_all = g * k
        negv = -v
        for t in range(C):
            e = torch.baddbmm(negv[t], S, k[t])  # S k − v
            Sm = S if mu is None else S * mu[t]
            S = torch.baddbmm(Sm, e, w_all[t].transpose(1, 2), alpha=-1)  # μ S − e (γk)ᵀ
            states.append(S)
            if keep:
                saved.append((e,))
        return states, saved
    if objective == "dec":
        w_all = g * k
        negv = -v
    elif objective == "sim":
        w_all = g * k
        h_all = -v
    else:
        h_all = v
    for t in range(C):
        h = torch.baddbmm(negv[t], S, k[t]) if objective == "dec" else h_all[t]  # dec: e = S k − v
        p = torch.bmm(S.transpose(1, 2), h)  # (N, m, 1): ⟨s_i, h⟩
        w = g[t] * (p - k[t]) if objective == "enc" else w_all[t]  # enc: γ e, e = Sᵀv − k
        a = p * w
        b = a + 1 if mu is None else a + mu[t]  # (N, m, 1)
        bT = b.transpose(1, 2)
        U = torch.baddbmm(S * bT, h, w.transpose(1, 2), alpha=-1)  # col i: (μ + p_i w_i) s_i − w_i h
        rho = torch.linalg.vector_norm(U, dim=1, keepdim=True)  # (N, 1, m)
        S = U / rho  # eq. 14
        states.append(S)
        if keep:
            saved.append((h, p, w, bT, rho))
    return states, saved


def _bwd_chunk(S_start, states, saved, G, gy, q, k, v, g, mu, objective):
    """Reverse pass over one chunk.  G: ∂L/∂S at the chunk end (N, d, m); gy: (C, N, d, 1).

    Returns ∂L/∂S at the chunk start and the gradients of q, k, v, g (C, N, ·, 1) and mu (C, N, 1, 1) | None.
    """
    C = k.shape[0]
    St = torch.stack(states, 0)  # (C, N, d, m)
    gq = torch.matmul(St.transpose(-1, -2), gy)  # y_t = S_t q_t
    qT = q.transpose(-1, -2)
    g_h_list, g_w_list, g_k_list, g_a_list = [None] * C, [None] * C, [None] * C, [None] * C
    for t in range(C - 1, -1, -1):
        S_in = states[t - 1] if t > 0 else S_start
        G = torch.baddbmm(G, gy[t], qT[t])  # + ∂y_t/∂S_t
        if objective == "delta":
            (e,) = saved[t]
            w = g[t] * k[t]
            gS = G if mu is None else G * mu[t]
            if mu is not None:
                g_a_list[t] = (G * S_in).sum((1, 2), keepdim=True)
            g_e = -torch.bmm(G, w)  # (N, d, 1)
            g_w = -torch.bmm(G.transpose(1, 2), e)  # (N, m, 1)
            G = torch.baddbmm(gS, g_e, k[t].transpose(1, 2))
            g_k_list[t] = torch.bmm(S_in.transpose(1, 2), g_e)
            g_h_list[t], g_w_list[t] = g_e, g_w
            continue
        h, p, w, bT, rho = saved[t]
        S_out = states[t]
        # S_out = U / ρ  →  ∂U = (G − S_out ⟨G, S_out⟩_col) / ρ
        gU = torch.addcmul(G, S_out, (G * S_out).sum(1, keepdim=True), value=-1) / rho
        gS = gU * bT  # through (μ + a_i) s_i
        g_a = (gU * S_in).sum(1, keepdim=True).transpose(1, 2)  # (N, m, 1)
        g_h = -torch.bmm(gU, w)  # through − h wᵀ
        g_w = torch.baddbmm(g_a * p, gU.transpose(1, 2), h, alpha=-1)  # (N, m, 1)
        g_p = g_a * w
        if objective == "enc":
            g_p = g_p + g_w * g[t]  # w = γ (p − k)
        gS = torch.baddbmm(gS, h, g_p.transpose(1, 2))  # p = Sᵀ h
        g_h = torch.baddbmm(g_h, S_in, g_p)
        if objective == "dec":  # h = S k − v
            gS = torch.baddbmm(gS, g_h, k[t].transpose(1, 2))
            g_k_list[t] = torch.bmm(S_in.transpose(1, 2), g_h)
        if mu is not None:
            g_a_list[t] = g_a.sum(1, keepdim=True)
        g_h_list[t], g_w_list[t] = g_h, g_w
        G = gS
    g_h = torch.stack(g_h_list, 0)
    g_w = torch.stack(g_w_list, 0)
    gmu = None if mu is None else torch.stack(g_a_list, 0)
    if objective in ("dec", "delta"):
        gk, gg, gv = torch.stack(g_k_list, 0) + g_w * g, g_w * k, -g_h
    elif objective == "sim":
        gk, gg, gv = g_w * g, g_w * k, -g_h
    else:  # enc: h = v, w = γ (p − k)
        ps = torch.stack([s[1] for s in saved], 0)
        gk, gg, gv = -g_w * g, g_w * (ps - k), g_h
    return G, gq, gk, gv, gg, gmu


class _FastScan(torch.autograd.Function):
    @staticmethod
    def forward(ctx, S0, q, k, v, g, mu, objective, chunk):
        T = k.shape[0]
        S = S0
        ys, bounds = [], []
        with torch.no_grad():
            for c0 in range(0, T, chunk):
                sl = slice(c0, min(c0 + chunk, T))
                bounds.append(S)
                mu_c = None if mu is None else mu[sl]
                states, _ = _fwd_chunk(S, k[sl], v[sl], g[sl], mu_c, objective, False)
                ys.append(torch.matmul(torch.stack(states, 0), q[sl]))  # y_t = S_t q_t
                S = states[-1]
        ctx.objective, ctx.chunk, ctx.has_mu = objective, chunk, mu is not None
        ctx.save_for_backward(q, k, v, g, mu if mu is not None else q.new_empty(0), *bounds)
        return torch.cat(ys, 0), S

    @staticmethod
    @first_order_backward("lattice_scan")
    @backward_without_autocast
    def backward(ctx, gy, gS_end):
        q, k, v, g, mu, *bounds = ctx.saved_tensors
        mu = mu if ctx.has_mu else None
        T, chunk, obj = k.shape[0], ctx.chunk, ctx.objective
        N, d, m = bounds[0].shape
        G = gS_end if gS_end is not None else bounds[0].new_zeros(N, d, m)
        if gy is None:
            gy = v.new_zeros(T, N, d, 1)
        outs: dict[str, list] = {"q": [], "k": [], "v": [], "g": [], "mu": []}
        starts = list(range(0, T, chunk))
        with torch.no_grad():
            for ci in range(len(starts) - 1, -1, -1):
                sl = slice(starts[ci], min(starts[ci] + chunk, T))
                mu_c = None if mu is None else mu[sl]
                states, saved = _fwd_chunk(bounds[ci], k[sl], v[sl], g[sl], mu_c, obj, True)  # recompute
                G, gq, gk, gv, gg, gmu = _bwd_chunk(
                    bounds[ci], states, saved, G, gy[sl], q[sl], k[sl], v[sl], g[sl], mu_c, obj
                )
                for key, val in (("q", gq), ("k", gk), ("v", gv), ("g", gg), ("mu", gmu)):
                    outs[key].insert(0, val)
        cat = {key: (torch.cat(val, 0) if val and val[0] is not None else None) for key, val in outs.items()}
        return G, cat["q"], cat["k"], cat["v"], cat["g"], cat["mu"], None, None

