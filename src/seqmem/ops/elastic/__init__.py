"""Elastic Memory's trapezoidal attention (Song et al., Eqs. 9–10): per block of ``L`` tokens, one joint softmax
over the memory tokens reconstructed from the HiPPO-LegS coefficients (:mod:`seqmem.ops.hippo`, Eqs. 7–8) and
the block's own causal keys.  ``naive.py`` is the reference (one query at a time, ``mode="recurrent"``),
``chunk.py`` the fast form (one masked SDPA call over all blocks, ``mode="chunk"``).  The memory itself (the
compression, Eq. 6, and the retrieval) is :func:`seqmem.ops.hippo_compress` / :func:`seqmem.ops.hippo_reconstruct`.
"""

from seqmem.ops.elastic.chunk import trapezoidal_attention

__all__ = ["trapezoidal_attention"]
