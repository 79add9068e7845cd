"""``seqmem repro echo``: its options and the run (train each sub-million model on the mixture, score it on every
grid, write the tables, the MQAR grid and ``echo_results.json``)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from seqmem.repro.common import fit_lm, write_json
from seqmem.repro.echo.configs import MODELS, SCALES
from seqmem.repro.echo.grids import accuracy, task_grids
from seqmem.repro.echo.models import submillion_config, train_cfg
from seqmem.repro.echo.mqar import mqar_grid
from seqmem.repro.echo.tables import write_tables
from seqmem.tasks.echo_tasks import EchoMixture, EchoNIAH


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--models", default=",".join(MODELS), help="comma-separated subset of " + ",".join(MODELS)
    )


def run(args) -> int:
    scale = getattr(args, "scale", "small")
    if scale not in SCALES:
        raise ValueError(f"--scale must be one of {list(SCALES)}, got {scale!r}")
    sc = SCALES[scale]
    out = Path(getattr(args, "out", None) or "docs/results/echo")
    out.mkdir(parents=True, exist_ok=True)
    seed = int(getattr(args, "seed", 0) or 0)
    models = [m for m in str(getattr(args, "models", ",".join(MODELS))).split(",") if m]
    for m in models:
        if m not in MODELS:
            raise ValueError(f"unknown model {m!r}; choose from {MODELS}")
    command = f"seqmem repro echo --scale {scale}"
    scale_note = (
        f"{scale}: d={sc['d']}, 4 layers, {sc['heads']} heads, r={sc['rank']}, SKA chunk 16, "
        f"{sc['steps']} steps x batch {sc['batch']} at T=64, lr {sc['lr']}, {sc['eval_n']} eval examples "
        "per cell (paper: d=128, 4 heads, r=24, 6000 steps, lr 3e-4)"
    )
    t_start = time.time()
    grids = task_grids(sc["grid"])
    results: dict[str, Any] = {"scale": scale, "models": {}}
    for name in models:
        cfg = submillion_config(name, d=sc["d"], heads=sc["heads"], rank=sc["rank"], d_state=sc["d_state"])
        task = EchoMixture(seq_len=64)
        fit = fit_lm(cfg, task, train_cfg(sc, seed=seed), seed=seed)
        model, tr = fit.model, fit.result
        rec: dict[str, Any] = {
            "params": model.num_parameters(),
            "train_seconds": fit.seconds,
            "train_final": tr.final,
            "history": tr.history,
            "state_floats@64": model.state_size(64),
            "state_floats@4096": model.state_size(4096),
        }
        model.eval()
        rec["niah"] = {t: accuracy(model, EchoNIAH(seq_len=t, n_kv=1), sc["eval_n"]) for t in sc["niah"]}
        rec["grids"] = {
            tn: {lab: accuracy(model, tk, sc["eval_n"]) for lab, tk in cells} for tn, cells in grids.items()
        }
        results["models"][name] = rec
        print(f"[echo] {name}: {rec['params']} params, train {rec['train_seconds']:.0f}s, niah {rec['niah']}")
    write_tables(out, results, models, sc, command, scale_note)
    results["mqar"] = mqar_grid(out, sc, seed, command, scale)
    results["seconds"] = time.time() - t_start
    write_json(out / "echo_results.json", results, indent=1)
    return 0
