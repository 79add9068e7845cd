"""Write each paper's ``rule`` block into ``docs/results/<paper>/headline.json`` from the committed run records:
every claim under the paper's protocol and the tuned one, per-seed values read from ``result.json``, the outcomes
and the word computed by ``seqmem.repro.verdict`` (the rule: ``docs/results/README.md``).

    python scripts/verdict_rules.py [--check]

The claims (which cells, which lr, what the paper says, what is pending) are declared below; the numbers come only
from the records.  ``--check`` writes nothing and exits 1 when a headline's ``rule`` differs from what this gives.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from seqmem.repro.verdict import cell_stats, claim_outcomes, verdict_word  # noqa: E402

RES = Path("docs/results")


def _all_records(report_dir: str, setting_dir: str, mixer: str) -> list[tuple[Path, dict]]:
    """Every run record of ``mixer``, whatever its status; stops the script when none has finished."""
    base = ROOT / RES / report_dir / "runs" / setting_dir / mixer
    out = [(p.relative_to(ROOT), json.loads(p.read_text())) for p in sorted(base.glob("model/*/seed*/result.json"))]
    if not any(r.get("status") == "finished" for _, r in out):
        raise SystemExit(f"no finished runs under {base}")
    return out


def _records(report_dir: str, setting_dir: str, mixer: str) -> list[tuple[Path, dict]]:
    return [(p, r) for p, r in _all_records(report_dir, setting_dir, mixer) if r.get("status") == "finished"]


#: rule 1's lr check (docs/results/README.md, "The rule"): for a sweep that chose lrs on seed 0, the sweeps that
#: gave the lrs within the seed spread of a choice every seed (the same training runs, checked), and their specs
SEEDS_FROM: dict[str, list[str]] = {
    "lattice/matched": ["lattice/matched_seeds"],
    "vla/capacity": ["vla/capacity_seeds", "vla/settle"],
    "echo/mqar_small": ["echo/mqar_small_seeds"],
    "vla/copy": ["vla/copy_seeds"],
}
#: the spec that settles a sweep's seed-0 choices (the settling sweeps choose on the mean over seeds themselves)
SEEDS_SPEC = {"lattice/matched": "lattice_matched_seeds", "vla/capacity": "vla_capacity_seeds",
              "echo/mqar_small": "echo_mqar_small_seeds", "vla/copy": "vla_copy_seeds",
              "vort/zipf_tiny": "vort_settle", "elastic/sampling_small": "elastic_settle"}


def _training(result_path: Path) -> str:
    """What a run trained, lr and seed aside (:func:`seqmem.sweep.runner.run_identity` of its ``run.json``)."""
    from seqmem.sweep.runner import run_identity

    spec = json.loads((ROOT / result_path).parent.joinpath("run.json").read_text())
    spec["train"] = {k: v for k, v in spec["train"].items() if k not in ("lr", "seed")}
    return run_identity(spec)


def _lr_key(lr: float) -> float:
    return float(f"{lr:.12g}")  # one lr however it was computed (3e-3 * 3 and 9e-3 alike)


def _pooled(report_dir: str, setting_dir: str, mixer: str, every: list[tuple[Path, dict]]) -> list[tuple[Path, dict]]:
    """``every`` (a sweep's finished and diverged runs of ``mixer``) and those of its ``SEEDS_FROM`` sweeps at the
    lrs and seeds it lacks (a diverged run stays one: it counts as the worst value, never replaced); stops the script
    unless all trained alike but for lr and seed."""
    keep = ("finished", "diverged")
    pool = [(p, r) for p, r in every if r.get("status") in keep]
    have = {(_lr_key(r["lr"]), r["seed"]) for _, r in pool}
    n_own = len(pool)
    for other in SEEDS_FROM.get(report_dir, []):
        base = ROOT / RES / other / "runs" / setting_dir / mixer
        for p in sorted(base.glob("model/*/seed*/result.json")):
            r = json.loads(p.read_text())
            if r.get("status") in keep and (_lr_key(r["lr"]), r["seed"]) not in have:
                have.add((_lr_key(r["lr"]), r["seed"]))
                pool.append((p.relative_to(ROOT), r))
    if len(pool) > n_own and len({_training(p) for p, _ in pool}) > 1:
        raise SystemExit(f"{report_dir} {mixer}: the runs pooled for rule 1's lr check (with "
                         f"{', '.join(SEEDS_FROM[report_dir])}) trained differently, not only in lr and seed")
    return pool


def _better(a: float, b: float, higher: bool) -> bool:
    """``a`` strictly better than ``b`` (nan, a diverged run, is the worst)."""
    if math.isnan(a):
        return False
    return math.isnan(b) or (a > b if higher else a < b)


def _mean(vals: dict[int, float]) -> float:
    return math.nan if any(math.isnan(v) for v in vals.values()) else sum(vals.values()) / len(vals)


def lr_choice(report_dir: str, setting_dir: str, mixer: str, seed0_lr: float,
              recs: list[tuple[Path, dict]]) -> dict[str, Any] | None:
    """Rule 1's check of the lr a ``first_seed`` sweep chose on seed 0, ``seed0_lr`` (None for other sweeps).

    The spread is twice the chosen lr's validation std over its seeds (an order claim's ``std_a + std_b`` with the
    other lr's std taken as the choice's; unbounded when a seed diverged there).  Every other lr whose seed-0
    validation value is within it of the choice's seed-0 value, or better than it (a probe from a ``SEEDS_FROM``
    sweep can be), must have run the choice's seeds — in this sweep or in a ``SEEDS_FROM`` sweep of the same
    training runs (checked); one that has not is listed in ``unsettled``.  Every lr with those seeds competes on
    the validation mean over them (a diverged seed is the worst value; a tie keeps the seed-0 choice): the best is
    rule 1's choice (``lr``).  A choice whose mean is the metric's maximum (accuracy 1.000) cannot be beaten and
    needs nothing more.  ``recs``: the runs :func:`_pooled` gives, diverged ones included."""
    report = ROOT / RES / report_dir / "report.json"
    if not report.is_file():
        return None
    rep = json.loads(report.read_text())
    if (rep.get("spec") or {}).get("lr_selection") != "first_seed":
        return None
    sel = rep["select"]
    higher = sel == "accuracy"
    by_lr: dict[float, dict[int, float]] = {}
    for _, r in recs:
        v = math.nan if r.get("status") == "diverged" else float(r["valid"][sel])
        by_lr.setdefault(_lr_key(r["lr"]), {})[r["seed"]] = v
    here = next((x for x in by_lr if abs(x - seed0_lr) <= 1e-12 * max(1.0, seed0_lr)), None)
    if here is None or 0 not in by_lr[here] or len(by_lr[here]) < 2:
        return None  # the choice has no seed spread yet: its cell has too few seeds to be read
    chosen = by_lr[here]
    mean_here = _mean(chosen)
    spread = math.inf if math.isnan(mean_here) else 2 * cell_stats(chosen)["std"]
    c0 = chosen[0]
    ceiling = higher and not math.isnan(mean_here) and mean_here >= 1.0
    near = sorted(x for x, v in by_lr.items() if x != here and 0 in v and not math.isnan(v[0])
                  and (abs(v[0] - c0) <= spread or _better(v[0], c0, higher)))
    means = {x: _mean({s: d[s] for s in chosen}) for x, d in by_lr.items() if set(d) >= set(chosen)}
    best = here
    for x in sorted(means):
        if not ceiling and _better(means[x], means[best], higher):
            best = x
    shown = sorted(set(near) | (set(means) - {here}))
    from seqmem.sweep.runner import tied_lrs

    # an lr whose mean ties the choice's, as the sweep's report reads a tie (none at the metric's bounds)
    tied = [] if ceiling else [x for x in tied_lrs(means, best, sel) if x != best]
    return {
        "lr": best, "select": f"validation {sel}", "seed0_choice": here,
        **({"tied": [f"{x:g}" for x in tied]} if tied else {}),  # an lr tied with the choice: the edge reads it
        "seed0": {f"{x:g}": round(v[0], 6) for x, v in sorted(by_lr.items()) if 0 in v},
        "spread": None if math.isinf(spread) else round(spread, 6),
        "compared": {f"{x:g}": ({"mean": None if math.isnan(means[x]) else round(means[x], 6),
                                      "n": len(chosen)} if x in means else {"n": len(by_lr[x])}) for x in shown},
        "by": ("the metric's maximum over seeds" if ceiling and shown else
               "the validation mean over seeds" if shown else "seed 0: every other lr beyond the seed spread"),
        "unsettled": [] if ceiling else [x for x in near if x not in means],
        **({"seeds_from": SEEDS_SPEC[report_dir]} if shown and report_dir in SEEDS_FROM else {}),
    }


def cell(report_dir: str, setting_dir: str, mixer: str, lr: float, metric: str, *, label: str,
         calibrated: bool, fixed_lr: bool = False) -> dict[str, Any]:
    """A cell: the finished runs of ``mixer`` at ``lr``; ``lr_at_edge`` when ``lr`` is the edge of the lrs tried
    with seed 0 (not for a protocol's fixed lr); for a tuned lr chosen on seed 0, rule 1's check
    (:func:`lr_choice`): ``lr_unsettled`` lists the lrs within the seed spread that still need every seed."""
    from seqmem.repro.verdict import record_value

    every = _all_records(report_dir, setting_dir, mixer)
    recs = [(p, r) for p, r in every if r.get("status") == "finished"]
    # the sweep counts a diverged seed as the worst value; a cell that dropped it would read the survivors alone
    for p, rec in every:
        if rec.get("status") == "diverged" and abs(rec["lr"] - lr) <= 1e-12 * max(1.0, lr):
            raise SystemExit(f"{p}: a diverged seed in the cell at lr {lr}; a cell reads every seed (the rule has no "
                             "worst-value reading yet)")
    pool = recs
    if not fixed_lr:  # a tuned cell may read the runs rule 1's check added (SEEDS_FROM), its edge probes included
        pool = _pooled(report_dir, setting_dir, mixer, every)
        recs = [(p, r) for p, r in pool if r.get("status") == "finished"]
    tried = sorted({r["lr"] for _, r in recs if r["seed"] == 0})
    runs = sorted(((p, r) for p, r in recs if abs(r["lr"] - lr) <= 1e-12 * max(1.0, lr)), key=lambda x: x[1]["seed"])
    if not runs:
        raise SystemExit(f"{report_dir}/{setting_dir}/{mixer}: no finished run at lr {lr} (tried {tried})")
    choice = None
    if not fixed_lr:  # a tuned cell is at the lr its sweep's report chose (rule 1's check may move it)
        report = ROOT / RES / report_dir / "report.json"
        rep = json.loads(report.read_text()) if report.is_file() else {}
        row = next((x for x in rep.get("rows", []) if x["mixer"] == mixer and x["setting"] == runs[0][1]["setting"]),
                   None)
        if rep and (row is None or row.get("best_lr") is None):
            raise SystemExit(f"{report_dir}: its report has no chosen lr for {mixer} at {runs[0][1]['setting']!r}")
        seed0_lr = lr if row is None else row["best_lr"]
        if ((rep.get("spec") or {}).get("train") or {}).get("lr_confirm"):
            # that report chose on the mean over seeds: its seed-0 choice is lr_valid's
            from seqmem.sweep.runner import choose_lr

            first = {x: v for x, v in ((float(k), v) for k, v in row["lr_valid"].items()) if v is not None}
            seed0_lr = choose_lr(first, rep["select"])
        choice = lr_choice(report_dir, setting_dir, mixer, seed0_lr, pool)
        want = choice["lr"] if choice is not None else seed0_lr
        if abs(want - lr) > 1e-12 * max(1.0, lr):
            raise SystemExit(f"{report_dir} {mixer}: tuned cell at lr {lr:g}; the report chose {seed0_lr:g} on seed 0 "
                             + ("" if choice is None or want == seed0_lr else
                                f"and rule 1's mean over seeds chooses {want:g}") + ": move the cell")
    per_seed = {str(r["seed"]): round(record_value(r, metric), 6) for _, r in runs}
    out = {
        "label": label, "lr": lr, "lrs_tried_seed0": tried, "per_seed": per_seed, **_stats(per_seed),
        "calibrated": calibrated,
        # at the edge of the lrs tried: the cell's lr or one tied with it over seeds (as the sweep's report reads it)
        "lr_at_edge": (not fixed_lr) and len(tried) > 1 and any(
            abs(y - x) <= 1e-12 * max(1.0, y) for x in (tried[0], tried[-1])
            for y in [lr, *(float(t) for t in (choice or {}).get("tied", []))]),
        "metric": metric, "runs": [str(p) for p, _ in runs],
    }
    if not fixed_lr and choice is not None:
        out["lr_choice"] = {k: v for k, v in choice.items() if k not in ("lr", "unsettled")}
        out["lr_unsettled"] = choice["unsettled"]
        if out["lr_unsettled"]:
            out["lr_unsettled_pending"] = (
                f"{SEEDS_SPEC.get(report_dir, 'a spec not written yet')} (scripts/settle.sh): rule 1's lr check of "
                f"{mixer} (lr " + ", ".join(f"{x:g}" for x in out["lr_unsettled"]) + " within the seed spread of "
                f"the seed-0 choice {choice['seed0_choice']:g})")
    return out


def ceiling_tie(report_dir: str, setting_dir: str, mixers: list[str], ceiling: float = 1.0) -> list[float]:
    """The lrs tried when every finished run of every mixer in ``mixers`` reaches validation accuracy ``ceiling``
    (the rule's tie at the metric's maximum: no lr can do better, so a grid edge hides nothing); stops the script
    when any run falls short, so a recorded ``same_as`` cannot outlive its evidence."""
    lrs = set()
    for mixer in mixers:
        for p, r in _records(report_dir, setting_dir, mixer):
            if r["valid"]["accuracy"] < ceiling:
                raise SystemExit(f"{p}: validation accuracy {r['valid']['accuracy']} < {ceiling}: the tie at the "
                                 "metric's maximum that the tuned protocol's same_as rests on does not hold")
            lrs.add(r["lr"])
    return sorted(lrs)


def _stats(per_seed: dict[str, float]) -> dict[str, Any]:
    """A cell's ``mean``, ``std`` (rounded to 6 places; None where undefined) and ``n`` from its per-seed values."""
    st = cell_stats(per_seed)
    return {"mean": None if st["mean"] is None else round(st["mean"], 6),
            "std": None if st["std"] is None else round(st["std"], 6), "n": st["n"]}


def report_row(report_dir: str, mixer: str, setting: str) -> dict[str, Any]:
    """A complete row of a sweep's ``report.json`` (stops the script when absent or incomplete)."""
    report = ROOT / RES / report_dir / "report.json"
    rows = json.loads(report.read_text())["rows"] if report.is_file() else []
    row = next((r for r in rows if r["mixer"] == mixer and r["setting"] == setting), None)
    if row is None or not row.get("complete"):
        raise SystemExit(f"{report_dir}: no complete row {mixer!r} at {setting!r} to calibrate from")
    return row


def calibration(reference: str, criterion: str, ours: dict[str, Any], ok: bool, applies: str) -> dict[str, Any]:
    """Rule 3's evidence for the cells a builder marks ``calibrated``: the reference, the criterion, the reference's
    numbers read from its report, and whether they meet it (never set by hand)."""
    return {"reference": reference, "criterion": criterion,
            "ours": {k: round(v, 4) if isinstance(v, float) else v for k, v in ours.items()},
            "calibrated": bool(ok), "applies_to": applies}


def finish(claim: dict[str, Any]) -> dict[str, Any]:
    outs = claim_outcomes(claim)
    claim["outcomes"], claim["word"] = outs, verdict_word(outs)
    for proto in claim["protocols"].values():  # say where rule 1's check decided a seed-0 choice
        checked = [f"{c['label'].split(',')[0]}: lr {c['lr']:g} by {c['lr_choice']['by']}"
                   for c in (proto.get("cells") or {}).values()
                   if (c.get("lr_choice") or {}).get("compared") and not c.get("lr_unsettled")]
        if checked and "what" in proto and "rule 1's lr check" not in proto["what"]:
            proto["what"] += ("; rule 1's lr check (every lr within the seed spread of the seed-0 choice run with "
                              "every seed): " + "; ".join(checked))
    # rule 1's unsettled lr choices name their own pending runs (cells read into the word only)
    need = [c["lr_unsettled_pending"] for p in claim["protocols"].values() for c in (p.get("cells") or {}).values()
            if c.get("lr_unsettled_pending")]
    if need:  # one entry per spec: "SPEC (scripts/settle.sh): rule 1's lr check of A (...), of B (...)"
        by_spec: dict[str, list[str]] = {}
        for x in need:
            head, _, what = x.partition(": rule 1's lr check of ")
            if what not in by_spec.setdefault(head, []):
                by_spec[head].append(what)
        have = [x for x in str(claim.get("pending") or "").split("; ") if x]
        new = [f"{h}: rule 1's lr check of " + ", of ".join(w) for h, w in by_spec.items()]
        claim["pending"] = "; ".join(have + [x for x in new if x not in have])
    return claim


def best_valid(report_dir: str, setting_dir: str, mixers: list[str], lr: float, seed: int = 0) -> str:
    """The row of a tune group with the best validation accuracy at ``lr`` (seed 0)."""
    best = None
    for m in mixers:
        for _, r in _records(report_dir, setting_dir, m):
            if r["seed"] == seed and abs(r["lr"] - lr) < 1e-12:
                if best is None or r["valid"]["accuracy"] > best[1]:
                    best = (m, r["valid"]["accuracy"])
    assert best is not None
    return best[0]


def chosen_lr(report_dir: str, setting_dir: str, mixer: str, key: str = "loss", lower: bool = True) -> float | None:
    """The lr a first-seed sweep chooses for a row: the best seed-0 validation ``key``; None before any run."""
    base = ROOT / RES / report_dir / "runs" / setting_dir / mixer
    vals = {}
    for p in base.glob("model/*/seed0/result.json"):
        rec = json.loads(p.read_text())
        if rec.get("status") == "finished":
            vals[rec["lr"]] = rec["valid"][key]
    if not vals:
        return None
    return (min if lower else max)(vals, key=vals.get)


def settled_rows(report_dir: str, mixers: list[str]) -> dict[str, dict[str, Any]] | None:
    """A settling sweep's report rows for ``mixers`` (its one setting), or None until every one is complete (a
    sweep is read whole or not at all: its lr choices use every seed)."""
    report = ROOT / RES / report_dir / "report.json"
    if not report.is_file():
        return None
    rows = {r["mixer"]: r for r in json.loads(report.read_text())["rows"]}
    if not all(rows.get(x, {}).get("complete") for x in mixers):
        return None
    return {x: rows[x] for x in mixers}


def swept_cell(report_dir: str, setting_dir: str, rows: dict[str, dict[str, Any]], variants: list[str],
               metric: str, *, lower: bool, calibrated: bool, name: str, lr: float | None = None) -> dict[str, Any]:
    """A cell from a settling sweep: of ``variants`` (rows of one model differing in an unspecified choice: the
    exponential's λ, the sampling's α) the one best on the validation mean over seeds — at ``lr`` (the paper's
    protocol) or at each row's chosen lr (the tuned one) — the others reported beside it (``variants``)."""
    def valid(x: str) -> float:
        r = rows[x]
        return r["lr_valid"][f"{lr:g}"] if lr is not None else r["valid_at_best"]

    best = (min if lower else max)(variants, key=valid)
    at = lr if lr is not None else rows[best]["best_lr"]
    how = f"lr {at:g}" + ("" if lr is not None else " (chosen on the validation mean over seeds)")
    c = cell(report_dir, setting_dir, best, at, metric, label=f"{name} ({best}), {how}" if len(variants) > 1
             else f"{name}, {how}", calibrated=calibrated, fixed_lr=lr is not None)
    if lr is None:  # the sweep's own edge: probes beyond the choice count as tried
        c["lr_at_edge"] = bool(rows[best]["lr_at_grid_edge"])
    if len(variants) > 1:
        c["variants"] = {x: {"lr": lr if lr is not None else rows[x]["best_lr"], "valid_mean": round(valid(x), 6)}
                         for x in variants}
    return c


def niah_cell(out_dir: str, length: int, label: str, calibrated: bool, lr: float = 3e-4) -> dict[str, Any]:
    """A cell from ``seqmem repro echo --seeds`` records: NIAH accuracy % at ``length`` of every finished seed
    (``<out_dir>/seeds/seed-S/ssm_ska.json``, written once its seed is evaluated), all trained at ``lr``."""
    from seqmem.repro.verdict import record_seed_lr, record_value

    metric, runs, per_seed = f"niah[{length}]", [], {}
    for p in sorted((ROOT / RES / out_dir / "seeds").glob("seed-*/ssm_ska.json")):
        rec = json.loads(p.read_text())
        seed, rec_lr = record_seed_lr(rec)
        if abs(rec_lr - lr) > 1e-12:
            raise SystemExit(f"{p}: trained at lr {rec_lr}, the cell is at {lr}")
        per_seed[str(seed)] = round(record_value(rec, metric), 6)
        runs.append(str(p.relative_to(ROOT)))
    return {"label": label, "lr": lr, "per_seed": per_seed, **_stats(per_seed), "calibrated": calibrated,
            "lr_at_edge": False, "metric": metric, "runs": runs}


def tuned_niah(out_dir: str, length: int, calibrated: bool) -> tuple[dict[str, Any], str]:
    """Echo Table 2's tuned protocol (echo_niah_tuned_k2): the lr whose records have the best mean validation
    accuracy over seeds (``<out_dir>/lr<LR>/seeds/seed-S/ssm_ska.json``; every lr needs 3 finished seeds first),
    and the NIAH cell at ``length`` there. Returns the protocol and what is still pending ("" when nothing)."""
    from seqmem.repro.verdict import record_seed_lr

    spec = "echo_niah_tuned_k2 (scripts/settle.sh: the paper's protocol at lr 1e-4 / 3e-4 / 1e-3 / 3e-3, 3 seeds each)"
    # each record's validation accuracy by definition: "pooled" (over every scored token; records saying pooled)
    # and "batch_mean" (the mean over evaluation batches of 16 of each batch's accuracy: older records' accuracy,
    # newer records' batch_mean_accuracy); the lrs are compared on a definition every record has, pooled first
    scores: dict[float, dict[str, dict[str, float]]] = {}
    dirs: dict[float, str] = {}
    for d in sorted((ROOT / RES / out_dir).glob("lr*")):
        for p in sorted(d.glob("seeds/seed-*/ssm_ska.json")):
            rec = json.loads(p.read_text())
            seed, lr = record_seed_lr(rec)
            if dirs.setdefault(lr, d.name) != d.name:
                raise SystemExit(f"{out_dir}: lr {lr:g} in two folders ({dirs[lr]}, {d.name})")
            v = rec["valid"]
            if v.get("pooled"):
                got = {"pooled": float(v["accuracy"])}
                if "batch_mean_accuracy" in v:
                    got["batch_mean"] = float(v["batch_mean_accuracy"])
            else:
                got = {"batch_mean": float(v["accuracy"])}
            scores.setdefault(lr, {})[str(seed)] = got
    common = set.intersection(*(set(g) for v in scores.values() for g in v.values())) if scores else {"pooled"}
    if not common:
        raise SystemExit(f"{out_dir}: some records pool their validation accuracy over scored tokens and some "
                         "average it over evaluation batches, with no definition common to all; retrain one kind "
                         "so the lrs are compared alike")
    kind = "pooled" if "pooled" in common else "batch_mean"
    valid = {lr: {seed: g[kind] for seed, g in v.items()} for lr, v in scores.items()}
    if not valid:
        return {"status": "not run", "why": "no run of the tuned spec yet"}, spec
    short = {lr: len(v) for lr, v in valid.items() if len(v) < 3}
    if len(valid) < 3 or short:
        return ({"status": "insufficient seeds", "why": "lrs with finished seeds so far: "
                 + ", ".join(f"{lr:g} ({len(v)})" for lr, v in sorted(valid.items()))}, spec + " (resumable)")
    means = {lr: sum(v.values()) / len(v) for lr, v in valid.items()}
    best = max(means, key=means.get)
    lrs = sorted(means)
    c = niah_cell(f"{out_dir}/{dirs[best]}", length, f"ssm_ska (K = 2), lr {best:g} (chosen on validation)",
                  calibrated, lr=best)
    c["lr_at_edge"] = best in (lrs[0], lrs[-1])
    c["lrs_tried"], c["valid_mean_by_lr"] = lrs, {f"{lr:g}": round(m, 3) for lr, m in sorted(means.items())}
    protocol = {"what": "the paper's protocol at each lr of a grid, 3 seeds each; the lr with the best mean "
                        "validation accuracy (training mixture, its validation stream) over seeds"
                        + ("" if kind == "pooled" else " (compared on the mean over evaluation batches of 16 of "
                           "each batch's token accuracy, the definition every lr's records carry)"),
                "cells": {"a": c}}
    return protocol, ((spec + ": the best lr is at the grid's edge; extend it (LRS=...)") if c["lr_at_edge"]
                      else "")


# ---------------------------------------------------------------------------------------------------- VORT
def vort() -> dict[str, Any]:
    d, s, m = "vort/zipf_tiny", "beta-1.0", "report.hits_long/report.queries_long"
    exps = ["exp-lambda4e-3", "exp-lambda4e-2", "exp-lambda4e-1"]
    exp_paper = best_valid(d, s, exps, 3e-4)
    def recall_calibration(ref: dict[str, Any], where: str, applies: str) -> dict[str, Any]:
        """Rule 3 from the reference (window 8 + attention) row ``ref``: mean test recall ≥ 0.5 in every lag bin."""
        bins = {b: ref["extra"][f"hits_{b}/queries_{b}"]["mean"] for b in ("short", "medium", "long")}
        return calibration(f"swa8+attention (a sliding window of 8 + attention), {where}, 3 seeds",
                           "mean test recall ≥ 0.5 in every lag bin (chance 1/16)", bins,
                           all(v >= 0.5 for v in bins.values()), applies)

    calib = recall_calibration(report_row(d, "swa8+attention", "beta=1.0"), "vort_zipf_tiny β = 1",
                               "the β = 1 cells (vort_zipf_tiny, vort_settle)")
    cal = calib["calibrated"]
    paper = {
        "pl": cell(d, s, "power-law", 3e-4, m, label="power-law, lr 3e-4", calibrated=cal, fixed_lr=True),
        "exp": cell(d, s, exp_paper, 3e-4, m, label=f"exponential ({exp_paper}, best on validation at lr 3e-4)",
                    calibrated=cal, fixed_lr=True),
        "mix": cell(d, s, "mixture-5", 3e-4, m, label="mixture-5, lr 3e-4", calibrated=cal, fixed_lr=True),
    }
    tuned = {
        "pl": cell(d, s, "power-law", 1e-3, m, label="power-law, lr 1e-3 (chosen on validation)", calibrated=cal),
        "exp": cell(d, s, "exp-lambda4e-3", 1e-3, m, label="exponential λ 4e-3, lr 1e-3 (chosen on validation)",
                    calibrated=cal),
        "mix": cell(d, s, "mixture-5", 3e-4, m, label="mixture-5, lr 3e-4 (chosen on validation)", calibrated=cal),
    }
    what_p = ("the paper's lr 3e-4 (§6 'Models compared') at 1/40 scale, β = 1, the exponential's λ chosen on "
              "validation at that lr; seed 0 only so far")
    dev_p = ["task layout: 16 queries per 250 positions; the paper plants an anchor at every position (§6 'Task "
             "design'), which the settling experiment adds as a task option"]
    what_t = ("lr chosen on validation (seed 0) from 3e-4 / 1e-3 / 3e-3, the exponential's λ from 4e-3 / 4e-2 / "
              "4e-1 on validation at each lr; 3 seeds at the choice; β = 1 (the calibrated β)")
    pending = ("vort_settle and vort_settle_dense (src/seqmem/experiments/): power-law vs exponential with λ ∈ "
               "{4e-3, 4e-2, 4e-1} and mixture-5 at lr ∈ {3e-4, 1e-3}, 3 seeds each, our sparse and the paper's "
               "dense anchor layout (where its reference calibrated: vort_calibrate_dense); λ and "
               "lr chosen on the validation mean over seeds")
    lam_note = {
        "exponential λ 4e-2 at lr 1e-3, seed 0 (validation 0.842 vs λ 4e-3's 0.844)":
            cell(d, s, "exp-lambda4e-2", 1e-3, m, label="exponential λ 4e-2, lr 1e-3", calibrated=cal),
        "exponential λ 4e-1 at lr 1e-3, seed 0":
            cell(d, s, "exp-lambda4e-1", 1e-3, m, label="exponential λ 4e-1, lr 1e-3", calibrated=cal),
        "exponentials at the paper's lr 3e-4, seed 0": {
            x: cell(d, s, x, 3e-4, m, label=f"{x}, lr 3e-4", calibrated=cal, fixed_lr=True) for x in exps},
        "β = 1.5 and 2.0 (zipf_tiny_beta)": "uncalibrated: the reference's long-lag recall is 0.341 ± 0.006 (β = "
            "1.5) and 0.470 ± 0.042 (β = 2.0); reported in README.md and table1.md, not read into a word",
    }

    settled = ""
    # once vort_settle is complete: every row at the paper's lr and at its lr chosen on the validation mean over
    # seeds (3 seeds each), the exponential's λ chosen on validation the same way; the dense layout stays pending
    def swept(report_dir: str, rows: dict[str, dict[str, Any]], calibrated: bool,
              lr: float | None = None) -> dict[str, dict[str, Any]]:
        """A settling sweep's three cells, at ``lr`` (the paper's protocol) or at each row's chosen lr."""
        kw = {"lower": False, "calibrated": calibrated, "lr": lr}
        return {"pl": swept_cell(report_dir, s, rows, ["power-law"], m, name="power-law", **kw),
                "exp": swept_cell(report_dir, s, rows, exps, m, name="exponential", **kw),
                "mix": swept_cell(report_dir, s, rows, ["mixture-5"], m, name="mixture-5", **kw)}

    dv = "vort/settle"
    vrows = settled_rows(dv, ["power-law", "mixture-5", *exps])
    if vrows is not None:
        paper, tuned = swept(dv, vrows, cal, 3e-4), swept(dv, vrows, cal)
        what_p = ("the paper's lr 3e-4 (§6 'Models compared') at 1/40 scale, β = 1; the exponential's λ (4e-3 / "
                  "4e-2 / 4e-1) chosen on the validation mean over seeds at that lr; vort_settle, 3 seeds")
        what_t = ("lr from 3e-4 / 1e-3 (an edge probed x3 or /3 with seed 0) and the exponential's λ chosen on the "
                  "validation mean over seeds; vort_settle, 3 seeds; β = 1 (the calibrated β)")
        settled = "vort_settle (src/seqmem/experiments/vort_settle.toml), our sparse layout"
        pending = ("vort_settle_dense (src/seqmem/experiments/): the same at the paper's dense anchor layout, where "
                   "its reference calibrated (vort_calibrate_dense)")

    # once vort_settle_dense is complete too: the paper's dense anchor layout (§6 'Task design') is both protocols'
    # task, read where its own reference (trained in that sweep, 3 seeds) calibrates; our sparse layout's cells are
    # reported beside them (also_reported), not read into the word
    dd = "vort/settle_dense"
    sparse: dict[str, dict[str, Any]] | None = None
    drows = settled_rows(dd, ["swa8+attention", "power-law", "mixture-5", *exps]) if vrows is not None else None
    if drows is not None:
        calib = recall_calibration(drows["swa8+attention"], "vort_settle_dense (the paper's dense layout) β = 1",
                                   "the dense-layout cells (vort_settle_dense)")
        sparse = {"paper": paper, "tuned": tuned}
        paper, tuned = swept(dd, drows, calib["calibrated"], 3e-4), swept(dd, drows, calib["calibrated"])
        what_p = ("the paper's lr 3e-4 (§6 'Models compared') and its dense anchor layout (§6 'Task design') at 1/40 "
                  "scale, β = 1; the exponential's λ (4e-3 / 4e-2 / 4e-1) chosen on the validation mean over seeds "
                  "at that lr; vort_settle_dense, 3 seeds")
        dev_p = []
        what_t = ("the paper's dense anchor layout; lr from 3e-4 / 1e-3 (an edge probed x3 or /3 with seed 0) and "
                  "the exponential's λ chosen on the validation mean over seeds; vort_settle_dense, 3 seeds; β = 1")
        settled = ("vort_settle_dense (src/seqmem/experiments/vort_settle_dense.toml), the paper's dense layout; "
                   "vort_settle (our sparse layout) reported beside it")
        pending = ""

    def claim(name: str, a: str, b: str, pa: float, pb: float) -> dict[str, Any]:
        return finish({
            "claim": name, "kind": "order", "higher_is_better": True, "metric": "long-lag recall (> 25 positions)",
            "paper": {"a": pa, "b": pb, "source": "Table 1, long lags > 1000, % (mean over β)"},
            "protocols": {
                "paper": {"what": what_p, "deviations": dev_p, "cells": {"a": paper[a], "b": paper[b]}},
                "tuned": {"what": what_t, "cells": {"a": tuned[a], "b": tuned[b]}},
            },
            **({"settled_by": settled} if settled else {}),
            **({"pending": pending} if pending else {}),
            **({"also_reported": {"our sparse layout (vort_settle; not read into the word)": {
                k: {"a": v[a], "b": v[b]} for k, v in sparse.items()}}} if sparse is not None else {}),
        })

    claims = [
        claim("power-law beats the exponential on long lags", "pl", "exp", 79.4, 52.3),
        claim("mixture-5 beats the exponential on long lags", "mix", "exp", 61.8, 52.3),
        claim("power-law beats mixture-5 on long lags", "pl", "mix", 79.4, 61.8),
    ]
    claims[0]["also_reported"] = {**lam_note, **claims[0].get("also_reported", {})}
    return {"headline_claim": claims[0]["claim"], "claims": claims, "calibration": calib}


# ---------------------------------------------------------------------------------------------------- Elastic
def elastic() -> dict[str, Any]:
    d, s, m = "elastic/sampling_small", "default", "report.loss"
    att, tpp = (report_row("elastic/calibrate_drift", x, "default") for x in ("attention", "transformer++"))
    gain = {"attention memory_gain": att["extra"]["memory_gain"]["mean"],
            "transformer++ memory_gain": tpp["extra"]["memory_gain"]["mean"],
            "attention loss_cont_q1": att["extra"]["loss_cont_q1"]["mean"],
            "transformer++ loss_cont_q1": tpp["extra"]["loss_cont_q1"]["mean"]}
    calib = calibration(
        "full attention over the whole sequence vs block-local Transformer++ (elastic_calibrate_drift, seed 0)",
        "the topic task measures memory: full attention's memory_gain (first-quarter loss of a block that starts a "
        "topic minus one that continues it) ≥ 0.5 nats and its loss_cont_q1 below Transformer++'s, Transformer++'s "
        "memory_gain within ±0.1 (no memory, no gain)", gain,
        gain["attention memory_gain"] >= 0.5 and abs(gain["transformer++ memory_gain"]) <= 0.1
        and gain["attention loss_cont_q1"] < gain["transformer++ loss_cont_q1"],
        "every cell on the topic task (elastic_sampling_small, elastic_paper_lr, elastic_settle, elastic_tuned_small)")
    cal = calib["calibrated"]
    tuned_lr = {"elastic-exp-1x": 4e-3, "elastic-uni-1x": 2e-2, "elastic-exp-4x": 4e-3, "elastic-uni-4x": 2e-2,
                "transformer++": 8e-3, "melodi": 2e-2, "memtrans-1x": 8e-3, "memtrans-4x": 2e-2, "infini": 2e-2}

    dp = "elastic/paper_lr"  # elastic_paper_lr: every model at lr 2e-3, seeds 0-2 (seed 0 reused from d)

    def p(x: str, metric: str = m) -> dict[str, Any]:
        src = dp if (ROOT / RES / dp / "runs" / s / x).is_dir() else d
        return cell(src, s, x, 2e-3, metric, label=f"{x}, lr 2e-3", calibrated=cal, fixed_lr=True)

    def t(x: str) -> dict[str, Any]:
        return cell(d, s, x, tuned_lr[x], m, label=f"{x}, lr {tuned_lr[x]:g} (chosen on validation)", calibrated=cal)

    what_p = ("the paper's lr 2e-3 for every model (§3.1, Table 9: identical hyperparameters), 2,000 steps, "
              "eps 1e-3 for exponential sampling (the paper leaves α open); elastic_paper_lr, seeds 0-2")
    what_t = ("lr chosen on validation with seed 0 from 1e-3 / 2e-3 / 4e-3, extended x2 at the upper edge twice "
              "(8e-3, then 1.6e-2 rounded to 2e-2: the runs trained at 2e-2); 3 seeds at the choice")
    settled_p = ("elastic_paper_lr (src/seqmem/experiments/elastic_paper_lr.toml): every model at the paper's lr "
                 "2e-3, seeds 0-2 (the paper's protocol)")
    pending_sampling = ("elastic_settle (src/seqmem/experiments/elastic_settle.toml: Elastic exp, eps ∈ {1e-3, "
                        "3e-2}, vs uni 1x at 8,000 steps, lrs 2e-3 … 1.6e-2 x 3 seeds, an edge extended; "
                        "memory-position loss beside the total)")
    pending_baselines = ("elastic_tuned_small (src/seqmem/experiments/elastic_tuned_small.toml: Elastic exp 1x, "
                         "Transformer++ and Melodi at 2,000 steps, lrs 2e-3 … 2e-2 x 3 seeds, an edge extended, lr "
                         "chosen on the validation mean over seeds)")

    def claim(name: str, a: str, b: str, pa: float, pb: float, tuned: dict[str, Any] | None = None,
              paper: dict[str, Any] | None = None, settled: str = "", pending: str = "") -> dict[str, Any]:
        return finish({
            "claim": name, "kind": "order", "higher_is_better": False, "metric": "test loss, nats per token",
            "settled_by": "; ".join(x for x in (settled_p if paper is None else "", settled) if x),
            "paper": {"a": pa, "b": pb, "source": "Table 2, Proof-Pile PPL (lower is better)"},
            "protocols": {"paper": paper or {"what": what_p, "cells": {"a": p(a), "b": p(b)}},
                          "tuned": tuned or {"what": what_t, "cells": {"a": t(a), "b": t(b)}}},
            "pending": pending,
        })

    # exponential vs uniform, once elastic_settle is complete: both protocols at 8,000 steps (within-block loss
    # converged), the paper's at its lr 2e-3 and the tuned one at each row's lr chosen on the validation mean over
    # seeds; the sampling's α (eps), which the paper leaves open, chosen on validation the same way
    ds, exps, lc = "elastic/settle", ["elastic-exp-1x", "elastic-exp-1x-eps3e-2"], "report.loss_cont_q1"
    srows = settled_rows(ds, exps + ["elastic-uni-1x"])
    sampling_kw: dict[str, Any] = {"pending": pending_sampling}
    if srows is not None:
        kw = {"lower": True, "calibrated": cal}
        sp = {"a": swept_cell(ds, s, srows, exps, m, name="Elastic_exp 1x", lr=2e-3, **kw),
              "b": swept_cell(ds, s, srows, ["elastic-uni-1x"], m, name="Elastic_uni 1x", lr=2e-3, **kw)}
        st = {"a": swept_cell(ds, s, srows, exps, m, name="Elastic_exp 1x", **kw),
              "b": swept_cell(ds, s, srows, ["elastic-uni-1x"], m, name="Elastic_uni 1x", **kw)}
        sampling_kw = {
            "paper": {"what": "the paper's lr 2e-3 (§3.1, Table 9), 8,000 steps (within-block loss converged); the "
                              "sampling's α (eps 1e-3 or 3e-2; the paper leaves it open) chosen on the validation "
                              "mean over seeds at that lr; elastic_settle, 3 seeds", "cells": sp},
            "tuned": {"what": "8,000 steps; lr (2e-3 … 1.6e-2, an edge extended) and eps chosen on the validation "
                              "mean over seeds; elastic_settle, 3 seeds", "cells": st},
            "settled": "elastic_settle (src/seqmem/experiments/elastic_settle.toml)", "pending": ""}
    # Elastic_exp 1x vs the baselines, once elastic_tuned_small is complete: its tuned protocol (the paper's stays
    # elastic_paper_lr's lr 2e-3 at the same 2,000 steps)
    dt, base = "elastic/tuned_small", ["elastic-exp-1x", "transformer++", "melodi"]
    trows = settled_rows(dt, base)

    def baseline_kw(b: str) -> dict[str, Any]:
        if trows is None:
            return {"pending": pending_baselines}
        kw = {"lower": True, "calibrated": cal}
        return {"tuned": {"what": "2,000 steps; lr (2e-3 … 2e-2, an edge extended) chosen on the validation mean "
                                  "over seeds; elastic_tuned_small, 3 seeds",
                          "cells": {"a": swept_cell(dt, s, trows, ["elastic-exp-1x"], m, name="Elastic_exp 1x", **kw),
                                    "b": swept_cell(dt, s, trows, [b], m, name=b, **kw)}},
                "settled": "elastic_tuned_small (src/seqmem/experiments/elastic_tuned_small.toml)"}

    claims = [
        claim("exponential memory sampling beats uniform (Elastic_exp 1x < Elastic_uni 1x)",
              "elastic-exp-1x", "elastic-uni-1x", 2.915, 2.958, **sampling_kw),
        claim("Elastic_exp 1x beats Transformer++", "elastic-exp-1x", "transformer++", 2.915, 3.322,
              **baseline_kw("transformer++")),
        claim("Elastic_exp 1x beats Melodi", "elastic-exp-1x", "melodi", 2.915, 2.940, **baseline_kw("melodi")),
        finish({
            "claim": "4x memory lowers Elastic_exp's loss (Table 3)", "kind": "order", "higher_is_better": False,
            "metric": "test loss, nats per token", "paper": {"a": 2.82, "b": 2.92, "source": "Table 3, PPL 4x vs 1x"},
            "protocols": {
                "paper": {"status": "out of reach", "why": "on the topic task only the previous block is useful "
                          "by design, so a larger memory cannot help; Table 3's long documents need the paper-scale "
                          "spec (elastic_sampling), beyond this machine"},
                "tuned": {"same_as": "paper", "why": "the same task"},
            },
        }),
    ]
    if srows is not None:
        kw = {"lower": True, "calibrated": cal}
        claims[0]["also_reported"] = {
            "memory-position loss (loss_cont_q1: first quarter of a block that continues a topic), elastic_settle, "
            "the paper's lr 2e-3": {
                "a": swept_cell(ds, s, srows, exps, lc, name="Elastic_exp 1x", lr=2e-3, **kw),
                "b": swept_cell(ds, s, srows, ["elastic-uni-1x"], lc, name="Elastic_uni 1x", lr=2e-3, **kw)},
            "memory-position loss, elastic_settle, the tuned lrs": {
                "a": swept_cell(ds, s, srows, exps, lc, name="Elastic_exp 1x", **kw),
                "b": swept_cell(ds, s, srows, ["elastic-uni-1x"], lc, name="Elastic_uni 1x", **kw)},
            "the paper's lr 2e-3 at 2,000 steps (elastic_paper_lr)": {
                x: p(x) for x in ("elastic-exp-1x", "elastic-uni-1x")},
        }
    else:
        claims[0]["also_reported"] = {}
    claims[0]["also_reported"] |= {
        "memory-position loss (loss_cont_q1: first quarter of a block that continues a topic), the paper's lr "
        "2e-3": {x: p(x, "report.loss_cont_q1") for x in ("elastic-exp-1x", "elastic-uni-1x")},
        "memory-position loss at the tuned lrs": {
            x: cell(d, s, x, tuned_lr[x], "report.loss_cont_q1", label=f"{x}, lr {tuned_lr[x]:g}", calibrated=cal)
            for x in ("elastic-exp-1x", "elastic-uni-1x")},
        "the paper's lr 2e-3, every model (test loss: mean, per seed)": {
            x: {"mean": c_["mean"], "per_seed": c_["per_seed"]} for x in tuned_lr for c_ in [p(x)]},
    }
    return {"headline_claim": claims[0]["claim"], "claims": claims, "calibration": calib}


# ---------------------------------------------------------------------------------------------------- Lattice
def lattice() -> dict[str, Any]:
    d, s, m = "lattice/context_small", "T-256", "report.bpb"
    a128, a256 = (report_row(d, "attention", f"T={n}") for n in (128, 256))
    bpb = {"attention bpb T=128": a128["extra"]["bpb"]["mean"], "attention bpb T=256": a256["extra"]["bpb"]["mean"],
           "attention bpb T=256 positions 0-63": a256["extra"]["bpb_pos_0_63"]["mean"],
           "attention bpb T=256 positions 192-255": a256["extra"]["bpb_pos_192_255"]["mean"]}
    calib = calibration(
        "Transformer++ (attention) on the byte-level code corpus, lattice_context_small, 3 seeds",
        "the task rewards context: attention's test bits per byte fall from T = 128 to T = 256, and at T = 256 its "
        "last position bucket beats its first", bpb,
        bpb["attention bpb T=256"] < bpb["attention bpb T=128"]
        and bpb["attention bpb T=256 positions 192-255"] < bpb["attention bpb T=256 positions 0-63"],
        "the T = 256 cells (lattice_context_small, lattice_matched)")
    cal = calib["calibrated"]
    lrs = {"lattice": 9e-3, "lattice_sim": 9e-3, "gated_deltanet": 9e-3, "mamba2": 9e-3, "attention": 3e-3}

    def t(x: str, note: str = "") -> dict[str, Any]:
        return cell(d, s, x, lrs[x], m, label=f"{x}{note}, lr {lrs[x]:g} (chosen on validation)", calibrated=cal)

    pending = ("lattice_matched (src/seqmem/experiments/lattice_matched.toml): the gated-delta rule (the lattice "
               "mixer's delta objective, eq. 20, with the forget gate, eq. 16) and Mamba-2's SSD rule (its ssd "
               "objective) inside Lattice's block vs Lattice-DEC, and Lattice-DEC's rule inside Gated DeltaNet's block "
               "(gated_deltanet with rule lattice) vs Gated DeltaNet, and Lattice-DEC's rule inside Mamba-2's block "
               "(mamba2 with rule lattice), T = 256, 3 seeds")
    settled = ("lattice_matched (src/seqmem/experiments/lattice_matched.toml): both update rules in Lattice's block "
               "(App. A), T = 256, lr chosen on validation, 3 seeds")
    native = {x: t(x, " (native block)") for x in ("lattice", "gated_deltanet", "mamba2")}
    matched_not_run = {"status": "not run", "why": "the paper gives every sub-quadratic model Mamba's block (App. "
                       "A); our Gated DeltaNet and Mamba-2 keep their native blocks (conv on q, k, v; gated "
                       "RMSNorm; ≈ 8 % more parameters), so the matched comparison has not been run"}
    same = {"same_as": "paper", "why": "the paper prints no lr: its protocol is the lr chosen on validation"}

    rule_name = {"gated_deltanet": "gated-delta rule", "mamba2": "Mamba-2's SSD rule"}
    rule_deviation = {
        "gated_deltanet": "the gated-delta rule as the lattice mixer's delta objective (eq. 20) with its forget gate "
                          "(eq. 16 defines only μ_t = 1 − γ_t λ_t): our gate is a sigmoid, not Gated DeltaNet's "
                          "exp-softplus form",
        "mamba2": "Mamba-2's SSD rule as the lattice mixer's ssd objective (Mamba-2's Δ and A, zero initial state): "
                  "q and k (Mamba-2's C and B) L2-normalised as the block does for every rule, no D skip (Table 1's "
                  "Mamba2 row has none)",
    }

    def matched(b: str) -> dict[str, Any]:
        """The matched-block protocol from lattice_matched's runs, where they exist."""
        row = {"gated_deltanet": "gated-delta-in-lattice-block", "mamba2": "ssd-in-lattice-block"}.get(b)
        md = "lattice/matched"
        lr_a, lr_b = (chosen_lr(md, s, x) if row else None for x in ("lattice", row or ""))
        if lr_a is None or lr_b is None:
            return dict(matched_not_run)
        return {
            "what": "both update rules in Lattice's block (App. A): lattice_matched, lr chosen on validation with "
                    "seed 0 (the paper prints none), 3 seeds at the choice",
            "deviations": [rule_deviation[b]],
            "cells": {"a": cell(md, s, "lattice", lr_a, m, label=f"Lattice-DEC, lr {lr_a:g}", calibrated=cal),
                      "b": cell(md, s, row, lr_b, m, label=f"{rule_name[b]} in Lattice's block, lr {lr_b:g}",
                                calibrated=cal)},
        }

    def reversed_block(b: str) -> dict[str, Any]:
        """Lattice-DEC's rule inside the other model's native block (lattice_matched), beside that model: a
        second table, not read into the word; nothing before its seed-0 runs finish."""
        row = {"gated_deltanet": "lattice-in-gated-deltanet-block", "mamba2": "lattice-in-mamba2-block"}[b]
        md, lr_r = "lattice/matched", chosen_lr("lattice/matched", s, row)
        if lr_r is None:
            return {}
        name = {"gated_deltanet": "Gated DeltaNet", "mamba2": "Mamba-2"}[b]
        return {f"Lattice-DEC's rule in {name}'s block vs {name} (second table, not read into the word)": {
            "a": cell(md, s, row, lr_r, m, label=f"Lattice-DEC's rule in {name}'s block, lr {lr_r:g} (chosen on "
                      "validation)", calibrated=cal),
            "b": native[b]}}

    def blocked(name: str, b: str, pb: float) -> dict[str, Any]:
        proto = matched(b)
        done = "settled_by" if "cells" in proto else "pending"  # lattice_matched's row ran: it settled the claim
        return finish({
            "claim": name, "kind": "order", "higher_is_better": False, "metric": "test bits per byte, T = 256",
            "paper": {"a": 17.90, "b": pb, "source": "Table 2, Books ppl at 1k (lower is better)"},
            "protocols": {"paper": proto, "tuned": dict(same)},
            done: settled if done == "settled_by" else pending,
            "also_reported": {"native blocks (second table, not read into the word)": {
                "a": native["lattice"], "b": native[b]}, **reversed_block(b)},
        })

    claims = [
        blocked("Lattice-DEC beats the gated-delta rule (matched block)", "gated_deltanet", 18.60),
        blocked("Lattice-DEC beats Mamba2's rule (matched block)", "mamba2", 18.90),
        finish({
            "claim": "Transformer++ is behind Lattice-DEC", "kind": "order", "higher_is_better": False,
            "metric": "test bits per byte, T = 256",
            "paper": {"a": 17.90, "b": 19.39, "source": "Table 2, Books ppl at 1k (lower is better)"},
            "protocols": {
                "paper": {"what": "Lattice in Mamba's block (App. A), Transformer++ its own; lr chosen on "
                                  "validation (the paper prints none); 3 seeds",
                          "cells": {"a": t("lattice"), "b": t("attention")}},
                "tuned": dict(same),
            },
        }),
    ]
    return {"headline_claim": claims[0]["claim"], "claims": claims, "calibration": calib}


# ---------------------------------------------------------------------------------------------------- Echo
def echo() -> dict[str, Any]:
    d, s, m = "echo/mqar_small", "M-4-gap-64", "report.accuracy"
    ref = report_row("echo/calibrate_small", "mamba2+attention", "M=4 gap=64")
    calib = calibration("Mamba-2 + attention, echo_calibrate_small, seed 0 (the paper: 100 % on every cell)",
                        "held-out accuracy ≥ 0.95 (the MQAR claims' tolerance of the paper's 100 %)",
                        {"mamba2+attention accuracy": ref["report_mean"]}, ref["report_mean"] >= 0.95,
                        "the MQAR cells at M = 4 gap 64 (Table 2's claims carry their own calibration)")
    cal = calib["calibrated"]
    what_p = ("the paper's synthetic-task peak lr 3e-4 (App. G Table 6; §5.2 does not restate it for MQAR: our "
              "choice of the paper's nearest protocol) at our scale (2 layers, d 128, 2,000 steps x 16); 3 seeds")
    dp = "echo/mqar_paper_lr"  # echo_mqar_paper_lr: the four models at lr 3e-4, seeds 0-2
    settled = ("echo_mqar_paper_lr (src/seqmem/experiments/echo_mqar_paper_lr.toml): the four models at the paper's "
               "synthetic-task lr 3e-4 (App. G Table 6), seeds 0-2, M = 4 gap 64")

    def tuned(c: dict[str, Any]) -> dict[str, Any]:
        """The tuned protocol of one cell, its "what" naming the lrs that cell's row tried."""
        lrs = " / ".join(f"{lr:.0e}".replace("e-0", "e-") for lr in c["lrs_tried_seed0"])
        return {"what": f"lr chosen on validation with seed 0 from {lrs}; 3 seeds at the choice", "cells": {"a": c}}

    transfer = json.loads((ROOT / RES / "echo/transfer_paper/transfer_seeds.json").read_text())
    t3 = {r["task"]: {k: r[k] for k in r if k.startswith("ours") or k.startswith("paper")}
          for r in transfer["rows"] if str(r.get("table")) == "3"}
    # the paper's "Mean" is over all lengths and KV counts (not the mean of its task rows): our mean over all cells
    t3_ref_mean = t3["Mean (of all cells)"]["ours SSM+Attn"].split(" (")[0]  # "mean ± std"
    t3_ref = float(t3_ref_mean.split(" ±")[0])
    # rule 3 for Table 3: the reference against the paper's 76.2, the criterion of Table 2's claims
    t3_calibrated = t3_ref >= 76.2 - 5.0
    attn = {int(r["task"].split("= ")[1]): r for r in transfer["rows"] if str(r.get("table")) == "2"}

    def table2(length: int, what: str) -> dict[str, Any]:
        """Table 2 at one length: the paper's protocol as printed (T = 64, App. G oracle mask, one operator per
        sequence, K = 2, lr 3e-4: echo_niah_paper_k2); calibrated where the same training gives the attention
        hybrid the paper's level (transfer_paper, 3 seeds)."""
        ref = attn[length]
        a_mean = sum(ref["ours SSM+Attn per seed"]) / len(ref["ours SSM+Attn per seed"])
        calibrated = a_mean >= ref["paper SSM+Attn"] - 5.0
        c = niah_cell("echo/transfer_paper_k2", length, "ssm_ska (K = 2), lr 3e-4", calibrated)
        k1 = niah_cell("echo/transfer_paper_k1", length, "ssm_ska (K = 1), lr 3e-4", calibrated)
        tuned, tuned_pending = tuned_niah("echo/transfer_tuned_k2", length, calibrated)
        pending = [tuned_pending] if tuned_pending else []
        if c["n"] < 3:
            pending.insert(0, "echo_niah_paper_k2 seeds " + ", ".join(str(x) for x in range(c["n"], 3))
                           + " (scripts/settle.sh; resumable)")
        return finish({
            "claim": f"Mamba-2 + SKA {what} (Table 2, T = {length:,})", "kind": "level",
            "higher_is_better": True, "metric": f"NIAH accuracy %, T = {length:,}", "tolerance": 5.0,
            "tolerance_source": "ours: the paper reports one run per cell with no spread; 5 points, the band of "
                                "this claim's calibration criterion",
            "paper": {"a": ref["paper SSM+SKA"], "source": f"Table 2, SSM+SKA at T = {length:,}"},
            "calibration": {"reference": "Mamba-2 + attention under the same training (transfer_paper, lr 3e-4, "
                                         "3 seeds)", "ours": round(a_mean, 3), "paper": ref["paper SSM+Attn"],
                            "criterion": "within 5 points of the paper's value or above it",
                            "calibrated": calibrated},
            "protocols": {
                "paper": {"what": "the paper's protocol as printed: trained at T = 64 on the task mixture, lr 3e-4, "
                                  "the App. G oracle action mask, one SKA operator per sequence from the masked "
                                  "tokens (App. F eq. 53; --ska-operator sequence), K = 2; echo_niah_paper_k2",
                          "cells": {"a": c}},
                "tuned": tuned,
            },
            "pending": "; ".join(pending),
            "also_reported": {
                "the same protocol with K = 1 (echo_niah_paper_k1)": k1,
                "ours, chunk-causal SKA with chunk 16, no action mask, lr 3e-4, 3 seeds (transfer_paper)":
                    {"ours SSM+SKA per seed": ref["ours SSM+SKA per seed"],
                     "ours SSM+Attn per seed": ref["ours SSM+Attn per seed"],
                     "ours SSM per seed": ref["ours SSM per seed"]},
            },
        })

    claims = [
        finish({
            "claim": "Mamba-2 + SKA (K = 2) reaches 100 % on MQAR", "settled_by": settled, "kind": "level",
            "higher_is_better": True,
            "metric": "held-out accuracy, M = 4 gap 64", "tolerance": 0.05,
            "tolerance_source": "ours: the paper states 100 % in prose with no spread; 0.05, the band of every "
                                "'solves' claim here and of the reference's calibration",
            "paper": {"a": 1.0, "source": "§5.2 (prose; 50M models fine-tuned on MQAR)"},
            "protocols": {
                "paper": {"what": what_p, "deviations": ["the paper fine-tunes 50M-parameter models (§5.2); "
                          "ours are trained from scratch at ≈ 1M parameters"],
                          "cells": {"a": cell(dp, s, "mamba2+ska", 3e-4, m, label="mamba2+ska, lr 3e-4",
                                              calibrated=cal, fixed_lr=True)}},
                "tuned": tuned(cell(d, s, "mamba2+ska", 1e-3, m, label="mamba2+ska, lr 1e-3 (chosen on validation)",
                                    calibrated=cal)),
            },
            "also_reported": {"SKA with K = 1 (ours), lr 1e-3": cell(d, s, "mamba2+ska-k1", 1e-3, m,
                                                                     label="mamba2+ska-k1", calibrated=cal),
                              "reference Mamba-2 + attention, lr 1e-3": cell(d, s, "mamba2+attention", 1e-3, m,
                                                                            label="mamba2+attention",
                                                                            calibrated=cal)},
        }),
        finish({
            "claim": "Mamba-2 alone fails MQAR (∼3 %)", "kind": "level", "higher_is_better": True,
            "settled_by": settled,
            "metric": "held-out accuracy, M = 4 gap 64", "tolerance": 0.02,
            "tolerance_source": "ours: the paper's '∼3 %' read as 1-5 % (it gives no spread)",
            "paper": {"a": 0.03, "source": "§5.2 (prose)"},
            "protocols": {
                "paper": {"what": what_p, "cells": {"a": cell(dp, s, "mamba2", 3e-4, m, label="mamba2, lr 3e-4",
                                                              calibrated=cal, fixed_lr=True)}},
                "tuned": tuned(cell(d, s, "mamba2", 1e-2, m, label="mamba2, lr 1e-2 (chosen on validation)",
                                    calibrated=cal)),
            },
        }),
        table2(64, "retrieves the needle at the training length"),
        table2(2048, "keeps NIAH retrieval at long lengths"),
        finish({
            "claim": "Mamba-2 + SKA beats Mamba-2 + attention on the transfer suite (Table 3)", "kind": "order",
            "higher_is_better": True,
            "metric": "mean accuracy % over every cell (sequence length, KV count) of Table 3's tasks",
            "paper": {"a": 81.1, "b": 76.2, "source": "Table 3 \"Mean\" row (\"mean accuracy across all sequence "
                                                      "lengths and KV counts\", its caption)"},
            "calibration": {"reference": "Mamba-2 + attention under the same training (transfer_paper, lr 3e-4, "
                                         "3 seeds), its mean over all cells", "ours": t3_ref, "paper": 76.2,
                            "criterion": "within 5 points of the paper's value or above it",
                            "calibrated": t3_calibrated},
            "protocols": {
                "paper": ({"status": "uncalibrated", "why": "the reference (Mamba-2 + attention) reaches "
                           f"{t3_ref_mean} against the paper's 76.2 at the paper's size and lr"}
                          if not t3_calibrated else
                          {"status": "not run", "why": "the reference calibrates, but the suite ran SKA chunk-causal "
                           "with chunk 16 and no action mask, not the paper's protocol"}),
                "tuned": {"status": "not run", "why": "no lr but the paper's was trained"},
            },
            "pending": "a tuned-lr transfer suite (not specified yet); the reference must calibrate first",
            "also_reported": {"ours, lr 3e-4, 3 seeds (transfer_seeds.json)": t3},
        }),
    ]
    return {"headline_claim": claims[0]["claim"], "claims": claims, "calibration": calib}


# ---------------------------------------------------------------------------------------------------- VLA
def vla() -> dict[str, Any]:
    n8, n24 = (report_row("vla/calibrate", "attention", f"n={n}")["report_mean"] for n in (8, 24))
    calib = calibration(
        "softmax attention, vla_calibrate, seed 0, lr chosen on validation",
        "the task and budget are learnable and hard where the paper says: softmax ≥ 0.95 at n = 8, and within 0.05 "
        "of the paper's 0.081 at n = 24 (Table 9)", {"attention n=8": n8, "attention n=24": n24},
        n8 >= 0.95 and abs(n24 - 0.081) <= 0.05,
        "the MQAR cells at n = 24 (the copy claims carry their own calibration)")
    cal = calib["calibrated"]
    d, s, m = "vla/capacity", "n-24", "report.accuracy"
    what_p = "the paper's lr 3e-4 at the paper's size and budget (2,000 steps x 64); 3 seeds"
    what_t = "lr chosen on validation with seed 0 from 3e-4 / 1e-3 / 3e-3; 3 seeds at the choice"
    dp = "vla/settle"  # vla_settle: VLA and softmax at n = 24 at the paper's lr 3e-4, seeds 0-2
    settled = ("vla_settle (src/seqmem/experiments/vla_settle.toml): VLA and softmax at n = 24 at the paper's lr "
               "3e-4, seeds 0-2")
    dc, mc = "vla/copy_identity", "report.accuracy"  # vla_copy_identity: both target readings, 3 seeds
    settled_c = ("vla_copy_identity (src/seqmem/experiments/vla_copy_identity.toml): VLA, the paper's DeltaNet, "
                 "eq. 3 linear attention and softmax under both target readings at lr 3e-4 and 1e-3, seeds 0-2")
    others = {"vla_paper_deltanet": "the paper's DeltaNet", "linear-attention-eq3": "eq. 3 linear attention",
              "attention": "softmax attention"}

    def copy_claim(targets: str, reading: str) -> dict[str, Any]:
        sd = f"targets-{targets}"
        # the copy task's own reference: softmax attention under the same reading, at the paper's lr
        ref = cell(dc, sd, "attention", 3e-4, mc, label="attention", calibrated=True, fixed_lr=True)
        calib_c = calibration("softmax attention under the same target reading, lr 3e-4, 3 seeds",
                              "held-out accuracy ≥ 0.95 (the copy claims' tolerance of the paper's 1.000)",
                              {"attention accuracy": ref["mean"]}, ref["mean"] >= 0.95, "this claim's cells")
        cal = calib_c["calibrated"]
        if targets == "next":
            # vla_copy's validation choices (grid 3e-4 / 1e-3 / 3e-3, extended at an edge; its runs are these,
            # reused): VLA's 1e-3 is interior; eq. 3 linear attention's seed-0 choice 9e-3 moves to 3e-3 by rule 1
            # (both have every seed: validation 0.4688 vs 0.4675 over seeds)
            tuned_dir, tuned_sd = "vla/copy", "default"
            tuned_lrs = {"vla": 1e-3, "vla_paper_deltanet": 1e-3, "linear-attention-eq3": 3e-3, "attention": 3e-4}
            tuned: dict[str, Any] = {
                "what": "lr chosen on validation with seed 0 from 3e-4 / 1e-3 / 3e-3 (vla_copy); 3 seeds at the "
                        "choice", "cells": {"a": cell(tuned_dir, tuned_sd, "vla", tuned_lrs["vla"], mc,
                                                      label=f"vla, lr {tuned_lrs['vla']:g} (chosen on validation)",
                                                      calibrated=cal)}}
        else:  # a tie at the metric's maximum: no lr can do better, so the grid's edge hides nothing
            tuned_dir, tuned_sd = dc, sd
            tie = ceiling_tie(dc, sd, ["vla", *others])  # checked from the run records, every model of the claim
            assert len(tie) > 1 and 3e-4 in tie, tie
            tuned_lrs = dict.fromkeys(others, tie[0])  # the tie at 1.000 (every lr, every seed): the first lr
            e = [f"{lr:.0e}".replace("e-0", "e-") for lr in tie]  # 3e-4, as the texts write lrs
            tuned = {"same_as": "paper", "why": f"every lr tried ({', '.join(e)}) reaches validation accuracy 1.000 "
                                                f"with every seed; the validation mean chooses the first, {e[0]}, "
                                                "the paper's"}
        return finish({
            "claim": f"VLA copies (Table 7), {reading}", "settled_by": settled_c, "kind": "level",
            "calibration": calib_c,
            "higher_is_better": True, "metric": "held-out accuracy on the copied half", "tolerance": 0.05,
            "tolerance_source": "ours: Table 7 reports one run with no spread; 0.05, the band of every 'solves' "
                                "claim here and of the reference's calibration",
            "paper": {"a": 1.0, "source": "Table 7, accuracy at step 150"},
            "protocols": {
                "paper": {"what": "the paper's lr 3e-4, T = 64, batch 32 x 1,500 steps; 3 seeds",
                          "cells": {"a": cell(dc, sd, "vla", 3e-4, mc, label="vla, lr 3e-4", calibrated=cal,
                                              fixed_lr=True)}},
                "tuned": tuned,
            },
            "also_reported": {
                **{f"{name}, lr 3e-4": cell(dc, sd, m_, 3e-4, mc, label=m_, calibrated=cal, fixed_lr=True)
                   for m_, name in others.items()},
                **{f"{name}, lr {lr_:g} (chosen on validation)": cell(tuned_dir, tuned_sd, m_, lr_, mc, label=m_,
                                                                       calibrated=cal)
                   for m_, name in others.items() for lr_ in [tuned_lrs[m_]]},
            },
        })

    claims = [
        finish({
            "claim": "VLA solves MQAR at n = 24 (Table 9)", "settled_by": settled, "kind": "level",
            "higher_is_better": True,
            "metric": "held-out accuracy, n = 24", "tolerance": 0.05,
            "tolerance_source": "ours: Table 9's ± 0.000 over 3 seeds leaves no spread to borrow; 0.05, the band "
                                "of every 'solves' claim here and of the reference's calibration",
            "paper": {"a": 1.0, "source": "Table 9, 1.000 ± 0.000"},
            "protocols": {
                "paper": {"what": what_p, "cells": {"a": cell(dp, s, "vla", 3e-4, m, label="vla, lr 3e-4",
                                                              calibrated=cal, fixed_lr=True)}},
                "tuned": {"what": what_t, "cells": {"a": cell(d, s, "vla", 1e-3, m, label="vla, lr 1e-3 (chosen "
                                                              "on validation)", calibrated=cal)}},
            },
            "also_reported": {"VLA without its readout normaliser, lr 3e-3": cell(
                d, s, "vla-no-normaliser", 3e-3, m, label="vla-no-normaliser", calibrated=cal)},
        }),
        finish({
            "claim": "softmax attention fails MQAR at n = 24 (Table 9)", "settled_by": settled, "kind": "level",
            "higher_is_better": True, "metric": "held-out accuracy, n = 24", "tolerance": 0.05,
            "tolerance_source": "ours: the same 0.05 band as the calibration criterion at n = 24 (Table 9's own "
                                "spread, ± 0.002, is narrower than ours over seeds)",
            "paper": {"a": 0.081, "source": "Table 9, 0.081 ± 0.002"},
            "protocols": {
                "paper": {"what": what_p, "cells": {"a": cell(dp, s, "attention", 3e-4, m,
                                                              label="attention, lr 3e-4", calibrated=cal,
                                                              fixed_lr=True)}},
                "tuned": {"what": what_t, "cells": {"a": cell(d, s, "attention", 1e-3, m, label="attention, lr "
                                                              "1e-3 (chosen on validation)", calibrated=cal)}},
            },
        }),
        copy_claim("next", "next-token targets (our reading)"),
        copy_claim("identity", "identity targets (the copied half's own input tokens)"),
    ]
    return {"headline_claim": claims[0]["claim"], "claims": claims, "calibration": calib}


def _fmt(c: dict[str, Any] | None) -> str:
    if not c:
        return "—"
    if c["n"] == 1:
        return f"{c['mean']:.3f} (1 seed)"
    return (f"{c['mean']:.3f} ± {c['std']:.3f} ({c['n']})" + (" *edge lr*" if c.get("lr_at_edge") else "")
            + (" *lr unsettled*" if c.get("lr_unsettled") else ""))


def markdown(rule: dict[str, Any]) -> str:
    """The rule block as a README table: each claim, both protocols' cells and outcomes, the word."""
    lines = [BEGIN, "", f"**The rule's word ([docs/results/README.md](../README.md)): {rule['word']}** "
             f"(headline claim: {rule['headline_claim']}). Mean ± std (seeds) per cell; A / B as in the claim; "
             "generated by `scripts/verdict_rules.py` from the committed run records.", "",
             "| claim | paper | paper's protocol: A / B → outcome | tuned protocol: A / B → outcome | word | pending |",
             "|---|---|---|---|---|---|"]
    for c in rule["claims"]:
        cols = []
        for name in ("paper", "tuned"):
            p = c["protocols"][name]
            if "same_as" in p:
                cols.append(f"= {p['same_as']}'s ({p.get('why', '')})")
                continue
            cells = p.get("cells") or {}
            if not cells:
                cols.append(f"{c['outcomes'][name]}: {p.get('why', '')}")
                continue
            ab = " / ".join(_fmt(cells.get(k)) for k in ("a", "b") if k in cells)
            cols.append(f"{ab} → {c['outcomes'][name]}")
        pv = c["paper"]
        paper = f"{pv['a']} / {pv['b']}" if "b" in pv else f"{pv['a']} (± {c.get('tolerance')})"
        lines.append(f"| {c['claim']} | {paper} | {cols[0]} | {cols[1]} | **{c['word']}** | "
                     f"{c.get('pending', '') or ''} |")
    return "\n".join([*lines, "", END])


BEGIN, END = "<!-- verdict-rule:begin (scripts/verdict_rules.py) -->", "<!-- verdict-rule:end -->"


def readme_with_table(text: str, rule: dict[str, Any]) -> str:
    i, j = text.find(BEGIN), text.find(END)
    if i < 0 or j < 0:
        raise SystemExit("README has no verdict-rule markers")
    return text[:i] + markdown(rule) + text[j + len(END):]


PAPERS = {"vort": vort, "elastic": elastic, "lattice": lattice, "echo": echo, "vla": vla}


def build(paper: str) -> dict[str, Any]:
    body = PAPERS[paper]()
    head = next(c for c in body["claims"] if c["claim"] == body["headline_claim"])
    return {"text": "docs/results/README.md (the rule)", "word": head["word"], **body}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("papers", nargs="*", default=list(PAPERS))
    args = ap.parse_args(argv)
    stale = []
    for paper in args.papers:
        path = ROOT / RES / paper / "headline.json"
        data = json.loads(path.read_text())
        rule = json.loads(json.dumps(build(paper)))
        readme = ROOT / RES / paper / "README.md"
        text = readme.read_text()
        new_text = readme_with_table(text, rule)
        if data.get("rule") != rule or new_text != text:
            stale.append(paper)
            if not args.check:
                data["rule"] = rule
                path.write_text(json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n")
                readme.write_text(new_text)
    for p in stale:
        print(("stale: " if args.check else "rewrote: ") + p)
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
