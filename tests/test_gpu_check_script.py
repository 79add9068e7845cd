"""scripts/gpu_check.sh and scripts/gpu_bench.py, checked without a GPU: the shell script parses, refuses a Python
without CUDA, plans time boxes that fit its budget, and — with a stand-in for a CUDA Python that fakes pytest — runs
its stages end to end, names failed tests, survives a stage cut at its box and a signal, and leaves its files under
$OUT; the table script runs its benchmark loop on the CPU (tiny sizes, a trial of the script, no GPU number), warms
each row up before timing it, keeps to its budget, says what it never reached, and writes the page from a truncated
JSON, a tree without git, a missing numpy; the committed page is either the not-run page or a real run's."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "scripts" / "gpu_bench.py"
CHECK = ROOT / "scripts" / "gpu_check.sh"
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}


def _bench(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH), *args], env=env or ENV, capture_output=True, text=True,
                          timeout=300)


def _load_bench():
    spec = importlib.util.spec_from_file_location("gpu_bench_under_test", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_check_script_parses_and_needs_cuda():
    assert subprocess.run(["bash", "-n", str(CHECK)]).returncode == 0
    if torch.cuda.is_available():
        return
    page = (ROOT / "docs" / "results" / "bench" / "gpu.md").read_text()
    p = subprocess.run(["bash", str(CHECK)], env={**ENV, "PYTHON": sys.executable},
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "no CUDA torch" in p.stderr
    assert (ROOT / "docs" / "results" / "bench" / "gpu.md").read_text() == page  # left alone: no run started


def _plan(budget: int) -> list[tuple[str, int | None, int]]:
    p = subprocess.run(["bash", str(CHECK), str(budget)], env={**ENV, "GPU_CHECK_DRY": "1"}, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    rows = re.findall(r"^(\w+)\s+(\d+|not run)\s+(\d+)$", p.stdout, re.M)
    return [(n, None if b == "not run" else int(b), int(e)) for n, b, e in rows]


@pytest.mark.parametrize("budget", [470, 600, 300, 200, 120, 60])
def test_dry_run_boxes_fit_the_budget(budget):
    plan = _plan(budget)
    assert [n for n, _, _ in plan] == ["setup", "triton", "contract", "kernels", "bench", "table"]
    # the worst case (every stage its whole box + its 10 s kill-after) ends within the budget
    assert plan[-1][2] <= budget and all(b is None or b >= 10 for _, b, _ in plan)
    assert sum(b + 10 for n, b, _ in plan[1:-1] if b is not None) + 30 + 30 <= budget
    if budget == 470:  # the documented boxes
        assert [(n, b) for n, b, _ in plan] == [("setup", 30), ("triton", 80), ("contract", 100),
                                                ("kernels", 110), ("bench", 80), ("table", 30)]


# ---------------------------------------------------------------------------------------------- end to end, faked
FAKE_PY = """#!/usr/bin/env bash
# a stand-in for a CUDA Python: CUDA "available", pytest faked (one pass, one failure; the triton stage sleeps for
# $FAKE_SLEEP first), no xdist; everything else on the real Python
case "$*" in
  *"torch.cuda.is_available()"*) exit 0 ;;
  *"-n 2"*) exit 1 ;;
  "-m pytest"*)
    echo "tests/ops/test_a.py::test_x PASSED"
    echo "[gw0] [ 50%] FAILED tests/test_contract.py::test_y[deltanet]"
    case "$*" in *triton*) sleep "${FAKE_SLEEP:-0}" ;; esac
    echo "FAILED tests/test_contract.py::test_y[deltanet] - AssertionError: 1e-3 > 2e-4"
    echo "==== 1 failed, 1 passed in 0.5s ===="
    exit 1 ;;
