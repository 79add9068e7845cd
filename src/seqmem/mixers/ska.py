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
forward exactly (the paper's per-token inclusive decoder of §3.5 does not; docs/echo.md).

Action mask (App. F eq. 53, App. G.1): ``y, state = mixer(x, state, action_mask=m)`` with ``m`` (batch, time) in
{0, 1} lets only the tokens with ``m_t = 1`` into the statistics (``M``: pairs with ``m_t = m_{t-1} = 1``); every
token still gets an output, chunk-causally as without a mask, and a sequence split into calls, its mask split
alike, equals one call.  ``None`` is the same computation as without a mask (all ones gives the same result).
Not with ``cu_seqlens`` (an error).

Operator scope ``operator_scope``:

* ``"chunk_causal"`` (default, causal, streams): the chunk-causal form above (eqs. 7–10).
* ``"sequence"``: the paper's one-operator masked / prefix mode (App. F eq. 53, eqs. 4–6): ONE operator per
  sequence, estimated from the tokens with ``action_mask = 1`` (every token when no mask is given: the prefix form
  over the whole input), read out at EVERY position, earlier ones included.  NON-CAUSAL: a position reads facts that
  come after it, so it refuses a ``state`` (streaming, token-by-token decoding) and ``cu_seqlens`` with a
  ValueError that says so; run each sequence whole in one call.  ``chunk_size`` is unused.  The statistics are
  those of ``ska_statistics(k̂, v, mask)`` and the readout ``ska_readout`` (:mod:`seqmem.ops.ska`); the key norm
  covers every key, masked-out ones included (App. F step 2 precedes step 3), as in the chunk-causal masked form:
  with ``norm="prefix_max"`` it is the maximum over every key up to the row's last token with ``m_t = 1`` (the
  prefix the operator is estimated from: the operator equals the chunk-causal one committed right after that token,
  and no key after it enters), over the whole sequence without a mask; with ``norm="seqmax"`` over the whole
  sequence (App. F step 2 as printed: with a mask it also reads the keys after the last fact, e.g. a
  teacher-forced answer's); ``"none"``: 1.  A row with no token in its mask gets 0 everywhere (``G = εI``,
  ``C_v = 0``).  The returned state holds the operator's statistics (``G``, ``M``, ``C_v`` of the normalised keys,
  without ``εI``), the last key ``z_prev`` (times its mask), the key norm ``m`` and ``pos``: an inspection, not a
  continuation (passing it back is refused), unless ``prefix_decode=True``.
  Leak-free for a model scored only at positions after its last ``m_t = 1`` token when the key norm does not read
  past it (``prefix_max``, the default): the Echo tasks' oracle masks are such (tests/tasks).
* ``prefix_decode=True`` (with ``"sequence"``): the prefix mode of §3.5 for agentic inference.  The first call (no
  state) is the prefix, as above; a call with its state continues it the paper's way: each later token is added
  to the statistics (``G, M, C_v``; masked by ``action_mask`` if one is given) and read through the operator that
  includes it, the prefix's key norm frozen (as §3.2.1 prescribes for decoding), so every prefix token serves the
  first generated token and ``model.generate`` streams in O(r³) per token.  The continuation is causal and splits
  exactly (any split of it into calls equals one call), but it is not the one-operator forward of the whole
  sequence (the prefix's outputs do not read later tokens; a later token reads its own).  Training is unchanged (a
  call without state).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from seqmem.io import check_int
from seqmem.mixers.base import Mixer, State, check_choice, check_positive_float, check_positive_int
from seqmem.ops._common import check_action_mask, floor
from seqmem.ops.ska.chunk import (
    NORMS,
    OPERATOR_FORMS,
    STATE_KEYS,
    ska_sequence_decode,
    ska_sequence_operator,
    spectral_koopman_attention,
)
from seqmem.ops.ska.naive import ska_sequence_decode_naive, ska_sequence_operator_naive
from seqmem.registry import register

