"""Every reproduction takes mean ± std from :func:`seqmem.io.mean_std` (sample std; one value: std nan)."""

from __future__ import annotations

import importlib
import math
import pkgutil

from seqmem import io
from seqmem.repro import common, lattice, vla


def test_one_shared_mean_std():
    assert common.mean_std is io.mean_std
    for pkg in (lattice, vla):
        users = []
        subs = [importlib.import_module(f"{pkg.__name__}.{m.name}") for m in pkgutil.iter_modules(pkg.__path__)]
        for mod in [pkg, *subs]:
            assert not hasattr(mod, "_mean_std"), mod.__name__
            if hasattr(mod, "mean_std"):
                assert mod.mean_std is io.mean_std, mod.__name__
                users.append(mod)
        assert users, pkg.__name__  # the package takes mean ± std somewhere, and from seqmem.io


def test_one_sample_convention():
    m, s = io.mean_std([0.5])
    assert m == 0.5 and math.isnan(s)  # lattice's copy gave 0.0, vla's None
    from seqmem.repro.lattice.context import _pm

    assert _pm([0.5]) == "0.500"  # one seed: the table shows the value without "± std"
    assert _pm([1.0, 3.0]) == f"2.000 ± {math.sqrt(2):.3f}"


def test_torch_threads_restores_the_count(tmp_path):
    import argparse

    import torch

    from seqmem.repro import elastic

    before = torch.get_num_threads()
    with common.torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    # a repro run no longer leaves the process at one thread (it computes at one thread inside)
    args = argparse.Namespace(scale="smoke", out=tmp_path, seed=0, steps=None, corpus="code", skip_lm=True)
    with common.torch_threads(2):
        assert elastic.run(args) == 0 and (tmp_path / "hippo_table12.md").exists()
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == before
