"""scripts/gpu_check.sh and scripts/gpu_bench.py, checked without a GPU: the shell script parses and refuses a
Python without CUDA; the table script runs its benchmark loop on the CPU (tiny sizes, a trial of the script, no
GPU number), keeps to its budget and writes the page; the committed page is either the not-run page or a real run's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "scripts" / "gpu_bench.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *args], env=ENV, capture_output=True, text=True, timeout=300)


def test_check_script_parses_and_needs_cuda():
    assert subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu_check.sh")]).returncode == 0
    if torch.cuda.is_available():
        return
    p = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], env={**ENV, "PYTHON": sys.executable},
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "no CUDA torch" in p.stderr


def test_bench_loop_and_page_on_the_cpu(tmp_path):
    js, md = tmp_path / "gpu.json", tmp_path / "gpu.md"
    p = _bench("--budget", "60", "--json", str(js), "--device", "cpu", "--d-model", "16", "--heads", "2",
               "--lengths", "16", "--mixers", "deltanet,attention", "--repeats", "1")
    assert p.returncode == 0, p.stderr
    data = json.loads(js.read_text())
    # attention first; the baseline on PyTorch and with the kernel backends on (on the CPU both run PyTorch)
    assert [r["mixer"] for r in data["records"]] == ["attention", "deltanet", "deltanet[fla]"]
    assert all(r["status"] == "ok" and r["form"] for r in data["records"]) and data["not_reached"] == []
    stages = tmp_path / "stages.tsv"
    stages.write_text("contract\t0\t12\t5 passed in 1.0s\n")
    assert _bench("--write-md", str(md), "--json", str(js), "--stages", str(stages)).returncode == 0
    text = md.read_text()
    assert "| contract | 0 | 12 | 5 passed in 1.0s |" in text and "| deltanet[fla] |" in text
    assert "a trial of the script, no GPU number" in text
    p = _bench("--budget", "0", "--json", str(js), "--device", "cpu", "--mixers", "attention")
    assert p.returncode == 0 and json.loads(js.read_text())["not_reached"] == ["attention"]


def test_committed_page_is_the_not_run_page_or_a_gpu_run(tmp_path):
    page = (ROOT / "docs" / "results" / "bench" / "gpu.md").read_text()
    if "Not run yet" in page:
        assert _bench("--write-md", str(tmp_path / "gpu.md"), "--not-run").returncode == 0
        assert page == (tmp_path / "gpu.md").read_text()
        assert not any(ch.isdigit() for ch in page.split("\n", 2)[2].replace("gpu_check", ""))
    else:
        assert "Card: " in page and "| layer |" in page and "trial of the script" not in page
