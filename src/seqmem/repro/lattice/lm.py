"""The Lattice LM tables: Table 2 in miniature (``lm``), Table 4's ablation ladder (``ablation``) and the
value-normalisation check that is not in the paper (``vnorm``), each with its bits-per-byte-by-position plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from seqmem.repro.common import figure, write_results
from seqmem.repro.lattice.configs import LADDER, MODELS, VNORM
from seqmem.repro.lattice.models import train_one
from seqmem.repro.lattice.paper import PAPER_T2


def plot_positions(results: list[dict[str, Any]], path: Path, title: str) -> None:
    """Validation bits per byte by context position, one line per trained row."""
    with figure(path, figsize=(7, 4), dpi=110) as (_fig, ax):
        for r in results:
            pos = r["positions"]
            if not pos:
                continue
            keys = sorted(pos, key=lambda s: int(s.split("_")[2]))
            xs = [(int(s.split("_")[2]) + int(s.split("_")[3])) / 2 for s in keys]
            ax.plot(xs, [pos[s] for s in keys], marker="o", label=r["model"])
        ax.set_xlabel("context position (bytes)")
        ax.set_ylabel("val bits per byte")
        ax.set_title(title)
        ax.legend(fontsize=7)


def run_lm(cfg: dict[str, Any], out: Path, command: str, seed: int, corpus: str, which: str) -> list[dict[str, Any]]:
    """Train the rows of ``which`` (``lm``: Table 2's models, ``ablation``: Table 4's ladder, ``vnorm``) on the byte
    corpus ``corpus``; write the table ``which`` beside the paper's numbers and ``which_bpb_vs_position.png``."""
    from seqmem.tasks.lm import LMTask

    task = LMTask(corpus, seq_len=cfg["seq_len"], max_files=cfg["max_files"], n_buckets=8)
    results = []
    if which == "lm":
        todo = [(n, m, o, PAPER_T2[n]) for n, (m, o) in MODELS.items()]
    elif which == "vnorm":
        todo = [(n, m, o, p) for n, (m, o, p) in VNORM.items()]
    else:
        todo = [(n, m, o, p) for n, (m, o, p) in LADDER.items()]
    for name, mixer, opts, paper in todo:
        r = train_one(name, mixer, opts, cfg, task, seed)
        r["paper"] = paper
        results.append(r)
        print(f"[lattice/{which}] {name}: val bpb {r['val_bpb']:.4f} ({r['params']} params, "
              f"{r['train_seconds']:.0f}s)", flush=True)  # fmt: skip
    scale = (f"{cfg['n_layers']} layers x d={cfg['d_model']}, {cfg['n_heads']} heads, byte-level {corpus!r} corpus, "
             f"T={cfg['seq_len']}, {cfg['steps']} steps x {cfg['batch']} seqs "
             f"(~{cfg['steps'] * cfg['batch'] * cfg['seq_len'] / 1e3:.0f}k bytes), seed {seed}")  # fmt: skip
    if which == "vnorm":
        rows = [{"model": r["model"], "paper": r["paper"], "ours_val_bpb": r["val_bpb"], "ours_params": r["params"],
                 "scale": "ours: see scale note"} for r in results]  # fmt: skip
        cols = ["model", "paper", "ours_val_bpb", "ours_params", "scale"]
        title = "Not in the paper: L2-normalised values (v_norm) for Lattice-ENC/DEC (val bits per byte)"
    elif which == "lm":
        rows = [{"model": r["model"], "paper_pile2k_ppl": r["paper"][0], "paper_books512_ppl": r["paper"][1],
                 "ours_val_bpb": r["val_bpb"], "ours_params": r["params"], "scale": "ours: see scale note; "
                 "paper: 110M params, 2.4B tokens"} for r in results]  # fmt: skip
        cols = ["model", "paper_pile2k_ppl", "paper_books512_ppl", "ours_val_bpb", "ours_params", "scale"]
        title = "Table 2 in miniature: LM quality (paper: perplexity; ours: bits per byte; lower is better)"
    else:
        rows = [{"configuration": r["model"], "paper_ppl": r["paper"], "ours_val_bpb": r["val_bpb"],
                 "ours_params": r["params"], "scale": "ours: see scale note; paper: 125M, the Pile"}
                for r in results]  # fmt: skip
        cols = ["configuration", "paper_ppl", "ours_val_bpb", "ours_params", "scale"]
        title = "Table 4 ablation ladder in the Lattice block (paper: Pile ppl; ours: val bits per byte)"
    write_results(out, which, rows, columns=cols, title=title, command=command, scale_note=scale,
                  extra={"runs": results})  # fmt: skip
    plot_positions(results, out / f"{which}_bpb_vs_position.png", f"{title.split(':')[0]} — val bpb by position")
    return results
