"""``seqmem sweep``: run (or resume) a sweep spec and write its report."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path


def add_parser(sub) -> None:
    from seqmem.sweep.spec import list_packaged_specs

    packaged = ", ".join(list_packaged_specs())
    p = sub.add_parser(
        "sweep",
        help="run a grid of training runs from a spec file (resumable) and report lr-selected means over seeds",
        description=(
            "Run every grid point of SPEC (a TOML/JSON file, or a packaged spec: " + packaged + ") as one run "
            "directory under --out; re-running skips finished runs and resumes partial ones from their "
            "checkpoints; a changed spec for existing runs is refused. Afterwards (or with --report alone) it "
            "writes report.md, report.json and the accuracy-vs-state plot: per row the learning rate with the best "
            "mean validation metric, then mean ± std over seeds on the reported examples."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("spec", help="spec file (.toml or .json) or packaged spec name")
    from seqmem.cliargs import out_path

    p.add_argument("--out", type=out_path, default=None, help="sweep directory (default: runs/sweeps/<spec name>)")
    p.add_argument("--jobs", type=int, default=1,
                   help="worker processes (more than the machine's cores is allowed, with a warning: the timings "
                        "then inflate)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads per worker (default: OMP_NUM_THREADS if set, else 1)")
    p.add_argument("--compile", action="store_true",
                   help="train through torch.compile (on CPU 0.68-1.04x the eager step's wall-clock time in "
                        "docs/BENCHMARKS.md's measurements, after a one-off "
                        "compile of up to a few minutes per model; needs a C++ compiler; recorded in each "
                        "result.json and log record)")
    p.add_argument("--device", default="cpu",
                   help="where the runs train: cpu, cuda, cuda:N or mps (recorded in each result.json; the data "
                        "stream is the same on every device, and a run started on one resumes on another)")
    p.add_argument("--yes", action="store_true",
                   help="start the runs even when their estimated cost is above 30 CPU-minutes (without it such a "
                        "sweep prints the estimate and stops)")
    p.add_argument("--report", action="store_true", help="only aggregate the finished runs (no training)")
    p.add_argument("--report-dir", type=out_path, default=None, help="where to write the report (default: --out)")
    p.add_argument("--dry-run", action="store_true", help="list the runs left and the estimated CPU time")
    p.add_argument("--no-probe", action="store_true", help="skip the step-time probe (no ETA)")
    p.add_argument("--limit", type=int, default=None, help="run at most this many runs now (the rest next time)")
    p.add_argument("--reuse", type=Path, action="append", default=[], metavar="DIR",
                   help="another sweep's --out: its finished runs with exactly this spec's settings (all but the "
                        "sweep's name) are copied instead of retrained, marked reused_from (repeatable)")
    p.add_argument("--resume-first", action="store_true",
                   help="start the part-trained runs (a checkpoint, no result) first, the furthest trained first, "
                        "instead of the runs with the most CPU time left (suits sessions with a time limit: "
                        "interrupted runs finish instead of waiting for the end of the campaign)")
    p.add_argument("--headline", type=Path, default=None, metavar="JSON",
                   help="also record the report in this paper's headline.json (its 'ours' entry for the spec: "
                        "chosen lr, mean ± std, per-seed values; the rest of the file is kept)")
    p.set_defaults(func=cmd_sweep)


def _run_command(args: argparse.Namespace, out: Path) -> str:
    """The command that runs the sweep, for the report: this invocation's; for ``--report`` alone, the run command
    an earlier report in the same report directory recorded, else this one without ``--report``."""
    # after "sweep"; --yes is a permission, not part of what ran
    argv = [a for a in list(getattr(args, "argv", None) or [])[1:] if a != "--yes"]
    if args.report:
        try:
            prev = json.loads((Path(args.report_dir or out) / "report.json").read_text()).get("command")
        except (OSError, ValueError, AttributeError):
            prev = None
        if isinstance(prev, str) and prev:
            return prev
        argv = [a for a in argv if a != "--report"]
    return "seqmem sweep " + " ".join(shlex.quote(a) for a in argv) if argv else ""


def cmd_sweep(args: argparse.Namespace) -> int:
    from seqmem.cliargs import LONG_JOB_CPU_S, UsageError, check_device
    from seqmem.cliargs import check_out_dir as _check_out_dir
    from seqmem.sweep import SpecError, load_spec, run_sweep, write_report
    from seqmem.sweep.report import update_headline

    for k in ("jobs", "threads"):
        if getattr(args, k) < 1:
            raise UsageError(f"--{k} must be at least 1")
    if args.limit is not None and args.limit < 1:
        raise UsageError("--limit must be at least 1")
    if args.jobs > (os.cpu_count() or 1):
        print(f"seqmem sweep: warning: --jobs {args.jobs} exceeds the {os.cpu_count()} cores; timings will be "
              "inflated", file=sys.stderr)
    if not args.report and not args.dry_run:
        check_device(args.device)
    if args.compile and not args.report and not args.dry_run:
        from seqmem.train.loop import check_compiler

        try:
            check_compiler(args.device)
        except ValueError as e:
            raise UsageError(f"--compile: {e}") from None
    if args.headline is not None and not Path(args.headline).is_file():
        raise UsageError(f"--headline {args.headline}: no such file")
    try:
        spec = load_spec(args.spec)
    except SpecError as e:
        raise UsageError(str(e)) from None
    from seqmem.sweep.report import report_owner
    from seqmem.sweep.runner import invalid_results

    out = Path(args.out) if args.out is not None else Path("runs/sweeps") / spec.name
    report_at = Path(args.report_dir) if args.report_dir else out
    owner = report_owner(report_at)
    if owner is not None and owner != spec.name:  # checked before any training, not after it
        raise UsageError(f"{report_at / 'report.json'} is the report of sweep {owner!r}, not {spec.name!r}: give "
                         "this sweep its own --out (or --report-dir)")
    command = _run_command(args, out)
    res = None
    if not args.report:
        out = _check_out_dir(out)
        import signal

        def _stop(signum, frame):  # SIGTERM stops the workers like Ctrl-C (finished runs are kept)
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, _stop)
        try:
            res = run_sweep(spec, out, jobs=args.jobs, threads=args.threads, probe=not args.no_probe,
                            dry_run=args.dry_run, limit=args.limit, log=lambda s: print(s, flush=True),
                            reuse=args.reuse, compile=args.compile, device=args.device,
                            confirm_above_s=None if args.yes else LONG_JOB_CPU_S,
                            resume_first=args.resume_first)
        except SpecError as e:
            raise UsageError(str(e)) from None
        if args.dry_run:
            return 0
        if res["errors"]:
            print(f"seqmem sweep: {res['errors']} run(s) failed (error.json in their directories)", file=sys.stderr)
    elif not out.is_dir():
        raise UsageError(f"{out} does not exist: nothing to report (run the sweep first)")
    else:
        for why in invalid_results(out, spec.points()):
            print(f"seqmem sweep: warning: {why}: not reported (re-run the sweep to train it again)",
                  file=sys.stderr)
    report_dir = _check_out_dir(args.report_dir) if args.report_dir else out
    try:
        payload = write_report(spec, out, report_dir, command=command)
    except OSError as e:  # a full disk, a read-only directory: one line naming the file
        raise UsageError(f"cannot write the report to {report_dir}: {e}") from None
    except SpecError as e:  # runs of another version of the spec under --out (--report: nothing checked before)
        raise UsageError(str(e)) from None
    done = sum(r["runs_done"] for r in payload["rows"])
    total = sum(r["runs_total"] for r in payload["rows"])
    print(f"report: {report_dir / 'report.md'} ({done}/{total} runs finished)")
    if args.headline is not None:
        try:
            update_headline(args.headline, spec, payload, report_dir)
        except ValueError as e:
            raise UsageError(str(e)) from None
        print(f"headline: {args.headline} (ours[{spec.name!r}])")
    return 1 if res is not None and res["errors"] else 0  # a failed run is no success
