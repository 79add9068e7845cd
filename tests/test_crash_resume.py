"""Crash safety: SIGKILL a training run mid-way, resume it, and get the same metrics as an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

ARGS = ["train", "--task", "mqar", "--mixer", "gated_deltanet", "--layers", "1", "--d-model", "16", "--heads", "2",
        "--steps", "400", "--batch-size", "8", "--vocab", "32", "--num-pairs", "2", "--seq-len", "16",
        "--eval-examples", "16", "--log-every", "5", "--checkpoint-every", "20", "--no-progress"]


def _run(out, *extra, **kw):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "seqmem", *ARGS, "--out", str(out), *extra], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def _metrics(path):
    rows = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in rows]


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_sigkill_then_resume_is_bit_identical(tmp_path):
    ref = _run(tmp_path / "ref")
    victim = _run(tmp_path / "victim")
    ckpts = tmp_path / "victim" / "checkpoints"
    deadline = time.time() + 120
    while time.time() < deadline:  # wait until at least two checkpoints exist, then kill without warning
        if ckpts.exists() and len([p for p in ckpts.iterdir() if p.name.startswith("ckpt-")]) >= 2:
            break
        time.sleep(0.05)
    else:
        pytest.fail("victim run wrote no checkpoints in time")
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL
    resumed = _run(tmp_path / "victim", "--resume")
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read().decode()
    assert ref.wait(timeout=300) == 0, ref.stderr.read().decode()
    assert _metrics(tmp_path / "victim") == _metrics(tmp_path / "ref")
