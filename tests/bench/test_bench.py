"""``seqmem bench speed|decode`` run end to end on tiny sizes, write valid JSON and PNGs; bad arguments exit 2."""

from __future__ import annotations

import json

import pytest
import torch

from seqmem.bench.common import measure, parse_lengths
from seqmem.bench.decode import state_bytes
from seqmem.bench.flops import count_flops
from seqmem.bench.speed import crossover
from seqmem.cli import main

PNG = b"\x89PNG\r\n\x1a\n"
TINY = ["--mixers", "attention,deltanet", "--lengths", "64,128", "--repeats", "1", "--warmup", "0",
        "--d-model", "32", "--heads", "2"]


def _png_ok(path) -> bool:
    return path.exists() and path.read_bytes()[:8] == PNG and path.stat().st_size > 1000


def _provenance_ok(data: dict, printed: str) -> None:
    """The payload says which code ran when and under what load, and the Markdown header repeats it."""
    import re

    import seqmem

    m = data["machine"]
    for k in ("date", "commit", "dirty", "seqmem", "omp_num_threads", "load_1min"):
        assert k in m, k
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", m["date"]) and m["seqmem"] == seqmem.__version__
    assert m["commit"] is None or re.fullmatch(r"[0-9a-f]{40}", m["commit"])
    assert m["dirty"] in (None, True, False) and (m["load_1min"] is None or m["load_1min"] >= 0)
    assert data["end"]["date"] >= m["date"]
    run = next(line for line in printed.splitlines() if line.startswith("Run: "))
    assert f"started {m['date']}" in run and "load average (1 min)" in run
    assert (m["commit"][:12] if m["commit"] else "commit not recorded") in run


def test_run_machine_without_git_or_load(monkeypatch):
    """No git (or not a git tree) and no load average: null, never an error; the header says "not recorded"."""
    import subprocess

    from seqmem.bench import common

    def no_git(*a, **k):
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", no_git)
    monkeypatch.setattr(common, "load_1min", lambda: None)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    m = common.run_machine("cpu")
    assert m["commit"] is None and m["dirty"] is None and m["load_1min"] is None and m["omp_num_threads"] == "1"
    assert "cuda_runtime" not in m
    text = common.provenance_text(m, {"date": "2026-01-01T00:00:00Z", "load_1min": 1.5})
    assert "commit not recorded" in text and "load average (1 min) not recorded" in text
    assert "ended 2026-01-01T00:00:00Z, load 1.50" in text and "OMP_NUM_THREADS=1" in text
    # a record from older code (machine_info only) renders too
    assert "commit not recorded" in common.provenance_text({"cpu": "x", "cores": 2})


def test_speed_end_to_end(tmp_path, capsys):
    js = tmp_path / "speed.json"
    assert main(["bench", "speed", *TINY, "--gemm-sizes", "256", "--json", str(js), "--plot", str(tmp_path / "p")]) == 0
    out = capsys.readouterr().out
    assert "| mixer | T | fast_ms" in out and "crossover" in out
    data = json.loads(js.read_text())
    assert data["bench"] == "speed" and data["machine"]["torch"] == torch.__version__
    _provenance_ok(data, out)
    assert data["gemm_peak"]["gflops"] > 0
    recs = data["records"]
    assert {(r["mixer"], r["impl"], r["seq_len"]) for r in recs} == {
        (m, i, n) for m in ("attention", "deltanet") for i in ("fast", "reference") for n in (64, 128)}
    for r in recs:
        for k in ("bench", "mixer", "impl", "seq_len", "batch", "d_model", "n_heads", "device", "median_ms",
                  "tokens_per_s", "machine"):
            assert k in r, k
        assert r["status"] == "ok" and r["median_ms"] > 0 and r["d_model"] == 32 and r["n_heads"] == 2
        assert r["tokens_per_s"] == pytest.approx(r["seq_len"] / (r["median_ms"] / 1e3))
        if r["impl"] == "fast":
            assert r["flops"] > 0 and 0 < r["frac_of_peak"]
            assert 0 < r["linear_ms"]  # the projections alone ...
        else:
            assert "linear_ms" not in r
    # ... give the floor column: attention's time over the projections' time
    for s in data["summary"]:
        fast = next(r for r in recs if (r["mixer"], r["impl"], str(r["seq_len"])) == (s["mixer"], "fast", s["T"]))
        attn = next(r for r in recs if (r["mixer"], r["impl"], str(r["seq_len"])) == ("attention", "fast", s["T"]))
        assert s["floor"] == pytest.approx(attn["median_ms"] / fast["linear_ms"])
    assert "floor@16k" in data["targets"][0]
    # attention's ratio to itself is 1; the reference speed-up is the ratio of the two medians
    row = next(s for s in data["summary"] if s["mixer"] == "attention" and s["T"] == "128")
    assert row["attn/mixer"] == pytest.approx(1.0)
    assert row["speed-up (ref/fast)"] == pytest.approx(row["ref_ms"] / row["fast_ms"])
    assert "| speed-up (ref/fast) |" in out
    assert _png_ok(tmp_path / "p" / "speed_time.png") and _png_ok(tmp_path / "p" / "speed_fast_vs_reference.png")


