"""The delta rule's walk over chunks as Triton kernels (ops/delta/chunk_scan.py): ``delta_rule`` and
``gated_delta_rule`` (``mode="chunk"``) on CUDA where no backend applies (fla absent or off).  CUDA is faked here
(Triton's interpreter takes CPU tensors; the backends off): against the recurrent reference in float64, in float32
— outputs, the state, the gradients of q, k, v, β, g and the initial state, for chunk lengths that are and are not
powers of two and longer than the input, a split sequence continued from its state; the op's choice of form; the
kernel's refusals; and the deltanet / gated_deltanet layers through the kernel against the PyTorch forms."""

from __future__ import annotations

import pytest
import torch
from _triton_util import assert_layer_same_on_kernel, assert_same_as_reference, kernel_module

import seqmem.ops as _ops
from conftest import assert_rel_close
from seqmem import backends, build_mixer
from seqmem.ops.delta import chunk as delta_chunk

kern, DEVICE = kernel_module("seqmem.ops.delta.chunk_scan")

B, T, H, DK, DV = 2, 37, 2, 12, 40  # DV: two value blocks, the second partial


@pytest.fixture
def on_kernel(monkeypatch):
    if DEVICE == "cpu":
        monkeypatch.setattr(delta_chunk._triton, "use_triton", lambda *ts: True)
    with backends.backends("pytorch"):
        yield


def _inputs(seed: int, gated: bool, init: bool = True, t: int = T, dk: int = DK) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, t, H, dk, generator=g)
    k = torch.nn.functional.normalize(torch.randn(B, t, H, dk, generator=g), dim=-1)  # as the layers do
    v = torch.randn(B, t, H, DV, generator=g)
    beta = torch.rand(B, t, H, generator=g)
    ins = [q, k, v, beta]
    if gated:
        ins.append(-torch.rand(B, t, H, generator=g) * 0.5)
    if init:
        ins.append(torch.randn(B, H, dk, DV, generator=g) * 0.3)
    return [x.to(DEVICE).requires_grad_() for x in ins]


def _call(ins: list[torch.Tensor], gated: bool, init: bool, **kw):
    q, k, v, beta = ins[:4]
    g = ins[4] if gated else None
    st = {"S": ins[-1]} if init else kw.pop("initial_state", None)
    if gated:
        return _ops.gated_delta_rule(q, k, v, beta=beta, g=g, scale=0.4, initial_state=st, **kw)
    return _ops.delta_rule(q, k, v, beta, scale=0.4, initial_state=st, **kw)


def _check(o: torch.Tensor, S: torch.Tensor, ins: list[torch.Tensor], gated: bool, init: bool,
           tol: float = 2e-5) -> None:
    d = [x.detach().double().requires_grad_() for x in ins]
    o_r, st = _call(d, gated, init, mode="recurrent")
    names = ["q", "k", "v", "beta"] + (["g"] if gated else []) + (["S0"] if init else [])
    assert_same_as_reference(o, S, o_r, st["S"], ins, d, names, tol, 10 * tol, seed=4)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("init", [True, False])
@pytest.mark.parametrize("chunk_size", [16, 10, 64])  # a power of two; padded to 16 inside; 32 on the kernel path
def test_delta_rule_through_the_kernel(on_kernel, gated, init, chunk_size):
    ins = _inputs(1, gated, init)
    op = "gated_delta_rule" if gated else "delta_rule"
    with backends.record_forms() as forms:
        o, st = _call(ins, gated, init, chunk_size=chunk_size)
    assert forms == {op: {"triton": 1}}
    _check(o, st["S"], ins, gated, init)


@pytest.mark.parametrize("dk", [70, 128])  # three key blocks of 32, the last partial; four
def test_key_blocks(on_kernel, dk):
    ins = _inputs(5, True, True, dk=dk)
    o, st = _call(ins, True, True, chunk_size=32)
    _check(o, st["S"], ins, True, True)


@pytest.mark.parametrize(("dk", "dv", "t"), [(40, 8, 37), (16, 16, 5), (33, 17, 33)])  # two key blocks, a value
def test_sizes(on_kernel, dk, dv, t):  # block below 16; one short chunk; block edges and one token past a chunk
    global DV
    old, DV = DV, dv
    try:
        ins = _inputs(6, True, True, t=t, dk=dk)
    finally:
        DV = old
    o, st = _call(ins, True, True)
    _check(o, st["S"], ins, True, True)


