"""VORT Table 1 as the paper reports it — accuracy per lag bin averaged over the Zipf exponents β — from the sweep
reports of the learned-model headline (``vort_zipf_tiny`` for β = 1, ``vort_zipf_tiny_beta`` for β = 1.5 and 2).

The paper's Table 1 gives one number per (kernel, lag bin): the mean over β = 1, 1.5, 2.  Ours is built the same way
from each β's pooled per-bin accuracy at the row's chosen lr: for seed index s, the mean over β of the seed-s runs
(different runs per β, paired by seed index), then mean ± sample std over the seed indices.  A tune group's chosen
row (the exponential, whose λ is chosen on validation) is reported under the group's name, at every β.

The paper's claims are gaps between rows (power-law over the exponential by 27 points on long lags, the mixture of
five exponentials between them), so the gaps are computed too, paired: runs with the same β and seed index train on
the same data stream, so their difference removes the stream's share of the seed spread (:func:`gaps`).

    python -m seqmem.repro.vort.table1 REPORT.json [REPORT.json ...] --out DIR [--headline HEADLINE.json]
        (writes table1.md / table1.json; with --headline also its ``table1_over_beta`` entry)
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


#: the paper's comparisons (row a minus row b), each as its Table 1 states it
GAPS = (("power-law", "exponential"), ("mixture-5", "exponential"), ("power-law", "mixture-5"))


def gaps(data: dict[str, dict[float, dict[str, list[float]]]]) -> list[dict[str, Any]]:
    """Row a minus row b per bin, paired by β and seed index, for each pair of :data:`GAPS` whose rows are both
    there: per β the per-seed differences and their mean ± std; ``pairs``, every (β, seed) difference pooled, with
    mean ± std, their number and how many are positive; once both rows have every β, ``mean_over_beta``: the
    difference of the two rows' means over β per seed index (what the paper's gap compares with).  ``paper``: the
    paper's Table 1 gap in points (it reports no spread)."""
    out = []
    for a, b in GAPS:
        if a not in data or b not in data:
            continue
        betas = [beta for beta in sorted(data[a]) if beta in data[b]]
        if not betas:
            continue
        entry: dict[str, Any] = {"a": a, "b": b, "betas": betas, "per_beta": {}, "pairs": {}}
        for bin_ in BINS:
            pooled = []
            for beta in betas:
                xa, xb = data[a][beta][bin_], data[b][beta][bin_]
                n = min(len(xa), len(xb))
                diff = [xa[s] - xb[s] for s in range(n)]
                pooled += diff
                m, sd = _stats(diff)
                entry["per_beta"].setdefault(str(beta), {})[bin_] = {"mean": m, "std": sd, "per_seed": diff}
            m, sd = _stats(pooled)
            entry["pairs"][bin_] = {"mean": m, "std": sd, "n": len(pooled), "positive": sum(d > 0 for d in pooled)}
        if all(beta in data[a] and beta in data[b] for beta in BETAS):
            over = {}
            for bin_ in BINS:
                n = min(len(data[r][beta][bin_]) for r in (a, b) for beta in BETAS)
                per_seed = [statistics.fmean(data[a][beta][bin_][s] - data[b][beta][bin_][s] for beta in BETAS)
                            for s in range(n)]
                m, sd = _stats(per_seed)
                over[bin_] = {"mean": m, "std": sd, "per_seed": per_seed}
            entry["mean_over_beta"] = over
        pa, pb = PAPER_T1.get(PAPER_ROWS.get(a, "")), PAPER_T1.get(PAPER_ROWS.get(b, ""))
        entry["paper"] = {bin_: round(x - y, 1) for bin_, x, y in zip(BINS, pa, pb)} if pa and pb else None
        out.append(entry)
    return out


def markdown(rows: list[dict[str, Any]], sources: list[str], gap_rows: list[dict[str, Any]] | None = None) -> str:
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
    if gap_rows:
        def signed(x: float) -> str:  # points with a sign, a true minus
            return f"{x:+.1f}".replace("-", "−")

        def pts(d: dict[str, Any]) -> str:
            m = signed(100 * d["mean"])
            return f"{m} ± {100 * d['std']:.1f}" if d["std"] is not None else m

        lines += ["", "## The paper's gaps on long lags, paired by seed (points)", "",
                  "Row a minus row b on the long-lag bin, by β and seed index (the same data stream): mean ± std "
                  "over seeds per β; *pooled*: every (β, seed) pair, with how many favour a; *mean over β*: the "
                  "difference of the two rows' means over β, per seed index — what the paper's gap compares with. "
                  "Every bin is in `table1.json`.", "",
                  "| a − b | " + " | ".join(f"β = {b:g}" for b in BETAS)
                  + " | pooled (pairs with a > b) | mean over β (ours) | paper |",
                  "|---|" + "---|" * (len(BETAS) + 3)]
        for g in gap_rows:
            cells = [pts(g["per_beta"][str(beta)]["long"]) if str(beta) in g["per_beta"] else "—" for beta in BETAS]
            pl = g["pairs"]["long"]
            over = g.get("mean_over_beta")
            lines.append(f"| {g['a']} − {g['b']} | " + " | ".join(cells)
                         + f" | {pts(pl)} ({pl['positive']} of {pl['n']}) | "
                         + (pts(over["long"]) if over else "— (not every β yet)") + " | "
                         + (signed(g["paper"]["long"]) if g["paper"] else "—") + " |")
    lines += ["", "Sources: " + ", ".join(f"`{s}`" for s in sources), ""]
    return "\n".join(lines)


def headline_entry(rows: list[dict[str, Any]], gap_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What ``headline.json`` records as ``table1_over_beta`` (JSON-normalised: what reading the file back gives)."""
    return json.loads(json.dumps({"report": "table1.md", "rows": rows, "gaps": gap_rows}, allow_nan=False))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="VORT Table 1 (mean over β) from sweep reports")
    ap.add_argument("reports", type=Path, nargs="+", help="report.json of vort_zipf_tiny / vort_zipf_tiny_beta")
    ap.add_argument("--out", type=Path, required=True, help="directory for table1.md and table1.json")
    ap.add_argument("--headline", type=Path, help="a paper's headline.json: record the table there too "
                    "(table1_over_beta; the rest of the file is kept)")
    a = ap.parse_args(argv)
    headline = None
    if a.headline is not None:
        try:
            headline = json.loads(a.headline.read_text())
        except (OSError, ValueError) as e:
            ap.error(f"cannot read {a.headline}: {e}")
        if not isinstance(headline, dict):
            ap.error(f"{a.headline}: a headline file holds a JSON object")
    try:
        reps = [json.loads(p.read_text()) for p in a.reports]
    except (OSError, ValueError) as e:
        ap.error(f"cannot read a report: {e}")
    data = collect(reps)
    rows, gap_rows = table(data), gaps(data)
    a.out.mkdir(parents=True, exist_ok=True)
    sources = [str(p) for p in a.reports]
    atomic_write_text(a.out / "table1.json", json.dumps({"sources": sources, "rows": rows, "gaps": gap_rows},
                                                        indent=2, allow_nan=False) + "\n")
    atomic_write_text(a.out / "table1.md", markdown(rows, sources, gap_rows))
    if headline is not None:
        headline["table1_over_beta"] = headline_entry(rows, gap_rows)
        atomic_write_text(a.headline, json.dumps(headline, indent=2, ensure_ascii=False, allow_nan=False) + "\n")
    print(f"wrote {a.out / 'table1.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
