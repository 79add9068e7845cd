"""Byte-level language modelling on local text (:mod:`seqmem.data`), vocabulary 256.

Examples are fixed-length windows of a split's byte stream: a start ``i`` is drawn uniformly from
``[0, len(split) - T - 1]`` and ``input_ids = bytes[i : i + T]``, ``targets = bytes[i + 1 : i + T + 1]``
(every position is scored).  Windows may cross document boundaries (documents are joined by the byte 0).

* training windows: the ``train`` split, from the caller's generator;
* :meth:`LMTask.eval_data`: the ``eval_split`` (default ``val``) from a fixed seed (``eval_seed``);
* :meth:`LMTask.test_data`: the ``test`` split from a separate fixed seed (``eval_seed + 1``) — report it
  once, never tune on it.

:meth:`LMTask.metrics` returns ``bpb`` (bits per byte = cross-entropy in nats / ln 2, over all positions),
``accuracy``, and ``bpb_pos_<lo>_<hi>`` for ``n_buckets`` equal position buckets of the context (inclusive
bounds; boundaries ``round(k · T / n_buckets)``), e.g. T = 512, ``n_buckets=8``: ``bpb_pos_0_63``, …,
``bpb_pos_448_511``.  A model that uses long context has lower bpb in the late buckets.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from torch import Tensor

from seqmem.data import SPLITS, Corpus, load_corpus
from seqmem.tasks._windows import SplitWindowsTask, bucket_edges
from seqmem.tasks.base import register_task

__all__ = ["LMTask", "bucket_edges"]


@register_task("lm")
class LMTask(SplitWindowsTask):
    """Next-byte prediction on windows of a local corpus (``code``, ``docs``, a directory or a file).

    Args:
        corpus: ``"code"``, ``"docs"``, or a path (see :func:`seqmem.data.load_corpus`).
        seq_len: T, the window length.
        max_files: use only a deterministic subset of this many files (fast tests / small runs).
        fractions: (train, val, test) document fractions.
        n_buckets: number of position buckets in :meth:`metrics`.
        eval_split: split used by :meth:`eval_data` (``"val"``; ``"train"`` to measure fitting).
        cache: cache the concatenated corpus under ``~/.cache/seqmem`` (``$SEQMEM_CACHE``).
        eval_seed: seed of the evaluation stream (the test stream uses ``eval_seed + 1``).

    ``max_files`` … ``eval_seed`` are :class:`~seqmem.tasks._windows.SplitWindowsTask`'s options (keyword-only).
    """


    name = "lm"
    vocab_size = 256

    def __init__(self, corpus: str = "code", seq_len: int = 512, **window_options: Any) -> None:
        super().__init__(seq_len, **window_options)
        if not isinstance(corpus, str | os.PathLike):
            raise ValueError(f"corpus must be 'code', 'docs' or a path, got {corpus!r}")
        self.corpus_name = str(corpus)
        self.corpus: Corpus = load_corpus(corpus, max_files=self.max_files, fractions=self.fractions,
                                          cache=self.cache)
        self.fractions = tuple(float(f) for f in self.fractions)
        self._check_splits()

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "corpus": self.corpus_name, "seq_len": self.seq_len, **self._window_config()}

    def _check_split(self, split: str) -> np.ndarray:
        arr = self.corpus.split(split)
        if arr.shape[0] < self.seq_len + 1:
            raise ValueError(
                f"the {split!r} split of corpus {self.corpus_name!r} has {arr.shape[0]} bytes "
                f"({len(self.corpus.documents.get(split, []))} documents), fewer than seq_len + 1 = "
                f"{self.seq_len + 1}; use a larger corpus (more files / max_files) or a shorter seq_len"
            )
        return arr

    def split_data(self, split: str, n_examples: int) -> tuple[Tensor, Tensor]:
        """Fixed-seed windows of any split: ``val``/``test`` as :meth:`eval_data`/:meth:`test_data`."""
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
        if split == "test":
            return self.test_data(n_examples)
        if split == self.eval_split:
            return self.eval_data(n_examples)
        self._check_split(split)
        seed = self.eval_seed + 2 + SPLITS.index(split)
        return self._cached_stream(split, seed, n_examples, lambda b, g: self.sample_split(split, b, g))

    def metrics(self, logits: Tensor, targets: Tensor) -> dict[str, float]:
        """``bpb`` overall, ``accuracy``, and ``bpb_pos_<lo>_<hi>`` per position bucket (module docstring)."""
        return self._position_metrics(logits, targets, "bpb", "bpb_pos", bucket_bits=True)
