"""Metric backends (JSONL always; tensorboard / wandb optional and skipped cleanly) and ``seqmem plot``."""

from __future__ import annotations

import json
import sys
import types

import pytest

from seqmem.cli import main
from seqmem.plotting import plot_runs
from seqmem.train.tracking import make_loggers

TRAIN = ["train", "--task", "mqar", "--mixer", "deltanet", "--layers", "1", "--d-model", "16", "--heads", "2",
         "--steps", "4", "--batch-size", "4", "--vocab", "32", "--num-pairs", "2", "--seq-len", "16",
         "--eval-examples", "16", "--eval-every", "2", "--log-every", "1", "--no-progress"]


class _FakeRun:
    def __init__(self, **kw):
        self.kw, self.logged, self.finished = kw, [], False

    def log(self, data, step):
        self.logged.append((step, data))

    def finish(self):
        self.finished = True


def test_wandb_backend_logs_every_record(tmp_path, monkeypatch, capsys):
    runs = []
    fake = types.SimpleNamespace(init=lambda **kw: runs.append(_FakeRun(**kw)) or runs[-1])
    monkeypatch.setitem(sys.modules, "wandb", fake)
    out = tmp_path / "run"
    assert main([*TRAIN, "--log", "wandb", "--out", str(out)]) == 0
    (run,) = runs
    assert run.kw["mode"] == "offline" and run.kw["config"]["model"]["mixer"] == "deltanet" and run.finished
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [s for s, _ in run.logged] == [r["step"] for r in rows] == [1, 2, 3, 4]
    assert run.logged[-1][1]["eval_loss"] == pytest.approx(rows[-1]["eval_loss"])


def test_wandb_run_id_is_kept_for_resume_and_new_for_a_new_run(tmp_path, monkeypatch):
    """--resume continues the W&B run (its id is kept in the run directory); --overwrite starts a W&B run of its
    own (an id from the path alone appended the new run to the old one)."""
    runs = []
    fake = types.SimpleNamespace(init=lambda **kw: runs.append(_FakeRun(**kw)) or runs[-1])
    monkeypatch.setitem(sys.modules, "wandb", fake)
    out = tmp_path / "run"
    args = [*TRAIN, "--log", "wandb", "--out", str(out), "--checkpoint-every", "2"]
    assert main(args) == 0
    assert main([*args, "--resume"]) == 0
    assert main([*args, "--overwrite"]) == 0
    first, resumed, fresh = (r.kw["id"] for r in runs)
    assert first == resumed != fresh
    assert (out / "wandb" / "seqmem_run_id").read_text().strip() == fresh


def test_missing_backend_is_skipped_with_a_clear_message(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    assert make_loggers(["wandb"], tmp_path) == []
    err = capsys.readouterr().err
    assert "--log wandb skipped" in err and "pip install wandb" in err and "metrics.jsonl" in err
    with pytest.raises(ValueError, match="unknown log backend"):
        make_loggers(["mlflow"], tmp_path)


def test_tensorboard_backend_when_installed(tmp_path):
    pytest.importorskip("tensorboard")
    (lg,) = make_loggers(["tensorboard"], tmp_path, {"a": 1})
    lg.log({"step": 1, "loss": 2.0, "eval_loss": 1.5, "accuracy": float("nan")}, 1)
    lg.close()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_plot_command(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main([*TRAIN, "--out", str(a)]) == 0
    assert main([*TRAIN, "--mixer", "linear_attention", "--out", str(b)]) == 0
    capsys.readouterr()
    assert main(["plot", str(a), str(b), "--out", str(tmp_path / "plots")]) == 0
    printed = capsys.readouterr().out.split()
    assert sorted(p.rsplit("/", 1)[-1] for p in printed) == ["accuracy.png", "loss.png"]
    assert all((tmp_path / "plots" / n).stat().st_size > 5000 for n in ("loss.png", "accuracy.png"))
    assert main(["plot", str(tmp_path / "nope")]) == 2


def test_plot_loss_by_position(tmp_path):
    rows = [{"step": 1, "loss": 3.0, "accuracy": 0.1},
            {"step": 2, "loss": 2.5, "accuracy": 0.2, "eval_loss": 2.6, "eval_accuracy": 0.2,
             "eval_bpb_pos_0_7": 3.0, "eval_bpb_pos_8_15": 2.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"torn')
    paths = plot_runs([tmp_path])
    assert sorted(p.name for p in paths) == ["accuracy.png", "loss.png", "loss_by_position.png"]
    assert all(p.parent == tmp_path / "plots" and p.stat().st_size > 5000 for p in paths)
