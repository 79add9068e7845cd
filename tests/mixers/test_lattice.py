"""Lattice block specifics (the generic contract is in tests/test_contract.py)."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_rel_close
from seqmem import build_mixer, list_mixers
from seqmem.mixers.lattice import LADDER, TTT_OPTIONS


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
    for opts in [*LADDER.values(), TTT_OPTIONS]:
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


def test_lattice_chunked_is_a_deprecated_alias_of_lattice_minibatch():
    """The former name still builds the mini-batch model (older run.json files load), with a DeprecationWarning;
    it is not listed."""
    with pytest.warns(DeprecationWarning, match="lattice_minibatch"):
        m = build_mixer("lattice_chunked", 16, n_heads=2)
    assert type(m).__name__ == "LatticeMinibatchMixer" and m.registered_name == "lattice_minibatch"
    assert "lattice_chunked" not in list_mixers() and "lattice_minibatch" in list_mixers()
