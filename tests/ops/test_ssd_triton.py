"""Mamba-2's SSD on CUDA without mamba_ssm: ``ssd(mode="chunk")`` runs seqmem's chunked simple-GLA Triton kernel
(ops/vort/chunk_simple_gla.py; queries C, keys B, values dt·x, log-gates dt·A, the state transposed).  CUDA is faked
here (Triton's interpreter takes CPU tensors; mamba_ssm's backend off): against the recurrent reference in float64,
in float32 — outputs, the state, the gradients of x, dt, A, B, C and the initial state, a split sequence continued
from its state, tokens with dt = 0 and a head with A = 0; the op's choice of form; and the mamba2 layer through the
kernel against the same layer on the PyTorch forms."""

from __future__ import annotations

import pytest
import torch
from _triton_util import assert_layer_same_on_kernel, assert_same_as_reference, kernel_module

import seqmem.ops as _ops
from seqmem import backends, build_mixer
from seqmem.ops.state_space import chunk as ssd_chunk

kern, DEVICE = kernel_module("seqmem.ops.vort.chunk_simple_gla")

B, T, H, P, N = 2, 37, 2, 6, 5


@pytest.fixture
def on_kernel(monkeypatch):
    """Every tensor reads as CUDA to the dispatch (the interpreter runs the kernel on CPU tensors); no backend."""
    if DEVICE == "cpu":
        monkeypatch.setattr(ssd_chunk._triton, "use_triton", lambda *ts: True)
    with backends.backends("pytorch"):
        yield


def _inputs(seed, t=T, init=True):
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    dt = torch.nn.functional.softplus(r(B, t, H))
    dt[:, 3] = 0.0  # a token that neither decays nor writes
    A = -torch.exp(r(H))
    A[1] = 0.0  # a head without decay
    ins = [r(B, t, H, P), dt, A, r(B, t, H, N), r(B, t, H, N)] + ([r(B, H, P, N)] if init else [])
    return [x.float().to(DEVICE).requires_grad_() for x in ins]


def _ref(ins):
    d = [x.detach().double().requires_grad_() for x in ins]
    y, st = _ops.ssd(*d[:5], initial_state=({"S": d[5]} if len(d) > 5 else None), mode="recurrent")
    return d, y, st["S"]


def _check(y, S, ins, ref, tol=2e-5, tol_grad=1e-4):
    d, y_r, S_r = ref
    names = ["x", "dt", "A", "B", "C", "S0"][:len(ins)]
    assert_same_as_reference(y, S, y_r, S_r, ins, d, names, tol, tol_grad, seed=9)


@pytest.mark.parametrize("init", [True, False])
def test_ssd_through_the_kernel(on_kernel, init):
    ins = _inputs(1, init=init)
    with backends.record_forms() as forms:
        y, st = _ops.ssd(*ins[:5], initial_state=({"S": ins[5]} if init else None))
    assert forms == {"ssd": {"triton": 1}}
    _check(y, st["S"], ins, _ref(ins))


def test_split_sequence_continues_from_its_state(on_kernel):
    ins = _inputs(2)
    y1, st = _ops.ssd(*(z[:, :20] for z in ins[:2]), ins[2], *(z[:, :20] for z in ins[3:5]),
                      initial_state={"S": ins[5]})
    y2, st = _ops.ssd(*(z[:, 20:] for z in ins[:2]), ins[2], *(z[:, 20:] for z in ins[3:5]), initial_state=st)
    _check(torch.cat([y1, y2], 1), st["S"], ins, _ref(ins))


def test_choice_of_form(monkeypatch):
    """mamba_ssm's backend first where it applies; else the kernel on CUDA with Triton on (faked); float64 and
    Triton off (or not CUDA) run the PyTorch forms, ``mode="recurrent"`` the reference loop."""
    ins = [x.detach() for x in _inputs(3)]
    monkeypatch.setattr(ssd_chunk._triton, "use_triton", lambda *ts: True)

    def form(*args, **kw):
        with backends.record_forms() as forms:
            _ops.ssd(*args, **kw)
        return forms.get("ssd")

    with backends.backends("pytorch"):
        assert form(*ins[:5]) == {"triton": 1}
        assert form(*(x.double() for x in ins[:5])) == {"pytorch": 1}
        assert form(*ins[:5], mode="recurrent") is None  # the reference loop: no form chosen
    monkeypatch.setattr(ssd_chunk._triton, "use_triton", lambda *ts: False)
    with backends.backends("pytorch"):
        assert form(*ins[:5]) == {"pytorch": 1}


def test_mamba2_layer_through_the_kernel(monkeypatch):
    """The mamba2 layer (forward, a split sequence continued from its state, input and parameter gradients) with its
    SSD on the kernel equals the same layer on the PyTorch forms."""
    torch.manual_seed(0)
    assert_layer_same_on_kernel(monkeypatch, ssd_chunk, build_mixer("mamba2", 32, n_heads=2), "ssd", DEVICE)
