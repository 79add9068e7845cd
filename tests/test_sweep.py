"""The sweep runner: spec validation, grid expansion, resumption, conflicts, lr choice on validation, report."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from conftest import tiny
from seqmem.cli import main
from seqmem.sweep import (
    LENGTH_RULE,
    SpecError,
    SweepConflict,
    collect,
    fair_options,
    list_packaged_specs,
    load_spec,
    run_sweep,
    write_report,
)
from seqmem.sweep.runner import seal

TINY = tiny()


def quiet(_: str) -> None:
    pass


def test_packaged_specs_all_load():
    names = list_packaged_specs()
    assert {"tiny", "compare", "demo"} <= set(names)
    for n in names:
        spec = load_spec(n)
        assert spec.points(), n


def test_grid_expansion_and_directories():
    spec = load_spec(tiny(model__d_model=[16, 32]))
    pts = spec.points()
    # 1 setting x 2 widths x 2 mixers x 2 lrs x 2 seeds
    assert len(pts) == 16
    assert len({p.rel_dir for p in pts}) == 16
    p = pts[0]
    assert p.rel_dir.parts[:3] == ("2-pairs", "attention", "d_model16")
    run = p.run_spec
    assert run["task"] == {"name": "mqar", "options": {"vocab_size": 16, "num_pairs": 2, "seq_len": 16}}
    assert run["train"]["lr"] == 3e-3 and run["train"]["seed"] == 0
    assert run["train"]["checkpoint_every"] == 6  # steps // 5 by default: a killed run loses little


@pytest.mark.parametrize(
    "change, match",
    [
        ({"bogus": 1}, "unknown key"),
        ({"name": "has space"}, "'name'"),
        ({"train__lrs": []}, "lrs"),
        ({"train__lrs": [1e-3, -1.0]}, "lrs"),
        ({"train__seeds": [0, 0]}, "distinct"),
        ({"train__lr": 1e-3}, "'lrs'"),
        ({"train__stpes": 3}, "unknown key"),
        ({"model__n_layers": [1, 2]}, "n_layers"),
        ({"model__widht": 3}, "unknown key"),
        ({"mixers": ["atention"]}, "did you mean 'attention'"),
        ({"mixers": [{"name": "attention", "options": {"windw": 4}}]}, "no option"),
        ({"mixers": [{"name": "a+b", "layers": ["attention"]}]}, "one mixer per layer"),
        ({"mixers": ["attention", "attention"]}, "distinct"),
        ({"settings": [{"label": "x", "options": {"num_pairs": 100}}]}, "task 'mqar'"),
        ({"mixers": [{"name": "attention", "options": {"window": -3}}]}, "window"),
        ({"select": "speed"}, "select"),
    ],
)
def test_bad_specs_are_refused_with_a_clear_message(change, match):
    with pytest.raises(SpecError, match=match):
        load_spec(tiny(**change))


def test_spec_file_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(SpecError, match="not valid TOML"):
        load_spec(bad)
    with pytest.raises(SpecError, match="neither a file nor a packaged spec"):
        load_spec(tmp_path / "missing.toml")
    js = tmp_path / "tiny.json"
    js.write_text(json.dumps(TINY))
    assert len(load_spec(js).points()) == len(load_spec("tiny").points())


def test_length_rule_scales_every_length_option():
    assert fair_options("ska", 64) == {"chunk_size": int(LENGTH_RULE["chunk"] * 64)}
    assert fair_options("swa", 64) == {"window": 16}
    assert fair_options("attention", 64) == {}  # window=None stays off
    assert fair_options("elastic", 64) == {"block_len": 16, "hippo_n": 16}
    assert fair_options("memorizing", 64) == {"block_len": 16, "n_queue": 32}
    assert fair_options("vort", 64) == {"local_window": 16}
    assert fair_options("vort_fixed_alpha", 64) == {}  # local_window=0 (off) by default stays off
    assert fair_options("mamba2", 64) == {}  # an exact chunked form's chunk is not a length
    # a spec's own options win over the rule
    spec = load_spec(tiny(mixers=[{"name": "swa", "options": {"window": 3}}]))
    assert spec.points()[0].run_spec["model"]["mixer_options"] == {"window": 3}


def test_hybrid_rows_get_per_layer_options():
    spec = load_spec(tiny(mixers=[{"name": "mamba2+ska", "layers": ["mamba2", "ska"], "family": "echo"}]))
    m = spec.points()[0].run_spec["model"]
    assert m["mixer"] == ["mamba2", "ska"]
    assert m["mixer_options"] == [{}, {"chunk_size": 2}]


def test_run_report_resume_and_conflict(tmp_path):
    spec = load_spec("tiny")
    a = tmp_path / "a"
    res = run_sweep(spec, a, jobs=1, log=quiet, probe=False)
    assert res == {"total": 8, "finished_before": 0, "ran": 8, "errors": 0}
    for p in spec.points():
        d = a / p.rel_dir
        assert json.loads((d / "run.json").read_text()) == p.run_spec
        r = json.loads((d / "result.json").read_text())
        assert r["status"] == "finished" and r["steps"] == 30
        # validation and reported examples are different draws
        assert r["valid"]["accuracy"] != r["report"]["accuracy"] or r["valid"]["loss"] != r["report"]["loss"]
    # a second invocation finds nothing to do
    assert run_sweep(spec, a, jobs=1, log=quiet, probe=False)["ran"] == 0

    # b: interrupted — three runs finished, one killed half-way (a checkpoint and metrics, no result) — resumes to
    # the same numbers
    b = tmp_path / "b"
    run_sweep(spec, b, jobs=1, log=quiet, probe=False, limit=3)
    from seqmem.io import atomic_write_text
    from seqmem.train import TrainConfig, train
    from seqmem.train.run import build_run

    p = spec.points()[3]
    d = b / p.rel_dir
    atomic_write_text(d / "run.json", json.dumps(p.run_spec))
    torch.manual_seed(p.seed)
    model, task = build_run(p.run_spec)
    train(model, task, TrainConfig(**p.run_spec["train"]), out_dir=d, stop_after=12)
    assert not (d / "result.json").exists() and any((d / "checkpoints").iterdir())
    log: list[str] = []
    res = run_sweep(spec, b, jobs=1, log=log.append, probe=False)
    assert res["finished_before"] == 3 and res["ran"] == 5
    assert json.loads((d / "result.json").read_text())["resumed"] is True
    ra, rb = collect(spec, a), collect(spec, b)
    for x, y in zip(ra, rb):
        assert x["per_seed"] == y["per_seed"] and x["best_lr"] == y["best_lr"] and x["lr_valid"] == y["lr_valid"]

    # a changed spec for existing runs is refused before anything runs
    changed = load_spec(tiny(train__steps=31))
    with pytest.raises(SweepConflict, match="differs in train"):
        run_sweep(changed, a, jobs=1, log=quiet, probe=False)

    # the report: Markdown, JSON, plot
    payload = write_report(spec, a, tmp_path / "rep")
    assert (tmp_path / "rep" / "report.md").read_text().startswith("# Sweep `tiny`")
    assert (tmp_path / "rep" / "accuracy_vs_state.png").stat().st_size > 1000
    assert json.loads((tmp_path / "rep" / "report.json").read_text())["rows"] == json.loads(
        json.dumps(payload["rows"], default=str))
    assert all(r["n_seeds"] == 2 and r["complete"] for r in payload["rows"])


def test_an_lr_extension_directory_of_an_edited_spec_is_refused(tmp_path, capsys):
    """The spec check covered the grid only: after an edit of steps and lrs, an lr extension of the new spec
    (9e-3 / 3 = 3e-3) landed on a directory the old spec had trained (10 steps), which counted as a finished
    stage-1 run of the new one (20 steps), could win the choice, and got its other seeds trained under the new
    spec.  Every directory the sweep may read (the extensions' too) is checked now, by the run, the report and a
    worker under the run's lock, and the error names the run and the fields that differ."""
    from seqmem.sweep.runner import run_point

    base = dict(mixers=["attention"], lr_selection="first_seed")
    old = load_spec(tiny(**base, train__steps=10, train__lrs=[1e-3, 3e-3], train__lr_extend=1))
    raw = tiny(**base, train__steps=20, train__lrs=[9e-3, 2.7e-2], train__lr_extend=1)
    new = load_spec(raw)
    out = tmp_path / "o"
    acc = {(lr, s): 0.5 for lr in old.lrs for s in old.seeds}
    _fake_results(old, out, acc, acc)
    acc = {(lr, s): (0.6 if lr == 9e-3 else 0.4) for lr in new.lrs for s in new.seeds}
    _fake_results(new, out, acc, acc)  # 9e-3 is the best and the smallest: the extension is 3e-3, the old run
    ext = next(p for p in new.points() if p.seed == 0)
    ext = new.point_at(ext, 3e-3, 0)
    assert (out / ext.rel_dir / "run.json").is_file()
    for call in (lambda: run_sweep(new, out, jobs=1, log=quiet, probe=False, dry_run=True),
                 lambda: write_report(new, out, tmp_path / "rep"),
                 lambda: run_point(ext.run_spec, str(out / ext.rel_dir))):
        with pytest.raises(SweepConflict) as e:
            call()
        msg = str(e.value)
        assert str(ext.rel_dir) in msg and "train.steps: 10 in run.json, 20 now" in msg, msg
    spec = tmp_path / "new.json"
    spec.write_text(json.dumps(raw))
    capsys.readouterr()
    assert main(["sweep", str(spec), "--out", str(out), "--report", "--report-dir", str(tmp_path / "r")]) == 2
    assert "train.steps: 10 in run.json, 20 now" in capsys.readouterr().err
    with pytest.raises(SweepConflict, match="lr0.009"):  # and the old spec's extension 3e-3 x 3 is the new grid's
        run_sweep(old, out, jobs=1, log=quiet, probe=False, dry_run=True)


def test_a_bf16_run_reports_evaluations_in_bf16(tmp_path):
    """result.json's valid and report evaluations ran in fp32 for a bf16 run, while its log's final evaluation and
    `seqmem eval` ran in bf16 (another number); they run in the run's precision now, which the result records."""
    from seqmem.sweep.runner import run_point

    spec = load_spec(tiny(mixers=["deltanet"], train__steps=10, train__precision="bf16", train__lrs=[3e-3],
                          train__seeds=[0]))
    (p,) = spec.points()
    d = tmp_path / "run"
    r = run_point(p.run_spec, str(d))
    assert r["status"] == "finished" and r["report_split"] == "eval"
    last = json.loads((d / "metrics.jsonl").read_text().splitlines()[-1])
    assert r["report"]["loss"] == last["eval_loss"] and r["report"]["accuracy"] == last["eval_accuracy"]
    assert r["eval_precision"] == "bf16"


def test_report_records_the_run_command_also_when_rewritten_by_report(tmp_path):
    """The report's Command line is the command that runs the sweep: a later ``--report`` keeps it (and, with no
    earlier report, gives its own arguments without ``--report``), rather than recording the report command."""
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(tiny(train__steps=4, train__lrs=[1e-2], train__seeds=[0], mixers=["attention"])))
    out, rep = tmp_path / "o", tmp_path / "rep"
    run = ["sweep", str(spec), "--out", str(out), "--report-dir", str(rep), "--no-probe", "--jobs", "1"]
    assert main(run) == 0
    want = "seqmem sweep " + " ".join(run[1:])
    assert f"Command: `{want}`" in (rep / "report.md").read_text()
    assert json.loads((rep / "report.json").read_text())["command"] == want
    assert main(["sweep", str(spec), "--out", str(out), "--report", "--report-dir", str(rep)]) == 0
    assert f"Command: `{want}`" in (rep / "report.md").read_text()
    # no earlier report in that directory: this invocation's arguments, less --report
    assert main(["sweep", str(spec), "--out", str(out), "--report", "--report-dir", str(tmp_path / "r2")]) == 0
    assert (f"Command: `seqmem sweep {spec} --out {out} --report-dir {tmp_path / 'r2'}`"
            in (tmp_path / "r2" / "report.md").read_text())


