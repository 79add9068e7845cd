"""How the Triton kernels are launched (ops/lattice/fused_recurrent.py, ops/vla/fused_recurrent.py), beyond the
numerics of test_lattice_triton.py / test_vla_triton.py:

* no checkpoints are stored when no backward can follow (grad mode off), even for inputs that require grad;
* VLA's kernels refuse any input that is not float32 (they load without casting; another dtype does not compile
  on a GPU although the interpreter runs it);
* on a GPU (skipped without one): the sizes the benchmark times — head dims 128 and 96 (padded to 128), T = 300
  (not a multiple of the checkpoint interval), bfloat16 inputs — against the float64 reference, outputs, final
  states and gradients; and a launch on a second GPU while the first is current (two GPUs only).
"""

from __future__ import annotations

import pytest
import torch
from _triton_util import kernel_module

from conftest import assert_rel_close
from seqmem.ops.lattice import orthonormal_slots
from seqmem.ops.lattice.naive import lattice_naive
from seqmem.ops.vla.naive import vla_attention_naive

lat, DEVICE = kernel_module("seqmem.ops.lattice.fused_recurrent")
vla, _ = kernel_module("seqmem.ops.vla.fused_recurrent")

cuda = pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU (the kernels are compiled there)")


class _Spy:
    """Stands in for a ``triton.jit`` kernel: records each launch's checkpoint buffer, then launches."""

    def __init__(self, kernel, ckpt_arg: int) -> None:
        self.kernel, self.ckpt_arg, self.shapes = kernel, ckpt_arg, []

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.shapes.append(tuple(args[self.ckpt_arg].shape))
            return self.kernel[grid](*args, **kw)

        return launch


def _lattice_inputs(B, T, H, D, M, seed=0, dtype=torch.float32, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, M, generator=g)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, M, generator=g), dim=-1)
    v = torch.randn(B, T, H, D, generator=g) * 0.5
    gam = torch.rand(B, T, H, generator=g)
    S0 = orthonormal_slots(B * H, D, M, generator=g).view(B, H, D, M)
    return [x.to(device=device, dtype=dtype).requires_grad_() for x in (q, k, v, gam, S0)]


def _vla_inputs(B, T, H, D, DV, seed=0, dtype=torch.float32, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, T, H, D, generator=g), torch.randn(B, T, H, D, generator=g)
    v = torch.randn(B, T, H, DV, generator=g)
    w_u = torch.randn(H, D, D, generator=g) * D**-0.5
    return [x.to(device=device, dtype=dtype).requires_grad_() for x in (q, k, v, w_u)]


def test_no_checkpoints_without_grad_mode(monkeypatch):
    spy = _Spy(lat._fwd_kernel, 8)
    monkeypatch.setattr(lat, "_fwd_kernel", spy)
    monkeypatch.setattr(lat, "check_device", lambda *a: None)  # it asks the kernel object whether it is interpreted
    monkeypatch.setattr(vla, "check_device", lambda *a: None)
    q, k, v, gam, S0 = _lattice_inputs(1, 9, 1, 8, 8)
    with torch.no_grad():
        lat.fused_recurrent_lattice(q, k, v, gam, S0, chunk_size=4)
    lat.fused_recurrent_lattice(q, k, v, gam, S0, chunk_size=4)
    assert spy.shapes[0][2] == 1 and spy.shapes[1][2] == 3  # one dummy slot, then ⌈9 / 4⌉ checkpoints

    sm, rw = _Spy(vla._sm_fwd_kernel, 6), _Spy(vla._gdr_fwd_kernel, 8)
    monkeypatch.setattr(vla, "_sm_fwd_kernel", sm)
    monkeypatch.setattr(vla, "_gdr_fwd_kernel", rw)
    q, k, v, w_u = _vla_inputs(1, 9, 1, 8, 8)
    with torch.no_grad():
        vla.fused_recurrent_vla(q, k, v, w_u, chunk_size=4)
    vla.fused_recurrent_vla(q, k, v, w_u, chunk_size=4)
    assert sm.shapes[0][1] == 1 and sm.shapes[1][1] == 3
    assert rw.shapes[0][2] == 1 and rw.shapes[1][2] == 3


