"""The VORT retrieval model (one keyed retrieval layer over structured inputs), its training and scoring by lag
bin, and the model rows of Tables 1-2."""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import Tensor, nn

from seqmem.registry import build_mixer
from seqmem.tasks.vort_tasks import lag_bin


class RetrievalModel(nn.Module):
    """One retrieval layer over structured inputs: x_t = [E_key[mem] + E_lab[label] + E_fill[filler] ; E_key[query]]
    → mixer → linear head over the C labels (our single-layer setup for Tables 1-2)."""

    def __init__(self, mixer: str, n_keys: int, n_labels: int, n_filler: int, d_model: int,
                 sharpness: float = 0.0, **mixer_options):
        super().__init__()
        de = d_model // 2
        self.key = nn.Embedding(n_keys + 1, de)
        self.lab = nn.Embedding(n_labels + 1, de)
        self.fill = nn.Embedding(n_filler + 1, de)
        for e, std in ((self.key, 1.0), (self.lab, 1.0), (self.fill, 0.1)):
            nn.init.normal_(e.weight, std=std)
        self.mixer = build_mixer(mixer, 2 * de, **mixer_options)
        self.head = nn.Linear(2 * de, n_labels)
        if sharpness:
            self.structured_init(sharpness)

    @torch.no_grad()
    def structured_init(self, sharpness: float) -> None:
        """Start from the retrieval solution (our choice, 'oracle keys'; docs/vort.md): q reads the query channel
        (× sharpness), k the memory channel, v and the output projection are identities, so that training
        concentrates on the readout and the kernel rather than on discovering retrieval."""
        m = self.mixer
        d = m.d_model
        de, h, dh = d // 2, m.n_heads, m.head_dim
        W = torch.zeros(3 * d, d)
        for j in range(h):  # each head sees the same channels (first min(dh, de) dims)
            r = min(dh, de)
            W[j * dh : j * dh + r, de : de + r] = sharpness * torch.eye(r)
            W[d + j * dh : d + j * dh + r, :r] = torch.eye(r)
        W[2 * d :, :] = torch.eye(d)
        m.qkv.weight.copy_(W)
        m.out.weight.copy_(torch.eye(d))
        self.head.weight.zero_()
        self.head.weight[:, :de] = self.lab.weight[1:] / math.sqrt(de)  # read the label out of the value
        self.head.bias.zero_()

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        mk, ml, fi, qk = (batch[k] + 1 for k in ("mem_key", "mem_label", "filler", "query_key"))
        zero = lambda e, i: e(i) * (i > 0)[..., None]  # noqa: E731  (index 0 = nothing)
        mem = zero(self.key, mk) + zero(self.lab, ml) + zero(self.fill, fi)
        x = torch.cat([mem, zero(self.key, qk)], -1)
        y, _ = self.mixer(x)
        return self.head(y)


CHANNELS = ("mem_key", "mem_label", "filler", "query_key")  # the model's inputs, packed along a last axis


class _Packed(nn.Module):
    """A :class:`RetrievalModel` as :func:`seqmem.train.train` calls it: the input channels packed into one
    (B, n, 4) tensor, ``(logits, None)`` out."""

    def __init__(self, model: RetrievalModel):
        super().__init__()
        self.model = model

    def forward(self, x: Tensor) -> tuple[Tensor, None]:
        return self.model({k: x[..., i] for i, k in enumerate(CHANNELS)}), None


class _PackedTask:
    """A retrieval task as :func:`seqmem.train.train` draws from it: (packed channels, target) pairs; its
    evaluation set is the validation stream ``val``."""

    def __init__(self, task, val: dict[str, Tensor]):
        self.task, self.val = task, val

    @staticmethod
    def pack(b: dict[str, Tensor]) -> Tensor:
        return torch.stack([b[k] for k in CHANNELS], -1)

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        b = self.task.sample(batch_size, generator)
        return self.pack(b), b["target"]

    def eval_data(self, n_examples: int) -> tuple[Tensor, Tensor]:
        return self.pack(self.val)[:n_examples], self.val["target"][:n_examples]


