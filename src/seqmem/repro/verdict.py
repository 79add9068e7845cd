"""The rule every headline verdict follows (``docs/results/README.md``): a claim is measured under the paper's
protocol and under the tuned one, only calibrated cells with enough seeds are read, and the word follows from the
numbers — ``confirmed`` (both protocols agree with the paper beyond the seed spread), ``refuted`` (both disagree
beyond it), ``not reproduced at our scale`` (they disagree with each other, the gap is within seeds, or a protocol
is not yet readable), ``out of reach`` (no protocol can be read at a scale we can run).

A ``headline.json`` carries the numbers under ``rule``; :func:`check_rule` recomputes every outcome and word from
them, and :func:`cell_from_records` every cell's per-seed values from its committed run records.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "MIN_SEEDS",
    "OUTCOMES",
    "WORDS",
    "cell_from_records",
    "cell_stats",
    "check_rule",
    "claim_outcomes",
    "claim_word",
    "protocol_outcome",
    "record_seed_lr",
    "record_value",
    "verdict_word",
]

WORDS = ("confirmed", "refuted", "not reproduced at our scale", "out of reach")
MIN_SEEDS = 3  # a cell with fewer seeds is not read
READ = ("agrees", "disagrees", "within seeds")
#: "lr unsettled": a tuned lr chosen on one seed while another lr's value on that seed is within the seed spread
#: and that lr has not run every seed (rule 1: such a choice is made on the mean over seeds)
NOT_READ = ("not run", "insufficient seeds", "uncalibrated", "lr at grid edge", "lr unsettled", "out of reach")
UNREADY = ("insufficient seeds", "not run", "lr at grid edge", "lr unsettled")  # each needs a pending experiment
OUTCOMES = READ + NOT_READ
PROTOCOLS = ("paper", "tuned")


def cell_stats(per_seed: Mapping[str, float] | Sequence[float]) -> dict[str, Any]:
    """``mean``, sample ``std`` (n − 1; None for one value) and ``n`` of a cell's per-seed values."""
    vals = [float(v) for v in (per_seed.values() if isinstance(per_seed, Mapping) else per_seed)]
    n = len(vals)
    if n == 0:
        return {"mean": None, "std": None, "n": 0}
    mean = sum(vals) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else None
    return {"mean": mean, "std": std, "n": n}


def protocol_outcome(protocol: Mapping[str, Any], claim: Mapping[str, Any]) -> str:
    """One protocol's outcome for ``claim``: one of :data:`OUTCOMES` (docs/results/README.md, "The rule")."""
    status = protocol.get("status")
    if status is not None:
        if status not in NOT_READ:
            raise ValueError(f"protocol status must be one of {NOT_READ}, got {status!r}")
        return status
    cells = protocol["cells"]
    kind = claim["kind"]
    need = ("a", "b") if kind == "order" else ("a",)
    if kind not in ("order", "level"):
        raise ValueError(f"claim kind must be 'order' or 'level', got {kind!r}")
    if any(k not in cells for k in need):
        raise ValueError(f"a {kind} claim needs cells {need}, got {sorted(cells)}")
    if not all(cells[k].get("calibrated") is True for k in need):
        return "uncalibrated"
    if any(cells[k].get("lr_at_edge") for k in need):
        return "lr at grid edge"
    if any(cells[k].get("lr_unsettled") for k in need):
        return "lr unsettled"
    stats = {k: cell_stats(cells[k]["per_seed"]) for k in need}
    if any(s["n"] < MIN_SEEDS for s in stats.values()):
        return "insufficient seeds"
    sign = 1.0 if claim["higher_is_better"] else -1.0
    a = stats["a"]
    if kind == "order":
        b = stats["b"]
        gap, spread = sign * (a["mean"] - b["mean"]), a["std"] + b["std"]
        return "agrees" if gap > spread else "disagrees" if gap < -spread else "within seeds"
    d, tol = abs(a["mean"] - float(claim["paper"]["a"])), float(claim["tolerance"])
    return "agrees" if d + a["std"] <= tol else "disagrees" if d - a["std"] > tol else "within seeds"


def verdict_word(outcomes: Mapping[str, str] | Sequence[str]) -> str:
    """The rule's word from the two protocols' outcomes (the paper's and the tuned one)."""
    outs = list(outcomes.values() if isinstance(outcomes, Mapping) else outcomes)
    bad = [o for o in outs if o not in OUTCOMES]
    if bad or len(outs) != 2:
        raise ValueError(f"two protocol outcomes from {OUTCOMES} expected, got {outs!r}")
    if all(o == "agrees" for o in outs):
        return "confirmed"
    if all(o == "disagrees" for o in outs):
        return "refuted"
    if all(o in ("uncalibrated", "out of reach") for o in outs):
        return "out of reach"
    return "not reproduced at our scale"


def _check_paper_sign(claim: Mapping[str, Any]) -> None:
    """An order claim's A must be the paper's better model (the sign of every gap comes from
    ``higher_is_better``): refuse one whose two paper numbers say the opposite, readable protocols or not."""
    if claim.get("kind") != "order":
        return
    paper = claim.get("paper") or {}
    try:
        pa, pb = float(paper["a"]), float(paper["b"])
    except (KeyError, TypeError, ValueError):
        return  # no two numbers to compare: the sign is the claim's
    if (pa - pb) * (1.0 if claim["higher_is_better"] else -1.0) < 0:
        raise ValueError(f"order claim {claim.get('claim', '')!r}: the paper's a = {pa:g}, b = {pb:g} put B ahead "
                         f"under higher_is_better = {claim['higher_is_better']}: the claim's A must be the paper's "
                         "better model")


