"""Run a sweep: one run directory per grid point, resumable, in worker processes with one thread each.

Per run directory: ``run.json`` (what ``seqmem train`` writes; a changed spec for an existing run, the lr
extensions' included, is refused: :func:`check_run_dirs`),
``metrics.jsonl`` and ``checkpoints/`` from the trainer, and ``result.json`` once the run has finished (validation
and reported metrics, state size, parameters, seconds).  Re-running the same sweep skips finished runs and resumes
partial ones from their newest good checkpoint, so a campaign can be stopped and continued on any machine.
A run that diverges (NaN loss at its learning rate) is a result too (``status: "diverged"``); any other error is
written to ``error.json`` and retried on the next invocation.  A ``result.json`` is sealed: it records the hashes
of the run's ``metrics.jsonl``, of its final weights and of its own content, and a result that is edited,
truncated, out of range or not the one its log ends with counts as unfinished (named in one line, trained again;
:func:`check_result`).

A run being trained holds a lock on its directory (``flock`` on ``.lock``, released when the process ends, even by a
crash), so several sweeps of one spec into one ``--out`` — two terminals, or a second worker started later — share
the grid instead of training the same run twice: each skips the runs another holds.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqmem.io import (
    UnsafePathError,
    atomic_write_bytes,
    atomic_write_text,
    check_within,
    file_sha256,
    is_locked,
    read_bytes_nofollow,
    run_lock,
    time_calls,
)
from seqmem.sweep.spec import Point, SpecError, SweepSpec

RESULT = "result.json"


class SweepConflict(SpecError):
    """Existing run directories were written by a different spec."""


def peak_state(model: Any, seq_len: int) -> int:
    """The most numbers per sequence ``model`` holds at any point of a ``seq_len``-token sequence (block mixers
    empty a partial-block buffer at each block end, so the size after exactly ``seq_len`` tokens understates them)."""
    return max(model.state_size(t) for t in range(1, seq_len + 1))


_ABSENT = object()


def spec_differences(old: Any, new: Any, path: str = "") -> list[str]:
    """The fields (dotted paths, e.g. ``train.steps``) where run spec ``old`` (a ``run.json``) differs from ``new``,
    each with both values."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in sorted(set(old) | set(new), key=str)
                for d in spec_differences(old.get(k, _ABSENT), new.get(k, _ABSENT), f"{path}.{k}" if path else str(k))]
    if old == new:
        return []

    def show(v: Any) -> str:
        t = "absent" if v is _ABSENT else json.dumps(v, default=str)
        return t if len(t) <= 60 else t[:57] + "..."

    return [f"{path or 'the spec'}: {show(old)} in run.json, {show(new)} now"]


def run_json_conflict(run_dir: Path, run_spec: dict[str, Any]) -> str | None:
    """Why the ``run.json`` in ``run_dir`` is not ``run_spec`` (the run directory holds another spec's run: its
    path and the differing fields), or None when it is the same or absent.  An unreadable one raises
    :class:`SweepConflict`."""
    f = Path(run_dir) / "run.json"
    if not (f.exists() or f.is_symlink()):
        return None
    try:
        old = json.loads(read_bytes_nofollow(f).decode("utf-8"))
    except (OSError, ValueError, RecursionError) as e:  # UnsafePathError (a link) is a ValueError
        raise SweepConflict(f"{f} is unreadable ({str(e).splitlines()[0]}): restore it, or delete that run "
                            "directory to train the run again") from None
    if old == run_spec:
        return None
    diff = spec_differences(old, run_spec)
    more = f"; and {len(diff) - 3} more field(s)" if len(diff) > 3 else ""
    return f"{f} (differs in {'; '.join(diff[:3])}{more})"


def check_conflicts(points: list[Point], out: Path) -> None:
    """Refuse to mix two specs in one directory: every existing ``run.json`` must equal its point's spec."""
    bad = [why for p in points if (why := run_json_conflict(out / p.rel_dir, p.run_spec)) is not None]
    if bad:
        more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
        raise SweepConflict(f"the spec changed for existing runs: {bad[0]}{more}; use another --out, or restore "
                            "the spec these runs were made with")


def check_run_dirs(spec: SweepSpec, out: Path, points: list[Point] | None = None) -> None:
    """:func:`check_conflicts` over every run directory the sweep may read: the grid and every lr extension's runs
    (:func:`extension_candidates`).  Checking the grid alone let an extension land on a directory an earlier
    version of the spec had trained (other steps or task options) and count it as one of its own finished runs."""
    points = spec.points() if points is None else points
    check_conflicts(points + extension_candidates(spec, points), Path(out))


#: labels of a run (which sweep, row, family and setting name it): not part of what is trained
_LABELS = ("name", "mixer", "family", "setting")


def run_identity(run_spec: dict[str, Any]) -> str:
    """What makes two runs the same training run, as one string: the task, the training (lr and seed included),
    the validation, and the model with its fields' defaults filled in and every layer as the layer it builds
    (:func:`seqmem.registry.layer_identity`: its class and canonical options); not the labels — the sweep's name,
    the row's, its family and the setting's.  A model the library cannot build is compared as written."""
    from seqmem.models.lm import LMConfig
    from seqmem.registry import layer_identity

    r = json.loads(json.dumps(run_spec))
    model = r.get("model") or {}
    try:
        cfg = LMConfig.from_dict({"vocab_size": 1, **model})  # the vocabulary is the task's
        layers = [layer_identity(name, dict(o)) for name, o in cfg.layers()]
        model = {**cfg.to_dict(), "mixer": None, "mixer_options": None, "layers": layers}
    except (ValueError, TypeError):
        pass
    sweep = {k: v for k, v in (r.get("sweep") or {}).items() if k not in _LABELS}
    return json.dumps({**r, "model": model, "sweep": sweep}, sort_keys=True, default=str)


def _finished_runs(src: Path) -> dict[str, tuple[Path, dict[str, Any]]]:
    """The finished runs under sweep directory ``src`` by :func:`run_identity`, each as (its directory, its
    result); the first in path order wins."""
    found: dict[str, tuple[Path, dict[str, Any]]] = {}
    for f in sorted(src.rglob("run.json")):
        d = f.parent
        res = read_result(d)
        if res is None or not (d / "metrics.jsonl").is_file():
            continue
        try:
            key = run_identity(json.loads(read_bytes_nofollow(f)))
        except (OSError, ValueError):  # unreadable, not JSON, or a symbolic link (UnsafePathError)
            continue
        found.setdefault(key, (d, res))
    return found


