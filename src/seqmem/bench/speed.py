"""``seqmem bench speed``: forward+backward time of one mixer layer per sequence length (issue #8 §1).

For every selected mixer, ``impl`` and length: warm-up calls, then timed repeats of ``y, _ = mixer(x);
y.backward(g)`` (parameter and input gradients; on CUDA timed with CUDA events, after a warm-up of the device
itself), median and spread, tokens/s, and the form the layer's ops ran (``form``: ``pytorch``, or the GPU kernel
backend or Lattice kernel that took a call; ``--backend pytorch|fla|both`` chooses or puts both side by side).
Derived: the speed-up of ``impl="fast"`` over ``impl="reference"`` (only where the reference was measured), the
ratio to ``attention`` (SDPA) at the same length with the crossover length, and the achieved GFLOP/s
(:mod:`seqmem.bench.flops`) as a fraction of the GEMM peak measured in the same run.  Lengths are measured in
increasing order; once a length exceeds the time cap (or warm-up + one repeat would exceed it, judging from the
shorter length's call time after its warm-up and an at least linear cost), that length and the longer ones are
reported "not run" — never extrapolated.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from seqmem.bench.common import (
    base_record,
    build_failed_records,
    fmt_len,
    measure,
    summarize_times,
    synchronize,
    warm_up_device,
)
from seqmem.bench.flops import count_flops, gemm_peak
from seqmem.registry import build_mixer

DEFAULT_LENGTHS_CPU = [1024, 2048, 4096, 8192, 16384]
DEFAULT_LENGTHS_CUDA = DEFAULT_LENGTHS_CPU + [32768, 65536]


def impls_of(choice: str) -> list[str]:
    return ["fast", "reference"] if choice == "both" else [choice]


def build(name: str, args: Any, impl: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(args.seed)
    options = getattr(args, "mixer_option_parsed", None) or {}  # --mixer-option, checked by the CLI
    return build_mixer(name, args.d_model, n_heads=args.heads, impl=impl, **options).to(device=device, dtype=dtype)


def _step_fn(m: torch.nn.Module, x: torch.Tensor, g: torch.Tensor) -> Callable[[], None]:
    params = [p for p in m.parameters() if p.requires_grad]

    def step() -> None:
        for p in params:
            p.grad = None
        x.grad = None
        y, _ = m(x)
        y.backward(g)

    return step


def training_step(args: Any, device: torch.device, dtype: torch.dtype, name: str, seq_len: int,
                  impl: str = "fast") -> Callable[[], None]:
    """Mixer ``name`` built (:func:`build`) and one forward+backward of it on random ``(args.batch, seq_len)``
    inputs and output gradients (seeded by ``args.seed``), as a function of no arguments."""
    m = build(name, args, impl, device, dtype)
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    x = torch.randn(args.batch, seq_len, args.d_model, generator=gen).to(device=device, dtype=dtype)
    x.requires_grad_(True)
    g = torch.randn(args.batch, seq_len, args.d_model, generator=gen).to(device=device, dtype=dtype)
    return _step_fn(m, x, g)


def _linears_fn(m: torch.nn.Module, batch: int, n: int, device: torch.device, dtype: torch.dtype,
                gen: torch.Generator) -> Callable[[], None] | None:
    """Forward+backward of the layer's ``nn.Linear`` projections alone, on inputs of the layer's length.

    The projections are work every form of the layer must do, so ``attention / this`` bounds how much faster than
    attention the layer can be (the "projection floor"); None if the layer has no ``nn.Linear``.
    """
    lins = [mod for mod in m.modules() if isinstance(mod, torch.nn.Linear)]
    if not lins:
        return None
    xs = [torch.randn(batch, n, lin.in_features, generator=gen).to(device=device, dtype=dtype).requires_grad_(True)
          for lin in lins]
    gs = [torch.randn(batch, n, lin.out_features, generator=gen).to(device=device, dtype=dtype) for lin in lins]

    def step() -> None:
        for lin, xi, gi in zip(lins, xs, gs):
            for p in lin.parameters():
                p.grad = None
            xi.grad = None
            lin(xi).backward(gi)

    return step


BACKEND_CHOICES = ("default", "pytorch", "fla", "both")


def backend_variants(choice: str) -> list[tuple[str, str | None]]:
    """``--backend`` → ``[(label suffix, backends to enable or None for the default)]``: ``pytorch`` = seqmem's
    PyTorch forms, ``fla`` = the GPU kernel backends (fla, and mamba_ssm for ``mamba2``) where they apply,
    ``both`` = the two side by side (the kernels' rows labelled ``mixer[fla]``), ``default`` = whatever
    ``SEQMEM_BACKENDS`` / the default selects."""
    from seqmem.backends import DEFAULT

    if choice not in BACKEND_CHOICES:
        raise ValueError(f"--backend must be one of {list(BACKEND_CHOICES)}, got {choice!r}")
    kernels = ",".join(DEFAULT)
    return {"default": [("", None)], "pytorch": [("", "pytorch")], "fla": [("", kernels)],
            "both": [("", "pytorch"), ("[fla]", kernels)]}[choice]


def run_speed(args: Any, device: torch.device, dtype: torch.dtype, mixers: list[str], lengths: list[int],
              ref_lengths: list[int], machine: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
    """Measure every (mixer, backend, impl, length); return ``{"peak": ..., "records": [...], "warmup_s": ...}``.

    The device is warmed up first (:func:`seqmem.bench.common.warm_up_device`), so no call time that a cap or
    a longer length's estimate is judged from includes its start-up."""
    from seqmem.backends import use_backends

    warm = warm_up_device(device, dtype)
    if warm:
        log(f"device warm-up: {warm:.2f} s")
    prev = use_backends(None)  # the caller's setting: the "default" variant, and restored at the end
    variants = [(suffix, prev if chosen is None else chosen)
                for suffix, chosen in backend_variants(getattr(args, "backend", None) or "default")]
    try:
        out = _run_speed(args, device, dtype, mixers, lengths, ref_lengths, machine, log, variants)
    finally:
        use_backends(prev)
    out["warmup_s"] = warm
    return out


def _run_speed(args: Any, device: torch.device, dtype: torch.dtype, mixers: list[str], lengths: list[int],
               ref_lengths: list[int], machine: dict[str, Any], log: Callable[[str], None],
               variants: list[tuple[str, Any]]) -> dict[str, Any]:
    from seqmem.backends import forms_text, record_forms, use_backends

    peak0 = gemm_peak(device, dtype, args.gemm_sizes_parsed)
    log(f"GEMM peak ({peak0['n']}³ {peak0['dtype']}): {peak0['gflops']:.1f} GFLOP/s")
    records: list[dict[str, Any]] = []
    cap = args.max_seconds
    for base_name, (suffix, chosen) in ((n, v) for n in mixers for v in variants):
        use_backends(chosen)
        name = base_name + suffix
        for impl in impls_of(args.impl):
            lens = lengths if impl == "fast" else ref_lengths
            repeats = args.repeats if impl == "fast" or args.ref_repeats is None else args.ref_repeats
            warmup = args.warmup if impl == "fast" or args.ref_warmup is None else args.ref_warmup
            try:
                m = build(base_name, args, impl, device, dtype)
            except Exception as e:  # a mixer that cannot be built at this width is reported, not fatal
                records += build_failed_records("speed", name, [impl], lens, e, args, device, dtype, machine)
                log(f"speed {name} {impl}: build failed: {e}")
                continue
            blocked: str | None = None
            last: tuple[int, float] | None = None
            for n in lens:
                rec = base_record("speed", name, impl, n, args, device, dtype, machine)
                rec.update(repeats=repeats, warmup=warmup,
                           backend="default" if chosen is None else ",".join(chosen) if not isinstance(chosen, str)
                           else chosen)
                records.append(rec)
                if blocked is None and last is not None and cap is not None:
                    pred = last[1] * n / last[0] * (warmup + 1)
                    if pred > cap:
                        blocked = (f"at T={fmt_len(last[0])} one call took {last[1]:.2f} s, so warm-up + one repeat "
                                   f"at T={fmt_len(n)} would take >= {pred:.1f} s (> --max-seconds {cap:g})")
                if blocked is not None:
                    rec.update(status="not run", note=blocked, median_ms=None)
                    log(f"speed {name:<20} {impl:<9} T={fmt_len(n):>5}: not run ({blocked})")
                    continue
                gen = torch.Generator(device="cpu").manual_seed(args.seed + n)
                x = torch.randn(args.batch, n, args.d_model, generator=gen).to(device=device, dtype=dtype)
                x.requires_grad_(True)
                g = torch.randn(args.batch, n, args.d_model, generator=gen).to(device=device, dtype=dtype)
                step = _step_fn(m, x, g)
                t0 = time.perf_counter()
                try:
                    with record_forms() as forms:
                        res = measure(step, warmup=warmup, repeats=repeats, max_seconds=cap, device=device)
                    rec["form"] = forms_text(forms)
                except Exception as e:  # e.g. out of memory: report and stop this mixer's longer lengths
                    res = {"status": "error", "note": f"{type(e).__name__}: {e}"[:300]}
                if res["status"] != "ok":
                    rec.update(status=res["status"], note=res["note"], median_ms=None)
                    blocked = f"T={fmt_len(n)} was not run ({res['note']})"
                    log(f"speed {name:<20} {impl:<9} T={fmt_len(n):>5}: {res['status']} ({res['note']})")
                else:
                    st = summarize_times(res["times_ms"])
                    rec.update(status="ok", note=None, **st, repeats_done=len(res["times_ms"]),
                               tokens_per_s=args.batch * n / (st["median_ms"] / 1e3))
                    last = (n, max(res["call_s"], st["median_ms"] / 1e3))
                    if impl == "fast" and not args.no_flops and (cap is None or 2 * last[1] < cap):
                        try:
                            by_op: dict[str, int] = {}
                            fl = count_flops(step, by_op)
                            synchronize(device)
                            rec.update(flops=fl, flops_by_op=by_op, gflops_per_s=fl / (st["median_ms"] / 1e3) / 1e9)
                        except Exception as e:  # a counting failure must not lose the timing
                            rec.update(flops=None, note=f"FLOP count failed: {type(e).__name__}: {e}"[:300])
                    lin = (_linears_fn(m, args.batch, n, device, dtype, gen)
                           if impl == "fast" and not args.no_floor else None)  # no projection inputs if unused
                    if lin is not None:
                        try:
                            lr = measure(lin, warmup=warmup, repeats=repeats, max_seconds=cap, device=device)
                        except Exception as e:  # the floor is a side measurement: never lose the timing
                            lr = {"status": "error", "note": f"{type(e).__name__}: {e}"[:300]}
                        if lr["status"] == "ok":
                            rec["linear_ms"] = summarize_times(lr["times_ms"])["median_ms"]
                    del lin
                    log(f"speed {name:<20} {impl:<9} T={fmt_len(n):>5}: {st['median_ms']:10.2f} ms "
                        f"(spread {100 * st['spread']:.0f}%, {rec['tokens_per_s']:,.0f} tok/s, "
                        f"{time.perf_counter() - t0:.1f} s; {rec['form']})")
                del x, g, step
            del m
    peak1 = gemm_peak(device, dtype, args.gemm_sizes_parsed)
    peak = peak0 if peak0["gflops"] >= peak1["gflops"] else peak1
    peak["measured"] = [peak0["gflops"], peak1["gflops"]]
    log(f"GEMM peak at the end: {peak1['gflops']:.1f} GFLOP/s; using the best, {peak['gflops']:.1f}")
    for r in records:
        if r.get("gflops_per_s") is not None:
            r["peak_gflops"] = peak["gflops"]
            r["frac_of_peak"] = r["gflops_per_s"] / peak["gflops"]
    return {"peak": peak, "records": records}


# ------------------------------------------------------------------------------------------------ analysis
def _ok(records: list[dict[str, Any]], mixer: str, impl: str) -> dict[int, dict[str, Any]]:
    return {r["seq_len"]: r for r in records
            if r["mixer"] == mixer and r["impl"] == impl and r.get("status") == "ok"}


def crossover(mixer_ms: dict[int, float], attn_ms: dict[int, float]) -> dict[str, Any]:
    """Length from which ``mixer`` is faster than attention at every longer measured length.

    Returns ``{"text": ..., "estimate": ...}``: ``"<= L"`` when faster everywhere, ``"> L"`` when attention is
    faster at every measured length, else the bracket ``"La–Lb"`` with a log–log interpolated estimate inside it.
    """
    common = sorted(set(mixer_ms) & set(attn_ms))
    if not common:
        return {"text": "not measured", "estimate": None}
    faster = [mixer_ms[n] < attn_ms[n] for n in common]
    if all(faster):
        return {"text": f"<= {fmt_len(common[0])}", "estimate": None}
    if not faster[-1]:
        return {"text": f"> {fmt_len(common[-1])}", "estimate": None}
    k = max(i for i, f in enumerate(faster) if not f)  # last length where attention is faster
    la, lb = common[k], common[k + 1]
    ra, rb = math.log(attn_ms[la] / mixer_ms[la]), math.log(attn_ms[lb] / mixer_ms[lb])
    est = math.exp(math.log(la) + (0 - ra) * (math.log(lb) - math.log(la)) / (rb - ra)) if rb != ra else None
    return {"text": f"{fmt_len(la)}–{fmt_len(lb)}", "estimate": est}


def summarize_speed(records: list[dict[str, Any]], target_lengths: tuple[int, int, int] = (4096, 2048, 16384)
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per (mixer, length) rows and per-mixer target rows ((a), (b), (d): see ``speed_targets_text``)."""
    mixers = list(dict.fromkeys(r["mixer"] for r in records))
    lengths = sorted({r["seq_len"] for r in records})
    attn = {n: r["median_ms"] for n, r in _ok(records, "attention", "fast").items()}
    rows, targets = [], []
    t_a, t_b, t_long = target_lengths
    for name in mixers:
        fast, ref = _ok(records, name, "fast"), _ok(records, name, "reference")
        all_recs = {(r["impl"], r["seq_len"]): r for r in records if r["mixer"] == name}
        for n in lengths:
            if ("fast", n) not in all_recs and ("reference", n) not in all_recs:
                continue
            f, rf = fast.get(n), ref.get(n)
            row: dict[str, Any] = {"mixer": name, "T": fmt_len(n),
                                   "fast_ms": f["median_ms"] if f else None,
                                   "spread_%": 100 * f["spread"] if f else None,
                                   "ref_ms": rf["median_ms"] if rf else None}
            for impl, key, got in (("fast", "fast_ms", f), ("reference", "ref_ms", rf)):
                if got is None and (impl, n) in all_recs:  # "not run (why)", never a bare status
                    rec = all_recs[(impl, n)]
                    row[key] = f"{rec['status']} ({rec['note']})" if rec.get("note") else rec["status"]
            row["form"] = f.get("form") if f else None
            row["speed-up (ref/fast)"] = rf["median_ms"] / f["median_ms"] if f and rf else None
            row["attn/mixer"] = attn[n] / f["median_ms"] if f and n in attn else None
            # the projection floor: attention's time over the time of this layer's nn.Linear projections alone
            row["floor"] = attn[n] / f["linear_ms"] if f and n in attn and f.get("linear_ms") else None
            row["ktok/s"] = f["tokens_per_s"] / 1e3 if f else None
            row["GFLOP/s"] = f.get("gflops_per_s") if f else None
            row["%peak"] = 100 * f["frac_of_peak"] if f and f.get("frac_of_peak") is not None else None
            rows.append(row)
        fast_ms = {n: r["median_ms"] for n, r in fast.items()}
        cx = crossover(fast_ms, attn) if name != "attention" else {"text": "—", "estimate": None}
        sp = ref[t_a]["median_ms"] / fast[t_a]["median_ms"] if t_a in ref and t_a in fast else None
        r2 = attn[t_b] / fast[t_b]["median_ms"] if t_b in attn and t_b in fast else None
        r16 = attn[t_long] / fast[t_long]["median_ms"] if t_long in attn and t_long in fast else None
        pk = fast[t_long].get("frac_of_peak") if t_long in fast else None
        fl16 = (attn[t_long] / fast[t_long]["linear_ms"]
                if t_long in attn and t_long in fast and fast[t_long].get("linear_ms") else None)

        def verdict(v: float | None, thr: float) -> str:
            return "not measured" if v is None else ("met" if v >= thr else "missed")

        targets.append({
            "mixer": name,
            f"speed-up (ref/fast)@{fmt_len(t_a)}": sp, "(a)": verdict(sp, 10.0),
            f"attn/mixer@{fmt_len(t_b)}": r2, f"attn/mixer@{fmt_len(t_long)}": r16,
            f"floor@{fmt_len(t_long)}": None if name == "attention" else fl16,
            "(b)": "—" if name == "attention" else (
                "not measured" if r2 is None or r16 is None else ("met" if r2 > 1 and r16 >= 10 else "missed")),
            "crossover": cx["text"] + (f" (≈{cx['estimate']:.0f})" if cx["estimate"] else ""),
            f"%peak@{fmt_len(t_long)}": 100 * pk if pk is not None else None, "(d)": verdict(pk, 0.25),
        })
    return rows, targets


def print_log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