esac
exec "@PYTHON@" "$@"
"""


def _fake_env(tmp_path: Path, **extra: str) -> dict:
    fake = tmp_path / "fakepy"
    fake.write_text(FAKE_PY.replace("@PYTHON@", sys.executable))
    fake.chmod(0o755)
    (tmp_path / "whl").mkdir()
    (tmp_path / "out").mkdir()
    return {**ENV, "PYTHON": str(fake), "OUT": str(tmp_path / "out"), "GPU_CHECK_WHEELS": str(tmp_path / "whl"),
            "GPU_CHECK_SITE": str(tmp_path / "site"), "GPU_CHECK_RESULTS": str(tmp_path / "res"),
            "GPU_CHECK_BENCH_ARGS": "--device cpu --d-model 16 --heads 2 --lengths 16 --mixers attention,deltanet "
                                    "--repeats 1 --max-seconds 2", **extra}


def _stages(out: Path) -> dict[str, list[str]]:
    return {ln.split("\t")[0]: ln.split("\t")[1:] for ln in (out / "stages.tsv").read_text().splitlines()}


def test_check_end_to_end_with_a_stand_in_python(tmp_path):
    """Budget 150: the triton box is 10 s and its stand-in sleeps 60 s, so that stage is cut (SIGINT, -v's line
    still names its failure); the others run; the bench runs for real on the CPU; 8 files come back in $OUT."""
    env = _fake_env(tmp_path, FAKE_SLEEP="60")
    p = subprocess.run(["bash", str(CHECK), "150"], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    out = tmp_path / "out"
    assert sorted(f.name for f in out.iterdir()) == sorted(
        ["triton.log", "contract.log", "kernels.log", "bench.log", "versions.txt", "stages.tsv", "gpu.json",
         "gpu.md"])  # the device tool brings back 8 files at most
    st = _stages(out)
    assert list(st) == ["setup", "triton", "contract", "kernels", "bench"]
    assert st["triton"][0] == "124" and st["triton"][2].startswith("cut at the 10 s time box")
    assert st["contract"] == ["1", st["contract"][1], "1 failed, 1 passed in 0.5s"]
    assert st["bench"][0] == "0" and st["bench"][2] == "bench: 3 of 3 rows done"
    page = (out / "gpu.md").read_text()
    assert page == (tmp_path / "res" / "gpu.md").read_text()
    assert "Failed tests (3):" in page and "* `triton: FAILED tests/test_contract.py::test_y[deltanet]`" in page
    assert "* `contract: FAILED tests/test_contract.py::test_y[deltanet] - AssertionError: 1e-3 > 2e-4`" in page
    assert "| attention |" in page and "| deltanet |" in page and "| deltanet[fla] | not installed |" in page
    versions = (out / "versions.txt").read_text()
    assert re.search(r"^numpy\t\d", versions, re.M) and re.search(r"^fla\t", versions, re.M)
    assert "fla_error\t" in versions or re.search(r"^fla\t\d", versions, re.M)
    data = json.loads((out / "gpu.json").read_text())
    assert data["not_reached"] == [] and set(data["warmup_s"]) == {"attention", "deltanet"}


def test_check_writes_its_page_when_stopped_by_a_signal(tmp_path):
    env = _fake_env(tmp_path, FAKE_SLEEP="120")
    p = subprocess.Popen(["bash", str(CHECK), "470"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    seen = ""
    deadline = time.monotonic() + 180
    while "== triton" not in seen and time.monotonic() < deadline:
        seen += p.stdout.readline()
    assert "== triton" in seen, seen
    time.sleep(2)
    p.send_signal(signal.SIGTERM)
    rest, _ = p.communicate(timeout=60)
    assert p.returncode == 143, seen + rest
    out = tmp_path / "out"
    st = _stages(out)
    assert st["triton"][0] == "signal" and "got a signal" in st["triton"][2]
    page = (out / "gpu.md").read_text()
    assert "| triton | signal |" in page and "triton: FAILED tests/test_contract.py::test_y[deltanet]" in page
    assert "Not measured in this run" in page and not (out / "gpu.json").exists()


# ---------------------------------------------------------------------------------------------- the bench loop
def test_bench_loop_and_page_on_the_cpu(tmp_path):
    js, md = tmp_path / "gpu.json", tmp_path / "gpu.md"
    p = _bench("--budget", "60", "--json", str(js), "--device", "cpu", "--d-model", "16", "--heads", "2",
               "--lengths", "16", "--mixers", "deltanet,attention", "--repeats", "1")
    assert p.returncode == 0, p.stderr
    data = json.loads(js.read_text())
    # attention first; the baseline on PyTorch; its kernel row is not measured again where no kernel would run
    assert [r["mixer"] for r in data["records"]] == ["attention", "deltanet", "deltanet[fla]"]
    assert all(r["status"] == "ok" and r["form"] for r in data["records"][:2]) and data["not_reached"] == []
    assert data["records"][2]["status"] in ("not installed", "no kernel")  # which_form: pytorch on the CPU
    assert set(data["warmup_s"]) == {"attention", "deltanet"}
    # each measured row profiled once at the middle length: its operators' own time, the largest first
    assert set(data["profiles"]) == {"attention", "deltanet"}
    prof = data["profiles"]["deltanet"]
    assert prof["seq_len"] == 16 and prof["launches"] >= len(prof["top"]) > 0 and prof["total_ms"] > 0
    assert [k["ms"] for k in prof["top"]] == sorted((k["ms"] for k in prof["top"]), reverse=True)
    assert "a trial, no GPU number" in prof["what"]
    # the decode pass: attention and deltanet at 1k and 4k, one token per step, the state flat for deltanet
    dec = {(r["mixer"], r["seq_len"]): r for r in data["decode"]}
    assert set(dec) == {(m, n) for m in ("attention", "deltanet") for n in (1024, 4096)}
    assert all(r["status"] == "ok" and r["median_ms"] > 0 for r in dec.values())
    assert dec[("deltanet", 1024)]["state_bytes"] == dec[("deltanet", 4096)]["state_bytes"]
    assert dec[("attention", 4096)]["state_bytes"] > dec[("attention", 1024)]["state_bytes"]
    stages = tmp_path / "stages.tsv"
    stages.write_text("contract\t0\t12\t5 passed in 1.0s\n")
    assert _bench("--write-md", str(md), "--json", str(js), "--stages", str(stages)).returncode == 0
    text = md.read_text()
    assert "| contract | 0 | 12 | 5 passed in 1.0s |" in text and "| deltanet[fla] |" in text
    assert "a trial of the script, no GPU number" in text
    assert "Decode, one token per step" in text and re.search(r"\| deltanet \| [0-9.]+ \| [0-9.]+ \| ", text)
    assert "Where the time goes: torch.profiler" in text and re.search(r"\| deltanet \| 16 \| [0-9.]+ \| ", text)
    # the syncs pass: each measured layer's host reads (on the CPU: tensor value reads) in a forward+backward
    assert set(data["syncs"]) == {"attention", "deltanet"} and data["syncs"]["attention"]["total"] == 0
    assert data["syncs"]["attention"]["decode_total"] == 0  # its position is known on the host
    assert "Waits for the device in one forward+backward" in text
    p = _bench("--budget", "0", "--json", str(js), "--device", "cpu", "--mixers", "attention")
    assert p.returncode == 0 and json.loads(js.read_text())["not_reached"] == ["attention"]


def _bench_args(js: Path, mixers: str, budget: float) -> Namespace:
    return Namespace(budget=budget, json=str(js), lengths="16,32", mixers=mixers, max_seconds=10.0, repeats=1,
                     device="cpu", d_model=16, heads=2, profile=False, decode=False, syncs=False)


def test_bench_warms_up_lists_the_unreached_and_keeps_to_its_budget(tmp_path, monkeypatch):
    import seqmem.bench.speed as speed

    gb, js, now, calls = _load_bench(), tmp_path / "gpu.json", [0.0], []
    monkeypatch.setattr(gb, "time", SimpleNamespace(monotonic=lambda: now[0]))
    monkeypatch.setattr(gb, "warm_up", lambda name, backend, ns, dev, dt, n: calls.append(("warm", name, n)) or 1.5)

    def fake_run_speed(ns, device, dtype, mixers, lengths, ref_lengths, machine, log):
        (name,) = mixers
        calls.append(("run", name, json.loads(js.read_text())["not_reached"]))
        now[0] += 100 if name == "attention" else 1
        if name == "vort":
            raise KeyboardInterrupt  # the stage's box ran out
        return {"peak": {}, "records": [{"mixer": name, "impl": "fast", "seq_len": n, "status": "ok",
                                         "median_ms": 1.0, "form": "pytorch"} for n in lengths]}

    monkeypatch.setattr(speed, "run_speed", fake_run_speed)
    # 130 s: attention (3 x 1 row x 10 s = 30 s needed) takes 100, deltanet (its [fla] row not run on the CPU)
    # starts with 30 left, ska finds 29 < 30 and is not started
    assert gb.run_bench(_bench_args(js, "ska,deltanet,attention", 130)) == 0
    left = ["attention", "deltanet", "ska", "deltanet[fla]"]
    assert calls == [("warm", "attention", 16), ("run", "attention", left),
                     ("warm", "deltanet", 16), ("run", "deltanet", left[1:])]
    data = json.loads(js.read_text())
    assert data["not_reached"] == ["ska"] and "ska" in data["skipped"] and "interrupted" not in data
    assert [r["mixer"] for r in data["records"]] == ["attention"] * 2 + ["deltanet"] * 2 + ["deltanet[fla]"] * 2
    # cut inside a mixer: it and the ones after stay listed, the cut one is named
    calls.clear()
    assert gb.run_bench(_bench_args(js, "elastic,vort,attention", 1000)) == 130
    data = json.loads(js.read_text())
    assert data["interrupted"] == "vort" and data["not_reached"] == ["vort", "elastic"]
    assert [c[1] for c in calls] == ["attention", "attention", "vort", "vort"]


def test_kernel_rows_come_last_and_need_their_autotuning_time(tmp_path, monkeypatch):
    """The baselines' [fla] rows are timed after every row on seqmem's own forms (their first call autotunes for
    about two minutes, which must not keep the mechanisms unmeasured), start only with KERNEL_WARMUP_S more than a
    plain row needs, and stand beside their own rows on the page."""
    import seqmem.bench.speed as speed

    gb, js, now, calls = _load_bench(), tmp_path / "gpu.json", [0.0], []
    monkeypatch.setattr(gb, "time", SimpleNamespace(monotonic=lambda: now[0]))
    monkeypatch.setattr(gb, "warm_up", lambda name, backend, ns, dev, dt, n: calls.append((name, backend)) or 1.0)
    monkeypatch.setattr(gb, "kernel_missing", lambda name, device, head_dim: None)  # as where fla is installed

    def fake_run_speed(ns, device, dtype, mixers, lengths, ref_lengths, machine, log):
        now[0] += 1
        return {"peak": {}, "records": [{"mixer": mixers[0], "impl": "fast", "seq_len": n, "status": "ok",
                                         "median_ms": 1.0, "form": ns.backend} for n in lengths]}

    monkeypatch.setattr(speed, "run_speed", fake_run_speed)
    assert gb.run_bench(_bench_args(js, "linear_attention,vort,deltanet,attention", 1000)) == 0
    assert calls == [("attention", "pytorch"), ("linear_attention", "pytorch"), ("deltanet", "pytorch"),
                     ("vort", "pytorch"), ("linear_attention", "fla"), ("deltanet", "fla")]
    md = tmp_path / "gpu.md"
    args = Namespace(write_md=str(md), json=str(js), not_run=False, versions=None, stages=None, logs=None,
                     commit_file=None)
    monkeypatch.setattr(gb, "time", time)  # the page's date
    assert gb.write_md(args) == 0
    table = md.read_text().split("| layer |", 1)[1]
    rows = [ln.split(" | ")[0][2:] for ln in table.splitlines() if ln.startswith("| ")]
    assert rows == ["attention", "linear_attention", "linear_attention[fla]", "deltanet", "deltanet[fla]", "vort"]
    # 4 own rows take 4 s; with 30 + KERNEL_WARMUP_S - 1 left, the first kernel row is not started
    calls.clear()
    now[0] = 0.0
    monkeypatch.setattr(gb, "time", SimpleNamespace(monotonic=lambda: now[0]))
    budget = 4 + 30 + gb.KERNEL_WARMUP_S - 1
    assert gb.run_bench(_bench_args(js, "linear_attention,vort,deltanet,attention", budget)) == 0
    data = json.loads(js.read_text())
    assert [c[1] for c in calls] == ["pytorch"] * 4
    assert data["not_reached"] == ["linear_attention[fla]", "deltanet[fla]"]
    assert set(data["skipped"]) == {"linear_attention[fla]", "deltanet[fla]"}


def test_decode_pass_comes_after_the_mechanisms_rows(tmp_path, monkeypatch):
    """The decode pass runs once, after the rows of attention, the baselines and the mechanisms and before the
    other mixers' rows and the kernels' rows, for the layers of DECODE_MIXERS it was given, each only with
    DECODE_S left."""
    import seqmem.bench.speed as speed

    gb, js, now, calls = _load_bench(), tmp_path / "gpu.json", [0.0], []
    monkeypatch.setattr(gb, "time", SimpleNamespace(monotonic=lambda: now[0]))
    monkeypatch.setattr(gb, "warm_up", lambda name, backend, ns, dev, dt, n: 1.0)
    monkeypatch.setattr(gb, "kernel_missing", lambda name, device, head_dim: None)

    def fake_run_speed(ns, device, dtype, mixers, lengths, ref_lengths, machine, log):
        calls.append(("row", mixers[0], ns.backend))
        now[0] += 1
        return {"peak": {}, "records": []}

    def fake_decode(name, args, device, dtype, machine, log):
        calls.append(("decode", name))
        now[0] += 5
        return [{"mixer": name, "seq_len": 1024, "status": "ok", "median_ms": 1.0, "state_bytes": 8}]

    monkeypatch.setattr(speed, "run_speed", fake_run_speed)
    monkeypatch.setattr(gb, "decode_one", fake_decode)
    args = _bench_args(js, "swa,deltanet,vort,attention", 1000)
    args.decode = True
    assert gb.run_bench(args) == 0
    assert calls == [("row", "attention", "pytorch"), ("row", "deltanet", "pytorch"), ("row", "vort", "pytorch"),
                     ("decode", "attention"), ("decode", "deltanet"), ("decode", "vort"),
                     ("row", "swa", "pytorch"), ("row", "deltanet", "fla")]
    assert [r["mixer"] for r in json.loads(js.read_text())["decode"]] == ["attention", "deltanet", "vort"]
    # with too little time left, a layer's decode is skipped and said so
    calls.clear()
    now[0] = 0.0
    args.budget = gb.DECODE_S + 4  # too little for any row (3 x the cap): one decode, then none
    assert gb.run_bench(args) == 0
    assert [c for c in calls if c[0] == "decode"] == [("decode", "attention")]
    assert set(json.loads(js.read_text())["skipped"]) >= {"decode deltanet", "decode vort"}


def test_profiles_after_the_decode_pass_and_a_cut_in_either(tmp_path, monkeypatch):
    """The profile pass runs after the decode pass, both after the mechanisms' rows; a profile whose trace holds no
    kernels is an error, one whose kernels sum to far less than the row's timed call is marked; a SIGINT in the
    decode pass leaves a valid JSON naming it and a page with the decode rows measured so far."""
    import seqmem.bench.speed as speed

    gb, js, now, calls = _load_bench(), tmp_path / "gpu.json", [0.0], []
    monkeypatch.setattr(gb, "time", SimpleNamespace(monotonic=lambda: now[0]))
    monkeypatch.setattr(gb, "warm_up", lambda name, backend, ns, dev, dt, n: 1.0)

    def fake_run_speed(ns, device, dtype, mixers, lengths, ref_lengths, machine, log):
        calls.append(("row", mixers[0]))
        now[0] += 1
        return {"peak": {}, "records": [{"mixer": mixers[0], "impl": "fast", "seq_len": n, "status": "ok",
                                         "median_ms": 10.0, "form": "x"} for n in lengths]}

    def fake_profile(name, backend, ns, device, dtype, n):
        calls.append(("profile", name))
        launches = 0 if name == "vort" else 5
        total = 1.0 if name == "deltanet" else 9.0
        return {"seq_len": n, "total_ms": total, "launches": launches, "what": "x",
                "top": [{"kernel": "k", "ms": total, "calls": launches}]}

    def fake_decode(name, args, device, dtype, machine, log):
        calls.append(("decode", name))
        if name == "vort":
            raise KeyboardInterrupt
        return [{"mixer": name, "seq_len": 1024, "status": "ok", "median_ms": 1.0, "state_bytes": 8}]

    monkeypatch.setattr(speed, "run_speed", fake_run_speed)
    monkeypatch.setattr(gb, "profile", fake_profile)
    monkeypatch.setattr(gb, "decode_one", fake_decode)

    def fake_syncs(name, ns, device, dtype, n):
        calls.append(("syncs", name))
        if name == "deltanet":
            raise RuntimeError("boom")
        return {"seq_len": n, "total": 2, "reads": [{"where": "seqmem/x.py:1", "count": 2}], "how": "x",
                "decode_total": 1, "decode_reads": [{"where": "seqmem/y.py:3", "count": 1}]}

    monkeypatch.setattr(gb, "syncs_one", fake_syncs)
    args = _bench_args(js, "swa,deltanet,attention,ska", 1000)
    args.decode = args.profile = args.syncs = True
    assert gb.run_bench(args) == 0
    assert calls == [("row", "attention"), ("row", "deltanet"), ("row", "ska"),
                     ("decode", "attention"), ("decode", "deltanet"), ("decode", "ska"),
                     ("profile", "attention"), ("profile", "deltanet"), ("profile", "ska"),
                     ("syncs", "attention"), ("syncs", "deltanet"), ("syncs", "ska"), ("row", "swa")]
    syncs = json.loads(js.read_text())["syncs"]
    assert syncs["attention"]["total"] == 2 and "boom" in syncs["deltanet"]["error"]
    page = gb.syncs_section({"syncs": syncs})
    assert "| attention | 16 | 2 | `seqmem/x.py:1` ×2 | 1 | `seqmem/y.py:3` ×1 |" in page
    assert "| deltanet | – | – | failed: RuntimeError" in page
    profs = json.loads(js.read_text())["profiles"]
    assert "note" not in profs["attention"] and "trace may have missed kernels" in profs["deltanet"]["note"]
    assert set(profs) == {"attention", "deltanet", "ska"}
    # a cut inside the decode pass
    calls.clear()
    now[0] = 0.0
    args.mixers = "vort,attention,swa"
    assert gb.run_bench(args) == 130
    data = json.loads(js.read_text())
    assert data["interrupted"] == "decode vort" and data["not_reached"] == ["swa"]
    assert [r["mixer"] for r in data["decode"]] == ["attention"]
    md = tmp_path / "gpu.md"
    monkeypatch.setattr(gb, "time", time)
    args_md = Namespace(write_md=str(md), json=str(js), not_run=False, versions=None, stages=None, logs=None,
                        commit_file=None)
    assert gb.write_md(args_md) == 0
    page = md.read_text()
    assert "Cut by the stage's time box while running decode vort." in page and "| attention | 1.00 |" in page


def test_profile_reads_device_entries_only_on_cuda():
    """``_own_us``: on CUDA a device-side entry's own time; an operator, a runtime call or an annotation (CPU-side)
    counts 0, so nothing is counted twice; on the CPU the operators' self time."""
    from seqmem.bench.profile import _own_us

    kernel = SimpleNamespace(device_type="DeviceType.CUDA", self_device_time_total=120.0, self_cpu_time_total=0.0)
    op = SimpleNamespace(device_type="DeviceType.CPU", self_device_time_total=120.0, self_cpu_time_total=30.0)
    span = SimpleNamespace(device_type="DeviceType.CUDA", is_user_annotation=True, self_device_time_total=500.0,
                           self_cpu_time_total=0.0)
    old = SimpleNamespace(device_type="DeviceType.CUDA", self_cuda_time_total=7.0, self_cpu_time_total=0.0)
    assert [_own_us(e, True) for e in (kernel, op, span, old)] == [120.0, 0.0, 0.0, 7.0]
    assert [_own_us(e, False) for e in (kernel, op)] == [0.0, 30.0]


