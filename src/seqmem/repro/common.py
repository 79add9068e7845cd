"""Helpers shared by the reproductions: tables with the paper's number beside ours, JSON, plots, run records."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqmem.io import atomic_write_bytes, atomic_write_text, fmt, machine_info, mean_std, save_figure, table_lines
from seqmem.repro.verdict import verdict_word

__all__ = [
    "atomic_write_bytes",
    "atomic_write_text",
    "Fit",
    "figure",
    "fit_lm",
    "fmt",
    "machine_info",
    "markdown_table",
    "mean_std",
    "save_figure",
    "torch_threads",
    "verdict_word",
    "write_json",
    "write_results",
]


@dataclass
class Fit:
    """What :func:`fit_lm` returns: the trained model, the trainer's result (``None`` when the run diverged and
    ``keep_diverged`` was set), the training wall time and the divergence message."""

    model: Any
    result: Any
    seconds: float
    diverged: str | None = None


def fit_lm(lm_config: Any, task: Any, train_config: Any, *, seed: int, device: Any = None,
           keep_diverged: bool = False, out_dir: str | Path | None = None) -> Fit:
    """Train one language model the way every reproduction does: seed torch with ``seed``, build
    :class:`seqmem.models.LanguageModel` from ``lm_config`` (moved to ``device`` when given), train it on ``task``
    with :func:`seqmem.train.train` and time it.  A diverged run (``FloatingPointError``) raises unless
    ``keep_diverged``, in which case it is returned with ``result=None`` and the message in ``diverged``.

    ``out_dir``: the run's directory (metrics and checkpoints, every ``train_config.checkpoint_every`` steps); a
    run cut off earlier continues from its newest good checkpoint there, exactly as if it had not stopped.
    ``seconds`` is then this process's part."""
    import torch

    from seqmem.models import LanguageModel
    from seqmem.train import train
    from seqmem.train.checkpoint import latest_good_checkpoint

    torch.manual_seed(seed)
    model = LanguageModel(lm_config)
    if device is not None:
        model = model.to(device)
    t0 = time.perf_counter()
    try:
        resume = out_dir is not None and latest_good_checkpoint(Path(out_dir) / "checkpoints") is not None
        result = train(model, task, train_config, out_dir=out_dir, resume=resume)
    except FloatingPointError as e:
        if not keep_diverged:
            raise
        return Fit(model, None, time.perf_counter() - t0, str(e))
    return Fit(model, result, time.perf_counter() - t0)


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` (at least 1) torch intra-op threads, then restore the previous count."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(max(1, int(n)))
    try:
        yield
    finally:
        torch.set_num_threads(old)


@contextmanager
def figure(path: Path | str, *, figsize: tuple[float, float], dpi: int = 120, nrows: int = 1,
           ncols: int = 1) -> Iterator[tuple[Any, Any]]:
    """A matplotlib figure (Agg backend) for the block to draw on: yields ``(fig, ax)`` (``ax`` an array of axes
    when ``nrows`` or ``ncols`` exceeds 1); after the block the figure is laid out tightly, saved as PNG at
    ``path`` (:func:`save_figure`) and closed.  When the block raises, the figure is closed and nothing is
    written."""
    from seqmem.io import pyplot

    plt = pyplot()

    fig, ax = plt.subplots(nrows, ncols, figsize=figsize)
    try:
        yield fig, ax
        fig.tight_layout()
        save_figure(fig, path, dpi=dpi)
    finally:
        plt.close(fig)


def write_json(path: Path | str, payload: Any, *, indent: int = 2) -> None:
    """Write ``payload`` as JSON (values JSON cannot hold as their ``str``) atomically to ``path``."""
    atomic_write_text(Path(path), json.dumps(payload, indent=indent, default=str))


def markdown_table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    """A GitHub Markdown table of ``rows`` (dicts) in the order of ``columns``."""
    if not rows:
        return "(no rows)\n"
    columns = columns or list(rows[0])
    return "\n".join(table_lines(columns, ([fmt(r.get(c)) for c in columns] for r in rows))) + "\n"


def write_results(
    out_dir: Path,
    name: str,
    rows: list[dict[str, Any]],
    *,
    columns: list[str] | None = None,
    title: str = "",
    command: str = "",
    scale_note: str = "",
    extra: dict[str, Any] | None = None,
) -> str:
    """Write ``name.md`` (table with title, command, scale note, machine) and ``name.json``; return the Markdown.

    By convention every reproduction table has the columns ``paper``, ``ours`` and ``scale`` (or ``paper_*`` /
    ``ours_*`` pairs) so the paper's value is never printed as ours.
    """
    out_dir = Path(out_dir)
    info = machine_info()
    md = []
    if title:
        md.append(f"### {title}\n")
    if command:
        md.append(f"Command: `{command}`\n")
    if scale_note:
        md.append(f"Scale: {scale_note}\n")
    md.append(markdown_table(rows, columns))
    md.append(f"\nMachine: {info['cpu']}, {info['cores']} cores, torch {info['torch']}, {time.strftime('%Y-%m-%d')}\n")
    text = "\n".join(md)
    atomic_write_text(out_dir / f"{name}.md", text)
    payload = {"title": title, "command": command, "scale": scale_note, "machine": info, "rows": rows, **(extra or {})}
    atomic_write_text(out_dir / f"{name}.json", json.dumps(payload, indent=2, default=str))
    return text
