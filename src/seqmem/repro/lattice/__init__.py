"""Lattice (Lattice: Learning to Efficiently Compress the Memory): scan speed, LM table (Table 2 in
miniature), ablation ladder (Table 4).

``seqmem repro lattice --scale smoke|small|paper --out DIR [--experiments speed,lm,ablation]``

* ``speed``: training throughput (forward + backward) of the exact recurrence: the plain per-token loop under
  autograd (``mode="recurrent"``) vs the fast exact scan (fused C++ kernel; PyTorch hand-VJP scan), for the op
  and for a full Lattice block; and the activation memory kept for the backward at T = 8k.  Not in the paper
  (it reports no timings).
* ``lm``: byte-level LM on the offline ``code`` corpus (seqmem.tasks.lm.LMTask) for Transformer++
  (``attention``), Linear Attention, Mamba2, DeltaNet, Gated DeltaNet, TTT (eq. 19 in the Lattice block) and
  Lattice-DEC/ENC/SIM — the paper's Table 2 models.  The paper trains 110M models on 2.4B tokens of the Pile
  and Books3 (perplexity, 32k-token vocabulary); we train ~0.1M-parameter models on ~10^5 bytes, so only the
  ORDERING can be compared, and at this scale it is mostly noise — see docs/results/lattice/README.md.
* ``ablation``: Table 4's ladder in the Lattice block: DeltaNet update (eq. 20) → + orthogonal recurrence
  (eq. 7) → + normalized projection (eq. 14) → + forget gate (eq. 16).
* ``context`` (not run by default): Table 2's context-length sweep (Books 512 → 16k, Pile 2k/8k) in miniature —
  every Table 2 row trained from scratch at each context length T (small: 128, 256, 512, 1024 bytes) with the
  SAME number of training bytes per T (batch = tokens_per_step / T sequences, as the paper fixes 0.5M tokens per
  batch), several seeds, on the offline ``docs`` corpus; val bpb overall and in the last position bucket,
  mean ± std over seeds.  Lattice-ENC runs with ``v_norm=True`` here (without it ENC does not learn at this
  scale, see ``vnorm``) and Mamba2 with ``expand=1, d_state=32`` so every row has ~119k parameters.

Every table shows the paper's number beside ours and our scale; bpb = bits per byte (ours), ppl = perplexity
per token (paper) are different units.

Layout: the scales and model specs (:mod:`.configs`) and the paper's numbers (:mod:`.paper`) are data beside
this code.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from seqmem.cliargs import comma_list
from seqmem.repro.common import fit_lm, mean_std, write_results
from seqmem.repro.lattice.configs import CONFIGS, CONTEXT_MODELS, LADDER, MODELS, VNORM
from seqmem.repro.lattice.configs import SCALES as SCALES  # the CLI reads seqmem.repro.lattice.SCALES
from seqmem.repro.lattice.configs import TTT as TTT
from seqmem.repro.lattice.paper import PAPER_BOOKS, PAPER_PILE, PAPER_T2
from seqmem.repro.lattice.paper import PAPER_BOOKS_T as PAPER_BOOKS_T

EXPERIMENTS = ["speed", "lm", "ablation", "vnorm", "context"]
DEFAULT_EXPERIMENTS = ["speed", "lm", "ablation"]


def add_arguments(parser) -> None:
    parser.add_argument("--experiments", default=",".join(DEFAULT_EXPERIMENTS),
                        help="comma-separated: speed,lm,ablation (default), vnorm (not in the paper) and context "
                             "(the context-length sweep with several seeds)")
    parser.add_argument("--steps", type=int, default=None,
                        help="override the training steps of every LM experiment (default: the scale's)")
    parser.add_argument("--corpus", default=None,
                        help="LM corpus: code, docs or a path (default: code for lm/ablation/vnorm, docs for context)")
    parser.add_argument("--contexts", default=None,
                        help="context: comma-separated context lengths (default per scale, small: 128,256,512,1024)")
    parser.add_argument("--models", default=None,
                        help="context: comma-separated subset of the rows (default all: "
                             + ", ".join(CONTEXT_MODELS) + ")")
    parser.add_argument("--seeds", type=int, default=None,
                        help="context: number of seeds (seed, seed+1, ...; default per scale, small: 3)")


# ------------------------------------------------------------------------------------------------------------
# speed
# ------------------------------------------------------------------------------------------------------------
def _time(fn, reps: int) -> float:
    fn()  # warm-up (builds the kernel on first use)
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def bench_scan(T: int, B: int, H: int, d: int, reps: int = 2, seed: int = 0) -> list[dict[str, Any]]:
    """Training throughput (fwd + bwd, tokens/s) of ``lattice_scan`` DEC per mode/backend, float32, 1 thread."""
    from seqmem.ops.lattice import _cpp as _lattice_cpp
    from seqmem.ops.lattice import lattice_scan

    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, d, generator=g).requires_grad_()
    k = torch.nn.functional.normalize(torch.randn(B, T, H, d, generator=g), dim=-1).requires_grad_()
    v = torch.randn(B, T, H, d, generator=g).requires_grad_()
    gam = torch.rand(B, T, H, generator=g).requires_grad_()
    variants = [("recurrent", "auto"), ("scan", "torch")]
    if _lattice_cpp.available():
        variants.append(("scan", "cpp"))
    rows, base = [], None
    for mode, backend in variants:

        def step(mode=mode, backend=backend):
            y, _ = lattice_scan(q, k, v, gam, mode=mode, backend=backend, chunk_size=64)
            y.sum().backward()

        dt = _time(step, reps)
        tps = B * T / dt
        base = base or tps
        label = "plain loop (autograd)" if mode == "recurrent" else f"exact scan ({backend})"
        rows.append({"level": "op", "impl": label, "shape": f"B={B} T={T} H={H} d=m={d}",
                     "ms_per_step": 1e3 * dt, "tokens_per_s": tps, "speedup": tps / base})  # fmt: skip
    return rows


def bench_block(T: int, B: int, d_model: int, H: int, reps: int = 2) -> list[dict[str, Any]]:
    """Training throughput of one Lattice block (projections, convs, scan, gate) per impl."""
    import os

    from seqmem import build_mixer

    rows, base = [], None
    x = torch.randn(B, T, d_model, generator=torch.Generator().manual_seed(1)).requires_grad_()
    for label, impl, env in (("reference (plain loop)", "reference", None), ("fast (torch scan)", "fast", "torch"),
                             ("fast (C++ scan)", "fast", None)):  # fmt: skip
        old = os.environ.get("SEQMEM_LATTICE_BACKEND")
        if env:
            os.environ["SEQMEM_LATTICE_BACKEND"] = env
        try:
            m = build_mixer("lattice", d_model, n_heads=H, impl=impl)

            def step(m=m):
                y, _ = m(x)
                y.pow(2).mean().backward()

            dt = _time(step, reps)
        finally:
            if env:
                if old is None:
                    os.environ.pop("SEQMEM_LATTICE_BACKEND", None)
                else:
                    os.environ["SEQMEM_LATTICE_BACKEND"] = old
        tps = B * T / dt
        base = base or tps
        rows.append({"level": "block", "impl": label, "shape": f"B={B} T={T} D={d_model} H={H}",
                     "ms_per_step": 1e3 * dt, "tokens_per_s": tps, "speedup": tps / base})  # fmt: skip
    return rows


def saved_bytes(T: int, B: int = 1, H: int = 4, d: int = 64, mode: str = "scan") -> int:
    """Bytes autograd keeps for the backward of ``lattice_scan`` (float32), measured with saved-tensor hooks."""
    from seqmem.ops.lattice import lattice_scan

    g = torch.Generator().manual_seed(0)
    ins = [torch.randn(B, T, H, d, generator=g).requires_grad_() for _ in range(3)]
    gam = torch.rand(B, T, H, generator=g).requires_grad_()
    total = [0]
    seen: set[int] = set()

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total[0] += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lattice_scan(*ins, gam, mode=mode, chunk_size=64)
    return total[0]


def run_speed(cfg: dict[str, Any], out: Path, command: str) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    rows = bench_scan(cfg["speed_T"], cfg["speed_B"], cfg["speed_H"], cfg["speed_d"], cfg["speed_reps"])
    rows += bench_block(cfg["speed_T"], cfg["speed_B"], cfg["speed_H"] * cfg["speed_d"], cfg["speed_H"],
                        cfg["speed_reps"])  # fmt: skip
    for r in rows:
        r["paper"] = "— (no timings in the paper)"
    write_results(out, "speed", rows, columns=["level", "impl", "shape", "ms_per_step", "tokens_per_s", "speedup",
                                              "paper"],  # fmt: skip
                  title="Training throughput of the exact Lattice recurrence (fwd+bwd, float32, 1 thread)",
                  command=command, scale_note="CPU, one thread; speedup relative to the plain loop")
    T = cfg["mem_T"]
    mem = []
    for mode in ("scan", "recurrent"):
        if mode == "recurrent" and T > 2048:  # measure at 1k and scale linearly (it is linear in T)
            b = saved_bytes(1024, mode=mode) * T / 1024
            note = "measured at T=1024, x T/1024"
        else:
            b, note = saved_bytes(T, mode=mode), "measured"
        mem.append({"mode": mode, "T": T, "shape": "B=1 H=4 d=m=64 float32", "saved_MB_per_layer": b / 2**20,
                    "how": note, "paper": "—"})  # fmt: skip
    note = "per sequence and layer; the scan keeps its inputs + one state per chunk of 64 tokens"
    write_results(out, "memory", mem, columns=["mode", "T", "shape", "saved_MB_per_layer", "how", "paper"],
                  title="Activation memory kept for the backward by one Lattice scan", command=command,
                  scale_note=note)  # fmt: skip
    return rows + mem


# ------------------------------------------------------------------------------------------------------------
# LM experiments
# ------------------------------------------------------------------------------------------------------------
def _train_one(name: str, mixer: str, opts: dict[str, Any], cfg: dict[str, Any], task, seed: int):
    from seqmem.models import LMConfig
    from seqmem.train import TrainConfig, evaluate

    lm_cfg = LMConfig(vocab_size=256, d_model=cfg["d_model"], n_layers=cfg["n_layers"], n_heads=cfg["n_heads"],
                      mixer=mixer, mixer_options=dict(opts))  # fmt: skip
    tc = TrainConfig(steps=cfg["steps"], batch_size=cfg["batch"], lr=cfg["lr"], weight_decay=0.1, warmup_frac=0.1,
                     clip=1.0, eval_every=0, eval_examples=cfg["eval_examples"],
                     eval_batch_size=min(32, cfg["eval_examples"]), log_every=max(1, cfg["steps"] // 10),
                     seed=seed)  # fmt: skip
    fit = fit_lm(lm_cfg, task, tc, seed=seed)
    model, res, secs = fit.model, fit.result, fit.seconds
    # the trainer evaluates at its last step on the same fixed val windows; reuse that instead of a second pass
    ev = res.final or evaluate(model, task, n_examples=cfg["eval_examples"],
                               batch_size=min(32, cfg["eval_examples"]))  # fmt: skip
    pos = {k: v for k, v in ev.items() if k.startswith("bpb_pos_")}
    hist = [{"step": h.get("step"), "loss": h.get("loss")} for h in res.history if "loss" in h]
    return {"model": name, "mixer": mixer, "options": opts, "params": model.num_parameters(),
            "val_bpb": ev.get("bpb", ev["loss"] / 0.6931471805599453), "val_acc": ev["accuracy"],
            "train_seconds": secs, "positions": pos, "history": hist}  # fmt: skip


def _plot(results: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        pos = r["positions"]
        if not pos:
            continue
        keys = sorted(pos, key=lambda s: int(s.split("_")[2]))
        xs = [(int(s.split("_")[2]) + int(s.split("_")[3])) / 2 for s in keys]
        ax.plot(xs, [pos[s] for s in keys], marker="o", label=r["model"])
    ax.set_xlabel("context position (bytes)")
    ax.set_ylabel("val bits per byte")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_lm(cfg, out: Path, command: str, seed: int, corpus: str, which: str) -> list[dict[str, Any]]:
    from seqmem.tasks.lm import LMTask

    task = LMTask(corpus, seq_len=cfg["seq_len"], max_files=cfg["max_files"], n_buckets=8)
    results = []
    if which == "lm":
        todo = [(n, m, o, PAPER_T2[n]) for n, (m, o) in MODELS.items()]
    elif which == "vnorm":
        todo = [(n, m, o, p) for n, (m, o, p) in VNORM.items()]
    else:
        todo = [(n, m, o, p) for n, (m, o, p) in LADDER.items()]
    for name, mixer, opts, paper in todo:
        r = _train_one(name, mixer, opts, cfg, task, seed)
        r["paper"] = paper
        results.append(r)
        print(f"[lattice/{which}] {name}: val bpb {r['val_bpb']:.4f} ({r['params']} params, "
              f"{r['train_seconds']:.0f}s)", flush=True)  # fmt: skip
    scale = (f"{cfg['n_layers']} layers x d={cfg['d_model']}, {cfg['n_heads']} heads, byte-level {corpus!r} corpus, "
             f"T={cfg['seq_len']}, {cfg['steps']} steps x {cfg['batch']} seqs "
             f"(~{cfg['steps'] * cfg['batch'] * cfg['seq_len'] / 1e3:.0f}k bytes), seed {seed}")  # fmt: skip
    if which == "vnorm":
        rows = [{"model": r["model"], "paper": r["paper"], "ours_val_bpb": r["val_bpb"], "ours_params": r["params"],
                 "scale": "ours: see scale note"} for r in results]  # fmt: skip
        cols = ["model", "paper", "ours_val_bpb", "ours_params", "scale"]
        title = "Not in the paper: L2-normalised values (v_norm) for Lattice-ENC/DEC (val bits per byte)"
    elif which == "lm":
        rows = [{"model": r["model"], "paper_pile2k_ppl": r["paper"][0], "paper_books512_ppl": r["paper"][1],
                 "ours_val_bpb": r["val_bpb"], "ours_params": r["params"], "scale": "ours: see scale note; "
                 "paper: 110M params, 2.4B tokens"} for r in results]  # fmt: skip
        cols = ["model", "paper_pile2k_ppl", "paper_books512_ppl", "ours_val_bpb", "ours_params", "scale"]
        title = "Table 2 in miniature: LM quality (paper: perplexity; ours: bits per byte; lower is better)"
    else:
        rows = [{"configuration": r["model"], "paper_ppl": r["paper"], "ours_val_bpb": r["val_bpb"],
                 "ours_params": r["params"], "scale": "ours: see scale note; paper: 125M, the Pile"}
                for r in results]  # fmt: skip
        cols = ["configuration", "paper_ppl", "ours_val_bpb", "ours_params", "scale"]
        title = "Table 4 ablation ladder in the Lattice block (paper: Pile ppl; ours: val bits per byte)"
    write_results(out, which, rows, columns=cols, title=title, command=command, scale_note=scale,
                  extra={"runs": results})  # fmt: skip
    _plot(results, out / f"{which}_bpb_vs_position.png", f"{title.split(':')[0]} — val bpb by position")
    return results


# ------------------------------------------------------------------------------------------------------------
# context-length sweep (Table 2's Books 512 -> 16k / Pile 2k, 8k in miniature), several seeds
# ------------------------------------------------------------------------------------------------------------
def _parse_contexts(text: str | None, default: list[int]) -> list[int]:
    if text is None:
        return list(default)
    try:
        vals = [int(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"--contexts must be comma-separated positive integers, got {text!r}") from None
    if not vals or any(v <= 0 for v in vals):
        raise ValueError(f"--contexts must be comma-separated positive integers, got {text!r}")
    return sorted(set(vals))


def _pm(xs: list[float]) -> str:
    if not xs:
        return "—"
    m, s = mean_std(xs)
    return f"{m:.3f} ± {s:.3f}" if len(xs) > 1 else f"{m:.3f}"


def _last_bucket(pos: dict[str, float]) -> float:
    key = max(pos, key=lambda s: int(s.split("_")[2]))
    return pos[key]


def _first_bucket(pos: dict[str, float]) -> float:
    key = min(pos, key=lambda s: int(s.split("_")[2]))
    return pos[key]


def _context_tables(runs: list[dict[str, Any]], lengths: list[int], seeds: list[int]):
    """Aggregate per-run results into (rows for val bpb, rows for last-bucket bpb, per-seed ranking rows)."""
    main, last = [], []
    books = lambda n: "/".join("—" if v is None else f"{v:.2f}" for v in PAPER_BOOKS[n])  # noqa: E731
    for name, (_mixer, _opts, note) in CONTEXT_MODELS.items():
        mine = [r for r in runs if r["model"] == name]
        if not mine:
            continue
        r_main: dict[str, Any] = {"model": name, "variant": note or "—", "params": mine[0]["params"],
                                  "paper_books_ppl_512/1k/2k/4k/8k/16k": books(name),
                                  "paper_pile_ppl_2k/8k": "{:.2f}/{:.2f}".format(*PAPER_PILE[name])}  # fmt: skip
        r_last = dict(r_main)
        for T in lengths:
            at = [r for r in mine if r["T"] == T]
            r_main[f"ours_bpb_T{T}"] = _pm([r["val_bpb"] for r in at])
            r_last[f"ours_last_T{T}"] = _pm([r["bpb_last"] for r in at])
            r_main[f"_bpb_T{T}"] = [r["val_bpb"] for r in at]
            r_last[f"_last_T{T}"] = [r["bpb_last"] for r in at]
            r_last[f"_first_T{T}"] = [r["bpb_first"] for r in at]
        main.append(r_main)
        last.append(r_last)
    # per length: mean rank over seeds, and how often each model is best (does the ranking survive the seeds?)
    ranks = []
    for T in lengths:
        for seed in seeds:
            at = {r["model"]: r["val_bpb"] for r in runs if r["T"] == T and r["seed"] == seed}
            for i, n in enumerate(sorted(at, key=at.get)):
                ranks.append({"T": T, "seed": seed, "model": n, "rank": i + 1})
    return main, last, ranks


def _plot_context(main, last, lengths: list[int], path: Path, corpus: str,
                  refs: dict[int, dict[str, float]] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, rows, key, lab in ((axes[0], main, "_bpb_T", "val bpb (all positions)"),
                               (axes[1], last, "_last_T", "val bpb, last 1/8 of the window")):  # fmt: skip
        for r in rows:
            xs, ms, ss = [], [], []
            for T in lengths:
                vals = r.get(f"{key}{T}") or []
                if vals:
                    m, s = mean_std(vals)
                    xs.append(T)
                    ms.append(m)
                    ss.append(0.0 if math.isnan(s) else s)  # one seed: no spread to draw
            style = "-" if r["model"].startswith("Lattice") else "--"
            ax.errorbar(xs, ms, yerr=ss, marker="o", capsize=3, linestyle=style, label=r["model"])
        if refs:
            rk = "bigram_bpb" if key == "_bpb_T" else "bigram_last"
            ts = [T for T in lengths if T in refs]
            ax.plot(ts, [refs[T][rk] for T in ts], "k:", marker="x", label="byte bigram on the same val windows")
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths)
        ax.set_xticklabels([str(T) for T in lengths])
        ax.set_xlabel("training / eval context length T (bytes)")
        ax.set_ylabel(lab)
    axes[0].set_title(f"bpb vs context ({corpus!r}, mean ± std over seeds)")
    axes[1].set_title("late positions: does longer context help?")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _parse_models(text: str | None) -> list[str]:
    if text is None:
        return list(CONTEXT_MODELS)
    names = comma_list(text)
    bad = [n for n in names if n not in CONTEXT_MODELS]
    if bad or not names:
        raise ValueError(f"unknown --models {bad or text!r}; valid: {', '.join(CONTEXT_MODELS)}")
    return [n for n in CONTEXT_MODELS if n in names]


def bigram_reference(task, n_eval: int, max_train_bytes: int = 20_000_000) -> dict[str, float]:
    """Difficulty of ``task``'s val windows: bpb of a byte-bigram count model (add-½, fitted on the first
    ``max_train_bytes`` of the train split) on exactly the windows the LMs are evaluated on — overall and in the
    last position bucket.  The val windows differ between context lengths, so this separates "harder val sample"
    from "worse model" when comparing across T."""
    import numpy as np

    tr = np.asarray(task.corpus.split("train")[:max_train_bytes], dtype=np.int64)
    c = np.bincount(tr[:-1] * 256 + tr[1:], minlength=256 * 256).astype(np.float64).reshape(256, 256) + 0.5
    logp = np.log2(c / c.sum(1, keepdims=True))
    x, y = task.eval_data(n_eval)
    nll = -logp[x.numpy(), y.numpy()]
    lo = task.buckets[-1][0]
    return {"bigram_bpb": float(nll.mean()), "bigram_last": float(nll[:, lo:].mean())}


def write_context(out: Path, runs: list[dict[str, Any]], lengths: list[int], seeds: list[int],
                  refs: dict[int, dict[str, float]], command: str, scale: str, corpus: str,
                  extra: dict[str, Any] | None = None) -> str:
    """Write context.md / context.json / context_bpb_vs_context.png from the per-run results."""
    from seqmem.repro.common import atomic_write_text, markdown_table

    main, last, ranks = _context_tables(runs, lengths, seeds)
    ref_main = {"model": "byte bigram (reference)", "variant": "add-½ counts, ≤20M train bytes, same val windows",
                "params": "—", "paper_books_ppl_512/1k/2k/4k/8k/16k": "—", "paper_pile_ppl_2k/8k": "—"}  # fmt: skip
    ref_last = dict(ref_main)
    for L in lengths:
        if L in refs:
            ref_main[f"ours_bpb_T{L}"] = f"{refs[L]['bigram_bpb']:.3f}"
            ref_last[f"ours_last_T{L}"] = f"{refs[L]['bigram_last']:.3f}"
    cols_main = ["model", "variant", "params", "paper_books_ppl_512/1k/2k/4k/8k/16k", "paper_pile_ppl_2k/8k"]
    cols_main += [f"ours_bpb_T{L}" for L in lengths]
    cols_last = ["model", "paper_books_ppl_512/1k/2k/4k/8k/16k"] + [f"ours_last_T{L}" for L in lengths]
    # the same, relative to the bigram reference on the same windows (comparable across T)
    rel = []
    for r in main:
        row: dict[str, Any] = {"model": r["model"]}
        for L in lengths:
            if L in refs:
                row[f"ours_minus_bigram_T{L}"] = _pm([v - refs[L]["bigram_bpb"] for v in r[f"_bpb_T{L}"]])
        rel.append(row)
    title = ("Table 2's context sweep in miniature: val bits per byte vs context length, mean ± std over "
             "seeds (paper: perplexity per token; lower is better in both)")  # fmt: skip
    payload = {"last_bucket_rows": last, "relative_rows": rel, "bigram_reference": {str(k): v for k, v in refs.items()},
               "ranks": ranks, "lengths": lengths, "seeds": seeds,
               "train_bytes_per_run": runs[0]["train_bytes"] if runs else 0, **(extra or {}), "runs": runs}  # fmt: skip
    md = write_results(out, "context", main + [ref_main], columns=cols_main, title=title, command=command,
                       scale_note=scale, extra=payload)  # fmt: skip
    names = [n for n in CONTEXT_MODELS if any(r["model"] == n for r in runs)]
    mean_rank = []
    for L in lengths:
        rrow: dict[str, Any] = {"T": L}
        for n in names:
            rk = [x["rank"] for x in ranks if x["T"] == L and x["model"] == n]
            rrow[n] = f"{sum(rk) / len(rk):.1f}" if rk else "—"
        mean_rank.append(rrow)
    md += ("\n### Last position bucket (the final 1/8 of each window): val bits per byte, mean ± std\n\n"
           + markdown_table(last + [ref_last], cols_last)
           + "\n### Val bpb minus the byte-bigram bpb of the same val windows (removes val-sample difficulty, "
             "which differs between T), mean ± std\n\n"
           + markdown_table(rel, ["model"] + [f"ours_minus_bigram_T{L}" for L in lengths if L in refs])
           + "\n### Rank by overall val bpb (1 = best), mean over seeds\n\n"
           + markdown_table(mean_rank, ["T", *names]))  # fmt: skip
    atomic_write_text(out / "context.md", md)
    _plot_context(main, last, lengths, out / "context_bpb_vs_context.png", corpus, refs)
    return md


def run_context(cfg: dict[str, Any], out: Path, command: str, seed0: int, corpus: str, lengths: list[int],
                n_seeds: int, models: list[str] | None = None) -> list[dict[str, Any]]:
    """Train every CONTEXT_MODELS row at every T in ``lengths`` for ``n_seeds`` seeds; write context.md/json/png.

    Every run sees ``ctx_steps * ctx_tokens_per_step`` training bytes whatever T is (batch = tokens_per_step / T
    sequences); the val stream also holds the same number of bytes (``ctx_eval_tokens``) at every T.  Results are
    rewritten after every finished context length, so an interrupted run leaves its completed part.
    """
    from seqmem.tasks.lm import LMTask

    tok = int(cfg["ctx_tokens_per_step"])
    bad = [T for T in lengths if tok % T or T > tok]
    if bad:
        raise ValueError(f"context lengths {bad} do not divide ctx_tokens_per_step={tok}; use powers of two <= {tok}")
    if n_seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {n_seeds}")
    seeds = [seed0 + i for i in range(n_seeds)]
    steps = int(cfg["ctx_steps"])
    n_train = steps * tok
    scale = (f"{cfg['n_layers']} layers x d={cfg['d_model']}, {cfg['n_heads']} heads, byte-level {corpus!r} corpus "
             f"(val split; test unused), T in {lengths}; every run {steps} steps x {tok} bytes = {n_train:,} "
             f"training bytes whatever T (batch {tok}//T sequences), AdamW lr {cfg['lr']}, seeds {seeds}; "
             f"val on {cfg['ctx_eval_tokens']} bytes per T. Paper: 110M params, 2.4B tokens, 32k vocab, "
             f"perplexity per token (a different unit)")  # fmt: skip
    runs: list[dict[str, Any]] = []
    refs: dict[int, dict[str, float]] = {}
    t_start, cpu_start = time.perf_counter(), time.process_time()
    for T in lengths:
        task = LMTask(corpus, seq_len=T, max_files=cfg["ctx_max_files"], n_buckets=8)
        n_eval = max(1, int(cfg["ctx_eval_tokens"]) // T)
        c = dict(cfg, seq_len=T, batch=tok // T, steps=steps, eval_examples=n_eval)
        for seed in seeds:
            for name in models or list(CONTEXT_MODELS):
                mixer, opts, _note = CONTEXT_MODELS[name]
                r = _train_one(name, mixer, opts, c, task, seed)
                r.update(T=T, seed=seed, train_bytes=n_train, bpb_last=_last_bucket(r["positions"]),
                         bpb_first=_first_bucket(r["positions"]))  # fmt: skip
                runs.append(r)
                print(f"[lattice/context] T={T} seed={seed} {name}: val bpb {r['val_bpb']:.4f} "
                      f"(last bucket {r['bpb_last']:.4f}; {r['params']} params, {r['train_seconds']:.0f}s; "
                      f"total {time.perf_counter() - t_start:.0f}s)", flush=True)  # fmt: skip
        refs[T] = bigram_reference(task, n_eval)
        done = [L for L in lengths if any(r["T"] == L for r in runs)]
        extra = {"seconds": time.perf_counter() - t_start, "cpu_seconds": time.process_time() - cpu_start}
        write_context(out, runs, done, seeds, refs, command, scale, corpus, extra)
    return runs


def run(args) -> int:
    scale = args.scale
    cfg = dict(CONFIGS[scale])
    if getattr(args, "steps", None):
        cfg["steps"] = int(args.steps)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    exps = comma_list(getattr(args, "experiments", ",".join(DEFAULT_EXPERIMENTS)))
    bad = [e for e in exps if e not in EXPERIMENTS]
    if bad:
        raise ValueError(f"unknown experiment(s) {bad}; valid: {EXPERIMENTS}")
    corpus_arg = getattr(args, "corpus", None)
    corpus = corpus_arg or "code"
    seed = int(getattr(args, "seed", 0))
    lengths = _parse_contexts(getattr(args, "contexts", None), cfg["ctx_lengths"])
    n_seeds = getattr(args, "seeds", None)
    n_seeds = int(cfg["ctx_seeds"] if n_seeds is None else n_seeds)
    models = _parse_models(getattr(args, "models", None))
    if getattr(args, "steps", None):
        cfg["ctx_steps"] = int(args.steps)
    command = f"seqmem repro lattice --scale {scale} --experiments {','.join(exps)} --seed {seed}" + (
        f" --steps {args.steps}" if getattr(args, "steps", None) else ""
    ) + (f" --corpus {corpus_arg}" if corpus_arg else "") + (
        f" --contexts {','.join(map(str, lengths))} --seeds {n_seeds}" if "context" in exps else ""
    ) + (f" --models '{','.join(models)}'" if getattr(args, "models", None) else "")
    summary: dict[str, Any] = {"scale": scale, "config": cfg, "command": command}
    t0 = time.perf_counter()
    if "speed" in exps:
        summary["speed"] = run_speed(cfg, out, command)
    for which in ("lm", "ablation", "vnorm"):
        if which in exps:
            res = run_lm(cfg, out, command, seed, corpus, which)
            summary[which] = [{k: r[k] for k in ("model", "val_bpb", "params", "train_seconds")} for r in res]
    if "context" in exps:
        res = run_context(cfg, out, command, seed, corpus_arg or "docs", lengths, n_seeds, models)
        summary["context"] = [{k: r[k] for k in ("model", "T", "seed", "val_bpb", "bpb_last", "params",
                                                 "train_seconds")} for r in res]  # fmt: skip
    summary["seconds"] = time.perf_counter() - t0
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return 0
