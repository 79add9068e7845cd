"""``seqmem bench decode``: per-token decode time and state bytes against context length (issue #8 §2).

For each mixer the context is streamed once, in pieces of ``--piece`` tokens (default 1024) through the ``fast``
implementation under ``torch.inference_mode``; when it reaches a requested context length ``L`` the state is held
fixed and single-token steps ``mixer(x_1, state)`` are timed (warm-up, repeats, median) for each requested ``impl``
(the reference step gets the same state: the contract makes the two implementations' states interchangeable).
``attention`` decodes against its KV cache.  A one-token step of ``impl="fast"`` runs the mixer's
``single_token_impl`` (the per-token form where that is cheaper); each record's ``step_path`` says which ran.
State bytes per sequence are measured on the state itself
(each tensor's bytes divided by the batch; position counters included).  Streaming to a context or one
measurement that exceeds ``--max-seconds`` makes that context and the longer ones "not run".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from seqmem.bench.common import (
    CapExceeded,
    base_record,
    build_failed_records,
    fmt_len,
    measure,
    summarize_times,
    synchronize,
    time_limit,
    warm_up_device,
)
from seqmem.bench.speed import build, impls_of
from seqmem.mixers.base import count_state

DEFAULT_CONTEXTS = [1024, 2048, 4096, 8192, 16384, 32768, 65536]


def state_bytes(state: dict[str, torch.Tensor] | None) -> int:
    """Bytes held per sequence: every tensor's ``numel · element_size`` divided by its batch (first) dimension."""
    if not state:
        return 0
    return sum(v.numel() * v.element_size() // max(v.shape[0], 1) for v in state.values())


def run_decode(args: Any, device: torch.device, dtype: torch.dtype, mixers: list[str], contexts: list[int],
               machine: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
    records: list[dict[str, Any]] = []
    cap = args.max_seconds
    impls = impls_of(args.impl)
    warm = warm_up_device(device, dtype)  # no step time (nor the cap judged from it) pays the device's start-up
    if warm:
        log(f"device warm-up: {warm:.2f} s")
    for name in mixers:
        try:
            builder = build(name, args, "fast", device, dtype).eval()
            steppers = {}
            for impl in impls:
                s = build(name, args, impl, device, dtype).eval()
                s.load_state_dict(builder.state_dict())
                steppers[impl] = s
        except Exception as e:
            records += build_failed_records("decode", name, impls, contexts, e, args, device, dtype, machine)
            log(f"decode {name}: build failed: {e}")
            continue
        gen = torch.Generator(device="cpu").manual_seed(args.seed)
        state = None
        pos = 0
        build_s_total = 0.0
        blocked: str | None = None
        step_blocked: dict[str, str | None] = dict.fromkeys(impls)
        rate: float | None = None  # seconds per streamed token, last increment
        with torch.inference_mode():
            for n in contexts:
                recs = {}
                for impl in impls:
                    rec = base_record("decode", name, impl, n, args, device, dtype, machine)
                    rec.update(context=n, repeats=args.repeats, warmup=args.warmup, piece=args.piece,
                               step_path=steppers[impl].single_token_impl if impl == "fast" else "reference")
                    records.append(rec)
                    recs[impl] = rec
                if blocked is None and rate is not None and cap is not None and rate * (n - pos) > cap:
                    blocked = (f"streaming {n - pos} more tokens would take >= {rate * (n - pos):.1f} s at the last "
                               f"increment's rate (> --max-seconds {cap:g})")
                if blocked is None:
                    t0 = time.perf_counter()
                    start = pos
                    try:
                        with time_limit(cap):
                            while pos < n:
                                k = min(args.piece, n - pos)
                                x = torch.randn(args.batch, k, args.d_model, generator=gen).to(device=device,
                                                                                             dtype=dtype)
                                _, state = builder(x, state)
                                pos += k
                            synchronize(device)
                    except CapExceeded:
                        blocked = f"streaming the context to {fmt_len(n)} exceeded --max-seconds {cap:g}"
                    except Exception as e:
                        blocked = f"streaming failed: {type(e).__name__}: {e}"[:300]
                    dt = time.perf_counter() - t0
                    build_s_total += dt
                    if pos > start:
                        rate = dt / (pos - start)
                if blocked is not None:
                    for rec in recs.values():
                        rec.update(status="not run", note=blocked, median_ms=None)
                    log(f"decode {name:<20} L={fmt_len(n):>5}: not run ({blocked})")
                    continue
                sb, sn = state_bytes(state), count_state(state)
                for impl, rec in recs.items():
                    rec.update(state_bytes=sb, state_numbers=sn, stream_s=build_s_total)
                    if step_blocked[impl] is not None:
                        rec.update(status="not run", note=step_blocked[impl], median_ms=None)
                        continue
                    x1 = torch.randn(args.batch, 1, args.d_model, generator=gen).to(device=device, dtype=dtype)
                    stepper, st = steppers[impl], state

                    def step(stepper=stepper, x1=x1, st=st) -> None:
                        stepper(x1, st)

                    try:
                        res = measure(step, warmup=args.warmup, repeats=args.repeats, max_seconds=cap, device=device)
                    except Exception as e:
                        res = {"status": "error", "note": f"{type(e).__name__}: {e}"[:300]}
                    if res["status"] != "ok":
                        rec.update(status=res["status"], note=res["note"], median_ms=None)
                        step_blocked[impl] = f"context {fmt_len(n)} was not run ({res['note']})"
                        log(f"decode {name:<20} {impl:<9} L={fmt_len(n):>5}: {res['status']} ({res['note']})")
                        continue
                    s = summarize_times(res["times_ms"])
                    rec.update(status="ok", note=None, **s, repeats_done=len(res["times_ms"]),
                               tokens_per_s=args.batch / (s["median_ms"] / 1e3))
                    log(f"decode {name:<20} {impl:<9} L={fmt_len(n):>5}: {s['median_ms']:8.3f} ms/token, "
                        f"state {sb / 1024:,.1f} KiB (streamed in {build_s_total:.1f} s so far)")
        del builder, steppers, state
    return {"records": records}


def summarize_decode(records: list[dict[str, Any]], impl: str = "fast") -> tuple[list[dict], list[dict]]:
    """Per (mixer, context) rows and per-mixer flatness rows (issue #8 §4 (c)).

    "flat" means: the state bytes at the longest measured context are at most those at the shortest (+1 %) and the
    step time grows by at most 1.5× (timing noise on a shared CPU) — measured from 1k (or the shortest context).
    """
    recs = [r for r in records if r["impl"] == impl]
    mixers = list(dict.fromkeys(r["mixer"] for r in recs))
    attn = {r["seq_len"]: r for r in recs if r["mixer"] == "attention" and r.get("status") == "ok"}
    rows, flat = [], []
    for name in mixers:
        mine = sorted((r for r in recs if r["mixer"] == name), key=lambda r: r["seq_len"])
        ok = [r for r in mine if r.get("status") == "ok"]
        for r in mine:
            n = r["seq_len"]
            a = attn.get(n)
            rows.append({
                "mixer": name, "context": fmt_len(n),
                "ms/token": r["median_ms"] if r.get("status") == "ok" else r.get("status"),
                "state_KiB": r["state_bytes"] / 1024 if r.get("state_bytes") is not None else None,
                "attn/mixer": a["median_ms"] / r["median_ms"] if a and r.get("status") == "ok" else None,
            })
        if len(ok) >= 2:
            t_ratio = ok[-1]["median_ms"] / ok[0]["median_ms"]
            s_ratio = ok[-1]["state_bytes"] / max(ok[0]["state_bytes"], 1)
            verdict = "flat" if (t_ratio <= 1.5 and s_ratio <= 1.01) else "grows"
            if ok[-1]["seq_len"] < 65536:
                verdict += f" (to {fmt_len(ok[-1]['seq_len'])} only)"
        else:
            t_ratio = s_ratio = None
            verdict = "not measured"
        passes = None
        if name != "attention":
            common = [r for r in ok if r["seq_len"] in attn]
            slower = [attn[r["seq_len"]]["median_ms"] > r["median_ms"] for r in common]
            if common and all(slower):
                passes = f"<= {fmt_len(common[0]['seq_len'])}"
            elif common and slower[-1]:
                k = max(i for i, s in enumerate(slower) if not s)
                passes = fmt_len(common[k + 1]["seq_len"])
            elif common:
                passes = f"> {fmt_len(common[-1]['seq_len'])}"
        flat.append({
            "mixer": name,
            "ms@first": ok[0]["median_ms"] if ok else None, "ms@last": ok[-1]["median_ms"] if ok else None,
            "last_context": fmt_len(ok[-1]["seq_len"]) if ok else None,
            "time_ratio": t_ratio, "state_ratio": s_ratio,
            "state_KiB@last": ok[-1]["state_bytes"] / 1024 if ok else None,
            "(c)": verdict, "attention slower from": passes if name != "attention" else "—",
        })
    return rows, flat
