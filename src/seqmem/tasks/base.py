"""The task protocol shared by every training task, and the name → task registry.

A task produces teacher-forced batches for a causal language model::

    input_ids, targets = task.sample(batch_size, generator)   # both (B, T) int64
    # targets[b, t] is the token the model must predict from input_ids[b, :t+1]; -100 where nothing is scored

A task built with an action mask (the Echo tasks' ``action_mask=True``) returns a third tensor, the batch's
``action_mask`` (B, T) int64 in {0, 1}: the oracle mask of the tokens allowed into an SKA layer's memory (Echo App. F
eq. 53); the trainer and :func:`seqmem.train.evaluate` pass it to the model (``model(x, action_mask=...)``).
:func:`split_batch` unpacks either form.

Training batches come from the caller's ``torch.Generator`` (the trainer's RNG stream); evaluation examples
come from :meth:`Task.eval_data`, a *separate* stream seeded with ``task.eval_seed`` that is deterministic,
cached, and prefix-consistent (``eval_data(100)`` equals ``eval_data(1000)[:100]``).

Register a new task with ``@register_task("name")`` on a :class:`Task` subclass and build it with
``build_task("name", **options)``; unknown names/options raise a :class:`ValueError` listing the valid ones.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import Tensor

from seqmem.io import check_int, import_submodules

IGNORE_INDEX = -100
DEFAULT_EVAL_SEED = 2_718_281
#: the validation stream is seeded with ``eval_seed + VALID_SEED_OFFSET``: examples for choosing hyper-parameters
#: (learning rates in ``seqmem sweep``), drawn apart from the reported evaluation examples
VALID_SEED_OFFSET = 1_000_003

__all__ = [
    "DEFAULT_EVAL_SEED",
    "IGNORE_INDEX",
    "VALID_SEED_OFFSET",
    "Task",
    "build_task",
    "get_task_class",
    "list_tasks",
    "masked_accuracy",
    "register_task",
    "split_batch",
    "task_options",
]


def split_batch(batch: Any) -> tuple[Tensor, Tensor, Tensor | None]:
    """``(input_ids, targets, action_mask or None)`` from a task's batch: ``(input_ids, targets)`` or
    ``(input_ids, targets, action_mask)``; a ValueError for anything else."""
    if isinstance(batch, (tuple, list)) and len(batch) in (2, 3) and all(isinstance(t, Tensor) for t in batch):
        return batch[0], batch[1], (batch[2] if len(batch) == 3 else None)
    raise ValueError("a task's batch must be (input_ids, targets) or (input_ids, targets, action_mask) tensors, "
                     f"got {type(batch).__name__}" + (f" of {len(batch)}" if isinstance(batch, (tuple, list)) else ""))


def masked_accuracy(logits: Tensor, targets: Tensor) -> tuple[float, int]:
    """Top-1 accuracy of ``logits.argmax(-1)`` where ``targets != -100``; returns ``(acc, n_scored)``."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match targets {tuple(targets.shape)}")
    mask = targets != IGNORE_INDEX
    n = int(mask.sum())
    if n == 0:
        return float("nan"), 0
    correct = (logits.argmax(-1) == targets) & mask
    return float(correct.sum()) / n, n


