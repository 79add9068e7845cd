"""Optional experiment-tracking backends next to the always-written ``metrics.jsonl``.

``make_loggers(["tensorboard", "wandb"], out_dir, config)`` returns logger objects with ``log(record, step)`` and
``close()``, for :func:`seqmem.train.train`'s ``loggers=``.  Both work offline:

* ``tensorboard`` — ``torch.utils.tensorboard.SummaryWriter`` writing event files to ``out_dir/tensorboard``
  (needs the ``tensorboard`` package); view with ``tensorboard --logdir out_dir/tensorboard``.
* ``wandb`` — Weights & Biases in ``WANDB_MODE`` (default ``offline``), files under ``out_dir/wandb``; upload later
  with ``wandb sync``.  The run id is kept in ``out_dir/wandb/seqmem_run_id`` so ``--resume`` continues the same
  W&B run and a new run in the same directory starts its own.

A backend whose package is not installed is skipped with one warning line on stderr (training still runs and the
JSONL metrics are complete).
"""

from __future__ import annotations

import hashlib
import importlib
import math
import os
import secrets
import sys
from pathlib import Path
from typing import Any

from seqmem.io import atomic_write_text

__all__ = ["BACKENDS", "TensorBoardLogger", "WandbLogger", "make_loggers"]

BACKENDS = ("tensorboard", "wandb")


def _scalars(record: dict[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in record.items():
        if k == "step" or isinstance(v, bool) or not isinstance(v, int | float):
            continue
        if math.isfinite(float(v)):
            out[k] = float(v)
    return out


class TensorBoardLogger:
    def __init__(self, out_dir: Path, config: dict[str, Any] | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter  # raises ImportError without the tensorboard package

        self.writer = SummaryWriter(log_dir=str(Path(out_dir) / "tensorboard"))
        if config:
            import json

            self.writer.add_text("config", "```\n" + json.dumps(config, indent=2) + "\n```", 0)

    def log(self, record: dict[str, Any], step: int) -> None:
        for k, v in _scalars(record).items():
            group = "eval" if k.startswith("eval_") else "train"
            self.writer.add_scalar(f"{group}/{k.removeprefix('eval_')}", v, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def wandb_run_id(out_dir: Path) -> str:
    """The W&B run id of the training run in ``out_dir``: kept in ``out_dir/wandb/seqmem_run_id``, so a resumed
    run continues its W&B run, and drawn at random where there is none, so a new run in the same directory (after
    ``--overwrite``, which removes ``wandb/``) or at the same path on another machine starts a W&B run of its own
    (an id from the path alone appended it to the old one, whose later steps W&B then drops)."""
    f = Path(out_dir) / "wandb" / "seqmem_run_id"
    if f.is_file() and not f.is_symlink():
        rid = f.read_text().strip()
        if rid.isalnum() and 0 < len(rid) <= 64:
            return rid
    if f.parent.is_dir() and any(f.parent.iterdir()):  # a run logged before the id was kept: its id, from the path
        rid = hashlib.sha1(str(Path(out_dir).resolve()).encode()).hexdigest()[:12]
    else:
        rid = secrets.token_hex(6)
    atomic_write_text(f, rid + "\n")
    return rid


class WandbLogger:
    def __init__(self, out_dir: Path, config: dict[str, Any] | None = None) -> None:
        wandb = importlib.import_module("wandb")
        out_dir = Path(out_dir)
        (out_dir / "wandb").mkdir(parents=True, exist_ok=True)
        run_id = wandb_run_id(out_dir)
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "seqmem"), dir=str(out_dir), config=config or {},
            mode=os.environ.get("WANDB_MODE", "offline"), id=run_id, resume="allow", name=out_dir.name,
        )

    def log(self, record: dict[str, Any], step: int) -> None:
        self.run.log(_scalars(record), step=step)

    def close(self) -> None:
        self.run.finish()


def make_loggers(names: list[str] | None, out_dir: str | os.PathLike, config: dict[str, Any] | None = None) -> list:
    """Loggers for the requested backends; missing packages are skipped with a warning on stderr."""
    loggers: list[Any] = []
    for name in names or []:
        if name not in BACKENDS:
            raise ValueError(f"unknown log backend {name!r}; valid: {', '.join(BACKENDS)} (JSONL is always written)")
        cls = TensorBoardLogger if name == "tensorboard" else WandbLogger
        try:
            loggers.append(cls(Path(out_dir), config))
        except ImportError as e:
            pkg = "tensorboard" if name == "tensorboard" else "wandb"
            print(f"seqmem: warning: --log {name} skipped: the {pkg!r} package is not installed "
                  f"(pip install {pkg}); metrics are still written to metrics.jsonl ({e})", file=sys.stderr)
    return loggers
