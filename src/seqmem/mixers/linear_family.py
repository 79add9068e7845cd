"""Linear-attention-family baselines: ``linear_attention``, ``deltanet``, ``gated_deltanet``.

All three project ``x`` to per-head ``q, k, v``, optionally pass them through a short causal depthwise
convolution (``conv_size``, None or 0 = off; the Based / zoology / flash-linear-attention recipe, followed by
SiLU), run a matrix-valued recurrence from :mod:`seqmem.ops` (``impl="reference"`` -> ``mode="recurrent"``,
``impl="fast"`` -> ``mode="chunk"``) and project back.  State: ``"S"`` ``(batch, heads, d_k, d_v)``;
``"conv"`` ``(batch, conv_size - 1, 3 * d_model)`` when the convolution is on (its last inputs, so streaming
is exact); ``"z"`` ``(batch, heads, d_k)`` (sum of feature-mapped keys) for ``linear_attention`` with
``normalize=True``.

* ``linear_attention`` (Katharopoulos et al., 2020): feature map ``"identity"`` or ``"elu1"`` (ELU + 1) on
  ``q, k``; optional normaliser ``o_t = phi(q_t)^T S_t / (phi(q_t) . z_t + eps)``,
  ``z_t = sum_{i<=t} phi(k_i)``.
* ``deltanet`` (Schlag et al., 2021; Yang et al., 2024): SiLU then L2-normalised ``q, k``; ``beta = sigmoid``
  of a per-head projection; per-head RMSNorm on the output (as flash-linear-attention's ``DeltaNet``).
* ``gated_deltanet`` (Yang et al., 2025, "Gated Delta Networks"): as DeltaNet plus the log decay
  ``g = -exp(A_log) * softplus(W_a x + dt_bias)`` (Mamba-2 style) and an output gate
  ``RMSNorm(o) * silu(W_g x)``.  ``rule="lattice"`` keeps this block and runs Lattice-DEC's update instead
  (:class:`GatedDeltaNet`).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqmem.mixers._conv import ShortConv
from seqmem.mixers._norm import GatedRMSNorm, RMSNorm
from seqmem.mixers.base import Mixer, State, check_choice, check_positive_float, check_positive_int
from seqmem.ops import delta_rule, gated_delta_rule, linear_attention
from seqmem.ops._common import compute_dtype, full_precision
from seqmem.ops.lattice import lattice_scan, orthonormal_slots
from seqmem.registry import register

__all__ = ["DeltaNet", "GatedDeltaNet", "LinearAttention"]


def _inv_softplus(x: Tensor) -> Tensor:
    return x + torch.log(-torch.expm1(-x))


def init_dt_bias(n: int, dt_min: float = 1e-3, dt_max: float = 0.1, floor: float = 1e-4) -> Tensor:
    """Mamba-2 initialisation: ``softplus(dt_bias)`` log-uniform in ``[dt_min, dt_max]``."""
    dt = torch.exp(torch.rand(n) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)).clamp_min(floor)
    return _inv_softplus(dt)


class _LinearFamily(Mixer):
    """Shared plumbing: fused q/k/v projection, optional short conv with cached inputs, output projection."""

    single_token_impl: ClassVar[str] = "reference"  # decode step: the per-token form is cheaper at T = 1

    contract_configs: ClassVar[list[dict]] = [{"chunk_size": 8}, {"chunk_size": 8, "conv_size": None}]
    # conv_size None or 0: no convolution (0 is how a TOML spec, which has no null, says it)
    option_domains: ClassVar[dict[str, str]] = {"conv_size": ">=0", "chunk_size": ">0"}

    def __init__(
        self,
        d_model: int,
        n_heads: int = 4,
        impl: str = "fast",
        conv_size: int | None = 4,
        chunk_size: int = 64,
    ) -> None:
        super().__init__(d_model, n_heads, impl)
        self.head_dim = self._head_dim()
        self.conv_size = None if conv_size in (None, 0) else check_positive_int("conv_size", conv_size)
        self.chunk_size = check_positive_int("chunk_size", chunk_size)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.conv = ShortConv(3 * d_model, self.conv_size) if self.conv_size is not None else None
        self.out = nn.Linear(d_model, d_model, bias=False)

    @classmethod
    def canonical_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """``conv_size`` 0 and None are both "no convolution"."""
        out = dict(options)
        if out.get("conv_size") == 0:
            out["conv_size"] = None
        return out

    @property
    def mode(self) -> str:
        """The op's ``mode`` for this ``impl`` (:meth:`Mixer._op_mode`)."""
        return self._op_mode()

    def _core_keys(self) -> set[str]:
        return {"S"}

    def state_keys(self) -> set[str]:
        return self._core_keys() | ({"conv"} if self.conv is not None else set())

    def state_size(self, seq_len: int) -> int:
        n = self.n_heads * self.head_dim * self.head_dim
        if self.conv is not None:
            n += self.conv.cache_size()
        return n

    def _qkv(self, x: Tensor, state: State | None, new: State) -> tuple[Tensor, Tensor, Tensor]:
        """Projected (and convolved) q, k, v of shape ``(batch, time, heads, head_dim)``."""
        u = self.qkv(x)
        if self.conv is not None:
            u, new["conv"] = self.conv(u, None if state is None else state["conv"])
            u = self._conv_act(u)
        else:
            u = self._no_conv_act(u)
        b, t, _ = x.shape
        q, k, v = u.view(b, t, 3, self.n_heads, self.head_dim).unbind(2)
        return q, k, v

    def _conv_act(self, u: Tensor) -> Tensor:
        return F.silu(u)

    def _no_conv_act(self, u: Tensor) -> Tensor:
        return u

    def _initial_S(self, state: State | None) -> Tensor | None:
        return None if state is None else state["S"]

    def _op_state(self, state: State | None) -> dict[str, Tensor] | None:
        """The op's ``initial_state``: the memory ``{"S": S}`` of this mixer's state."""
        return None if state is None else {"S": state["S"]}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, conv_size={self.conv_size}, chunk_size={self.chunk_size}"


