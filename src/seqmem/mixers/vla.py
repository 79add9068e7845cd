"""VLA — Variational Linear Attention (arXiv:2605.11196) and the paper's own "DeltaNet" baseline (eq. 4).

``vla``: Algorithm 1 per head (ELU+1 features, unit read key k̂, penalty direction
u = L2norm(W_u k_raw)/√d_h, Sherman–Morrison inverse-penalty A (A₀ = I/λ0, λ0 = 0.1), +ηI refresh every
20 tokens counted from the sequence start, unit write direction α̂ = A k̂/‖A k̂‖, residual write
S ← S + (v − S k̂) α̂ᵀ, readout S φ(q)/max(φ(q)ᵀz, ε)), then the concatenated heads go through an output
projection.  Variants: ``vla_v2`` (unnormalised write α = A k̂), ``vla_fixed_a`` (the "A_t = 10 I fixed"
ablation; no A in the state).  ``vla_paper_deltanet``: eq. (4) of the paper,
``S_t = β_t S_{t-1} + (v_t − S_{t-1} k̂_t) k̂_tᵀ`` with a per-token decay β_t = σ(w_βᵀx_t + b)
(NOT canonical DeltaNet, which is registered as ``deltanet`` by Core).

impl="reference" runs the literal per-token loop; impl="fast" the exact chunked form (seqmem.ops.vla_ops).
State: S (H, d_h, d_h), A (H, d_h, d_h), z (H, d_h) and the position counter (the refresh is periodic in it).
float16 / bfloat16 inputs: the ops compute and keep the state in float32 (no half-precision CPU Cholesky /
triangular solve; z ~ t passes float16's range), the output comes back in the input's (autocast) dtype.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import Tensor, nn

from seqmem.mixers.base import Mixer, State, check_choice, check_positive_float, check_positive_int
from seqmem.ops.vla.chunk import NORMALIZERS, vla_attention, vla_paper_delta_rule
from seqmem.registry import register


def _drop_unused_w_u(module: nn.Module, state_dict: dict, prefix: str, *args: object) -> None:
    """Load a state dict saved when a fixed-A layer still had its unused ``w_u``: the key is dropped."""
    state_dict.pop(prefix + "w_u", None)


class _HeadProjections(Mixer):
    """q/k/v/o projections shared by the VLA family."""

    single_token_impl: ClassVar[str] = "reference"  # decode step: the per-token form is cheaper at T = 1

    option_domains: ClassVar[dict[str, str]] = {"chunk_size": ">0"}

    def __init__(self, d_model: int, n_heads: int, impl: str, chunk_size: int, bias: bool) -> None:
        super().__init__(d_model, n_heads, impl)
        self.head_dim = self._head_dim()
        self.chunk_size = check_positive_int("chunk_size", chunk_size)
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.o_proj = nn.Linear(d_model, d_model, bias=bias)

    def _qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        b, t, _ = x.shape
        shape = (b, t, self.n_heads, self.head_dim)
        return self.q_proj(x).view(shape), self.k_proj(x).view(shape), self.v_proj(x).view(shape)


@register(
    "vla",
    facts=dict(
        state_promise=("grows", "Prop. 1 claims a plateau of ‖S‖ (a heuristic argument, not a proof); "
                                "z = Σ k̂ grows O(T)"),
        numerics_smoke=(8e-7, 1.5e-2, 1.7e-3),  # measured 2.5e-7, 5.0e-3, 5.5e-4 (float32 solves since #10 §2)
        # fp16 last 4k: the output is ~1e-6 there, float16's subnormal range
        numerics_full=((7.3e-07, 6.1e-06), (1.5e-02, 1.6e-02), (1.7e-03, 4.6e-02)),
    ),
    description="Variational Linear Attention (Algorithm 1; exact chunked fast form)")
class VLA(_HeadProjections):
    """Variational Linear Attention, Algorithm 1 of Pandey & Singh (2026), with options for its ablations."""

    contract_configs: ClassVar[list[dict]] = [
        {"chunk_size": 8},
        {"chunk_size": 5, "refresh_period": 7, "refresh_eta": 0.05},
        {"chunk_size": 16, "u_scale": 1.0, "normalizer": "none", "refresh_period": 3},
    ]
    # λ0 > 0 (A₀ = I/λ0); u_scale None = 1/√d_h; refresh_period 0 or None = no refresh; refresh_eta = 0 refreshes
    # by nothing; eps > 0 is the readout's floor max(φ(q)ᵀz, ε)
    option_domains: ClassVar[dict[str, str]] = {
        "lam0": ">0", "u_scale": ">0", "refresh_period": ">=0", "refresh_eta": ">=0", "eps": ">0",
    }

    def __init__(
        self,
        d_model: int,
        n_heads: int = 4,
        impl: str = "fast",
        lam0: float = 0.1,
        u_scale: float | None = None,
        refresh_period: int | None = 20,
        refresh_eta: float = 1e-3,
        eps: float = 1e-4,
        normalizer: str = "paper",
        normalize_key: bool = True,
        normalize_alpha: bool = True,
        fixed_A: bool = False,
        chunk_size: int = 20,
        bias: bool = False,
    ) -> None:
        super().__init__(d_model, n_heads, impl, chunk_size, bias)
        self.lam0 = check_positive_float("lam0", lam0)
        self.u_scale = None if u_scale is None else check_positive_float("u_scale", u_scale)
        if refresh_period is not None:
            if refresh_period != 0:
                check_positive_int("refresh_period", refresh_period)
            refresh_period = refresh_period or None
        self.refresh_period = refresh_period
        self.refresh_eta = check_positive_float("refresh_eta", refresh_eta, allow_zero=True)
        self.eps = check_positive_float("eps", eps)
        self.normalizer = check_choice("normalizer", normalizer, NORMALIZERS)
        flags = (("normalize_key", normalize_key), ("normalize_alpha", normalize_alpha), ("fixed_A", fixed_A))
        for name, val in flags:
            if not isinstance(val, bool):
                raise ValueError(f"{name} must be a bool, got {val!r}")
        self.normalize_key, self.normalize_alpha, self.fixed_A = normalize_key, normalize_alpha, fixed_A
        dh = self.head_dim
        # W_u: per-head map of the raw key to the penalty direction (f_θ of eq. 8); nn.Linear-style init.  Drawn
        # with fixed_A too, which never reads it (no Sherman-Morrison step), and then dropped: the random draws of
        # construction stay those of every earlier build, so the other parameters initialise as they did
        w_u = torch.empty(n_heads, dh, dh).uniform_(-(dh**-0.5), dh**-0.5)
        if fixed_A:
            self.register_parameter("w_u", None)  # no parameter without a gradient (plain DDP refuses one)
            self.register_load_state_dict_pre_hook(_drop_unused_w_u)
        else:
            self.w_u = nn.Parameter(w_u)

    def state_keys(self) -> set[str]:
        keys = {"S", "pos"}
        if not self.fixed_A:
            keys.add("A")
        if self.normalizer == "paper":
            keys.add("z")
        return keys

    def state_size(self, seq_len: int) -> int:
        h, dh = self.n_heads, self.head_dim
        n = h * dh * dh + 1
        if not self.fixed_A:
            n += h * dh * dh
        if self.normalizer == "paper":
            n += h * dh
        return n

    def _forward(self, x: Tensor, state: State | None) -> tuple[Tensor, State]:
        b, t, _ = x.shape
        q, k, v = self._qkv(x)
        o, new_state = vla_attention(
            q, k, v, self.w_u,
            lam0=self.lam0, u_scale=self.u_scale, refresh_period=self.refresh_period,
            refresh_eta=self.refresh_eta,
            eps=self.eps, normalizer=self.normalizer, normalize_key=self.normalize_key,
            normalize_alpha=self.normalize_alpha, fixed_A=self.fixed_A, initial_state=state, mode=self._op_mode(),
            chunk_size=self.chunk_size,
        )  # fmt: skip
        return self.o_proj(o.reshape(b, t, self.d_model)), new_state

    def extra_repr(self) -> str:
        return (
            super().extra_repr()
            + f", lam0={self.lam0}, refresh={self.refresh_period}/{self.refresh_eta}"
            + f", normalizer={self.normalizer!r}, normalize_alpha={self.normalize_alpha}"
            + f", fixed_A={self.fixed_A}, chunk_size={self.chunk_size}"
        )


@register(
    "vla_v2",
    facts=dict(
        state_promise=("grows", "unnormalised write α = A k̂: explodes at λ0 = 0.1 by design (Table 2, docs/vla.md)"),
        numerics_smoke=("nonfinite", "nonfinite", "nonfinite"),  # explodes by design (float64 reaches ~1e94 here)
        numerics_full=("nonfinite", "nonfinite", "nonfinite"),
    ),
    normalize_alpha=False, description="VLAv2-style ablation: unnormalised write α = A k̂")
class VLAv2(VLA):
    """VLA with the unnormalised write direction α_t = A_t k̂_t (the paper's VLAv2 is never defined; this
    is our reading).  With λ0 = 0.1 the first writes are ≈ 10·k̂ and the state explodes — the paper's
    point; the contract tests use λ0 = 1 so the transitions stay contractive."""

    contract_configs: ClassVar[list[dict]] = [{"chunk_size": 8, "lam0": 1.0}]


@register(
    "vla_fixed_a",
    facts=dict(
        state_promise=("grows", "as vla without A; z = Σ k̂ grows O(T)"),
        numerics_smoke=(8e-7, 1.5e-2, 1.7e-3),  # measured 2.6e-7, 5.0e-3, 5.4e-4
        numerics_full=((6.5e-07, 1.1e-06), (1.5e-02, 1.6e-02), (1.6e-03, 3.9e-02)),
    ),
    fixed_A=True, description="VLA ablation, A_t = I/λ0 fixed (β=1 delta rule)")
class VLAFixedA(VLA):
    """The "A_t = 10 I fixed" ablation (Table 4): no Sherman–Morrison update, α̂ = k̂, i.e. a β = 1 delta
    rule with unit ELU+1 keys and the linear-attention readout normaliser."""

    contract_configs: ClassVar[list[dict]] = [{"chunk_size": 8}]


@register(
    "vla_paper_deltanet",
    facts=dict(
        state_promise=("grows", "S decays by β < 1 (bounded); normaliser z grows O(T)"),
        numerics_smoke=(8e-7, 1.5e-2, 1.7e-3),  # measured 2.4e-7, 4.9e-3, 5.4e-4
        numerics_full=((6.7e-07, 1.4e-06), (1.5e-02, 1.3e-02), (1.6e-03, 4.9e-02)),
    ),
    description="the VLA paper's DeltaNet, eq. (4): S = βS + (v − S k̂)k̂ᵀ")
class VLAPaperDeltaNet(_HeadProjections):
    """The VLA paper's "DeltaNet" baseline exactly as its eq. (4) defines it (decay gate on S, write rate 1).

    Details the paper leaves unstated (docs/vla.md): keys k̂ = L2norm(ELU(k)+1), β_t = σ(w_βᵀ x_t + b_β) per head,
    readout as VLA's (S φ(q) / max(φ(q)ᵀ Σφ(k), ε)).  Canonical DeltaNet (Yang et al. 2024) is the separate
    ``deltanet`` mixer.
    """

    contract_configs: ClassVar[list[dict]] = [{"chunk_size": 8}, {"chunk_size": 5, "normalizer": "none"}]
    option_domains: ClassVar[dict[str, str]] = {"eps": ">0"}

    def __init__(
        self,
        d_model: int,
        n_heads: int = 4,
        impl: str = "fast",
        eps: float = 1e-4,
        normalizer: str = "paper",
        chunk_size: int = 32,
        bias: bool = False,
    ) -> None:
        super().__init__(d_model, n_heads, impl, chunk_size, bias)
        self.eps = check_positive_float("eps", eps)
        self.normalizer = check_choice("normalizer", normalizer, NORMALIZERS)
        self.beta_proj = nn.Linear(d_model, n_heads, bias=True)

    def state_keys(self) -> set[str]:
        return {"S", "z"} if self.normalizer == "paper" else {"S"}

    def state_size(self, seq_len: int) -> int:
        h, dh = self.n_heads, self.head_dim
        return h * dh * dh + (h * dh if self.normalizer == "paper" else 0)

    def _forward(self, x: Tensor, state: State | None) -> tuple[Tensor, State]:
        b, t, _ = x.shape
        q, k, v = self._qkv(x)
        beta = torch.sigmoid(self.beta_proj(x))
        o, new_state = vla_paper_delta_rule(
            q, k, v, beta, eps=self.eps, normalizer=self.normalizer, initial_state=state, mode=self._op_mode(),
            chunk_size=self.chunk_size,
        )
        return self.o_proj(o.reshape(b, t, self.d_model)), new_state

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, eps={self.eps}, normalizer={self.normalizer!r}, "
                f"chunk_size={self.chunk_size}")
