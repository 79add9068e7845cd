"""VLA (Variational Linear Attention): ``naive.py`` is the recurrent reference (Algorithm 1, step by step),
``chunk.py`` the exact chunked form, ``fused_recurrent.py`` the Triton kernels that ``mode="chunk"`` runs on CUDA
tensors (imported only then: they need ``triton``); :func:`vla_attention` / :func:`vla_paper_delta_rule` run
either (``mode="recurrent" | "chunk"``)."""

from seqmem.ops.vla.chunk import (
    vla_attention,
    vla_generalized_delta_chunk,
    vla_jacobian_norm_closed_form,
    vla_paper_delta_rule,
)

__all__ = ["vla_attention", "vla_paper_delta_rule", "vla_jacobian_norm_closed_form", "vla_generalized_delta_chunk"]
