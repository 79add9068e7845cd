"""Former home of the Lattice kernel loader: ``seqmem.ops._lattice_cpp`` is the module
:mod:`seqmem.ops.lattice._cpp` itself (one module object, so setting its ``_LIB`` / ``_FAILED`` acts on the
loader the scan uses)."""

import sys

from seqmem.ops.lattice import _cpp

sys.modules[__name__] = _cpp
