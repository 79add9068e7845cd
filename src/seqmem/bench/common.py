"""Shared pieces of the benchmarks: argument parsing, a time-capped measurement loop, records and output."""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from seqmem.cliargs import comma_list
from seqmem.io import table_lines
from seqmem.repro.common import atomic_write_text, machine_info

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


# ------------------------------------------------------------------------------------------------ argument parsing
def parse_lengths(spec: str | None, default: list[int]) -> list[int]:
    """``"1k,2k,4096"`` → ``[1024, 2048, 4096]`` (``k`` = 1024, sorted, duplicates removed)."""
    if spec is None:
        return list(default)
    out: set[int] = set()
    for part in spec.split(","):
        p = part.strip().lower()
        if not p:
            continue
        mult = 1
        if p.endswith("k"):
            mult, p = 1024, p[:-1]
        try:
            v = int(float(p) * mult) if mult != 1 else int(p)
        except ValueError:
            raise ValueError(f"--lengths: {part.strip()!r} is not a length (use e.g. 1k,2k,4096)") from None
        if v <= 0:
            raise ValueError(f"--lengths: lengths must be positive, got {part.strip()!r}")
        out.add(v)
    if not out:
        raise ValueError("--lengths: no lengths given")
    return sorted(out)


def add_mixers_option(p: Any) -> None:
    """``--mixers``, shared by every benchmark (read with :func:`resolve_mixers`)."""
    p.add_argument("--mixers", default=None, help="comma-separated mixer names (default: every registered mixer)")


def add_model_options(p: Any, d_model: int, heads: int) -> None:
    """``--mixers`` and the width of what they build: ``--d-model`` and ``--heads``."""
    from seqmem.cliargs import positive_int

    add_mixers_option(p)
    p.add_argument("--d-model", type=positive_int, default=d_model, help="model width")
    p.add_argument("--heads", type=positive_int, default=heads, help="heads")


def add_repeat_options(p: Any, repeats: int, warmup: int, repeats_help: str, warmup_help: str) -> None:
    """``--repeats`` (timed, at least 1) and ``--warmup`` (untimed, 0 allowed)."""
    from seqmem.cliargs import nonnegative_int, positive_int

    p.add_argument("--repeats", type=positive_int, default=repeats, help=repeats_help)
    p.add_argument("--warmup", type=nonnegative_int, default=warmup, help=warmup_help)


def add_output_options(p: Any, tables: str, plot: bool = False) -> None:
    """``--json``, ``--plot`` (with ``plot``) and ``--markdown`` (which writes ``tables``, e.g. "the table")."""
    from seqmem.cliargs import out_file, out_path

    p.add_argument("--json", type=out_file, default=None,
                   help="write the records to this JSON file (default: not written)")
    if plot:
        p.add_argument("--plot", type=out_path, default=None,
                       help="write PNG plots to this directory (default: no plots)")
    p.add_argument("--markdown", type=out_file, default=None,
                   help=f"write {tables} to this Markdown file (default: printed only)")


#: options whose attribute is not their flag's name (the flag a recorded command line spells, not an old alias)
FLAG_OF_DEST = {"batch": "--batch-size"}


def command_line(prefix: str, args: Any) -> str:
    """``prefix`` followed by every option of ``args`` spelled out: the command that repeats the run (also when it
    was called from Python).  Unset (None) and off (False) options, derived ``*_parsed`` values and the raw
    ``argv`` the CLI attaches are left out."""
    parts = [prefix]
    for k, v in vars(args).items():
        if k in ("func", "cmd", "bench", "argv") or k.endswith("_parsed") or v is None or v is False:
            continue
        flag = FLAG_OF_DEST.get(k, "--" + k.replace("_", "-"))
        for item in v if isinstance(v, list) else [v]:  # a repeatable option: its flag once per value
            parts.append(flag)
            if item is not True:
                parts.append(shlex.quote(str(item)))
    return " ".join(parts)


def check_mixer_options(mixers: list[str], pairs: list[str] | None) -> dict[str, Any]:
    """``--mixer-option KEY=VALUE`` pairs as a dict, checked against every mixer to be benchmarked (one that does
    not take an option is an error naming it, before anything is measured)."""
    from seqmem.cliargs import parse_options
    from seqmem.registry import check_options

    options = parse_options(pairs)
    for name in mixers:
        try:
            check_options(name, options)
        except ValueError as e:
            raise ValueError(f"--mixer-option: {e}") from None
    return options


