"""Ground-floor helpers every layer may use: atomic file writes, machine facts, sample statistics.

Nothing here imports the rest of seqmem, so training, sweeps, reproductions and the command line can all share it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import math
import os
import pkgutil
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any


def machine_info() -> dict[str, Any]:
    """CPU model, core count, torch/Python versions, intra-op threads and GPU name (if any)."""
    import torch

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


@functools.cache
def import_submodules(package: str) -> None:
    """Import every module of ``package`` except ``base`` and private ``_`` ones (the registries of mixers and tasks
    fill themselves from the decorators these modules run); once per package (a failed import is retried)."""
    pkg = importlib.import_module(package)
    for mod in pkgutil.iter_modules(pkg.__path__):
        if not mod.name.startswith("_") and mod.name != "base":
            importlib.import_module(f"{package}.{mod.name}")


def time_calls(fn: Callable[[], Any], repeats: int, warmup: int = 0,
               clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn`` by ``clock`` (wall clock by default; ``time.process_time``
    gives the CPU time the calls needed, which other processes on the machine do not inflate), after ``warmup``
    untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return times


def read_jsonl(path: Path | str) -> list[dict[str, Any]]:
    """The rows of a JSON-lines file, up to the first line that does not parse (a torn last line from a crash)."""
    import json

    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


def atomic_write_text(path: Path | str, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and rename, so a crash never leaves half a file."""
    atomic_write_bytes(path, text.encode())


def atomic_write_bytes(path: Path | str, data: bytes) -> None:
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


class MissingExtra(ImportError):
    """An optional dependency is not installed; the message names the extra that brings it (one line)."""


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend; :class:`MissingExtra` naming the ``plot`` extra when matplotlib is
    not installed (it is needed for plots only)."""
    try:
        import matplotlib
    except ImportError:
        raise MissingExtra('plots need matplotlib, which a plain install leaves out: pip install "seqmem[plot]"') \
            from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path | str, dpi: int = 120) -> None:
    """Save a matplotlib figure as PNG atomically (rendered in memory, then :func:`atomic_write_bytes`)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    atomic_write_bytes(Path(path), buf.getvalue())


def fmt(v: Any, digits: int = 3, *, nan: str = "nan", exponent: bool = True) -> str:
    """``v`` as a table cell: ``—`` for None, ``nan`` for NaN, a float with ``digits`` decimals (in exponent form
    from 1e5 on and below 1e-3 unless ``exponent`` is False), anything else as ``str``."""
    if v is None:
        return "—"
    if isinstance(v, float):
        if math.isnan(v):
            return nan
        if exponent and v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
            return f"{v:.{digits}e}"
        return f"{v:.{digits}f}"
    return str(v)


def table_lines(header: list[str], rows: Iterable[list[str]], numeric: bool = False) -> list[str]:
    """The lines of a GitHub Markdown table of already formatted cells; with ``numeric`` every column after the
    first is right-aligned."""
    rule = "|---|" + "---:|" * (len(header) - 1) if numeric else "|" + "---|" * len(header)
    return ["| " + " | ".join(header) + " |", rule] + ["| " + " | ".join(cells) + " |" for cells in rows]


def mean_std(values: Iterable[float]) -> tuple[float, float]:
    """Mean and *sample* standard deviation (n − 1 in the denominator) of ``values``.

    One value has no spread to estimate: its std is ``nan`` (shown as "—" in tables), never a misleading 0.
    An empty input gives ``(nan, nan)``."""
    xs = [float(v) for v in values]
    if not xs:
        return math.nan, math.nan
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, math.nan
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def check_int(name: str, value: Any, minimum: int = 1, prefix: str = "") -> int:
    """``value`` as an int ≥ ``minimum`` (bools refused), else one ``ValueError`` line naming ``name``:
    "must be a positive integer" (minimum 1), "a non-negative integer" (0) or "an integer >= minimum"."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = {1: "a positive integer", 0: "a non-negative integer"}.get(minimum, f"an integer >= {minimum}")
        raise ValueError(f"{prefix}{name} must be {kind}, got {value!r}")
    return value


#: the lock file of a run directory (see :func:`run_lock`)
LOCK = ".lock"


@contextlib.contextmanager
def run_lock(run_dir: Path | str) -> Iterator[bool]:
    """Hold ``run_dir``'s lock while the block runs: yields True when this process holds it, False when another
    process does (nothing is waited for).  An ``flock`` on ``run_dir/.lock``: the operating system releases it
    when the holder exits, however it exits, so a crashed run leaves nothing stale.  Where ``fcntl`` does not
    exist (Windows) there is no lock and this always yields True."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        yield True
        return
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock


def is_locked(run_dir: Path | str) -> bool:
    """Whether the run in ``run_dir`` is being trained now: its lock is held (by another process, or by a
    :func:`run_lock` block of this one).  Opens the lock file read-only and writes nothing (a dry run of a read-only
    checkout works)."""
    try:
        import fcntl

        fd = os.open(Path(run_dir) / LOCK, os.O_RDONLY)
    except (ImportError, OSError):  # no lock file (never trained here), or no fcntl
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
