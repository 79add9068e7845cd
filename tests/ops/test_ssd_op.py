"""ssd (Mamba-2): chunked block decomposition == recurrent == full (T x T) semiseparable matrix; gradients."""

from __future__ import annotations

import pytest
import torch
from _core_util import grads, rand, tensor_state

import seqmem.ops as _ops
from conftest import assert_rel_close

B, H, P, N = 2, 3, 4, 5

ssd = tensor_state(_ops.ssd)


def make(t, dtype=torch.float64, seed=0, init=True, grad=False, a_scale=1.0):
    x = rand(B, t, H, P, dtype=dtype, seed=seed, requires_grad=grad)
    dt = torch.nn.functional.softplus(rand(B, t, H, seed=seed + 1)).to(dtype).requires_grad_(grad)
    A = (-a_scale * torch.exp(rand(H, seed=seed + 2))).to(dtype).requires_grad_(grad)
    Bm = rand(B, t, H, N, dtype=dtype, seed=seed + 3, requires_grad=grad)
    Cm = rand(B, t, H, N, dtype=dtype, seed=seed + 4, requires_grad=grad)
    s0 = rand(B, H, P, N, dtype=dtype, seed=seed + 5, requires_grad=grad) if init else None
    return x, dt, A, Bm, Cm, s0


def semiseparable_ref(x, dt, A, Bm, Cm, s0):
    """y = M (dt x) + C_t . (decay_{0->t} h_0) with M[t, s] = (C_t . B_s) prod_{s<m<=t} exp(dt_m A), built
    entry by entry as an explicit product of per-step decays (no segment sums, no chunks)."""
    b, t, h, p = x.shape
    a = torch.exp(dt * A)  # (b, t, h) per-step decay
    M = torch.zeros(b, h, t, t, dtype=x.dtype)
    from_start = torch.ones(b, h, t, dtype=x.dtype)
    for i in range(t):
        prod = torch.ones(b, h, dtype=x.dtype)
        for s in range(i, -1, -1):
            M[:, :, i, s] = (Cm[:, i] * Bm[:, s]).sum(-1) * prod
            prod = prod * a[:, s]
        from_start[:, :, i] = prod
    xdt = (x * dt[..., None]).permute(0, 2, 1, 3)  # (b, h, t, p)
    y = M @ xdt
    if s0 is not None:
        y = y + torch.einsum("bhtn,bhpn->bhtp", Cm.permute(0, 2, 1, 3), s0) * from_start[..., None]
    return y.permute(0, 2, 1, 3)


@pytest.mark.parametrize("t,chunk", [(1, 8), (7, 8), (37, 8), (64, 16), (45, 64)])
@pytest.mark.parametrize("init", [False, True])
def test_chunk_equals_recurrent_and_semiseparable_f64(t, chunk, init):
    x, dt, A, Bm, Cm, s0 = make(t, init=init)
    y_r, s_r = ssd(x, dt, A, Bm, Cm, initial_state=s0, mode="recurrent")
    y_c, s_c = ssd(x, dt, A, Bm, Cm, initial_state=s0, mode="chunk", chunk_size=chunk)
    y_x = semiseparable_ref(x, dt, A, Bm, Cm, s0)
    assert y_c.shape == (B, t, H, P) and s_c.shape == (B, H, P, N)
    assert_rel_close(y_c, y_r, 1e-10, "chunk vs recurrent")
    assert_rel_close(s_c, s_r, 1e-10, "chunk vs recurrent state")
    assert_rel_close(y_r, y_x, 1e-10, "recurrent vs semiseparable matrix")


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
def test_gradients_chunk_equal_recurrent(dtype, tol):
    args = make(29, dtype=dtype, grad=True)

    def f(mode):
        return lambda x, dt, A, Bm, Cm, s0: ssd(x, dt, A, Bm, Cm, initial_state=s0, mode=mode, chunk_size=8)

    for a, b, name in zip(grads(f("chunk"), args), grads(f("recurrent"), args), "x dt A B C s0".split()):
        assert_rel_close(a, b, tol, f"grad {name}")


def test_float32_close_to_float64():
    x, dt, A, Bm, Cm, s0 = make(50)
    y64, s64 = ssd(x, dt, A, Bm, Cm, initial_state=s0, mode="recurrent")
    y32, s32 = ssd(*(z.float() for z in (x, dt, A, Bm, Cm)), initial_state=s0.float(), chunk_size=16)
    assert_rel_close(y32, y64, 1e-5, "f32 vs f64")
    assert_rel_close(s32, s64, 1e-5, "f32 state vs f64")


