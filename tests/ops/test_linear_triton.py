"""Linear attention on CUDA where no backend applies (fla absent or off, or a float32 / float16 call fla does not
take): ``linear_attention(mode="chunk")`` runs seqmem's chunked simple-GLA Triton kernel with zero gates
(ops/vort/chunk_simple_gla.py).  CUDA is faked here (Triton's interpreter takes CPU tensors; the backends off):
against the recurrent reference in float64, in float32 — outputs, the state, the gradients of q, k, v and the
initial state, a split sequence continued from its state; the op's choice of form; and the linear_attention layer
through the kernel against the same layer on the PyTorch forms."""

from __future__ import annotations

import pytest
import torch
from _triton_util import assert_layer_same_on_kernel, assert_same_as_reference, kernel_module

import seqmem.ops as _ops
from seqmem import backends, build_mixer
from seqmem.ops.linear import chunk as lin_chunk

kern, DEVICE = kernel_module("seqmem.ops.vort.chunk_simple_gla")

B, T, H, DK, DV = 2, 37, 2, 6, 10


@pytest.fixture
def on_kernel(monkeypatch):
    if DEVICE == "cpu":
        monkeypatch.setattr(lin_chunk._triton, "use_triton", lambda *ts: True)
    with backends.backends("pytorch"):
        yield


def _inputs(seed, init=True):
    g = torch.Generator().manual_seed(seed)
    shapes = [(B, T, H, DK), (B, T, H, DK), (B, T, H, DV)] + ([(B, H, DK, DV)] if init else [])
    return [torch.randn(*s, generator=g).to(DEVICE).requires_grad_() for s in shapes]


def _check(o, S, ins, tol=2e-5):
    d = [x.detach().double().requires_grad_() for x in ins]
    o_r, st = _ops.linear_attention(*d[:3], scale=0.4, initial_state=({"S": d[3]} if len(d) > 3 else None),
                                    mode="recurrent")
    names = ["q", "k", "v", "S0"][:len(ins)]
    assert_same_as_reference(o, S, o_r, st["S"], ins, d, names, tol, 5 * tol, seed=4)


@pytest.mark.parametrize("init", [True, False])
def test_linear_attention_through_the_kernel(on_kernel, init):
    ins = _inputs(1, init)
    with backends.record_forms() as forms:
        o, st = _ops.linear_attention(*ins[:3], scale=0.4, initial_state=({"S": ins[3]} if init else None))
    assert forms == {"linear_attention": {"triton": 1}}
    _check(o, st["S"], ins)


def test_split_sequence_continues_from_its_state(on_kernel):
    ins = _inputs(2)
    o1, st = _ops.linear_attention(*(x[:, :21] for x in ins[:3]), scale=0.4, initial_state={"S": ins[3]})
    o2, st = _ops.linear_attention(*(x[:, 21:] for x in ins[:3]), scale=0.4, initial_state=st)
    _check(torch.cat([o1, o2], 1), st["S"], ins)


def test_choice_of_form(monkeypatch):
    """The kernel on CUDA (faked) with Triton on, for more than one token; one token, float64 and Triton off run
    the PyTorch forms, ``mode="recurrent"`` the reference loop."""
    q, k, v = (x.detach() for x in _inputs(3, init=False))
    monkeypatch.setattr(lin_chunk._triton, "use_triton", lambda *ts: True)

    def form(*args, **kw):
        with backends.record_forms() as forms:
            _ops.linear_attention(*args, **kw)
        return forms.get("linear_attention")

    with backends.backends("pytorch"):
        assert form(q, k, v) == {"triton": 1}
        assert form(q[:, :1], k[:, :1], v[:, :1]) == {"pytorch": 1}
        assert form(q.double(), k.double(), v.double()) == {"pytorch": 1}
        assert form(q, k, v, mode="recurrent") is None
        prev = lin_chunk._triton.set_triton(False)
        try:
            monkeypatch.setattr(lin_chunk._triton, "use_triton", lambda *ts: lin_chunk._triton._enabled())
            assert form(q, k, v) == {"pytorch": 1}
        finally:
            lin_chunk._triton.set_triton(prev)


def test_layer_through_the_kernel(monkeypatch):
    """The linear_attention layer (forward, a split sequence continued from its state, input and parameter
    gradients) with its op on the kernel equals the same layer on the PyTorch forms."""
    torch.manual_seed(0)
    assert_layer_same_on_kernel(monkeypatch, lin_chunk, build_mixer("linear_attention", 32, n_heads=2),
                                "linear_attention", DEVICE)