def reuse_finished(points: list[Point], out: Path, sources: list[Path], dry_run: bool = False,
                   log: Callable[[str], None] | None = None, found: set[Point] | None = None) -> int:
    """Copy finished runs that another sweep already trained with exactly these settings into ``out``.

    For every point not finished under ``out``: the first source directory holding a finished run that is the
    same training run (:func:`run_identity`: same task, model layers, training, lr, seed and validation, whatever
    the sweep, row or setting is called — a row renamed, or a layer option spelled another way that builds the
    same layer, is still found) gives its ``metrics.jsonl`` and ``result.json`` (with ``reused_from`` naming the
    source run, and the row, family and setting labels of this sweep); ``run.json`` is written as this sweep's.
    Checkpoints are not copied (the run is finished).  Returns the number of runs reused (that would be, with
    ``dry_run``); ``found``, if given, receives their points.
    """
    n = 0
    out = Path(out)
    for src in sources:
        src = Path(src)
        if not src.is_dir():
            raise SpecError(f"--reuse {src}: no such directory")
        if src.resolve() == out.resolve():
            raise SpecError(f"--reuse {src} is the sweep's own --out")
    index = [_finished_runs(Path(src)) for src in sources]
    for p in points:
        dst = out / p.rel_dir
        if is_finished(dst):
            continue
        key = run_identity(p.run_spec)
        hit = next((found[key] for found in index if key in found), None)
        if hit is None:
            continue
        d, res = hit
        try:  # never through a symbolic link: a link to a file outside would become a copy of it here
            metrics = read_bytes_nofollow(d / "metrics.jsonl")
        except (OSError, UnsafePathError) as e:
            if log is not None:
                log(f"not reused: {d}: {e}")
            continue
        n += 1
        if found is not None:
            found.add(p)
        if not dry_run:
            sw = p.run_spec.get("sweep", {})
            labels = {k: sw[k] for k in ("setting", "mixer", "family") if k in sw and k in res}
            check_within(out, dst / RESULT)
            dst.mkdir(parents=True, exist_ok=True)
            atomic_write_text(dst / "run.json", json.dumps(p.run_spec, indent=2), root=out)
            atomic_write_bytes(dst / "metrics.jsonl", metrics, root=out)
            new = {k: v for k, v in res.items() if k != SEAL}
            new.update(labels, reused_from=str(d))
            atomic_write_text(dst / RESULT, json.dumps(seal(new) if SEAL in res else new, indent=2), root=out)
    if n and log is not None:
        log(f"{'would reuse' if dry_run else 'reused'} {n} finished run(s) from {', '.join(map(str, sources))}")
    return n


def is_finished(run_dir: Path) -> bool:
    """Whether the run in ``run_dir`` has a valid result (:func:`read_result`)."""
    return read_result(run_dir) is not None


def trained_fraction(run_dir: Path, steps: int) -> float:
    """The share of ``steps`` an unfinished run has already trained: its newest checkpoint's step (by name; a
    corrupt one is found out when the run resumes) over ``steps``; 0 for a run that has none."""
    from seqmem.train.checkpoint import checkpoint_step, list_checkpoints

    found = list_checkpoints(run_dir / "checkpoints")  # oldest step first
    return min(checkpoint_step(found[-1]) / steps, 1.0) if found and steps > 0 else 0.0


def part_trained(out: Path, points: list[Point]) -> dict[Point, float]:
    """The unfinished runs among ``points`` that have trained some steps, with the share done
    (:func:`trained_fraction`)."""
    return {p: f for p in points if not is_finished(out / p.rel_dir)
            and (f := trained_fraction(out / p.rel_dir, p.run_spec["train"]["steps"])) > 0}


def run_cost(row_cost: dict[tuple, float], group: tuple) -> float:
    """CPU-seconds one run of row ``group`` costs: 0 for a row whose cost is not known (absent or NaN)."""
    c = row_cost.get(group, 0.0)
    return c if c == c else 0.0


def cost_left(counts: dict[tuple, tuple[int, int]], groups: dict[tuple, list[Point]], row_cost: dict[tuple, float],
              partial: dict[Point, float]) -> float:
    """CPU-seconds the runs left cost: each row's runs left (``counts``: :func:`plan_counts`) at its cost per run,
    less the share the part-trained ones (``partial``: :func:`part_trained`) have done; rows without a cost count 0."""
    cost = sum(run_cost(row_cost, groups[k][0].group) * max(n - d, 0) for k, (n, d) in counts.items())
    cost -= sum(run_cost(row_cost, p.group) * f for p, f in partial.items())
    return max(cost, 0.0)


def work_done(out: Path, mine: set[Point] | list[Point], started: dict[Point, float],
              row_cost: dict[tuple, float]) -> float:
    """CPU-seconds of the runs left that this process has trained so far: each of its runs (``mine``: finished or
    still in flight) at its row's cost per run, times the share it trained here — a finished run's whole, an
    unfinished one's newest checkpoint (:func:`trained_fraction`) — less the share done before this process started
    (``started``: :func:`part_trained`).  With several workers, runs in flight count too, so the ETA's rate is right
    from the first finished run on (it used to credit finished runs only, and started high)."""
    total = 0.0
    for p in mine:
        d = out / p.rel_dir
        now = 1.0 if is_finished(d) else trained_fraction(d, p.run_spec["train"]["steps"])
        total += run_cost(row_cost, p.group) * max(now - started.get(p, 0.0), 0.0)
    return total


#: result.json's hash of its own content (every other key, canonical JSON): an edit that does not recompute it
#: is found out
SEAL = "sha256"
#: result.json's hashes of what produced it: the run's metrics.jsonl and its final checkpoint's model.safetensors
METRICS_HASH, WEIGHTS_HASH = "metrics_sha256", "weights_sha256"


def _canonical(result: dict[str, Any]) -> bytes:
    return json.dumps({k: v for k, v in result.items() if k != SEAL}, sort_keys=True, separators=(",", ":"),
                      default=str).encode()


