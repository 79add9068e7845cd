"""Echo / Spectral Koopman Attention (Sridhar & Johansen 2026, arXiv:2605.06997): NIAH length generalisation (Table 2),
zero-shot transfer (Table 3), state sizes.

Experiments (paper | ours side by side, see docs/echo.md and docs/results/echo/README.md):

* Table 2 — NIAH (KV = 1) length generalisation of SSM, SSM+Attn, SSM+SKA trained at length 64;
* Table 3 — zero-shot transfer: train once on the system-prompt + tool-trace mixture, evaluate the six
  task grids (our generators, :mod:`seqmem.tasks.echo_tasks`);
* state sizes and parameter counts of every model, including the 50M / 180M configs (built on the meta
device);
* (``--scale paper`` only) a scaled-down subset of the §4.2 MQAR grid, one model trained per (M, gap)
  cell.

Models follow §4.1: d = 128, 4 layers, 4 heads, Mamba-2 d_state = 16, SwiGLU d_ff = 384, V = 128,
untied embeddings; SKA / attention (RoPE) at the last two layers.  SKA runs chunk-causally with S = 16
(with the paper's S = 64 a model trained at T = 64 gets no SKA output at all); the paper's
oracle action mask (App. F eq. 53) is used only with ``--action-mask``, in the chunk-causal form or, with
``--ska-operator sequence``, as the paper prints it: one operator per sequence from the masked tokens, read at every
position (non-causal; docs/echo.md).

Layout: the scales and model rows (:mod:`.configs`) and the paper's numbers (:mod:`.paper`) are data;
:mod:`.models` (the model configs, their sizes, the optimiser), :mod:`.grids` (the evaluation grids),
:mod:`.tables` (Tables 2, 3 and the state sizes) and :mod:`.mqar` (the §4.2 grid) are the code; :mod:`.runner` is
the command.
"""

from __future__ import annotations

from seqmem.repro.echo.configs import LABEL, MODELS, SCALES
from seqmem.repro.echo.grids import accuracy, task_grids
from seqmem.repro.echo.models import (
    echo50m_config,
    echo180m_config,
    hybrid_config,
    meta_stats,
    submillion_config,
    train_cfg,
)
from seqmem.repro.echo.mqar import mqar_grid
from seqmem.repro.echo.paper import PAPER_PARAMS, PAPER_TABLE2, PAPER_TABLE3
from seqmem.repro.echo.runner import add_arguments, check_args, run
from seqmem.repro.echo.tables import plot_niah, write_tables

__all__ = [
    "LABEL",
    "MODELS",
    "PAPER_PARAMS",
    "PAPER_TABLE2",
    "PAPER_TABLE3",
    "SCALES",
    "accuracy",
    "add_arguments",
    "check_args",
    "echo180m_config",
    "echo50m_config",
    "hybrid_config",
    "meta_stats",
    "mqar_grid",
    "plot_niah",
    "run",
    "submillion_config",
    "task_grids",
    "train_cfg",
    "write_tables",
]
