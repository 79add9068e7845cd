"""Former home of the VORT retrieval ops, kept so ``seqmem.ops.vort_ops`` imports keep working: see
:mod:`seqmem.ops.vort`."""

from seqmem.ops.vort.chunk import (  # noqa: F401
    MODES,
    NORMALIZERS,
    local_window_attention,
    refine_alpha,
    retrieval_loss,
    soe_kernel_matrix,
    soe_retention,
)
