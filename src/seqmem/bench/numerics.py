"""``seqmem bench numerics``: low precision and long-horizon stability of every registered mixer.

Each mixer is built at a small width with its registered (paper) default options and random weights (fixed seed;
weight matrices that the mixer initialises to zero, such as SKA's output projection, are re-drawn so the output is
not identically zero), and fed one random input of ``--length`` tokens (batch 1) streamed in ``--piece``-token
pieces with the returned state, in

* ``float64`` — the reference (the float32 weights cast up);
* ``float32``;
* ``bf16`` — float32 weights under ``torch.autocast(device, dtype=torch.bfloat16)``;
* ``fp16`` — mixer and input cast to float16 (an op without a float16 CPU kernel is reported, not hidden);
* ``fp16_autocast`` (on request only, not in the default set) — float32 weights under
  ``torch.autocast(device, dtype=torch.float16)``.

Per mixer and precision it reports NaN/Inf in output and state, the relative error ``‖y − y64‖ / ‖y64‖`` over the
whole sequence, the first and the last ``--tail`` tokens, the largest state norm over time and the wall time; for
the float64 run it records every state tensor's norm after each piece, so growth (``‖s_T‖ / ‖s_{T/2}‖``) can be
compared with what each mechanism promises (:func:`promise`, its ``state_promise`` fact).  Forward only,
``impl="fast"`` unless ``--impl``; ``--backward`` adds the gradients at the end of the input in each precision
(:func:`backward_at_end`: finite, and their error against float32).

Run: ``python -m seqmem.bench.numerics --json FILE --markdown FILE`` (or ``seqmem bench numerics`` once wired).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

PRECISIONS = ("float64", "float32", "bf16", "fp16")
#: accepted by ``precisions=`` / ``--precisions`` but not run by default
EXTRA_PRECISIONS = ("fp16_autocast",)


def promise(name: str) -> tuple[str, str]:
    """What the mixer registered as ``name`` promises about its state norm over a long sequence, and why: its
    ``state_promise`` fact (``("bounded" | "grows", why)``; see :attr:`seqmem.mixers.base.Mixer.facts`).
    ``bounded``: the update is a contraction / a fixed-size buffer / a normalised memory, so norms stay bounded for
    bounded inputs; ``grows``: the state is (partly) an undecayed running sum or a growing cache, by design."""
    from seqmem.registry import mixer_facts

    return tuple(mixer_facts(name).get("state_promise", ("unknown", "not classified")))


def __getattr__(attr: str):
    if attr == "PROMISES":  # the former table: every registered mixer's promise, read from the registry
        from seqmem.registry import list_mixers

        return {n: promise(n) for n in list_mixers()}
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


# ------------------------------------------------------------------------------------------------- building blocks
def effective_options(name: str, d_model: int, options: dict[str, Any]) -> dict[str, Any]:
    """The options ``build_mixer(name, d_model, **options)`` ends up using: class defaults, registered defaults,
    then ``options`` (for the record)."""
    import inspect

    from seqmem import get_entry

    entry = get_entry(name)
    out: dict[str, Any] = {}
    for klass in reversed(entry.cls.__mro__):
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        for pname, p in inspect.signature(init).parameters.items():
            if pname in ("self", "d_model") or p.default is inspect.Parameter.empty:
                continue
            if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                continue
            out[pname] = p.default
    valid = set(entry.valid_options())
    out = {k: v for k, v in out.items() if k in valid}
    out.update(entry.defaults)
    out.update(options)
    return {k: (v if isinstance(v, int | float | str | bool | type(None)) else repr(v)) for k, v in out.items()}


def build_random_mixer(name: str, d_model: int, n_heads: int, seed: int, impl: str = "fast",
                       **options: Any) -> tuple[torch.nn.Module, list[str]]:
    """Build mixer ``name`` in float32 with seeded random weights; re-draw all-zero weight matrices.

    Returns ``(mixer, redrawn)`` where ``redrawn`` names the re-drawn parameters (N(0, 1/fan_in))."""
    import seqmem

    torch.manual_seed(seed)
    m = seqmem.build_mixer(name, d_model, n_heads=n_heads, impl=impl, **options)
    redrawn = []
    with torch.no_grad():
        for pname, p in m.named_parameters():
            if p.dim() >= 2 and p.is_floating_point() and not p.any():
                p.normal_(0.0, p.shape[-1] ** -0.5)
                redrawn.append(pname)
    return m.eval(), redrawn


def state_norms(state: dict[str, torch.Tensor] | None) -> dict[str, float]:
    """Frobenius norm (float64) of every floating-point state tensor (integer counters are skipped)."""
    out: dict[str, float] = {}
    for k, v in (state or {}).items():
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel():
            out[k] = float(v.detach().double().norm())
    return out


def _total(norms: dict[str, float]) -> float:
    return math.sqrt(sum(v * v for v in norms.values())) if norms else 0.0


def _stream(mixer: torch.nn.Module, x: torch.Tensor, piece: int, n_tokens: int, ctx: Callable[[], Any],
            max_seconds: float | None, on_piece: Callable[[int, torch.Tensor, dict], None]) -> dict[str, Any]:
    """Feed ``x[:, :n_tokens]`` to ``mixer`` in pieces, calling ``on_piece(start, y, state)`` after each."""
    state = None
    t0, c0 = time.perf_counter(), time.process_time()
    done = 0
    stopped = None
    with torch.no_grad():
        for s in range(0, n_tokens, piece):
            e = min(s + piece, n_tokens)
            with ctx():
                y, state = mixer(x[:, s:e], state)
            on_piece(s, y, state)
            done = e
            el = time.perf_counter() - t0
            if max_seconds is not None and done < n_tokens and el * n_tokens / done > max_seconds:
                stopped = (f"stopped after {done} of {n_tokens} tokens: projected "
                           f"{el * n_tokens / done:.0f} s > --max-seconds {max_seconds:g}")
                break
    return {"tokens": done, "seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0,
            "stopped": stopped}


def _rel(num: float, den: float) -> float:
    if not math.isfinite(num):
        return math.nan
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return math.sqrt(num / den)


def measure_mixer(name: str, *, length: int = 65536, piece: int = 4096, d_model: int = 32, n_heads: int = 2,
                  seed: int = 0, precisions: tuple[str, ...] = PRECISIONS, tail: int = 4096, impl: str = "fast",
                  max_seconds: float | None = None, options: dict[str, Any] | None = None,
                  device: str = "cpu", log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """Stream one random sequence through mixer ``name`` in each precision and compare with float64.

    Returns a record: options, redrawn weights, ``reference`` (float64 run: per-piece state norms) and
    ``runs[precision]`` with ``finite``, ``rel_err``, ``rel_err_first``, ``rel_err_last``, ``state_max``,
    ``state_finite``, ``seconds``, ``tokens`` and ``error`` (why a precision could not run)."""
    options = dict(options or {})
    dev = torch.device(device)
    m32, redrawn = build_random_mixer(name, d_model, n_heads, seed, impl=impl, **options)
    m32 = m32.to(dev)
    g = torch.Generator().manual_seed(seed + 1)
    x64 = torch.randn(1, length, d_model, generator=g, dtype=torch.float64).to(dev)
    rec: dict[str, Any] = {
        "mixer": name, "options": effective_options(name, d_model, {"n_heads": n_heads, "impl": impl, **options}),
        "redrawn": redrawn, "length": length, "piece": piece, "d_model": d_model, "seed": seed,
        "promise": promise(name)[0],
        "promise_why": promise(name)[1],
        "runs": {},
    }

    # float64 reference: outputs kept, state norms per piece
    y64 = torch.empty(1, length, d_model, dtype=torch.float64, device=dev)
    traj: list[dict[str, Any]] = []

    def ref_piece(s: int, y: torch.Tensor, st: dict) -> None:
        y64[:, s:s + y.shape[1]] = y.double()
        traj.append({"t": s + y.shape[1], "norms": state_norms(st)})

    m64 = copy.deepcopy(m32).double()
    log(f"{name}: float64")
    info = _stream(m64, x64, piece, length, contextlib.nullcontext, max_seconds, ref_piece)
    n_ref = info["tokens"]
    rec["reference"] = {"tokens": n_ref, "seconds": info["seconds"], "cpu_seconds": info["cpu_seconds"],
                        "stopped": info["stopped"], "state_trajectory": traj}
    ref_finite = bool(torch.isfinite(y64[:, :n_ref]).all())
    tail_n = min(tail, n_ref)
    yref = y64[:, :n_ref]
    den_all = float(yref.pow(2).sum()) if ref_finite else math.nan
    den_first = float(yref[:, :tail_n].pow(2).sum()) if ref_finite else math.nan
    den_last = float(yref[:, n_ref - tail_n:].pow(2).sum()) if ref_finite else math.nan

    def run_one(prec: str) -> dict[str, Any]:
        if prec == "float64":
            mixer, x, ctx = m64, x64, contextlib.nullcontext
        else:
            mixer, dt, ctx = _precision_setup(m32, prec, dev)
            x = x64.to(dt)
        acc = {"all": 0.0, "first": 0.0, "last": 0.0, "nonfinite": 0, "state_max": 0.0, "state_finite": True,
               "out_dtype": None}
        if prec == "float64":
            # the reference itself: no error by definition; report its finiteness and state norms
            norms = [_total(p["norms"]) for p in traj]
            return {"finite": ref_finite, "nonfinite": int((~torch.isfinite(yref)).sum()),
                    "rel_err": 0.0, "rel_err_first": 0.0, "rel_err_last": 0.0,
                    "state_max": max(norms) if norms else 0.0,
                    "state_finite": all(math.isfinite(v) for v in norms), "seconds": info["seconds"],
                    "cpu_seconds": info["cpu_seconds"],
                    "tokens": n_ref, "stopped": info["stopped"], "error": None, "out_dtype": "torch.float64"}

        def on_piece(s: int, y: torch.Tensor, st: dict) -> None:
            e = s + y.shape[1]
            acc["out_dtype"] = str(y.dtype)
            yd = y.double()
            acc["nonfinite"] += int((~torch.isfinite(yd)).sum())
            diff = (yd - y64[:, s:e]).pow(2)
            acc["all"] += float(diff.sum())
            lo = max(s, n_ref - tail_n)
            if lo < e:
                acc["last"] += float(diff[:, lo - s:].sum())
            if s < tail_n:
                acc["first"] += float(diff[:, :tail_n - s].sum())
            tot = _total(state_norms(st))
            if not math.isfinite(tot):
                acc["state_finite"] = False
            else:
                acc["state_max"] = max(acc["state_max"], tot)

        try:
            r = _stream(mixer, x, piece, n_ref, ctx, max_seconds, on_piece)
        except Exception as exc:  # an op without a kernel for this dtype on this device: report it
            kind = "unsupported on " + dev.type.upper() if prec in ("fp16", "bf16", "fp16_autocast") else "error"
            return {"finite": None, "error": f"{kind}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
        n = r["tokens"]
        out = {"finite": acc["nonfinite"] == 0, "nonfinite": acc["nonfinite"], "tokens": n,
               "seconds": r["seconds"], "cpu_seconds": r["cpu_seconds"], "stopped": r["stopped"], "error": None,
               "out_dtype": acc["out_dtype"],
               "state_max": acc["state_max"], "state_finite": acc["state_finite"]}
        if n == n_ref:
            out["rel_err"] = _rel(acc["all"], den_all)
            out["rel_err_first"] = _rel(acc["first"], den_first)
            out["rel_err_last"] = _rel(acc["last"], den_last)
        else:  # stopped early: errors over what ran
            out["rel_err"] = _rel(acc["all"], float(yref[:, :n].pow(2).sum()))
            out["rel_err_first"] = _rel(acc["first"], den_first) if n >= tail_n else math.nan
            out["rel_err_last"] = math.nan
        return out

    for prec in precisions:
        if prec != "float64":
            log(f"{name}: {prec}")
        rec["runs"][prec] = run_one(prec)
    rec["growth"] = state_growth(traj)
    return rec


def _precision_setup(m32: torch.nn.Module, prec: str, dev: torch.device) -> tuple[torch.nn.Module, torch.dtype,
                                                                                    Callable[[], Any]]:
    """``(mixer, input dtype, context)`` of ``prec`` for the float32 mixer ``m32`` (a copy where it is cast)."""
    if prec == "float64":
        return copy.deepcopy(m32).double(), torch.float64, contextlib.nullcontext
    if prec == "float32":
        return m32, torch.float32, contextlib.nullcontext
    if prec == "fp16":
        return copy.deepcopy(m32).half(), torch.float16, contextlib.nullcontext
    if prec in ("bf16", "fp16_autocast"):
        dt = torch.bfloat16 if prec == "bf16" else torch.float16
        return m32, torch.float32, lambda: torch.autocast(dev.type, dtype=dt)
    raise ValueError(f"unknown precision {prec!r}; choose from {list(PRECISIONS + EXTRA_PRECISIONS)}")


def backward_at_end(name: str, *, length: int = 65536, piece: int = 4096, d_model: int = 32, n_heads: int = 2,
                    seed: int = 0, precision: str = "fp16_autocast", impl: str = "fast", device: str = "cpu",
                    options: dict[str, Any] | None = None, compare: str | None = "float32") -> dict[str, Any]:
    """Gradients at the end of a long input: stream ``length - piece`` tokens without gradients in ``precision``,
    then run the last ``piece`` with gradients (the incoming state a leaf that requires them, as in truncated
    backpropagation through time) and call ``backward`` outside the autocast region (the standard mixed-precision
    pattern).  Same mixer and input as :func:`measure_mixer`.  The loss is ``⟨y, r⟩ / √numel`` with a fixed
    ``r ~ N(0, 1)``: upstream gradients of RMS ``1/√numel`` whatever the output's scale (a loss like ``mean(y²)``
    would scale them with ``y``, which is ~t for an undecayed read-out).

    Returns ``finite`` (every output; ``nonfinite_outputs`` counts NaN/Inf), ``grads_finite``, ``nonfinite``
    (the names of gradients with NaN/Inf: ``x``, ``state.<key>``, parameters), ``grad_max`` (the largest
    |gradient|), ``seconds`` and, with ``compare`` (a precision), ``grad_rel_err``: the largest
    ``‖g − g_ref‖ / ‖g_ref‖`` over the gradient tensors against the same run in ``compare``, and
    ``grad_rel_err_of`` (the tensor it is in)."""
    dev = torch.device(device)
    m32, _ = build_random_mixer(name, d_model, n_heads, seed, impl=impl, **dict(options or {}))
    m32 = m32.to(dev)
    g = torch.Generator().manual_seed(seed + 1)
    x64 = torch.randn(1, length, d_model, generator=g, dtype=torch.float64).to(dev)
    start = max(length - piece, 0)
    r = torch.randn(1, length - start, d_model, generator=g, dtype=torch.float64).float().to(dev)

    def grads(prec: str) -> tuple[dict[str, torch.Tensor], bool, float]:
        mixer, dt, ctx = _precision_setup(m32, prec, dev)
        mixer = copy.deepcopy(mixer)
        state, bad_out = None, 0
        t0 = time.perf_counter()
        with torch.no_grad():
            for s in range(0, start, piece):
                with ctx():
                    y, state = mixer(x64[:, s:min(s + piece, start)].to(dt), state)
                bad_out += int((~torch.isfinite(y)).sum())
        x = x64[:, start:].to(dt).requires_grad_()
        state = None if state is None else {
            k: (v.detach().requires_grad_() if v.is_floating_point() else v) for k, v in state.items()}
        with ctx():
            y, _ = mixer(x, state)
        (y.float() * r).sum().div(math.sqrt(r.numel())).backward()
        out = {"x": x.grad, **{f"state.{k}": v.grad for k, v in (state or {}).items() if v.is_floating_point()},
               **{n: p.grad for n, p in mixer.named_parameters()}}
        bad_out += int((~torch.isfinite(y)).sum())
        return {k: v for k, v in out.items() if v is not None}, bad_out, time.perf_counter() - t0

    got, bad_out, seconds = grads(precision)
    bad = [k for k, v in got.items() if not bool(torch.isfinite(v).all())]
    rec: dict[str, Any] = {
        "mixer": name, "precision": precision, "length": length, "piece": piece, "finite": bad_out == 0,
        "nonfinite_outputs": bad_out,
        "grads_finite": not bad, "nonfinite": bad, "seconds": seconds,
        "grad_max": max((float(v.detach().abs().max()) for v in got.values() if v.numel()), default=0.0),
    }
    if compare is not None:
        ref, _, _ = grads(compare)
        errs = {k: float((got[k].double() - r.double()).norm() / r.double().norm())
                for k, r in ref.items() if k in got and float(r.double().norm()) > 0}
        worst = max(errs, key=lambda k: errs[k] if math.isfinite(errs[k]) else math.inf, default=None)
        rec["grad_rel_err"] = errs[worst] if worst is not None else 0.0
        rec["grad_rel_err_of"] = worst
        rec["compare"] = compare
    return rec


def state_growth(traj: list[dict[str, Any]], start_fraction: float = 1 / 4) -> dict[str, Any]:
    """Per state tensor: final and max norm, ``ratio`` = ‖s_T‖ / ‖s_{T/2}‖, and ``exponent`` p of a least-squares
    fit ‖s_t‖ ∝ t^p over the pieces with t ≥ ``start_fraction``·T (0: bounded, 0.5: ~√t, 1: ~t).

    The exponent uses every piece, so the random wobble of small buffers (a short-convolution cache of the last
    three inputs) does not read as growth the way a two-point ratio can."""
    if not traj:
        return {}
    last = traj[-1]
    mid = min(traj, key=lambda p: abs(p["t"] - last["t"] / 2))
    pts = [p for p in traj if p["t"] >= start_fraction * last["t"]]
    out: dict[str, Any] = {}
    for k, v in last["norms"].items():
        m = mid["norms"].get(k, math.nan)
        xs, ys = [], []
        for p in pts:
            n = p["norms"].get(k)
            if n is not None and n > 0 and math.isfinite(n):
                xs.append(math.log(p["t"]))
                ys.append(math.log(n))
        if len(xs) >= 3 and len(xs) == len(pts) and max(xs) > min(xs):
            mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
            expo = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        else:
            expo = math.nan
        out[k] = {"final": v, "max": max(p["norms"].get(k, 0.0) for p in traj),
                  "ratio": (v / m) if (m and math.isfinite(m) and math.isfinite(v)) else math.nan,
                  "exponent": expo}
    return out


def growth_summary(growth: dict[str, Any], threshold: float = 0.1) -> str:
    """``"flat"`` or the growing keys with their fitted exponent and T/2 → T ratio, e.g. ``"z t^1.00 (×2.00)"``."""
    if not growth:
        return "no state"
    bad = [k for k, g in growth.items() if not math.isfinite(g["final"])]
    grow = sorted(((g["exponent"], k, g["ratio"]) for k, g in growth.items()
                   if math.isfinite(g.get("exponent", math.nan)) and g["exponent"] > threshold), reverse=True)
    parts = [f"{k} non-finite" for k in bad] + [f"{k} t^{p:.2f} (×{r:.2f})" for p, k, r in grow]
    return ", ".join(parts) if parts else "flat"


# ------------------------------------------------------------------------------------------------------- reporting
def _e(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf"
        return "0" if v == 0 else f"{v:.1e}"
    return str(v)


def tables(records: list[dict[str, Any]]) -> str:
    """Markdown: per mixer × precision errors, then per mixer state growth against the promise."""
    lines = ["### Relative error against float64, NaN/Inf, max state norm, time\n",
             "rel_err: ‖y − y64‖/‖y64‖ over all tokens; first/last: over the first/last tail tokens. "
             "finite: no NaN/Inf in the output.\n",
             "| mixer | precision | finite | rel_err | first | last | max state norm | seconds (CPU) | note |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        for prec, run in r["runs"].items():
            if run.get("error"):
                lines.append(f"| {r['mixer']} | {prec} | — | — | — | — | — | — | {run['error']} |")
                continue
            note = run.get("stopped") or ""
            if run.get("nonfinite"):
                note = (note + "; " if note else "") + f"{run['nonfinite']:,} non-finite outputs"
            if not run.get("state_finite", True):
                note = (note + "; " if note else "") + "non-finite state"
            lines.append(
                f"| {r['mixer']} | {prec} | {'yes' if run['finite'] else 'NO'} | {_e(run['rel_err'])} | "
                f"{_e(run['rel_err_first'])} | {_e(run['rel_err_last'])} | {_e(run['state_max'])} | "
                f"{run['seconds']:.1f} ({run.get('cpu_seconds', math.nan):.1f}) | {note} |")
    lines += ["", "### Long-horizon state norms (float64 run)\n",
              "growth: state tensors whose norm grows like t^p with p > 0.1 (least-squares fit of log ‖s_t‖ "
              "against log t over the pieces from T/4 to T; 0.5: ~√t, 1: ~t), with ‖s_T‖/‖s_{T/2}‖ in "
              "brackets; promise: what the mechanism guarantees.\n",
              "| mixer | promise | why | growth T/2 → T | largest tensor (final norm) | verdict |",
              "|---|---|---|---|---|---|"]
    for r in records:
        r["growth"] = state_growth(r["reference"]["state_trajectory"])
        gsum = growth_summary(r["growth"])
        big = max(r["growth"].items(), key=lambda kv: kv[1]["final"] if math.isfinite(kv[1]["final"]) else math.inf,
                  default=None)
        bigs = f"{big[0]} ({_e(big[1]['final'])})" if big else "—"
        if r["promise"] == "bounded":
            verdict = "bounded, as promised" if gsum in ("flat", "no state") else "GROWS although promised bounded"
        else:
            verdict = "grows, as documented" if gsum not in ("flat", "no state") else "flat at this length"
        lines.append(f"| {r['mixer']} | {r['promise']} | {r['promise_why']} | {gsum} | {bigs} | {verdict} |")
    back = [(r["mixer"], b) for r in records for b in r.get("backward", {}).values()]
    if back:
        lines += ["", "### Gradients at the end of the input (--backward)\n",
                  "The first T − piece tokens streamed without gradients, the last piece with them (its incoming "
                  "state a leaf that requires gradients), backward outside autocast of ⟨y, r⟩/√numel (r ~ N(0, 1) "
                  "fixed). grad rel_err: the largest ‖g − g_ref‖/‖g_ref‖ over the gradient tensors (input, "
                  "incoming state, parameters) against the same run in the reference precision.\n",
                  "| mixer | precision | output finite | gradients finite | largest abs gradient | grad rel_err "
                  "(tensor) | reference | seconds |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, b in back:
            if b.get("error"):
                lines.append(f"| {name} | {b['precision']} | — | — | — | — | — | {b['error']} |")
                continue
            fin = "yes" if b["grads_finite"] else "NO: " + ", ".join(b["nonfinite"])
            err = f"{_e(b['grad_rel_err'])} ({b['grad_rel_err_of']})" if "grad_rel_err" in b else "—"
            lines.append(f"| {name} | {b['precision']} | {'yes' if b['finite'] else 'NO'} | {fin} | "
                         f"{_e(b['grad_max'])} | {err} | {b.get('compare', '—')} | {b['seconds']:.1f} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------------------- CLI
from seqmem.bench.common import add_model_options, add_output_options, command_line  # noqa: E402
from seqmem.cliargs import comma_list  # noqa: E402
from seqmem.cliargs import positive_float as _pos_float  # noqa: E402
from seqmem.cliargs import positive_int as _pos_int  # noqa: E402


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of ``seqmem bench numerics``."""
    add_model_options(p, d_model=32, heads=2)
    p.add_argument("--length", type=_pos_int, default=65536, help="tokens of the random input (batch 1)")
    p.add_argument("--piece", type=_pos_int, default=4096, help="tokens per streamed piece")
    p.add_argument("--tail", type=_pos_int, default=4096, help="tokens of the first/last error windows")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and inputs")
    p.add_argument("--precisions", default=",".join(PRECISIONS),
                   help=f"comma-separated subset of {','.join(PRECISIONS)}, plus {','.join(EXTRA_PRECISIONS)} on "
                        "request (float64 always runs: it is the reference)")
    p.add_argument("--impl", default="fast", choices=["fast", "reference"],
                   help="the training form or the recurrent reference")
    p.add_argument("--device", default="cpu", help="torch device")
    p.add_argument("--max-seconds", type=_pos_float, default=300.0,
                   help="per mixer and precision: stop (and say so) when the projected time exceeds this")
    p.add_argument("--threads", type=_pos_int, default=None,
                   help="torch threads (default: OMP_NUM_THREADS if set, else 1)")
    p.add_argument("--backward", action="store_true",
                   help="also check the gradients at the end of the input in each precision (backward_at_end: the "
                        "last piece with gradients, against float32)")
    add_output_options(p, "the tables")
    p.add_argument("--render", type=Path, default=None,
                   help="only re-render the Markdown of a saved --json file (no measurement)")


