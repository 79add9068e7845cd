"""Not in the Lattice paper (it reports no timings): training throughput of the exact recurrence (plain loop vs
the fast exact scan, for the op and for a full Lattice block) and the activation memory the scan keeps for the
backward."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from seqmem.repro.common import torch_threads, write_results


def _time(fn, reps: int) -> float:
    fn()  # warm-up (builds the kernel on first use)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def bench_scan(T: int, B: int, H: int, d: int, reps: int = 2, seed: int = 0) -> list[dict[str, Any]]:
    """Training throughput (fwd + bwd, tokens/s) of ``lattice_scan`` DEC per mode/backend, float32, 1 thread."""
    from seqmem.ops.lattice import _cpp as _lattice_cpp
    from seqmem.ops.lattice import lattice_scan

    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, d, generator=g).requires_grad_()
    k = torch.nn.functional.normalize(torch.randn(B, T, H, d, generator=g), dim=-1).requires_grad_()
    v = torch.randn(B, T, H, d, generator=g).requires_grad_()
    gam = torch.rand(B, T, H, generator=g).requires_grad_()
    variants = [("recurrent", "auto"), ("scan", "torch")]
    if _lattice_cpp.available():
        variants.append(("scan", "cpp"))
    rows, base = [], None
    for mode, backend in variants:

        def step(mode=mode, backend=backend):
            y, _ = lattice_scan(q, k, v, gam, mode=mode, backend=backend, chunk_size=64)
            y.sum().backward()

        dt = _time(step, reps)
        tps = B * T / dt
        base = base or tps
        label = "plain loop (autograd)" if mode == "recurrent" else f"exact scan ({backend})"
        rows.append({"level": "op", "impl": label, "shape": f"B={B} T={T} H={H} d=m={d}",
                     "ms_per_step": 1e3 * dt, "tokens_per_s": tps, "speedup": tps / base})  # fmt: skip
    return rows


def bench_block(T: int, B: int, d_model: int, H: int, reps: int = 2) -> list[dict[str, Any]]:
    """Training throughput of one Lattice block (projections, convs, scan, gate) per impl."""
    import os

    from seqmem import build_mixer

    rows, base = [], None
    x = torch.randn(B, T, d_model, generator=torch.Generator().manual_seed(1)).requires_grad_()
    for label, impl, env in (("reference (plain loop)", "reference", None), ("fast (torch scan)", "fast", "torch"),
                             ("fast (C++ scan)", "fast", None)):  # fmt: skip
        old = os.environ.get("SEQMEM_LATTICE_BACKEND")
        if env:
            os.environ["SEQMEM_LATTICE_BACKEND"] = env
        try:
            m = build_mixer("lattice", d_model, n_heads=H, impl=impl)

            def step(m=m):
                y, _ = m(x)
                y.pow(2).mean().backward()

            dt = _time(step, reps)
        finally:
            if env:
                if old is None:
                    os.environ.pop("SEQMEM_LATTICE_BACKEND", None)
                else:
                    os.environ["SEQMEM_LATTICE_BACKEND"] = old
        tps = B * T / dt
        base = base or tps
        rows.append({"level": "block", "impl": label, "shape": f"B={B} T={T} D={d_model} H={H}",
                     "ms_per_step": 1e3 * dt, "tokens_per_s": tps, "speedup": tps / base})  # fmt: skip
    return rows


def saved_bytes(T: int, B: int = 1, H: int = 4, d: int = 64, mode: str = "scan") -> int:
    """Bytes autograd keeps for the backward of ``lattice_scan`` (float32), measured with saved-tensor hooks."""
    from seqmem.ops.lattice import lattice_scan

    g = torch.Generator().manual_seed(0)
    ins = [torch.randn(B, T, H, d, generator=g).requires_grad_() for _ in range(3)]
    gam = torch.rand(B, T, H, generator=g).requires_grad_()
    total = [0]
    seen: set[int] = set()

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total[0] += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lattice_scan(*ins, gam, mode=mode, chunk_size=64)
    return total[0]


def run_speed(cfg: dict[str, Any], out: Path, command: str) -> list[dict[str, Any]]:
    with torch_threads(1):  # one thread for the timings; the caller's setting is restored after
        rows = bench_scan(cfg["speed_T"], cfg["speed_B"], cfg["speed_H"], cfg["speed_d"], cfg["speed_reps"])
        rows += bench_block(cfg["speed_T"], cfg["speed_B"], cfg["speed_H"] * cfg["speed_d"], cfg["speed_H"],
                            cfg["speed_reps"])  # fmt: skip
    for r in rows:
        r["paper"] = "— (no timings in the paper)"
    write_results(out, "speed", rows, columns=["level", "impl", "shape", "ms_per_step", "tokens_per_s", "speedup",
                                              "paper"],  # fmt: skip
                  title="Training throughput of the exact Lattice recurrence (fwd+bwd, float32, 1 thread)",
                  command=command, scale_note="CPU, one thread; speedup relative to the plain loop")
    T = cfg["mem_T"]
    mem = []
    for mode in ("scan", "recurrent"):
        if mode == "recurrent" and T > 2048:  # measure at 1k and scale linearly (it is linear in T)
            b = saved_bytes(1024, mode=mode) * T / 1024
            note = "measured at T=1024, x T/1024"
        else:
            b, note = saved_bytes(T, mode=mode), "measured"
        mem.append({"mode": mode, "T": T, "shape": "B=1 H=4 d=m=64 float32", "saved_MB_per_layer": b / 2**20,
                    "how": note, "paper": "—"})  # fmt: skip
    note = "per sequence and layer; the scan keeps its inputs + one state per chunk of 64 tokens"
    write_results(out, "memory", mem, columns=["mode", "T", "shape", "saved_MB_per_layer", "how", "paper"],
                  title="Activation memory kept for the backward by one Lattice scan", command=command,
                  scale_note=note)  # fmt: skip
    return rows + mem
