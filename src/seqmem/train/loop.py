"""Training loop: AdamW, linear warm-up + cosine decay, gradient clipping, periodic evaluation, JSONL metrics,
atomic checkpoints and exact resume (weights, optimizer, scheduler, data and torch RNG state).

Multi-process (``torchrun``): when ``torch.distributed`` is initialised with world size W > 1, the model is wrapped in
``DistributedDataParallel``; every rank draws the same global batch from the shared data RNG and trains on its own
slice of it (``torch.tensor_split`` of the batch into W parts), each rank's loss is its token-sum divided by the
*global* number of scored tokens (times W, undone by DDP's gradient averaging), so gradients, optimizer steps and the
logged loss equal a single-process run with the same global batch up to float summation order.  Rank 0 writes
metrics and checkpoints; checkpoints hold no world size, so a run resumes on any number of processes."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqmem.mixers.base import NonFiniteError, check_fields, check_option
from seqmem.train.checkpoint import (
    latest_good_checkpoint,
    list_checkpoints,
    load_trainer_state,
    load_weights,
    remove_orphans,
    save_checkpoint,
)


@dataclass
class TrainConfig:
    steps: int = 1000
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.1
    warmup_frac: float = 0.1
    min_lr_frac: float = 0.0
    clip: float = 1.0
    betas: tuple[float, float] = (0.9, 0.98)
    eval_every: int = 0  # 0: evaluate only at the end
    eval_examples: int = 512
    eval_batch_size: int = 64
    log_every: int = 10
    checkpoint_every: int = 0  # 0: only at the end (when out_dir is given)
    seed: int = 0

    def __post_init__(self) -> None:
        # types (NaN/Inf refused for floats) and domains, each option checked by itself (a NaN weight decay is
        # reported as such, not later as a diverged run blamed on the learning rate)
        check_fields(self, {"lr": ">0", "weight_decay": ">=0", "warmup_frac": "[0,1)", "min_lr_frac": "[0,1]",
                            "clip": ">=0", "eval_every": ">=0", "checkpoint_every": ">=0"})
        for b in tuple(self.betas) if isinstance(self.betas, (tuple, list)) and len(self.betas) == 2 else (None,):
            check_option("TrainConfig", "betas", b, float, "[0,1)")
        for k in ("steps", "batch_size", "eval_examples", "eval_batch_size", "log_every"):
            v = getattr(self, k)
            if not isinstance(v, int) or v <= 0:
                raise ValueError(f"TrainConfig.{k} must be a positive integer, got {v!r}")
        for k in ("eval_every", "checkpoint_every"):
            if getattr(self, k) < 0:
                raise ValueError(f"TrainConfig.{k} must be >= 0")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.warmup_frac < 1:
            raise ValueError(f"warmup_frac must be in [0, 1), got {self.warmup_frac}")
        if self.clip < 0 or self.weight_decay < 0:
            raise ValueError("clip and weight_decay must be >= 0")
        self.betas = tuple(self.betas)


@dataclass
class TrainResult:
    history: list[dict[str, Any]] = field(default_factory=list)
    final: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def dist_info() -> tuple[int, int]:
    """``(rank, world_size)`` of the initialised default process group, else ``(0, 1)``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=-100)


