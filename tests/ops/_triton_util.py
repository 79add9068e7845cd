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


def assert_layer_same_on_kernel(monkeypatch, op_module: ModuleType, layer: torch.nn.Module, op: str,
                                device: str) -> None:
    """``layer`` (forward, a split sequence continued from its state, input and parameter gradients) with ``op``'s
    Triton form on equals the same layer on the PyTorch forms.  ``op_module`` is the op's module: its
    ``_triton.use_triton`` is patched off for the reference and on for the kernel (so CPU tensors under the
    interpreter take the kernel), with the third-party backends off."""
    from conftest import assert_rel_close
    from seqmem import backends

    torch.manual_seed(0)
    layer = layer.to(device)
    x = torch.randn(1, 40, layer.d_model).to(device)
    w = torch.randn(1, 40, layer.d_model).to(device)

    def run(kernel: bool):
        monkeypatch.setattr(op_module._triton, "use_triton", lambda *ts: kernel)
        layer.zero_grad()
        xi = x.clone().requires_grad_()
        with backends.backends("pytorch"), backends.record_forms() as forms:
            y, _ = layer(xi, output_final_state=False)
            y1, st = layer(xi[:, :23])  # a split sequence, continued from its state
            y2, _ = layer(xi[:, 23:], st)
        ((y + torch.cat([y1, y2], 1)) * w).sum().backward()
        assert ("triton" in forms.get(op, {})) == kernel, forms
        grads = [p.grad.clone() for p in layer.parameters() if p.grad is not None]
        return y.detach(), torch.cat([y1, y2], 1).detach(), xi.grad, grads

    ref, out = run(False), run(True)
    assert_rel_close(out[0], ref[0], 1e-4, "y")
    assert_rel_close(out[1], ref[0], 1e-4, "y streamed")
    assert_rel_close(out[2], ref[2], 1e-4, "dx")
    assert len(out[3]) == len(ref[3])
    for i, (a, b) in enumerate(zip(out[3], ref[3])):
        assert_rel_close(a, b, 1e-4, f"parameter grad {i}")


def assert_same_as_reference(o: torch.Tensor, S: torch.Tensor, o_r: torch.Tensor, S_r: torch.Tensor,
                             ins: list[torch.Tensor], d: list[torch.Tensor], names: list[str], tol: float,
                             grad_tol: float, seed: int) -> None:
    """A kernel's float32 output ``o`` and final state ``S`` (computed from ``ins``) equal the float64 reference's
    ``o_r``, ``S_r`` (computed from ``d``, the same inputs in float64) within ``tol``, and so do the gradients of a
    random weighting of both (weights from ``seed``) with respect to every input, named ``names``, within
    ``grad_tol``."""
    from conftest import assert_rel_close

    assert o.dtype == torch.float32 and S.dtype == torch.float32
    assert_rel_close(o.double(), o_r, tol, "o")
    assert_rel_close(S.double(), S_r, tol, "S")
    gen = torch.Generator().manual_seed(seed)
    wo = torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.device)
    ws = torch.randn(S.shape, generator=gen, dtype=torch.float64).to(o.device)
    ga = torch.autograd.grad((o.double() * wo).sum() + (S.double() * ws).sum(), ins)
    gr = torch.autograd.grad((o_r * wo).sum() + (S_r * ws).sum(), d)
    for name, a, b in zip(names, ga, gr, strict=True):
        assert_rel_close(a.double(), b, grad_tol, f"d{name}")
