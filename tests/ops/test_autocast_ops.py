"""Ops under ``torch.autocast`` and with half inputs: linear attention, the (gated) delta rule and the Lattice scan
compute in float32 with autocast off, forward and backward, so

* under autocast (float16 / bfloat16), with the backward outside the region (the standard pattern), outputs and
  gradients are exactly the float32 op's on the same inputs, rounded once to the inputs' dtype;
* with the backward inside the region, gradients are finite and close (PyTorch runs an autograd backward's matmuls
  in the autocast dtype; the Lattice scan's hand-written backward turns autocast off itself, so it stays exact);
* the state is float32.

Before: Lattice's fast scan crashed in a backward outside autocast ("Input dtypes must be the same": its
recompute mixed the float32 state with the autocast-dtype inputs), and linear attention's chunk sums ran in
float16 under autocast and overflowed on long inputs.
"""

from __future__ import annotations

import pytest
import torch

from seqmem.ops import delta_rule, gated_delta_rule, lattice_scan, linear_attention, spectral_koopman_attention, ssd
from seqmem.ops.lattice import _cpp as _lattice_cpp

HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _inputs(op: str, g: torch.Generator, B: int = 2, T: int = 19, H: int = 2, d: int = 6):
    """The op's tensors (float32, rounded to float16 and bfloat16 so the half runs see the same values) and a
    function of them returning ``(y, state tensor)``."""
    def r(*s):
        return torch.randn(*s, generator=g)

    if op == "linear":
        t = [r(B, T, H, d), r(B, T, H, d), r(B, T, H, d)]

        def fn(mode, q, k, v):
            o, st = linear_attention(q, k, v, mode=mode, chunk_size=8)
            return o, st["S"]
    elif op in ("delta", "gated_delta"):
        q, k = (torch.nn.functional.normalize(r(B, T, H, d), dim=-1) for _ in range(2))
        t = [q, k, r(B, T, H, d), torch.sigmoid(r(B, T, H))]
        if op == "gated_delta":
            t.append(-torch.rand(B, T, H, generator=g) * 0.5)

        def fn(mode, q, k, v, beta, g=None):
            if g is None:
                o, st = delta_rule(q, k, v, beta, mode=mode, chunk_size=8)
            else:
                o, st = gated_delta_rule(q, k, v, beta=beta, g=g, mode=mode, chunk_size=8)
            return o, st["S"]
    elif op == "ssd":  # x third: the upstream gradient takes its shape (y's)
        t = [r(B, T, H, d - 2), r(B, T, H, d - 2), r(B, T, H, d), torch.nn.functional.softplus(r(B, T, H)),
             -torch.exp(r(H))]

        def fn(mode, Bm, Cm, x, dt, A):
            y, st = ssd(x, dt, A, Bm, Cm, mode=mode, chunk_size=8)
            return y, st["S"]
    else:  # lattice_<objective>[_forget]
        parts = op.split("_")
        objective, forget = parts[1], parts[-1] == "forget"
        normalize = objective != "delta"
        m = d - 2
        q, k = (torch.nn.functional.normalize(r(B, T, H, m), dim=-1) for _ in range(2))
        t = [q, k, r(B, T, H, d), torch.sigmoid(r(B, T, H))]
        S0 = torch.linalg.qr(r(B, H, d, m))[0]
        if forget:
            t.append(torch.sigmoid(r(B, T, H) + 2))

        def fn(mode, q, k, v, gamma, mu=None, backend="auto"):
            y, st = lattice_scan(q, k, v, gamma, {"S": S0}, objective=objective, normalize=normalize, forget=mu,
                                 mode="recurrent" if mode == "recurrent" else "scan", chunk_size=8, backend=backend)
            return y, st["S"]
    for dt in HALF.values():  # every input exactly representable in both half dtypes
        t = [x.to(dt).float() for x in t]
    return t, fn


