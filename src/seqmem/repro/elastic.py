"""Elastic Memory (Towards Compressive and Scalable Recurrent Memory): long-document LM, per-block loss,
memory scaling, sampling swap, HiPPO tables.

``seqmem repro elastic --scale smoke|small|paper --out DIR`` writes, under DIR:

* ``lm_main`` (Table 2 analogue): test PPL / bits per byte / LongPPL proxy for Transformer++ (block-local),
  Memorizing Transformer, Infini-Transformer, Melodi, Elastic_uni and Elastic_exp at "1x" memory, plus
  ``per_block`` (loss vs block index; ``per_block.png``);
* ``memory_scaling`` (Table 3): Elastic_exp and MemTrans at several memory sizes (zero added parameters);
* ``sampling_swap`` (Tables 5/6): uni/exp-trained models tested with both samplings (no retraining);
* ``hippo_table12`` (Table 12): reconstruction MSE of sines / white noise (ZOH, forward, backward, bilinear);
* ``hippo_table13`` (Table 13): reconstruction MSE of the trained Elastic model's real memory-layer K/V vs N;
* ``throughput`` (Table 8): training tokens/s normalised to Transformer++;
* ``README.md``: the command, the scale, every table, and automatic paper-claim checks.

Data: byte-level windows of the ``code`` corpus (:class:`seqmem.tasks.lm.LMTask`; the test split is used only
for the reported numbers).  A window is ``n_blocks`` blocks of ``block_len`` bytes (the paper: 16 × 2048
Llama-2 tokens).  LongPPL proxy (our protocol): a full-attention reference LM trained on the same data scores every
test token with the full window and with a 1-block sliding window; key tokens have ``loss_short − loss_full >
2`` and ``loss_full < 2`` (nats), LongPPL = exp(mean loss of the evaluated model on the key tokens).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from seqmem.mixers.elastic import Elastic, memory_layer_stack
from seqmem.ops.hippo import (
    hippo_compress,
    hippo_reconstruct,
    legs_matrices,
)
from seqmem.repro.common import atomic_write_text, save_figure, write_results
from seqmem.tasks.elastic_topic import ElasticTopicTask

SCALES = ["smoke", "small", "paper"]

CONFIGS: dict[str, dict[str, Any]] = {
    "smoke": dict(
        d_model=32,
        n_layers=2,
        n_heads=2,
        block_len=8,
        n_blocks=4,
        batch=2,
        steps=2,
        n1x=8,
        scaling=[4, 16],
        memtrans_scaling=[16],
        eval_examples=4,
        tput_steps=1,
        max_files=60,
        table12_trials=2,
        table13_examples=2,
    ),
    "small": dict(
        d_model=64,
        n_layers=4,
        n_heads=4,
        block_len=32,
        n_blocks=16,
        batch=8,
        steps=90,
        n1x=32,
        scaling=[8, 128],
        memtrans_scaling=[128],
        eval_examples=64,
        tput_steps=3,
        max_files=None,
        table12_trials=20,
        table13_examples=16,
    ),
    # the paper's 100M model as we infer it from its Section 3.4: only meaningful on a GPU; never run on CPU
    "paper": dict(
        d_model=720,
        n_layers=12,
        n_heads=8,
        block_len=2048,
        n_blocks=16,
        batch=2,
        steps=76300,
        n1x=540,
        scaling=[1080, 2160, 4320, 8640],
        memtrans_scaling=[8640],
        eval_examples=512,
        tput_steps=10,
        max_files=None,
        table12_trials=20,
        table13_examples=64,
    ),
}

# ---- the paper's numbers (Proof-Pile columns; Tables 2, 3, 5, 8, 12, 13) ----
PAPER_T2 = {  # model: (PPL, LongPPL) on Proof-Pile
    "Transformer++": (3.322, 3.866),
    "Mem. Transformer": (3.305, 3.843),
    "Infini-Transformer": (2.950, 2.736),
    "Melodi": (2.940, 2.980),
    "Elastic Memory_uni": (2.958, 2.560),
    "Elastic Memory_exp": (2.915, 2.586),
}
PAPER_T3 = {  # memory multiple: {model: (PPL, LongPPL)}
    1: {"MemT": (3.31, 3.84), "Elastic_exp": (2.92, 2.59)},
    2: {"MemT": (3.28, 3.76), "Elastic_exp": (2.86, 2.43)},
    4: {"MemT": (3.12, 3.22), "Elastic_exp": (2.82, 2.31)},
    8: {"MemT": (3.01, 2.86), "Elastic_exp": (2.78, 2.22)},
    16: {"MemT": (2.94, 2.48), "Elastic_exp": (2.75, 2.15)},
}
PAPER_T5 = {"uni": (2.96, 2.56), "uni-exp": (2.93, 2.61), "exp": (2.92, 2.59), "exp-uni": (2.97, 2.57)}
PAPER_T8 = {
    "Transformer++": 1.000,
    "Mem. Transformer": 1.079,
    "Infini-Transformer": 0.637,
    "Melodi": 0.548,
    "Elastic Memory_uni": 1.055,
    "Elastic Memory_exp": 1.057,
}
PAPER_T8_16X = 0.794  # Elastic_exp at 16x memory
PAPER_T12 = {
    ("1 sine", "ZOH"): 1.2e-5,
    ("3 sines", "ZOH"): 2.3e-4,
    ("5 sines", "ZOH"): 9.8e-4,
    ("5 sines", "forward"): 3.3e-3,
    ("5 sines", "backward"): 2.9e-3,
    ("5 sines", "bilinear"): 4.8e-4,
    ("noise N=32", "ZOH"): 0.97,
    ("noise N=128", "ZOH"): 0.90,
    ("noise N=512", "ZOH"): 0.72,
}
PAPER_T13 = {1: (0.45, 2.92), 2: (0.41, 2.86), 4: (0.35, 2.82), 8: (0.31, 2.78), 16: (0.27, 2.75)}


def add_arguments(parser) -> None:
    parser.add_argument("--steps", type=int, default=None,
                        help="override the number of training steps (default: the scale's)")
    parser.add_argument("--corpus", default="code", help="LMTask corpus (code, docs or a path)")
    parser.add_argument("--skip-lm", action="store_true", help="only the HiPPO tables (12) — seconds")
    parser.add_argument("--only-topic", action="store_true", help="only the synthetic topic-memory check")


# ------------------------------------------------------------------------------------------------ model specs
def model_specs(c: dict[str, Any]) -> dict[str, tuple[list[str], list[dict[str, Any]]]]:
    """Mixer names / options per layer for every model of the main table (memory sizes matched at "1x")."""
    nl, L, n1 = c["n_layers"], c["block_len"], c["n1x"]
    base = {"block_len": L}

    def one_layer(mixer: str, opts: dict[str, Any]):
        names = memory_layer_stack(nl, mixer)
        return names, [dict(base, **opts) if n == mixer else dict(base) for n in names]

    # 1x: Elastic N x 2d floats at one layer == MemTrans queue N x 2d == Melodi n_layers x n_sum x d
    n_sum = max(1, 2 * n1 // nl)
    return {
        "Transformer++": (["block_attention"] * nl, [dict(base)] * nl),
        "Mem. Transformer": one_layer("memorizing", {"n_queue": n1}),
        "Infini-Transformer": (["infini"] * nl, [dict(base)] * nl),
        "Melodi": (["melodi"] * nl, [dict(base, n_summary=n_sum)] * nl),
        "Elastic Memory_uni": one_layer("elastic", {"hippo_n": n1, "sampling": "uniform"}),
        "Elastic Memory_exp": one_layer("elastic", {"hippo_n": n1, "sampling": "exponential"}),
    }


def build_model(c: dict[str, Any], names: list[str], opts: list[dict[str, Any]]):
    from seqmem.models import LanguageModel, LMConfig

    cfg = LMConfig(
        vocab_size=256,
        d_model=c["d_model"],
        n_layers=c["n_layers"],
        n_heads=c["n_heads"],
        mixer=names,
        mixer_options=opts,
    )
    return _device_model(LanguageModel(cfg))


def _device_model(model):
    """The GPU when one is present (``--scale paper`` needs it), else the CPU."""
    return model.to("cuda") if torch.cuda.is_available() else model


def train_cfg(c: dict[str, Any], seed: int):
    from seqmem.train import TrainConfig

    # paper's optimiser (Table 9): AdamW 2e-3, betas (0.9, 0.95), wd 0.1, clip 1, cosine; warmup 5% (not 1%)
    return TrainConfig(
        steps=c["steps"],
        batch_size=c["batch"],
        lr=2e-3,
        weight_decay=0.1,
        warmup_frac=0.05,
        clip=1.0,
        betas=(0.9, 0.95),
        eval_every=0,
        eval_examples=max(4, c["eval_examples"] // 4),
        eval_batch_size=8,
        log_every=max(1, c["steps"] // 10),
        seed=seed,
    )


# ------------------------------------------------------------------------------------------------ evaluation
@torch.no_grad()
def token_losses(model, x: torch.Tensor, y: torch.Tensor, batch: int = 8) -> torch.Tensor:
    """Per-token cross-entropy (nats), shape (n, T)."""
    model.eval()
    dev = next(model.parameters()).device
    out = []
    for i in range(0, x.shape[0], batch):
        logits, _ = model(x[i : i + batch].to(dev))
        out.append(F.cross_entropy(logits.double().transpose(1, 2), y[i : i + batch].to(dev), reduction="none"))
    return torch.cat(out).cpu()


def summarise(ce: torch.Tensor, key: torch.Tensor | None, block_len: int) -> dict[str, Any]:
    mean = float(ce.mean())
    per_block = ce.view(ce.shape[0], -1, block_len).mean((0, 2)).tolist()
    r = {"ppl": math.exp(mean), "bpb": mean / math.log(2), "per_block_loss": per_block}
    if key is not None:
        r["n_key"] = int(key.sum())
        r["longppl"] = math.exp(float(ce[key].mean())) if int(key.sum()) else float("nan")
    return r


def set_window(model, window: int | None) -> None:
    for m in model.modules():
        if hasattr(m, "window") and type(m).__name__ == "Attention":
            m.window = window


def elastic_layers(model) -> list[Elastic]:
    return [m for m in model.modules() if isinstance(m, Elastic)]


def throughput(model, task, c: dict[str, Any], steps: int) -> float:
    """Training tokens per second (forward + backward + AdamW step) on a fixed batch."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = task.sample(c["batch"], torch.Generator().manual_seed(123))
    dev = next(model.parameters()).device
    x, y = x.to(dev), y.to(dev)
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        logits, _ = model(x)
        F.cross_entropy(logits.reshape(-1, 256).float(), y.reshape(-1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return x.numel() / float(np.median(times[1:]))


# ------------------------------------------------------------------------------------------------ Table 12
def _sines(n_waves: int, T: int, rng: np.random.Generator) -> np.ndarray:
    t = (np.arange(T) + 0.5) / T
    f = np.zeros(T)
    for _ in range(n_waves):
        f += rng.uniform(0.5, 1.0) * np.sin(2 * np.pi * rng.uniform(1, 5) * t + rng.uniform(0, 2 * np.pi))
    return f


def gbt_compress(f: np.ndarray, N: int, alpha: float) -> np.ndarray:
    """LegS with the generalized bilinear transform, step 1/(k+1) (forward α=0, backward α=1, bilinear ½)."""
    A, B = (z.numpy() for z in legs_matrices(N))
    c = np.zeros(N)
    eye = np.eye(N)
    for k, fk in enumerate(f):
        d = 1.0 / (k + 1)
        c = np.linalg.solve(eye + alpha * d * A, (eye - (1 - alpha) * d * A) @ c + d * B * fk)
    return c


def table12(trials: int, seed: int) -> list[dict[str, Any]]:
    T, rng = 1024, np.random.default_rng(seed)
    left = torch.arange(T, dtype=torch.float64)  # the paper's uniform points x_j = j t / L_mem, L_mem = T
    mid = left + 0.5

    def mse(c: torch.Tensor, f: np.ndarray, pts: torch.Tensor) -> float:
        rec = hippo_reconstruct(c.reshape(1, -1, 1), float(T), pts)[0, :, 0].numpy()
        return float(np.mean((rec - f) ** 2))

    rows = []
    cases = [
        ("1 sine", 1, "ZOH", 32),
        ("3 sines", 3, "ZOH", 32),
        ("5 sines", 5, "ZOH", 32),
        ("5 sines", 5, "forward", 32),
        ("5 sines", 5, "backward", 32),
        ("5 sines", 5, "bilinear", 32),
        ("noise N=32", 0, "ZOH", 32),
        ("noise N=128", 0, "ZOH", 128),
        ("noise N=512", 0, "ZOH", 512),
    ]
    for name, waves, disc, N in cases:
        el, em = [], []
        for _ in range(trials):
            f = _sines(waves, T, rng) if waves else rng.standard_normal(T)
            if disc == "ZOH":
                c = hippo_compress(torch.tensor(f)[:, None], N, block_len=256)[0, :, 0]
            else:
                c = torch.tensor(gbt_compress(f, N, {"forward": 0.0, "backward": 1.0, "bilinear": 0.5}[disc]))
            el.append(mse(c, f, left))
            em.append(mse(c, f, mid))
        rows.append(
            {
                "signal": name,
                "N": N,
                "length": T,
                "discretization": disc,
                "paper MSE": PAPER_T12[(name, disc)],
                "ours MSE (paper's uniform x_j = j)": float(np.mean(el)),
                "ours MSE (cell midpoints)": float(np.mean(em)),
                "trials": trials,
            }
        )
    return rows


# ------------------------------------------------------------------------------------------------ Table 13
@torch.no_grad()
def table13(model, x: torch.Tensor, c: dict[str, Any], ppl_by_n: dict[int, float]) -> list[dict[str, Any]]:
    """Reconstruction MSE of the memory layer's real raw K/V (one trained model) when compressed with N."""
    layer = elastic_layers(model)[0]
    grabbed: list[torch.Tensor] = []
    hook = layer.register_forward_hook(lambda mod, inp, out: grabbed.append(inp[0].detach()))
    model.eval()
    model(x.to(next(model.parameters()).device))
    hook.remove()
    h = grabbed[0].double()
    _, k, v = layer.qkv(h.to(layer.qkv.weight.dtype)).double().chunk(3, -1)
    sig = torch.cat([k, v], -1)  # (n, T, 2 d_model)
    T = sig.shape[1]
    mid = torch.arange(T, dtype=torch.float64) + 0.5
    rows = []
    for mult in (1, 2, 4, 8, 16):
        N = c["n1x"] * mult
        if N > 4 * T:
            continue
        coef = hippo_compress(sig, N, block_len=c["block_len"])
        rec = hippo_reconstruct(coef, float(T), mid)
        err = float(((rec - sig) ** 2).mean())
        rows.append(
            {
                "memory": f"{mult}x",
                "N (ours)": N,
                "N (paper)": 540 * mult,
                "paper recon MSE": PAPER_T13[mult][0],
                "ours recon MSE": err,
                "ours relative MSE": err / float((sig**2).mean()),
                "paper PPL": PAPER_T13[mult][1],
                "ours PPL (trained at this N)": ppl_by_n.get(N),
            }
        )
    return rows


# ------------------------------------------------------------------------------------------------ topic task
TOPIC = {
    "smoke": dict(
        vocab=32,
        topic=4,
        block_len=8,
        n_blocks=4,
        d_model=32,
        n_layers=2,
        n_heads=2,
        batch=4,
        steps=3,
        n_mem=8,
        eval_examples=8,
    ),
    "small": dict(
        vocab=64,
        topic=4,
        block_len=16,
        n_blocks=8,
        d_model=32,
        n_layers=2,
        n_heads=2,
        batch=16,
        steps=250,
        n_mem=16,
        eval_examples=256,
    ),
    "paper": dict(
        vocab=64,
        topic=4,
        block_len=16,
        n_blocks=8,
        d_model=32,
        n_layers=2,
        n_heads=2,
        batch=16,
        steps=250,
        n_mem=16,
        eval_examples=256,
    ),
}


class TopicTask(ElasticTopicTask):
    """The registered ``elastic_topic`` task (:class:`seqmem.tasks.elastic_topic.ElasticTopicTask`) with this
    module's original signature and evaluation streams (``eval_data`` / ``test_data`` draw ``n_examples`` at once
    from ``eval_seed`` / ``eval_seed + 1``), so that ``seqmem repro elastic`` results are unchanged."""

    def __init__(self, vocab: int, topic: int, seq_len: int, eval_seed: int = 2_718_281) -> None:
        super().__init__(vocab_size=vocab, topic=topic, seq_len=seq_len, block_len=seq_len, eval_seed=eval_seed)

    def eval_data(self, n_examples: int):
        return self.sample(n_examples, torch.Generator().manual_seed(self.eval_seed))

    def test_data(self, n_examples: int):
        return self.sample(n_examples, torch.Generator().manual_seed(self.eval_seed + 1))


def topic_check(scale: str, seed: int) -> list[dict[str, Any]]:
    """Train Transformer++ / Elastic_exp / Elastic_uni / MemTrans on :class:`TopicTask`; loss by in-block position."""
    from seqmem.train import TrainConfig, train

    t = dict(TOPIC[scale])
    L, T = t["block_len"], t["block_len"] * t["n_blocks"]
    task = TopicTask(t["vocab"], t["topic"], T)
    xt, yt = task.test_data(t["eval_examples"])
    c = dict(d_model=t["d_model"], n_layers=t["n_layers"], n_heads=t["n_heads"], block_len=L, n1x=t["n_mem"])
    specs = model_specs(c)
    rows = []
    for name in ("Transformer++", "Mem. Transformer", "Elastic Memory_uni", "Elastic Memory_exp"):
        torch.manual_seed(seed)
        from seqmem.models import LanguageModel, LMConfig

        names, opts = specs[name]
        m = _device_model(
            LanguageModel(
                LMConfig(
                    vocab_size=t["vocab"],
                    d_model=c["d_model"],
                    n_layers=c["n_layers"],
                    n_heads=c["n_heads"],
                    mixer=names,
                    mixer_options=opts,
                )
            )
        )
        cfg = TrainConfig(
            steps=t["steps"],
            batch_size=t["batch"],
            lr=3e-3,
            weight_decay=0.1,
            warmup_frac=0.05,
            clip=1.0,
            betas=(0.9, 0.95),
            eval_examples=16,
            eval_batch_size=16,
            log_every=max(1, t["steps"] // 5),
            seed=seed,
        )
        train(m, task, cfg)
        ce = token_losses(m, xt, yt, batch=64).view(xt.shape[0], t["n_blocks"], L)
        q = max(1, L // 4)
        rows.append(
            {
                "model": name,
                "optimum ln(topic)": math.log(t["topic"]),
                "block 0, first quarter": float(ce[:, 0, :q].mean()),
                "blocks >= 1, first quarter": float(ce[:, 1:, :q].mean()),
                "blocks >= 1, last quarter": float(ce[:, 1:, -q:].mean()),
                "all tokens": float(ce.mean()),
            }
        )
        print(f"[elastic repro] topic task {name}: {rows[-1]}", flush=True)
    return rows


def _topic_section(out: Path, scale: str, seed: int, cmd: str) -> tuple[str, str]:
    t = TOPIC[scale]
    rows = topic_check(scale, seed)
    md = write_results(
        out,
        "topic_task",
        rows,
        title="Synthetic topic-memory check (ours; not a paper table)",
        command=cmd,
        scale_note=f"vocab {t['vocab']}, topic of {t['topic']} tokens, "
        f"{t['n_blocks']} blocks of {t['block_len']}, d_model {t['d_model']}, {t['n_layers']} layers "
        f"(memory at the last), memory 1x = {t['n_mem']}, {t['steps']} steps x batch {t['batch']}; "
        "loss in nats by in-block position",
    )
    r = {x["model"]: x["blocks >= 1, first quarter"] for x in rows}
    check = (
        f"Topic task (memory carries a low-frequency summary across blocks): early-position loss in blocks "
        f">= 1 — Transformer++ {r['Transformer++']:.3f}, MemTrans {r['Mem. Transformer']:.3f}, Elastic_uni "
        f"{r['Elastic Memory_uni']:.3f}, Elastic_exp {r['Elastic Memory_exp']:.3f} (optimum "
        f"{math.log(t['topic']):.3f}); Elastic_exp below Transformer++: "
        f"{r['Elastic Memory_exp'] < r['Transformer++']}"
    )
    return md, check


# ------------------------------------------------------------------------------------------------ plots
def plot_per_block(results: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4))
    base = results.get("Transformer++", {}).get("per_block_loss")
    for name, r in results.items():
        pb = [v / math.log(2) for v in r["per_block_loss"]]
        ax.plot(range(len(pb)), pb, marker="o", ms=3, label=name)
        if base is not None:
            ax2.plot(range(len(pb)), [a - b / math.log(2) for a, b in zip(pb, base)], marker="o", ms=3, label=name)
    ax.set_xlabel("block index")
    ax.set_ylabel("test loss (bits per byte)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax2.axhline(0.0, color="k", lw=0.5)
    ax2.set_xlabel("block index")
    ax2.set_ylabel("loss minus Transformer++ (bits per byte)")
    ax2.set_title("difference to Transformer++ (same test windows)")
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------ run
def run(args) -> int:
    torch.set_num_threads(1)
    scale = args.scale
    if scale == "paper" and not torch.cuda.is_available():
        print(
            "seqmem repro elastic: --scale paper is the inferred 100M / 32k-token configuration and needs a GPU "
            "(hours per model); use --scale small on a CPU"
        )
        return 2
    c = dict(CONFIGS[scale])
    if getattr(args, "steps", None):
        c["steps"] = int(args.steps)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    seed = int(getattr(args, "seed", 0) or 0)
    cmd = f"seqmem repro elastic --scale {scale}" + (f" --steps {args.steps}" if getattr(args, "steps", None) else "")
    T = c["block_len"] * c["n_blocks"]
    note = (
        f"{scale}: byte-level LM on the `code` corpus, d_model={c['d_model']}, {c['n_layers']} layers, "
        f"{c['n_heads']} heads, blocks of {c['block_len']} bytes x {c['n_blocks']} = {T}-byte windows, "
        f"batch {c['batch']}, {c['steps']} steps; memory 1x = N = {c['n1x']} (paper: 100M params, 2048-token "
        f"blocks x 16, 40B tokens, N = 540)"
    )
    t_start = time.time()
    md: list[str] = [f"# Elastic Memory reproduction ({scale})\n", f"Command: `{cmd}`\n", f"Scale: {note}\n"]
    checks: list[str] = []
    if getattr(args, "only_topic", False):
        tmd, tcheck = _topic_section(out, scale, seed, cmd + " --only-topic")
        print(tcheck)
        return 0

    rows12 = table12(c["table12_trials"], seed)
    md.append(
        write_results(
            out,
            "hippo_table12",
            rows12,
            title="Table 12 — HiPPO reconstruction of synthetic signals",
            command=cmd,
            scale_note="exact (signal parameters unknown in the paper: amplitudes "
            "U(0.5,1), 1–5 cycles per window, random phase)",
        )
    )
    zoh = {r["signal"]: r["ours MSE (paper's uniform x_j = j)"] for r in rows12 if r["discretization"] == "ZOH"}
    bil = next(r for r in rows12 if r["discretization"] == "bilinear")["ours MSE (paper's uniform x_j = j)"]
    checks.append(
        f"Table 12: smooth MSE rises with components (1<3<5 sines): "
        f"{zoh['1 sine'] < zoh['3 sines'] < zoh['5 sines']}; noise MSE falls with N: "
        f"{zoh['noise N=32'] > zoh['noise N=128'] > zoh['noise N=512']}; bilinear beats ZOH on 5 sines "
        f"(paper: yes): {bil < zoh['5 sines']}"
    )
    if getattr(args, "skip_lm", False):
        return _finish(out, md, checks, t_start)

    from seqmem.tasks.lm import LMTask
    from seqmem.train import train

    task = LMTask(getattr(args, "corpus", "code"), seq_len=T, max_files=c["max_files"], n_buckets=c["n_blocks"])
    xt, yt = task.test_data(c["eval_examples"])
    specs = model_specs(c)
    models: dict[str, Any] = {}
    train_s: dict[str, float] = {}

    def fit(name: str, names: list[str], opts: list[dict[str, Any]]):
        torch.manual_seed(seed)
        m = build_model(c, names, opts)
        t0 = time.time()
        res = train(m, task, train_cfg(c, seed))
        train_s[name] = time.time() - t0
        print(
            f"[elastic repro] {name}: trained {c['steps']} steps in {train_s[name]:.0f}s, "
            f"val loss {res.final.get('loss', float('nan')):.3f}",
            flush=True,
        )
        return m

    # the LongPPL evaluator: full causal attention over the whole window, trained on the same data
    evaluator = fit("evaluator (full attention)", ["attention"] * c["n_layers"], [{}] * c["n_layers"])
    full = token_losses(evaluator, xt, yt)
    set_window(evaluator, c["block_len"])
    short = token_losses(evaluator, xt, yt)
    set_window(evaluator, None)
    key = ((short - full) > 2.0) & (full < 2.0)
    key_relaxed = ((short - full) > 1.0) & (full < 2.0)

    results: dict[str, dict[str, Any]] = {}
    for name, (names, opts) in specs.items():
        models[name] = fit(name, names, opts)
        ce = token_losses(models[name], xt, yt)
        results[name] = summarise(ce, key, c["block_len"])
        results[name]["longppl_relaxed"] = math.exp(float(ce[key_relaxed].mean())) if int(key_relaxed.sum()) else None
        results[name]["params"] = models[name].num_parameters()
        results[name]["state_floats"] = models[name].state_size(T)
    base_params = results["Transformer++"]["params"]
    rows = []
    for name, r in results.items():
        rows.append(
            {
                "model": name,
                "added params": r["params"] - base_params,
                "state floats/seq": r["state_floats"],
                "paper PPL (Proof-Pile)": PAPER_T2[name][0],
                "ours PPL (bytes)": r["ppl"],
                "ours bpb": r["bpb"],
                "paper LongPPL": PAPER_T2[name][1],
                "ours LongPPL proxy": r["longppl"],
                "ours LongPPL proxy (relaxed, >1 nat)": r["longppl_relaxed"],
                "ours last-block bpb": r["per_block_loss"][-1] / math.log(2),
            }
        )
    md.append(
        write_results(
            out,
            "lm_main",
            rows,
            title="Table 2 analogue — test PPL and LongPPL proxy",
            command=cmd,
            scale_note=note + f"; key tokens {int(key.sum())} strict / "
            f"{int(key_relaxed.sum())} relaxed of {key.numel()}",
            extra={"results": results},
        )
    )
    pb_rows = [
        {"model": n, **{f"b{i}": r["per_block_loss"][i] / math.log(2) for i in range(c["n_blocks"])}}
        for n, r in results.items()
    ]
    md.append(
        write_results(
            out,
            "per_block",
            pb_rows,
            title="Per-block test loss (bits per byte) vs block index",
            command=cmd,
            scale_note=note,
        )
    )
    plot_per_block(results, out / "per_block.png", f"Elastic repro ({scale}): loss vs block index")

    ppl = {n: r["ppl"] for n, r in results.items()}
    tpp = ppl["Transformer++"]
    checks.append(
        f"Table 2: Elastic_exp PPL < Transformer++ (paper: yes): {ppl['Elastic Memory_exp'] < tpp}; "
        f"Elastic_uni < Transformer++: {ppl['Elastic Memory_uni'] < tpp}; Elastic_exp best PPL "
        f"(paper: yes): {min(ppl, key=ppl.get) == 'Elastic Memory_exp'} (best: {min(ppl, key=ppl.get)}); "
        f"Elastic_exp < MemTrans (paper: yes): {ppl['Elastic Memory_exp'] < ppl['Mem. Transformer']}"
    )

    def slope(pb: list[float]) -> float:
        half = len(pb) // 2
        return float(np.mean(pb[half:]) - np.mean(pb[1:half]))

    checks.append(
        "Per-block: late-minus-early-block loss (nats; negative = improves with block index): "
        + ", ".join(f"{n}: {slope(r['per_block_loss']):+.4f}" for n, r in results.items())
    )

    # ---- Tables 5/6: sampling swap at test time (no retraining)
    swap_rows = []
    for trained, test, label in [
        ("uniform", "uniform", "uni"),
        ("uniform", "exponential", "uni-exp"),
        ("exponential", "exponential", "exp"),
        ("exponential", "uniform", "exp-uni"),
    ]:
        m = models["Elastic Memory_uni" if trained == "uniform" else "Elastic Memory_exp"]
        for layer in elastic_layers(m):
            layer.set_sampling(test)
        r = summarise(token_losses(m, xt, yt), key, c["block_len"])
        for layer in elastic_layers(m):
            layer.set_sampling(trained)
        swap_rows.append(
            {
                "model": f"Elastic Memory_{label}",
                "paper PPL": PAPER_T5[label][0],
                "ours PPL": r["ppl"],
                "paper LongPPL": PAPER_T5[label][1],
                "ours LongPPL proxy": r["longppl"],
            }
        )
    md.append(
        write_results(
            out,
            "sampling_swap",
            swap_rows,
            title="Tables 5/6 — test-time sampling swap",
            command=cmd,
            scale_note=note,
        )
    )
    sp = {r["model"].split("_")[1]: r["ours PPL"] for r in swap_rows}
    checks.append(
        f"Table 5: uni-exp PPL < uni (paper: yes): {sp['uni-exp'] < sp['uni']}; exp-uni PPL > exp "
        f"(paper: yes): {sp['exp-uni'] > sp['exp']}"
    )

    # ---- Table 3: memory scaling at zero added parameters
    ppl_by_n = {c["n1x"]: ppl["Elastic Memory_exp"]}
    scal_rows = [
        {
            "model": "Elastic_exp",
            "memory": "1x",
            "N / queue": c["n1x"],
            "added params": 0,
            "paper PPL": PAPER_T3[1]["Elastic_exp"][0],
            "ours PPL": ppl["Elastic Memory_exp"],
            "paper LongPPL": PAPER_T3[1]["Elastic_exp"][1],
            "ours LongPPL proxy": results["Elastic Memory_exp"]["longppl"],
        }
    ]
    for N in c["scaling"]:
        names, opts = model_specs(dict(c, n1x=N))["Elastic Memory_exp"]
        m = fit(f"Elastic_exp N={N}", names, opts)
        r = summarise(token_losses(m, xt, yt), key, c["block_len"])
        ppl_by_n[N] = r["ppl"]
        mult = N / c["n1x"]
        p = PAPER_T3.get(int(mult)) if mult >= 1 and float(mult).is_integer() else None
        scal_rows.append(
            {
                "model": "Elastic_exp",
                "memory": f"{mult:g}x",
                "N / queue": N,
                "added params": m.num_parameters() - base_params,
                "paper PPL": p["Elastic_exp"][0] if p else None,
                "ours PPL": r["ppl"],
                "paper LongPPL": p["Elastic_exp"][1] if p else None,
                "ours LongPPL proxy": r["longppl"],
            }
        )
        models[f"Elastic_exp N={N}"] = m
    scal_rows.append(
        {
            "model": "MemT",
            "memory": "1x",
            "N / queue": c["n1x"],
            "added params": c["n_heads"],
            "paper PPL": PAPER_T3[1]["MemT"][0],
            "ours PPL": ppl["Mem. Transformer"],
            "paper LongPPL": PAPER_T3[1]["MemT"][1],
            "ours LongPPL proxy": results["Mem. Transformer"]["longppl"],
        }
    )
    for nq in c["memtrans_scaling"]:
        names, opts = model_specs(dict(c, n1x=nq))["Mem. Transformer"]
        m = fit(f"MemT queue={nq}", names, opts)
        r = summarise(token_losses(m, xt, yt), key, c["block_len"])
        mult = nq / c["n1x"]
        p = PAPER_T3.get(int(mult)) if float(mult).is_integer() else None
        scal_rows.append(
            {
                "model": "MemT",
                "memory": f"{mult:g}x",
                "N / queue": nq,
                "added params": m.num_parameters() - base_params,
                "paper PPL": p["MemT"][0] if p else None,
                "ours PPL": r["ppl"],
                "paper LongPPL": p["MemT"][1] if p else None,
                "ours LongPPL proxy": r["longppl"],
            }
        )
    md.append(
        write_results(
            out,
            "memory_scaling",
            scal_rows,
            title="Table 3 — memory scaling (zero added params)",
            command=cmd,
            scale_note=note,
        )
    )
    el = sorted((r["N / queue"], r["ours PPL"]) for r in scal_rows if r["model"] == "Elastic_exp")
    checks.append(
        f"Table 3: Elastic_exp PPL monotone non-increasing in N (paper: yes): "
        f"{all(a[1] >= b[1] for a, b in zip(el, el[1:]))} ({', '.join(f'N={n}: {v:.3f}' for n, v in el)})"
    )

    # ---- Table 13: reconstruction of the trained model's real K/V
    rows13 = table13(models["Elastic Memory_exp"], xt[: c["table13_examples"]], c, ppl_by_n)
    md.append(
        write_results(
            out,
            "hippo_table13",
            rows13,
            title="Table 13 — reconstruction MSE of real memory-layer "
            "K/V (trained Elastic_exp 1x model; all positions, cell midpoints)",
            command=cmd,
            scale_note=note,
        )
    )
    mses = [r["ours recon MSE"] for r in rows13]
    checks.append(
        f"Table 13: recon MSE monotone non-increasing in N (paper: yes): "
        f"{all(a >= b - 1e-12 for a, b in zip(mses, mses[1:]))}"
    )

    # ---- Table 8: throughput
    tp_rows = []
    tps = {name: throughput(models[name], task, c, c["tput_steps"]) for name in specs}
    big = max(c["scaling"])
    tps_big = throughput(models[f"Elastic_exp N={big}"], task, c, c["tput_steps"])
    for name in specs:
        tp_rows.append(
            {
                "model": name,
                "memory": "1x",
                "paper (normalised)": PAPER_T8[name],
                "ours tokens/s": tps[name],
                "ours (normalised)": tps[name] / tps["Transformer++"],
            }
        )
    tp_rows.append(
        {
            "model": "Elastic Memory_exp",
            "memory": f"{big / c['n1x']:g}x (N={big})",
            "paper (normalised)": PAPER_T8_16X if big / c["n1x"] >= 16 else None,
            "ours tokens/s": tps_big,
            "ours (normalised)": tps_big / tps["Transformer++"],
        }
    )
    md.append(
        write_results(
            out,
            "throughput",
            tp_rows,
            title="Table 8 — training throughput (fwd+bwd+AdamW)",
            command=cmd,
            scale_note=note + "; one CPU thread, median of "
            f"{c['tput_steps']} steps (paper: 8xA800, FlashAttention-2, 100M model)",
        )
    )
    checks.append(
        f"Table 8: Elastic 1x within 20% of Transformer++ throughput: "
        f"{tps['Elastic Memory_exp'] / tps['Transformer++'] > 0.8}; Elastic faster than Melodi "
        f"(paper: yes): {tps['Elastic Memory_exp'] > tps['Melodi']}; throughput falls at larger N "
        f"(paper: yes): {tps_big < tps['Elastic Memory_exp']}"
    )
    tmd, tcheck = _topic_section(out, scale, seed, cmd)
    md.append(tmd)
    checks.append(tcheck)
    atomic_write_text(out / "train_seconds.json", json.dumps(train_s, indent=2))
    return _finish(out, md, checks, t_start)


def _finish(out: Path, md: list[str], checks: list[str], t_start: float) -> int:
    md.append("## Automatic checks of the paper's claims\n")
    md.extend(f"- {c}" for c in checks)
    md.append(f"\nTotal wall time: {time.time() - t_start:.0f} s\n")
    atomic_write_text(out / "README.md", "\n".join(md) + "\n")
    print("\n".join(checks))
    return 0
