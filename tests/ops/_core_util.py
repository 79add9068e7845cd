"""Helpers shared by the core-op tests (test_linear_op, test_delta_ops, test_ssd_op)."""

from __future__ import annotations

import torch


def rand(*shape, dtype=torch.float64, seed=0, scale=1.0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64) * scale
    return x.to(dtype).requires_grad_(requires_grad)


def grads(fn, inputs, seed=123):
    """Gradients of a random projection of all outputs of ``fn(*inputs)`` w.r.t. ``inputs``."""
    outs = fn(*inputs)
    g = torch.Generator().manual_seed(seed)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype)).sum() for o in outs)
    return torch.autograd.grad(loss, [x for x in inputs if x is not None and x.requires_grad])
