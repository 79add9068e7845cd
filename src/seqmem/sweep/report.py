"""Aggregate a sweep: the learning rate chosen on validation, then mean ± std over seeds on the reported split.

For every row (setting × mixer × model size) the learning rate with the best mean *validation* metric over seeds is
chosen (highest accuracy, or lowest loss with ``select = "loss"``); a diverged run counts as the worst value.  The
row then reports that learning rate's mean ± sample std over seeds on the task's reported split (never used for
the choice; a diverged seed counts there as the worst value too, accuracy 0 or loss +inf, and is named), the
per-seed values, the peak state (numbers per sequence) and the parameters.  Written as Markdown,
JSON and an accuracy-vs-state plot (one line per mixer across model sizes, error bars over seeds).
"""

from __future__ import annotations

import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Any

from seqmem.io import (
    MissingExtra,
    UnsafePathError,
    atomic_write_text,
    fmt,
    machine_info,
    mean_std,
    pyplot,
    read_bytes_nofollow,
    save_figure,
    table_lines,
)
from seqmem.sweep.runner import (
    check_run_dirs,
    choose_lr,
    chosen_lr,
    plan_rows,
    probe_lrs,
    read_result,
    selection_lrs,
    tied_lrs,
    valid_value,
    wanted_points,
)
from seqmem.sweep.spec import SweepSpec, length_rule_text


def collect(spec: SweepSpec, out: Path) -> list[dict[str, Any]]:
    """One row per (setting, mixer, model size), with the chosen lr and statistics over seeds."""
    from seqmem.registry import build_mixer

    rows = []
    plans = plan_rows(spec, out)  # the row's planned runs (lr extensions and tune groups included)
    for (setting, mixer, axes), plan in plans.items():
        pts = plan.points
        lr_valid = selection_lrs(spec, plan.stage1 if spec.lr_selection == "first_seed" else pts, out)
        n_total = plan.needed
        results = {(p.lr, p.seed): read_result(out / p.rel_dir) for p in pts}
        n_done = sum(1 for r in results.values() if valid_value(r, spec.select) is not None)
        best_lr = choose_lr(lr_valid, spec.select)
        confirmed: dict[float, float] = {}
        if spec.lr_selection == "first_seed" and spec.lr_confirm:  # the mean over seeds decides among close lrs
            best_lr, confirmed = chosen_lr(spec, plan, out)
        probes = sorted(probe_lrs(spec, pts)) if spec.lr_selection == "all_seeds" and spec.lr_extend else []
        tried = sorted(set(lr_valid) | set(probes))  # a probe beyond the choice makes it interior
        first = next((r for r in results.values() if r and "state" in r), None)
        row: dict[str, Any] = {
            "setting": setting, "mixer": mixer, "family": pts[0].family, **dict(axes),
            "runs_done": n_done, "runs_total": n_total, "complete": n_done >= n_total,
            "lr_valid": {f"{lr:g}": v for lr, v in sorted(lr_valid.items())},
            "best_lr": best_lr, "state": first["state"] if first else None,
            "params": first["params"] if first else None,
            "tune": plan.tune, "tune_chosen": plan.chosen,
        }
        if confirmed:  # lr_confirm: the lrs given every seed and their validation means
            row["lr_valid_mean"] = {f"{lr:g}": v for lr, v in sorted(confirmed.items())}
        if probes:  # all_seeds with lr_extend: an extension probed with the first seed only (it did not beat the
            # choice there, or has not finished): its first-seed validation value; never the chosen lr
            row["lr_probe"] = {f"{lr:g}": valid_value(results.get((lr, spec.seeds[0])), spec.select) for lr in probes}
        if best_lr is not None:
            sel_vals = confirmed if best_lr in confirmed else lr_valid
            tie = tied_lrs(sel_vals, best_lr, spec.select) if best_lr in sel_vals else [best_lr]
            per_seed = {}
            for seed in spec.seeds:
                v = valid_value(results.get((best_lr, seed)), spec.select, part="report")
                if v is not None:
                    per_seed[seed] = v
            # a diverged seed (nan) counts as the worst value in the mean too, as in the choice: accuracy 0, loss
            # infinite (the mean is then infinite); it was dropped, so a row where 2 of 3 seeds diverged reported
            # the survivor's value as a 3-seed mean
            diverged = [seed for seed, v in per_seed.items() if math.isnan(v)]
            m, sd = mean_std([worst_value(spec.select) if math.isnan(v) else v for v in per_seed.values()])
            split = next((r.get("report_split") for (lr, _), r in results.items()
                          if lr == best_lr and r and r.get("report_split")), "eval")
            extra = {}
            for name in spec.extra_metrics:  # the same runs, another metric of the reported split
                vals = [v for (lr, _), r in results.items() if lr == best_lr and r and r.get("status") == "finished"
                        and (v := _metric_of(r.get("report", {}), name)) is not None]
                # a diverged seed has no value and an extra metric no known worst: the mean is then undefined
                em, esd = (math.nan, math.nan) if diverged else mean_std(vals)
                extra[name] = {"mean": em, "std": esd, "per_seed": vals}
            row["extra"] = extra
            modes = [_compile_mode(out / q.rel_dir, results[(q.lr, q.seed)]) for q in pts
                     if q.lr == best_lr and results.get((q.lr, q.seed))]
            row["compile_modes"] = {k: modes.count(k) for k in ("compiled", "eager", "mixed") if modes.count(k)}
            row.update({"report_mean": m, "report_std": sd, "per_seed": per_seed, "n_seeds": len(per_seed),
                        "diverged_seeds": len(diverged),
                        "valid_at_best": lr_valid[best_lr], "report_split": split,
                        "lr_at_grid_edge": len(tried) > 1 and any(lr in (min(tried), max(tried)) for lr in tie)})
            if len(tie) > 1:  # lrs whose selection value ties the choice's (the first of them is chosen)
                row["lr_tied"] = [f"{lr:g}" for lr in tie]
            if diverged:  # which seeds (counted as the worst value in report_mean and report_std)
                row["diverged"] = diverged
        # why the row may be unable to use its context (per layer, at this setting's length)
        seq_len = next(s.seq_len for s in spec.settings if s.label == setting)
        model = pts[0].run_spec["model"]
        names = model["mixer"] if isinstance(model["mixer"], list) else [model["mixer"]] * model["n_layers"]
        opts = model["mixer_options"] if isinstance(model["mixer_options"], list) else \
            [model["mixer_options"]] * len(names)
        reasons = []
        for n, o in zip(names, opts):
            r = build_mixer(n, model["d_model"], **{"n_heads": model["n_heads"], **o}).long_range_reason(seq_len)
            if r:
                reasons.append(f"{n}: {r}")
        row["cannot_reach_first_token"] = len(reasons) == len(names)
        row["length_note"] = "; ".join(sorted(set(reasons)))
        row["note"] = spec.notes.get(mixer, "")
        paper = spec.paper.get(setting, {})
        row["paper"] = paper.get(mixer, paper.get(plan.tune) if plan.chosen else None)
        row["mixer_options"] = model["mixer_options"]
        rows.append(row)
    return rows