@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
def test_chained_calls_equal_single_call(mode):
    x, dt, A, Bm, Cm, s0 = make(37)
    y, s = ssd(x, dt, A, Bm, Cm, initial_state=s0, mode=mode, chunk_size=8)
    outs, st = [], s0
    for a, b in ((0, 3), (3, 12), (12, 13), (13, 37)):
        sl = slice(a, b)
        yi, st = ssd(x[:, sl], dt[:, sl], A, Bm[:, sl], Cm[:, sl], initial_state=st, mode=mode, chunk_size=8)
        outs.append(yi)
    assert_rel_close(torch.cat(outs, 1), y, 1e-10, "chained outputs")
    assert_rel_close(st, s, 1e-10, "chained state")


def test_stable_with_strong_decay():
    x, dt, A, Bm, Cm, s0 = make(100, a_scale=40.0)
    y_r, _ = ssd(x, dt, A, Bm, Cm, initial_state=s0, mode="recurrent")
    y_c, s_c = ssd(x, dt, A, Bm, Cm, initial_state=s0, chunk_size=64)
    assert torch.isfinite(y_c).all() and torch.isfinite(s_c).all()
    assert_rel_close(y_c, y_r, 1e-10, "strong decay")


@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
def test_gradcheck(mode):
    x, dt, A, Bm, Cm, s0 = make(5)
    args = (
        x[:1, :, :1, :2], dt[:1, :, :1], A[:1], Bm[:1, :, :1, :2], Cm[:1, :, :1, :2], s0[:1, :1, :2, :2]
    )
    args = tuple(a.detach().clone().requires_grad_(True) for a in args)
    assert torch.autograd.gradcheck(
        lambda x, dt, A, Bm, Cm, s: ssd(x, dt, A, Bm, Cm, initial_state=s, mode=mode, chunk_size=2), args
    )


def test_bad_inputs_raise():
    x, dt, A, Bm, Cm, s0 = make(6)
    with pytest.raises(ValueError, match="mode"):
        ssd(x, dt, A, Bm, Cm, mode="scan")
    with pytest.raises(ValueError, match="dt"):
        ssd(x, dt[..., None], A, Bm, Cm)
    with pytest.raises(ValueError, match="A"):
        ssd(x, dt, A[:2], Bm, Cm)
    with pytest.raises(ValueError, match="C"):
        ssd(x, dt, A, Bm, Cm[..., :2])
    with pytest.raises(ValueError, match="initial_state"):
        ssd(x, dt, A, Bm, Cm, initial_state=s0.transpose(-1, -2))


@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
def test_a_positive_A_or_negative_dt_is_refused(mode):
    """A < 0 and dt > 0 were documented but unchecked: Mamba's A_log passed for -exp(A_log) gave |y| ~ 1e6 with no
    error.  Each is one reduction now; A = 0 and dt = 0 stay allowed (an underflowed -exp(A_log), a saturated
    softplus), and a NaN propagates."""
    x, dt, A, Bm, Cm, s0 = make(40)
    a_log = torch.log(torch.arange(1, H + 1, dtype=torch.float64))  # Mamba-2's A_log init: log 1 .. log H
    with pytest.raises(ValueError, match=r"ssd: A must be <= 0 \(the log decay rate per head: pass -exp\(A_log\), "
                                         r"not A_log\), got .*1.09861"):
        _ops.ssd(x, dt, a_log, Bm, Cm, mode=mode)
    with pytest.raises(ValueError, match=r"ssd: A must be <= 0 .*got .*inf"):
        _ops.ssd(x, dt, torch.full_like(A, float("inf")), Bm, Cm, mode=mode)
    for bad in (-1e-3, -0.5, -float("inf")):
        d = dt.clone()
        d[1, 7, 2] = bad
        with pytest.raises(ValueError, match=r"ssd: dt must be >= 0 \(a step size"):
            _ops.ssd(x, d, A, Bm, Cm, mode=mode)
    d = dt.clone()
    d[1, 7, 2] = float("nan")  # a NaN propagates (the library's NaN policy: set_check_finite names it)
    assert _ops.ssd(x, d, A, Bm, Cm, mode=mode)[0].isnan().any()
    d = dt.clone()
    d[:, 5:9] = 0.0  # a softplus saturated at 0 (large inputs): those tokens neither decay nor write; allowed
    assert_rel_close(_ops.ssd(x, d, A, Bm, Cm, mode=mode)[0], semiseparable_ref(x, d, A, Bm, Cm, None), 1e-12)
    for zero in (0.0, -0.0):  # no decay in one head (-exp(A_log) underflowed to -0.0): allowed, exact
        a0 = A.clone()
        a0[1] = zero
        assert_rel_close(_ops.ssd(x, dt, a0, Bm, Cm, mode=mode)[0], semiseparable_ref(x, dt, a0, Bm, Cm, None), 1e-12)
    y, _ = _ops.ssd(x, dt, -torch.exp(a_log), Bm, Cm, mode=mode)  # what was meant: a bounded output
    assert y.abs().max() < 1e3
