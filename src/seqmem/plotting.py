"""``seqmem plot RUN [RUN ...]``: PNG curves of training runs from their ``metrics.jsonl``.

Writes ``loss.png`` (train loss per logged step, eval loss as markers), ``accuracy.png`` (train and eval accuracy)
and, when the evaluation reports per-position metrics (``eval_<metric>_pos_<lo>_<hi>``, e.g. the ``lm`` task's
``bpb_pos_*`` or the ``text`` task's ``loss_pos_*``), ``loss_by_position.png`` from the last evaluation — one line
per run, so several runs are compared on the same axes.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from seqmem.io import read_jsonl
from seqmem.repro.common import save_figure

__all__ = ["add_parser", "plot_runs", "read_metrics"]

_POS = re.compile(r"^eval_(.+)_pos_(\d+)_(\d+)$")


def read_metrics(run: str | Path) -> list[dict[str, Any]]:
    """Rows of ``run/metrics.jsonl`` (a torn last line is ignored)."""
    path = Path(run) / "metrics.jsonl"
    if not path.is_file():
        raise ValueError(f"{run} is not a training run directory (no metrics.jsonl)")
    rows = read_jsonl(path)
    if not rows:
        raise ValueError(f"{path} has no metrics yet")
    return rows


def _series(rows: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), int | float) and r[key] == r[key]]
    return [p[0] for p in pts], [float(p[1]) for p in pts]


def plot_runs(runs: list[str | Path], out: str | Path | None = None) -> list[Path]:
    """Draw the curves of ``runs`` into ``out`` (default ``<first run>/plots``); returns the PNG paths."""
    from seqmem.io import pyplot

    plt = pyplot()

    if not runs:
        raise ValueError("give at least one run directory")
    data = {str(r): read_metrics(r) for r in runs}
    label = {k: Path(k).name or k for k in data}
    out = Path(out) if out is not None else Path(runs[0]) / "plots"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot write plots to {out}: {e.strerror or e}") from None
    written: list[Path] = []
    for metric, fname, ylabel in (("loss", "loss.png", "loss (nats/token)"), ("accuracy", "accuracy.png", "accuracy")):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        drawn = False
        for k, rows in data.items():
            s, v = _series(rows, metric)
            if s:
                (line,) = ax.plot(s, v, lw=1.2, label=f"{label[k]} train")
                drawn = True
                color = line.get_color()
            else:
                color = None
            s, v = _series(rows, f"eval_{metric}")
            if s:
                ax.plot(s, v, "o--", color=color, ms=4, lw=0.8, label=f"{label[k]} eval")
                drawn = True
        if not drawn:
            plt.close(fig)
            continue
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        if metric == "loss":
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        save_figure(fig, out / fname, dpi=120)
        plt.close(fig)
        written.append(out / fname)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    names = set()
    for k, rows in data.items():
        last = next((r for r in reversed(rows) if any(_POS.match(x) for x in r)), None)
        if last is None:
            continue
        pts: dict[str, list[tuple[float, float]]] = {}
        for key, v in last.items():
            m = _POS.match(key)
            if m and isinstance(v, int | float):
                pts.setdefault(m.group(1), []).append(((int(m.group(2)) + int(m.group(3))) / 2, float(v)))
        for name, p in pts.items():
            p.sort()
            ax.plot([x for x, _ in p], [y for _, y in p], "o-", ms=3, label=f"{label[k]} {name} (step {last['step']})")
            names.add(name)
    if names:
        ax.set_xlabel("position in the context (bucket centre)")
        ax.set_ylabel(" / ".join(sorted(names)))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        save_figure(fig, out / "loss_by_position.png", dpi=120)
        written.append(out / "loss_by_position.png")
    plt.close(fig)
    return written


def cmd_plot(args: argparse.Namespace) -> int:
    for p in plot_runs(args.runs, args.out):
        print(p)
    return 0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("plot", help="PNG curves (loss, accuracy, loss by position) of one or more training runs")
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="run directory (with metrics.jsonl)")
    from seqmem.cliargs import out_path as _out_path

    p.add_argument("--out", type=_out_path, default=None, help="output directory (default FIRST_RUN/plots)")
    p.set_defaults(func=cmd_plot)
