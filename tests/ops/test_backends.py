"""Optional op backends (seqmem.backends): off by default; when enabled, used only where installed and supported,
else the PyTorch form runs; a fake backend stands in for the GPU kernels on CPU.  The real kernels (fla, mamba_ssm)
are checked against seqmem's reference forms only where CUDA and the package are present."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from _core_util import tensor_state

import seqmem
import seqmem.ops as _ops
from seqmem import backends
from seqmem.ops import _backends

# the bare state tensor of the math (the backends' own convention): initial_state=S, returned state S
delta_rule, gated_delta_rule, ssd = (tensor_state(op) for op in (_ops.delta_rule, _ops.gated_delta_rule, _ops.ssd))


def _qkv(b=2, t=19, h=2, d=8, device="cpu", dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, t, h, d, generator=g, dtype=dtype) for _ in range(3))
    k = torch.nn.functional.normalize(k, dim=-1)
    beta = torch.rand(b, t, h, generator=g, dtype=dtype)
    gate = -torch.rand(b, t, h, generator=g, dtype=dtype)
    return [x.to(device) for x in (q, k, v, beta, gate)]


@pytest.fixture
def fake():
    """A backend "fake" for gated_delta_rule that records its calls and computes the recurrent reference."""
    calls = []

    def fn(q, k, v, beta, g, scale, initial_state, chunk_size):
        calls.append(chunk_size)
        return gated_delta_rule(q, k, v, beta=beta, g=g, scale=scale, initial_state=initial_state, mode="recurrent")

    support = {"ok": True}
    backends.register_backend("gated_delta_rule", "fake", fn, supports=lambda *t: support["ok"])
    yield calls, support
    backends.unregister_backend("gated_delta_rule", "fake")
    backends.use_backends(None)


def test_off_by_default(fake, monkeypatch):
    calls, _ = fake
    monkeypatch.delenv("SEQMEM_BACKENDS", raising=False)
    q, k, v, beta, g = _qkv()
    gated_delta_rule(q, k, v, beta=beta, g=g)
    assert calls == [] and backends.enabled_backends() == ()


def test_enabled_backend_is_used_and_matches(fake):
    calls, _ = fake
    q, k, v, beta, g = _qkv()
    s0 = torch.randn(2, 2, 8, 8)
    ref = gated_delta_rule(q, k, v, beta=beta, g=g, initial_state=s0, chunk_size=8)
    with backends.backends(["fake"]):
        out = gated_delta_rule(q, k, v, beta=beta, g=g, initial_state=s0, chunk_size=8)
        gated_delta_rule(q, k, v, beta=beta, g=g, mode="recurrent")  # the reference form never dispatches
    assert calls == [8]
    torch.testing.assert_close(out[0], ref[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out[1], ref[1], rtol=1e-4, atol=1e-5)
    gated_delta_rule(q, k, v, beta=beta, g=g)
    assert calls == [8]  # off again after the block


def test_unsupported_or_missing_backend_falls_back(fake, monkeypatch):
    calls, support = fake
    q, k, v, beta, g = _qkv()
    support["ok"] = False
    with backends.backends(["fake"]):
        gated_delta_rule(q, k, v, beta=beta, g=g)
    assert calls == []
    support["ok"] = True
    backends.register_backend("gated_delta_rule", "absent", lambda *a: 1 / 0, available=lambda: False)
    try:
        with backends.backends(["absent", "fake"]):  # first choice not installed: the next one
            gated_delta_rule(q, k, v, beta=beta, g=g)
        assert calls == [64]
    finally:
        backends.unregister_backend("gated_delta_rule", "absent")
    monkeypatch.setenv("SEQMEM_BACKENDS", "fake")  # the environment variable enables it too
    gated_delta_rule(q, k, v, beta=beta, g=g)
    assert len(calls) == 2


def test_real_backends_fall_back_on_cpu():
    """fla / mamba_ssm enabled: on CPU tensors (or without the package) the PyTorch forms run, unchanged."""
    assert {"delta_rule", "gated_delta_rule", "ssd"} <= set(backends.list_backends())
    q, k, v, beta, g = _qkv()
    x = torch.randn(2, 19, 2, 8)
    dt, A = torch.rand(2, 19, 2), -torch.rand(2)
    B, C = torch.randn(2, 19, 2, 4), torch.randn(2, 19, 2, 4)
    ref = [delta_rule(q, k, v, beta), gated_delta_rule(q, k, v, beta=beta, g=g), ssd(x, dt, A, B, C)]
    with backends.backends(["fla", "mamba_ssm"]):
        assert _backends.select("gated_delta_rule", q, k, v, beta, g, None) is None
        got = [delta_rule(q, k, v, beta), gated_delta_rule(q, k, v, beta=beta, g=g), ssd(x, dt, A, B, C)]
    for (o1, s1), (o2, s2) in zip(ref, got):
        assert torch.equal(o1, o2) and torch.equal(s1, s2)


def test_mixer_uses_backend_and_gradients_flow(fake):
    calls, _ = fake
    torch.manual_seed(0)
    m = seqmem.build_mixer("gated_deltanet", 16, n_heads=2, chunk_size=8)
    x = torch.randn(2, 13, 16, requires_grad=True)
    y_ref, st_ref = m(x)
    with backends.backends(["fake"]):
        y, st = m(x)
    assert calls
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-5)
    y.sum().backward()
    assert x.grad is not None and m.qkv.weight.grad is not None


def test_unknown_op_is_refused():
    with pytest.raises(ValueError, match="no op"):
        backends.register_backend("softmax", "x", lambda *a: a)


# ------------------------------------------------------------------ the real kernels, where there is a GPU for them
_cuda = torch.cuda.is_available()


@pytest.mark.skipif(not (_cuda and importlib.util.find_spec("fla")), reason="needs CUDA and fla")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fla_matches_reference(dtype):
    q, k, v, beta, g = _qkv(b=2, t=300, h=4, d=64, device="cuda", dtype=dtype)
    s0 = torch.randn(2, 4, 64, 64, device="cuda")
    tol = {torch.float32: 2e-3, torch.bfloat16: 5e-2}[dtype]
    for op, gates in ((delta_rule, {"beta": beta}), (gated_delta_rule, {"beta": beta, "g": g})):
        ref_o, ref_s = op(q.double(), k.double(), v.double(), **{n: x.double() for n, x in gates.items()},
                          initial_state=s0.double(), mode="recurrent")
        with backends.backends(["fla"]):
            assert _backends.select(op.__name__, q, k, v, *gates.values(), s0) is not None
            o, s = op(q, k, v, **gates, initial_state=s0)
        scale_o, scale_s = ref_o.abs().max(), ref_s.abs().max()
        assert (o.double() - ref_o).abs().max() <= tol * scale_o, op.__name__
        assert (s.double() - ref_s).abs().max() <= tol * scale_s, op.__name__


@pytest.mark.skipif(not (_cuda and importlib.util.find_spec("mamba_ssm")), reason="needs CUDA and mamba_ssm")
def test_mamba_ssd_matches_reference():
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(2, 300, 4, 64, device="cuda", generator=g)
    dt = torch.rand(2, 300, 4, device="cuda", generator=g) * 0.1
    A = -torch.rand(4, device="cuda", generator=g)
    B, C = (torch.randn(2, 300, 4, 16, device="cuda", generator=g) for _ in range(2))
    ref_y, ref_s = ssd(x.double(), dt.double(), A.double(), B.double(), C.double(), mode="recurrent")
    with backends.backends(["mamba_ssm"]):
        y, s = ssd(x, dt, A, B, C)
    assert (y.double() - ref_y).abs().max() <= 2e-3 * ref_y.abs().max()
    assert (s.double() - ref_s).abs().max() <= 2e-3 * ref_s.abs().max()
