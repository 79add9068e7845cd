"""What the VLA tables share: the scale note and the figure of labelled curves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from seqmem.repro.common import figure


def scale_note(scale: str, cfg: dict[str, Any], extra: str = "") -> str:
    """The scale line of a table: model width, heads, batch, seeds, evaluation size (and ``extra``)."""
    return (f"{scale}: d={cfg['d_model']}, H={cfg['n_heads']}, batch {cfg['batch']}, seeds {cfg['seeds']}, "
            f"eval {cfg['eval_examples']} examples" + (f"; {extra}" if extra else ""))


def plot(path: Path, draw, xlabel: str, ylabel: str, *, title: str | None = None, logx: bool = False,
         logy: bool = False, legend_size: int = 7) -> None:
    """A 6×4 figure: ``draw(ax)`` plots the labelled curves, then the axes get their labels, scales and legend."""
    with figure(path, figsize=(6, 4), dpi=110) as (_fig, ax):
        draw(ax)
        if logx:
            ax.set_xscale("log")
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if title:
            ax.set_title(title)
        ax.legend(fontsize=legend_size)
