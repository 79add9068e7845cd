"""linear_attention / deltanet / gated_deltanet / mamba2 mixers vs independent per-token references written
from their parameters (no seqmem.ops), plus options, state sizes and errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import assert_rel_close
from seqmem import build_mixer, count_state

D, H, T = 16, 2, 19


def perturbed(name, **opts):
    torch.manual_seed(0)
    m = build_mixer(name, D, n_heads=H, **opts).double()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return m


def x_in(t=T, b=2, seed=3):
    return torch.randn(b, t, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def conv_ref(u, conv):
    """Causal depthwise conv through nn.functional.conv1d with left zero padding."""
    k = conv.weight.shape[-1]
    y = F.conv1d(F.pad(u.transpose(1, 2), (k - 1, 0)), conv.weight, conv.bias, groups=u.shape[-1])
    return y.transpose(1, 2)


def rms(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def assert_grads_and_split(m, x, y, ref, st, key):
    """Every gradient (input and parameters) of ``y`` equals that of the per-token ``ref``, and the sequence split
    at 7 and continued from its state gives the same output and state ``st[key]``."""
    w = torch.randn(y.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    params = list(m.parameters())
    g = torch.autograd.grad((y * w).sum(), [x, *params])
    g_ref = torch.autograd.grad((ref * w).sum(), [x, *params])
    for name, a, b in zip(["x", *(nm for nm, _ in m.named_parameters())], g, g_ref):
        assert_rel_close(a, b, 1e-10, f"gradient of {name}")
    y1, s1 = m(x[:, :7])
    y2, s2 = m(x[:, 7:], s1)
    assert_rel_close(torch.cat([y1, y2], 1), y, 1e-12, "split output")
    assert_rel_close(s2[key], st[key], 1e-12, "split state")


def qkv_ref(m, x, act_without_conv):
    u = x @ m.qkv.weight.T
    if m.conv is not None:
        u = F.silu(conv_ref(u, m.conv))
    elif act_without_conv:
        u = F.silu(u)
    b, t, _ = x.shape
    return [a.reshape(b, t, H, D // H) for a in u.split(D, -1)]


@pytest.mark.parametrize("impl", ["reference", "fast"])
@pytest.mark.parametrize(
    "opts",
    [
        {"feature_map": "elu1", "normalize": True},
        {"feature_map": "identity", "conv_size": None},
        {"feature_map": "elu1", "conv_size": 3, "normalize": False},
    ],
)
def test_linear_attention_matches_quadratic_form(impl, opts):
    m = perturbed("linear_attention", impl=impl, chunk_size=8, **opts)
    x = x_in()
    y, st = m(x)
    q, k, v = qkv_ref(m, x, act_without_conv=False)
    if opts["feature_map"] == "elu1":
        q, k = F.elu(q) + 1, F.elu(k) + 1
    dk = D // H
    scores = torch.einsum("bthd,bshd->bhts", q, k) * dk**-0.5 * torch.ones(T, T, dtype=torch.bool).tril()
    o = torch.einsum("bhts,bshd->bthd", scores, v)
    if opts.get("normalize"):
        o = o / (scores.sum(-1).transpose(1, 2)[..., None] + m.eps)
    ref = o.reshape(2, T, D) @ m.out.weight.T
    assert_rel_close(y, ref, 1e-10, "linear attention vs quadratic form")
    assert count_state(st) == m.state_size(T)
    if opts.get("normalize"):
        assert_rel_close(st["z"], k.sum(1), 1e-12, "normaliser state = sum of phi(k)")


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("conv_size", [4, None])
def test_deltanets_match_per_token_reference(gated, conv_size):
    name = "gated_deltanet" if gated else "deltanet"
    m = perturbed(name, chunk_size=8, conv_size=conv_size)
    x = x_in()
    y, st = m(x)
    q, k, v = qkv_ref(m, x, act_without_conv=True)
    q, k = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    beta = torch.sigmoid(x @ m.b_proj.weight.T + m.b_proj.bias)
    dk = D // H
    if gated:
        decay = torch.exp(-torch.exp(m.A_log) * F.softplus(x @ m.a_proj.weight.T + m.dt_bias))
        assert ((decay > 0) & (decay < 1)).all()
    # per-token loop in the (d_v x d_k) orientation: M <- a M (I - b k k^T) + b v k^T, o = M q / sqrt(d_k)
    M = torch.zeros(2, H, dk, dk, dtype=torch.float64)
    outs = []
    for t in range(T):
        kt, vt, bt = k[:, t], v[:, t], beta[:, t, :, None, None]
        if gated:
            M = decay[:, t, :, None, None] * M
        M = M - bt * (M @ kt[..., :, None]) @ kt[..., None, :] + bt * vt[..., :, None] @ kt[..., None, :]
        outs.append((M @ q[:, t, :, :, None])[..., 0] * dk**-0.5)
    o = torch.stack(outs, 1)
    if gated:
        gate = (x @ m.g_proj.weight.T).reshape(2, T, H, dk)
        o = rms(o, m.o_norm.weight, m.o_norm.eps) * F.silu(gate)
    else:
        o = rms(o, m.o_norm.weight, m.o_norm.eps)
    ref = o.reshape(2, T, D) @ m.out.weight.T
    assert_rel_close(y, ref, 1e-10, f"{name} vs per-token reference")
    assert_rel_close(st["S"], M.transpose(-1, -2), 1e-10, f"{name} state")


@pytest.mark.parametrize("impl", ["reference", "fast"])
@pytest.mark.parametrize("conv_size", [4, None])
def test_gated_deltanet_block_with_lattice_rule_matches_per_token_reference(impl, conv_size):
    """rule="lattice": Gated DeltaNet's block (q/k/v convs, L2-normalised q/k, sigmoid b, gated RMSNorm, out)
    around Lattice-DEC's update, written out token by token; outputs, state and all gradients in float64."""
    m = perturbed("gated_deltanet", impl=impl, chunk_size=8, conv_size=conv_size, rule="lattice")
    assert not any(hasattr(m, p) for p in ("a_proj", "A_log", "dt_bias"))  # no decay gate: Lattice-DEC has none
    x = x_in().requires_grad_(True)
    y, st = m(x)
    q, k, v = qkv_ref(m, x, act_without_conv=True)
    q, k = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    gamma = torch.sigmoid(x @ m.b_proj.weight.T + m.b_proj.bias)
    dk = D // H
    # (d x m) slots: orthonormal columns drawn in float32; the op projects them onto the sphere (eq. 14) once
    assert_rel_close(m.S0.transpose(-1, -2) @ m.S0, torch.eye(dk, dtype=torch.float64).expand(H, dk, dk), 1e-6,
                     "orthonormal S_0")
    S = (m.S0 / m.S0.norm(dim=-2, keepdim=True)).expand(2, H, dk, dk)
    outs = []
    for t in range(T):
        kt, vt, gt = k[:, t], v[:, t], gamma[:, t, :, None, None]
        e = (S @ kt[..., None])[..., 0] - vt  # e_t = S k_t − v_t (unit slots: φ(S) = S), eq. 7
        p = (S.transpose(-1, -2) @ e[..., None])[..., 0]  # ⟨s_i, e_t⟩
        U = S - gt * (e[..., :, None] * kt[..., None, :] - S * (p * kt)[..., None, :])  # eq. 13
        S = U / U.norm(dim=-2, keepdim=True)  # eq. 14
        outs.append((S @ q[:, t, :, :, None])[..., 0])  # y_t = S_t q_t
    o = torch.stack(outs, 1)
    gate = (x @ m.g_proj.weight.T).reshape(2, T, H, dk)
    ref = (rms(o, m.o_norm.weight, m.o_norm.eps) * F.silu(gate)).reshape(2, T, D) @ m.out.weight.T
    assert_rel_close(y, ref, 1e-12, "gated_deltanet(rule='lattice') vs per-token reference")
    assert_rel_close(st["S"], S, 1e-12, "state: the slots")
    assert_grads_and_split(m, x, y, ref, st, "S")


