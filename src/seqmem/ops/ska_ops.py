"""Former home of the SKA ops, kept so ``seqmem.ops.ska_ops`` imports keep working: see :mod:`seqmem.ops.ska`."""

from seqmem.ops.ska import *  # noqa: F403  (every name in seqmem.ops.ska.__all__)
from seqmem.ops.ska.chunk import MODES, NORMS, OPERATOR_FORMS, STATE_KEYS  # noqa: F401
