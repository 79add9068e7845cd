"""The Lattice fused recurrent Triton kernel (ops/lattice/fused_recurrent.py) against the recurrent reference
(naive.py) in float32: outputs, final slots, the gradients of every input (the initial slots included) and a split
sequence continued from its state.  Without a GPU the kernel runs in Triton's CPU interpreter, which is slow: the
shapes are tiny (T = 11 with checkpoints every 4 tokens, so neither divides the other)."""

from __future__ import annotations

import pytest
import torch
from _triton_util import kernel_module

from conftest import assert_rel_close
from seqmem.ops import _triton
from seqmem.ops.lattice import lattice_scan, orthonormal_slots
from seqmem.ops.lattice.naive import lattice_naive

fr, DEVICE = kernel_module("seqmem.ops.lattice.fused_recurrent")

B, T, H, M, D = 2, 11, 2, 8, 16


def _inputs(seed: int, gamma: str = "head", forget: bool = False, t: int = T):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(DEVICE).requires_grad_()

    q = r(B, t, H, M)
    k = torch.nn.functional.normalize(torch.randn(B, t, H, M, generator=g), dim=-1).to(DEVICE).requires_grad_()
    v = r(B, t, H, D, scale=0.5)
    gshape = (B, t, H, M) if gamma == "slot" else (B, t, H)
    gam = torch.rand(*gshape, generator=g).to(DEVICE).requires_grad_()
    mu = (0.5 + 0.5 * torch.rand(B, t, H, generator=g)).to(DEVICE).requires_grad_() if forget else None
    # non-unit columns: the kernel's wrapper projects them onto the sphere, so that step's gradient is covered too
    S0 = (orthonormal_slots(B * H, D, M, generator=g).view(B, H, D, M) * 1.3).to(DEVICE).requires_grad_()
    return q, k, v, gam, mu, S0


def _grads(y, S, ins, seed=7):
    g = torch.Generator().manual_seed(seed)
    wy = torch.randn(y.shape, generator=g).to(y.device)
    ws = torch.randn(S.shape, generator=g).to(S.device)
    return torch.autograd.grad((y * wy).sum() + (S * ws).sum(), [x for x in ins if x is not None])


@pytest.mark.parametrize("objective,gamma,forget", [("dec", "head", False), ("enc", "slot", True),
                                                      ("sim", "head", True)])
def test_matches_naive(objective, gamma, forget, monkeypatch):
    monkeypatch.setattr(fr, "SLOT_BLOCK", 4)  # enc / sim: two blocks of 4 slots, partial read-outs summed
    q, k, v, gam, mu, S0 = _inputs(0, gamma, forget)
    y, S = fr.fused_recurrent_lattice(q, k, v, gam, S0, objective=objective, forget=mu, chunk_size=4)
    yr, Sr = lattice_naive(q, k, v, gam, S0, objective=objective, forget=mu)
    assert y.dtype == torch.float32 and S.dtype == torch.float32
    assert_rel_close(y, yr, 1e-5, "y")
    assert_rel_close(S, Sr, 1e-5, "S_T")
    ins = (q, k, v, gam, mu, S0)
    names = [n for n, x in zip(("q", "k", "v", "gamma", "forget", "S0"), ins) if x is not None]
    for n, a, b in zip(names, _grads(y, S, ins), _grads(yr, Sr, ins)):
        assert_rel_close(a, b, 1e-4, f"grad {n}")


def test_split_sequence_continues_from_state():
    q, k, v, gam, _, S0 = _inputs(1)
    yr, Sr = lattice_naive(q, k, v, gam, S0, objective="dec")
    y1, S1 = fr.fused_recurrent_lattice(q[:, :6], k[:, :6], v[:, :6], gam[:, :6], S0, chunk_size=4)
    y2, S2 = fr.fused_recurrent_lattice(q[:, 6:], k[:, 6:], v[:, 6:], gam[:, 6:], S1, chunk_size=4)
    assert_rel_close(torch.cat([y1, y2], 1), yr, 1e-5, "y (split)")
    assert_rel_close(S2, Sr, 1e-5, "S_T (split)")
    ins = (q, k, v, gam, S0)
    for a, b in zip(_grads(torch.cat([y1, y2], 1), S2, ins), _grads(yr, Sr, ins)):
        assert_rel_close(a, b, 1e-4, "grad through the split")


def test_op_dispatch():
    """``lattice_scan(backend="triton")`` runs the kernel; ``auto`` takes it on CUDA only; bad requests fail."""
    q, k, v, gam, _, S0 = _inputs(2, t=5)
    y, st = lattice_scan(q, k, v, gam, {"S": S0}, objective="sim", backend="triton", chunk_size=3)
    yr, str_ = lattice_scan(q, k, v, gam, {"S": S0}, objective="sim", mode="recurrent")
    assert_rel_close(y, yr, 1e-5, "y")
    assert_rel_close(st["S"], str_["S"], 1e-5, "S")
    assert _triton.use_triton(q, k, v) == (DEVICE == "cuda")
    prev = _triton.set_triton(False)
    try:
        assert not _triton.use_triton(q.cuda() if DEVICE == "cuda" else q)
    finally:
        _triton.set_triton(prev)
    with pytest.raises(ValueError, match="backend='triton' covers"):
        lattice_scan(q, k, v, gam, objective="dec", l1=0.1, backend="triton")
    with pytest.raises(ValueError, match="backend='triton' covers"):
        lattice_scan(q.double(), k.double(), v.double(), gam.double(), objective="dec", backend="triton")


