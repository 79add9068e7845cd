"""FLOP counting and the GEMM peak the achieved rate is compared with.

FLOP count (documented, per op): :class:`torch.utils.flop_counter.FlopCounterMode` intercepts every aten op of one
forward+backward call and adds, for the matrix ops only,

* ``mm``/``addmm``/``bmm``/``baddbmm`` (every ``nn.Linear``, ``matmul`` and ``einsum`` lowers to these):
  ``2·m·n·k`` per product;
* convolutions: ``2·(output elements)·(kernel elements · in-channels / groups)`` forward and the same for each
  of the input and weight gradients (our formula for ``convolution_backward``: PyTorch's ignores ``groups`` and
  counts a depthwise short convolution's backward as a dense one, ~C× too high);
* scaled-dot-product attention (PyTorch's formula): forward ``4·B·H·Tq·Tk·d`` (two ``Tq×Tk×d`` products),
  backward ``10·B·H·Tq·Tk·d`` (five products, the score recomputation included).  We add the CPU flash kernel
  (``_scaled_dot_product_flash_attention_for_cpu`` and its backward), which PyTorch does not register, with the
  same formula halved when ``is_causal=True`` (the kernel skips the masked half).

Element-wise work (exp, gating, cumsum, norms), triangular solves and custom C++ kernels are not counted, so the
count is a lower bound of the work done and GFLOP/s measures how well a mixer turns its time into matrix products.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

aten = torch.ops.aten


def _shape(t: Any) -> Any:
    return t.shape if isinstance(t, torch.Tensor) else t


def _cpu_flash_fwd(query, key, value, dropout_p=0.0, is_causal=False, *args, out_val=None, **kwargs) -> int:  # noqa: ARG001
    n = sdpa_flop_count(_shape(query), _shape(key), _shape(value))
    return n // 2 if is_causal else n


def _cpu_flash_bwd(grad_out, query, key, value, out, logsumexp, dropout_p=0.0, is_causal=False, *args,  # noqa: ARG001
                   out_val=None, **kwargs) -> int:
    n = sdpa_backward_flop_count(_shape(grad_out), _shape(query), _shape(key), _shape(value))
    return n // 2 if is_causal else n


def _conv_bwd(grad_out, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,  # noqa: ARG001
              output_mask, *args, out_val=None, **kwargs) -> int:
    fwd = 2 * _shape(grad_out).numel() * _shape(w)[1:].numel()
    return fwd * (int(bool(output_mask[0])) + int(bool(output_mask[1])))



CUSTOM: dict[Any, Any] = {aten.convolution_backward: _conv_bwd}
if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu"):
    CUSTOM[aten._scaled_dot_product_flash_attention_for_cpu] = _cpu_flash_fwd
if hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward"):
    CUSTOM[aten._scaled_dot_product_flash_attention_for_cpu_backward] = _cpu_flash_bwd


class _FlopCounter(TorchDispatchMode):
    """A minimal FLOP-counting dispatch mode (like ``FlopCounterMode`` without its module tracking, whose
    autograd hooks import ``torch._dynamo``): PyTorch's per-op formulas plus :data:`CUSTOM`."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0
        self.by_op: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ARG002
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        formula = CUSTOM.get(packet) or flop_registry.get(packet)
        if formula is not None:
            n = int(formula(*args, **kwargs, out_val=out))
            self.total += n
            self.by_op[str(packet)] = self.by_op.get(str(packet), 0) + n
        return out


def count_flops(fn: Callable[[], Any], by_op: dict[str, int] | None = None) -> int:
    """Matrix FLOPs executed by one call of ``fn`` (see the module docstring for what is counted); if ``by_op`` is
    given it is filled with the count per aten op."""
    with _FlopCounter() as counter:
        fn()
    if by_op is not None:
        by_op.update(counter.by_op)
    return counter.total


def gemm_peak(device: torch.device, dtype: torch.dtype, sizes: tuple[int, ...] | list[int] = (512, 1024, 2048),
              repeats: int = 5) -> dict[str, Any]:
    """The machine's GEMM peak as seen by this process (same threads, same load): the best GFLOP/s of an
    ``n×n @ n×n`` product (``2n³`` FLOPs) in ``dtype`` over the ``sizes``, each timed ``repeats`` times after one
    warm-up."""
    best: dict[str, Any] | None = None
    for n in sizes:
        r = _gemm(device, dtype, n, repeats)
        if best is None or r["gflops"] > best["gflops"]:
            best = r
    assert best is not None
    return best


def _gemm(device: torch.device, dtype: torch.dtype, n: int, repeats: int) -> dict[str, Any]:
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return {"n": n, "dtype": str(dtype).replace("torch.", ""), "best_ms": best * 1e3, "gflops": 2 * n**3 / best / 1e9}
