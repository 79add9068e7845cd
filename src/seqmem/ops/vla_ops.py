"""Former home of the VLA ops, kept so ``seqmem.ops.vla_ops`` imports keep working: see :mod:`seqmem.ops.vla`."""

from seqmem.ops._common import MODES  # noqa: F401
from seqmem.ops.vla.chunk import (  # noqa: F401
    NORMALIZERS,
    vla_attention,
    vla_generalized_delta_chunk,
    vla_jacobian_norm_closed_form,
    vla_paper_delta_rule,
)
