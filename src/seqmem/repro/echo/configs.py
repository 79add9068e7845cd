"""Scales (the ``small`` one as a base and, per scale, the keys that differ) and the model rows of ``seqmem repro
echo`` as data."""

from __future__ import annotations

from typing import Any

MODELS = ("ssm", "ssm_attn", "ssm_ska")
LABEL = {"ssm": "SSM", "ssm_attn": "SSM+Attn", "ssm_ska": "SSM+SKA"}

#: the ``small`` scale; every other scale is this plus the keys in :data:`DIFF`
BASE: dict[str, Any] = dict(
    d=64, heads=2, rank=16, d_state=16, steps=1500, batch=16, lr=3e-3, eval_n=48, niah=[64, 128, 256, 512],
    grid="small", mqar_cells=[], mqar_steps=0, mqar_eval=0,
)
DIFF: dict[str, dict[str, Any]] = {
    "smoke": dict(d=32, rank=8, d_state=8, steps=4, batch=4, eval_n=8, niah=[64, 128], grid="smoke",
                  mqar_cells=[(2, 16)], mqar_steps=2, mqar_eval=4),
    "small": {},
    "paper": dict(d=128, heads=4, rank=24, steps=6000, lr=3e-4, eval_n=256, niah=[64, 128, 256, 512, 1024, 2048, 4096],
                  grid="paper", mqar_cells=[(4, 64), (4, 256), (4, 1024), (32, 64), (32, 256), (32, 1024)],
                  mqar_steps=3000, mqar_eval=256),
}  # fmt: skip
SCALES: dict[str, dict[str, Any]] = {s: {**BASE, **d} for s, d in DIFF.items()}
