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


def _run(tmp_path: Path, *args: str) -> tuple[int, list[list[str]], str]:
    log = tmp_path / "calls.jsonl"
    fake = tmp_path / "seqmem"
    fake.write_text("#!/usr/bin/env python3\nimport json, sys\n"
                    f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    fake.chmod(0o755)
    env = {**os.environ, "SEQMEM": str(fake), "JOBS": "2"}
    p = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return p.returncode, calls, p.stderr


def test_calibrations_run_before_headlines_and_every_call_is_a_recorded_packaged_sweep(tmp_path):
    rc, calls, err = _run(tmp_path, "all")
    assert rc == 0, err
    specs = [c[1] for c in calls if c[0] == "sweep"]
    assert specs[:4] == ["echo_calibrate_small", "elastic_calibrate_small", "lattice_calibrate_small",
                         "vort_calibrate_small"]
    assert set(specs[4:]) >= {"vla_capacity", "vla_conv", "vla_copy", "echo_mqar_small", "elastic_sampling_small",
                              "lattice_context_small", "vort_zipf_small"}
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
    assert rc == 0 and [c[1] for c in calls] == ["echo_calibrate_small", "elastic_calibrate_small",
                                                  "lattice_calibrate_small", "vort_calibrate_small"]
    rc, calls, err = _run(tmp_path / "b", "nope")
    assert rc == 2 and "usage" in err and calls == []