def test_decode_table_survives_odd_records_and_shows_without_speed_rows(tmp_path):
    """The decode table: error / not-run / one-context records, a zero median and a record without a length do not
    break the page; the layers not started are named; decode records alone (every speed row skipped) still show."""
    gb = _load_bench()
    payload = {"records": [], "skipped": {"decode vla": "3 s of the budget left, 23 s needed", "vort": "x"},
               "decode": [
                   {"mixer": "attention", "seq_len": 1024, "status": "ok", "median_ms": 2.0, "state_bytes": 2048},
                   {"mixer": "attention", "seq_len": 4096, "status": "ok", "median_ms": 4.0, "state_bytes": 8192},
                   {"mixer": "deltanet", "seq_len": 1024, "status": "ok", "median_ms": 0.0, "state_bytes": 64},
                   {"mixer": "lattice", "seq_len": 1024, "status": "error", "note": "RuntimeError: boom"},
                   {"mixer": "ska", "status": "ok", "median_ms": 1.0},
                   {"mixer": "mamba2", "seq_len": 4096, "status": "not run", "note": "cap", "median_ms": None}]}
    text = gb.decode_section(payload)
    assert "| attention | 2.00 | 4.00 | 8 | 1.00 · 1.00 |" in text
    assert "| deltanet | ok | – |" in text and "| lattice | error | – |" in text and "RuntimeError: boom" in text
    assert "ska" not in text and "Decode not started: vla (3 s of the budget left, 23 s needed)." in text
    assert gb.decode_section({"decode": [], "skipped": {}}) == ""
    js, md = tmp_path / "gpu.json", tmp_path / "gpu.md"
    js.write_text(json.dumps(payload))
    args = Namespace(write_md=str(md), json=str(js), not_run=False, versions=None, stages=None, logs=None,
                     commit_file=None, also_json=[str(js)])
    assert gb.write_md(args) == 0
    page = md.read_text()
    assert "Not measured in this run" in page and page.count("| attention | 2.00 | 4.00 |") == 2  # main + call 2


