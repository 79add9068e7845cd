"""GPU fast paths for seqmem's ops: flash-linear-attention's Triton kernels for linear attention and the (gated)
delta rule, Mamba-2's for SSD — used by default on CUDA where the package is installed (the ``gpu`` extra) and the
call is one its kernels take (float16/bfloat16, head sizes up to 256, ``mode="chunk"``).  Everything else runs
seqmem's own forms: on CUDA its Triton kernels where it has one (below), else (CPU, float64,
``mode="recurrent"``, ...) its PyTorch forms, which stay the references.

Turn them off (or choose) with ``seqmem.backends.use_backends("pytorch")`` / ``use_backends(["fla"])``, for a
block with ``with seqmem.backends.backends("pytorch"): ...``, without code changes with ``SEQMEM_BACKENDS=pytorch``
(or ``fla``, ``mamba_ssm``, ``fla,mamba_ssm``), and on the command line with ``seqmem bench speed --backend
pytorch``.  :func:`which_form` says which form an op takes for a device, dtype and head size;
:func:`record_forms` reports the forms that ran.  See docs/ecosystem.md and :mod:`seqmem.ops._backends`.

seqmem's own Triton kernels (Lattice, VLA, and a chunked simple-GLA kernel for VORT's retention and, where no
backend takes the call, ``linear_attention`` and ``ssd``; docs/ops.md) are on by default for CUDA tensors when
``triton`` is installed: :func:`set_triton` (``False`` / ``True`` / ``None`` = the environment) or
``SEQMEM_TRITON=0`` switches them off, :func:`use_triton` says whether an op would take them for given tensors.
"""

from seqmem.ops._backends import (
    DEFAULT,
    backends,
    enabled_backends,
    forms_text,
    list_backends,
    record_forms,
    register_backend,
    unregister_backend,
    use_backends,
    which_form,
)
from seqmem.ops._triton import set_triton, triton_available, use_triton

__all__ = ["DEFAULT", "backends", "enabled_backends", "forms_text", "list_backends", "record_forms",
           "register_backend", "set_triton", "triton_available", "unregister_backend", "use_backends",
           "use_triton", "which_form"]
