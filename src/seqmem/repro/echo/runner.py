"""``seqmem repro echo``: its options and the run (train each sub-million model on the mixture, score it on every
grid, write the tables, the MQAR grid and ``echo_results.json``)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from seqmem.io import mean_std
from seqmem.mixers.base import check_positive_float
from seqmem.repro.common import fit_lm, write_json, write_results
from seqmem.repro.echo.configs import LABEL, MODELS, SCALES
from seqmem.repro.echo.grids import accuracy, task_grids, valid_accuracies
from seqmem.repro.echo.models import submillion_config, train_cfg
from seqmem.repro.echo.mqar import mqar_grid
from seqmem.repro.echo.paper import PAPER_TABLE2, PAPER_TABLE3
from seqmem.repro.echo.tables import write_tables
from seqmem.tasks.echo_tasks import EchoMixture, EchoNIAH, facts_precede_answers

SKA_OPERATORS = ("chunk_causal", "sequence")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--models", default=",".join(MODELS), help="comma-separated subset of " + ",".join(MODELS)
    )
    parser.add_argument(
        "--seeds", type=int, default=None,
        help="train every model with seeds seed, seed+1, ... (this many); each (seed, model) record is kept under "
             "OUT/seeds/seed-S/MODEL.json, so a stopped run resumes model by model; Tables 2-3 then give the mean "
             "over seeds and transfer_seeds.{md,json} mean ± std with the per-seed values (the MQAR grid, if the "
             "scale has one, runs for the first seed only)",
    )
    parser.add_argument(
        "--ska-chunk", type=int, default=16,
        help="SKA's chunk length S in the transfer suite (default 16; the paper's App. G: 64). A needle inside the "
             "query's own chunk is invisible to the chunk-causal operator",
    )
    parser.add_argument(
        "--ska-power", type=int, default=2,
        help="SKA's Koopman power K (eq. 13; default 2, the paper's; 1 moves the query one step along the lag-one "
             "map)",
    )
    parser.add_argument(
        "--action-mask", action="store_true",
        help="give the SKA layers the paper's oracle action mask (App. F eq. 53, App. G.1): only the tasks' "
             "fact-bearing tokens (NIAH: the needles' key and value; per task in seqmem.tasks.echo_tasks) enter "
             "SKA's statistics, chunk-causally, in training and in every evaluation; SKA models only (--models "
             "ssm_ska); at a scale with the §4.2 MQAR grid (smoke, paper) also --no-mqar",
    )
    parser.add_argument(
        "--ska-operator", default="chunk_causal", choices=SKA_OPERATORS,
        help="chunk_causal (default): SKA's chunk-causal form (eqs. 7-10, --ska-chunk); sequence: the paper's "
             "one-operator masked mode (App. F eq. 53, the ska mixer's operator_scope='sequence'), one operator per "
             "sequence from the action-masked tokens, read at every position: non-causal, so only with "
             "--action-mask (the oracle facts all precede the scored positions; checked on every task before "
             "training), and --ska-chunk does not apply",
    )
    parser.add_argument(
        "--lr", type=float, default=None,
        help="peak learning rate of the transfer suite's training (default: the scale's; paper: 3e-4, App. G). "
             "Every record keeps its validation accuracy (the training mixture's validation stream at T = 64, "
             "separate from every reported example) for choosing an lr across runs of this command",
    )
    parser.add_argument(
        "--no-mqar", action="store_true",
        help="skip the §4.2 MQAR grid (the echo_calibrate* / echo_mqar* sweep specs run it with lr selection and "
             "seeds); Tables 2-3 only",
    )


def check_args(args) -> tuple:
    """Every argument checked before anything is created or printed (``seqmem repro echo`` calls it first); returns
    ``(scale, settings, chunk, power, action_mask, operator, out, seed, models)``."""
    scale = getattr(args, "scale", "small")
    if scale not in SCALES:
        raise ValueError(f"--scale must be one of {list(SCALES)}, got {scale!r}")
    sc = dict(SCALES[scale])
    chunk, power = getattr(args, "ska_chunk", None), getattr(args, "ska_power", None)
    chunk, power = 16 if chunk is None else int(chunk), 2 if power is None else int(power)
    if chunk < 1 or power < 0:
        raise ValueError(f"--ska-chunk must be >= 1 and --ska-power >= 0, got {chunk}, {power}")
    action_mask = getattr(args, "action_mask", False) or False
    if not isinstance(action_mask, bool):
        raise ValueError(f"--action-mask is a flag (True or False), got {action_mask!r}")
    operator = getattr(args, "ska_operator", None) or "chunk_causal"
    if operator not in SKA_OPERATORS:
        raise ValueError(f"--ska-operator must be one of {list(SKA_OPERATORS)}, got {operator!r}")
    if operator == "sequence":
        if not action_mask:
            raise ValueError("--ska-operator sequence reads one operator from every token of a sequence, the "
                             "teacher-forced answers included (target leakage): it needs --action-mask, whose facts "
                             "all precede the scored positions")
        if chunk != 16:
            raise ValueError(f"--ska-chunk {chunk}: the one-operator mode (--ska-operator sequence) has no chunks")
    lr = getattr(args, "lr", None)
    if lr is not None:
        sc["lr"] = check_positive_float("--lr", lr)  # finite and > 0
    # only non-default values enter the configuration, so records written before these options keep their key
    sc.update({k: v for k, v, d in (("ska_chunk", chunk, 16), ("ska_power", power, 2), ("action_mask", action_mask,
                                    False), ("ska_operator", operator, "chunk_causal")) if v != d})
    out = Path(getattr(args, "out", None) or "docs/results/echo")
    seed = int(getattr(args, "seed", 0) or 0)
    models = [m for m in str(getattr(args, "models", ",".join(MODELS))).split(",") if m]
    for m in models:
        if m not in MODELS:
            raise ValueError(f"unknown model {m!r}; choose from {MODELS}")
    if action_mask:
        no_ska = [m for m in models if m != "ssm_ska"]
        if no_ska:
            raise ValueError(f"--action-mask: only SKA layers take the action mask (the paper gives it to SKA only); "
                             f"{no_ska} have none: run them without it (--models ssm_ska)")
        if not getattr(args, "no_mqar", False) and sc["mqar_cells"]:
            raise ValueError("--action-mask applies to the transfer suite; the §4.2 MQAR grid trains every model "
                             "without it: add --no-mqar")
    return scale, sc, chunk, power, action_mask, operator, out, seed, models


def run(args) -> int:
    scale, sc, chunk, power, action_mask, operator, out, seed, models = check_args(args)
    out.mkdir(parents=True, exist_ok=True)
    if chunk >= 64 and "ssm_ska" in models and operator == "chunk_causal":
        print(f"[echo] note: SKA chunk {chunk} >= the training length 64: in training every position is in SKA's "
              "chunk 0, which reads no statistics, so SKA outputs 0 and, its output projection starting at 0, no "
              "SKA parameter ever gets a gradient (with or without --action-mask): its layers stay untrained")
    command = f"seqmem repro echo --scale {scale}" + (f" --ska-chunk {chunk}" if chunk != 16 else "") \
        + (f" --ska-power {power}" if power != 2 else "") + (" --action-mask" if action_mask else "") \
        + (f" --ska-operator {operator}" if operator != "chunk_causal" else "") \
        + (f" --lr {sc['lr']:g}" if sc["lr"] != SCALES[scale]["lr"] else "")
    ska_mode = (f"SKA chunk {chunk}" if operator == "chunk_causal" else
                "SKA one operator per sequence from the masked tokens (App. F eq. 53, non-causal)")
    scale_note = (
        f"{scale}: d={sc['d']}, 4 layers, {sc['heads']} heads, r={sc['rank']}, {ska_mode}, "
        + (f"K = {power}, " if power != 2 else "")
        + ("SKA action mask (oracle fact tokens, App. F eq. 53), " if action_mask else "") +
        f"{sc['steps']} steps x batch {sc['batch']} at T=64, lr {sc['lr']}, {sc['eval_n']} eval examples "
        "per cell (paper: d=128, 4 heads, r=24, 6000 steps, lr 3e-4)"
    )
    t_start = time.time()
    grids = task_grids(sc["grid"], action_mask=action_mask)
    if operator == "sequence":
        _check_no_target_in_mask(sc, grids)
    n_seeds = getattr(args, "seeds", None)
    if n_seeds is not None and int(n_seeds) < 1:
        raise ValueError(f"--seeds must be at least 1, got {n_seeds}")
    seeds = [seed + i for i in range(int(n_seeds))] if n_seeds else [seed]
    per_seed: dict[int, dict[str, Any]] = {}
    for s in seeds:
        for name in models:
            key = {"scale": scale, "seed": s, "model": name, "config": {k: sc[k] for k in sorted(sc)}}
            cache = out / "seeds" / f"seed-{s}" / f"{name}.json" if n_seeds else None
            if cache is not None and cache.exists():
                rec = json.loads(cache.read_text())
                rec["niah"] = {_key(t): v for t, v in rec.get("niah", {}).items()}
                if rec.get("key") != json.loads(json.dumps(key)):  # as JSON stores it (tuples as lists)
                    raise ValueError(f"{cache} was written by another configuration ({rec.get('key')}); "
                                     "use another --out or remove it")
                print(f"[echo] seed {s} {name}: kept from {cache}")
            else:
                # with --seeds each training keeps checkpoints beside its cache file, so a run cut off (a session's
                # end) continues from its newest one; they are removed once the record is written
                run_dir = cache.with_suffix("") if cache is not None else None
                rec = _train_and_score(name, sc, grids, s, run_dir)
                rec["key"] = key
                if cache is not None:
                    cache.parent.mkdir(parents=True, exist_ok=True)
                    write_json(cache, rec, indent=1)
                    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
            per_seed.setdefault(s, {})[name] = rec
    results: dict[str, Any] = {"scale": scale, "seeds": seeds, "ska_operator": operator,
                               "models": _mean_over_seeds(per_seed, models) if n_seeds else per_seed[seed]}
    if n_seeds:
        command += f" --seeds {n_seeds}" + (f" --seed {seed}" if seed else "")
        scale_note += f"; mean over seeds {seeds} (per-seed values in transfer_seeds)"
        results["per_seed"] = {str(s): per_seed[s] for s in seeds}
        _write_seed_table(out, per_seed, models, command, scale_note)
    write_tables(out, results, models, sc, command, scale_note)
    results["mqar"] = {} if getattr(args, "no_mqar", False) else mqar_grid(out, sc, seed, command, scale)
    results["seconds"] = time.time() - t_start
    write_json(out / "echo_results.json", results, indent=1)
    return 0


def _train_and_score(name: str, sc: dict, grids: dict, seed: int, run_dir: Path | None = None) -> dict[str, Any]:
    """Train one sub-million model on the mixture with ``seed`` and score it on NIAH and every transfer grid
    (``run_dir``: checkpoints every twelfth of the steps there, and resume from them)."""
    cfg = submillion_config(name, d=sc["d"], heads=sc["heads"], rank=sc["rank"], d_state=sc["d_state"],
                            chunk_size=sc.get("ska_chunk", 16), power=sc.get("ska_power", 2),
                            operator_scope=sc.get("ska_operator", "chunk_causal"))
    tcfg = train_cfg(sc, seed=seed)
    if run_dir is not None:
        tcfg = dataclasses.replace(tcfg, checkpoint_every=max(1, tcfg.steps // 12))
    am = sc.get("action_mask", False)
    fit = fit_lm(cfg, EchoMixture(seq_len=64, action_mask=am), tcfg, seed=seed, out_dir=run_dir)
    model, tr = fit.model, fit.result
    cpu, cpu_estimated = tr.total_cpu_seconds(tcfg.steps)
    rec: dict[str, Any] = {
        "params": model.num_parameters(),
        "train_seconds": fit.seconds,
        # CPU time of the whole training, earlier processes of a resumed run included; the step it resumed from
        "train_cpu_seconds": cpu,
        "resumed_from_step": tr.start_step,
        **({"train_cpu_seconds_estimated": True} if cpu_estimated else {}),
        "train_final": tr.final,
        "history": tr.history,
        "state_floats@64": model.state_size(64),
        "state_floats@4096": model.state_size(4096),
    }
    model.eval()
    # for choosing an lr across runs: the training mixture's validation stream (never a reported example)
    # ("pooled": accuracy is correct / scored over every scored position; records without it hold the mean over
    # evaluation batches of 16 of each batch's token accuracy, which differs where examples score 1 or 4 tokens:
    # kept here too as batch_mean_accuracy, so that lrs scored before and after compare on one definition)
    rec["valid"] = {"task": "echo_mixture T=64", "n": sc["eval_n"], "pooled": True,
                    **valid_accuracies(model, EchoMixture(seq_len=64, action_mask=am), sc["eval_n"])}
    rec["niah"] = {t: accuracy(model, EchoNIAH(seq_len=t, n_kv=1, action_mask=am), sc["eval_n"]) for t in sc["niah"]}
    rec["grids"] = {tn: {lab: accuracy(model, tk, sc["eval_n"]) for lab, tk in cells} for tn, cells in grids.items()}
    print(f"[echo] seed {seed} {name}: {rec['params']} params, train {rec['train_seconds']:.0f}s, niah {rec['niah']}")
    return rec


def _check_no_target_in_mask(sc: dict, grids: dict) -> None:
    """The one-operator mode serves every position with the facts of the whole sequence: refuse a task whose oracle
    mask reaches a scored position or its teacher-forced answer (:func:`facts_precede_answers`, on 16 examples of
    the training mixture, of NIAH at every length and of every grid cell)."""
    tasks = [("the training mixture", EchoMixture(seq_len=64, action_mask=True))]
    tasks += [(f"NIAH T = {t}", EchoNIAH(seq_len=t, n_kv=1, action_mask=True)) for t in sc["niah"]]
    tasks += [(f"{tn} {lab}", tk) for tn, cells in grids.items() for lab, tk in cells]
    for label, task in tasks:
        _, y, m = task.sample(16, torch.Generator().manual_seed(0))
        if not bool(facts_precede_answers(y, m).all()):
            raise ValueError(f"--ska-operator sequence: in {label} a fact of the oracle mask does not precede every "
                             "scored position, so the one operator would read a target; run it chunk-causally")


def _mean_over_seeds(per_seed: dict[int, dict[str, Any]], models: list[str]) -> dict[str, Any]:
    """Per model: the first seed's record with every NIAH and grid cell replaced by its mean over seeds."""
    out: dict[str, Any] = {}
    recs = list(per_seed.values())
    for m in models:
        first = recs[0][m]
        niah = {t: sum(float(r[m]["niah"][t]) for r in recs) / len(recs) for t in first["niah"]}
        grids = {tn: {lab: sum(float(r[m]["grids"][tn][lab]) for r in recs) / len(recs) for lab in cells}
                 for tn, cells in first["grids"].items()}
        train_s = sum(float(r[m]["train_seconds"]) for r in recs) / len(recs)
        out[m] = {**first, "niah": niah, "grids": grids, "train_seconds": train_s}
    return out


