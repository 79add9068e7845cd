"""VORT — variable-order (power-law) retention (VORT paper, arXiv:2605.08966, eqs. 11, 14–17) and its baseline kernels.

Per head: q, k, v projections; features φ (FAVOR+ positive random features with a fixed seed, elu+1, or the
exact exp(q·k/√d) of eq. 13); keyed retrieval o_t = Σ_i s_ti ŵ_{t−i} v_i / (Σ_i s_ti ŵ_{t−i} + ε0) (eq. 16),
where the kernel ŵ is

* ``kernel="soe"`` — the corrected SOE of the GL power-law kernel (seqmem.ops.fractional) in the merged form
  (docs/vort.md): S(+1) decay channels shared by all tokens with per-token weights c_s(α_t) (exactly the K-bank
  sum of eqs. 14–16, K times cheaper); the λ = 0 tail lump acts on the current token only;
* ``kernel="gl"`` — exact GL weights w_{t−i}^(α_i) (the paper's "exact fractional convolution"; KV-cache state);
* ``kernel="exp"`` — one fixed exponential e^{−λj} (the Exponential baseline);
* ``kernel="mixture"`` — Σ_m π_m e^{−λ_m j}, learned π_m = softplus(θ_m), λ_m = exp(η_m) (Mixture-5).

α_t (eq. 11): ``alpha_mode="continuous"``: α_t = δ + (1−δ)σ(w·x_t + w_H H(a_t) + w_e e_t + b), with H the
normalised entropy of the token's local-attention row and e_t an entity flag (a learned soft probe σ(u·x_t + c),
or given through :meth:`VORT.entity_flags`); ``"banked"`` rounds α_t to the nearest of the K bank orders
α_k = δ + (1−δ)k/K (straight-through gradient; the paper's routing); ``"fixed"``: one global α (Tables 1–2).
Output: y = W_O (o_t + Attn_local(x_t)) (eq. 17), a causal sliding-window softmax attention of width
``local_window`` sharing q/k/v (0 disables it and the entropy feature).
impl="reference": per-token recurrences (eqs. 14–16 as written); impl="fast": chunked form (parallel form for
the KV-cache kernels).  Choices the paper leaves open are documented in docs/vort.md.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqmem.mixers.base import Mixer, State, check_choice, check_positive_int
from seqmem.ops._common import cached_constants, compile_disabled
from seqmem.ops._common import compute_dtype as _compute_dtype
from seqmem.ops._common import full_precision as _full_precision
from seqmem.ops.fractional import CONSTRUCTIONS, gl_weights, soe_coefficients
from seqmem.ops.vort import (
    kv_retention,
    local_window_attention,
    refine_alpha,
    retrieval_loss,
    soe_kernel_matrix,
    soe_retention,
)
from seqmem.registry import register

KERNELS = ("soe", "gl", "exp", "mixture")
ALPHA_MODES = ("continuous", "banked", "fixed")
FEATURE_MAPS = ("favor", "elu", "exact")
ENTITY = ("probe", "input", "none")


def favor_features(x: Tensor, omega: Tensor) -> Tensor:
    """FAVOR+ positive random features φ(x) = exp(Ω x' − |x'|²/2)/√m, x' = x/d^{1/4} (Performer; eq. 16's φ).

    ``x`` (batch, time, heads, d); ``omega`` (heads, m, d).  E[φ(q)·φ(k)] = exp(q·k/√d).  Computed as
    :func:`favor_features_scaled`'s φ̃·e^{s}: it overflows or underflows for large ``x`` (the mixer uses the
    scaled form)."""
    f, log_scale = favor_features_scaled(x, omega)
    return f * torch.exp(log_scale)[..., None]


def favor_features_scaled(x: Tensor, omega: Tensor) -> tuple[Tensor, Tensor]:
    """FAVOR+ features in scaled form: φ(x) = φ̃(x)·e^{s(x)} with φ̃ = exp(Ω x' − max_m (Ω x')_m) ∈ (0, 1] and
    s = max_m (Ω x')_m − |x'|²/2 − log √m (φ̃·e^{s} = φ exactly).

    Returns ``(φ̃ (batch, time, heads, m), s (batch, time, heads))``: both are finite for any finite ``x``,
    where φ itself underflows to 0 once |x'|²/2 exceeds ~745 (float64) or ~103 (float32)."""
    d = x.shape[-1]
    xs = x * d**-0.25
    proj = torch.einsum("bthd,hmd->bthm", xs, omega)
    top = proj.amax(-1, keepdim=True)
    log_scale = top[..., 0] - 0.5 * (xs * xs).sum(-1) - 0.5 * math.log(omega.shape[1])
    return torch.exp(proj - top), log_scale


def orthogonal_gaussian(heads: int, m: int, d: int, seed: int) -> Tensor:
    """Blocks of orthogonal rows with chi-distributed norms (FAVOR+'s orthogonal random features), float64."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(heads):
        rows = []
        while sum(r.shape[0] for r in rows) < m:
            A = torch.randn(d, d, generator=g, dtype=torch.float64)
            Qm, _ = torch.linalg.qr(A)
            rows.append(Qm.t())
        W = torch.cat(rows, 0)[:m]
        norms = torch.randn(m, d, generator=g, dtype=torch.float64).norm(dim=1)
        out.append(W * norms[:, None])
    return torch.stack(out)


def fit_exp_mixture(alpha: float, n_exp: int, horizon: int, iters: int = 300) -> tuple[np.ndarray, np.ndarray]:
    """Rates and weights of n_exp exponentials fitted to the GL kernel w_j^(α), 0 ≤ j ≤ horizon.

    Minimises the mean squared relative error on ~200 log-spaced lags over log-rates and log-weights (L-BFGS,
    float64), starting from rates log-spaced in [1/horizon, 1].  The "fit" initialisation of the Mixture-5
    baseline (the Mixture's deficit in the paper must come from optimisation, not expressiveness).
    """
    lags = np.unique(np.round(np.logspace(0, math.log10(horizon), 200)))
    j = torch.tensor(np.concatenate([[0.0], lags]), dtype=torch.float64)
    w = gl_weights(alpha, j)
    log_rate = torch.linspace(math.log(1.0 / horizon), 0.0, n_exp, dtype=torch.float64).requires_grad_(True)
    log_pi = torch.full((n_exp,), math.log(1.0 / n_exp), dtype=torch.float64).requires_grad_(True)
    opt = torch.optim.LBFGS([log_rate, log_pi], max_iter=iters, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        fit = (log_pi.exp() * torch.exp(-log_rate.exp() * j[:, None])).sum(1)
        loss = ((fit / w - 1) ** 2).mean()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    order = torch.argsort(log_rate.detach())
    return log_rate.detach()[order].exp().numpy(), log_pi.detach()[order].exp().numpy()


@register(
    "vort",
    facts=dict(
        state_promise=("grows", "SOE banks grow O(t^α) (Prop. 4.4); the α = 1 bank and λ = 1 lump grow O(t) "
                                "(docs/vort.md)"),
        numerics_smoke=(7e-7, 2e-2, 2.2e-3),  # measured 2.2e-7, 5.8e-3, 7.1e-4 (float32 channels since #10 §2)
        numerics_full=((6.8e-07, 7.1e-07), (1.5e-02, 1.5e-02), (1.9e-03, 1.8e-03)),
    ),
    description="VORT: adaptive power-law (SOE) retention + local attention (VORT paper)")
class VORT(Mixer):
    """Keyed linear-attention retrieval with power-law (SOE) or exponential decay kernels (VORT
    eqs. 11–17)."""

    # decode step: the fast form's fused one-token update (soe_retention at T = 1) takes 0.70-0.97x the per-token
    # reference's time at 4k context in the 2026-11-25 decode run (docs/results/bench/decode_cpu.json: vort 0.83,
    # vort_fixed_alpha 0.70, exp_mixture 0.82, exp_decay 0.97; d 256, one thread, wall clock)
    single_token_impl: ClassVar[str] = "fast"

    length_options: ClassVar[dict[str, str]] = {"local_window": "window"}
    option_domains: ClassVar[dict[str, str]] = {
        "n_banks": ">0", "n_soe": ">0", "horizon": ">1", "soe_eps": "(0,1)",
        "n_features": ">0", "local_window": ">=0", "decay_rate": ">0", "n_exp": ">0", "chunk_size": ">0",
        "eps0": ">=0",
    }
    pos_on_host: ClassVar[bool] = True  # a decode step reads its position from the host (Mixer._state_pos)
    contract_configs: ClassVar[list[dict]] = [
        {"chunk_size": 8, "local_window": 8, "n_soe": 6, "horizon": 64, "n_features": 8},
        {
            "chunk_size": 8,
            "alpha_mode": "banked",
            "n_banks": 4,
            "feature_map": "elu",
            "normalizer": "plain",
            "strict_causal": True,
            "local_window": 5,
            "n_soe": 5,
            "horizon": 64,
            "entity": "none",
        },
        {"kernel": "gl", "feature_map": "elu", "local_window": 6},
        {"feature_map": "exact", "local_window": 0, "n_soe": 6, "horizon": 64, "alpha_mode": "fixed"},
    ]

    def __init__(
        self,
        d_model: int,
        n_heads: int = 4,
        impl: str = "fast",
        kernel: str = "soe",
        alpha_mode: str = "continuous",
        alpha: float = 0.7,
        min_alpha: float = 0.1,
        n_banks: int = 8,
        n_soe: int = 15,
        horizon: int = 4096,
        soe_eps: float = 1e-3,
        construction: str = "corrected",
        feature_map: str = "favor",
        n_features: int = 64,
        feature_seed: int = 0,
        normalizer: str = "kernel",
        strict_causal: bool = False,
        eps0: float = 1e-6,
        local_window: int = 64,
        entity: str = "probe",
        decay_rate: float = 1e-3,
        n_exp: int = 5,
        mixture_init: str = "logspace",
        chunk_size: int = 64,
    ) -> None:
        super().__init__(d_model, n_heads, impl)
        self.head_dim = self._head_dim()
        self.kernel = check_choice("kernel", kernel, KERNELS)
        self.alpha_mode = check_choice("alpha_mode", alpha_mode, ALPHA_MODES)
        self.feature_map = check_choice("feature_map", feature_map, FEATURE_MAPS)
        self.normalizer = check_choice("normalizer", normalizer, ("kernel", "plain"))
        self.entity = check_choice("entity", entity, ENTITY)
        self.construction = check_choice("construction", construction, CONSTRUCTIONS)
        self.mixture_init = check_choice("mixture_init", mixture_init, ("logspace", "fit"))
        if not (0 < min_alpha < 1):
            raise ValueError(f"min_alpha (δ) must be in (0, 1), got {min_alpha!r}")
        if not (min_alpha <= alpha <= 1):
            raise ValueError(f"alpha must be in [min_alpha, 1] = [{min_alpha}, 1], got {alpha!r}")
        if eps0 == 0 and strict_causal:
            raise ValueError("eps0 must be > 0 with strict_causal=True (the first token sees nothing: 0/0)")
        if self.construction == "paper" and self.kernel == "soe":
            raise ValueError(
                "construction='paper' has α-dependent nodes and cannot be merged; use kernel ops"
            )
        self.alpha, self.min_alpha = float(alpha), float(min_alpha)
        self.n_banks = check_positive_int("n_banks", n_banks)
        self.n_soe = check_positive_int("n_soe", n_soe)
        self.horizon = check_positive_int("horizon", horizon)
        if horizon < 2:
            raise ValueError("horizon must be >= 2")
        self.soe_eps, self.eps0 = float(soe_eps), float(eps0)
        self.strict_causal = bool(strict_causal)
        self.local_window = (
            0 if local_window in (None, 0) else check_positive_int("local_window", local_window)
        )
        self.chunk_size = check_positive_int("chunk_size", chunk_size)
        self.n_exp = check_positive_int("n_exp", n_exp)
        self.n_features = (
            self.head_dim if feature_map in ("elu", "exact") else check_positive_int("n_features", n_features)
        )
        self.decay_rate = float(decay_rate)
        self.uses_cache = feature_map == "exact" or kernel == "gl"
        if self.kernel in ("exp", "mixture") and self.alpha_mode != "fixed":
            raise ValueError(f"kernel={kernel!r} has no fractional order: use alpha_mode='fixed'")

        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        if self.feature_map == "favor":
            self.register_buffer(
                "omega", orthogonal_gaussian(n_heads, self.n_features, self.head_dim, feature_seed).float()
            )
        if self.alpha_mode != "fixed":
            # eq. (11): α = δ + (1-δ) σ(W_α [x; H; e] + b_α); init w_x ~ 0, w_H = -1, w_e = +2
            self.alpha_x = nn.Linear(d_model, 1)
            nn.init.normal_(self.alpha_x.weight, std=0.02)
            p0 = (self.alpha - self.min_alpha) / (1 - self.min_alpha)
            p0 = min(max(p0, 1e-3), 1 - 1e-3)
            nn.init.constant_(self.alpha_x.bias, math.log(p0 / (1 - p0)))
            self.alpha_h = nn.Parameter(torch.tensor(-1.0))
            self.alpha_e = nn.Parameter(torch.tensor(2.0))
            if self.entity == "probe":
                self.entity_probe = nn.Linear(d_model, 1)
                nn.init.normal_(self.entity_probe.weight, std=0.02)
                nn.init.constant_(self.entity_probe.bias, -2.0)
        if self.kernel == "exp":
            self.register_buffer("exp_rate", torch.tensor([self.decay_rate]))
        if self.kernel == "mixture":
            if self.mixture_init == "fit":
                rates, pi = fit_exp_mixture(0.7, self.n_exp, self.horizon)
            else:
                rates = np.logspace(math.log10(1.0 / self.horizon), 0.0, self.n_exp)
                pi = np.full(self.n_exp, 1.0 / self.n_exp)
            self.mix_log_rate = nn.Parameter(torch.tensor(np.log(rates), dtype=torch.float32))
            self.mix_weight_raw = nn.Parameter(torch.tensor(np.log(np.expm1(pi)), dtype=torch.float32))
        self._entity_override: Tensor | None = None
        #: the fixed-α SOE channel values per dtype (:meth:`_shared_channels`); float32 / float64 ahead of any trace
        self._soe_values: dict[torch.dtype, tuple[list[float], list[float], float]] = {}
        #: ... and as tensors per (dtype, device), for eager calls
        self._soe_tensors: dict[tuple[torch.dtype, torch.device], tuple[Tensor, Tensor, Tensor]] = {}
        if self.kernel == "soe" and self.alpha_mode == "fixed":
            for dt in (torch.float32, torch.float64):
                self._soe_values[dt] = self._fixed_soe_values(dt)
        self._alpha_override_t: Tensor | None = None
        self.last_alpha: Tensor | None = None

    # -- options --
    @contextlib.contextmanager
    def _overriding(self, attr: str, value: Tensor):
        """Within this context, ``self.<attr>`` is ``value`` (None again after it)."""
        setattr(self, attr, value)
        try:
            yield self
        finally:
            setattr(self, attr, None)

    def entity_flags(self, e: Tensor) -> contextlib.AbstractContextManager:
        """Within this context, use ``e`` (batch, time) in [0, 1] as the entity flag of eq. (11).  Required with
        ``entity="input"`` (a call without it raises a ValueError; ``entity="none"`` is e = 0); with ``"probe"`` it
        replaces the probe's flags."""
        return self._overriding("_entity_override", e)

    def alpha_override(self, alpha: Tensor) -> contextlib.AbstractContextManager:
        """Within this context, use ``alpha`` (batch, time) in [δ, 1] as the per-token orders (e.g. refined α)."""
        return self._overriding("_alpha_override_t", alpha)

    def retrieval_loss(self, x: Tensor, source: Tensor, exact_kernel: bool = False) -> Tensor:
        """Plasticity objective L_ret (eq. 24) of this layer on a whole sequence ``x`` (batch, time, d_model).

        ``source`` (batch, time): index of the ground-truth source token of each query (−1: not scored).  Uses
        this layer's q, k (per head, summed) and its routed α (continuous α_t; banked mode uses the quantised α with
        the straight-through gradient), so adding ``λ_ret · L_ret`` to a training loss sends gradient into the α
        routing (W_α, b_α, the entropy/entity weights) — our reading of Section 5 (docs/vort.md).
        """
        self._check_input(x)
        if self.kernel not in ("soe", "gl"):
            raise ValueError("retrieval_loss needs a fractional kernel (kernel='soe' or 'gl')")
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).unbind(2)
        ent = x.new_zeros(b, t)
        if self.local_window > 0:
            ent = local_window_attention(q, k, v, self.local_window, chunk_size=self.chunk_size)[1]
        alpha = self._alpha(x, ent)
        return retrieval_loss(q, k, alpha, source, n_terms=self.n_soe, horizon=self.horizon, eps=self.soe_eps,
                              exact_kernel=exact_kernel or self.kernel == "gl")

    def refine_alpha(self, x: Tensor, source: Tensor, lr: float = 0.1, steps: int = 10) -> tuple[Tensor, list]:
        """Test-time plasticity: projected GD on the per-token α of ``x`` (clip to [δ, 1]) minimising L_ret.

        Returns the refined α (batch, time) and the loss history; use it with :meth:`alpha_override`.
        """
        b, t, _ = x.shape
        with torch.no_grad():
            q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, self.head_dim).unbind(2)
            ent = x.new_zeros(b, t)
            if self.local_window > 0:
                ent = local_window_attention(q, k, v, self.local_window, chunk_size=self.chunk_size)[1]
            a0 = self._alpha(x, ent)

        def f(a: Tensor) -> Tensor:
            return retrieval_loss(q, k, a, source, n_terms=self.n_soe, horizon=self.horizon, eps=self.soe_eps,
                                  exact_kernel=self.kernel == "gl")

        return refine_alpha(a0, f, min_alpha=self.min_alpha, lr=lr, steps=steps)

    def bank_orders(self, device: torch.device | str | None = None) -> Tensor:
        """α_k = δ + (1−δ) k/K, k = 1..K (the paper's bank grid; α_K = 1), on ``device`` (default: the CPU)."""
        k = torch.arange(1, self.n_banks + 1, dtype=torch.float64, device=device)
        return self.min_alpha + (1 - self.min_alpha) * k / self.n_banks

    def n_channels(self) -> int:
        if self.kernel == "soe":
            return self.n_soe + (1 if self.construction == "corrected" else 0)
        return 1 if self.kernel == "exp" else self.n_exp

    def _coef_width(self) -> int:
        return 1 if self.kernel == "gl" else self.n_channels() + 1

    def state_keys(self) -> set[str]:
        keys = {"pos"}
        if self.uses_cache:
            keys |= {"k", "v", "coef"}
        else:
            keys |= {"G", "b"} | ({"z"} if self.normalizer == "plain" else set())
            keys |= {"m"} if self.feature_map == "favor" else set()
        if self.local_window > 1:
            keys |= {"lk", "lv"}
        return keys

    def state_size(self, seq_len: int) -> int:
        h, dh, f = self.n_heads, self.head_dim, self.n_features
        n = 1
        if self.uses_cache:
            n += seq_len * (2 * h * dh + self._coef_width())
        else:
            n += h * self.n_channels() * f * (dh + 1) + (h * f if self.normalizer == "plain" else 0)
            n += h if self.feature_map == "favor" else 0  # m: the running key scale of the FAVOR+ features
        if self.local_window > 1:
            n += 2 * h * dh * min(seq_len, self.local_window - 1)
        return n

    # -- pieces --
    def _features(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """φ(x) as ``(φ̃, log-scale)`` with φ = φ̃·e^{log-scale} (FAVOR+), or ``(φ, None)``."""
        if self.feature_map == "favor":
            return favor_features_scaled(x, self.omega.to(x.dtype))
        if self.feature_map == "elu":
            return F.elu(x) + 1, None
        return x, None

    def _alpha(self, x: Tensor, ent: Tensor) -> Tensor:
        if self._alpha_override_t is not None:
            a = self._alpha_override_t.to(x.dtype)
            if a.shape != x.shape[:2]:
                raise ValueError(f"alpha override must be (batch, time) = {tuple(x.shape[:2])}, got {tuple(a.shape)}")
            if (a < self.min_alpha - 1e-12).any() or (a > 1).any():
                raise ValueError(f"alpha override must lie in [min_alpha, 1] = [{self.min_alpha}, 1]")
            return a
        if self.alpha_mode == "fixed":
            return x.new_full(x.shape[:2], self.alpha)
        if self._entity_override is not None:
            e = self._entity_override.to(x.dtype)
            if e.shape != x.shape[:2]:
                raise ValueError(
                    f"entity flags must be (batch, time) = {tuple(x.shape[:2])}, got {tuple(e.shape)}"
                )
        elif self.entity == "probe":
            e = torch.sigmoid(self.entity_probe(x)[..., 0])
        elif self.entity == "input":
            raise ValueError(
                f"{type(self).__name__}: entity='input' takes the entity flags e_t of eq. (11) from the caller: run "
                "the layer inside `with layer.entity_flags(e):` with e of shape (batch, time) = "
                f"{tuple(x.shape[:2])} (entity='none' for e = 0, 'probe' to learn them)"
            )
        else:
            e = torch.zeros_like(x[..., 0])
        z = self.alpha_x(x)[..., 0] + self.alpha_h * ent + self.alpha_e * e
        a = self.min_alpha + (1 - self.min_alpha) * torch.sigmoid(z)
        if self.alpha_mode == "banked":
            banks = self.bank_orders(x.device).to(x.dtype)
            idx = (a.detach()[..., None] - banks).abs().argmin(-1)
            a = a + (banks[idx] - a).detach()  # straight-through estimator
        return a

    def _token_independent(self) -> bool:
        """Whether every token has the same channel weights: the exponential kernels, and a fixed α (no override)."""
        return self.kernel in ("exp", "mixture") or (
            self.kernel == "soe" and self.alpha_mode == "fixed" and self._alpha_override_t is None)

    def _shared_channels(self, dtype, device) -> tuple[Tensor, Tensor, Tensor]:
        """The channel weights (S',), rates (S',) and lag-0 weight (0-d) shared by every token
        (:meth:`_token_independent`): the values :meth:`_channels` gives each token.  The fixed-α SOE values are
        computed once per dtype and enter as constants, so ``torch.compile`` traces no check of α (each
        data-dependent check there was a graph break: 14 graphs per vort_fixed_alpha model, now 4)."""
        if self.kernel != "soe":
            return self._channels(torch.zeros((), dtype=dtype, device=device), dtype)
        if dtype not in self._soe_values:
            self._soe_values[dtype] = self._fixed_soe_values(dtype)
        c, xi, c_now = self._soe_values[dtype]
        if torch.compiler.is_compiling():  # constants of the traced graph
            return (torch.tensor(c, dtype=dtype, device=device), torch.tensor(xi, dtype=dtype, device=device),
                    torch.tensor(c_now, dtype=dtype, device=device))
        # eager: the tensors once per dtype and device (each torch.tensor(list, device=cuda) is a blocking copy, a
        # wait for the GPU, per forward); the ops only read them
        return cached_constants(self._soe_tensors, (dtype, torch.device(device)), lambda: (
            torch.tensor(c, dtype=dtype, device=device), torch.tensor(xi, dtype=dtype, device=device),
            torch.tensor(c_now, dtype=dtype, device=device)))

    @compile_disabled
    def _fixed_soe_values(self, dtype: torch.dtype) -> tuple[list[float], list[float], float]:
        """:meth:`_channels` of the fixed α (a 0-d tensor of ``dtype``) as Python numbers (exact: ``dtype``'s
        values)."""
        c, xi, c_now = self._channels(torch.tensor(self.alpha, dtype=dtype), dtype)
        return c.tolist(), xi.tolist(), float(c_now)

    def _channels(self, alpha: Tensor, dtype) -> tuple[Tensor, Tensor, Tensor]:
        """Per-token channel weights (b, t, S'), rates (S',), lag-0 weight (b, t)."""
        if self.kernel == "soe":
            try:  # soe_coefficients checks alpha with one read of the device; this one adds none
                c, xi, c_now = soe_coefficients(
                    alpha, self.n_soe, self.horizon, self.soe_eps, construction=self.construction
                )
            except ValueError as e:
                if not bool(torch.isfinite(alpha).all()):  # alpha is computed from x: NaN/Inf there is bad input
                    raise ValueError(f"{type(self).__name__}: NaN/Inf in the input x (the memory order alpha "
                                     "computed from it is not finite); clean the input, or turn on "
                                     "seqmem.mixers.base.set_check_finite(True) to find it") from e
                raise
            return c, xi.to(dtype), c_now
        if self.kernel == "exp":
            ones = alpha.new_ones(alpha.shape + (1,))
            return ones, self.exp_rate.to(dtype), torch.zeros_like(alpha)
        pi = F.softplus(self.mix_weight_raw.to(dtype))
        return (
            pi.expand(alpha.shape + pi.shape),
            torch.exp(self.mix_log_rate.to(dtype)),
            torch.zeros_like(alpha),
        )

    # -- forward --
    def _forward(self, x: Tensor, state: State | None) -> tuple[Tensor, State]:
        b, t, _ = x.shape
        h, dh = self.n_heads, self.head_dim
        start = 0 if state is None else self._state_pos(state)
        if state is not None:
            self._check_cache_lengths(state, start)
        q, k, v = self.qkv(x).view(b, t, 3, h, dh).unbind(2)
        new_state: State = {}
        mode = self._op_mode()
        # local sliding-window attention (eq. 17) and its entropy (eq. 11's H(a_t))
        if self.local_window > 0:
            # the op's window cache {"k", "v"} is kept as this mixer's "lk"/"lv" (no cache for a window of 1)
            win = None if state is None or self.local_window == 1 else {"k": state["lk"], "v": state["lv"]}
            loc, ent, win = local_window_attention(
                q, k, v, self.local_window, initial_state=win, return_state=True, mode=mode,
                chunk_size=self.chunk_size
            )
            if self.local_window > 1:
                new_state["lk"], new_state["lv"] = win["k"], win["v"]
        else:
            loc, ent = None, x.new_zeros(b, t)
        alpha = self._alpha(x, ent)
        self.last_alpha = alpha.detach()  # for inspection; a graph kept here stopped copy.deepcopy of the layer
        if self.uses_cache:
            o = self._cached(q, k, v, alpha, state, start, new_state)
        else:
            # half inputs: channel weights, features, the retention and its state in float32 (the SOE weight of
            # the slowest channel and the FAVOR+ exponentials overflow float16), autocast off; o back in q's dtype
            cd = _compute_dtype(x)
            init = None if state is None else {kk: state[kk].to(cd) for kk in ("G", "b", "z", "m") if kk in state}
            with _full_precision(x.device):
                if self._token_independent():  # one kernel for every token: the op may run its lag-kernel form
                    c, xi, c_now = self._shared_channels(cd, x.device)
                else:
                    c, xi, c_now = self._channels(alpha.to(cd), cd)
                fq = self._features(q.to(cd))[0]  # φ(q) up to a per-query factor (FAVOR+: e^{s_q})
                fk, sk = self._features(k.to(cd))
                o, st = soe_retention(
                    fq,
                    fk,
                    v.to(cd),
                    c,
                    xi,
                    c_now,
                    eps0=self.eps0,
                    normalizer=self.normalizer,
                    strict_causal=self.strict_causal,
                    initial_state=init,
                    mode=mode,
                    chunk_size=self.chunk_size,
                    k_log_scale=sk,
                    output_final_state=self._final_state_wanted,
                )
            o = o.to(q.dtype)
            if st is not None:
                new_state.update(st)
        if loc is not None:
            o = o + loc
        new_state["pos"] = torch.full((b,), start + t, dtype=torch.long, device=x.device)
        return self.out(o.reshape(b, t, self.d_model)), new_state

    def _check_cache_lengths(self, state: State, start: int) -> None:
        """The KV cache (``k``, ``v``, ``coef``: every past token) holds ``pos`` tokens and the local window's cache
        (``lk``, ``lv``) the last ``min(pos, local_window - 1)``: a truncated cache or one from another window would
        shift every lag (eq. 2's w_{t-i} is indexed by the cache position)."""
        want = {"k": start, "v": start, "coef": start} if self.uses_cache else {}
        if self.local_window > 1:
            want |= {"lk": min(start, self.local_window - 1), "lv": min(start, self.local_window - 1)}
        for key, n in want.items():
            if state[key].shape[1] != n:
                what = ("every past token" if key in ("k", "v", "coef")
                        else f"the last min(pos, local_window - 1) = min({start}, {self.local_window - 1}) tokens")
                raise ValueError(
                    f"{type(self).__name__}: state[{key!r}] holds {state[key].shape[1]} tokens at pos {start}, "
                    f"expected {n} ({what}): a truncated cache or a state from another configuration; pass "
                    "state=None to start a new sequence"
                )

    def _cached(self, q, k, v, alpha, state, start, new_state) -> Tensor:
        """KV-cache path: exact exp scores (eq. 13) and/or exact GL weights; parallel or per-token."""
        b, t = q.shape[:2]
        cd = _compute_dtype(q)  # half inputs: kernel coefficients (stored in the state) in float32
        if self.kernel == "gl":
            coef = alpha[..., None].to(cd)
        else:
            with _full_precision(q.device):
                c, xi, c_now = self._channels(alpha.to(cd), cd)
            coef = torch.cat([c, c_now[..., None]], -1)
        if state is not None:
            K = torch.cat([state["k"], k], 1)
            V = torch.cat([state["v"], v], 1)
            C = torch.cat([state["coef"], coef], 1)
        else:
            K, V, C = k, v, coef
        new_state.update({"k": K, "v": V, "coef": C})
        n = K.shape[1]
        kpos = torch.arange(n, device=q.device)
        if self.impl == "reference":
            outs = [
                self._cached_rows(
                    q[:, i : i + 1],
                    K[:, : start + i + 1],
                    V[:, : start + i + 1],
                    C[:, : start + i + 1],
                    kpos[: start + i + 1],
                    torch.arange(start + i, start + i + 1, device=q.device),
                )
                for i in range(t)
            ]
            return torch.cat(outs, 1)
        return self._cached_rows(q, K, V, C, kpos, torch.arange(start, start + t, device=q.device))

    def _cached_rows(self, q, K, V, C, kpos, qpos) -> Tensor:
        """Rows of the KV-cache path, computed in float32 for half inputs (autocast off), returned in q's dtype."""
        cd = _compute_dtype(q)
        with _full_precision(q.device):
            o = self._cached_rows_cd(q.to(cd), K.to(cd), V.to(cd), C.to(cd), kpos, qpos)
        return o.to(q.dtype)

    def _rates(self, dtype: torch.dtype, device: torch.device) -> Tensor:
        if self.kernel == "soe":  # the rates ξ_s do not depend on α (but for "paper", whose nodes do; α = ½ there)
            half = torch.tensor(0.5, dtype=torch.float64, device=device)
            xi = soe_coefficients(half, self.n_soe, self.horizon, self.soe_eps, construction=self.construction)[1]
            return xi.to(dtype)
        return self.exp_rate.to(dtype) if self.kernel == "exp" else torch.exp(self.mix_log_rate).to(dtype)

    def _cached_rows_cd(self, q, K, V, C, kpos, qpos) -> Tensor:
        vis = kpos[None, :] < qpos[:, None] if self.strict_causal else kpos[None, :] <= qpos[:, None]
        if self.kernel == "gl":  # exact GL weights w_{t-i}^(α_i) (eq. 2)
            lag = (qpos[:, None] - kpos[None, :]).clamp_min(0).to(q.dtype)
            a = C[..., 0][:, None, :]  # (b, 1, n)
            D = torch.exp(torch.lgamma(lag + a) - torch.lgamma(a) - torch.lgamma(lag + 1.0)) * vis
        else:
            now = None if self.strict_causal else C[..., -1]
            D = soe_kernel_matrix(qpos, kpos, C[..., :-1], self._rates(q.dtype, q.device), now) * vis
        kw = dict(normalizer=self.normalizer, eps0=self.eps0)
        if self.feature_map == "exact":  # exp(q·k/√d) (eq. 13)
            return kv_retention(q, K, V, D, vis, scores="exact", **kw)
        (fq, _), (fk, sk) = self._features(q), self._features(K)
        return kv_retention(fq, fk, V, D, vis, scores="features", k_log_scale=sk, **kw)

    def extra_repr(self) -> str:
        """The options that matter for this kernel and α mode (the SOE size for ``soe``, the rate for ``exp``, the
        count for ``mixture``; α when fixed, δ and the entity flags when routed)."""
        parts = [f"kernel={self.kernel!r}"]
        if self.kernel == "soe":
            parts.append(f"n_soe={self.n_soe}, horizon={self.horizon}")
        elif self.kernel == "exp":
            parts.append(f"decay_rate={self.decay_rate}")
        elif self.kernel == "mixture":
            parts.append(f"n_exp={self.n_exp}")
        parts.append(f"alpha_mode={self.alpha_mode!r}")
        if self.kernel in ("soe", "gl"):
            if self.alpha_mode == "fixed":
                parts.append(f"alpha={self.alpha}")
            else:
                parts.append(f"min_alpha={self.min_alpha}, entity={self.entity!r}")
                if self.alpha_mode == "banked":
                    parts.append(f"n_banks={self.n_banks}")
        parts.append(f"feature_map={self.feature_map!r}, local_window={self.local_window}, "
                     f"chunk_size={self.chunk_size}")
        return super().extra_repr() + ", " + ", ".join(parts)


@register(
    "vort_fixed_alpha",
    facts=dict(
        state_promise=("grows", "α = 1 channel is a running sum: grows O(t) (docs/vort.md)"),
        numerics_smoke=(8e-7, 1.5e-2, 2.2e-3),  # measured 2.6e-7, 4.9e-3, 7.3e-4
        numerics_full=((8.5e-07, 9.5e-07), (1.4e-02, 1.4e-02), (1.9e-03, 2.0e-03)),
    ),
    description="power-law (GL) keyed retention via SOE, one global α = 0.7 (VORT Tables 1–2)",
    alpha_mode="fixed", alpha=0.7, local_window=0,
)
class VORTFixedAlpha(VORT):
    """The paper's 'Power-Law' model: VORT retrieval with one fixed global α (no routing, no local attention)."""

    contract_configs: ClassVar[list[dict]] = [
        {"chunk_size": 8, "n_soe": 6, "horizon": 64, "n_features": 8},
        {"kernel": "gl", "feature_map": "exact", "strict_causal": True},
    ]

    def __init__(self, d_model: int, *, alpha_mode: str = "fixed", local_window: int = 0, **options: Any) -> None:
        # the name's defaults as the class's own (the class built without the registry was a routed VORT), and a
        # routed α refused: "continuous" or "banked" would make this the vort mixer under another name
        if alpha_mode != "fixed":
            raise ValueError(f"{type(self).__name__}: one fixed global α is this layer (alpha_mode='fixed'), got "
                             f"alpha_mode={alpha_mode!r}; the vort mixer routes α per token")
        super().__init__(d_model, alpha_mode=alpha_mode, local_window=local_window, **options)


@register(
    "exp_decay",
    facts=dict(
        state_promise=("bounded", "single exponential decay < 1 (geometric sum)"),
        numerics_smoke=(8e-7, 1.5e-2, 2.1e-3),  # measured 2.6e-7, 4.9e-3, 6.9e-4 (float32 retention since #10 §2)
        numerics_full=((8.3e-07, 8.3e-07), (1.4e-02, 1.4e-02), (2.0e-03, 1.9e-03)),
    ),
    description="keyed retention with one fixed exponential decay e^{-λj} (VORT 'Exponential')",
    kernel="exp", alpha_mode="fixed", local_window=0,
)
class ExpDecay(VORT):
    """The paper's 'Exponential' baseline: the same retrieval with one fixed decay rate λ = decay_rate."""

    contract_configs: ClassVar[list[dict]] = [
        {"chunk_size": 8, "feature_map": "elu", "decay_rate": 0.05},
        {"chunk_size": 8, "n_features": 8, "normalizer": "plain", "local_window": 4},
    ]

    def __init__(self, d_model: int, *, kernel: str = "exp", alpha_mode: str = "fixed", local_window: int = 0,
                 **options: Any) -> None:  # the name's defaults as the class's own
        super().__init__(d_model, kernel=kernel, alpha_mode=alpha_mode, local_window=local_window, **options)


@register(
    "exp_mixture",
    facts=dict(
        state_promise=("bounded", "mixture of exponential decays < 1"),
        numerics_smoke=(8e-7, 1.5e-2, 2.1e-3),  # measured 2.6e-7, 5.0e-3, 6.9e-4
        numerics_full=((1.1e-06, 1.1e-06), (1.4e-02, 1.4e-02), (2.2e-03, 2.2e-03)),
    ),
    description="keyed retention with a learned mixture of exponentials (VORT 'Mixture-5')",
    kernel="mixture", alpha_mode="fixed", local_window=0,
)
class ExpMixture(VORT):
    """The paper's 'Mixture-5' baseline: Σ_m π_m e^{−λ_m j}, π_m = softplus(θ_m), λ_m = exp(η_m), learned."""

    contract_configs: ClassVar[list[dict]] = [
        {"chunk_size": 8, "n_features": 8, "horizon": 64},
        {"chunk_size": 8, "feature_map": "elu", "mixture_init": "fit", "horizon": 64},
    ]

    def __init__(self, d_model: int, *, kernel: str = "mixture", alpha_mode: str = "fixed", local_window: int = 0,
                 **options: Any) -> None:  # the name's defaults as the class's own
        super().__init__(d_model, kernel=kernel, alpha_mode=alpha_mode, local_window=local_window, **options)