OPERATOR_SCOPES = ("chunk_causal", "sequence")
SEQUENCE_STATE_KEYS = ("G", "M", "Cv", "z_prev", "m", "pos")


@register(
    "ska",
    facts=dict(
        state_promise=("grows", "G, M, C_v are undecayed prefix sums (O(T)); the readout whitens them"),
        numerics_smoke=(9e-6, 7e-2, 4e-3),  # measured 2.8e-6, 2.3e-2, 1.4e-3
        numerics_full=((3.9e-06, 2.7e-06), (6.9e-02, 3.9e-02), (3.7e-03, 4.2e-03)),
        # measured 1.8e-2 / 2.1e-2 (bf16), 2.8e-3 / 3.1e-3 (fp16): the ridge solve amplifies the output's rounding
        numerics_amp={"bf16": (5e-2, 1.2e-1), "fp16": (8e-3, 1.2e-2)},
    ),
)
class SKAMixer(Mixer):
    """Spectral Koopman Attention (Echo): chunk-causal ridge/Koopman retrieval from constant-size
    statistics (or, with ``operator_scope="sequence"``, one non-causal operator per sequence: App. F eq. 53)."""

    single_token_impl: ClassVar[str] = "reference"  # decode step: the per-token form is cheaper at T = 1
    takes_action_mask: ClassVar[bool] = True  # forward(..., action_mask=): App. F eq. (53)
    pos_on_host: ClassVar[bool] = True  # a decode step hands its op the remembered position (Mixer._known_pos)

    # The paper's sequence-max normalisation (norm="seqmax") is deliberately NOT in the contract configs: it
    # divides
    # every key by a maximum over the whole input, so outputs depend on future tokens (not causal) and a split
    # sequence differs from the full forward (the max is frozen at the first piece). See
    # tests/ops/test_ska.py for
    # the test that demonstrates the leak.  The one-operator mode operator_scope="sequence" (App. F eq. 53) is left
    # out for the same reason (every position reads later facts; it refuses a state): tests/mixers/
    # test_ska_sequence_mode.py tests it.
    # chunk-causal: a query reads only the statistics of earlier chunks, so the chunk length limits what it sees
    length_options: ClassVar[dict[str, str]] = {"chunk_size": "chunk"}
    contract_configs: ClassVar[list[dict]] = [
        {"rank": 4, "chunk_size": 8},
        {"rank": 3, "chunk_size": 5, "power": 0},
        {"rank": 4, "chunk_size": 8, "norm": "none", "power": 1, "operator_form": "unwhitened"},
    ]

    # power K = 0 is the paper's ablation (no Koopman power); eps is the ridge term of the whitening; the output
    # scale η multiplies a zero-initialised projection, so η = 0 is a saddle with no gradient to either and η < 0
    # flips the readout; γ = 1 + 0.5·sigmoid(ρ) only reaches [1, 1.5)
    option_domains: ClassVar[dict[str, str]] = {
        "rank": ">0", "chunk_size": ">0", "power": ">=0", "eps": ">0", "eta_init": ">0", "gamma_init": "[1,1.5)",
        "spec_iters": ">0",
    }

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
        operator_scope: str = "chunk_causal",
        prefix_decode: bool = False,
    ) -> None:
        super().__init__(d_model, n_heads, impl)
        self.head_dim = self._head_dim()
        self.rank = check_positive_int("rank", rank)
        self.chunk_size = check_positive_int("chunk_size", chunk_size)
        check_int("power (K)", power, 0)
        self.power = power
        self.eps = check_positive_float("eps", eps)
        self.norm = check_choice("norm", norm, NORMS)
        self.operator_form = check_choice("operator_form", operator_form, OPERATOR_FORMS)
        self.operator_scope = check_choice("operator_scope", operator_scope, OPERATOR_SCOPES)
        if not isinstance(prefix_decode, bool):
            raise ValueError(f"prefix_decode must be True or False, got {prefix_decode!r}")
        if prefix_decode and self.operator_scope != "sequence":
            raise ValueError("prefix_decode=True continues the one-operator prefix mode (§3.5): it needs "
                             "operator_scope='sequence' (the chunk-causal default already streams exactly)")
        self.prefix_decode = prefix_decode
        self.spec_iters = check_positive_int("spec_iters", spec_iters)
        if not (1.0 <= gamma_init < 1.5):
            raise ValueError(f"gamma_init must lie in [1, 1.5), got {gamma_init!r}")
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

    @classmethod
    def canonical_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """``operator_scope="sequence"`` reads no ``chunk_size``: two such layers that differ only there are the same
        layer (``seqmem sweep --reuse`` takes one's run for the other)."""
        out = dict(options)
        if out.get("operator_scope") == "sequence":
            out["chunk_size"] = None
        return out

    def unused_parameters(self) -> dict[str, str]:
        if self.power == 0:  # kept so that power=0 layers load the state dicts of their runs (compare_diagnose)
            return {"gamma_raw": "power=0 reads the ridge readout only: γ (eq. 12) scales the powers of the Koopman "
                                 "operator, none of which is read"}
        return {}

    @property
    def gamma(self) -> Tensor:
        """``γ = 1 + 0.5·sigmoid(ρ) ∈ (1, 1.5)`` (eq. 12)."""
        return 1.0 + 0.5 * torch.sigmoid(self.gamma_raw)

    def state_keys(self) -> set[str]:
        return set(SEQUENCE_STATE_KEYS if self.operator_scope == "sequence" else STATE_KEYS)

    def state_size(self, seq_len: int) -> int:
        """Per head: committed ``G, M`` (2r²), ``C_v`` (Pr), previous key (r), norm (1) — the paper's
        ``2r² + Pr + r + 1`` — plus the pending partial-chunk sums (2r² + Pr + 1); plus one position
        counter.  ``operator_scope="sequence"``: the one operator's ``G, M, C_v``, last key and norm
        (2r² + Pr + r + 1 per head) plus the position counter (continuable with ``prefix_decode=True``)."""
        r, P = self.rank, self.head_dim
        if self.operator_scope == "sequence":
            return self.n_heads * (2 * r * r + P * r + r + 1) + 1
        return self.n_heads * (4 * r * r + 2 * P * r + r + 2) + 1

    def forward(
        self, x: Tensor, state: State | list[State] | None = None, *, cu_seqlens: Tensor | None = None,
        output_final_state: bool = True, action_mask: Tensor | None = None,
    ) -> tuple[Tensor, State | list[State] | None]:
        """The mixer contract (:meth:`Mixer.forward`) plus ``action_mask`` (batch, time) in {0, 1}: the App. F
        action mask of eq. (53) (see the module docstring)."""
        if self.operator_scope == "sequence":
            why = ("is non-causal: every position reads ONE operator estimated from the whole sequence's "
                   "(action-masked) tokens, later ones included (Echo App. F eq. 53)")
            if state is not None and not self.prefix_decode:
                raise ValueError(f"{type(self).__name__}(operator_scope='sequence') {why}, so it cannot continue "
                                 "from a state (streaming or token-by-token decoding would read an operator of "
                                 "the new tokens alone); run the whole sequence in one call with state=None, "
                                 "use operator_scope='chunk_causal', or decode the paper's way (§3.5: later "
                                 "tokens added to the prefix's operator) with prefix_decode=True")
            if cu_seqlens is not None:
                raise ValueError(f"{type(self).__name__}(operator_scope='sequence') {why}; packed sequences "
                                 "(cu_seqlens) are not supported: run the sequences as a batch")
        if action_mask is None:
            return super().forward(x, state, cu_seqlens=cu_seqlens, output_final_state=output_final_state)
        if cu_seqlens is not None:
            raise ValueError(f"{type(self).__name__}: action_mask cannot be combined with cu_seqlens (packed "
                             "sequences); run the sequences as a batch")
        self._check_input(x)
        # as bool after the check (one read of a non-bool mask): the op's check of a bool mask reads nothing
        self._mask_arg = check_action_mask(action_mask, tuple(x.shape[:2]), x.device, type(self).__name__).bool()
        try:
            return super().forward(x, state, output_final_state=output_final_state)
        finally:
            self._mask_arg = None

    def _dispatch(self, x: Tensor, state: State | None) -> tuple[Tensor, State]:
        # the mask given to forward reaches _forward only through here, after every check (the state-layout probe
        # of those checks runs _forward on inputs of its own, without a mask)
        self._mask, self._mask_arg = getattr(self, "_mask_arg", None), None
        try:
            return super()._dispatch(x, state)
        finally:
            self._mask = None

    def _forward(self, x: Tensor, state: State | None) -> tuple[Tensor, State]:
        B, T, _ = x.shape
        H, r, P = self.n_heads, self.rank, self.head_dim
        k = self.w_k(x).view(B, T, H, r)
        q = self.w_q(x).view(B, T, H, r)
        v = self.w_v(x).view(B, T, H, P)
        if self.operator_scope == "sequence":
            kw = dict(power=self.power, gamma=self.gamma, eta=1.0, spec_iters=self.spec_iters,
                      operator_form=self.operator_form)
            mask = getattr(self, "_mask", None)
            if state is None:  # the prefix (or the whole sequence): one operator (eqs. 4-6, 53)
                seq = ska_sequence_operator_naive if self.impl == "reference" else ska_sequence_operator
                o, new_state = seq(q, k, v, mask, self.eps, self.norm, kw)
            else:  # prefix_decode: later tokens added to the prefix's operator, each read inclusively (§3.5)
                dec = ska_sequence_decode_naive if self.impl == "reference" else ska_sequence_decode
                o, new_state = dec(q, k, v, state, mask, self.eps, self.norm, kw)
            y = self.w_o((self.eta * o.reshape(B, T, H * P)).to(x.dtype))
            return y, new_state
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
            mode=self._op_mode(),
            mask=getattr(self, "_mask", None),
            _pos0=None if state is None else self._known_pos(state),  # None: the op reads it
        )
        y = self.w_o((self.eta * o.reshape(B, T, H * P)).to(x.dtype))
        return y, new_state

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, rank={self.rank}, chunk_size={self.chunk_size}, K={self.power}, "
            f"norm={self.norm!r}, operator_form={self.operator_form!r}"
            + (f", operator_scope={self.operator_scope!r}" if self.operator_scope != "chunk_causal" else "")
            + (", prefix_decode=True" if self.prefix_decode else "")
        )


