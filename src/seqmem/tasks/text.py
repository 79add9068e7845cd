"""Language modelling on real text with any tokenizer (``seqmem train --task lm --dataset NAME --tokenizer TOK``).

Documents come from :func:`seqmem.textdata.load_documents` (local files always; PG-19, Proof-Pile, FineWeb-Edu or
any Hub dataset through ``datasets``), token ids from :func:`seqmem.textdata.load_tokenizer` (``byte``, a Hugging
Face tokenizer, a ``tokenizer.json``, or ``train:<vocab>``).  Each split is one token stream (documents joined by
the tokenizer's end-of-text id); examples are random windows of ``seq_len + 1`` tokens, every position scored —
exactly as :class:`seqmem.tasks.lm.LMTask` does for bytes.

:meth:`TextLMTask.metrics`: ``bits_per_token``, ``accuracy`` and ``loss_pos_<lo>_<hi>`` (mean loss in nats per
token in ``n_buckets`` position buckets, inclusive bounds) — lower late-bucket loss = the model uses long context.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import Tensor

from seqmem.data import SPLITS
from seqmem.tasks._windows import SplitWindowsTask
from seqmem.tasks.base import register_task
from seqmem.textdata import TextTokenizer, load_documents, load_tokenizer, tokenize_splits

__all__ = ["TextLMTask"]


@register_task("text")
class TextLMTask(SplitWindowsTask):
    """Next-token prediction on windows of a tokenized dataset.

    Args:
        dataset: a local path, ``code``/``docs``, or a Hub dataset name (see :mod:`seqmem.textdata`).
        tokenizer: ``byte`` | ``train:<vocab>`` | tokenizer name or path.
        seq_len: window length T in tokens.
        text_field: record field holding the text (``.jsonl`` / ``datasets`` sources).
        max_docs: read at most this many documents per split (Hub datasets default to 10 000).
        max_files: for directory corpora, a deterministic subset of this many files.
        fractions: (train, val, test) fractions for sources without their own splits.
        n_buckets: position buckets in :meth:`metrics`.
        eval_split: split of :meth:`eval_data` (``val``).
        cache: cache corpora, trained tokenizers and token streams under ``$SEQMEM_CACHE``.

    ``max_files`` … ``eval_seed`` are :class:`~seqmem.tasks._windows.SplitWindowsTask`'s options (keyword-only).
    """


    name = "text"

    def __init__(
        self,
        dataset: str = "code",
        tokenizer: str = "byte",
        seq_len: int = 512,
        text_field: str = "text",
        max_docs: int | None = None,
        **window_options: Any,
    ) -> None:
        super().__init__(seq_len, **window_options)
        self.dataset, self.tokenizer_spec = str(dataset), str(tokenizer)
        self.text_field, self.max_docs = text_field, max_docs
        self.fractions = tuple(float(f) for f in self.fractions)
        docs, ident = load_documents(self.dataset, text_field=text_field, max_docs=max_docs,
                                     max_files=self.max_files, fractions=self.fractions, cache=self.cache)
        self.num_documents = {s: len(docs[s]) for s in SPLITS}
        self.tokenizer: TextTokenizer = load_tokenizer(self.tokenizer_spec, docs["train"], self.cache, ident)
        self.vocab_size = self.tokenizer.vocab_size
        self.tokens = tokenize_splits(docs, self.tokenizer, ident if self.cache else None)
        self._check_splits()

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "dataset": self.dataset, "tokenizer": self.tokenizer_spec, "seq_len": self.seq_len,
                "text_field": self.text_field, "max_docs": self.max_docs, **self._window_config()}

    def save_tokenizer(self, directory) -> None:  # noqa: ANN001
        """Write the tokenizer next to a run (``seqmem train`` does this into ``OUT/tokenizer``)."""
        self.tokenizer.save(directory)

    def _check_split(self, split: str) -> np.ndarray:
        arr = self.tokens[split]
        if arr.shape[0] < self.seq_len + 1:
            raise ValueError(
                f"the {split!r} split of dataset {self.dataset!r} has {arr.shape[0]} tokens "
                f"({self.num_documents[split]} documents), fewer than seq_len + 1 = {self.seq_len + 1}; "
                "use more documents or a shorter seq_len"
            )
        return arr

    def metrics(self, logits: Tensor, targets: Tensor) -> dict[str, float]:
        return self._position_metrics(logits, targets, "bits_per_token", "loss_pos", bucket_bits=False)
