"""Lattice block specifics (the generic contract is in tests/test_contract.py)."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_rel_close
from seqmem import build_mixer, list_mixers
from seqmem.mixers.lattice import LADDER, SSD_OPTIONS, TTT_OPTIONS


def test_registered_names():
    for name in ("lattice", "lattice_enc", "lattice_sim", "lattice_minibatch"):
        assert name in list_mixers()
    assert build_mixer("lattice_enc", 16, n_heads=2).objective == "enc"
    assert build_mixer("lattice_sim", 16, n_heads=2).objective == "sim"


def test_block_structure_shared_qk_projection():
    m = build_mixer("lattice", 32, n_heads=4)
    assert m.qk_proj.out_features == 4 * 8  # ONE projection feeds both q and k (App. A)
    assert m.conv_q.kernel_size == 4 and m.conv_k.kernel_size == 4
    S0 = m.S0
    assert S0.shape == (4, 8, 8)
    eye = torch.eye(8).expand(4, 8, 8)
    assert_rel_close(S0.transpose(-1, -2) @ S0, eye, 1e-5, "orthonormal initial slots")


@pytest.mark.parametrize("name", ["lattice", "lattice_enc", "lattice_sim", "lattice_minibatch"])
def test_slots_stay_on_the_sphere(name):
    torch.manual_seed(0)
    m = build_mixer(name, 16, n_heads=2, chunk_size=8).double()
    x = torch.randn(2, 50, 16, dtype=torch.float64)
    y, st = m(x)
    norms = st["S"].norm(dim=-2)  # lattice_minibatch: the chunk-start slots
    assert (norms - 1).abs().max() < 1e-12
    assert y.abs().max() > 1e-4


def test_ladder_and_ttt_options_build_and_run():
    x = torch.randn(1, 12, 16)
    for opts in [*LADDER.values(), TTT_OPTIONS, SSD_OPTIONS]:
        m = build_mixer("lattice", 16, n_heads=2, **opts)
        y, _ = m(x)
        assert torch.isfinite(y).all() and y.shape == x.shape


def test_fast_is_faster_than_reference_and_equal():
    """The C++/hand-VJP scan gives the reference's numbers (float64) for a whole block."""
    torch.manual_seed(0)
    ref = build_mixer("lattice", 16, n_heads=2, impl="reference", forget_gate=True).double()
    fast = build_mixer("lattice", 16, n_heads=2, impl="fast", forget_gate=True).double()
    fast.load_state_dict(ref.state_dict())
    x = torch.randn(2, 40, 16, dtype=torch.float64, requires_grad=True)
    yr, _ = ref(x)
    yf, _ = fast(x)
    assert_rel_close(yf, yr, 1e-12, "block output")
    (gr,) = torch.autograd.grad(yr.pow(2).sum(), x)
    (gf,) = torch.autograd.grad(yf.pow(2).sum(), x)
    assert_rel_close(gf, gr, 1e-11, "block input gradient")


def test_bad_options_raise():
    with pytest.raises(ValueError, match="m <= d"):
        build_mixer("lattice", 16, n_heads=2, n_slots=9)
    with pytest.raises(ValueError, match="objective"):
        build_mixer("lattice", 16, n_heads=2, objective="pca")
    with pytest.raises(ValueError, match="l1"):
        build_mixer("lattice", 16, n_heads=2, l1=-0.1)
    with pytest.raises(ValueError, match="divisible"):
        build_mixer("lattice", 15, n_heads=2)
    with pytest.raises(ValueError):
        build_mixer("lattice_minibatch", 16, n_heads=2, objective="ttt")
    with pytest.raises(ValueError):
        build_mixer("lattice", 16, n_heads=2, normalize="yes")
    for objective in ("ttt", "delta"):  # eqs. 19-20 have no sphere projection: normalize=False must be said
        with pytest.raises(ValueError, match=rf"objective='{objective}' \(eq. \d+\) has no sphere projection"):
            build_mixer("lattice", 16, n_heads=2, objective=objective)


def test_lattice_chunked_is_a_deprecated_alias_of_lattice_minibatch():
    """The former name still builds the mini-batch model (older run.json files load), with a DeprecationWarning;
    it is not listed."""
    with pytest.warns(DeprecationWarning, match="lattice_minibatch"):
        m = build_mixer("lattice_chunked", 16, n_heads=2)
    assert type(m).__name__ == "LatticeMinibatchMixer" and m.registered_name == "lattice_minibatch"
    assert "lattice_chunked" not in list_mixers() and "lattice_minibatch" in list_mixers()


