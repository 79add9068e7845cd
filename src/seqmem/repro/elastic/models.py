"""The models of the Elastic Memory tables: mixer stacks per row (memory matched at "1x"), the LM around them and
the paper's optimiser (Table 9) as a :class:`seqmem.train.TrainConfig`."""

from __future__ import annotations

from typing import Any

import torch

from seqmem.mixers.elastic import memory_layer_stack
from seqmem.repro.elastic.configs import OPTIMISER


def model_specs(c: dict[str, Any]) -> dict[str, tuple[list[str], list[dict[str, Any]]]]:
    """Mixer names / options per layer for every model of the main table (memory sizes matched at "1x")."""
    nl, L, n1 = c["n_layers"], c["block_len"], c["n1x"]
    base = {"block_len": L}

    def one_layer(mixer: str, opts: dict[str, Any]):
        names = memory_layer_stack(nl, mixer)
        return names, [dict(base, **opts) if n == mixer else dict(base) for n in names]

    # 1x: Elastic N x 2d floats at one layer == MemTrans queue N x 2d == Melodi n_layers x n_sum x d
    n_sum = max(1, 2 * n1 // nl)
    return {
        "Transformer++": (["block_attention"] * nl, [dict(base)] * nl),
        "Mem. Transformer": one_layer("memorizing", {"n_queue": n1}),
        "Infini-Transformer": (["infini"] * nl, [dict(base)] * nl),
        "Melodi": (["melodi"] * nl, [dict(base, n_summary=n_sum)] * nl),
        "Elastic Memory_uni": one_layer("elastic", {"hippo_n": n1, "sampling": "uniform"}),
        "Elastic Memory_exp": one_layer("elastic", {"hippo_n": n1, "sampling": "exponential"}),
    }


def lm_config(c: dict[str, Any], names: list[str], opts: list[dict[str, Any]], vocab_size: int = 256):
    """The :class:`seqmem.models.LMConfig` of one row (bytes by default)."""
    from seqmem.models import LMConfig

    return LMConfig(
        vocab_size=vocab_size,
        d_model=c["d_model"],
        n_layers=c["n_layers"],
        n_heads=c["n_heads"],
        mixer=names,
        mixer_options=opts,
    )


def model_device() -> str | None:
    """The GPU when one is present (``--scale paper`` needs it), else ``None`` (the CPU)."""
    return "cuda" if torch.cuda.is_available() else None


def build_model(c: dict[str, Any], names: list[str], opts: list[dict[str, Any]]):
    from seqmem.models import LanguageModel

    return LanguageModel(lm_config(c, names, opts)).to(model_device() or "cpu")


def train_cfg(c: dict[str, Any], seed: int):
    from seqmem.train import TrainConfig

    # paper's optimiser (Table 9): AdamW 2e-3 with OPTIMISER's betas / weight decay / clip / warmup, cosine
    return TrainConfig(
        steps=c["steps"],
        batch_size=c["batch"],
        lr=2e-3,
        **OPTIMISER,
        eval_every=0,
        eval_examples=max(4, c["eval_examples"] // 4),
        eval_batch_size=8,
        log_every=max(1, c["steps"] // 10),
        seed=seed,
    )
