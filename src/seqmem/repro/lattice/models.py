"""The Lattice LM rows trained for the tables: one byte-level LM per (mixer, options), trained and scored on the
validation windows."""

from __future__ import annotations

from typing import Any

from seqmem.repro.common import fit_lm


def train_one(name: str, mixer: str, opts: dict[str, Any], cfg: dict[str, Any], task, seed: int) -> dict[str, Any]:
    """Train the byte LM of one row (``mixer`` with ``opts`` at the scale ``cfg``: AdamW, weight decay 0.1, 10 %
    warm-up, clip 1) on ``task`` and return its validation bits per byte (overall and by position), accuracy,
    parameters, time and loss curve."""
    from seqmem.models import LMConfig
    from seqmem.train import TrainConfig, evaluate

    lm_cfg = LMConfig(vocab_size=256, d_model=cfg["d_model"], n_layers=cfg["n_layers"], n_heads=cfg["n_heads"],
                      mixer=mixer, mixer_options=dict(opts))  # fmt: skip
    tc = TrainConfig(steps=cfg["steps"], batch_size=cfg["batch"], lr=cfg["lr"], weight_decay=0.1, warmup_frac=0.1,
                     clip=1.0, eval_every=0, eval_examples=cfg["eval_examples"],
                     eval_batch_size=min(32, cfg["eval_examples"]), log_every=max(1, cfg["steps"] // 10),
                     seed=seed)  # fmt: skip
    fit = fit_lm(lm_cfg, task, tc, seed=seed)
    model, res, secs = fit.model, fit.result, fit.seconds
    # the trainer evaluates at its last step on the same fixed val windows; reuse that instead of a second pass
    ev = res.final or evaluate(model, task, n_examples=cfg["eval_examples"],
                               batch_size=min(32, cfg["eval_examples"]))  # fmt: skip
    pos = {k: v for k, v in ev.items() if k.startswith("bpb_pos_")}
    hist = [{"step": h.get("step"), "loss": h.get("loss")} for h in res.history if "loss" in h]
    return {"model": name, "mixer": mixer, "options": opts, "params": model.num_parameters(),
            "val_bpb": ev.get("bpb", ev["loss"] / 0.6931471805599453), "val_acc": ev["accuracy"],
            "train_seconds": secs, "positions": pos, "history": hist}  # fmt: skip
