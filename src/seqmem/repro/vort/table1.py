"""VORT Table 1 as the paper reports it — accuracy per lag bin averaged over the Zipf exponents β — from the sweep
reports of the learned-model headline (``vort_zipf_tiny`` for β = 1, ``vort_zipf_tiny_beta`` for β = 1.5 and 2).

The paper's Table 1 gives one number per (kernel, lag bin): the mean over β = 1, 1.5, 2.  Ours is built the same way
from each β's pooled per-bin accuracy at the row's chosen lr: for seed index s, the mean over β of the seed-s runs
(different runs per β, paired by seed index), then mean ± sample std over the seed indices.  A tune group's chosen
row (the exponential, whose λ is chosen on validation) is reported under the group's name, at every β.

    python -m seqmem.repro.vort.table1 REPORT.json [REPORT.json ...] --out DIR     (writes table1.md / table1.json)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

from seqmem.io import atomic_write_text, mean_std
from seqmem.repro.vort.paper import PAPER_T1

BINS = ("short", "medium", "long")
BETAS = (1.0, 1.5, 2.0)
#: our row names -> the paper's Table 1 rows (attention is our reference; the paper has none)
PAPER_ROWS = {"power-law": "PL", "exponential": "Exp", "mixture-5": "Mix-5"}


def _beta(setting: str) -> float:
    if not setting.startswith("beta="):
        raise ValueError(f"setting {setting!r} is not a Zipf exponent (beta=...)")
    return float(setting.split("=", 1)[1])


def collect(reports: list[dict[str, Any]]) -> dict[str, dict[float, dict[str, list[float]]]]:
    """``{row: {β: {bin: per-seed accuracies}}}`` over the complete rows of the reports (sweep ``report.json``
    payloads).  Rows of a tune group appear once, under the group's name, as the group's chosen row; a row at a β is
    left out until all its seeds have finished."""
    alias: dict[str, str] = {}
    for rep in reports:
        for r in rep["rows"]:
            if r.get("tune") and r.get("tune_chosen"):
                alias[r["mixer"]] = r["tune"]
    out: dict[str, dict[float, dict[str, list[float]]]] = {}
    for rep in reports:
        for r in rep["rows"]:
            if r.get("tune") and not r.get("tune_chosen"):
                continue
            if not r.get("complete"):
                continue
            name = alias.get(r["mixer"], r.get("tune") or r["mixer"])
            per_bin = {}
            for b in BINS:
                cell = (r.get("extra") or {}).get(f"hits_{b}/queries_{b}")
                if not cell:
                    raise ValueError(f"report row {r['mixer']} ({r['setting']}) has no pooled accuracy for the {b} "
                                     "lag bin: the spec needs extra_metrics = hits_<bin>/queries_<bin>")
                per_bin[b] = [float(v) for v in cell["per_seed"]]
            beta = _beta(r["setting"])
            if beta in out.get(name, {}):
                raise ValueError(f"row {name} at β = {beta} appears in two reports")
            out.setdefault(name, {})[beta] = per_bin
    return out


def _stats(xs: list[float]) -> tuple[float, float | None]:
    """:func:`seqmem.io.mean_std`, with ``None`` for the std of one value (JSON has no NaN)."""
    m, sd = mean_std(xs)
    return m, (None if math.isnan(sd) else sd)


def table(data: dict[str, dict[float, dict[str, list[float]]]]) -> list[dict[str, Any]]:
    """One entry per row: per β and bin mean ± std over seeds, and — once every β of the paper is there — the
    mean over β per bin with its per-seed-index values (see the module docstring)."""
    rows = []
    for name, by_beta in data.items():
        entry: dict[str, Any] = {"row": name, "betas": sorted(by_beta), "per_beta": {}}
        for beta in sorted(by_beta):
            entry["per_beta"][str(beta)] = {b: dict(zip(("mean", "std"), _stats(by_beta[beta][b])))
                                            for b in BINS}
        complete = all(beta in by_beta for beta in BETAS)
        entry["complete"] = complete
        if complete:
            n = min(len(by_beta[beta][b]) for beta in BETAS for b in BINS)
            over = {}
            for b in BINS:
                per_seed = [statistics.fmean(by_beta[beta][b][s] for beta in BETAS) for s in range(n)]
                m, sd = _stats(per_seed)
                over[b] = {"mean": m, "std": sd, "per_seed": per_seed}
            entry["mean_over_beta"] = over
        paper = PAPER_T1.get(PAPER_ROWS.get(name, ""))
        entry["paper"] = dict(zip(BINS, paper)) if paper else None
        rows.append(entry)
    return rows


def markdown(rows: list[dict[str, Any]], sources: list[str]) -> str:
    def pct(m: float, s: float | None) -> str:
        return f"{100 * m:.1f} ± {100 * s:.1f}" if s is not None else f"{100 * m:.1f}"

    lines = ["# VORT Table 1: accuracy % per lag bin (short / medium / long), learned models at 1/40 scale", "",
             "Ours: pooled test accuracy per lag bin at each row's chosen lr, mean ± std over 3 seeds; *mean over β* "
             "pairs the runs by seed index (see `seqmem.repro.vort.table1`). The paper's numbers are transcribed "
             "(Table 1, mean over β = 1, 1.5, 2 at n = 10,000); they are not ours.", "",
             "| row | " + " | ".join(f"β = {b:g}" for b in BETAS) + " | mean over β (ours) | paper (mean over β) |",
             "|---|" + "---|" * (len(BETAS) + 2)]
    for r in rows:
        cells = []
        for beta in BETAS:
            pb = r["per_beta"].get(str(beta))
            cells.append(" / ".join(pct(pb[b]["mean"], pb[b]["std"]) for b in BINS) if pb else "not run yet")
        over = r.get("mean_over_beta")
        ours = " / ".join(pct(over[b]["mean"], over[b]["std"]) for b in BINS) if over else "— (not every β yet)"
        paper = " / ".join(f"{r['paper'][b]:.1f}" for b in BINS) if r["paper"] else "— (no such row)"
        lines.append(f"| {r['row']} | " + " | ".join(cells) + f" | {ours} | {paper} |")
    lines += ["", "Sources: " + ", ".join(f"`{s}`" for s in sources), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="VORT Table 1 (mean over β) from sweep reports")
    ap.add_argument("reports", type=Path, nargs="+", help="report.json of vort_zipf_tiny / vort_zipf_tiny_beta")
    ap.add_argument("--out", type=Path, required=True, help="directory for table1.md and table1.json")
    a = ap.parse_args(argv)
    try:
        reps = [json.loads(p.read_text()) for p in a.reports]
    except (OSError, ValueError) as e:
        ap.error(f"cannot read a report: {e}")
    rows = table(collect(reps))
    a.out.mkdir(parents=True, exist_ok=True)
    sources = [str(p) for p in a.reports]
    atomic_write_text(a.out / "table1.json", json.dumps({"sources": sources, "rows": rows}, indent=2,
                                                        allow_nan=False) + "\n")
    atomic_write_text(a.out / "table1.md", markdown(rows, sources))
    print(f"wrote {a.out / 'table1.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
