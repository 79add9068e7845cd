"""The layer speed table of scripts/gpu_check.sh, and docs/results/bench/gpu.md.

    python scripts/gpu_bench.py --budget S --json gpu.json [--lengths 4k,16k,64k] [--mixers a,b]
    python scripts/gpu_bench.py --write-md gpu.md --json gpu.json [--stages stages.tsv] [--versions v.txt] [--logs D]
    python scripts/gpu_bench.py --write-md gpu.md --not-run      # the page before any run

The first form runs ``seqmem bench speed`` (one layer, forward+backward, bfloat16, d_model 1024, 8 heads of 128,
batch 2; the sizes of the GPU issue) row by row in a fixed order — attention, the baselines on seqmem's forms, the
five mechanisms, the rest, and last the baselines on their GPU kernels (fla; mamba_ssm for mamba2), whose first
call autotunes for minutes (the page shows them beside their own rows) — until the budget is spent.  The
baselines' own rows run seqmem's Triton kernels where it has them — linear_attention's and mamba2's ``ssd`` on the
chunked simple-GLA kernel, deltanet's and gated_deltanet's walk over chunks — as VORT's rows do for their
retention: the ``form`` column says ``triton``; ``SEQMEM_TRITON=0`` would time the PyTorch forms.  Before a row is
timed, one untimed, uncapped forward+backward at the shortest length pays its kernels' compilation and autotuning
(fla's autotune keys leave out the length, so one call covers every length; its seconds: ``warmup_s``), so no
capped measurement counts them.  A ``[fla]`` row whose kernels are not installed (``seqmem.backends.which_form``
says the PyTorch form would run) is recorded "not installed", not measured again.  A row is started only while
3 x the cap (``--max-seconds``) seconds are left, a kernel row only with ``KERNEL_WARMUP_S`` more.  The JSON lists
every row in ``not_reached`` from the start and drops each once it is done, and is rewritten (atomically) after
every row: a run cut short keeps what it measured and says what it never ran.  Nothing is extrapolated.

After the rows of attention, the baselines and the mechanisms on seqmem's own forms — before the other mixers' rows
and the kernels' — three passes run, each layer only while its time is left (``--no-decode`` / ``--no-profile`` /
``--no-syncs`` skip them): a decode pass, one token per step at contexts of 1k and 4k (batch 1; ``DECODE_MIXERS``,
``DECODE_S``): whether a step stays flat in context and how it compares with attention's; then a profile of each of
those rows at the middle length (torch.profiler after a warm call: the GPU kernels' own time, their calls and the
largest; ``PROFILE_S`` plus three of its calls), marked where the kernels sum to far less than the row's timed call or
the trace holds none: where a layer loses to its fla counterpart, the page says which kernels take the time; then a
count of each of those layers' waits for the device in a forward+backward and in a decode step at the shortest length
(``seqmem bench syncs``: ``torch.cuda.set_sync_debug_mode``, by source line; ``SYNCS_S``, ``--no-syncs``). The rows
timed after the profiles are said to be (``TEARDOWN_CUPTI=1`` is set, so that kineto releases the profiler).

The second form writes the Markdown page from that JSON (a truncated or missing one is reported, not fatal), the
check's stage outcomes, versions and logs (failed tests named from pytest's lines); it imports neither torch nor
seqmem, so the page is written even where they cannot be imported.  The commit comes from ``.whl/COMMIT``
(written by ``gpu_check.sh prepare`` just before the tree travels; git's reading beside it where that differs), or
from git where there is no such file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIRST = ["attention", "linear_attention", "deltanet", "gated_deltanet", "mamba2"]  # baselines: PyTorch and [fla]
MECHANISMS = ["ska", "vort", "vla", "lattice", "lattice_minibatch", "elastic"]
KERNEL_OP = {"linear_attention": "linear_attention", "deltanet": "delta_rule", "gated_deltanet": "gated_delta_rule",
             "mamba2": "ssd"}  # the op whose GPU kernel a baseline's [fla] row runs
PROFILE_TOP = 8  # kernels listed per profiled row
PROFILE_S = 10.0  # a row is profiled (two more forward+backwards at the middle length) only with this much + 3 of
# its measured calls left
DECODE_MIXERS = ["attention", "linear_attention", "deltanet", "gated_deltanet", "mamba2", "ska", "vort", "vla",
                 "lattice", "lattice_minibatch", "elastic"]  # the decode pass's layers, in this order
DECODE_CONTEXTS = [1024, 4096]  # its contexts: a step at 4k against attention's, and whether it stays flat
DECODE_S = 23.0  # a layer's decode starts only with this much left: at each of 2 contexts streaming and stepping,
# each capped at 5 s, and the build
SYNCS_S = 10.0  # a layer's host-read count (two forward+backwards and a prefill and two decode steps at the
# shortest length, the builds) starts only with this much left
SYNCS_TOP = 4  # source lines listed per layer
KERNEL_WARMUP_S = 150.0  # a [fla] row starts only with this much more left: its first call's autotuning (~2 min)
TEST_STAGES = ("triton", "contract", "kernels")  # the stages whose pytest logs name failures
NOT_RUN = ("Not run yet: no GPU was at hand when `scripts/gpu_check.sh` was written, so this page holds no "
           "numbers. Run `bash scripts/gpu_check.sh` on a CUDA machine (after `bash scripts/gpu_check.sh prepare` "
           "where pip can reach PyPI, if that machine cannot) and commit the page it writes.")


def _order(mixers: list[str]) -> list[str]:
    head = [m for m in FIRST + MECHANISMS if m in mixers]
    return head + [m for m in mixers if m not in head]


def write_atomic(path: Path, text: str) -> None:
    """``text`` to ``path`` through a temporary file in the same folder and ``os.replace``: a reader (or a run
    killed mid-write) sees the old file or the new one, never half of one.  (``seqmem.io.atomic_write_text`` does
    the same; this copy keeps the page writer free of seqmem's imports.)"""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would outlive the rename
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ------------------------------------------------------------------------------------------------ the bench
def jobs(mixers: list[str]) -> list[tuple[str, str, str]]:
    """The rows in the order they are timed, as ``(mixer, row suffix, --backend choice)``: every mixer on seqmem's
    own forms (backends off, ``pytorch``: VORT too, whose retention would otherwise take fla's simple-GLA kernel
    where fla is installed) in ``mixers``' order, then the baselines on their GPU kernels (``[fla]``) last — a
    first call of fla's kernels autotunes for about two minutes (117-119 s per op on an H200, fla 0.6.0, triton
    3.6), which must not keep the mechanisms' rows from being measured."""
    own = [(m, "", "pytorch") for m in mixers]
    return own + [(m, "[fla]", "fla") for m in mixers if m in KERNEL_OP]


def kernel_missing(name: str, device: Any, head_dim: int) -> tuple[str, str] | None:
    """Why ``name``'s ``[fla]`` row would run seqmem's PyTorch form anyway, as (status, note); None where a GPU
    kernel takes its calls (``seqmem.backends.which_form``)."""
    import torch

    from seqmem.backends import DEFAULT, backends, list_backends, which_form

    op = KERNEL_OP[name]
    with backends(list(DEFAULT)):
        if which_form(op, device, torch.bfloat16, head_dim=head_dim) != "pytorch":
            return None
    missing = [b.split(" ")[0] for b in list_backends().get(op, []) if b.endswith("(missing)")]
    from seqmem.ops import _backends as _be

    if op == "gated_delta_rule" and not missing and _be._fla_gated_backward_refused(torch.device(device)):
        return "refused", ("fla's gated backward raises on Hopper with 3.4 <= triton < 3.7.1: training calls run "
                           "seqmem's walk, which the plain row times")
    if missing:
        return "not installed", f"{', '.join(missing)} does not import here: the row would rerun PyTorch"
    return "no kernel", f"which_form: pytorch for {op} on {device}, bfloat16, head size {head_dim}"


def _with_backend(backend: str) -> Any:
    """A context that sets the backends as ``run_speed`` sets them for a row with this ``--backend`` choice."""
    from contextlib import nullcontext

    from seqmem.backends import backends
    from seqmem.bench.speed import backend_variants

    chosen = backend_variants(backend)[0][1]
    return nullcontext() if chosen is None else backends(chosen)


def warm_up(name: str, backend: str, ns: argparse.Namespace, device: Any, dtype: Any, n: int) -> float:
    """One untimed, uncapped forward+backward of ``name`` with ``backend`` at length ``n``: the kernels'
    compilation and autotuning, paid before anything is timed.  Returns its seconds."""
    from seqmem.bench.common import synchronize
    from seqmem.bench.speed import training_step

    with _with_backend(backend):
        t0 = time.perf_counter()
        training_step(ns, device, dtype, name, n)()
        synchronize(device)
        return time.perf_counter() - t0


def profile(name: str, backend: str, ns: argparse.Namespace, device: Any, dtype: Any, n: int,
            top: int = PROFILE_TOP) -> dict[str, Any]:
    """Where one forward+backward of ``name`` at length ``n`` spends its time, after a warm call
    (``seqmem.bench.profile.profile_mixer``: GPU kernels by their own device time on CUDA, operators on a CPU
    trial): the ``top`` largest, the total and the calls, in ms."""
    from seqmem.bench.profile import profile_mixer

    with _with_backend(backend):
        r = profile_mixer(ns, device, dtype, name, n, "fast", top)
    cuda = getattr(device, "type", str(device)) == "cuda"
    return {"seq_len": n, "total_ms": round(r["total_self_ms"], 3), "launches": r["op_calls"],
            "top": [{"kernel": str(t["op"])[:120], "ms": round(t["self_ms"], 4), "calls": t["calls"]}
                    for t in r["top"]],
            "what": r["timed"] + ("" if cuda else " (a trial, no GPU number)")}


def syncs_one(name: str, ns: argparse.Namespace, device: Any, dtype: Any, n: int) -> dict[str, Any]:
    """``seqmem bench syncs`` for one layer on seqmem's own forms: the synchronising calls of a forward+backward at
    ``n`` tokens after a warm one, by source line (the first :data:`SYNCS_TOP`)."""
    from seqmem.bench.syncs import host_reads

    one = argparse.Namespace(**{**vars(ns), "warmup": 1, "batch": 1})
    with _with_backend("pytorch"):
        r = host_reads(one, device, dtype, name, n)
        d = host_reads(one, device, dtype, name, n, decode=True)
    return {"seq_len": n, "total": r["total"], "reads": r["reads"][:SYNCS_TOP], "how": r["how"],
            "decode_total": d["total"], "decode_reads": d["reads"][:SYNCS_TOP]}


def syncs_section(payload: dict[str, Any]) -> str:
    """The syncs pass's table; '' where it did not run."""
    syncs = payload.get("syncs") or {}
    if not syncs:
        return ""
    how = next((r.get("how") for r in syncs.values() if r.get("how")), "synchronising calls")
    lines = [f"\nWaits for the device in one forward+backward after a warm one, and in one decode step after T "
             f"tokens ({how}; seqmem's own forms, batch 1; each stops the host until the queued kernels have run, so "
             "the launches after it no longer overlap them):\n",
             "| layer | T | waits (train) | where (count) | waits (decode step) | where (count) |",
             "|---|---:|---:|---|---:|---|"]

    def where(reads: list[dict[str, Any]]) -> str:
        return ("; ".join(f"`{w['where']}` ×{w['count']}" for w in reads) or "none").replace("|", "/")

    for name, r in syncs.items():
        if "error" in r:
            lines.append(f"| {name} | – | – | failed: {r['error'][:100].replace('|', '/')} | – | – |")
            continue
        lines.append(f"| {name} | {fmt_len(r['seq_len'])} | {r['total']} | {where(r.get('reads', []))} | "
                     f"{r.get('decode_total', '–')} | {where(r.get('decode_reads', []))} |")
    return "\n".join(lines) + "\n"


def decode_one(name: str, args: argparse.Namespace, device: Any, dtype: Any, machine: dict[str, Any],
               log: Any) -> list[dict[str, Any]]:
    """``seqmem bench decode`` for one layer: the context streamed in pieces of 1,024 tokens, then one token per
    step (the layer's single-token path, on seqmem's own forms) at each of :data:`DECODE_CONTEXTS`, batch 1."""
    from seqmem.bench.decode import run_decode

    ns = argparse.Namespace(d_model=args.d_model, heads=args.heads, batch=1, seed=0, impl="fast", repeats=10,
                            warmup=3, max_seconds=min(5.0, args.max_seconds), piece=1024, mixer_option_parsed={})
    with _with_backend("pytorch"):
        return run_decode(ns, device, dtype, [name], list(DECODE_CONTEXTS), machine, log)["records"]


def decode_section(payload: dict[str, Any]) -> str:
    """The decode pass's table (ms per token at each context, the state, attention's step / the layer's) and the
    layers it did not start; '' where it neither ran nor skipped a layer."""
    recs = [r for r in payload.get("decode") or [] if r.get("seq_len") and r.get("mixer")]
    skipped = {k[len("decode "):]: v for k, v in (payload.get("skipped") or {}).items() if k.startswith("decode ")}
    if not recs and not skipped:
        return ""

    def ok(r: dict[str, Any]) -> bool:
        return r.get("status") == "ok" and (r.get("median_ms") or 0) > 0

    attn = {r["seq_len"]: r["median_ms"] for r in recs if r["mixer"] == "attention" and ok(r)}
    ns = sorted({r["seq_len"] for r in recs})
    lines = ["\nDecode, one token per step after streaming the context (batch 1, the layer's own single-token path "
             "on seqmem's forms, the median of up to 10 steps after 3 warm-up steps, each measurement capped):\n"]
    if recs:
        head = (["layer"] + [f"{fmt_len(n)} ms/token" for n in ns] + ["state at the last (KiB)"]
                + ["attention's step / layer's at " + " · ".join(fmt_len(n) for n in ns), "step path"])
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in dict.fromkeys(r["mixer"] for r in recs):
        by_n = {r["seq_len"]: r for r in recs if r["mixer"] == name}
        cells, ratios = [], []
        for n in ns:
            r = by_n.get(n) or {}
            cells.append(_fmt(r["median_ms"]) if ok(r) else str(r.get("status", "–")))
            ratios.append(f"{attn[n] / r['median_ms']:.2f}" if ok(r) and n in attn else "–")
        last = by_n.get(ns[-1]) or {}
        sb = last.get("state_bytes")
        notes = [r.get("note") for r in by_n.values() if r.get("status") not in ("ok", None) and r.get("note")]
        path = next((r.get("step_path") for r in by_n.values() if r.get("step_path")), "–")
        path += f" ({str(notes[0])[:80]})" if notes else ""
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {'–' if sb is None else f'{sb / 1024:,.0f}'} | "
                     + " · ".join(ratios) + f" | {path.replace('|', '/')} |")
    text = "\n".join(lines) + "\n"
    if skipped:
        text += "\nDecode not started: " + "; ".join(f"{k} ({v})" for k, v in skipped.items()) + ".\n"
    return text


