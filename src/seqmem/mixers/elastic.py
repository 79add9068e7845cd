"""Elastic Memory (*Towards Compressive and Scalable Recurrent Memory*, Song et al.): block-wise attention
with a HiPPO-LegS compressed key/value memory.

``block_attention`` — Transformer++ with block-local attention: causal softmax attention inside blocks of
``block_len`` tokens, RoPE with block-local positions, nothing crosses a block boundary.  It is also the base
class of every block-memory mixer (``elastic`` here; ``memorizing``, ``infini``, ``melodi`` in
``memory_baselines.py``): a subclass adds a memory state read once per block and folded once per completed
block.

``elastic`` (Algorithm 1 of the paper), for block ``b`` (0-indexed, counted from the sequence start):

1. retrieval (Eqs. 7–8): ``[K_mem, V_mem] = R C_b`` — ``L_mem`` memory tokens reconstructed from the LegS
   coefficients ``C_b`` (N × 2·d_model) of the raw (pre-RoPE) keys and the values of blocks ``0..b−1``; ``R``
   is one fixed matrix (uniform or exponential sample points, switchable at test time with
   :meth:`Elastic.set_sampling`);
2. trapezoidal attention (Eqs. 9–10): one joint softmax over ``[K_mem; K_block]`` — every query sees every
   memory token (no positional encoding on them), causal inside the block; in block 0 the memory columns are
   masked (the history is empty);
3. memory update (Eq. 6): ``C_{b+1} = P_b C_b + K̄_b [K_raw, V]_b`` with ``P_b = (b/(b+1))^A`` and the HiPPO
   input kernel ``K̄_b`` (closed forms in :mod:`seqmem.ops.hippo`, float64 math cast to the model dtype).

No trainable memory parameters: ``elastic`` and ``block_attention`` have identical parameters.

impl="fast": blocks in parallel (one masked SDPA call over all blocks after a cheap sequential scan of the
memory; :func:`seqmem.ops.trapezoidal_attention`); impl="reference": a per-token loop (each query through
``seqmem.ops.elastic.naive.trapezoidal_attention_token``); the memory of a finished block is folded token by
token with the ZOH recurrence ``c_k = Ā_k c_{k−1} + B̄_k f_k`` (Eq. 4; ``hippo_compress(mode="recurrent")``),
which must equal the block form of Eq. 6.

Streaming state: ``k``, ``v`` — raw keys / values of the current partial block (``pos mod block_len`` tokens),
``pos`` — tokens seen, plus the memory (``mem``: C, N × 2·d_model for ``elastic``).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqmem.mixers.attention import rope_angles
from seqmem.mixers.base import Mixer, State, _version, check_choice, check_positive_int, own_memory
from seqmem.ops._common import cached_constants
from seqmem.ops.elastic import trapezoidal_attention
from seqmem.ops.elastic.chunk import visible_kind
from seqmem.ops.elastic.naive import trapezoidal_attention_token
from seqmem.ops.hippo import SAMPLINGS, hippo_compress, legs_blocks, legs_reconstruction_matrix, sample_fractions
from seqmem.registry import register


def _rotate(x: Tensor, c2: Tensor, s2: Tensor) -> Tensor:
    h = x.shape[-1] // 2
    return torch.addcmul(x * c2, torch.cat([x[..., h:], x[..., :h]], -1), s2)


class _Rotate(torch.autograd.Function):
    """RoPE as one autograd node: ``y = x ∘ [cos, cos] + swap(x) ∘ [−sin, sin]``, ``swap`` exchanging the halves
    ``x[..., :d/2]`` and ``x[..., d/2:]`` (the pairs rotated); its gradient is the same rotation by the opposite
    angles (twice differentiable: the backward is this function again)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, c2: Tensor, s2: Tensor) -> Tensor:
        ctx.save_for_backward(c2, s2)
        return _rotate(x, c2, s2)

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None, None]:
        c2, s2 = ctx.saved_tensors
        return _Rotate.apply(g, c2, -s2), None, None


