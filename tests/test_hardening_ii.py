"""Hardening II (issue #43): no write or read outside the chosen directories, results bound to what produced them,
every grid point its own run, exit codes that tell the truth.  Each case failed on the code before the fix; the
per-case map is in docs/reliability.md."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import tiny
from seqmem.cli import main
from seqmem.sweep import load_spec, run_sweep, write_report
from seqmem.sweep.runner import check_result, is_finished, read_result, seal
from seqmem.sweep.spec import PACKAGED_SPECS, SpecError, slug

SRC = str(Path(__file__).resolve().parent.parent / "src")




def _main(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def _one_line_error(argv: list[str], capsys, match: str, code: int = 2) -> str:
    capsys.readouterr()
    assert _main(argv) == code
    err = capsys.readouterr().err
    assert "Traceback" not in err and match in err, err
    return err


def _victim(tmp_path: Path) -> Path:
    v = tmp_path / "victim"
    v.write_text("precious")
    return v


def _sealed(p, **r) -> dict:
    t = p.run_spec["train"]
    return seal({"lr": t["lr"], "seed": t["seed"], "steps": t["steps"], **r})


def _finished(out: Path, p, acc: float = 0.5) -> Path:
    """A finished run as the runner writes it (sealed, with its log)."""
    d = out / p.rel_dir
    d.mkdir(parents=True, exist_ok=True)
    (d / "run.json").write_text(json.dumps(p.run_spec))
    (d / "metrics.jsonl").write_text(json.dumps({"step": p.run_spec["train"]["steps"], "loss": 1.0}) + "\n")
    from seqmem.io import file_sha256

    r = _sealed(p, status="finished", valid={"accuracy": acc, "loss": 1.0}, report={"accuracy": acc, "loss": 1.0},
                report_split="eval", state=1, params=1, seconds=1.0, metrics_sha256=file_sha256(d / "metrics.jsonl"))
    (d / "result.json").write_text(json.dumps(r))
    return d


# ----------------------------------------------------------------------------- 1. the writability probe
def test_the_writability_probe_never_follows_a_planted_link(tmp_path, capsys):
    from seqmem.cliargs import check_out_dir

    victim = _victim(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / ".seqmem-write-test").symlink_to(victim)
    assert _main(["sweep", "tiny", "--out", str(out), "--dry-run", "--no-probe"]) == 0
    check_out_dir(out)  # every command's probe (train, export-hf, bench --json, repro, eval --json, --report-dir)
    assert victim.read_text() == "precious"
    assert (out / ".seqmem-write-test").is_symlink()
    assert not [p for p in out.iterdir() if p.name.startswith(".seqmem-write-test-")]  # the probe file is gone


def test_atomic_writes_replace_a_link_and_respect_the_umask(tmp_path):
    from seqmem.io import UnsafePathError, append_text, atomic_write_text

    victim = _victim(tmp_path)
    (tmp_path / "f.json").symlink_to(victim)
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "f.json", "new")
        assert victim.read_text() == "precious" and not (tmp_path / "f.json").is_symlink()
        assert (tmp_path / "f.json").stat().st_mode & 0o777 == 0o644  # was 0600 despite umask 022
        (tmp_path / "log").symlink_to(victim)
        with pytest.raises(UnsafePathError):
            append_text(tmp_path / "log", "x\n")  # metrics.jsonl is appended to, never through a link
        assert victim.read_text() == "precious"
    finally:
        os.umask(old)


def test_checkpoint_directories_get_the_umask_mode(tmp_path):
    import torch

    from seqmem.train.checkpoint import save_checkpoint

    old = os.umask(0o022)
    try:
        ck = save_checkpoint(tmp_path, 1, torch.nn.Linear(2, 2), {"step": 1})
    finally:
        os.umask(old)
    assert ck.stat().st_mode & 0o777 == 0o755  # mkdtemp's 0700 used to survive the rename


# ----------------------------------------------------------------------------- 2. traversal by names
def test_labels_and_names_cannot_leave_the_sweep_directory(tmp_path):
    assert slug("..") == "x" and slug(".") == "x" and slug("../a") == "a" and slug(".hidden") == "hidden"
    raw = tiny(settings=[{"label": "..", "options": {"seq_len": 16}}])
    raw["mixers"] = [{"name": "..", "layers": ["attention", "attention"]}]
    spec = load_spec(raw)
    for p in spec.points():
        assert ".." not in p.rel_dir.parts and "." not in p.rel_dir.parts
        assert (tmp_path / "a" / "b" / p.rel_dir).resolve().is_relative_to((tmp_path / "a" / "b").resolve())
    with pytest.raises(SpecError, match="start with '.'"):
        load_spec(tiny(name=".."))


def test_a_run_directory_that_is_a_link_elsewhere_is_refused(tmp_path):
    from seqmem.io import UnsafePathError

    spec = load_spec(tiny(mixers=["attention"], train__lrs=[1e-2], train__seeds=[0]))
    (p,) = spec.points()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "out" / p.rel_dir
    link.parent.mkdir(parents=True)
    link.symlink_to(elsewhere)
    with pytest.raises(UnsafePathError, match="outside"):
        run_sweep(spec, tmp_path / "out", log=lambda s: None, probe=False)
    assert list(elsewhere.iterdir()) == []


# ----------------------------------------------------------------------------- 3. a tampered run.json
def test_a_tampered_run_json_cannot_make_eval_read_outside(tmp_path, capsys, monkeypatch):
    run = tmp_path / "runs" / "run"
    run.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret " * 100)
    spec = {"task": {"name": "lm", "options": {"corpus": str(outside), "seq_len": 16}},
            "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "mixer": "attention"}, "train": {}}
    (run / "run.json").write_text(json.dumps(spec))
    monkeypatch.chdir(run)
    monkeypatch.setenv("SEQMEM_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SEQMEM_DATA_ROOTS", raising=False)
    _one_line_error(["eval", "--run", str(run)], capsys, "outside")
    assert not (tmp_path / "cache").exists()  # nothing was read into the token cache
    _one_line_error(["export-hf", "--run", str(run), "--out", str(tmp_path / "hf")], capsys, "outside")
    monkeypatch.setenv("SEQMEM_DATA_ROOTS", str(outside))  # named explicitly: read (then: no checkpoint to eval)
    _one_line_error(["eval", "--run", str(run)], capsys, "no valid checkpoint")


def test_run_json_shapes_and_run_files_are_one_line_errors(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    base = {"model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "mixer": "attention"}}
    for spec, match in (({**base, "task": {"options": {}}}, "no 'name'"),
                        ({**base, "task": {"name": "mqar"}, "train": [1]}, "must be objects")):
        (run / "run.json").write_text(json.dumps(spec))
        _one_line_error(["eval", "--run", str(run)], capsys, match)
        _one_line_error(["export-hf", "--run", str(run), "--out", str(tmp_path / "hf")], capsys, match)
    _one_line_error(["eval", "--run", str(run / "run.json")], capsys, "not a training run directory")
    (run / "run.json").write_text(json.dumps({**base, "task": {"name": "mqar"}, "train": {"steps": "10"}}))
    _one_line_error(["train", "--config", str(run / "run.json"), "--out", str(tmp_path / "r2")], capsys,
                    "steps")
    (run / "run.json").write_text(json.dumps({**base, "task": {"name": "mqar"}, "train": [1]}))
    _one_line_error(["train", "--config", str(run / "run.json"), "--out", str(tmp_path / "r2")], capsys, "train")


# ----------------------------------------------------------------------------- 4. --reuse and the tokenizer
def test_reuse_never_copies_through_a_link(tmp_path):
    spec = load_spec(tiny(mixers=["attention"], train__lrs=[1e-2], train__seeds=[0]))
    (p,) = spec.points()
    src = tmp_path / "src"
    d = _finished(src, p)
    secret = tmp_path / "secret"
    secret.write_text(json.dumps({"step": 30, "loss": 0.0}) + "\n")
    (d / "metrics.jsonl").unlink()
    (d / "metrics.jsonl").symlink_to(secret)
    from seqmem.sweep.runner import reuse_finished

    lines: list[str] = []
    assert reuse_finished(spec.points(), tmp_path / "dst", [src], log=lines.append) == 0
    assert not (tmp_path / "dst" / p.rel_dir / "metrics.jsonl").exists()


def test_a_planted_tokenizer_link_is_replaced_not_written_through(tmp_path):
    from seqmem.textdata import TextTokenizer

    victim = _victim(tmp_path)
    tok = tmp_path / "out" / "tokenizer"
    tok.mkdir(parents=True)
    (tok / "byte_tokenizer.json").symlink_to(victim)
    TextTokenizer("byte").save(tok)
    assert victim.read_text() == "precious"
    assert json.loads((tok / "byte_tokenizer.json").read_text())["type"] == "byte"


# ----------------------------------------------------------------------------- 5-7. data loss
def test_empty_out_is_refused_everywhere(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "report.md").write_text("mine")
    for argv in (["sweep", "tiny", "--out", ""], ["sweep", "tiny", "--report", "--report-dir", ""],
                 ["bench", "speed", "--json", ""], ["eval", "--run", ".", "--json", ""]):
        capsys.readouterr()
        assert _main(argv) == 2, argv
        assert "empty" in capsys.readouterr().err
    assert (tmp_path / "report.md").read_text() == "mine"


def test_a_second_spec_never_replaces_another_sweeps_report(tmp_path, capsys):
    a = load_spec(tiny(mixers=["attention"], train__seeds=[0]))
    for p in a.points():
        _finished(tmp_path, p)
    write_report(a, tmp_path)
    before = (tmp_path / "report.md").read_text()
    other = tmp_path / "other.toml"
    other.write_text((PACKAGED_SPECS / "tiny.toml").read_text().replace('name = "tiny"', 'name = "tiny2"'))
    _one_line_error(["sweep", str(other), "--out", str(tmp_path), "--dry-run"], capsys, "report of sweep 'tiny'")
    b = load_spec(str(other))
    with pytest.raises(ValueError, match="report of sweep"):
        write_report(b, tmp_path)
    assert (tmp_path / "report.md").read_text() == before


def test_export_hf_into_the_runs_checkpoints_is_refused(tmp_path, capsys):
    pytest.importorskip("transformers")
    run = tmp_path / "run"
    assert main(["train", "--task", "mqar", "--mixer", "attention", "--layers", "1", "--d-model", "16", "--heads",
                 "2", "--steps", "2", "--batch-size", "2", "--vocab-size", "16", "--num-pairs", "2", "--seq-len",
                 "16", "--eval-examples", "4", "--no-progress", "--out", str(run)]) == 0
    ck = sorted((run / "checkpoints").glob("ckpt-*"))[-1]
    weights = (ck / "model.safetensors").read_bytes()
    _one_line_error(["export-hf", "--run", str(run), "--out", str(ck)], capsys, "inside the run's checkpoints")
    assert (ck / "model.safetensors").read_bytes() == weights



def _export_runs(tmp_path: Path) -> tuple[Path, Path]:
    """A byte-level LM run (it exports a tokenizer) and an MQAR run (no tokenizer), one step each."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(12):
        (corpus / f"d{i}.txt").write_text(f"document {i} " * 40)
    common = ["--layers", "1", "--d-model", "16", "--heads", "2", "--steps", "1", "--batch-size", "2", "--seq-len",
              "16", "--eval-examples", "2", "--no-progress"]
    lm, mqar = tmp_path / "lm", tmp_path / "mqar"
    assert main(["train", "--task", "lm", "--corpus", str(corpus), "--mixer", "deltanet", *common,
                 "--out", str(lm)]) == 0
    assert main(["train", "--task", "mqar", "--mixer", "deltanet", "--vocab-size", "16", "--num-pairs", "2", *common,
                 "--out", str(mqar)]) == 0
    return lm, mqar


