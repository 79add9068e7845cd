"""``seqmem bench profile``: where one mixer's forward+backward time goes (torch.profiler, top ops by self time)."""

from __future__ import annotations

from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from seqmem.bench.speed import _step_fn, build


def profile_mixer(args: Any, device: torch.device, dtype: torch.dtype, name: str, seq_len: int,
                  impl: str = "fast", top: int = 15) -> dict[str, Any]:
    """Profile one forward+backward call after ``args.warmup`` unprofiled ones; return the top ops by self time and
    the op-call count."""
    m = build(name, args, impl, device, dtype)
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    x = torch.randn(args.batch, seq_len, args.d_model, generator=gen).to(device=device, dtype=dtype)
    x.requires_grad_(True)
    g = torch.randn(args.batch, seq_len, args.d_model, generator=gen).to(device=device, dtype=dtype)
    step = _step_fn(m, x, g)
    for _ in range(getattr(args, "warmup", 1)):
        step()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        step()
    events = prof.key_averages()
    total_self = sum(e.self_cpu_time_total for e in events)
    rows = []
    for e in sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]:
        rows.append({"op": e.key, "calls": e.count, "self_ms": e.self_cpu_time_total / 1e3,
                     "self_%": 100 * e.self_cpu_time_total / max(total_self, 1)})
    return {"mixer": name, "impl": impl, "seq_len": seq_len, "total_self_ms": total_self / 1e3,
            "op_calls": sum(e.count for e in events), "top": rows}
