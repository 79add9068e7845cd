"""Training like users train: gradient accumulation == the large batch, bf16 autocast, ``seqmem train --config
run.json`` (reproduces the run; flags override), every TrainConfig field on the command line, and runs written
before a training field existed still resume."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

import seqmem
from seqmem.cli import main
from seqmem.models import LanguageModel, LMConfig
from seqmem.tasks.mqar import MQARTask
from seqmem.train import TrainConfig, train
from seqmem.train.checkpoint import _sha256, list_checkpoints
from seqmem.train.loop import _micro_steps, config_dict, lm_loss, with_defaults


def _setup(seed=0, mixer="deltanet"):
    torch.manual_seed(seed)
    task = MQARTask(vocab_size=32, num_pairs=2, seq_len=16)
    model = LanguageModel(LMConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, mixer=mixer))
    return model, task


def _rows(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "tokens_per_s"}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("batch,accum", [(8, 4), (7, 3)])  # 7 = 3 + 2 + 2: uneven micro-batches
def test_grad_accum_equals_the_large_batch(batch, accum):
    # one step's gradient: the summed micro-batch gradients are the large batch's (float rounding apart)
    m, task = _setup(mixer="gated_deltanet")
    x, y = task.sample(batch, torch.Generator().manual_seed(0))
    y[0, :5] = -100  # micro-batches with different numbers of scored tokens
    lm_loss(m(x)[0], y).backward()
    ref = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad(set_to_none=True)
    report, acc = _micro_steps(m, x, y, accum, "fp32", 0, 1, torch.device("cpu"), True)
    with torch.no_grad():
        logits = m(x)[0]
        mask = y != -100
        assert float(report) == pytest.approx(float(lm_loss(logits, y)), rel=1e-6)
        assert acc == pytest.approx(float((logits[mask].argmax(-1) == y[mask]).float().mean()))
    for n, p in m.named_parameters():  # differences ~1e-7 of each gradient's largest entry
        assert (p.grad - ref[n]).abs().max() <= 1e-5 * ref[n].abs().max() + 1e-12, n
    # whole runs: the same curve (AdamW's normalised steps amplify the rounding a little)
    cfg = dict(steps=5, batch_size=batch, lr=1e-2, log_every=1, eval_examples=16)
    m1, task = _setup(mixer="gated_deltanet")
    r1 = train(m1, task, TrainConfig(**cfg))
    m2, task = _setup(mixer="gated_deltanet")
    r2 = train(m2, task, TrainConfig(**cfg, grad_accum=accum))
    for a, b in zip(r1.history, r2.history):
        for k in ("loss", "accuracy", "lr"):
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), (a["step"], k)
    for (n, p1), p2 in zip(m1.named_parameters(), m2.parameters()):
        # (element-wise, Adam turns a gradient of 1e-12 vs 0 into a full step: compare each tensor as a whole)
        assert float((p2 - p1).detach().norm()) <= 1e-3 * float(p1.detach().norm()) + 1e-6, n
    assert r2.final["loss"] == pytest.approx(r1.final["loss"], rel=1e-4)


def test_grad_accum_is_checked():
    with pytest.raises(ValueError, match="grad_accum"):
        TrainConfig(batch_size=4, grad_accum=5)
    with pytest.raises(ValueError, match="grad_accum"):
        TrainConfig(grad_accum=0)
    with pytest.raises(ValueError, match="precision"):
        TrainConfig(precision="fp8")


def test_bf16_autocast_trains_close_to_fp32():
    seen = []
    m, task = _setup()
    m.blocks[0].register_forward_pre_hook(lambda *a: seen.append(torch.is_autocast_enabled("cpu")))
    cfg = dict(steps=4, batch_size=8, lr=1e-2, log_every=1, eval_examples=16)
    rb = train(m, task, TrainConfig(**cfg, precision="bf16"))
    assert seen and all(seen)  # training and evaluation forwards ran under autocast
    assert all(p.dtype == torch.float32 for p in m.parameters())  # weights stay fp32
    m2, task = _setup()
    rf = train(m2, task, TrainConfig(**cfg))
    assert rb.history[0]["loss"] == pytest.approx(rf.history[0]["loss"], rel=2e-2)
    assert rb.history[0]["loss"] != rf.history[0]["loss"]  # bf16 really changed the arithmetic
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rb.history)


ARGS = ["train", "--task", "mqar", "--mixer", "deltanet", "--layers", "1", "--d-model", "16", "--heads", "2",
        "--steps", "4", "--batch-size", "6", "--vocab-size", "32", "--num-pairs", "2", "--seq-len", "16",
        "--eval-examples", "12", "--log-every", "1", "--no-progress"]
EXTRA = ["--warmup-frac", "0.25", "--min-lr-frac", "0.1", "--clip", "0.5", "--betas", "0.8", "0.95",
         "--eval-batch-size", "5", "--grad-accum", "2", "--lr", "0.005", "--weight-decay", "0.05",
         "--mixer-option", "chunk_size=4", "--task-option", "power_a=0.02", "--mlp-ratio", "2"]


@pytest.mark.parametrize("mixer", seqmem.list_mixers())
def test_bf16_training_works_for_every_mixer(mixer):
    """``precision="bf16"`` (forward under autocast, backward after it) for every registered mixer, with its first
    contract configuration (chunks and blocks shorter than the sequence): finite losses and weights that moved.
    Lattice's fast scan crashed here in the backward ("Input dtypes must be the same")."""
    torch.manual_seed(0)
    task = MQARTask(vocab_size=32, num_pairs=2, seq_len=16)
    opts = dict(seqmem.get_entry(mixer).cls.contract_configs[0])
    model = LanguageModel(LMConfig(vocab_size=32, d_model=16, n_layers=1, n_heads=2, mixer=mixer, mixer_options=opts,
                                   mlp_ratio=0))
    before = [p.detach().clone() for p in model.parameters()]
    r = train(model, task, TrainConfig(steps=2, batch_size=4, lr=1e-2, log_every=1, eval_examples=4,
                                       precision="bf16"))
    assert all(math.isfinite(row["loss"]) for row in r.history) and math.isfinite(r.final["loss"])
    assert all(torch.isfinite(p).all() and p.dtype == torch.float32 for p in model.parameters())
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))


