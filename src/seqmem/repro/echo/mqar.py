"""§4.2 of Echo, scaled down: the MQAR grid with a distractor gap, one model trained per (model, M, gap) cell."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from seqmem.repro.common import fit_lm, write_results
from seqmem.repro.echo.grids import accuracy
from seqmem.repro.echo.models import hybrid_config, train_cfg
from seqmem.tasks.echo_tasks import EchoMQAR


def mqar_grid(out: Path, sc: dict, seed: int, command: str, scale: str) -> dict:
    """§4.2 MQAR grid, scaled down: one model per (model, M, gap) cell, d = sc['d'], 4 layers, the two special
    layers at 0-based {1, 2} (first/last stay Mamba-2)."""
    if not sc["mqar_cells"]:
        return {}
    res: dict[str, Any] = {}
    rows = []
    for M, gap in sc["mqar_cells"]:
        row: dict[str, Any] = {"M": M, "gap": gap}
        for name, special in (("Mamba-2", "mamba2"), ("Mamba-2+Attn", "attention"), ("Mamba-2+SKA", "ska")):
            cfg = hybrid_config(
                sc["d"],
                4,
                sc["heads"],
                [1, 2],
                special,
                rank=sc["rank"],
                chunk_size=64,
                d_state=sc["d_state"],
                vocab_size=128,
            )
            cfg.mixer_options = [
                ({"d_state": sc["d_state"]} if n == "mamba2" else o)
                for n, o in zip(cfg.mixer, cfg.mixer_options)
            ]
            task = EchoMQAR(num_pairs=M, gap=gap)
            tc = train_cfg(sc, steps=sc["mqar_steps"], seed=seed)
            tc.lr = 1e-3
            model = fit_lm(cfg, task, tc, seed=seed).model
            acc = accuracy(model, task, sc["mqar_eval"])
            paper = (
                "~3"
                if special == "mamba2"
                else ("<100 (n/r)" if (special == "attention" and M == 4 and gap == 4096) else 100)
            )
            row[f"paper {name}"] = paper
            row[f"ours {name}"] = acc
            res[f"{name}|M={M}|gap={gap}"] = acc
        rows.append(row)
    write_results(
        out,
        "mqar_grid",
        rows,
        title="§4.2 MQAR with distractor gap (scaled down; paper: 50M models)",
        command=command,
        scale_note=f"{scale}: d={sc['d']}, 4 layers, special layers 0-based {{1,2}}, "
        f"{sc['mqar_steps']} steps, chance = 1/40 values",
    )
    return res