def resolve_mixers(spec: str | None) -> list[str]:
    """Comma-separated mixer names (validated against the registry); ``None`` → every registered mixer."""
    import seqmem

    known = seqmem.list_mixers()
    if spec is None or spec.strip().lower() == "all":
        return known
    names = comma_list(spec)
    if not names:
        raise ValueError("--mixers: no mixer names given")
    from seqmem.registry import ALIASES

    bad = [n for n in names if n not in known and n not in ALIASES]
    if bad:
        raise ValueError(f"--mixers: unknown mixer(s) {bad}; registered: {', '.join(known)}")
    return list(dict.fromkeys(names))


def resolve_device(name: str) -> torch.device:
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device: {name!r} is not a torch device") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda requested but CUDA is not available on this machine")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device: only cpu and cuda are supported, got {name!r}")
    return dev


def resolve_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"--dtype must be one of {list(DTYPES)}, got {name!r}")
    return DTYPES[name]


def fmt_len(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


# ------------------------------------------------------------------------------------------------ timing
class CapExceeded(Exception):
    """Raised (by SIGALRM) when a measurement runs past its time cap."""


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`CapExceeded` once ``seconds`` have passed (best effort: a long C++ call such as one backward
    pass is interrupted only when it returns).  No-op off the main thread or without ``setitimer``."""
    if (
        seconds is None
        or not hasattr(signal, "setitimer")
        or threading.current_thread() is not threading.main_thread()
    ):
        yield
        return

    def handler(signum, frame):  # noqa: ARG001
        raise CapExceeded

    old = signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warm_up_device(device: torch.device, dtype: torch.dtype) -> float:
    """Pay a device's one-off start-up costs before anything is timed or estimated from a call's time: on CUDA the
    context, the cuBLAS handle, the loading of the matmul and attention (SDPA) kernels and the autograd engine's
    device thread, in ``dtype``, forward and backward.  Returns the seconds it took (0 on the CPU, which has none).
    Without it the first measurement's first call pays them (seconds), and a time cap judged from that call
    refuses a layer that takes milliseconds."""
    if device.type != "cuda":
        return 0.0
    t0 = time.perf_counter()
    a = torch.randn(512, 512, device=device, dtype=dtype, requires_grad=True)
    (a @ a).float().sum().backward()
    q = torch.randn(1, 2, 256, 64, device=device, dtype=dtype, requires_grad=True)
    torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).float().sum().backward()
    synchronize(device)
    return time.perf_counter() - t0


def timed_call(fn: Callable[[], Any], device: torch.device) -> float:
    """Seconds one call of ``fn`` takes: on CUDA between two CUDA events recorded around it (the device's own
    clock, waited for), else by the wall clock."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def device_name(device: torch.device) -> str | None:
    """The card's name and CUDA version for a CUDA device (``"NVIDIA H100 80GB HBM3, CUDA 13.0"``), else None."""
    if device.type != "cuda":
        return None
    return f"{torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}"


def measure(
    fn: Callable[[], Any],
    *,
    warmup: int,
    repeats: int,
    max_seconds: float | None,
    device: torch.device,
) -> dict[str, Any]:
    """Run ``fn`` ``warmup`` times untimed, then up to ``repeats`` timed times, all within ``max_seconds``.

    Returns ``{"status": "ok", "times_ms": [...], "call_s": ...}`` or ``{"status": "not run", "note": ...}``.
    A repeat is started only if the time spent so far plus the latest call's time fits in the cap: the estimate
    comes from the latest call, after the warm-up, never from the first (which pays one-off costs: kernel
    compilation and autotuning, allocator growth, and without :func:`warm_up_device` the device's start-up).  A
    measurement with no completed timed repeat is "not run" (nothing is ever extrapolated).  On CUDA each call is
    timed with CUDA events (:func:`timed_call`).  ``call_s``: the latest call's seconds.
    """
    times: list[float] = []
    latest = 0.0
    t_start = time.perf_counter()

    def fits() -> bool:
        return max_seconds is None or (time.perf_counter() - t_start) + latest <= max_seconds

    try:
        with time_limit(max_seconds):
            for _ in range(warmup):
                latest = timed_call(fn, device)
            for _ in range(repeats):
                if times and not fits():
                    break
                if not times and not fits():
                    return {"status": "not run", "note": f"one call takes {latest:.2f} s after the warm-up; "
                            f"one repeat would exceed --max-seconds {max_seconds:g}", "call_s": latest}
                latest = timed_call(fn, device)
                times.append(latest * 1e3)
    except CapExceeded:
        if not times:
            return {"status": "not run", "note": f"exceeded --max-seconds {max_seconds:g}",
                    "call_s": time.perf_counter() - t_start}
    return {"status": "ok", "times_ms": times, "call_s": latest}


def summarize_times(times_ms: list[float]) -> dict[str, float]:
    """median, min, max and the relative spread ``(max - min) / median`` of the timed repeats."""
    med = statistics.median(times_ms)
    lo, hi = min(times_ms), max(times_ms)
    return {"median_ms": med, "min_ms": lo, "max_ms": hi, "spread": (hi - lo) / med if med > 0 else 0.0}


# ------------------------------------------------------------------------------------------------ provenance
def utc_now() -> str:
    """The current time, UTC, ISO 8601 to the second (``"2026-11-25T00:16:03Z"``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def load_1min() -> float | None:
    """The 1-minute load average (``/proc/loadavg``, else ``os.getloadavg``); None where the system has neither."""
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    try:
        return float(os.getloadavg()[0])
    except (OSError, AttributeError):
        return None


def source_commit() -> dict[str, Any]:
    """``{"commit": full hash, "dirty": bool}`` of the git tree seqmem was imported from, or both None where that
    is not a git work tree (an installed wheel, no git on the machine, git failing): never raises.  ``dirty``: a
    tracked file differs from the commit (``git status --porcelain --untracked-files=no``).  The package's own
    files must be tracked by that tree, so a wheel installed inside some other repository is not given its commit."""
    import seqmem

    pkg = Path(seqmem.__file__).resolve().parent
    none: dict[str, Any] = {"commit": None, "dirty": None}

    def git(*cmd: str) -> str | None:
        try:
            p = subprocess.run(["git", *cmd], cwd=pkg, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return p.stdout.strip() if p.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit or git("ls-files", "--error-unmatch", "__init__.py") is None:
        return none
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def gpu_driver() -> str | None:
    """The NVIDIA driver version (``nvidia-smi``), or None where it cannot be asked."""
    try:
        p = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = p.stdout.strip().splitlines() if p.returncode == 0 else []
    return lines[0].strip() if lines else None


def run_machine(device: torch.device | str | None = None) -> dict[str, Any]:
    """The ``machine`` record of a benchmark, taken before it measures: :func:`~seqmem.io.machine_info` (CPU
    model, cores, torch, threads, Python, GPU name) plus what says which code ran under which conditions:
    ``date`` (UTC, ISO), ``seqmem`` (version), ``commit`` and ``dirty`` (None outside a git tree),
    ``omp_num_threads`` (the variable as set, None if unset), ``load_1min`` (the 1-minute load average: other work
    on the machine, which the wall-clock times include) and, on a CUDA device, ``cuda_runtime`` (torch's CUDA
    version) and ``gpu_driver`` (the NVIDIA driver)."""
    import seqmem

    info = machine_info()
    info.update({"date": utc_now(), "seqmem": seqmem.__version__, **source_commit(),
                 "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "load_1min": load_1min()})
    if device is not None and torch.device(device).type == "cuda":
        info.update({"cuda_runtime": torch.version.cuda, "gpu_driver": gpu_driver()})
    return info


def run_end() -> dict[str, Any]:
    """``{"date", "load_1min"}`` when a benchmark ends (beside :func:`run_machine`'s, taken at its start)."""
    return {"date": utc_now(), "load_1min": load_1min()}


def provenance_text(machine: dict[str, Any], end: dict[str, Any] | None = None) -> str:
    """One line for a Markdown header: commit, start (and end) date and load average, from :func:`run_machine`'s
    record (and :func:`run_end`'s); "not recorded" for what a record from older code lacks."""
    commit, dirty = machine.get("commit"), machine.get("dirty")
    code = "commit not recorded"
    if commit:
        code = f"commit {commit[:12]}" + (" with uncommitted changes" if dirty else "" if dirty is False
                                          else " (uncommitted changes not known)")
    if machine.get("seqmem"):
        code = f"seqmem {machine['seqmem']}, {code}"

    def load(v: Any) -> str:
        return "not recorded" if v is None else f"{v:.2f}"

    when = f"started {machine['date']}" if machine.get("date") else "start date not recorded"
    text = f"{code}; {when}, load average (1 min) {load(machine.get('load_1min'))}"
    if end:
        text += f"; ended {end['date']}, load {load(end.get('load_1min'))}"
    omp = machine.get("omp_num_threads")
    text += f"; OMP_NUM_THREADS={omp if omp is not None else 'unset'}" if "omp_num_threads" in machine else ""
    if machine.get("cuda_runtime") or machine.get("gpu_driver"):
        text += f"; CUDA {machine.get('cuda_runtime') or '?'}, driver {machine.get('gpu_driver') or 'unknown'}"
    return text


# ------------------------------------------------------------------------------------------------ output
def write_json(path: Path, payload: dict[str, Any]) -> None:
    def clean(o: Any) -> Any:
        if isinstance(o, float) and (math.isnan(o) or math.isinf(o)):
            return None
        if isinstance(o, dict):
            return {k: clean(v) for k, v in o.items()}
        if isinstance(o, list | tuple):
            return [clean(v) for v in o]
        return o

    atomic_write_text(Path(path), json.dumps(clean(payload), indent=1, default=str) + "\n")


def check_writable_dir(path: Path) -> Path:
    """``path`` created if needed and writable, else a one-line error (exit 2 on the command line)."""
    from seqmem.cliargs import check_out_dir

    return check_out_dir(path)


def check_writable_file(path: Path, flag: str = "--json") -> Path:
    """``path`` as a file to write: not a directory, in a writable directory; errors name ``flag``."""
    path = Path(path)
    if path.exists() and path.is_dir():
        raise ValueError(f"{flag}: {path} is a directory, expected a file name")
    check_writable_dir(path.parent if str(path.parent) else Path("."))
    return path


def base_record(bench: str, mixer: str, impl: str, seq_len: int, args: Any, device: torch.device,
                dtype: torch.dtype, machine: dict[str, Any]) -> dict[str, Any]:
    return {
        "bench": bench, "mixer": mixer, "impl": impl, "seq_len": seq_len, "batch": args.batch,
        "d_model": args.d_model, "n_heads": args.heads, "device": str(device),
        "dtype": str(dtype).replace("torch.", ""),
        "mixer_options": getattr(args, "mixer_option_parsed", None) or {},  # --mixer-option
        "machine": machine,
    }


def build_failed_records(bench: str, mixer: str, impls: list[str], seq_lens: list[int], error: Exception, args: Any,
                         device: torch.device, dtype: torch.dtype, machine: dict[str, Any]) -> list[dict[str, Any]]:
    """One ``status="error"`` record per (impl, length) for a mixer that could not be built (reported, not fatal)."""
    note = f"build failed: {type(error).__name__}: {error}"[:300]
    return [{**base_record(bench, mixer, impl, n, args, device, dtype, machine), "status": "error", "note": note}
            for n in seq_lens for impl in impls]


def md_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    def f(v: Any) -> str:
        if v is None:
            return "—"
        if isinstance(v, float):
            if math.isnan(v):
                return "—"
            a = abs(v)
            if a >= 1000:
                return f"{v:,.0f}"
            if a >= 100:
                return f"{v:.0f}"
            if a >= 10:
                return f"{v:.1f}"
            if a >= 0.01 or a == 0:
                return f"{v:.2f}"
            return f"{v:.1e}"
        return str(v)

    return "\n".join(table_lines(columns, ([f(r.get(c)) for c in columns] for r in rows))) + "\n"


__all__ = ["machine_info", "run_machine", "run_end", "provenance_text", "source_commit"]