@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_mamba2_matches_per_token_reference(impl):
    m = perturbed("mamba2", impl=impl, d_state=6, chunk_size=8)
    x = x_in()
    y, st = m(x)
    di, n, h = m.d_inner, m.d_state, m.n_heads
    p = di // h
    zxbcdt = x @ m.in_proj.weight.T
    z, xBC, dt = zxbcdt.split([di, di + 2 * n, h], -1)
    xBC = F.silu(conv_ref(xBC, m.conv))
    xs, Bm, Cm = xBC.split([di, n, n], -1)
    xs = xs.reshape(2, T, h, p)
    dt = F.softplus(dt + m.dt_bias)
    A = -torch.exp(m.A_log)
    hst = torch.zeros(2, h, p, n, dtype=torch.float64)
    ys = []
    for t in range(T):
        hst = torch.exp(dt[:, t] * A)[..., None, None] * hst + (dt[:, t, :, None] * xs[:, t])[..., None] * Bm[
            :, t, None, None, :
        ]
        ys.append((hst * Cm[:, t, None, None, :]).sum(-1) + m.D[:, None] * xs[:, t])
    yy = torch.stack(ys, 1).reshape(2, T, di) * F.silu(z)
    ref = rms(yy, m.norm.weight, m.norm.eps) @ m.out_proj.weight.T
    assert_rel_close(y, ref, 1e-10, "mamba2 vs per-token reference")
    assert_rel_close(st["ssm"], hst, 1e-10, "mamba2 ssm state")
    assert torch.equal(st["conv"], zxbcdt[:, -3:, di : di + di + 2 * n])


