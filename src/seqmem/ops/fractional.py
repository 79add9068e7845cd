"""Grünwald–Letnikov power-law kernel and its sum-of-exponentials (SOE) approximation (VORT paper, arXiv:2605.08966).

``gl_weights(alpha, lags)``
    w_j^(α) = Γ(j+α) / (Γ(α) Γ(j+1))  (eq. 2), in lgamma form (stable for lags up to 1e6 and beyond).
``soe_coefficients(alpha, n_terms, horizon, eps)``
    the decay channels of the SOE: coefficients ``c`` (..., S'), rates ``xi`` (S',) (decay λ_s = exp(-ξ_s))
    and the coefficient ``c_now`` (...) of the λ = 0 "upper tail" lump that only acts at lag 0, so that
    ŵ_j = Σ_s c_s exp(-ξ_s j) + c_now·1[j = 0]   (eq. 6).
``soe_kernel(alpha, lags, n_terms, horizon, eps)``
    ŵ_j evaluated at ``lags``.

Constructions (``construction=``):

* ``"corrected"`` (default; docs/vort.md): Gauss–Legendre in the log decay rate
  u = log(λ/λ_min) on Theorem 3.1's interval [λ_min, λ_max] = [ε/2T, 2 log(2T/ε)], the corrected density
  ρ_α(λ) = e^{-αλ}(1-e^{-λ})^{-α} / (Γ(α)Γ(1-α)) (no extra e^{-λ}), the Jacobian ξ_s in
  c_s = ω_s ξ_s ρ_α(ξ_s), and two closed-form tail lumps: c_lo = λ_min^{1-α}/(Γ(α)Γ(2-α)) on a non-decaying
  channel (ξ = 0) and c_hi = e^{-αλ_max}/(Γ(1+α)Γ(1-α)) at lag 0 only.  Nodes do not depend on α; c(α) is
  smooth in α on (0, 1] (1/Γ(1-α) is written (1-α)/Γ(2-α)), and α = 1 gives exactly c = (0, …, 0, c_lo = 1):
  the running sum.
* ``"theorem"``: the same without the tail lumps (Theorem 3.1 as stated, with ρ and the Jacobian fixed).
* ``"paper_legendre"``: Theorem 3.1 exactly as printed: c_s = ω_s ρ_printed(ξ_s) (printed ρ has an extra
  e^{-λ}; no Jacobian).
* ``"paper"``: the abstract's "Gauss–Laguerre" with the printed density: generalised Gauss–Laguerre nodes
  for the weight λ^{-α} e^{-λ} (α-dependent nodes, so ``xi`` has the shape of ``c``),
  c_s = ω_s ρ_printed(ξ_s)/(ξ_s^{-α} e^{-ξ_s}).  It approximates w_{j+1} (not w_j) and converges only
  algebraically; kept to document why it fails.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from torch import Tensor

from seqmem.io import check_int
from seqmem.ops._common import cached_constants, compile_disabled

__all__ = [
    "CONSTRUCTIONS",
    "gl_weights",
    "gl_kernel_sum",
    "soe_nodes",
    "soe_coefficients",
    "soe_kernel",
    "soe_density",
]

CONSTRUCTIONS = ("corrected", "theorem", "paper_legendre", "paper")


def _as_tensor(x, dtype=torch.float64) -> Tensor:
    if isinstance(x, Tensor):
        return x if x.is_floating_point() else x.to(dtype)
    return torch.as_tensor(x, dtype=dtype)


def _check_alpha(alpha: Tensor, upper: float | None = 1.0) -> None:
    ok = torch.isfinite(alpha) & (alpha > 0)
    if upper is not None:
        ok &= alpha <= upper
    if bool(ok.all()):  # one read of the device on the good path; the messages below only when it fails
        return
    if not torch.isfinite(alpha).all():
        raise ValueError("alpha must be finite")
    if (alpha <= 0).any():
        raise ValueError(f"alpha must be > 0, got min {float(alpha.min())}")
    if upper is not None and (alpha > upper).any():
        raise ValueError(f"alpha must be <= {upper} (fractional order), got max {float(alpha.max())}")


def gl_weights(alpha, lags) -> Tensor:
    """Grünwald–Letnikov weights w_j^(α) = Γ(j+α)/(Γ(α)Γ(j+1)) (eq. 2), shape ``alpha.shape + lags.shape``.

    ``alpha`` > 0 (float or tensor, differentiable); ``lags`` non-negative integers (int, sequence or tensor).
    Computed as exp(lgamma(j+α) − lgamma(α) − lgamma(j+1)), stable for very large lags.
    """
    a = _as_tensor(alpha)
    _check_alpha(a, upper=None)
    j = _as_tensor(lags, dtype=a.dtype).to(device=a.device, dtype=a.dtype)
    if (j < 0).any() or (j != torch.round(j)).any():
        raise ValueError("lags must be non-negative integers")
    a_ = a.reshape(a.shape + (1,) * j.dim())
    return torch.exp(torch.lgamma(j + a_) - torch.lgamma(a_) - torch.lgamma(j + 1))


def gl_kernel_sum(alpha, t) -> Tensor:
    """Σ_{j=0}^{t-1} w_j^(α) = Γ(t+α)/(Γ(α+1)Γ(t)) ~ t^α/Γ(α+1) (Prop. 4.4, corrected hockey-stick), t ≥ 1."""
    a = _as_tensor(alpha)
    _check_alpha(a, upper=None)
    tt = _as_tensor(t, dtype=a.dtype).to(device=a.device, dtype=a.dtype)
    if (tt < 1).any():
        raise ValueError("t must be >= 1")
    a_ = a.reshape(a.shape + (1,) * tt.dim())
    return torch.exp(torch.lgamma(tt + a_) - torch.lgamma(a_ + 1) - torch.lgamma(tt))


def soe_density(alpha, lam, printed: bool = False) -> Tensor:
    """ρ_α(λ) of eq. (5), corrected: e^{-αλ}(1-e^{-λ})^{-α}/(Γ(α)Γ(1-α)); ``printed=True``: times e^{-λ}."""
    a = _as_tensor(alpha)
    _check_alpha(a)
    lam = _as_tensor(lam, dtype=a.dtype).to(device=a.device, dtype=a.dtype)
    a_ = a.reshape(a.shape + (1,) * lam.dim())
    log_rho = -a_ * lam - a_ * torch.log(-torch.expm1(-lam)) - torch.lgamma(a_) - torch.lgamma(2 - a_)
    rho = torch.exp(log_rho) * (1 - a_)  # 1/Γ(1-α) = (1-α)/Γ(2-α)
    return rho * torch.exp(-lam) if printed else rho


def soe_nodes(n_terms: int, horizon: int, eps: float = 1e-3) -> tuple[np.ndarray, np.ndarray, float, float]:
    """α-independent Gauss–Legendre nodes in u = log(λ/λ_min) (Theorem 3.1).

    Returns ``(xi, omega, lam_min, lam_max)`` in float64 numpy: rates ξ_s = λ_min e^{u_s}, mapped weights ω_s
    (read-only arrays, computed once per argument triple: a decode step needs them every token).
    """
    _check_soe_args(n_terms, horizon, eps)
    return _soe_nodes(n_terms, horizon, float(eps))


@functools.lru_cache(maxsize=64)
def _soe_nodes(n_terms: int, horizon: int, eps: float) -> tuple[np.ndarray, np.ndarray, float, float]:
    lam_min = eps / (2 * horizon)
    lam_max = 2 * math.log(2 * horizon / eps)
    L = math.log(lam_max / lam_min)
    x, w = np.polynomial.legendre.leggauss(n_terms)
    u = (x + 1) * L / 2
    xi, omega = lam_min * np.exp(u), w * L / 2
    xi.flags.writeable = omega.flags.writeable = False
    return xi, omega, lam_min, lam_max


@compile_disabled
def _soe_node_floats(
    n_terms: int, horizon: int, eps: float
) -> tuple[tuple[float, ...], tuple[float, ...], float, float]:
    """:func:`soe_nodes` as Python floats, run outside ``torch.compile``'s tracing: traced, the cached numpy arrays
    became tensors inside dynamo and the graph resumed after them failed ("Expected np.nditer base"), so a
    compiled VORT model with the SOE kernel did not run."""
    xi, omega, lam_min, lam_max = _soe_nodes(n_terms, horizon, eps)
    return tuple(xi.tolist()), tuple(omega.tolist()), lam_min, lam_max


_NODE_TENSORS: dict[tuple, tuple[Tensor, Tensor]] = {}


def _soe_node_tensors(n_terms: int, horizon: int, eps: float, dtype: torch.dtype,
                      device: torch.device) -> tuple[Tensor, Tensor, float, float]:
    """:func:`soe_nodes` as tensors of ``dtype`` on ``device``: ``(xi, omega, lam_min, lam_max)``.  Eager calls
    build them once per argument set (each ``torch.tensor(values, device=cuda)`` is a blocking copy: a wait for
    the GPU per forward otherwise); traced calls build them in the graph, as constants.  Read-only: the callers
    copy before they hand ``xi`` out."""
    xi_f, om_f, lam_min, lam_max = _soe_node_floats(n_terms, horizon, eps)
    if torch.compiler.is_compiling():
        return (torch.tensor(xi_f, dtype=dtype, device=device), torch.tensor(om_f, dtype=dtype, device=device),
                lam_min, lam_max)
    key = (n_terms, horizon, eps, dtype, torch.device(device))
    if key not in _NODE_TENSORS and len(_NODE_TENSORS) >= 256:  # a bound (a model uses a handful of keys)
        _NODE_TENSORS.clear()
    xi, om = cached_constants(_NODE_TENSORS, key, lambda: (torch.tensor(xi_f, dtype=dtype, device=device),
                                                           torch.tensor(om_f, dtype=dtype, device=device)))
    return xi, om, lam_min, lam_max


def _check_soe_args(n_terms, horizon, eps) -> None:
    check_int("n_terms", n_terms)
    check_int("horizon", horizon, 2)
    if not (0 < eps < 1):
        raise ValueError(f"eps must be in (0, 1), got {eps!r}")


def _gen_laguerre(n: int, a: float) -> tuple[np.ndarray, np.ndarray]:
    """Generalised Gauss–Laguerre nodes/weights for the weight x^a e^{-x} (Golub–Welsch), a > -1."""
    k = np.arange(n, dtype=np.float64)
    diag = 2 * k + 1 + a
    off = np.sqrt(k[1:] * (k[1:] + a))
    J = np.diag(diag) + np.diag(off, 1) + np.diag(off, -1)
    x, V = np.linalg.eigh(J)
    return x, math.gamma(a + 1) * V[0] ** 2


def soe_coefficients(
    alpha, n_terms: int, horizon: int, eps: float = 1e-3, *, construction: str = "corrected"
) -> tuple[Tensor, Tensor, Tensor]:
    """SOE channels of the GL kernel (eqs. 5–6, Theorem 3.1): ``(c, xi, c_now)``.

    ``c``: (..., S') coefficients (S' = n_terms + 1 for "corrected" — the last channel is the ξ = 0 lump —,
    else n_terms); ``xi``: (S',) decay rates (``alpha.shape + (S',)`` for the α-dependent "paper" nodes);
    ``c_now``: (...) weight of the lag-0-only lump (zero except for "corrected").  Differentiable in ``alpha``
    (except "paper", whose nodes depend on α).  ``alpha`` in (0, 1].
    """
    if construction not in CONSTRUCTIONS:
        raise ValueError(f"construction must be one of {list(CONSTRUCTIONS)}, got {construction!r}")
    a = _as_tensor(alpha)
    _check_alpha(a)
    _check_soe_args(n_terms, horizon, eps)
    dt, dev = a.dtype, a.device
    if construction == "paper":
        if (a >= 1).any():
            raise ValueError("the paper's Gauss–Laguerre construction needs alpha < 1")
        flat = a.detach().reshape(-1).cpu().double().numpy()
        xs, cs = [], []
        for av in flat:
            x, w = _gen_laguerre(n_terms, -float(av))
            xs.append(x)
            # c_s = ω_s ρ_printed(ξ_s) / (ξ_s^{-α} e^{-ξ_s})
            log_rho = -av * x - av * np.log(-np.expm1(-x)) - math.lgamma(av) - math.lgamma(1 - av) - x
            cs.append(w * np.exp(log_rho + av * np.log(x) + x))
        shape = a.shape + (n_terms,)
        xi = torch.tensor(np.array(xs), dtype=dt, device=dev).reshape(shape)
        c = torch.tensor(np.array(cs), dtype=dt, device=dev).reshape(shape)
        return c, xi, torch.zeros(a.shape, dtype=dt, device=dev)

    xi, om, lam_min, lam_max = _soe_node_tensors(n_terms, horizon, float(eps), dt, dev)
    a_ = a[..., None]
    log_rho = -a_ * xi - a_ * torch.log(-torch.expm1(-xi)) - torch.lgamma(a_) - torch.lgamma(2 - a_)
    rho = torch.exp(log_rho) * (1 - a_)
    if construction == "paper_legendre":
        c = om * rho * torch.exp(-xi)  # printed ρ (extra e^{-λ}), no Jacobian
    else:
        c = om * xi * rho  # corrected ρ, Jacobian ξ_s
    zero = torch.zeros(a.shape, dtype=dt, device=dev)
    if construction != "corrected":
        return c, xi.clone(), zero  # a copy: xi is the cached nodes
    c_lo = torch.exp((1 - a) * math.log(lam_min) - torch.lgamma(a) - torch.lgamma(2 - a))
    c_hi = torch.exp(-a * lam_max - torch.lgamma(1 + a) - torch.lgamma(2 - a)) * (1 - a)
    c = torch.cat([c, c_lo[..., None]], -1)
    xi = torch.cat([xi, xi.new_zeros(1)])
    return c, xi, c_hi


def soe_kernel(
    alpha, lags, n_terms: int, horizon: int, eps: float = 1e-3, *, construction: str = "corrected"
) -> Tensor:
    """SOE approximation ŵ_j^(α) = Σ_s c_s e^{-ξ_s j} + c_now·1[j=0] (eq. 6) at ``lags``.

    Shape ``alpha.shape + lags.shape``.  With the default corrected construction
    max_{j≤T} |ŵ_j − w_j| ≤ 1.5e-3 for S = 15, T = 1000, α ∈ [0.05, 0.99] (tests/ops/test_fractional.py).
    Differentiable in ``alpha``.
    """
    a = _as_tensor(alpha)
    c, xi, c_now = soe_coefficients(a, n_terms, horizon, eps, construction=construction)
    j = _as_tensor(lags, dtype=c.dtype).to(device=c.device, dtype=c.dtype)
    if (j < 0).any():
        raise ValueError("lags must be non-negative")
    nd = j.dim()
    c_ = c.reshape(a.shape + (1,) * nd + c.shape[-1:])
    xi_ = xi.reshape(xi.shape[:-1] + (1,) * nd + xi.shape[-1:]) if xi.dim() > 1 else xi
    w = (c_ * torch.exp(-xi_ * j[..., None])).sum(-1)
    return w + c_now.reshape(a.shape + (1,) * nd) * (j == 0).to(c.dtype)
