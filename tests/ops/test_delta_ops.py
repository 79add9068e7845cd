"""delta_rule / gated_delta_rule: chunked (UT form) == recurrent == independent references; gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _core_util import grads, rand, tensor_state

import seqmem.ops as _ops
from conftest import assert_rel_close

B, H, DK, DV = 2, 3, 5, 4

delta_rule = tensor_state(_ops.delta_rule)
gated_delta_rule = tensor_state(_ops.gated_delta_rule)


def make(t, dtype=torch.float64, seed=0, init=True, grad=False, g_scale=0.3):
    q = rand(B, t, H, DK, dtype=dtype, seed=seed, requires_grad=grad)
    k = F.normalize(rand(B, t, H, DK, seed=seed + 1), dim=-1).to(dtype).requires_grad_(grad)
    v = rand(B, t, H, DV, dtype=dtype, seed=seed + 2, requires_grad=grad)
    beta = torch.sigmoid(rand(B, t, H, seed=seed + 3)).to(dtype).requires_grad_(grad)
    g = (-g_scale * rand(B, t, H, seed=seed + 4).abs()).to(dtype).requires_grad_(grad)
    s0 = rand(B, H, DK, DV, dtype=dtype, seed=seed + 5, requires_grad=grad) if init else None
    return q, k, v, beta, g, s0


# ---------------------------------------------------------------- independent references (other orientation)
def delta_ref(q, k, v, beta, s0, scale, g=None):
    """M_t = S_t^T (d_v x d_k): M_t = a_t M_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T,
    o_t = M_t q_t scale, written with explicit per-step transition matrices."""
    b, t, h, dk = q.shape
    eye = torch.eye(dk, dtype=q.dtype)
    M = torch.zeros(b, h, v.shape[-1], dk, dtype=q.dtype) if s0 is None else s0.transpose(-1, -2)
    out = []
    for i in range(t):
        kk = k[:, i, :, :, None] @ k[:, i, :, None, :]  # (b, h, dk, dk)
        trans = eye - beta[:, i, :, None, None] * kk
        if g is not None:
            trans = torch.exp(g[:, i])[..., None, None] * trans
        M = M @ trans + beta[:, i, :, None, None] * (v[:, i, :, :, None] @ k[:, i, :, None, :])
        out.append((M @ (scale * q[:, i, :, :, None]))[..., 0])
    return torch.stack(out, 1), M.transpose(-1, -2)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("t,chunk", [(1, 8), (7, 8), (37, 8), (64, 16), (45, 64)])
@pytest.mark.parametrize("init", [False, True])
def test_chunk_equals_recurrent_and_reference_f64(gated, t, chunk, init):
    q, k, v, beta, g, s0 = make(t, init=init)
    if gated:
        o_r, s_r = gated_delta_rule(q, k, v, beta=beta, g=g, initial_state=s0, mode="recurrent")
        o_c, s_c = gated_delta_rule(q, k, v, beta=beta, g=g, initial_state=s0, mode="chunk", chunk_size=chunk)
        o_x, s_x = delta_ref(q, k, v, beta, s0, DK**-0.5, g)
    else:
        o_r, s_r = delta_rule(q, k, v, beta, initial_state=s0, mode="recurrent")
        o_c, s_c = delta_rule(q, k, v, beta, initial_state=s0, mode="chunk", chunk_size=chunk)
        o_x, s_x = delta_ref(q, k, v, beta, s0, DK**-0.5)
    assert o_c.shape == (B, t, H, DV) and s_c.shape == (B, H, DK, DV)
    assert_rel_close(o_c, o_r, 1e-10, "chunk vs recurrent output")
    assert_rel_close(s_c, s_r, 1e-10, "chunk vs recurrent state")
    assert_rel_close(o_r, o_x, 1e-10, "recurrent vs independent reference")
    assert_rel_close(s_r, s_x, 1e-10, "recurrent state vs independent reference")


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_gradients_chunk_equal_recurrent(gated, dtype, tol):
    q, k, v, beta, g, s0 = make(29, dtype=dtype, grad=True)
    if gated:
        args = (q, k, v, beta, g, s0)

        def f(mode):
            return lambda q, k, v, beta, g, s0: gated_delta_rule(
                q, k, v, beta=beta, g=g, initial_state=s0, mode=mode, chunk_size=8
            )
    else:
        args = (q, k, v, beta, s0)

        def f(mode):
            return lambda q, k, v, beta, s0: delta_rule(
                q, k, v, beta, initial_state=s0, mode=mode, chunk_size=8
            )

    gr = grads(f("recurrent"), args)
    gc = grads(f("chunk"), args)
    assert len(gr) == len(args)
    names = ["q", "k", "v", "beta", "g", "s0"] if gated else ["q", "k", "v", "beta", "s0"]
    for a, b, name in zip(gc, gr, names):
        assert_rel_close(a, b, tol, f"grad {name}")


@pytest.mark.parametrize("gated", [False, True])
def test_float32_chunk_close_to_float64(gated):
    q, k, v, beta, g, s0 = make(50)
    fn = gated_delta_rule if gated else delta_rule
    extra64 = {"g": g} if gated else {}
    extra32 = {"g": g.float()} if gated else {}
    o64, s64 = fn(q, k, v, beta=beta, **extra64, initial_state=s0, mode="recurrent")
    q32, k32, v32, b32 = (x.float() for x in (q, k, v, beta))
    o32, s32 = fn(q32, k32, v32, beta=b32, **extra32, initial_state=s0.float(), chunk_size=16)
    assert o32.dtype == torch.float32 and s32.dtype == torch.float32
    assert_rel_close(o32, o64, 1e-5, "f32 chunk vs f64")
    assert_rel_close(s32, s64, 1e-5, "f32 chunk state vs f64")


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
def test_chained_calls_equal_single_call(gated, mode):
    q, k, v, beta, g, s0 = make(37)
    fn = gated_delta_rule if gated else delta_rule

    def call(sl, s):
        extra = {"g": g[:, sl]} if gated else {}
        return fn(q[:, sl], k[:, sl], v[:, sl], beta=beta[:, sl], **extra, initial_state=s, mode=mode, chunk_size=8)

    o, s = call(slice(0, 37), s0)
    outs, st = [], s0
    for a, b in ((0, 3), (3, 12), (12, 13), (13, 37)):
        oi, st = call(slice(a, b), st)
        outs.append(oi)
    assert_rel_close(torch.cat(outs, 1), o, 1e-10, "chained outputs")
    assert_rel_close(st, s, 1e-10, "chained final state")


def test_gated_chunk_stable_with_strong_decay():
    """Decays down to e^-50 per token inside a 64-chunk: cumulative products underflow (e^-3200) but the
    segment-sum form stays finite and exact."""
    q, k, v, beta, g, s0 = make(100, g_scale=50.0)
    o_r, s_r = gated_delta_rule(q, k, v, beta=beta, g=g, initial_state=s0, mode="recurrent")
    o_c, s_c = gated_delta_rule(q, k, v, beta=beta, g=g, initial_state=s0, mode="chunk", chunk_size=64)
    assert torch.isfinite(o_c).all() and torch.isfinite(s_c).all()
    assert_rel_close(o_c, o_r, 1e-10, "strong decay output")
    q32, k32, v32, b32, g32 = (x.float().requires_grad_(True) for x in (q, k, v, beta, g))
    o32, s32 = gated_delta_rule(q32, k32, v32, beta=b32, g=g32, chunk_size=64)
    (o32.sum() + s32.sum()).backward()
    assert all(torch.isfinite(x.grad).all() for x in (q32, k32, v32, b32, g32))


def test_delta_rule_overwrites_with_beta_one():
    """DeltaNet's defining property: with beta = 1 and a unit key, writing (k, v2) after (k, v1) replaces v1,
    and S^T k retrieves v2 exactly (linear attention would return v1 + v2)."""
    k1 = F.normalize(torch.randn(1, 1, 1, DK, dtype=torch.float64), dim=-1)
    k = k1.expand(1, 2, 1, DK)
    v = torch.randn(1, 2, 1, DV, dtype=torch.float64)
    beta = torch.ones(1, 2, 1, dtype=torch.float64)
    for mode in ("recurrent", "chunk"):
        o, S = delta_rule(k, k, v, beta, scale=1.0, mode=mode)
        assert_rel_close(o[0, 1, 0], v[0, 1, 0], 1e-12, f"{mode}: retrieval after overwrite")
        assert_rel_close(S[0, 0].T @ k1[0, 0, 0], v[0, 1, 0], 1e-12, f"{mode}: S^T k")


def test_gated_with_zero_log_decay_is_delta_rule():
    q, k, v, beta, g, s0 = make(21)
    o1, s1 = gated_delta_rule(q, k, v, beta=beta, g=torch.zeros_like(g), initial_state=s0, chunk_size=8)
    o2, s2 = delta_rule(q, k, v, beta, initial_state=s0, chunk_size=8)
    assert_rel_close(o1, o2, 1e-12, "g = 0")
    assert_rel_close(s1, s2, 1e-12, "g = 0 state")


@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
def test_gradcheck(mode):
    q, k, v, beta, g, s0 = make(4, grad=True)
    small = [x.detach()[:1, :, :1, :2].clone().requires_grad_(True) for x in (q, k, v)]
    b_, g_ = (x.detach()[:1, :, :1].clone().requires_grad_(True) for x in (beta, g))
    s_ = s0.detach()[:1, :1, :2, :2].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda q, k, v, b, s: delta_rule(q, k, v, b, initial_state=s, mode=mode, chunk_size=2),
        (*small, b_, s_),
    )
    assert torch.autograd.gradcheck(
        lambda q, k, v, b, g, s: gated_delta_rule(q, k, v, beta=b, g=g, initial_state=s, mode=mode, chunk_size=2),
        (*small, b_, g_, s_),
    )


def test_low_precision_inputs_computed_in_float32():
    q, k, v, beta, g, _ = make(9)
    qb, kb, vb, bb, gb = (x.bfloat16() for x in (q, k, v, beta, g))
    o, s = gated_delta_rule(qb, kb, vb, beta=bb, g=gb, chunk_size=4)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32


def test_bad_inputs_raise():
    q, k, v, beta, g, s0 = make(6)
    with pytest.raises(ValueError, match="mode"):
        delta_rule(q, k, v, beta, mode="parallel")
    with pytest.raises(ValueError, match="chunk_size"):
        delta_rule(q, k, v, beta, chunk_size=0)
    with pytest.raises(ValueError, match="k"):
        delta_rule(q, k[..., :-1], v, beta)
    with pytest.raises(ValueError, match="v"):
        delta_rule(q, k, v[:, :-1], beta)
    with pytest.raises(ValueError, match="beta"):
        delta_rule(q, k, v, beta[..., None])
    with pytest.raises(ValueError, match="q"):
        delta_rule(q[0], k, v, beta)
    with pytest.raises(ValueError, match="initial_state"):
        delta_rule(q, k, v, beta, initial_state=s0.transpose(-1, -2))
    with pytest.raises(ValueError, match="g"):
        gated_delta_rule(q, k, v, beta=beta, g=g[:, :-1])
    with pytest.raises(ValueError, match="floating"):
        gated_delta_rule(q, k, v, beta=beta, g=g.long())
    with pytest.raises(ValueError, match="scale"):
        delta_rule(q, k, v, beta, scale="big")


@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
def test_gate_zero_erases_memory(mode):
    """Gated DeltaNet's motivation: a_t = exp(g_t) -> 0 clears the memory, leaving S_t = beta_t k_t v_t^T."""
    q, k, v, beta, g, s0 = make(13)
    g = g.clone()
    g[:, 9] = -1e4  # forget everything before token 9
    _, S = gated_delta_rule(q[:, :10], k[:, :10], v[:, :10], beta=beta[:, :10], g=g[:, :10], initial_state=s0,
                            mode=mode, chunk_size=4)
    expect = beta[:, 9, :, None, None] * k[:, 9, :, :, None] * v[:, 9, :, None, :]
    assert_rel_close(S, expect, 1e-12, "state after a full reset")
    o_full, _ = gated_delta_rule(q, k, v, beta=beta, g=g, initial_state=s0, mode=mode, chunk_size=4)
    o_tail, _ = gated_delta_rule(q[:, 9:], k[:, 9:], v[:, 9:], beta=beta[:, 9:], g=g[:, 9:], mode=mode, chunk_size=4)
    assert_rel_close(o_full[:, 9:], o_tail, 1e-12, "outputs after the reset ignore the past")
