"""Training loop: AdamW, linear warm-up + cosine decay, gradient clipping, periodic evaluation, JSONL metrics,
atomic checkpoints and exact resume (weights, optimizer, scheduler, data and torch RNG state).

Multi-process (``torchrun``): when ``torch.distributed`` is initialised with world size W > 1, the model is wrapped in
``DistributedDataParallel``; every rank draws the same global batch from the shared data RNG and trains on its own
slice of it (``torch.tensor_split`` of the batch into W parts), each rank's loss is its token-sum divided by the
*global* number of scored tokens (times W, undone by DDP's gradient averaging), so gradients, optimizer steps and the
logged loss equal a single-process run with the same global batch up to float summation order.  Rank 0 writes
metrics and checkpoints; checkpoints hold no world size, so a run resumes on any number of processes.

``fsdp=True`` shards parameters, gradients and optimizer state instead (FSDP2, ``torch.distributed.fsdp.fully_shard``
on each block and then the whole model) with the same data and loss scheme; checkpoints are gathered into the same
full, unsharded format, so an FSDP run resumes in one process (or with DDP) and vice versa.

``grad_accum`` = N splits each rank's share of the global batch into N micro-batches whose gradients are summed before
the optimizer step (the loss of each is its token-sum over the global number of scored tokens), so a run equals the
same run with N = 1 up to float rounding; ``precision="bf16"`` runs forward passes (training and evaluation) under
``torch.autocast`` with bfloat16, the weights and optimizer state staying float32."""

from __future__ import annotations

import inspect
import json
import math
import os
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqmem.io import append_text, fsync_path, read_jsonl
from seqmem.mixers.base import NonFiniteError, check_fields, check_option
from seqmem.models.lm import check_ids
from seqmem.tasks.base import split_batch
from seqmem.train.checkpoint import (
    config_mismatch,
    latest_good_checkpoint,
    list_checkpoints,
    load_trainer_state,
    load_weights,
    model_config_json,
    remove_orphans,
    save_checkpoint,
    unique_state,
    verify_checkpoint,
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
    grad_accum: int = 1  # micro-batches per optimizer step (of the global batch_size)
    precision: str = "fp32"  # "fp32" or "bf16" (torch.autocast with bfloat16 for forward passes)

    def __post_init__(self) -> None:
        # types (NaN/Inf refused for floats) and domains, each option checked by itself (a NaN weight decay is
        # reported as such, not later as a diverged run blamed on the learning rate)
        check_fields(self, {"lr": ">0", "weight_decay": ">=0", "warmup_frac": "[0,1)", "min_lr_frac": "[0,1]",
                            "clip": ">=0", "eval_every": ">=0", "checkpoint_every": ">=0"})
        if not (isinstance(self.betas, (tuple, list)) and len(self.betas) == 2):
            raise ValueError(f"TrainConfig: betas must be two numbers in [0, 1) (Adam's beta1, beta2), got "
                             f"{self.betas!r}")
        for b in self.betas:
            check_option("TrainConfig", "betas", b, float, "[0,1)")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"TrainConfig: seed must be a non-negative integer, got {self.seed!r}")
        for k in ("steps", "batch_size", "eval_examples", "eval_batch_size", "log_every", "grad_accum"):
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
        if self.precision not in PRECISIONS:
            raise ValueError(f"TrainConfig.precision must be one of {list(PRECISIONS)}, got {self.precision!r}")
        if self.grad_accum > self.batch_size:
            raise ValueError(f"TrainConfig.grad_accum={self.grad_accum} exceeds batch_size={self.batch_size}: "
                             "every micro-batch needs at least one sequence")
        self.betas = tuple(self.betas)


PRECISIONS = ("fp32", "bf16")


def config_dict(cfg: TrainConfig) -> dict[str, Any]:
    """``cfg`` as the JSON-able dict stored in checkpoints and ``run.json`` (``betas`` a list)."""
    return asdict(cfg) | {"betas": list(cfg.betas)}