def test_cli_sweep_exit_codes(tmp_path, capsys):
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(tiny(train__steps=4, train__lrs=[1e-2], train__seeds=[0], mixers=["attention"])))
    out = tmp_path / "o"
    assert main(["sweep", str(spec), "--out", str(out), "--no-probe"]) == 0
    assert (out / "report.md").exists()
    spec.write_text(json.dumps(tiny(train__steps=5, train__lrs=[1e-2], train__seeds=[0], mixers=["attention"])))
    capsys.readouterr()
    assert main(["sweep", str(spec), "--out", str(out), "--no-probe"]) == 2
    err = capsys.readouterr().err
    assert "spec changed" in err and len(err.strip().splitlines()) == 1
    assert main(["sweep", str(tmp_path / "nope.toml"), "--out", str(out)]) == 2
    assert main(["sweep", "tiny", "--report", "--out", str(tmp_path / "never-ran")]) == 2
    assert main(["sweep", "tiny", "--jobs", "0"]) == 2


def _sealed(run_spec: dict, r: dict) -> dict:
    """A result as the runner writes it: the run's lr, seed and steps, and sealed (its own hash)."""
    from seqmem.sweep.runner import seal

    t = run_spec["train"]
    return seal({"lr": t["lr"], "seed": t["seed"], "steps": t["steps"], **r})


def _fake_results(spec, out: Path, valid: dict, report: dict, status: dict | None = None) -> None:
    """Write result.json files: valid[(lr, seed)] / report[(lr, seed)] accuracies."""
    from seqmem.io import atomic_write_text

    for p in spec.points():
        d = out / p.rel_dir
        st = (status or {}).get((p.lr, p.seed), "finished")
        r = {"status": st, "state": 100, "params": 10, "seconds": 1.0, "report_split": "eval"}
        if st == "finished":
            r["valid"] = {"accuracy": valid[(p.lr, p.seed)], "loss": 1.0}
            r["report"] = {"accuracy": report[(p.lr, p.seed)], "loss": 1.0}
        atomic_write_text(d / "run.json", json.dumps(p.run_spec))
        atomic_write_text(d / "result.json", json.dumps(_sealed(p.run_spec, r)))


_TIED_SUMMARY = """
import json, sys
from pathlib import Path
from seqmem.sweep import collect, load_spec
from seqmem.sweep.report import summary_table
spec = load_spec(json.loads(sys.argv[1]))
print(summary_table(spec, collect(spec, Path(sys.argv[2]))))
"""


def test_tied_rows_keep_the_spec_order_in_every_process(tmp_path):
    # the summary used to order mixers through a set of strings, so two tied rows swapped places between processes
    # (string hashing is randomised per process) and every refresh rewrote the report
    import os
    import subprocess
    import sys

    raw = tiny(mixers=[{"name": "deltanet"}, {"name": "attention"}, {"name": "mamba2"}])
    spec = load_spec(raw)
    acc = {(lr, seed): 0.5 for lr in spec.lrs for seed in spec.seeds}
    _fake_results(spec, tmp_path, acc, acc)
    tables = set()
    for hash_seed in range(6):
        env = {**os.environ, "PYTHONHASHSEED": str(hash_seed)}
        out = subprocess.run([sys.executable, "-c", _TIED_SUMMARY, json.dumps(raw), str(tmp_path)], env=env,
                             capture_output=True, text=True, check=True).stdout
        tables.add(out)
    (table,) = tables
    rows = [line.split("|")[1].strip() for line in table.splitlines()[2:] if line.startswith("|")]
    assert rows == ["`deltanet`", "`attention`", "`mamba2`"]


def test_a_report_from_unchanged_runs_is_kept_as_it_is(tmp_path):
    """Re-running a finished sweep rewrites its report: only the date and the writer's thread count would change,
    so the files are kept (no churn to commit); a changed run rewrites them."""
    import re

    spec = load_spec(tiny(mixers=["attention"]))
    acc = {(lr, seed): 0.5 for lr in spec.lrs for seed in spec.seeds}
    _fake_results(spec, tmp_path, acc, acc)
    write_report(spec, tmp_path)
    md, js = tmp_path / "report.md", tmp_path / "report.json"
    old_md = re.sub(r"report written \S+ \S+", "report written 1999-01-01 00:00.", md.read_text())
    data = json.loads(js.read_text())
    data["machine"]["threads"] = 77
    old_js = json.dumps(data)
    assert old_md != md.read_text()
    md.write_text(old_md)
    js.write_text(old_js)
    write_report(spec, tmp_path)
    assert md.read_text() == old_md and js.read_text() == old_js
    acc[(spec.lrs[0], 0)] = 0.9  # a run changed: both files are rewritten
    _fake_results(spec, tmp_path, acc, acc)
    write_report(spec, tmp_path)
    assert md.read_text() != old_md and json.loads(js.read_text())["machine"]["threads"] != 77


def test_lr_is_chosen_on_validation_never_on_the_reported_split(tmp_path):
    spec = load_spec(tiny(mixers=["attention"]))
    lo, hi = spec.lrs
    # validation prefers `lo`; the reported examples would prefer `hi`
    valid = {(lo, 0): 0.9, (lo, 1): 0.8, (hi, 0): 0.5, (hi, 1): 0.6}
    report = {(lo, 0): 0.7, (lo, 1): 0.75, (hi, 0): 0.99, (hi, 1): 0.98}
    _fake_results(spec, tmp_path, valid, report)
    (row,) = collect(spec, tmp_path)
    assert row["best_lr"] == lo
    assert row["per_seed"] == {0: 0.7, 1: 0.75}
    assert row["report_mean"] == pytest.approx(0.725)
    assert row["report_std"] == pytest.approx(math.sqrt(((0.7 - 0.725) ** 2 + (0.75 - 0.725) ** 2) / 1))
    assert row["lr_at_grid_edge"]


def test_a_diverged_run_makes_its_lr_the_worst(tmp_path):
    spec = load_spec(tiny(mixers=["attention"]))
    lo, hi = spec.lrs
    valid = {(lo, 0): 0.3, (lo, 1): 0.3, (hi, 0): 0.9, (hi, 1): 0.9}
    _fake_results(spec, tmp_path, valid, valid, status={(hi, 1): "diverged"})
    (row,) = collect(spec, tmp_path)
    assert row["best_lr"] == lo


@pytest.mark.parametrize("select", ["accuracy", "loss"])
def test_a_diverged_seed_counts_as_the_worst_value_in_the_reported_mean(tmp_path, select):
    """first_seed: seed 0 chooses `hi`, seeds 1 and 2 diverge there.  The mean dropped them, so the row reported the
    surviving seed's value as a 3-seed mean (0.90 (3)); the protocol's "a diverged run counts as the worst value"
    holds for the mean now: accuracy 0 (mean 0.30), loss infinite; the diverged seeds are named."""
    from seqmem.sweep.report import headline_summary, markdown, summary_table

    spec = load_spec(tiny(mixers=["attention"], lr_selection="first_seed", train__seeds=[0, 1, 2], select=select,
                          extra_metrics=["accuracy"]))
    lo, hi = spec.lrs
    valid = {(lr, seed): (0.9 if lr == hi else 0.5) for lr in spec.lrs for seed in spec.seeds}
    _fake_results(spec, tmp_path, valid, valid, status={(hi, 1): "diverged", (hi, 2): "diverged"})
    if select == "loss":  # _fake_results writes accuracies (and loss 1.0): loss 2.0 at lo, so hi is chosen
        for p in spec.points():
            r = json.loads((tmp_path / p.rel_dir / "result.json").read_text())
            if r["status"] == "finished" and p.lr == lo:
                r["valid"]["loss"] = r["report"]["loss"] = 2.0
                (tmp_path / p.rel_dir / "result.json").write_text(json.dumps(_sealed(p.run_spec, r)))
    (row,) = collect(spec, tmp_path)
    assert row["best_lr"] == hi and row["complete"]
    assert row["n_seeds"] == 3 and row["diverged_seeds"] == 2 and row["diverged"] == [1, 2]
    assert math.isnan(row["extra"]["accuracy"]["mean"])  # no known worst value: undefined, not the survivor's
    md = markdown(spec, [row])
    if select == "accuracy":
        assert row["report_mean"] == pytest.approx(0.3)
        assert row["report_std"] == pytest.approx(math.sqrt((0.6**2 + 2 * 0.3**2) / 2))
        assert "| `attention` | 0.30 ± 0.52 (3, 2 diverged, edge lr) |" in summary_table(spec, [row])
        assert "seed(s) 1, 2 diverged (counted as accuracy 0 in the mean)" in md
        assert "0.900, diverged, diverged" in md
    else:
        assert row["report_mean"] == math.inf and math.isnan(row["report_std"])
        assert "| `attention` | inf (3, 2 diverged, edge lr) |" in summary_table(spec, [row])
        assert "seed(s) 1, 2 diverged (counted as loss inf in the mean)" in md
    payload = json.loads(json.dumps({"select": select, "cpu_hours": 0.0, "rows": [row]}))
    entry = next(iter(headline_summary(spec, payload)["settings"].values()))["attention"]
    assert entry["mean"] == (0.3 if select == "accuracy" else None) and entry["diverged_seeds"] == 2
    assert entry["diverged"].startswith("seed(s) 1, 2 diverged")
    json.dumps(entry, allow_nan=False)  # what update_headline writes