def test_decode_end_to_end(tmp_path, capsys):
    js = tmp_path / "decode.json"
    args = ["bench", "decode", *TINY, "--piece", "50", "--impl", "fast", "--json", str(js), "--plot", str(tmp_path)]
    assert main(args) == 0
    data = json.loads(js.read_text())
    _provenance_ok(data, capsys.readouterr().out)
    recs = {(r["mixer"], r["seq_len"]): r for r in data["records"]}
    assert set(recs) == {(m, n) for m in ("attention", "deltanet") for n in (64, 128)}
    assert all(r["status"] == "ok" and r["median_ms"] > 0 for r in recs.values())
    # attention's KV cache: 2 · d_model floats per token (+ one int64 position); deltanet's state is constant
    assert recs[("attention", 64)]["state_bytes"] == 2 * 32 * 64 * 4 + 8
    assert recs[("attention", 128)]["state_bytes"] == 2 * 32 * 128 * 4 + 8
    assert recs[("deltanet", 64)]["state_bytes"] == recs[("deltanet", 128)]["state_bytes"] > 0
    assert _png_ok(tmp_path / "decode_time.png") and _png_ok(tmp_path / "decode_state.png")


def test_profile_lists_top_ops(tmp_path, capsys):
    js = tmp_path / "p.json"
    assert main(["bench", "profile", "--mixers", "deltanet", "--lengths", "64", "--d-model", "32", "--heads", "2",
                 "--top", "5", "--json", str(js)]) == 0
    res = json.loads(js.read_text())["results"]
    assert len(res) == 1 and len(res[0]["top"]) == 5 and res[0]["op_calls"] > 0
    assert "| op | calls | self_ms |" in capsys.readouterr().out


def test_profile_takes_only_the_options_it_uses(tmp_path, capsys):
    """One profiled call after --warmup unprofiled ones: the timing options of speed / decode (repeats, a time cap,
    plots) would do nothing here, so they are refused."""
    for extra in (["--repeats", "3"], ["--max-seconds", "5"], ["--plot", str(tmp_path / "p")]):
        with pytest.raises(SystemExit) as e:
            main(["bench", "profile", "--mixers", "deltanet", "--lengths", "64", *extra])
        assert e.value.code == 2
    assert not (tmp_path / "p").exists()
    capsys.readouterr()
    assert main(["bench", "profile", "--mixers", "deltanet", "--lengths", "64", "--d-model", "32", "--heads", "2",
                 "--warmup", "0", "--top", "3"]) == 0
    assert "0 warm-up call(s), one profiled call" in capsys.readouterr().out