def test_export_hf_never_overwrites_an_export_or_writes_through_a_link(tmp_path, capsys, monkeypatch):
    pytest.importorskip("transformers")
    import transformers

    lm, mqar = _export_runs(tmp_path)
    out = tmp_path / "hf"
    old = os.umask(0o022)
    try:
        assert main(["export-hf", "--run", str(lm), "--out", str(out)]) == 0
        assert {f.name: f.stat().st_mode & 0o777 for f in out.iterdir()} == {
            n: 0o644 for n in ("README.md", "config.json", "configuration_seqmem.py", "generation_config.json",
                               "model.safetensors", "modeling_seqmem.py", "tokenizer.json", "tokenizer_config.json")}
        # another run's export into the same directory: refused (it would keep the LM run's tokenizer)
        before = {f.name: f.read_bytes() for f in out.iterdir()}
        _one_line_error(["export-hf", "--run", str(mqar), "--out", str(out)], capsys, "already holds an exported model")
        # an export that fails half-way leaves the old one as it was, even with --overwrite
        import seqmem.hf.modeling_seqmem as modeling

        real = modeling.save_exported

        def fail(model, where):
            real(model, where)
            raise OSError("No space left on device")

        monkeypatch.setattr(modeling, "save_exported", fail)
        assert main(["export-hf", "--run", str(mqar), "--out", str(out), "--overwrite"]) == 1
        assert {f.name: f.read_bytes() for f in out.iterdir()} == before
        monkeypatch.setattr(modeling, "save_exported", real)
        # --overwrite replaces the whole export: no tokenizer of the LM run stays next to the MQAR model
        assert main(["export-hf", "--run", str(mqar), "--out", str(out), "--overwrite"]) == 0
        assert sorted(f.name for f in out.iterdir()) == ["README.md", "config.json", "configuration_seqmem.py",
                                                         "generation_config.json", "model.safetensors",
                                                         "modeling_seqmem.py"]
        assert json.loads((out / "config.json").read_text())["vocab_size"] == 16
        # links planted under an export's names: counted as an export (refused), replaced with --overwrite
        planted = tmp_path / "planted"
        planted.mkdir()
        victims = {}
        for i, name in enumerate(("modeling_seqmem.py", "config.json", "tokenizer.json", "model.safetensors")):
            (tmp_path / f"v{i}").mkdir()
            victims[name] = _victim(tmp_path / f"v{i}")
            (planted / name).symlink_to(victims[name])
        _one_line_error(["export-hf", "--run", str(lm), "--out", str(planted)], capsys, "already holds")
        assert main(["export-hf", "--run", str(lm), "--out", str(planted), "--overwrite"]) == 0
        assert all(v.read_text() == "precious" for v in victims.values())
        assert not [f for f in planted.iterdir() if f.is_symlink() or f.name.startswith(".")]
        assert all(f.stat().st_mode & 0o777 == 0o644 for f in planted.iterdir())
        assert len(transformers.AutoTokenizer.from_pretrained(planted)) == 256
    finally:
        os.umask(old)