def test_partial_rows_are_marked(tmp_path):
    spec = load_spec(tiny(mixers=["attention"]))
    lo, hi = spec.lrs
    valid = {(lo, 0): 0.3, (lo, 1): 0.3, (hi, 0): 0.9, (hi, 1): 0.9}
    _fake_results(spec, tmp_path, valid, valid)
    (tmp_path / spec.points()[-1].rel_dir / "result.json").unlink()
    (row,) = collect(spec, tmp_path)
    assert not row["complete"] and row["runs_done"] == 3
    from seqmem.sweep.report import markdown

    md = markdown(spec, [row])
    assert "PARTIAL" in md
    # the summary pivot: one cell per setting, mean ± std and the seed count, '*' while the row is incomplete
    assert "| `attention` | 0.90 (1, edge lr)* |" in md


def test_first_seed_protocol_runs_other_seeds_only_at_the_chosen_lr(tmp_path):
    raw = tiny(lr_selection="first_seed", train__seeds=[0, 1, 2], train__steps=4, mixers=["attention"])
    spec = load_spec(raw)
    lo, hi = spec.lrs
    log: list[str] = []
    res = run_sweep(spec, tmp_path, jobs=1, log=log.append, probe=False)
    # 2 lrs with seed 0, then seeds 1 and 2 at the chosen lr: 4 runs, not 6
    assert res["total"] == 4 and res["ran"] == 4
    (row,) = collect(spec, tmp_path)
    assert row["complete"] and row["n_seeds"] == 3
    finished = {(p.lr, p.seed) for p in spec.points() if (tmp_path / p.rel_dir / "result.json").exists()}
    best = row["best_lr"]
    assert finished == {(lo, 0), (hi, 0), (best, 1), (best, 2)}
    # the choice is the first seed's validation value
    v = {lr: json.loads((tmp_path / p.rel_dir / "result.json").read_text())["valid"]["accuracy"]
         for p in spec.points() if p.seed == 0 for lr in [p.lr]}
    assert v[best] == max(v.values())


def test_notes_and_length_reasons_reach_the_report(tmp_path):
    raw = tiny(mixers=["swa", "attention"], notes={"attention": "the reference"})
    spec = load_spec(raw)
    lo, hi = spec.lrs
    vals = {(lr, s): 0.5 for lr in (lo, hi) for s in (0, 1)}
    _fake_results(spec, tmp_path, vals, vals)
    rows = {r["mixer"]: r for r in collect(spec, tmp_path)}
    assert rows["swa"]["cannot_reach_first_token"] and "window of 4 tokens" in rows["swa"]["length_note"]
    assert rows["attention"]["note"] == "the reference"
    from seqmem.sweep.report import markdown

    md = markdown(spec, list(rows.values()))
    assert "the reference" in md and "by design cannot see the whole sequence" in md
    with pytest.raises(SpecError, match="not rows"):
        load_spec(tiny(notes={"nobody": "x"}))


def test_killed_sweep_leaves_no_workers_and_resumes_to_the_same_report(tmp_path):
    """The acceptance scenario: `seqmem sweep` with 2 workers is SIGKILLed after its first finished run; its
    workers exit on their own, and re-running the same command completes the sweep with the numbers of an
    uninterrupted run."""
    import os
    import signal
    import subprocess
    import sys
    import time

    raw = tiny(train__steps=40, train__seeds=[0], mixers=["attention"])
    spec_file = tmp_path / "s.json"
    spec_file.write_text(json.dumps(raw))
    out = tmp_path / "killed"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "seqmem", "sweep", str(spec_file), "--out", str(out), "--jobs", "2", "--no-probe"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not list(out.rglob("result.json")) and proc.poll() is None:
        time.sleep(0.2)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(5)  # the workers notice their parent is gone within ~2 s
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(out) not in ps and "tracker_fd" not in "".join(
        line for line in ps.splitlines() if "spawn_main" in line and str(os.getpid()) in line)
    assert subprocess.run(cmd, env=env, capture_output=True).returncode == 0
    spec = load_spec(raw)
    clean = tmp_path / "clean"
    run_sweep(spec, clean, jobs=1, log=quiet, probe=False)
    for x, y in zip(collect(spec, out), collect(spec, clean)):
        assert x["per_seed"] == y["per_seed"] and x["lr_valid"] == y["lr_valid"] and x["complete"]


def _fake_finished(spec, like, lr: float, seed: int, acc: float, out: Path) -> None:
    """A finished run of ``like``'s row at (lr, seed) with validation and reported accuracy ``acc``."""
    from seqmem.io import atomic_write_text

    p = spec.point_at(like, lr, seed)
    r = {"status": "finished", "state": 1, "params": 1, "seconds": 1.0, "valid": {"accuracy": acc, "loss": 1.0},
         "report": {"accuracy": acc, "loss": 1.0}}
    atomic_write_text(out / p.rel_dir / "run.json", json.dumps(p.run_spec))
    atomic_write_text(out / p.rel_dir / "result.json", json.dumps(_sealed(p.run_spec, r)))


def test_lr_grid_is_extended_while_the_best_lr_is_at_an_edge(tmp_path):
    """With lr_extend, a row whose best first-seed lr is the largest tried also tries lr x factor (at most
    lr_extend times per side); the other seeds then run at the final choice."""
    from seqmem.sweep.runner import row_plan

    raw = tiny(lr_selection="first_seed", train__seeds=[0, 1], mixers=["attention"])
    raw["train"]["lr_extend"] = 2
    spec = load_spec(raw)
    lo, hi = spec.lrs  # 3e-3, 1e-2
    pts = spec.points()

    def fake(lr: float, seed: int, acc: float) -> None:
        _fake_finished(spec, pts[0], lr, seed, acc, tmp_path)

    fake(lo, 0, 0.5)
    fake(hi, 0, 0.6)  # best at the top edge -> try 3e-2
    s1, s2, decided = row_plan(spec, pts, tmp_path)
    assert [p.lr for p in s1] == [lo, hi, 0.03] and not decided
    assert s1[-1].rel_dir.name == "seed0" and s1[-1].rel_dir.parent.name == "lr0.03"
    fake(0.03, 0, 0.7)  # still the best at the edge -> try 9e-2 (the second and last extension upwards)
    s1, s2, decided = row_plan(spec, pts, tmp_path)
    assert [p.lr for p in s1] == [lo, hi, 0.03, 0.09]
    fake(0.09, 0, 0.65)  # the best is now inside: decided, seed 1 at 0.03
    s1, s2, decided = row_plan(spec, pts, tmp_path)
    assert decided and [(p.lr, p.seed) for p in s2] == [(0.03, 1)]
    fake(0.03, 1, 0.75)
    (row,) = collect(spec, tmp_path)
    assert row["best_lr"] == 0.03 and row["per_seed"] == {0: 0.7, 1: 0.75} and row["complete"]
    assert row["runs_total"] == 5 and row["lr_valid"] == {"0.003": 0.5, "0.01": 0.6, "0.03": 0.7, "0.09": 0.65}


def test_a_tie_that_reaches_the_grid_edge_is_an_edge_choice(tmp_path):
    """choose_lr keeps the first lr of a tie; a tie that includes the grid's edge hides an edge choice, so
    lr_extend probes beyond the tied edge lr and the report marks the tie ('(tie: …)') and the edge.  A tie at the
    metric's best possible value (accuracy 1) says nothing about where the best lr lies: not marked, not
    extended beyond what the first lr's own position asks."""
    from seqmem.sweep.report import markdown
    from seqmem.sweep.runner import row_plan, tied_lrs

    assert tied_lrs({1e-3: 0.5, 3e-3: 0.6, 1e-2: 0.6}, 3e-3, "accuracy") == [3e-3, 1e-2]
    assert tied_lrs({1e-3: 1.0, 3e-3: 1.0}, 1e-3, "accuracy") == [1e-3]  # saturated
    assert tied_lrs({1e-3: 2.0, 3e-3: 2.0}, 1e-3, "loss") == [1e-3, 3e-3]
    assert tied_lrs({1e-3: math.nan, 3e-3: math.nan}, 1e-3, "loss") == [1e-3]

    raw = tiny(lr_selection="first_seed", train__seeds=[0, 1], mixers=["attention"], train__lrs=[1e-3, 3e-3, 1e-2])
    raw["train"]["lr_extend"] = 1
    spec = load_spec(raw)
    pts = spec.points()

    def fake(lr: float, seed: int, acc: float) -> None:
        _fake_finished(spec, pts[0], lr, seed, acc, tmp_path)

    fake(1e-3, 0, 0.5)
    fake(3e-3, 0, 0.6)  # chosen (first of the tie) ...
    fake(1e-2, 0, 0.6)  # ... tied with the top edge: probe 3e-2
    s1, s2, decided = row_plan(spec, pts, tmp_path)
    assert [p.lr for p in s1] == [1e-3, 3e-3, 1e-2, 0.03] and not decided
    fake(0.03, 0, 0.6)  # tied again, and lr_extend = 1 is spent: decided at 3e-3, reported as an edge tie
    s1, s2, decided = row_plan(spec, pts, tmp_path)
    assert decided and [(p.lr, p.seed) for p in s2] == [(3e-3, 1)]
    fake(3e-3, 1, 0.62)
    (row,) = collect(spec, tmp_path)
    assert row["best_lr"] == 3e-3 and row["lr_tied"] == ["0.003", "0.01", "0.03"] and row["lr_at_grid_edge"]
    assert "0.003 (edge) (tie: 0.003 = 0.01 = 0.03)" in markdown(spec, [row])
    fake(0.03, 0, 0.55)  # the probe loses: the tie (3e-3, 1e-2) is interior, no edge mark
    (row,) = collect(spec, tmp_path)
    assert row["lr_tied"] == ["0.003", "0.01"] and not row["lr_at_grid_edge"] and row["complete"]
    for lr in (1e-3, 3e-3, 1e-2, 0.03):  # every lr at accuracy 1: no tie marked, the usual edge rule only
        fake(lr, 0, 1.0)
    fake(1e-3, 1, 1.0)
    (row,) = collect(spec, tmp_path)
    assert "lr_tied" not in row and row["best_lr"] == 1e-3


