"""Loading a Triton kernel module for the tests: compiled on CUDA when a GPU is present, else under Triton's CPU
interpreter.  Without a GPU nothing can be compiled anyway, so ``TRITON_INTERPRET=1`` is then set for the rest of
the session (triton reads it both when it decorates a kernel and when it first launches one)."""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType

import pytest
import torch

from seqmem.ops import _triton


def kernel_module(name: str) -> tuple[ModuleType, str]:
    """``(module, device)``; skips the calling test module when triton is not installed."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed (it is in the dev extra: pip install -e '.[dev]')",
                    allow_module_level=True)
    if torch.cuda.is_available():
        return importlib.import_module(name), "cuda"
    os.environ["TRITON_INTERPRET"] = "1"
    mod = importlib.import_module(name)
    if not any(_triton.interpreted(getattr(mod, a)) for a in dir(mod)):  # imported before: decorate again
        mod = importlib.reload(mod)
    return mod, "cpu"