@pytest.mark.parametrize("which", ["output", "state"])
def test_a_loss_on_one_output(on_kernel, which):
    """Gradients when only the output or only the final state enters the loss (the other's gradient is zero)."""
    ins = _inputs(7, True)
    o, st = _call(ins, True, True)
    d = [x.detach().double().requires_grad_() for x in ins]
    o_r, st_r = _call(d, True, True, mode="recurrent")
    pick = (lambda a, b: a) if which == "output" else (lambda a, b: b)
    ga = torch.autograd.grad(pick(o, st["S"]).double().pow(2).sum(), ins, allow_unused=True)
    gr = torch.autograd.grad(pick(o_r, st_r["S"]).pow(2).sum(), d, allow_unused=True)
    for name, a, b in zip(("q", "k", "v", "beta", "g", "S0"), ga, gr):
        if b is None:  # the final state does not depend on q
            assert a is None or not a.any(), name
        else:
            assert_rel_close(a.double(), b, 2e-4, f"d{name}")


def test_without_a_backward_the_walk_runs_in_segments(on_kernel, monkeypatch):
    """Under no_grad the walk runs SEGMENT chunks per call (memory bounded in T), with the same result."""
    ins = [x.detach() for x in _inputs(8, True)]
    o_full, st_full = _call(ins, True, True, chunk_size=4)  # no input requires grad: segments of 64 chunks (one)
    calls = []
    real = kern._Walk.apply
    monkeypatch.setattr(kern._Walk, "apply", lambda *a: (calls.append(a[0].shape[2]), real(*a))[1])
    monkeypatch.setattr(kern, "SEGMENT", 3)
    with torch.no_grad():
        o, st = _call(ins, True, True, chunk_size=4)  # 10 chunks: 3 + 3 + 3 + 1
    assert calls == [3, 3, 3, 1]
    assert_rel_close(o, o_full, 1e-6, "o")
    assert_rel_close(st["S"], st_full["S"], 1e-6, "S")


@pytest.mark.parametrize("gated", [False, True])
def test_split_sequence_continues_from_its_state(on_kernel, gated):
    ins = _inputs(2, gated)
    n = 4 + gated
    first = [x[:, :21] for x in ins[:n]] + [ins[-1]]
    o1, st = _call(first, gated, True, chunk_size=16)
    rest = [x[:, 21:] for x in ins[:n]]
    o2, st = _call(rest + [st["S"]], gated, True, chunk_size=16)
    _check(torch.cat([o1, o2], 1), st["S"], ins, gated, True)


def test_half_inputs_are_computed_in_float32(monkeypatch):
    """bfloat16 inputs take the kernel in float32 (as the chunked form computes them) and match that form."""
    ins = [x.detach().to(torch.bfloat16).to(DEVICE) for x in _inputs(3, True, init=False)]
    out = {}
    for kernel in (True, False):
        monkeypatch.setattr(delta_chunk._triton, "use_triton", lambda *ts, on=kernel: on)
        with backends.backends("pytorch"), backends.record_forms() as forms:
            out[kernel] = _call(ins, True, False, chunk_size=16)
        assert forms == {"gated_delta_rule": {"triton" if kernel else "pytorch": 1}}
    (o, st), (o_r, st_r) = out[True], out[False]
    assert o.dtype == torch.bfloat16 and st["S"].dtype == torch.float32
    assert_rel_close(o.float(), o_r.float(), 1e-2, "o")
    assert_rel_close(st["S"], st_r["S"], 1e-5, "S")


def test_choice_of_form(monkeypatch):
    """The kernel on CUDA (faked) with Triton on, for more than one token and any chunk_size; one token, float64,
    key sizes above 128 and Triton off run the PyTorch forms, ``mode="recurrent"`` the reference loop."""
    q, k, v, beta = (x.detach() for x in _inputs(3, False, init=False))
    monkeypatch.setattr(delta_chunk._triton, "use_triton", lambda *ts: True)

    def form(*args, **kw):
        with backends.record_forms() as forms:
            _ops.delta_rule(*args, **kw)
        return forms.get("delta_rule")

    wide = torch.nn.functional.normalize(torch.randn(B, 3, H, 129), dim=-1).to(q.device)
    with backends.backends("pytorch"):
        assert form(q, k, v, beta) == {"triton": 1}
        assert form(q, k, v, beta, chunk_size=200) == {"triton": 1}  # the kernel path's chunk: 32 tokens
        assert form(q[:, :1], k[:, :1], v[:, :1], beta[:, :1]) == {"pytorch": 1}
        assert form(q.double(), k.double(), v.double(), beta.double()) == {"pytorch": 1}
        assert form(wide, wide, v[:, :3], beta[:, :3]) == {"pytorch": 1}
        long = [torch.cat([x] * 4, 1) for x in (q, k, v, beta)]
        assert form(*long, chunk_size=129) == {"triton": 1}  # the kernel path's chunks are at most 32 tokens
        assert form(q, k, v, beta, mode="recurrent") is None
        prev = delta_chunk._triton.set_triton(False)
        try:
            monkeypatch.setattr(delta_chunk._triton, "use_triton", lambda *ts: delta_chunk._triton._enabled())
            assert form(q, k, v, beta) == {"pytorch": 1}
        finally:
            delta_chunk._triton.set_triton(prev)