def worst_value(select: str) -> float:
    """The value a diverged run counts as, in the lr choice and in a row's mean: 0 for accuracy, +inf for loss."""
    return 0.0 if select == "accuracy" else math.inf


def _diverged_text(r: dict[str, Any], select: str) -> str:
    """``seed(s) 1, 2 diverged (counted as accuracy 0)``, or ``""`` when none did."""
    seeds = r.get("diverged")
    if not r.get("diverged_seeds"):
        return ""
    which = f"seed(s) {', '.join(map(str, seeds))}" if seeds else f"{r['diverged_seeds']} seed(s)"
    return f"{which} diverged (counted as {'accuracy 0' if select == 'accuracy' else 'loss inf'} in the mean)"


def _compile_mode(run_dir: Path, result: dict[str, Any]) -> str:
    """``compiled``, ``eager`` or ``mixed``: how a run's training steps ran, from its training log records (each
    process under ``--compile`` marks its own) and its result (the process that finished it)."""
    flags = {bool(result.get("compiled"))}
    try:
        lines = read_bytes_nofollow(Path(run_dir) / "metrics.jsonl").decode("utf-8", "replace").splitlines()
    except (OSError, UnsafePathError):  # no log, or not a plain file: the result's mark alone
        lines = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and "tokens_per_s" in rec:  # a training log record, not an evaluation
            flags.add(bool(rec.get("compiled")))
    return "mixed" if len(flags) > 1 else ("compiled" if flags == {True} else "eager")


def _metric_of(report: dict[str, Any], name: str) -> float | None:
    """``report[name]``, or for ``"a/b"`` the ratio ``report[a] / report[b]`` (e.g. pooled per-bin accuracy from
    per-example hit and query counts); None if absent or the denominator is 0."""
    if "/" in name:
        a, b = name.split("/", 1)
        if a in report and b in report and float(report[b]) != 0:
            return float(report[a]) / float(report[b])
        return None
    return float(report[name]) if name in report else None


