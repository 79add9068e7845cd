"""``seqmem demo``: the main mixers (``--all``: every registered mixer) once on a small MQAR — a preset of the
sweep runner.

The demo is the packaged sweep spec ``demo`` (``src/seqmem/experiments/demo.toml``: one seed, one learning rate)
with the command line's overrides, run by :func:`seqmem.sweep.run_sweep` into ``<out>/runs`` (resumable: a second
``seqmem demo`` reuses finished runs; ``--fresh`` retrains).  It prints a table (mixer, peak state, parameters,
accuracy, seconds, note) and writes ``results.md``, ``results.json``, the sweep report and
``accuracy_vs_state.png``.  Registry-driven: a newly registered mixer joins automatically.  It is a tour, not a
ranking: the ranking with learning rates chosen on validation and several seeds is the ``compare`` sweep.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from seqmem.sweep.runner import peak_state  # noqa: F401  (re-exported)


@dataclass
class DemoConfig:
    """The demo's sizes; the defaults are those of the packaged ``demo`` spec (see its comments)."""

    vocab_size: int = 32
    num_pairs: int = 4
    seq_len: int = 32
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 2
    mlp_ratio: float = 4.0
    steps: int = 800
    batch_size: int = 32
    lr: float = 2e-3
    eval_examples: int = 512
    seed: int = 0


#: ``seqmem demo`` without ``--all``: each mechanism's main mixer, the variant the comparison found to work where the
#: paper's form does not (``ska`` with ``power=1``, ``vla`` with ``normalizer="none"``; docs/results/compare/) and
#: the reference baselines: 15.6 CPU-minutes for the committed runs (docs/results/demo/runs), ≈ 8 min on 2 idle cores
QUICK_ROWS: list[dict[str, Any]] = [
    {"name": "attention", "family": "baseline"},
    {"name": "deltanet", "family": "baseline"},
    {"name": "lattice", "family": "lattice"},
    {"name": "ska-k1", "layers": ["ska", "ska"], "options": {"power": 1}, "family": "echo"},
    {"name": "ska", "family": "echo"},
    {"name": "vla-no-normaliser", "layers": ["vla", "vla"], "options": {"normalizer": "none"}, "family": "vla"},
    {"name": "vla", "family": "vla"},
    {"name": "vort", "family": "vort"},
    {"name": "elastic", "family": "elastic"},
]


#: the committed demo's run records (a clone's docs/results/demo/runs): identical runs are taken from there
COMMITTED_RUNS = Path(__file__).resolve().parents[2] / "docs" / "results" / "demo" / "runs"


def demo_options(name: str, seq_len: int) -> dict[str, Any]:
    """Options the demo passes to mixer ``name``: the sweep's length rule (:data:`seqmem.sweep.LENGTH_RULE`)."""
    from seqmem.sweep import fair_options

    return fair_options(name, seq_len)


def demo_spec(cfg: DemoConfig, mixers: list[str | dict[str, Any]] | None = None) -> dict[str, Any]:
    """The packaged ``demo`` spec with ``cfg``'s sizes and the chosen mixers (default: all registered; a row may
    be a spec's ``[[mixers]]`` table, e.g. from :data:`QUICK_ROWS`)."""
    import tomllib

    from seqmem.sweep.spec import resolve_spec_path

    raw = tomllib.loads(resolve_spec_path("demo").read_text())
    raw["task"]["options"] = {"vocab_size": cfg.vocab_size, "num_pairs": cfg.num_pairs}
    raw["settings"] = [{"label": f"{cfg.num_pairs} pairs", "options": {"seq_len": cfg.seq_len}}]
    raw["model"] = {"d_model": cfg.d_model, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
                    "mlp_ratio": cfg.mlp_ratio}
    raw["train"].update({"steps": cfg.steps, "batch_size": cfg.batch_size, "lrs": [cfg.lr], "seeds": [cfg.seed],
                         "eval_examples": cfg.eval_examples})
    if mixers is not None:
        raw["mixers"] = list(mixers)
    return raw