def test_lr_confirm_gives_lrs_within_the_seed_spread_every_seed_and_chooses_on_the_mean(tmp_path):
    """lr_confirm (first_seed): once the first-seed choice has every seed, an lr whose first-seed validation is
    within twice the choice's seed std gets every seed too (one beyond it does not), and the row's lr is the best
    validation mean over seeds; the report shows those means.  Without it, nothing changes."""
    from seqmem.sweep.runner import plan_rows, row_plan

    raw = tiny(lr_selection="first_seed", train__seeds=[0, 1, 2], mixers=["attention"], train__lrs=[1e-3, 3e-3, 1e-2])
    raw["train"]["lr_confirm"] = True
    spec = load_spec(raw)
    pts = spec.points()

    def fake(lr: float, seed: int, acc: float) -> None:
        _fake_finished(spec, pts[0], lr, seed, acc, tmp_path)

    fake(1e-3, 0, 0.50)  # beyond the spread
    fake(3e-3, 0, 0.80)  # the first-seed choice
    fake(1e-2, 0, 0.78)  # within it
    s1, s2, decided = row_plan(spec, pts, tmp_path)
    assert decided and [(p.lr, p.seed) for p in s2] == [(3e-3, 1), (3e-3, 2)]  # the spread is not known yet
    fake(3e-3, 1, 0.70)
    fake(3e-3, 2, 0.75)  # std 0.05: spread 0.10 takes 1e-2 (0.02 away), not 1e-3 (0.30)
    s1, s2, decided = row_plan(spec, pts, tmp_path)
    assert [(p.lr, p.seed) for p in s2] == [(3e-3, 1), (3e-3, 2), (1e-2, 1), (1e-2, 2)]
    (row,) = collect(spec, tmp_path)
    assert row["best_lr"] == 3e-3 and not row["complete"] and row["runs_total"] == 7
    fake(1e-2, 1, 0.79)
    fake(1e-2, 2, 0.80)  # mean 0.79 beats 0.75
    (row,) = collect(spec, tmp_path)
    assert row["best_lr"] == 1e-2 and row["complete"] and row["per_seed"] == {0: 0.78, 1: 0.79, 2: 0.80}
    assert row["lr_valid_mean"] == pytest.approx({"0.003": 0.75, "0.01": 0.79})
    from seqmem.sweep.report import markdown

    assert "mean over seeds: 0.003: 0.750, 0.01: 0.790" in markdown(spec, [row])
    fake(1e-3, 1, 0.99)
    fake(1e-3, 2, 0.99)  # runs on disk that the row's plan does not ask for do not enter the choice
    (row,) = collect(spec, tmp_path)
    assert row["best_lr"] == 1e-2 and set(row["lr_valid_mean"]) == {"0.003", "0.01"}
    assert sum(len(p.points) for p in plan_rows(spec, tmp_path).values()) == 7
    # without lr_confirm the first-seed choice stands and 1e-2 gets no other seeds
    raw["train"]["lr_confirm"] = False
    plain = load_spec(raw)
    (row,) = collect(plain, tmp_path)
    assert row["best_lr"] == 3e-3 and "lr_valid_mean" not in row and row["runs_total"] == 5
    # a diverged seed at the first-seed choice is its worst value: the spread has no bound, every lr gets every seed
    from seqmem.io import atomic_write_text

    p = spec.point_at(pts[0], 3e-3, 2)
    r = {"status": "diverged", "state": 1, "params": 1, "seconds": 1.0}
    atomic_write_text(tmp_path / p.rel_dir / "result.json", json.dumps(_sealed(p.run_spec, r)))
    s1, s2, _ = row_plan(spec, pts, tmp_path)
    assert {p.lr for p in s2} == {1e-3, 3e-3, 1e-2}
    # lr_confirm needs first_seed
    raw["train"]["lr_confirm"] = True
    raw["lr_selection"] = "all_seeds"
    with pytest.raises(SpecError, match="lr_confirm needs lr_selection"):
        load_spec(raw)


def _confirm_extend_row(out: Path):
    """A first_seed row with lr_confirm and lr_extend = 1 (lrs 1e-3 / 3e-3 / 1e-2, seeds 0-2): its spec, points,
    and a ``fake(lr, seed, acc)`` writing a finished run under ``out``."""
    raw = tiny(lr_selection="first_seed", train__seeds=[0, 1, 2], mixers=["attention"], train__lrs=[1e-3, 3e-3, 1e-2])
    raw["train"]["lr_confirm"] = True
    raw["train"]["lr_extend"] = 1
    spec = load_spec(raw)
    pts = spec.points()

    def fake(lr: float, seed: int, acc: float) -> None:
        _fake_finished(spec, pts[0], lr, seed, acc, out)

    return spec, pts, fake


def test_lr_confirm_probes_beyond_a_mean_over_seeds_choice_at_the_edge(tmp_path):
    """lr_confirm with lr_extend: when the mean over seeds moves the choice to the grid's edge (the first seed
    chose inside it), the lr beyond that edge is probed with the first seed, gets every seed if it is within the
    seed spread there, and the mean over seeds decides again; the row is undecided while the probe runs (its
    finished other seeds stay in the plan)."""
    from seqmem.sweep.runner import row_plan

    spec, pts, fake = _confirm_extend_row(tmp_path)

    def plan() -> tuple[list[tuple[float, int]], list[tuple[float, int]], bool]:
        s1, s2, decided = row_plan(spec, pts, tmp_path)
        return [(p.lr, p.seed) for p in s1], [(p.lr, p.seed) for p in s2], decided

    fake(1e-3, 0, 0.50)
    fake(3e-3, 0, 0.80)  # the first-seed choice, interior
    fake(1e-2, 0, 0.78)
    fake(3e-3, 1, 0.70)
    fake(3e-3, 2, 0.75)  # spread 0.10: 1e-2 gets every seed
    fake(1e-2, 1, 0.85)
    assert plan()[2] and (0.03, 0) not in plan()[0]  # 1e-2 still has a seed running: no probe yet
    fake(1e-2, 2, 0.86)  # mean 0.83 beats 0.75: the choice moves to 1e-2, the grid's top -> probe 3e-2
    s1, s2, decided = plan()
    assert s1[-1] == (0.03, 0) and not decided and (1e-2, 2) in s2  # the finished seeds stay planned
    (row,) = collect(spec, tmp_path)
    assert not row["complete"] and row["best_lr"] == 1e-2
    fake(0.03, 0, 0.79)  # within the spread of the first-seed choice: every seed
    s1, s2, decided = plan()
    assert decided and {(0.03, 1), (0.03, 2)} <= set(s2)
    fake(0.03, 1, 0.70)
    fake(0.03, 2, 0.70)  # mean 0.73: 1e-2 stays, now interior
    s1, s2, decided = plan()
    assert decided and [lr for lr, _ in s1] == [1e-3, 3e-3, 1e-2, 0.03]
    (row,) = collect(spec, tmp_path)
    assert row["best_lr"] == 1e-2 and row["complete"] and not row["lr_at_grid_edge"] and row["runs_total"] == 10
    assert row["lr_valid_mean"] == pytest.approx({"0.003": 0.75, "0.01": 0.83, "0.03": 0.73})
    fake(0.03, 0, 0.30)  # a probe beyond the spread gets no other seeds and shows the choice interior
    s1, s2, decided = plan()
    assert decided and not any(lr == 0.03 for lr, _ in s2)
    (row,) = collect(spec, tmp_path)
    assert row["best_lr"] == 1e-2 and not row["lr_at_grid_edge"] and row["complete"]


def test_lr_confirm_edge_probe_that_wins_the_first_seed_keeps_the_lrs_with_every_seed(tmp_path):
    """The mean-over-seeds probe may win on the first seed and become the first-seed choice; the lrs already
    given every seed stay in the plan and in the choice, so the best mean (1e-2) is chosen, not the probe.  When
    the side's probes are spent, a choice the mean puts at the edge stays there, marked '(edge)'."""
    from seqmem.sweep.runner import row_plan

    spec, pts, fake = _confirm_extend_row(tmp_path)

    for lr, vals in {1e-3: [0.5], 3e-3: [0.80, 0.70, 0.75], 1e-2: [0.78, 0.95, 0.95]}.items():
        for seed, v in enumerate(vals):
            fake(lr, seed, v)
    fake(0.03, 0, 0.90)  # the probe of the mean's edge choice 1e-2 wins seed 0: its seeds run too ...
    s1, s2, decided = row_plan(spec, pts, tmp_path)
    assert {(1e-2, 1), (1e-2, 2), (3e-3, 1), (3e-3, 2), (0.03, 1), (0.03, 2)} <= {(p.lr, p.seed) for p in s2}
    fake(0.03, 1, 0.88)
    fake(0.03, 2, 0.88)  # ... mean 0.887 < 1e-2's 0.893: 1e-2, interior now, stays the choice
    (row,) = collect(spec, tmp_path)
    assert row["best_lr"] == 1e-2 and not row["lr_at_grid_edge"] and row["complete"] and row["runs_total"] == 10
    assert set(row["lr_valid_mean"]) == {"0.003", "0.01", "0.03"}

    out = tmp_path / "spent"  # the first seed took the side's one probe already
    for lr, vals in {1e-3: [0.5], 3e-3: [0.6], 1e-2: [0.80, 0.70, 0.75], 0.03: [0.78, 0.85, 0.86]}.items():
        for seed, v in enumerate(vals):
            _fake_finished(spec, pts[0], lr, seed, v, out)
    s1, s2, decided = row_plan(spec, pts, out)
    assert decided and [p.lr for p in s1] == [1e-3, 3e-3, 1e-2, 0.03]  # no second probe upwards
    (row,) = collect(spec, out)
    assert row["best_lr"] == 0.03 and row["lr_at_grid_edge"] and row["complete"]


