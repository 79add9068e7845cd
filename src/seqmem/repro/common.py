"""Helpers shared by the reproductions: tables with the paper's number beside ours, JSON, plots, run records."""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and rename, so a crash never leaves half a file."""
    atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Binary twin of :func:`atomic_write_text`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_figure(fig: Any, path: Path, dpi: int = 120) -> None:
    """Save a matplotlib figure as PNG atomically (rendered in memory, then :func:`atomic_write_bytes`)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    atomic_write_bytes(Path(path), buf.getvalue())


def fmt(v: Any, digits: int = 3) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
            return f"{v:.{digits}e}"
        return f"{v:.{digits}f}"
    return str(v)


def markdown_table(rows: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    """A GitHub Markdown table of ``rows`` (dicts) in the order of ``columns``."""
    if not rows:
        return "(no rows)\n"
    columns = columns or list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(c)) for c in columns) + " |")
    return "\n".join(lines) + "\n"


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
