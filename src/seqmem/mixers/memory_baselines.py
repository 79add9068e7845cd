"""Baselines of the Elastic Memory paper (004, Table 1), on the block-attention base of ``elastic.py``.

All three read a memory once per block of ``block_len`` tokens (counted from the sequence start) and fold each
completed block into it; inside the block they use causal softmax attention with block-local RoPE.

* ``memorizing`` — Memorizing Transformer (Wu et al., 2022) as the paper re-implements it: a FIFO queue of the
  raw keys / values of the last ``n_queue`` tokens of previous blocks, read by *dense* attention (the kNN
  lookup is replaced by full attention, as in the paper), combined with local attention by a learned per-head
  gate: ``y = σ(g_h) A_mem + (1 − σ(g_h)) A_local`` (only ``y = A_local`` while the queue is empty).  Bounded
  state.
* ``infini`` — Infini-Transformer (Munkhdalai et al., 2024): per head a compressive memory ``M`` (d_k × d_v)
  and normaliser ``z``, read by linear attention ``A_mem = σ(q) M / (σ(q) z)`` (σ = ELU + 1), updated per
  block with the delta rule ``M ← M + σ(K)ᵀ (V − σ(K) M / (σ(K) z))``, ``z ← z + Σ σ(K)``; the paper adds an
  RMSNorm (we apply a parameter-free RMSNorm to ``A_mem`` per head, our choice; docs/elastic.md);
  ``y = σ(β_h) A_mem + (1 − σ(β_h)) A_local``.  ``M`` and ``z`` are undecayed sums: for float16 / bfloat16
  inputs they are kept and read in float32 (z = Σσ(k) passes float16's 65,504 after ~10⁵ tokens and the read
  would silently vanish).
* ``melodi`` — Melodi's short-term (intra-layer) memory as docs/elastic.md defines it (the Elastic Memory
  paper keeps only that part): ``n_summary`` learned summary tokens per layer.  After each block they attend
  (position-free softmax, the layer's own q/k/v projections) to ``[memory; the whole block]``; the result is
  linearly mixed with the previous memory, ``m ← σ(μ) ⊙ m + (1 − σ(μ)) ⊙ s`` (per slot; ``m = s`` after the
  first block).  The next block attends to the memory's keys / values (projected with the layer's k/v weights,
  no RoPE) in one joint softmax with the causal block keys.  Added parameters ``n_summary × d_model`` (+
  ``n_summary`` mix logits).

Memory keys and queries for the memory read are the raw (pre-RoPE) projections throughout (position-free
memory, like Elastic Memory's memory tokens).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqmem.mixers.base import State, check_positive_float, check_positive_int
from seqmem.mixers.elastic import BlockAttention, Ctx
from seqmem.ops._common import compute_dtype as _compute_dtype
from seqmem.ops._common import full_precision as _full_precision
from seqmem.ops.elastic.chunk import by_runs
from seqmem.registry import register


def _elu1(x: Tensor) -> Tensor:
    return F.elu(x) + 1.0


def _gate(logit: Tensor, a_mem: Tensor, a_loc: Tensor) -> Tensor:
    """``σ(g_h) A_mem + (1 − σ(g_h)) A_local`` with one gate logit per head (heads on dim −2)."""
    g = torch.sigmoid(logit)[:, None]  # (h, 1), broadcast over head_dim
    return g * a_mem + (1 - g) * a_loc


@register(
    "memorizing",
    facts=dict(
        state_promise=("bounded", "FIFO queue of n_queue keys/values"),
        numerics_smoke=(7e-7, 1.5e-2, 2e-3),  # measured 2.3e-7, 4.8e-3, 5.8e-4
        numerics_full=((6.4e-07, 6.5e-07), (1.6e-02, 1.6e-02), (1.9e-03, 1.9e-03)),
    ),
    description="Memorizing Transformer: FIFO memory of past K/V, dense read, per-head gate",
)
class Memorizing(BlockAttention):
    """Memorizing Transformer (dense-read variant; an Elastic Memory paper baseline): block attention + gated
    FIFO K/V memory.

    BlockAttention's options (``n_heads``, ``impl``, ``block_len``, ``rope_base``) pass through (keyword-only).
    """

    single_token_impl: ClassVar[str] = "reference"  # decode step: the per-token form is cheaper at T = 1

    contract_configs: ClassVar[list[dict[str, Any]]] = [
        {"block_len": 8, "n_queue": 12},
        {"block_len": 6, "n_queue": 4},
    ]
    length_options: ClassVar[dict[str, str]] = {"block_len": "block", "n_queue": "queue"}
    option_domains: ClassVar[dict[str, str]] = {"n_queue": ">0"}

    def long_range_reason(self, seq_len: int) -> str | None:
        # the last token's block starts at b; the queue then holds the n_queue tokens before b
        b = (seq_len - 1) // self.block_len * self.block_len
        if b > self.n_queue:
            return f"FIFO memory of {self.n_queue} tokens before the current {self.block_len}-token block (< {seq_len})"
        return None

    def __init__(self, d_model: int, *, n_queue: int = 2048, **block_options: Any) -> None:
        super().__init__(d_model, **block_options)
        self.n_queue = check_positive_int("n_queue", n_queue)
        self.mem_gate = nn.Parameter(torch.zeros(self.n_heads))

    def _mem_keys(self) -> set[str]:
        return {"mem_k", "mem_v"}

    def _mem_size(self) -> int:
        return 2 * self.n_queue * self.d_model

    def _mem_init(self, b: int, like: Tensor) -> State:
        z = like.new_zeros(b, self.n_queue, self.d_model)
        return {"mem_k": z, "mem_v": z.clone()}

    def _mem_visible(self, blk: int, n_mem: int) -> int:
        return min(n_mem, blk * self.block_len)  # the newest slots of the queue hold the tokens seen so far

    def _mem_context(self, mem: State, blk: int) -> Ctx:
        b = mem["mem_k"].shape[0]
        filled = self._mem_visible(blk, self.n_queue)  # the newest `filled` slots hold real tokens
        valid = torch.arange(self.n_queue, device=mem["mem_k"].device) >= self.n_queue - filled
        h, dh = self.n_heads, self.head_dim
        return {
            "k": mem["mem_k"].view(b, self.n_queue, h, dh),
            "v": mem["mem_v"].view(b, self.n_queue, h, dh),
            "valid": valid.expand(b, self.n_queue),
        }

    def _mem_update(self, mem: State, k_raw: Tensor, v: Tensor, blk: int, reference: bool) -> State:
        b, L = k_raw.shape[:2]
        mk = torch.cat([mem["mem_k"], k_raw.reshape(b, L, -1)], 1)[:, -self.n_queue :]
        mv = torch.cat([mem["mem_v"], v.reshape(b, L, -1)], 1)[:, -self.n_queue :]
        return {"mem_k": mk, "mem_v": mv}

    def _attend_fast(
        self, q_rot: Tensor, q_raw: Tensor, k_rot: Tensor, v: Tensor, ctx: Ctx, off: int = 0, b0: int = 0
    ) -> Tensor:
        """Local attention for all blocks, then per run of blocks with the same number ``f`` of filled queue slots
        (the newest ``f``; the same in every sequence) one unmasked SDPA call of the queries against those slots,
        gated in; blocks with an empty queue keep ``A_local``."""
        a_loc = super()._attend_fast(q_rot, q_raw, k_rot, v, {}, off)
        b, nb, lq, h, dh = q_raw.shape
        M = self.n_queue

        def run(f: int, pieces: tuple[Tensor, ...]) -> Tensor:
            a_j, q_j, k_j, v_j = pieces
            if f == 0:
                return a_j
            n = a_j.shape[1]
            qm = q_j.reshape(b * n, lq, h, dh).transpose(1, 2)
            km = k_j[:, :, M - f :].reshape(b * n, f, h, dh).transpose(1, 2)
            vm = v_j[:, :, M - f :].reshape(b * n, f, h, dh).transpose(1, 2)
            a_mem = F.scaled_dot_product_attention(qm, km, vm).transpose(1, 2).reshape(b, n, lq, h, dh)
            return _gate(self.mem_gate, a_mem, a_j)

        # filled slots per block: the same in every row, known from the block index (no read-back of the mask)
        filled = [self._mem_visible(b0 + j, M) for j in range(nb)]
        return by_runs(filled, (a_loc, q_raw, ctx["k"], ctx["v"]), run)

    def _attend_token(self, q_rot: Tensor, q_raw: Tensor, k_rot: Tensor, v: Tensor, ctx: Ctx, blk: int) -> Tensor:
        a_loc = super()._attend_token(q_rot, q_raw, k_rot, v, {}, blk)
        valid = ctx["valid"]  # (b, M)
        if self._mem_visible(blk, self.n_queue) == 0:  # the queue is empty (from the block index: no device read)
            return a_loc
        scale = self.head_dim**-0.5
        s = torch.einsum("bhd,bmhd->bhm", q_raw, ctx["k"]) * scale
        s = s.masked_fill(~valid[:, None, :], float("-inf"))
        a_mem = torch.einsum("bhm,bmhd->bhd", torch.softmax(s, -1), ctx["v"])
        return _gate(self.mem_gate, a_mem, a_loc)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", n_queue={self.n_queue}"


@register(
    "infini",
    facts=dict(
        state_promise=("grows", "normaliser z = Σ σ(k) grows O(T) by design; no bound on the delta-rule memory M"),
        numerics_smoke=(7e-7, 1.5e-2, 2e-3),  # measured 2.3e-7, 4.8e-3, 5.8e-4 (float32 memory since #10 §2)
        numerics_full=((5.6e-07, 5.8e-07), (1.3e-02, 1.4e-02), (1.7e-03, 1.7e-03)),
    ),
    description="Infini-Transformer: compressive delta-rule memory (linear-attention read) + gate",
)
class Infini(BlockAttention):
    """Infini-attention (delta-rule memory; an Elastic Memory paper baseline) on block-local attention.

    BlockAttention's options (``n_heads``, ``impl``, ``block_len``, ``rope_base``) pass through (keyword-only).
    """

    contract_configs: ClassVar[list[dict[str, Any]]] = [
        {"block_len": 8},
        {"block_len": 5, "update": "linear"},
    ]
    option_domains: ClassVar[dict[str, str]] = {"norm_eps": ">0"}  # the read's denominator and the RMS norm

    def __init__(self, d_model: int, *, update: str = "delta", norm_eps: float = 1e-6, **block_options: Any) -> None:
        super().__init__(d_model, **block_options)
        if update not in ("delta", "linear"):
            raise ValueError(f"update must be 'delta' or 'linear', got {update!r}")
        self.update, self.norm_eps = update, check_positive_float("norm_eps", norm_eps)
        self.mem_gate = nn.Parameter(torch.zeros(self.n_heads))

    def _mem_keys(self) -> set[str]:
        return {"mem_M", "mem_z"}

    def _mem_size(self) -> int:
        return self.n_heads * self.head_dim * (self.head_dim + 1)

    def _mem_init(self, b: int, like: Tensor) -> State:
        # the memory is an undecayed sum (z = Σσ(k) passes float16's 65,504 after ~10⁵ tokens): kept in float32
        # for float16 / bfloat16 inputs (float64 stays float64)
        h, dh = self.n_heads, self.head_dim
        cd = _compute_dtype(like)
        return {"mem_M": like.new_zeros(b, h, dh, dh, dtype=cd), "mem_z": like.new_zeros(b, h, dh, dtype=cd)}

    def _mem_context(self, mem: State, blk: int) -> Ctx:
        b = mem["mem_M"].shape[0]
        return {"M": mem["mem_M"], "z": mem["mem_z"],
                "empty": torch.full((b,), self._mem_visible(blk, 1) == 0, dtype=torch.bool,
                                    device=mem["mem_M"].device)}  # fmt: skip

    def _read(self, sq: Tensor, M: Tensor, z: Tensor, eq: str, eqz: str) -> Tensor:
        """σ(q) M / (σ(q) z + eps) in M's dtype (float32 for half inputs; autocast off)."""
        with _full_precision(sq.device):
            sq = sq.to(M.dtype)
            num = torch.einsum(eq, sq, M)
            den = torch.einsum(eqz, sq, z)[..., None] + self.norm_eps
            return num / den

    def _mem_update(self, mem: State, k_raw: Tensor, v: Tensor, blk: int, reference: bool) -> State:
        M, z = mem["mem_M"], mem["mem_z"]
        with _full_precision(k_raw.device):
            sk = _elu1(k_raw.to(M.dtype))  # (b, L, h, dk)
            v = v.to(M.dtype)
            if self.update == "delta" and blk > 0:  # block 0 reads the empty memory: 0 (see _attend_token)
                v = v - self._read(sk, M, z, "blhk,bhkv->blhv", "blhk,bhk->blh")
            M = M + torch.einsum("blhk,blhv->bhkv", sk, v)
            z = z + sk.sum(1)
        return {"mem_M": M, "mem_z": z}

    def _norm(self, a: Tensor) -> Tensor:
        return a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + self.norm_eps)

    def _mem_out(self, q_raw: Tensor, ctx: Ctx, eq: str, eqz: str, like: Tensor) -> Tensor:
        """The normalised memory read, computed in the memory's dtype and returned in ``like``'s dtype."""
        a = self._read(_elu1(q_raw.to(ctx["M"].dtype)), ctx["M"], ctx["z"], eq, eqz)
        with _full_precision(a.device):
            return self._norm(a).to(like.dtype)

    def _attend_fast(
        self, q_rot: Tensor, q_raw: Tensor, k_rot: Tensor, v: Tensor, ctx: Ctx, off: int = 0, b0: int = 0
    ) -> Tensor:
        """Blocks whose memory is still empty (block 0: M = 0, z = 0, so A_mem = 0 exactly) get
        ``(1 − σ(g_h)) A_local`` without the read."""
        a_loc = super()._attend_fast(q_rot, q_raw, k_rot, v, {}, off)

        def run(empty: bool, pieces: tuple[Tensor, ...]) -> Tensor:
            a_j, q_j, M_j, z_j = pieces
            if empty:
                return (1 - torch.sigmoid(self.mem_gate)[:, None]) * a_j
            a_mem = self._mem_out(q_j, {"M": M_j, "z": z_j}, "bnlhk,bnhkv->bnlhv", "bnlhk,bnhk->bnlh", a_j)
            return _gate(self.mem_gate, a_mem, a_j)

        empty = [self._mem_visible(b0 + j, 1) == 0 for j in range(q_raw.shape[1])]  # from the block index
        return by_runs(empty, (a_loc, q_raw, ctx["M"], ctx["z"]), run)

    def _attend_token(self, q_rot: Tensor, q_raw: Tensor, k_rot: Tensor, v: Tensor, ctx: Ctx, blk: int) -> Tensor:
        a_loc = super()._attend_token(q_rot, q_raw, k_rot, v, {}, blk)
        if self._mem_visible(blk, 1) == 0:  # block 0, known from its index (no device read); as _attend_fast:
            # M = 0, z = 0, so A_mem = 0 exactly and so are its gradients, but they pass through ÷ (σ(q)·z + eps)
            # = ÷ eps: a backward run inside float16 autocast (its matmuls in float16) turned that into inf · 0 = NaN
            return (1 - torch.sigmoid(self.mem_gate)[:, None]) * a_loc
        a_mem = self._mem_out(q_raw, ctx, "bhk,bhkv->bhv", "bhk,bhk->bh", a_loc)
        return _gate(self.mem_gate, a_mem, a_loc)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", update={self.update!r}"


