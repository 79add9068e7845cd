"""Tables 12 and 13: HiPPO reconstruction of synthetic signals and of a trained model's memory-layer K/V."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from seqmem.ops.hippo import hippo_compress, hippo_reconstruct, legs_matrices
from seqmem.repro.elastic.evaluation import elastic_layers
from seqmem.repro.elastic.paper import PAPER_T12, PAPER_T13


def _sines(n_waves: int, T: int, rng: np.random.Generator) -> np.ndarray:
    t = (np.arange(T) + 0.5) / T
    f = np.zeros(T)
    for _ in range(n_waves):
        f += rng.uniform(0.5, 1.0) * np.sin(2 * np.pi * rng.uniform(1, 5) * t + rng.uniform(0, 2 * np.pi))
    return f


def gbt_compress(f: np.ndarray, N: int, alpha: float) -> np.ndarray:
    """LegS with the generalized bilinear transform, step 1/(k+1) (forward α=0, backward α=1, bilinear ½)."""
    A, B = (z.numpy() for z in legs_matrices(N))
    c = np.zeros(N)
    eye = np.eye(N)
    for k, fk in enumerate(f):
        d = 1.0 / (k + 1)
        c = np.linalg.solve(eye + alpha * d * A, (eye - (1 - alpha) * d * A) @ c + d * B * fk)
    return c


def table12(trials: int, seed: int) -> list[dict[str, Any]]:
    T, rng = 1024, np.random.default_rng(seed)
    left = torch.arange(T, dtype=torch.float64)  # the paper's uniform points x_j = j t / L_mem, L_mem = T
    mid = left + 0.5

    def mse(c: torch.Tensor, f: np.ndarray, pts: torch.Tensor) -> float:
        rec = hippo_reconstruct(c.reshape(1, -1, 1), float(T), pts)[0, :, 0].numpy()
        return float(np.mean((rec - f) ** 2))

    rows = []
    cases = [
        ("1 sine", 1, "ZOH", 32),
        ("3 sines", 3, "ZOH", 32),
        ("5 sines", 5, "ZOH", 32),
        ("5 sines", 5, "forward", 32),
        ("5 sines", 5, "backward", 32),
        ("5 sines", 5, "bilinear", 32),
        ("noise N=32", 0, "ZOH", 32),
        ("noise N=128", 0, "ZOH", 128),
        ("noise N=512", 0, "ZOH", 512),
    ]
    for name, waves, disc, N in cases:
        el, em = [], []
        for _ in range(trials):
            f = _sines(waves, T, rng) if waves else rng.standard_normal(T)
            if disc == "ZOH":
                c = hippo_compress(torch.tensor(f)[:, None], N, block_len=256)[0, :, 0]
            else:
                c = torch.tensor(gbt_compress(f, N, {"forward": 0.0, "backward": 1.0, "bilinear": 0.5}[disc]))
            el.append(mse(c, f, left))
            em.append(mse(c, f, mid))
        rows.append(
            {
                "signal": name,
                "N": N,
                "length": T,
                "discretization": disc,
                "paper MSE": PAPER_T12[(name, disc)],
                "ours MSE (paper's uniform x_j = j)": float(np.mean(el)),
                "ours MSE (cell midpoints)": float(np.mean(em)),
                "trials": trials,
            }
        )
    return rows


# ------------------------------------------------------------------------------------------------ Table 13
@torch.no_grad()
def table13(model, x: torch.Tensor, c: dict[str, Any], ppl_by_n: dict[int, float]) -> list[dict[str, Any]]:
    """Reconstruction MSE of the memory layer's real raw K/V (one trained model) when compressed with N."""
    layer = elastic_layers(model)[0]
    grabbed: list[torch.Tensor] = []
    hook = layer.register_forward_hook(lambda mod, inp, out: grabbed.append(inp[0].detach()))
    model.eval()
    model(x.to(next(model.parameters()).device))
    hook.remove()
    h = grabbed[0].double()
    _, k, v = layer.qkv(h.to(layer.qkv.weight.dtype)).double().chunk(3, -1)
    sig = torch.cat([k, v], -1)  # (n, T, 2 d_model)
    T = sig.shape[1]
    mid = torch.arange(T, dtype=torch.float64) + 0.5
    rows = []
    for mult in (1, 2, 4, 8, 16):
        N = c["n1x"] * mult
        if N > 4 * T:
            continue
        coef = hippo_compress(sig, N, block_len=c["block_len"])
        rec = hippo_reconstruct(coef, float(T), mid)
        err = float(((rec - sig) ** 2).mean())
        rows.append(
            {
                "memory": f"{mult}x",
                "N (ours)": N,
                "N (paper)": 540 * mult,
                "paper recon MSE": PAPER_T13[mult][0],
                "ours recon MSE": err,
                "ours relative MSE": err / float((sig**2).mean()),
                "paper PPL": PAPER_T13[mult][1],
                "ours PPL (trained at this N)": ppl_by_n.get(N),
            }
        )
    return rows
