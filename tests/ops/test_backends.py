"""Op backends (seqmem.backends): the built-in ones (fla, mamba_ssm) on by default, used only where installed and
supported (CUDA, half precision, head sizes their kernels take), else the PyTorch form runs; switched off by the API
or SEQMEM_BACKENDS.  Fakes stand in for the GPU kernels on CPU (a fake backend; fla "installed" with a stand-in
that refuses float32 as fla does, tensors reporting is_cuda).  The real kernels are checked against seqmem's
reference forms, op by op and layer by layer, only where CUDA and the package are present."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from _core_util import tensor_state

import seqmem
import seqmem.ops as _ops
from seqmem import backends
from seqmem.ops import _backends, _triton

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


def test_built_in_backends_on_by_default_and_switches_off(fake, monkeypatch):
    calls, _ = fake
    monkeypatch.delenv("SEQMEM_BACKENDS", raising=False)
    assert backends.enabled_backends() == ("fla", "mamba_ssm") == backends.DEFAULT
    q, k, v, beta, g = _qkv()
    gated_delta_rule(q, k, v, beta=beta, g=g)
    assert calls == []  # a registered backend is not enabled unless named
    for env in ("pytorch", "", "none", " pytorch "):
        monkeypatch.setenv("SEQMEM_BACKENDS", env)
        assert backends.enabled_backends() == (), env
    monkeypatch.setenv("SEQMEM_BACKENDS", "fla")
    assert backends.enabled_backends() == ("fla",)
    with backends.backends("pytorch"):  # the API wins over the environment
        assert backends.enabled_backends() == ()
    assert backends.enabled_backends() == ("fla",)
    backends.use_backends([])
    assert backends.enabled_backends() == ()
    backends.use_backends(None)
    assert backends.enabled_backends() == ("fla",)


def test_unknown_backend_names_are_errors(monkeypatch):
    with pytest.raises(ValueError, match="unknown backend.*'flash'"):
        backends.use_backends(["flash"])
    with pytest.raises(ValueError, match="cannot be combined"):
        backends.use_backends("pytorch,fla")
    monkeypatch.setenv("SEQMEM_BACKENDS", "fla,triton_x")
    with pytest.raises(ValueError, match="SEQMEM_BACKENDS: unknown backend"):
        backends.enabled_backends()
    with pytest.raises(ValueError, match="means 'no backend'"):
        backends.register_backend("delta_rule", "pytorch", lambda *a: a)
    assert backends.enabled_backends.__module__ == "seqmem.ops._backends"


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


# ------------------------------------ what fla's kernels take, on the CPU: a stand-in that refuses as fla does
@pytest.fixture
def fake_fla(monkeypatch):
    """fla "installed" with its kernels replaced by a stand-in that refuses float32 as fla's chunk kernels do
    ("... does not support float32"), and every tensor reporting ``is_cuda``: what a CUDA machine with fla sees
    (seqmem's own Triton kernels off, which would take linear attention's calls that fla does not)."""
    calls = []

    def kernel_for(op):
        def run(q, *args):
            if q.dtype == torch.float32:
                raise AssertionError(f"{op}: ChunkFunction does not support float32. Please use bfloat16.")
            calls.append((op, q.dtype, q.shape[-1]))
            with backends.backends("pytorch"):
                s0 = None if args[-2] is None else {"S": args[-2]}
                k, v, *gates = args[:-3]
                kw = dict(zip(("beta", "g"), gates))  # by keyword: the gates' order differs between conventions
                o, st = getattr(_ops, op)(q, k, v, **kw, scale=args[-3], initial_state=s0)
            return o, st["S"]

        return run

    for op in ("linear_attention", "delta_rule", "gated_delta_rule"):
        b = next(x for x in _backends._REGISTRY[op] if x.name == "fla")
        monkeypatch.setattr(b, "_available", True)
        monkeypatch.setattr(b, "fn", kernel_for(op))
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    backends.use_backends(["fla"])
    prev = _triton.set_triton(False)  # seqmem's own Triton kernels off: the calls fla refuses run the PyTorch forms
    yield calls
    _triton.set_triton(prev)
    backends.use_backends(None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_fla_gets_half_precision_only(fake_fla, dtype):
    """float32 (and float64) calls run the PyTorch form on a CUDA machine with fla: fla's chunk_delta_rule asserts
    it does not support float32, so sending it there failed every float32 call."""
    q, k, v, beta, g = _qkv(dtype=dtype)
    s0 = torch.randn(2, 2, 8, 8)
    delta_rule(q, k, v, beta=beta, initial_state=s0)
    gated_delta_rule(q, k, v, beta=beta, g=g, initial_state=s0)
    _ops.linear_attention(q, k, v)
    half = dtype == torch.bfloat16
    assert [c[0] for c in fake_fla] == (["delta_rule", "gated_delta_rule", "linear_attention"] if half else [])


@pytest.mark.parametrize("hopper, triton_version, to_fla", [
    (True, "3.6.0", False), (True, "3.4.0", False), (True, "3.4", False), (True, "3.7.1rc1", False),
    (True, "3.7.1", True), (True, "3.4.0rc1", True), (True, "3.3.1", True), (False, "3.6.0", True),
    (True, None, True)])
def test_fla_gated_backward_refused_on_hopper_with_triton_3_4_to_3_7(fake_fla, monkeypatch, hopper,
                                                                      triton_version, to_fla):
    """fla 0.6.0's gated delta-rule backward raises on Hopper with 3.4.0 <= triton < 3.7.1 (seen on an H200 with
    triton 3.6.0: "... produces incorrect results for gated chunk_bwd_dqkwg"; bounds as fla's ``packaging``
    compares them), so a training call that took fla there crashed in its backward: such calls run seqmem's own
    forms; a call without gradients stays on fla, and the plain delta rule (no gate) is not affected."""
    monkeypatch.setattr(_backends, "_is_hopper", lambda device: hopper)
    monkeypatch.setattr(_backends, "_triton_version",
                        lambda: None if triton_version is None else _backends.parse_version(triton_version))
    q, k, v, beta, g = (x.requires_grad_() for x in _qkv(dtype=torch.bfloat16))
    o, _ = gated_delta_rule(q, k, v, beta=beta, g=g)
    o.float().sum().backward()  # the PyTorch form where fla is refused: a backward that works
    with torch.no_grad():
        gated_delta_rule(q, k, v, beta=beta, g=g)
    gated_delta_rule(*(x.detach() for x in (q, k, v)), beta=beta.detach(), g=g.detach())  # nothing wants a grad
    delta_rule(q, k, v, beta=beta)
    gated = ["gated_delta_rule"] if to_fla else []
    assert [c[0] for c in fake_fla] == gated + ["gated_delta_rule"] * 2 + ["delta_rule"]
    # which_form answers for a training call, in or out of grad mode
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            assert (backends.which_form("gated_delta_rule", "cuda", torch.bfloat16) == "fla") == to_fla


def test_vort_fla_kernel_refused_for_training_where_fla_gated_backward_raises(monkeypatch):
    """VORT's retention on fla's simple GLA has the same gated backward: on such a machine a call that wants
    gradients takes seqmem's own simple-GLA kernel, one without stays on fla."""
    from seqmem.ops.vort import chunk as vort_chunk

    monkeypatch.setattr(vort_chunk._triton, "use_triton", lambda *a: True)
    monkeypatch.setattr(vort_chunk._FLA_GLA, "_available", True)
    monkeypatch.setattr(_backends, "_is_hopper", lambda device: True)
    monkeypatch.setattr(_backends, "_triton_version", lambda: (3, 6, 0, 1))
    x = torch.rand(1, 4, 2, 3)
    assert vort_chunk._gla_form(x, x, x, x, x, {}, None) == "fla"
    xg = x.clone().requires_grad_()
    assert vort_chunk._gla_form(x, xg, x, x, x, {}, None) == "triton"
    with torch.no_grad():
        assert vort_chunk._gla_form(x, xg, x, x, x, {}, None) == "fla"
    monkeypatch.setattr(_backends, "_triton_version", lambda: (3, 7, 1, 1))
    assert vort_chunk._gla_form(x, xg, x, x, x, {}, None) == "fla"