def run_demo(cfg: DemoConfig, mixers: list[str | dict[str, Any]] | None, out: Path, jobs: int = 1, log=print,
             fresh: bool = False, threads: int = 1, confirm_above_s: float | None = None) -> list[dict[str, Any]]:
    from seqmem.io import atomic_write_text, machine_info
    from seqmem.sweep import collect, load_spec, run_sweep, write_report
    from seqmem.sweep.spec import length_rule_text

    spec = load_spec(demo_spec(cfg, mixers))
    runs = Path(out) / "runs"
    if fresh and runs.exists():
        shutil.rmtree(runs)
    t0 = time.perf_counter()
    reuse = [] if fresh or not COMMITTED_RUNS.is_dir() or COMMITTED_RUNS.resolve() == runs.resolve() \
        else [COMMITTED_RUNS]
    if reuse:
        log(f"runs identical to the committed ones in {COMMITTED_RUNS} are taken from there (--fresh trains them)")
    swept = run_sweep(spec, runs, jobs=jobs, threads=threads, log=log, confirm_above_s=confirm_above_s, reuse=reuse)
    write_report(spec, runs, out)
    rows = []
    for r in collect(spec, runs):
        p = next(p for p in spec.points() if p.mixer == r["mixer"])
        err_file = runs / p.rel_dir / "error.json"
        res_file = runs / p.rel_dir / "result.json"
        res = json.loads(res_file.read_text()) if res_file.exists() else {}
        err = json.loads(err_file.read_text())["error"] if err_file.exists() else res.get("error")
        acc = r.get("report_mean")
        note = _note(r, cfg, err)
        if res.get("reused_from"):
            note = "; ".join(n for n in (note, "committed run (docs/results/demo)") if n)
        rows.append({
            "mixer": r["mixer"], "options": p.run_spec["model"]["mixer_options"], "state": r["state"],
            "params": r["params"], "accuracy": float("nan") if acc is None else acc,
            "seconds": res.get("seconds", float("nan")), "error": err,
            "note": note,
        })
    rows.sort(key=lambda r: (-(r["accuracy"] if r["accuracy"] == r["accuracy"] else -1), r["state"] or 0))
    from seqmem.repro.common import markdown_table

    table = markdown_table([{k: r[k] for k in ("mixer", "state", "params", "accuracy", "seconds", "note")}
                            for r in rows])
    info = machine_info()
    header = (
        f"MQAR: vocab {cfg.vocab_size}, {cfg.num_pairs} key-value pairs, length {cfg.seq_len}; "
        f"{cfg.n_layers} layers, d_model {cfg.d_model}, {cfg.n_heads} heads; {cfg.steps} steps of batch "
        f"{cfg.batch_size}. ONE seed ({cfg.seed}) and ONE learning rate ({cfg.lr}) for every mixer, no lr "
        "selection: a tour of the library, not a ranking (the `compare` sweep ranks with lr chosen on validation "
        "and 3 seeds). Results depend on the seed and also on the CPU (float summation order). "
        f"state = the most numbers per sequence the model holds at any point of a {cfg.seq_len}-token sequence "
        f"(all layers); accuracy = per-query accuracy on {cfg.eval_examples} held-out examples. Lengths: "
        f"{length_rule_text()}.\n"
        f"Machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']}; training "
        f"{sum(r['seconds'] for r in rows if r['seconds'] == r['seconds']):.0f} s summed over the runs "
        f"({swept.get('ran', 0)} trained by this command in {time.perf_counter() - t0:.0f} s, the others by an "
        "earlier one).\n\n"
    )
    atomic_write_text(Path(out) / "results.md", header + table)
    atomic_write_text(Path(out) / "results.json", json.dumps({"config": asdict(cfg), "machine": info,
                                                              "rows": rows}, indent=2))
    log("\n" + header + table)
    log(f"wrote {Path(out) / 'results.md'}, results.json, report.md and accuracy_vs_state.png in {out}")
    return rows


def _note(r: dict[str, Any], cfg: DemoConfig, err: str | None) -> str:
    if err:
        return "failed: " + err[:80]
    if r["mixer"] == "attention" and not (r.get("report_mean") or 0) >= 0.99:
        return "BELOW the 0.99 target for attention"
    if r["cannot_reach_first_token"]:
        return "cannot see the whole sequence by design: " + r["length_note"]
    return ""