# ----------------------------------------------------------------------------- 8, 10, 14. results that lie
@pytest.mark.parametrize("content, why", [
    ("", "not valid JSON"), ('{"status": "fini', "not valid JSON"), ("{}", "status"), ("[]", "not a JSON object"),
    ("null", "not a JSON object"), ("1e308", "not a JSON object"),
])
def test_a_broken_result_is_not_finished_and_is_named(tmp_path, content, why):
    spec = load_spec(tiny(mixers=["attention"], train__lrs=[1e-2], train__seeds=[0]))
    (p,) = spec.points()
    d = _finished(tmp_path, p)
    (d / "result.json").write_text(content)
    res, problem = check_result(d)
    assert res is None and str(d / "result.json") in problem and why in problem
    lines: list[str] = []
    out = run_sweep(spec, tmp_path, dry_run=True, log=lines.append, probe=False)
    assert out["finished_before"] == 0 and any(str(d / "result.json") in line for line in lines)
    assert write_report(spec, tmp_path)["rows"][0]["runs_done"] == 0


@pytest.mark.parametrize("edit", [
    {"report": {"accuracy": 7.5, "loss": 1.0}}, {"report": {"accuracy": -3.0, "loss": 1.0}},
    {"valid": {"accuracy": True, "loss": 1.0}}, {"lr": "0.01"}, {"steps": None},
])
def test_an_edited_result_is_never_reported(tmp_path, edit):
    spec = load_spec(tiny(mixers=["attention"], train__lrs=[1e-2], train__seeds=[0]))
    (p,) = spec.points()
    d = _finished(tmp_path, p)
    r = json.loads((d / "result.json").read_text())
    (d / "result.json").write_text(json.dumps({**r, **edit}))  # hand-edited: the seal no longer matches
    assert not is_finished(d)
    (d / "result.json").write_text(json.dumps(seal({**r, **edit})))  # even sealed again: out of range / types
    assert not is_finished(d)
    assert write_report(spec, tmp_path)["rows"][0]["runs_done"] == 0


