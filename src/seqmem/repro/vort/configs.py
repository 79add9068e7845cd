"""Scales of ``seqmem repro vort`` as data: the retrieval tables' (Tables 1-2) and the byte-LM table's (Table 3)."""

from __future__ import annotations

from typing import Any

SCALES = ["smoke", "small", "paper"]

CONFIGS: dict[str, dict[str, Any]] = {
    "smoke": dict(n1=128, n2=128, betas=[1.0], q1=8, E=3, M=4, d=16, heads=1, feats=8, S=8, steps=3, batch=2,
                  lr=3e-3, n_val=4, n_test=4, lam_grid=[1e-2, 1e-1], window=8, exact=True),
    "small": dict(n1=1024, n2=1024, betas=[1.0], q1=48, E=10, M=10, d=64, heads=1, feats=64, S=15, steps=40,
                  batch=8, lr=3e-3, n_val=16, n_test=32, lam_grid=[1e-3, 3e-3, 1e-2, 3e-2], window=16,
                  exact=True),
    "paper": dict(n1=10_000, n2=8_000, betas=[1.0, 1.5, 2.0], q1=256, E=20, M=20, d=128, heads=2, feats=64,
                  S=15, steps=3000, batch=8, lr=3e-4, n_val=200, n_test=1000,
                  lam_grid=[1e-4, 3e-4, 1e-3, 3e-3, 1e-2], window=64, exact=False),
}

LM_CONFIGS = {
    "smoke": dict(corpus="docs", max_files=20, seq_len=64, d=16, heads=1, feats=8, S=6, steps=2, batch=2,
                  lr=3e-3, eval_examples=4, n_buckets=2),
    "small": dict(corpus="docs", max_files=None, seq_len=512, d=64, heads=2, feats=32, S=10, steps=60, batch=8,
                  lr=3e-3, eval_examples=32, n_buckets=4),
    "paper": dict(corpus="docs", max_files=None, seq_len=8192, d=256, heads=4, feats=64, S=10, steps=5000, batch=8,
                  lr=3e-4, eval_examples=200, n_buckets=32),
}