def _command(args: argparse.Namespace) -> str:
    return command_line("python -m seqmem.bench.numerics", args)


def report(payload: dict[str, Any]) -> str:
    """The Markdown report of a run's JSON payload (what ``--json`` writes)."""
    from seqmem.bench.common import provenance_text

    st, m = payload["settings"], payload["machine"]
    if "date" in m:  # recorded by run_machine: commit, dates and load
        run = f"Run: {provenance_text(m, payload.get('end'))}.\n\n"
    else:  # a payload from before those were recorded: its date only
        run = f"Run: {payload['when']}; commit and load not recorded.\n\n"
    return (f"## seqmem bench numerics\n\nCommand: `{payload['command']}`\n\nMachine: {m['cpu']}, "
            f"{m['cores']} cores, torch {m['torch']}, {m['threads']} thread(s).\n\n{run}Settings: "
            f"T={st['length']} streamed in pieces of {st['piece']}, d_model={st['d_model']}, heads={st['heads']}, "
            f"batch 1, impl={st['impl']}, seed {st['seed']}, registered default options (listed per mixer in the "
            f"JSON). Total time {payload['seconds']:.0f} s wall, {payload['cpu_seconds']:.0f} s CPU.\n\n"
            ) + tables(payload["records"])


def run(args: argparse.Namespace) -> int:
    """Run the numerics benchmark described by ``args`` (see :func:`add_arguments`); print and write tables.

    With ``--render FILE`` only re-render the Markdown of a saved ``--json`` payload."""
    import json

    from seqmem.bench.common import (
        check_writable_file,
        resolve_device,
        resolve_mixers,
        run_end,
        run_machine,
        write_json,
    )
    from seqmem.repro.common import atomic_write_text

    if getattr(args, "render", None) is not None:
        try:
            payload = json.loads(Path(args.render).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"--render: cannot read {args.render}: {e}") from None
        text = report(payload)
        print(text)
        if args.markdown is not None:
            atomic_write_text(args.markdown, text)
        return 0
    mixers = resolve_mixers(args.mixers)
    dev = resolve_device(args.device)
    precs = comma_list(args.precisions)
    bad = [s for s in precs if s not in PRECISIONS + EXTRA_PRECISIONS]
    if bad or not precs:
        raise ValueError(f"--precisions: unknown {bad or 'empty list'}; choose from {','.join(PRECISIONS)}")
    precs = ["float64"] + [s for s in dict.fromkeys(precs) if s != "float64"]
    if args.tail > args.length:
        raise ValueError(f"--tail ({args.tail}) must not exceed --length ({args.length})")
    for f, flag in ((args.json, "--json"), (args.markdown, "--markdown")):
        if f is not None:
            check_writable_file(f, flag)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    from seqmem.cliargs import threads_note

    print(f"seqmem bench numerics: {len(mixers)} mixer(s), T={args.length}, {threads_note()}", file=sys.stderr,
          flush=True)
    machine = run_machine(dev)
    t0, c0 = time.time(), time.process_time()
    records = []
    for name in mixers:
        rec = measure_mixer(name, length=args.length, piece=args.piece, d_model=args.d_model, n_heads=args.heads,
                            seed=args.seed, precisions=tuple(precs), tail=args.tail, impl=args.impl,
                            max_seconds=args.max_seconds, device=str(dev),
                            log=lambda s: print(s, file=sys.stderr, flush=True))
        if args.backward:
            rec["backward"] = {}
            for prec in precs[1:]:
                try:
                    rec["backward"][prec] = backward_at_end(
                        name, length=args.length, piece=args.piece, d_model=args.d_model, n_heads=args.heads,
                        seed=args.seed, precision=prec, impl=args.impl, device=str(dev),
                        compare=None if prec == "float32" else "float32")
                except Exception as exc:  # an op without a kernel for this dtype on this device: report it
                    rec["backward"][prec] = {"precision": prec,
                                             "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
        records.append(rec)
        print(f"{name}: " + ", ".join(
            f"{p} {'ERR' if r.get('error') else _e(r['rel_err'])}" for p, r in rec["runs"].items()),
            file=sys.stderr, flush=True)
    payload = {"bench": "numerics", "command": _command(args), "machine": machine, "end": run_end(),
               "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seconds": time.time() - t0,
               "cpu_seconds": time.process_time() - c0,
               "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"},
               "records": records}
    text = report(payload)
    print(text)
    if args.markdown is not None:
        atomic_write_text(args.markdown, text)
    if args.json is not None:
        write_json(args.json, payload)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m seqmem.bench.numerics", description=__doc__.split("\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        from seqmem.cliargs import apply_threads

        apply_threads(args)
        return run(args)
    except ValueError as e:
        print(f"seqmem bench numerics: error: {e}".splitlines()[0], file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
