"""Refresh the comparison table in README.md from the sweep report (``docs/results/compare/report.md``).

Only the text between the two markers ``<!-- compare-table:begin -->`` and ``<!-- compare-table:end -->`` is
replaced: the status line and the summary table.  Missing or repeated markers, or a report without its summary
table, stop the script with exit code 2 and leave README.md untouched (the README is written atomically).

    python scripts/readme_compare.py [--readme README.md] [--report docs/results/compare/report.md]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from seqmem.io import atomic_write_text

BEGIN, END = "<!-- compare-table:begin -->", "<!-- compare-table:end -->"


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def edge_cells(report: str) -> set[tuple[str, str]]:
    """``(mixer cell, summary column)`` of every row whose chosen learning rate the report marks '(edge)' (at the
    edge of the grid), from the per-setting tables: a setting's section ``## LABEL (...)`` and its table's axis
    columns between ``mixer`` and ``state`` give the summary's column label (``LABEL, d_model 64``)."""
    edges: set[tuple[str, str]] = set()
    lines = report.splitlines()
    label = None
    for i, line in enumerate(lines):
        if line.startswith("## "):
            label = None if line.startswith("## Summary") else line[3:].split(" (")[0]
            continue
        if label is None or not line.startswith("| mixer"):
            continue
        head = _cells(line)
        if "state" not in head or "lr*" not in head:
            continue
        axes = head[1:head.index("state")]
        for row_line in lines[i + 2:]:
            if not row_line.startswith("|"):
                break
            row = dict(zip(head, _cells(row_line)))
            if "(edge)" in row.get("lr*", ""):
                col = f"{label}, " + ", ".join(f"{a} {row[a]}" for a in axes) if axes else label
                edges.add((row["mixer"], col))
        label = None
    return edges


def _edge_mark(cell: str) -> str:
    """``'0.50 ± 0.10 (3)*'`` -> ``'0.50 ± 0.10 (3, edge lr)*'``, the summary's own marker (reports written before
    the summary carried it); a cell that has it is kept."""
    if "edge lr" in cell or cell == "—":
        return cell
    i = cell.rfind(")")
    return cell[:i] + ", edge lr" + cell[i:] if i >= 0 else cell + " (edge lr)"


def mark_edges(table: str, edges: set[tuple[str, str]]) -> str:
    """The summary table with 'edge lr' in each cell whose row's chosen learning rate is at the grid's edge."""
    lines = table.splitlines()
    head = _cells(lines[0])
    out = lines[:2]
    for line in lines[2:]:
        cells = _cells(line)
        cells = [_edge_mark(c) if (cells[0], col) in edges else c for col, c in zip(head, cells)]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def table_block(report: str) -> str:
    """The status line and summary table for the README, from the report's text: the cells whose chosen learning
    rate the report marks '(edge)' carry 'edge lr', and the training time is worded as the report's
    'Runs finished' line words it."""
    m = re.search(r"## Summary:.*?\n\n(\| mixer.*?)\n\n", report, re.S)
    runs = re.search(r"^Runs finished: (\d+)/(\d+); training time of (.+?): ([\d.]+) CPU-hours(.*)$", report, re.M)
    if m is None or runs is None:
        raise ValueError("the report has no summary table or no 'Runs finished' line")
    done, total, of, cpuh, rest = runs.groups()
    basis = rest.split(". Machine:")[0].strip().rstrip(".")
    hours = f"training time of {of}: {cpuh} CPU-hours" + (f" {basis}" if basis else "")
    edges = edge_cells(report)
    table = mark_edges(m.group(1), edges)
    legend = (" `edge lr`: the chosen learning rate, or one tied with it on validation, is the largest or smallest "
              "tried.") if "edge lr" in table else ""
    if done == total:
        status = f"**Status: complete — {total} runs; {hours}.**{legend}"
    else:
        status = (f"**Status: campaign in progress — {done} of {total} runs finished; {hours} so far; `*` marks a "
                  f"cell that is not final, `—` one not run yet.**{legend} Re-run `make compare` to continue it.")
    return f"{status}\n\n{table}"


def replace_between_markers(readme: str, block: str) -> str:
    if readme.count(BEGIN) != 1 or readme.count(END) != 1 or readme.index(BEGIN) > readme.index(END):
        raise ValueError(f"README must contain {BEGIN} once, followed by {END} once")
    head, rest = readme.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{block}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--readme", type=Path, default=Path("README.md"))
    p.add_argument("--report", type=Path, default=Path("docs/results/compare/report.md"))
    a = p.parse_args(argv)
    try:
        new = replace_between_markers(a.readme.read_text(), table_block(a.report.read_text()))
    except (OSError, ValueError) as e:
        print(f"readme_compare: {e}", file=sys.stderr)
        return 2
    atomic_write_text(a.readme, new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
