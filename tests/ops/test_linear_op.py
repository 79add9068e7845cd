"""linear_attention: chunked == recurrent == masked quadratic form; gradients; chaining; errors."""

from __future__ import annotations

import pytest
import torch
from _core_util import grads, rand, tensor_state

import seqmem.ops as _ops
from conftest import assert_rel_close

B, H, DK, DV = 2, 3, 5, 4

linear_attention = tensor_state(_ops.linear_attention)


def make(t, dtype=torch.float64, seed=0, init=True, grad=False):
    q = rand(B, t, H, DK, dtype=dtype, seed=seed, requires_grad=grad)
    k = rand(B, t, H, DK, dtype=dtype, seed=seed + 1, requires_grad=grad)
    v = rand(B, t, H, DV, dtype=dtype, seed=seed + 2, requires_grad=grad)
    s0 = rand(B, H, DK, DV, dtype=dtype, seed=seed + 5, requires_grad=grad) if init else None
    return q, k, v, s0


def quadratic_ref(q, k, v, s0, scale):
    """o = ((scale q) k^T ⊙ causal) v + (scale q) S_0, the parallel (attention-like) form."""
    t = q.shape[1]
    qs = scale * q.permute(0, 2, 1, 3)
    kh, vh = k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    o = ((qs @ kh.transpose(-1, -2)) * mask) @ vh
    S = kh.transpose(-1, -2) @ vh
    if s0 is not None:
        o = o + qs @ s0
        S = S + s0
    return o.permute(0, 2, 1, 3), S


@pytest.mark.parametrize("t,chunk", [(1, 8), (7, 8), (37, 8), (64, 16), (45, 64)])
@pytest.mark.parametrize("init", [False, True])
def test_chunk_equals_recurrent_and_quadratic_f64(t, chunk, init):
    q, k, v, s0 = make(t, init=init)
    o_r, s_r = linear_attention(q, k, v, initial_state=s0, mode="recurrent")
    o_c, s_c = linear_attention(q, k, v, initial_state=s0, mode="chunk", chunk_size=chunk)
    o_x, s_x = quadratic_ref(q, k, v, s0, DK**-0.5)
    assert o_c.shape == (B, t, H, DV) and s_c.shape == (B, H, DK, DV)
    assert_rel_close(o_c, o_r, 1e-10, "chunk vs recurrent")
    assert_rel_close(s_c, s_r, 1e-10, "chunk vs recurrent state")
    assert_rel_close(o_r, o_x, 1e-10, "recurrent vs quadratic form")
    assert_rel_close(s_r, s_x, 1e-10, "state vs quadratic form")


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_gradients_chunk_equal_recurrent(dtype, tol):
    args = make(29, dtype=dtype, grad=True)

    def f(mode):
        return lambda q, k, v, s0: linear_attention(q, k, v, initial_state=s0, mode=mode, chunk_size=8)

    for a, b, name in zip(grads(f("chunk"), args), grads(f("recurrent"), args), "q k v s0".split()):
        assert_rel_close(a, b, tol, f"grad {name}")


def test_float32_close_to_float64_and_custom_scale():
    q, k, v, s0 = make(50)
    o64, _ = linear_attention(q, k, v, scale=0.7, initial_state=s0, mode="recurrent")
    q32, k32, v32 = q.float(), k.float(), v.float()
    o32, _ = linear_attention(q32, k32, v32, scale=0.7, initial_state=s0.float(), chunk_size=16)
    assert_rel_close(o32, o64, 1e-5, "f32 vs f64")
    ox, _ = quadratic_ref(q, k, v, s0, 0.7)
    assert_rel_close(o64, ox, 1e-10, "scale=0.7")


@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
def test_chained_calls_equal_single_call(mode):
    q, k, v, s0 = make(37)
    o, s = linear_attention(q, k, v, initial_state=s0, mode=mode, chunk_size=8)
    outs, st = [], s0
    for a, b in ((0, 3), (3, 12), (12, 13), (13, 37)):
        oi, st = linear_attention(q[:, a:b], k[:, a:b], v[:, a:b], initial_state=st, mode=mode, chunk_size=8)
        outs.append(oi)
    assert_rel_close(torch.cat(outs, 1), o, 1e-10, "chained outputs")
    assert_rel_close(st, s, 1e-10, "chained state")


def test_normaliser_via_ones_column():
    """Appending a ones column to v yields the normaliser phi(q_t) . sum_{i<=t} phi(k_i) exactly."""
    q, k, v, _ = make(20)
    fq, fk = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    o, _ = linear_attention(fq, fk, torch.cat([v, torch.ones_like(v[..., :1])], -1), scale=1.0, chunk_size=8)
    den = torch.einsum("bthd,bthd->bth", fq, torch.cumsum(fk, 1))
    assert_rel_close(o[..., -1], den, 1e-12, "normaliser")


@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
def test_gradcheck(mode):
    args = [x.detach()[:1, :, :1, :2].clone().requires_grad_(True) for x in make(5)[:3]]
    s0 = make(5)[3].detach()[:1, :1, :2, :2].clone().requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda q, k, v, s: linear_attention(q, k, v, initial_state=s, mode=mode, chunk_size=2), (*args, s0)
    )


def test_bad_inputs_raise():
    q, k, v, s0 = make(6)
    with pytest.raises(ValueError, match="mode"):
        linear_attention(q, k, v, mode="fast")
    with pytest.raises(ValueError, match="chunk_size"):
        linear_attention(q, k, v, chunk_size=-1)
    with pytest.raises(ValueError, match="k"):
        linear_attention(q, k[:, :, :2], v)
    with pytest.raises(ValueError, match="v"):
        linear_attention(q, k, v[:1])
    with pytest.raises(ValueError, match="initial_state"):
        linear_attention(q, k, v, initial_state=s0[:, :, :, :2])
    with pytest.raises(ValueError, match="torch.Tensor"):
        linear_attention(q.numpy(), k, v)


def test_scale_must_be_finite():
    """scale = nan / inf passed (every output NaN, or inf·0 = NaN); the ops that share check_scale refuse it."""
    q, k, v, _ = make(6)
    beta = torch.sigmoid(q[..., 0]).detach()
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValueError, match=rf"linear_attention: scale must be a finite number or None, got {bad!r}"):
            linear_attention(q, k, v, scale=bad)
        with pytest.raises(ValueError, match=r"delta_rule: scale must be a finite number or None"):
            _ops.delta_rule(q, k, v, beta, scale=bad)
    for ok in (None, 0.5, 2):
        linear_attention(q, k, v, scale=ok)
