"""Copy task of the VLA paper (§5.2, Table 7): reproduce the first half after a separator.

Layout (the paper gives only "a length-T sequence; reproduce the second half after a separator"; our reading,
docs/vla.md)::

    c_1 .. c_m  SEP  c_1 .. c_m  [pad]        m = (T - 1) // 2, SEP = V - 1, c_i uniform from [0, V - 1)

Targets are next-token targets on the copy half only: the position of SEP predicts c_1, the position of c_i in
the copy predicts c_{i+1}; the last copied token and any pad are not scored (m scored positions per example).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from seqmem.io import check_int
from seqmem.tasks.base import DEFAULT_EVAL_SEED, IGNORE_INDEX, Task, register_task

__all__ = ["CopyHalfTask"]


@register_task("copy_half")
class CopyHalfTask(Task):
    """Copy the first half of the sequence after a separator (VLA paper's copy task)."""

    name = "copy_half"

    def __init__(self, vocab_size: int = 128, seq_len: int = 64, eval_seed: int = DEFAULT_EVAL_SEED) -> None:
        super().__init__(eval_seed)
        for k, v, lo in (("vocab_size", vocab_size, 3), ("seq_len", seq_len, 3)):
            check_int(k, v, lo)
        self.vocab_size, self.seq_len = vocab_size, seq_len
        self.m = (seq_len - 1) // 2
        self.sep_token = vocab_size - 1

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "vocab_size": self.vocab_size, "seq_len": self.seq_len,
                "eval_seed": self.eval_seed}

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        B, m, T = self._check_batch(batch_size), self.m, self.seq_len
        c = torch.randint(0, self.vocab_size - 1, (B, m), generator=generator)
        x = torch.zeros(B, T, dtype=torch.long)
        x[:, :m] = c
        x[:, m] = self.sep_token
        x[:, m + 1 : 2 * m + 1] = c
        y = torch.full((B, T), IGNORE_INDEX, dtype=torch.long)
        y[:, m : 2 * m] = c
        return x, y
