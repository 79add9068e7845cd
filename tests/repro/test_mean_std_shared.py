"""Every reproduction takes mean ± std from :func:`seqmem.io.mean_std` (sample std; one value: std nan)."""

from __future__ import annotations

import math

from seqmem import io
from seqmem.repro import common, lattice, vla


def test_one_shared_mean_std():
    assert common.mean_std is io.mean_std
    for mod in (lattice, vla):
        assert not hasattr(mod, "_mean_std"), mod.__name__
        assert mod.mean_std is io.mean_std


def test_one_sample_convention():
    m, s = io.mean_std([0.5])
    assert m == 0.5 and math.isnan(s)  # lattice's copy gave 0.0, vla's None
    assert lattice._pm([0.5]) == "0.500"  # one seed: the table shows the value without "± std"
    assert lattice._pm([1.0, 3.0]) == f"2.000 ± {math.sqrt(2):.3f}"