@register(
    "linear_attention",
    facts=dict(
        state_promise=("grows", "undecayed sum S = Σ φ(k) vᵀ (≈√T for zero-mean v, ≈T otherwise)"),
        numerics_smoke=(4e-7, 1.5e-2, 1.5e-3),  # measured 1.3e-7, 4.4e-3, 4.2e-4
        numerics_full=((3.9e-07, 3.9e-07), (9.7e-03, 9.4e-03), (1.1e-03, 1.1e-03)),
    ),
    description="causal linear attention (identity/elu+1, opt. normaliser)")
class LinearAttention(_LinearFamily):
    """Causal linear attention (Katharopoulos et al., 2020) with an optional short convolution.

    The family's options (``n_heads``, ``impl``, ``conv_size``, ``chunk_size``) pass through (keyword-only).
    """

    contract_configs: ClassVar[list[dict]] = [
        {"chunk_size": 8},
        {"chunk_size": 8, "conv_size": None, "feature_map": "identity"},
        {"chunk_size": 8, "feature_map": "elu1", "normalize": True},
        {"chunk_size": 8, "conv_size": None, "feature_map": "elu1", "normalize": True},
    ]
    # eps = 0 is the exact normaliser of the paper (elu1 features are positive, so φ(q)·z > 0)
    option_domains: ClassVar[dict[str, str]] = {"eps": ">=0"}

    def __init__(
        self, d_model: int, *, feature_map: str = "elu1", normalize: bool = False, eps: float = 1e-6,
        **family_options: Any,
    ) -> None:
        super().__init__(d_model, **family_options)
        self.feature_map = check_choice("feature_map", feature_map, ("identity", "elu1"))
        self.normalize = check_choice("normalize", normalize, (True, False))
        self.eps = check_positive_float("eps", eps, allow_zero=True)

    def _core_keys(self) -> set[str]:
        return {"S", "z"} if self.normalize else {"S"}

    def state_size(self, seq_len: int) -> int:
        return super().state_size(seq_len) + (self.n_heads * self.head_dim if self.normalize else 0)

    def _phi(self, x: Tensor) -> Tensor:
        return F.elu(x) + 1.0 if self.feature_map == "elu1" else x

    def _forward(self, x: Tensor, state: State | None) -> tuple[Tensor, State]:
        new: State = {}
        q, k, v = self._qkv(x, state, new)
        q, k = self._phi(q), self._phi(k)
        S0 = self._initial_S(state)
        if self.normalize:
            # the normaliser rides along as an extra value column of ones: S_aug = [S, z]
            v = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
            if S0 is not None:
                S0 = torch.cat([S0, state["z"].unsqueeze(-1)], dim=-1)
        # the op computes (and returns the state) in float32 for half inputs; asking for the output in the compute
        # dtype too keeps the undecayed sums' readout (o ~ t, the normaliser φ(q)·z ~ t) out of float16's range
        cd = compute_dtype(x)
        o, st = linear_attention(q, k, v.to(cd), initial_state=None if S0 is None else {"S": S0}, mode=self.mode,
                                 chunk_size=self.chunk_size)  # fmt: skip
        S = st["S"]
        if self.normalize:
            o = o[..., :-1] / (o[..., -1:] + self.eps)
            new["S"], new["z"] = S[..., :-1].contiguous(), S[..., -1].contiguous()
        else:
            new["S"] = S
        b, t, _ = x.shape
        o = o.reshape(b, t, self.d_model)
        w = self.out.weight
        amp = torch.is_autocast_enabled(x.device.type)
        if o.dtype == w.dtype and not amp:
            return self.out(o), new
        # float16 / bfloat16 mixer or autocast: the read-out o (~t, an undecayed sum) leaves float16's range before
        # the projection brings y back into it (64k tokens, d_model 64: |o| > 65,504 while max |y| is 5.9e4), so
        # the projection runs in float32 and only y is rounded, to the input's (autocast) dtype
        with full_precision(x.device):
            y = F.linear(o, w.to(o.dtype))
        return y.to(torch.get_autocast_dtype(x.device.type) if amp else x.dtype), new

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, feature_map={self.feature_map!r}, normalize={self.normalize}"


