"""``seqmem bench speed|decode|profile|syncs|train|numerics`` argument parsing (added to the main CLI by
:func:`add_parser`).

Every JSON payload and Markdown header says which code ran when and under what load: the ``machine`` record of
:func:`seqmem.bench.common.run_machine` (date, commit, dirty tree, seqmem version, ``OMP_NUM_THREADS``, the 1-minute
load average, CUDA runtime and driver on a GPU) and, for the benchmarks that time, ``end`` (date and load when done).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import torch

from seqmem.bench.common import (
    DTYPES,
    add_model_options,
    add_output_options,
    add_repeat_options,
    check_mixer_options,
    check_writable_dir,
    check_writable_file,
    command_line,
    device_name,
    md_table,
    parse_lengths,
    provenance_text,
    resolve_device,
    resolve_dtype,
    resolve_mixers,
    run_end,
    run_machine,
    write_json,
)
from seqmem.cliargs import nonnegative_int as _nonneg_int
from seqmem.cliargs import positive_float as _pos_float
from seqmem.cliargs import positive_int as _pos_int
from seqmem.cliargs import threads_note
from seqmem.clihelp import add_deprecated_alias


def _common(p: argparse.ArgumentParser, repeats: int, warmup: int, impl: str, timed: bool = True) -> None:
    """The options of speed / decode (``timed``) and profile (one profiled call: no repeats, cap or plots)."""
    add_model_options(p, d_model=256, heads=4)
    p.add_argument("--lengths", default=None,
                   help="comma-separated lengths, k = 1024 (e.g. 1k,2k,4k; default: the benchmark's own list)")
    p.add_argument("--batch-size", dest="batch", type=_pos_int, default=1, help="sequences per call")
    add_deprecated_alias(p, "--batch", "--batch-size")
    if timed:
        add_repeat_options(p, repeats, warmup, "timed repeats per measurement", "untimed warm-up calls per measurement")
    else:
        from seqmem.cliargs import nonnegative_int

        p.add_argument("--warmup", type=nonnegative_int, default=warmup,
                       help="unprofiled calls before the one profiled call")
    p.add_argument("--device", default="cpu", help="torch device")
    p.add_argument("--dtype", default="float32", choices=list(DTYPES), help="parameter and input dtype")
    p.add_argument("--impl", default=impl, choices=["fast", "reference", "both"],
                   help="the training form, the recurrent reference, or both")
    if timed:
        p.add_argument("--max-seconds", type=_pos_float, default=30.0,
                       help="time cap per measurement; what would exceed it is reported 'not run'")
    p.add_argument("--threads", type=_pos_int, default=None,
                   help="torch threads (default: OMP_NUM_THREADS if set, else 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and inputs")
    _mixer_option(p)
    add_output_options(p, "the summary tables", plot=timed)


def _mixer_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mixer-option", action="append", metavar="KEY=VALUE",
                   help="option given to every benchmarked mixer, value as JSON (repeatable, e.g. window=8; "
                        "default: each mixer's own options)")


def add_parser(sub: Any) -> None:
    """Add ``bench`` with sub-commands ``speed``, ``decode``, ``profile``, ``syncs``, ``train`` and ``numerics`` to
    the CLI's sub-parsers ``sub``."""
    p = sub.add_parser("bench", help="benchmarks: layer speed, decode cost, profiles, training-step cost and "
                                     "low-precision numerics of the mixers")
    bsub = p.add_subparsers(dest="bench", metavar="BENCH", parser_class=type(p))

    s = bsub.add_parser("speed", help="forward+backward time of one mixer layer vs sequence length")
    _common(s, repeats=3, warmup=1, impl="both")
    s.add_argument("--ref-lengths", default=None,
                   help="lengths at which impl=reference is measured (default: --lengths); capped by --max-seconds")
    s.add_argument("--ref-repeats", type=_pos_int, default=None,
                   help="timed repeats for impl=reference (default: --repeats)")
    s.add_argument("--ref-warmup", type=_nonneg_int, default=None,
                   help="warm-up calls for impl=reference (default: --warmup)")
    s.add_argument("--no-flops", action="store_true", help="skip the FLOP count (GFLOP/s, %% of GEMM peak)")
    s.add_argument("--no-floor", action="store_true",
                   help="skip timing each layer's nn.Linear projections alone (the 'floor' column)")
    s.add_argument("--gemm-sizes", default="512,1024,2048",
                   help="sizes n of the n×n GEMMs measuring the peak (the best rate counts)")
    s.add_argument("--backend", default="default", choices=["default", "pytorch", "fla", "both"],
                   help="the ops' forms: pytorch = seqmem's PyTorch forms; fla = the GPU kernels (fla, and mamba_ssm "
                        "for mamba2) where installed and applicable; both = side by side (rows mixer[fla]); "
                        "default = SEQMEM_BACKENDS, else the kernels (the 'form' column says what ran)")
    s.set_defaults(func=cmd_speed)

    d = bsub.add_parser("decode", help="per-token decode time and state bytes vs context length")
    _common(d, repeats=20, warmup=3, impl="both")
    d.add_argument("--piece", type=_pos_int, default=1024, help="tokens per piece when streaming the context")
    d.set_defaults(func=cmd_decode)
    pr = bsub.add_parser("profile", help="top ops of one forward+backward call of each mixer (torch.profiler)")
    _common(pr, repeats=1, warmup=1, impl="fast", timed=False)
    pr.add_argument("--top", type=_pos_int, default=12, help="ops to list per mixer")
    pr.set_defaults(func=cmd_profile)
    sy = bsub.add_parser("syncs", help="where one forward+backward of each mixer reads a value back from the device "
                                       "(a wait for the GPU on CUDA), by source line")
    _common(sy, repeats=1, warmup=1, impl="fast", timed=False)
    sy.add_argument("--decode", action="store_true",
                    help="count one decode step (a token with the state after --lengths tokens and the --warmup "
                         "steps, no gradients) instead of a training step")
    sy.set_defaults(func=cmd_syncs)

    tr = bsub.add_parser("train", help="seconds and tokens/s of one training step (fwd+bwd+AdamW) of a small LM "
                                       "per mixer: experiment budgets")
    add_model_options(tr, d_model=128, heads=2)
    tr.add_argument("--layers", type=_pos_int, default=2, help="layers")
    tr.add_argument("--vocab-size", type=_pos_int, default=32, help="vocabulary")
    tr.add_argument("--seq-len", type=_pos_int, default=32, help="tokens per sequence")
    tr.add_argument("--batch-size", type=_pos_int, default=32, help="sequences per step")
    add_repeat_options(tr, 5, 2, "timed steps (the median counts)", "untimed steps first")
    tr.add_argument("--scored", type=float, default=1.0,
                    help="fraction of positions with a target (1: language modelling; recall tasks score a few %%)")
    tr.add_argument("--full-head", action="store_true",
                    help="compute the logits at every position, not just the scored ones (the cost without "
                         "training's sparse head)")
    tr.add_argument("--threads", type=_pos_int, default=None,
                    help="torch threads (default: OMP_NUM_THREADS if set, else 1)")
    tr.add_argument("--device", default="cpu", help="torch device (cuda: the device is warmed up first and each step "
                                                    "timed with CUDA events)")
    tr.add_argument("--dtype", default="float32", choices=list(DTYPES), help="parameter dtype")
    tr.add_argument("--compile", action="store_true",
                    help="also time each mixer's step through torch.compile (as seqmem train --compile runs it): "
                         "compiled ms / step, the ratio to eager and the one-off compile time")
    _mixer_option(tr)
    add_output_options(tr, "the table")
    tr.set_defaults(func=cmd_train)

    from seqmem.bench import numerics

    nm = bsub.add_parser("numerics", help="low-precision error and state growth of every mixer over a long input")
    numerics.add_arguments(nm)
    nm.set_defaults(func=numerics.run)
    p.set_defaults(func=lambda args: (p.print_help(sys.stderr), 2)[1])