def test_vla_kernels_refuse_non_float32_inputs():
    q, k, v, w_u = _vla_inputs(1, 4, 1, 8, 8)
    for i in range(4):
        args = [x.detach() for x in (q, k, v, w_u)]
        args[i] = args[i].double()
        with pytest.raises(ValueError, match="computes in float32, got torch.float64"):
            vla.fused_recurrent_vla(*args)
    beta = torch.rand(1, 4, 1, device=DEVICE, dtype=torch.float64)
    with pytest.raises(ValueError, match="computes in float32"):
        vla.fused_recurrent_vla_paper_delta_rule(q.detach(), k.detach(), v.detach(), beta)


def _grads(outs, ins, seed=3):
    g = torch.Generator().manual_seed(seed)
    ws = [torch.randn(o.shape, generator=g).to(o.device, torch.float64) for o in outs]
    loss = sum((o.double() * w).sum() for o, w in zip(outs, ws))
    return torch.autograd.grad(loss, ins)


@cuda
@pytest.mark.parametrize("dim", [128, 96])
@pytest.mark.parametrize("objective,dtype", [("dec", torch.float32), ("dec", torch.bfloat16), ("enc", torch.float32)])
def test_lattice_at_benchmark_sizes(objective, dtype, dim):
    ins = _lattice_inputs(2, 300, 2, dim, dim, dtype=dtype)
    ref_ins = [x.detach().double().requires_grad_() for x in ins]
    y, S = lat.fused_recurrent_lattice(*ins[:4], ins[4], objective=objective, chunk_size=64)
    yr, Sr = lattice_naive(*ref_ins[:4], ref_ins[4], objective=objective)
    assert y.dtype == dtype
    # float32 PyTorch against float64 at these sizes: y 5e-7 / 2e-4, gradients ≤ 2e-3 (dec / enc; enc is the
    # worse conditioned); bfloat16 (y stored in it): y 3e-3, gradients 2e-3
    tol_y, tol_g = (1e-2, 1e-2) if dtype == torch.bfloat16 else (1e-3, 1e-2)
    assert_rel_close(y.double(), yr, tol_y, "y")
    assert_rel_close(S.double(), Sr, 1e-3, "S_T")
    for n, a, b in zip(("q", "k", "v", "gamma", "S0"), _grads((y, S), ins), _grads((yr, Sr), ref_ins)):
        assert b.abs().max() > 0
        assert_rel_close(a.double(), b, tol_g, f"grad {n}")


@cuda
@pytest.mark.parametrize("dim", [128, 96])
def test_vla_at_benchmark_sizes(dim):
    ins = _vla_inputs(2, 300, 2, dim, dim)
    ref_ins = [x.detach().double().requires_grad_() for x in ins]
    o, st = vla.fused_recurrent_vla(*ins, chunk_size=64)
    o_r, st_r = vla_attention_naive(*ref_ins)
    # float32 PyTorch against float64 at these sizes: ≤ 2e-6 for outputs, states and gradients
    assert_rel_close(o.double(), o_r, 1e-3, "o")
    for n in ("S", "A", "z"):
        assert_rel_close(st[n].double(), st_r[n], 1e-3, f"state {n}")
    outs, refs = (o, st["S"], st["A"]), (o_r, st_r["S"], st_r["A"])
    for n, a, b in zip(("q", "k", "v", "w_u"), _grads(outs, ins), _grads(refs, ref_ins)):
        assert b.abs().max() > 0
        assert_rel_close(a.double(), b, 1e-2, f"grad {n}")


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_kernels_launch_on_their_tensors_device():
    """Triton launches on the current device: the ops put their tensors' device in place around each launch."""
    with torch.cuda.device(0):
        ins = _lattice_inputs(1, 70, 2, 32, 32, device="cuda:1")
        y, S = lat.fused_recurrent_lattice(*ins[:4], ins[4], chunk_size=16)
        g1 = _grads((y, S), ins)
        ins0 = [x.detach().to("cuda:0").requires_grad_() for x in ins]
        y0, S0 = lat.fused_recurrent_lattice(*ins0[:4], ins0[4], chunk_size=16)
        torch.testing.assert_close(y.cpu(), y0.cpu())
        for a, b in zip(g1, _grads((y0, S0), ins0)):
            torch.testing.assert_close(a.cpu(), b.cpu())
        vins = _vla_inputs(1, 70, 2, 32, 32, device="cuda:1")
        o, _ = vla.fused_recurrent_vla(*vins, chunk_size=16)
        o0, _ = vla.fused_recurrent_vla(*[x.detach().to("cuda:0") for x in vins], chunk_size=16)
        torch.testing.assert_close(o.cpu(), o0.cpu())