def test_refusals():
    z = torch.zeros(1, 1, 2, 16, 8, device=DEVICE)
    s0 = torch.zeros(1, 1, 8, 8, device=DEVICE)
    qk = torch.zeros(1, 1, 2, 16, 16, device=DEVICE)
    with pytest.raises(ValueError, match="s0 must be"):
        kern.delta_chunk_scan(z, z, z, qk, z, None, torch.zeros(1, 1, 8, 9, device=DEVICE))
    with pytest.raises(ValueError, match="float32"):
        kern.delta_chunk_scan(z.double(), z, z, qk, z, None, s0)
    with pytest.raises(ValueError, match="gt must be"):
        kern.delta_chunk_scan(z, z, z, qk, z, torch.zeros(1, 1, 3, device=DEVICE), s0)


@pytest.mark.parametrize("name", ["deltanet", "gated_deltanet"])
def test_layer_through_the_kernel(monkeypatch, name):
    """The deltanet and gated_deltanet layers (forward, a split sequence continued from its state, input and
    parameter gradients) with their op on the kernel equal the same layers on the PyTorch forms."""
    torch.manual_seed(0)
    layer = build_mixer(name, 32, n_heads=2, chunk_size=16)
    op = "gated_delta_rule" if name == "gated_deltanet" else "delta_rule"
    assert_layer_same_on_kernel(monkeypatch, delta_chunk, layer, op, DEVICE)


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU (the kernel is compiled there)")
@pytest.mark.parametrize("dk", [64, 128])  # two key blocks of 32 (value blocks of 32); four (value blocks of 16)
def test_kernel_at_layer_sizes(dk):
    """The compiled walk at the sizes a layer gives it (T = 300, not a multiple of the chunk; 16 heads; values as
    wide as the keys), through gated_delta_rule with an initial state, against the float64 loop."""
    g = torch.Generator().manual_seed(21)
    shapes = [(1, 300, 16, dk), (1, 300, 16, dk), (1, 300, 16, dk)]
    q, k, v = (torch.randn(*s, generator=g) for s in shapes)
    k = torch.nn.functional.normalize(k, dim=-1)
    beta, gate = torch.rand(1, 300, 16, generator=g), -torch.rand(1, 300, 16, generator=g) * 0.1
    s0 = torch.randn(1, 16, dk, dk, generator=g) * 0.1
    ins = [x.to(DEVICE).requires_grad_() for x in (q, k, v, beta, gate, s0)]
    with backends.backends("pytorch"), backends.record_forms() as forms:
        o, st = _ops.gated_delta_rule(*ins[:3], beta=ins[3], g=ins[4], initial_state={"S": ins[5]})
    assert forms == {"gated_delta_rule": {"triton": 1}}
    ref = [x.detach().double().requires_grad_() for x in ins]
    o_r, st_r = _ops.gated_delta_rule(*ref[:3], beta=ref[3], g=ref[4], initial_state={"S": ref[5]}, mode="recurrent")
    assert_rel_close(o.double(), o_r, 1e-4, "o")
    assert_rel_close(st["S"].double(), st_r["S"], 1e-4, "S")
    gen = torch.Generator().manual_seed(3)
    wo = torch.randn(o.shape, generator=gen, dtype=torch.float64).to(DEVICE)
    ga = torch.autograd.grad((o.double() * wo).sum(), ins)
    gr = torch.autograd.grad((o_r * wo).sum(), ref)
    for name, a, b in zip(("q", "k", "v", "beta", "g", "S0"), ga, gr):
        assert_rel_close(a.double(), b, 1e-3, f"d{name}")