def _setup(args: argparse.Namespace):
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype)
    mixers = resolve_mixers(args.mixers)
    args.mixer_option_parsed = check_mixer_options(mixers, args.mixer_option)
    if hasattr(args, "d_model") and hasattr(args, "heads"):  # every layer builds at this width, before any timing
        from seqmem.registry import build_mixer

        for name in mixers:
            try:
                build_mixer(name, args.d_model, n_heads=args.heads, **args.mixer_option_parsed)
            except ValueError as e:
                raise ValueError(f"{name} at --d-model {args.d_model} --heads {args.heads}"
                                 + (f" with --mixer-option {args.mixer_option_parsed}" if args.mixer_option_parsed
                                    else "") + f": {e}") from None
    if args.json is not None:
        check_writable_file(args.json)
    if getattr(args, "plot", None) is not None:
        check_writable_dir(args.plot)
    if args.markdown is not None:
        check_writable_file(args.markdown, "--markdown")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    _log(f"seqmem bench {args.bench}: {len(mixers)} mixer(s) on {device}, {threads_note()}")
    return device, dtype, mixers, run_machine(device)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _command(args: argparse.Namespace) -> str:
    """The equivalent command line, every option spelled out (also when called from Python)."""
    return command_line(f"seqmem bench {args.bench}", args)


