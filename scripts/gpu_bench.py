"""The layer speed table of scripts/gpu_check.sh, and docs/results/bench/gpu.md.

    python scripts/gpu_bench.py --budget S --json gpu.json [--lengths 4k,16k,64k] [--mixers a,b]
    python scripts/gpu_bench.py --write-md gpu.md --json gpu.json [--stages stages.tsv] [--versions v.txt]
    python scripts/gpu_bench.py --write-md gpu.md --not-run      # the page before any run

The first form runs ``seqmem bench speed`` (one layer, forward+backward, bfloat16, d_model 1024, 8 heads of 128,
batch 2; the sizes of the GPU issue) mixer by mixer in a fixed order — attention, the baselines on PyTorch and on
their GPU kernels (fla; mamba_ssm for mamba2) side by side, then the five mechanisms, then the rest — until the
budget is spent, writing the JSON after every mixer (so a run cut short keeps what it measured).  Mixers the budget
did not reach are listed as not run.  Each measurement is capped (``--max-seconds``); nothing is extrapolated.
The second form writes the Markdown page from that JSON and the check's stage outcomes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

FIRST = ["attention", "linear_attention", "deltanet", "gated_deltanet", "mamba2"]  # run with --backend both
MECHANISMS = ["ska", "vort", "vla", "lattice", "lattice_minibatch", "elastic"]
NOT_RUN = ("Not run yet: no GPU was at hand when `scripts/gpu_check.sh` was written, so this page holds no "
           "numbers. Run `bash scripts/gpu_check.sh` on a CUDA machine (after `bash scripts/gpu_check.sh prepare` "
           "where pip can reach PyPI, if that machine cannot) and commit the page it writes.")


def _order(mixers: list[str]) -> list[str]:
    head = [m for m in FIRST + MECHANISMS if m in mixers]
    return head + [m for m in mixers if m not in head]


def run_bench(args: argparse.Namespace) -> int:
    import torch

    from seqmem import list_mixers
    from seqmem.bench.common import device_name, parse_lengths
    from seqmem.bench.speed import run_speed
    from seqmem.io import machine_info

    t_end = time.monotonic() + args.budget
    device, dtype = torch.device(args.device), torch.bfloat16
    lengths = parse_lengths(args.lengths, [])
    mixers = _order(args.mixers.split(",") if args.mixers else list_mixers())
    machine = machine_info()
    payload: dict[str, Any] = {"bench": "speed", "card": device_name(device), "machine": machine,
                               "settings": {"dtype": "bfloat16", "d_model": args.d_model, "heads": args.heads,
                                            "batch": 2,
                                            "lengths": lengths, "max_seconds": args.max_seconds,
                                            "repeats": args.repeats, "warmup": 1},
                               "records": [], "not_reached": []}
    out = Path(args.json)
    for i, name in enumerate(mixers):
        left = t_end - time.monotonic()
        # a mixer needs at most 3 lengths x (warm-up + repeats) within the cap, twice with both backends
        need = 2 * args.max_seconds if name not in FIRST else 4 * args.max_seconds
        if left < min(need, 20):
            payload["not_reached"] = mixers[i:]
            break
        ns = argparse.Namespace(d_model=args.d_model, heads=args.heads, batch=2, seed=0, impl="fast",
                                repeats=args.repeats, warmup=1, ref_repeats=None, ref_warmup=None,
                                max_seconds=args.max_seconds, no_flops=True, no_floor=True,
                                gemm_sizes_parsed=[4096] if device.type == "cuda" else [64],
                                backend="both" if name in FIRST and name != "attention" else "default",
                                mixer_option_parsed={})
        try:
            res = run_speed(ns, device, dtype, [name], lengths, lengths, machine,
                            lambda msg: print(msg, file=sys.stderr, flush=True))
            payload["records"] += res["records"]
            payload.setdefault("gemm_peak", res["peak"])
        except Exception as e:  # noqa: BLE001 — one mixer's failure is recorded, the table goes on
            payload["records"].append({"mixer": name, "status": "error", "note": f"{type(e).__name__}: {e}"[:300]})
        if device.type == "cuda":
            torch.cuda.empty_cache()
        out.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    out.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    return 0


def _fmt(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def table(payload: dict[str, Any]) -> str:
    from seqmem.bench.common import fmt_len

    recs = [r for r in payload.get("records", []) if r.get("impl", "fast") == "fast"]
    lengths = payload["settings"]["lengths"]
    attn = {r["seq_len"]: r["median_ms"] for r in recs if r["mixer"] == "attention" and r.get("status") == "ok"}
    names = list(dict.fromkeys(r["mixer"] for r in recs))
    head = (["layer"] + [f"{fmt_len(n)} ms" for n in lengths]
            + ["attention's time / layer's at " + " · ".join(fmt_len(n) for n in lengths), "form"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names:
        by_n = {r.get("seq_len"): r for r in recs if r["mixer"] == name}
        cells, ratios, forms = [], [], set()
        for n in lengths:
            r = by_n.get(n)
            if r is None or r.get("status") != "ok":
                cells.append("–" if r is None else str(r.get("status", "–")))
                ratios.append("–")
                continue
            cells.append(_fmt(r["median_ms"]))
            ratios.append(f"{attn[n] / r['median_ms']:.2f}" if n in attn else "–")
            forms.add(r.get("form", "pytorch"))
        if all(c == "–" for c in cells) and any(r.get("status") == "error" for r in by_n.values()):
            note = next(r.get("note", "") for r in by_n.values() if r.get("status") == "error")
            cells = [f"error: {note[:80]}"] + ["–"] * (len(lengths) - 1)
        form = "; ".join(sorted(forms)) or "–"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {' · '.join(ratios)} | {form} |")
    return "\n".join(lines) + "\n"


def write_md(args: argparse.Namespace) -> int:
    path = Path(args.write_md)
    path.parent.mkdir(parents=True, exist_ok=True)
    title = "# GPU check: correctness on CUDA and layer speed (`scripts/gpu_check.sh`)\n\n"
    if args.not_run:
        path.write_text(title + NOT_RUN + "\n")
        return 0
    payload = json.loads(Path(args.json).read_text()) if args.json and Path(args.json).exists() else None
    info = {}
    if args.versions and Path(args.versions).exists():
        info = dict(line.split("\t", 1) for line in Path(args.versions).read_text().splitlines() if "\t" in line)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip() or "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
        commit += " (with uncommitted changes)" if dirty else ""
    except (OSError, subprocess.SubprocessError):
        commit = "unknown (no git)"
    text = title
    text += (f"Card: {info.get('card', 'unknown')}; driver {info.get('driver', 'unknown')}; torch "
             f"{info.get('torch', 'unknown')}; triton {info.get('triton', '—')}; fla {info.get('fla', '—')}; "
             f"mamba_ssm {info.get('mamba_ssm', '—')}; Python {info.get('python', '—')}. Date "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; commit {commit}.\n\n")
    text += "## Stages\n\n| stage | exit | seconds | outcome |\n|---|---:|---:|---|\n"
    if args.stages and Path(args.stages).exists():
        for line in Path(args.stages).read_text().splitlines():
            parts = line.split("\t")
            if len(parts) == 4:
                text += "| " + " | ".join(p.replace("|", "/") for p in parts) + " |\n"
    if args.logs:
        fails = []
        for stage in ("contract", "kernels"):
            log = Path(args.logs) / f"{stage}.log"
            if log.exists():
                fails += [f"{stage}: {ln.strip()}" for ln in log.read_text().splitlines()
                          if ln.startswith(("FAILED", "ERROR"))]
        if fails:
            text += "\nFailures (first 40):\n\n" + "".join(f"* `{f[:200]}`\n" for f in fails[:40])
    text += "\n## Layer speed: one layer forward+backward\n\n"
    if payload is None or not payload.get("records"):
        text += "Not measured in this run (the bench stage wrote no records; see its outcome above).\n"
    else:
        s = payload["settings"]
        where = payload.get("card") or "the CPU (a trial of the script, no GPU number)"
        text += (f"`seqmem bench speed` on {where}: {s['dtype']}, d_model {s['d_model']}, "
                 f"{s['heads']} heads of {s['d_model'] // s['heads']}, batch {s['batch']}, impl fast, median of up "
                 f"to {s['repeats']} repeats after a warm-up (CUDA events, after the device's own warm-up), each "
                 f"measurement capped at {s['max_seconds']:g} s: a length that would exceed the cap, and the longer "
                 "ones, are 'not run' — never extrapolated. `layer[fla]`: the same layer with the GPU kernel "
                 "backends on (fla; mamba_ssm for mamba2), its plain row on seqmem's PyTorch forms. form: the "
                 "forms the layer's ops ran. Ratio > 1: the layer is faster than attention (SDPA).\n\n")
        text += table(payload)
        if payload.get("not_reached"):
            text += f"\nNot reached within the budget: {', '.join(payload['not_reached'])}.\n"
        text += "\nRecords: [gpu.json](gpu.json).\n"
    path.write_text(text)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=float, default=240.0, help="seconds for the whole table")
    p.add_argument("--json", default=None, help="the records (written after every mixer; read by --write-md)")
    p.add_argument("--lengths", default="4k,16k,64k")
    p.add_argument("--mixers", default=None, help="comma-separated (default: every registered mixer)")
    p.add_argument("--max-seconds", type=float, default=8.0, help="cap per measurement")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cuda", help="cuda (the check); cpu only to try the script itself")
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--write-md", default=None, help="write the Markdown page here instead of measuring")
    p.add_argument("--stages", default=None)
    p.add_argument("--versions", default=None)
    p.add_argument("--logs", default=None)
    p.add_argument("--not-run", action="store_true", help="with --write-md: the page before any run")
    args = p.parse_args()
    if args.write_md:
        return write_md(args)
    if not args.json:
        p.error("--json is required to measure")
    return run_bench(args)


if __name__ == "__main__":
    sys.exit(main())
