"""Every Python snippet of README.md's "Use a layer in your model" section and of docs/use-a-layer.md runs as
written (each document's blocks in order, in one namespace, as a reader pastes them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _readme_section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Use a layer in your model")
    end = text.index("\n## ", start + 3)
    return text[start:end]


def _blocks(text: str) -> list[str]:
    return _BLOCK.findall(text)


def _run(blocks: list[str], where: str) -> None:
    assert blocks, f"no python blocks in {where}"
    ns: dict = {"__name__": "__snippet__"}
    for i, code in enumerate(blocks):
        try:
            exec(compile(code, f"{where} block {i + 1}", "exec"), ns)
        except Exception as e:  # noqa: BLE001
            raise AssertionError(f"{where} block {i + 1} failed: {type(e).__name__}: {e}\n{code}") from e


def test_readme_section_snippets_run():
    section = _readme_section()
    assert len(section.splitlines()) <= 26  # a short section; the details live in docs/use-a-layer.md
    assert "docs/use-a-layer.md" in section
    _run(_blocks(section), "README 'Use a layer in your model'")


def test_use_a_layer_doc_snippets_run(capsys):
    pytest.importorskip("transformers")
    blocks = _blocks((ROOT / "docs" / "use-a-layer.md").read_text())
    assert len(blocks) >= 8
    _run(blocks, "docs/use-a-layer.md")
    out = capsys.readouterr().out
    assert "caught: output" in out  # the swapped-gates kernel was caught
    assert "unexpected keyword argument" in out