def _apply_rope(x: Tensor, positions: Tensor, base: float = 10000.0) -> Tensor:
    """RoPE of ``x`` (batch, time, heads, dim) at integer ``positions`` (time,), the convention of
    :func:`seqmem.mixers.attention.apply_rope` (pairs ``(x[..., i], x[..., i + dim/2])``)."""
    cos, sin = rope_angles(positions, x.shape[-1], base, x.dtype)
    c2, s2 = torch.cat([cos, cos], -1)[:, None, :], torch.cat([-sin, sin], -1)[:, None, :]
    if x.requires_grad and torch.is_grad_enabled():
        return _Rotate.apply(x, c2, s2)
    return _rotate(x, c2, s2)  # no graph to record (decoding): the same numbers without the autograd node


Ctx = dict[str, Tensor]


@register(
    "block_attention",
    facts=dict(
        state_promise=("bounded", "only the current partial block is held"),
        numerics_smoke=(7e-7, 1.5e-2, 2e-3),  # measured 2.3e-7, 4.8e-3, 5.8e-4
        numerics_full=((6.8e-07, 6.6e-07), (1.4e-02, 1.4e-02), (1.8e-03, 1.8e-03)),
    ),
    description="Transformer++ block-local causal softmax attention (RoPE, no memory)",
)
class BlockAttention(Mixer):
    """Block-local causal softmax attention (the paper's Transformer++); base of the memory mixers.

    RoPE's base defaults to 10,000 (RoFormer's): the paper does not give it (Llama-3's 500,000 is one option away,
    ``rope_base=5e5``); every committed Elastic result used the default."""

    contract_configs: ClassVar[list[dict[str, Any]]] = [{"block_len": 8}]
    pos_on_host: ClassVar[bool] = True  # a decode step reads its position from the host (Mixer._state_pos)
    length_options: ClassVar[dict[str, str]] = {"block_len": "block"}
    # fast form: a piece of t queries starting c > 0 tokens into a block runs as the padded causal square when
    # t >= max(square_min_queries, c), else as one masked SDPA call of the t queries
    square_min_queries: ClassVar[int] = 256
    option_domains: ClassVar[dict[str, str]] = {"block_len": ">0", "rope_base": ">1"}

    def long_range_reason(self, seq_len: int) -> str | None:
        # the memory mixers override this; plain block attention sees only its own block
        if type(self)._mem_keys is BlockAttention._mem_keys and self.block_len < seq_len:
            return f"attention within {self.block_len}-token blocks and no memory (< {seq_len})"
        return None

    def __init__(
        self,
        d_model: int,
        n_heads: int = 4,
        impl: str = "fast",
        block_len: int = 2048,
        rope_base: float = 10000.0,
    ) -> None:
        super().__init__(d_model, n_heads, impl)
        self.head_dim = self._head_dim(rope=True)
        self.block_len = check_positive_int("block_len", block_len)
        if not (isinstance(rope_base, numbers.Real) and not isinstance(rope_base, bool) and rope_base > 1):
            raise ValueError(f"rope_base must be a number > 1, got {rope_base!r}")
        self.rope_base = float(rope_base)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        # decode: (state key tensor, its version, its rotated keys) for the states of the last step (see _forward)
        self._krot_cache: tuple[tuple[Tensor, int | None, Tensor], ...] = ()

    # -- memory hooks (overridden by the memory mixers)
    # ---------------------------------------------------------
    def _mem_keys(self) -> set[str]:
        return set()

    def _mem_size(self) -> int:
        return 0

    def _mem_init(self, b: int, like: Tensor) -> State:
        return {}

    def _mem_context(self, mem: State, blk: int) -> Ctx:
        """What block ``blk`` reads from the memory (tensors with batch first)."""
        return {}

    def _mem_visible(self, blk: int, n_mem: int) -> int:
        """How many of the ``n_mem`` memory tokens block ``blk`` reads (the newest ones; the same in every row).
        Known on the host from the block's index, so the fast form groups blocks without reading a mask back from
        the device.  Here: none in block 0 (the memory is empty), all of them after."""
        return n_mem if blk > 0 else 0

    def _mem_update(self, mem: State, k_raw: Tensor, v: Tensor, blk: int, reference: bool) -> State:
        """Fold completed block ``blk`` (raw keys / values, (batch, L, heads, head_dim)) into the memory."""
        return mem

    # -- contract
    # -----------------------------------------------------------------------------------------------
    def state_keys(self) -> set[str]:
        return {"k", "v", "pos"} | self._mem_keys()

    def state_size(self, seq_len: int) -> int:
        return 2 * self.d_model * (seq_len % self.block_len) + 1 + self._mem_size()

    def _rope(self, x: Tensor, positions: Tensor) -> Tensor:
        return _apply_rope(x, positions, self.rope_base)

    def _forward(self, x: Tensor, state: State | None) -> tuple[Tensor, State]:
        b, t, d = x.shape
        h, dh = self.n_heads, self.head_dim
        if state is None:
            kc = x.new_zeros(b, 0, d)
            vc = x.new_zeros(b, 0, d)
            start = 0
            mem = self._mem_init(b, x)
        else:
            kc, vc = state["k"], state["v"]
            start = self._state_pos(state)
            mem = {k: state[k] for k in self._mem_keys()}
            if kc.shape[1] != start % self.block_len or vc.shape[1] != start % self.block_len:
                raise ValueError(
                    f"{type(self).__name__}: state holds {kc.shape[1]} cached keys and {vc.shape[1]} cached values "
                    f"at pos {start}, expected {start % self.block_len} (the current block's tokens, pos mod "
                    f"block_len={self.block_len})"
                )
        q, k, v = self.qkv(x).view(b, t, 3, h, dh).unbind(2)
        c = kc.shape[1]
        K = torch.cat([kc.view(b, c, h, dh), k], 1) if c else k
        V = torch.cat([vc.view(b, c, h, dh), v], 1) if c else v
        # decoding within a block: the cached keys were rotated by an earlier step (same tensor, unmodified); two
        # entries: the state a step returned (the next step's input) and the state it was given (a step repeated
        # from one state, as when sampling several continuations)
        cache, self._krot_cache = self._krot_cache, ()
        krot_prefix = None
        for key_tensor, version, krot in cache:
            if c > 0 and key_tensor is kc and version == _version(kc):
                krot_prefix = krot
        k_rot = None
        if self.impl == "fast":
            y, mem, k_rot = self._fast(q, K, V, c, start, mem, krot_prefix)
        else:
            y, mem = self._reference(q, K, V, c, start, mem)
        y = self.out(y.reshape(b, t, d))
        n = c + t
        keep = (start + t) % self.block_len
        new_state: State = own_memory({  # own copies (no views into K, V): the decode cache below keys on them
            "k": K[:, n - keep :].reshape(b, keep, d),
            "v": V[:, n - keep :].reshape(b, keep, d),
            "pos": torch.full((b,), start + t, dtype=torch.long, device=x.device),
            **mem,
        })
        if k_rot is not None and keep == n and not torch.is_grad_enabled():
            self._krot_cache = ((new_state["k"], _version(new_state["k"]), k_rot),) + (
                ((kc, _version(kc), k_rot[:, :c]),) if c > 0 else ())
        return y, new_state

    # -- fast: all blocks at once
    # ---------------------------------------------------------------------------------
    def _fast(self, q: Tensor, K: Tensor, V: Tensor, c: int, start: int, mem: State,
              krot_prefix: Tensor | None = None) -> tuple[Tensor, State, Tensor | None]:
        """``(y, memory, rotated keys)``; the rotated keys (b, c + t, h, dh) only when every query lies in one block
        (else ``None``).  ``krot_prefix``: the first ``c`` keys already rotated (a decode step), or ``None``."""
        b, t, h, dh = q.shape
        L = self.block_len
        n = c + t
        nb = -(-n // L)
        b0 = (start - c) // L
        if nb == 1 and c and t >= max(self.square_min_queries, c):
            # a long piece that starts inside a block: the queries padded in front to the causal square (SDPA's
            # causal path; measured faster than the masked call from t ≈ c on, t ≥ 256)
            Kp, Vp, Qp, off = K[:, None], V[:, None], F.pad(q, (0, 0, 0, 0, c, 0))[:, None], 0
        elif nb == 1:  # all queries in one block (decoding, short pieces): only the t new queries, no padding
            Kp, Vp, Qp, off = K[:, None], V[:, None], q[:, None], c
        else:  # several blocks: pad to whole blocks, queries at their in-block slots
            pad = nb * L - n

            def blocks(z: Tensor, front: int = 0) -> Tensor:  # no copy when nothing is padded
                return (F.pad(z, (0, 0, 0, 0, front, pad)) if front or pad else z).view(b, nb, L, h, dh)

            Kp, Vp, Qp, off = blocks(K), blocks(V), blocks(q, c), 0
        ctx, mem = self._mem_scan(mem, Kp, Vp, b0, min(nb, n // L))
        lq, lk = Qp.shape[2], Kp.shape[2]
        qpos = torch.arange(off, off + lq, device=q.device)
        kpos = torch.arange(lk, device=q.device)
        q_rot = self._rope(Qp.reshape(b * nb, lq, h, dh), qpos).view(b, nb, lq, h, dh)
        if nb == 1 and krot_prefix is not None:  # rotate only the new keys (RoPE is per position: same values)
            k_rot = torch.cat([krot_prefix, self._rope(Kp[:, 0, c:], kpos[c:])], 1)[:, None]
        else:
            k_rot = self._rope(Kp.reshape(b * nb, lk, h, dh), kpos).view(b, nb, lk, h, dh)
        y = self._attend_fast(q_rot, Qp, k_rot, Vp, ctx, off, b0)
        if nb == 1:
            return (y[:, 0, c:] if Qp.shape[2] > t else y[:, 0]), mem, k_rot[:, 0]
        y = y.reshape(b, nb * L, h, dh)
        return (y if c == 0 and t == nb * L else y[:, c : c + t]), mem, None

    def _mem_scan(self, mem: State, Kp: Tensor, Vp: Tensor, b0: int, done: int) -> tuple[Ctx, State]:
        """What every block reads, stacked on dim 1, and the memory after the ``done`` complete blocks: a
        sequential scan over the blocks of ``Kp``, ``Vp`` (batch, blocks, L, heads, head_dim), the first being
        block ``b0``.  A memory mixer may override it with a batched form of the same numbers."""
        ctxs = []
        Ks, Vs = Kp.unbind(1), Vp.unbind(1)  # one unbind, not a slice per block (each would zero-fill a gradient)
        for j in range(Kp.shape[1]):
            ctxs.append(self._mem_context(mem, b0 + j))
            if j < done:
                mem = self._mem_update(mem, Ks[j], Vs[j], b0 + j, reference=False)
        return {key: torch.stack([cx[key] for cx in ctxs], 1) for key in ctxs[0]}, mem

    def _attend_fast(
        self, q_rot: Tensor, q_raw: Tensor, k_rot: Tensor, v: Tensor, ctx: Ctx, off: int = 0, b0: int = 0
    ) -> Tensor:
        """Joint softmax over [memory tokens; causal block keys] for all blocks; (b, nb, L, h, dh) tensors.

        ``off``: in-block position of the first query (queries and keys of one block may differ in length);
        ``b0``: the index of the first block.
        """
        kinds = None
        if "k" in ctx:  # what each block sees of its memory, from the block index (see _mem_visible)
            M = ctx["k"].shape[2]
            kinds = [visible_kind(self._mem_visible(b0 + j, M), M) for j in range(q_rot.shape[1])]
        return trapezoidal_attention(q_rot, k_rot, v, ctx.get("k"), ctx.get("v"), ctx.get("valid"), offset=off,
                                     mem_kinds=kinds)

    # -- reference: per token
    # -------------------------------------------------------------------------------------
    def _reference(
        self, q: Tensor, K: Tensor, V: Tensor, c: int, start: int, mem: State
    ) -> tuple[Tensor, State]:
        b, t, h, dh = q.shape
        L = self.block_len
        lo = 0  # first token of the current block inside K / V
        ctx = self._mem_context(mem, start // L)
        outs = []
        for i in range(t):
            p = start + i
            off = p % L
            if off == 0 and i > 0:
                ctx = self._mem_context(mem, p // L)
            hi = c + i + 1
            kb, vb = K[:, lo:hi], V[:, lo:hi]
            q_rot = self._rope(q[:, i : i + 1], torch.arange(off, off + 1, device=q.device))[:, 0]
            k_rot = self._rope(kb, torch.arange(off + 1, device=q.device))
            outs.append(self._attend_token(q_rot, q[:, i], k_rot, vb, ctx, p // L))
            if off == L - 1:  # block complete: fold it into the memory, start a new block
                mem = self._mem_update(mem, kb, vb, p // L, reference=True)
                lo = hi
        return torch.stack(outs, 1), mem

    def _attend_token(self, q_rot: Tensor, q_raw: Tensor, k_rot: Tensor, v: Tensor, ctx: Ctx, blk: int) -> Tensor:
        """One query (b, h, dh) against the visible block keys (b, n, h, dh) and the memory tokens of its block,
        ``blk``."""
        return trapezoidal_attention_token(q_rot, k_rot, v, ctx.get("k"), ctx.get("v"), ctx.get("valid"),
                                           scale=self.head_dim**-0.5)  # fmt: skip

    def extra_repr(self) -> str:
        return super().extra_repr() + f", block_len={self.block_len}"


@register(
    "elastic",
    facts=dict(
        state_promise=("bounded", "HiPPO-LegS coefficients of the history under the uniform measure on [0, t]"),
        numerics_smoke=(7e-7, 1.5e-2, 2e-3),  # measured 2.1e-7, 4.8e-3, 5.8e-4
        numerics_full=((8.6e-07, 8.3e-07), (1.6e-02, 1.6e-02), (2.0e-03, 2.0e-03)),
    ),
    sampling="exponential",
    description="Elastic Memory: HiPPO-LegS compressed K/V memory + trapezoidal attention",
)
@register(
    "elastic_uni",
    facts=dict(
        state_promise=("bounded", "HiPPO-LegS coefficients of the history under the uniform measure on [0, t]"),
        numerics_smoke=(7e-7, 1.5e-2, 2e-3),  # measured 2.1e-7, 4.8e-3, 5.8e-4
        numerics_full=((7.9e-07, 7.9e-07), (1.6e-02, 1.6e-02), (2.0e-03, 2.0e-03)),
    ),
    sampling="uniform", description="Elastic Memory with uniform polynomial sampling")
class Elastic(BlockAttention):
    """Elastic Memory attention (Elastic Memory paper, Algorithm 1): block attention + HiPPO-LegS memory of raw K and V.

    Options: ``block_len`` (L, paper 2048), ``hippo_n`` (N, paper 540 at "1x"), ``mem_tokens`` (L_mem;
    default N), ``sampling`` (``"exponential"`` | ``"uniform"`` | ``"midpoint"``), ``alpha`` (exponential decay;
    default ``eps^{1/(L_mem−1)}``), ``eps`` (distance of the newest sample point from the present, as a fraction
    of the history).  Zero trainable parameters beyond block attention's.
    BlockAttention's options (``n_heads``, ``impl``, ``block_len``, ``rope_base``) pass through (keyword-only).
    """

    contract_configs: ClassVar[list[dict[str, Any]]] = [
        {"block_len": 8, "hippo_n": 6},
        {"block_len": 8, "hippo_n": 12, "mem_tokens": 5, "sampling": "uniform"},
        {"block_len": 5, "hippo_n": 4, "mem_tokens": 7, "sampling": "midpoint", "n_heads": 1},
    ]
    length_options: ClassVar[dict[str, str]] = {"block_len": "block", "hippo_n": "memory"}
    # alpha None = eps^{1/(L_mem−1)}; alpha and eps are fractions of the history (see set_sampling)
    option_domains: ClassVar[dict[str, str]] = {"hippo_n": ">0", "mem_tokens": ">0", "alpha": "(0,1)", "eps": "(0,1)"}

    def __init__(
        self,
        d_model: int,
        *,
        hippo_n: int = 540,
        mem_tokens: int | None = None,
        sampling: str = "exponential",
        alpha: float | None = None,
        eps: float = 1e-3,
        **block_options: Any,
    ) -> None:
        super().__init__(d_model, **block_options)
        self.hippo_n = check_positive_int("hippo_n", hippo_n)
        self.mem_tokens = self.hippo_n if mem_tokens is None else check_positive_int("mem_tokens", mem_tokens)
        # decoding: the memory tokens of the current block, reused while the same memory tensor comes back (and the
        # sample points are those they were built with: set_sampling clears it)
        self._ctx_cache: tuple[Tensor, int | None, int, Any, Ctx] | None = None
        self._R: dict[tuple, Tensor] = {}
        self.set_sampling(sampling, alpha, eps)

    def set_sampling(self, sampling: str, alpha: float | None = None, eps: float | None = None) -> None:
        """Switch the retrieval sample points: test-time inductive-bias injection (Section 3.5)."""
        check_choice("sampling", sampling, SAMPLINGS)
        eps = getattr(self, "eps", 1e-3) if eps is None else eps
        if not (isinstance(eps, numbers.Real) and not isinstance(eps, bool) and 0 < eps < 1):
            raise ValueError(f"eps must be in (0, 1), got {eps!r}")
        if alpha is not None and not (isinstance(alpha, numbers.Real) and not isinstance(alpha, bool)
                                      and 0 < alpha < 1):
            raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
        self.sampling, self.alpha, self.eps = sampling, None if alpha is None else float(alpha), float(eps)
        self._fractions = sample_fractions(sampling, self.mem_tokens, alpha=alpha, eps=self.eps)
        self._ctx_cache = None  # memory tokens built from the former sample points

    def _recon(self, like: Tensor) -> Tensor:
        key = (self.sampling, self.alpha, self.eps, like.dtype, like.device)
        if key not in self._R:
            self._R = {}  # one entry: the current sampling's
        return cached_constants(self._R, key, lambda: legs_reconstruction_matrix(
            self.hippo_n, self._fractions, like.dtype, like.device))

    def _block_mats(self, first: int, count: int, like: Tensor) -> list[tuple[Tensor, Tensor]]:
        """``(P_b, K̄_b)`` of Eq. 6 for blocks ``first .. first + count − 1`` in ``like``'s dtype and device: float64
        closed forms computed once and kept, shared by every layer of the same ``hippo_n`` and ``block_len``
        (:func:`seqmem.ops.hippo.legs_blocks`)."""
        return legs_blocks(self.hippo_n, self.block_len, first, count, like.dtype, like.device)

    def prepare_compile(self, seq_len: int) -> None:
        """Build, before ``torch.compile`` traces a forward over ``seq_len`` tokens, the fixed matrices it reads:
        ``R`` (Eq. 8) and ``(P_b, K̄_b)`` (Eq. 6) of every block, in the parameters' dtype and device.  They come
        from float64 numpy closed forms; built while traced, each block index became a graph break and a compiled
        frame of its own (dynamo's recompile limit at 8 blocks); prebuilt, the traced forward only reads them."""
        like = self.qkv.weight
        self._recon(like)
        self._block_mats(0, -(-seq_len // self.block_len), like)

    def _mem_keys(self) -> set[str]:
        return {"mem"}

    def _mem_size(self) -> int:
        return self.hippo_n * 2 * self.d_model

    def _mem_init(self, b: int, like: Tensor) -> State:
        return {"mem": like.new_zeros(b, self.hippo_n, 2 * self.d_model)}

    def _mem_context(self, mem: State, blk: int) -> Ctx:
        C = mem["mem"]
        cached = self._ctx_cache
        # The memory changes only at block ends, so token-by-token decoding passes the same tensor back L times:
        # reuse its memory tokens (Eq. 8) instead of rebuilding them per token.  Exact: same tensor object, same
        # version counter (not modified in place), same block; never while autograd records (no graph is kept).
        # Inference-mode tensors have no version counter: there the same object and block are the key.  The sample
        # points they were built from are part of the key too (set_sampling replaces them and clears the cache).
        version = _version(C)
        if (cached is not None and cached[0] is C and cached[1] == version and cached[2] == blk
                and cached[3] is self._fractions):
            return cached[4]
        b = C.shape[0]
        tok = self._recon(C) @ C  # Eq. 8: (b, L_mem, 2 d_model)
        h, dh = self.n_heads, self.head_dim
        M = tok.shape[1]
        ctx = {
            "k": tok[..., : self.d_model].reshape(b, M, h, dh),
            "v": tok[..., self.d_model :].reshape(b, M, h, dh),
            "valid": torch.full((b, M), self._mem_visible(blk, M) > 0, dtype=torch.bool, device=C.device),
        }
        self._ctx_cache = None if torch.is_grad_enabled() else (C, version, blk, self._fractions, ctx)
        return ctx

    def _mem_scan(self, mem: State, Kp: Tensor, Vp: Tensor, b0: int, done: int) -> tuple[Ctx, State]:
        """Batched Eq. 6 and Eq. 8: the input terms ``K̄_j F_j`` of all complete blocks in one batched matmul,
        then the (cheap) recurrence ``C_{j+1} = P_j C_j + K̄_j F_j``, then the memory tokens ``R C_j`` of every
        block in one more; block 0's memory is empty and is not reconstructed."""
        b, nb, L = Kp.shape[:3]
        if nb == 1:
            return super()._mem_scan(mem, Kp, Vp, b0, done)
        C = mem["mem"]
        Cs = [C]
        if done:
            mats = self._block_mats(b0, done, C)
            Kbar = torch.stack([Kb for _, Kb in mats])  # (done, N, L); K̄ [K_raw, V] = [K̄ K_raw, K̄ V]
            kf, vf = ((z if done == nb else z[:, :done]).reshape(b, done, L, -1) for z in (Kp, Vp))
            inputs = torch.cat([Kbar @ kf, Kbar @ vf], -1).unbind(1)  # done × (b, N, 2 d_model)
            for (P, _), inp in zip(mats, inputs):
                C = P @ C + inp
                Cs.append(C)
        hist = Cs[:nb] if b0 > 0 else Cs[1:nb]  # the memory each block reads (block 0: empty)
        tok = self._recon(C) @ torch.stack(hist, 1)  # (b, blocks read, L_mem, 2 d_model)
        if b0 == 0:
            tok = torch.cat([tok.new_zeros(b, 1, *tok.shape[2:]), tok], 1)
        h, dh, M = self.n_heads, self.head_dim, tok.shape[2]
        blk = torch.arange(b0, b0 + nb, device=C.device)
        tk, tv = tok.split(self.d_model, -1)
        ctx = {
            "k": tk.reshape(b, nb, M, h, dh),
            "v": tv.reshape(b, nb, M, h, dh),
            "valid": (blk > 0)[None, :, None].expand(b, nb, M),
        }
        return ctx, {"mem": C}

    def _mem_update(self, mem: State, k_raw: Tensor, v: Tensor, blk: int, reference: bool) -> State:
        b, L = k_raw.shape[:2]
        Fb = torch.cat([k_raw.reshape(b, L, -1), v.reshape(b, L, -1)], -1)  # (b, L, 2 d_model), raw K and V
        C = mem["mem"]
        if reference:  # Eq. 4, one token at a time (C is zero before block 0, where hippo_compress ignores it)
            pos = torch.full((b,), blk * L, dtype=torch.long, device=C.device)
            C = hippo_compress(Fb, self.hippo_n, mode="recurrent", initial_state={"c": C, "t": pos})
        else:  # Eq. 6, the whole block in two matmuls
            (P, K), = self._block_mats(blk, 1, C)
            C = P @ C + K @ Fb
        return {"mem": C}

    def extra_repr(self) -> str:
        return super().extra_repr() + (
            f", hippo_n={self.hippo_n}, mem_tokens={self.mem_tokens}, sampling={self.sampling!r}, "
            f"alpha={self.alpha}, eps={self.eps}"
        )


def memory_layer_stack(
    n_layers: int, memory_mixer: str, memory_layers: list[int] | int | None = None
) -> list[str]:
    """Mixer names for an LM stack: ``block_attention`` everywhere except ``memory_layers`` (0-indexed).

    The paper puts the memory at the 9th layer (index 8; §3.1); 12 layers in all is our inference (the paper gives
    no depth), so the default is the layer at 3/4 depth, ``ceil(0.75 * n_layers) − 1``, clipped to the stack.
    """
    n_layers = check_positive_int("n_layers", n_layers)
    if memory_layers is None:
        memory_layers = [max(0, min(n_layers - 1, math.ceil(0.75 * n_layers) - 1))]
    elif isinstance(memory_layers, int):
        memory_layers = [memory_layers]
    for i in memory_layers:
        if not (0 <= i < n_layers):
            raise ValueError(f"memory layer index {i} outside 0..{n_layers - 1}")
    return [memory_mixer if i in memory_layers else "block_attention" for i in range(n_layers)]