def test_version_parsing_orders_as_packaging_does():
    """``parse_version``: pre-releases below their release, missing parts 0, local tags ignored; ``_is_hopper``
    says no without CUDA."""
    pv = _backends.parse_version
    assert pv("3.6.0") == (3, 6, 0, 1) and pv("3.4") == (3, 4, 0, 1) and pv("3.7.1+git1a2b") == (3, 7, 1, 1)
    assert pv("3.7.1rc1") < pv("3.7.1") and pv("3.4.0.dev0") < pv("3.4.0") and pv("3.4.0rc1") < pv("3.4.0")
    assert pv("3.6.0.post1") == (3, 6, 0, 1) and pv("nightly") is None
    if not torch.cuda.is_available():
        assert _backends._is_hopper(torch.device("cuda")) is False


def test_is_hopper_reads_the_devices_fla_reads(monkeypatch):
    """fla counts a machine as Hopper from device 0's name or the current device's capability; seqmem also checks
    the tensor's own device."""
    caps = {0: (8, 0), 1: (9, 0)}
    names = {0: "NVIDIA A100-SXM4-80GB", 1: "NVIDIA H100 80GB HBM3"}
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "current_device", lambda: 0)
    monkeypatch.setattr(cuda, "get_device_capability", lambda i=None: caps[0 if i is None else i])
    monkeypatch.setattr(cuda, "get_device_name", lambda i=None: names[0 if i is None else i])
    assert not _backends._is_hopper(torch.device("cuda", 0))
    assert _backends._is_hopper(torch.device("cuda", 1))  # the tensor's own device
    monkeypatch.setattr(cuda, "current_device", lambda: 1)
    assert _backends._is_hopper(torch.device("cuda", 0))  # fla's current-device check
    names[0] = "NVIDIA H200"
    monkeypatch.setattr(cuda, "current_device", lambda: 0)
    assert _backends._is_hopper(torch.device("cuda", 0))  # fla's device-0 name check