def test_syncs_lists_the_reads_of_the_device_by_line(tmp_path, capsys):
    """``bench syncs`` counts, after a warm call, where a forward+backward reads a tensor's value on the host (on
    CUDA: every synchronising call): VLA's chunked form reads its refresh positions and Cholesky checks, the block
    memory mixers read nothing over several blocks (their block kinds come from the block index)."""
    js = tmp_path / "s.json"
    methods = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__")
    before = {n: getattr(torch.Tensor, n) for n in methods}
    own = {n for n in methods if n in vars(torch.Tensor)}
    assert main(["bench", "syncs", "--mixers", "memorizing", "--lengths", "64", "--d-model", "32", "--heads", "2",
                 "--mixer-option", "block_len=8", "--mixer-option", "n_queue=12", "--json", str(js)]) == 0
    mem = json.loads(js.read_text())["results"][0]
    assert mem["total"] == 0 and mem["reads"] == []  # 8 blocks, kinds from the block index
    assert main(["bench", "syncs", "--mixers", "vla", "--lengths", "64", "--d-model", "32", "--heads", "2",
                 "--json", str(js)]) == 0
    res = {r["mixer"]: r for r in json.loads(js.read_text())["results"]}
    assert res["vla"]["total"] == sum(r["count"] for r in res["vla"]["reads"]) > 0
    assert any("seqmem/ops/vla/chunk.py:" in r["where"] for r in res["vla"]["reads"])
    out = capsys.readouterr().out
    assert "| where | count |" in out and "1 warm-up call(s) not counted, one counted call" in out
    assert all(getattr(torch.Tensor, n) is f for n, f in before.items())  # the spy is gone after the call
    assert {n for n in methods if n in vars(torch.Tensor)} == own
    with pytest.raises(SystemExit) as e:
        main(["bench", "syncs", "--mixers", "vla", "--repeats", "3"])
    assert e.value.code == 2
    # a decode step: attention and lattice_minibatch know their position on the host (the state they returned; the
    # mixer hands lattice_minibatch's op the position in its chunk)
    assert main(["bench", "syncs", "--decode", "--mixers", "attention,lattice_minibatch,vort_fixed_alpha",
                 "--lengths", "16", "--d-model", "32", "--heads", "2", "--json", str(js)]) == 0
    res = {r["mixer"]: r for r in json.loads(js.read_text())["results"]}
    assert all(r["decode"] for r in res.values())
    assert res["attention"]["total"] == 0 and res["attention"]["reads"] == []
    assert not any("minibatch.py" in r["where"] for r in res["lattice_minibatch"]["reads"])
    assert not any("torch.tensor" in r["where"] for r in res["vort_fixed_alpha"]["reads"])  # cached per device
    assert "one decode step after 16 tokens" in capsys.readouterr().out


def test_syncs_spy_counts_value_reads_and_host_built_device_tensors():
    """The CPU spy counts what would wait for a GPU: value reads, and tensors built from host values with a device
    (a blocking copy on CUDA); not tensors built without one, nor from a tensor."""
    from collections import Counter

    from seqmem.bench.syncs import _spy

    found: Counter = Counter()
    t = torch.ones(3)
    with _spy(found):
        torch.tensor([1.0, 2.0], device=t.device)
        torch.as_tensor(2.0, device="cpu")
        torch.tensor([1.0])
        torch.as_tensor(t, device=t.device)
        t.tolist()
        bool(t.sum() > 0)
    kinds = sorted(k.split(" ")[0] for k in found.elements())
    assert kinds == ["__bool__", "tolist", "torch.as_tensor(…,", "torch.tensor(…,"], found
    assert all("test_bench.py:" in k for k in found)


def test_speed_no_floor_skips_the_projections(tmp_path):
    js = tmp_path / "s.json"
    assert main(["bench", "speed", *TINY, "--impl", "fast", "--no-flops", "--no-floor", "--gemm-sizes", "64",
                 "--json", str(js)]) == 0
    data = json.loads(js.read_text())
    assert all("linear_ms" not in r for r in data["records"]) and all(s["floor"] is None for s in data["summary"])


def test_floor_is_timed_like_the_layer(monkeypatch):
    """The projections alone get the layer's --warmup and --repeats (not a warm-up of their own)."""
    from seqmem.bench import speed

    calls = []
    real = speed.measure

    def spy(fn, **kw):
        calls.append((kw["warmup"], kw["repeats"]))
        return real(fn, **kw)

    monkeypatch.setattr(speed, "measure", spy)
    assert main(["bench", "speed", "--mixers", "deltanet", "--lengths", "64", "--d-model", "32", "--heads", "2",
                 "--impl", "fast", "--no-flops", "--gemm-sizes", "64", "--warmup", "3", "--repeats", "2"]) == 0
    assert calls == [(3, 2), (3, 2)]  # the layer, then its projections


def test_time_cap_reports_not_run(tmp_path):
    js = tmp_path / "s.json"
    assert main(["bench", "speed", *TINY, "--impl", "fast", "--no-flops", "--max-seconds", "0.000001",
                 "--gemm-sizes", "64", "--json", str(js)]) == 0
    recs = json.loads(js.read_text())["records"]
    assert recs and all(r["status"] == "not run" and r["median_ms"] is None for r in recs)
    assert all("max-seconds" in r["note"] for r in recs)


