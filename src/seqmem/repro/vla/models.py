"""The VLA models trained for the tables: the 2-layer LM of a model row, trained and scored with the paper's
optimiser (a diverged run is a result, not a crash), and the MQAR task in the paper's layout."""

from __future__ import annotations

import time
from typing import Any

from seqmem.repro.common import fit_lm
from seqmem.repro.vla.configs import ALL_MODELS


def train_one(model_key: str, task, steps: int, lr: float, seed: int, cfg: dict[str, Any], batch: int,
              eval_tasks: dict[str, Any] | None = None, eval_every: int = 0) -> dict[str, Any]:
    """Train the 2-layer LM of ``model_key`` on ``task`` (AdamW, weight decay 0.01, 10 % warm-up + cosine, clip 1)
    and score it, plus on each of ``eval_tasks``; a diverged run comes back with NaN loss and accuracy."""
    from seqmem.models import LMConfig
    from seqmem.train import TrainConfig, evaluate

    mixer, opts = ALL_MODELS[model_key]
    lm_cfg = LMConfig(vocab_size=task.vocab_size, d_model=cfg["d_model"], n_layers=2, n_heads=cfg["n_heads"],
                      mixer=mixer, mixer_options=opts, mlp_ratio=3.0)
    tc = TrainConfig(steps=steps, batch_size=batch, lr=lr, weight_decay=0.01, warmup_frac=0.1, clip=1.0,
                     betas=(0.9, 0.999), eval_every=eval_every, eval_examples=cfg["eval_examples"],
                     eval_batch_size=64, log_every=max(1, steps // 10), seed=seed)
    t0 = time.perf_counter()
    fit = fit_lm(lm_cfg, task, tc, seed=seed, keep_diverged=True)
    lm = fit.model
    try:
        if fit.diverged:
            raise FloatingPointError(fit.diverged)
        res = fit.result
        out = {"loss": res.final["loss"], "accuracy": res.final["accuracy"], "history": res.history,
               "diverged": False}
        for name, t in (eval_tasks or {}).items():
            ev = evaluate(lm, t, n_examples=cfg["eval_examples"], batch_size=64)
            out[f"{name}_accuracy"], out[f"{name}_loss"] = ev["accuracy"], ev["loss"]
    except FloatingPointError as e:  # report divergence as a result, not a crash
        out = {"loss": float("nan"), "accuracy": float("nan"), "history": [], "diverged": str(e)}
    out.update(model=model_key, lr=lr, seed=seed, steps=steps, seconds=time.perf_counter() - t0,
               params=sum(p.numel() for p in lm.parameters()))
    return out


def mqar_task(n: int, T: int | None = None, key_range: tuple[int, int] | None = None):
    """MQAR with ``n`` pairs in the VLA layout (vocabulary 128), length ``T`` (default 3n + 1)."""
    from seqmem.tasks.mqar import MQARTask

    return MQARTask(vocab_size=128, num_pairs=n, seq_len=T or 3 * n + 1, layout="vla", key_range=key_range)
