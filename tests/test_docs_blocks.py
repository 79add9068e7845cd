"""Every Python block of docs/*.md (not docs/results/) runs on its own, as a reader pastes it: each in a fresh
namespace, with an empty temporary directory as the working directory, on the CPU.  A block whose fence is preceded
by the line `<!-- not run: REASON -->` is skipped (it needs what a test cannot have here: a download, a GPU)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))  # not docs/results/**
_BLOCK = re.compile(r"^(?:<!-- not run: ([^\n]*?) -->\n)?```python\n(.*?)^```", re.S | re.M)


def _blocks(doc: Path) -> list[tuple[str, str | None]]:
    """The page's Python blocks as ``(code, reason)``: ``reason`` is the `not run` comment's, else ``None``."""
    return [(m[2], m[1]) for m in _BLOCK.finditer(doc.read_text())]


CASES = [pytest.param(doc, i, id=f"{doc.name}-block{i}") for doc in DOCS for i in range(len(_blocks(doc)))]


def test_blocks_are_found():
    assert len(CASES) >= 20
    for doc in DOCS:
        text = doc.read_text()
        assert text.count("```python\n") == len(_blocks(doc)), doc.name  # every block is collected
        reasons = [reason for _, reason in _blocks(doc) if reason is not None]
        assert text.count("<!-- not run:") == len(reasons), f"{doc.name}: a `not run` comment not before a block"
        assert all(r.strip() for r in reasons), f"{doc.name}: a `not run` comment without a reason"


@pytest.mark.parametrize("doc, i", CASES)
def test_python_block_runs(doc, i, monkeypatch, tmp_path):
    code, reason = _blocks(doc)[i]
    if reason is not None:
        pytest.skip(f"not run: {reason}")
    if "transformers" in code or "seqmem.hf" in code:
        pytest.importorskip("transformers")
    from seqmem.backends import use_backends

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    backends = use_backends(None)  # a block may choose backends: put the setting back afterwards
    use_backends(backends)
    try:
        exec(compile(code, f"docs/{doc.name} python block {i}", "exec"), {"__name__": "docs"})
    finally:
        use_backends(backends)