@pytest.mark.parametrize("mixer", ["lattice", "lattice_enc", "lattice_sim"])
def test_cli_bf16_training_of_lattice(mixer, tmp_path):
    """``seqmem train --mixer lattice --precision bf16`` as the issue ran it (it crashed in the first backward)."""
    assert main([*ARGS, "--mixer", mixer, "--mixer-option", "chunk_size=8", "--steps", "2", "--precision", "bf16",
                 "--out", str(tmp_path / "run")]) == 0
    rows = _rows(tmp_path / "run")
    assert rows and all(math.isfinite(r["loss"]) for r in rows if "loss" in r)


def test_config_reproduces_a_run_and_flags_override(tmp_path, capsys):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    assert main([*ARGS, *EXTRA, "--out", str(a)]) == 0
    spec = json.loads((a / "run.json").read_text())
    # every TrainConfig field is in run.json, with the values given on the command line
    assert set(spec["train"]) == set(TrainConfig.__dataclass_fields__)
    assert spec["train"] | {"checkpoint_every": 0} == config_dict(TrainConfig(
        steps=4, batch_size=6, lr=0.005, weight_decay=0.05, warmup_frac=0.25, min_lr_frac=0.1, clip=0.5,
        betas=(0.8, 0.95), eval_examples=12, eval_batch_size=5, log_every=1, grad_accum=2, seed=0))
    assert spec["model"]["mixer_options"] == {"chunk_size": 4} and spec["task"]["options"]["power_a"] == 0.02
    # the run.json alone reproduces the run, bit for bit
    assert main(["train", "--config", str(a / "run.json"), "--no-progress", "--out", str(b)]) == 0
    assert json.loads((b / "run.json").read_text()) == spec
    assert _rows(b) == _rows(a)
    # flags override (the run directory works as --config too)
    assert main(["train", "--config", str(a), "--steps", "3", "--lr", "0.002", "--mixer", "gated_deltanet",
                 "--mixer-option", "chunk_size=8", "--no-progress", "--out", str(c)]) == 0
    spec_c = json.loads((c / "run.json").read_text())
    assert spec_c["train"] == {**spec["train"], "steps": 3, "lr": 0.002, "checkpoint_every": 1}
    assert spec_c["model"] == {**spec["model"], "mixer": "gated_deltanet", "mixer_options": {"chunk_size": 8}}
    assert spec_c["task"] == spec["task"]
    capsys.readouterr()
    # clear errors: no task, a file that is not a run specification
    assert main(["train", "--mixer", "deltanet", "--out", str(tmp_path / "d")]) == 2
    assert "--task" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("[1, 2]")
    assert main(["train", "--config", str(tmp_path / "bad.json"), "--out", str(tmp_path / "e")]) == 2
    assert "run specification" in capsys.readouterr().err
    # a misspelt section or task key is refused, not dropped (the run used to train with the defaults)
    for typo, word in (({**spec, "trian": spec["train"]}, "trian"),
                       ({**spec, "task": {"name": spec["task"]["name"], "option": spec["task"]["options"]}}, "option")):
        (tmp_path / "typo.json").write_text(json.dumps(typo))
        assert main(["train", "--config", str(tmp_path / "typo.json"), "--out", str(tmp_path / "f")]) == 2
        assert word in capsys.readouterr().err
    # a flag of another task is refused, not dropped
    assert main(["train", "--task", "lm", "--mixer", "attention", "--vocab-size", "100", "--out",
                 str(tmp_path / "g")]) == 2
    assert "--task mqar only" in capsys.readouterr().err
    assert main(["train", "--task", "mqar", "--mixer", "attention", "--corpus", "code", "--out",
                 str(tmp_path / "h")]) == 2
    assert "--task lm only" in capsys.readouterr().err


