"""Optional GPU fast paths for seqmem's ops (opt-in): flash-linear-attention's Triton kernels for the (gated) delta
rule and Mamba-2's for SSD, used only on CUDA tensors when the package is installed and the backend enabled —
``seqmem.backends.use_backends(["fla", "mamba_ssm"])``, ``with seqmem.backends.backends(["fla"]): ...`` or
``SEQMEM_BACKENDS=fla,mamba_ssm``.  Everything else (CPU, other dtypes, ``mode="recurrent"``, backends off — the
default) runs seqmem's own PyTorch forms, which stay the references.  See docs/ecosystem.md and
:mod:`seqmem.ops._backends`.

seqmem's own Triton kernels (Lattice, VLA; docs/ops.md) are on by default for CUDA tensors when ``triton`` is
installed: :func:`set_triton` (``False`` / ``True`` / ``None`` = the environment) or ``SEQMEM_TRITON=0`` switches
them off, :func:`use_triton` says whether an op would take them for given tensors.
"""

from seqmem.ops._backends import (
    backends,
    enabled_backends,
    list_backends,
    register_backend,
    unregister_backend,
    use_backends,
)
from seqmem.ops._triton import set_triton, triton_available, use_triton

__all__ = ["backends", "enabled_backends", "list_backends", "register_backend", "set_triton", "triton_available",
           "unregister_backend", "use_backends", "use_triton"]