def test_a_result_is_bound_to_its_log_and_a_fabricated_run_is_not_finished(tmp_path):
    spec = load_spec(tiny(mixers=["attention"], train__lrs=[1e-2], train__seeds=[0]))
    (p,) = spec.points()
    d = _finished(tmp_path, p)
    assert is_finished(d)
    with open(d / "metrics.jsonl", "a") as f:
        f.write('{"step": 99}\n')
    assert not is_finished(d) and "metrics.jsonl" in check_result(d)[1]
    # a fabricated directory: run.json, an empty log, an unsealed result saying finished (it was reported, 0.980)
    (d / "metrics.jsonl").write_text("")
    (d / "result.json").write_text(json.dumps({"status": "finished", "lr": 0.01, "seed": 0, "steps": 30,
                                               "valid": {"accuracy": 0.98}, "report": {"accuracy": 0.98}}))
    assert not is_finished(d) and "empty" in check_result(d)[1]
    # an unsealed result written before sealing: accepted when it agrees with its log
    (d / "metrics.jsonl").write_text(json.dumps({"step": 30, "eval_accuracy": 0.98}) + "\n")
    assert is_finished(d)
    (d / "result.json").write_text(json.dumps({"status": "finished", "lr": 0.01, "seed": 0, "steps": 30,
                                               "valid": {"accuracy": 0.98}, "report": {"accuracy": 0.99}}))
    assert not is_finished(d) and "final evaluation" in check_result(d)[1]


