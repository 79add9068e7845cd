"""Scales and model specs of ``seqmem repro vla`` as data."""

from __future__ import annotations

import copy
from typing import Any

SCALES = ["smoke", "small", "paper"]

MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "softmax": ("attention", {}),
    "linear": ("linear_attention", {"feature_map": "elu1", "normalize": True, "conv_size": None,
                                    "eps": 1e-4}),
    "deltanet_paper": ("vla_paper_deltanet", {}),
    "deltanet": ("deltanet", {}),
    "vla": ("vla", {}),
}
#: extra models selectable with --models (not run by default)
EXTRA_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "vla_nonorm": ("vla", {"normalizer": "none"}),
    "vla_unit_u": ("vla", {"u_scale": 1.0}),
    "vla_fixed_a": ("vla_fixed_a", {}),
    "vla_v2": ("vla_v2", {}),
}
ALL_MODELS = {**MODELS, **EXTRA_MODELS}

#: budgets per scale: ``paper`` follows Tables 3/6; ``small``: ≈45 min wall clock on a shared 2-core machine
CONFIGS: dict[str, dict[str, Any]] = {
    "smoke": dict(
        d_model=32, n_heads=2, batch=8, eval_examples=32, seeds=[42], lrs=[3e-3], lr_main=3e-3,
        copy=dict(seq_len=16, steps=3, batch=8), capacity=dict(ns=[2], steps=3), capacity_long=None,
        long=dict(n=2, Ts=[16], steps=3), ood=dict(ns=[2], steps=3),
        stability=dict(T=60, d=8, batch=2), jacobian=dict(ds=[8], T=30),
        latency=dict(Ts=[32, 64], reps=1, max_ref_T=64),
    ),
    "small": dict(
        d_model=128, n_heads=4, batch=32, eval_examples=256, seeds=[42], lrs=[3e-4, 3e-3], lr_main=3e-3,
        copy=dict(seq_len=64, steps=150, batch=16), capacity=dict(ns=[4, 8], steps=200),
        capacity_long=None, long=dict(n=8, Ts=[64], steps=150), ood=dict(ns=[8], steps=200),
        stability=dict(T=1000, d=32, batch=8), jacobian=dict(ds=[32, 64, 96, 128], T=200),
        latency=dict(Ts=[128, 512, 2048], reps=3, max_ref_T=2048),
    ),
    "paper": dict(
        d_model=128, n_heads=4, batch=64, eval_examples=960, seeds=[42, 123, 999], lrs=[3e-4, 1e-3, 3e-3],
        lr_main=3e-4,
        copy=dict(seq_len=64, steps=1500, batch=32), capacity=dict(ns=[4, 8, 16, 24], steps=2000),
        capacity_long=dict(ns=[32, 48], steps=1000), long=dict(n=8, Ts=[64, 128, 256, 512], steps=2000),
        ood=dict(ns=[8, 16, 24], steps=1000), stability=dict(T=1000, d=32, batch=8),
        jacobian=dict(ds=[32, 64, 96, 128], T=200), latency=dict(Ts=[128, 512, 2048, 4096], reps=5,
                                                                 max_ref_T=4096),
    ),
}  # fmt: skip


def scale_config(scale: str) -> dict[str, Any]:
    """A fresh copy of ``CONFIGS[scale]`` (the run overrides keys of it)."""
    if scale not in CONFIGS:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    return copy.deepcopy(CONFIGS[scale])
