"""The committed headline records say what the committed runs give: every ``ours[<spec>]`` entry of every
``docs/results/<paper>/headline.json`` equals the summary of its sweep's run records under the current spec
(``scripts/refresh_reports.py`` rewrites them; run it before committing results)."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEADLINES = sorted((ROOT / "docs" / "results").glob("*/headline.json"))


def _script():
    spec = importlib.util.spec_from_file_location("refresh_reports", ROOT / "scripts" / "refresh_reports.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("headline", HEADLINES, ids=[h.parent.name for h in HEADLINES])
def test_committed_headline_entries_match_their_runs(headline, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert json.loads(headline.read_text()).get("ours"), headline
    stale = _script().stale_entries(headline.relative_to(ROOT))
    assert stale == [], (f"{headline.relative_to(ROOT)}: ours entries {stale} differ from their runs; run "
                         "`.venv/bin/python scripts/refresh_reports.py` and commit the reports")


def test_a_stale_entry_is_found_and_refreshed(tmp_path, monkeypatch, capsys):
    """An entry whose numbers differ from its runs is reported by --check (exit 1) and rewritten by a refresh."""
    mod = _script()
    src = ROOT / "docs" / "results" / "echo" / "calibrate_long"
    dst = tmp_path / "docs" / "results" / "echo" / "calibrate_long"
    shutil.copytree(src / "runs", dst / "runs", ignore=shutil.ignore_patterns("checkpoints", ".lock"))
    shutil.copy(src / "report.json", dst / "report.json")  # the command line the refreshed report keeps
    recorded = json.loads((ROOT / "docs" / "results" / "echo" / "headline.json").read_text())
    entry = recorded["ours"]["echo_calibrate_long"]
    good = json.loads(json.dumps(entry))
    cell = entry["settings"]["M=4 gap=256"]["mamba2+attention"]
    cell["mean"] = 0.5  # a number no run gives
    headline = tmp_path / "docs" / "results" / "echo" / "headline.json"
    headline.write_text(json.dumps({"verdict": "kept", "ours": {"echo_calibrate_long": entry}}))
    monkeypatch.chdir(tmp_path)
    rel = Path("docs/results/echo/headline.json")
    assert mod.stale_entries(rel) == ["echo_calibrate_long"]
    assert mod.main(["--check", str(rel)]) == 1 and "stale: docs/results/echo/headline.json: echo_calibrate_long" \
        in capsys.readouterr().out
    assert mod.main([str(rel)]) == 0
    data = json.loads(headline.read_text())
    assert data["verdict"] == "kept" and data["ours"]["echo_calibrate_long"] == good
    assert mod.main(["--check", str(rel)]) == 0 and (dst / "report.md").is_file()


def test_a_refresh_keeps_a_report_whose_runs_did_not_change(tmp_path, monkeypatch):
    """Rewriting a report from unchanged runs changes only its date: the file is kept as it was (no churn)."""
    mod = _script()
    src = ROOT / "docs" / "results" / "echo" / "calibrate_long"
    dst = tmp_path / "docs" / "results" / "echo" / "calibrate_long"
    shutil.copytree(src / "runs", dst / "runs", ignore=shutil.ignore_patterns("checkpoints", ".lock"))
    shutil.copy(src / "report.json", dst / "report.json")
    recorded = json.loads((ROOT / "docs" / "results" / "echo" / "headline.json").read_text())
    headline = tmp_path / "docs" / "results" / "echo" / "headline.json"
    headline.write_text(json.dumps({"ours": {"echo_calibrate_long": recorded["ours"]["echo_calibrate_long"]}}))
    monkeypatch.chdir(tmp_path)
    rel = Path("docs/results/echo/headline.json")
    assert mod.main([str(rel)]) == 0
    md = dst / "report.md"
    old = re.sub(r"report written \d{4}-\d\d-\d\d \d\d:\d\d", "report written 1999-01-01 00:00", md.read_text())
    assert old != md.read_text()
    md.write_text(old)
    assert mod.main([str(rel)]) == 0
    assert md.read_text() == old  # same runs: the old file, date and all
    shutil.rmtree(next((dst / "runs").rglob("result.json")).parent)  # a run gone: the report changes
    assert mod.main([str(rel)]) == 0 and md.read_text() != old