# -- Mamba-2's SSD rule in the Lattice block (objective="ssd") ---------------------------------------------------
def _ssd_block_by_hand(m, x: torch.Tensor) -> torch.Tensor:
    """The block with the SSD rule, written out token by token: same projections, convolutions, gate and output as
    every objective; per head S_t = exp(−Δ_t e^{A_log}) S_{t-1} + Δ_t v_t k_tᵀ from S_0 = 0, y_t = S_t q_t."""
    B, T, _ = x.shape
    H, d, n = m.n_heads, m.head_dim, m.n_slots

    def conv(u, c):  # causal depthwise: y_t = b + Σ_j w_j u_{t-K+1+j}, zeros before the start
        K = c.weight.shape[-1]
        up = torch.cat([u.new_zeros(B, K - 1, u.shape[-1]), u], 1)
        return c.bias + sum(c.weight[:, 0, j] * up[:, j : j + T] for j in range(K))

    u = x @ m.qk_proj.weight.T
    q = torch.nn.functional.normalize(torch.nn.functional.silu(conv(u, m.conv_q)).view(B, T, H, n), dim=-1, eps=1e-6)
    k = torch.nn.functional.normalize(torch.nn.functional.silu(conv(u, m.conv_k)).view(B, T, H, n), dim=-1, eps=1e-6)
    v = (x @ m.v_proj.weight.T).view(B, T, H, d)
    dt = torch.log1p(torch.exp(x @ m.gamma_proj.weight.T + m.gamma_proj.bias))  # softplus, (B, T, H)
    a = torch.exp(-dt * torch.exp(m.A_log))
    S = x.new_zeros(B, H, d, n)
    ys = []
    for t in range(T):
        S = a[:, t, :, None, None] * S + dt[:, t, :, None, None] * v[:, t, :, :, None] * k[:, t, :, None, :]
        ys.append((S @ q[:, t, :, :, None]).squeeze(-1))
    y = torch.stack(ys, 1).reshape(B, T, H * d)
    y = y * torch.nn.functional.gelu(x @ m.gate_proj.weight.T)
    return y @ m.o_proj.weight.T


@pytest.mark.parametrize("impl", ["fast", "reference"])
@pytest.mark.parametrize("n_slots", [8, 12])
def test_ssd_rule_equals_the_per_token_recurrence(impl, n_slots):
    """Outputs and gradients (input and every parameter) equal the hand-written recurrence in float64; the fast
    form runs the SSD op's chunk decomposition with chunks that do not divide T."""
    torch.manual_seed(0)
    m = build_mixer("lattice", 16, n_heads=2, impl=impl, chunk_size=8, n_slots=n_slots, **SSD_OPTIONS).double()
    with torch.no_grad():  # larger steps than Mamba-2's initial Δ ∈ [1e-3, 0.1], so the decay matters
        m.gamma_proj.bias.add_(2.0)
        m.A_log.copy_(torch.log(torch.tensor([0.3, 1.5])))
    x = torch.randn(2, 29, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 29, 16, dtype=torch.float64)
    y, st = m(x)
    y_ref = _ssd_block_by_hand(m, x)
    assert_rel_close(y, y_ref, 1e-12, "block output")
    assert st["S"].shape == (2, 2, 8, n_slots)
    params = list(m.parameters())
    g = torch.autograd.grad((y * w).sum(), [x, *params])
    g_ref = torch.autograd.grad((y_ref * w).sum(), [x, *params])
    names = ["x", *(n for n, _ in m.named_parameters())]
    for name, a, b in zip(names, g, g_ref):
        assert_rel_close(a, b, 1e-11, f"gradient of {name}")
    assert m.A_log.requires_grad and g[names.index("A_log")].abs().max() > 0


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_ssd_rule_state_carries_across_a_split(dtype):
    torch.manual_seed(0)
    m = build_mixer("lattice", 16, n_heads=2, chunk_size=8, **SSD_OPTIONS).to(dtype)
    with torch.no_grad():
        m.gamma_proj.bias.add_(2.0)
    x = torch.randn(2, 30, 16, dtype=dtype)
    y, st = m(x)
    y1, s1 = m(x[:, :11])
    y2, s2 = m(x[:, 11:], s1)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    assert_rel_close(torch.cat([y1, y2], 1), y, tol, "split output")
    for key in st:
        assert_rel_close(s2[key], st[key], tol, f"split state[{key}]")
    zero = m.initial_state(2, dtype, x.device)["S"]
    assert zero.abs().max() == 0  # Mamba-2's state starts at zero; the block keeps no S_0
    assert not hasattr(m, "S0")


def test_ssd_rule_rejects_lattice_only_options():
    for bad, match in (
        ({"normalize": True}, "normalize=True"),
        ({"gamma_per_slot": True}, "gamma_per_slot"),
        ({"forget_gate": True}, "forget_gate"),
        ({"l1": 0.1}, "l1"),
        ({"learn_s0": True}, "learn_s0"),
    ):
        opts = {**SSD_OPTIONS, **bad}
        with pytest.raises(ValueError, match=match):
            build_mixer("lattice", 16, n_heads=2, **opts)
    with pytest.raises(ValueError, match="objective"):  # the normalize default is the sphere projection
        build_mixer("lattice", 16, n_heads=2, objective="ssd")
    with pytest.raises(ValueError, match="objective"):  # the mini-batch model has no SSD form
        build_mixer("lattice_minibatch", 16, n_heads=2, objective="ssd")
