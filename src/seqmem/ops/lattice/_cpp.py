"""Build-on-first-use loader of the fused C++ Lattice scan (``_kernel.cpp``), its autograd Function.

The kernel is plain C++ (no torch headers), so it compiles in about a second with the system ``c++``; it is
cached under ``$SEQMEM_CACHE`` (default ``~/.cache/seqmem``) keyed by a hash of the source.  A cache directory or
library that another user owns or could write to is never loaded from (a library there could run any code): the
kernel is then compiled into a private temporary directory for this process, with a ``RuntimeWarning`` naming the
path to fix (``chmod go-w`` it, or point ``SEQMEM_CACHE`` at a directory of your own).  If no compiler is
available, :func:`available` returns False and ``lattice_scan(mode="scan")`` uses the pure-PyTorch hand-VJP
scan instead.  Set ``SEQMEM_LATTICE_BACKEND=torch`` to force the PyTorch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import torch

from seqmem.ops._common import backward_without_autocast, first_order_backward

_SRC = Path(__file__).with_name("_kernel.cpp")
_LIB: ctypes.CDLL | None = None
_FAILED: str | None = None
_LOCK = threading.Lock()
OBJ_CODE = {"dec": 0, "enc": 1, "sim": 2, "delta": 3, "ttt": 4, "dec_plain": 5, "enc_plain": 6, "sim_plain": 7}


def _cpu_id() -> str:
    """The CPU model and instruction-set flags (Linux), else the platform's processor string."""
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
        return "|".join(sorted({ln for ln in info if ln.startswith(("model name", "flags", "Features"))}))
    except OSError:
        import platform

        return platform.machine() + platform.processor()


def _unsafe(path: Path) -> str | None:
    """Why ``path`` must not be trusted (owned by another user, or writable by group or others), else ``None``."""
    st = path.stat()
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"{path} (owned by another user)"
    if st.st_mode & 0o022:
        return f"{path} (writable by others: mode {st.st_mode & 0o777:o})"
    return None


def _compile(cxx: str, flags: list[str], so: Path) -> None:
    """Compile the kernel to ``so`` via a temporary file in the same directory and an atomic rename."""
    fd, tmp = tempfile.mkstemp(dir=so.parent, suffix=".so")
    os.close(fd)
    common = ["-shared", "-fPIC", "-std=c++17", str(_SRC), "-o", tmp]
    try:
        r = subprocess.run([cxx, *flags, *common], capture_output=True, text=True)
        if r.returncode != 0:  # a compiler without -march=native (e.g. some clang on arm64): plain -O3
            r = subprocess.run([cxx, "-O3", *common], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"compiling {_SRC.name} failed:\n{r.stderr[-2000:]}")
        os.chmod(tmp, 0o755)  # whatever the umask: never writable by group or others
        os.replace(tmp, so)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _build() -> ctypes.CDLL:
    src = _SRC.read_bytes()
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        raise RuntimeError("no C++ compiler found")
    # Built WITHOUT -fopenmp: a second OpenMP runtime (the system libgomp) loaded beside the one bundled with torch
    # made later torch kernels in the same process spin forever inside libgomp (seen in the test suite).
    # -march=native and reassociation (not -ffast-math: NaN/Inf semantics are kept) let the compiler vectorise the
    # dot products: ~1.3x on the Lattice layer at the demo size; sums differ from the serial order by rounding only
    # (the tests compare with the PyTorch loop at 1e-12).  The cache key includes this CPU, so a cache directory
    # shared between machines never loads a library built for another instruction set.
    flags = ["-O3", "-march=native", "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math"]
    key = hashlib.sha256(src + cxx.encode() + " ".join(flags).encode() + _cpu_id().encode()).hexdigest()[:16]
    cache = Path(os.environ.get("SEQMEM_CACHE", Path.home() / ".cache" / "seqmem"))
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    name = f"lattice_kernel_{key}.so"
    problem = _unsafe(cache) or (_unsafe(cache / name) if (cache / name).exists() else None)
    if problem is None:
        so = cache / name
        if not so.exists():
            _compile(cxx, flags, so)
        lib = ctypes.CDLL(str(so))
    else:
        warnings.warn(f"not loading the Lattice kernel from {problem}; compiling it in a private temporary "
                      "directory instead (fix: chmod go-w, or set SEQMEM_CACHE to a directory of your own)",
                      RuntimeWarning, stacklevel=3)
        private = tempfile.mkdtemp(prefix="seqmem-lattice-")  # mode 0700, removed once the library is loaded
        try:
            so = Path(private) / name
            _compile(cxx, flags, so)
            lib = ctypes.CDLL(str(so))
        finally:
            shutil.rmtree(private, ignore_errors=True)
    for name in ("lattice_fwd_f64", "lattice_fwd_f32", "lattice_bwd_f64", "lattice_bwd_f32"):
        getattr(lib, name).restype = None
    return lib