def seal(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` with :data:`SEAL`, the SHA-256 of the rest of it."""
    import hashlib

    return {**{k: v for k, v in result.items() if k != SEAL}, SEAL: hashlib.sha256(_canonical(result)).hexdigest()}


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _metrics_problem(name: str, m: Any) -> str | None:
    """Why a result's metrics table ``m`` (``valid`` / ``report``) is not plausible, or None: finite numbers,
    accuracies (keys with ``acc``) in [0, 1], losses non-negative."""
    if not isinstance(m, dict) or not m:
        return f"'{name}' is not a table of metrics"
    for k, v in m.items():
        if not _num(v):
            return f"'{name}.{k}' is {v!r}, not a finite number"
        if "acc" in k and not 0.0 <= v <= 1.0:
            return f"'{name}.{k}' is {v!r}, outside [0, 1]"
        if "loss" in k and v < 0:
            return f"'{name}.{k}' is {v!r}, negative"
    return None


def result_problem(run_dir: Path, r: Any) -> str | None:
    """Why ``r`` (the parsed ``result.json`` of ``run_dir``) cannot be trusted as the run's result, or None.

    Checked: a JSON object with ``status`` finished or diverged; ``lr``, ``seed``, ``steps`` of the right types;
    a finished run's ``valid`` and ``report`` metrics finite and in range.  A sealed result (:data:`SEAL`, written
    since results were bound to what produced them) must match its own hash, the hash of ``metrics.jsonl`` and,
    where the final checkpoint is there, that checkpoint's weights.  An unsealed result (written before) must be
    consistent with its ``metrics.jsonl``: the log ends at the result's step count with the final evaluation the
    result reports (on the ``eval`` split); one that carries a key written only beside a seal (the log's or the
    weights' hash) has had its seal removed and is refused."""
    if not isinstance(r, dict):
        return f"not a JSON object (a {type(r).__name__})"
    status = r.get("status")
    if status not in ("finished", "diverged"):
        return f"'status' is {status!r}, not finished or diverged"
    if not (_num(r.get("lr")) and r["lr"] > 0):
        return f"'lr' is {r.get('lr')!r}, not a positive number"
    for k in ("seed", "steps"):
        v = r.get(k)
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if k == "seed" else 1):
            return f"'{k}' is {v!r}, not a {'non-negative' if k == 'seed' else 'positive'} integer"
    if status == "finished":
        for part in ("valid", "report"):
            if (why := _metrics_problem(part, r.get(part))) is not None:
                return why
    metrics = Path(run_dir) / "metrics.jsonl"
    if SEAL in r:
        import hashlib

        if r[SEAL] != hashlib.sha256(_canonical(r)).hexdigest():
            return "edited after it was written (its sha256 does not match its content)"
        if METRICS_HASH in r:
            try:
                if file_sha256(metrics) != r[METRICS_HASH]:
                    return "metrics.jsonl is not the log this result was written with (its hash differs)"
            except OSError:
                return "metrics.jsonl is missing"
        w = r.get(WEIGHTS_HASH)
        if w is not None:
            man = Path(run_dir) / "checkpoints" / f"ckpt-{r['steps']:08d}" / "manifest.json"
            if man.is_file():  # finished runs are usually kept without checkpoints (committed, packed)
                try:
                    got = json.loads(man.read_text())["files"]["model.safetensors"]
                except (OSError, ValueError, KeyError, TypeError):
                    return f"the final checkpoint's manifest {man} is unreadable"
                if got != w:
                    return "the final checkpoint's weights are not those this result was written with"
        return None
    marks = [k for k in (METRICS_HASH, WEIGHTS_HASH, "sealed_later") if k in r]
    if marks:  # written since results were sealed (these keys came with the seal): its seal was removed
        return f"its seal ({SEAL}) is missing though it carries {marks[0]}: edited after it was written"
    try:  # unsealed: written before results were sealed; must agree with the log
        rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return "unsealed and no metrics.jsonl beside it"
    except (OSError, ValueError):
        return "unsealed and its metrics.jsonl is unreadable"
    if status == "diverged":
        return None
    if not rows or not isinstance(rows[-1], dict):
        return "unsealed and its metrics.jsonl is empty (no training was logged)"
    last = rows[-1]
    if last.get("step") != r["steps"]:
        return f"unsealed and its metrics.jsonl ends at step {last.get('step')!r}, not {r['steps']}"
    final = {k[5:]: v for k, v in last.items() if k.startswith("eval_")}
    if final and r.get("report_split", "eval") == "eval":
        for k, v in r["report"].items():
            if k in final and not (_num(final[k]) and math.isclose(v, final[k], rel_tol=1e-6, abs_tol=1e-9)):
                return f"unsealed and 'report.{k}' = {v!r} is not the final evaluation in metrics.jsonl ({final[k]!r})"
    return None


_checked: dict[str, tuple[tuple, Any, str | None]] = {}


def _stat_key(p: Path) -> tuple:
    try:
        st = p.stat()
        return (st.st_ino, st.st_size, st.st_mtime_ns)
    except OSError:
        return ()


def check_result(run_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """``(result, None)`` for a valid ``result.json`` in ``run_dir``; ``(None, why)`` for one that is there but
    cannot be trusted (:func:`result_problem`; ``why`` names the file); ``(None, None)`` for none.  The verdict is
    cached by the file's bytes and the log's and checkpoints' sizes and times, so the planner's many calls do not
    hash the log again."""
    run_dir = Path(run_dir)
    f = run_dir / RESULT
    try:
        data = read_bytes_nofollow(f)
    except FileNotFoundError:
        return None, None
    except UnsafePathError:
        return None, f"{f}: a symbolic link, not a file"
    except OSError as e:
        return None, f"{f}: unreadable ({e.strerror or e})"
    key = (data, _stat_key(run_dir / "metrics.jsonl"), _stat_key(run_dir / "checkpoints"))
    hit = _checked.get(str(f))
    if hit is not None and hit[0] == key:
        return hit[1], hit[2]
    try:
        r = json.loads(data.decode("utf-8"))
        problem = result_problem(run_dir, r)
    except UnicodeDecodeError:
        r, problem = None, "not UTF-8 text"
    except (ValueError, RecursionError) as e:
        r, problem = None, f"not valid JSON (truncated or empty?): {str(e).splitlines()[0]}"
    res, why = (r, None) if problem is None else (None, f"{f}: {problem}")
    if len(_checked) > 100_000:
        _checked.clear()
    _checked[str(f)] = (key, res, why)
    return (json.loads(json.dumps(res)) if res is not None else None), why


def read_result(run_dir: Path) -> dict[str, Any] | None:
    """The run's result when it is there and valid (:func:`check_result`), else None (unfinished)."""
    return check_result(run_dir)[0]


def invalid_results(out: Path, points: list[Point]) -> list[str]:
    """One line per point under ``out`` whose ``result.json`` is there but invalid (:func:`check_result`)."""
    return [why for p in points if (why := check_result(Path(out) / p.rel_dir)[1]) is not None]


def run_point(run_spec: dict[str, Any], run_dir: str, threads: int = 1, compile: bool = False,
              device: str = "cpu") -> dict[str, Any]:
    """Train (or resume) one grid point and write its ``result.json``; returns the result — or, when another
    process holds the run's lock (:func:`run_lock`), ``{"status": "busy"}`` without touching the run.
    ``compile``: the training steps through ``torch.compile`` (see :func:`seqmem.train.train`).  ``device``: where
    the model trains (``cpu``, ``cuda``, ...); the data stream is generated on the CPU from the seed either way, and
    checkpoints are device-independent, so a run started on one device can be resumed on another."""
    with run_lock(Path(run_dir)) as held:
        if not held:
            return {"status": "busy", "error": "another process is training this run"}
        # another spec's run in this directory (a sweep of an edited spec started since the caller's check):
        # never counted as, nor continued into, this one
        if (why := run_json_conflict(Path(run_dir), run_spec)) is not None:
            raise SweepConflict(f"the spec changed for an existing run: {why}")
        done = read_result(Path(run_dir))  # finished by another process between the caller's check and the lock
        if done is not None:
            return done
        return _train_point(run_spec, run_dir, threads, compile, device)


def device_name(device: str) -> str:
    """``device`` as recorded in ``result.json``: the accelerator's name for a GPU (``cuda (NVIDIA H200)``)."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(dev)})"
    return dev.type


def _train_point(run_spec: dict[str, Any], run_dir: str, threads: int, compile: bool = False,
                 device: str = "cpu") -> dict[str, Any]:
    import torch

    from seqmem.mixers.base import NonFiniteError
    from seqmem.train import TrainConfig, evaluate, train
    from seqmem.train.checkpoint import latest_good_checkpoint
    from seqmem.train.run import build_run

    torch.set_num_threads(threads)
    d = Path(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    spec_file = d / "run.json"
    if not spec_file.exists():
        atomic_write_text(spec_file, json.dumps(run_spec, indent=2))
    torch.manual_seed(run_spec["train"]["seed"])
    model, task = build_run(run_spec)
    model.to(device)
    cfg = TrainConfig(**run_spec["train"])
    sweep = run_spec.get("sweep", {})
    resume = latest_good_checkpoint(d / "checkpoints") is not None
    t0, c0 = time.perf_counter(), time.process_time()
    result: dict[str, Any] = {
        "setting": sweep.get("setting"), "mixer": sweep.get("mixer"), "family": sweep.get("family"),
        "lr": cfg.lr, "seed": cfg.seed, "steps": cfg.steps,
        "params": model.num_parameters(), "state": peak_state(model, task.seq_len), "seq_len": task.seq_len,
        "resumed": resume, "device": device_name(device),
    }
    if compile:  # this process's steps ran compiled (an earlier part of a resumed run may not have)
        result["compiled"] = True
    before: float | None = 0.0  # CPU seconds of the steps earlier processes trained (a resumed run)
    try:
        res = train(model, task, cfg, out_dir=d, resume=resume, compile=compile)
        total, estimated = res.total_cpu_seconds(cfg.steps)
        before = total - res.cpu_seconds
        if estimated:  # the checkpoint predates the record: estimated at this process's rate per step
            result["cpu_seconds_estimated"] = True
        report_split = getattr(task, "report_split", "eval")
        # in the run's own precision, as its log's evaluations and `seqmem eval` (a bf16 run was evaluated in fp32)
        result["valid"] = evaluate(model, task, sweep.get("valid_examples", 512), cfg.eval_batch_size,
                                   split="valid", precision=cfg.precision)
        result["report"] = evaluate(model, task, cfg.eval_examples, cfg.eval_batch_size, split=report_split,
                                    precision=cfg.precision)
        result["report_split"] = report_split
        result["eval_precision"] = cfg.precision  # what "valid" and "report" were computed in
        result["status"] = "finished"
        result["train_seconds"] = res.seconds
    except (FloatingPointError, NonFiniteError) as e:  # diverged at this learning rate: a result, not a crash
        result["status"] = "diverged"
        result["error"] = str(e).splitlines()[0]
    result["seconds"] = time.perf_counter() - t0
    # what the run cost, earlier processes of a resumed run included; the wall clock also counts waiting for a core
    result["cpu_seconds"] = time.process_time() - c0 + (before or 0.0)
    if resume:
        result["cpu_seconds_before_resume"] = before
    # bound to what produced it: the log, the final weights (their manifest hash), and its own content
    if (d / "metrics.jsonl").is_file():
        result[METRICS_HASH] = file_sha256(d / "metrics.jsonl")
    final = d / "checkpoints" / f"ckpt-{cfg.steps:08d}" / "manifest.json"
    if result["status"] == "finished" and final.is_file():
        result[WEIGHTS_HASH] = json.loads(final.read_text())["files"]["model.safetensors"]
    atomic_write_text(d / RESULT, json.dumps(seal(result), indent=2))
    err = d / "error.json"
    if err.exists():
        err.unlink()
    return result


def _exit_with_parent(parent: int) -> None:
    """Worker initializer: exit as soon as the sweep's main process is gone (killed, even with SIGKILL), so no
    orphaned worker keeps training into a run directory that a later invocation will use."""
    import threading

    def watch() -> None:
        while True:
            time.sleep(2.0)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _run_point_safe(run_spec: dict[str, Any], run_dir: str, threads: int, compile: bool = False,
                    device: str = "cpu") -> dict[str, Any]:
    try:
        return run_point(run_spec, run_dir, threads, compile, device)
    except Exception as e:  # noqa: BLE001 — recorded and retried next time; the sweep goes on
        msg = f"{type(e).__name__}: {e}".splitlines()[0]
        try:
            atomic_write_text(Path(run_dir) / "error.json", json.dumps({"error": msg}))
        except OSError:
            pass
        return {"status": "error", "error": msg}


def _worker_main(conn: Any, parent: int, args: tuple) -> None:
    """A worker process: one run, its result sent back through ``conn``."""
    _exit_with_parent(parent)
    try:
        conn.send(_run_point_safe(*args))
    finally:
        conn.close()


class _Workers:
    """One process per run (spawned, so nothing of the parent's torch state is shared): a worker that dies — killed,
    out of memory — costs its own run only, reported as an error (and retried next time), while the others go on.
    (A process pool breaks as a whole when one worker dies, and every run in flight with it.)"""

    def __init__(self, parent: int) -> None:
        import multiprocessing as mp

        self.ctx = mp.get_context("spawn")
        self.parent = parent
        self.running: dict[Any, tuple[Point, Any, Any, str]] = {}  # sentinel -> (point, process, pipe, run dir)

    def start(self, p: Point, args: tuple) -> None:
        recv, send = self.ctx.Pipe(duplex=False)
        proc = self.ctx.Process(target=_worker_main, args=(send, self.parent, args), daemon=True)
        proc.start()
        send.close()
        self.running[proc.sentinel] = (p, proc, recv, args[1])

    def wait(self) -> list[tuple[Point, dict[str, Any]]]:
        """Block until at least one run ends; its point and result (a dead worker's: an error naming its exit)."""
        from multiprocessing.connection import wait as wait_any

        conns = {v[2]: k for k, v in self.running.items()}
        ready = wait_any(list(conns) + list(self.running))
        done = []
        for obj in ready:
            key = conns.get(obj, obj)
            if key not in self.running:
                continue
            p, proc, recv, run_dir = self.running.pop(key)
            try:
                r = recv.recv() if recv.poll() else None
            except (EOFError, OSError):
                r = None
            proc.join()
            recv.close()
            if r is None:
                code = proc.exitcode
                import signal

                how = (f"killed by signal {signal.Signals(-code).name}" if code is not None and code < 0
                       and -code in signal.Signals._value2member_map_ else f"exit code {code}")
                msg = f"the worker training this run died ({how}); re-run the sweep to resume it"
                try:
                    atomic_write_text(Path(run_dir) / "error.json", json.dumps({"error": msg}))
                except OSError:
                    pass
                r = {"status": "error", "error": msg}
            done.append((p, r))
        return done

    def terminate(self) -> None:
        for _, proc, _recv, _ in self.running.values():
            if proc.is_alive():
                proc.terminate()
        for _, proc, recv, _ in self.running.values():
            proc.join(5)
            recv.close()
        self.running.clear()


def step_seconds(run_spec: dict[str, Any]) -> float:
    """CPU seconds of one training step (forward + backward at the run's batch size, the faster of two after one
    untimed step, with the loss computed as training computes it: the head at the scored positions only), measured
    with one thread — for ETAs and cost estimates.  The untimed step takes the one-time costs of a process's first
    steps: without it the first model probed in a process, whichever it was, came out 1.3–2.8× its steady step
    time (elastic_settle: its first row 308 ms/step against 239 for rows that differ only in the sampling)."""
    import torch

    from seqmem.tasks.base import split_batch
    from seqmem.train.loop import scored_loss, takes_positions
    from seqmem.train.run import build_run

    model, task = build_run(run_spec)
    x, y, am = split_batch(task.sample(run_spec["train"].get("batch_size", 32), torch.Generator().manual_seed(0)))
    sparse = takes_positions(model)

    def step() -> None:
        scored_loss(model, x, y, sparse, action_mask=am)[0].backward()

    # CPU time, not wall clock: on a loaded machine the wall clock swings several-fold with the load, the CPU time a
    # one-thread step needs does not.  One thread: the process's CPU time also counts idle intra-op threads spinning
    # while they wait for work.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return min(time_calls(step, repeats=2, warmup=1, clock=time.process_time))
    finally:
        torch.set_num_threads(threads)


def estimate_costs(points: list[Point], log: Callable[[str], None] | None = None, runs_per_model: float = 1.0,
                   jobs: int = 1) -> dict[Point, float]:
    """Estimated seconds of each point (one-thread step time × steps), probing each distinct model once; each
    logged line carries a projection of the whole sweep's wall time (``runs_per_model`` runs of each model on
    ``jobs`` workers) from the models probed so far, so the ETA is there from the first seconds."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    probe: dict[str, float] = {}
    out: dict[Point, float] = {}
    keys = {json.dumps({"task": p.run_spec["task"], "model": p.run_spec["model"]}, sort_keys=True) for p in points}
    try:
        for p in points:
            key = json.dumps({"task": p.run_spec["task"], "model": p.run_spec["model"]}, sort_keys=True)
            if key not in probe:
                try:
                    probe[key] = step_seconds(p.run_spec)
                except Exception:  # noqa: BLE001 — the run itself will report the error
                    probe[key] = float("nan")
                if log is not None:
                    run_s = probe[key] * p.run_spec["train"]["steps"]
                    known = [v * p.run_spec["train"]["steps"] for v in probe.values() if v == v]
                    proj = sum(known) / max(len(known), 1) * len(keys) * runs_per_model / max(jobs, 1)
                    label = " / ".join([p.setting, p.mixer] + ([str(dict(p.model_axes))] if p.model_axes else []))
                    log(f"  [{len(probe)}/{len(keys)}] {label}: "
                        f"{probe[key] * 1e3:.0f} ms/step, ~{_fmt_secs(run_s)} per run | projected ETA "
                        f"{_fmt_secs(proj)}")
            out[p] = probe[key] * p.run_spec["train"]["steps"]
    finally:
        torch.set_num_threads(threads)
    return out


def choose_lr(values: dict[float, float], select: str) -> float | None:
    """The learning rate with the best validation value (``nan`` = diverged = worst); ``None`` if empty."""
    best = None
    for lr, v in values.items():
        if best is None:
            best = lr
            continue
        b = values[best]
        if math.isnan(b) and not math.isnan(v):
            best = lr
        elif not math.isnan(v) and (v > b if select == "accuracy" else v < b):
            best = lr
    return best


def tied_lrs(values: dict[float, float], best: float, select: str) -> list[float]:
    """The lrs whose value ties ``best``'s (``best`` included; sorted).  :func:`choose_lr` keeps the first of a tie,
    so a tie that reaches the grid's edge hides an edge choice: the lr extension and the report's edge mark read
    the whole tie.  At the metric's bounds (accuracy 1 or 0) or a diverged ``best``, only ``best``: there a tie
    says nothing about where the best lr lies.  A tie at another floor (a model at chance) is read as a tie, and
    the extension probes beyond both of its edges (at most ``lr_extend`` per side)."""
    b = values[best]
    if math.isnan(b) or (select == "accuracy" and (b >= 1.0 or b <= 0.0)):
        return [best]
    return sorted(lr for lr, v in values.items()
                  if lr == best or (not math.isnan(v) and math.isclose(v, b, rel_tol=1e-12, abs_tol=1e-15)))


def valid_value(r: dict[str, Any] | None, select: str, part: str = "valid") -> float | None:
    """A finished run's metric (``None`` while unfinished; ``nan`` if it diverged)."""
    if r is None or r.get("status") not in ("finished", "diverged"):
        return None
    if r["status"] == "diverged":
        return math.nan
    return float(r[part][select])


def group_points(points: list[Point]) -> dict[tuple, list[Point]]:
    groups: dict[tuple, list[Point]] = {}
    for p in points:
        groups.setdefault(p.group, []).append(p)
    return groups


def selection_lrs(spec: SweepSpec, pts: list[Point], out: Path) -> dict[float, float]:
    """Validation value per lr used to choose a row's lr: mean over seeds (``all_seeds``) or the first seed's
    (``first_seed``); lrs with no finished run are absent."""
    by_lr: dict[float, list[float]] = {}
    if spec.lr_selection == "all_seeds":  # an lr the plan holds with fewer than every seed (a probe) is not chosen
        probes = probe_lrs(spec, pts)
        pts = [p for p in pts if p.lr not in probes]
    for p in pts:
        if spec.lr_selection == "first_seed" and not spec.is_first_stage(p):
            continue
        v = valid_value(read_result(out / p.rel_dir), spec.select)
        if v is not None:
            by_lr.setdefault(p.lr, []).append(v)
    return {lr: (math.nan if any(math.isnan(v) for v in vs) else sum(vs) / len(vs)) for lr, vs in by_lr.items()}


def probe_lrs(spec: SweepSpec, pts: list[Point]) -> set[float]:
    """Under ``all_seeds`` with ``lr_extend``: the lrs ``pts`` hold with only some of the seeds — an extension's
    first-seed probe that has not (yet) beaten the chosen lr (:func:`all_seeds_plan`)."""
    seeds: dict[float, set[int]] = {}
    for p in pts:
        seeds.setdefault(p.lr, set()).add(p.seed)
    return {lr for lr, s in seeds.items() if not s >= set(spec.seeds)}


def all_seeds_plan(spec: SweepSpec, pts: list[Point], out: Path) -> tuple[list[Point], bool]:
    """``(runs, decided)`` of one row under ``all_seeds`` selection with ``lr_extend``: the grid, every lr with
    every seed; while the lr with the best validation mean over seeds, or an lr tied with it (:func:`tied_lrs`), is
    the largest (smallest) tried, a probe at ``edge × factor`` (``/ factor``; :func:`extended_lr`) with the first
    seed, at most ``lr_extend`` per side.  A
    probe whose first-seed validation beats the best lr's first seed, or is within the seed spread of it (twice the
    best lr's std over seeds: rule 1 of docs/results/README.md), gets the other seeds too and joins the choice (mean
    over seeds again); one beyond it is the evidence that the best is interior, and is never chosen.
    ``decided``: every run the row needs has finished.  A row with a single lr is never extended."""
    plan = list(pts)
    first, grid = spec.seeds[0], sorted({p.lr for p in pts})  # the row's own grid (a row may set its lrs)

    def first_value(lr: float) -> float | None:
        return valid_value(read_result(out / spec.point_at(pts[0], lr, first).rel_dir), spec.select)

    while True:
        if not all(is_finished(out / p.rel_dir) for p in plan):
            return plan, False
        vals = selection_lrs(spec, plan, out)
        best = choose_lr(vals, spec.select)
        if best is None or math.isnan(vals[best]):
            return plan, True

        spread = _spread(spec, plan, best, out)
        won = [lr for lr in sorted(probe_lrs(spec, plan))
               if choose_lr({best: first_value(best), lr: first_value(lr)}, spec.select) == lr
               or (first_value(lr) is not None and not math.isnan(first_value(lr))
                   and abs(first_value(lr) - first_value(best)) <= spread)]
        if won:  # a probe beat the choice on the first seed, or is within the seed spread: the other seeds decide
            plan += [spec.point_at(plan[0], lr, s) for lr in won for s in spec.seeds if s != first]
            continue
        if len(grid) == 1:  # an lr grid of one is never extended
            return plan, True
        new = _edge_probe(spec, vals, best, sorted({p.lr for p in plan}), grid)
        if new is None:
            return plan, True
        plan.append(spec.point_at(plan[0], new, first))


def _spread(spec: SweepSpec, plan: list[Point], best: float, out: Path) -> float:
    """Twice the sample std of ``best``'s validation values over its seeds (rule 1's seed spread; unbounded when
    a seed diverged, 0 with one seed)."""
    vals = list(_seed_values(spec, [p for p in plan if p.lr == best], out).get(best, {}).values())
    if any(math.isnan(v) for v in vals):
        return math.inf
    if len(vals) < 2:
        return 0.0
    mean = sum(vals) / len(vals)
    return 2 * math.sqrt(sum((v - mean) ** 2 for v in vals) / (len(vals) - 1))


def extension_candidates(spec: SweepSpec, points: list[Point]) -> list[Point]:
    """Every run an lr extension could ask for (each row's lrs beyond its grid, up to ``lr_extend`` per side, with
    every seed): what ``--reuse`` may copy before the extension is known."""
    if not spec.lr_extend:
        return []
    out = []
    for pts in group_points(points).values():
        grid = {p.lr for p in pts}
        if len(grid) == 1:
            continue
        for lr0, factor in ((max(grid), spec.lr_extend_factor), (min(grid), 1 / spec.lr_extend_factor)):
            lr = lr0
            for _ in range(spec.lr_extend):
                lr = extended_lr(lr, factor)
                out += [spec.point_at(pts[0], lr, s) for s in spec.seeds]
    return out


def extended_lr(best: float, factor: float) -> float:
    """``best × factor`` rounded to one significant digit (1e-3 / 3 → 3e-4), or to as few more as keep it beyond
    ``best`` (1e-2 × 1.4 → 0.01 would not extend at all: 0.014).  The value rounded is the one trained, named and
    reported."""
    x = best * factor
    for digits in range(1, 18):
        v = float(f"{x:.{digits}g}")
        if (v > best) if factor > 1 else (v < best):
            return v
    return x


def row_plan(spec: SweepSpec, pts: list[Point], out: Path, tuned: bool = False
             ) -> tuple[list[Point], list[Point], bool]:
    """``(stage1, stage2, decided)`` of one row under ``first_seed`` selection.

    Stage 1: the first seed at every lr of the grid, and — with ``lr_extend`` — one beyond the grid's edge
    (``edge × factor`` or ``edge / factor``, rounded to one significant digit: 1e-3 / 3 → 3e-4) while the best
    finished one, or an lr tied with it (:func:`tied_lrs`), is the largest (smallest) tried, at most ``lr_extend``
    per side.
    Stage 2: the other seeds at the chosen lr, once stage 1 has finished (``decided``) — at once for a row with a
    single lr that is not in a tune group (``tuned``): there is nothing to choose, so all its seeds can run side by
    side (an lr grid of one is never extended).  With ``lr_confirm`` also every lr within the seed spread
    (:func:`confirm_lrs`); once they have finished, a choice the mean over seeds puts at the edge of the lrs
    tried is probed beyond it as above (the row is undecided again while the probe runs; the lrs already given
    every seed stay in the plan and in the choice)."""
    stage1 = [p for p in pts if spec.is_first_stage(p)]
    if len(stage1) == 1 and not tuned:
        return stage1, [p for p in pts if p is not stage1[0] and p.lr == stage1[0].lr], True
    grid = sorted(p.lr for p in stage1)  # the row's own grid
    keep: list[Point] = []  # lr_confirm: the other seeds known before a probe of the mean-over-seeds choice
    while True:
        if not all(is_finished(out / p.rel_dir) for p in stage1):
            return stage1, keep, False
        vals = selection_lrs(spec, stage1, out)
        best = choose_lr(vals, spec.select)
        if best is None:
            return stage1, keep, False
        tried = sorted(vals)
        if spec.lr_extend and len(tried) > 1 and not math.isnan(vals[best]):
            new = _edge_probe(spec, vals, best, tried, grid)
            if new is not None:
                stage1 = stage1 + [spec.point_at(stage1[0], new, spec.seeds[0])]
                continue
        given = {(p.lr, p.seed): p for p in pts}
        stage2 = [given.get((best, s)) or spec.point_at(stage1[0], best, s) for s in spec.seeds[1:]]
        if spec.lr_confirm:
            stage2 += [given.get((lr, s)) or spec.point_at(stage1[0], lr, s)
                       for lr in confirm_lrs(spec, stage1, stage2, best, out) for s in spec.seeds[1:]]
            stage2 += [p for p in keep if p not in stage2]  # lrs given every seed before a probe stay in the choice
            if spec.lr_extend and len(tried) > 1 and all(is_finished(out / p.rel_dir) for p in stage2):
                # rule 1: the mean over seeds may choose an lr at the edge the first seed did not: probe beyond it
                # with the first seed, as above (a probe within the seed spread then gets every seed too)
                chosen, means = _mean_choice(spec, stage1 + stage2, best, out)
                new = _edge_probe(spec, means, chosen, tried, grid) if means else None
                if new is not None:
                    stage1, keep = stage1 + [spec.point_at(stage1[0], new, spec.seeds[0])], stage2
                    continue
        return stage1, stage2, True


def _edge_probe(spec: SweepSpec, values: dict[float, float], best: float, tried: list[float],
                grid: list[float]) -> float | None:
    """The lr beyond the edge of ``tried`` that ``best`` (or an lr tied with it in ``values``) sits on, while
    fewer than ``lr_extend`` lrs lie beyond the row's ``grid`` on that side; ``None`` if the choice is interior,
    diverged or the side is spent."""
    if math.isnan(values[best]):
        return None
    tie = tied_lrs(values, best, spec.select)  # an lr tied with the choice at an edge: an edge choice
    new = None
    if tried[-1] in tie and sum(lr > max(grid) for lr in tried) < spec.lr_extend:
        new = extended_lr(tried[-1], spec.lr_extend_factor)
    elif tried[0] in tie and sum(lr < min(grid) for lr in tried) < spec.lr_extend:
        new = extended_lr(tried[0], 1 / spec.lr_extend_factor)
    return None if new is None or new in tried else new


def _seed_values(spec: SweepSpec, pts: list[Point], out: Path) -> dict[float, dict[int, float]]:
    """Validation value per lr and seed of the finished (or diverged: nan) runs among ``pts``."""
    by: dict[float, dict[int, float]] = {}
    for p in pts:
        v = valid_value(read_result(out / p.rel_dir), spec.select)
        if v is not None:
            by.setdefault(p.lr, {})[p.seed] = v
    return by


def confirm_lrs(spec: SweepSpec, stage1: list[Point], stage2: list[Point], best: float, out: Path) -> list[float]:
    """``lr_confirm``: the lrs whose first-seed validation value is within the seed spread of the first-seed
    choice ``best`` — twice the sample std of ``best``'s values over every seed (an order claim's ``std_a + std_b``
    with the other lr's std taken as the choice's; unbounded when a seed diverged there) — known once ``best`` has
    finished every seed (none before).  They get every seed, and :func:`chosen_lr` takes the best mean over seeds."""
    at_best = [p for p in stage1 if p.lr == best] + stage2
    if len(spec.seeds) < 2 or set(_seed_values(spec, at_best, out).get(best, {})) != set(spec.seeds):
        return []
    spread = _spread(spec, at_best, best, out)
    first = selection_lrs(spec, stage1, out)
    return sorted(lr for lr, v in first.items()
                  if lr != best and not math.isnan(v) and abs(v - first[best]) <= spread)


def chosen_lr(spec: SweepSpec, plan: RowPlan, out: Path) -> tuple[float | None, dict[float, float]]:
    """A row's chosen lr and, with ``lr_confirm``, the validation means over seeds it was chosen on: the
    first-seed choice, unless another lr of the row's plan has every seed (``lr_confirm`` gave them) and a better
    mean over seeds (a diverged seed is the worst value; a tie keeps the first-seed choice).  ``first_seed`` rows
    only (``{}`` without ``lr_confirm``)."""
    first = selection_lrs(spec, plan.stage1, out)
    best = choose_lr(first, spec.select)
    if best is None or not spec.lr_confirm:
        return best, {}
    return _mean_choice(spec, plan.points, best, out)


def _mean_choice(spec: SweepSpec, pts: list[Point], best: float, out: Path) -> tuple[float, dict[float, float]]:
    """Among the lrs of ``pts`` with every seed finished, the best validation mean over seeds and the means
    (``best``, the first-seed choice, wins a tie; a diverged seed is the worst value); ``(best, {})`` unless
    ``best`` and another lr have every seed."""
    by = _seed_values(spec, pts, out)
    full = {lr: d for lr, d in by.items() if set(d) == set(spec.seeds)}  # every planned lr with every seed
    if best not in full or len(full) < 2:
        return best, {}
    means = {lr: (math.nan if any(math.isnan(v) for v in d.values()) else sum(d.values()) / len(d))
             for lr, d in sorted(full.items(), key=lambda x: x[0] != best)}  # the first-seed choice first
    return choose_lr(means, spec.select), means


@dataclass
class RowPlan:
    """The runs one row needs as known now (``first_seed`` selection; ``all_seeds``: every grid point)."""

    stage1: list[Point]
    stage2: list[Point]
    decided: bool  # the row's lr is chosen (and, in a tune group, the group's row is chosen)
    needed: int  # runs the row needs in all, as far as the results so far tell
    tune: str | None = None
    chosen: bool | None = None  # in a decided tune group: whether this row is the group's choice

    @property
    def points(self) -> list[Point]:
        return self.stage1 + self.stage2


def _row_best(spec: SweepSpec, plan: RowPlan, out: Path) -> float | None:
    """A row's first-seed validation value at its chosen lr (None: nothing finished; nan: diverged)."""
    vals = selection_lrs(spec, plan.stage1, out)
    best = choose_lr(vals, spec.select)
    return None if best is None else vals[best]


def _best_key(spec: SweepSpec, values: dict[tuple, float]) -> tuple | None:
    """The key with the best value (nan worst; ties: the first, i.e. spec order)."""
    best = None
    for k, v in values.items():
        if best is None or (math.isnan(values[best]) and not math.isnan(v)) or (
                not math.isnan(v) and (v > values[best] if spec.select == "accuracy" else v < values[best])):
            best = k
    return best


def plan_rows(spec: SweepSpec, out: Path, points: list[Point] | None = None) -> dict[tuple, RowPlan]:
    """Every row's :class:`RowPlan`, keyed by ``Point.group``, in spec order.

    ``first_seed``: each row's stage 1 and stage 2 as :func:`row_plan` gives them.  Rows that share a tune group
    (``tune`` in the spec; per setting and model size) are one model with a hyperparameter: once every row of the
    group has chosen its lr, the row whose first seed is best on validation at its chosen lr is the group's choice
    and alone gets the other seeds; until then no row of the group starts its second stage (the other seeds are
    counted on the row leading so far, for ETAs)."""
    points = spec.points() if points is None else points
    groups = group_points(points)
    plans: dict[tuple, RowPlan] = {}
    for key, pts in groups.items():
        if spec.lr_selection == "all_seeds":
            if spec.lr_extend:
                runs, decided = all_seeds_plan(spec, pts, out)
                plans[key] = RowPlan(runs, [], decided, len(runs))
            else:
                plans[key] = RowPlan(pts, [], True, len(pts))
            continue
        tune = spec.tune_of(pts[0].mixer)
        s1, s2, decided = row_plan(spec, pts, out, tuned=tune is not None)
        plans[key] = RowPlan(s1, s2, decided, len(s1) + max(len(s2), len(spec.seeds) - 1), tune)
    tune_groups: dict[tuple, list[tuple]] = {}
    for key, plan in plans.items():
        if plan.tune:
            tune_groups.setdefault((key[0], key[2], plan.tune), []).append(key)
    extra = len(spec.seeds) - 1
    for keys in tune_groups.values():
        so_far = {k: v for k in keys if (v := _row_best(spec, plans[k], out)) is not None}
        decided = all(plans[k].decided for k in keys)
        best = _best_key(spec, so_far) or keys[0]
        for k in keys:
            plan = plans[k]
            if decided:
                plan.chosen = k == best
            else:
                plan.decided = False
            if not (decided and k == best):
                plan.stage2 = []
                plan.needed = len(plan.stage1) + (extra if k == best else 0)
    return plans


def wanted_points(spec: SweepSpec, out: Path, points: list[Point] | None = None) -> list[Point]:
    """The runs the sweep needs now: every point (``all_seeds``), or per row its stage-1 runs and, once they have
    finished, the other seeds at the chosen lr (``first_seed``, see :func:`plan_rows`)."""
    points = spec.points() if points is None else points
    if spec.lr_selection == "all_seeds" and not spec.lr_extend:
        return points
    return [p for plan in plan_rows(spec, out, points).values() for p in plan.points]


def plan_counts(spec: SweepSpec, out: Path, points: list[Point] | None = None) -> dict[tuple, tuple[int, int]]:
    """Per row ``(needed, finished)`` as known now: the runs it needs in all (stage 1, with the lr extensions its
    results ask for, plus the other seeds where it may get them) and how many of the runs it needs now
    (:func:`wanted_points`) have finished."""
    return {k: (plan.needed, sum(1 for p in plan.points if is_finished(out / p.rel_dir)))
            for k, plan in plan_rows(spec, out, points).items()}


def _fmt_secs(s: float) -> str:
    if s != s:
        return "?"
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


class NeedsConfirmation(ValueError):
    """A sweep whose estimated cost is above what it starts without ``--yes``."""


def run_sweep(
    spec: SweepSpec,
    out: Path,
    jobs: int = 1,
    threads: int = 1,
    log: Callable[[str], None] = print,
    probe: bool = True,
    dry_run: bool = False,
    limit: int | None = None,
    reuse: list[Path] | tuple[Path, ...] = (),
    compile: bool = False,
    device: str = "cpu",
    confirm_above_s: float | None = None,
    resume_first: bool = False,
) -> dict[str, Any]:
    """Run every unfinished run of ``spec`` under ``out``; returns counts.  See the module docstring.
    ``device``: where every run trains (see :func:`run_point`); the ETA probe times CPU steps whatever it is.
    ``confirm_above_s``: when the probe's estimate for the runs this call would start exceeds this many CPU-seconds,
    raise :class:`NeedsConfirmation` (after printing the estimate) instead of starting them.
    ``resume_first``: within a slice, part-trained runs (a checkpoint, no result) come first, the furthest trained
    first, then the rest as usual — for time-limited sessions, where longest-first leaves every interrupted run to the
    end of the campaign.

    With ``lr_selection = "first_seed"`` the second stage of a row (its other seeds at the chosen lr) starts as soon
    as the row's first-seed runs have finished, within the same invocation."""
    out = Path(out)
    points = spec.points()
    check_run_dirs(spec, out, points)  # the lr extensions' directories too
    bad = invalid_results(out, points)
    for why in bad[:5]:
        log(f"  {why}: not counted as finished; the run {'would be' if dry_run else 'is'} trained again")
    if len(bad) > 5:
        log(f"  ... and {len(bad) - 5} more invalid result.json file(s)")
    would_reuse: set[Point] = set()  # a dry run copies nothing: these are listed as reused, not as to run
    if reuse:  # an lr extension's runs too, before it is known whether the results ask for them
        reuse_finished(points + extension_candidates(spec, points), out, list(reuse), dry_run=dry_run, log=log,
                       found=would_reuse)
    groups = group_points(points)
    counts = plan_counts(spec, out, points)
    n_expected = sum(n for n, _ in counts.values())
    done_before = sum(d for _, d in counts.values())
    n_left = n_expected - done_before
    log(f"sweep {spec.name}: {n_expected} runs ({spec.lr_selection} lr selection), {done_before} finished, "
        f"{n_left} to run ({jobs} worker(s) x {threads} thread(s)) -> {out}")
    if dry_run and would_reuse:
        log(f"  ({len(would_reuse)} of the runs to run would be copied from --reuse, not trained)")
    # cost per row (all its runs share a model) for the ETA and for starting the runs with the most time left first
    row_cost: dict[tuple, float] = {}
    # the runs already part-trained, with the share of their steps done (what the ETA need not count again)
    started = part_trained(out, wanted_points(spec, out, points))
    if probe and n_left:
        log("measuring one-thread step times (CPU time, not inflated by load) for the ETA ..."
            + (" (eager steps: --compile's measured 0.68-1.04x of eager ones, wall clock on a 2-core CPU, "
               "docs/BENCHMARKS.md; plus a one-off compile per model)" if compile else ""))
        left = {k: n - d for k, (n, d) in counts.items() if d < n}
        left_rows = [groups[k] for k in left]
        c = estimate_costs([g[0] for g in left_rows], log,
                           runs_per_model=(sum(left.values()) - sum(started.values())) / max(len(left_rows), 1),
                           jobs=jobs)
        row_cost = {p.group: v for p, v in c.items()}
        total = cost_left(counts, groups, row_cost, started)  # part-trained runs: only the steps they have left
        log(f"estimated {total / 3600:.2f} CPU-hours for the runs left"
            + (f" ({len(started)} part-trained, counted by the steps they have left)" if started else "")
            + f", about {_fmt_secs(total / max(jobs, 1))} with {jobs} worker(s)")
        now = total * (min(1.0, limit / n_left) if limit is not None else 1.0)  # --limit: a share of them
        if confirm_above_s is not None and not dry_run and now > confirm_above_s:
            raise NeedsConfirmation(
                f"the runs left need an estimated {now / 3600:.1f} CPU-hours (about {_fmt_secs(now / max(jobs, 1))} "
                f"with {jobs} worker(s)) into {out}, more than the {confirm_above_s / 60:.0f} CPU-minutes a sweep "
                "starts without asking: add --yes to start them (make: YES=1), --limit N to run a few, or "
                "--dry-run to list them")
    slice_order = {}
    for p in points:
        slice_order.setdefault((p.setting, p.model_axes), len(slice_order))

    def order(todo: list[Point]) -> list[Point]:
        # slices (setting, model size) in spec order; within a slice the runs with the most CPU time left first
        # (a part-trained run counts by the steps it has left), so that the workers finish together
        # (with ``resume_first``, the part-trained runs first, the furthest trained first)
        def key(p: Point) -> tuple:
            frac = trained_fraction(out / p.rel_dir, p.run_spec["train"]["steps"])
            left = run_cost(row_cost, p.group) * (1.0 - frac)
            first = (-frac,) if resume_first else ()
            return (slice_order[(p.setting, p.model_axes)], *first, -left)

        return sorted(todo, key=key)

    if dry_run:
        todo = order([p for p in wanted_points(spec, out, points) if not is_finished(out / p.rel_dir)])
        for p in todo[:limit]:
            if p in would_reuse:
                log(f"  would reuse {p.rel_dir} (a finished run of --reuse; not trained)")
                continue
            log(f"  would run {p.rel_dir}" + ("  (another process is training it now)"
                                               if is_locked(out / p.rel_dir) else ""))
        if spec.lr_selection == "first_seed":
            log(f"  (+ the second-stage runs of rows whose lr is not chosen yet: {n_left - len(todo)})")
        return {"total": n_expected, "finished_before": done_before, "ran": 0, "errors": 0}

    t0 = time.perf_counter()
    state = {"finished": 0, "errors": 0}
    busy: set[Point] = set()  # runs another process took between the check and the start: not this process's work

    def left_now() -> tuple[int, int, float]:
        """(runs needed in all, runs finished, CPU-seconds left) as known now: an lr extension adds runs to a row
        (and, if it wins, that row's other seeds) only once the results that ask for it exist."""
        now = plan_counts(spec, out, points)
        # what the unfinished runs have trained so far (this process's runs included) is not left
        cost = cost_left(now, groups, row_cost, part_trained(out, wanted_points(spec, out, points)))
        return sum(n for n, _ in now.values()), sum(d for _, d in now.values()), cost

    def report(p: Point, r: dict[str, Any]) -> None:
        if r.get("status") == "busy":  # another process took it between the check and the start
            busy.add(p)
            log(f"skipped {p.rel_dir}: another process is training it")
            return
        state["finished"] += 1
        n_all, n_done, secs_left = left_now()
        # what this process has trained so far, its runs in flight included (a resumed run: the share it added)
        done_cost = work_done(out, attempted - busy, started, row_cost)
        el = time.perf_counter() - t0
        if r.get("status") == "finished":
            what = (f"valid {_metric(r['valid'], spec.select)}  {r.get('report_split', 'eval')} "
                    f"{_metric(r['report'], spec.select)}")
        elif r.get("status") == "diverged":
            what = "diverged"
        else:
            what = f"ERROR {r.get('error', '')}"
            state["errors"] += 1
        left = n_all - n_done
        if left <= 0:
            eta = "done"
        elif done_cost > 0 and secs_left > 1e-9:
            eta = f"ETA {_fmt_secs(el / done_cost * secs_left)}"
        else:
            eta = f"ETA {_fmt_secs(el / state['finished'] * left)}"
        log(f"[{n_done}/{n_all}] {p.rel_dir}  {what}  "
            f"{_fmt_secs(r.get('seconds', 0.0))}  | {eta}")

    # one run at a time per worker, always the first in priority order among the runs wanted *now*: a row's
    # second stage (first_seed selection) starts as soon as its first-seed runs finish, and slices complete in order
    attempted: set[Point] = set()
    budget = limit

    def next_point() -> Point | None:
        nonlocal budget
        if budget is not None and budget <= 0:
            return None
        # a run another process holds is left to it (not marked attempted: if that process dies, it is taken up)
        cand = order([p for p in wanted_points(spec, out, points)
                      if p not in attempted and not is_finished(out / p.rel_dir) and not is_locked(out / p.rel_dir)])
        if not cand:
            return None
        if budget is not None:
            budget -= 1
        attempted.add(cand[0])
        check_within(out, out / cand[0].rel_dir / RESULT)  # no run directory that is a link to elsewhere
        return cand[0]

    env_before = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = str(threads)  # inherited by spawned workers
    ex = None
    try:
        if jobs <= 1:
            import torch

            prev = torch.get_num_threads()
            try:
                while (p := next_point()) is not None:
                    report(p, _run_point_safe(p.run_spec, str(out / p.rel_dir), threads, compile, device))
            finally:
                torch.set_num_threads(prev)
        else:
            ex = _Workers(os.getpid())
            while True:
                while len(ex.running) < jobs and (p := next_point()) is not None:
                    ex.start(p, (p.run_spec, str(out / p.rel_dir), threads, compile, device))
                if not ex.running:
                    break
                for p, r in ex.wait():
                    report(p, r)
    except BaseException:  # Ctrl-C, SIGTERM (below) or an error: stop the workers too
        if ex is not None:
            ex.terminate()
            ex = None
        raise
    finally:
        if ex is not None:
            ex.terminate()
        if env_before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = env_before
    log(f"sweep {spec.name}: ran {state['finished']} run(s) in {_fmt_secs(time.perf_counter() - t0)}"
        + (f", {state['errors']} error(s) (see error.json; re-run to retry)" if state["errors"] else ""))
    return {"total": n_expected, "finished_before": done_before, "ran": state["finished"],
            "errors": state["errors"]}


def _metric(m: dict[str, Any], select: str) -> str:
    v = m.get(select)
    return "?" if v is None else f"{select} {v:.3f}"
