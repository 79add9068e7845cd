"""`make compare` on a fresh clone leaves `git status` clean: the committed comparison's runs give its committed
report (report.md, report.json, plot), written by the command `make compare` runs, up to the date and the writing
machine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMPARE = ROOT / "docs" / "results" / "compare"


def test_committed_compare_report_regenerates_identically(tmp_path, monkeypatch):
    from seqmem.sweep import load_spec
    from seqmem.sweep.report import write_report

    for f in ("report.md", "report.json", "accuracy_vs_state.png"):
        shutil.copy(COMPARE / f, tmp_path / f)
    before = {f.name: f.read_bytes() for f in tmp_path.iterdir()}
    monkeypatch.chdir(ROOT)
    spec = load_spec("compare")
    committed = json.loads((COMPARE / "report.json").read_text())
    payload = write_report(spec, Path("docs/results/compare/runs"), tmp_path, command=committed["command"])
    after = {f.name: f.read_bytes() for f in tmp_path.iterdir()}
    assert after == before, "a regenerated comparison report differs from the committed one: run `make compare` " \
                            "and commit docs/results/compare"
    assert committed["source"] == "seqmem/experiments/compare.toml"  # no path of the machine that wrote it
    assert abs(payload["cpu_hours"] - committed["cpu_hours"]) < 1e-9


def test_makefile_compare_command_is_the_recorded_one():
    """The report records the command that ran the sweep; `make compare` runs exactly it (so the file stays)."""
    committed = json.loads((COMPARE / "report.json").read_text())["command"]
    make = (ROOT / "Makefile").read_text()
    assert committed.replace("seqmem sweep", ".venv/bin/seqmem sweep") in make