def test_half_inputs_accumulate_in_float32():
    q, k, v, gam, _, S0 = _inputs(3, t=5)
    bf = [x.detach().to(torch.bfloat16) for x in (q, k, v, gam)]
    y, S = fr.fused_recurrent_lattice(*bf, S0.detach(), chunk_size=3)
    yr, Sr = lattice_naive(*(x.float() for x in bf), S0.detach(), objective="dec")
    assert y.dtype == torch.bfloat16 and S.dtype == torch.float32
    assert_rel_close(y.float(), yr, 2e-2, "y (bf16 in, fp32 accumulate)")
    assert_rel_close(S, Sr, 1e-5, "S_T (float32 state)")


def test_padded_dims_and_single_token(monkeypatch):
    """d, m that are not powers of two (the kernel pads its blocks; enc: slot blocks of 4 + 1) and a one-token call
    (a decode step)."""
    monkeypatch.setattr(fr, "SLOT_BLOCK", 4)
    g = torch.Generator().manual_seed(4)
    for t, d, m in ((3, 12, 5), (1, 12, 5)):
        q, k, v = (torch.randn(B, t, H, n, generator=g).to(DEVICE) for n in (m, m, d))
        gam = torch.rand(B, t, H, m, generator=g).to(DEVICE)
        S0 = orthonormal_slots(B * H, d, m, generator=g).view(B, H, d, m).to(DEVICE)
        for objective in ("dec", "enc"):
            y, S = fr.fused_recurrent_lattice(q, k, v, gam, S0, objective=objective, chunk_size=2)
            yr, Sr = lattice_naive(q, k, v, gam, S0, objective=objective)
            assert_rel_close(y, yr, 1e-5, f"y ({objective}, T={t}, d={d}, m={m})")
            assert_rel_close(S, Sr, 1e-5, f"S_T ({objective}, T={t}, d={d}, m={m})")


def test_mixer_layer_runs_the_kernel(monkeypatch):
    """A whole Lattice layer (per-slot γ, forget gate) with the kernel dispatched as on CUDA equals the layer on
    its CPU form: output, state and parameter gradients."""
    from seqmem.registry import build_mixer

    mixer = build_mixer("lattice", 16, n_heads=2, gamma_per_slot=True, forget_gate=True).to(DEVICE)
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(8)).to(DEVICE)

    def run():
        y, st = mixer(x)
        grads = torch.autograd.grad(y.square().sum() + st["S"].sum(), list(mixer.parameters()), allow_unused=True)
        return y, st["S"], grads

    y_ref, S_ref, g_ref = run()
    calls = []
    real = fr.fused_recurrent_lattice
    monkeypatch.setattr(_triton, "use_triton", lambda *ts: True)
    monkeypatch.setattr(fr, "fused_recurrent_lattice", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    y, S, g = run()
    assert calls, "the layer did not reach the kernel"
    assert_rel_close(y, y_ref, 1e-5, "layer output")
    assert_rel_close(S, S_ref, 1e-5, "layer state")
    for a, b in zip(g, g_ref):
        if b is not None:
            assert_rel_close(a, b, 1e-4, "parameter gradient")


def test_op_passes_half_inputs_to_the_kernel_uncast():
    """lattice_scan hands bfloat16 inputs to the kernel as they are (it accumulates in float32 itself): the same
    output (to bfloat16's rounding: the kernel stores y in bfloat16 itself, and Triton's CPU interpreter rounds
    towards zero there), state and gradients as casting them to float32 first, with gradients in the inputs'
    dtype."""
    q, k, v, gam, mu, S0 = _inputs(5, "head", True, t=5)
    bf = [x.detach().to(torch.bfloat16).requires_grad_() for x in (q, k, v, gam, mu)]
    f32 = [x.detach().float().requires_grad_() for x in bf]
    y, st = lattice_scan(*bf[:4], {"S": S0.detach()}, objective="dec", forget=bf[4], chunk_size=3, backend="triton")
    yr, sr = lattice_scan(*f32[:4], {"S": S0.detach()}, objective="dec", forget=f32[4], chunk_size=3,
                          backend="triton")  # fmt: skip
    assert y.dtype == torch.bfloat16 and st["S"].dtype == torch.float32
    assert_rel_close(y.float(), yr, 2**-7, "y (one bfloat16 rounding)")
    assert torch.equal(st["S"], sr["S"])
    w = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(y.device)
    ga = torch.autograd.grad((y.float() * w).sum() + st["S"].sum(), bf)
    gb = torch.autograd.grad((yr.to(torch.bfloat16).float() * w).sum() + sr["S"].sum(), f32)
    for a, b in zip(ga, gb):
        assert a.dtype == torch.bfloat16
        assert_rel_close(a.float(), b.to(torch.bfloat16).float(), 2**-7, "grad")