def test_a_trained_result_is_sealed_and_a_broken_one_is_trained_again(tmp_path):
    spec = load_spec(tiny(mixers=["attention"], train__lrs=[1e-2], train__seeds=[0], train__steps=4))
    (p,) = spec.points()
    run_sweep(spec, tmp_path, log=lambda s: None, probe=False)
    d = tmp_path / p.rel_dir
    r = read_result(d)
    assert r is not None and {"sha256", "metrics_sha256", "weights_sha256"} <= set(r)
    (d / "result.json").write_text("{}")
    res = run_sweep(spec, tmp_path, log=lambda s: None, probe=False)
    assert res["ran"] == 1 and is_finished(d)
    # an edit that also removes the seal is caught too: the result still carries the log's hash, written only
    # beside a seal (it used to pass as a result from before sealing, and its edited validation chose the lr)
    for edit in ({"valid": {**r["valid"], "accuracy": 0.9}}, {"status": "diverged"}):
        forged = {k: v for k, v in {**read_result(d), **edit}.items() if k != "sha256"}
        (d / "result.json").write_text(json.dumps(forged))
        assert not is_finished(d)
        assert "seal" in check_result(d)[1]
        res = run_sweep(spec, tmp_path, log=lambda s: None, probe=False)
        assert res["ran"] == 1 and is_finished(d)