def test_failures_are_named_wherever_pytest_puts_them():
    gb = _load_bench()
    log = "\n".join([
        "tests/test_contract.py::test_a[deltanet] FAILED                      [  3%]",
        "[gw2] [  5%] FAILED tests/test_contract.py::test_b[vort-cfg0] ",
        "[gw1] [  6%] PASSED tests/test_contract.py::test_c[ska] ",
        "tests/ops/test_backends.py::test_d ERROR",
        "ERROR tests/ops/test_vort_gla.py - ImportError: cannot import name 'x'",
        "E   AssertionError: relative error 1e-3 > 2e-4",
        "==== 2 failed, 1 passed, 1 error in 9.0s ====",
        "FAILED tests/test_contract.py::test_a[deltanet] - AssertionError: relative error 1e-3 > 2e-4",
    ])
    assert gb.failures(log) == [
        "FAILED tests/test_contract.py::test_a[deltanet] - AssertionError: relative error 1e-3 > 2e-4",
        "FAILED tests/test_contract.py::test_b[vort-cfg0]",
        "ERROR tests/ops/test_backends.py::test_d",
        "ERROR tests/ops/test_vort_gla.py - ImportError: cannot import name 'x'",
    ]
    assert gb.failures("==== 3 passed ====\nall good\n") == []


