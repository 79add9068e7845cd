"""Lattice (Karami & Mirrokni 2025, arXiv:2504.05646): the orthogonal-state-recurrence block of Appendix A.

Block (docs/lattice.md; details the paper leaves open are marked (R), our recommendation):

    u = x W_qk                                   one projection shared by q and k (App. A)
    q = silu(conv_q(u)),  k = silu(conv_k(u))    two short causal depthwise convolutions (kernel 4 (R), SiLU (R))
    q, k ← q/‖q‖, k/‖k‖ per head                 (R, DeltaNet convention; ``qk_norm``)
    v = x W_v,  γ_t = sigmoid(x W_γ + b)         input-dependent step size, per head or per slot (R)
    y = OSR scan (seqmem.ops.lattice_scan)       DEC / ENC / SIM + sphere projection (eq. 14)
    out = (y ⊙ gelu(x W_g)) W_o                  GeLU post-gate, output projection

Per head the state is ``S ∈ R^{d×m}`` (``d = head_dim``, ``m = n_slots ≤ d``), started from a fixed random
orthonormal ``S_0`` per head (a buffer; ``learn_s0=True`` makes it a parameter, column-normalised when used with
``normalize=True``, the default, and used as it is with ``normalize=False``).
Registered: ``lattice`` (DEC), ``lattice_enc``, ``lattice_sim``.  The rows of the Table 4 ablation and the TTT
baseline are options of the same block (see ``LADDER`` below): DeltaNet update (``objective="delta",
normalize=False``, eq. 20), orthogonal update without the sphere projection (``normalize=False``, eq. 7/13),
+ sphere projection (the default, eq. 14), + forget gate (``forget_gate=True``, eq. 16), and the paper's model
of TTT (``objective="ttt", normalize=False``, eq. 19).  ``objective="ssd", normalize=False`` (``SSD_OPTIONS``)
runs Mamba-2's SSD rule in the same block (App. A gives every sub-quadratic baseline this block; Table 1's Mamba2
row): per head ``S_t = a_t S_{t-1} + Δ_t v_t k_tᵀ``, ``y_t = S_t q_t`` with ``Δ_t = softplus(x W_Δ + b_Δ)`` and
``a_t = exp(−Δ_t exp(A_log))``, parameterised and initialised as the ``mamba2`` mixer's and run by the same op
(:func:`seqmem.ops.ssd`); the state starts at zero (Mamba-2's), not at ``S_0``, and there is no ``D`` skip
(Table 1's Mamba2 update has none).  ``lattice_minibatch`` (the TTT-style mini-batch
approximation, docs/lattice.md; formerly ``lattice_chunked``) is a DIFFERENT model, registered separately.

``impl="reference"`` runs the per-token loop under autograd; ``impl="fast"`` runs the same recurrence with the
fused C++ scan (or the PyTorch hand-VJP scan) and a chunk-recompute backward.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqmem.mixers._conv import ShortConv
from seqmem.mixers.base import Mixer, State, check_choice, check_positive_float, check_positive_int
from seqmem.mixers.linear_family import init_dt_bias
from seqmem.ops import ssd
from seqmem.ops.lattice import LATTICE_OBJECTIVES, lattice_minibatch, lattice_scan, orthonormal_slots
from seqmem.ops.lattice.step import projection_problem
from seqmem.registry import deprecated_alias, register

#: mixer options of the Table 4 ablation ladder and of the TTT baseline, all in the Lattice block
LADDER: dict[str, dict[str, Any]] = {
    "deltanet (eq. 20)": {"objective": "delta", "normalize": False},
    "+ orthogonal recurrence (eq. 7)": {"objective": "dec", "normalize": False},
    "+ normalized projection (eq. 14)": {"objective": "dec", "normalize": True},
    "+ forget gate (eq. 16)": {"objective": "dec", "normalize": True, "forget_gate": True},
}
TTT_OPTIONS: dict[str, Any] = {"objective": "ttt", "normalize": False}
#: Mamba-2's SSD rule (scalar decay per head, additive write) in the Lattice block
SSD_OPTIONS: dict[str, Any] = {"objective": "ssd", "normalize": False}
#: the update rules of the ``objective`` option: the Lattice op's objectives, and ``"ssd"`` (run by ``ops.ssd``)
MIXER_OBJECTIVES: tuple[str, ...] = (*LATTICE_OBJECTIVES, "ssd")


def _check_ssd_options(normalize: bool, gamma_per_slot: bool, forget_gate: bool, l1: float, learn_s0: bool) -> None:
    """The options that have no meaning under Mamba-2's SSD rule are errors, not silently ignored."""
    why = {
        "normalize=True": (normalize, "the sphere projection (eq. 14) is Lattice's; pass normalize=False"),
        "gamma_per_slot=True": (gamma_per_slot, "Mamba-2's Δ_t is one scalar per head"),
        "forget_gate=True": (forget_gate, "the SSD rule has its own decay exp(−Δ_t exp(A_log))"),
        "l1 > 0": (l1 > 0, "the L1 prox (eq. 18) is a Lattice option"),
        "learn_s0=True": (learn_s0, "the SSD state starts at zero, as in Mamba-2"),
    }
    for opt, (bad, reason) in why.items():
        if bad:
            raise ValueError(f"objective='ssd' (Mamba-2's SSD rule) does not take {opt}: {reason}")