def _fmt(v: Any) -> str:
    """A table cell: three decimals, never in exponent form; ``—`` for None and NaN."""
    return fmt(v, nan="—", exponent=False)


def _seed_cell(v: Any) -> str:
    """One seed's value in a table: ``diverged`` for a diverged run (NaN), else :func:`_fmt`."""
    return "diverged" if isinstance(v, float) and math.isnan(v) else _fmt(v)


def chance_level(spec: SweepSpec) -> dict[str, float]:
    """Per setting: 1/(number of value tokens) for MQAR-like tasks with a ``value_range`` (else absent)."""
    return {k: v[0] for k, v in _levels(spec).items()}


def _levels(spec: SweepSpec) -> dict[str, tuple[float, float | None]]:
    """Per setting of an MQAR-like task: (chance = 1/value tokens, the 1/pairs plateau of a model that has learnt
    that the answer is one of the values in context but not which one, or None for a task without pairs)."""
    from seqmem.tasks import build_task

    out = {}
    for s in spec.settings:
        t = build_task(spec.task, **{**spec.task_options, **s.options})
        vr = getattr(t, "value_range", None)
        if vr is not None:
            pairs = getattr(t, "num_pairs", None)
            out[s.label] = (1.0 / (vr[1] - vr[0]), 1.0 / pairs if isinstance(pairs, int) and pairs > 0 else None)
    return out


def summary_table(spec: SweepSpec, rows: list[dict[str, Any]]) -> str:
    """One line per mixer, one column per (setting, model size): mean ± std over seeds at the chosen lr, with
    the number of seeds; mixers ordered by their mean over the columns they have (ties in the spec's order)."""
    cols = []
    for setting in spec.settings:
        for combo in _axis_combos(spec):
            cols.append((setting.label, combo))
    cell: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        cell[(r["mixer"], r["setting"], tuple((a, r.get(a)) for a in spec.model_axes))] = r

    def text(r: dict[str, Any] | None) -> str:
        if r is None or r.get("report_mean") is None:
            return "—"
        sd = "" if r["report_std"] != r["report_std"] else f" ± {r['report_std']:.2f}"
        seeds = f"{r['n_seeds']}" + (f", {r['diverged_seeds']} diverged" if r.get("diverged_seeds") else "") + (
            ", not chosen" if r.get("tune_chosen") is False else "") + (", edge lr" if r.get("lr_at_grid_edge") else "")
        mark = "" if r["complete"] else "*"
        return f"{r['report_mean']:.2f}{sd} ({seeds}){mark}"

    def score(m: str) -> float:
        vals = [cell[k]["report_mean"] for k in cell if k[0] == m and cell[k].get("report_mean") is not None]
        if not vals:
            return -math.inf
        mean = sum(vals) / len(vals)
        return mean if spec.select == "accuracy" else -mean

    # a stable sort of the rows' first appearance: ties keep the spec's row order (a set's order would change
    # with each process's string hashing, and the report with it)
    mixers = sorted(dict.fromkeys(r["mixer"] for r in rows), key=lambda m: -score(m))
    head = ["mixer"] + [f"{lab}, " + ", ".join(f"{a} {v}" for a, v in combo) if combo else lab for lab, combo in cols]
    body = ([f"`{m}`"] + [text(cell.get((m, lab, combo))) for lab, combo in cols] for m in mixers)
    return "\n".join(table_lines(head, body, numeric=True)) + "\n"


def paper_section(spec: SweepSpec, rows: list[dict[str, Any]]) -> list[str]:
    """The paper's numbers beside ours (rows the spec's ``[paper]`` table names), as Markdown lines."""
    if not spec.paper:
        return []
    lines = ["## Paper vs ours", ""]
    if spec.paper_source:
        lines += [f"Paper: {spec.paper_source}. The paper's values are transcribed, not measured here.", ""]
    if spec.paper_scale:
        lines += [f"How our scale differs: {spec.paper_scale}", ""]
    head = ["setting", "mixer", *spec.model_axes, "paper", f"ours ({spec.select}, mean ± std)", "per seed", "seeds"]
    body = []
    for r in rows:
        if r.get("paper") is None:
            continue
        pv = r["paper"] if isinstance(r["paper"], str) else f"{r['paper']:.3f}"
        ours = "not run yet" if r.get("report_mean") is None else (
            f"{_fmt(r['report_mean'])} ± {_fmt(r['report_std'])}" + ("" if r["complete"] else " (PARTIAL)"))
        per = ", ".join(_seed_cell(v) for v in r.get("per_seed", {}).values()) or "—"
        body.append([r["setting"], f"`{r['mixer']}`", *[str(r.get(a)) for a in spec.model_axes], pv, ours, per,
                     str(r.get("n_seeds", 0))])
    return lines + table_lines(head, body) + [""]