def test_the_committed_results_are_all_valid():
    """Every committed result.json is sealed (scripts/seal_results.py) and passes the checks."""
    root = Path(__file__).resolve().parent.parent / "docs" / "results"
    files = sorted(root.rglob("result.json"))
    assert files
    bad = [why for f in files if (why := check_result(f.parent)[1]) is not None]
    assert not bad, bad[:3]


# ----------------------------------------------------------------------------- 9. one run per grid point
def test_near_equal_values_get_their_own_stable_directories():
    assert slug(0.001) == "0.001" and slug(3e-4) == "0.0003" and slug(1.5) == "1.5"  # existing names unchanged
    spec = load_spec(tiny(mixers=["attention"], train__lrs=[0.001, 0.0010000001], train__seeds=[0]))
    dirs = {p.rel_dir for p in spec.points()}
    assert len(dirs) == 2 and any("lr0.0010000001" in str(d) for d in dirs)
    spec = load_spec(tiny(mixers=["attention"], train__seeds=[0], model__mlp_ratio=[1.5, 1.50000001]))
    assert len({p.rel_dir for p in spec.points()}) == 4


def test_duplicate_grid_values_are_refused():
    with pytest.raises(SpecError, match="distinct"):
        load_spec(tiny(mixers=[{"name": "attention", "lrs": [0.003, 0.003]}]))
    with pytest.raises(SpecError, match="share the run directory"):
        load_spec(tiny(model__d_model=[16, 16.0]))


def test_an_lr_extension_always_extends():
    from seqmem.sweep.runner import extended_lr

    assert extended_lr(1e-3, 3) == 0.003 and extended_lr(1e-3, 1 / 3) == 0.0003  # committed campaigns' values
    assert extended_lr(0.01, 1.4) == 0.014  # was 0.01: no extension at all
    assert extended_lr(0.03, 1 / 1.4) < 0.03


# ----------------------------------------------------------------------------- 11. exit codes
def test_sweep_exits_non_zero_when_a_run_failed(tmp_path, capsys, monkeypatch):
    from seqmem.sweep import runner

    monkeypatch.setattr(runner, "_run_point_safe", lambda *a, **k: {"status": "error", "error": "boom"})
    spec = tmp_path / "s.toml"
    spec.write_text((PACKAGED_SPECS / "tiny.toml").read_text())
    assert _main(["sweep", str(spec), "--out", str(tmp_path / "o"), "--no-probe", "--limit", "1"]) == 1
    assert "failed" in capsys.readouterr().err


def test_bench_exits_non_zero_when_a_cell_errored(tmp_path, capsys):
    import argparse

    from seqmem.bench.cli import _emit

    # a cell whose record says status "error": the table is printed, the files written, and the exit code is 1
    args = argparse.Namespace(bench="speed", markdown=tmp_path / "t.md", json=None)
    bad = {"records": [{"mixer": "deltanet", "seq_len": 16, "status": "ok"},
                       {"mixer": "deltanet", "seq_len": 32, "status": "error", "note": "RuntimeError: boom"}]}
    assert _emit(args, "the table", bad) == 1
    assert "1 cell(s) failed, e.g. deltanet T=32: RuntimeError: boom" in capsys.readouterr().err
    assert (tmp_path / "t.md").read_text() == "the table"
    assert _emit(args, "the table", {"records": [{"status": "ok"}]}) == 0
    # a bad option never reaches a cell: refused before any timing, one line, exit 2
    code = _main(["bench", "speed", "--mixers", "deltanet", "--mixer-option", "chunk_size=abc", "--lengths", "16",
                  "--repeats", "1", "--warmup", "0", "--d-model", "16", "--heads", "2", "--batch", "1",
                  "--gemm-sizes", "16", "--impl", "fast"])
    assert code == 2
    assert "chunk_size" in capsys.readouterr().err


