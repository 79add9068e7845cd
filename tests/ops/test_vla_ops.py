"""VLA ops: the exact chunked form equals the literal Algorithm 1 loop (outputs, states, gradients), for
every chunk size and every alignment of the periodic refresh; streaming; the generalised-delta chunk kernel;
bad input."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_rel_close
from seqmem.ops.vla import vla_attention, vla_generalized_delta_chunk, vla_paper_delta_rule

TOL = {torch.float64: 1e-10, torch.float32: 2e-5}
B, T, H, D = 2, 45, 2, 6


def _inputs(dtype, seed=0, t=T, dv=D):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, t, H, D, generator=g, dtype=dtype) for _ in range(2))
    v = torch.randn(B, t, H, dv, generator=g, dtype=dtype)
    w_u = torch.randn(H, D, D, generator=g, dtype=dtype) / D**0.5
    return [x.requires_grad_(True) for x in (q, k, v, w_u)]


def _run(mode, q, k, v, w_u, chunk_size=20, initial_state=None, **kw):
    o, st = vla_attention(q, k, v, w_u, mode=mode, chunk_size=chunk_size, initial_state=initial_state, **kw)
    wt = torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)
    loss = (o * wt).sum() + st["S"].sum() + (st["A"].sum() if "A" in st else 0)
    grads = torch.autograd.grad(loss, [q, k, v, w_u], allow_unused=True)
    return o, st, grads


def _compare(a, b, tol, what):
    (o1, s1, g1), (o2, s2, g2) = a, b
    assert_rel_close(o2, o1, tol, f"{what}: output")
    assert set(s1) == set(s2)
    for key in s1:
        if key == "pos":
            assert torch.equal(s1[key], s2[key])
        else:
            assert_rel_close(s2[key], s1[key], tol, f"{what}: state {key}")
    for name, x, y in zip("qkvw", g1, g2):
        assert (x is None) == (y is None)
        if x is not None:
            assert_rel_close(y, x, 10 * tol, f"{what}: grad {name}")


def _prefix_state(dtype, pos, **kw):
    """A realistic state after `pos` tokens (per batch element positions may differ)."""
    sts = []
    for b, p in enumerate(pos):
        q, k, v, w_u = (x.detach() for x in _inputs(dtype, seed=10 + b, t=max(p, 1)))
        _, st = vla_attention(q[:1, :p], k[:1, :p], v[:1, :p], w_u, mode="recurrent", **kw) if p else (
            None, None)
        sts.append(st)
    if all(s is None for s in sts):
        return None
    return {key: torch.cat([s[key] for s in sts], 0) for key in sts[0]}


F64, F32 = torch.float64, torch.float32


@pytest.mark.parametrize(
    "dtype,chunk_size",
    [(F64, 1), (F64, 3), (F64, 7), (F64, 20), (F64, 64), (F32, 7), (F32, 64)],
    ids=["f64-C1", "f64-C3", "f64-C7", "f64-C20", "f64-C64", "f32-C7", "f32-C64"],
)
def test_chunk_equals_recurrent(dtype, chunk_size):
    q, k, v, w_u = _inputs(dtype)
    ref = _run("recurrent", q, k, v, w_u)
    fast = _run("chunk", q, k, v, w_u, chunk_size=chunk_size)
    _compare(ref, fast, TOL[dtype], f"C={chunk_size}")
    # the refresh actually fired (positions 20 and 40): turning it off changes the output
    o_off, _ = vla_attention(q, k, v, w_u, mode="chunk", chunk_size=chunk_size, refresh_period=None)
    assert (o_off - ref[0]).abs().max() > 1e-7


@pytest.mark.parametrize("pos", [(7, 7), (19, 19), (13, 2)], ids=["off7", "off19", "per-batch"])
@pytest.mark.parametrize("chunk_size", [4, 5, 16])
def test_refresh_alignment_from_state(pos, chunk_size):
    """Continuing from a state at position p: refreshes land at multiples of the period from the start."""
    dtype = torch.float64
    kw = {"refresh_period": 6, "refresh_eta": 0.05}
    st0 = _prefix_state(dtype, pos, **kw)
    q, k, v, w_u = _inputs(dtype, seed=1, t=23)
    ref = _run("recurrent", q, k, v, w_u, initial_state=st0, **kw)
    fast = _run("chunk", q, k, v, w_u, chunk_size=chunk_size, initial_state=st0, **kw)
    _compare(ref, fast, TOL[dtype], f"pos={pos} C={chunk_size}")
    assert torch.equal(fast[1]["pos"], torch.tensor(pos) + 23)


@pytest.mark.parametrize(
    "kw,dtype",
    [
        ({"refresh_period": None}, F64),
        ({"normalize_alpha": False, "lam0": 1.0}, F64),
        ({"fixed_A": True}, F64),
        ({"normalizer": "none"}, F64),
        ({"u_scale": 1.0, "refresh_period": 3, "refresh_eta": 0.1}, F64),
        ({"normalize_key": False, "lam0": 1.0}, F64),
        ({"normalize_alpha": False, "lam0": 1.0}, F32),
        ({"u_scale": 1.0, "refresh_period": 3, "refresh_eta": 0.1}, F32),
    ],
    ids=["no-refresh", "v2", "fixedA", "no-norm", "unit-u", "no-khat", "v2-f32", "unit-u-f32"],
)
def test_variants_chunk_equals_recurrent(kw, dtype):
    q, k, v, w_u = _inputs(dtype, seed=2, t=30)
    for c in (4, 16):
        _compare(_run("recurrent", q, k, v, w_u, **kw), _run("chunk", q, k, v, w_u, chunk_size=c, **kw),
                 TOL[dtype] * (10 if "normalize_key" in kw else 1), f"{kw} C={c}")


def test_streaming_splits_equal_full():
    dtype = torch.float64
    q, k, v, w_u = (x.detach() for x in _inputs(dtype, t=41))
    for mode in ("recurrent", "chunk"):
        o, st = vla_attention(q, k, v, w_u, mode=mode, chunk_size=8)
        for sizes in ([1, 40], [19, 1, 21], [20, 21], [3] * 13 + [2]):
            outs, s, i = [], None, 0
            for n in sizes:
                oi, s = vla_attention(q[:, i : i + n], k[:, i : i + n], v[:, i : i + n], w_u, mode=mode,
                                      chunk_size=8, initial_state=s)
                outs.append(oi)
                i += n
            assert_rel_close(torch.cat(outs, 1), o, 1e-12, f"{mode} split {sizes}")
            for key in ("S", "A", "z"):
                assert_rel_close(s[key], st[key], 1e-12, f"{mode} split {sizes} state {key}")


def test_per_batch_positions_equal_separate_runs():
    """A batch whose elements sit at different positions equals running each element alone."""
    dtype = torch.float64
    st0 = _prefix_state(dtype, (13, 2), refresh_period=5, refresh_eta=0.1)
    q, k, v, w_u = (x.detach() for x in _inputs(dtype, seed=4, t=17))
    o, _ = vla_attention(q, k, v, w_u, mode="chunk", chunk_size=6, initial_state=st0, refresh_period=5,
                         refresh_eta=0.1)
    for b in range(2):
        sb = {key: val[b : b + 1] for key, val in st0.items()}
        ob, _ = vla_attention(q[b : b + 1], k[b : b + 1], v[b : b + 1], w_u, mode="chunk", chunk_size=6,
                              initial_state=sb, refresh_period=5, refresh_eta=0.1)
        assert_rel_close(ob, o[b : b + 1], 1e-12, f"batch {b}")


def test_value_dim_may_differ():
    q, k, v, w_u = _inputs(torch.float64, t=12, dv=3)
    o1, s1 = vla_attention(q, k, v, w_u, mode="recurrent")
    o2, s2 = vla_attention(q, k, v, w_u, mode="chunk", chunk_size=5)
    assert o1.shape == (B, 12, H, 3) and s1["S"].shape == (B, H, 3, D)
    assert_rel_close(o2, o1, 1e-12)


@pytest.mark.parametrize("with_decay", [False, True])
def test_generalized_delta_chunk_matches_loop(with_decay):
    """The chunk kernel of S_t = S_{t-1}(g_t I − a_t b_tᵀ) + v_t b_tᵀ, o_t = S_t q_t against a plain loop."""
    g = torch.Generator().manual_seed(7)
    c, d, dv = 9, 5, 4
    q, a, b = (torch.randn(3, c, d, generator=g, dtype=torch.float64) for _ in range(3))
    a, b = a / a.norm(dim=-1, keepdim=True), b / b.norm(dim=-1, keepdim=True)
    v = torch.randn(3, c, dv, generator=g, dtype=torch.float64)
    S0 = torch.randn(3, dv, d, generator=g, dtype=torch.float64)
    log_g = torch.log(torch.rand(3, c, generator=g, dtype=torch.float64) * 0.5 + 0.4) if with_decay else None
    S, outs = S0.clone(), []
    eye = torch.eye(d, dtype=torch.float64)
    for t in range(c):
        gt = log_g[:, t].exp()[:, None, None] if with_decay else 1.0
        S = S @ (gt * eye - a[:, t, :, None] * b[:, t, None, :]) + v[:, t, :, None] * b[:, t, None, :]
        outs.append(S @ q[:, t, :, None])
    o, S_end = vla_generalized_delta_chunk(q, a, b, v, S0, log_g)
    assert_rel_close(o, torch.cat(outs, -1).transpose(1, 2), 1e-12)
    assert_rel_close(S_end, S, 1e-12)


@pytest.mark.parametrize(
    "dtype,chunk_size", [(F64, 1), (F64, 5), (F64, 64), (F32, 16)], ids=["f64-C1", "f64-C5", "f64-C64", "f32-C16"]
)
def test_paper_delta_rule_chunk_equals_recurrent(dtype, chunk_size):
    q, k, v, _ = _inputs(dtype, seed=5)
    beta = torch.sigmoid(torch.randn(B, T, H, dtype=dtype, generator=torch.Generator().manual_seed(6)))
    beta.requires_grad_(True)
    res = []
    for mode in ("recurrent", "chunk"):
        o, st = vla_paper_delta_rule(q, k, v, beta, mode=mode, chunk_size=chunk_size)
        grads = torch.autograd.grad((o * o.detach().sign()).sum() + st["S"].sum(), [q, k, v, beta])
        res.append((o, st, grads))
    (o1, s1, g1), (o2, s2, g2) = res
    assert_rel_close(o2, o1, TOL[dtype])
    assert_rel_close(s2["S"], s1["S"], TOL[dtype])
    for x, y in zip(g1, g2):
        assert_rel_close(y, x, 10 * TOL[dtype])


def test_paper_delta_rule_is_eq4():
    """One step of the op equals eq. (4): S_1 = β S_0 + (v − S_0 k̂) k̂ᵀ."""
    q, k, v, _ = (x.detach() for x in _inputs(torch.float64, t=1))
    S0 = torch.randn(B, H, D, D, dtype=torch.float64)
    beta = torch.full((B, 1, H), 0.3, dtype=torch.float64)
    _, st = vla_paper_delta_rule(q, k, v, beta, initial_state={"S": S0}, normalizer="none", mode="chunk")
    kf = torch.nn.functional.elu(k[:, 0]) + 1
    kh = kf / kf.norm(dim=-1, keepdim=True)
    e = v[:, 0] - torch.einsum("bhij,bhj->bhi", S0, kh)
    assert_rel_close(st["S"], 0.3 * S0 + e[..., :, None] * kh[..., None, :], 1e-13)


def test_bad_input_raises():
    q, k, v, w_u = (x.detach() for x in _inputs(torch.float64, t=5))
    with pytest.raises(ValueError, match="mode"):
        vla_attention(q, k, v, w_u, mode="parallel")
    with pytest.raises(ValueError, match="chunk_size"):
        vla_attention(q, k, v, w_u, chunk_size=0)
    with pytest.raises(ValueError, match="w_u"):
        vla_attention(q, k, v, w_u[:, :3])
    with pytest.raises(ValueError, match="same shape"):
        vla_attention(q[..., :3], k, v, w_u)
    with pytest.raises(ValueError, match="lam0"):
        vla_attention(q, k, v, w_u, lam0=0.0)
    with pytest.raises(ValueError, match="normalizer"):
        vla_attention(q, k, v, w_u, normalizer="softmax")
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="vla_attention: u_scale must be a finite number > 0"):
            vla_attention(q, k, v, w_u, u_scale=bad)
    for bad in (-1e-3, float("inf")):  # η < 0 could leave A indefinite
        with pytest.raises(ValueError, match="vla_attention: refresh_eta must be a finite number >= 0"):
            vla_attention(q, k, v, w_u, refresh_eta=bad)
    with pytest.raises(ValueError, match="initial_state"):
        vla_attention(q, k, v, w_u, initial_state={"S": torch.zeros(B, H, D, D)})
    with pytest.raises(ValueError, match="return_trace"):
        vla_attention(q, k, v, w_u, mode="chunk", return_trace=True)
    with pytest.raises(ValueError, match="tensor"):
        vla_attention(q[0], k[0], v[0], w_u)
    with pytest.raises(ValueError, match="beta"):
        vla_paper_delta_rule(q, k, v, torch.rand(B, 5))


@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
def test_paper_delta_rule_refuses_a_beta_outside_0_1(mode):
    """β is eq. 4's decay, in [0, 1]: the chunked form read a negative β through log(max(β, tiny)) while the recurrent
    one took it as given, so the two modes silently disagreed; both refuse it now, and β > 1 with it.  A NaN
    propagates (the library's NaN policy: set_check_finite names it)."""
    q, k, v, _ = (x.detach() for x in _inputs(torch.float64, t=5))
    beta = torch.full((B, 5, H), 0.5, dtype=torch.float64)
    for bad, got in ((-0.3, r"values in \[-0.3, 0.5\]"), (1.5, r"values in \[0.5, 1.5\]"),
                     (-float("inf"), r"values in \[0.5, 0.5\] and inf")):
        b = beta.clone()
        b[1, 3, 0] = bad
        with pytest.raises(ValueError, match=rf"vla_paper_delta_rule: beta must be in \[0, 1\] \(eq. 4: a per-step "
                                             rf"decay\), got .*{got}"):
            vla_paper_delta_rule(q, k, v, b, mode=mode)
    with pytest.raises(ValueError, match="vla_paper_delta_rule: beta must be a floating-point tensor, got dtype "
                                         "torch.int64"):
        vla_paper_delta_rule(q, k, v, torch.ones(B, 5, H, dtype=torch.long), mode=mode)
    b = beta.clone()
    b[1, 3, 0] = float("nan")
    assert vla_paper_delta_rule(q, k, v, b, mode=mode)[0].isnan().any()  # NaN: propagated, not refused


def test_paper_delta_rule_beta_0_and_1_agree_across_modes():
    """The ends of the range are allowed: β = 1 keeps the state, β = 0 (a sigmoid saturated at 0, as at large
    inputs) forgets it; the chunked form, which reads log max(β, tiny), equals the recurrent one there."""
    q, k, v, _ = (x.detach() for x in _inputs(torch.float64, t=9))
    beta = torch.rand(B, 9, H, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    beta[:, 3] = 0.0
    beta[0, 5, 1] = 0.0
    beta[:, 7] = 1.0
    (o1, s1), (o2, s2) = (vla_paper_delta_rule(q, k, v, beta, mode=m, chunk_size=4) for m in ("recurrent", "chunk"))
    assert_rel_close(o2, o1, 1e-12)
    assert_rel_close(s2["S"], s1["S"], 1e-12)


@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
def test_paper_delta_rule_checks_the_state_shapes(mode):
    """A batch-1 state with a batch-2 input broadcast silently in the recurrent mode; each key's shape and dtype is
    checked now, as vla_attention's are."""
    q, k, v, _ = (x.detach() for x in _inputs(torch.float64, t=5))
    beta = torch.full((B, 5, H), 0.5, dtype=torch.float64)
    _, st = vla_paper_delta_rule(q, k, v, beta, mode=mode)
    with pytest.raises(ValueError, match=r"vla_paper_delta_rule: initial_state\['S'\] must have shape \(batch, heads, "
                                         rf"d_v, d\) = \({B}, {H}, {D}, {D}\), got \(1, {H}, {D}, {D}\)"):
        vla_paper_delta_rule(q, k, v, beta, mode=mode, initial_state={"S": st["S"][:1], "z": st["z"]})
    with pytest.raises(ValueError, match=r"vla_paper_delta_rule: initial_state\['z'\] must have shape \(batch, heads, "
                                         rf"d\) = \({B}, {H}, {D}\), got \({B}, {H}, 1\)"):
        vla_paper_delta_rule(q, k, v, beta, mode=mode, initial_state={"S": st["S"], "z": st["z"][..., :1]})
    with pytest.raises(ValueError, match=r"initial_state\['S'\] must be a floating-point tensor"):
        vla_paper_delta_rule(q, k, v, beta, mode=mode, initial_state={"S": st["S"].long(), "z": st["z"]})
    with pytest.raises(ValueError, match=r"vla_paper_delta_rule: initial_state must be a dict with keys \['S', 'z'\], "
                                         r"got \['S'\]"):
        vla_paper_delta_rule(q, k, v, beta, mode=mode, initial_state={"S": st["S"]})


def test_vla_attention_checks_the_state_dtypes_and_finite_scalars():
    q, k, v, w_u = (x.detach() for x in _inputs(torch.float64, t=5))
    _, st = vla_attention(q, k, v, w_u)
    with pytest.raises(ValueError, match=r"vla_attention: initial_state\['A'\] must have shape \(batch, heads, d, d\) "
                                         rf"= \({B}, {H}, {D}, {D}\), got \(1, {H}, {D}, {D}\)"):
        vla_attention(q, k, v, w_u, initial_state={**st, "A": st["A"][:1]})
    with pytest.raises(ValueError, match=r"vla_attention: initial_state\['pos'\] must be an integer tensor"):
        vla_attention(q, k, v, w_u, initial_state={**st, "pos": st["pos"].double()})
    for bad in (float("inf"), float("nan"), 0.0, -1e-4):
        with pytest.raises(ValueError, match=rf"vla_attention: eps must be a finite number > 0, got {bad!r}"):
            vla_attention(q, k, v, w_u, eps=bad)
        with pytest.raises(ValueError, match=rf"vla_paper_delta_rule: eps must be a finite number > 0, got {bad!r}"):
            vla_paper_delta_rule(q, k, v, torch.full((B, 5, H), 0.5, dtype=torch.float64), eps=bad)
    with pytest.raises(ValueError, match=r"vla_attention: lam0 must be a finite number > 0, got inf"):
        vla_attention(q, k, v, w_u, lam0=float("inf"))  # A_0 = I/inf = 0: every write silently zero
