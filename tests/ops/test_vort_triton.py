"""seqmem's chunked simple-GLA Triton kernel (ops/vort/chunk_simple_gla.py), which runs VORT's SOE retention on CUDA
when flash-linear-attention is not there, against the per-token loop of its contract in float64, in float32:
outputs, the final state, the gradients of q, k, v, the gates and the initial state, a split sequence continued
from its state; then the whole SOE retention through it against the recurrent reference (naive.py), and the op's
choice of kernel.  Without a GPU the kernel runs in Triton's CPU interpreter on tiny shapes (chunks of 16 tokens,
a partial last chunk, head sizes that are not powers of two, two value blocks)."""

from __future__ import annotations

import pytest
import torch
from _triton_util import assert_layer_same_on_kernel, kernel_module
from test_vort_gla import _inputs as soe_inputs

from conftest import assert_rel_close
from seqmem import backends
from seqmem.ops import _triton
from seqmem.ops.vort import chunk as vort_chunk
from seqmem.ops.vort import gla as vort_gla
from seqmem.ops.vort import soe_retention

kern, DEVICE = kernel_module("seqmem.ops.vort.chunk_simple_gla")


def gla_loop(q, k, v, g, scale, h0):
    """``h_t = e^{g_t} h_{t-1} + k_t v_tᵀ``, ``o_t = scale · h_tᵀ q_t``, one token at a time, in float64."""
    q, k, v, g = (x.double() for x in (q, k, v, g))
    h = q.new_zeros(q.shape[0], q.shape[2], q.shape[3], v.shape[-1]) if h0 is None else h0.double()
    outs = []
    for t in range(q.shape[1]):
        h = torch.exp(g[:, t])[..., None, None] * h + k[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], h) * scale)
    return torch.stack(outs, 1), h


def _inputs(seed, B, T, H, K, V, state=True):
    gen = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(DEVICE).requires_grad_()

    g = (-torch.rand(B, T, H, generator=gen) * 0.6).to(DEVICE).requires_grad_()  # log-gates ≤ 0
    return r(B, T, H, K), r(B, T, H, K), r(B, T, H, V), g, (r(B, H, K, V) if state else None)


def _check(out, ref, ins, tol=2e-5, tol_grad=5e-5):
    (o, h), (o_r, h_r) = out, ref
    assert o.dtype == torch.float32 and h.dtype == torch.float32
    assert_rel_close(o.double(), o_r, tol, "o")
    assert_rel_close(h.double(), h_r, tol, "final state")
    gen = torch.Generator().manual_seed(7)
    wo, wh = torch.randn(o.shape, generator=gen, dtype=torch.float64), torch.randn(h.shape, generator=gen,
                                                                                   dtype=torch.float64)
    ins = [x for x in ins if x is not None]
    ga = torch.autograd.grad((o.double() * wo.to(DEVICE)).sum() + (h.double() * wh.to(DEVICE)).sum(), ins)
    gr = torch.autograd.grad((o_r * wo.to(DEVICE)).sum() + (h_r * wh.to(DEVICE)).sum(), ins)
    for name, a, b in zip("q k v g h0".split(), ga, gr):
        assert_rel_close(a.double(), b, tol_grad, f"d{name}")


@pytest.mark.parametrize(("B", "T", "H", "K", "V", "state", "chunk"), [
    (2, 37, 2, 8, 20, True, 16),  # 3 chunks, the last partial
    (1, 16, 1, 16, 16, False, 16),  # one whole chunk, no initial state
    (1, 9, 2, 5, 40, True, 16),  # shorter than a chunk; K padded to 16; two value blocks (32 for float32), one partial
    (1, 20, 1, 40, 24, True, 16),  # two key blocks, the second partial
    (1, 45, 1, 8, 8, True, None),  # the default chunk (32 for float32): two chunks
])
def test_kernel_matches_loop(B, T, H, K, V, state, chunk):  # noqa: N803
    q, k, v, g, h0 = _inputs(B * 100 + T, B, T, H, K, V, state)
    out = kern.chunk_simple_gla(q, k, v, g, scale=0.7, initial_state=h0, output_final_state=True, chunk_size=chunk)
    _check(out, gla_loop(q, k, v, g, 0.7, h0), [q, k, v, g, h0])


def test_split_sequence_continues_from_its_state():
    q, k, v, g, h0 = _inputs(3, 2, 41, 2, 8, 12)
    ref = gla_loop(q, k, v, g, 0.5, h0)
    o1, h1 = kern.chunk_simple_gla(q[:, :19], k[:, :19], v[:, :19], g[:, :19], scale=0.5, initial_state=h0,
                                   output_final_state=True, chunk_size=16)
    o2, h2 = kern.chunk_simple_gla(q[:, 19:], k[:, 19:], v[:, 19:], g[:, 19:], scale=0.5, initial_state=h1,
                                   output_final_state=True, chunk_size=16)
    _check((torch.cat([o1, o2], 1), h2), ref, [q, k, v, g, h0])


