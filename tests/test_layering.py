"""Data flows one way: ops ← mixers ← models ← train ← sweep ← repro/bench ← cli.  Checked on the import
statements of every module (module-level and function-level)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "seqmem"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return {m for m in out if m == "seqmem" or m.startswith("seqmem.")}


MODULES = sorted(p for p in SRC.rglob("*.py"))

# package (or module) -> seqmem packages it must not import
FORBIDDEN = {
    "ops": ("seqmem.mixers", "seqmem.models", "seqmem.train", "seqmem.sweep", "seqmem.repro", "seqmem.bench",
            "seqmem.cli", "seqmem.tasks"),
    "mixers": ("seqmem.models", "seqmem.train", "seqmem.sweep", "seqmem.repro", "seqmem.bench", "seqmem.cli"),
    "models": ("seqmem.train", "seqmem.sweep", "seqmem.repro", "seqmem.bench", "seqmem.cli"),
    "tasks": ("seqmem.train", "seqmem.sweep", "seqmem.repro", "seqmem.bench", "seqmem.cli"),
    "train": ("seqmem.sweep", "seqmem.repro", "seqmem.bench", "seqmem.cli"),
    "sweep": ("seqmem.repro", "seqmem.bench", "seqmem.cli"),
    "io.py": ("seqmem.",),
}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_imports_flow_one_way(path: Path):
    rel = path.relative_to(SRC)
    key = rel.parts[0]
    imports = _imports(path)
    for bad in FORBIDDEN.get(key, ()):
        hits = sorted(m for m in imports if m == bad.rstrip(".") or m.startswith(bad if bad.endswith(".") else
                                                                                    bad + ".") or m == bad)
        assert not hits, f"{rel} imports {hits}: against the one-way data flow"
    # nothing but the command line's entry points imports seqmem.cli
    if rel.as_posix() not in ("cli.py", "__main__.py"):
        assert "seqmem.cli" not in imports, f"{rel} imports seqmem.cli (use seqmem.cliargs)"
