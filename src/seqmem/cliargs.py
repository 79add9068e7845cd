"""Argument types and errors shared by every command-line module (``seqmem.cli``, ``seqmem.demo``,
``seqmem.sweep.cli``, ``seqmem.bench.cli``, ``seqmem.plotting``), so none of them imports another's parser."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


class UsageError(Exception):
    """A user mistake the CLI reports in one line (exit code 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _parse_value(s: str) -> Any:
    try:
        return json.loads(s)
    except json.JSONDecodeError:
        return s


def parse_options(pairs: list[str] | None) -> dict[str, Any]:
    """``["chunk_size=32", "window=null"]`` → ``{"chunk_size": 32, "window": None}`` (values parsed as JSON)."""
    out: dict[str, Any] = {}
    for p in pairs or []:
        if "=" not in p:
            raise UsageError(f"option {p!r} must look like KEY=VALUE")
        k, v = p.split("=", 1)
        out[k.strip()] = _parse_value(v)
    return out


def comma_list(text: str) -> list[str]:
    """The items of a comma-separated list, stripped, empty ones dropped (``"a, b,"`` → ``["a", "b"]``)."""
    return [item.strip() for item in str(text).split(",") if item.strip()]


def _number(s: str, convert: Callable[[str], Any], ok: Callable[[Any], bool], what: str) -> Any:
    """``convert(s)`` where it succeeds and passes ``ok``, else an argparse error "expected ``what``"."""
    try:
        v = convert(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}") from None
    if not ok(v):
        raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}")
    return v


def positive_int(s: str) -> int:
    return _number(s, int, lambda v: v > 0, "a positive integer")


def nonnegative_int(s: str) -> int:
    return _number(s, int, lambda v: v >= 0, "a non-negative integer")


def positive_float(s: str) -> float:
    return _number(s, float, lambda v: v > 0, "a positive number")


def out_path(s: str) -> Path:
    """An ``--out`` directory: a non-empty path (``--out ''`` would write into the current directory)."""
    if not s.strip():
        raise argparse.ArgumentTypeError("expected a directory, got an empty path (use --out . for this directory)")
    return Path(s)


def out_file(s: str) -> Path:
    """A file to write (``--json``, ``--markdown``): a non-empty path."""
    if not s.strip():
        raise argparse.ArgumentTypeError("expected a file name, got an empty path")
    return Path(s)


def check_out_dir(path: Path | str) -> Path:
    """``path`` as an output directory: created if missing and checked writable by a fresh temporary file (never a
    fixed name, which a planted symbolic link could point elsewhere); an empty path is refused (it would mean the
    current directory)."""
    from seqmem.io import probe_writable

    if not str(path).strip():
        raise UsageError("an empty output path: give a directory (use . for this directory)")
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe_writable(path)
    except OSError as e:
        raise UsageError(f"cannot write to output directory {path}: {e.strerror or e}") from None
    return path


def check_device(name: str) -> str:
    """``--device``: the name of a device torch knows, with data (not ``meta``), present on this machine."""
    import torch

    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError):
        raise UsageError(f"--device {name}: not a device; use cpu, cuda, cuda:N or mps") from None
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise UsageError(f"--device {name}: no CUDA GPU is available to this torch build; use --device cpu")
        if dev.index is not None and dev.index >= n:
            raise UsageError(f"--device {name}: only {n} CUDA GPU(s) here (cuda:0..cuda:{n - 1})")
    elif dev.type == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise UsageError(f"--device {name}: MPS is not available here; use --device cpu")
    elif dev.type != "cpu":
        raise UsageError(f"--device {name}: seqmem runs on cpu, cuda or mps, not {dev.type}")
    return name


#: CPU-seconds of estimated work above which a long job (a sweep, the full demo) starts only with ``--yes``
LONG_JOB_CPU_S = 30 * 60

#: where the thread count of the running command came from (set by :func:`apply_threads`)
_THREADS_SOURCE = "default"


def apply_threads(args: argparse.Namespace) -> int:
    """Set torch's intra-op thread count for a command and return it: ``--threads N`` where the command has it,
    else ``OMP_NUM_THREADS`` where it is set, else **1**.

    One thread is the default because every command's default model is small (d_model 64-256, batches of a few
    thousand tokens): there a second thread costs more in synchronisation than it saves, and on a machine that is
    busy with other work torch's default (one thread per core) is several times slower
    (docs/BENCHMARKS.md, "Threads").  A command with ``--threads`` gets the chosen count back in ``args.threads``.
    """
    import os

    import torch

    global _THREADS_SOURCE
    n = getattr(args, "threads", None)
    source = "--threads"
    if n is None:
        env = os.environ.get("OMP_NUM_THREADS", "").strip()
        if env.isdigit() and int(env) > 0:
            n, source = int(env), "OMP_NUM_THREADS"
        else:
            n, source = 1, "default"
    n = int(n)
    if n < 1:
        raise UsageError(f"--threads must be at least 1, got {n}")
    torch.set_num_threads(n)
    if hasattr(args, "threads"):
        args.threads = n
    _THREADS_SOURCE = source
    return n


def threads_note() -> str:
    """``"1 torch thread (default; --threads N or OMP_NUM_THREADS=N to change)"``: for a command's first line."""
    import torch

    n = torch.get_num_threads()
    how = {"default": "default; --threads N or OMP_NUM_THREADS=N to change"}.get(_THREADS_SOURCE, _THREADS_SOURCE)
    return f"{n} torch thread{'s' if n != 1 else ''} ({how})"
