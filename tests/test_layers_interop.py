"""The layer surface users bring from fla and zoology: every mixer class importable from seqmem.layers and
seqmem.mixers, fla's constructor names, the zoology adapter, and seqmem.testing.assert_matches_reference."""

from __future__ import annotations

import pytest
import torch

import seqmem.layers
from seqmem.ops import fla_compat
from seqmem.registry import get_entry, list_mixers
from seqmem.testing import assert_matches_reference


def test_every_registered_mixer_class_is_exported():
    import seqmem.mixers

    for name in list_mixers():
        cls = get_entry(name).cls
        assert getattr(seqmem.layers, cls.__name__) is cls, name
        assert cls.__name__ in seqmem.layers.__all__
        assert getattr(seqmem.mixers, cls.__name__) is cls, name
    from seqmem.mixers import GatedDeltaNet  # noqa: F401  (the import the issue reported failing)

    with pytest.raises(ImportError):
        from seqmem.mixers import GatedDeltaNett  # noqa: F401


def test_fla_constructor_names():
    from seqmem.layers import GatedDeltaNet, LatticeMixer

    m = GatedDeltaNet(hidden_size=32, num_heads=4, layer_idx=3)
    assert (m.d_model, m.n_heads, m.layer_idx) == (32, 4, 3)
    assert GatedDeltaNet(hidden_size=32, head_dim=8).n_heads == 4
    assert GatedDeltaNet(32, num_heads=2).n_heads == 2
    torch.manual_seed(0)
    a = GatedDeltaNet(hidden_size=16, num_heads=2)
    torch.manual_seed(0)
    b = GatedDeltaNet(16, n_heads=2)
    x = torch.randn(1, 5, 16)
    torch.testing.assert_close(a(x)[0], b(x)[0])
    for kw, match in ((dict(hidden_size=32, d_model=16), "hidden_size=32 and d_model=16 disagree"),
                      (dict(hidden_size=32, num_heads=4, n_heads=2), "num_heads=4 and n_heads=2 disagree"),
                      (dict(hidden_size=32, head_dim=5), "head_dim=5 must be a positive divisor"),
                      (dict(hidden_size=32, head_dim=True), "head_dim=True must be a positive divisor"),
                      (dict(hidden_size=32, num_heads=2, head_dim=8), r"head_dim=8 × n_heads=2 must equal"),
                      (dict(head_dim=8), "needs hidden_size")):
        with pytest.raises(ValueError, match=match):
            GatedDeltaNet(**kw)
    with pytest.raises(ValueError, match="disagree"):
        GatedDeltaNet(16, hidden_size=32)
    lat = LatticeMixer(hidden_size=32, num_heads=2, head_dim=8)  # Lattice's own head_dim option
    assert lat.n_heads == 2


def test_fla_mamba2_head_dim_is_headdim():
    """fla's Mamba2 splits expand·hidden_size into num_heads heads of head_dim: head_dim is seqmem's headdim (it was
    read as d_model / n_heads, so Mamba2(hidden_size=64, head_dim=16) built heads of 32 and fla's valid
    Mamba2(hidden_size=64, num_heads=2, head_dim=64) was refused)."""
    from seqmem.layers import Mamba2

    m = Mamba2(hidden_size=64, num_heads=2, head_dim=64)
    assert (m.n_heads, m.headdim, m.d_inner) == (2, 64, 128)
    m = Mamba2(hidden_size=64, head_dim=16)
    assert (m.n_heads, m.headdim) == (8, 16)
    with pytest.raises(ValueError, match=r"n_heads=2 × headdim=16 must equal"):
        Mamba2(hidden_size=64, num_heads=2, head_dim=16)
    with pytest.raises(ValueError, match="head_dim=16 and headdim=8 disagree"):
        Mamba2(hidden_size=64, head_dim=16, headdim=8)


def test_zoology_adapter():
    z = seqmem.layers.ZoologyMixer(d_model=16, layer_idx=1, mixer="vla", n_heads=2)
    x = torch.randn(2, 7, 16)
    y = z(x)
    assert isinstance(y, torch.Tensor) and y.shape == x.shape
    torch.testing.assert_close(y, z.mixer(x)[0])
    assert z.state_size(sequence_length=100) == z.mixer.state_size(100) > 0
    with pytest.raises(TypeError):
        z(x, None)


@pytest.mark.parametrize("op", ["chunk_gated_delta_rule", "chunk_delta_rule", "chunk_linear_attn",
                                "fused_recurrent_gated_delta_rule"])
def test_assert_matches_reference_accepts_seqmem_fla_ops(op):
    assert_matches_reference(getattr(fla_compat, op), seq_len=21)
    assert_matches_reference(getattr(fla_compat, op), seq_len=21, dtype=torch.float32)


def test_assert_matches_reference_catches_wrong_kernels():
    def swapped(q, k, v, g, beta, **kw):  # the positional-order trap: beta and g exchanged
        return fla_compat.chunk_gated_delta_rule(q, k, v, beta.clamp(max=-1e-3), -g, **kw)

    with pytest.raises(AssertionError, match="output"):
        assert_matches_reference(swapped, "chunk_gated_delta_rule", seq_len=21)

    def forgets_state(q, k, v, g, beta, initial_state=None, **kw):  # one-shot right only without an initial state
        return fla_compat.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=None, **kw)

    with pytest.raises(AssertionError, match="output|final state"):
        assert_matches_reference(forgets_state, "chunk_gated_delta_rule", seq_len=21)


@pytest.mark.parametrize("name", ["gated_deltanet", "vla", "mamba2"])
def test_assert_matches_reference_on_layers(name):
    from seqmem import build_mixer

    torch.manual_seed(0)
    assert_matches_reference(build_mixer(name, 16, n_heads=2), seq_len=19)


def test_assert_matches_reference_catches_a_broken_state_handoff():
    from seqmem.layers import GatedDeltaNet

    class Leaky(GatedDeltaNet):
        def _forward(self, x, state):
            return super()._forward(x, None)  # drops the incoming state: one-shot right, continuation wrong

    torch.manual_seed(0)
    with pytest.raises(AssertionError, match="continuation"):
        assert_matches_reference(Leaky(hidden_size=16, num_heads=2), seq_len=19)


def test_assert_matches_reference_is_never_vacuous():
    """SKA with its default chunk 64 at seq_len 37: every position is in chunk 0, the reference output is zero, so an
    output comparison would prove nothing: a ValueError says so (it used to pass). A zero-initialised output
    projection no longer hides a wrong output: a candidate that differs only there is caught."""
    import seqmem
    from seqmem.testing import assert_matches_reference

    with pytest.raises(ValueError, match="identically zero"):
        assert_matches_reference(seqmem.build_mixer("ska", 32, n_heads=2))
    assert_matches_reference(seqmem.build_mixer("ska", 32, n_heads=2, chunk_size=8))

    class Scaled(torch.nn.Module):  # the layer's output x 1.5: wrong, but zero while the projection is zero
        def __init__(self) -> None:
            super().__init__()
            self.inner = seqmem.build_mixer("ska", 32, n_heads=2, chunk_size=8)
            self.d_model = 32

        def forward(self, x, state=None):
            y, st = self.inner(x, state)
            return 1.5 * y, st

    ref = Scaled()
    ref.forward = ref.inner.forward  # the reference: the layer itself, same parameter names under .inner
    with pytest.raises(AssertionError, match="output"):
        assert_matches_reference(Scaled(), ref)
