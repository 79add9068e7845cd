"""Elastic Memory (Towards Compressive and Scalable Recurrent Memory): long-document LM, per-block loss,
memory scaling, sampling swap, HiPPO tables.

``seqmem repro elastic --scale smoke|small|paper --out DIR`` writes, under DIR:

* ``lm_main`` (Table 2 analogue): test PPL / bits per byte / LongPPL proxy for Transformer++ (block-local),
  Memorizing Transformer, Infini-Transformer, Melodi, Elastic_uni and Elastic_exp at "1x" memory, plus
  ``per_block`` (loss vs block index; ``per_block.png``);
* ``memory_scaling`` (Table 3): Elastic_exp and MemTrans at several memory sizes (zero added parameters);
* ``sampling_swap`` (Tables 5/6): uni/exp-trained models tested with both samplings (no retraining);
* ``hippo_table12`` (Table 12): reconstruction MSE of sines / white noise (ZOH, forward, backward, bilinear);
* ``hippo_table13`` (Table 13): reconstruction MSE of the trained Elastic model's real memory-layer K/V vs N;
* ``throughput`` (Table 8): training tokens/s normalised to Transformer++;
* ``README.md``: the command, the scale, every table, and automatic paper-claim checks.

Data: byte-level windows of the ``code`` corpus (:class:`seqmem.tasks.lm.LMTask`; the test split is used only
for the reported numbers).  A window is ``n_blocks`` blocks of ``block_len`` bytes (the paper: 16 × 2048
Llama-2 tokens).  LongPPL proxy (our protocol): a full-attention reference LM trained on the same data scores every
test token with the full window and with a 1-block sliding window; key tokens have ``loss_short − loss_full >
2`` and ``loss_full < 2`` (nats), LongPPL = exp(mean loss of the evaluated model on the key tokens).

Layout: :mod:`.configs` (scales: one base configuration plus the keys each scale changes) and :mod:`.paper` (the
paper's numbers) are data; :mod:`.models` (mixer stacks and optimiser), :mod:`.evaluation`, :mod:`.hippo_tables`
(Tables 12, 13), :mod:`.topic` (the topic-memory check) and :mod:`.checks` (the claim lines of the README) are
the code; :mod:`.runner` is the command.  Training goes through :func:`seqmem.train.train`.
"""

from __future__ import annotations

from seqmem.ops.hippo import hippo_compress, hippo_reconstruct, legs_matrices
from seqmem.repro.elastic.configs import CONFIGS, SCALES, TOPIC
from seqmem.repro.elastic.evaluation import elastic_layers, set_window, summarise, throughput, token_losses
from seqmem.repro.elastic.hippo_tables import gbt_compress, table12, table13
from seqmem.repro.elastic.models import build_model, model_specs, train_cfg
from seqmem.repro.elastic.paper import PAPER_T2, PAPER_T3, PAPER_T5, PAPER_T8, PAPER_T8_16X, PAPER_T12, PAPER_T13
from seqmem.repro.elastic.runner import SCALES_HELP, THREADS_FIXED, add_arguments, plot_per_block, run
from seqmem.repro.elastic.topic import TopicTask, topic_check

__all__ = [
    "CONFIGS",
    "PAPER_T12",
    "PAPER_T13",
    "PAPER_T2",
    "PAPER_T3",
    "PAPER_T5",
    "PAPER_T8",
    "PAPER_T8_16X",
    "SCALES",
    "TOPIC",
    "TopicTask",
    "SCALES_HELP",
    "THREADS_FIXED",
    "add_arguments",
    "build_model",
    "elastic_layers",
    "gbt_compress",
    "hippo_compress",
    "hippo_reconstruct",
    "legs_matrices",
    "model_specs",
    "plot_per_block",
    "run",
    "set_window",
    "summarise",
    "table12",
    "table13",
    "throughput",
    "token_losses",
    "topic_check",
    "train_cfg",
]
