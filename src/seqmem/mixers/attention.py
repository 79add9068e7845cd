"""Causal softmax multi-head attention with RoPE (``attention``) and sliding-window attention (``swa``).

fast: ``torch.nn.functional.scaled_dot_product_attention`` over [KV cache; new tokens]; with a window and many
keys, blocks of ``window`` queries against their ``2·window − 1`` keys (``seqmem.ops.local_attention``), linear in
the length.
reference: a per-token loop, softmax(q·K^T/√d)·V over the visible keys, written out.
State: the KV cache (post-RoPE keys) — all past tokens for ``attention``, the last ``window - 1`` for ``swa`` —
and, for ``swa``, the absolute position (RoPE needs it once the cache stops growing).
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqmem.mixers.base import Mixer, State, check_positive_float, check_positive_int
from seqmem.ops.local_attention import windowed_softmax
from seqmem.registry import register


def rope_angles(positions: Tensor, dim: int, base: float = 10000.0, dtype=torch.float32) -> tuple[Tensor, Tensor]:
    """cos/sin tables of shape (T, dim/2) for integer ``positions`` (T,) (RoFormer rotary embedding)."""
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=positions.device) / dim)
    ang = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x: Tensor, positions: Tensor, base: float = 10000.0) -> Tensor:
    """Rotate pairs (x[..., :d/2], x[..., d/2:]) of ``x`` (batch, time, heads, dim) by position-dependent angles."""
    d = x.shape[-1]
    if d % 2:
        raise ValueError(f"RoPE needs an even head dimension, got {d}")
    cos, sin = rope_angles(positions, d, base, x.dtype)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


@register(
    "attention",
    facts=dict(
        state_promise=("grows", "KV cache holds every token (O(T) state by design)"),
        numerics_smoke=(7e-7, 1.5e-2, 2e-3),  # measured 2.3e-7, 5.0e-3, 6.1e-4
        numerics_full=((7.7e-07, 1.3e-06), (1.6e-02, 1.6e-02), (1.8e-03, 1.8e-03)),
    ),
    window=None, description="causal softmax MHA with RoPE (SDPA); state = KV cache")
@register(
    "swa",
    facts=dict(
        state_promise=("bounded", "cache of the last `window` keys/values"),
        numerics_smoke=(7e-7, 1.5e-2, 2e-3),  # measured 2.2e-7, 4.9e-3, 6.2e-4
        numerics_full=((6.6e-07, 6.5e-07), (1.5e-02, 1.5e-02), (1.9e-03, 1.8e-03)),
    ),
    window=64, description="sliding-window softmax attention with RoPE; state = last window")
class Attention(Mixer):
    """Causal multi-head softmax attention with rotary positions; optional sliding window."""

    contract_configs: ClassVar[list[dict]] = [{}, {"window": 8}]
    pos_on_host: ClassVar[bool] = True  # a decode step reads its position from the host (Mixer._state_pos)
    length_options: ClassVar[dict[str, str]] = {"window": "window"}
    # window None = full causal attention; rope_base ≤ 1 gives inverse frequencies ≥ 1 (base 1: every pair turns
    # by the same angle t, positions only mod 2π)
    option_domains: ClassVar[dict[str, str]] = {"window": ">0", "rope_base": ">1"}

    def long_range_reason(self, seq_len: int) -> str | None:
        if self.window is not None and self.window < seq_len:
            return f"sliding window of {self.window} tokens (< {seq_len})"
        return None
    #: the windowed fast path uses banded blocks once the keys number at least max(this, 8·window); below that
    #: SDPA with a dense mask is as fast on CPU.  Measured (forward + backward, batch 16, d 128, 4 heads, one
    #: thread; approximate, not recorded: 2-core CPU, 2026-11-26): window 8 dense / banded 25 / 26 ms at 128
    #: keys, 65 / 53 at 256, 203 / 115 at 512; window 64 198 / 149 at 512, 678 / 304 at 1,024
    band_min_keys: ClassVar[int] = 256

    def __init__(
        self,
        d_model: int,
        n_heads: int = 4,
        impl: str = "fast",
        window: int | None = None,
        rope_base: float = 10000.0,
        bias: bool = False,
    ) -> None:
        super().__init__(d_model, n_heads, impl)
        self.head_dim = self._head_dim(rope=True)
        self.window = None if window is None else check_positive_int("window", window)
        self.rope_base = check_positive_float("rope_base", rope_base)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out = nn.Linear(d_model, d_model, bias=bias)

    def state_keys(self) -> set[str]:
        return {"k", "v", "pos"}

    def _cache_len(self, n: int) -> int:
        return n if self.window is None else min(n, self.window - 1)

    def state_size(self, seq_len: int) -> int:
        return 2 * self.d_model * self._cache_len(seq_len) + 1

    def _forward(self, x: Tensor, state: State | None) -> tuple[Tensor, State]:
        b, t, _ = x.shape
        h, dh = self.n_heads, self.head_dim
        if state is None:
            k_cache = x.new_zeros(b, h, 0, dh)
            v_cache = x.new_zeros(b, h, 0, dh)
            start = 0
        else:
            k_cache, v_cache = state["k"], state["v"]
            start = self._state_pos(state)
            want = self._cache_len(start)
            if k_cache.shape[2] != want or v_cache.shape[2] != want:
                rule = ("every past token" if self.window is None
                        else f"the last min(pos, window - 1) = min({start}, {self.window - 1}) tokens")
                raise ValueError(
                    f"{type(self).__name__}: state holds {k_cache.shape[2]} cached keys and {v_cache.shape[2]} "
                    f"cached values at pos {start}, expected {want} ({rule}; window={self.window}): a state "
                    "from another window or a truncated cache; pass state=None to start a new sequence"
                )
        q, k, v = self.qkv(x).view(b, t, 3, h, dh).unbind(2)
        pos = torch.arange(start, start + t, device=x.device)
        q = apply_rope(q, pos, self.rope_base).transpose(1, 2)  # (b, h, t, dh)
        k = apply_rope(k, pos, self.rope_base).transpose(1, 2)
        v = v.transpose(1, 2)
        keys = torch.cat([k_cache, k], 2)
        vals = torch.cat([v_cache, v], 2)
        n_past = k_cache.shape[2]
        if self.impl == "fast":
            y = self._sdpa(q, keys, vals, n_past)
        else:
            y = self._loop(q, keys, vals, n_past)
        y = self.out(y.transpose(1, 2).reshape(b, t, self.d_model))
        keep = self._cache_len(start + t)
        new_state = {
            "k": keys[:, :, keys.shape[2] - keep :],
            "v": vals[:, :, vals.shape[2] - keep :],
            "pos": torch.full((b,), start + t, dtype=torch.long, device=x.device),
        }
        return y, new_state

    def _visible(self, t: int, n_past: int, device) -> Tensor:
        """mask[i, j]: query i (absolute n_past+i within the cache frame) may see key j."""
        qi = torch.arange(t, device=device)[:, None] + n_past
        kj = torch.arange(n_past + t, device=device)[None, :]
        mask = kj <= qi
        if self.window is not None:
            mask = mask & (kj > qi - self.window)
        return mask

    def _sdpa(self, q: Tensor, keys: Tensor, vals: Tensor, n_past: int) -> Tensor:
        t = q.shape[2]
        if self.window is not None and n_past + t >= max(self.band_min_keys, 8 * self.window):
            # banded blocks of `window` queries, O(t·window) instead of SDPA's dense t×(n_past+t) mask
            o, _ = windowed_softmax(*(x.transpose(1, 2) for x in (q, keys, vals)), self.window, n_past,
                                    chunk_size=min(self.window, t))  # fmt: skip
            return o.transpose(1, 2)
        if n_past == 0 and self.window is None:
            return F.scaled_dot_product_attention(q, keys, vals, is_causal=True)
        return F.scaled_dot_product_attention(q, keys, vals, attn_mask=self._visible(t, n_past, q.device))

    def _loop(self, q: Tensor, keys: Tensor, vals: Tensor, n_past: int) -> Tensor:
        """Reference: for each query position, softmax over the keys it may see."""
        outs = []
        scale = self.head_dim**-0.5
        for i in range(q.shape[2]):
            hi = n_past + i + 1
            lo = 0 if self.window is None else max(0, hi - self.window)
            s = torch.einsum("bhd,bhjd->bhj", q[:, :, i], keys[:, :, lo:hi]) * scale
            p = torch.softmax(s, dim=-1)
            outs.append(torch.einsum("bhj,bhjd->bhd", p, vals[:, :, lo:hi]))
        return torch.stack(outs, 2)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", window={self.window}"