@register(
    "deltanet",
    facts=dict(
        state_promise=("bounded", "delta rule with unit keys, β ∈ (0,1): ‖I − βkkᵀ‖ ≤ 1"),
        numerics_smoke=(1e-6, 3e-2, 4e-3),  # measured 3.4e-7, 1.0e-2, 1.2e-3
        numerics_full=((1.1e-06, 1.1e-06), (3.1e-02, 3.2e-02), (3.5e-03, 3.6e-03)),
    ),
    description="DeltaNet: delta rule with L2-normalised q/k, sigmoid beta, short conv")
class DeltaNet(_LinearFamily):
    """DeltaNet (Schlag et al. 2021; Yang et al. 2024).

    ``S_t = (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T``, ``o_t = S_t^T q_t / sqrt(d_k)``.
    The family's options (``n_heads``, ``impl``, ``conv_size``, ``chunk_size``) pass through (keyword-only).
    """

    # norm_eps > 0: the per-head RMSNorm divides o by its RMS, and a head's o that is exactly zero is 0/0 = NaN
    # with eps = 0 (inputs of scale 1e4 do it: SiLU saturates to exact zeros)
    option_domains: ClassVar[dict[str, str]] = {"norm_eps": ">0"}

    def __init__(self, d_model: int, *, norm_eps: float = 1e-5, **family_options: Any) -> None:
        super().__init__(d_model, **family_options)
        self.b_proj = nn.Linear(d_model, self.n_heads, bias=True)
        self.o_norm = self._make_norm(check_positive_float("norm_eps", norm_eps))

    def _make_norm(self, eps: float) -> nn.Module:
        return RMSNorm(self.head_dim, eps)

    def _no_conv_act(self, u: Tensor) -> Tensor:
        return F.silu(u)

    def _prep(self, x: Tensor, state: State | None, new: State):
        q, k, v = self._qkv(x, state, new)
        q, k = F.normalize(q, dim=-1, eps=1e-6), F.normalize(k, dim=-1, eps=1e-6)
        beta = torch.sigmoid(self.b_proj(x))
        return q, k, v, beta

    def _forward(self, x: Tensor, state: State | None) -> tuple[Tensor, State]:
        new: State = {}
        q, k, v, beta = self._prep(x, state, new)
        o, st = self._rule(x, q, k, v, beta, initial_state=self._op_state(state), mode=self.mode,
                           chunk_size=self.chunk_size)  # fmt: skip
        new["S"] = st["S"]
        b, t, _ = x.shape
        return self.out(self._norm_out(x, o).reshape(b, t, self.d_model)), new

    def _rule(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, **kw: Any) -> tuple[Tensor, State]:
        """The recurrence over the prepared ``q, k, v, beta`` (``kw``: the op's state, mode and chunk size)."""
        return delta_rule(q, k, v, beta, **kw)

    def _norm_out(self, x: Tensor, o: Tensor) -> Tensor:
        """The per-head output norm of ``o`` (batch, time, heads, head_dim)."""
        return self.o_norm(o)