@torch.no_grad()
def evaluate(
    model: nn.Module, task: Any, n_examples: int = 512, batch_size: int = 64, distributed: bool = False,
    split: str = "eval",
) -> dict[str, float]:
    """Loss and accuracy over the scored positions of the task's fixed evaluation set (+ task metrics).

    ``split``: ``"eval"`` (:meth:`~seqmem.tasks.base.Task.eval_data`, the default), ``"valid"`` (the examples for
    choosing hyper-parameters, :meth:`~seqmem.tasks.base.Task.valid_data`) or ``"test"`` (tasks with a held-out
    test split, e.g. language modelling).

    ``distributed=True`` (every rank of the process group must call it): rank r evaluates batches r, r+W, …; the
    per-batch sums are gathered and added in batch order, so the result equals the single-process one exactly."""
    was_training = model.training
    model.eval()
    getter = {"eval": "eval_data", "valid": "valid_data", "test": "test_data"}.get(split)
    if getter is None:
        raise ValueError(f"split must be 'eval', 'valid' or 'test', got {split!r}")
    if not hasattr(task, getter):
        raise ValueError(f"task {type(task).__name__} has no {split!r} split ({getter})")
    inputs, targets = getattr(task, getter)(n_examples)
    device = next(model.parameters()).device
    rank, world = dist_info() if distributed else (0, 1)
    parts: list[tuple[int, float, float, int, int, dict[str, float]]] = []
    for j, i in enumerate(range(0, inputs.shape[0], batch_size)):
        if j % world != rank:
            continue
        x, y = inputs[i : i + batch_size].to(device), targets[i : i + batch_size].to(device)
        try:
            logits, _ = model(x)
        except NonFiniteError as e:
            raise NonFiniteError(f"evaluation batch {j}: {e}") from None
        mask = y != -100
        n = int(mask.sum())
        if n == 0:
            continue
        loss_sum = float(F.cross_entropy(logits[mask].float(), y[mask], reduction="sum"))
        if not math.isfinite(loss_sum):
            raise FloatingPointError(
                f"evaluation loss is {loss_sum} on batch {j} (examples {i}..{i + x.shape[0] - 1}); the model's "
                "weights are non-finite or it overflows: evaluate in float32 or use an earlier checkpoint"
            )
        correct = float((logits[mask].argmax(-1) == y[mask]).sum())
        mets = {k: float(v) for k, v in task.metrics(logits, y).items()} if hasattr(task, "metrics") else {}
        parts.append((j, loss_sum, correct, n, x.shape[0], mets))
    if world > 1:
        import torch.distributed as dist

        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, parts)
        parts = sorted((p for g in gathered for p in g), key=lambda p: p[0])
    tot_loss = tot_correct = tot_n = 0.0
    extra: dict[str, float] = {}
    extra_w: dict[str, float] = {}
    for _, loss_sum, correct, n, bsz, mets in parts:
        tot_loss += loss_sum
        tot_correct += correct
        tot_n += n
        for k, v in mets.items():
            extra[k] = extra.get(k, 0.0) + v * bsz
            extra_w[k] = extra_w.get(k, 0.0) + bsz
    model.train(was_training)
    if tot_n == 0:
        raise ValueError("evaluation set has no scored positions (targets are all -100)")
    out = {"loss": tot_loss / tot_n, "accuracy": tot_correct / tot_n}
    out.update({k: extra[k] / extra_w[k] for k in extra})
    return out


def _lr_lambda(cfg: TrainConfig):
    warm = int(cfg.warmup_frac * cfg.steps)

    def f(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        p = (step - warm) / max(1, cfg.steps - warm)
        return cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(p, 1.0)))

    return f


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)


