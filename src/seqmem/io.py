"""Ground-floor helpers every layer may use: atomic file writes, machine facts, sample statistics.

Nothing here imports the rest of seqmem, so training, sweeps, reproductions and the command line can all share it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import importlib
import math
import numbers
import os
import pkgutil
import platform
import stat
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


class UnsafePathError(ValueError):
    """A path that would write or read outside its directory (through a symbolic link, or a ``..`` in a name);
    the message is one line naming the path."""


@functools.cache
def _umask() -> int:
    """The process's umask (read from ``/proc`` where it can be, which changes nothing; else set and restored)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    m = os.umask(0o022)
    os.umask(m)
    return m


def file_mode() -> int:
    """The mode a new file gets by the umask (0644 under umask 022): what ``open()`` would have given it."""
    return 0o666 & ~_umask()


def dir_mode() -> int:
    """The mode a new directory gets by the umask (0755 under umask 022)."""
    return 0o777 & ~_umask()


def make_private_dir_public(path: Path | str) -> None:
    """Give a directory made by ``tempfile.mkdtemp`` (mode 0700) the mode the umask gives a new directory."""
    os.chmod(path, dir_mode())


def check_within(root: Path | str, path: Path | str, what: str = "") -> Path:
    """``path`` if it lies under directory ``root`` once symbolic links are resolved (``path`` itself may be
    missing), else :class:`UnsafePathError` naming both: a derived path (a run directory, a report, a tokenizer)
    never leads outside the directory it was derived from."""
    root_r = Path(root).resolve()
    p = Path(path)
    if any(part in ("..",) for part in p.parts):
        raise UnsafePathError(f"{what or p}: '..' in a derived path ({p})")
    target = p.parent.resolve() / p.name if p.name else p.resolve()
    if target != root_r and root_r not in target.parents:
        raise UnsafePathError(f"{what or p}: resolves to {target}, outside {root_r} (a symbolic link?); refusing "
                              "to write or read there")
    return p


def safe_join(root: Path | str, rel: Path | str) -> Path:
    """``root / rel`` for a relative ``rel`` whose parts are plain names (no ``.``, ``..``, empty or absolute
    parts), else :class:`UnsafePathError`."""
    r = Path(rel)
    if r.is_absolute() or any(part in ("", ".", "..") for part in r.parts) or not r.parts:
        raise UnsafePathError(f"{rel}: not a plain relative path under {root}")
    return Path(root) / r


def read_bytes_nofollow(path: Path | str) -> bytes:
    """The bytes of the regular file ``path``, refusing a symbolic link in its last part (``O_NOFOLLOW``) or
    anything but a regular file (:class:`UnsafePathError`); other errors are ``OSError`` as ``open`` raises them."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePathError(f"{path} is a symbolic link; refusing to read through it") from None
        raise
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise UnsafePathError(f"{path} is not a regular file")
        return f.read()


def append_text(path: Path | str, text: str) -> None:
    """Append ``text`` to the file ``path`` (created with the umask's mode if missing), never through a symbolic
    link (:class:`UnsafePathError`)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePathError(f"{path} is a symbolic link; refusing to write through it") from None
        raise
    with os.fdopen(fd, "a") as f:
        f.write(text)


def fsync_path(path: Path | str) -> None:
    """Flush the file or directory ``path`` to disk (``fsync``); a directory that cannot be opened for it (some
    platforms) is left as it is."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        if Path(path).is_dir():
            return
        raise
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def probe_writable(directory: Path | str) -> None:
    """Raise ``OSError`` unless a file can be created in ``directory``: a fresh temporary name opened with
    ``O_CREAT | O_EXCL`` (which never follows a symbolic link planted under any fixed name), then removed."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".seqmem-write-test-")
    os.close(fd)
    os.unlink(tmp)


def atomic_write_text(path: Path | str, text: str, root: Path | str | None = None) -> None:
    """Write ``text`` to ``path`` via a temporary file and rename, so a crash never leaves half a file.

    The temporary name is created exclusively (``O_EXCL``: a symbolic link planted there is never followed) and the
    rename replaces a link at ``path`` rather than writing through it; the file gets the umask's mode (0644 under
    022).  With ``root``: ``path`` must lie under that directory once links are resolved (:func:`check_within`)."""
    atomic_write_bytes(path, text.encode(), root=root)


def atomic_write_bytes(path: Path | str, data: bytes, root: Path | str | None = None) -> None:
    """Binary twin of :func:`atomic_write_text`."""
    path = Path(path)
    if root is not None:
        check_within(root, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), file_mode())
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


def file_sha256(path: Path | str) -> str:
    """SHA-256 hex digest of a file's bytes."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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
    """``value`` as an int ≥ ``minimum`` (any integer: ``int``, a NumPy integer, any ``numbers.Integral``; bools
    refused), else one ``ValueError`` line naming ``name``: "must be a positive integer" (minimum 1), "a
    non-negative integer" (0) or "an integer >= minimum"."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        kind = {1: "a positive integer", 0: "a non-negative integer"}.get(minimum, f"an integer >= {minimum}")
        raise ValueError(f"{prefix}{name} must be {kind}, got {value!r}")
    return int(value)


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
    fd = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
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
