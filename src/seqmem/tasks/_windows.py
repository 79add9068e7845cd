"""Language-modelling tasks as random windows of a token array per split (``train`` / ``val`` / ``test``).

Shared by the byte-level ``lm`` task and the tokenised ``text`` task: subclasses hold the arrays and implement
``_check_split(split) -> np.ndarray`` (the split's tokens, at least ``seq_len + 1`` of them, else a clear error) and
set ``eval_split``.  Hyper-parameters are chosen on the evaluation windows (``eval_split``, default ``val``; the
validation windows refuse any other split); results are reported on ``test`` (``report_split``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from seqmem.data import DEFAULT_FRACTIONS, SPLITS
from seqmem.io import check_int
from seqmem.tasks.base import DEFAULT_EVAL_SEED, IGNORE_INDEX, Task, masked_accuracy


def bucket_edges(seq_len: int, n_buckets: int) -> list[tuple[int, int]]:
    """Half-open ranges ``[lo, hi)`` of ``n_buckets`` near-equal buckets covering ``range(seq_len)``."""
    b = [round(k * seq_len / n_buckets) for k in range(n_buckets + 1)]
    return [(b[k], b[k + 1]) for k in range(n_buckets)]


class SplitWindowsTask(Task):
    """Windows ``(tokens[i:i+T], tokens[i+1:i+T+1])`` of a split, starting at uniformly random ``i``.

    The options every such task shares are this class's: ``max_files`` (a deterministic subset of this many files
    of a directory corpus), ``fractions`` ((train, val, test) document fractions), ``n_buckets`` (position buckets
    in the metrics), ``eval_split`` (the split of :meth:`eval_data`), ``cache`` and ``eval_seed``; a subclass
    declares its own options and ``seq_len`` (in its own order) and forwards these keyword-only.

    A subclass calls ``__init__`` first (it checks and sets ``seq_len``, ``n_buckets``, ``eval_split`` and the
    position ``buckets``, and sets ``max_files``, ``cache`` and ``fractions`` as given: the subclass's loader checks
    ``fractions`` and stores them as floats), loads its token arrays, then calls :meth:`_check_splits`."""

    report_split: ClassVar[str] = "test"
    eval_split: str = "val"

    def __init__(
        self,
        seq_len: int,
        *,
        max_files: int | None = None,
        fractions: tuple[float, float, float] = DEFAULT_FRACTIONS,
        n_buckets: int = 8,
        eval_split: str = "val",
        cache: bool = True,
        eval_seed: int = DEFAULT_EVAL_SEED,
    ) -> None:
        super().__init__(eval_seed)
        self._check_window_options(seq_len, n_buckets, eval_split)
        self.seq_len, self.n_buckets, self.eval_split = seq_len, n_buckets, eval_split
        self.buckets = bucket_edges(seq_len, n_buckets)
        self.max_files, self.fractions, self.cache = max_files, fractions, bool(cache)

    def _window_config(self) -> dict[str, Any]:
        """The shared options' part of :meth:`config`."""
        return {"max_files": self.max_files, "fractions": list(self.fractions), "n_buckets": self.n_buckets,
                "eval_split": self.eval_split, "cache": self.cache, "eval_seed": self.eval_seed}

    def _check_split(self, split: str) -> np.ndarray:
        raise NotImplementedError

    def _check_splits(self) -> None:
        """:meth:`_check_split` of the splits the task draws from at once: ``train`` and ``eval_split``."""
        for split in ("train", self.eval_split):
            self._check_split(split)

    @staticmethod
    def _check_window_options(seq_len: int, n_buckets: int, eval_split: str) -> None:
        """Raise unless ``seq_len`` is a positive integer, ``n_buckets`` an integer in ``[1, seq_len]`` and
        ``eval_split`` a split name."""
        check_int("seq_len", seq_len)
        if isinstance(n_buckets, bool) or not isinstance(n_buckets, int) or not 1 <= n_buckets <= seq_len:
            raise ValueError(f"n_buckets must be an integer in [1, seq_len={seq_len}], got {n_buckets!r}")
        if eval_split not in SPLITS:
            raise ValueError(f"eval_split must be one of {', '.join(SPLITS)}, got {eval_split!r}")

    @staticmethod
    def _mean_ce(logits: Tensor, targets: Tensor) -> Callable[[int, int], float]:
        """``mean(lo, hi)``: the mean cross-entropy (nats, in float64) over the scored targets at positions
        ``lo .. hi-1`` (nan where none is scored); raises unless ``logits`` is ``targets``' shape plus a vocab axis."""
        if logits.dim() != 3 or logits.shape[:-1] != targets.shape:
            raise ValueError(f"logits {tuple(logits.shape)} do not match targets {tuple(targets.shape)}")
        ce = F.cross_entropy(logits.double().reshape(-1, logits.shape[-1]), targets.reshape(-1),
                             ignore_index=IGNORE_INDEX, reduction="none").reshape(targets.shape)
        mask = (targets != IGNORE_INDEX).to(ce.dtype)

        def mean(lo: int, hi: int) -> float:
            n = float(mask[:, lo:hi].sum())
            return float((ce[:, lo:hi] * mask[:, lo:hi]).sum()) / n if n else float("nan")

        return mean

    def _position_metrics(self, logits: Tensor, targets: Tensor, total: str, bucket: str, bucket_bits: bool
                          ) -> dict[str, float]:
        """``total``: the mean loss in bits per scored target; ``accuracy``; and, when ``targets`` span
        ``seq_len``, ``<bucket>_<lo>_<hi>`` per position bucket (inclusive bounds): the mean loss there, in bits
        with ``bucket_bits``, else in nats."""
        mean = self._mean_ce(logits, targets)
        ln2 = math.log(2.0)
        out = {total: mean(0, targets.shape[1]) / ln2, "accuracy": masked_accuracy(logits, targets)[0]}
        if targets.shape[1] == self.seq_len:
            for lo, hi in self.buckets:
                out[f"{bucket}_{lo}_{hi - 1}"] = mean(lo, hi) / ln2 if bucket_bits else mean(lo, hi)
        return out

    def sample_split(
        self, split: str, batch_size: int, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """``batch_size`` random windows of ``split`` as int64 ``(inputs, targets)``."""
        B = self._check_batch(batch_size)
        arr = self._check_split(split)
        T = self.seq_len
        starts = torch.randint(0, arr.shape[0] - T, (B,), generator=generator).numpy()
        w = torch.from_numpy(np.asarray(arr[starts[:, None] + np.arange(T + 1)], dtype=np.int64))
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        return self.sample_split("train", batch_size, generator)

    def _eval_sample(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return self.sample_split(self.eval_split, batch_size, generator)

    def valid_data(self, n_examples: int) -> tuple[Tensor, Tensor]:
        """Hyper-parameters are chosen on the evaluation windows (``eval_split``, which must be ``val`` here);
        results are reported on :meth:`test_data`.  With ``eval_split="test"`` a sweep chose its lrs on the windows
        it reports (and with ``"train"`` on the training data): refused."""
        self.check_selection_split(self.eval_split)
        return self.eval_data(n_examples)

    @staticmethod
    def check_selection_split(eval_split: str) -> None:
        """Raise unless ``eval_split`` may be the split hyper-parameters are chosen on (``val``)."""
        if eval_split != "val":
            why = "the split results are reported on" if eval_split == "test" else "the split trained on"
            raise ValueError(f"eval_split={eval_split!r}: the validation windows (what a sweep chooses learning "
                             f"rates on) would be {why}; choose on eval_split='val' (eval_split={eval_split!r} is "
                             "for `seqmem train`'s evaluations)")

    def test_data(self, n_examples: int) -> tuple[Tensor, Tensor]:
        """``n_examples`` windows of the ``test`` split from a fixed seed (``eval_seed + 1``; cached) — report
        once, never tune on it."""
        self._check_split("test")
        return self._cached_stream("test", self.eval_seed + 1, n_examples,
                                   lambda b, g: self.sample_split("test", b, g))
