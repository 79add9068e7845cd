"""VLA mixers: paper defaults, option validation, state layout, reference == fast at the paper's head size
across refreshes, and the variants' defining behaviour (v2 explodes at λ0 = 0.1, A fixed = no A state)."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import assert_rel_close
from seqmem import build_mixer, count_state, list_mixers


def test_registered_names_and_paper_defaults():
    for name in ("vla", "vla_v2", "vla_fixed_a", "vla_paper_deltanet"):
        assert name in list_mixers()
    m = build_mixer("vla", 128, n_heads=4)
    assert (m.lam0, m.refresh_period, m.refresh_eta, m.eps, m.normalizer) == (0.1, 20, 1e-3, 1e-4, "paper")
    assert m.u_scale is None and m.normalize_alpha and not m.fixed_A  # u scaled by 1/√d_h (Algorithm 1)
    assert m.state_size(10) == 2 * 4 * 32 * 32 + 4 * 32 + 1  # S + A + z + position
    assert build_mixer("vla_v2", 16, n_heads=2).normalize_alpha is False
    assert build_mixer("vla_fixed_a", 16, n_heads=2).state_size(5) == 2 * 8 * 8 + 2 * 8 + 1


@pytest.mark.parametrize(
    "opts",
    [{"lam0": 0}, {"lam0": -1.0}, {"refresh_period": -3}, {"refresh_period": 2.5}, {"refresh_eta": -1e-3},
     {"eps": 0}, {"normalizer": "softmax"}, {"chunk_size": 0}, {"fixed_A": "yes"}, {"u_scale": 0.0},
     {"n_heads": 3}],
)
def test_bad_options_raise(opts):
    with pytest.raises(ValueError):
        build_mixer("vla", 16, **{"n_heads": 2, **opts})


def test_reference_equals_fast_paper_head_size_across_refreshes():
    """d_h = 32 (the paper's), T = 45 crosses refreshes at 20 and 40; fast chunk 20 and 7 vs the loop."""
    torch.manual_seed(0)
    ref = build_mixer("vla", 64, n_heads=2, impl="reference").double()
    x = torch.randn(1, 45, 64, dtype=torch.float64, requires_grad=True)
    y_ref, s_ref = ref(x)
    g_ref = torch.autograd.grad(y_ref.square().sum(), [x, ref.w_u])
    for c in (20, 7):
        fast = build_mixer("vla", 64, n_heads=2, impl="fast", chunk_size=c).double()
        fast.load_state_dict(ref.state_dict())
        y, s = fast(x)
        assert_rel_close(y, y_ref, 1e-10, f"C={c}")
        for k in s_ref:
            assert_rel_close(s[k].double(), s_ref[k].double(), 1e-10, f"C={c} state {k}")
        g = torch.autograd.grad(y.square().sum(), [x, fast.w_u])
        for a, b in zip(g, g_ref):
            assert_rel_close(a, b, 1e-9)
    assert count_state(s_ref) == ref.state_size(45)
    assert int(s_ref["pos"][0]) == 45


def test_v2_explodes_at_paper_lambda_while_vla_stays_bounded():
    """Unnormalised α = A k̂ with A₀ = 10 I writes ~10× the residual: the state blows up (Table 2's point),
    while normalised VLA stays bounded on the same input."""
    torch.manual_seed(1)
    x = torch.randn(1, 60, 32, dtype=torch.float64)
    norms = {}
    for name in ("vla", "vla_v2"):
        torch.manual_seed(2)
        m = build_mixer(name, 32, n_heads=1).double()
        _, st = m(x)
        norms[name] = torch.linalg.matrix_norm(st["S"]).max().item()
    assert norms["vla"] < 50
    assert not math.isfinite(norms["vla_v2"]) or norms["vla_v2"] > 1e6 * norms["vla"]


def test_paper_deltanet_state_and_decay():
    torch.manual_seed(0)
    m = build_mixer("vla_paper_deltanet", 16, n_heads=2).double()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    _, st = m(x)
    assert set(st) == {"S", "z"} and count_state(st) == m.state_size(9) == 2 * 8 * 8 + 2 * 8
    assert torch.linalg.matrix_rank(st["S"]).min() > 1
    # β → 0 (eq. 4 as a decay gate): S_T = (v_T − S_{T-1} k̂_T) k̂_Tᵀ is rank one — the past is gone
    with torch.no_grad():
        m.beta_proj.bias.fill_(-60.0)
        m.beta_proj.weight.zero_()
    for impl in ("fast", "reference"):
        m.impl = impl
        _, st1 = m(x)
        sv = torch.linalg.svdvals(st1["S"])
        assert (sv[..., 1] < 1e-12 * sv[..., 0]).all()


def test_fixed_a_has_no_unused_w_u_and_loads_state_dicts_that_have_it():
    """vla_fixed_a never reads W_u (no Sherman-Morrison step): it is not a parameter (it got no gradient, inflated
    the parameter count and stopped plain DDP).  It is still drawn at construction, so every other parameter
    initialises as before, and a state dict saved with it loads (the key is dropped)."""
    torch.manual_seed(0)
    full = build_mixer("vla", 16, n_heads=2, fixed_A=False)
    torch.manual_seed(0)
    m = build_mixer("vla_fixed_a", 16, n_heads=2)
    after = torch.rand(4)
    assert "w_u" not in dict(m.named_parameters()) and "w_u" not in m.state_dict() and m.w_u is None
    sd = full.state_dict()
    assert all(torch.equal(m.state_dict()[k], sd[k]) for k in m.state_dict())  # the same draws, in order
    torch.manual_seed(0)
    build_mixer("vla", 16, n_heads=2, fixed_A=False)
    assert torch.equal(torch.rand(4), after)  # the generator is left where it was
    old = dict(m.state_dict(), w_u=sd["w_u"])  # a state dict saved when the layer had w_u
    m.load_state_dict(old)  # strict: the unused key is dropped, nothing is missing
    x = torch.randn(1, 6, 16)
    y, _ = m(x)
    assert y.shape == x.shape and torch.isfinite(y).all()