def _axis_combos(spec: SweepSpec) -> list[tuple[tuple[str, Any], ...]]:
    combos: list[tuple[tuple[str, Any], ...]] = [()]
    for a in spec.model_axes:
        combos = [c + ((a, v),) for c in combos for v in spec.model[a]]
    return combos


def markdown(spec: SweepSpec, rows: list[dict[str, Any]], command: str = "", cpu_seconds: float = 0.0,
             wall_only: int = 0, estimated: int = 0, last_part: int = 0,
             devices: dict[str, int] | None = None, trained: int | None = None) -> str:
    """The report as Markdown: the protocol, the length rule, one table per setting, CPU-hours and machine
    (``wall_only``: finished runs recorded before runs kept their CPU time, counted by wall clock; ``trained``:
    the finished runs the CPU-hours count, when more than the report's, e.g. seeds run at an lr an extension
    later replaced)."""
    info = machine_info()
    cpu_s = cpu_seconds
    sel = spec.select
    lines = [f"# Sweep `{spec.name}`", ""]
    if spec.description:
        lines += [spec.description, ""]
    lines += [
        f"Task `{spec.task}` {json.dumps(spec.task_options)}; model {json.dumps(spec.model)}; "
        f"training {json.dumps(spec.train)}; learning rates {spec.lrs}; seeds {spec.seeds}.",
        "",
        ("**Protocol.** For each row the learning rate with the best mean validation "
         f"{sel} over seeds ({spec.valid_examples} validation examples, a stream separate from the reported ones) "
         "is chosen; the row " if spec.lr_selection == "all_seeds" else
         f"**Protocol (two stages).** For each row every learning rate is trained with seed {spec.seeds[0]}; the "
         f"one with the best validation {sel} ({spec.valid_examples} validation examples, a stream separate from "
         f"the reported ones) is then trained with the other seeds ({spec.seeds[1:]}); the row ") +
        "reports that learning rate's mean ± sample std over seeds on the reported split, and the per-seed values. "
        "A diverged run counts as the worst value. *state* is the most numbers per sequence the model holds at any "
        "point of the sequence (all layers). *lr** is the chosen learning rate; '(edge)' marks one at the edge of "
        "the lrs tried, or tied on validation with an lr there; '(tie: …)' lists the lrs whose validation value "
        "ties the choice's (the first in the spec's order is chosen" + (
            ", or the first-seed choice among means over seeds" if spec.lr_confirm else "") +
        "; a tie at accuracy 1 or 0 is not marked)." + (
            f" While a row's best lr, or one tied with it, is the largest (smallest) tried, that lr × "
            f"{spec.lr_extend_factor:g} (÷ {spec.lr_extend_factor:g}) is probed with seed {spec.seeds[0]}, at most "
            f"{spec.lr_extend} per side; a probe that beats the best lr's first seed, or is within its seed spread "
            "(twice its std over seeds), gets the other seeds and joins the choice, one that does not shows the best "
            "is interior and is listed as a probe, never chosen."
            if spec.lr_extend and spec.lr_selection == "all_seeds" else "") + (
            f" While a row's best first-seed lr, or one tied with it, is the largest (smallest) tried, that lr × "
            f"{spec.lr_extend_factor:g} (÷ {spec.lr_extend_factor:g}) is trained with seed {spec.seeds[0]} too, at "
            f"most {spec.lr_extend} per side" + (" (and when the mean over seeds moves the choice to an edge)"
                                                 if spec.lr_confirm else "") + "."
            if spec.lr_extend and spec.lr_selection == "first_seed" else "") + (
            " Once the chosen lr has every seed, every lr whose first-seed validation value is within twice its "
            "seed std gets every seed too, and the best validation mean over seeds among them is chosen (the means "
            "follow 'valid by lr')." if spec.lr_confirm else "") + (
            " Rows that share a **tune group** are one model with a hyperparameter (the rows' options) chosen on "
            "validation as the lr is: every row of the group runs its first seed at each lr, and only the group's "
            "row with the best validation value at its chosen lr gets the other seeds; the others report their "
            "first seed ('not chosen')." if any(r.tune for r in spec.mixers) else ""),
        "",
        f"**Lengths.** {length_rule_text()}" + ("." if spec.scale_lengths else " — switched OFF in this spec."),
        "",
    ]
    lines += [f"## Summary: {sel} on the reported examples, mean ± std over seeds (number of seeds; 'edge lr': "
              "the chosen lr, or one tied with it on validation, is the largest or smallest tried; * = row not "
              "complete yet) at each row's chosen learning rate", "", summary_table(spec, rows)]
    lines += paper_section(spec, rows)
    chance = chance_level(spec)
    for setting in spec.settings:
        srows = [r for r in rows if r["setting"] == setting.label]
        srows.sort(key=lambda r: (-(r.get("report_mean") if r.get("report_mean") == r.get("report_mean") and
                                    r.get("report_mean") is not None else -1)
                                  if sel == "accuracy" else (r.get("report_mean") or math.inf), r["state"] or 0))
        lines += [f"## {setting.label} ({json.dumps(setting.options)}, T = {setting.seq_len})", ""]
        if setting.label in chance:
            lines += [f"Chance: {chance[setting.label]:.3f}.", ""]
        axes = spec.model_axes
        head = ["mixer", *axes, "state", "params", "lr*", f"{sel} (mean ± std)", "per seed", "valid by lr", "runs",
                "note"] + (["paper"] if spec.paper else []) + [f"{n} (mean ± std)" for n in spec.extra_metrics]
        body = []
        for r in srows:
            per = ", ".join(_seed_cell(v) for v in r.get("per_seed", {}).values()) or "—"
            lrv = ", ".join([f"{lr}: {_fmt(v)}" for lr, v in r["lr_valid"].items()]
                            + [f"{lr}: {'…' if v is None else _fmt(v)} (probe, first seed)"
                               for lr, v in (r.get("lr_probe") or {}).items()]) or "—"
            if r.get("lr_valid_mean"):  # lr_confirm
                lrv += "; mean over seeds: " + ", ".join(f"{lr}: {_fmt(v)}" for lr, v in r["lr_valid_mean"].items())
            ms = "—" if r.get("report_mean") is None else \
                f"{_fmt(r['report_mean'])} ± {_fmt(r['report_std'])}"
            lr = "—" if r["best_lr"] is None else f"{r['best_lr']:g}" + (
                " (edge)" if r.get("lr_at_grid_edge") else "") + (
                f" (tie: {' = '.join(r['lr_tied'])})" if r.get("lr_tied") else "")
            note = []
            if r["cannot_reach_first_token"]:
                note.append("by design cannot see the whole sequence: " + r["length_note"])
            elif r["length_note"]:
                note.append(r["length_note"])
            if r.get("note"):
                note.append(md_cell(r["note"]))
            if r.get("tune"):
                note.append(f"tune group '{r['tune']}': " + (
                    "chosen on validation" if r.get("tune_chosen") else
                    f"not chosen (seed {spec.seeds[0]} only)" if r.get("tune_chosen") is False else
                    "not chosen yet"))
            if r.get("diverged_seeds"):
                note.append(_diverged_text(r, sel))
            cm = r.get("compile_modes") or {}
            if len(cm) > 1 or cm.get("mixed"):
                note.append("trained partly under --compile (" + ", ".join(f"{n} {k}" for k, n in cm.items())
                            + " runs; the same math, within rounding)")
            if not r["complete"]:
                note.append("PARTIAL")
            state = "—" if r["state"] is None else f"{r['state']:,}"
            params = "—" if r["params"] is None else f"{r['params']:,}"
            paper = [] if not spec.paper else [
                "—" if r.get("paper") is None else (r["paper"] if isinstance(r["paper"], str) else _fmt(r["paper"]))]
            extra = []
            for n in spec.extra_metrics:
                e = r.get("extra", {}).get(n)
                extra.append("—" if not e or not e["per_seed"] else f"{_fmt(e['mean'])} ± {_fmt(e['std'])}")
            body.append([f"`{r['mixer']}`", *[str(r.get(a)) for a in axes], state, params, lr, ms, per, lrv,
                         f"{r['runs_done']}/{r['runs_total']}", "; ".join(note), *paper, *extra])
        lines += table_lines(head, body)
        lines.append("")
    done = sum(r["runs_done"] for r in rows)
    total = sum(r["runs_total"] for r in rows)
    if not wall_only:
        basis = "CPU time"
    elif wall_only == (trained or done):
        basis = "wall clock: these runs predate CPU-time records, and a wall clock also counts waiting for a core"
    else:
        basis = (f"CPU time; {wall_only} run(s) recorded without it by their wall clock, which also counts waiting "
                 "for a core")
    if estimated:
        basis += (f"; {estimated} resumed run(s) from checkpoints that predate CPU-time records: their earlier steps "
                  "estimated at the resumed part's rate")
    if last_part:
        basis += f"; {last_part} resumed run(s) recorded with the CPU time of their last part only (an undercount)"
    of = "the finished runs" if not trained or trained == done else \
        f"all {trained} finished runs ({trained - done} outside the report: seeds of an lr no longer chosen)"
    lines += [f"Runs finished: {done}/{total}; training time of {of}: {cpu_s / 3600:.2f} CPU-hours "
              f"(one thread each; {basis}). Machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']}; "
              f"report written {time.strftime('%Y-%m-%d %H:%M')}.", ""]
    if devices:
        lines += ["Trained on: " + ", ".join(f"{d} ({n} run(s))" for d, n in devices.items())
                  + " (a resumed run under the device of its last part; the data stream is the same on every "
                  "device; the CPU-hours above count the host process's CPU time only).", ""]
    if command:
        lines += [f"Command: `{command}`", ""]
    return "\n".join(lines)