def _check_head_dims(d_model: int, n_heads: int, head_dim: int | None, n_slots: int | None) -> tuple[int, ...]:
    if head_dim is None:
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}; pass head_dim")
        head_dim = d_model // n_heads
    check_positive_int("head_dim", head_dim)
    n_slots = head_dim if n_slots is None else check_positive_int("n_slots", n_slots)
    return head_dim, n_slots


@register(
    "lattice",
    facts=dict(
        state_promise=("bounded", "unit-norm slot columns after every step (eq. 14): ‖S‖_F = √m per head"),
        numerics_smoke=(1.2e-6, 5e-2, 7e-3),  # measured 3.8e-7, 1.8e-2, 2.3e-3
        numerics_full=((1.1e-06, 1.1e-06), (4.5e-02, 4.5e-02), (5.8e-03, 5.8e-03)),
    ),
    objective="dec")
class LatticeMixer(Mixer):
    """Lattice block: orthogonal slot-memory recurrence (DEC/ENC/SIM), shared q/k projection, GeLU gate."""

    contract_configs: ClassVar[list[dict[str, Any]]] = [
        {"chunk_size": 8},
        {"chunk_size": 8, "gamma_per_slot": True, "forget_gate": True, "learn_s0": True},
        {"chunk_size": 8, "objective": "ttt", "normalize": False, "n_slots": 4, "conv_size": 2},
        {"chunk_size": 8, "objective": "delta", "normalize": False, "forget_gate": True},
        {"chunk_size": 8, "normalize": False, "l1": 0.01},
        {"chunk_size": 8, "objective": "ssd", "normalize": False, "n_slots": 12},  # m > d: no S_0 to bound it
    ]
    # head_dim / n_slots None = d_model / n_heads; l1 = 0: no L1 term; seed: any integer (torch.Generator)
    option_domains: ClassVar[dict[str, str]] = {
        "head_dim": ">0", "n_slots": ">0", "conv_size": ">0", "l1": ">=0", "chunk_size": ">0",
    }

    def __init__(
        self,
        d_model: int,
        n_heads: int = 4,
        impl: str = "fast",
        objective: str = "dec",
        normalize: bool = True,
        head_dim: int | None = None,
        n_slots: int | None = None,
        conv_size: int = 4,
        qk_norm: bool = True,
        gamma_per_slot: bool = False,
        forget_gate: bool = False,
        l1: float = 0.0,
        learn_s0: bool = False,
        chunk_size: int = 64,
        seed: int = 0,
        v_norm: bool = False,
    ) -> None:
        super().__init__(d_model, n_heads, impl)
        self.objective = check_choice("objective", objective, MIXER_OBJECTIVES)
        for name, val in (
            ("normalize", normalize), ("qk_norm", qk_norm), ("gamma_per_slot", gamma_per_slot),
            ("forget_gate", forget_gate), ("learn_s0", learn_s0), ("v_norm", v_norm),
        ):  # fmt: skip
            if not isinstance(val, bool):
                raise ValueError(f"{name} must be a bool, got {val!r}")
        self.normalize = normalize
        self.head_dim, self.n_slots = _check_head_dims(d_model, n_heads, head_dim, n_slots)
        if self.n_slots > self.head_dim and objective != "ssd":
            raise ValueError(
                f"n_slots={self.n_slots} > head_dim={self.head_dim}: orthonormal initial slots need m <= d"
            )
        self.conv_size = check_positive_int("conv_size", conv_size)
        self.chunk_size = check_positive_int("chunk_size", chunk_size)
        self.l1 = check_positive_float("l1", l1, allow_zero=True)
        if objective == "ssd":
            _check_ssd_options(normalize, gamma_per_slot, forget_gate, self.l1, learn_s0)
        if (why := projection_problem(objective, normalize)) is not None:
            raise ValueError(why)
        self.qk_norm, self.gamma_per_slot, self.forget_gate, self.learn_s0, self.v_norm = (
            qk_norm, gamma_per_slot, forget_gate, learn_s0, v_norm
        )  # fmt: skip
        H, d, m = n_heads, self.head_dim, self.n_slots
        self.qk_proj = nn.Linear(d_model, H * m, bias=False)  # shared by q and k (App. A)
        self.conv_q = ShortConv(H * m, conv_size)
        self.conv_k = ShortConv(H * m, conv_size)
        self.v_proj = nn.Linear(d_model, H * d, bias=False)
        self.gamma_proj = nn.Linear(d_model, H * m if gamma_per_slot else H)  # γ_t; Δ_t for the SSD rule
        if objective == "ssd":  # Mamba-2's Δ_t = softplus(x W_Δ + b_Δ) and A = −exp(A_log), initialised as there
            with torch.no_grad():
                self.gamma_proj.bias.copy_(init_dt_bias(H))
            self.A_log = nn.Parameter(torch.log(torch.empty(H).uniform_(1.0, 16.0)))
        if forget_gate:
            self.forget_proj = nn.Linear(d_model, H)
            nn.init.constant_(self.forget_proj.bias, 3.0)  # μ ≈ 0.95 at init
        self.gate_proj = nn.Linear(d_model, H * d, bias=False)
        self.o_proj = nn.Linear(H * d, d_model, bias=False)
        if objective == "ssd":  # no S_0: the state starts at zero
            return
        s0 = orthonormal_slots(H, d, m, generator=torch.Generator().manual_seed(seed))
        if learn_s0:
            self.S0 = nn.Parameter(s0)
        else:
            self.register_buffer("S0", s0)

    # -- contract -------------------------------------------------------------------------------------------
    def state_keys(self) -> set[str]:
        return {"S", "conv_q", "conv_k"}

    def state_size(self, seq_len: int) -> int:
        H, d, m = self.n_heads, self.head_dim, self.n_slots
        return H * d * m + 2 * (self.conv_size - 1) * H * m

    def initial_state(self, batch: int, dtype: torch.dtype, device: torch.device) -> State:
        H, d, m = self.n_heads, self.head_dim, self.n_slots
        if self.objective == "ssd":  # Mamba-2's state starts at zero
            S = torch.zeros(batch, H, d, m, dtype=dtype, device=device)
        else:
            S = self.S0.to(dtype=dtype, device=device).unsqueeze(0).expand(batch, H, d, m)
        return {
            "S": S,
            "conv_q": torch.zeros(batch, self.conv_size - 1, H * m, dtype=dtype, device=device),
            "conv_k": torch.zeros(batch, self.conv_size - 1, H * m, dtype=dtype, device=device),
        }

    def _features(self, x: Tensor, state: State) -> tuple[Tensor, ...]:
        B, T, _ = x.shape
        H, d, m = self.n_heads, self.head_dim, self.n_slots
        u = self.qk_proj(x)
        q, cq = self.conv_q(u, state["conv_q"])
        k, ck = self.conv_k(u, state["conv_k"])
        q = F.silu(q).view(B, T, H, m)
        k = F.silu(k).view(B, T, H, m)
        if self.qk_norm:
            q = F.normalize(q, dim=-1, eps=1e-6)
            k = F.normalize(k, dim=-1, eps=1e-6)
        v = self.v_proj(x).view(B, T, H, d)
        if self.v_norm:  # NOT in the paper: unit-norm values (tames the ENC step, which scales with ‖v‖²)
            v = F.normalize(v, dim=-1, eps=1e-6)
        if self.objective == "ssd":
            gamma = F.softplus(self.gamma_proj(x))  # Δ_t (b_Δ is the bias)
        else:
            gamma = torch.sigmoid(self.gamma_proj(x))
        gamma = gamma.view(B, T, H, m) if self.gamma_per_slot else gamma.view(B, T, H)
        mu = torch.sigmoid(self.forget_proj(x)) if self.forget_gate else None
        return q, k, v, gamma, mu, cq, ck

    def _forward(self, x: Tensor, state: State | None) -> tuple[Tensor, State]:
        B, T, _ = x.shape
        if state is None:
            state = self.initial_state(B, x.dtype, x.device)
        q, k, v, gamma, mu, cq, ck = self._features(x, state)
        if self.objective == "ssd":  # S_t = exp(−Δ_t e^{A_log}) S_{t-1} + Δ_t v_t k_tᵀ, y_t = S_t q_t
            y, st = ssd(
                v, gamma, -torch.exp(self.A_log), k, q, initial_state={"S": state["S"]},
                mode=self._op_mode(), chunk_size=self.chunk_size,
            )  # fmt: skip
            y = y.reshape(B, T, -1) * F.gelu(self.gate_proj(x))  # GeLU post-gate
            return self.o_proj(y), {"S": st["S"], "conv_q": cq, "conv_k": ck}
        y, st = lattice_scan(
            q, k, v, gamma, {"S": state["S"]}, objective=self.objective, normalize=self.normalize, forget=mu,
            l1=self.l1 if self.l1 > 0 else None, chunk_size=self.chunk_size,
            mode=self._op_mode("scan"),
        )  # fmt: skip
        y = y.reshape(B, T, -1) * F.gelu(self.gate_proj(x))  # GeLU post-gate
        return self.o_proj(y), {"S": st["S"], "conv_q": cq, "conv_k": ck}

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, objective={self.objective!r}, normalize={self.normalize}, "
            f"head_dim={self.head_dim}, n_slots={self.n_slots}, conv_size={self.conv_size}, "
            f"chunk_size={self.chunk_size}, gamma_per_slot={self.gamma_per_slot}, forget_gate={self.forget_gate}, "
            f"l1={self.l1}"
        )