def train_one(name: str, cfg: DemoConfig, threads: int = 1) -> dict[str, Any]:
    """Train one mixer at the demo's size in a temporary directory; its row (``accuracy``, ``error``, ...)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        rows = run_demo(cfg, [name], Path(d), jobs=1, log=lambda s: None)
    return rows[0]


def add_parser(sub) -> None:
    d = DemoConfig()
    p = sub.add_parser(
        "demo",
        help="train the main mixers (--all: every registered mixer) on a small MQAR; print a table, write a plot "
             "(the quick tour: about 15 CPU-minutes, ≈ 8 min on 2 idle cores, or seconds where its committed runs "
             "are reused; --all: every mixer, its estimate printed before it starts)",
        description="A preset of `seqmem sweep`: the packaged `demo` spec (one seed, one lr) with these sizes. "
                    "Without --all or --mixers, the quick tour: " + ", ".join(r["name"] for r in QUICK_ROWS) +
                    ". Resumable: finished runs under OUT/runs are reused (--fresh retrains), so --all after the "
                    "quick tour trains only the other mixers.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    from seqmem.cliargs import out_path

    p.add_argument("--out", type=out_path, default=Path("runs/demo"), help="output directory")
    p.add_argument("--mixers", default=None,
                   help="comma-separated registered mixers (default: the quick tour's rows: " +
                        ", ".join(r["name"] for r in QUICK_ROWS) + ")")
    p.add_argument("--all", action="store_true",
                   help="every registered mixer (the full tour: several times the quick tour's ≈ 15 "
                        "CPU-minutes; its estimate is printed before anything starts)")
    p.add_argument("--yes", action="store_true",
                   help="start even when the estimated cost is above 30 CPU-minutes (without it the demo prints the "
                        "estimate and stops)")
    p.add_argument("--steps", type=int, default=d.steps, help="training steps per mixer")
    p.add_argument("--num-pairs", type=int, default=d.num_pairs, help="MQAR key-value pairs")
    p.add_argument("--seq-len", type=int, default=d.seq_len, help="sequence length")
    p.add_argument("--d-model", type=int, default=d.d_model, help="model width")
    p.add_argument("--vocab-size", type=int, default=d.vocab_size, help="vocabulary size")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="sequences per step")
    p.add_argument("--lr", type=float, default=d.lr, help="learning rate (one for every mixer)")
    p.add_argument("--seed", type=int, default=d.seed, help="seed")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                   help="parallel training processes")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads per process (default: OMP_NUM_THREADS if set, else 1)")
    p.add_argument("--fresh", action="store_true",
                   help="retrain instead of reusing finished runs (under OUT/runs, and the committed ones in a "
                        "clone's docs/results/demo/runs)")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    import seqmem
    from seqmem.cliargs import UsageError, comma_list
    from seqmem.cliargs import check_out_dir as _check_out_dir

    names = seqmem.list_mixers()
    if args.all and args.mixers:
        raise UsageError("give --all or --mixers, not both")
    mixers: list[Any] | None = None if args.all else comma_list(args.mixers) if args.mixers else None
    unknown = [m for m in mixers or [] if m not in names]
    if unknown:
        raise UsageError(f"unknown mixer(s) {unknown}; registered: {', '.join(names)}")
    for k in ("steps", "num_pairs", "seq_len", "d_model", "vocab_size", "batch_size", "jobs", "lr"):
        if not getattr(args, k) > 0:
            raise UsageError(f"--{k.replace('_', '-')} must be positive")
    cfg = DemoConfig(steps=args.steps, num_pairs=args.num_pairs, seq_len=args.seq_len, d_model=args.d_model,
                     vocab_size=args.vocab_size, batch_size=args.batch_size, lr=args.lr, seed=args.seed)
    try:  # the task validates its sizes (e.g. enough key and value tokens for the pairs): a usage error
        from seqmem.tasks.mqar import MQARTask

        MQARTask(vocab_size=cfg.vocab_size, num_pairs=cfg.num_pairs, seq_len=cfg.seq_len)
    except ValueError as e:
        raise UsageError(str(e)) from None
    out = _check_out_dir(args.out)
    from seqmem.cliargs import threads_note

    if not args.all and not args.mixers:
        mixers = QUICK_ROWS
    what = "every registered mixer (the full tour)" if mixers is None else \
        "the quick tour (`seqmem demo --all`: every mixer)" if mixers is QUICK_ROWS else "the chosen mixers"
    print(f"seqmem demo: {len(mixers or names)} mixers on MQAR, {what}; {args.jobs} process(es) of "
          f"{threads_note()}", file=sys.stderr)
    from seqmem.cliargs import LONG_JOB_CPU_S

    run_demo(cfg, mixers, out, jobs=args.jobs, log=lambda s: print(s, flush=True), fresh=args.fresh,
             threads=args.threads, confirm_above_s=None if args.yes else LONG_JOB_CPU_S)
    return 0
