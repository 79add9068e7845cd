"""Lattice (Lattice: Learning to Efficiently Compress the Memory): scan speed, LM table (Table 2 in
miniature), ablation ladder (Table 4).

``seqmem repro lattice --scale smoke|small|paper --out DIR [--experiments speed,lm,ablation]``

* ``speed``: training throughput (forward + backward) of the exact recurrence: the plain per-token loop under
  autograd (``mode="recurrent"``) vs the fast exact scan (fused C++ kernel; PyTorch hand-VJP scan), for the op
  and for a full Lattice block; and the activation memory kept for the backward at T = 8k.  Not in the paper
  (it reports no timings).
* ``lm``: byte-level LM on the offline ``code`` corpus (seqmem.tasks.lm.LMTask) for Transformer++
  (``attention``), Linear Attention, Mamba2, DeltaNet, Gated DeltaNet, TTT (eq. 19 in the Lattice block) and
  Lattice-DEC/ENC/SIM — the paper's Table 2 models.  The paper trains 110M models on 2.4B tokens of the Pile
  and Books3 (perplexity per token; it names no tokenizer); we train ~0.1M-parameter models on ~10^5 bytes, so only the
  ORDERING can be compared, and at this scale it is mostly noise — see docs/results/lattice/README.md.
* ``ablation``: Table 4's ladder in the Lattice block: DeltaNet update (eq. 20) → + orthogonal recurrence
  (eq. 7) → + normalized projection (eq. 14) → + forget gate (eq. 16).
* ``context`` (not run by default): Table 2's context-length sweep (Books 512 → 16k, Pile 2k/8k) in miniature —
  every Table 2 row trained from scratch at each context length T (small: 128, 256, 512, 1024 bytes) with the
  SAME number of training bytes per T (batch = tokens_per_step / T sequences, as the paper fixes 0.5M tokens per
  batch), several seeds, on the offline ``docs`` corpus; val bpb overall and in the last position bucket,
  mean ± std over seeds.  Lattice-ENC runs with ``v_norm=True`` here (without it ENC does not learn at this
  scale, see ``vnorm``) and Mamba2 with ``expand=1, d_state=32`` so every row has ~119k parameters.

Every table shows the paper's number beside ours and our scale; bpb = bits per byte (ours), ppl = perplexity
per token (paper) are different units.

Layout: the scales and model specs (:mod:`.configs`) and the paper's numbers (:mod:`.paper`) are data;
:mod:`.models` (train one LM row), :mod:`.speed` (throughput, activation memory), :mod:`.lm` (the LM, ablation and
v_norm tables) and :mod:`.context` (the context-length sweep) are the code; :mod:`.runner` is the command.
"""

from __future__ import annotations

from seqmem.repro.lattice.configs import CONFIGS, CONTEXT_MODELS, LADDER, MODELS, SCALES, TTT, VNORM
from seqmem.repro.lattice.context import bigram_reference, parse_contexts, parse_models, run_context, write_context
from seqmem.repro.lattice.lm import plot_positions, run_lm
from seqmem.repro.lattice.models import train_one
from seqmem.repro.lattice.paper import PAPER_BOOKS, PAPER_BOOKS_T, PAPER_PILE, PAPER_T2
from seqmem.repro.lattice.runner import DEFAULT_EXPERIMENTS, EXPERIMENTS, add_arguments, run
from seqmem.repro.lattice.speed import bench_block, bench_scan, run_speed, saved_bytes

__all__ = [
    "CONFIGS",
    "CONTEXT_MODELS",
    "DEFAULT_EXPERIMENTS",
    "EXPERIMENTS",
    "LADDER",
    "MODELS",
    "PAPER_BOOKS",
    "PAPER_BOOKS_T",
    "PAPER_PILE",
    "PAPER_T2",
    "SCALES",
    "TTT",
    "VNORM",
    "add_arguments",
    "bench_block",
    "bench_scan",
    "bigram_reference",
    "parse_contexts",
    "parse_models",
    "plot_positions",
    "run",
    "run_context",
    "run_lm",
    "run_speed",
    "saved_bytes",
    "train_one",
    "write_context",
]
