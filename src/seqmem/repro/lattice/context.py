"""Table 2's context-length sweep of Lattice in miniature (Books 512 → 16k, Pile 2k / 8k): every row trained from
scratch at each context length with the same training bytes, several seeds, mean ± std tables beside a byte-bigram
reference on the same validation windows, and the plot."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from seqmem.cliargs import comma_list
from seqmem.repro.common import atomic_write_text, figure, markdown_table, mean_std, write_results
from seqmem.repro.lattice.configs import CONTEXT_MODELS
from seqmem.repro.lattice.models import train_one
from seqmem.repro.lattice.paper import PAPER_BOOKS, PAPER_PILE


def parse_contexts(text: str | None, default: list[int]) -> list[int]:
    """The sorted distinct context lengths of ``--contexts`` (``default`` when not given)."""
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
    """Val bpb vs context length (all positions; last bucket), mean ± std over seeds, with the bigram reference."""
    with figure(path, figsize=(11, 4.2), dpi=110, ncols=2) as (_fig, axes):
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


def parse_models(text: str | None) -> list[str]:
    """The rows of ``--models`` in :data:`CONTEXT_MODELS` order (all of them when not given)."""
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
             f"val on {cfg['ctx_eval_tokens']} bytes per T. Paper: 110M params, 2.4B tokens, perplexity per "
             f"token (a different unit; the paper names no tokenizer)")  # fmt: skip
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
                r = train_one(name, mixer, opts, c, task, seed)
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