def test_page_from_a_truncated_json_without_git_and_without_numpy(tmp_path, monkeypatch):
    gb = _load_bench()
    js, md, logs = tmp_path / "gpu.json", tmp_path / "gpu.md", tmp_path / "logs"
    js.write_text('{"bench": "speed", "records": [{"mixer": "attention", "seq_')  # cut mid-write
    logs.mkdir()
    (logs / "triton.log").write_text("tests/ops/test_lattice_triton.py::test_k FAILED   [ 50%]\n")
    (tmp_path / "versions.txt").write_text("card\tNVIDIA H200\nnumpy\tnot installed (ModuleNotFoundError)\n"
                                           "fla\tnot installed (ImportError)\nfla_error\tImportError: no triton\n"
                                           "# Traceback (most recent call last):\n")
    (tmp_path / "COMMIT").write_text("commit\t0123456789abcdef0123\ndirty\t3\n")
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "no-such-git"))  # as on a machine the tree reached without .git
    args = Namespace(write_md=str(md), json=str(js), not_run=False, versions=str(tmp_path / "versions.txt"),
                     stages=None, logs=str(logs), commit_file=str(tmp_path / "COMMIT"))
    assert gb.write_md(args) == 0
    page = md.read_text()
    assert "The bench's records could not be read (JSONDecodeError" in page and "Not measured in this run" in page
    assert "commit 0123456789ab (no git here: from COMMIT, written by `gpu_check.sh prepare`, then with 3 " in page
    assert "**numpy is missing on this machine's Python**" in page and "fla did not import: `ImportError: no " in page
    assert "* `triton: FAILED tests/ops/test_lattice_triton.py::test_k`" in page
    # a test whose xdist worker the time box stopped is listed apart, not as a failure
    (logs / "contract.log").write_text("[gw3] node down: Not properly terminated\n"
                                       "FAILED tests/test_contract.py::test_x[vla] - worker 'gw3' crashed while "
                                       "running 'tests/test_contract.py::test_x[vla]'\n")
    assert gb.write_md(args) == 0
    page = md.read_text()
    assert "Failed tests (1):" in page and "Stopped with their worker (1;" in page
    assert page.index("test_x[vla]") > page.index("Stopped with their worker")
    # a bench cut before its first mixer finished: nothing measured, every mixer listed as not reached
    js.write_text(json.dumps({"records": [], "not_reached": ["attention", "vort"], "interrupted": "attention"}))
    args.commit_file = str(tmp_path / "none")
    assert gb.write_md(args) == 0
    page = md.read_text()
    assert "Not reached (never run, or cut before it finished): attention, vort." in page
    assert "while running attention" in page and "commit unknown (no git here, and no .whl/COMMIT)" in page