def _strip_new_fields(run: Path, fields: tuple[str, ...]) -> None:
    """Make ``run`` look written before ``fields`` existed (run.json and every checkpoint's trainer state)."""
    spec = json.loads((run / "run.json").read_text())
    for f in fields:
        spec["train"].pop(f)
    (run / "run.json").write_text(json.dumps(spec))
    for ck in list_checkpoints(run / "checkpoints"):
        st = torch.load(ck / "trainer.pt", weights_only=True)
        for f in fields:
            st["train_config"].pop(f)
        torch.save(st, ck / "trainer.pt")
        man = json.loads((ck / "manifest.json").read_text())
        man["files"]["trainer.pt"] = _sha256(ck / "trainer.pt")
        (ck / "manifest.json").write_text(json.dumps(man))


def test_runs_from_before_new_fields_resume(tmp_path, capsys):
    run = tmp_path / "run"
    assert main([*ARGS, "--checkpoint-every", "2", "--out", str(run)]) == 0
    full = _rows(run)
    shutil.rmtree(list_checkpoints(run / "checkpoints")[-1])  # "crashed" after step 2
    _strip_new_fields(run, ("grad_accum", "precision", "warmup_frac", "min_lr_frac", "clip", "betas",
                            "eval_batch_size"))
    assert with_defaults({"steps": 4}) == config_dict(TrainConfig(steps=4))
    # the old run resumes (the missing fields had their defaults) and continues exactly
    assert main([*ARGS, "--checkpoint-every", "2", "--out", str(run), "--resume"]) == 0
    assert _rows(run) == full
    assert main([*ARGS, "--checkpoint-every", "2", "--out", str(run), "--steps", "6", "--resume"]) == 0  # extend
    capsys.readouterr()
    # but a changed new field is a different run
    assert main([*ARGS, "--checkpoint-every", "2", "--out", str(run), "--steps", "8", "--resume",
                 "--grad-accum", "2"]) == 2
    assert "arguments differ" in capsys.readouterr().err


def test_fsdp_needs_torchrun(tmp_path, capsys):
    assert main([*ARGS, "--fsdp", "--out", str(tmp_path / "r")]) == 2
    assert "torchrun" in capsys.readouterr().err


def test_checkpoints_are_ordered_by_step_not_by_name(tmp_path):
    # past step 10^8 the name grows a digit: "ckpt-100000000" sorts before "ckpt-99999999" by name; the newest
    # must still be the one kept, listed last and resumed from
    from seqmem.train.checkpoint import latest_good_checkpoint, save_checkpoint

    m = torch.nn.Linear(2, 2)
    for step in (99_999_998, 99_999_999, 100_000_000):
        save_checkpoint(tmp_path, step, m, {"step": step}, keep=2)
    (tmp_path / "ckpt-notastep").mkdir()  # not a checkpoint: neither listed nor removed
    assert [c.name for c in list_checkpoints(tmp_path)] == ["ckpt-99999999", "ckpt-100000000"]
    assert latest_good_checkpoint(tmp_path).name == "ckpt-100000000"
    assert (tmp_path / "ckpt-notastep").is_dir()