def _emit(args: argparse.Namespace, text: str, payload: dict[str, Any]) -> int:
    """Print ``text``, write the Markdown and JSON files asked for; the exit code: 1 when a cell of the benchmark
    failed with an error (its record's ``status`` is ``"error"``; the table says why), else 0."""
    print(text)
    if args.markdown is not None:
        from seqmem.repro.common import atomic_write_text

        atomic_write_text(args.markdown, text)
    if args.json is not None:
        write_json(args.json, payload)
    failed = [r for key in ("records", "rows", "results") for r in payload.get(key) or []
              if isinstance(r, dict) and r.get("status") == "error"]
    if failed:
        first = failed[0]
        _log(f"seqmem bench {args.bench}: error: {len(failed)} cell(s) failed, e.g. {first.get('mixer', '?')} "
             f"T={first.get('seq_len', '?')}: {first.get('note') or first.get('error') or 'error'}".splitlines()[0])
        return 1
    return 0


def _header(args: argparse.Namespace, machine: dict[str, Any], title: str, settings: str | None = None,
            end: dict[str, Any] | None = None) -> str:
    """Title, command line, machine, the run's commit, dates and load (:func:`provenance_text`; ``end`` from
    :func:`run_end` where the run is over) and ``settings`` (default: those of speed / decode / profile)."""
    if settings is None:
        settings = (f"d_model={args.d_model}, heads={args.heads}, batch={args.batch}, dtype={args.dtype}, "
                    f"device={args.device}" + (f", --max-seconds {args.max_seconds:g}" if hasattr(args, "max_seconds")
                                               else f", {args.warmup} warm-up call(s), one profiled call"))
    card = device_name(torch.device(getattr(args, "device", "cpu")))
    gpu = f"GPU {card}, " if card else ""
    return (f"## {title}\n\nCommand: `{_command(args)}`\n\nMachine: {gpu}{machine['cpu']}, {machine['cores']} cores, "
            f"torch {machine['torch']}, {machine['threads']} thread(s).\n\nRun: {provenance_text(machine, end)}.\n\n"
            f"Settings: {settings}\n\n")


def cmd_speed(args: argparse.Namespace) -> int:
    from seqmem.bench.speed import DEFAULT_LENGTHS_CPU, DEFAULT_LENGTHS_CUDA, run_speed, summarize_speed

    device, dtype, mixers, machine = _setup(args)
    default = DEFAULT_LENGTHS_CUDA if device.type == "cuda" else DEFAULT_LENGTHS_CPU
    lengths = parse_lengths(args.lengths, default)
    try:
        args.gemm_sizes_parsed = parse_lengths(args.gemm_sizes, [])
    except ValueError as e:
        raise ValueError(str(e).replace("--lengths", "--gemm-sizes")) from None
    ref_lengths = parse_lengths(args.ref_lengths, lengths) if args.ref_lengths is not None else lengths
    t0 = time.time()
    out = run_speed(args, device, dtype, mixers, lengths, ref_lengths, machine, _log)
    end = run_end()
    rows, targets = summarize_speed(out["records"], (4096, 2048, 16384))
    peak = out["peak"]
    text = _header(args, machine, "seqmem bench speed", end=end)
    text += (f"GEMM peak ({peak['n']}×{peak['n']} {peak['dtype']} matmul, best of the runs at start and end): "
             f"{peak['gflops']:.1f} GFLOP/s. Total time {time.time() - t0:.0f} s.\n\n")
    text += "### Forward+backward time per length\n\n"
    text += ("fast_ms / ref_ms: median ms (or why not measured), wall clock (CUDA events on a GPU); "
             "speed-up (ref/fast): ref_ms / fast_ms, the speed-up of impl=fast over impl=reference; "
             "attn/mixer: attention's time over this mixer's (> 1: the mixer is faster); "
             "floor: attention's time over the time of this layer's nn.Linear projections alone (forward+backward, "
             "same length) — the most any form of this layer can beat attention by; "
             "%peak: counted matrix GFLOP/s over the GEMM peak; form: the form the layer's ops ran in impl=fast "
             "(pytorch, or the kernel that took a call).\n\n")
    text += md_table(rows, ["mixer", "T", "fast_ms", "spread_%", "ref_ms", "speed-up (ref/fast)", "attn/mixer",
                            "floor", "ktok/s", "GFLOP/s", "%peak", "form"])
    text += speed_targets_text(targets)
    payload = {"bench": "speed", "command": _command(args), "machine": machine, "end": end, "gemm_peak": peak,
               "settings": {"lengths": lengths, "ref_lengths": ref_lengths, "mixers": mixers,
                            **{k: v for k, v in vars(args).items() if k not in ("func", "json", "plot", "markdown")}},
               "records": out["records"], "summary": rows, "targets": targets}
    if args.plot is not None:
        from seqmem.bench.plots import plot_speed

        payload["plots"] = [str(p) for p in plot_speed(out["records"], args.plot)]
    return _emit(args, text, payload)