def test_page_commit_from_prepare_and_a_further_bench_call(tmp_path, monkeypatch):
    """The commit that travelled (.whl/COMMIT, written by prepare) wins over a git that reads another commit (the
    device machine held a .git of an older one), which is named beside it; ``--also-json`` adds a further bench
    call's table; the date is the records' own."""
    gb = _load_bench()
    js, js2, md, commit = tmp_path / "gpu.json", tmp_path / "gpu_call2.json", tmp_path / "gpu.md", tmp_path / "C"
    rec = {"mixer": "attention", "impl": "fast", "seq_len": 4096, "status": "ok", "median_ms": 3.0, "form": "x"}
    js.write_text(json.dumps({"records": [rec], "machine": {"date": "2026-11-29T18:58:00Z"}, "not_reached": []}))
    js2.write_text(json.dumps({"records": [dict(rec, mixer="deltanet", median_ms=10.0)], "note": "Right after.",
                               "not_reached": ["vort"], "skipped": {"vla": "5 s of the budget left"}}))
    commit.write_text("commit\tfeedfacefeedfacefeed\ndirty\t0\n")
    monkeypatch.setattr(gb, "_git_commit", lambda: "0123456789ab (with uncommitted changes)")
    args = Namespace(write_md=str(md), json=str(js), not_run=False, versions=None, stages=None, logs=None,
                     commit_file=str(commit), also_json=[str(js2)])
    assert gb.write_md(args) == 0
    page = md.read_text()
    assert ("commit feedfacefeed (git here reads 0123456789ab (with uncommitted changes): from C, written by "
            "`gpu_check.sh prepare`)") in page
    assert "Date 2026-11-29T18:58:00Z" in page
    second = page.split("### Bench call 2 ([gpu_call2.json](gpu_call2.json))", 1)[1]
    assert "Right after." in second and "| deltanet | 10.0 |" in second
    assert "Not started: vla (5 s of the budget left)." in second and "Not reached (never" in second
    args.no_git = True
    assert gb.write_md(args) == 0
    assert "commit feedfacefeed (no git here: from C, " in md.read_text()
    monkeypatch.setattr(gb, "_git_commit", lambda: "feedfacefeed")
    args.no_git = False
    assert gb.write_md(args) == 0
    assert "commit feedfacefeed." in md.read_text()


def test_committed_page_is_the_not_run_page_or_a_gpu_run(tmp_path):
    page = (ROOT / "docs" / "results" / "bench" / "gpu.md").read_text()
    if "Not run yet" in page:
        assert _bench("--write-md", str(tmp_path / "gpu.md"), "--not-run").returncode == 0
        assert page == (tmp_path / "gpu.md").read_text()
        assert not any(ch.isdigit() for ch in page.split("\n", 2)[2].replace("gpu_check", ""))
    else:
        assert "Card: " in page and "| layer |" in page and "trial of the script" not in page
