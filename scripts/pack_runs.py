"""Pack the sweep runs changed since a marker file into tar parts of bounded size, to carry a campaign's progress from
one machine to another (e.g. back from a GPU machine that keeps nothing after the call).

    python scripts/pack_runs.py MARKER OUTDIR RUNS_DIR [RUNS_DIR ...] [--part-mib 15] [--max-parts 7]

A run directory (one holding ``run.json``) counts as changed when a file in it is newer than MARKER.  A finished
run (``result.json``) is packed without its checkpoints (results do not need them); an unfinished one with its
``run.json``, ``metrics.jsonl`` and newest good checkpoint, so the campaign resumes from it elsewhere.  Paths are
stored relative to the current directory (run it from the repository root; unpack there with ``tar xf``).  Parts
are ``OUTDIR/runs-K.tar``; finished runs go first, and unfinished runs that do not fit in ``--max-parts`` parts are
named on stderr and left out (they resume from their last packed state, or from scratch).
"""

from __future__ import annotations

import argparse
import sys
import tarfile
from pathlib import Path

from seqmem.train.checkpoint import latest_good_checkpoint


def changed_runs(roots: list[Path], marker: Path) -> list[Path]:
    since = marker.stat().st_mtime
    runs = []
    for root in roots:
        for spec in sorted(root.rglob("run.json")):
            d = spec.parent
            if any(f.is_file() and f.stat().st_mtime > since for f in d.rglob("*")):
                runs.append(d)
    return runs


def run_files(d: Path) -> list[Path]:
    """The files of run ``d`` worth carrying (see the module docstring)."""
    if (d / "result.json").exists():
        return sorted(f for f in d.rglob("*") if f.is_file() and "checkpoints" not in f.relative_to(d).parts
                      and f.name != ".lock")
    files = [f for f in (d / "run.json", d / "metrics.jsonl") if f.exists()]
    ck = latest_good_checkpoint(d / "checkpoints")
    if ck is not None:
        files += sorted(f for f in ck.rglob("*") if f.is_file())
    return files


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("marker", type=Path)
    ap.add_argument("outdir", type=Path)
    ap.add_argument("roots", type=Path, nargs="+")
    ap.add_argument("--part-mib", type=float, default=15.0)
    ap.add_argument("--max-parts", type=int, default=7)
    a = ap.parse_args(argv)
    if not a.marker.exists():
        ap.error(f"{a.marker}: no such marker file")
    runs = changed_runs([r for r in a.roots if r.is_dir()], a.marker)
    runs.sort(key=lambda d: not (d / "result.json").exists())  # finished first
    limit = int(a.part_mib * 2**20)
    parts: list[list[Path]] = []
    sizes: list[int] = []
    left_out = []
    for d in runs:
        files = run_files(d)
        size = sum(f.stat().st_size for f in files) + 1024 * (len(files) + 1)
        k = next((i for i, s in enumerate(sizes) if s + size <= limit), None)
        if k is None:
            if len(parts) >= a.max_parts or size > limit:
                left_out.append(d)
                continue
            parts.append([])
            sizes.append(0)
            k = len(parts) - 1
        parts[k] += files
        sizes[k] += size
    a.outdir.mkdir(parents=True, exist_ok=True)
    for i, files in enumerate(parts):
        with tarfile.open(a.outdir / f"runs-{i}.tar", "w") as tar:
            for f in files:
                tar.add(f, arcname=str(f), recursive=False)
    done = sum((d / "result.json").exists() for d in runs)
    print(f"packed {len(runs) - len(left_out)} changed run(s) ({done} finished) into {len(parts)} part(s)")
    for d in left_out:
        print(f"left out (too big for the parts): {d}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
