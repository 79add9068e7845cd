"""README.md keeps its sections, and the comparison table is refreshed only between its markers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = ["## Two commands", "## Which memory works", "## The demo", "## The mixer contract", "## Command line",
            "## Reproductions", "## Reliability", "## Adding a mixer", "## Layout"]


def _script():
    spec = importlib.util.spec_from_file_location("readme_compare", ROOT / "scripts" / "readme_compare.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_has_every_section_in_order():
    text = (ROOT / "README.md").read_text()
    pos = [text.find(h) for h in SECTIONS]
    assert -1 not in pos, [h for h, p in zip(SECTIONS, pos) if p == -1]
    assert pos == sorted(pos)


REPORT = """# x

## Summary: accuracy

| mixer | a |
|---|---|
| `m` | 1.00 |

Runs finished: 3/5; training time of the finished runs: 0.10 CPU-hours
"""


def test_refresh_replaces_only_between_markers(tmp_path):
    mod = _script()
    readme = tmp_path / "README.md"
    report = tmp_path / "report.md"
    report.write_text(REPORT)
    readme.write_text(f"# top\n\n{mod.BEGIN}\nold\n{mod.END}\n\n## After\nkept\n")
    assert mod.main(["--readme", str(readme), "--report", str(report)]) == 0
    text = readme.read_text()
    assert "old" not in text and "| `m` | 1.00 |" in text and "3 of 5 runs" in text
    assert text.startswith("# top\n") and text.endswith("## After\nkept\n")


@pytest.mark.parametrize(
    "body", ["no markers at all\n## After\n", "<!-- compare-table:end --> x <!-- compare-table:begin -->"]
)
def test_refresh_refuses_without_markers_and_leaves_readme_alone(tmp_path, body, capsys):
    mod = _script()
    readme = tmp_path / "README.md"
    report = tmp_path / "report.md"
    report.write_text(REPORT)
    readme.write_text(body)
    assert mod.main(["--readme", str(readme), "--report", str(report)]) == 2
    assert readme.read_text() == body
    assert "compare-table" in capsys.readouterr().err