def train(
    model: nn.Module,
    task: Any,
    cfg: TrainConfig,
    out_dir: str | Path | None = None,
    resume: bool = False,
    progress: bool = False,
    stop_after: int | None = None,
    loggers: list[Any] | None = None,
) -> TrainResult:
    """Train ``model`` on ``task``.  With ``out_dir``: ``metrics.jsonl`` (one object per log step) and checkpoints
    under ``out_dir/checkpoints``; ``resume=True`` continues exactly from the newest good checkpoint.
    ``stop_after`` ends the run early after that many steps (for tests of resumption).  ``loggers``: extra metric
    sinks with ``log(record, step)`` (e.g. :mod:`seqmem.train.tracking`), called on rank 0 only.

    Under ``torchrun`` (an initialised process group of W > 1 ranks) this trains with DistributedDataParallel; see
    the module docstring.  ``cfg.batch_size`` is the global batch (at least W)."""
    device = next(model.parameters()).device
    rank, world = dist_info()
    main = rank == 0
    if world > 1 and cfg.batch_size < world:
        raise ValueError(f"batch_size={cfg.batch_size} is smaller than the number of processes ({world})")
    opt = make_optimizer(model, cfg)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(cfg))
    gen = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    start = 0
    result = TrainResult()
    metrics_path = ckpt_dir = None
    if out_dir is not None:
        out_dir = Path(out_dir)
        if main:
            out_dir.mkdir(parents=True, exist_ok=True)
        metrics_path, ckpt_dir = out_dir / "metrics.jsonl", out_dir / "checkpoints"
        if resume:
            if main:
                remove_orphans(ckpt_dir)
            ck = latest_good_checkpoint(ckpt_dir)
            if ck is None:
                raise ValueError(f"--resume: no valid checkpoint under {ckpt_dir}")
            load_weights(model, ck)
            st = load_trainer_state(ck)
            old_cfg = dict(st.get("train_config") or {})
            if {**old_cfg, "steps": cfg.steps} != asdict(cfg) | {"betas": list(cfg.betas)}:
                raise ValueError(f"--resume: checkpoint {ck} was written with a different training configuration")
            if cfg.steps < st["step"]:
                raise ValueError(f"--resume: the checkpoint is at step {st['step']}, beyond steps={cfg.steps}")
            opt.load_state_dict(st["optimizer"])
            sched.load_state_dict(st["scheduler"])
            if old_cfg.get("steps") != cfg.steps and main:
                # Extension: the warm-up + cosine schedule is laid over the new total, as if the run had been
                # started with it (LambdaLR's state holds only the step count; the lambda is _lr_lambda(cfg)).
                lr_old = cfg.lr * _lr_lambda(TrainConfig(**{**old_cfg, "betas": tuple(old_cfg["betas"])}))(
                    st["step"] - 1)
                lr_new = cfg.lr * _lr_lambda(cfg)(st["step"] - 1)
                _say(f"resume: extending the run from {old_cfg.get('steps')} to {cfg.steps} steps; the learning-"
                     f"rate schedule is laid over the new total (lr at step {st['step']}: {lr_old:.3g} -> "
                     f"{lr_new:.3g})")
            gen.set_state(st["data_rng"])
            torch.set_rng_state(st["torch_rng"])
            start = st["step"]
            result.history = [r for r in _read_jsonl(metrics_path) if r["step"] <= start]
            if main:
                _write_jsonl(metrics_path, result.history)
        else:
            if list_checkpoints(ckpt_dir):
                raise ValueError(f"{out_dir} already holds checkpoints of a training run: resume=True continues "
                                 "it; to start a new run, use another directory or remove the old run first")
            if main and metrics_path.exists():
                metrics_path.unlink()
    if not main:
        metrics_path = ckpt_dir = None
        loggers = None
    ddp: nn.Module = model
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=ids, static_graph=True)

    bar = None
    lines = False  # progress as plain lines (stderr is a log file or a pipe: no carriage returns)
    last_line = float("-inf")
    if progress and main:
        import sys

        if sys.stderr.isatty():
            from tqdm.auto import tqdm

            bar = tqdm(total=cfg.steps, initial=start, dynamic_ncols=True, leave=False)
        else:
            lines = True
    model.train()
    t0 = time.perf_counter()
    tokens = 0
    end = cfg.steps if stop_after is None else min(cfg.steps, stop_after)
    for step in range(start + 1, end + 1):
        x, y = task.sample(cfg.batch_size, gen)
        tokens += x.numel()
        log_now = step % cfg.log_every == 0 or step == cfg.steps
        try:
            if world == 1:
                x, y = x.to(device), y.to(device)
                logits, _ = model(x)
                loss = report = lm_loss(logits, y)
            else:
                loss, report, logits, x, y = _ddp_loss(ddp, x, y, rank, world, device)
        except NonFiniteError as e:
            raise NonFiniteError(f"training step {step}: {e}") from None
        if not torch.isfinite(report):
            raise FloatingPointError(
                f"training loss became {float(report.detach())} at step {step}; the run diverged: lower the "
                "learning rate (--lr), keep gradient clipping on, or train in float32"
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        opt.step()
        sched.step()
        record: dict[str, Any] | None = None
        if log_now:
            with torch.no_grad():
                mask = y != -100
                if world == 1:
                    acc = float((logits[mask].argmax(-1) == y[mask]).float().mean()) if mask.any() else float("nan")
                else:
                    acc = _ddp_accuracy(logits, y, device)
            el = time.perf_counter() - t0
            record = {"step": step, "loss": float(report.detach()), "accuracy": acc, "lr": sched.get_last_lr()[0],
                      "tokens_per_s": tokens / max(el, 1e-9)}
        if (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps:
            ev = evaluate(model, task, cfg.eval_examples, cfg.eval_batch_size, distributed=world > 1)
            record = record or {"step": step, "loss": float(report.detach())}
            record.update({f"eval_{k}": v for k, v in ev.items()})
            if step == cfg.steps:
                result.final = ev
        if record is not None:
            result.history.append(record)
            if metrics_path is not None:
                with open(metrics_path, "a") as f:
                    f.write(json.dumps(record) + "\n")
            for lg in loggers or []:
                lg.log(record, step)
            if bar is not None:
                bar.set_postfix(loss=f"{record['loss']:.3f}", acc=f"{record.get('accuracy', float('nan')):.3f}",
                                tok_s=f"{record.get('tokens_per_s', 0):.0f}")
            if (bar is not None or lines) and "eval_loss" in record:
                _say(_eval_line(record, cfg.steps), bar)
            elif lines and "accuracy" in record and (time.perf_counter() - last_line >= 10 or step == end):
                last_line = time.perf_counter()  # at most one line per 10 s (and the last step)
                _say(_progress_line(record, cfg.steps, start, last_line - t0))
        if bar is not None:
            bar.update(1)
        if ckpt_dir is not None and (
            (cfg.checkpoint_every and step % cfg.checkpoint_every == 0) or step == end
        ):
            save_checkpoint(ckpt_dir, step, model, {
                "step": step, "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                "data_rng": gen.get_state(), "torch_rng": torch.get_rng_state(),
                "train_config": asdict(cfg) | {"betas": list(cfg.betas)},
            })
        if world > 1 and ((cfg.checkpoint_every and step % cfg.checkpoint_every == 0) or step == end):
            import torch.distributed as dist

            dist.barrier()  # nobody runs ahead of a checkpoint being written
    if bar is not None:
        bar.close()
    result.seconds = time.perf_counter() - t0
    return result


def _say(msg: str, bar: Any = None) -> None:
    """One line on stderr (above the progress bar when there is one)."""
    import sys

    if bar is not None:
        bar.write(msg, file=sys.stderr)
    else:
        print(msg, file=sys.stderr, flush=True)


def _progress_line(record: dict[str, Any], total: int, start: int, elapsed: float) -> str:
    step = record["step"]
    left = elapsed / max(step - start, 1) * (total - step)
    return (f"step {step}/{total}  loss {record['loss']:.4f}  acc {record['accuracy']:.3f}  "
            f"{record.get('tokens_per_s', 0):.0f} tok/s  {elapsed:.0f} s elapsed, ~{left:.0f} s left")


def _eval_line(record: dict[str, Any], total: int) -> str:
    evals = "  ".join(f"{k[5:]} {v:.4f}" for k, v in record.items() if k.startswith("eval_"))
    return f"step {record['step']}/{total}  eval: {evals}"


def _ddp_loss(
    ddp: nn.Module, x: Tensor, y: Tensor, rank: int, world: int, device: torch.device
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """This rank's slice of the global batch and its loss scaled so that DDP's gradient average is the gradient of
    the global token-mean loss; the returned loss value (for logging) is the global mean (all-reduced)."""
    import torch.distributed as dist

    n_global = int((y != -100).sum())
    lo_hi = torch.tensor_split(torch.arange(x.shape[0]), world)[rank]
    xs, ys = x[lo_hi].to(device), y[lo_hi].to(device)
    logits, _ = ddp(xs)
    loss_sum = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ys.reshape(-1), ignore_index=-100,
                               reduction="sum")
    loss = loss_sum * (world / max(n_global, 1))
    total = loss_sum.detach().clone()
    dist.all_reduce(total)
    report = total / max(n_global, 1) if n_global else total * float("nan")
    return loss, report, logits, xs, ys


def _ddp_accuracy(logits: Tensor, y: Tensor, device: torch.device) -> float:
    import torch.distributed as dist

    mask = y != -100
    t = torch.tensor([float((logits[mask].argmax(-1) == y[mask]).sum()), float(mask.sum())], dtype=torch.float64,
                     device=device)
    dist.all_reduce(t)
    return float(t[0] / t[1]) if t[1] > 0 else float("nan")


def _read_jsonl(path: Path | None) -> list[dict[str, Any]]:
    if path is None or not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a torn last line from a crash
    return rows


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    from seqmem.io import atomic_write_text

    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
