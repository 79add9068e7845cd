"""``seqmem bench train``: the cost of one training step of a small language model with each mixer.

One step = forward of the whole model, cross-entropy, backward and an AdamW update, at the demo's size by default
(2 layers, d_model 128, 2 heads, SwiGLU, vocab 32, 32 tokens, batch 32; lengths scaled by the sweep's length rule);
``--scored`` sets the fraction of positions with a target, as in a recall task, where training evaluates the head
(and the last block's MLP) at those positions only (``--full-head``: at every position, for comparison).
The median over repeats of wall-clock time, and tokens per second, so that an experiment's budget is
``steps × seconds/step × runs``.  Measured, never asserted in tests."""

from __future__ import annotations

import statistics
from typing import Any

import torch

from seqmem.io import table_lines


def train_step_seconds(mixer: str, d_model: int = 128, n_layers: int = 2, n_heads: int = 2, vocab: int = 32,
                       seq_len: int = 32, batch: int = 32, repeats: int = 5, warmup: int = 2,
                       seed: int = 0, scored: float = 1.0, full_head: bool = False,
                       options: dict[str, Any] | None = None, compile: bool = False,
                       device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """Median seconds of one training step of the LM with ``mixer`` in every layer (see the module docstring).

    ``scored``: the fraction of positions with a target (1.0: language modelling; a recall task scores a few
    percent), drawn at random; the step computes the loss as training does (the head and the last MLP at the
    scored positions only), or, with ``full_head``, from the logits of every position.  ``options``: mixer
    options on top of the length rule's (:func:`seqmem.sweep.fair_options`).  ``compile``: the step's forward and
    backward through ``torch.compile`` as ``seqmem train --compile`` runs them; the first call (the compile) is
    timed apart as ``compile_seconds`` and is not a repeat.  ``device`` / ``dtype``: where and in what the model
    trains; on CUDA the device is warmed up before the first step and each step is timed with CUDA events."""
    from seqmem.bench.common import timed_call, warm_up_device
    from seqmem.models import LanguageModel, LMConfig
    from seqmem.sweep import fair_options
    from seqmem.sweep.runner import peak_state
    from seqmem.train.loop import prepare_compile, scored_loss

    if not 0.0 < scored <= 1.0:
        raise ValueError(f"scored must be a fraction in (0, 1], got {scored!r}")

    torch.manual_seed(seed)
    mixer_options = {**fair_options(mixer, seq_len), **(options or {})}
    model = LanguageModel(LMConfig(vocab_size=vocab, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                                   mixer=mixer, mixer_options=mixer_options))
    device = torch.device(device)
    model = model.to(device=device, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab, (batch, seq_len), generator=g)
    y = torch.randint(0, vocab, (batch, seq_len), generator=g)
    if scored < 1.0:
        y = y.masked_fill(torch.rand(batch, seq_len, generator=g) >= scored, -100)
        y.view(-1)[0] = 0  # at least one scored position
    x, y = x.to(device), y.to(device)
    warm_up_device(device, dtype)

    if compile:
        prepare_compile(model, seq_len)
    fwd = torch.compile(model) if compile else model

    def step() -> None:
        loss = scored_loss(fwd, x, y, sparse=not full_head)[0]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    extra: dict[str, Any] = {}
    if compile:
        extra["compile_seconds"] = timed_call(step, device)
    for _ in range(warmup):
        timed_call(step, device)
    times = [timed_call(step, device) for _ in range(repeats)]
    med = statistics.median(times)
    return {"mixer": mixer, "device": str(device), "dtype": str(dtype).replace("torch.", ""),
            "seconds_per_step": med, "tokens_per_s": batch * seq_len / med,
            "min_seconds": min(times), "params": model.num_parameters(), "state": peak_state(model, seq_len),
            "options": mixer_options, "scored": scored, "full_head": full_head, "compiled": compile, **extra}


def markdown(rows: list[dict[str, Any]], steps: int = 1000) -> str:
    """One line per mixer, fastest first; rows with a ``"compiled"`` twin (``bench train --compile``) add its
    ms / step, the ratio to eager and the one-off compile time."""
    twin = any(r.get("compiled_twin") for r in rows)
    header = ["mixer", "ms / step", "tokens / s", "s per 1,000 steps", "params", "peak state"] + (
        ["compiled ms / step", "compiled / eager", "compile s"] if twin else [])

    def line(r: dict[str, Any]) -> list[str]:
        out = [f"`{r['mixer']}`", f"{r['seconds_per_step'] * 1e3:.1f}", f"{r['tokens_per_s']:,.0f}",
               f"{r['seconds_per_step'] * steps:.0f}", f"{r['params']:,}", f"{r['state']:,}"]
        c = r.get("compiled_twin")
        if twin:
            out += ["—", "—", "—"] if not c else [f"{c['seconds_per_step'] * 1e3:.1f}",
                                                  f"{c['seconds_per_step'] / r['seconds_per_step']:.2f}",
                                                  f"{c['compile_seconds']:.0f}"]
        return out

    body = (line(r) for r in sorted(rows, key=lambda r: r["seconds_per_step"]))
    return "\n".join(table_lines(header, body, numeric=True)) + "\n"
