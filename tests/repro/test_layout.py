"""Every ``seqmem repro <paper>`` is a package whose scales/model specs (``configs.py``) and paper numbers
(``paper.py``) are data beside its code, with the entry points the command line calls."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

REPRO = Path(__file__).resolve().parents[2] / "src" / "seqmem" / "repro"
PAPERS = sorted(p.name for p in REPRO.iterdir() if p.is_dir() and (p / "__init__.py").exists())


def test_every_paper_is_a_package():
    assert PAPERS == ["echo", "elastic", "lattice", "vla", "vort"]
    assert not [p.name for p in REPRO.glob("*.py") if p.stem not in ("__init__", "common", "verdict")]


@pytest.mark.parametrize("paper", PAPERS)
def test_data_beside_the_code(paper):
    mod = importlib.import_module(f"seqmem.repro.{paper}")
    assert callable(mod.run) and callable(mod.add_arguments) and mod.SCALES
    for name in ("configs.py", "paper.py"):
        tree = ast.parse((REPRO / paper / name).read_text())
        # data only: assignments (and, for vla, the copy-returning accessor); no training or model code
        kinds = {type(n).__name__ for n in tree.body} - {"Expr", "ImportFrom", "Import", "Assign", "AnnAssign"}
        assert kinds <= {"FunctionDef"}, (paper, name, kinds)
        assert "seqmem.train" not in (REPRO / paper / name).read_text()


@pytest.mark.parametrize("paper", PAPERS)
def test_no_private_mean_std(paper):
    for f in (REPRO / paper).glob("*.py"):
        assert "def _mean_std" not in f.read_text(), f


@pytest.mark.parametrize("paper", PAPERS)
def test_thin_package_init(paper):
    """A paper's ``__init__.py`` only re-exports; the code lives in its modules and the command in ``runner.py``."""
    tree = ast.parse((REPRO / paper / "__init__.py").read_text())
    defs = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assert not defs, (paper, defs)
    assert (REPRO / paper / "runner.py").exists(), paper
    mod = importlib.import_module(f"seqmem.repro.{paper}")
    assert mod.run.__module__ == f"seqmem.repro.{paper}.runner"
    assert all(hasattr(mod, name) for name in mod.__all__), paper
