"""Synthetic long-range "topic" task for block-wise memories (ours; not in the Elastic Memory paper).

Every sequence draws its tokens uniformly from a per-sequence random subset (the "topic") of ``topic`` tokens out of
``vocab_size``; with ``topic_blocks = k > 0`` the topic changes every ``k`` blocks instead (a fresh random subset per
segment of ``k·block_len`` targets), so that recent history is worth more than old history.  Knowing the topic
gives loss ``ln(topic)`` per token; a model that attends only within a block of ``block_len`` tokens must rediscover
the topic in every block, so its loss at the first in-block positions is higher, while a model whose memory carries
a bag-of-tokens summary across blocks (what the low-order coefficients of Elastic Memory's HiPPO state hold) reaches
``ln(topic)`` from the start of every block that continues a topic.  The memory is therefore provably useful, and
whether it is used can be read off the per-block losses.

Every position is scored (next-token targets).  :meth:`ElasticTopicTask.metrics` adds, in nats per token,
``loss_block0_q1`` (the first quarter of block 0, where no model has history), ``loss_later_q1`` (first quarters
of blocks >= 1), ``loss_later_rest`` (the rest of blocks >= 1), ``loss_start_q1`` / ``loss_cont_q1`` (first quarters of
the blocks that start a topic — block 0, and with ``topic_blocks = k`` every k-th block — and of those that continue
one), ``memory_gain`` = ``loss_start_q1 − loss_cont_q1`` (≈ 0 for a block-local model, > 0 when history is used;
with one topic per sequence it is ``loss_block0_q1 − loss_later_q1``) and ``excess_loss`` = mean loss − ln(topic).

How much memory is used is read from ``loss_cont_q1`` between two bounds: :meth:`ElasticTopicTask.block_local_q1`
(the Bayes-optimal block-local model, no memory; 2.557 nats at V 64, topic 4, L 32) and ``ln(topic)`` (a perfect
memory).  ``memory_gain`` alone over-reads it: a memory that misleads at a topic change raises ``loss_start_q1``
above the block-local bound and so raises the gain; the largest gain of a model that is not misled is
``block_local_q1() − ln(topic)`` (1.17 nats there).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from seqmem.io import check_int
from seqmem.tasks.base import DEFAULT_EVAL_SEED, IGNORE_INDEX, Task, register_task

__all__ = ["ElasticTopicTask"]


@register_task("elastic_topic")
class ElasticTopicTask(Task):
    """Tokens drawn from a per-sequence topic (see the module docstring).

    Args:
        vocab_size: V.
        topic: tokens per topic (``1 <= topic <= V``); the optimum loss is ``ln(topic)``.
        seq_len: T.
        block_len: the memory models' block length L (``T`` must be a multiple of it).
        topic_blocks: 0 (default) = one topic per sequence; k > 0 = a new topic every k blocks: the input at
            position t belongs to segment t // (k·L), so every input and every target of a block except its last
            target come from the block's own topic (a block-local model sees the same statistics in a block that
            starts a topic as in one that continues it), and the last target of a segment's last block is the first
            token of the next topic.
        eval_seed: seed of the evaluation stream (:meth:`test_data` uses ``eval_seed + 1``).
    """

    name = "elastic_topic"

    def __init__(self, vocab_size: int = 64, topic: int = 4, seq_len: int = 128, block_len: int = 16,
                 topic_blocks: int = 0, eval_seed: int = DEFAULT_EVAL_SEED) -> None:
        super().__init__(eval_seed)
        for k, v in (("vocab_size", vocab_size), ("topic", topic), ("seq_len", seq_len), ("block_len", block_len)):
            check_int(k, v)
        check_int("topic_blocks", topic_blocks, minimum=0)
        if topic > vocab_size:
            raise ValueError(f"need 1 <= topic <= vocab, got topic={topic}, vocab={vocab_size}")
        if seq_len % block_len:
            raise ValueError(f"seq_len={seq_len} must be a multiple of block_len={block_len}")
        self.vocab_size, self.topic, self.seq_len, self.block_len = vocab_size, topic, seq_len, block_len
        self.topic_blocks = topic_blocks

    def config(self) -> dict[str, Any]:
        cfg = {"name": self.name, "vocab_size": self.vocab_size, "topic": self.topic, "seq_len": self.seq_len,
               "block_len": self.block_len, "eval_seed": self.eval_seed}
        if self.topic_blocks:  # absent at the default, so one-topic configs (and their run keys) are unchanged
            cfg["topic_blocks"] = self.topic_blocks
        return cfg

    def segments(self) -> Tensor:
        """Segment (topic) index of each of the T + 1 tokens: token t is the input at position t, token t + 1 its
        target (the final token, the last position's target, belongs to the last segment)."""
        seg = torch.zeros(self.seq_len + 1, dtype=torch.long)
        if self.topic_blocks:
            seg[:-1] = torch.arange(self.seq_len) // (self.topic_blocks * self.block_len)
            seg[-1] = seg[-2]
        return seg

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        B = self._check_batch(batch_size)
        seg = self.segments()
        n_seg = int(seg[-1]) + 1
        # (B, n_seg · topic): the topics of each sequence's segments, side by side
        subsets = torch.stack([torch.randperm(self.vocab_size, generator=generator)[: self.topic]
                               for _ in range(B * n_seg)]).view(B, n_seg * self.topic)
        idx = torch.randint(0, self.topic, (B, self.seq_len + 1), generator=generator) + seg * self.topic
        tok = torch.gather(subsets, 1, idx)
        return tok[:, :-1].contiguous(), tok[:, 1:].contiguous()

    @property
    def q1_len(self) -> int:
        """Positions of a block's first quarter, the ones the ``*_q1`` metrics score: ``max(1, block_len // 4)``."""
        return max(1, self.block_len // 4)

    def block_local_q1(self) -> float:
        """Expected loss, in nats per token, of the Bayes-optimal block-local model over a block's first quarter
        (the positions ``loss_start_q1`` / ``loss_cont_q1`` score): the loss of a model that uses no memory and the
        block's own tokens optimally, the upper bound of ``loss_cont_q1`` for any model that does not mislead itself.

        After ``n`` inputs of a block with ``m`` distinct tokens seen (``m`` follows the occupancy law of ``n`` draws
        from ``topic`` tokens), the posterior gives each seen token ``1/topic`` and each of the ``V − m`` unseen ones
        ``(topic − m) / (topic · (V − m))``; the first quarter predicts after ``n = 1 …`` :attr:`q1_len` inputs."""
        V, K = self.vocab_size, self.topic
        q = self.q1_len
        dist = [1.0] + [0.0] * K  # P(m distinct | n draws), n = 0
        total = 0.0
        for _ in range(q):
            dist = [dist[m] * m / K + (dist[m - 1] * (K - m + 1) / K if m else 0.0) for m in range(K + 1)]
            total += sum(p * (m / K * math.log(K) + ((K - m) / K * math.log(K * (V - m) / (K - m)) if m < K else 0.0))
                         for m, p in enumerate(dist) if p)
        return total / q

    def test_data(self, n_examples: int) -> tuple[Tensor, Tensor]:
        """A held-out stream (seed ``eval_seed + 1``), apart from the eval and validation examples."""
        return self._cached_stream("test", self.eval_seed + 1, n_examples, self._eval_sample)

    def metrics(self, logits: Tensor, targets: Tensor) -> dict[str, float]:
        out = super().metrics(logits, targets)
        B, T = targets.shape
        ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1),
                             ignore_index=IGNORE_INDEX, reduction="none").reshape(B, T)
        out["excess_loss"] = float(ce.mean()) - math.log(self.topic)
        L = self.block_len
        if T != self.seq_len or T % L:
            return out
        ce = ce.view(B, T // L, L)
        q = self.q1_len
        out["loss_block0_q1"] = float(ce[:, 0, :q].mean())
        if T // L > 1:
            out["loss_later_q1"] = float(ce[:, 1:, :q].mean())
            if q < L:
                out["loss_later_rest"] = float(ce[:, 1:, q:].mean())
            blocks = torch.arange(T // L)
            starts = blocks % self.topic_blocks == 0 if self.topic_blocks else blocks == 0
            out["loss_start_q1"] = float(ce[:, starts, :q].mean())
            if (~starts).any():
                out["loss_cont_q1"] = float(ce[:, ~starts, :q].mean())
                out["memory_gain"] = out["loss_start_q1"] - out["loss_cont_q1"]
        return out
