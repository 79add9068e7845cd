"""Tables 1 (Zipf-lag retrieval) and 2 (entity label copy) of VORT: every model row trained on each task, the
accuracy by lag bin beside the paper's, the Exp decay rate chosen on the validation stream."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from seqmem.repro.common import figure, write_results
from seqmem.repro.vort.models import RetrievalModel, model_specs, train_eval
from seqmem.repro.vort.paper import PAPER_T1, PAPER_T2
from seqmem.tasks.vort_tasks import EntityLabelCopy, ZipfLagRetrieval


def retrieval_table(key: str, cfg: dict[str, Any]) -> tuple[str, list, dict, tuple[float, float], str, str]:
    """Table 1 (Zipf lags) or Table 2 (entity copy) at this scale: ``(name, tasks, the paper's numbers, lag-bin
    edges, note, short note)``; the bins are the paper's scaled by ``n / n_paper``."""
    if key == "table1":
        n, n_paper, bins, paper, name = cfg["n1"], 10_000, (100, 1000), PAPER_T1, "table1_zipf"
        tasks: list = [ZipfLagRetrieval(seq_len=n, beta=b, n_queries=cfg["q1"]) for b in cfg["betas"]]
        what, train, short_what = (f"β∈{cfg['betas']} (paper 1.0/1.5/2.0), {cfg['q1']} queries/seq",
                                   " (paper 5,000×20 epochs)", "")
    else:
        n, n_paper, bins, paper, name = cfg["n2"], 8_000, (200, 2000), PAPER_T2, "table2_entity"
        tasks = [EntityLabelCopy(seq_len=n, n_entities=cfg["E"], mentions=cfg["M"])]
        what, train, short_what = f"E={cfg['E']} (paper 20), {cfg['M']} mentions/entity", "", f", E={cfg['E']}"
    f = n / n_paper
    note = (f"n={n} (paper {n_paper:,}), bins scaled ×{f:g}, {what}, {cfg['steps']}×{cfg['batch']} train seqs{train}, "
            f"d={cfg['d']}, d_φ={cfg['feats']}, {cfg['n_test']} test seqs, 1 seed")
    short = f"n={n}, bins ×{f:g}{short_what}, {cfg['steps']}×{cfg['batch']} seqs"
    return name, tasks, paper, (bins[0] * f, bins[1] * f), note, short


def retrieval_experiment(name: str, tasks: list, cfg: dict, edges, paper: dict, out: Path, seed: int,
                         command: str, scale_note: str, short: str) -> dict[str, Any]:
    """Train and score every row of :func:`~seqmem.repro.vort.models.model_specs` on each of ``tasks``; write
    ``name`` (the paper's rows with the tuned Exp), ``name_lambda_sweep`` and ``name.png``."""
    runs: dict[str, list[dict]] = {}
    for ti, task in enumerate(tasks):
        val = task.eval_data(cfg["n_val"], seed=10_000 + ti)
        test = task.eval_data(cfg["n_test"], seed=20_000 + ti)
        for label, mixer, opts in model_specs(cfg, task.seq_len):
            torch.manual_seed(seed)
            opts = dict(opts)
            sharp = opts.pop("sharpness")
            model = RetrievalModel(mixer, task.n_keys, task.n_labels, task.n_filler, cfg["d"], sharpness=sharp, **opts)
            r = train_eval(task, model, cfg, seed, val, test, edges)
            r["task_index"] = ti
            runs.setdefault(label, []).append(r)
            print(f"[vort/{name}] task {ti} {label}: test {r['test']} ({r['train_seconds']:.0f}s)", flush=True)

    def avg(label, split, key):
        return sum(r[split][key] for r in runs[label]) / len(runs[label])

    exp_labels = [k for k in runs if k.startswith("Exp")]
    best_exp = max(exp_labels, key=lambda k: avg(k, "val", "all"))  # tuned on the validation stream only
    mix = "Mix-5 (log-spaced init)"
    main = [("PL", next(k for k in runs if k.startswith("PL"))), ("Exp", best_exp), ("Mix-5", mix)]
    rows = []
    for pname, label in main:
        rows.append({"model": f"{pname}: {label}", **{f"paper {b}": paper[pname][i] for i, b in
                                                       enumerate(("short", "medium", "long"))},
                     **{f"ours {b}": avg(label, "test", b) for b in ("short", "medium", "long")},
                     "scale": short})
    for label in runs:
        if label not in dict(main).values():
            rows.append({"model": label, **{f"ours {b}": avg(label, "test", b) for b in ("short", "medium", "long")},
                         "scale": short})
    cols = ["model", "paper short", "ours short", "paper medium", "ours medium", "paper long", "ours long", "scale"]
    write_results(out, name, rows, columns=cols, command=command, scale_note=scale_note,
                  title=f"{name}: accuracy (%) by lag bin; Exp λ chosen on validation = {best_exp}",
                  extra={"runs": runs, "edges": list(edges)})
    sweep = [{"λ": k, "paper": "only the tuned λ is reported",
              **{f"ours val {b}": avg(k, "val", b) for b in ("short", "medium", "long", "all")},
              **{f"ours test {b}": avg(k, "test", b) for b in ("short", "medium", "long")}, "scale": short}
             for k in exp_labels]
    write_results(out, f"{name}_lambda_sweep", sweep, title=f"{name}: full Exp λ sweep per bin", command=command,
                  scale_note=scale_note)
    try:
        with figure(out / f"{name}.png", figsize=(7, 4), dpi=100) as (_fig, ax):
            for label in runs:
                ax.plot([0, 1, 2], [avg(label, "test", b) for b in ("short", "medium", "long")], "o-", label=label)
            ax.set_xticks([0, 1, 2], [f"≤{edges[0]:g}", f"{edges[0]:g}–{edges[1]:g}", f">{edges[1]:g}"])
            ax.set_ylabel("test accuracy (%)")
            ax.set_title(name)
            ax.legend(fontsize=7)
    except ImportError:  # pragma: no cover
        pass
    return {"best_exp": best_exp, "runs": runs}