def test_mixer_option_reaches_the_mixer_the_record_and_the_command(tmp_path, capsys):
    js = tmp_path / "s.json"
    argv = ["bench", "speed", "--mixers", "swa", "--lengths", "32", "--repeats", "1", "--warmup", "0", "--d-model",
            "32", "--heads", "2", "--impl", "fast", "--no-flops", "--no-floor", "--gemm-sizes", "64",
            "--mixer-option", "window=3", "--mixer-option", "rope_base=500", "--json", str(js)]
    seen = []
    import seqmem.bench.speed as speed

    real = speed.build_mixer

    def spy(*a, **kw):
        m = real(*a, **kw)
        seen.append((m.window, m.rope_base))
        return m

    speed.build_mixer = spy
    try:
        assert main(argv) == 0
    finally:
        speed.build_mixer = real
    assert seen == [(3, 500.0)]  # swa's own default window is 64
    data = json.loads(js.read_text())
    assert [r["mixer_options"] for r in data["records"]] == [{"window": 3, "rope_base": 500}]
    # the repeat command spells a repeatable option once per value, and flags as they are spelled now
    assert "--mixer-option window=3 --mixer-option rope_base=500" in data["command"]
    assert "--batch-size 1" in data["command"] and "--batch " not in data["command"]
    assert "--mixer-option window=3 --mixer-option rope_base=500" in capsys.readouterr().out


def test_bench_train_takes_mixer_options(tmp_path):
    js = tmp_path / "t.json"
    assert main(["bench", "train", "--mixers", "swa", "--d-model", "16", "--heads", "2", "--layers", "1",
                 "--seq-len", "16", "--batch-size", "2", "--repeats", "1", "--warmup", "0",
                 "--mixer-option", "window=3", "--json", str(js)]) == 0
    (row,) = json.loads(js.read_text())["rows"]
    assert row["options"]["window"] == 3  # over the length rule's window (0.25·T = 4)


@pytest.mark.parametrize("argv", [
    ["bench", "speed", "--mixers", "swa", "--mixer-option", "windw=8"],
    ["bench", "speed", "--mixers", "swa,deltanet", "--mixer-option", "window=8"],  # deltanet has no window
    ["bench", "decode", "--mixers", "swa", "--mixer-option", "window"],
    ["bench", "train", "--mixers", "swa", "--mixer-option", "nope=1"],
    ["bench", "speed", "--mixers", "no_such_mixer"],
    ["bench", "speed", "--lengths", "abc"],
    ["bench", "speed", "--lengths", "0"],
    ["bench", "speed", "--repeats", "0"],
    ["bench", "decode", "--max-seconds", "-1"],
    ["bench", "decode", "--dtype", "int8"],
    ["bench", "speed", "--impl", "slow"],
    ["bench", "decode", "--device", "tpu"],
    ["bench", "speed", "--mixers", "attention", "--heads", "3", "--d-model", "32"],  # refused before any timing
    ["bench", "speed", "--mixers", "swa", "--mixer-option", "window=0", "--d-model", "32", "--heads", "2"],
    ["bench"],
])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        raise SystemExit(main(argv))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "error" in err or "usage" in err


