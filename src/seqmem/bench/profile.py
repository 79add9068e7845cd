"""``seqmem bench profile``: where one mixer's forward+backward time goes (torch.profiler, top entries by own time).

On the CPU the entries are operators and their self time; on CUDA they are the GPU kernels and their own device
time (an operator's CPU self time there is launch overhead, not the work).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from seqmem.bench.common import synchronize
from seqmem.bench.speed import training_step


def _own_us(e: Any, cuda: bool) -> float:
    """An averaged event's own time in microseconds: on CUDA a device-side entry's (kernels, copies, fills; the
    attribute's name changed across torch versions) — a CPU-side one (an operator, a runtime call, an annotation)
    counts 0, so nothing is counted twice; CPU self time otherwise."""
    if cuda:
        if "CPU" in str(getattr(e, "device_type", "CPU")) or getattr(e, "is_user_annotation", False):
            return 0.0
        return float(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0) or 0)
    return float(e.self_cpu_time_total)


def profile_mixer(args: Any, device: torch.device, dtype: torch.dtype, name: str, seq_len: int,
                  impl: str = "fast", top: int = 15) -> dict[str, Any]:
    """Profile one forward+backward call after ``args.warmup`` unprofiled ones; return the top entries by own time
    (operators on the CPU, GPU kernels on CUDA: ``timed`` says which) and their call count."""
    step = training_step(args, device, dtype, name, seq_len, impl)
    for _ in range(getattr(args, "warmup", 1)):
        step()
    cuda = device.type == "cuda"
    synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]) as prof:
        step()
        synchronize(device)
    events = [e for e in prof.key_averages() if _own_us(e, cuda) > 0]
    total = sum(_own_us(e, cuda) for e in events)
    rows = []
    for e in sorted(events, key=lambda e: _own_us(e, cuda), reverse=True)[:top]:
        rows.append({"op": e.key, "calls": e.count, "self_ms": _own_us(e, cuda) / 1e3,
                     "self_%": 100 * _own_us(e, cuda) / max(total, 1)})
    return {"mixer": name, "impl": impl, "seq_len": seq_len, "total_self_ms": total / 1e3,
            "op_calls": sum(e.count for e in events), "top": rows,
            "timed": "GPU kernels, own device time" if cuda else "CPU operators, self time"}
