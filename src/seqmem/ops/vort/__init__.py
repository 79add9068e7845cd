"""VORT (power-law retention): ``naive.py`` is the per-token reference of eqs. (14)–(16), ``chunk.py`` the exact
chunked and parallel forms plus the local attention, kernel-matrix and plasticity ops; :func:`soe_retention`
runs either (``mode="recurrent" | "chunk" | "parallel"``)."""

from seqmem.ops.vort.chunk import (
    kv_retention,
    local_window_attention,
    refine_alpha,
    retrieval_loss,
    soe_kernel_matrix,
    soe_retention,
)

__all__ = [
    "soe_retention", "kv_retention", "local_window_attention", "retrieval_loss", "refine_alpha", "soe_kernel_matrix"
]