@register(
    "melodi",
    facts=dict(
        state_promise=("bounded", "fixed summary memory, gated mix of old memory and new summaries (no proof)"),
        numerics_smoke=(7e-7, 1.5e-2, 2e-3),  # measured 2.2e-7, 4.8e-3, 5.8e-4
        numerics_full=((7.5e-07, 7.5e-07), (1.5e-02, 1.5e-02), (1.9e-03, 1.8e-03)),
    ),
    description="Melodi short-term memory: learned summary tokens, self-attn + linear mix, read by attention",
)
class Melodi(BlockAttention):
    """Melodi short-term summary-token memory on block-local attention (an Elastic Memory paper baseline).

    BlockAttention's options (``n_heads``, ``impl``, ``block_len``, ``rope_base``) pass through (keyword-only).
    """

    single_token_impl: ClassVar[str] = "reference"  # decode step: the per-token form is cheaper at T = 1

    contract_configs: ClassVar[list[dict[str, Any]]] = [{"block_len": 8, "n_summary": 3}]
    length_options: ClassVar[dict[str, str]] = {"block_len": "block", "n_summary": "memory"}
    option_domains: ClassVar[dict[str, str]] = {"n_summary": ">0"}

    def __init__(self, d_model: int, *, n_summary: int = 64, **block_options: Any) -> None:
        super().__init__(d_model, **block_options)
        self.n_summary = check_positive_int("n_summary", n_summary)
        self.summary = nn.Parameter(torch.randn(n_summary, d_model) * d_model**-0.5)
        self.mix_logit = nn.Parameter(torch.zeros(n_summary))

    def _mem_keys(self) -> set[str]:
        return {"mem"}

    def _mem_size(self) -> int:
        return self.n_summary * self.d_model

    def _mem_init(self, b: int, like: Tensor) -> State:
        return {"mem": like.new_zeros(b, self.n_summary, self.d_model)}

    def _kv(self, m: Tensor) -> tuple[Tensor, Tensor]:
        d = self.d_model
        w = self.qkv.weight
        b, n = m.shape[:2]
        return (m @ w[d : 2 * d].T).view(b, n, self.n_heads, self.head_dim), (m @ w[2 * d :].T).view(
            b, n, self.n_heads, self.head_dim
        )

    def _mem_context(self, mem: State, blk: int) -> Ctx:
        m = mem["mem"]
        km, vm = self._kv(m)
        return {
            "k": km,
            "v": vm,
            "valid": torch.full(m.shape[:2], self._mem_visible(blk, m.shape[1]) > 0, dtype=torch.bool, device=m.device),
        }

    def _mem_update(self, mem: State, k_raw: Tensor, v: Tensor, blk: int, reference: bool) -> State:
        m = mem["mem"]
        b = m.shape[0]
        d, h, dh = self.d_model, self.n_heads, self.head_dim
        qs = (self.summary @ self.qkv.weight[:d].T).view(self.n_summary, h, dh)
        keys, vals = k_raw, v
        if blk > 0:
            km, vm = self._kv(m)
            keys, vals = torch.cat([km, keys], 1), torch.cat([vm, vals], 1)
        s = torch.einsum("shd,bjhd->bhsj", qs, keys) * dh**-0.5
        summ = torch.einsum("bhsj,bjhd->bshd", torch.softmax(s, -1), vals).reshape(b, self.n_summary, d)
        if blk == 0:
            return {"mem": summ}
        lam = torch.sigmoid(self.mix_logit)[:, None]
        return {"mem": lam * m + (1 - lam) * summ}

    def extra_repr(self) -> str:
        return super().extra_repr() + f", n_summary={self.n_summary}"