OPS = ["linear", "delta", "gated_delta", "ssd", "lattice_dec", "lattice_enc", "lattice_sim", "lattice_dec_forget",
       "lattice_delta_forget"]


def _run(fn, tensors, mode, dt, ctx, backward_inside, **kw):
    xs = [x.detach().to(dt).clone().requires_grad_() for x in tensors]
    up = torch.randn(xs[2].shape, generator=torch.Generator().manual_seed(5))
    up = up.to(torch.bfloat16).to(torch.float16).float()  # the upstream gradient exact in both half dtypes
    with ctx():
        y, S = fn(mode, *xs, **kw)
        if backward_inside:
            (y.float() * up).sum().backward()
    if not backward_inside:
        (y.float() * up).sum().backward()
    return y, S, [x.grad for x in xs]


@pytest.mark.parametrize("mode", ["fast", "recurrent"])
@pytest.mark.parametrize("prec", ["fp16", "bf16"])
@pytest.mark.parametrize("op", OPS)
def test_autocast_computes_in_float32(op, prec, mode):
    import contextlib

    dt = HALF[prec]
    tensors, fn = _inputs(op, torch.Generator().manual_seed(0))
    backends = ["torch", "cpp"] if op.startswith("lattice") and mode == "fast" and _lattice_cpp.available() \
        else [None]
    fmode = "chunk" if mode == "fast" else "recurrent"
    for backend in backends:
        kw = {} if backend is None else {"backend": backend}
        y32, S32, g32 = _run(fn, tensors, fmode, torch.float32, contextlib.nullcontext, True, **kw)
        for inside in (False, True):
            where = f"{op} {prec} {mode} {backend} backward {'inside' if inside else 'outside'}"
            y, S, grads = _run(fn, tensors, fmode, dt, lambda: torch.autocast("cpu", dtype=dt), inside, **kw)
            assert y.dtype == dt and S.dtype == torch.float32, where
            assert torch.equal(y, y32.to(dt)) and torch.equal(S, S32), where  # the float32 computation, rounded
            for a, b in zip(grads, g32):
                assert a.dtype == dt and torch.isfinite(a).all(), where
                if not inside or (op.startswith("lattice") and mode == "fast"):  # a hand-written backward
                    assert torch.equal(a, b.to(dt)), where
                else:  # the autograd backward's matmuls ran in the autocast dtype
                    err = float((a.double() - b.double()).norm() / b.double().norm())
                    assert err < (3e-2 if prec == "bf16" else 4e-3), f"{where}: {err:.1e}"


