"""Stage the newest good checkpoint of every unfinished sweep run for commit, so a campaign continues from it on a
fresh clone (checkpoints are git-ignored: without this a run cut off by the end of a session restarts from step 0).

    python scripts/stage_partial_runs.py [--dry-run] [ROOT ...]        (default ROOT: docs/results)

For every ``checkpoints/`` directory under ROOT (run from the repository root):
* the run has no ``result.json`` (unfinished): its newest checkpoint whose checksums verify is ``git add -f``-ed and
  any other checkpoint of the run that git tracks is untracked (``git rm --cached``; the files stay on disk);
* the run has finished: every tracked checkpoint of it is untracked (results do not need them).
Tracked checkpoints whose files are gone from disk are untracked too.  Nothing is committed; commit afterwards.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from seqmem.train.checkpoint import latest_good_checkpoint

RESULT = "result.json"


def git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout


def tracked_checkpoint_dirs(root: Path) -> set[Path]:
    """The ``checkpoints/ckpt-*`` directories under ``root`` that hold a tracked file."""
    out = set()
    for f in git("ls-files", "-z", "--", str(root)).split("\0"):
        parts = Path(f).parts
        if "checkpoints" in parts:
            i = parts.index("checkpoints")
            if i + 1 < len(parts):
                out.add(Path(*parts[: i + 2]))
    return out


def plan(roots: list[Path]) -> tuple[list[Path], list[Path]]:
    """``(stage, untrack)``: checkpoint directories to add, and tracked ones to untrack."""
    stage: list[Path] = []
    tracked: set[Path] = set()
    for root in roots:
        tracked |= tracked_checkpoint_dirs(root)
        for ck in sorted(root.rglob("checkpoints")):
            if not ck.is_dir() or (ck.parent / RESULT).exists():
                continue
            good = latest_good_checkpoint(ck)
            if good is not None:
                stage.append(good)
    keep = set(stage)
    return stage, sorted(tracked - keep)


def size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("roots", nargs="*", type=Path, default=[Path("docs/results")])
    ap.add_argument("--dry-run", action="store_true", help="print what would be staged and untracked")
    a = ap.parse_args(argv)
    for r in a.roots:
        if not r.is_dir():
            print(f"stage_partial_runs: {r} is not a directory", file=sys.stderr)
            return 2
    stage, untrack = plan(a.roots)
    sizes = {p: size_mb(p) for p in stage}
    for p in stage:
        print(f"stage    {p} ({sizes[p]:.1f} MB)")
        if not a.dry_run:
            git("add", "-f", "--", str(p))
    for p in untrack:
        print(f"untrack  {p}")
        if not a.dry_run:
            git("rm", "-r", "-q", "--cached", "--ignore-unmatch", "--", str(p))
    total = sum(sizes.values())
    print(f"{'would stage' if a.dry_run else 'staged'} {len(stage)} unfinished run(s) ({total:.1f} MB), "
          f"{'would untrack' if a.dry_run else 'untracked'} {len(untrack)} checkpoint(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