def test_cuda_unavailable_is_a_usage_error(capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    assert main(["bench", "speed", "--device", "cuda", "--mixers", "attention"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_parse_lengths():
    assert parse_lengths("2k,1k,1024,96", []) == [96, 1024, 2048]
    assert parse_lengths(None, [5]) == [5]
    with pytest.raises(ValueError):
        parse_lengths("1x", [])


def test_crossover():
    attn = {1024: 10.0, 2048: 40.0, 4096: 160.0}
    assert crossover({1024: 5.0, 2048: 5.0, 4096: 5.0}, attn)["text"] == "<= 1k"
    assert crossover({1024: 50.0, 2048: 400.0, 4096: 1600.0}, attn)["text"] == "> 4k"
    c = crossover({1024: 20.0, 2048: 20.0, 4096: 20.0}, attn)  # ratio 0.5, 2, 8: crosses between 1k and 2k
    assert c["text"] == "1k–2k" and c["estimate"] == pytest.approx(1024 * 2 ** 0.5)


def test_flop_count_matches_formula():
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    assert count_flops(lambda: a @ b) == 2 * 8 * 16 * 4
    conv = torch.nn.Conv1d(6, 6, 4, groups=6, bias=False)
    x = torch.randn(1, 6, 10, requires_grad=True)
    fwd = 2 * 6 * 7 * 4  # output elements × kernel taps, depthwise
    assert count_flops(lambda: conv(x).sum().backward()) == 3 * fwd  # forward + input grad + weight grad


def test_measure_counts_repeats_and_state_bytes():
    res = measure(lambda: None, warmup=1, repeats=3, max_seconds=10.0, device=torch.device("cpu"))
    assert res["status"] == "ok" and len(res["times_ms"]) == 3
    st = {"S": torch.zeros(2, 4, 8), "pos": torch.zeros(2, dtype=torch.long)}
    assert state_bytes(st) == 4 * 8 * 4 + 8


def test_measure_judges_the_cap_after_the_warm_up():
    """The first call pays one-off costs (on CUDA: the device's start-up, kernel loading and autotuning); the cap's
    estimate comes from the latest call after the warm-up, so a fast call after a slow first one is measured (it
    was refused: "one call takes 0.30 s")."""
    import time

    calls = []

    def fn():
        time.sleep(0.3 if not calls else 0.001)
        calls.append(1)

    res = measure(fn, warmup=2, repeats=3, max_seconds=0.5, device=torch.device("cpu"))
    assert res["status"] == "ok" and len(res["times_ms"]) == 3 and max(res["times_ms"]) < 100
    assert res["call_s"] < 0.1


def test_device_is_warmed_up_before_anything_is_estimated(monkeypatch):
    """speed, decode and train warm the device up before the first measurement (and the GEMM peak)."""
    import argparse

    import seqmem.bench.common as common
    import seqmem.bench.decode as decode
    import seqmem.bench.flops as flops
    import seqmem.bench.speed as speed

    order = []
    real_measure = common.measure

    def warm(device, dtype):
        order.append("warm-up")
        return 0.0

    def meas(*a, **k):
        order.append("measure")
        return real_measure(*a, **k)

    for mod in (speed, decode):
        monkeypatch.setattr(mod, "warm_up_device", warm)
        monkeypatch.setattr(mod, "measure", meas)
    real_peak = flops.gemm_peak
    monkeypatch.setattr(speed, "gemm_peak", lambda *a: (order.append("peak"), real_peak(*a))[1])
    args = argparse.Namespace(d_model=16, heads=2, batch=1, seed=0, impl="fast", repeats=1, warmup=1,
                              ref_repeats=None, ref_warmup=None, max_seconds=None, no_flops=True, no_floor=True,
                              gemm_sizes_parsed=[64], backend="pytorch", piece=8, dtype="float32", device="cpu")
    cpu = torch.device("cpu")
    out = speed.run_speed(args, cpu, torch.float32, ["deltanet"], [16], [16], {}, lambda m: None)
    assert order[0] == "warm-up" and "measure" in order and out["records"][0]["form"] == "delta_rule: pytorch"
    order.clear()
    decode.run_decode(args, cpu, torch.float32, ["deltanet"], [16], {}, lambda m: None)
    assert order[0] == "warm-up" and "measure" in order
    import seqmem.bench.train as train

    monkeypatch.setattr(common, "warm_up_device", warm)
    order.clear()
    r = train.train_step_seconds("deltanet", d_model=16, n_heads=2, seq_len=8, batch=2, repeats=1, warmup=0)
    assert order == ["warm-up"] and r["device"] == "cpu"


def test_warm_up_and_event_timing_on_the_cpu_are_plain():
    cpu = torch.device("cpu")
    from seqmem.bench.common import device_name, timed_call, warm_up_device

    assert warm_up_device(cpu, torch.float32) == 0.0 and device_name(cpu) is None
    assert 0 <= timed_call(lambda: None, cpu) < 1.0


def test_speed_backend_both_puts_the_forms_side_by_side(tmp_path, monkeypatch):
    monkeypatch.delenv("SEQMEM_BACKENDS", raising=False)
    js = tmp_path / "speed.json"
    args = ["bench", "speed", "--mixers", "attention,deltanet", "--lengths", "32", "--repeats", "1", "--warmup",
            "0", "--d-model", "16", "--heads", "2", "--impl", "fast", "--no-flops", "--no-floor", "--gemm-sizes",
            "64", "--backend", "both", "--json", str(js)]
    assert main(args) == 0
    data = json.loads(js.read_text())
    got = {(r["mixer"], r["backend"], r["form"]) for r in data["records"]}
    # on the CPU the kernels take no call: both rows ran the PyTorch forms, and say so
    assert got == {("attention", "pytorch", "pytorch"), ("attention[fla]", "fla,mamba_ssm", "pytorch"),
                   ("deltanet", "pytorch", "delta_rule: pytorch"),
                   ("deltanet[fla]", "fla,mamba_ssm", "delta_rule: pytorch")}
    assert all(s["form"] for s in data["summary"])
    from seqmem.backends import enabled_backends

    assert enabled_backends() == ("fla", "mamba_ssm")  # the choice does not outlive the run
