"""VORT's SOE retention as a simple-GLA call with the channels as heads (ops/vort/gla.py; on CUDA it calls fla's
``chunk_simple_gla``).  Here the GLA call is a per-token loop with fla's contract (``h_t = e^{g_t} h_{t-1} + k_t v_tᵀ``,
``o_t = scale·h_tᵀ q_t``), so the tests check the reduction itself against the recurrent reference (naive.py):
outputs, states, gradients of every input and state tensor, split sequences, both normalisers, scaled keys.  With a
GPU and fla installed, fla's kernel is also checked against that loop."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from conftest import assert_rel_close
from seqmem.ops.vort import chunk as vort_chunk
from seqmem.ops.vort import gla as vort_gla
from seqmem.ops.vort import soe_retention

B, T, H, F, DV, S = 2, 9, 2, 4, 3, 3


def gla_loop(q, k, v, g, scale=None, initial_state=None, output_final_state=False):
    """fla's ``chunk_simple_gla`` contract as a loop: (B, T, H, K), (B, T, H, V), g (B, T, H), state (B, H, K, V)."""
    Bq, Tq, Hq, K = q.shape
    h = q.new_zeros(Bq, Hq, K, v.shape[-1]) if initial_state is None else initial_state.to(q.dtype)
    outs = []
    for t in range(Tq):
        h = torch.exp(g[:, t])[..., None, None] * h + k[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], h) * scale)
    return torch.stack(outs, 1), (h if output_final_state else None)


def _inputs(seed, dtype, scaled, plain, state, t=T, device="cpu"):
    """SOE retention inputs (also those of tests/ops/test_vort_triton.py, on its device)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape, pos=False):
        x = torch.randn(*shape, generator=g, dtype=torch.float64)
        return (x.abs() + 0.1 if pos else x).to(device, dtype).requires_grad_()

    q, k, v = r(B, t, H, F, pos=True), r(B, t, H, F, pos=True), r(B, t, H, DV)
    coef, cn = r(B, t, H, S, pos=True), r(B, t, H, pos=True)
    xi = torch.tensor([0.0, 0.3, 1.5], dtype=dtype, device=device)  # a λ = 1 channel included
    beta = r(B, t, H) if scaled else None
    st = None
    if state:
        st = {"G": r(B, H, S, F, DV), "b": r(B, H, S, F, pos=True)}
        if plain:
            st["z"] = r(B, H, F, pos=True)
        if scaled:
            st["m"] = r(B, H)
    return q, k, v, coef, xi, cn, beta, st


def _run_gla(q, k, v, coef, xi, cn, beta, st, normalizer):
    return vort_gla.soe_retention_gla(q, k, v, coef, xi, cn, eps0=1e-3, normalizer=normalizer, initial_state=st,
                                      k_log_scale=beta, gla=gla_loop)  # fmt: skip


def _run_ref(q, k, v, coef, xi, cn, beta, st, normalizer):
    return soe_retention(q, k, v, coef, xi, cn, eps0=1e-3, normalizer=normalizer, initial_state=st,
                         k_log_scale=beta, mode="recurrent")  # fmt: skip


def _check(out, ref, ins, tol):
    (o, s), (o_r, s_r) = out, ref
    assert set(s) == set(s_r)
    assert_rel_close(o, o_r, tol, "o")
    for n in s:
        assert_rel_close(s[n], s_r[n], tol, f"state {n}")
    gen = torch.Generator().manual_seed(3)
    w = {n: torch.randn(x.shape, generator=gen, dtype=torch.float64).to(x.dtype) for n, x in s.items()}
    wo = torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype)

    def loss(o, s):
        return (o * wo).sum() + sum((s[n] * w[n]).sum() for n in s)

    for i, (a, b) in enumerate(zip(torch.autograd.grad(loss(o, s), ins), torch.autograd.grad(loss(o_r, s_r), ins))):
        assert_rel_close(a, b, 10 * tol, f"grad of input {i}")


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
@pytest.mark.parametrize("normalizer", ["kernel", "plain"])
@pytest.mark.parametrize("scaled,state", [(False, False), (True, True), (True, False)])
def test_matches_recurrent(dtype, tol, normalizer, scaled, state):
    q, k, v, coef, xi, cn, beta, st = _inputs(0, dtype, scaled, normalizer == "plain", state)
    ins = [x for x in (q, k, v, coef, cn, beta, *(st or {}).values()) if x is not None]
    _check(_run_gla(q, k, v, coef, xi, cn, beta, st, normalizer), _run_ref(q, k, v, coef, xi, cn, beta, st,
                                                                             normalizer), ins, tol)  # fmt: skip


@pytest.mark.parametrize("normalizer", ["kernel", "plain"])
def test_split_sequence_continues_from_state(normalizer):
    q, k, v, coef, xi, cn, beta, _ = _inputs(1, torch.float64, True, normalizer == "plain", False)
    ref = _run_ref(q, k, v, coef, xi, cn, beta, None, normalizer)

    def part(sl, st):
        return _run_gla(q[:, sl], k[:, sl], v[:, sl], coef[:, sl], xi, cn[:, sl], beta[:, sl], st, normalizer)

    o1, s1 = part(slice(0, 4), None)
    o2, s2 = part(slice(4, None), s1)
    _check((torch.cat([o1, o2], 1), s2), ref, [q, k, v, coef, cn, beta], 1e-10)


def test_op_dispatch(monkeypatch):
    """soe_retention(mode="chunk") takes the GLA form where it applies (CUDA + fla; forced here), not with
    strict_causal."""
    monkeypatch.setattr(vort_chunk, "_gla_form", lambda *a: "fla")
    monkeypatch.setattr(vort_gla, "_fla_gla", lambda: gla_loop)
    calls = []
    monkeypatch.setattr(vort_chunk, "soe_retention_gla", lambda *a, **kw: calls.append(1) or
                        vort_gla.soe_retention_gla(*a, **kw))  # fmt: skip
    q, k, v, coef, xi, cn, beta, _ = _inputs(2, torch.float64, True, False, False)
    o, s = soe_retention(q, k, v, coef, xi, cn, k_log_scale=beta, eps0=1e-3)
    o_r, s_r = soe_retention(q, k, v, coef, xi, cn, k_log_scale=beta, eps0=1e-3, mode="recurrent")
    assert calls == [1]
    assert_rel_close(o, o_r, 1e-10, "o")
    soe_retention(q, k, v, coef, xi, cn, k_log_scale=beta, eps0=1e-3, strict_causal=True)
    assert calls == [1]


@pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("fla") is None,
                    reason="fla's kernel needs a GPU and flash-linear-attention")
def test_fla_kernel_matches_loop():
    q, k, v, coef, xi, cn, beta, st = (x.detach().cuda() if isinstance(x, torch.Tensor) else x
                                       for x in _inputs(4, torch.float32, True, False, False))  # fmt: skip
    o, s = vort_gla.soe_retention_gla(q, k, v, coef, xi.cuda(), cn, eps0=1e-3, normalizer="kernel",
                                      initial_state=None, k_log_scale=beta)  # fmt: skip
    o_r, s_r = _run_gla(q, k, v, coef, xi.cuda(), cn, beta, None, "kernel")
    # float32 through fla's kernel: TF32 matmuls on NVIDIA GPUs (about 1e-3 relative), hence 5e-3
    assert_rel_close(o, o_r, 5e-3, "o (fla vs loop)")
    assert_rel_close(s["G"], s_r["G"], 5e-3, "G (fla vs loop)")
