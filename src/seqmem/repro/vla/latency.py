"""Fig. 3 of VLA on the CPU: forward latency of one mixer layer per model and length."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from seqmem.repro.common import write_results
from seqmem.repro.vla.configs import MODELS
from seqmem.repro.vla.report import plot


def exp_latency(out: Path, scale: str, cfg: dict[str, Any], command: str) -> list[dict[str, Any]]:
    """Fig. 3: forward latency of one mixer layer (B = 1, d = 128, H = 4, fp32, no grad) vs T."""
    from seqmem import build_mixer

    lc = cfg["latency"]
    d, H = cfg["d_model"], cfg["n_heads"]
    variants = {
        "softmax": ("attention", {}), "linear": MODELS["linear"], "deltanet": ("deltanet", {}),
        "deltanet_paper": ("vla_paper_deltanet", {}), "vla_reference_loop": ("vla", {"impl": "reference"}),
        "vla_fast_chunk20": ("vla", {"chunk_size": 20}), "vla_fast_chunk64": ("vla", {"chunk_size": 64}),
    }
    rows, times = [], {}
    for name, (mixer, opts) in variants.items():
        torch.manual_seed(0)
        m = build_mixer(mixer, d, n_heads=H, **opts).eval()
        for T in lc["Ts"]:
            if name == "vla_reference_loop" and T > lc["max_ref_T"]:
                continue
            x = torch.randn(1, T, d)
            with torch.no_grad():
                m(x[:, : min(T, 64)])  # warm-up
                ts = []
                for _ in range(lc["reps"]):
                    t0 = time.perf_counter()
                    m(x)
                    ts.append(time.perf_counter() - t0)
            ms = 1000 * statistics.median(ts)
            times[(name, T)] = ms
            rows.append({"model": name, "T": T, "ours ms": ms, "ours tokens/s": T / ms * 1000})
    for T in lc["Ts"]:
        if ("vla_reference_loop", T) in times:
            rows.append({"model": "speed-up fast(C=64) / reference loop", "T": T,
                         "ours ms": times[("vla_reference_loop", T)] / times[("vla_fast_chunk64", T)],
                         "paper": "14× (Triton vs Python loop, T=4096, T4 GPU)"})
    for r in rows:
        r.setdefault("paper", "—")
        r["scale"] = f"{scale}: CPU, {torch.get_num_threads()} thread(s), median of {lc['reps']}"
    write_results(out, "latency", rows, columns=["model", "T", "paper", "ours ms", "ours tokens/s", "scale"],
                  title="Forward latency of one layer (Fig. 3; paper: T4 GPU, softmax crossover ≈43K tokens)",
                  command=command, scale_note="single mixer layer, batch 1, d=128, H=4, fp32, CPU; "
                  "the paper's GPU numbers are not comparable (speed-up row only)")

    def draw(ax):
        for name in variants:
            pts = [(T, times[(name, T)]) for T in lc["Ts"] if (name, T) in times]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=name)

    plot(out / "latency.png", draw, "T", "forward latency (ms)", logx=True, logy=True)
    return rows