@register(
    "lattice_enc",
    facts=dict(
        state_promise=("bounded", "unit-norm slot columns (eq. 14)"),
        numerics_smoke=(1e-4, 0.7, 0.3),  # measured 2.2e-5, 0.22, 8.6e-2: ill-conditioned (see README)
        numerics_full=((1.9e-02, 9.7e-04), (3.9e-01, 3.7e-01), (1.6e-01, 1.9e-01)),
    ),
    objective="enc")
class LatticeEncMixer(LatticeMixer):
    """Lattice-ENC block: the encoding objective ½‖φ(S)ᵀv − k‖² (eqs. 9-10, 21)."""

    contract_configs: ClassVar[list[dict[str, Any]]] = [
        {"chunk_size": 8},
        {"chunk_size": 8, "gamma_per_slot": True, "forget_gate": True, "n_slots": 4, "v_norm": True},
    ]


@register(
    "lattice_sim",
    facts=dict(
        state_promise=("bounded", "unit-norm slot columns (eq. 14)"),
        numerics_smoke=(1e-6, 4.5e-2, 6e-3),  # measured 3.3e-7, 1.4e-2, 1.9e-3
        numerics_full=((9.3e-07, 9.4e-07), (3.8e-02, 3.9e-02), (4.9e-03, 4.9e-03)),
    ),
    objective="sim")