def test_ties_reach_both_edges_and_all_seeds_means(tmp_path):
    """A tie at the bottom edge probes downwards, one spanning the grid probes both sides (lr_extend each), a
    loss tie counts as an accuracy tie does, and under all_seeds a tie of means at the edge is probed too."""
    from seqmem.sweep.runner import all_seeds_plan, row_plan

    raw = tiny(lr_selection="first_seed", train__seeds=[0, 1], mixers=["attention"], train__lrs=[1e-3, 3e-3, 1e-2])
    raw["train"]["lr_extend"] = 1
    spec = load_spec(raw)
    pts = spec.points()
    for lr, v in {1e-3: 0.4, 3e-3: 0.4, 1e-2: 0.3}.items():  # a tie with the bottom edge
        _fake_finished(spec, pts[0], lr, 0, v, tmp_path / "low")
    assert [p.lr for p in row_plan(spec, pts, tmp_path / "low")[0]][-1] == 3e-4
    for lr in (1e-3, 3e-3, 1e-2):  # a tie across the grid (a model at a floor): both sides, once each
        _fake_finished(spec, pts[0], lr, 0, 0.25, tmp_path / "flat")
    s1, _, decided = row_plan(spec, pts, tmp_path / "flat")
    assert [p.lr for p in s1][3:] == [0.03] and not decided
    _fake_finished(spec, pts[0], 0.03, 0, 0.25, tmp_path / "flat")
    assert [p.lr for p in row_plan(spec, pts, tmp_path / "flat")[0]][3:] == [0.03, 3e-4]
    _fake_finished(spec, pts[0], 3e-4, 0, 0.25, tmp_path / "flat")
    s1, s2, decided = row_plan(spec, pts, tmp_path / "flat")
    assert decided and len(s1) == 5 and [(p.lr, p.seed) for p in s2] == [(1e-3, 1)]  # the first in spec order

    loss = load_spec({**raw, "select": "loss"})
    lpts = loss.points()
    for lr, v in {1e-3: 2.5, 3e-3: 2.0, 1e-2: 2.0}.items():  # a loss tie with the top edge
        p = loss.point_at(lpts[0], lr, 0)
        r = {"status": "finished", "state": 1, "params": 1, "seconds": 1.0, "valid": {"accuracy": 0.1, "loss": v},
             "report": {"accuracy": 0.1, "loss": v}}
        from seqmem.io import atomic_write_text

        atomic_write_text(tmp_path / "loss" / p.rel_dir / "run.json", json.dumps(p.run_spec))
        atomic_write_text(tmp_path / "loss" / p.rel_dir / "result.json", json.dumps(_sealed(p.run_spec, r)))
    assert [p.lr for p in row_plan(loss, lpts, tmp_path / "loss")[0]][-1] == 0.03

    raw2 = tiny(train__seeds=[0, 1], mixers=["attention"], train__lrs=[1e-3, 3e-3, 1e-2])
    raw2["train"]["lr_extend"] = 1
    alls = load_spec(raw2)
    apts = alls.points()
    for lr, vals in {1e-3: [0.5, 0.5], 3e-3: [0.6, 0.7], 1e-2: [0.7, 0.6]}.items():  # means 0.65 tie at the top
        for seed, v in enumerate(vals):
            _fake_finished(alls, apts[0], lr, seed, v, tmp_path / "all")
    runs, decided = all_seeds_plan(alls, apts, tmp_path / "all")
    assert (0.03, 0) in [(p.lr, p.seed) for p in runs] and not decided