def plot(spec: SweepSpec, rows: list[dict[str, Any]], path: Path) -> None:
    """Accuracy (or loss) against peak state: per setting a panel, per mixer a line across model sizes."""
    plt = pyplot()

    settings = spec.settings
    fig, axs = plt.subplots(1, len(settings), figsize=(6.2 * len(settings) + 2.4, 4.8), squeeze=False)
    mixers = [m.label for m in spec.mixers]
    cmap = plt.get_cmap("tab20").colors
    markers = "osD^vPX<>*hd"
    levels = _levels(spec)
    one_seed = all(len(r.get("per_seed") or {}) <= 1 for r in rows if r.get("report_mean") is not None)
    # one panel with one point per mixer (the demo): the legend carries each mixer's value
    value_in_legend = len(settings) == 1 and not spec.model_axes
    for ax, setting in zip(axs[0], settings):
        for i, mixer in enumerate(mixers):
            pts = sorted((r for r in rows if r["setting"] == setting.label and r["mixer"] == mixer
                          and r.get("report_mean") is not None and math.isfinite(r["report_mean"]) and r["state"]),
                         key=lambda r: r["state"])  # a loss row with a diverged seed has an infinite mean
            if not pts:
                continue
            xs = [r["state"] for r in pts]
            ys = [r["report_mean"] for r in pts]
            es = [0.0 if r["report_std"] != r["report_std"] else r["report_std"] for r in pts]
            dashed = any(r["cannot_reach_first_token"] for r in pts)
            # the 10 dark tab20 colours first, then the 10 light ones: neighbours in the legend never share a hue
            color = cmap[(2 * i) % 20 + (i // 10) % 2]
            label = (f"{mixer} ({ys[0]:.3f})" if value_in_legend else mixer) if ax is axs[0][0] else None
            ax.errorbar(xs, ys, yerr=es, color=color, marker=markers[i % len(markers)], ms=5,
                        capsize=3, lw=1.2, ls="--" if dashed else "-", label=label,
                        markeredgecolor="black", markeredgewidth=0.3)
        if setting.label in levels and spec.select == "accuracy":
            chance, plateau = levels[setting.label]
            first = ax is axs[0][0]
            ax.axhline(chance, color="grey", ls=":", lw=1, label=f"chance ({chance:.2f})" if first else None)
            if plateau is not None:
                ax.axhline(plateau, color="grey", ls="-.", lw=1,
                           label=f"1/pairs plateau ({plateau:.2f})" if first else None)
        ax.set_xscale("log")
        ax.set_xlabel("peak state (numbers per sequence, log)")
        ax.set_ylabel(f"{spec.select} (reported split; " + ("one seed)" if one_seed else "mean ± std over seeds)"))
        ax.set_title(f"{setting.label} (T={setting.seq_len})", fontsize=10)
        ax.grid(alpha=0.3)
        if spec.select == "accuracy":
            ax.set_ylim(-0.02, 1.04)
    width = fig.get_figwidth()
    fig.legend(loc="center left", bbox_to_anchor=(1 - 2.3 / width, 0.5), fontsize=7, frameon=False)
    fig.suptitle(f"{spec.name}: {spec.select} vs state (dashed: cannot see the whole sequence by design)",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 1 - 2.4 / width, 1))
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def md_cell(text: str) -> str:
    """``text`` (the spec's words) as one Markdown table cell that says just that: line breaks as spaces, ``|``
    escaped (it would end the cell), ``&``, ``<`` and ``>`` as entities (no HTML of the spec's making)."""
    text = " ".join(str(text).splitlines())
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|")


def report_owner(report_dir: Path) -> str | None:
    """The name of the spec whose report ``report_dir`` holds (its ``report.json``), or None (no report there)."""
    try:
        data = json.loads((Path(report_dir) / "report.json").read_text())
        name = data["spec"]["name"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return name if isinstance(name, str) else None


def _run_results(spec: SweepSpec, out: Path) -> list[dict[str, Any]]:
    """The ``result.json`` of every run of the grid and of those an lr extension added (outside the grid), each
    read once."""
    run_dirs = {p.rel_dir for p in spec.points()} | {p.rel_dir for p in wanted_points(spec, out)}
    return [r for rel in sorted(run_dirs) if (r := read_result(out / rel))]


def _training_time(results: list[dict[str, Any]]) -> tuple[float, int, int, int]:
    """CPU seconds of the runs, and how many of them have only a wall clock, an estimated CPU time, or the CPU time
    of their last part (a resumed run recorded before the parts were summed)."""
    secs, wall_only, estimated, last_part = 0.0, 0, 0, 0
    for r in results:
        if "cpu_seconds" in r:
            secs += float(r["cpu_seconds"])
            estimated += bool(r.get("cpu_seconds_estimated"))
            last_part += bool(r.get("resumed")) and "cpu_seconds_before_resume" not in r
        else:
            secs += float(r.get("seconds", 0.0))
            wall_only += 1
    return secs, wall_only, estimated, last_part


def run_devices(results: list[dict[str, Any]]) -> dict[str, int]:
    """Finished runs per device they trained on (``result.json``'s ``device``), when any trained off the CPU;
    empty when all ran on the CPU (runs recorded before devices were kept did)."""
    n: dict[str, int] = {}
    for r in results:
        if r.get("status") == "finished":
            d = str(r.get("device", "cpu"))
            n[d] = n.get(d, 0) + 1
    return dict(sorted(n.items())) if set(n) - {"cpu"} else {}  # sorted: the same report from the same runs


def _report(spec: SweepSpec, out: Path, command: str) -> tuple[dict[str, Any], tuple]:
    check_run_dirs(spec, out)  # no run of another version of the spec is reported as this one's (SweepConflict)
    rows = collect(spec, out)
    results = _run_results(spec, out)
    times = _training_time(results)
    devices = run_devices(results)
    payload = {
        "spec": spec.raw, "source": portable_source(spec.source), "length_rule": length_rule_text(),
        "select": spec.select,
        "cpu_hours": times[0] / 3600, "machine": machine_info(), "command": command, "rows": rows,
    }
    if devices:
        payload["devices"] = devices
    return payload, (*times, devices, sum(r.get("status") == "finished" for r in results))


def portable_source(source: str) -> str:
    """A spec's path as a report records it: a packaged spec as ``seqmem/experiments/<file>`` (the same on every
    clone), any other path as given."""
    from seqmem.sweep.spec import PACKAGED_SPECS

    p = Path(source)
    return f"seqmem/experiments/{p.name}" if p.is_file() and p.resolve().parent == PACKAGED_SPECS.resolve() \
        else source


def report_payload(spec: SweepSpec, out: Path, command: str = "") -> dict[str, Any]:
    """What :func:`write_report` writes to ``report.json`` for the runs under ``out``, without writing anything."""
    return _report(spec, Path(out), command)[0]


def write_report(spec: SweepSpec, out: Path, report_dir: Path | None = None, command: str = "") -> dict[str, Any]:
    """Write ``report.md``, ``report.json`` and ``<select>_vs_state.png`` to ``report_dir`` (default ``out``)."""
    out = Path(out)
    report_dir = Path(report_dir or out)
    owner = report_owner(report_dir)
    if owner is not None and owner != spec.name:  # another sweep's report: never replaced by this one
        raise ValueError(f"{report_dir / 'report.json'} is the report of sweep {owner!r}, not {spec.name!r}: give "
                         "this sweep its own --out (or --report-dir)")
    payload, times = _report(spec, out, command)
    rows = payload["rows"]
    md = markdown(spec, rows, command, *times)
    js = json.dumps(payload, indent=2, default=str)
    # the same runs give the same files: a report that would differ only in when, where (machine, clone) and by how
    # many threads it was written is kept as it is (re-running a finished sweep, refreshing, or `make compare` on a
    # fresh clone leaves no churn to commit)
    same = _same_report(report_dir / "report.md", md) and _same_report(report_dir / "report.json", js)
    if not same:
        atomic_write_text(report_dir / "report.md", md)
        atomic_write_text(report_dir / "report.json", js)
    figure = report_dir / f"{spec.select}_vs_state.png"
    if not (same and figure.is_file()):  # the same rows draw the same plot (up to the plotting library's bytes)
        try:
            plot(spec, rows, figure)
        except MissingExtra as e:  # the tables are the report; the figure needs the plot extra
            print(f"seqmem: report written without its figure: {e}", file=sys.stderr)
    return payload


def _same_report(path: Path, text: str) -> bool:
    """Whether ``path`` holds ``text`` up to what changes when the runs do not: the report's date and the writing
    machine (``report.md``'s "Machine: ...; report written ..."), the writing machine and the spec file's location
    on disk (``report.json``'s ``machine`` and ``source``)."""
    try:
        old = path.read_text()
    except OSError:
        return False
    if path.suffix == ".json":
        try:
            a, b = json.loads(old), json.loads(text)
        except ValueError:
            return False
        for d in (a, b):
            if isinstance(d, dict):
                d.pop("machine", None)
                d.pop("source", None)
        return a == b
    undated = re.compile(r"Machine: [^\n]*?; report written \d{4}-\d\d-\d\d \d\d:\d\d")
    return undated.sub("", old) == undated.sub("", text)


def headline_summary(spec: SweepSpec, payload: dict[str, Any],
                     report_dir: Path | str | None = None) -> dict[str, Any]:
    """A sweep report reduced to what a paper's ``headline.json`` records: per setting and row (a row with model
    axes is named ``mixer (axis=value, ...)``) the chosen lr, mean ± std over seeds on the reported split, the
    per-seed values, validation by lr and the paper's value."""
    def num(v: Any) -> float | None:  # 4 decimals; NaN (one seed's std, a diverged run) and inf (the mean loss of a
        # row with a diverged seed) as null
        return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else round(float(v), 4)

    by_setting: dict[str, dict[str, Any]] = {}
    for r in payload["rows"]:
        axes = ", ".join(f"{a}={r[a]}" for a in spec.model_axes if a in r)
        name = f"{r['mixer']} ({axes})" if axes else r["mixer"]
        entry: dict[str, Any] = {
            "runs": f"{r['runs_done']}/{r['runs_total']}",
            "complete": bool(r["complete"]),
            "lr": r.get("best_lr"),
            "mean": num(r.get("report_mean")),
            "std": num(r.get("report_std")),
            "per_seed": {str(k): num(v) for k, v in (r.get("per_seed") or {}).items()},
            "valid_by_lr": {k: num(v) for k, v in (r.get("lr_valid") or {}).items()},
        }
        if r.get("diverged_seeds"):
            entry["diverged_seeds"] = r["diverged_seeds"]
            entry["diverged"] = _diverged_text(r, spec.select)
        if r.get("extra"):
            entry["extra"] = {k: {"mean": num(e["mean"]), "std": num(e["std"]),
                                  "per_seed": [num(v) for v in e["per_seed"]]} for k, e in r["extra"].items()}
        if r.get("tune"):
            entry["tune"] = {"group": r["tune"], "chosen": r.get("tune_chosen")}
        if r.get("paper") is not None:
            entry["paper"] = r["paper"]
        by_setting.setdefault(r["setting"], {})[name] = entry
    done = sum(r["runs_done"] for r in payload["rows"])
    total = sum(r["runs_total"] for r in payload["rows"])
    out: dict[str, Any] = {
        "select": payload["select"], "runs": f"{done}/{total}", "cpu_hours": round(float(payload["cpu_hours"]), 2),
        "settings": by_setting,
    }
    if report_dir is not None:
        out["report"] = str(Path(report_dir) / "report.md")
    return out


def update_headline(path: Path | str, spec: SweepSpec, payload: dict[str, Any],
                    report_dir: Path | str | None = None) -> dict[str, Any]:
    """Set ``ours[<spec name>]`` of the JSON object at ``path`` to :func:`headline_summary` (atomic rewrite; the
    rest of the file is kept).  A missing or malformed file is refused before anything is written."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such headline file")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a headline file holds a JSON object")
    ours = data.get("ours")
    if ours is None:
        ours = data["ours"] = {}
    if not isinstance(ours, dict):
        raise ValueError(f"{path}: 'ours' must be an object keyed by spec name")
    ours[spec.name] = headline_summary(spec, payload, report_dir)
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n")
    return data
