"""VLA (Variational Linear Attention, arXiv:2605.11196): state-norm curves, Jacobian norms, latency, copy
task, MQAR capacity / long context / OOD.

``seqmem repro vla --scale smoke|small|paper --out DIR [--experiments a,b] [--lr-sweep 3e-4,3e-3]``

Models (paper §5.1, Tables 3/6: 2 layers, d = 128, 4 heads, vocab 128, tied embeddings, AdamW 3e-4 with 10 %
warm-up + cosine, clip 1.0, weight decay 0.01, batch 64): ``softmax`` (our ``attention``: SDPA + RoPE — the
paper mentions no positional encoding), ``linear`` (ELU+1 linear attention with the ratio normaliser, eq. 3),
``deltanet_paper`` (the paper's eq. 4, ``vla_paper_deltanet``), ``deltanet`` (canonical DeltaNet from Core)
and ``vla``.  The backbone is seqmem's pre-norm LM (RMSNorm, SwiGLU with hidden 256 = the paper's FFN width);
the paper does not state its norm/FFN type.  Every table shows the paper's value next to ours and our scale.
The learning rate: the MQAR capacity curve runs every rate of the sweep (``lrs``; the paper's 3e-4 learns far
slower than the paper reports, docs/vla.md); copy / long-context / OOD use ``lr_main`` unless
``--lr-sweep`` is given.

Layout: the scales and model specs (:mod:`.configs`) and the paper's numbers (:mod:`.paper`) are data;
:mod:`.models` (train one model row, the MQAR task), :mod:`.report` (scale note, figure), :mod:`.dynamics`
(state norms, Jacobian), :mod:`.latency` and :mod:`.recall` (copy, MQAR capacity, long context, OOD) are the code;
:mod:`.runner` is the command.
"""

from __future__ import annotations

from seqmem.repro.vla.configs import ALL_MODELS, CONFIGS, EXTRA_MODELS, MODELS, SCALES, scale_config
from seqmem.repro.vla.dynamics import exp_jacobian, exp_stability
from seqmem.repro.vla.latency import exp_latency
from seqmem.repro.vla.models import mqar_task, train_one
from seqmem.repro.vla.paper import PAPER_CAPACITY, PAPER_COPY, PAPER_LONG, PAPER_N24_2000, PAPER_OOD
from seqmem.repro.vla.recall import exp_capacity, exp_copy, exp_long, exp_ood
from seqmem.repro.vla.runner import EXPERIMENTS, SEED_HELP, add_arguments, check_args, learning_rates, run

__all__ = [
    "ALL_MODELS",
    "CONFIGS",
    "EXPERIMENTS",
    "EXTRA_MODELS",
    "MODELS",
    "PAPER_CAPACITY",
    "PAPER_COPY",
    "PAPER_LONG",
    "PAPER_N24_2000",
    "PAPER_OOD",
    "SCALES",
    "SEED_HELP",
    "add_arguments",
    "check_args",
    "exp_capacity",
    "exp_copy",
    "exp_jacobian",
    "exp_latency",
    "exp_long",
    "exp_ood",
    "exp_stability",
    "learning_rates",
    "mqar_task",
    "run",
    "scale_config",
    "train_one",
]