def test_float16_linear_attention_stays_on_pytorch(fake_fla):
    """fla keeps linear attention's undecayed per-chunk states in the input's dtype: float16 overflows near 65k
    tokens there, so float16 linear attention runs the PyTorch form (float32 sums); the delta rules go to fla."""
    q, k, v, beta, g = _qkv(dtype=torch.float16)
    _ops.linear_attention(q, k, v)
    delta_rule(q, k, v, beta=beta)
    assert [c[0] for c in fake_fla] == ["delta_rule"]


def test_vort_fla_kernel_follows_the_backend_switch(monkeypatch):
    """VORT's fla kernel (simple GLA) is a backend like the others: SEQMEM_BACKENDS / use_backends("pytorch") turn
    it off (it used to follow only the Triton switch); seqmem's own kernel then runs, which follows the Triton
    switch (tests/ops/test_vort_triton.py)."""
    from seqmem.ops.vort import chunk as vort_chunk

    monkeypatch.setattr(vort_chunk._triton, "use_triton", lambda *a: True)
    monkeypatch.setattr(vort_chunk._FLA_GLA, "_available", True)
    x = torch.rand(1, 4, 2, 3)
    args = (x, x, x, x, x, {}, None)
    assert vort_chunk._gla_form(*args) == "fla"
    with backends.backends("pytorch"):
        assert vort_chunk._gla_form(*args) == "triton"
    with backends.backends(["mamba_ssm"]):
        assert vort_chunk._gla_form(*args) == "triton"
    assert vort_chunk._gla_form(x.double(), *args[1:]) is None


def test_mamba_gets_one_group_for_an_expanded_B_and_C():
    """Mamba-2's B and C are one group expanded over the heads (stride 0): the kernel gets that one group, not a
    copy per head (it would compute C Bᵀ once per head); a per-head B keeps its heads."""
    one = torch.randn(2, 5, 1, 16)
    expanded = one.expand(2, 5, 4, 16)
    assert _backends._shared_group(expanded).shape == (2, 5, 1, 16)
    torch.testing.assert_close(_backends._shared_group(expanded), one)
    per_head = torch.randn(2, 5, 4, 16)
    assert _backends._shared_group(per_head) is per_head


