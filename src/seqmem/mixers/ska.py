"""Spectral Koopman Attention (SKA) mixer from Echo (Sridhar & Johansen 2026), on the seqmem mixer contract.

Per head: rank-``r`` key/query projections (orthogonal init), values of width ``P = d_model / n_heads``, the
chunk-causal statistics and whitened Koopman readout of :func:`seqmem.ops.spectral_koopman_attention`, a
learnable
output scale ``η`` (init 1.5, §3.2.3) and a zero-initialised output projection (App. F: SKA starts as a
no-op).
``γ ∈ [1, 1.5]`` (eq. 12) is parametrised ``γ = 1 + 0.5·sigmoid(ρ)`` (the paper gives no parametrisation).

The state holds the committed statistics, the previous key, the normalisation state and the pending sums of
the
current partial chunk plus a position counter, so streaming and token-by-token decoding reproduce the training
forward exactly (the paper's per-token inclusive decoder of §3.5 does not; notes/echo.md §7.6).
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from torch import Tensor, nn

from seqmem.mixers.base import Mixer, State, check_choice, check_positive_int
from seqmem.ops.ska_ops import NORMS, OPERATOR_FORMS, STATE_KEYS, spectral_koopman_attention
from seqmem.registry import register


@register("ska")
class SKAMixer(Mixer):
    """Spectral Koopman Attention (Echo): chunk-causal ridge/Koopman retrieval from constant-size
    statistics."""

    # The paper's sequence-max normalisation (norm="seqmax") is deliberately NOT in the contract configs: it
    # divides
    # every key by a maximum over the whole input, so outputs depend on future tokens (not causal) and a split
    # sequence differs from the full forward (the max is frozen at the first piece). See
    # tests/ops/test_ska.py for
    # the test that demonstrates the leak.
    contract_configs: ClassVar[list[dict]] = [
        {"rank": 4, "chunk_size": 8},
        {"rank": 3, "chunk_size": 5, "power": 0},
        {"rank": 4, "chunk_size": 8, "norm": "none", "power": 1, "operator_form": "unwhitened"},
    ]

    def __init__(
        self,
        d_model: int,
        n_heads: int = 4,
        impl: str = "fast",
        rank: int = 24,
        chunk_size: int = 64,
        power: int = 2,
        eps: float = 1e-3,
        norm: str = "prefix_max",
        eta_init: float = 1.5,
        gamma_init: float = 1.0,
        spec_iters: int = 6,
        operator_form: str = "whitened",
    ) -> None:
        super().__init__(d_model, n_heads, impl)
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        self.rank = check_positive_int("rank", rank)
        self.chunk_size = check_positive_int("chunk_size", chunk_size)
        if isinstance(power, bool) or not isinstance(power, int) or power < 0:
            raise ValueError(f"power (K) must be a non-negative integer, got {power!r}")
        self.power = power
        if not (isinstance(eps, (int, float)) and eps > 0):
            raise ValueError(f"eps must be a positive number, got {eps!r}")
        self.eps = float(eps)
        self.norm = check_choice("norm", norm, NORMS)
        self.operator_form = check_choice("operator_form", operator_form, OPERATOR_FORMS)
        self.spec_iters = check_positive_int("spec_iters", spec_iters)
        if not (1.0 <= gamma_init < 1.5):
            raise ValueError(f"gamma_init must lie in [1, 1.5), got {gamma_init!r}")
        self.head_dim = d_model // n_heads
        H, r, P = n_heads, rank, self.head_dim
        self.w_k = nn.Linear(d_model, H * r, bias=False)
        self.w_q = nn.Linear(d_model, H * r, bias=False)
        self.w_v = nn.Linear(d_model, H * P, bias=False)
        self.w_o = nn.Linear(H * P, d_model, bias=False)
        nn.init.orthogonal_(self.w_k.weight)
        nn.init.orthogonal_(self.w_q.weight)
        nn.init.xavier_uniform_(self.w_v.weight)
        nn.init.zeros_(self.w_o.weight)
        self.eta = nn.Parameter(torch.tensor(float(eta_init)))
        # gamma = 1 + 0.5 sigmoid(rho); gamma_init = 1 maps to rho = -6 (gamma ≈ 1.0012)
        g = min(max((gamma_init - 1.0) / 0.5, 2.5e-3), 1 - 1e-6)
        self.gamma_raw = nn.Parameter(torch.tensor(math.log(g / (1 - g))))

    @property
    def gamma(self) -> Tensor:
        """``γ = 1 + 0.5·sigmoid(ρ) ∈ (1, 1.5)`` (eq. 12)."""
        return 1.0 + 0.5 * torch.sigmoid(self.gamma_raw)

    def state_keys(self) -> set[str]:
        return set(STATE_KEYS)

    def state_size(self, seq_len: int) -> int:
        """Per head: committed ``G, M`` (2r²), ``C_v`` (Pr), previous key (r), norm (1) — the paper's
        ``2r² + Pr + r + 1`` — plus the pending partial-chunk sums (2r² + Pr + 1); plus one position
        counter."""
        r, P = self.rank, self.head_dim
        return self.n_heads * (4 * r * r + 2 * P * r + r + 2) + 1

    def _forward(self, x: Tensor, state: State | None) -> tuple[Tensor, State]:
        B, T, _ = x.shape
        H, r, P = self.n_heads, self.rank, self.head_dim
        k = self.w_k(x).view(B, T, H, r)
        q = self.w_q(x).view(B, T, H, r)
        v = self.w_v(x).view(B, T, H, P)
        o, new_state = spectral_koopman_attention(
            q,
            k,
            v,
            chunk_size=self.chunk_size,
            power=self.power,
            eps=self.eps,
            gamma=self.gamma,
            eta=1.0,
            norm=self.norm,
            spec_iters=self.spec_iters,
            operator_form=self.operator_form,
            initial_state=state,
            mode="recurrent" if self.impl == "reference" else "chunk",
        )
        y = self.w_o((self.eta * o.reshape(B, T, H * P)).to(x.dtype))
        return y, new_state

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, rank={self.rank}, chunk_size={self.chunk_size}, K={self.power}, "
            f"norm={self.norm!r}, operator_form={self.operator_form!r}"
        )
