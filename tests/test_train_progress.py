"""`train` progress on non-terminals, eval lines on the console, and extending a finished run with --resume."""

from __future__ import annotations

import json
import math

import pytest
import torch

from seqmem.cli import main
from seqmem.models import LanguageModel, LMConfig
from seqmem.tasks.mqar import MQARTask
from seqmem.train import TrainConfig, train
from seqmem.train.loop import _lr_lambda

TRAIN = ["train", "--task", "mqar", "--mixer", "attention", "--vocab-size", "16", "--num-pairs", "2",
         "--seq-len", "12", "--d-model", "16", "--batch-size", "4", "--eval-examples", "16", "--log-every", "2"]


def _setup():
    torch.manual_seed(0)
    task = MQARTask(vocab_size=32, num_pairs=2, seq_len=16)
    model = LanguageModel(LMConfig(vocab_size=32, d_model=16, n_layers=1, n_heads=2, mixer="deltanet"))
    return model, task


def test_progress_on_a_pipe_is_plain_lines_with_evals(tmp_path, capsys):
    # under pytest stderr is not a terminal: no tqdm bar, plain lines (no carriage return)
    assert main([*TRAIN, "--steps", "6", "--eval-every", "3", "--out", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert "\r" not in err
    assert "step 3/6  eval: loss" in err and "accuracy" in err
    assert "step 2/6  loss" in err and "s left" in err  # the first log step prints (then at most one per 10 s)
    assert "step 6/6  eval: loss" in err  # the final evaluation


def test_no_progress_prints_no_lines(tmp_path, capsys):
    assert main([*TRAIN, "--steps", "4", "--eval-every", "2", "--no-progress", "--out", str(tmp_path / "r")]) == 0
    assert "step " not in capsys.readouterr().err


def test_resume_extends_a_finished_run_and_relays_the_schedule(tmp_path):
    model, task = _setup()
    cfg = TrainConfig(steps=8, batch_size=4, lr=3e-3, log_every=1, eval_examples=16)
    train(model, task, cfg, out_dir=tmp_path)
    model, task = _setup()
    longer = TrainConfig(**{**cfg.__dict__, "steps": 16})
    res = train(model, task, longer, out_dir=tmp_path, resume=True)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 17))
    # steps 1-8 followed the 8-step schedule, steps 9-16 the 16-step schedule (as if started with 16 steps); each
    # record logs the lr its step trained with (step s: the schedule at s - 1; it used to log the next step's)
    f8, f16 = _lr_lambda(cfg), _lr_lambda(longer)
    for r in rows:
        f = f8 if r["step"] <= 8 else f16
        assert math.isclose(r["lr"], 3e-3 * f(r["step"] - 1), rel_tol=1e-9), r
    assert res.final and "accuracy" in res.final
    with pytest.raises(ValueError, match="beyond"):
        model, task = _setup()
        train(model, task, TrainConfig(**{**cfg.__dict__, "steps": 10}), out_dir=tmp_path, resume=True)


def test_cli_resume_with_more_steps(tmp_path, capsys):
    out = tmp_path / "r"
    assert main([*TRAIN, "--steps", "4", "--out", str(out)]) == 0
    assert main([*TRAIN, "--steps", "6", "--out", str(out), "--resume"]) == 0
    err = capsys.readouterr().err
    assert "extending the run from 4 to 6 steps" in err
    assert json.loads((out / "run.json").read_text())["train"]["steps"] == 6
    assert main([*TRAIN, "--steps", "6", "--lr", "0.5", "--out", str(out), "--resume"]) == 2  # other changes: no