def with_defaults(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored training configuration completed with the defaults of fields it lacks: a run written before a
    field existed ran with its default (every field added later defaults to the earlier behaviour), so
    ``--resume`` compares it as such."""
    return {**config_dict(TrainConfig()), **stored}


def checkpoint_identity(model: nn.Module, task: Any) -> dict[str, str]:
    """The model's and task's configurations as canonical JSON (those that have one: ``model.cfg.to_dict()``,
    ``task.config()``), stored in each checkpoint and compared on resume: weights of the same shapes load into
    another configuration (more heads, another eps or window) without an error of their own."""
    out: dict[str, str] = {}
    if (m := model_config_json(model)) is not None:
        out["model_config"] = m
    if callable(getattr(task, "config", None)):
        out["task_config"] = json.dumps(task.config(), sort_keys=True, default=str)
    return out


def autocast(device: torch.device | str, precision: str):
    """The forward-pass context for ``precision``: ``torch.autocast`` with bfloat16 for ``"bf16"``."""
    if precision not in PRECISIONS:  # "fp16" or "BF16" would otherwise run float32 without a word
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    if precision == "bf16":
        return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)
    return nullcontext()


@dataclass
class TrainResult:
    history: list[dict[str, Any]] = field(default_factory=list)
    final: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    #: the step training started from (0, or the resumed checkpoint's step)
    start_step: int = 0
    #: CPU seconds this process spent training (all ranks' own process only)
    cpu_seconds: float = 0.0
    #: CPU seconds the steps before ``start_step`` cost in earlier processes, as recorded in the resumed checkpoint
    #: (0.0 for a fresh run; None when the checkpoint predates this record)
    cpu_seconds_before: float | None = 0.0

    def total_cpu_seconds(self, steps: int) -> tuple[float, bool]:
        """``(CPU seconds of the whole run of `steps` steps, estimated)``: this process's plus the earlier
        processes' of a resumed run; where the checkpoint predates that record, the earlier steps are estimated at
        this process's rate per step (``estimated`` True)."""
        if self.cpu_seconds_before is not None:
            return self.cpu_seconds + self.cpu_seconds_before, False
        done = steps - self.start_step
        before = self.cpu_seconds / done * self.start_step if done > 0 else 0.0
        return self.cpu_seconds + before, True


def dist_info() -> tuple[int, int]:
    """``(rank, world_size)`` of the initialised default process group, else ``(0, 1)``."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=-100)


def takes_positions(model: nn.Module) -> bool:
    """Whether ``model`` (or the module a DDP wrapper holds) computes logits at chosen positions only
    (``model(x, positions=mask)``, as :class:`~seqmem.models.LanguageModel` does)."""
    inner = getattr(model, "module", model)
    try:
        return "positions" in inspect.signature(inner.forward).parameters
    except (TypeError, ValueError):
        return False


_STATELESS: dict[type, dict[str, bool]] = {}


def stateless_kwargs(model: nn.Module) -> dict[str, bool]:
    """``{"output_final_state": False}`` for a model whose forward takes it (:class:`~seqmem.models.LanguageModel`,
    also inside a DDP or ``torch.compile`` wrapper), else ``{}``: a loss never reads the final state, and a mixer
    may then skip computing it (VORT's channel sums)."""
    inner = getattr(model, "module", model)
    inner = getattr(inner, "_orig_mod", inner)
    kind = type(inner)
    if kind not in _STATELESS:
        try:
            takes = "output_final_state" in inspect.signature(inner.forward).parameters
        except (TypeError, ValueError):
            takes = False
        _STATELESS[kind] = {"output_final_state": False} if takes else {}
    return _STATELESS[kind]


def scored_logits(model: nn.Module, x: Tensor, y: Tensor, sparse: bool,
                  action_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The logits and targets of the scored positions (``y != -100``), flattened to ``(N, vocab)`` and ``(N,)``.

    ``sparse`` (the model :func:`takes_positions`): when some positions are unscored, the model evaluates its head
    (and its last block's MLP) at the scored ones only — the same loss and gradients, computed without the rows
    the loss ignores (a recall task scores a few percent of its positions).  ``action_mask``: the batch's action
    mask (a task built with one), passed to the model as ``action_mask=``.  No final state is asked for
    (:func:`stateless_kwargs`)."""
    mask = y != -100
    kw = dict(stateless_kwargs(model))
    if action_mask is not None:
        kw["action_mask"] = action_mask
    if sparse and not bool(mask.all()):
        logits, _ = model(x, positions=mask, **kw)
        return logits, y[mask]
    logits, _ = model(x, **kw)
    return logits.reshape(-1, logits.shape[-1])[mask.reshape(-1)], y[mask]


def scored_loss(model: nn.Module, x: Tensor, y: Tensor, sparse: bool,
                reduction: str = "mean", action_mask: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Training's loss: cross-entropy in float32 over the scored positions (:func:`scored_logits`), with the
    logits and targets it was computed from: ``(loss, logits (N, vocab), targets (N,))``."""
    logits, targets = scored_logits(model, x, y, sparse, action_mask)
    return F.cross_entropy(logits.float(), targets, reduction=reduction), logits, targets


@torch.no_grad()
def evaluate(
    model: nn.Module, task: Any, n_examples: int = 512, batch_size: int = 64, distributed: bool = False,
    split: str = "eval", precision: str = "fp32", lockstep: bool = False,
) -> dict[str, float]:
    """Loss and accuracy over the scored positions of the task's fixed evaluation set (+ task metrics).

    ``split``: ``"eval"`` (:meth:`~seqmem.tasks.base.Task.eval_data`, the default), ``"valid"`` (the examples for
    choosing hyper-parameters, :meth:`~seqmem.tasks.base.Task.valid_data`) or ``"test"`` (tasks with a held-out
    test split, e.g. language modelling).

    ``distributed=True`` (every rank of the process group must call it): rank r evaluates batches r, r+W, …; the
    per-batch sums are gathered and added in batch order, so the result equals the single-process one exactly.
    ``lockstep`` (FSDP, whose forward passes are collective): every rank runs the same number of forward passes (a
    rank without a batch in the last round runs a discarded one).  ``precision``: see :func:`autocast`."""
    was_training = model.training
    model.eval()
    getter = {"eval": "eval_data", "valid": "valid_data", "test": "test_data"}.get(split)
    if getter is None:
        raise ValueError(f"split must be 'eval', 'valid' or 'test', got {split!r}")
    if not hasattr(task, getter):
        raise ValueError(f"task {type(task).__name__} has no {split!r} split ({getter})")
    inputs, targets, amask = split_batch(getattr(task, getter)(n_examples))
    device = next(model.parameters()).device
    rank, world = dist_info() if distributed else (0, 1)
    parts: list[tuple[int, float, float, int, int, dict[str, float]]] = []
    n_batches = -(-inputs.shape[0] // batch_size)
    for j in range(rank, -(-n_batches // world) * world, world):
        if j >= n_batches:
            if lockstep:
                with autocast(device, precision):
                    model(inputs[:1].to(device), **({} if amask is None else {"action_mask": amask[:1].to(device)}))
            continue
        i = j * batch_size
        x, y = inputs[i : i + batch_size].to(device), targets[i : i + batch_size].to(device)
        kw = {} if amask is None else {"action_mask": amask[i : i + batch_size].to(device)}
        try:
            with autocast(device, precision):
                logits, _ = model(x, **stateless_kwargs(model), **kw)
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
    # pooled over every scored position; a task metric of the same name (a per-batch value, weighted by batch size)
    # would differ where examples score different numbers of tokens (echo_mixture: 1 or 4), and with the batch size
    out.update({k: extra[k] / extra_w[k] for k in extra if k not in out})
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
    fsdp: bool = False,
    compile: bool = False,
) -> TrainResult:
    """Train ``model`` on ``task``.  With ``out_dir``: ``metrics.jsonl`` (one object per log step) and checkpoints
    under ``out_dir/checkpoints``; ``resume=True`` continues exactly from the newest good checkpoint (one at the
    final step: only the final evaluation runs, and ``final`` is what the uninterrupted run returned).
    ``stop_after`` ends the run early after that many steps (for tests of resumption).  ``loggers``: extra metric
    sinks with ``log(record, step)`` (e.g. :mod:`seqmem.train.tracking`), called on rank 0 only.
    ``compile=True`` runs the training steps' forward and backward through ``torch.compile`` (one process, no
    gradient accumulation; evaluation stays eager): the same model and optimiser, its float rounding not bit-equal
    to eager steps; the log records carry ``"compiled": true``, and the compile time counts in the run's CPU time.

    Under ``torchrun`` (an initialised process group of W > 1 ranks) this trains with DistributedDataParallel, or
    with FSDP2 when ``fsdp``; see the module docstring.  ``cfg.batch_size`` is the global batch (at least W times
    ``cfg.grad_accum``)."""
    device = next(model.parameters()).device
    rank, world = dist_info()
    main = rank == 0
    if world > 1 and cfg.batch_size < world:
        raise ValueError(f"batch_size={cfg.batch_size} is smaller than the number of processes ({world})")
    if cfg.batch_size < world * cfg.grad_accum:
        raise ValueError(f"batch_size={cfg.batch_size} cannot be split into {cfg.grad_accum} micro-batches on each "
                         f"of {world} processes")
    if fsdp and world == 1:
        raise ValueError("fsdp=True needs an initialised process group of more than one rank (torchrun)")
    if resume and out_dir is None:
        raise ValueError("resume=True needs out_dir (the run directory whose checkpoints it continues)")
    opt_state = sched_state = None
    gen = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    start = 0
    loss_since_log = (0.0, 0)  # the training loss summed over the steps since the last log record
    result = TrainResult()
    identity = checkpoint_identity(model, task)  # stored in each checkpoint, compared on resume
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
            st = load_trainer_state(ck)
            old_cfg = with_defaults(dict(st.get("train_config") or {}))
            if {**old_cfg, "steps": cfg.steps} != config_dict(cfg):
                raise ValueError(f"--resume: checkpoint {ck} was written with a different training configuration")
            for what, now in identity.items():  # checkpoints written before these were kept: skip
                diff = config_mismatch(st[what], now) if isinstance(st.get(what), str) else []
                if diff:
                    raise ValueError(f"--resume: checkpoint {ck} was written for a different "
                                     f"{what.removesuffix('_config')} configuration (fields that differ: "
                                     f"{', '.join(diff[:6])}); build the model and task of that run, or start a "
                                     "new run")
            load_weights(model, ck)  # after the checks: a refused resume leaves the caller's model as it was
            if cfg.steps < st["step"]:
                raise ValueError(f"--resume: the checkpoint is at step {st['step']}, beyond steps={cfg.steps}")
            opt_state, sched_state = st["optimizer"], st["scheduler"]
            if old_cfg.get("steps") != cfg.steps and main:
                # Extension: the warm-up + cosine schedule is laid over the new total, as if the run had been
                # started with it (LambdaLR's state holds only the step count; the lambda is _lr_lambda(cfg)).
                lr_old = cfg.lr * _lr_lambda(TrainConfig(**{**old_cfg, "betas": tuple(old_cfg["betas"])}))(
                    st["step"])
                lr_new = cfg.lr * _lr_lambda(cfg)(st["step"])
                _say(f"resume: extending the run from {old_cfg.get('steps')} to {cfg.steps} steps; the learning-"
                     f"rate schedule is laid over the new total (lr at step {st['step'] + 1}: {lr_old:.3g} -> "
                     f"{lr_new:.3g})")
            gen.set_state(st["data_rng"])
            torch.set_rng_state(st["torch_rng"])
            start = st["step"]
            result.start_step = start
            prior = st.get("cpu_seconds")
            result.cpu_seconds_before = float(prior) if isinstance(prior, int | float) else None
            since = st.get("loss_since_log")  # the interval's loss sum and steps (older checkpoints: none)
            if isinstance(since, list | tuple) and len(since) == 2:
                loss_since_log = (float(since[0]), int(since[1]))
            result.history = [r for r in _read_jsonl(metrics_path) if r["step"] <= start]
            if main:
                _write_jsonl(metrics_path, result.history)
        else:
            if list_checkpoints(ckpt_dir):
                if all(not verify_checkpoint(c) for c in list_checkpoints(ckpt_dir)):
                    raise ValueError(f"{ckpt_dir} holds only corrupt or incomplete checkpoints (their checksums do "
                                     f"not match): nothing to resume; delete {ckpt_dir} to train the run from the "
                                     "start")
                raise ValueError(f"{out_dir} already holds checkpoints of a training run: resume=True continues "
                                 "it; to start a new run, use another directory or remove the old run first")
            if main and metrics_path.exists():
                metrics_path.unlink()
    saving = ckpt_dir is not None  # every rank takes part in gathering an FSDP checkpoint
    if not main:
        metrics_path = ckpt_dir = None
        loggers = None
    ddp: nn.Module = model
    keep_names: list[str] = []
    if fsdp:
        keep_names = list(unique_state(model))  # tied weights once, as in an unsharded checkpoint
        _fully_shard(model)
    elif world > 1:
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=ids, static_graph=True)
    opt = make_optimizer(model, cfg)  # after sharding: FSDP replaces the parameters by sharded ones
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(cfg))
    if opt_state is not None:
        if fsdp:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            set_optimizer_state_dict(model, opt, _ids_to_fqns(opt_state, model, opt),
                                     options=StateDictOptions(full_state_dict=True))
        else:
            opt.load_state_dict(opt_state)
        sched.load_state_dict(sched_state)
        # the optimizer's saved lr is the old schedule's: set the next step's from this run's (an extension lays the
        # schedule over a new total; for a plain resume the value is the same)
        for g, base, lam in zip(opt.param_groups, sched.base_lrs, sched.lr_lambdas):
            g["lr"] = base * lam(sched.last_epoch)
    simple = world == 1 and cfg.grad_accum == 1  # one forward/backward per step (the original single-process path)
    sparse = takes_positions(model)  # the head at the scored positions only (scored_logits)
    fwd = model  # what the training steps call: the model, or its compiled form
    vocab: int | None = None  # set when compiled: the batch's id range is then checked before the call
    if compile:
        if not simple or fsdp:
            raise ValueError("compile=True supports one process without gradient accumulation (grad_accum = 1)")
        check_compiler(device)
        if isinstance(getattr(task, "seq_len", None), int):  # a task without one: the forward builds its caches
            prepare_compile(model, task.seq_len)
        fwd = torch.compile(model)
        vocab = getattr(getattr(model, "cfg", None), "vocab_size", None)

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
    t0, c0 = time.perf_counter(), time.process_time()
    tokens = 0
    loss_sum = torch.tensor(loss_since_log[0], dtype=torch.float32, device=device)  # summed on the device: no sync
    loss_n = loss_since_log[1]
    end = cfg.steps if stop_after is None else min(cfg.steps, stop_after)
    for step in range(start + 1, end + 1):
        x, y, am = split_batch(task.sample(cfg.batch_size, gen))
        tokens += x.numel()
        log_now = step % cfg.log_every == 0 or step == cfg.steps
        try:
            if simple:
                if vocab is not None:  # compiled: the id range, on the host (the compiled forward skips it)
                    check_ids(x, vocab)
                x, y = x.to(device), y.to(device)
                am = None if am is None else am.to(device)
                with autocast(device, cfg.precision):
                    loss, logits, scored = scored_loss(fwd, x, y, sparse, action_mask=am)
                report = loss
            else:
                opt.zero_grad(set_to_none=True)
                report, acc = _micro_steps(ddp, x, y, cfg.grad_accum, cfg.precision, rank, world, device, log_now,
                                           sparse, am)
        except NonFiniteError as e:
            raise NonFiniteError(f"training step {step}: {e}") from None
        except Exception as e:
            if compile and type(e).__module__.startswith(("torch._dynamo", "torch._inductor")):
                # the compiler, not the model: say so, with the way out
                raise RuntimeError(f"torch.compile failed at step {step} ({type(e).__name__}: "
                                   f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}); train without "
                                   "compile") from e
            raise
        if not torch.isfinite(report):
            raise FloatingPointError(
                f"training loss became {float(report.detach())} at step {step}; the run diverged: lower the "
                "learning rate (--lr), keep gradient clipping on, or train in float32"
            )
        loss_sum += report.detach().float()
        loss_n += 1
        if simple:
            opt.zero_grad(set_to_none=True)
            loss.backward()
        # the gradient norm (clipping with max_norm = inf clips nothing): a finite loss can still back-propagate
        # an inf or nan, which clipping would turn into nan weights and the next step would blame on its loss
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip if cfg.clip > 0 else math.inf)
        if hasattr(gnorm, "full_tensor"):  # FSDP2: a DTensor
            gnorm = gnorm.full_tensor()
        if not torch.isfinite(gnorm):
            raise FloatingPointError(
                f"the gradients became non-finite (norm {float(gnorm)}) at step {step}, with a finite loss "
                f"({float(report.detach()):.4g}); the weights were not updated: lower the learning rate (--lr), "
                "train in float32, or check a custom kernel's backward")
        lr_used = opt.param_groups[0]["lr"]  # the lr this step trains with (the scheduler then moves to the next)
        opt.step()
        sched.step()
        record: dict[str, Any] | None = None
        if log_now:
            if simple:
                with torch.no_grad():
                    acc = float((logits.argmax(-1) == scored).float().mean()) if scored.numel() else float("nan")
            el = time.perf_counter() - t0
            # loss: this step's; loss_mean: the mean over the steps since the previous log record (less noisy)
            record = {"step": step, "loss": float(report.detach()), "loss_mean": float(loss_sum) / loss_n,
                      "accuracy": acc, "lr": lr_used, "tokens_per_s": tokens / max(el, 1e-9)}
            loss_sum.zero_()
            loss_n = 0
            if compile:
                record["compiled"] = True
        if (cfg.eval_every and step % cfg.eval_every == 0) or step == cfg.steps:
            ev = evaluate(model, task, cfg.eval_examples, cfg.eval_batch_size, distributed=world > 1,
                          precision=cfg.precision, lockstep=fsdp)
            record = record or {"step": step, "loss": float(report.detach())}
            record.update({f"eval_{k}": v for k, v in ev.items()})
            if step == cfg.steps:
                result.final = ev
        if record is not None:
            result.history.append(record)
            if metrics_path is not None:
                append_text(metrics_path, json.dumps(record) + "\n")  # never through a planted link
            for lg in loggers or []:
                lg.log(record, step)
            if bar is not None:
                bar.set_postfix(loss=f"{record.get('loss_mean', record['loss']):.3f}",
                                acc=f"{record.get('accuracy', float('nan')):.3f}",
                                tok_s=f"{record.get('tokens_per_s', 0):.0f}")
            if (bar is not None or lines) and "eval_loss" in record:
                _say(_eval_line(record, cfg.steps), bar)
            elif lines and "accuracy" in record and (time.perf_counter() - last_line >= 10 or step == end):
                last_line = time.perf_counter()  # at most one line per 10 s (and the last step)
                _say(_progress_line(record, cfg.steps, start, last_line - t0))
        if bar is not None:
            bar.update(1)
        if saving and ((cfg.checkpoint_every and step % cfg.checkpoint_every == 0) or step == end):
            if fsdp:  # gathered on every rank (collective), written by rank 0 in the unsharded format
                weights, opt_sd = _full_state(model, opt, keep_names)
            else:
                weights, opt_sd = model, opt.state_dict()
            if ckpt_dir is not None:
                if metrics_path is not None and metrics_path.exists():
                    # the log lines up to this step on disk before the checkpoint: after a power loss a checkpoint
                    # never survives the lines before its step (a resume keeps rows <= its step: a permanent gap)
                    fsync_path(metrics_path)
                save_checkpoint(ckpt_dir, step, weights, {
                    "step": step, "optimizer": opt_sd, "scheduler": sched.state_dict(),
                    "data_rng": gen.get_state(), "torch_rng": torch.get_rng_state(),
                    "train_config": config_dict(cfg),
                    **identity,  # what a resume must be given again (compared there)
                    # CPU seconds of the steps so far, across resumes (None-safe: an older checkpoint's earlier
                    # segments are unknown and left out)
                    "cpu_seconds": (result.cpu_seconds_before or 0.0) + time.process_time() - c0,
                    # the logged loss_mean's partial interval: a resume continues it, as if never interrupted
                    "loss_since_log": [float(loss_sum), loss_n],
                })
        if world > 1 and ((cfg.checkpoint_every and step % cfg.checkpoint_every == 0) or step == end):
            import torch.distributed as dist

            dist.barrier()  # nobody runs ahead of a checkpoint being written
    if start == cfg.steps:
        # resumed from a checkpoint at the final step: nothing left to train, but the final evaluation an
        # uninterrupted run returns (``final`` was empty, and `seqmem train --resume` printed no evaluation); a log
        # without it (the steps shrunk to the checkpoint's) gets it on its final-step record, as a full run's has
        result.final = evaluate(model, task, cfg.eval_examples, cfg.eval_batch_size, distributed=world > 1,
                                precision=cfg.precision, lockstep=fsdp)
        evaluated = {f"eval_{k}": v for k, v in result.final.items()}
        last = result.history[-1] if result.history and result.history[-1].get("step") == start else None
        if last is None or not any(k.startswith("eval_") for k in last):
            if last is None:
                last = {"step": start}
                result.history.append(last)
            last.update(evaluated)
            if metrics_path is not None:
                _write_jsonl(metrics_path, result.history)
        if bar is not None or lines:
            _say(_eval_line({"step": start, **evaluated}, cfg.steps), bar)
    if bar is not None:
        bar.close()
    result.seconds = time.perf_counter() - t0
    result.cpu_seconds = time.process_time() - c0
    return result


def prepare_compile(model: nn.Module, seq_len: int) -> None:
    """Let every submodule with a ``prepare_compile(seq_len)`` method build, eagerly, the fixed tensors its
    forward over ``seq_len`` tokens caches (e.g. Elastic Memory's per-block HiPPO matrices), so that
    ``torch.compile`` traces plain cache reads instead of the cache's construction (graph breaks, recompiles)."""
    for m in model.modules():
        prepare = getattr(m, "prepare_compile", None)
        if callable(prepare):
            prepare(seq_len)


def check_compiler(device: torch.device | str) -> None:
    """Refuse ``torch.compile`` on CPU where its code generator has no C++ compiler (a one-line error before
    training instead of a long traceback at the first step)."""
    import shutil

    if torch.device(device).type != "cpu":
        return
    cxx = os.environ.get("CXX")
    if not any(shutil.which(c) for c in ([cxx] if cxx else []) + ["g++", "clang++", "c++"]):
        raise ValueError("compile=True on CPU needs a C++ compiler (g++ or clang++, or $CXX) for torch.compile's "
                         "code generation; none was found: install one or train without compile")


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
    return (f"step {step}/{total}  loss {record.get('loss_mean', record['loss']):.4f}  acc {record['accuracy']:.3f}  "
            f"{record.get('tokens_per_s', 0):.0f} tok/s  {elapsed:.0f} s elapsed, ~{left:.0f} s left")


def _eval_line(record: dict[str, Any], total: int) -> str:
    evals = "  ".join(f"{k[5:]} {v:.4f}" for k, v in record.items() if k.startswith("eval_"))
    return f"step {record['step']}/{total}  eval: {evals}"


def _micro_steps(
    net: nn.Module, x: Tensor, y: Tensor, n_micro: int, precision: str, rank: int, world: int, device: torch.device,
    want_acc: bool, sparse: bool = False, action_mask: Tensor | None = None,
) -> tuple[Tensor, float]:
    """Forward and backward over this rank's slice of the global batch in ``n_micro`` micro-batches (gradients
    summed), each loss scaled so that the summed — and, across ranks,
    averaged — gradient is the gradient of the global token-mean loss.  Returns the global mean loss (all-reduced)
    and, with ``want_acc``, the global accuracy."""
    n_global = int((y != -100).sum())
    rows = torch.tensor_split(torch.arange(x.shape[0]), world)[rank] if world > 1 else torch.arange(x.shape[0])
    parts = torch.tensor_split(rows, n_micro)
    total = torch.zeros((), device=device)
    counts = torch.zeros(2, dtype=torch.float64, device=device)
    for j, idx in enumerate(parts):
        last = j == len(parts) - 1
        xs, ys = x[idx].to(device), y[idx].to(device)
        ams = None if action_mask is None else action_mask[idx].to(device)
        if hasattr(net, "set_requires_gradient_sync"):  # FSDP2: reduce-scatter after the last micro-batch only
            net.set_requires_gradient_sync(last)
        # (DDP averages every micro-batch's gradients: DDP with static_graph refuses no_sync; the sum of averages
        # is the average of the sums, at the cost of one all-reduce per micro-batch)
        with autocast(device, precision):
            loss_sum, logits, scored = scored_loss(net, xs, ys, sparse, reduction="sum", action_mask=ams)
        (loss_sum * (world / max(n_global, 1))).backward()
        total += loss_sum.detach()
        if want_acc:
            with torch.no_grad():
                hits = (logits.argmax(-1) == scored).sum()
                counts += torch.stack([hits, torch.full_like(hits, scored.numel())]).double()
    if world > 1:
        import torch.distributed as dist

        dist.all_reduce(total)
        if want_acc:
            dist.all_reduce(counts)
    report = total / n_global if n_global else total * float("nan")
    acc = float(counts[0] / counts[1]) if want_acc and counts[1] > 0 else float("nan")
    return report, acc


def _fully_shard(model: nn.Module) -> None:
    """FSDP2: shard each block of ``model.blocks`` (when it has them), then the model itself (in place)."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch < 2.6
        try:
            from torch.distributed._composable.fsdp import fully_shard
        except ImportError:
            raise ValueError("FSDP2 (torch.distributed.fsdp.fully_shard) needs a newer torch") from None
    for blk in getattr(model, "blocks", []):
        fully_shard(blk)
    fully_shard(model)


class _Weights:
    """A full (gathered) state dict in the shape :func:`save_checkpoint` expects of a model."""

    def __init__(self, sd: dict[str, Tensor]) -> None:
        self._sd = sd

    def state_dict(self) -> dict[str, Tensor]:
        return self._sd


def _full_state(model: nn.Module, opt: torch.optim.Optimizer, keep: list[str]) -> tuple[_Weights, dict[str, Any]]:
    """The unsharded weights and optimizer state of an FSDP model (a collective: every rank calls it; the full
    tensors land on rank 0, in the format of an unsharded model's ``state_dict`` / ``opt.state_dict()``)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    o = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd = get_model_state_dict(model, options=o)
    osd = get_optimizer_state_dict(model, opt, options=o)
    if not msd:  # ranks other than 0 receive nothing
        return _Weights({}), {}
    return _Weights({k: msd[k] for k in keep}), _fqns_to_ids(osd)


def _fqns_to_ids(osd: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state dict keyed by parameter names (``torch.distributed.checkpoint``) → keyed by position,
    as ``Optimizer.state_dict()`` writes it (parameters numbered through the groups in order)."""
    index: dict[str, int] = {}
    for g in osd["param_groups"]:
        for name in g["params"]:
            index.setdefault(name, len(index))
    return {"state": {index[k]: v for k, v in osd["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in osd["param_groups"]]}


def _ids_to_fqns(osd: dict[str, Any], model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """The inverse of :func:`_fqns_to_ids` for ``opt`` over ``model``'s parameters."""
    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for g in opt.param_groups for p in g["params"]]
    return {"state": {order[int(k)]: v for k, v in osd["state"].items()},
            "param_groups": [{**g, "params": [order[int(i)] for i in g["params"]]} for g in osd["param_groups"]]}


def _read_jsonl(path: Path | None) -> list[dict[str, Any]]:
    return [] if path is None or not path.exists() else read_jsonl(path)


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    from seqmem.io import atomic_write_text

    atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))