def test_fla_gets_head_sizes_it_takes_only(fake_fla):
    q, k, v, beta, g = _qkv(d=300, t=5, dtype=torch.bfloat16)
    delta_rule(q, k, v, beta)  # d_k = 300 > 256: the PyTorch form
    assert fake_fla == []
    q, k, v, beta, g = _qkv(d=256, t=5, dtype=torch.bfloat16)
    delta_rule(q, k, v, beta)
    assert fake_fla == [("delta_rule", torch.bfloat16, 256)]


def test_which_form_answers_for_a_device_not_here(fake_fla, monkeypatch):
    monkeypatch.undo()  # real is_cuda: which_form needs no tensor on the device
    b = next(x for x in _backends._REGISTRY["delta_rule"] if x.name == "fla")
    monkeypatch.setattr(b, "_available", True)
    assert backends.which_form("delta_rule", "cuda", torch.bfloat16, 128) == "fla"
    assert backends.which_form("delta_rule", "cuda", torch.float32, 128) == "pytorch"
    assert backends.which_form("delta_rule", "cuda", torch.bfloat16, 512) == "pytorch"
    assert backends.which_form("delta_rule", "cpu", torch.bfloat16, 128) == "pytorch"
    with backends.backends("pytorch"):
        assert backends.which_form("delta_rule", "cuda", torch.bfloat16, 128) == "pytorch"
    assert _ops.which_form is backends.which_form
    with pytest.raises(ValueError, match="no op 'softmax'"):
        backends.which_form("softmax", "cuda", torch.bfloat16)


def test_linear_attention_float32_values_with_bfloat16_keys(fake_fla):
    """The linear-attention mixer asks for float32 values (undecayed sums); fla then gets them in bfloat16 and the
    output comes back in float32, as the op promises."""
    q, k, v, _, _ = _qkv(dtype=torch.bfloat16)
    b = next(x for x in _backends._REGISTRY["linear_attention"] if x.name == "fla")
    seen = []
    b_fn = b.fn
    b.fn = lambda q, k, v, *a: (seen.append(v.dtype), b_fn(q, k, v.to(q.dtype), *a))[1]
    try:
        o, st = _ops.linear_attention(q, k, v.float())
    finally:
        b.fn = b_fn
    assert seen == [torch.float32]


def test_record_forms_reports_what_ran(fake):
    q, k, v, beta, g = _qkv()
    with backends.record_forms() as forms:
        gated_delta_rule(q, k, v, beta=beta, g=g)
        with backends.backends(["fake"]):
            gated_delta_rule(q, k, v, beta=beta, g=g)
        _ops.lattice_scan(k, k, v, 0.1)
    assert forms["gated_delta_rule"] == {"pytorch": 1, "fake": 1}
    assert set(forms["lattice_scan"]) <= {"cpp", "pytorch"}
    assert backends.forms_text({}) == "pytorch"
    assert backends.forms_text({"delta_rule": {"fla": 3}}) == "delta_rule: fla"


def test_unknown_op_is_refused():
    with pytest.raises(ValueError, match="no op"):
        backends.register_backend("softmax", "x", lambda *a: a)


# ------------------------------------------------------------------ the real kernels, where there is a GPU for them
_cuda = torch.cuda.is_available()


