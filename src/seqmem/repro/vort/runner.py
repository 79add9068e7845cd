"""``seqmem repro vort``: its options and the run over the chosen experiments (``summary.json`` at the end)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from seqmem.repro.common import torch_threads, write_json
from seqmem.repro.vort.configs import CONFIGS, SCALES
from seqmem.repro.vort.kernel import kernel_experiment
from seqmem.repro.vort.lm import lm_experiment
from seqmem.repro.vort.retrieval import retrieval_experiment, retrieval_table

EXPERIMENTS = ["kernel", "table1", "table2", "table3"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--experiments", default="kernel,table1,table2,table3",
                   help="comma list of kernel,table1,table2,table3")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: OMP_NUM_THREADS if set, else 1)")


def run(args: argparse.Namespace) -> int:
    if args.scale not in CONFIGS:
        raise ValueError(f"scale must be one of {SCALES}")
    exps = [e for e in getattr(args, "experiments", "kernel,table1,table2,table3").split(",") if e]
    bad = set(exps) - set(EXPERIMENTS)
    if bad:
        raise ValueError(f"unknown experiments {sorted(bad)}; choose from kernel, table1, table2, table3")
    with torch_threads(int(getattr(args, "threads", 1) or 1)):
        return _run(args, exps)


def _run(args: argparse.Namespace, exps: list[str]) -> int:
    cfg = CONFIGS[args.scale]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seed = int(getattr(args, "seed", 0))
    command = f"seqmem repro vort --scale {args.scale} --experiments {','.join(exps)} --seed {seed}"
    t0 = time.time()
    summary: dict[str, Any] = {"scale": args.scale, "config": cfg}
    if "kernel" in exps:
        summary["kernel"] = kernel_experiment(out, command)
    for key in ("table1", "table2"):
        if key in exps:
            name, tasks, paper, edges, note, short = retrieval_table(key, cfg)
            summary[key] = retrieval_experiment(name, tasks, cfg, edges, paper, out, seed, command, note,
                                                short)["best_exp"]
    if "table3" in exps:
        summary["table3"] = lm_experiment(args.scale, out, seed, command)
    summary["seconds"] = time.time() - t0
    write_json(out / "summary.json", summary)
    print(f"[vort] done in {summary['seconds']:.0f}s -> {out}", flush=True)
    return 0