def mamba2_features(m, x):
    """Mamba-2's block up to the update, from its parameters: z, x (heads), B, C, dt = softplus(dt + dt_bias)."""
    di, n, h = m.d_inner, m.d_state, m.n_heads
    b, t, _ = x.shape
    z, xBC, dt = (x @ m.in_proj.weight.T).split([di, di + 2 * n, h], -1)
    xs, Bm, Cm = F.silu(conv_ref(xBC, m.conv)).split([di, n, n], -1)
    return z, xs.reshape(b, t, h, di // h), Bm, Cm, F.softplus(dt + m.dt_bias)


@pytest.mark.parametrize("impl", ["reference", "fast"])
@pytest.mark.parametrize("d_state", [6, 16])
def test_mamba2_block_with_lattice_rule_matches_per_token_reference(impl, d_state):
    """rule="lattice": Mamba-2's block (in_proj, conv + SiLU, D skip, gated RMSNorm, out_proj) around Lattice-DEC's
    update with key B, query C, value x and step Δ_t, written out token by token; slots are the state's d_state
    columns, normalised over headdim (d_state 16 = headdim: m = d); outputs, state and all gradients in float64."""
    m = perturbed("mamba2", impl=impl, d_state=d_state, chunk_size=8, rule="lattice")
    assert not hasattr(m, "A_log")  # no decay: Lattice-DEC has none
    x = x_in().requires_grad_(True)
    y, st = m(x)
    z, xs, Bm, Cm, dt = mamba2_features(m, x)
    h, p, n = m.n_heads, m.headdim, m.d_state
    assert (p, n) == (D * 2 // H, d_state) and m.S0.shape == (h, p, n)
    assert_rel_close(m.S0.transpose(-1, -2) @ m.S0, torch.eye(n, dtype=torch.float64).expand(h, n, n), 1e-6,
                     "orthonormal S_0")
    S = (m.S0 / m.S0.norm(dim=-2, keepdim=True)).expand(2, h, p, n)  # (heads, headdim, d_state), slot = column
    ys = []
    for t in range(T):
        kt, vt, gt = Bm[:, t, None, :].expand(2, h, n), xs[:, t], dt[:, t, :, None, None]
        e = (S @ kt[..., None])[..., 0] - vt  # e_t = S B_t − x_t (unit slots: φ(S) = S), eq. 7
        pr = (S.transpose(-1, -2) @ e[..., None])[..., 0]  # ⟨s_i, e_t⟩
        U = S - gt * (e[..., :, None] * kt[..., None, :] - S * (pr * kt)[..., None, :])  # eq. 13, γ_t = Δ_t
        S = U / U.norm(dim=-2, keepdim=True)  # eq. 14: each d_state column back on the sphere in R^headdim
        ys.append((S * Cm[:, t, None, None, :]).sum(-1) + m.D[:, None] * vt)  # y_t = S_t C_t + D x_t
    yy = torch.stack(ys, 1).reshape(2, T, m.d_inner) * F.silu(z)
    ref = rms(yy, m.norm.weight, m.norm.eps) @ m.out_proj.weight.T
    assert_rel_close(y, ref, 1e-12, "mamba2(rule='lattice') vs per-token reference")
    assert_rel_close(st["ssm"], S, 1e-12, "state: the slots")
    assert_rel_close(st["ssm"].norm(dim=-2), torch.ones(2, h, n, dtype=torch.float64), 1e-12, "unit slots")
    assert count_state(st) == m.state_size(T) == build_mixer("mamba2", D, n_heads=H, d_state=d_state).state_size(T)
    assert_grads_and_split(m, x, y, ref, st, "ssm")


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_mamba2_lattice_rule_reference_equals_fast(dtype):
    """rule="lattice", impl="reference" (per-token loop) == impl="fast" (scan): outputs, final states, gradients,
    at a length that crosses several backward chunks and from a carried state."""
    tol = {torch.float64: 1e-12, torch.float32: 2e-5}[dtype]
    ms = {impl: perturbed("mamba2", impl=impl, d_state=8, chunk_size=8, rule="lattice").to(dtype)
          for impl in ("reference", "fast")}
    x = x_in(t=45).to(dtype).requires_grad_(True)
    w = torch.randn(x.shape, dtype=dtype, generator=torch.Generator().manual_seed(5))
    outs = {}
    for impl, m in ms.items():
        _, s0 = m(x[:, :5].detach())
        y, st = m(x, s0)
        outs[impl] = (y, st, torch.autograd.grad((y * w).sum(), [x, *m.parameters()]))
    (yr, sr, gr), (yf, sf, gf) = outs["reference"], outs["fast"]
    assert_rel_close(yf, yr, tol, "output fast vs reference")
    assert set(sf) == set(sr) == {"conv", "ssm"}
    for k in sr:
        assert_rel_close(sf[k], sr[k], tol, f"state[{k}] fast vs reference")
    for name, a, b in zip(["x", *(nm for nm, _ in ms["reference"].named_parameters())], gf, gr):
        assert_rel_close(a, b, tol * 10, f"gradient of {name} fast vs reference")


def test_mamba2_lattice_rule_needs_slots_that_fit_headdim():
    with pytest.raises(ValueError, match="d_state <= headdim"):
        build_mixer("mamba2", 16, n_heads=2, d_state=17, rule="lattice")  # headdim 16
    assert build_mixer("mamba2", 16, n_heads=2, d_state=17).rule == "ssd"  # SSD has no such bound


def test_state_sizes_exact():
    la = build_mixer("linear_attention", 16, n_heads=2, normalize=True)
    assert la.state_size(100) == 2 * 8 * 8 + 3 * 48 + 2 * 8
    dn = build_mixer("deltanet", 16, n_heads=2, conv_size=None)
    assert dn.state_size(5) == 2 * 8 * 8
    m2 = build_mixer("mamba2", 16, n_heads=2, d_state=8)
    assert m2.state_size(5) == 3 * (32 + 16) + 2 * 16 * 8
    m2h = build_mixer("mamba2", 16, headdim=8, d_state=8)
    assert m2h.n_heads == 4 and m2h.state_size(1) == 3 * 48 + 4 * 8 * 8


def test_mamba2_heads_and_headdim_must_agree():
    """headdim sets the heads (expand·d_model / headdim); an n_heads given beside it that disagrees was overwritten
    silently (n_heads=2, headdim=8 at d_model 16 built 4 heads): it is refused, an agreeing one accepted."""
    with pytest.raises(ValueError, match=r"n_heads=2 × headdim=8 must equal expand \* d_model = 32"):
        build_mixer("mamba2", 16, n_heads=2, headdim=8)
    m = build_mixer("mamba2", 16, n_heads=4, headdim=8)
    assert (m.n_heads, m.headdim) == (4, 8)
    assert build_mixer("mamba2", 16).n_heads == 4  # the default without headdim
    # a model's n_heads is not forced on a layer whose headdim sets its heads (Echo's Mamba-2 layers: headdim 64)
    from seqmem.models import LanguageModel, LMConfig

    lm = LanguageModel(LMConfig(vocab_size=16, d_model=32, n_layers=2, n_heads=2, mixer=["mamba2", "attention"],
                                mixer_options=[{"headdim": 16, "d_state": 8}, {}]))
    assert (lm.blocks[0].mixer.n_heads, lm.blocks[0].mixer.headdim, lm.blocks[1].mixer.n_heads) == (4, 16, 2)


@pytest.mark.parametrize(
    "name,opts",
    [
        ("linear_attention", {"feature_map": "relu"}),
        ("linear_attention", {"normalize": "yes"}),
        ("linear_attention", {"eps": -1.0}),
        ("deltanet", {"conv_size": -1}),
        ("deltanet", {"n_heads": 3}),
        ("gated_deltanet", {"chunk_size": 0}),
        ("gated_deltanet", {"rule": "lattice_dec"}),
        ("gated_deltanet", {"rule": "delta"}),
        ("mamba2", {"headdim": 5}),
        ("mamba2", {"d_state": 0}),
        ("mamba2", {"expand": 1.5}),
        ("mamba2", {"n_heads": 3}),
        ("mamba2", {"rule": "Lattice"}),
        ("mamba2", {"rule": "gated_delta"}),
        ("mamba2", {"rule": None}),
    ],
)
def test_bad_options_raise(name, opts):
    with pytest.raises(ValueError):
        build_mixer(name, 16, **opts)


FAMILY_OWN = {"linear_attention": ["feature_map", "normalize", "eps"], "deltanet": ["norm_eps"],
              "gated_deltanet": ["norm_eps", "rule"]}


@pytest.mark.parametrize("name", sorted(FAMILY_OWN))
def test_family_options_pass_through_keyword_only(name):
    """linear_attention / deltanet / gated_deltanet declare only their own options; the family's (n_heads, impl,
    conv_size, chunk_size; and DeltaNet's norm_eps for gated_deltanet) pass through ``**kwargs``, keyword-only: a
    positional second argument is refused (it would once have been ``n_heads``), and the forwarded options are
    listed, checked and reported under the mixer's own name as before."""
    import seqmem

    entry = seqmem.get_entry(name)
    cls = entry.cls
    with pytest.raises(TypeError):
        cls(D, H)
    m = cls(D, n_heads=H, impl="reference", conv_size=None, chunk_size=5)
    assert (m.n_heads, m.impl, m.conv_size, m.chunk_size, m.conv) == (H, "reference", None, 5, None)
    for p in ("b_proj", "a_proj"):  # per-head projections sized from self.n_heads
        if hasattr(m, p):
            assert getattr(m, p).out_features == H
    if hasattr(m, "A_log"):
        assert m.A_log.shape == m.dt_bias.shape == (H,)
    opts = entry.valid_options()
    assert opts == ["n_heads", "impl", "conv_size", "chunk_size", *FAMILY_OWN[name]]
    owner = cls.__name__
    for opt, bad, want in [("n_heads", "2", "an integer"), ("n_heads", 0, "an integer > 0"),
                           ("conv_size", 2.0, "an integer"), ("chunk_size", 0, "an integer > 0")]:
        with pytest.raises(ValueError, match=f"^{owner}: {opt} must be {want}, got"):
            build_mixer(name, D, **{opt: bad})
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['chunk_sise'\] \(did you mean 'chunk_size'\?\)"):
        build_mixer(name, D, chunk_sise=8)


@pytest.mark.parametrize("name", ["linear_attention", "deltanet", "gated_deltanet", "mamba2"])
def test_float32_long_sequence_finite_and_fast_equals_reference(name):
    torch.manual_seed(0)
    opts = {"d_state": 16} if name == "mamba2" else {}
    fast = build_mixer(name, 32, n_heads=4, **opts)
    ref = build_mixer(name, 32, n_heads=4, impl="reference", **opts)
    ref.load_state_dict(fast.state_dict())
    x = torch.randn(2, 200, 32)
    yf, _ = fast(x)
    yr, _ = ref(x)
    assert torch.isfinite(yf).all()
    assert_rel_close(yf, yr, 1e-4, f"{name} float32 fast vs reference at T=200")


@pytest.mark.parametrize("name", ["linear_attention", "deltanet", "gated_deltanet"])
def test_conv_size_zero_is_no_convolution(name):
    """``conv_size=0`` (how a TOML spec, which has no null, switches the convolution off) is the model
    ``conv_size=None`` builds: no convolution, the same parameters and outputs, no ``"conv"`` state."""
    torch.manual_seed(0)
    off = build_mixer(name, D, n_heads=H, conv_size=None)
    torch.manual_seed(0)
    zero = build_mixer(name, D, n_heads=H, conv_size=0)
    assert zero.conv is None and zero.conv_size is None
    assert [n for n, _ in zero.named_parameters()] == [n for n, _ in off.named_parameters()]
    x = torch.randn(2, 7, D)
    (y0, s0), (y1, s1) = off(x), zero(x)
    assert torch.equal(y0, y1) and "conv" not in s1 and set(s0) == set(s1)
    assert "conv" in build_mixer(name, D, n_heads=H)(x)[1]  # the default keeps its convolution
