"""Evaluation of trained Elastic-table models: per-token losses, PPL / bits per byte / LongPPL proxy per block,
the evaluator's sliding window, the memory layers of a model and training throughput (Table 8)."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from seqmem.mixers.elastic import Elastic


@torch.no_grad()
def token_losses(model, x: torch.Tensor, y: torch.Tensor, batch: int = 8) -> torch.Tensor:
    """Per-token cross-entropy (nats), shape (n, T)."""
    model.eval()
    dev = next(model.parameters()).device
    out = []
    for i in range(0, x.shape[0], batch):
        logits, _ = model(x[i : i + batch].to(dev))
        out.append(F.cross_entropy(logits.double().transpose(1, 2), y[i : i + batch].to(dev), reduction="none"))
    return torch.cat(out).cpu()


def summarise(ce: torch.Tensor, key: torch.Tensor | None, block_len: int) -> dict[str, Any]:
    mean = float(ce.mean())
    per_block = ce.view(ce.shape[0], -1, block_len).mean((0, 2)).tolist()
    r = {"ppl": math.exp(mean), "bpb": mean / math.log(2), "per_block_loss": per_block}
    if key is not None:
        r["n_key"] = int(key.sum())
        r["longppl"] = math.exp(float(ce[key].mean())) if int(key.sum()) else float("nan")
    return r


def set_window(model, window: int | None) -> None:
    for m in model.modules():
        if hasattr(m, "window") and type(m).__name__ == "Attention":
            m.window = window


def elastic_layers(model) -> list[Elastic]:
    return [m for m in model.modules() if isinstance(m, Elastic)]


def throughput(model, task, c: dict[str, Any], steps: int) -> float:
    """Training tokens per second (forward + backward + AdamW step) on a fixed batch."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = task.sample(c["batch"], torch.Generator().manual_seed(123))
    dev = next(model.parameters()).device
    x, y = x.to(dev), y.to(dev)
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        logits, _ = model(x)
        F.cross_entropy(logits.reshape(-1, 256).float(), y.reshape(-1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return x.numel() / float(np.median(times[1:]))