def speed_targets_text(targets: list[dict[str, Any]]) -> str:
    """The speed-targets table ((a) speed-up ref/fast ≥ 10 at 4k, (b) faster than attention at 2k and ≥ 10x at 16k,
    (d) ≥ 25 % of the GEMM peak at 16k), or one line saying which lengths it needs when none of them was measured."""
    measured = [t for t in targets if any(v not in (None, "not measured", "—") and k not in ("mixer", "crossover")
                                          for k, v in t.items())]
    head = ("\n### Against the speed targets\n\n(a) the fast form ≥ 10x the reference at 4k; (b) faster than attention "
            "at 2k and ≥ 10x faster at 16k; (d) ≥ 25 % of the GEMM peak at 16k.\n\n")
    if not measured:  # only the crossover with attention, from the lengths that were measured
        return head + ("Not measured in this run: the targets need --lengths 2k,4k,16k (and --impl both for (a)). "
                       "Crossover with attention over the lengths measured:\n\n"
                       + md_table([{"mixer": t["mixer"], "crossover": t["crossover"]} for t in targets],
                                  ["mixer", "crossover"]))
    return head + md_table(targets, list(targets[0]))


def cmd_decode(args: argparse.Namespace) -> int:
    from seqmem.bench.decode import DEFAULT_CONTEXTS, run_decode, summarize_decode

    device, dtype, mixers, machine = _setup(args)
    contexts = parse_lengths(args.lengths, DEFAULT_CONTEXTS)
    t0 = time.time()
    out = run_decode(args, device, dtype, mixers, contexts, machine, _log)
    end = run_end()
    text = _header(args, machine, "seqmem bench decode", end=end) + f"Total time {time.time() - t0:.0f} s.\n\n"
    payload: dict[str, Any] = {"bench": "decode", "command": _command(args), "machine": machine, "end": end,
                               "settings": {"contexts": contexts, "mixers": mixers,
                                            **{k: v for k, v in vars(args).items()
                                               if k not in ("func", "json", "plot", "markdown")}},
                               "records": out["records"]}
    from seqmem.bench.speed import impls_of

    for impl in impls_of(args.impl):
        rows, flat = summarize_decode(out["records"], impl)
        text += f"### Decode, impl={impl}: ms per token and state per context\n\n"
        text += ("ms/token: median ms of one single-token step, wall clock (CUDA events on a GPU); attn/mixer: "
                 "attention's step time over this mixer's at the same context (> 1: the mixer is faster).\n\n")
        text += md_table(rows, ["mixer", "context", "ms/token", "state_KiB", "attn/mixer"])
        text += f"\n### Flatness, impl={impl}\n\n"
        text += md_table(flat, list(flat[0]) if flat else ["mixer"]) + "\n"
        payload[f"summary_{impl}"] = rows
        payload[f"flatness_{impl}"] = flat
    if args.plot is not None:
        from seqmem.bench.plots import plot_decode

        payload["plots"] = [str(p) for impl in impls_of(args.impl)
                            for p in plot_decode(out["records"], args.plot,
                                                 prefix="decode" if impl == "fast" else f"decode_{impl}", impl=impl)]
    return _emit(args, text, payload)