class LatticeSimMixer(LatticeMixer):
    """Lattice-SIM block: the similarity objective −⟨φ(S)ᵀv, k⟩ (eqs. 11-12)."""

    contract_configs: ClassVar[list[dict[str, Any]]] = [
        {"chunk_size": 8},
        {"chunk_size": 8, "gamma_per_slot": True, "forget_gate": True, "n_slots": 4},
    ]


@register(
    "lattice_minibatch",
    facts=dict(
        state_promise=("bounded", "unit-norm slot columns at chunk ends (eq. 14)"),
        numerics_smoke=(1.1e-6, 3.5e-2, 5e-3),  # measured 3.5e-7, 1.1e-2, 1.7e-3
        numerics_full=((9.5e-07, 9.6e-07), (3.2e-02, 3.2e-02), (4.3e-03, 4.3e-03)),
    ),
    objective="dec")
class LatticeMinibatchMixer(LatticeMixer):
    """Mini-batch Lattice (TTT-style): all gradients of a chunk taken at its start state.

    Registered as ``lattice_minibatch`` (``lattice_chunked``, its former name, still builds it with a
    DeprecationWarning).  A DIFFERENT model from ``lattice`` (equal only for ``chunk_size=1``); chunks are counted
    from the sequence start, so the state also holds the chunk-start slots, the partial-chunk update and a position
    counter.
    ``impl="reference"``: a per-token loop with the same mini-batch semantics; ``impl="fast"``: the op's
    causal-product form (:func:`seqmem.ops.lattice_minibatch`; never forms the per-token states).
    """

    single_token_impl: ClassVar[str] = "reference"  # decode step: the per-token form is cheaper at T = 1
    pos_on_host: ClassVar[bool] = True  # a decode step hands its op the remembered position (Mixer._known_pos)

    contract_configs: ClassVar[list[dict[str, Any]]] = [
        {"chunk_size": 8},
        {"chunk_size": 5, "objective": "enc", "gamma_per_slot": True, "n_slots": 4},
    ]

    def __init__(self, d_model: int, n_heads: int = 4, impl: str = "fast", objective: str = "dec",
                 head_dim: int | None = None, n_slots: int | None = None, conv_size: int = 4,
                 qk_norm: bool = True, gamma_per_slot: bool = False, learn_s0: bool = False,
                 chunk_size: int = 16, seed: int = 0, normalize: bool = True, forget_gate: bool = False,
                 l1: float = 0.0, v_norm: bool = False) -> None:  # fmt: skip
        if normalize is not True or forget_gate is not False or l1 != 0.0:
            raise ValueError("lattice_minibatch supports only normalize=True, forget_gate=False, l1=0")
        if objective not in ("dec", "enc", "sim"):
            raise ValueError(f"lattice_minibatch: objective must be 'dec', 'enc' or 'sim', got {objective!r}")
        super().__init__(
            d_model, n_heads, impl, objective=objective, normalize=True, head_dim=head_dim, n_slots=n_slots,
            conv_size=conv_size, qk_norm=qk_norm, gamma_per_slot=gamma_per_slot, learn_s0=learn_s0,
            chunk_size=chunk_size, seed=seed, v_norm=v_norm,
        )  # fmt: skip

    def state_keys(self) -> set[str]:
        return {"S", "A", "pos", "conv_q", "conv_k"}

    def state_size(self, seq_len: int) -> int:
        H, d, m = self.n_heads, self.head_dim, self.n_slots
        return 2 * H * d * m + 1 + 2 * (self.conv_size - 1) * H * m

    def initial_state(self, batch: int, dtype: torch.dtype, device: torch.device) -> State:
        st = super().initial_state(batch, dtype, device)
        st["A"] = torch.zeros_like(st["S"])
        st["pos"] = torch.zeros(batch, dtype=torch.long, device=device)
        return st

    def _forward(self, x: Tensor, state: State | None) -> tuple[Tensor, State]:
        B, T, _ = x.shape
        fresh = state is None
        if fresh:
            state = self.initial_state(B, x.dtype, x.device)
        q, k, v, gamma, _, cq, ck = self._features(x, state)
        # from the start the op needs no position (pos None is 0, known on the host: no read of the device)
        op_state = {"S": state["S"], "A": state["A"], "pos": None if fresh else state["pos"]}
        known = None if fresh else self._known_pos(state, self.chunk_size)  # None: the op reads it
        y, st = lattice_minibatch(
            q, k, v, gamma, op_state, objective=self.objective, chunk_size=self.chunk_size, mode=self._op_mode(),
            _offset=None if known is None else known % self.chunk_size,
        )  # fmt: skip
        y = y.reshape(B, T, -1) * F.gelu(self.gate_proj(x))
        return self.o_proj(y), {**st, "conv_q": cq, "conv_k": ck}


deprecated_alias("lattice_chunked", "lattice_minibatch")
LatticeChunkedMixer = LatticeMinibatchMixer  # the class's former name
