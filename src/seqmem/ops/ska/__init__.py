"""Spectral Koopman Attention (SKA), Echo (Sridhar & Johansen 2026), as functional ops.

Per head, keys ``z_t`` and queries ``z^q_t`` in ``R^r``, values ``v_t`` in ``R^P``.  SKA keeps the additive
statistics

* ``G = Σ ẑ_t ẑ_tᵀ`` (+ ``εI``)            eq. (4)/(8)
* ``M = Σ ẑ_t ẑ_{t-1}ᵀ``                    eq. (5)/(9)
* ``C_v = Σ v_t ẑ_tᵀ``                      eq. (6)/(10)

and reads a query through the whitened Koopman operator (App. F): ``G̃ = LLᵀ``, ``A_w = L⁻¹ M L⁻ᵀ``, spectral
normalisation ``Â = γ A_w / max(σ_max(A_w), 1)`` with detached power iterations (eq. 12), power filter of order
``K`` and ridge readout ``ŷ = η C_v G̃⁻¹ L Âᴷ L⁻¹ q`` (eq. 13, Prop. I.8).

Collapse identity (docs/echo.md): since ``Â = c·L⁻¹ M L⁻ᵀ`` with the scalar ``c = γ/max(σ,1)``,

    ŷ = η · cᴷ · C_v (G̃⁻¹ M)ᴷ G̃⁻¹ q          (K = 0: exact ridge regression ``η C_v G̃⁻¹ q``)

which the fast path evaluates as ``u = L⁻¹q; u ← c A_w u (K times); ŷ = η C_v L⁻ᵀ u`` (no explicit ``B_v``).

Chunk-causal training (eqs. 7–10): tokens of chunk ``c`` (size ``S``) read statistics committed by chunks ``< c``
only (so chunk 0 outputs 0).  Both ``mode="chunk"`` (parallel) and ``mode="recurrent"`` (a per-token loop that
commits the statistics at the same chunk boundaries) return the same outputs and the same final state, which
holds the committed statistics plus the pending sums of the current partial chunk, so any split of a sequence
continues exactly (with ``norm="prefix_max"`` or ``"none"``; under ``"seqmax"`` the scale is frozen at the first
piece's maximum, so a split differs from one call, as the paper's decoding rule does).

Action mask (App. F eq. 53, App. G.1): ``mask=`` (B, T) in {0, 1} restricts the statistics to the tokens with
``m_t = 1`` (``M`` to adjacent pairs with both in), in the same chunk-causal form; every token still queries,
and the key norm still covers every key (App. F step 2 precedes the masked accumulation of step 3).

Key normalisation ``norm``:

* ``"prefix_max"`` (default, causal): chunk ``c`` divides keys/queries by ``m_c = max_{t < first(c)} ‖z_t‖``.
  By the adaptive-ridge identity (docs/echo.md) this equals raw statistics with ridge ``ε m_c²``, so the state
  holds RAW statistics and they are normalised when read; this is the paper's footnote rescale rule, done
  exactly.
* ``"seqmax"`` (paper eq. 3, NON-CAUSAL): one ``m = max_t ‖z_t‖`` over the whole input of the first call (it sees
  future tokens); later calls reuse that frozen ``m`` (the paper's decoding rule, §3.5).
* ``"none"``: ``m = 1``.

Files: ``naive.py`` is the recurrent reference (``mode="recurrent"``, and :func:`ska_readout_appf`, App. F step
by step); ``chunk.py`` the parallel form (``mode="chunk"``), the collapsed readout :func:`ska_readout` and the
statistics helpers.
"""

from seqmem.ops.ska.chunk import (
    ska_init_state,
    ska_readout,
    ska_ridge_readout,
    ska_spectral_scale,
    ska_statistics,
    spectral_koopman_attention,
)
from seqmem.ops.ska.naive import ska_readout_appf

__all__ = [
    "ska_spectral_scale",
    "ska_readout",
    "ska_readout_appf",
    "ska_ridge_readout",
    "ska_statistics",
    "spectral_koopman_attention",
    "ska_init_state",
]