def cmd_profile(args: argparse.Namespace) -> int:
    from seqmem.bench.profile import profile_mixer
    from seqmem.bench.speed import impls_of

    device, dtype, mixers, machine = _setup(args)
    lengths = parse_lengths(args.lengths, [4096])
    text = _header(args, machine, "seqmem bench profile")
    results = []
    for name in mixers:
        for impl in impls_of(args.impl):
            for n in lengths:
                r = profile_mixer(args, device, dtype, name, n, impl, args.top)
                results.append(r)
                text += (f"### {name} impl={impl} T={n}: {r['total_self_ms']:.1f} ms in {r['op_calls']:,} calls "
                         f"({r['timed']})\n\n")
                text += md_table(r["top"], ["op", "calls", "self_ms", "self_%"]) + "\n"
    payload = {"bench": "profile", "command": _command(args), "machine": machine, "end": run_end(), "results": results}
    return _emit(args, text, payload)


def cmd_syncs(args: argparse.Namespace) -> int:
    from seqmem.bench.speed import impls_of
    from seqmem.bench.syncs import host_reads

    device, dtype, mixers, machine = _setup(args)
    lengths = parse_lengths(args.lengths, [1024])
    text = _header(args, machine, "seqmem bench syncs", settings=(
        f"d_model={args.d_model}, heads={args.heads}, batch={args.batch}, dtype={args.dtype}, device={args.device}, "
        f"{args.warmup} warm-up call(s) not counted, one counted call" + (", decode steps" if args.decode else "")))
    results = []
    for name in mixers:
        for impl in impls_of(args.impl):
            for n in lengths:
                r = {**host_reads(args, device, dtype, name, n, impl, decode=args.decode), "impl": impl}
                results.append(r)
                what = f"one decode step after {n} tokens" if args.decode else "one forward+backward"
                text += f"### {name} impl={impl} T={n}: {r['total']} read(s) in {what} ({r['how']})\n\n"
                text += (md_table(r["reads"], ["where", "count"]) if r["reads"] else "none\n") + "\n"
    payload = {"bench": "syncs", "command": _command(args), "machine": machine, "end": run_end(), "results": results}
    return _emit(args, text, payload)


def cmd_train(args: argparse.Namespace) -> int:
    from seqmem.bench.train import markdown, train_step_seconds

    mixers = resolve_mixers(args.mixers)
    options = check_mixer_options(mixers, args.mixer_option)
    device, dtype = resolve_device(args.device), resolve_dtype(args.dtype)
    if not 0.0 < args.scored <= 1.0:
        _log(f"error: --scored must be a fraction in (0, 1], got {args.scored}")
        return 2
    for f, flag in ((args.json, "--json"), (args.markdown, "--markdown")):
        if f is not None:
            check_writable_file(f, flag)
    torch.set_num_threads(args.threads)
    _log(f"seqmem bench train: {len(mixers)} mixer(s), {threads_note()}")
    machine = run_machine(device)  # its thread count is args.threads, set above
    rows = []
    for i, m in enumerate(mixers, 1):
        kw = dict(scored=args.scored, full_head=args.full_head, options=options, device=device, dtype=dtype)
        shape = (m, args.d_model, args.layers, args.heads, args.vocab_size, args.seq_len, args.batch_size,
                 args.repeats, args.warmup)
        r = train_step_seconds(*shape, **kw)
        msg = f"[{i}/{len(mixers)}] {m}: {r['seconds_per_step'] * 1e3:.1f} ms/step, {r['tokens_per_s']:,.0f} tokens/s"
        if args.compile:
            c = train_step_seconds(*shape, **kw, compile=True)
            r["compiled_twin"] = {k: c[k] for k in ("seconds_per_step", "tokens_per_s", "min_seconds",
                                                    "compile_seconds")}
            msg += (f"; compiled {c['seconds_per_step'] * 1e3:.1f} ms/step "
                    f"(x{c['seconds_per_step'] / r['seconds_per_step']:.2f}, compile {c['compile_seconds']:.0f} s)")
        _log(msg)
        rows.append(r)
    end = run_end()
    head = ", logits at every position" if args.full_head else ""
    text = _header(args, machine, "Training-step cost (fwd + bwd + AdamW)",
                   f"{args.layers} layers, d_model {args.d_model}, {args.heads} heads, vocab {args.vocab_size}, "
                   f"T = {args.seq_len}, batch {args.batch_size}; {args.scored:g} of the positions scored{head}; "
                   f"{args.dtype} on {args.device}; median of {args.repeats} steps, wall clock (CUDA events "
                   f"on a GPU).", end=end) + markdown(rows)
    config = {k: v for k, v in vars(args).items() if k not in ("func",) and not callable(v)}
    return _emit(args, text, {"bench": "train", "machine": machine, "end": end, "config": config, "rows": rows})