@register(
    "koopman_mlp",
    facts=dict(
        state_promise=("bounded", "no recurrent state (position counter only)"),
        numerics_smoke=(8e-7, 1.5e-2, 2e-3),  # measured 2.4e-7, 4.6e-3, 6.8e-4
        numerics_full=((7.4e-07, 7.4e-07), (1.4e-02, 1.4e-02), (2.1e-03, 2.1e-03)),
    ),
    description="channel MLP, not a token mixer: the Echo Spectral Koopman MLP (§3.3, eq. 14), token-wise and "
                "stateless; registered so it can be a layer of a hybrid (use it with mlp_ratio=0)",
)
class KoopmanMLP(Mixer):
    """Spectral Koopman MLP (Echo §3.3, eq. 14) as a token-wise, stateless layer.

    ``g = SiLU(W_lift h) ∈ R^{d_k}``; consecutive pairs ``(g[2i], g[2i+1])`` are multiplied by the 2×2 real form of
    ``λ_i = γ_i + iω_i`` with ``|λ_i|`` clamped to ≤ 1 (rescaling ``(γ_i, ω_i)``); ``out = W_readout z``.
    Parameters ``2·d·d_k + d_k`` with ``d_k = ⌈d·8/3 / 64⌉·64`` by default.  In the LM backbone use it as its own
    layer after each sequence layer with ``mlp_ratio=0`` (pre-norm + residual come from the backbone), which gives
    the Echo block ``[Mamba-2; Koopman MLP]``.  Note: ``W_readout·R`` is one linear map, so this is a
    re-parametrised 2-matrix SiLU MLP; with the ≤ 1 clamp ``R`` may contract (not orthogonal, App. J.4).
    """

    contract_configs: ClassVar[list[dict]] = [{"d_k": 32}]
    option_domains: ClassVar[dict[str, str]] = {"d_k": "even>0"}  # pairs of features; None = ⌈8d/3 / 64⌉·64

    def long_range_reason(self, seq_len: int) -> str | None:
        return "a token-wise layer with no sequence memory (a control)"

    def __init__(
        self,
        d_model: int,
        n_heads: int = 4,
        impl: str = "fast",
        d_k: int | None = None,
        unit_circle: bool = False,
    ) -> None:
        super().__init__(d_model, n_heads, impl)
        if d_k is None:
            d_k = 64 * math.ceil(d_model * 8 / 3 / 64)
        self.d_k = check_positive_int("d_k", d_k)
        if d_k % 2:
            raise ValueError(f"d_k must be even (pairs of features), got {d_k}")
        if not isinstance(unit_circle, bool):
            raise ValueError(f"unit_circle must be a bool, got {unit_circle!r}")
        self.unit_circle = unit_circle
        self.w_lift = nn.Linear(d_model, d_k, bias=False)
        self.w_readout = nn.Linear(d_k, d_model, bias=False)
        nn.init.xavier_uniform_(self.w_lift.weight)
        nn.init.xavier_uniform_(self.w_readout.weight)
        self.lam_re = nn.Parameter(torch.ones(d_k // 2))
        self.lam_im = nn.Parameter(0.1 * torch.randn(d_k // 2))

    def eigenvalues(self) -> tuple[Tensor, Tensor]:
        """``(γ, ω)`` after the clamp ``|λ| ≤ 1`` (or projection onto ``|λ| = 1`` with ``unit_circle=True``).

        Float16 / bfloat16 parameters are rescaled in float32 (``d_k / 2`` numbers) and the result rounded once:
        the gradient of ``γ/|λ|`` with respect to ``γ`` is ``ω²/|λ|³``, a cancellation that bfloat16 arithmetic
        got 30 % wrong."""
        lr, li = self.lam_re, self.lam_im
        dt = lr.dtype
        if dt in (torch.float16, torch.bfloat16):
            lr, li = lr.float(), li.float()
        rho = torch.sqrt(lr**2 + li**2).clamp_min(floor(1e-12, lr.dtype))
        s = 1.0 / rho if self.unit_circle else torch.clamp(1.0 / rho, max=1.0)
        return (lr * s).to(dt), (li * s).to(dt)

    def state_keys(self) -> set[str]:
        return {"pos"}

    def state_size(self, seq_len: int) -> int:
        """Token-wise: the only state is a position counter (kept so batch mismatches are caught)."""
        return 1

    def _forward(self, x: Tensor, state: State | None) -> tuple[Tensor, State]:
        g = torch.nn.functional.silu(self.w_lift(x))
        g1, g2 = g[..., 0::2], g[..., 1::2]
        a, w = self.eigenvalues()
        z1 = a * g1 + w * g2  # eq. (14): [[γ, ω], [−ω, γ]] [g1; g2]
        z2 = -w * g1 + a * g2
        z = torch.stack([z1, z2], -1).flatten(-2)
        pos = state["pos"] if state is not None else torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        return self.w_readout(z), {"pos": pos + x.shape[1]}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, d_k={self.d_k}, unit_circle={self.unit_circle}"