def available() -> bool:
    """True if the fused kernel is (or can be) built here and ``SEQMEM_LATTICE_BACKEND`` is not ``torch``."""
    global _LIB, _FAILED
    if os.environ.get("SEQMEM_LATTICE_BACKEND", "").lower() == "torch":
        return False
    with _LOCK:
        if _LIB is None and _FAILED is None:
            try:
                _LIB = _build()
            except Exception as exc:  # noqa: BLE001 — any build failure means "use the torch path"
                _FAILED = str(exc)
    return _LIB is not None


def build_error() -> str | None:
    """Why the kernel could not be built (None if it was built or not tried)."""
    return _FAILED


def _p(t: torch.Tensor | None) -> ctypes.c_void_p:
    return ctypes.c_void_p(0 if t is None else t.data_ptr())


def _i(x: int) -> ctypes.c_int64:
    return ctypes.c_int64(x)


class CppScan(torch.autograd.Function):
    """Kernel layout: S0 (N,d,m), q,k,g (N,T,m), v (N,T,d), mu (N,T)|None -> y (N,T,d), S_T (N,d,m)."""

    @staticmethod
    def forward(ctx, S0, q, k, v, g, mu, objective, chunk):
        N, T, m = k.shape
        d = v.shape[-1]
        nc = (T + chunk - 1) // chunk
        S0c, qc, kc, vc, gc, muc = (
            x.detach().contiguous() if x is not None else None for x in (S0, q, k, v, g, mu)
        )
        y = v.new_empty(N, T, d)
        bounds = v.new_empty(N, nc, d, m)  # the state at every chunk start: all the backward keeps
        S_end = v.new_empty(N, d, m)
        fn = _LIB.lattice_fwd_f64 if v.dtype == torch.float64 else _LIB.lattice_fwd_f32
        fn(
            ctypes.c_int(OBJ_CODE[objective]), _i(N), _i(T), _i(d), _i(m), _i(chunk),
            _p(S0c), _p(qc), _p(kc), _p(vc), _p(gc), _p(muc), _p(y), _p(bounds), _p(S_end),
        )  # fmt: skip
        ctx.objective, ctx.chunk, ctx.has_mu = objective, chunk, mu is not None
        ctx.save_for_backward(bounds, qc, kc, vc, gc, muc if muc is not None else qc.new_empty(0))
        return y, S_end

    @staticmethod
    @first_order_backward("lattice_scan (C++ scan)")
    @backward_without_autocast
    def backward(ctx, gy, gS_end):
        bounds, q, k, v, g, mu = ctx.saved_tensors
        mu = mu if ctx.has_mu else None
        N, T, m = k.shape
        d = v.shape[-1]
        gy = v.new_zeros(N, T, d) if gy is None else gy.contiguous()
        gS_end = v.new_zeros(N, d, m) if gS_end is None else gS_end.contiguous()
        gS0 = torch.empty_like(gS_end)
        gq, gk, gg, gv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(g), torch.empty_like(v)
        gmu = torch.empty_like(mu) if mu is not None else None
        fn = _LIB.lattice_bwd_f64 if v.dtype == torch.float64 else _LIB.lattice_bwd_f32
        fn(
            ctypes.c_int(OBJ_CODE[ctx.objective]), _i(N), _i(T), _i(d), _i(m), _i(ctx.chunk),
            _p(bounds), _p(q), _p(k), _p(v), _p(g), _p(mu), _p(gy), _p(gS_end),
            _p(gS0), _p(gq), _p(gk), _p(gv), _p(gg), _p(gmu),
        )  # fmt: skip
        return gS0, gq, gk, gv, gg, gmu, None, None