def _key(t: Any) -> Any:
    """NIAH lengths come back from JSON as strings: as ints again."""
    return int(t) if isinstance(t, str) and t.isdigit() else t


def _write_seed_table(out: Path, per_seed: dict[int, dict[str, Any]], models: list[str], command: str,
                      scale_note: str) -> None:
    """``transfer_seeds.{md,json}``: Table 3's task means (and their two means: of the task means, and of all cells,
    the latter beside the paper's "Mean") and Table 2's NIAH lengths, mean ± sample std over seeds with the per-seed
    values, beside the paper's value."""
    seeds = list(per_seed)

    def cell(values: list[float]) -> str:
        m, sd = mean_std(values)
        per = ", ".join(f"{v:.1f}" for v in values)
        return f"{m:.1f} ± {'—' if math.isnan(sd) else f'{sd:.1f}'} ({per})"

    rows: list[dict[str, Any]] = []
    task_means: dict[str, dict[int, list[float]]] = {m: {s: [] for s in seeds} for m in models}
    all_cells: dict[str, dict[int, list[float]]] = {m: {s: [] for s in seeds} for m in models}
    for tn, paper in PAPER_TABLE3.items():
        if tn == "Mean":
            continue
        row: dict[str, Any] = {"table": "3", "task": tn}
        for m in models:
            vals = []
            for s in seeds:
                cells = list(per_seed[s][m]["grids"][tn].values())
                v = sum(cells) / len(cells)
                vals.append(v)
                task_means[m][s].append(v)
                all_cells[m][s] += cells
            row[f"paper {LABEL[m]}"] = paper[MODELS.index(m)]
            row[f"ours {LABEL[m]}"] = cell(vals)
            row[f"ours {LABEL[m]} per seed"] = vals
        rows.append(row)
    # Table 3's "Mean" is over "all sequence lengths and KV counts" (its caption), not over its task rows (whose
    # mean is 53.3 / 75.7 / 80.5, not 54.4 / 76.2 / 81.1): it stands beside our mean over every cell of every task
    for label, per in (("Mean (of task means)", task_means), ("Mean (of all cells)", all_cells)):
        row = {"table": "3", "task": label}
        for m in models:
            vals = [sum(per[m][s]) / len(per[m][s]) for s in seeds]
            if per is all_cells:
                row[f"paper {LABEL[m]}"] = PAPER_TABLE3["Mean"][MODELS.index(m)]
            row[f"ours {LABEL[m]}"] = cell(vals)
            row[f"ours {LABEL[m]} per seed"] = vals
        rows.append(row)
    for t in per_seed[seeds[0]][models[0]]["niah"]:
        row = {"table": "2", "task": f"NIAH T = {t}"}
        for m in models:
            vals = [float(per_seed[s][m]["niah"][t]) for s in seeds]
            row[f"paper {LABEL[m]}"] = PAPER_TABLE2.get(_key(t), (None,) * 3)[MODELS.index(m)]
            row[f"ours {LABEL[m]}"] = cell(vals)
            row[f"ours {LABEL[m]} per seed"] = vals
        rows.append(row)
    cols = ["table", "task"] + [c for m in models for c in (f"paper {LABEL[m]}", f"ours {LABEL[m]}")]
    write_results(out, "transfer_seeds", rows, columns=cols,
                  title=f"Tables 2-3 over seeds {seeds}: accuracy %, mean ± std (per seed)", command=command,
                  scale_note=scale_note + "; task grids are OURS (paper unspecified)")