def test_all_seeds_extends_an_edge_lr_by_a_first_seed_probe(tmp_path):
    """all_seeds with lr_extend: while the best mean-over-seeds lr is the largest tried, lr x factor is probed with
    the first seed; a probe that loses there is never chosen and makes the best interior (no '(edge)'); one that
    wins gets the other seeds and joins the choice; at most lr_extend probes per side."""
    from seqmem.io import atomic_write_text
    from seqmem.sweep.report import summary_table
    from seqmem.sweep.runner import all_seeds_plan, extension_candidates, wanted_points

    raw = tiny(train__seeds=[0, 1], mixers=["attention"])
    raw["train"]["lr_extend"] = 2
    spec = load_spec(raw)
    lo, hi = spec.lrs  # 3e-3, 1e-2
    pts = spec.points()

    def fake(lr: float, seed: int, acc: float, out: Path = tmp_path) -> None:
        p = spec.point_at(pts[0], lr, seed)
        r = {"status": "finished", "state": 1, "params": 1, "seconds": 1.0, "valid": {"accuracy": acc, "loss": 1.0},
             "report": {"accuracy": acc, "loss": 1.0}}
        atomic_write_text(out / p.rel_dir / "run.json", json.dumps(p.run_spec))
        atomic_write_text(out / p.rel_dir / "result.json", json.dumps(_sealed(p.run_spec, r)))

    def plan() -> tuple[list[tuple[float, int]], bool]:
        runs, decided = all_seeds_plan(spec, pts, tmp_path)
        return [(p.lr, p.seed) for p in runs], decided

    grid = [(p.lr, p.seed) for p in pts]
    assert plan() == (grid, False) and len(wanted_points(spec, tmp_path)) == 4
    for seed, (a, b) in enumerate([(0.5, 0.6), (0.5, 0.61)]):
        fake(lo, seed, a)
        fake(hi, seed, b)  # the best mean (0.605, spread 2 std = 0.014) at the top edge -> probe 3e-2 with seed 0
    assert plan() == (grid + [(0.03, 0)], False)
    fake(0.03, 0, 0.595)  # below the best lr's seed 0 (0.6) but within the seed spread: rule 1 wants its seeds
    assert plan() == (grid + [(0.03, 0), (0.03, 1)], False)
    fake(0.03, 0, 0.55)  # below it beyond the spread: the best is interior, the probe never chosen
    assert plan() == (grid + [(0.03, 0)], True)
    (row,) = collect(spec, tmp_path)
    assert row["best_lr"] == hi and not row["lr_at_grid_edge"] and row["complete"]
    assert row["lr_valid"] == {"0.003": 0.5, "0.01": pytest.approx(0.605)} and row["lr_probe"] == {"0.03": 0.55}
    write_report(spec, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "0.03: 0.550 (probe, first seed)" in md and "probed with seed 0" in md
    assert "edge lr" not in summary_table(spec, [row])  # the probe showed the best interior: no edge mark

    fake(0.03, 0, 0.8)  # the probe now beats seed 0 there: the other seed decides
    assert plan() == (grid + [(0.03, 0), (0.03, 1)], False)
    fake(0.03, 1, 0.9)  # mean 0.85, the best, at the edge again -> the second and last probe upwards, 9e-2
    assert plan() == (grid + [(0.03, 0), (0.03, 1), (0.09, 0)], False)
    fake(0.09, 0, 0.95)
    fake(0.09, 1, 0.99)
    assert plan() == (grid + [(0.03, 0), (0.03, 1), (0.09, 0), (0.09, 1)], True)  # no third probe
    (row,) = collect(spec, tmp_path)
    assert row["best_lr"] == 0.09 and row["lr_at_grid_edge"] and "lr_probe" not in row
    assert "(2, edge lr)" in summary_table(spec, [row])  # still at the edge after the last probe: the summary says so
    assert row["per_seed"] == {0: 0.95, 1: 0.99} and row["runs_total"] == 8
    # --reuse may copy every run an extension could ask for: two lrs per side, every seed
    cands = {(p.lr, p.seed) for p in extension_candidates(spec, pts)}
    assert cands == {(lr, s) for lr in (0.03, 0.09, 1e-3, 3e-4) for s in (0, 1)}
    # a row with its own single lr is never extended (as under first_seed)
    one = load_spec({**raw, "mixers": [{"name": "attention", "lrs": [1e-2]}]})
    out = tmp_path / "one"
    for seed in (0, 1):
        fake(1e-2, seed, 0.9, out)
    runs, decided = all_seeds_plan(one, one.points(), out)
    assert decided and [(p.lr, p.seed) for p in runs] == [(1e-2, 0), (1e-2, 1)]
    assert extension_candidates(one, one.points()) == []


def test_the_estimate_counts_only_the_steps_part_trained_runs_have_left(tmp_path, monkeypatch):
    """A run resumed from a checkpoint at step 5 of 10 costs half a run in the ETA (it used to count a whole one,
    so a sweep of part-trained runs was estimated far above what it took)."""
    import re

    from seqmem.sweep import runner

    spec = load_spec(tiny(train__steps=10, mixers=["attention"]))  # 2 lrs x 2 seeds
    monkeypatch.setattr(runner, "estimate_costs", lambda pts, *a, **k: {p: 360.0 for p in pts})
    p0, p1 = spec.points()[:2]
    (tmp_path / p0.rel_dir / "checkpoints" / "ckpt-00000005").mkdir(parents=True)
    (tmp_path / p1.rel_dir / "checkpoints" / "ckpt-00000002").mkdir(parents=True)
    (tmp_path / p1.rel_dir / "checkpoints" / "ckpt-00000008").mkdir(parents=True)
    (tmp_path / p1.rel_dir / "checkpoints" / "not-a-checkpoint").mkdir()
    (tmp_path / p1.rel_dir / "checkpoints" / "ckpt-old").mkdir()  # sorts last, is not a step: ignored
    assert runner.trained_fraction(tmp_path / p0.rel_dir, 10) == 0.5
    assert runner.trained_fraction(tmp_path / p1.rel_dir, 10) == 0.8
    assert runner.trained_fraction(tmp_path / spec.points()[2].rel_dir, 10) == 0.0
    lines: list[str] = []
    run_sweep(spec, tmp_path, jobs=1, log=lines.append, probe=True, dry_run=True)
    (line,) = [x for x in lines if x.startswith("estimated")]
    # 4 runs x 360 s, less 0.5 and 0.8 of a run: (4 - 1.3) x 0.1 h
    assert float(re.match(r"estimated ([\d.]+) CPU-hours", line)[1]) == pytest.approx(0.27)
    assert "2 part-trained" in line


def test_runs_with_the_most_time_left_start_first(tmp_path, monkeypatch):
    """Within a slice the runs start in order of the CPU time they have left: a row's cost per run less what a
    part-trained run has done (so two workers finish together instead of one starting a whole run last)."""
    from seqmem.sweep import runner

    spec = load_spec(tiny(train__steps=10, mixers=["attention"]))  # 2 lrs x 2 seeds, one row
    monkeypatch.setattr(runner, "estimate_costs", lambda pts, *a, **k: {p: 360.0 for p in pts})
    a, b, c, d = spec.points()
    (tmp_path / a.rel_dir / "checkpoints" / "ckpt-00000008").mkdir(parents=True)
    (tmp_path / b.rel_dir / "checkpoints" / "ckpt-00000003").mkdir(parents=True)
    lines: list[str] = []
    run_sweep(spec, tmp_path, jobs=1, log=lines.append, probe=True, dry_run=True)
    assert [x.split()[-1] for x in lines if x.strip().startswith("would run")] == [
        str(p.rel_dir) for p in (c, d, b, a)]
    # --resume-first: the part-trained runs first, the furthest trained first; then the rest as before
    lines.clear()
    run_sweep(spec, tmp_path, jobs=1, log=lines.append, probe=True, dry_run=True, resume_first=True)
    assert [x.split()[-1] for x in lines if x.strip().startswith("would run")] == [
        str(p.rel_dir) for p in (a, b, c, d)]


def test_the_eta_credits_what_runs_in_flight_have_trained(tmp_path):
    """The ETA's rate is the work this process has done over its wall time: a finished run counts whole, a run still
    in flight by its newest checkpoint, a resumed one only for the share it added here, and a row whose cost is
    unknown (NaN) not at all (it used to credit finished runs alone, so with several workers it started high)."""
    from seqmem.io import atomic_write_text
    from seqmem.sweep import runner

    spec = load_spec(tiny(train__steps=10, mixers=["attention"]))  # 2 lrs x 2 seeds
    a, b, c, d = spec.points()
    done = {"status": "finished", "valid": {"accuracy": 0.5}, "report": {"accuracy": 0.5}}
    atomic_write_text(tmp_path / a.rel_dir / "result.json", json.dumps(_sealed(a.run_spec, done)))  # finished here
    (tmp_path / b.rel_dir / "checkpoints" / "ckpt-00000004").mkdir(parents=True)  # in flight, 0.4 done
    # resumed from 0.5, finished here
    atomic_write_text(tmp_path / c.rel_dir / "result.json", json.dumps(_sealed(c.run_spec, done)))
    cost = {a.group: 100.0}
    assert runner.work_done(tmp_path, {a, b, c, d}, {c: 0.5}, cost) == pytest.approx(100 + 40 + 50)
    assert runner.work_done(tmp_path, {b}, {b: 0.4}, cost) == 0.0  # no step trained here yet
    assert runner.work_done(tmp_path, {a, b}, {}, {a.group: float("nan")}) == 0.0


def test_progress_counts_the_runs_an_lr_extension_adds(tmp_path, monkeypatch):
    """The progress line's [finished/needed] counts grow with an lr extension and its second-stage seeds: never
    more finished than needed, and "done" only on the last run (an extension used to print [5/4] ... done)."""
    import re

    from seqmem.io import atomic_write_text
    from seqmem.sweep import runner

    # the higher the lr the better: extends twice
    def fake_run(run_spec: dict, run_dir: str, threads: int, compile: bool = False, device: str = "cpu") -> dict:
        lr = run_spec["train"]["lr"]
        r = {"status": "finished", "state": 1, "params": 1, "seconds": 1.0,
             "valid": {"accuracy": lr, "loss": 1.0}, "report": {"accuracy": lr, "loss": 1.0}}
        r = _sealed(run_spec, r)
        atomic_write_text(Path(run_dir) / "run.json", json.dumps(run_spec))
        atomic_write_text(Path(run_dir) / "result.json", json.dumps(r))
        return r

    monkeypatch.setattr(runner, "_run_point_safe", fake_run)
    raw = tiny(lr_selection="first_seed", train__seeds=[0, 1], mixers=["attention"])
    raw["train"]["lr_extend"] = 2
    lines: list[str] = []
    run_sweep(load_spec(raw), tmp_path, jobs=1, log=lines.append, probe=False)
    progress = [re.match(r"\[(\d+)/(\d+)\] .*\| (.*)$", line) for line in lines if line.startswith("[")]
    counts = [(int(m[1]), int(m[2])) for m in progress]
    # 2 grid lrs, 2 extensions upwards (each the best when it finishes), then seed 1 at the last: 5 runs
    assert counts == [(1, 3), (2, 4), (3, 5), (4, 5), (5, 5)]
    assert [m[3] == "done" for m in progress] == [False, False, False, False, True]
    # the report's CPU-hours count every run trained, the extensions' too (1 s of wall clock each here)
    assert write_report(load_spec(raw), tmp_path)["cpu_hours"] * 3600 == pytest.approx(5.0)


def test_tune_group_gives_the_other_seeds_to_its_best_row_only(tmp_path, monkeypatch):
    """Rows sharing a tune group are one model with a hyperparameter chosen on validation: each row runs its first
    seed at every lr; none starts its other seeds before the whole group has chosen; then only the group's best row
    (first seed, at its chosen lr) gets them.  The report marks the choice and puts the group's paper value beside
    the chosen row; a row outside the group is unaffected."""
    import re

    from seqmem.io import atomic_write_text
    from seqmem.sweep import runner
    from seqmem.sweep.runner import plan_rows, wanted_points

    score = {"slow": 0.5, "mid": 0.7, "fast": 0.6, "attention": 0.4}  # validation accuracy by row, lr-independent

    def fake_run(run_spec: dict, run_dir: str, threads: int, compile: bool = False, device: str = "cpu") -> dict:
        acc = score[run_spec["sweep"]["mixer"]] + run_spec["train"]["lr"] + run_spec["train"]["seed"] / 100
        r = {"status": "finished", "state": 1, "params": 1, "seconds": 1.0,
             "valid": {"accuracy": acc, "loss": 1.0}, "report": {"accuracy": acc, "loss": 1.0}}
        r = _sealed(run_spec, r)
        atomic_write_text(Path(run_dir) / "run.json", json.dumps(run_spec))
        atomic_write_text(Path(run_dir) / "result.json", json.dumps(r))
        return r

    monkeypatch.setattr(runner, "_run_point_safe", fake_run)
    raw = tiny(lr_selection="first_seed", train__seeds=[0, 1, 2])
    raw["mixers"] = [{"name": n, "layers": ["attention"] * 2, "tune": "decay"} for n in ("slow", "mid", "fast")]
    raw["mixers"].append("attention")
    raw["paper"] = {"source": "T", "2 pairs": {"decay": 0.9}}
    spec = load_spec(raw)
    lo, hi = spec.lrs
    # before anything ran: every row's first seed, no other seeds, 2 seeds counted once for the group (on its first
    # row) and once for attention
    plans = plan_rows(spec, tmp_path)
    assert {k[1]: p.needed for k, p in plans.items()} == {"slow": 4, "mid": 2, "fast": 2, "attention": 4}
    assert all(p.seed == 0 for p in wanted_points(spec, tmp_path))
    # the group is decided only when all its rows are: with slow and mid done, fast not, nobody has seeds 1-2
    for p in spec.points():
        if p.seed == 0 and p.mixer in ("slow", "mid"):
            fake_run(p.run_spec, str(tmp_path / p.rel_dir), 1)
    plans = plan_rows(spec, tmp_path)
    assert not any(p.stage2 for k, p in plans.items() if p.tune) and plans[("2 pairs", "mid", ())].needed == 4
    lines: list[str] = []
    run_sweep(spec, tmp_path, jobs=1, log=lines.append, probe=False)
    done = {(p.mixer, p.lr, p.seed) for p in spec.points() if (tmp_path / p.rel_dir / "result.json").exists()}
    assert {(m, s) for m, _, s in done if s > 0} == {("mid", 1), ("mid", 2), ("attention", 1), ("attention", 2)}
    assert all(lr == hi for m, lr, s in done if s > 0)
    counts = [tuple(map(int, m.groups())) for line in lines if (m := re.match(r"\[(\d+)/(\d+)\]", line))]
    assert counts[-1] == (12, 12) and all(d <= n for d, n in counts)  # 3 x 2 + 2 + (2 + 2)
    rows = {r["mixer"]: r for r in collect(spec, tmp_path)}
    assert rows["mid"]["tune_chosen"] is True and rows["mid"]["n_seeds"] == 3 and rows["mid"]["paper"] == 0.9
    assert rows["slow"]["tune_chosen"] is False and rows["slow"]["n_seeds"] == 1 and rows["slow"]["paper"] is None
    assert rows["slow"]["complete"] and rows["slow"]["runs_total"] == 2
    assert rows["attention"]["tune"] is None and rows["attention"]["n_seeds"] == 3
    md = write_report(spec, tmp_path)
    text = (tmp_path / "report.md").read_text()
    assert "tune group 'decay': chosen on validation" in text and "not chosen (seed 0 only)" in text
    assert "(1, not chosen, edge lr)" in text and md["rows"]
    with pytest.raises(SpecError, match="first_seed"):
        load_spec({**raw, "lr_selection": "all_seeds"})
    with pytest.raises(SpecError, match="named like a mixer row"):
        load_spec({**raw, "mixers": raw["mixers"][:3] + [{"name": "attention", "tune": "attention"}]})
    with pytest.raises(SpecError, match="not rows or tune groups"):
        load_spec({**raw, "paper": {"2 pairs": {"nobody": 1.0}}})


def test_reuse_copies_only_identical_finished_runs(tmp_path):
    """--reuse: another sweep's finished runs with the same settings (all but the sweep's name) are copied and
    marked; a run that differs in anything else is trained, never taken."""
    from seqmem.sweep.runner import reuse_finished

    a, b = tmp_path / "a", tmp_path / "b"
    run_sweep(load_spec("tiny"), a, jobs=1, log=quiet, probe=False, limit=3)
    other = load_spec(tiny(name="tiny_headline"))
    done_a = [p for p in other.points() if (a / p.rel_dir / "result.json").exists()]
    assert len(done_a) == 3
    # a spec that differs in the training steps reuses nothing
    assert reuse_finished(load_spec(tiny(name="x", train__steps=31)).points(), b, [a], dry_run=True) == 0
    dry: list[str] = []  # a dry run lists the runs it would copy as reused, not as to run, and copies nothing
    run_sweep(other, b, jobs=1, log=dry.append, probe=False, reuse=[a], dry_run=True)
    for p in other.points():
        listed = [line for line in dry if line.endswith(str(p.rel_dir)) or f" {p.rel_dir} " in line]
        assert len(listed) == 1 and listed[0].lstrip().startswith("would reuse" if p in done_a else "would run")
    assert any("3 of the runs to run would be copied from --reuse" in line for line in dry)
    assert not b.exists() or not any(b.rglob("result.json"))
    log: list[str] = []
    res = run_sweep(other, b, jobs=1, log=log.append, probe=False, reuse=[a])
    assert res["finished_before"] == 3 and res["ran"] == 5 and any("reused 3 finished run(s)" in s for s in log)
    for p in other.points():
        r = json.loads((b / p.rel_dir / "result.json").read_text())
        assert json.loads((b / p.rel_dir / "run.json").read_text()) == p.run_spec  # this sweep's name
        if p in done_a:
            assert r["reused_from"] == str(a / p.rel_dir)
            src = json.loads((a / p.rel_dir / "result.json").read_text())
            assert r == seal({**src, "reused_from": str(a / p.rel_dir)})  # sealed again with its new key
            assert not (b / p.rel_dir / "checkpoints").exists()
        else:
            assert "reused_from" not in r
    with pytest.raises(SpecError, match="own --out"):
        run_sweep(other, b, jobs=1, log=quiet, probe=False, reuse=[b])
    with pytest.raises(SpecError, match="no such directory"):
        run_sweep(other, b, jobs=1, log=quiet, probe=False, reuse=[tmp_path / "missing"])


def test_reuse_finds_the_same_run_under_another_row_label_and_option_spelling(tmp_path):
    """A finished run is the same training run whatever its row or setting is called and however an option that
    builds the same layer is spelled (a linear-family conv_size of None and 0: no convolution): --reuse takes it
    and writes this sweep's labels; a layer that differs (conv_size 2) is trained."""
    from seqmem.registry import layer_identity
    from seqmem.sweep.runner import reuse_finished, run_identity

    assert layer_identity("linear_attention", {"conv_size": 0}) == layer_identity("linear_attention",
                                                                                  {"conv_size": None})
    assert layer_identity("linear_attention", {}) == layer_identity("linear_attention", {"conv_size": 4})
    assert layer_identity("linear_attention", {}) != layer_identity("linear_attention", {"conv_size": None})
    with pytest.raises(ValueError, match="unknown option"):
        layer_identity("linear_attention", {"conv": 0})

    def spec(name, label, setting, conv):
        return load_spec(tiny(name=name, settings=[{"label": setting, "options": {"seq_len": 16}}],
                              train__lrs=[1e-2], train__seeds=[0],
                              mixers=[{"name": label, "layers": ["linear_attention", "linear_attention"],
                                       "options": {"conv_size": conv}, "family": "baseline"}]))

    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    src = spec("src", "la-noconv", "two pairs", None)
    run_sweep(src, a, jobs=1, log=quiet, probe=False)
    same = spec("dst", "la-eq3", "2 pairs", 0)
    [p_src], [p_dst] = src.points(), same.points()
    assert p_src.rel_dir != p_dst.rel_dir and run_identity(p_src.run_spec) == run_identity(p_dst.run_spec)
    log: list[str] = []
    res = run_sweep(same, b, jobs=1, log=log.append, probe=False, reuse=[a])
    assert res["ran"] == 0 and res["finished_before"] == 1 and any("reused 1 finished run(s)" in m for m in log)
    r = json.loads((b / p_dst.rel_dir / "result.json").read_text())
    r_src = json.loads((a / p_src.rel_dir / "result.json").read_text())
    assert r["reused_from"] == str(a / p_src.rel_dir) and r["report"] == r_src["report"]
    assert (r["mixer"], r["setting"]) == ("la-eq3", "2 pairs") and (r_src["mixer"], r_src["setting"]) == \
        ("la-noconv", "two pairs")
    assert json.loads((b / p_dst.rel_dir / "run.json").read_text()) == p_dst.run_spec
    other = spec("dst2", "la-conv2", "2 pairs", 2)
    assert reuse_finished(other.points(), c, [a], dry_run=True) == 0
    assert reuse_finished(spec("dst3", "x", "2 pairs", 0).points(), c, [a], dry_run=True) == 1


def test_paper_numbers_stand_beside_ours_in_the_report(tmp_path):
    """A spec's [paper] table (transcribed numbers per setting and row) becomes a 'Paper vs ours' section and a
    'paper' column; naming an unknown setting or row, or a non-number, is refused."""
    mixers = [m["name"] for m in TINY["mixers"]]
    paper = {"source": "Table 1 (toy)", "scale": "30 steps instead of 10,000",
             "2 pairs": {mixers[0]: 0.987, mixers[1]: "n/a (diverged)"}}
    spec = load_spec(tiny(paper=paper))
    assert spec.paper == {"2 pairs": {mixers[0]: 0.987, mixers[1]: "n/a (diverged)"}}
    run_sweep(spec, tmp_path / "r", jobs=1, log=quiet, probe=False, limit=1)
    md = write_report(spec, tmp_path / "r", tmp_path / "rep")
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "## Paper vs ours" in text and "Paper: Table 1 (toy)" in text and "30 steps instead of 10,000" in text
    assert "0.987" in text and "n/a (diverged)" in text and "not run yet" in text
    assert {r["mixer"]: r["paper"] for r in md["rows"]} == {mixers[0]: 0.987, mixers[1]: "n/a (diverged)"}
    for bad, match in (({"3 pairs": {mixers[0]: 1.0}}, "setting that is not in the spec"),
                       ({"2 pairs": {"nope": 1.0}}, "not rows"),
                       ({"2 pairs": {mixers[0]: True}}, "finite number or a string"),
                       ({"2 pairs": {mixers[0]: float("nan")}}, "finite number or a string")):
        with pytest.raises(SpecError, match=match):
            load_spec(tiny(paper=bad))


def test_extra_metrics_are_tabulated_at_the_chosen_lr(tmp_path):
    """extra_metrics: more metrics of the reported split (e.g. per-bin accuracy), mean ± std over the seeds of the
    chosen lr; a metric the task does not report shows '—'; a malformed list is refused."""
    spec = load_spec(tiny(extra_metrics=["loss", "no_such_metric", "accuracy/loss"]))
    run_sweep(spec, tmp_path / "r", jobs=1, log=quiet, probe=False)
    payload = write_report(spec, tmp_path / "r", tmp_path / "rep")
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "loss (mean ± std)" in text and "no_such_metric (mean ± std)" in text
    for row in payload["rows"]:
        want = []
        for seed in spec.seeds:
            d = tmp_path / "r" / next(p.rel_dir for p in spec.points()
                                      if (p.mixer, p.lr, p.seed) == (row["mixer"], row["best_lr"], seed))
            want.append(json.loads((d / "result.json").read_text())["report"]["loss"])
        assert row["extra"]["loss"]["per_seed"] == want
        assert row["extra"]["loss"]["mean"] == pytest.approx(sum(want) / len(want))
        assert row["extra"]["no_such_metric"]["per_seed"] == []
        ratio = [json.loads((tmp_path / "r" / p.rel_dir / "result.json").read_text())["report"] for p in spec.points()
                 if (p.mixer, p.lr) == (row["mixer"], row["best_lr"])]
        assert row["extra"]["accuracy/loss"]["per_seed"] == [r["accuracy"] / r["loss"] for r in ratio]
    for bad in ("loss", ["loss", "loss"], [""]):
        with pytest.raises(SpecError, match="extra_metrics"):
            load_spec(tiny(extra_metrics=bad))


def test_headline_records_the_report(tmp_path, capsys):
    """--headline writes the report's chosen lr, mean ± std and per-seed values into a paper's headline.json
    under ours[<spec name>], keeps the rest of the file, and refuses a missing or malformed file."""
    spec = tmp_path / "s.json"
    spec.write_text(json.dumps(tiny(train__steps=4, train__lrs=[1e-2], train__seeds=[0, 1],
                                    mixers=["attention"])))
    out = tmp_path / "o"
    head = tmp_path / "headline.json"
    head.write_text(json.dumps({"paper": "Toy", "verdict": "pending", "ours": {"older_spec": {"kept": True}}}))
    assert main(["sweep", str(spec), "--out", str(out), "--no-probe", "--headline", str(head)]) == 0
    data = json.loads(head.read_text())
    assert data["paper"] == "Toy" and data["verdict"] == "pending" and data["ours"]["older_spec"] == {"kept": True}
    rec = data["ours"][TINY["name"]]
    report = json.loads((out / "report.json").read_text())
    (row,) = [r for r in report["rows"] if r["setting"] == report["rows"][0]["setting"]]
    entry = rec["settings"][row["setting"]]["attention"]
    assert entry["lr"] == 1e-2 and entry["complete"] and entry["runs"] == "2/2"
    assert entry["mean"] == round(row["report_mean"], 4) and entry["std"] == round(row["report_std"], 4)
    assert entry["per_seed"] == {str(k): round(v, 4) for k, v in row["per_seed"].items()}
    assert len(entry["per_seed"]) == 2
    assert rec["runs"] == "2/2" and rec["report"] == str(out / "report.md")
    # bad headline files: refused with a clear message, the file untouched
    capsys.readouterr()
    assert main(["sweep", str(spec), "--out", str(out), "--report", "--headline", str(tmp_path / "no.json")]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["sweep", str(spec), "--out", str(out), "--report", "--headline", str(bad)]) == 2
    assert "not valid JSON" in capsys.readouterr().err and bad.read_text() == "{not json"
    bad.write_text(json.dumps({"ours": [1, 2]}))
    assert main(["sweep", str(spec), "--out", str(out), "--report", "--headline", str(bad)]) == 2
    assert "'ours' must be an object" in capsys.readouterr().err


def test_step_time_probe_counts_cpu_time_not_waiting(monkeypatch):
    """The ETA probe times a step by CPU time, so time the process spends waiting (for a core on a loaded machine,
    here a sleep) does not inflate the cost estimate; the wall clock would count it."""
    import time

    from seqmem.io import time_calls
    from seqmem.sweep import runner

    def wait():
        time.sleep(0.2)

    assert min(time_calls(wait, repeats=1)) >= 0.2
    assert min(time_calls(wait, repeats=1, clock=time.process_time)) < 0.05
    # step_seconds: a model whose forward only waits costs (almost) nothing by the probe
    from seqmem.train import run as run_mod

    point = load_spec(tiny(train__steps=4, mixers=["attention"])).points()[0]
    base = runner.step_seconds(point.run_spec)

    real_build = run_mod.build_run

    def build_waiting(rs):
        model, task = real_build(rs)
        inner = model.forward

        def forward(*a, **k):
            time.sleep(0.3)
            return inner(*a, **k)

        model.forward = forward
        return model, task

    monkeypatch.setattr(run_mod, "build_run", build_waiting)
    assert runner.step_seconds(point.run_spec) < base + 0.15


def test_runs_record_cpu_time_and_the_report_sums_it(tmp_path):
    """A run records its CPU time beside its wall clock; the report's CPU-hours sum the CPU time, and runs recorded
    without it (before it was kept) are counted by wall clock and said to be."""
    spec = load_spec(tiny(train__steps=4, train__lrs=[1e-2], train__seeds=[0], mixers=["attention"]))
    out = tmp_path / "o"
    run_sweep(spec, out, jobs=1, log=quiet, probe=False)
    results = sorted(out.rglob("result.json"))
    assert results
    for f in results:
        r = json.loads(f.read_text())
        assert 0 < r["cpu_seconds"] <= r["seconds"] * 1.5 + 0.5
    payload = write_report(spec, out)
    cpu = sum(json.loads(f.read_text())["cpu_seconds"] for f in results)
    assert payload["cpu_hours"] == pytest.approx(cpu / 3600)
    assert "CPU time)" in (out / "report.md").read_text()
    r = json.loads(results[0].read_text())
    r["seconds"], _ = 7200.0, r.pop("cpu_seconds")
    results[0].write_text(json.dumps(seal(r)))  # as an older runner wrote it
    payload = write_report(spec, out)
    assert payload["cpu_hours"] >= 2.0
    # the only run has no CPU time: the whole report is by wall clock, and says so
    assert "CPU-hours (one thread each; wall clock: these runs predate CPU-time records" in \
        (out / "report.md").read_text()


def test_a_resumed_run_records_the_cpu_time_of_its_earlier_parts(tmp_path, monkeypatch):
    """A run cut mid-way and resumed by a later process counts the CPU time its checkpoint records for the steps
    before it (not only the last part's); a checkpoint written before that record is estimated at the resumed
    part's rate per step and the report says so; a legacy result (resumed, no record) is flagged as an undercount."""
    from seqmem.io import atomic_write_text
    from seqmem.train import TrainConfig, train
    from seqmem.train.checkpoint import latest_good_checkpoint
    from seqmem.train.run import build_run

    spec = load_spec(tiny(train__steps=20, train__lrs=[1e-2], train__seeds=[0, 1], mixers=["attention"],
                          train__checkpoint_every=10))
    out = tmp_path / "o"
    p, q = spec.points()[:2]
    pre = {}
    for pt in (p, q):
        d = out / pt.rel_dir
        atomic_write_text(d / "run.json", json.dumps(pt.run_spec))
        torch.manual_seed(pt.seed)
        model, task = build_run(pt.run_spec)
        train(model, task, TrainConfig(**pt.run_spec["train"]), out_dir=d, stop_after=10)
        ck = latest_good_checkpoint(d / "checkpoints")
        st = torch.load(ck / "trainer.pt", weights_only=True)
        assert st["step"] == 10 and st["cpu_seconds"] > 0
        pre[pt] = st["cpu_seconds"]
    # q's checkpoint as an older version wrote it: no CPU-time record (its manifest hash must follow the edit)
    from seqmem.train import checkpoint as ckmod
    ck = latest_good_checkpoint(out / q.rel_dir / "checkpoints")
    st = torch.load(ck / "trainer.pt", weights_only=True)
    del st["cpu_seconds"]
    torch.save(st, ck / "trainer.pt")
    man = json.loads((ck / "manifest.json").read_text())
    man["files"]["trainer.pt"] = ckmod._sha256(ck / "trainer.pt")
    (ck / "manifest.json").write_text(json.dumps(man))

    run_sweep(spec, out, jobs=1, log=quiet, probe=False)
    rp = json.loads((out / p.rel_dir / "result.json").read_text())
    rq = json.loads((out / q.rel_dir / "result.json").read_text())
    assert rp["resumed"] and rp["cpu_seconds_before_resume"] == pytest.approx(pre[p])
    assert rp["cpu_seconds"] > pre[p] and "cpu_seconds_estimated" not in rp
    assert rq["resumed"] and rq["cpu_seconds_estimated"] is True and rq["cpu_seconds_before_resume"] > 0
    assert rq["cpu_seconds"] > rq["cpu_seconds_before_resume"]
    md = write_report(spec, out) and (out / "report.md").read_text()
    assert "1 resumed run(s) from checkpoints that predate CPU-time records" in md
    assert "last part only" not in md
    del rp["cpu_seconds_before_resume"]  # a result written before the record: its CPU time is the last part's
    (out / p.rel_dir / "result.json").write_text(json.dumps(seal(rp)))
    write_report(spec, out)
    assert "1 resumed run(s) recorded with the CPU time of their last part only" in (out / "report.md").read_text()


def test_a_run_another_process_trains_is_skipped_and_taken_up_once_released(tmp_path):
    """Two sweeps into one --out share the grid: a run whose lock another process holds is neither trained twice
    nor touched (a race at the start returns "busy"), and is trained by a later invocation once the lock is free
    (as when its holder crashed)."""
    import fcntl
    import os

    from seqmem.io import LOCK, is_locked
    from seqmem.sweep.runner import run_point

    spec = load_spec("tiny")
    out = tmp_path / "out"
    held = spec.points()[0]
    d = out / held.rel_dir
    d.mkdir(parents=True)
    fd = os.open(d / LOCK, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # "another process" (flock locks are per open file)
    try:
        assert is_locked(d) and not is_locked(out / spec.points()[1].rel_dir)
        log: list[str] = []
        assert run_sweep(spec, out, jobs=1, log=log.append, probe=False, dry_run=True)["ran"] == 0
        assert any(str(held.rel_dir) in m and "another process is training it now" in m for m in log)
        res = run_sweep(spec, out, jobs=1, log=quiet, probe=False)
        assert res["ran"] == 7 and res["errors"] == 0
        assert sorted(p.name for p in d.iterdir()) == [LOCK]  # untouched: no run.json, metrics or checkpoints
        # the race: locked after the check, run_point refuses without writing anything
        assert run_point(held.run_spec, str(d))["status"] == "busy"
        assert sorted(p.name for p in d.iterdir()) == [LOCK]
    finally:
        os.close(fd)
    assert not is_locked(d)
    res = run_sweep(spec, out, jobs=1, log=quiet, probe=False)
    assert res["ran"] == 1 and json.loads((d / "result.json").read_text())["status"] == "finished"
    assert not is_locked(d)  # released after training


def test_runs_record_their_device_and_a_gpu_run_shows_in_the_report(tmp_path, capsys):
    """``--device``: each result.json says where it trained; the report lists the devices once any run trained off
    the CPU; a device this machine lacks is refused before anything runs."""
    spec = load_spec(tiny(train__steps=4, train__lrs=[1e-2], train__seeds=[0, 1], mixers=["attention"]))
    out = tmp_path / "o"
    run_sweep(spec, out, jobs=1, log=quiet, probe=False, device="cpu")
    results = sorted(out.rglob("result.json"))
    assert len(results) == 2 and all(json.loads(f.read_text())["device"] == "cpu" for f in results)
    payload = write_report(spec, out)
    assert "devices" not in payload and "Trained on" not in (out / "report.md").read_text()
    r = json.loads(results[0].read_text())
    r["device"] = "cuda (NVIDIA H200)"
    results[0].write_text(json.dumps(seal(r)))
    payload = write_report(spec, out)
    assert payload["devices"] == {"cpu": 1, "cuda (NVIDIA H200)": 1}
    assert list(payload["devices"]) == ["cpu", "cuda (NVIDIA H200)"]  # sorted, whichever run dir comes first
    assert "Trained on: cpu (1 run(s)), cuda (NVIDIA H200) (1 run(s))" in (out / "report.md").read_text()
    sfile = tmp_path / "s.json"
    sfile.write_text(json.dumps(spec.raw))
    for bad, why in [("cuda:7", "GPU"), ("meta", "not meta"), ("tpu", "not a device")]:
        if bad == "cuda:7" and torch.cuda.device_count() > 7:
            continue
        capsys.readouterr()
        assert main(["sweep", str(sfile), "--out", str(tmp_path / "o2"), "--no-probe", "--device", bad]) == 2
        err = capsys.readouterr().err
        assert f"--device {bad}" in err and why in err
    assert not (tmp_path / "o2").exists()



def test_a_single_lr_row_runs_all_its_seeds_at_once_unless_it_is_tuned(tmp_path):
    """First-seed selection with one lr has nothing to choose: every seed is wanted before seed 0 finishes (so
    parallel workers take them side by side); a single-lr row of a tune group still waits for the group's choice."""
    from seqmem.sweep.runner import plan_rows, wanted_points

    raw = tiny(lr_selection="first_seed", train__seeds=[0, 1, 2], train__steps=4, train__lrs=[1e-2],
               mixers=[{"name": "attention"}, {"name": "swa-a", "layers": ["swa", "swa"], "tune": "w"},
                       {"name": "swa-b", "layers": ["swa", "swa"], "options": [{"window": 2}, {"window": 2}],
                        "tune": "w"}])
    spec = load_spec(raw)
    wanted = wanted_points(spec, tmp_path)
    by_row: dict[str, set[int]] = {}
    for p in wanted:
        by_row.setdefault(p.mixer, set()).add(p.seed)
    assert by_row == {"attention": {0, 1, 2}, "swa-a": {0}, "swa-b": {0}}
    plans = plan_rows(spec, tmp_path)
    assert sum(pl.needed for pl in plans.values()) == 3 + 1 + 1 + 2
    res = run_sweep(spec, tmp_path, jobs=1, log=quiet, probe=False)
    assert res["ran"] == 7 and res["total"] == 7


def test_calibration_gates_are_their_sweeps_reference_runs():
    """A calibration spec that gates a costly settling sweep trains exactly that sweep's reference runs, so the
    sweep's --reuse takes them instead of training them again: every gate point is one of the sweep's points."""
    from seqmem.sweep.runner import run_identity

    for gate, sweep in [("vort_calibrate_dense", "vort_settle_dense")]:
        wanted = {run_identity(p.run_spec) for p in load_spec(sweep).points()}
        pts = load_spec(gate).points()
        assert pts and all(run_identity(p.run_spec) in wanted for p in pts), (gate, sweep)


def test_a_row_trained_partly_under_compile_is_flagged(tmp_path):
    """A row whose runs at its chosen lr were trained partly under --compile (some runs compiled, some eager, or one
    run resumed in the other mode) says so in the report; a row trained one way says nothing."""
    from seqmem.sweep.report import _compile_mode, markdown

    spec = load_spec(tiny(mixers=["attention"]))
    lo, hi = spec.lrs
    valid = {(lo, 0): 0.3, (lo, 1): 0.3, (hi, 0): 0.9, (hi, 1): 0.9}
    _fake_results(spec, tmp_path, valid, valid)
    (row,) = collect(spec, tmp_path)
    assert row["compile_modes"] == {"eager": 2} and "--compile" not in markdown(spec, [row])
    p0, p1 = (p for p in spec.points() if p.lr == hi)
    for p in (p0, p1):
        f = tmp_path / p.rel_dir / "result.json"
        r = json.loads(f.read_text())
        r.pop("seal", None)
        f.write_text(json.dumps(_sealed(p.run_spec, {**r, "compiled": True})))
    (row,) = collect(spec, tmp_path)
    assert row["compile_modes"] == {"compiled": 2} and "--compile" not in markdown(spec, [row])
    # p1 was resumed: its first part trained eager (log records without the mark)
    d1 = tmp_path / p1.rel_dir
    (d1 / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0, "tokens_per_s": 5.0}) + "\n"
                                      + json.dumps({"step": 2, "loss": 1.0, "eval_loss": 1.0}) + "\n"
                                      + json.dumps({"step": 3, "loss": 1.0, "tokens_per_s": 5.0, "compiled": True})
                                      + "\n")
    assert _compile_mode(d1, json.loads((d1 / "result.json").read_text())) == "mixed"
    (row,) = collect(spec, tmp_path)
    assert row["compile_modes"] == {"compiled": 1, "mixed": 1}
    assert "trained partly under --compile (1 compiled, 1 mixed runs" in markdown(spec, [row])
