"""The Mamba-2 block (Dao & Gu, 2024, "Transformers are SSMs", Fig. 6 / ``mamba_ssm.modules.mamba2_simple``).

``in_proj(x) -> [z, xBC, dt]``; ``xBC = silu(causal_depthwise_conv1d(xBC))`` (kernel ``d_conv``);
``x, B, C = split(xBC)`` (one group: ``B, C`` shared by all heads); ``dt = softplus(dt + dt_bias)``;
``A = -exp(A_log)``; ``y = SSD(x, dt, A, B, C) + D * x`` (:func:`seqmem.ops.ssd`, ``impl="reference"`` ->
``mode="recurrent"``, ``impl="fast"`` -> ``mode="chunk"``); ``y = RMSNorm(y * silu(z))``; ``out_proj(y)``.
State: ``"conv"`` ``(batch, d_conv - 1, d_inner + 2 d_state)`` (the conv's last inputs) and ``"ssm"``
``(batch, heads, headdim, d_state)``.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqmem.mixers._conv import ShortConv
from seqmem.mixers._norm import GatedRMSNorm
from seqmem.mixers.base import Mixer, State, check_positive_float, check_positive_int
from seqmem.mixers.linear_family import init_dt_bias
from seqmem.ops import ssd
from seqmem.registry import register

__all__ = ["Mamba2"]


@register(
    "mamba2",
    facts=dict(
        state_promise=("bounded", "decay exp(Δ·A) < 1 per step"),
        numerics_smoke=(7e-7, 1.7e-2, 2.4e-3),  # measured 2.2e-7, 5.7e-3, 7.9e-4
        numerics_full=((6.5e-07, 6.5e-07), (1.7e-02, 1.7e-02), (2.4e-03, 2.4e-03)),
    ),
    description="Mamba-2 block: in-proj, causal conv, SSD, D skip, gated RMSNorm, out-proj")
class Mamba2(Mixer):
    """Mamba-2 block with SSD (state-space duality); heads = ``n_heads`` unless ``headdim`` is given."""

    single_token_impl: ClassVar[str] = "reference"  # decode step: the per-token form is cheaper at T = 1

    contract_configs: ClassVar[list[dict]] = [
        {"d_state": 8, "chunk_size": 8},
        {"d_state": 4, "chunk_size": 8, "headdim": 8, "d_conv": 2, "expand": 1},
    ]
    # norm_eps > 0: the gated RMSNorm divides y·silu(z) by its RMS, and a row that is exactly zero is 0/0 = NaN
    # with eps = 0 (an all-zero input does it)
    option_domains: ClassVar[dict[str, str]] = {
        "d_state": ">0", "expand": ">0", "headdim": ">0", "d_conv": ">0", "chunk_size": ">0", "norm_eps": ">0",
    }

    def __init__(
        self,
        d_model: int,
        n_heads: int = 4,
        impl: str = "fast",
        d_state: int = 64,
        expand: int = 2,
        headdim: int | None = None,
        d_conv: int = 4,
        chunk_size: int = 64,
        norm_eps: float = 1e-5,
    ) -> None:
        super().__init__(d_model, n_heads, impl)
        self.d_state = check_positive_int("d_state", d_state)
        self.expand = check_positive_int("expand", expand)
        self.d_conv = check_positive_int("d_conv", d_conv)
        self.chunk_size = check_positive_int("chunk_size", chunk_size)
        self.d_inner = expand * d_model
        if headdim is None:
            if self.d_inner % n_heads:
                raise ValueError(f"expand * d_model = {self.d_inner} must be divisible by n_heads={n_heads}")
            self.headdim = self.d_inner // n_heads
        else:
            self.headdim = check_positive_int("headdim", headdim)
            if self.d_inner % self.headdim:
                raise ValueError(f"expand * d_model = {self.d_inner} must be divisible by headdim={headdim}")
            self.n_heads = self.d_inner // self.headdim  # headdim, when given, sets the number of heads
        h = self.n_heads
        self.conv_dim = self.d_inner + 2 * self.d_state
        self.in_proj = nn.Linear(d_model, 2 * self.d_inner + 2 * self.d_state + h, bias=False)
        self.conv = ShortConv(self.conv_dim, d_conv, bias=True)
        self.dt_bias = nn.Parameter(init_dt_bias(h))
        self.A_log = nn.Parameter(torch.log(torch.empty(h).uniform_(1.0, 16.0)))
        self.D = nn.Parameter(torch.ones(h))
        self.norm = GatedRMSNorm(
            self.d_inner, check_positive_float("norm_eps", norm_eps), norm_before_gate=False
        )
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=False)

    def state_keys(self) -> set[str]:
        return {"conv", "ssm"}

    def state_size(self, seq_len: int) -> int:
        return self.conv.cache_size() + self.n_heads * self.headdim * self.d_state

    def _forward(self, x: Tensor, state: State | None) -> tuple[Tensor, State]:
        b, t, _ = x.shape
        h, p, n = self.n_heads, self.headdim, self.d_state
        z, xBC, dt = torch.split(self.in_proj(x), [self.d_inner, self.conv_dim, h], dim=-1)
        xBC, conv_cache = self.conv(xBC, None if state is None else state["conv"])
        xBC = F.silu(xBC)
        xs, Bm, Cm = torch.split(xBC, [self.d_inner, n, n], dim=-1)
        xs = xs.reshape(b, t, h, p)
        dt = F.softplus(dt + self.dt_bias)  # (b, t, h)
        A = -torch.exp(self.A_log)
        Bm = Bm[:, :, None, :].expand(b, t, h, n)
        Cm = Cm[:, :, None, :].expand(b, t, h, n)
        mode = self._op_mode()
        y, st = ssd(
            xs, dt, A, Bm, Cm,
            initial_state=None if state is None else {"S": state["ssm"]}, mode=mode, chunk_size=self.chunk_size,
        )
        ssm = st["S"]
        y = y + self.D[:, None] * xs
        y = self.norm(y.reshape(b, t, self.d_inner), z)
        return self.out_proj(y), {"conv": conv_cache, "ssm": ssm}

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, d_state={self.d_state}, expand={self.expand}, headdim={self.headdim}, "
            f"d_conv={self.d_conv}, chunk_size={self.chunk_size}"
        )