class Task:
    """Base class of a training task (see the module docstring for the protocol).

    Subclasses set ``name`` (class attribute), ``vocab_size`` and ``seq_len`` and implement :meth:`sample` and
    :meth:`config`; they may override :meth:`metrics`.
    """

    name: ClassVar[str] = "task"
    #: the split whose results are reported; hyper-parameters are chosen on ``valid`` (:meth:`valid_data`)
    report_split: ClassVar[str] = "eval"
    #: eval examples are generated in blocks of this many, in order, so eval_data is prefix-consistent
    eval_block: ClassVar[int] = 256

    vocab_size: int
    seq_len: int

    def __init__(self, eval_seed: int = DEFAULT_EVAL_SEED) -> None:
        check_int("eval_seed", eval_seed, 0)
        self.eval_seed = eval_seed
        self._streams: dict[str, tuple[tuple[Tensor, ...] | None, torch.Generator | None]] = {}

    # --- to implement ----------------------------------------------------------------------------------
    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """Draw ``batch_size`` training examples ``(input_ids, targets)``, both ``(B, seq_len)`` int64."""
        raise NotImplementedError

    def config(self) -> dict[str, Any]:
        """JSON-serialisable options that rebuild this task with ``build_task(cfg.pop("name"), **cfg)``."""
        raise NotImplementedError

    # --- provided --------------------------------------------------------------------------------------
    def eval_data(self, n_examples: int) -> tuple[Tensor, ...]:
        """``n_examples`` evaluation examples from the fixed-seed eval stream (deterministic, cached): ``(inputs,
        targets)``, or ``(inputs, targets, action_mask)`` for a task built with an action mask."""
        return self._cached_stream("eval", self.eval_seed, n_examples, self._eval_sample)

    def valid_data(self, n_examples: int) -> tuple[Tensor, ...]:
        """``n_examples`` validation examples: drawn like :meth:`eval_data` but from a separate stream (seed
        ``eval_seed + VALID_SEED_OFFSET``), for choosing hyper-parameters without touching the reported examples."""
        return self._cached_stream("valid", self.eval_seed + VALID_SEED_OFFSET, n_examples, self._eval_sample)

    def _cached_stream(
        self,
        key: str,
        seed: int,
        n_examples: int,
        draw: Callable[[int, torch.Generator], tuple[Tensor, ...]],
    ) -> tuple[Tensor, ...]:
        """First ``n_examples`` of the stream ``draw(eval_block, gen)``, ``gen`` seeded by ``seed`` (every tensor of
        the batches ``draw`` returns: inputs, targets and, for a task with an action mask, the mask)."""
        check_int("n_examples", n_examples)
        cache, gen = self._streams.get(key, (None, None))
        have = 0 if cache is None else cache[0].shape[0]
        if have < n_examples:
            if gen is None:
                gen = torch.Generator().manual_seed(seed)
            parts: list[list[Tensor]] = [] if cache is None else [[t] for t in cache]
            for _ in range(math.ceil((n_examples - have) / self.eval_block)):
                batch = draw(self.eval_block, gen)
                if not parts:
                    parts = [[] for _ in batch]
                for lst, t in zip(parts, batch, strict=True):
                    lst.append(t)
            cache = tuple(torch.cat(lst) for lst in parts)
            self._streams[key] = (cache, gen)
        assert cache is not None
        return tuple(t[:n_examples].clone() for t in cache)

    def _eval_sample(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Hook: how eval examples are drawn (default: like training examples)."""
        return self.sample(batch_size, generator)

    def metrics(self, logits: Tensor, targets: Tensor) -> dict[str, float]:
        """Task metrics from ``logits (B, T, V)`` and ``targets (B, T)``.  Default: scored-token accuracy.

        Values must be per-example averages (the trainer averages them over batches weighted by batch size).
        :func:`~seqmem.train.loop.evaluate` reports ``loss`` and ``accuracy`` pooled over every scored position
        itself; a value of either name returned here is not used by it.
        """
        acc, _ = masked_accuracy(logits, targets)
        return {"accuracy": acc}

    def _check_batch(self, batch_size: int) -> int:
        check_int("batch_size", batch_size)
        return batch_size

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.config().items() if k != "name")
        return f"{type(self).__name__}({opts})"


# --- registry ------------------------------------------------------------------------------------------
_TASKS: dict[str, type[Task]] = {}


def register_task(name: str):
    """Class decorator registering a :class:`Task` subclass under ``name``."""

    def deco(cls: type[Task]) -> type[Task]:
        if not (isinstance(cls, type) and issubclass(cls, Task)):
            raise TypeError(f"@register_task({name!r}) must decorate a Task subclass, got {cls!r}")
        if name in _TASKS and _TASKS[name] is not cls:
            raise ValueError(f"task name {name!r} registered twice ({_TASKS[name]} and {cls})")
        _TASKS[name] = cls
        return cls

    return deco


def _load_all() -> None:
    import_submodules("seqmem.tasks")  # once (cached)


def list_tasks() -> list[str]:
    """Names of all registered tasks, sorted."""
    _load_all()
    return sorted(_TASKS)


def get_task_class(name: str) -> type[Task]:
    _load_all()
    if name not in _TASKS:
        from seqmem.registry import unknown_name

        raise unknown_name("task", name, _TASKS)
    return _TASKS[name]


def task_options(name: str) -> list[str]:
    """Constructor options accepted by task ``name``."""
    cls = get_task_class(name)
    opts: list[str] = []
    for klass in cls.__mro__:
        if klass is object or not issubclass(klass, Task):
            continue
        for pname, p in inspect.signature(klass.__init__).parameters.items():
            if pname == "self" or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                continue
            if pname not in opts:
                opts.append(pname)
    return opts


def build_task(name: str, **options: Any) -> Task:
    """Build task ``name``; unknown names or options raise ``ValueError`` listing the valid ones."""
    cls = get_task_class(name)
    valid = task_options(name)
    bad = [k for k in options if k not in valid]
    if bad:
        from seqmem.registry import did_you_mean

        hints = "".join(did_you_mean(b, valid) for b in bad)
        raise ValueError(
            f"unknown option(s) {', '.join(map(repr, bad))}{hints} for task {name!r}; valid: {', '.join(valid)}"
        )
    return cls(**options)
