import json

import pytest
import torch

from seqmem.models import LanguageModel, LMConfig
from seqmem.tasks.mqar import MQARTask
from seqmem.train import TrainConfig, evaluate, train
from seqmem.train.checkpoint import list_checkpoints


def setup(seed=0):
    torch.manual_seed(seed)
    task = MQARTask(vocab_size=32, num_pairs=2, seq_len=16)
    model = LanguageModel(LMConfig(vocab_size=32, d_model=16, n_layers=1, n_heads=2, mixer="deltanet"))
    return model, task


CFG = dict(steps=12, batch_size=8, lr=3e-3, log_every=2, eval_every=6, eval_examples=32, checkpoint_every=4)


def test_training_reduces_loss_and_writes_metrics(tmp_path):
    model, task = setup()
    before = evaluate(model, task, 64)
    res = train(model, task, TrainConfig(**{**CFG, "steps": 60}), out_dir=tmp_path)
    assert res.final["loss"] < before["loss"]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(2, 61, 2))
    assert all("loss" in r for r in rows) and "eval_accuracy" in rows[-1]
    assert len(list_checkpoints(tmp_path / "checkpoints")) == 2  # keeps the newest two


def test_resume_is_exact(tmp_path):
    model, task = setup()
    full = train(model, task, TrainConfig(**CFG), out_dir=tmp_path / "a")
    model, task = setup()
    train(model, task, TrainConfig(**CFG), out_dir=tmp_path / "b", stop_after=5)  # "crash" after step 5
    model, task = setup(seed=123)  # different init: everything must come from the checkpoint (step 4)
    res = train(model, task, TrainConfig(**CFG), out_dir=tmp_path / "b", resume=True)
    a = (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
    b = (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()
    strip = [{k: v for k, v in json.loads(line).items() if k != "tokens_per_s"} for line in a]
    got = [{k: v for k, v in json.loads(line).items() if k != "tokens_per_s"} for line in b]
    assert got == strip
    assert res.final == full.final


def test_logged_loss_mean_covers_the_interval_and_survives_a_resume(tmp_path):
    """Each log record has ``loss`` (its step's) and ``loss_mean`` (the mean over the steps since the previous
    record); a resume from a checkpoint inside an interval continues that interval's sum."""
    cfg = {**CFG, "log_every": 1}
    model, task = setup()
    train(model, task, TrainConfig(**cfg), out_dir=tmp_path / "every")
    per_step = {r["step"]: r["loss"] for r in map(json.loads, (tmp_path / "every" / "metrics.jsonl").read_text()
                                                 .splitlines())}
    cfg = {**CFG, "log_every": 3}  # checkpoints every 4 steps: inside the intervals 4-6 and 7-9
    model, task = setup()
    train(model, task, TrainConfig(**cfg), out_dir=tmp_path / "a")
    rows = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in rows if "loss_mean" in r]
    assert [r["step"] for r in logged] == [3, 6, 9, 12]
    for r in logged:
        window = [per_step[s] for s in range(r["step"] - 2, r["step"] + 1)]
        assert r["loss"] == per_step[r["step"]]
        assert r["loss_mean"] == pytest.approx(sum(window) / 3, rel=1e-6)
    model, task = setup()
    train(model, task, TrainConfig(**cfg), out_dir=tmp_path / "b", stop_after=5)  # checkpoint at step 4
    model, task = setup(seed=123)
    train(model, task, TrainConfig(**cfg), out_dir=tmp_path / "b", resume=True)
    strip = [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in rows]
    got = [{k: v for k, v in json.loads(line).items() if k != "tokens_per_s"}
           for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert got == strip


def test_resume_at_the_final_step_returns_the_final_evaluation(tmp_path):
    """A resume from a checkpoint at the final step has nothing to train: it returned ``final == {}`` (and
    `seqmem train --resume` printed no evaluation).  It evaluates now, as the uninterrupted run did, and leaves its
    log as it was; with the steps shrunk to the checkpoint's, the final-step record gets the evaluation."""
    model, task = setup()
    full = train(model, task, TrainConfig(**CFG), out_dir=tmp_path / "a")
    log = (tmp_path / "a" / "metrics.jsonl").read_text()
    model, task = setup(seed=123)  # everything from the checkpoint
    res = train(model, task, TrainConfig(**CFG), out_dir=tmp_path / "a", resume=True)
    assert full.final and res.final == full.final
    assert (tmp_path / "a" / "metrics.jsonl").read_text() == log
    # stopped at step 8 of 12 (a checkpoint there), resumed with steps = 8
    model, task = setup()
    train(model, task, TrainConfig(**CFG), out_dir=tmp_path / "b", stop_after=8)
    model, task = setup(seed=123)
    res = train(model, task, TrainConfig(**{**CFG, "steps": 8}), out_dir=tmp_path / "b", resume=True)
    assert res.final and res.final == evaluate(model, task, CFG["eval_examples"])
    rows = [json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 8 and rows[-1]["eval_loss"] == res.final["loss"] and "loss" in rows[-1]


def test_the_log_and_the_checkpoint_rename_reach_the_disk_before_a_checkpoint_counts(tmp_path, monkeypatch):
    """After a power loss a checkpoint could survive while log lines before its step were lost (metrics.jsonl was
    never fsynced, nor the checkpoint directory after the rename); a resume keeps rows <= its step, so the gap was
    permanent.  Now metrics.jsonl is fsynced before each checkpoint is written and the directory after its rename."""
    import os

    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc to name the files fsynced")
    synced: list[str] = []
    real = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    model, task = setup()
    train(model, task, TrainConfig(**CFG), out_dir=tmp_path)
    log, ckpts = os.path.realpath(tmp_path / "metrics.jsonl"), os.path.realpath(tmp_path / "checkpoints")
    kinds = ["log" if p == log else "dir" if p == ckpts else "file" if ".tmp-ckpt-" in p else p for p in synced]
    # the three files, then the temporary directory itself, then (after the rename) the checkpoints directory
    assert kinds == ["log", "file", "file", "file", "file", "dir"] * 3  # checkpoints at steps 4, 8 and 12


def test_corrupt_checkpoint_falls_back(tmp_path):
    model, task = setup()
    train(model, task, TrainConfig(**CFG), out_dir=tmp_path)
    newest = list_checkpoints(tmp_path / "checkpoints")[-1]
    with open(newest / "model.safetensors", "r+b") as f:
        f.seek(100)
        f.write(b"garbage!")
    model, task = setup()
    with pytest.warns(UserWarning, match="corrupt"):
        train(model, task, TrainConfig(**CFG), out_dir=tmp_path, resume=True)


def test_resume_without_checkpoint_or_with_other_config(tmp_path):
    model, task = setup()
    with pytest.raises(ValueError, match="no valid checkpoint"):
        train(model, task, TrainConfig(**CFG), out_dir=tmp_path, resume=True)
    train(model, task, TrainConfig(**CFG), out_dir=tmp_path)
    with pytest.raises(ValueError, match="different training configuration"):
        train(model, task, TrainConfig(**{**CFG, "lr": 1e-2}), out_dir=tmp_path, resume=True)


@pytest.mark.parametrize("kw", [dict(steps=0), dict(lr=0), dict(warmup_frac=1.5), dict(batch_size=-1),
                                dict(seed=-5), dict(seed=True), dict(betas=(0.9,)), dict(betas=(0.9, 1.5))])
def test_bad_train_config(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        TrainConfig(**kw)


def test_total_cpu_seconds_of_a_resumed_run():
    from seqmem.train.loop import TrainResult

    # a fresh run: this process's time; a resumed one adds the recorded earlier part
    assert TrainResult(cpu_seconds=12.0).total_cpu_seconds(100) == (12.0, False)
    assert TrainResult(cpu_seconds=12.0, start_step=40, cpu_seconds_before=30.0).total_cpu_seconds(100) == (42.0, False)
    # a checkpoint without the record: the 40 earlier steps at this process's 0.2 s per step (60 steps, 12 s)
    total, estimated = TrainResult(cpu_seconds=12.0, start_step=40, cpu_seconds_before=None).total_cpu_seconds(100)
    assert estimated and total == pytest.approx(12.0 + 8.0)
    # resumed at the end (nothing left to train): no rate to estimate with
    assert TrainResult(cpu_seconds=0.5, start_step=100, cpu_seconds_before=None).total_cpu_seconds(100) == (0.5, True)


def test_compiled_training_is_the_same_training(tmp_path, monkeypatch):
    """compile=True: the same losses as eager training (up to float rounding), log records marked compiled, the
    checkpoint loadable by an eager model (no compiled-module prefixes), no graph break at the id check,
    out-of-range ids still a clear error; refused with grad_accum > 1 and, on CPU, without a C++ compiler (one
    line, before training)."""
    import shutil

    from seqmem.train.loop import check_compiler

    cfg = TrainConfig(**{**CFG, "steps": 6, "eval_every": 0, "checkpoint_every": 6})
    model, task = setup()
    eager = train(model, task, cfg, out_dir=tmp_path / "eager")
    model, task = setup()
    from torch._dynamo.utils import counters

    counters.clear()
    comp = train(model, task, cfg, out_dir=tmp_path / "compiled", compile=True)
    # the id check stays outside the graph (the scored positions' gather, a data-dependent shape, may break it)
    assert not [k for k in counters["graph_break"] if "item()" in k], dict(counters["graph_break"])
    got = [json.loads(line) for line in (tmp_path / "compiled" / "metrics.jsonl").read_text().splitlines()]
    want = [json.loads(line) for line in (tmp_path / "eager" / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in got] == pytest.approx([r["loss"] for r in want], rel=1e-4)
    assert all(r.get("compiled") is True for r in got if "accuracy" in r) and "compiled" not in want[0]
    assert comp.final["loss"] == pytest.approx(eager.final["loss"], rel=1e-4)
    fresh, _ = setup(seed=1)  # the compiled run's checkpoint is an ordinary one
    from seqmem.train.checkpoint import latest_good_checkpoint, load_weights

    load_weights(fresh, latest_good_checkpoint(tmp_path / "compiled" / "checkpoints"))
    assert evaluate(fresh, task, 32)["loss"] == pytest.approx(comp.final["loss"], rel=1e-6)
    with pytest.raises(ValueError, match="grad_accum"):
        train(*setup(), TrainConfig(**{**CFG, "grad_accum": 2}), compile=True)

    class BadIds:  # a task whose batch holds an id beyond the vocabulary: still a clear error when compiled
        def sample(self, n, gen):
            x, y = task.sample(n, gen)
            x[0, 3] = 32
            return x, y

    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 32\), got range \[0, 32\]"):
        train(model, BadIds(), cfg, compile=True)
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(ValueError, match="C\\+\\+ compiler"):
        check_compiler("cpu")


def test_evaluate_pools_accuracy_over_scored_positions_whatever_the_batch_size():
    """echo_mixture scores 1 or 4 tokens per example: evaluate's accuracy is correct / scored over all of them, the
    same for every evaluation batch size (a task's per-batch accuracy, averaged by batch size, used to replace it,
    and moved with the batch size)."""
    from torch import nn

    from seqmem.tasks import build_task
    from seqmem.tasks.base import split_batch

    task = build_task("echo_mixture")
    xs, ys, _ = split_batch(task.valid_data(37))
    counts = (ys != -100).sum(1)
    assert len(set(counts.tolist())) > 1  # the case: examples score different numbers of tokens

    class Oracle(nn.Module):  # right on the examples scoring one token, wrong on the others
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.zeros(1))

        def forward(self, x, **kw):
            rows = [int((xs == r).all(1).nonzero()[0]) for r in x]
            y = ys[rows].clamp(min=0)
            logits = nn.functional.one_hot(y, task.vocab_size).float()
            wrong = counts[rows] != 1
            logits[wrong] = nn.functional.one_hot((y[wrong] + 1) % task.vocab_size, task.vocab_size).float()
            return logits, None

    pooled = float((counts == 1).sum()) / float(counts.sum())
    got = [evaluate(Oracle(), task, 37, bs, split="valid")["accuracy"] for bs in (37, 16, 3, 1)]
    assert 0 < pooled < 1 and got == pytest.approx([pooled] * 4, abs=1e-12)


def test_logged_lr_is_the_lr_each_step_trained_with():
    """metrics.jsonl's lr is what the optimizer used at that step (it was the next step's: the log reached the
    minimum lr, which no step trains at)."""
    model, task = setup()
    cfg = TrainConfig(steps=10, batch_size=4, lr=1.0, warmup_frac=0.3, min_lr_frac=0.1, log_every=1,
                      eval_examples=8, clip=1.0)
    used: list[float] = []
    real = torch.optim.AdamW.step

    def spy(self, *a, **kw):
        used.append(self.param_groups[0]["lr"])
        return real(self, *a, **kw)

    torch.optim.AdamW.step = spy
    try:
        res = train(model, task, cfg)
    finally:
        torch.optim.AdamW.step = real
    logged = [r["lr"] for r in res.history if "loss" in r]
    assert len(used) == 10 and logged == pytest.approx(used, rel=1e-12)
    assert min(logged) > 0.1  # the schedule's floor (min_lr_frac) is where it ends, not a step's lr


def test_resume_refuses_another_model_or_task_configuration(tmp_path):
    """Weights of the same shapes load into another configuration (more heads, another eps) without an error of
    their own: each checkpoint stores the model's and task's configurations and a resume compares them, before
    touching the caller's model."""
    from seqmem.tasks.mqar import MQARTask

    model, task = setup()
    train(model, task, TrainConfig(**CFG), out_dir=tmp_path, stop_after=5)
    other = LanguageModel(LMConfig(vocab_size=32, d_model=16, n_layers=1, n_heads=4, mixer="deltanet"))
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(ValueError, match="different model configuration"):
        train(other, task, TrainConfig(**CFG), out_dir=tmp_path, resume=True)
    assert all(torch.equal(before[k], v) for k, v in other.state_dict().items())  # left as it was
    model2, _ = setup()
    with pytest.raises(ValueError, match="different task configuration"):
        train(model2, MQARTask(vocab_size=32, num_pairs=3, seq_len=16), TrainConfig(**CFG), out_dir=tmp_path,
              resume=True)
    model3, task3 = setup(seed=5)
    train(model3, task3, TrainConfig(**CFG), out_dir=tmp_path, resume=True)  # the same run resumes


def test_resume_needs_a_directory():
    model, task = setup()
    with pytest.raises(ValueError, match="resume=True needs out_dir"):
        train(model, task, TrainConfig(**CFG), resume=True)


def test_loading_weights_checks_tied_embeddings(tmp_path):
    """A tied run's checkpoint has no head of its own: loading it into an untied model left the head at its
    random initialisation; an untied run's head, loaded into a tied model, overwrote the shared embedding."""
    from seqmem.train.checkpoint import load_weights, save_checkpoint

    def lm(tie: bool) -> LanguageModel:
        return LanguageModel(LMConfig(vocab_size=32, d_model=16, n_layers=1, n_heads=2, mixer="deltanet",
                                      tie_embeddings=tie))

    tied, untied = save_checkpoint(tmp_path / "t", 1, lm(True), {}), save_checkpoint(tmp_path / "u", 1, lm(False), {})
    with pytest.raises(ValueError, match="tie_embeddings=True"):
        load_weights(lm(False), tied)
    with pytest.raises(ValueError, match="tie_embeddings=False"):
        load_weights(lm(True), untied)
    load_weights(lm(True), tied)
    load_weights(lm(False), untied)


def test_unknown_precision_is_refused():
    from seqmem.train.loop import autocast

    for p in ("fp16", "BF16"):
        with pytest.raises(ValueError, match="precision must be one of"):
            autocast("cpu", p)
    model, task = setup()
    with pytest.raises(ValueError, match="precision must be one of"):
        evaluate(model, task, 8, precision="fp16")


@pytest.mark.parametrize("clip", [1.0, 0.0])
def test_non_finite_gradients_stop_at_their_step(clip):
    """A finite loss whose backward gives an inf gradient: clipping turned it into nan weights and the next step
    blamed its loss on the lr.  The step that made it stops, with the weights not updated."""
    model, task = setup()
    calls = {"n": 0}

    def poison(grad):
        calls["n"] += 1
        return grad * float("inf") if calls["n"] == 3 else grad

    model.embed.weight.register_hook(poison)
    with pytest.raises(FloatingPointError, match="gradients became non-finite .* at step 3"):
        train(model, task, TrainConfig(**{**CFG, "clip": clip}))
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_loading_weights_checks_the_stored_model_configuration(tmp_path):
    """`seqmem eval`, export and `from_run` rebuild the model from run.json: one edited so that the shapes still
    match (another number of heads) loaded the weights into another model.  The checkpoint's manifest carries the
    model configuration; a field only one side has (added in a later version) is not compared."""
    from seqmem.train.checkpoint import config_mismatch, load_weights

    model, task = setup()
    train(model, task, TrainConfig(**CFG), out_dir=tmp_path)
    ck = list_checkpoints(tmp_path / "checkpoints")[-1]
    load_weights(setup()[0], ck)
    other = LanguageModel(LMConfig(vocab_size=32, d_model=16, n_layers=1, n_heads=4, mixer="deltanet"))
    with pytest.raises(ValueError, match="fields that differ: n_heads"):
        load_weights(other, ck)
    assert config_mismatch('{"a": 1, "b": 2}', '{"a": 1, "c": 3}') == []
    assert config_mismatch('{"a": 1}', '{"a": 2}') == ["a"]
