"""The synthetic topic-memory check (ours; not a paper table): block-local vs memory models on
:class:`seqmem.tasks.elastic_topic.ElasticTopicTask`, loss by in-block position."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from seqmem.repro.common import fit_lm, write_results
from seqmem.repro.elastic import checks as claims
from seqmem.repro.elastic.configs import OPTIMISER, TOPIC
from seqmem.repro.elastic.evaluation import token_losses
from seqmem.repro.elastic.models import lm_config, model_device, model_specs
from seqmem.tasks.elastic_topic import ElasticTopicTask


class TopicTask(ElasticTopicTask):
    """The registered ``elastic_topic`` task (:class:`seqmem.tasks.elastic_topic.ElasticTopicTask`) with this
    module's original signature and evaluation streams (``eval_data`` / ``test_data`` draw ``n_examples`` at once
    from ``eval_seed`` / ``eval_seed + 1``), so that ``seqmem repro elastic`` results are unchanged."""

    def __init__(self, vocab: int, topic: int, seq_len: int, eval_seed: int = 2_718_281) -> None:
        super().__init__(vocab_size=vocab, topic=topic, seq_len=seq_len, block_len=seq_len, eval_seed=eval_seed)

    def eval_data(self, n_examples: int):
        return self.sample(n_examples, torch.Generator().manual_seed(self.eval_seed))

    def test_data(self, n_examples: int):
        return self.sample(n_examples, torch.Generator().manual_seed(self.eval_seed + 1))


def topic_check(scale: str, seed: int) -> list[dict[str, Any]]:
    """Train Transformer++ / Elastic_exp / Elastic_uni / MemTrans on :class:`TopicTask`; loss by in-block position."""
    from seqmem.train import TrainConfig

    t = dict(TOPIC[scale])
    L, T = t["block_len"], t["block_len"] * t["n_blocks"]
    task = TopicTask(t["vocab"], t["topic"], T)
    xt, yt = task.test_data(t["eval_examples"])
    c = dict(d_model=t["d_model"], n_layers=t["n_layers"], n_heads=t["n_heads"], block_len=L, n1x=t["n_mem"])
    specs = model_specs(c)
    rows = []
    for name in ("Transformer++", "Mem. Transformer", "Elastic Memory_uni", "Elastic Memory_exp"):
        names, opts = specs[name]
        cfg = TrainConfig(
            steps=t["steps"],
            batch_size=t["batch"],
            lr=3e-3,
            **OPTIMISER,
            eval_examples=16,
            eval_batch_size=16,
            log_every=max(1, t["steps"] // 5),
            seed=seed,
        )
        m = fit_lm(lm_config(c, names, opts, vocab_size=t["vocab"]), task, cfg, seed=seed, device=model_device()).model
        ce = token_losses(m, xt, yt, batch=64).view(xt.shape[0], t["n_blocks"], L)
        q = max(1, L // 4)
        rows.append(
            {
                "model": name,
                "optimum ln(topic)": math.log(t["topic"]),
                "block 0, first quarter": float(ce[:, 0, :q].mean()),
                "blocks >= 1, first quarter": float(ce[:, 1:, :q].mean()),
                "blocks >= 1, last quarter": float(ce[:, 1:, -q:].mean()),
                "all tokens": float(ce.mean()),
            }
        )
        print(f"[elastic repro] topic task {name}: {rows[-1]}", flush=True)
    return rows


def _topic_section(out: Path, scale: str, seed: int, cmd: str) -> tuple[str, str]:
    t = TOPIC[scale]
    rows = topic_check(scale, seed)
    md = write_results(
        out,
        "topic_task",
        rows,
        title="Synthetic topic-memory check (ours; not a paper table)",
        command=cmd,
        scale_note=f"vocab {t['vocab']}, topic of {t['topic']} tokens, "
        f"{t['n_blocks']} blocks of {t['block_len']}, d_model {t['d_model']}, {t['n_layers']} layers "
        f"(memory at the last), memory 1x = {t['n_mem']}, {t['steps']} steps x batch {t['batch']}; "
        "loss in nats by in-block position",
    )
    return md, claims.topic(rows, t["topic"])