def claim_outcomes(claim: Mapping[str, Any]) -> dict[str, str]:
    """Both protocols' outcomes; a protocol ``{"same_as": other}`` takes the other's outcome."""
    _check_paper_sign(claim)
    protos = claim["protocols"]
    if set(protos) != set(PROTOCOLS):
        raise ValueError(f"a claim needs the protocols {PROTOCOLS}, got {sorted(protos)}")
    out = {}
    for name in PROTOCOLS:
        p = protos[name]
        src = protos[p["same_as"]] if "same_as" in p else p
        if "same_as" in src:
            raise ValueError("only one protocol may be `same_as` the other")
        out[name] = protocol_outcome(src, claim)
    return out


def claim_word(claim: Mapping[str, Any]) -> str:
    return verdict_word(claim_outcomes(claim))


def check_rule(rule: Mapping[str, Any]) -> list[str]:
    """What in a ``headline.json`` ``rule`` disagrees with its own numbers (empty when all agree)."""
    problems = []
    claims = rule.get("claims") or []
    if not claims:
        return ["rule has no claims"]
    names = [c["claim"] for c in claims]
    for c in claims:
        name = c["claim"]
        try:
            outs = claim_outcomes(c)
        except (KeyError, ValueError) as e:
            problems.append(f"{name}: {e}")
            continue
        if c.get("outcomes") != outs:
            problems.append(f"{name}: outcomes {c.get('outcomes')} recorded, the numbers give {outs}")
        if c.get("word") != verdict_word(outs):
            problems.append(f"{name}: word {c.get('word')!r} recorded, the numbers give {verdict_word(outs)!r}")
        for pname, p in c["protocols"].items():
            for key, cell in (p.get("cells") or {}).items():
                st = cell_stats(cell["per_seed"])
                for f in ("mean", "std"):
                    want, got = st[f], cell.get(f)
                    if (want is None) != (got is None) or (want is not None and abs(want - got) > 5e-4):
                        problems.append(f"{name}: {pname}.{key}.{f} {got} recorded, per_seed gives {want}")
                if cell.get("n") != st["n"]:
                    problems.append(f"{name}: {pname}.{key}.n {cell.get('n')} recorded, per_seed has {st['n']}")
        if c.get("kind") == "level" and not c.get("tolerance_source"):
            problems.append(f"{name}: a level claim's tolerance needs its source (tolerance_source: the paper's "
                            "spread, or ours with the reason)")
        if outs and any(o in UNREADY for o in outs.values()) \
                and not c.get("pending"):
            problems.append(f"{name}: a protocol is not yet readable but no pending experiment is named")
    head = rule.get("headline_claim")
    if head not in names:
        problems.append(f"headline_claim {head!r} is not one of the claims")
    else:
        want = next(c for c in claims if c["claim"] == head)
        try:
            w = claim_word(want)
        except (KeyError, ValueError):
            w = None
        if rule.get("word") != w:
            problems.append(f"word {rule.get('word')!r} recorded, the headline claim's numbers give {w!r}")
    return problems


def record_value(result: Mapping[str, Any], metric: str) -> float:
    """A metric of one run record: ``"report.loss"``, a ratio ``"report.hits_long/report.queries_long"``, or, for a
    ``seqmem repro echo --seeds`` record, ``"niah[T]"`` (NIAH accuracy % at length T)."""
    if metric.startswith("niah[") and metric.endswith("]"):
        return float(result["niah"][metric[5:-1]])

    def one(path: str) -> float:
        split, _, key = path.partition(".")
        return float(result[split][key])

    num, _, den = metric.partition("/")
    return one(num) / one(den) if den else one(num)


def _is_repro_seed_record(rec: Mapping[str, Any]) -> bool:
    return "status" not in rec and isinstance(rec.get("key"), Mapping) and "seed" in rec["key"]


def record_seed_lr(rec: Mapping[str, Any]) -> tuple[int, float]:
    """(seed, lr) of a sweep run record (``result.json``) or a ``seqmem repro echo --seeds`` seed record."""
    if _is_repro_seed_record(rec):
        return int(rec["key"]["seed"]), float(rec["key"]["config"]["lr"])
    return int(rec["seed"]), float(rec["lr"])


def cell_from_records(runs: Sequence[str | Path], metric: str, root: Path | None = None) -> dict[str, float]:
    """Per-seed values of ``metric`` from finished run records (a sweep's ``result.json``, or a repro's seed record,
    written only when its seed finished evaluating), keyed by seed."""
    out: dict[str, float] = {}
    for r in runs:
        path = Path(root or ".") / r
        rec = json.loads(path.read_text())
        if not _is_repro_seed_record(rec) and rec.get("status") != "finished":
            raise ValueError(f"{r}: run not finished")
        seed = str(record_seed_lr(rec)[0])
        if seed in out:
            raise ValueError(f"{r}: seed {seed} twice in one cell")
        out[seed] = record_value(rec, metric)
    return out
