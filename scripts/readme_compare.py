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


def table_block(report: str) -> str:
    """The status line and summary table for the README, from the report's text."""
    m = re.search(r"## Summary:.*?\n\n(\| mixer.*?)\n\n", report, re.S)
    runs = re.search(r"Runs finished: (\d+)/(\d+); training time of .*?: ([\d.]+) CPU-hours", report)
    if m is None or runs is None:
        raise ValueError("the report has no summary table or no 'Runs finished' line")
    done, total, cpuh = runs.groups()
    if done == total:
        status = f"**Status: complete — {total} runs ({cpuh} CPU-hours).**"
    else:
        status = (f"**Status: campaign in progress — {done} of {total} runs finished ({cpuh} CPU-hours so far); `*` "
                  "marks a cell that is not final, `—` one not run yet.** Re-run `make compare` to continue it.")
    return f"{status}\n\n{m.group(1)}"


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
