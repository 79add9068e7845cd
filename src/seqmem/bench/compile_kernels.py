"""Compile every seqmem Triton kernel for NVIDIA GPUs on a machine without one, and report what ptxas says.

Triton compiles ahead of time without a driver: ``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90,
32))`` lowers a kernel to PTX and runs the ``ptxas`` shipped in the triton wheel.  This module

1. *records* the kernel launches the ops make on a few typical shapes, by running them under Triton's CPU
   interpreter (``TRITON_INTERPRET=1``) with the interpreter's grid executor wrapped: for each launch the kernel,
   the argument types (pointer dtypes, integer widths) and the compile-time constants (block sizes, flags,
   ``num_warps``);
2. *compiles* each distinct launch for each requested architecture in a fresh process without the interpreter
   (there ``triton.jit`` makes real ``JITFunction`` objects), and runs ``ptxas -v`` on the PTX for registers, spill
   stores/loads and shared memory.

It catches what the interpreter cannot (type errors in the compiled dialect, constructs the compiler refuses,
register spills from a state block too large for a program) before a GPU is at hand.  It says nothing of speed.

    python -m seqmem.bench.compile_kernels [--arch 80 90] [--quick] [--out report.md]

Exit status 1 when a kernel does not compile.  The table for the committed kernels is docs/results/bench/
kernels_compile.md.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["Launch", "compile_launches", "record_launches", "main"]

Launch = dict  # {"module", "kernel", "signature": {arg: type}, "constexprs": {arg: value}, "options": {...}}

_PTR = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64", "int64": "i64",
        "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8", "bool": "i1"}  # fmt: skip


def _cases(quick: bool = False) -> list[tuple[str, Callable[[], None]]]:
    """The op calls whose launches are recorded: typical head sizes (64; 128 too), every objective / option that
    changes a kernel's constants, float32 and bfloat16 inputs, forward and backward.  ``quick``: float32 at 64
    only, every kernel still at least once."""
    import torch

    from seqmem.ops.lattice import fused_recurrent as lat
    from seqmem.ops.vla import fused_recurrent as vla
    from seqmem.ops.vort import chunk_simple_gla as gla

    B, T, H = 1, 3, 1

    def lattice(objective: str, dtype: torch.dtype, forget: bool, D: int = 64) -> Callable[[], None]:  # noqa: N803
        def run() -> None:
            g = torch.Generator().manual_seed(0)
            q, k = (torch.randn(B, T, H, D, generator=g, dtype=dtype).requires_grad_() for _ in range(2))
            v = torch.randn(B, T, H, D, generator=g, dtype=dtype).requires_grad_()
            gam = torch.rand(B, T, H, generator=g).to(dtype).requires_grad_()
            mu = torch.rand(B, T, H, generator=g).to(dtype).requires_grad_() if forget else None
            y, S = lat.fused_recurrent_lattice(q, k, v, gam, objective=objective, forget=mu, chunk_size=2)
            (y.float().sum() + S.sum()).backward()

        return run

    def vla_attention(fixed_A: bool, D: int = 64) -> Callable[[], None]:  # noqa: N803
        def run() -> None:
            g = torch.Generator().manual_seed(0)
            q, k, v = (torch.randn(B, T, H, D, generator=g).requires_grad_() for _ in range(3))
            w_u = (torch.randn(H, D, D, generator=g) * D**-0.5).requires_grad_()
            o, st = vla.fused_recurrent_vla(q, k, v, w_u, fixed_A=fixed_A, chunk_size=2)
            (o.sum() + sum(x.float().sum() for x in st.values() if x.is_floating_point())).backward()

        return run

    def vla_delta() -> None:
        D = 64
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(B, T, H, D, generator=g).requires_grad_() for _ in range(3))
        beta = torch.rand(B, T, H, generator=g).requires_grad_()
        o, st = vla.fused_recurrent_vla_paper_delta_rule(q, k, v, beta, chunk_size=2)
        (o.sum() + st["S"].sum()).backward()

    def simple_gla(dtype: torch.dtype, K: int = 64, V: int = 65) -> Callable[[], None]:  # noqa: N803
        def run() -> None:  # VORT's channels as heads: V = Dv + 1 (the key-sum column), two value blocks
            g = torch.Generator().manual_seed(0)
            q, k = (torch.randn(B, 70, H, K, generator=g, dtype=dtype).requires_grad_() for _ in range(2))
            v = torch.randn(B, 70, H, V, generator=g, dtype=dtype).requires_grad_()
            lg = (-torch.rand(B, 70, H, generator=g)).requires_grad_()
            h0 = torch.randn(B, H, K, V, generator=g).requires_grad_()
            o, ht = gla.chunk_simple_gla(q, k, v, lg, initial_state=h0, output_final_state=True)
            (o.float().sum() + ht.sum()).backward()

        return run

    def ssd(dtype: torch.dtype) -> None:
        def run() -> None:
            from seqmem.ops.state_space.chunk import _ssd_gla

            g = torch.Generator().manual_seed(0)
            x = torch.randn(B, 70, H, 64, generator=g, dtype=dtype).requires_grad_()
            dt = torch.rand(B, 70, H, generator=g).requires_grad_()
            A = -torch.rand(H, generator=g).requires_grad_()
            Bm, Cm = (torch.randn(B, 70, H, 128, generator=g, dtype=dtype).requires_grad_() for _ in range(2))
            y, st = _ssd_gla(x, dt, A, Bm, Cm, None)
            (y.float().sum() + st["S"].sum()).backward()

        return run

    def delta(gated: bool, K: int = 64, C: int = 32) -> Callable[[], None]:  # noqa: N803
        def run() -> None:  # the (gated) delta rule's walk over chunks of 32 (the ops' length), float32 only
            from seqmem.ops.delta.chunk_scan import delta_chunk_scan

            g = torch.Generator().manual_seed(0)
            up = torch.randn(B, H, 2, C, 64, generator=g).requires_grad_()
            w, q, ko = (torch.randn(B, H, 2, C, K, generator=g).requires_grad_() for _ in range(3))
            qk = torch.randn(B, H, 2, C, C, generator=g).requires_grad_()
            gt = torch.rand(B, H, 2, generator=g).requires_grad_() if gated else None
            s0 = torch.randn(B, H, K, 64, generator=g).requires_grad_()
            o, st = delta_chunk_scan(up, w, q, qk, ko, gt, s0)
            (o.sum() + st.sum()).backward()

        return run

    dtypes = (torch.float32,) if quick else (torch.float32, torch.bfloat16)
    cases = [(f"lattice {o} {str(dt)[6:]}{' forget' if f else ''}", lattice(o, dt, f))
             for o in ("dec", "enc", "sim") for dt in dtypes for f in (False, True)]
    cases += [("vla", vla_attention(False)), ("vla fixed_A", vla_attention(True)), ("vla paper delta rule", vla_delta)]
    cases += [(f"vort simple GLA {str(dt)[6:]}", simple_gla(dt)) for dt in dtypes]
    cases += [("delta rule", delta(False)), ("gated delta rule", delta(True))]
    if not quick:  # Mamba-2's ssd on the same kernel: half C, B with float32 values dt·x (the launch's pointer types)
        cases += [("mamba2 SSD simple GLA bfloat16", ssd(torch.bfloat16))]
    if not quick:
        cases += [("lattice dec float32 d=m=128", lattice("dec", torch.float32, False, 128)),
                  ("vla d=128", vla_attention(False, 128)), ("vort simple GLA K=128", simple_gla(torch.float32, 128)),
                  ("gated delta rule K=128", delta(True, 128))]
    return cases


def record_launches(quick: bool = False) -> list[Launch]:
    """Run :func:`_cases` under Triton's interpreter and return each distinct launch (this process must have
    ``TRITON_INTERPRET=1`` set before the kernel modules were first imported)."""
    import torch
    from triton.runtime import interpreter

    seen: dict[str, Launch] = {}
    orig = interpreter.GridExecutor.__call__

    def recording(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        fn = self.fn
        names = list(self.arg_names)
        bound = dict(zip(names, args)) | kwargs
        const = set(self.constexprs)
        sig, cst = {}, {}
        for n in names:
            a = bound.get(n)
            if n in const:
                sig[n], cst[n] = "constexpr", a
            elif isinstance(a, torch.Tensor):
                sig[n] = "*" + _PTR[str(a.dtype)[6:]]
            elif isinstance(a, bool):
                sig[n] = "i1"
            elif isinstance(a, int):
                sig[n] = "i32" if -(2**31) <= a < 2**31 else "i64"
            elif isinstance(a, float):
                sig[n] = "fp32"
            else:
                raise TypeError(f"{fn.__name__}: cannot type argument {n}={a!r}")
        opts = {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs}
        rec = {"module": fn.__module__, "kernel": fn.__name__, "signature": sig, "constexprs": cst, "options": opts}
        seen.setdefault(json.dumps(rec, sort_keys=True), rec)
        return orig(self, *args, **kwargs)

    interpreter.GridExecutor.__call__ = recording
    try:
        for _, run in _cases(quick):
            run()
    finally:
        interpreter.GridExecutor.__call__ = orig
    return list(seen.values())


def _ptxas_info(log: str) -> dict[str, int]:
    """Registers, spill bytes and stack from the ``ptxas -v`` log Triton prints with ``dump_ptxas_log``."""
    if "Used" not in log:
        raise RuntimeError("no ptxas log (was the kernel taken from Triton's cache?)")
    info = {}
    for key, pat in (("registers", r"Used (\d+) registers"), ("spill_stores", r"(\d+) bytes spill stores"),
                     ("spill_loads", r"(\d+) bytes spill loads"), ("stack", r"(\d+) bytes stack frame")):
        m = re.search(pat, log)
        info[key] = int(m.group(1)) if m else 0
    return info


def compile_launches(launches: list[Launch], archs: list[int]) -> list[dict]:
    """Compile each launch for each architecture (in this process, which must not run the interpreter); one row
    per (launch, arch) with ``ok``, ``error`` and ptxas's numbers."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    knobs.nvidia.dump_ptxas_log = True  # Triton runs ptxas -v itself; print its log
    knobs.compilation.always_compile = True  # never a cached binary (no log)
    rows = []
    for rec in launches:
        kern = getattr(importlib.import_module(rec["module"]), rec["kernel"])
        names = kern.arg_names
        cst = {(names.index(k),): v for k, v in rec["constexprs"].items()}
        for arch in archs:
            row = {"kernel": f"{rec['module'].rsplit('.', 2)[-2]}.{rec['kernel']}", "arch": arch,
                   "constexprs": rec["constexprs"], "signature": rec["signature"], "options": rec["options"],
                   "pointers": sorted({t for t in rec["signature"].values()
                                                                         if t.startswith("*")})}  # fmt: skip
            try:
                src = ASTSource(kern, rec["signature"], constexprs=cst)
                log = io.StringIO()
                with contextlib.redirect_stdout(log):
                    k = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=rec["options"])
                row |= {"ok": True, "num_warps": k.metadata.num_warps, "shared": k.metadata.shared}
                row |= _ptxas_info(log.getvalue())
            except Exception as e:  # noqa: BLE001 — reported per kernel
                row |= {"ok": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
            rows.append(row)
    return rows


def _table(rows: list[dict]) -> str:
    out = ["| kernel | sm | constants | pointers | ok | warps | registers | spill st/ld (B) | shared (B) |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cst = ", ".join(f"{k}={v}" for k, v in r["constexprs"].items())
        ptrs = "/".join(p[1:] for p in r["pointers"])
        if r["ok"]:
            out.append(f"| {r['kernel']} | {r['arch']} | {cst} | {ptrs} | yes | {r['num_warps']} | {r['registers']}"
                       f" | {r['spill_stores']}/{r['spill_loads']} | {r['shared']} |")
        else:
            out.append(f"| {r['kernel']} | {r['arch']} | {cst} | {ptrs} | **no**: {r['error']} | | | | |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m seqmem.bench.compile_kernels", description=__doc__.split("\n")[0])
    p.add_argument("--arch", type=int, nargs="+", default=[80, 90], help="SM versions (default: 80 90)")
    p.add_argument("--quick", action="store_true", help="float32 at head size 64 only (every kernel still once)")
    p.add_argument("--out", type=Path, help="write the table (markdown) and rows (.json beside it) here")
    p.add_argument("--_compile", type=Path, help=argparse.SUPPRESS)  # internal: the compile step's input
    a = p.parse_args(argv)
    if a._compile:
        print(json.dumps(compile_launches(json.loads(a._compile.read_text()), a.arch)))
        return 0
    if os.environ.get("TRITON_INTERPRET") != "1":  # record in a child with the interpreter on
        env = os.environ | {"TRITON_INTERPRET": "1"}
        code = "import json, sys; from seqmem.bench.compile_kernels import record_launches; " \
               f"json.dump(record_launches({a.quick}), sys.stdout)"  # fmt: skip
        rec = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        if rec.returncode:
            sys.stderr.write(rec.stderr)
            return 1
        launches = rec.stdout
    else:
        launches = json.dumps(record_launches(a.quick))
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        f.write(launches)
    with tempfile.TemporaryDirectory() as tmp:  # a cache of its own: the user's Triton cache is left alone
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_CACHE_DIR": tmp}
        res = subprocess.run([sys.executable, "-m", "seqmem.bench.compile_kernels", "--_compile", f.name, "--arch",
                              *map(str, a.arch)], env=env, capture_output=True, text=True)  # fmt: skip
    os.unlink(f.name)
    if res.returncode:
        sys.stderr.write(res.stderr)
        return 1
    rows = json.loads(res.stdout)
    import triton

    from seqmem.bench.common import source_commit, utc_now

    src = source_commit()
    commit = (f"commit {src['commit'][:12]}" + (" with uncommitted changes" if src["dirty"] else "")
              if src["commit"] else "commit not recorded (not a git tree)")
    table = (
        "# seqmem's Triton kernels compiled for NVIDIA GPUs (no GPU used)\n\n"
        f"Written by `python -m seqmem.bench.compile_kernels{' --quick' if a.quick else ''}` with triton "
        f"{triton.__version__} ({utc_now()}, {commit}): each kernel launch the ops make on typical shapes "
        "(head size 64, and 128 where "
        "listed; recorded under Triton's CPU interpreter) compiled ahead of time for each architecture, with ptxas's "
        "registers per thread, spill bytes and shared memory.  This checks that the kernels compile and fit their "
        "programs; it measures no speed.\n\n" + _table(rows)
    )
    print(table, end="")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(table)
        a.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    bad = [r for r in rows if not r["ok"]]
    spills = [r for r in rows if r["ok"] and r["spill_stores"]]
    print(f"{len(rows) - len(bad)}/{len(rows)} compiled; {len(spills)} spill registers", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
