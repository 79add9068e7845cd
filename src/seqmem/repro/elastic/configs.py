"""Scales of ``seqmem repro elastic`` as data: one base configuration and, per scale, the keys that differ.

``small`` is the base (the committed docs/results/elastic run); ``smoke`` shrinks it to seconds; ``paper`` is the
paper's 100M model as we infer it from its Section 3.4 (only meaningful on a GPU; never run on CPU).
"""

from __future__ import annotations

from typing import Any

SCALES = ["smoke", "small", "paper"]

# ---- the paper's AdamW settings (Table 9; warmup 5% of the steps, not 1%), shared by every model trained here
OPTIMISER: dict[str, Any] = dict(weight_decay=0.1, warmup_frac=0.05, clip=1.0, betas=(0.9, 0.95))

# ---- the language-model tables (Tables 2, 3, 5/6, 8, 12, 13)
# n1x: memory "1x" (Elastic's N = MemTrans' queue = Melodi's summary budget); scaling: Elastic_exp memory sizes of
# Table 3 besides 1x; memtrans_scaling: MemTrans queue sizes of Table 3 besides 1x
BASE: dict[str, Any] = dict(
    d_model=64, n_layers=4, n_heads=4, block_len=32, n_blocks=16, batch=8, steps=90, n1x=32, scaling=[8, 128],
    memtrans_scaling=[128], eval_examples=64, tput_steps=3, max_files=None, table12_trials=20, table13_examples=16,
)  # fmt: skip
DIFF: dict[str, dict[str, Any]] = {
    "smoke": dict(
        d_model=32, n_layers=2, n_heads=2, block_len=8, n_blocks=4, batch=2, steps=2, n1x=8, scaling=[4, 16],
        memtrans_scaling=[16], eval_examples=4, tput_steps=1, max_files=60, table12_trials=2, table13_examples=2,
    ),
    "small": {},
    "paper": dict(
        d_model=720, n_layers=12, n_heads=8, block_len=2048, batch=2, steps=76300, n1x=540,
        scaling=[1080, 2160, 4320, 8640], memtrans_scaling=[8640], eval_examples=512, tput_steps=10,
        table13_examples=64,
    ),
}  # fmt: skip
CONFIGS: dict[str, dict[str, Any]] = {s: {**BASE, **DIFF[s]} for s in SCALES}

# ---- the synthetic topic-memory check (ours; the paper scale is the small one)
TOPIC_BASE: dict[str, Any] = dict(
    vocab=64, topic=4, block_len=16, n_blocks=8, d_model=32, n_layers=2, n_heads=2, batch=16, steps=250, n_mem=16,
    eval_examples=256,
)  # fmt: skip
TOPIC_DIFF: dict[str, dict[str, Any]] = {
    "smoke": dict(vocab=32, block_len=8, n_blocks=4, batch=4, steps=3, n_mem=8, eval_examples=8),
    "small": {},
    "paper": {},
}
TOPIC: dict[str, dict[str, Any]] = {s: {**TOPIC_BASE, **TOPIC_DIFF[s]} for s in SCALES}