def model_specs(cfg: dict, n: int) -> list[tuple[str, str, dict]]:
    """The rows of Tables 1-2 at sequence length ``n``: ``(label, mixer, options)``; the options hold the
    model's ``sharpness`` (for :class:`RetrievalModel`) beside the mixer's own."""
    base = dict(n_heads=cfg["heads"], n_features=cfg["feats"], chunk_size=64, horizon=n, strict_causal=True,
                sharpness=cfg.get("sharpness", 1.0))
    specs = [(f"PL (α=0.7, S={cfg['S']})", "vort_fixed_alpha", dict(base, n_soe=cfg["S"]))]
    for lam in cfg["lam_grid"]:
        specs.append((f"Exp λ={lam:g}", "exp_decay", dict(base, decay_rate=lam)))
    specs.append(("Mix-5 (log-spaced init)", "exp_mixture", dict(base, mixture_init="logspace")))
    specs.append(("Mix-5 (fit-to-PL init)", "exp_mixture", dict(base, mixture_init="fit")))
    specs.append(("VORT adaptive α (ours)", "vort", dict(base, n_soe=cfg["S"], local_window=cfg["window"])))
    specs.append(("ablation PL S=1", "vort_fixed_alpha", dict(base, n_soe=1)))
    if cfg["exact"]:
        specs.append(("ablation PL exact GL conv.", "vort_fixed_alpha", dict(base, kernel="gl")))
    return specs


def train_eval(task, model: RetrievalModel, cfg: dict, seed: int, val: dict, test: dict, edges) -> dict[str, Any]:
    """Train with :func:`seqmem.train.train` (AdamW without weight decay, betas (0.9, 0.999), linear warm-up over
    the first tenth of the steps then a constant rate, clip 1, data stream seeded ``seed + 17``), then score
    ``val`` and ``test`` by lag bin."""
    from seqmem.train import TrainConfig, train

    tc = TrainConfig(steps=cfg["steps"], batch_size=cfg["batch"], lr=cfg["lr"], weight_decay=0.0, warmup_frac=0.1,
                     min_lr_frac=1.0, clip=1.0, betas=(0.9, 0.999), eval_every=0, eval_examples=cfg["n_val"],
                     eval_batch_size=8, log_every=1, seed=seed + 17)
    t0 = time.time()
    res: dict[str, Any] = {}
    try:
        hist = train(_Packed(model), _PackedTask(task, val), tc).history
    except FloatingPointError as e:  # a diverged run is a result: its last finite weights are scored
        hist, res["diverged"] = [], str(e)
    losses = [h["loss"] for h in hist]
    res.update(train_seconds=time.time() - t0,
               final_train_loss=sum(losses[-5:]) / max(1, len(losses[-5:])) if losses else float("nan"))
    res["val"] = evaluate(model, val, edges)
    res["test"] = evaluate(model, test, edges)
    return res


@torch.no_grad()
def evaluate(model: RetrievalModel, data: dict[str, Tensor], edges, batch: int = 8) -> dict[str, float]:
    """Accuracy (%) of ``model`` on ``data`` in the short / medium / long lag bins split at ``edges``, overall,
    and the number of queries per bin."""
    correct = torch.zeros(3)
    count = torch.zeros(3)
    n = data["target"].shape[0]
    for i in range(0, n, batch):
        b = {k: v[i : i + batch] for k, v in data.items()}
        pred = model(b).argmax(-1)
        bins = lag_bin(b["lag"], edges)
        ok = pred == b["target"]
        for k in range(3):
            m = bins == k
            correct[k] += (ok & m).sum()
            count[k] += m.sum()
    acc = (100 * correct / count.clamp_min(1)).tolist()
    return {"short": acc[0], "medium": acc[1], "long": acc[2], "all": float(100 * correct.sum() / count.sum()),
            "n_short": int(count[0]), "n_medium": int(count[1]), "n_long": int(count[2])}