def test_linear_attention_sums_do_not_overflow_under_float16_autocast():
    """Positive keys and values: each chunk adds ~576 to every state entry, the state passes float16's 65,504
    after ~7,300 tokens.  Under float16 autocast the op's chunk products and their prefix sums ran in float16 and
    overflowed (a 64k-token linear-attention layer gave NaN/Inf from token ~40,575); they are float32 now."""
    g = torch.Generator().manual_seed(0)
    T, d = 8192, 8
    k = 2 + 2 * torch.rand(1, T, 1, d, generator=g)
    v = 2 + 2 * torch.rand(1, T, 1, d, generator=g)
    q = 1e-3 * torch.rand(1, T, 1, d, generator=g)
    o32, s32 = linear_attention(q, k, v, chunk_size=64)
    assert s32["S"].abs().max() > 7e4  # the state is out of float16's range
    with torch.autocast("cpu", dtype=torch.float16):
        o, s = linear_attention(q.half(), k.half(), v, chunk_size=64)  # v float32, as the mixer passes it
    assert torch.isfinite(o).all() and torch.isfinite(s["S"]).all()
    o_ref, _ = linear_attention(q.half().float(), k.half().float(), v, chunk_size=64)
    assert torch.equal(o, o_ref)


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
def test_ssd_under_bfloat16_autocast_keeps_float32_accuracy(mode):
    """float32 inputs under bfloat16 autocast: ssd ran its chunk maths (the segment-sum decays, the block matmuls)
    in bfloat16, a relative error of ~4e-3 to 4e-2 against float64 where the other ops stay at float32's ~1e-7;
    it turns autocast off now, as they do."""
    g = torch.Generator().manual_seed(1)
    B, T, H, P, N = 2, 50, 3, 8, 6
    x, Bm, Cm = torch.randn(B, T, H, P, generator=g), torch.randn(B, T, H, N, generator=g), \
        torch.randn(B, T, H, N, generator=g)
    dt, A = torch.nn.functional.softplus(torch.randn(B, T, H, generator=g)), -torch.exp(torch.randn(H, generator=g))
    y64, s64 = ssd(*(z.double() for z in (x, dt, A, Bm, Cm)), mode="recurrent")
    s64 = s64["S"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, st = ssd(x, dt, A, Bm, Cm, mode=mode, chunk_size=16)
    assert y.dtype == torch.float32 and st["S"].dtype == torch.float32
    for got, ref, what in ((y, y64, "y"), (st["S"], s64, "S")):
        err = float((got.double() - ref).norm() / ref.norm())
        assert err < 1e-5, f"{mode} {what}: {err:.1e}"


def _low_rank_qkv(B: int = 2, T: int = 96, H: int = 2, r: int = 8, P: int = 6):
    """SKA's q, k, v from 4 distinct token vectors repeated (a topic / MQAR-like stream): the keys span few
    directions, so the ridge solve G̃⁻¹ is ill-conditioned and amplifies any rounding in the statistics."""
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 4, (B, T), generator=g)
    q, k = (torch.randn(4, H, r, generator=g)[tokens] for _ in range(2))
    v = torch.randn(4, H, P, generator=g)[tokens]
    return q, k, v


@pytest.mark.parametrize("form", ["chunk", "recurrent", "sequence"])
def test_ska_under_bfloat16_autocast_keeps_float32_accuracy(form):
    """float32 inputs under bfloat16 autocast, keys spanning 4 directions: the op's statistics, Cholesky solves and
    power iterations ran their einsums and matmuls in bfloat16 and the ill-conditioned ridge solve amplified the
    rounding (outputs ~1e3 times the float64 ones, no error raised).  The op now turns autocast off: the output and
    the gradients (backward outside the region) are exactly float32's, and close to float64."""
    from seqmem.ops.ska.chunk import ska_sequence_operator

    kw = dict(power=2, gamma=1.0, eta=1.0, spec_iters=6, operator_form="whitened")

    def fn(q, k, v):
        if form == "sequence":
            return ska_sequence_operator(q, k, v, None, 1e-3, "prefix_max", kw)[0]
        return spectral_koopman_attention(q, k, v, chunk_size=32, mode=form)[0]

    base = _low_rank_qkv()
    up = torch.randn(base[2].shape, generator=torch.Generator().manual_seed(4))
    runs = {}
    for tag in ("f64", "f32", "bf16"):
        xs = [x.double() if tag == "f64" else x.clone() for x in base]
        xs = [x.requires_grad_() for x in xs]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=tag == "bf16"):
            o = fn(*xs)
        (o * up.to(o.dtype)).sum().backward()
        runs[tag] = (o.detach(), [x.grad for x in xs])
    o, grads = runs["bf16"]
    assert o.dtype == torch.float32
    assert torch.equal(o, runs["f32"][0]), form
    assert all(torch.equal(a, b) for a, b in zip(grads, runs["f32"][1])), form
    o64, g64 = runs["f64"]
    for got, ref, what in ((o, o64, "o"), *zip(grads, g64, ("dq", "dk", "dv"))):
        err = float((got.double() - ref).norm() / ref.norm())
        assert err < 1e-2, f"{form} {what}: {err:.1e}"  # float32 itself: up to ~1e-3 on these keys