def test_bench_markdown_errors_name_markdown(tmp_path, capsys):
    _one_line_error(["bench", "speed", "--mixers", "deltanet", "--markdown", str(tmp_path)], capsys, "--markdown")


# ----------------------------------------------------------------------------- 13. a worker's death
@pytest.mark.slow  # two spawned workers: about a minute on a loaded 2-core machine
def test_a_killed_worker_costs_only_its_own_run(tmp_path):
    raw = tiny(mixers=["attention"], train__seeds=[0], train__steps=100)  # 2 runs, one per worker
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(raw))
    out = tmp_path / "o"
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "seqmem", "sweep", str(spec), "--out", str(out), "--jobs", "2",
                             "--no-probe"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        victim = None
        while time.time() < deadline and victim is None:
            kids = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
            workers = [k for k in kids if "spawn_main" in Path(f"/proc/{k}/cmdline").read_text(errors="ignore")]
            if len(workers) >= 2:
                victim = int(workers[0])
            time.sleep(0.1)
        assert victim is not None, "no workers started"
        os.kill(victim, signal.SIGKILL)
        text, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, text
    assert "Traceback" not in text and "died" in text
    assert len(list(out.rglob("result.json"))) >= 1  # the other worker's runs went on
    assert any("died" in f.read_text() for f in out.rglob("error.json"))


# ----------------------------------------------------------------------------- 14-16. one-line errors
def test_spec_errors_are_one_line(tmp_path, capsys):
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    _one_line_error(["sweep", str(deep), "--dry-run"], capsys, "deep.toml")
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"name = \"\xff\xfe\"\n")
    _one_line_error(["sweep", str(binary), "--dry-run"], capsys, "bin.toml")
    for change, match in ((dict(train__steps=[1, 2]), "steps"), (dict(train__seeds=[2**70]), r"2\*\*63"),
                          (dict(model__d_model=list(range(8, 8 + 2000)), train__seeds=list(range(10))), "split")):
        with pytest.raises(SpecError, match=match):
            load_spec(tiny(**change))


def test_a_huge_grid_is_refused_at_once():
    t0 = time.perf_counter()
    with pytest.raises(SpecError, match="more than"):
        load_spec(tiny(model__d_model=list(range(8, 1008)), train__lrs=[1e-3 * (i + 1) for i in range(100)],
                       train__seeds=list(range(10))))
    assert time.perf_counter() - t0 < 20


def test_an_unreadable_run_json_is_not_called_a_changed_spec(tmp_path, capsys):
    spec = load_spec(tiny(mixers=["attention"], train__lrs=[1e-2], train__seeds=[0]))
    (p,) = spec.points()
    d = tmp_path / p.rel_dir
    d.mkdir(parents=True)
    (d / "run.json").write_text("{not json")
    from seqmem.sweep.runner import SweepConflict

    with pytest.raises(SweepConflict, match="unreadable") as e:
        run_sweep(spec, tmp_path, dry_run=True, log=lambda s: None, probe=False)
    assert "changed" not in str(e.value)


def test_a_run_with_only_a_corrupt_checkpoint_is_not_told_to_resume(tmp_path):
    import torch

    from seqmem.tasks import build_task
    from seqmem.train import TrainConfig, train
    from seqmem.train.checkpoint import save_checkpoint

    ck = save_checkpoint(tmp_path / "checkpoints", 2, torch.nn.Linear(2, 2), {"step": 2})
    (ck / "model.safetensors").write_bytes(b"junk")
    from seqmem.models import LanguageModel, LMConfig

    task = build_task("mqar", vocab_size=16, num_pairs=2, seq_len=16)
    model = LanguageModel(LMConfig(vocab_size=16, d_model=16, n_layers=1, n_heads=2, mixer="attention"))
    with pytest.raises(ValueError, match="only corrupt") as e:
        train(model, task, TrainConfig(steps=2, batch_size=2, lr=1e-3), out_dir=tmp_path)
    assert "resume=True" not in str(e.value)


