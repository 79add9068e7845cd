"""Helpers shared by the core-op tests (test_linear_op, test_delta_ops, test_ssd_op)."""

from __future__ import annotations

import functools

import torch


def rand(*shape, dtype=torch.float64, seed=0, scale=1.0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64) * scale
    return x.to(dtype).requires_grad_(requires_grad)


def tensor_state(op):
    """``op`` with the bare state tensor of the math: ``initial_state=S`` is passed as ``{"S": S}`` and the returned
    state dict is read as its ``"S"`` (these tests are about the numbers; tests/ops/test_state_convention.py checks
    the dict form itself)."""

    @functools.wraps(op)
    def run(*args, initial_state=None, **kw):
        o, st = op(*args, initial_state=None if initial_state is None else {"S": initial_state}, **kw)
        return o, st["S"]

    return run


def grads(fn, inputs, seed=123):
    """Gradients of a random projection of all outputs of ``fn(*inputs)`` w.r.t. ``inputs``."""
    outs = fn(*inputs)
    g = torch.Generator().manual_seed(seed)
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=torch.float64).to(o.dtype)).sum() for o in outs)
    return torch.autograd.grad(loss, [x for x in inputs if x is not None and x.requires_grad])
