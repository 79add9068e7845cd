"""``seqmem repro lattice``: its options and the run over the chosen experiments (``summary.json`` at the end)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from seqmem.cliargs import comma_list
from seqmem.repro.common import write_json
from seqmem.repro.lattice.configs import CONFIGS, CONTEXT_MODELS
from seqmem.repro.lattice.context import parse_contexts, parse_models, run_context
from seqmem.repro.lattice.lm import run_lm
from seqmem.repro.lattice.speed import run_speed

EXPERIMENTS = ["speed", "lm", "ablation", "vnorm", "context"]
DEFAULT_EXPERIMENTS = ["speed", "lm", "ablation"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--experiments", default=",".join(DEFAULT_EXPERIMENTS),
                        help="comma-separated: speed,lm,ablation (default), vnorm (not in the paper) and context "
                             "(the context-length sweep with several seeds)")
    parser.add_argument("--steps", type=int, default=None,
                        help="override the training steps of every LM experiment (default: the scale's)")
    parser.add_argument("--corpus", default=None,
                        help="LM corpus: code, docs or a path (default: code for lm/ablation/vnorm, docs for context)")
    parser.add_argument("--contexts", default=None,
                        help="context: comma-separated context lengths (default per scale, small: 128,256,512,1024)")
    parser.add_argument("--models", default=None,
                        help="context: comma-separated subset of the rows (default all: "
                             + ", ".join(CONTEXT_MODELS) + ")")
    parser.add_argument("--seeds", type=int, default=None,
                        help="context: number of seeds (seed, seed+1, ...; default per scale, small: 3)")


def run(args: argparse.Namespace) -> int:
    scale = args.scale
    cfg = dict(CONFIGS[scale])
    if getattr(args, "steps", None):
        cfg["steps"] = int(args.steps)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    exps = comma_list(getattr(args, "experiments", ",".join(DEFAULT_EXPERIMENTS)))
    bad = [e for e in exps if e not in EXPERIMENTS]
    if bad:
        raise ValueError(f"unknown experiment(s) {bad}; valid: {EXPERIMENTS}")
    corpus_arg = getattr(args, "corpus", None)
    corpus = corpus_arg or "code"
    seed = int(getattr(args, "seed", 0))
    lengths = parse_contexts(getattr(args, "contexts", None), cfg["ctx_lengths"])
    n_seeds = getattr(args, "seeds", None)
    n_seeds = int(cfg["ctx_seeds"] if n_seeds is None else n_seeds)
    models = parse_models(getattr(args, "models", None))
    if getattr(args, "steps", None):
        cfg["ctx_steps"] = int(args.steps)
    command = f"seqmem repro lattice --scale {scale} --experiments {','.join(exps)} --seed {seed}" + (
        f" --steps {args.steps}" if getattr(args, "steps", None) else ""
    ) + (f" --corpus {corpus_arg}" if corpus_arg else "") + (
        f" --contexts {','.join(map(str, lengths))} --seeds {n_seeds}" if "context" in exps else ""
    ) + (f" --models '{','.join(models)}'" if getattr(args, "models", None) else "")
    summary: dict[str, Any] = {"scale": scale, "config": cfg, "command": command}
    t0 = time.perf_counter()
    if "speed" in exps:
        summary["speed"] = run_speed(cfg, out, command)
    for which in ("lm", "ablation", "vnorm"):
        if which in exps:
            res = run_lm(cfg, out, command, seed, corpus, which)
            summary[which] = [{k: r[k] for k in ("model", "val_bpb", "params", "train_seconds")} for r in res]
    if "context" in exps:
        res = run_context(cfg, out, command, seed, corpus_arg or "docs", lengths, n_seeds, models)
        summary["context"] = [{k: r[k] for k in ("model", "T", "seed", "val_bpb", "bpb_last", "params",
                                                 "train_seconds")} for r in res]  # fmt: skip
    summary["seconds"] = time.perf_counter() - t0
    write_json(out / "summary.json", summary)
    return 0
