"""README.md keeps its sections, every code block in it runs (Python blocks are executed; every command of a shell
block is parsed by the real command line, and `make` targets exist), and the comparison table is refreshed only
between its markers."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SECTIONS = ["## The answer", "## Quickstart", "## Two commands", "## Use a layer in your model", "## The mechanisms",
            "## Which memory works", "## The demo", "## The mixer contract", "## Command line", "## Reproductions",
            "## Reliability", "## Adding a mixer", "## Layout"]


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), re.S)


def _commands() -> list[str]:
    """Every command line of the README's bash blocks (continuations joined, comments dropped)."""
    out = []
    for block in _blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def test_readme_has_every_section_in_order():
    text = README.read_text()
    pos = [text.find(h) for h in SECTIONS]
    assert -1 not in pos, [h for h, p in zip(SECTIONS, pos) if p == -1]
    assert pos == sorted(pos)


def test_first_screen_answers_what_works_and_runs_a_layer():
    """The answer and a runnable layer come before the installation details."""
    text = README.read_text()
    assert text.find("## The answer") < text.find("## Quickstart") < text.find("## Two commands")
    assert text.find("```python") < text.find("## Two commands")
    answer = text[text.find("## The answer"):text.find("## Quickstart")]
    for paper in ("vla", "echo", "vort", "lattice", "elastic"):
        assert f"docs/results/{paper}/" in answer, paper


@pytest.mark.parametrize("paper", ["vla", "echo", "vort", "lattice", "elastic"])
def test_the_answer_says_what_each_headline_says(paper):
    """Each paper's line in "The answer" carries its headline's word under the verdict rule, and speaks of
    something still pending only while a claim of that headline is (a finished settling run must not stay
    "pending" there)."""
    import json

    text = README.read_text()
    answer = text[text.find("## The answer"):text.find("## Quickstart")]
    bullet = next(b for b in answer.split("\n* ") if f"docs/results/{paper}/" in b)
    rule = json.loads((ROOT / "docs" / "results" / paper / "headline.json").read_text())["rule"]
    word = rule["word"].replace(" at our scale", "")
    assert word in bullet.replace("\n  ", " ").lower(), (paper, word)
    if not any(c.get("pending") for c in rule["claims"]):
        assert "pending" not in bullet.lower(), paper


@pytest.mark.parametrize("i", range(len(_blocks("python"))))
def test_python_blocks_run(i, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    exec(compile(_blocks("python")[i], f"README python block {i}", "exec"), {"__name__": "readme"})


def test_every_shell_command_parses():
    """Each `seqmem` command is accepted by the real parser (a dry run: nothing is trained), each `make` target is
    in the Makefile; the names the README builds by (`power=1`, `normalizer="none"`) are real options."""
    from seqmem.cli import make_parser

    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    commands = _commands()
    assert commands
    for cmd in commands:
        argv = shlex.split(cmd)
        if argv[0] == "make":
            assert argv[1] in targets, cmd
            continue
        assert argv[0] == ".venv/bin/seqmem", cmd
        try:
            make_parser().parse_args(argv[1:])
        except SystemExit as e:
            raise AssertionError(f"README command does not parse: {cmd}") from e


def test_readme_variant_names_build():
    import seqmem

    assert seqmem.build_mixer("ska", d_model=32, n_heads=2, power=1).power == 1
    seqmem.build_mixer("vla", d_model=32, n_heads=2, normalizer="none")
    text = README.read_text()
    assert "`ska-k1` is\n`ska` with `power=1`" in text or "`ska-k1` is `ska` with `power=1`" in text
    assert 'normalizer="none"' in text


def _script():
    spec = importlib.util.spec_from_file_location("readme_compare", ROOT / "scripts" / "readme_compare.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_table_is_the_committed_reports():
    """The comparison table between the markers is what scripts/readme_compare.py makes of the committed report."""
    mod = _script()
    text = README.read_text()
    block = text.split(mod.BEGIN)[1].split(mod.END)[0].strip()
    assert block == mod.table_block((ROOT / "docs" / "results" / "compare" / "report.md").read_text()).strip()
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


EDGE_REPORT = """# x

## Summary: accuracy

| mixer | 4 pairs, d_model 64 | 4 pairs, d_model 128 |
|---|---:|---:|
| `m` | 1.00 ± 0.00 (3) | 0.50 ± 0.10 (3) |
| `n` | 0.90 ± 0.01 (3) | — |

## 4 pairs ({"num_pairs": 4}, T = 32)

Chance: 0.062.

| mixer | d_model | state | params | lr* | accuracy (mean ± std) |
|---|---|---|---|---|---|
| `m` | 64 | 1 | 2 | 0.001 | 1.000 ± 0.000 |
| `m` | 128 | 1 | 2 | 0.03 (edge) | 0.500 ± 0.100 |
| `n` | 64 | 1 | 2 | 0.0003 (edge) | 0.900 ± 0.010 |

Runs finished: 6/6; training time of all 7 finished runs (1 outside the report: seeds of an lr no longer chosen): \
1.25 CPU-hours (one thread each; wall clock: old). Machine: x, 2 cores, torch y; report written z.
"""


def test_edge_markers_and_the_reports_wording_are_carried_over():
    """A cell whose chosen lr the report marks '(edge)' carries 'edge lr'; the hours are worded as the report's."""
    block = _script().table_block(EDGE_REPORT)
    assert "| `m` | 1.00 ± 0.00 (3) | 0.50 ± 0.10 (3, edge lr) |" in block
    assert "| `n` | 0.90 ± 0.01 (3, edge lr) | — |" in block
    assert ("complete — 6 runs; training time of all 7 finished runs (1 outside the report: seeds of an lr no "
            "longer chosen): 1.25 CPU-hours (one thread each; wall clock: old).**") in block
    assert ("`edge lr`: the chosen learning rate, or one tied with it on validation, is the largest or smallest "
            "tried.") in block
    # a report whose summary already marks the cell: kept as it is, never marked twice
    marked = EDGE_REPORT.replace("0.50 ± 0.10 (3) |", "0.50 ± 0.10 (3, edge lr) |")
    assert "| `m` | 1.00 ± 0.00 (3) | 0.50 ± 0.10 (3, edge lr) |" in _script().table_block(marked)


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
