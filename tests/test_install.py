"""A plain ``pip install .`` (no extras) must be enough to import every mixer module and build every mixer.

scipy, transformers, pytest and hypothesis come only with the ``dev`` / ``hf`` extras, so a child process makes
them unimportable (``sys.modules[name] = None``) before importing seqmem, then imports every module under
``seqmem.mixers`` and ``seqmem.ops``, builds and runs every registered mixer, and runs ``seqmem list``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

EXTRAS_ONLY = ("scipy", "transformers", "hypothesis", "pytest", "datasets", "matplotlib")

_CHILD = textwrap.dedent(
    """
    import sys
    for name in {blocked!r}:
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[mod]
        sys.modules[name] = None          # `import name` now raises ImportError

    import importlib, pkgutil
    import torch
    import seqmem, seqmem.mixers, seqmem.ops

    for pkg in (seqmem.mixers, seqmem.ops):
        for mod in pkgutil.iter_modules(pkg.__path__):
            importlib.import_module(pkg.__name__ + "." + mod.name)

    names = seqmem.list_mixers()
    assert len(names) >= 20, names
    torch.manual_seed(0)
    x = torch.randn(1, 8, 32)
    for name in names:
        m = seqmem.build_mixer(name, 32, n_heads=2)
        y, _ = m(x)
        assert y.shape == x.shape, name

    from seqmem.cli import main
    assert main(["list", "--d-model", "32", "--heads", "2", "--context", "64"]) == 0
    for name in {blocked!r}:
        assert sys.modules.get(name) is None, name + " was imported"
    print("OK", len(names))
    """
)


def test_plain_install_needs_no_extras():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", _CHILD.format(blocked=EXTRAS_ONLY)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    assert "OK" in out.stdout



def test_every_packaged_file_is_in_the_package_data():
    """A non-editable install ships only what ``[tool.setuptools.package-data]`` names besides modules: every data
    file under ``src/seqmem`` (sweep specs, C++ sources) must match one of its patterns, or ``seqmem sweep NAME``
    finds the spec in a clone and not in an installed package."""
    import fnmatch
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["seqmem"]
    pkg = root / "src" / "seqmem"
    data = [p.relative_to(pkg).as_posix() for p in pkg.rglob("*") if p.is_file()
            and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    assert any(d.startswith("experiments/") for d in data)  # the walk sees the specs
    missing = [d for d in data if not any(fnmatch.fnmatch(d, pat) for pat in patterns)]
    assert not missing, f"data files a non-editable install would leave out: {missing}"
