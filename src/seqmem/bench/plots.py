"""PNG plots of benchmark records (matplotlib, Agg backend): time vs length (log–log), decode time and state."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from seqmem.repro.common import save_figure

_STYLES = ["-", "--", "-.", ":"]


def _plt():
    from seqmem.io import pyplot

    return pyplot()


def _series(records: list[dict[str, Any]], impl: str, key: str) -> dict[str, tuple[list[int], list[float]]]:
    out: dict[str, tuple[list[int], list[float]]] = {}
    for r in sorted(records, key=lambda r: r["seq_len"]):
        if r["impl"] != impl or r.get("status") != "ok" or r.get(key) is None:
            continue
        xs, ys = out.setdefault(r["mixer"], ([], []))
        xs.append(r["seq_len"])
        ys.append(r[key])
    return out


def _lines(ax, series: dict[str, tuple[list[int], list[float]]], cmap) -> None:
    for i, (name, (xs, ys)) in enumerate(series.items()):
        bold = name == "attention"
        ax.plot(xs, ys, _STYLES[(i // 10) % len(_STYLES)], marker="o", ms=3, color="black" if bold else cmap(i % 10),
                lw=2.5 if bold else 1.2, label=name)


def _fmt_len(v: float, _pos: int = 0) -> str:
    n = int(round(v))
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def _finish(fig, ax, path: Path) -> Path:
    from matplotlib.ticker import FuncFormatter

    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(_fmt_len))
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    save_figure(fig, path, dpi=110)
    return path


def plot_speed(records: list[dict[str, Any]], out_dir: Path, prefix: str = "speed") -> list[Path]:
    """``<prefix>_time.png`` (fast forward+backward ms vs T) and ``<prefix>_fast_vs_reference.png``."""
    plt = _plt()
    cmap = plt.get_cmap("tab10")
    paths = []
    fig, ax = plt.subplots(figsize=(9, 5.5))
    _lines(ax, _series(records, "fast", "median_ms"), cmap)
    ax.set_xlabel("sequence length T")
    ax.set_ylabel("forward+backward time, ms (median)")
    ax.set_title("one mixer layer, impl=fast")
    paths.append(_finish(fig, ax, Path(out_dir) / f"{prefix}_time.png"))
    plt.close(fig)
    ref = _series(records, "reference", "median_ms")
    if ref:
        fast = _series(records, "fast", "median_ms")
        fig, ax = plt.subplots(figsize=(9, 5.5))
        for i, (name, (xs, ys)) in enumerate(ref.items()):
            c = cmap(i % 10)
            st = _STYLES[(i // 10) % len(_STYLES)]
            ax.plot(xs, ys, st, marker="x", ms=4, color=c, lw=1, alpha=0.6)
            if name in fast:
                ax.plot(*fast[name], st, marker="o", ms=3, color=c, lw=1.5, label=name)
        ax.set_xlabel("sequence length T")
        ax.set_ylabel("forward+backward time, ms")
        ax.set_title("fast (o) vs reference (x, faint)")
        paths.append(_finish(fig, ax, Path(out_dir) / f"{prefix}_fast_vs_reference.png"))
        plt.close(fig)
    return paths


def plot_decode(records: list[dict[str, Any]], out_dir: Path, prefix: str = "decode", impl: str = "fast"
                ) -> list[Path]:
    """``<prefix>_time.png`` (ms per token vs context) and ``<prefix>_state.png`` (state bytes vs context)."""
    plt = _plt()
    cmap = plt.get_cmap("tab10")
    paths = []
    for key, ylabel, suffix in (("median_ms", "ms per decoded token (median)", "time"),
                                ("state_bytes", "state bytes per sequence", "state")):
        fig, ax = plt.subplots(figsize=(9, 5.5))
        _lines(ax, _series(records, impl, key), cmap)
        ax.set_xlabel("context length")
        ax.set_ylabel(ylabel)
        ax.set_title(f"decode, impl={impl}")
        paths.append(_finish(fig, ax, Path(out_dir) / f"{prefix}_{suffix}.png"))
        plt.close(fig)
    return paths
