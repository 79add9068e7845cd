"""scripts/headlines.sh: the paper campaigns in order, each a packaged sweep spec recorded in its paper's
headline.json; checked with a stand-in for seqmem that logs its arguments (nothing is trained)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from seqmem.sweep import list_packaged_specs

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "headlines.sh"
CALIBRATIONS = ["vla_calibrate", "echo_calibrate_small", "elastic_calibrate_small", "elastic_calibrate_drift",
                "lattice_calibrate_small", "vort_calibrate_small", "vort_calibrate_rope", "vort_calibrate_tiny",
                "vort_calibrate_tiny_wide", "vort_calibrate_tiny_wide_long"]


def _run(tmp_path: Path, *args: str, force: bool = True) -> tuple[int, list[list[str]], str]:
    log = tmp_path / "calls.jsonl"
    fake = tmp_path / "seqmem"
    fake.write_text("#!/usr/bin/env python3\nimport json, sys\n"
                    f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    fake.chmod(0o755)
    env = {**os.environ, "SEQMEM": str(fake), "JOBS": "2", "FORCE": "1" if force else "0"}
    p = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return p.returncode, calls, p.stderr + p.stdout


def test_calibrations_run_before_headlines_and_every_call_is_a_recorded_packaged_sweep(tmp_path):
    rc, calls, err = _run(tmp_path, "all")
    assert rc == 0, err
    specs = [c[1] for c in calls if c[0] == "sweep"]
    assert specs[:len(CALIBRATIONS)] == CALIBRATIONS
    assert set(specs[len(CALIBRATIONS):]) >= {"vla_capacity", "vla_conv", "vla_copy", "echo_mqar_small",
                                              "elastic_sampling_small", "lattice_context_small", "vort_zipf_tiny",
                                              "echo_mqar_long"}
    packaged = set(list_packaged_specs())
    repro = [c for c in calls if c[0] == "repro"]
    assert repro == [["repro", "echo", "--scale", "paper", "--seeds", "3", "--no-mqar", "--out",
                      "docs/results/echo/transfer_paper"]]
    for c in calls:
        if c[0] == "repro":
            continue
        assert c[0] == "sweep" and c[1] in packaged
        opt = {c[i]: c[i + 1] for i in range(2, len(c) - 1) if c[i].startswith("--")}
        paper = Path(opt["--headline"]).parent
        assert (ROOT / opt["--headline"]).is_file() and opt["--headline"].endswith("headline.json")
        assert Path(opt["--out"]).parent == Path(opt["--report-dir"]) and Path(opt["--report-dir"]).parent == paper
        assert opt["--jobs"] == "2"
        if "--reuse" in opt:  # a headline reuses its own paper's calibration
            assert Path(opt["--reuse"]).parts[:3] == paper.parts[:3]


def test_phases_and_bad_phase(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    rc, calls, _ = _run(tmp_path / "a", "calibrate")
    assert rc == 0 and [c[1] for c in calls] == CALIBRATIONS
    rc, calls, err = _run(tmp_path / "b", "nope")
    assert rc == 2 and "usage" in err and calls == []
    (tmp_path / "c").mkdir()
    rc, calls, err = _run(tmp_path / "c", "long")  # the lane of its own: VORT's grid, reusing its calibration
    assert rc == 0, err
    assert [c[:2] for c in calls] == [["sweep", "vort_zipf_tiny"], ["sweep", "vort_zipf_tiny_beta"]]
    assert calls[0][calls[0].index("--reuse") + 1] == "docs/results/vort/calibrate_tiny_wide_long/runs"
    (tmp_path / "d").mkdir()
    # a second worker on VORT's grid (runs are locked) after Echo's transfer suite, before the second answers of
    # papers that have one (Echo's longer gap, the rest of VLA's capacity curve)
    rc, calls, err = _run(tmp_path / "d", "headline")
    assert rc == 0, err
    names = [c[1] for c in calls]
    assert names.count("vort_zipf_tiny") == 1 and names.count("vort_zipf_tiny_beta") == 1
    assert names.index("echo") < names.index("vort_zipf_tiny") < names.index("echo_mqar_long") \
        < names.index("vla_capacity")
    assert names[-1] == "vla_capacity"


def test_a_headline_waits_for_its_papers_calibration(tmp_path):
    """Without FORCE a paper's headline sweeps run only when its headline.json records the calibration as passed
    (calibration.calibrated starting with "yes"); the others are skipped with a message naming the paper."""
    (tmp_path / "h").mkdir()
    (tmp_path / "l").mkdir()
    rc, calls, out = _run(tmp_path / "h", "headline", force=False)
    rc_long, calls_long, out_long = _run(tmp_path / "l", "long", force=False)
    assert rc == 0 and rc_long == 0
    out += out_long
    ran = {c[1] for c in calls + calls_long if c[0] == "sweep"}
    headline_specs = {"vla": {"vla_conv", "vla_capacity", "vla_copy"}, "echo": {"echo_mqar_small"},
                      "elastic": {"elastic_sampling_small"}, "lattice": {"lattice_context_small"},
                      "vort": {"vort_zipf_tiny"}}
    for paper, specs in headline_specs.items():
        cal = json.loads((ROOT / "docs" / "results" / paper / "headline.json").read_text()).get("calibration") or {}
        passed = str(cal.get("calibrated", "")).lower().startswith("yes")
        assert (specs <= ran) if passed else not (specs & ran), paper
        assert passed or f"{paper} is not calibrated yet" in out
