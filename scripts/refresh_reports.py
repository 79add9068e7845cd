"""Rewrite every sweep report that a paper's ``headline.json`` records, and its ``ours`` entry, from the run
records on disk — run before committing results, so the committed reports and headline files say what the
committed runs give (``tests/repro/test_headline_records.py`` checks it).

    python scripts/refresh_reports.py [--check] [HEADLINE.json ...]     (default: docs/results/*/headline.json)

For every ``ours[<spec>]`` entry: ``seqmem sweep <spec> --out <report dir>/runs --report --report-dir <report dir>
--headline <file>`` (no training; the report keeps the command that ran the sweep), then the tables derived from
those reports (VORT's Table 1 over β, ``docs/results/vort/table1.md``).  ``--check`` writes nothing
and exits 1, listing them, when any entry differs from what its runs give.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def stale_entries(headline: Path) -> list[str]:
    """The spec names of ``headline``'s ``ours`` entries that differ from what their runs on disk give."""
    from seqmem.sweep import load_spec
    from seqmem.sweep.report import headline_summary, report_payload

    data = json.loads(headline.read_text())
    stale = []
    for name, entry in (data.get("ours") or {}).items():
        report_dir = Path(entry["report"]).parent
        spec = load_spec(name)
        payload = report_payload(spec, report_dir / "runs")
        if json.loads(json.dumps(headline_summary(spec, payload, report_dir))) != entry:
            stale.append(name)
    return stale


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("headlines", nargs="*", type=Path)
    ap.add_argument("--check", action="store_true", help="only list the stale entries (exit 1 if any)")
    args = ap.parse_args(argv)
    files = args.headlines or sorted(Path("docs/results").glob("*/headline.json"))
    if args.check:
        stale = [f"{f}: {name}" for f in files for name in stale_entries(f)]
        for s in stale:
            print(f"stale: {s}")
        return 1 if stale else 0
    from seqmem.cli import main as seqmem_main

    for f in files:
        for name, entry in (json.loads(f.read_text()).get("ours") or {}).items():
            report_dir = Path(entry["report"]).parent
            rc = seqmem_main(["sweep", name, "--out", str(report_dir / "runs"), "--report", "--report-dir",
                              str(report_dir), "--headline", str(f)])
            if rc:  # (a report whose runs did not change is kept as it is: see seqmem.sweep.report)
                return rc
    # derived tables built from those reports
    vort = [Path("docs/results/vort") / d / "report.json" for d in ("zipf_tiny", "zipf_tiny_beta")]
    if all(p.is_file() for p in vort):
        from seqmem.repro.vort.table1 import main as vort_table1

        rc = vort_table1([*map(str, vort), "--out", "docs/results/vort",
                          "--headline", "docs/results/vort/headline.json"])
        if rc:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
