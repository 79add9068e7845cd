"""Experiments as data: a grid of training runs from a spec file, resumable, aggregated with lr chosen on
validation and statistics over seeds.  ``seqmem sweep SPEC --out DIR [--jobs N]``; see :mod:`seqmem.sweep.spec`.
"""

from seqmem.sweep.report import collect, write_report
from seqmem.sweep.runner import SweepConflict, peak_state, run_point, run_sweep
from seqmem.sweep.spec import (
    LENGTH_RULE,
    SpecError,
    SweepSpec,
    fair_options,
    length_rule_text,
    list_packaged_specs,
    load_spec,
)

__all__ = [
    "LENGTH_RULE",
    "SpecError",
    "SweepConflict",
    "SweepSpec",
    "collect",
    "fair_options",
    "length_rule_text",
    "list_packaged_specs",
    "load_spec",
    "peak_state",
    "run_point",
    "run_sweep",
    "write_report",
]
