"""VORT (Adaptive Power-Law Memory, arXiv:2605.08966): SOE kernel accuracy (Fig. 4), Zipf-lag retrieval
(Table 1), entity label copy (Table 2).

``seqmem repro vort --scale smoke|small|paper``.  Models (all share the keyed retrieval accumulator of eq. 16,
one layer): PL = ``vort_fixed_alpha`` (α = 0.7, SOE S = 15), Exp = ``exp_decay`` (λ swept, chosen on a validation
stream), Mix-5 = ``exp_mixture`` (log-spaced init and fitted-to-PL init), VORT = ``vort`` (per-token α, banked
routing off, local window), ablations S = 1 and the exact GL convolution (``kernel="gl"``).  Task generators are
ours (seqmem.tasks.vort_tasks; the paper specifies none).  Table 3 (PG-19 char-LM) runs only as a substitute on a
local corpus (experiment ``table3``; see docs/results/vort/README.md).

Layout: the scales (:mod:`.configs`) and the paper's numbers (:mod:`.paper`) are data; :mod:`.models` (the
retrieval model, its training and scoring, the table rows), :mod:`.kernel` (Fig. 4), :mod:`.retrieval`
(Tables 1-2) and :mod:`.lm` (Table 3) are the code; :mod:`.runner` is the command.
"""

from __future__ import annotations

from seqmem.repro.vort.configs import CONFIGS, LM_CONFIGS, SCALES
from seqmem.repro.vort.kernel import kernel_experiment
from seqmem.repro.vort.lm import lm_experiment
from seqmem.repro.vort.models import CHANNELS, RetrievalModel, evaluate, model_specs, train_eval
from seqmem.repro.vort.paper import PAPER_T1, PAPER_T2, PAPER_T3
from seqmem.repro.vort.retrieval import retrieval_experiment, retrieval_table
from seqmem.repro.vort.runner import EXPERIMENTS, add_arguments, run

__all__ = [
    "CHANNELS",
    "CONFIGS",
    "EXPERIMENTS",
    "LM_CONFIGS",
    "PAPER_T1",
    "PAPER_T2",
    "PAPER_T3",
    "SCALES",
    "RetrievalModel",
    "add_arguments",
    "evaluate",
    "kernel_experiment",
    "lm_experiment",
    "model_specs",
    "retrieval_experiment",
    "retrieval_table",
    "run",
    "train_eval",
]
