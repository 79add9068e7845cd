"""Former home of the Lattice ops, kept so ``seqmem.ops.lattice_ops`` imports keep working: see
:mod:`seqmem.ops.lattice`."""

from seqmem.ops.lattice import (  # noqa: F401
    LATTICE_OBJECTIVES,
    lattice_chunked,
    lattice_minibatch,
    lattice_scan,
    lattice_step,
    orthonormal_slots,
    soft_threshold,
    sphere_retract,
)