@pytest.mark.skipif(not (_cuda and importlib.util.find_spec("fla")), reason="needs CUDA and fla")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fla_matches_reference(dtype):
    """bfloat16 runs fla's kernels; float32 (which they refuse) falls back to the PyTorch form: both match."""
    q, k, v, beta, g = _qkv(b=2, t=300, h=4, d=64, device="cuda", dtype=dtype)
    s0 = torch.randn(2, 4, 64, 64, device="cuda")
    tol = {torch.float32: 2e-3, torch.bfloat16: 5e-2}[dtype]
    linear = tensor_state(_ops.linear_attention)
    cases = ((delta_rule, {"beta": beta}), (gated_delta_rule, {"beta": beta, "g": g}), (linear, {}))
    for op, gates in cases:  # the gates by keyword
        ref_o, ref_s = op(q.double(), k.double(), v.double(), **{n: x.double() for n, x in gates.items()},
                          initial_state=s0.double(), mode="recurrent")
        with backends.backends(["fla"]):
            chosen = _backends.select(op.__name__, q, k, v, *gates.values(), s0)
            assert (chosen is not None) == (dtype == torch.bfloat16), op.__name__
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
    with backends.backends(["mamba_ssm"]), backends.record_forms() as forms:
        y, s = ssd(x, dt, A, B, C)
    assert forms == {"ssd": {"mamba_ssm": 1}}, forms  # the kernel ran (a broken install falls back silently)
    # float32 on the kernel: TF32 matmuls (about 1e-3 relative)
    assert (y.double() - ref_y).abs().max() <= 2e-3 * ref_y.abs().max()
    assert (s.double() - ref_s).abs().max() <= 2e-3 * ref_s.abs().max()


@pytest.mark.skipif(not (_cuda and importlib.util.find_spec("mamba_ssm")), reason="needs CUDA and mamba_ssm")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mamba_ssd_initial_state_one_group_and_gradients(dtype):
    """mamba's kernel from an initial state (P = 64 ≠ N = 16, so a transposed state layout fails), B and C one
    group expanded over the heads (Mamba-2's layout), bfloat16 too; outputs, final state and the gradients of every
    input, the initial state and A included, against the float64 reference."""
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(2, 300, 4, 64, device="cuda", generator=g)
    dt = torch.rand(2, 300, 4, device="cuda", generator=g) * 0.1
    A = -torch.rand(4, device="cuda", generator=g)
    B1, C1 = (torch.randn(2, 300, 1, 16, device="cuda", generator=g) for _ in range(2))
    s0 = torch.randn(2, 4, 64, 16, device="cuda", generator=g)
    leaves = [t.to(dtype if i in (0, 3, 4) else torch.float32).requires_grad_()
              for i, t in enumerate((x, dt, A, B1, C1, s0))]
    ref = [t.detach().double().requires_grad_() for t in leaves]

    def run(xx, dd, aa, bb, cc, ss):
        return ssd(xx, dd, aa, bb.expand(-1, -1, 4, -1), cc.expand(-1, -1, 4, -1), initial_state=ss,
                   mode="chunk" if xx.dtype != torch.float64 else "recurrent")

    with backends.backends(["mamba_ssm"]), backends.record_forms() as forms:
        y, st = run(*leaves)
    assert forms == {"ssd": {"mamba_ssm": 1}}, forms
    y_r, st_r = run(*ref)
    tol = 3e-2 if dtype == torch.bfloat16 else 3e-3
    assert _rel(y, y_r) <= tol and _rel(st["S"], st_r["S"]) <= tol
    w = torch.randn(y.shape, device="cuda", generator=g)
    ws = torch.randn(st["S"].shape, device="cuda", generator=g)
    ga = torch.autograd.grad((y.float() * w).sum() + (st["S"].float() * ws).sum(), leaves)
    gb = torch.autograd.grad((y_r * w.double()).sum() + (st_r["S"] * ws.double()).sum(), ref)
    for name, a, b in zip(("x", "dt", "A", "B", "C", "initial_state"), ga, gb):
        assert _rel(a, b) <= 2 * tol, f"grad {name}: {_rel(a, b):.1e}"


