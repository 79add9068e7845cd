"""``seqmem demo``: a small but real comparison of every registered mixer on MQAR.

Trains the same small language model (2 layers) with each mixer on multi-query associative recall, then prints
a table (mixer, state numbers per sequence, parameters, eval accuracy, time) and writes a PNG of accuracy against
state size.  Registry-driven: a newly registered mixer joins automatically.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass
class DemoConfig:
    vocab_size: int = 64
    num_pairs: int = 4
    seq_len: int = 32
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 2
    steps: int = 1200
    batch_size: int = 64
    lr: float = 3e-3
    eval_examples: int = 512
    seed: int = 0


#: Options whose paper defaults assume long contexts (a 2048-token block, a 64-token window, a 2048-slot queue)
#: are scaled to the demo's sequence length, so that windows, blocks and memories are actually exercised:
#: option name -> fraction of seq_len.
SCALED_OPTIONS = {"window": 0.25, "block_len": 0.25, "n_queue": 0.5}


def demo_options(name: str, seq_len: int) -> dict[str, Any]:
    """Options the demo passes to mixer ``name`` (see :data:`SCALED_OPTIONS`)."""
    from seqmem import get_entry

    entry = get_entry(name)
    valid = entry.valid_options()
    # an option switched off by the registered defaults (attention's window=None) stays off
    return {
        k: max(1, int(f * seq_len))
        for k, f in SCALED_OPTIONS.items()
        if k in valid and not (k in entry.defaults and entry.defaults[k] is None)
    }


def train_one(name: str, cfg: DemoConfig, threads: int = 1) -> dict[str, Any]:
    """Train one mixer on the demo task and return its row of the table."""
    import torch

    from seqmem.models import LanguageModel, LMConfig
    from seqmem.tasks.mqar import MQARTask
    from seqmem.train import TrainConfig, train

    torch.set_num_threads(threads)
    torch.manual_seed(cfg.seed)
    task = MQARTask(vocab_size=cfg.vocab_size, num_pairs=cfg.num_pairs, seq_len=cfg.seq_len)
    model = LanguageModel(LMConfig(vocab_size=task.vocab_size, d_model=cfg.d_model, n_layers=cfg.n_layers,
                                   n_heads=cfg.n_heads, mixer=name, mixer_options=demo_options(name, cfg.seq_len)))
    tcfg = TrainConfig(steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, seed=cfg.seed,
                       eval_examples=cfg.eval_examples, log_every=max(1, cfg.steps // 10))
    t0 = time.perf_counter()
    try:
        res = train(model, task, tcfg)
        acc, err = res.final["accuracy"], None
    except Exception as e:  # report the failure in the table instead of killing the demo
        acc, err = float("nan"), f"{type(e).__name__}: {e}"
    return {
        "mixer": name,
        "options": demo_options(name, cfg.seq_len),
        "state": model.state_size(cfg.seq_len),
        "params": model.num_parameters(),
        "accuracy": acc,
        "seconds": time.perf_counter() - t0,
        "error": err,
    }


def run_demo(cfg: DemoConfig, mixers: list[str], out: Path, jobs: int = 1, log=print) -> list[dict[str, Any]]:
    from seqmem.repro.common import atomic_write_text, machine_info, markdown_table

    rows: list[dict[str, Any]] = []
    threads = max(1, (os.cpu_count() or 1) // max(jobs, 1))
    t0 = time.perf_counter()
    if jobs > 1 and len(mixers) > 1:
        import multiprocessing as mp

        with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as ex:
            futs = {ex.submit(train_one, m, cfg, threads): m for m in mixers}
            for f in futs:
                rows.append(f.result())
                log(_progress_line(rows[-1], len(rows), len(mixers)))
    else:
        for m in mixers:
            rows.append(train_one(m, cfg, threads))
            log(_progress_line(rows[-1], len(rows), len(mixers)))
    rows.sort(key=lambda r: (-(r["accuracy"] if r["accuracy"] == r["accuracy"] else -1), r["state"]))
    for r in rows:
        r["note"] = _note(r)
    table = markdown_table(
        [{k: r[k] for k in ("mixer", "state", "params", "accuracy", "seconds", "note")} for r in rows]
    )
    info = machine_info()
    header = (
        f"MQAR: vocab {cfg.vocab_size}, {cfg.num_pairs} key-value pairs, length {cfg.seq_len}; "
        f"{cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads; {cfg.steps} steps of batch "
        f"{cfg.batch_size}, lr {cfg.lr}, seed {cfg.seed}. state = numbers per sequence held by the model after "
        f"{cfg.seq_len} tokens; accuracy = per-query accuracy on {cfg.eval_examples} held-out examples. "
        f"Windows, blocks and memory queues are scaled to the sequence length ({SCALED_OPTIONS}).\n"
        f"Machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']}; "
        f"total {time.perf_counter() - t0:.0f} s.\n\n"
    )
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "results.md", header + table)
    atomic_write_text(out / "results.json", json.dumps({"config": asdict(cfg), "machine": info, "rows": rows},
                                                        indent=2))
    plot_accuracy_vs_state(rows, out / "accuracy_vs_state.png", cfg)
    log("\n" + header + table)
    log(f"wrote {out / 'results.md'}, {out / 'results.json'}, {out / 'accuracy_vs_state.png'}")
    return rows


def _progress_line(r: dict[str, Any], i: int, n: int) -> str:
    extra = f"  FAILED ({r['error']})" if r["error"] else ""
    return f"[{i}/{n}] {r['mixer']:<24} acc {r['accuracy']:.3f}  state {r['state']:>9,}  {r['seconds']:.0f}s{extra}"


def _note(r: dict[str, Any]) -> str:
    if r["error"]:
        return "failed: " + r["error"][:80]
    if r["mixer"] == "attention" and not r["accuracy"] >= 0.99:
        return "BELOW the 0.99 target for attention"
    return ""


def plot_accuracy_vs_state(rows: list[dict[str, Any]], path: Path, cfg: DemoConfig) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from seqmem.repro.common import atomic_write_bytes

    fig, ax = plt.subplots(figsize=(8, 5))
    for r in rows:
        if r["accuracy"] == r["accuracy"]:
            ax.scatter(r["state"], r["accuracy"], s=30)
            ax.annotate(r["mixer"], (r["state"], r["accuracy"]), fontsize=7, xytext=(3, 3),
                        textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel(f"state size (numbers per sequence after {cfg.seq_len} tokens, log scale)")
    ax.set_ylabel("MQAR per-query accuracy")
    ax.set_ylim(-0.02, 1.05)
    ax.set_title(f"MQAR ({cfg.num_pairs} pairs, T={cfg.seq_len}): accuracy vs state size")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="train every registered mixer on MQAR; print a table, write a plot")
    d = DemoConfig()
    p.add_argument("--out", type=Path, default=Path("runs/demo"))
    p.add_argument("--mixers", default=None, help="comma-separated subset (default: all registered)")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--num-pairs", type=int, default=d.num_pairs)
    p.add_argument("--seq-len", type=int, default=d.seq_len)
    p.add_argument("--d-model", type=int, default=d.d_model)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="parallel training processes")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    import seqmem
    from seqmem.cli import UsageError, _check_out_dir

    names = seqmem.list_mixers()
    mixers = names if not args.mixers else [m.strip() for m in args.mixers.split(",") if m.strip()]
    unknown = [m for m in mixers if m not in names]
    if unknown:
        raise UsageError(f"unknown mixer(s) {unknown}; registered: {', '.join(names)}")
    for k in ("steps", "num_pairs", "seq_len", "d_model", "jobs"):
        if getattr(args, k) <= 0:
            raise UsageError(f"--{k.replace('_', '-')} must be positive")
    cfg = DemoConfig(steps=args.steps, num_pairs=args.num_pairs, seq_len=args.seq_len, d_model=args.d_model,
                     seed=args.seed)
    out = _check_out_dir(args.out)
    print(f"seqmem demo: {len(mixers)} mixers on MQAR, {args.jobs} process(es)", file=sys.stderr)
    run_demo(cfg, mixers, out, jobs=args.jobs, log=lambda s: print(s, flush=True))
    return 0