def run_bench(args: argparse.Namespace) -> int:
    # kineto tears CUPTI down after each trace only with this set (else, in some versions, later kernels run slower
    # after a profile): the rows timed after the profile pass (the other mixers', the kernels') keep their speed
    os.environ.setdefault("TEARDOWN_CUPTI", "1")
    import torch

    from seqmem import list_mixers
    from seqmem.bench.common import device_name, parse_lengths, run_end, run_machine
    from seqmem.bench.speed import run_speed

    t_end = time.monotonic() + args.budget
    device, dtype = torch.device(args.device), torch.bfloat16
    lengths = parse_lengths(args.lengths, [])
    mixers = _order(args.mixers.split(",") if args.mixers else list_mixers())
    machine = run_machine(device)  # with date, commit (null without .git: the page reads .whl/COMMIT), load
    payload: dict[str, Any] = {"bench": "speed", "card": device_name(device), "machine": machine,
                               "settings": {"dtype": "bfloat16", "d_model": args.d_model, "heads": args.heads,
                                            "batch": 2, "lengths": lengths, "max_seconds": args.max_seconds,
                                            "repeats": args.repeats, "warmup": 1, "budget_s": args.budget},
                               "records": [], "warmup_s": {}, "skipped": {}, "profiles": {}, "decode": [],
                               "syncs": {},
                               "not_reached": [name + suffix for name, suffix, _ in jobs(mixers)]}
    out = Path(args.json)
    prof_n = lengths[len(lengths) // 2]  # the profiles' length: the middle one (16k at 4k, 16k, 64k)
    timed: list[tuple[str, str, str, float]] = []  # (row, mixer, backend, median ms at prof_n) to profile

    def save() -> None:
        write_atomic(out, json.dumps(payload, indent=1, default=str) + "\n")

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    def namespace(backend: str) -> argparse.Namespace:
        return argparse.Namespace(d_model=args.d_model, heads=args.heads, batch=2, seed=0, impl="fast",
                                  repeats=args.repeats, warmup=1, ref_repeats=None, ref_warmup=None,
                                  max_seconds=args.max_seconds, no_flops=True, no_floor=True,
                                  gemm_sizes_parsed=[4096] if device.type == "cuda" else [64],
                                  backend=backend, mixer_option_parsed={})

    def room(key: str, need: float, what: str = "") -> bool:
        """Whether ``need`` seconds of the budget are left; if not, ``key`` is recorded as skipped (and logged)."""
        left = t_end - time.monotonic()
        if left >= need:
            return True
        log(f"{key}: not started ({left:.0f} s left, {need:.0f} s needed{what})")
        payload["skipped"][key] = f"{left:.0f} s of the budget left, {need:.0f} s needed"
        return False

    save()
    row = None

    def decode_pass() -> None:
        nonlocal row
        for dname in [m for m in DECODE_MIXERS if m in mixers]:
            if not room(f"decode {dname}", DECODE_S):
                continue
            row = f"decode {dname}"
            try:
                payload["decode"] += decode_one(dname, args, device, dtype, machine, log)
            except Exception as e:  # noqa: BLE001 — recorded, the pass goes on
                payload["decode"].append({"mixer": dname, "seq_len": DECODE_CONTEXTS[0], "status": "error",
                                          "note": f"{type(e).__name__}: {e}"[:300]})
            save()

    def profile_pass() -> None:
        nonlocal row
        for prow, name, backend, median_ms in timed:
            if not room(f"profile {prow}", PROFILE_S + 3 * median_ms / 1000):  # two calls and the tracing
                continue
            row = f"profile {prow}"
            try:
                pr = profile(name, backend, namespace(backend), device, dtype, prof_n)
                if pr["launches"] == 0:
                    pr = {"error": "no kernel events in the trace (the profiler could not attach?)"}
                elif pr["total_ms"] < 0.3 * median_ms:
                    pr["note"] = (f"the kernels sum to {pr['total_ms']:.3g} ms, {100 * pr['total_ms'] / median_ms:.0f}"
                                  " % of the row's timed call: the trace may have missed kernels")
            except Exception as e:  # noqa: BLE001 — a profile is extra: its failure is noted only
                pr = {"error": f"{type(e).__name__}: {e}"[:200]}
            payload["profiles"][prow] = pr
            save()

    def syncs_pass() -> None:
        nonlocal row
        for sname in [name for name, suffix, _ in jobs(mixers) if not suffix and name in FIRST + MECHANISMS]:
            if not room(f"syncs {sname}", SYNCS_S):
                continue
            row = f"syncs {sname}"
            try:
                payload["syncs"][sname] = syncs_one(sname, namespace("pytorch"), device, dtype, lengths[0])
            except Exception as e:  # noqa: BLE001 — extra, like a profile: its failure is noted only
                payload["syncs"][sname] = {"error": f"{type(e).__name__}: {e}"[:200]}
            save()

    passes = [] if not getattr(args, "decode", True) else [decode_pass]
    passes += [] if not getattr(args, "profile", True) else [profile_pass]
    passes += [] if not getattr(args, "syncs", True) else [syncs_pass]
    try:
        for name, suffix, backend in jobs(mixers):
            if passes and (suffix or name not in FIRST + MECHANISMS):  # after the mechanisms' rows
                for run_pass in passes:
                    run_pass()
                passes = []
            row = name + suffix
            ns = namespace(backend)
            try:
                why = kernel_missing(name, device, args.d_model // args.heads) if suffix == "[fla]" else None
                if why is not None:
                    log(f"{row}: {why[0]} ({why[1]})")
                    payload["records"] += [{"mixer": row, "impl": "fast", "seq_len": n, "status": why[0],
                                            "note": why[1], "median_ms": None} for n in lengths]
                    payload["not_reached"].remove(row)
                    save()
                    continue
                need = 3 * args.max_seconds + (KERNEL_WARMUP_S if suffix == "[fla]" else 0)
                if not room(row, need, f": 3 x the cap{' + the kernels autotuning' if suffix else ''}"):
                    continue
                payload["warmup_s"][row] = round(warm_up(name, backend, ns, device, dtype, lengths[0]), 3)
                log(f"{row}: untimed warm-up at T={lengths[0]}: {payload['warmup_s'][row]:.1f} s")
                res = run_speed(ns, device, dtype, [name], lengths, lengths, machine, log)
                for r in res["records"]:
                    r["mixer"] = row  # run_speed labels by the mixer; the row says which backends
                payload["records"] += res["records"]
                payload.setdefault("gemm_peak", res["peak"])
                at = [r for r in res["records"] if r.get("seq_len") == prof_n and r.get("status") == "ok"
                      and (r.get("median_ms") or 0) > 0]
                if at:
                    timed.append((row, name, backend, float(at[0]["median_ms"])))
            except Exception as e:  # noqa: BLE001 — one row's failure is recorded, the table goes on
                note = f"{type(e).__name__}: {e}"[:300]
                if row not in payload["warmup_s"]:
                    note = "warm-up failed: " + note
                log(f"{row}: error ({note})")
                payload["records"].append({"mixer": row, "status": "error", "note": note})
            if device.type == "cuda":
                torch.cuda.empty_cache()
            payload["not_reached"].remove(row)
            save()
        for run_pass in passes:
            run_pass()
    except KeyboardInterrupt:  # the stage's time box ran out (SIGINT): keep what was measured
        payload["interrupted"] = row
        payload["end"] = run_end()
        print(f"bench: interrupted during {row}; not reached: {', '.join(payload['not_reached'])}", flush=True)
        save()
        return 130
    payload["end"] = run_end()
    save()
    total = len(jobs(mixers))
    print(f"bench: {total - len(payload['not_reached'])} of {total} rows done"
          + (f"; not reached: {', '.join(payload['not_reached'])}" if payload["not_reached"] else ""), flush=True)
    return 0


# ------------------------------------------------------------------------------------------------ the page
def fmt_len(n: int) -> str:
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def _fmt(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def table(payload: dict[str, Any]) -> str:
    recs = [r for r in payload.get("records", []) if r.get("impl", "fast") == "fast" and r.get("mixer")]
    lengths = payload.get("settings", {}).get("lengths") or sorted({r["seq_len"] for r in recs if r.get("seq_len")})
    attn = {r["seq_len"]: r["median_ms"] for r in recs if r["mixer"] == "attention" and r.get("status") == "ok"}
    seen = list(dict.fromkeys(r["mixer"] for r in recs))
    bases = list(dict.fromkeys(n.split("[")[0] for n in seen))  # a [fla] row (timed last) beside its own
    names = [n for b in bases for n in seen if n.split("[")[0] == b]
    head = (["layer"] + [f"{fmt_len(n)} ms" for n in lengths]
            + ["attention's time / layer's at " + " · ".join(fmt_len(n) for n in lengths), "form"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in names:
        by_n = {r.get("seq_len"): r for r in recs if r["mixer"] == name}
        cells, ratios, forms = [], [], set()
        for n in lengths:
            r = by_n.get(n)
            if r is None or r.get("status") != "ok" or r.get("median_ms") is None:
                cells.append("–" if r is None else str(r.get("status", "–")))
                ratios.append("–")
                continue
            cells.append(_fmt(r["median_ms"]))
            ratios.append(f"{attn[n] / r['median_ms']:.2f}" if n in attn else "–")
            forms.add(r.get("form") or "pytorch")
        if all(c == "–" for c in cells) and any(r.get("status") == "error" for r in by_n.values()):
            note = next(r.get("note", "") for r in by_n.values() if r.get("status") == "error")
            cells = [f"error: {note[:80]}"] + ["–"] * (len(lengths) - 1)
        form = "; ".join(sorted(forms)) or "–"
        lines.append(f"| {name} | " + " | ".join(c.replace("|", "/") for c in cells)
                     + f" | {' · '.join(ratios)} | {form} |")
    return "\n".join(lines) + "\n"


def profiles_section(payload: dict[str, Any], top: int = 4) -> str:
    """The rows' profiles (``profile``): each row's kernel time, launches and largest kernels; '' where none."""
    profs = payload.get("profiles") or {}
    if not profs:
        return ""
    what = next((p.get("what") for p in profs.values() if p.get("what")), "kernels' own time")
    lines = [f"\nWhere the time goes: torch.profiler over one forward+backward after a warm call ({what}, ms; "
             "launches: the entries' calls — kernels, copies, fills; the largest with their calls):\n",
             "| layer | T | kernels' time | launches | largest |", "|---|---:|---:|---:|---|"]
    for row, pr in profs.items():
        if "error" in pr:
            lines.append(f"| {row} | – | – | – | profile failed: {pr['error'][:100].replace('|', '/')} |")
            continue
        big = "; ".join(f"`{k['kernel'][:60].replace('|', '/').replace('`', '')}` {_fmt(k['ms'])} ×{k['calls']}"
                        for k in pr.get("top", [])[:top])
        big += f" ({pr['note']})" if pr.get("note") else ""
        lines.append(f"| {row} | {fmt_len(pr['seq_len'])} | {_fmt(pr['total_ms'])} | {pr['launches']:,} | {big} |")
    return "\n".join(lines) + ("\n\nThe profiles ran after the rows of attention, the baselines and the mechanisms; "
                                "the other rows were timed after them.\n")


_NODE = re.compile(r"\S+\.py(?:::\S+)?")
_KIND = re.compile(r"\b(FAILED|ERROR)\b")


def failures(text: str) -> list[str]:
    """Each failed or erroring test of a pytest log once, in order: from ``-v``'s progress lines (``path::test
    FAILED``, ``[gw0] [ 3%] FAILED path::test``), which are there even when the run was cut, and ``-rfE``'s
    summary (``FAILED path::test - message``), whose message is kept."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        kind = _KIND.search(line)
        node = _NODE.search(line) if kind else None
        if node is None:
            continue
        entry = f"{kind.group(1)} {node.group(0)}"
        if " - " in line[node.end():]:
            entry += " - " + line[node.end():].split(" - ", 1)[1].strip()
        if node.group(0) not in found or len(entry) > len(found[node.group(0)]):
            found[node.group(0)] = entry
    return list(found.values())


def _git_commit() -> str | None:
    """The checked-out commit (and whether the tree differs from it), or None where git has no repository here."""
    try:
        p = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=10,
                           cwd=ROOT)
        if p.returncode == 0 and p.stdout.strip():
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                   text=True, timeout=10, cwd=ROOT).stdout.strip()
            return p.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def commit_text(commit_file: Path | None, use_git: bool = True) -> str:
    """The commit of the tree that ran: from ``commit_file``, which ``gpu_check.sh prepare`` wrote just before the
    tree travelled (the device machine may hold a ``.git`` of another commit, or none), with git's reading beside
    it where that differs; from git where there is no such file; ``use_git=False``: the file alone (a page
    rewritten later, elsewhere, where git reads a later commit)."""
    git = _git_commit() if use_git else None
    if commit_file is not None and Path(commit_file).is_file():
        info = dict(ln.split("\t", 1) for ln in Path(commit_file).read_text().splitlines() if "\t" in ln)
        c, d = info.get("commit", "unknown").strip(), info.get("dirty", "").strip()
        changes = "" if d in ("", "0") else f", then with {d} changed or untracked file(s)"
        where = "no git here" if git is None else f"git here reads {git}"
        head = git.split(" ")[0] if git is not None else None
        if head and (c.startswith(head) or head.startswith(c)):
            return git
        return f"{c[:12]} ({where}: from {Path(commit_file).name}, written by `gpu_check.sh prepare`{changes})"
    if git is not None:
        return git
    return "unknown (no git here, and no .whl/COMMIT)"


def _read_json(path: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """The bench's JSON, or None and why not (missing: no reason; truncated or unreadable: the error)."""
    if not path or not Path(path).exists():
        return None, None
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        return None, f"{type(e).__name__}: {e}"
    return (data, None) if isinstance(data, dict) else (None, f"not a JSON object: {type(data).__name__}")


def date_text(args: argparse.Namespace) -> str:
    """The run's date: its records' start (``machine.date``) where they hold one, else now."""
    payload, _ = _read_json(getattr(args, "json", None))
    date = ((payload or {}).get("machine") or {}).get("date")
    return str(date) if date else time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def also_section(path: str, index: int) -> str:
    """A further bench call's table (``--also-json``): its rows, what it never reached, or why it is unreadable."""
    payload, err = _read_json(path)
    head = f"\n### Bench call {index} ([{Path(path).name}]({Path(path).name}))\n\n"
    if payload is None:
        return head + f"Its records could not be read ({err or 'missing'}).\n"
    text = head
    note = payload.get("note")
    if note:
        text += f"{note}\n\n"
    text += ((table(payload) + profiles_section(payload)) if payload.get("records") else "Nothing measured.\n")
    text += decode_section(payload)
    if payload.get("interrupted"):
        text += f"\nCut while running {payload['interrupted']}.\n"
    if payload.get("skipped"):
        text += "\nNot started: " + "; ".join(f"{k} ({v})" for k, v in payload["skipped"].items()) + ".\n"
    if payload.get("not_reached"):
        text += f"\nNot reached (never run, or cut before it finished): {', '.join(payload['not_reached'])}.\n"
    return text


def write_md(args: argparse.Namespace) -> int:
    path = Path(args.write_md)
    title = "# GPU check: correctness on CUDA and layer speed (`scripts/gpu_check.sh`)\n\n"
    if args.not_run:
        write_atomic(path, title + NOT_RUN + "\n")
        return 0
    payload, json_error = _read_json(args.json)
    info: dict[str, str] = {}
    if args.versions and Path(args.versions).exists():
        info = dict(line.split("\t", 1) for line in Path(args.versions).read_text().splitlines()
                    if "\t" in line and not line.startswith("#"))
    commit = commit_text(Path(args.commit_file) if args.commit_file else None, not getattr(args, "no_git", False))
    text = title
    text += (f"Card: {info.get('card', 'unknown')}; driver {info.get('driver', 'unknown')}; torch "
             f"{info.get('torch', 'unknown')}; triton {info.get('triton', '—')}; fla {info.get('fla', '—')[:120]}; "
             f"mamba_ssm {info.get('mamba_ssm', '—')[:120]}; numpy {info.get('numpy', '—')[:120]}; Python "
             f"{info.get('python', '—')}. Date {date_text(args)}; commit {commit}.\n\n")
    if info.get("numpy", "").startswith("not"):
        text += ("**numpy is missing on this machine's Python**: seqmem imports it at module level, so every stage "
                 "that imports seqmem failed on that, not on CUDA. Bring numpy (a wheel for this Python) and run "
                 "again.\n\n")
    if info.get("fla_error"):
        text += f"fla did not import: `{info['fla_error'][:400]}` (full traceback: versions.txt).\n\n"
    text += "## Stages\n\n| stage | exit | seconds | outcome |\n|---|---:|---:|---|\n"
    if args.stages and Path(args.stages).exists():
        for line in Path(args.stages).read_text().splitlines():
            parts = line.split("\t")
            if len(parts) == 4:
                text += "| " + " | ".join(p.replace("|", "/") for p in parts) + " |\n"
    if args.logs:
        fails = []
        for stage in TEST_STAGES:
            log = Path(args.logs) / f"{stage}.log"
            if log.exists():
                fails += [f"{stage}: {f}" for f in failures(log.read_text(errors="replace"))]
        # a test whose xdist worker died ("worker 'gw3' crashed while running ...") was most likely stopped by its
        # stage's time box (SIGINT reaches the workers too): listed apart, not as a failure of the code
        crashed = [f for f in fails if "crashed" in f]
        fails = [f for f in fails if "crashed" not in f]
        if fails:
            text += (f"\nFailed tests ({len(fails)}" + ("; the first 40" if len(fails) > 40 else "") + "):\n\n"
                     + "".join(f"* `{f[:200].replace('`', chr(39))}`\n" for f in fails[:40]))
        if crashed:
            text += (f"\nStopped with their worker ({len(crashed)}; a stage cut at its box stops its xdist workers "
                     "too — rerun these before reading them as failures):\n\n"
                     + "".join(f"* `{f[:200].replace('`', chr(39))}`\n" for f in crashed[:20]))
    text += "\n## Layer speed: one layer forward+backward\n\n"
    if json_error:
        text += (f"The bench's records could not be read ({json_error[:200]}): the stage was probably cut while "
                 "writing them. Nothing below is from them.\n\n")
    if payload is None or not payload.get("records"):
        text += "Not measured in this run (the bench stage wrote no records; see its outcome above).\n"
        text += decode_section(payload or {})
    else:
        s = payload.get("settings", {})
        where = payload.get("card") or "the CPU (a trial of the script, no GPU number)"
        d, h = s.get("d_model", 0), s.get("heads", 1) or 1
        text += (f"`seqmem bench speed` on {where}: {s.get('dtype')}, d_model {d}, {h} heads of {d // h}, batch "
                 f"{s.get('batch')}, impl fast, median of up to {s.get('repeats')} repeats after a warm-up (CUDA "
                 "events, after the device's own warm-up and one untimed call per row at the shortest length that "
                 "pays compilation and autotuning: `warmup_s` in gpu.json), each measurement capped at "
                 f"{s.get('max_seconds', 0):g} s: a length that would exceed the cap, and the longer ones, are "
                 "'not run' — never extrapolated. `layer[fla]`: the same layer with the GPU kernel backends on "
                 "(fla; mamba_ssm for mamba2), 'not installed' where they are not; its plain row on seqmem's "
                 "PyTorch forms. form: the forms the layer's ops ran. Ratio > 1: the layer is faster than "
                 "attention (SDPA).\n\n")
        text += table(payload)
        text += profiles_section(payload)
        text += syncs_section(payload)
        text += decode_section(payload)
    if payload is not None:
        if payload.get("interrupted"):
            text += f"\nCut by the stage's time box while running {payload['interrupted']}.\n"
        if payload.get("not_reached"):
            text += f"\nNot reached (never run, or cut before it finished): {', '.join(payload['not_reached'])}.\n"
        if payload.get("records"):
            text += "\nRecords: [gpu.json](gpu.json).\n"
    for i, extra in enumerate(getattr(args, "also_json", None) or [], start=2):
        text += also_section(extra, i)
    write_atomic(path, text)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=float, default=240.0, help="seconds for the whole table")
    p.add_argument("--json", default=None, help="the records (written after every mixer; read by --write-md)")
    p.add_argument("--lengths", default="4k,16k,64k")
    p.add_argument("--mixers", default=None, help="comma-separated (default: every registered mixer)")
    p.add_argument("--max-seconds", type=float, default=8.0, help="cap per measurement")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-decode", dest="decode", action="store_false",
                   help="skip the decode pass (one token per step at 1k and 4k, after the rows on seqmem's forms)")
    p.add_argument("--no-profile", dest="profile", action="store_false",
                   help="skip the profile of each row at the middle length (torch.profiler's top kernels)")
    p.add_argument("--no-syncs", dest="syncs", action="store_false",
                   help="skip the count of each layer's waits for the device (after the profiles)")
    p.add_argument("--device", default="cuda", help="cuda (the check); cpu only to try the script itself")
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--write-md", default=None, help="write the Markdown page here instead of measuring")
    p.add_argument("--stages", default=None)
    p.add_argument("--versions", default=None)
    p.add_argument("--logs", default=None)
    p.add_argument("--commit-file", default=str(ROOT / ".whl" / "COMMIT"),
                   help="the commit where git has none (written by gpu_check.sh prepare)")
    p.add_argument("--not-run", action="store_true", help="with --write-md: the page before any run")
    p.add_argument("--no-git", action="store_true",
                   help="with --write-md: the commit from --commit-file alone (a page rewritten elsewhere, later)")
    p.add_argument("--also-json", action="append", default=[],
                   help="with --write-md: a further bench call's records, shown as its own table (repeatable)")
    args = p.parse_args()
    if args.write_md:
        return write_md(args)
    if not args.json:
        p.error("--json is required to measure")
    return run_bench(args)


if __name__ == "__main__":
    sys.exit(main())
