"""Former home of the SKA ops, kept so ``seqmem.ops.ska_ops`` imports keep working: see :mod:`seqmem.ops.ska`."""

from seqmem.ops.ska.chunk import (  # noqa: F401
    MODES,
    NORMS,
    OPERATOR_FORMS,
    STATE_KEYS,
    ska_init_state,
    ska_readout,
    ska_ridge_readout,
    ska_spectral_scale,
    ska_statistics,
    spectral_koopman_attention,
)
from seqmem.ops.ska.naive import ska_readout_appf  # noqa: F401