@register(
    "gated_deltanet",
    facts=dict(
        state_promise=("bounded", "delta rule times a decay gate ≤ 1"),
        numerics_smoke=(9e-7, 3e-2, 4e-3),  # measured 3.0e-7, 1.0e-2, 1.3e-3
        numerics_full=((8.9e-07, 8.8e-07), (3.0e-02, 3.0e-02), (3.5e-03, 3.5e-03)),
        # measured 1.1e-2 / 7.8e-2 (bf16), 1.5e-3 / 9.3e-3 (fp16): the decay's dt_bias gradient
        numerics_amp={"bf16": (3e-2, 0.25), "fp16": (4e-3, 3e-2)},
    ),
    description="Gated DeltaNet: gated delta rule, Mamba-2 style decay, output gate")
class GatedDeltaNet(DeltaNet):
    """Gated DeltaNet (Yang et al., 2025): ``S_t = exp(g_t) (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T``.

    DeltaNet's options (``n_heads``, ``impl``, ``conv_size``, ``chunk_size``, ``norm_eps``) pass through
    (keyword-only).  ``rule`` picks the update run in this block: ``"gated_delta"`` (the default, above) or
    ``"lattice"``: Lattice-DEC's update (Karami & Mirrokni 2025, eqs. 7/13 and the sphere projection eq. 14, the
    ``lattice`` mixer's default rule, :func:`seqmem.ops.lattice_scan`) with the block's ``b_t`` as the step size
    ``γ_t``, per head ``S ∈ R^{d×d}`` started from a fixed random orthonormal ``S_0`` (a buffer, drawn as the
    ``lattice`` mixer's with seed 0), read out ``y_t = S_t q_t`` (eq. 13, no ``d^{-1/2}`` scale) into the same gated
    RMSNorm and output projection; no decay gate (Lattice-DEC has none), so ``a_proj``, ``A_log`` and ``dt_bias``
    are not built.  Its state ``"S"`` holds Lattice's slots ``(batch, heads, d, m)`` with ``m = d``.
    ``chunk_size`` is then the scan's backward recompute chunk (``impl="fast"``: ``mode="scan"``).
    """

    RULES: ClassVar[tuple[str, ...]] = ("gated_delta", "lattice")
    contract_configs: ClassVar[list[dict]] = [*_LinearFamily.contract_configs, {"chunk_size": 8, "rule": "lattice"}]

    def __init__(self, d_model: int, *, rule: str = "gated_delta", **deltanet_options: Any) -> None:
        super().__init__(d_model, **deltanet_options)
        self.rule = check_choice("rule", rule, self.RULES)
        if rule == "gated_delta":
            self.a_proj = nn.Linear(d_model, self.n_heads, bias=False)
            self.A_log = nn.Parameter(torch.log(torch.empty(self.n_heads).uniform_(1e-3, 16)))
            self.dt_bias = nn.Parameter(init_dt_bias(self.n_heads))
        else:
            H, d = self.n_heads, self.head_dim
            self.register_buffer("S0", orthonormal_slots(H, d, d, generator=torch.Generator().manual_seed(0)))
        self.g_proj = nn.Linear(d_model, d_model, bias=False)

    def _make_norm(self, eps: float) -> nn.Module:
        return GatedRMSNorm(self.head_dim, eps, norm_before_gate=True)

    def _rule(self, x: Tensor, q: Tensor, k: Tensor, v: Tensor, beta: Tensor, **kw: Any) -> tuple[Tensor, State]:
        if self.rule == "lattice":  # Lattice-DEC: S ← colnormalize(S − γ_t (e_t k_tᵀ − S diag((Sᵀe_t) ⊙ k_t)))
            S = kw["initial_state"]
            if S is None:
                S = {"S": self.S0.to(dtype=v.dtype).unsqueeze(0).expand(v.shape[0], *self.S0.shape)}
            mode = "recurrent" if self.impl == "reference" else "scan"
            return lattice_scan(q, k, v, beta, S, objective="dec", normalize=True, mode=mode,
                                chunk_size=kw["chunk_size"])  # fmt: skip
        # log decay (batch, time, heads), Gated DeltaNet / Mamba-2 parametrisation
        g = -torch.exp(self.A_log) * F.softplus(self.a_proj(x) + self.dt_bias)
        return gated_delta_rule(q, k, v, beta=beta, g=g, **kw)

    def _norm_out(self, x: Tensor, o: Tensor) -> Tensor:
        b, t, _ = x.shape
        return self.o_norm(o, self.g_proj(x).view(b, t, self.n_heads, self.head_dim))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rule={self.rule!r}"