def test_defaults_and_no_final_state():
    """``scale`` defaults to K^-½; without ``output_final_state`` the state is None and the backward has no state
    gradient to take; T = 0 returns the initial state."""
    q, k, v, g, _ = _inputs(4, 1, 20, 1, 9, 8, state=False)
    o, h = kern.chunk_simple_gla(q, k, v, g, chunk_size=16)
    assert h is None
    o_r, _ = gla_loop(q, k, v, g, 9 ** -0.5, None)
    assert_rel_close(o.double(), o_r, 2e-5, "o")
    w = torch.randn(o.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(DEVICE)
    ga = torch.autograd.grad((o.double() * w).sum(), [q, k, v, g])
    gr = torch.autograd.grad((o_r * w).sum(), [q, k, v, g])
    for a, b in zip(ga, gr):
        assert_rel_close(a.double(), b, 5e-5, "grad")
    h0 = torch.randn(1, 1, 9, 8).to(DEVICE)
    o0, h0_out = kern.chunk_simple_gla(q[:, :0], k[:, :0], v[:, :0], g[:, :0], initial_state=h0,
                                       output_final_state=True)
    assert o0.shape == (1, 0, 1, 8) and torch.equal(h0_out, h0) and h0_out is not h0


def test_refusals():
    q, k, v, g, h0 = (x.detach() for x in _inputs(5, 1, 8, 1, 4, 4))
    with pytest.raises(ValueError, match="float64"):
        kern.chunk_simple_gla(q.double(), k.double(), v.double(), g.double())
    with pytest.raises(ValueError, match="power of two"):
        kern.chunk_simple_gla(q, k, v, g, chunk_size=24)
    with pytest.raises(ValueError, match="power of two from 16 to 128"):
        kern.chunk_simple_gla(q, k, v, g, chunk_size=256)
    with pytest.raises(ValueError, match="must agree"):
        kern.chunk_simple_gla(q, k, v, g[:, :4])
    with pytest.raises(ValueError, match="initial_state"):
        kern.chunk_simple_gla(q, k, v, g, initial_state=h0[..., :3])


# ------------------------------------------------------------------ VORT's SOE retention through the kernel
def _soe_inputs(seed, scaled, plain, state, t=21):
    return soe_inputs(seed, torch.float32, scaled, plain, state, t=t, device=DEVICE)


@pytest.mark.parametrize(("scaled", "plain", "state"), [(False, False, False), (True, False, True),
                                                        (False, True, True), (True, True, False)])
def test_soe_retention_through_the_kernel(scaled, plain, state):
    q, k, v, coef, xi, cn, beta, st = _soe_inputs(11, scaled, plain, state)
    normalizer = "plain" if plain else "kernel"
    o, s = vort_gla.soe_retention_gla(q, k, v, coef, xi, cn, eps0=1e-3, normalizer=normalizer, initial_state=st,
                                      k_log_scale=beta, gla=kern.chunk_simple_gla)
    d = {n: (x.double() if isinstance(x, torch.Tensor) else x) for n, x in
         dict(q=q, k=k, v=v, coef=coef, xi=xi, cn=cn, beta=beta).items()}
    st_d = None if st is None else {n: x.double() for n, x in st.items()}
    o_r, s_r = soe_retention(d["q"], d["k"], d["v"], d["coef"], d["xi"], d["cn"], eps0=1e-3, normalizer=normalizer,
                             initial_state=st_d, k_log_scale=d["beta"], mode="recurrent")
    assert set(s) == set(s_r)
    assert_rel_close(o.double(), o_r, 1e-4, "o")
    for n in s:
        assert_rel_close(s[n].double(), s_r[n], 1e-4, f"state {n}")
    ins = [x for x in (q, k, v, coef, cn, beta, *(st or {}).values()) if x is not None]
    w = torch.randn(o.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64).to(DEVICE)
    ga = torch.autograd.grad((o.double() * w).sum() + sum(x.double().sum() for x in s.values()), ins)
    gr = torch.autograd.grad((o_r * w).sum() + sum(x.sum() for x in s_r.values()), ins)
    for i, (a, b) in enumerate(zip(ga, gr)):
        assert_rel_close(a.double(), b, 5e-4, f"grad {i}")


def test_op_takes_seqmems_kernel_without_fla(monkeypatch):
    """On CUDA (faked here: the interpreter takes CPU tensors) soe_retention(mode="chunk") runs fla's kernel where
    the fla backend is enabled and installed, else seqmem's; with Triton off or float64, the PyTorch forms."""
    monkeypatch.setattr(vort_chunk._triton, "use_triton", lambda *ts: _triton._enabled())
    q, k, v, coef, xi, cn, beta, _ = _soe_inputs(12, True, False, False)
    args = (q, k, v, coef, cn, None, beta)
    monkeypatch.setattr(vort_chunk._FLA_GLA, "_available", True)
    assert vort_chunk._gla_form(*args) == "fla"
    with backends.backends("pytorch"):  # the fla backend off: seqmem's kernel, which follows the Triton switch
        assert vort_chunk._gla_form(*args) == "triton"
        prev = _triton.set_triton(False)
        try:
            assert vort_chunk._gla_form(*args) is None
        finally:
            _triton.set_triton(prev)
        assert vort_chunk._gla_form(q.double(), *args[1:]) is None
        with backends.record_forms() as forms:
            o, s = soe_retention(q, k, v, coef, xi, cn, k_log_scale=beta, eps0=1e-3)
        assert forms == {"soe_retention": {"triton": 1}}
        o_r, s_r = soe_retention(*(x.double() for x in (q, k, v, coef, xi, cn)), k_log_scale=beta.double(),
                                 eps0=1e-3, mode="recurrent")
        assert_rel_close(o.double(), o_r, 1e-4, "o")
        assert_rel_close(s["G"].double(), s_r["G"], 1e-4, "G")


def test_continues_a_state_that_has_seen_no_key():
    """An empty piece with scaled keys returns m = −inf (no key scale yet); the next piece through the kernel takes
    its first key's units (a gate of −inf − β would make the kernel's γ_i − γ_j a NaN)."""
    q, k, v, coef, xi, cn, beta, _ = _soe_inputs(13, True, False, False)
    _, st = soe_retention(q[:, :0], k[:, :0], v[:, :0], coef[:, :0], xi, cn[:, :0], k_log_scale=beta[:, :0])
    assert torch.isinf(st["m"]).all()
    o, s = vort_gla.soe_retention_gla(q, k, v, coef, xi, cn, eps0=1e-3, normalizer="kernel", initial_state=st,
                                      k_log_scale=beta, gla=kern.chunk_simple_gla)
    o_r, s_r = soe_retention(q, k, v, coef, xi, cn, eps0=1e-3, initial_state=st, k_log_scale=beta, mode="recurrent")
    assert_rel_close(o, o_r, 1e-4, "o")
    assert_rel_close(s["G"], s_r["G"], 1e-4, "G")


@pytest.mark.parametrize("name", ["vort", "vort_fixed_alpha", "exp_decay", "exp_mixture"])
def test_layers_through_the_kernel(monkeypatch, name):
    """Each VORT-family layer, forward and backward, with its retention through seqmem's kernel (CUDA faked: the
    interpreter takes CPU tensors; fla off) equals the same layer on the PyTorch forms, streaming included."""
    from seqmem import build_mixer

    torch.manual_seed(0)
    few = {"vort": {"n_soe": 3}, "vort_fixed_alpha": {"n_soe": 3}, "exp_mixture": {"n_exp": 2}}.get(name, {})
    # (fewer channels than the defaults: the interpreter is slow)
    assert_layer_same_on_kernel(monkeypatch, vort_chunk, build_mixer(name, 32, n_heads=2, **few), "soe_retention",
                                DEVICE)


@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU (the kernel is compiled there)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("K", "V"), [(64, 65), (128, 129)])  # VORT: the features; the values and the key-sum column
def test_kernel_at_benchmark_sizes(dtype, K, V):  # noqa: N803
    """The compiled kernel at the sizes a layer gives it (T = 300, not a multiple of the chunk; 16 heads of SOE
    channels), float32 (full-precision products) and bfloat16 (TF32), against the float64 loop."""
    q, k, v, g, h0 = (x.detach() for x in _inputs(21, 2, 300, 16, K, V))
    ins = [x.to(dtype).requires_grad_() for x in (q, k, v)] + [g.requires_grad_(), h0.requires_grad_()]
    ref_ins = [x.detach().double().requires_grad_() for x in ins]
    o, h = kern.chunk_simple_gla(*ins[:4], scale=K ** -0.5, initial_state=ins[4], output_final_state=True)
    o_r, h_r = gla_loop(*ref_ins[:4], K ** -0.5, ref_ins[4])
    assert o.dtype == dtype and h.dtype == torch.float32
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    assert_rel_close(o.double(), o_r, tol, "o")
    assert_rel_close(h.double(), h_r, tol, "final state")
    gen = torch.Generator().manual_seed(3)
    wo = torch.randn(o.shape, generator=gen, dtype=torch.float64).to(DEVICE)
    wh = torch.randn(h.shape, generator=gen, dtype=torch.float64).to(DEVICE)
    ga = torch.autograd.grad((o.double() * wo).sum() + (h.double() * wh).sum(), ins)
    gr = torch.autograd.grad((o_r * wo).sum() + (h_r * wh).sum(), ref_ins)
    for name, a, b in zip("q k v g h0".split(), ga, gr):
        assert_rel_close(a.double(), b, 10 * tol, f"d{name}")
