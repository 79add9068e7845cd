"""When the ops run their Triton kernels (``ops/<mechanism>/fused_recurrent.py``).

An op with a Triton kernel asks :func:`use_triton` on every fast-form call.  The answer is yes only when

* Triton kernels are not switched off: :func:`set_triton` (``False`` off, ``True`` on, ``None`` back to the
  environment) or the environment variable ``SEQMEM_TRITON=0``;
* ``triton`` is importable (checked once); and
* every tensor is on a CUDA device.

CPU tensors never take the kernels through this function, so CPU behaviour is that of the PyTorch / C++ forms.
The kernels themselves also take CPU tensors when their module was imported with Triton's interpreter on
(``TRITON_INTERPRET=1`` while ``triton.jit`` decorates them); the tests use this, calling the kernels directly or
through an op's ``backend="triton"``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os

from torch import Tensor

__all__ = ["device_guard", "set_triton", "triton_available", "use_float_kernel", "use_triton"]

_FORCED: bool | None = None
_AVAILABLE: bool | None = None


def triton_available() -> bool:
    """Whether ``triton`` can be imported (checked once, without importing it)."""
    global _AVAILABLE
    if _AVAILABLE is None:
        _AVAILABLE = importlib.util.find_spec("triton") is not None
    return _AVAILABLE


def set_triton(enabled: bool | None) -> bool | None:
    """Switch the Triton kernels on (``True``) or off (``False``) for every op, or back to the environment
    (``None``: on unless ``SEQMEM_TRITON=0``); returns the previous setting."""
    global _FORCED
    if enabled is not None and not isinstance(enabled, bool):
        raise ValueError(f"set_triton takes True, False or None, got {enabled!r}")
    prev, _FORCED = _FORCED, enabled
    return prev


def _enabled() -> bool:
    if _FORCED is not None:
        return _FORCED
    return os.environ.get("SEQMEM_TRITON", "1").strip().lower() not in ("0", "false", "off", "no")


def use_triton(*tensors: Tensor | None) -> bool:
    """True when the op should run its Triton kernel on these tensors (``None`` entries are ignored)."""
    ts = [t for t in tensors if t is not None]
    return bool(ts) and _enabled() and all(t.is_cuda for t in ts) and triton_available()


def use_float_kernel(*tensors: Tensor | None) -> bool:
    """:func:`use_triton`, for a kernel that computes in float32: none of the tensors is float64 (those take the
    PyTorch forms, which keep float64)."""
    import torch

    ts = [t for t in tensors if t is not None]
    return use_triton(*ts) and all(t.dtype != torch.float64 for t in ts)


def interpreted(kernel: object) -> bool:
    """Whether a ``triton.jit`` kernel was decorated with the interpreter on (it then runs on CPU tensors)."""
    return type(kernel).__name__ == "InterpretedFunction"


def check_device(op: str, kernel: object, *tensors: Tensor | None) -> None:
    """Raise a one-line error unless the tensors can go to ``kernel``: CUDA tensors for a compiled kernel, CPU
    tensors for one running in Triton's interpreter."""
    ts = [t for t in tensors if t is not None]
    if interpreted(kernel):
        if any(t.device.type != "cpu" for t in ts):
            raise ValueError(f"{op}: the kernel was imported under TRITON_INTERPRET=1 and takes CPU tensors only")
    elif any(not t.is_cuda for t in ts):
        raise ValueError(f"{op}: the Triton kernel needs CUDA tensors (CPU tensors only under TRITON_INTERPRET=1)")
    if len({t.device for t in ts}) > 1:
        raise ValueError(f"{op}: all tensors must be on one device, got {sorted({str(t.device) for t in ts})}")


def device_guard(x: Tensor) -> contextlib.AbstractContextManager:
    """The context to launch a kernel on ``x``'s device in: Triton launches on the *current* CUDA device and its
    stream, so a tensor on ``cuda:1`` while ``cuda:0`` is current needs ``torch.cuda.device(x.device)`` around the
    launch (a CPU tensor under the interpreter: nothing)."""
    import torch

    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


def num_warps(state_elems: int) -> int:
    """Warps per program for a kernel whose live register blocks hold ``state_elems`` floats in all (a forward:
    the state; a backward: the state and its gradient, so twice that).  Chosen from ptxas's spill counts for
    sm_80 / sm_90 (``python -m seqmem.bench.compile_kernels``): 4 warps spilled a 64 × 64 state's backward, and
    a 128 × 128 state spills less with 32 warps than with 16."""
    return 4 if state_elems <= 2048 else 8 if state_elems <= 8192 else 32