def test_a_full_disk_gives_one_line_and_leaves_no_partial_checkpoint(tmp_path, monkeypatch, capsys):
    """Case 14, a full disk: torch and safetensors report it as "unexpected pos ..." — a checkpoint write says which
    checkpoint and asks about the disk, leaving no partial checkpoint nor temporary directory; a sweep's report that
    cannot be written is one line naming the directory, exit 2."""
    import torch

    from seqmem.train import checkpoint as ck

    def full(*a, **k):
        raise RuntimeError("[enforce fail at inline_container.cc:595] . unexpected pos 4096 vs 0")

    monkeypatch.setattr(ck, "save_file", full)
    with pytest.raises(OSError, match=r"cannot write checkpoint .*ckpt-00000007.*is the disk full\?"):
        ck.save_checkpoint(tmp_path / "c", 7, torch.nn.Linear(2, 2), {"step": 7})
    assert list((tmp_path / "c").iterdir()) == []
    monkeypatch.undo()

    import seqmem.sweep

    def no_space(*a, **k):
        raise OSError(28, "No space left on device")

    spec = tmp_path / "s.toml"
    spec.write_text((PACKAGED_SPECS / "tiny.toml").read_text())
    (tmp_path / "o").mkdir()
    monkeypatch.setattr(seqmem.sweep, "write_report", no_space)  # what the sweep command calls
    err = _one_line_error(["sweep", str(spec), "--out", str(tmp_path / "o"), "--report"], capsys,
                          "cannot write the report")
    assert "No space left" in err


def test_a_model_too_large_for_memory_is_refused_at_once(tmp_path, capsys):
    t0 = time.perf_counter()
    _one_line_error(["train", "--task", "mqar", "--mixer", "attention", "--d-model", "100000000", "--out",
                     str(tmp_path / "r")], capsys, "GiB")
    assert time.perf_counter() - t0 < 30


# ----------------------------------------------------------------------------- 17. low
def test_spec_notes_are_escaped_in_the_report(tmp_path):
    raw = tiny(mixers=["attention"], train__seeds=[0])
    raw["notes"] = {"attention": "a | b <script>\nnew row"}
    spec = load_spec(raw)
    for p in spec.points():
        _finished(tmp_path, p)
    write_report(spec, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "a \\| b &lt;script&gt; new row" in md and "<script>" not in md


def test_a_tampered_corpus_cache_of_the_same_size_is_rebuilt(tmp_path):
    from seqmem.data import load_corpus

    src = tmp_path / "corpus"
    src.mkdir()
    for i in range(6):
        (src / f"f{i}.txt").write_text(f"document {i} " * 50)
    c1 = load_corpus(str(src), cache_dir=tmp_path / "cache")
    train = Path(c1.cache_path) / "train.bin"
    data = bytearray(train.read_bytes())
    data[:5] = b"EVIL!"
    train.write_bytes(bytes(data))
    c2 = load_corpus(str(src), cache_dir=tmp_path / "cache")
    assert bytes(c2.split("train")[:5]) != b"EVIL!"


def test_run_point_rechecks_finished_under_the_lock(tmp_path):
    from seqmem.sweep.runner import run_point

    spec = load_spec(tiny(mixers=["attention"], train__lrs=[1e-2], train__seeds=[0]))
    (p,) = spec.points()
    d = _finished(tmp_path, p, acc=0.25)
    r = run_point(p.run_spec, str(d))
    assert r["report"]["accuracy"] == 0.25  # not trained again
