"""The Mamba-2 block (Dao & Gu, 2024, "Transformers are SSMs", Fig. 6 / ``mamba_ssm.modules.mamba2_simple``).

``in_proj(x) -> [z, xBC, dt]``; ``xBC = silu(causal_depthwise_conv1d(xBC))`` (kernel ``d_conv``);
``x, B, C = split(xBC)`` (one group: ``B, C`` shared by all heads); ``dt = softplus(dt + dt_bias)``;
``A = -exp(A_log)``; ``y = SSD(x, dt, A, B, C) + D * x`` (:func:`seqmem.ops.ssd`, ``impl="reference"`` ->
``mode="recurrent"``, ``impl="fast"`` -> ``mode="chunk"``); ``y = RMSNorm(y * silu(z))``; ``out_proj(y)``.
State: ``"conv"`` ``(batch, d_conv - 1, d_inner + 2 d_state)`` (the conv's last inputs) and ``"ssm"``
``(batch, heads, headdim, d_state)``.

``rule="lattice"`` keeps this block and runs Lattice-DEC's update (Karami & Mirrokni 2025) in place of SSD, as
``gated_deltanet`` does with ``rule="lattice"`` (:class:`Mamba2`).
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqmem.mixers._conv import ShortConv
from seqmem.mixers._norm import GatedRMSNorm
from seqmem.mixers.base import Mixer, State, check_choice, check_positive_float, check_positive_int
from seqmem.mixers.linear_family import init_dt_bias
from seqmem.ops import ssd
from seqmem.ops.lattice import lattice_scan, orthonormal_slots
from seqmem.registry import register

__all__ = ["Mamba2"]


@register(
    "mamba2",
    facts=dict(
        state_promise=("bounded", "decay exp(Δ·A) < 1 per step"),
        numerics_smoke=(7e-7, 1.7e-2, 2.4e-3),  # measured 2.2e-7, 5.7e-3, 7.9e-4
        numerics_full=((6.5e-07, 6.5e-07), (1.7e-02, 1.7e-02), (2.4e-03, 2.4e-03)),
    ),
    description="Mamba-2 block: in-proj, causal conv, SSD (or Lattice-DEC's rule), D skip, gated RMSNorm, out-proj")
class Mamba2(Mixer):
    """Mamba-2 block with SSD (state-space duality); heads = ``n_heads`` (default 4) unless ``headdim`` is given,
    which sets them to ``expand·d_model / headdim`` (both given: they must agree, ``n_heads·headdim =
    expand·d_model``, else a ValueError).  fla's ``head_dim`` is ``headdim`` here, as in fla's Mamba2.

    ``rule`` picks the update run in this block: ``"ssd"`` (the default, the module docstring) or ``"lattice"``:
    Lattice-DEC's update (Karami & Mirrokni 2025, eqs. 7/13 and the sphere projection eq. 14, the ``lattice``
    mixer's default rule, :func:`seqmem.ops.lattice_scan`), everything else in the block unchanged (``in_proj``,
    causal conv + SiLU, ``D`` skip, gated RMSNorm, ``out_proj``).  Mapping onto the op's ``(q, k, v)`` per head:
    key ``k_t = B_t`` (``d_state`` entries, shared by all heads), query ``q_t = C_t``, value ``v_t = x_t``
    (``headdim``), as SSD pairs them (``h_t = Ā_t h_{t-1} + Δ_t x_t B_tᵀ``, ``y_t = h_t C_t``).  The op's state
    ``S (d×m)`` has the slots as columns and the key on its last axis, so ``d = headdim``, ``m = d_state`` and
    ``S`` has exactly SSD's layout ``(heads, headdim, d_state)``: slot ``i`` is the column ``S[:, i]`` that SSD's
    ``B_{t,i}`` writes, and the column normalisation (eqs. 6/14) acts over ``headdim``.  Orthonormal slots need
    ``d_state <= headdim`` (a ValueError otherwise).  ``B`` and ``C`` enter as the block makes them (SiLU of the
    conv, not L2-normalised: Mamba-2's block has no q/k normalisation, as ``gated_deltanet``'s rule takes its
    block's q/k, which that block L2-normalises).

    Step size: ``γ_t = Δ_t = softplus(dt + dt_bias)`` per head, and ``A`` (``A_log``) is not built.  In Lattice's
    reading (§3.1) SSD's update is a decay ``Ā_t = exp(Δ_t A)`` times the state plus a write of step ``Δ_t``
    (``Δ_t x_t B_tᵀ``, one gradient step of size ``Δ_t`` on ``−⟨h B_t, x_t⟩``); ``gated_deltanet``'s rule keeps
    its block's write step ``b_t`` (the step of the delta rule, eq. 20) as ``γ_t`` and drops its decay gate, and
    this does the same with ``Δ_t``.  Lattice-DEC has no decay, and a scalar one would only re-scale the step:
    with the sphere projection, ``P_C(μ S − γ ∇) = P_C(S − (γ/μ) ∇)`` for ``μ > 0`` (eq. 16 under eq. 14; the
    paper's Table 4 finds its forget gate adds nothing).  Per slot the write strength is ``Δ_t B_{t,i}``, SSD's.
    The state starts from a fixed random orthonormal ``S_0`` per head (a buffer, drawn as the ``lattice``
    mixer's with seed 0), not from zero; read-out ``y_t = S_t C_t`` (eq. 13) with the updated state, then
    ``+ D x_t``.  ``"ssm"`` then holds Lattice's unit-norm slots, same shape, so ``state_size`` is the same for
    both rules.  ``chunk_size`` is the scan's backward recompute chunk (``impl="fast"``: ``mode="scan"``;
    ``impl="reference"``: the per-token loop).
    """

    single_token_impl: ClassVar[str] = "reference"  # decode step: the per-token form is cheaper at T = 1

    RULES: ClassVar[tuple[str, ...]] = ("ssd", "lattice")
    contract_configs: ClassVar[list[dict]] = [
        {"d_state": 8, "chunk_size": 8},
        {"d_state": 4, "chunk_size": 8, "headdim": 8, "d_conv": 2, "expand": 1},
        {"d_state": 8, "chunk_size": 8, "rule": "lattice"},
    ]
    # norm_eps > 0: the gated RMSNorm divides y·silu(z) by its RMS, and a row that is exactly zero is 0/0 = NaN
    # with eps = 0 (an all-zero input does it)
    option_domains: ClassVar[dict[str, str]] = {
        "d_state": ">0", "expand": ">0", "headdim": ">0", "d_conv": ">0", "chunk_size": ">0", "norm_eps": ">0",
    }

    head_dim_option: ClassVar[str | None] = "headdim"

    def __init__(
        self,
        d_model: int,
        n_heads: int | None = None,
        impl: str = "fast",
        d_state: int = 64,
        expand: int = 2,
        headdim: int | None = None,
        d_conv: int = 4,
        chunk_size: int = 64,
        norm_eps: float = 1e-5,
        rule: str = "ssd",
    ) -> None:
        d_inner = check_positive_int("expand", expand) * check_positive_int("d_model", d_model)
        if headdim is None:
            n_heads = 4 if n_heads is None else check_positive_int("n_heads", n_heads)
            if d_inner % n_heads:
                raise ValueError(f"expand * d_model = {d_inner} must be divisible by n_heads={n_heads}")
            headdim = d_inner // n_heads
        else:
            headdim = check_positive_int("headdim", headdim)
            if d_inner % headdim:
                raise ValueError(f"expand * d_model = {d_inner} must be divisible by headdim={headdim}")
            if n_heads is not None and n_heads * headdim != d_inner:
                raise ValueError(
                    f"Mamba2: n_heads={n_heads} × headdim={headdim} must equal expand * d_model = {d_inner} (the "
                    f"heads split the inner width); give one of them (headdim={headdim} alone makes "
                    f"{d_inner // headdim} heads)"
                )
            n_heads = d_inner // headdim  # headdim, when given, sets the number of heads
        super().__init__(d_model, n_heads, impl)
        self.rule = check_choice("rule", rule, self.RULES)
        self.d_state = check_positive_int("d_state", d_state)
        self.expand = expand
        self.d_conv = check_positive_int("d_conv", d_conv)
        self.chunk_size = check_positive_int("chunk_size", chunk_size)
        self.d_inner = d_inner
        self.headdim = headdim
        h = self.n_heads
        if rule == "lattice" and self.d_state > self.headdim:
            raise ValueError(
                f"rule='lattice': d_state={self.d_state} slots cannot be orthonormal in headdim={self.headdim} "
                "(Lattice's S_0 needs d_state <= headdim)"
            )
        self.conv_dim = self.d_inner + 2 * self.d_state
        self.in_proj = nn.Linear(d_model, 2 * self.d_inner + 2 * self.d_state + h, bias=False)
        self.conv = ShortConv(self.conv_dim, d_conv, bias=True)
        self.dt_bias = nn.Parameter(init_dt_bias(h))
        if rule == "ssd":
            self.A_log = nn.Parameter(torch.log(torch.empty(h).uniform_(1.0, 16.0)))
        else:  # Lattice-DEC has no decay (see the class docstring); fixed orthonormal slots S_0 (heads, p, n)
            gen = torch.Generator().manual_seed(0)
            self.register_buffer("S0", orthonormal_slots(h, self.headdim, self.d_state, generator=gen))
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
        Bm = Bm[:, :, None, :].expand(b, t, h, n)
        Cm = Cm[:, :, None, :].expand(b, t, h, n)
        if self.rule == "lattice":  # S ← colnormalize(S − Δ_t (e_t B_tᵀ − S diag((Sᵀe_t) ⊙ B_t))), e_t = S B_t − x_t
            S = self.S0.to(dtype=xs.dtype).unsqueeze(0).expand(b, h, p, n) if state is None else state["ssm"]
            y, st = lattice_scan(
                Cm, Bm, xs, dt, {"S": S}, objective="dec", normalize=True, mode=self._op_mode("scan"),
                chunk_size=self.chunk_size,
            )
        else:
            y, st = ssd(
                xs, dt, -torch.exp(self.A_log), Bm, Cm,
                initial_state=None if state is None else {"S": state["ssm"]}, mode=self._op_mode(),
                chunk_size=self.chunk_size,
            )
        ssm = st["S"]
        y = y + self.D[:, None] * xs
        y = self.norm(y.reshape(b, t, self.d_inner), z)
        return self.out_proj(y), {"conv": conv_cache, "ssm": ssm}

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, d_state={self.d_state}, expand={self.expand}, headdim={self.headdim}, "
            f"d_conv={self.d_conv}, chunk_size={self.chunk_size}, rule={self.rule!r}"
        )
