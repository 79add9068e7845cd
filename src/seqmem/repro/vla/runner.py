"""``seqmem repro vla``: its options, the learning rates per experiment and the run over the chosen experiments
(``runs.json`` at the end)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from seqmem.cliargs import comma_list
from seqmem.repro.common import torch_threads, write_json
from seqmem.repro.vla.configs import ALL_MODELS, MODELS, scale_config
from seqmem.repro.vla.dynamics import exp_jacobian, exp_stability
from seqmem.repro.vla.latency import exp_latency
from seqmem.repro.vla.recall import exp_capacity, exp_copy, exp_long, exp_ood

EXPERIMENTS = ["stability", "jacobian", "latency", "copy", "capacity", "long_context", "ood"]


#: the --seed help of `seqmem repro vla`
SEED_HELP = ("first training seed: 0 (the default) keeps the scale's seeds (42; paper: 42, 123, 999), a non-zero S "
             "replaces the first of them")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--experiments", default=",".join(EXPERIMENTS), help=f"comma list of {EXPERIMENTS}")
    p.add_argument("--models", default=",".join(MODELS), help=f"comma list of {list(ALL_MODELS)}")
    p.add_argument("--steps", type=int, default=None,
                   help="override the training steps of every experiment (default: the scale's)")
    p.add_argument("--capacity-ns", default=None,
                   help="override the MQAR capacity n list, e.g. 4,8 (replaces the whole list, the paper scale's "
                        "n = 32 / 48 block included; default: the scale's)")
    p.add_argument("--batch-size", dest="batch", type=int, default=None,
                   help="override the MQAR batch size (default: the scale's)")
    from seqmem.clihelp import add_deprecated_alias

    add_deprecated_alias(p, "--batch", "--batch-size")
    p.add_argument("--lr-sweep", default=None, help="comma list of learning rates (default: per scale)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: OMP_NUM_THREADS if set, else 1)")


def learning_rates(args: argparse.Namespace, cfg: dict[str, Any]) -> tuple[list[float], list[float]]:
    """(rates for the capacity curve, rates for the other training experiments)."""
    if getattr(args, "lr_sweep", None):
        sweep = [float(x) for x in args.lr_sweep.split(",")]
        return sweep, sweep
    return cfg["lrs"], [cfg["lr_main"]]


def run(args: argparse.Namespace) -> int:
    scale = args.scale
    cfg = scale_config(scale)
    with torch_threads(int(getattr(args, "threads", 1) or 1)):
        return _run(args, scale, cfg)


def check_args(args: argparse.Namespace) -> None:
    """Every argument checked before anything is created or printed (``seqmem repro vla`` calls it first)."""
    _settings(args, args.scale, scale_config(args.scale))


def _run(args: argparse.Namespace, scale: str, cfg: dict[str, Any]) -> int:
    out, exps, models, steps, lrs, lrs_main = _settings(args, scale, cfg)
    out.mkdir(parents=True, exist_ok=True)
    return _run_body(args, scale, cfg, out, exps, models, steps, lrs, lrs_main)


def _settings(args: argparse.Namespace, scale: str, cfg: dict[str, Any]) -> tuple:
    """The run's settings from ``args`` (``cfg`` updated in place), every argument checked."""
    out = Path(args.out)
    exps = comma_list(getattr(args, "experiments", ",".join(EXPERIMENTS)))
    bad = sorted(set(exps) - set(EXPERIMENTS))
    if bad:
        raise ValueError(f"unknown experiment(s) {bad}; choose from {EXPERIMENTS}")
    models = comma_list(getattr(args, "models", ",".join(MODELS)))
    bad = sorted(set(models) - set(ALL_MODELS))
    if bad:
        raise ValueError(f"unknown model(s) {bad}; choose from {list(ALL_MODELS)}")
    steps = getattr(args, "steps", None)
    if steps is not None:
        if steps <= 0:
            raise ValueError(f"--steps must be positive, got {steps}")
        for key in ("copy", "capacity", "capacity_long", "long", "ood"):
            if cfg.get(key):
                cfg[key]["steps"] = steps
    if getattr(args, "batch", None):
        if args.batch <= 0:
            raise ValueError(f"--batch must be positive, got {args.batch}")
        cfg["batch"] = int(args.batch)
    if getattr(args, "capacity_ns", None):
        cfg["capacity"]["ns"] = [int(x) for x in str(args.capacity_ns).split(",")]
        cfg["capacity_long"] = None
    lrs, lrs_main = learning_rates(args, cfg)
    if getattr(args, "seed", 0):
        rest = [s for s in cfg["seeds"] if s != int(args.seed)]
        cfg["seeds"] = [int(args.seed)] + rest[: len(cfg["seeds"]) - 1]
    return out, exps, models, steps, lrs, lrs_main


def _run_body(args: argparse.Namespace, scale: str, cfg: dict[str, Any], out: Path, exps: list[str],
              models: list[str], steps: int | None, lrs: Any, lrs_main: Any) -> int:
    command = (f"seqmem repro vla --scale {scale} --out {out} --experiments {','.join(exps)} "
               f"--models {','.join(models)}"
               + (f" --lr-sweep {args.lr_sweep}" if getattr(args, "lr_sweep", None) else "")
               + (f" --steps {steps}" if steps is not None else "")
               + (f" --capacity-ns {args.capacity_ns}" if getattr(args, "capacity_ns", None) else "")
               + (f" --batch-size {args.batch}" if getattr(args, "batch", None) else ""))
    runs: list[dict[str, Any]] = []
    timing: dict[str, float] = {}
    for e in exps:
        t0 = time.perf_counter()
        if e == "stability":
            exp_stability(out, scale, cfg, command)
        elif e == "jacobian":
            exp_jacobian(out, scale, cfg, command)
        elif e == "latency":
            exp_latency(out, scale, cfg, command)
        else:
            fn = {"copy": exp_copy, "capacity": exp_capacity, "long_context": exp_long, "ood": exp_ood}[e]
            fn(out, scale, cfg, command, models, lrs if e == "capacity" else lrs_main, runs)
        timing[e] = time.perf_counter() - t0
        print(f"[vla] {e}: {timing[e]:.1f} s", flush=True)
    write_json(out / "runs.json", {"command": command, "scale": scale, "config": cfg, "seconds": timing, "runs": runs},
               indent=1)
    return 0
