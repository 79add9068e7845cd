"""The VORT mixer family beyond the contract: kernels, α modes, routing gradients, baselines, options."""

from __future__ import annotations

import pytest
import torch

from seqmem import build_mixer
from seqmem.mixers.vort import fit_exp_mixture
from seqmem.ops import gl_weights, soe_kernel

D, H = 16, 2


def mk(name="vort", seed=0, **kw):
    torch.manual_seed(seed)
    return build_mixer(name, D, n_heads=H, **kw).double()


def x_in(t=50, b=2, seed=1):
    return torch.randn(b, t, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_registered_defaults():
    assert mk("vort").alpha_mode == "continuous" and mk("vort").kernel == "soe"
    m = mk("vort_fixed_alpha")
    assert m.alpha_mode == "fixed" and m.alpha == 0.7 and m.local_window == 0
    assert mk("exp_decay").kernel == "exp"
    m = mk("exp_mixture")
    assert m.kernel == "mixture" and m.n_channels() == 5


def test_soe_vs_exact_gl_kernel_close():
    """Ablation claim: the exact fractional convolution and SOE (S = 15) give nearly the same output."""
    x = x_in(t=120)
    outs = {}
    for kern in ("soe", "gl"):
        m = mk("vort_fixed_alpha", kernel=kern, feature_map="elu", n_soe=15, horizon=1000)
        outs[kern] = m(x)[0]
    rel = (outs["soe"] - outs["gl"]).abs().max() / outs["gl"].abs().max()
    assert rel < 5e-3
    m = mk("vort_fixed_alpha", kernel="soe", feature_map="elu", n_soe=1, horizon=1000)
    assert (m(x)[0] - outs["gl"]).abs().max() / outs["gl"].abs().max() > 5 * rel  # S = 1 is not enough


def test_exact_feature_map_is_eq13_softmax_with_kernel():
    x = x_in(t=30)
    m = mk("vort_fixed_alpha", kernel="gl", feature_map="exact", eps0=0.0)
    y, _ = m(x)
    q, k, v = m.qkv(x).view(2, 30, 3, H, D // H).unbind(2)
    t = 29
    lags = torch.arange(t, -1, -1)
    w = gl_weights(0.7, lags)
    s = torch.einsum("bhd,bihd->bhi", q[:, t], k[:, : t + 1]) / (D // H) ** 0.5
    a = s.exp() * w
    o = torch.einsum("bhi,bihd->bhd", a / a.sum(-1, keepdim=True), v[:, : t + 1])
    torch.testing.assert_close(y[:, t], m.out(o.reshape(2, D)))


def test_alpha_modes_and_routing_gradients():
    x = x_in()
    m = mk("vort", alpha_mode="banked", n_banks=4, min_alpha=0.2)
    y, _ = m(x)
    banks = m.bank_orders()
    a = m.last_alpha
    assert torch.isclose(a[..., None], banks.double(), atol=1e-12).any(-1).all()  # every α on the grid
    y.square().sum().backward()
    assert m.alpha_x.weight.grad.abs().max() > 0 and m.alpha_h.grad.abs() > 0  # straight-through
    m = mk("vort")
    y, _ = m(x)
    assert ((m.last_alpha > 0.1) & (m.last_alpha < 1)).all()
    y.square().sum().backward()
    assert m.alpha_x.bias.grad.abs() > 0 and m.entity_probe.weight.grad.abs().max() > 0
    # entity flags given as input raise α (w_e = +2 at init)
    m = mk("vort", entity="input")
    with pytest.raises(ValueError, match="entity_flags"):  # was: e = 0 without a word
        m(x)
    with m.entity_flags(torch.zeros(2, 50, dtype=torch.float64)):
        m(x)
    a0 = m.last_alpha.clone()
    with m.entity_flags(torch.ones(2, 50, dtype=torch.float64)):
        m(x)
    assert (m.last_alpha > a0).all()
    with pytest.raises(ValueError), m.entity_flags(torch.ones(3, 5)):
        m(x)


def test_alpha_one_fixed_is_running_sum():
    x = x_in()
    m = mk("vort_fixed_alpha", alpha=1.0, feature_map="elu")
    y, _ = m(x)
    m2 = mk("exp_decay", feature_map="elu", decay_rate=1e-12)  # e^{-1e-12 j} ≈ 1: plain running sum
    m2.load_state_dict(m.state_dict(), strict=False)
    torch.testing.assert_close(y, m2(x)[0], rtol=1e-8, atol=1e-10)


def test_mixture_baseline():
    rates, pi = fit_exp_mixture(0.7, 5, 1000)
    j = torch.arange(1001, dtype=torch.float64)
    fit = (torch.tensor(pi)[None] * torch.exp(-torch.tensor(rates)[None] * j[:, None])).sum(1)
    rel = ((fit - gl_weights(0.7, j)) / gl_weights(0.7, j)).abs().max()
    assert rel < 0.02  # 5 exponentials fit the α = 0.7 kernel to ~1% on j ≤ 1000 (1.8 % measured at T = 1000)
    m = mk("exp_mixture")
    y, _ = m(x_in())
    y.square().sum().backward()
    assert m.mix_log_rate.grad.abs().max() > 0 and m.mix_weight_raw.grad.abs().max() > 0


def test_state_is_constant_size_for_soe():
    m = mk("vort", local_window=8, n_soe=10, n_features=16)
    s1 = m.state_size(100)
    assert s1 == m.state_size(10_000)
    assert s1 == 1 + H * 11 * 16 * (D // H + 1) + 2 * H * (D // H) * 7 + H  # + H: FAVOR+'s running key scale m
    m = mk("vort_fixed_alpha", kernel="gl")
    assert m.state_size(200) > m.state_size(100)  # the exact kernel needs the whole history


@pytest.mark.parametrize(
    "kw",
    [
        {"kernel": "nope"},
        {"alpha_mode": "soft"},
        {"feature_map": "relu"},
        {"min_alpha": 0.0},
        {"alpha": 1.5},
        {"n_soe": 0},
        {"horizon": 1},
        {"local_window": -1},
        {"normalizer": "none"},
        {"soe_eps": 2.0},
        {"construction": "paper"},
        {"kernel": "exp", "alpha_mode": "continuous"},
    ],
)
def test_bad_options(kw):
    with pytest.raises(ValueError):
        build_mixer("vort", D, n_heads=H, **kw)


def test_soe_kernel_used_by_mixer_matches_ops():
    """The mixer's SOE channels reproduce soe_kernel: a one-token value read out at lag j sees ŵ_j / ŵ_0."""
    m = mk("vort_fixed_alpha", feature_map="elu", n_soe=15, horizon=1000, eps0=0.0, normalizer="plain")
    c, xi, cn = m._channels(torch.full((1, 1), 0.7, dtype=torch.float64), torch.float64)
    j = torch.arange(0, 500, 37, dtype=torch.float64)
    w = (c[0, 0] * torch.exp(-xi * j[:, None])).sum(-1) + cn[0, 0] * (j == 0)
    torch.testing.assert_close(w, soe_kernel(0.7, j, 15, 1000))


def test_plasticity_aux_loss_and_test_time_refinement():
    g = torch.Generator().manual_seed(7)
    t = 40
    x = torch.randn(2, t, D, generator=g, dtype=torch.float64)
    src = torch.full((2, t), -1)
    src[:, 30:] = torch.arange(30, t) - 25  # sources at lag 25
    m = mk("vort", local_window=8, n_soe=12, horizon=64)
    loss = m.retrieval_loss(x, src)
    loss.backward()
    for p in (m.alpha_x.weight, m.alpha_x.bias, m.alpha_h, m.alpha_e):
        assert p.grad is not None and p.grad.abs().max() > 0  # gradient reaches the α routing
    # a few SGD steps on the routing parameters only lower L_ret
    opt = torch.optim.SGD([m.alpha_x.weight, m.alpha_x.bias, m.alpha_h, m.alpha_e], lr=0.5)
    l0 = float(m.retrieval_loss(x, src).detach())
    for _ in range(10):
        opt.zero_grad()
        m.retrieval_loss(x, src).backward()
        opt.step()
    assert float(m.retrieval_loss(x, src).detach()) < l0
    # test-time projected GD on α, then a forward pass with the refined α
    a, hist = m.refine_alpha(x, src, lr=1.0, steps=8)
    assert hist[-1] < hist[0] and ((a >= m.min_alpha) & (a <= 1)).all()
    with m.alpha_override(a):
        y, _ = m(x)
        assert torch.equal(m.last_alpha, a)
    assert torch.isfinite(y).all()
    with pytest.raises(ValueError), m.alpha_override(torch.zeros(2, t, dtype=torch.float64)):
        m(x)
    with pytest.raises(ValueError):
        mk("exp_decay").retrieval_loss(x, src)


@pytest.mark.parametrize("name, kw", [
    ("vort_fixed_alpha", {"n_soe": 15, "horizon": 500, "n_features": 8}),
    ("exp_mixture", {"n_exp": 5, "horizon": 500, "n_features": 8}),
    ("exp_decay", {"decay_rate": 0.02, "n_features": 8}),
    ("vort", {"n_soe": 6, "horizon": 64, "n_features": 8, "local_window": 4}),
])
def test_no_final_state_gives_the_same_outputs_and_gradients(monkeypatch, name, kw):
    """forward(..., output_final_state=False): the same outputs and parameter gradients (float64) as the call that
    returns the state; token-independent kernels (fixed α, the exponentials) pass one set of channel weights to the
    op, which then runs its lag-kernel form where that is the cheaper one (here: always); per-token α never does."""
    from seqmem.ops.vort import chunk as vchunk

    ran = []
    real = vchunk._lag_form
    monkeypatch.setattr(vchunk, "_lag_form", lambda *a: ran.append(1) or real(*a))
    monkeypatch.setattr(vchunk, "LAG_FORM_RATIO", 1e9)
    torch.manual_seed(0)
    m = build_mixer(name, 16, n_heads=2, **kw).double()
    x = torch.randn(2, 150, 16, dtype=torch.float64)
    outs = []
    for want in (True, False):
        m.zero_grad()
        y, st = m(x, output_final_state=want)
        assert (st is not None) == want
        y.square().sum().backward()
        outs.append((y.detach(), [p.grad.clone() for p in m.parameters() if p.grad is not None]))
    assert bool(ran) == (name != "vort")
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-10, atol=1e-12)
    for a, b in zip(outs[1][1], outs[0][1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-12)
    assert m._final_state_wanted  # restored after the call
    if name != "vort":  # the shared weights are every token's weights
        alpha = torch.full((2, 3), m.alpha, dtype=torch.float64)
        for shared, per_token in zip(m._shared_channels(torch.float64, "cpu"), m._channels(alpha, torch.float64)):
            torch.testing.assert_close(shared.expand_as(per_token), per_token, rtol=0, atol=0)


def test_soe_mixer_runs_under_torch_compile():
    """A fixed-α VORT layer compiles (the SOE quadrature nodes, cached numpy arrays, used to break dynamo's graph
    resumption: "Expected np.nditer base") and gives the eager outputs."""
    pytest.importorskip("torch._inductor")
    import shutil

    if not any(shutil.which(c) for c in ("g++", "clang++", "c++")):
        pytest.skip("torch.compile on CPU needs a C++ compiler")
    torch.manual_seed(0)
    m = build_mixer("vort_fixed_alpha", 8, n_heads=2, n_soe=4, horizon=32, n_features=4)
    x = torch.randn(1, 12, 8)
    y, _ = torch.compile(m, backend="eager")(x)
    torch.testing.assert_close(y, m(x)[0])


def test_fixed_alpha_refuses_a_routed_alpha_and_its_class_builds_what_its_name_builds():
    """vort_fixed_alpha with alpha_mode='continuous' was the routed vort under another name; the variant classes
    built without the registry (seqmem.layers) were routed SOE VORTs whatever their name."""
    import seqmem
    from seqmem.layers import ExpDecay, ExpMixture, VORTFixedAlpha

    for mode in ("continuous", "banked"):
        with pytest.raises(ValueError, match="alpha_mode='fixed'"):
            seqmem.build_mixer("vort_fixed_alpha", 16, alpha_mode=mode)
    for cls, name in ((VORTFixedAlpha, "vort_fixed_alpha"), (ExpDecay, "exp_decay"), (ExpMixture, "exp_mixture")):
        assert cls(16, n_heads=2).extra_repr() == seqmem.build_mixer(name, 16, n_heads=2).extra_repr()
