"""Seal the ``result.json`` of finished runs written before results were sealed: record the hash of the run's
``metrics.jsonl`` (and of its final checkpoint's weights where that checkpoint is there) and the result's own hash,
so any later edit of the result or its log is found out (``seqmem.sweep.runner.result_problem``).

    python scripts/seal_results.py [--check] [ROOT ...]      (default: docs/results)

Every ``result.json`` under the roots that has no seal gets one, with ``"sealed_later": true`` saying that the seal
was added afterwards (it vouches for the files as they are now, not for how they were produced); values are not
touched, so every report reads the same.  A result that is not plausible (values out of range, wrong types) is
listed and left alone.  ``--check`` writes nothing and exits 1 when some result has no seal.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def unsealed(roots: list[Path]) -> list[Path]:
    """The ``result.json`` files under ``roots`` without a seal (symbolic links skipped)."""
    from seqmem.sweep.runner import SEAL

    found = []
    for root in roots:
        for f in sorted(root.rglob("result.json")):
            if f.is_symlink():
                continue
            try:
                r = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(r, dict) and SEAL not in r:
                found.append(f)
    return found


def seal_file(f: Path) -> str | None:
    """Seal ``f`` in place (atomic rewrite, same key order and indent); returns why not, or None."""
    from seqmem.io import atomic_write_text, file_sha256
    from seqmem.sweep.runner import METRICS_HASH, WEIGHTS_HASH, _metrics_problem, seal

    r = json.loads(f.read_text())
    if r.get("status") == "finished":
        for part in ("valid", "report"):
            if (why := _metrics_problem(part, r.get(part))) is not None:
                return why
    metrics = f.parent / "metrics.jsonl"
    if not metrics.is_file():
        return "no metrics.jsonl beside it"
    r[METRICS_HASH] = file_sha256(metrics)
    man = f.parent / "checkpoints" / f"ckpt-{r.get('steps', 0):08d}" / "manifest.json"
    if r.get("status") == "finished" and man.is_file():
        r[WEIGHTS_HASH] = json.loads(man.read_text())["files"]["model.safetensors"]
    r["sealed_later"] = True
    atomic_write_text(f, json.dumps(seal(r), indent=2))
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("roots", nargs="*", type=Path, default=[Path("docs/results")])
    ap.add_argument("--check", action="store_true", help="only list the unsealed results (exit 1 if any)")
    args = ap.parse_args(argv)
    todo = unsealed(args.roots)
    if args.check:
        for f in todo:
            print(f"unsealed: {f}")
        return 1 if todo else 0
    bad = 0
    for f in todo:
        why = seal_file(f)
        if why is not None:
            bad += 1
            print(f"left unsealed: {f}: {why}", file=sys.stderr)
    print(f"sealed {len(todo) - bad} result(s)" + (f", {bad} left unsealed" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
