"""scripts/pack_runs.py: the runs changed since a marker are packed for the trip between machines — finished runs
without checkpoints, unfinished ones with their newest good checkpoint only — in parts of bounded size, and unpack
where they came from."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from conftest import fake_run_dir

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "pack_runs.py"


def _run_dir(root: Path, name: str, steps: list[int], finished: bool) -> Path:
    return fake_run_dir(root / "runs" / name, steps, finished, width=64, metrics=True)


def _pack(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_changed_runs_are_packed_finished_bare_and_unfinished_with_their_newest_checkpoint(tmp_path):
    old = _run_dir(tmp_path, "old", [1], finished=True)
    past = time.time() - 100
    for f in old.rglob("*"):
        os.utime(f, (past, past))
    marker = tmp_path / "marker"
    marker.write_text("")
    os.utime(marker, (past + 50, past + 50))
    _run_dir(tmp_path, "done", [1, 2], finished=True)
    _run_dir(tmp_path, "partial", [1, 2], finished=False)
    r = _pack(tmp_path, "marker", "out", "runs")
    assert r.returncode == 0, r.stderr
    assert "packed 2 changed run(s) (1 finished) into 1 part(s)" in r.stdout
    (part,) = sorted((tmp_path / "out").glob("runs-*.tar"))
    names = set(tarfile.open(part).getnames())
    assert "runs/done/result.json" in names and not any(n.startswith("runs/old") for n in names)
    assert not any("done/checkpoints" in n for n in names)
    partial_ckpts = {n.split("/")[3] for n in names if n.startswith("runs/partial/checkpoints/")}
    assert partial_ckpts == {"ckpt-00000002"}
    assert {"runs/partial/run.json", "runs/partial/metrics.jsonl"} <= names
    back = tmp_path / "back"
    back.mkdir()
    with tarfile.open(part) as t:
        t.extractall(back, filter="data")
    from seqmem.train.checkpoint import latest_good_checkpoint

    assert latest_good_checkpoint(back / "runs/partial/checkpoints").name == "ckpt-00000002"


def test_parts_are_bounded_and_what_does_not_fit_is_named(tmp_path):
    marker = tmp_path / "marker"
    marker.write_text("")
    os.utime(marker, (time.time() - 100,) * 2)
    for i in range(3):
        _run_dir(tmp_path, f"p{i}", [1], finished=False)  # ~ 17 KB of checkpoint each
    r = _pack(tmp_path, "marker", "out", "runs", "--part-mib", "0.03", "--max-parts", "2")
    assert r.returncode == 0, r.stderr
    parts = sorted((tmp_path / "out").glob("runs-*.tar"))
    assert len(parts) == 2 and all(p.stat().st_size <= 0.03 * 2**20 + 10240 for p in parts)
    assert r.stderr.count("left out") == 1
    assert _pack(tmp_path, "nope", "out", "runs").returncode == 2