@pytest.mark.skipif(not (_cuda and importlib.util.find_spec("fla")), reason="needs CUDA and fla")
def test_fla_gradients_from_an_initial_state():
    """fla's backward from an initial state (its dh0) and through β and g, in bfloat16, against float64."""
    q, k, v, beta, g = _qkv(b=2, t=300, h=4, d=64, device="cuda", dtype=torch.bfloat16)
    s0 = torch.randn(2, 4, 64, 64, device="cuda")
    cases = ((delta_rule, {"beta": beta}), (gated_delta_rule, {"beta": beta, "g": g}))
    for op, gates in cases:
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, *gates.values(), s0)]
        ref = [t.detach().double().requires_grad_() for t in leaves]
        names = ("q", "k", "v", *gates, "initial_state")

        def call(ts, mode, op=op, gates=gates):
            kw = dict(zip(gates, ts[3:-1]))
            return op(*ts[:3], **kw, initial_state=ts[-1], mode=mode)

        with backends.backends(["fla"]), backends.record_forms() as forms:
            o, st = call(leaves, "chunk")
        # where fla's gated backward refuses this machine (Hopper, 3.4 <= triton < 3.7.1) seqmem's own walk runs
        refused = op is gated_delta_rule and _backends._fla_gated_backward_refused(q.device)
        assert ("fla" in forms[op.__name__]) != refused, forms
        o_r, st_r = call(ref, "recurrent")
        w = torch.randn(o.shape, device="cuda")
        ga = torch.autograd.grad((o.float() * w).sum() + st["S"].float().sum(), leaves)
        gb = torch.autograd.grad((o_r * w.double()).sum() + st_r["S"].sum(), ref)
        for n, a, b in zip(names, ga, gb):
            assert _rel(a, b) <= 1e-1, f"{op.__name__} grad {n}: {_rel(a, b):.1e}"


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12))


@pytest.mark.parametrize("name,backend", [("linear_attention", "fla"), ("deltanet", "fla"),
                                          ("gated_deltanet", "fla"), ("mamba2", "mamba_ssm")])
def test_layer_on_the_gpu_kernels_matches_pytorch(name, backend):
    """A whole layer in bfloat16 on the backend's kernels (the default on CUDA) against the same layer on the
    PyTorch forms (seqmem's Triton kernels off): outputs, final state and input gradients within bfloat16
    tolerance; then which form float32 takes."""
    if not (_cuda and importlib.util.find_spec(backend)):
        pytest.skip(f"needs CUDA and {backend}")
    # where fla's gated backward refuses this machine (Hopper, 3.4 <= triton < 3.7.1) the layer with fla on trains
    # on seqmem's own walk: that is then what it must run, and match
    refused = name == "gated_deltanet" and _backends._fla_gated_backward_refused(torch.device("cuda"))
    torch.manual_seed(0)
    m = seqmem.build_mixer(name, 256, n_heads=2).to("cuda", torch.bfloat16)
    x = torch.randn(2, 300, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(2, 300, 256, device="cuda")
    outs = {}
    for be in ("pytorch", backend):
        x.grad = None
        prev = _triton.set_triton(False if be == "pytorch" else None)  # the reference: the PyTorch forms
        try:
            with backends.backends(be), backends.record_forms() as forms:
                y, st = m(x)
                (y.float() * w).sum().backward()
        finally:
            _triton.set_triton(prev)
        ran = {f for fs in forms.values() for f in fs}
        assert ran == ({"triton"} if refused and be != "pytorch" else {be}), f"{name}: {forms}"
        outs[be] = (y, st, x.grad.clone())
    (y0, s0, g0), (y1, s1, g1) = outs["pytorch"], outs[backend]
    assert _rel(y1, y0) <= 3e-2 and _rel(g1, g0) <= 5e-2, f"{name}: y {_rel(y1, y0):.1e}, dx {_rel(g1, g0):.1e}"
    for k in s0:
        assert _rel(s1[k], s0[k]) <= 3e-2, f"{name}: state[{k}] {_rel(s1[k], s0[k]):.1e}"
    with backends.record_forms() as forms:
        m.float()(x.detach().float())
    # fla's kernels refuse float32: linear attention then runs seqmem's simple-GLA Triton kernel, the delta rules
    # seqmem's walk over chunks (both Triton); mamba_ssm takes it (TF32 matmuls)
    want = {"mamba_ssm"} if backend == "mamba_ssm" else {"triton"}
    assert {f for fs in forms.values() for f in fs} == want, f"{name} float32: {forms}"
