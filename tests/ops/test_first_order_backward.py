"""Backwards autograd cannot record — the Triton kernels (Lattice, VLA, VORT's simple GLA, the delta rules' walk),
the C++ and hand-derived Lattice scans, ShortConv's fused multiply-add — cannot be differentiated again:
``create_graph=True`` through them (double backward, gradient penalties, Hessian-vector products) raises a
one-line error instead of silently dropping the second-order terms; first-order gradients are unchanged."""

from __future__ import annotations

import pytest
import torch

import seqmem.ops as _ops
from seqmem import build_mixer

MSG = "cannot be differentiated again"


def _grad_of_grad(out: list[torch.Tensor], xs: list[torch.Tensor]) -> None:
    loss = sum((o.float() ** 2).sum() for o in out if o is not None)
    gs = torch.autograd.grad(loss, xs, create_graph=True, allow_unused=True)
    sum(g.sum() for g in gs if g is not None).backward()


def _x(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).requires_grad_()


@pytest.mark.parametrize("backend", ["cpp", "torch"])
def test_lattice_scans(backend):
    q, k, v = _x(1, 6, 1, 4), _x(1, 6, 1, 4, seed=1), _x(1, 6, 1, 4, seed=2)
    gam = torch.rand(1, 6, 1).requires_grad_()
    try:
        y, st = _ops.lattice_scan(q, k, v, gam, backend=backend, chunk_size=4)
    except (RuntimeError, ValueError) as e:  # no C++ compiler here
        pytest.skip(f"backend {backend!r} unavailable: {e}")
    with pytest.raises(RuntimeError, match=MSG):
        _grad_of_grad([y, st["S"]], [q, k, v, gam])
    # first order still works, and the reference form is twice differentiable
    y, st = _ops.lattice_scan(q, k, v, gam, backend=backend, chunk_size=4)
    torch.autograd.grad(y.sum(), [q, k, v, gam])
    y, st = _ops.lattice_scan(q, k, v, gam, mode="recurrent")
    _grad_of_grad([y, st["S"]], [q, k, v, gam])


def test_short_conv_in_a_layer():
    layer = build_mixer("deltanet", 16, n_heads=2)
    x = _x(1, 9, 16)
    with pytest.raises(RuntimeError, match=f"ShortConv: .*{MSG}"):
        _grad_of_grad([layer(x)[0]], [x])


def _kernel(name: str):
    pytest.importorskip("triton", reason="triton is not installed (it is in the dev extra)")
    from _triton_util import kernel_module

    return kernel_module(name)


def _delta(device: str):
    from seqmem.ops.delta import chunk as delta_chunk

    mod, dev = _kernel("seqmem.ops.delta.chunk_scan")
    q, k, v = (x.to(dev).detach().requires_grad_() for x in (_x(1, 9, 1, 8), _x(1, 9, 1, 8, seed=1),
                                                             _x(1, 9, 1, 8, seed=2)))
    beta = torch.rand(1, 9, 1, device=dev).requires_grad_()
    prev = delta_chunk._triton.use_triton
    delta_chunk._triton.use_triton = lambda *ts: True
    try:
        o, st = _ops.delta_rule(q, torch.nn.functional.normalize(k, dim=-1), v, beta, chunk_size=4)
    finally:
        delta_chunk._triton.use_triton = prev
    return [o, st["S"]], [q, k, v, beta]


def _simple_gla(device: str):
    mod, dev = _kernel("seqmem.ops.vort.chunk_simple_gla")
    q, k, v = (x.to(dev).detach().requires_grad_() for x in (_x(1, 20, 1, 16), _x(1, 20, 1, 16, seed=1),
                                                             _x(1, 20, 1, 16, seed=2)))
    g = (-torch.rand(1, 20, 1, device=dev)).requires_grad_()
    o, ht = mod.chunk_simple_gla(q, k, v, g, output_final_state=True, chunk_size=16)
    return [o, ht], [q, k, v, g]


def _vla(device: str):
    mod, dev = _kernel("seqmem.ops.vla.fused_recurrent")
    q, k, v = (x.to(dev).detach().requires_grad_() for x in (_x(1, 5, 1, 16), _x(1, 5, 1, 16, seed=1),
                                                             _x(1, 5, 1, 16, seed=2)))
    w_u = (_x(1, 16, 16, seed=3) * 0.25).to(dev).detach().requires_grad_()
    o, st = mod.fused_recurrent_vla(q, k, v, w_u, chunk_size=2)
    return [o] + [x for x in st.values() if x.is_floating_point()], [q, k, v, w_u]


def _lattice(device: str):
    mod, dev = _kernel("seqmem.ops.lattice.fused_recurrent")
    q, k, v = (x.to(dev).detach().requires_grad_() for x in (_x(1, 5, 1, 16), _x(1, 5, 1, 16, seed=1),
                                                             _x(1, 5, 1, 16, seed=2)))
    gam = torch.rand(1, 5, 1, device=dev).requires_grad_()
    y, S = mod.fused_recurrent_lattice(q, k, v, gam, objective="dec", chunk_size=2)
    return [y, S], [q, k, v, gam]


@pytest.mark.parametrize("case", [_delta, _simple_gla, _vla, _lattice], ids=["delta", "simple_gla", "vla", "lattice"])
def test_triton_kernels(case):
    out, xs = case("cpu")
    torch.autograd.grad(sum((o.float() ** 2).sum() for o in out), xs, retain_graph=True)  # first order: fine
    with pytest.raises(RuntimeError, match=MSG):
        _grad_of_grad(out, xs)
