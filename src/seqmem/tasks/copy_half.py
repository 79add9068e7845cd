"""Copy task of the VLA paper (§5.2, Table 7: "reproduce the second half after a separator token"): after the
separator, the sequence's second half repeats its first half.

Layout (the paper gives only "a length-T sequence; reproduce the second half after a separator"; our reading,
docs/vla.md)::

    c_1 .. c_m  SEP  c_1 .. c_m  [pad]        m = (T - 1) // 2, SEP = V - 1, c_i uniform from [0, V - 1)

``targets`` picks one of two readings of what is scored (the paper does not say; m scored positions per example
either way, any pad not scored):

* ``"next"`` (default): next-token targets on the copy half — the position of SEP predicts c_1, the position of c_i
  in the copy predicts c_{i+1}; the last copied token is not scored. Copying is then a recall of m associations.
* ``"identity"``: the copied half's own input tokens — the position of c_i in the copy is scored against c_i
  itself, which a model can emit from its current input alone (no memory needed).
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

    TARGETS = ("next", "identity")

    def __init__(self, vocab_size: int = 128, seq_len: int = 64, targets: str = "next",
                 eval_seed: int = DEFAULT_EVAL_SEED) -> None:
        super().__init__(eval_seed)
        for k, v, lo in (("vocab_size", vocab_size, 3), ("seq_len", seq_len, 3)):
            check_int(k, v, lo)
        if targets not in self.TARGETS:
            raise ValueError(f"targets must be one of {self.TARGETS}, got {targets!r}")
        self.targets = targets
        self.vocab_size, self.seq_len = vocab_size, seq_len
        self.m = (seq_len - 1) // 2
        self.sep_token = vocab_size - 1

    def config(self) -> dict[str, Any]:
        cfg = {"name": self.name, "vocab_size": self.vocab_size, "seq_len": self.seq_len}
        if self.targets != "next":  # the default is left out, so runs recorded before the option keep their config
            cfg["targets"] = self.targets
        return {**cfg, "eval_seed": self.eval_seed}

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        B, m, T = self._check_batch(batch_size), self.m, self.seq_len
        c = torch.randint(0, self.vocab_size - 1, (B, m), generator=generator)
        x = torch.zeros(B, T, dtype=torch.long)
        x[:, :m] = c
        x[:, m] = self.sep_token
        x[:, m + 1 : 2 * m + 1] = c
        y = torch.full((B, T), IGNORE_INDEX, dtype=torch.long)
        if self.targets == "next":
            y[:, m : 2 * m] = c
        else:
            y[:, m + 1 : 2 * m + 1] = c
        return x, y
