"""The automatic checks of the paper's claims: one line of text per table, from that table's rows."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

LEFT = "ours MSE (paper's uniform x_j = j)"


def table12(rows12: list[dict[str, Any]]) -> str:
    zoh = {r["signal"]: r[LEFT] for r in rows12 if r["discretization"] == "ZOH"}
    bil = next(r for r in rows12 if r["discretization"] == "bilinear")[LEFT]
    return (
        f"Table 12: smooth MSE rises with components (1<3<5 sines): "
        f"{zoh['1 sine'] < zoh['3 sines'] < zoh['5 sines']}; noise MSE falls with N: "
        f"{zoh['noise N=32'] > zoh['noise N=128'] > zoh['noise N=512']}; bilinear beats ZOH on 5 sines "
        f"(paper: yes): {bil < zoh['5 sines']}"
    )


def table2(ppl: dict[str, float]) -> str:
    tpp = ppl["Transformer++"]
    return (
        f"Table 2: Elastic_exp PPL < Transformer++ (paper: yes): {ppl['Elastic Memory_exp'] < tpp}; "
        f"Elastic_uni < Transformer++: {ppl['Elastic Memory_uni'] < tpp}; Elastic_exp best PPL "
        f"(paper: yes): {min(ppl, key=ppl.get) == 'Elastic Memory_exp'} (best: {min(ppl, key=ppl.get)}); "
        f"Elastic_exp < MemTrans (paper: yes): {ppl['Elastic Memory_exp'] < ppl['Mem. Transformer']}"
    )


def per_block(results: dict[str, dict[str, Any]]) -> str:
    def slope(pb: list[float]) -> float:
        half = len(pb) // 2
        return float(np.mean(pb[half:]) - np.mean(pb[1:half]))

    return "Per-block: late-minus-early-block loss (nats; negative = improves with block index): " + ", ".join(
        f"{n}: {slope(r['per_block_loss']):+.4f}" for n, r in results.items()
    )


def table5(swap_rows: list[dict[str, Any]]) -> str:
    sp = {r["model"].split("_")[1]: r["ours PPL"] for r in swap_rows}
    return (
        f"Table 5: uni-exp PPL < uni (paper: yes): {sp['uni-exp'] < sp['uni']}; exp-uni PPL > exp "
        f"(paper: yes): {sp['exp-uni'] > sp['exp']}"
    )


def table3(scal_rows: list[dict[str, Any]]) -> str:
    el = sorted((r["N / queue"], r["ours PPL"]) for r in scal_rows if r["model"] == "Elastic_exp")
    return (
        f"Table 3: Elastic_exp PPL monotone non-increasing in N (paper: yes): "
        f"{all(a[1] >= b[1] for a, b in zip(el, el[1:]))} ({', '.join(f'N={n}: {v:.3f}' for n, v in el)})"
    )


def table13(rows13: list[dict[str, Any]]) -> str:
    mses = [r["ours recon MSE"] for r in rows13]
    return (
        f"Table 13: recon MSE monotone non-increasing in N (paper: yes): "
        f"{all(a >= b - 1e-12 for a, b in zip(mses, mses[1:]))}"
    )


def table8(tps: dict[str, float], tps_big: float) -> str:
    return (
        f"Table 8: Elastic 1x within 20% of Transformer++ throughput: "
        f"{tps['Elastic Memory_exp'] / tps['Transformer++'] > 0.8}; Elastic faster than Melodi "
        f"(paper: yes): {tps['Elastic Memory_exp'] > tps['Melodi']}; throughput falls at larger N "
        f"(paper: yes): {tps_big < tps['Elastic Memory_exp']}"
    )


def topic(rows: list[dict[str, Any]], n_topic: int) -> str:
    r = {x["model"]: x["blocks >= 1, first quarter"] for x in rows}
    return (
        f"Topic task (memory carries a low-frequency summary across blocks): early-position loss in blocks "
        f">= 1 — Transformer++ {r['Transformer++']:.3f}, MemTrans {r['Mem. Transformer']:.3f}, Elastic_uni "
        f"{r['Elastic Memory_uni']:.3f}, Elastic_exp {r['Elastic Memory_exp']:.3f} (optimum "
        f"{math.log(n_topic):.3f}); Elastic_exp below Transformer++: "
        f"{r['Elastic Memory_exp'] < r['Transformer++']}"
    )
