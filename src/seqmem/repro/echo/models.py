"""The Echo models as :class:`seqmem.models.LMConfig`: the sub-million models of §4.1, the Mamba-2 hybrids with SKA /
attention layers (Echo-50M, Echo-180M), their sizes without weights, and the paper's optimiser."""

from __future__ import annotations

from typing import Any

import torch

from seqmem.models import LanguageModel, LMConfig
from seqmem.train import TrainConfig


def submillion_config(
    model: str,
    d: int = 128,
    heads: int = 4,
    rank: int = 24,
    d_state: int = 16,
    chunk_size: int = 16,
    vocab_size: int = 128,
    power: int = 2,
    operator_scope: str = "chunk_causal",
) -> LMConfig:
    """§4.1 models: 2 Mamba-2 layers + 2 layers of Mamba-2 / attention (RoPE) / SKA (chunk ``chunk_size``, Koopman
    power K = ``power``, eq. 13; ``operator_scope="sequence"``: the one-operator masked mode of App. F eq. 53, whose
    ``chunk_size`` is unused)."""
    last = {"ssm": "mamba2", "ssm_attn": "attention", "ssm_ska": "ska"}[model]
    mix = ["mamba2", "mamba2", last, last]
    ska = {"rank": rank, "chunk_size": chunk_size, **({"power": power} if power != 2 else {}),
           **({"operator_scope": operator_scope} if operator_scope != "chunk_causal" else {})}
    opt = {"mamba2": {"d_state": d_state}, "attention": {}, "ska": ska}
    # SwiGLU hidden = 8·ceil(ratio·d·2/3 / 8): ratio 4.5 gives d_ff = 384 at d = 128, App. G Table 5's ⌈d·8/3⌉
    # rounded up to 64 (§4.1 says only "SwiGLU MLPs")
    return LMConfig(
        vocab_size=vocab_size,
        d_model=d,
        n_layers=4,
        n_heads=heads,
        mixer=mix,
        mixer_options=[opt[m] for m in mix],
        mlp_ratio=4.5,
        tie_embeddings=False,
    )


def hybrid_config(
    d_model: int,
    n_layers: int,
    n_heads: int,
    special_layers: list[int],
    special: str = "ska",
    rank: int = 56,
    chunk_size: int = 64,
    d_state: int = 64,
    vocab_size: int = 32000,
    mlp_ratio: float = 4.0,
    ffn: str = "swiglu",
) -> LMConfig:
    """Mamba-2 stack with ``special`` ("ska" / "attention" / "mamba2") at the 0-based ``special_layers``.
    The first and last layers must stay Mamba-2 (§3.4).  ``ffn="koopman"``: every block's FFN is the Spectral
    Koopman MLP (mixer ``koopman_mlp`` as its own backbone layer after each sequence layer, ``mlp_ratio=0``)."""
    if ffn not in ("swiglu", "koopman"):
        raise ValueError(f"ffn must be 'swiglu' or 'koopman', got {ffn!r}")
    if 0 in special_layers or n_layers - 1 in special_layers:
        raise ValueError("the first and last layers are always Mamba-2 (Echo §3.4)")
    mix, opts = [], []
    for i in range(n_layers):
        name = special if i in special_layers else "mamba2"
        mix.append(name)
        opts.append(
            {"d_state": d_state, "headdim": 64}
            if name == "mamba2"
            else ({"rank": rank, "chunk_size": chunk_size} if name == "ska" else {})
        )
        if ffn == "koopman":
            mix.append("koopman_mlp")
            opts.append({})
    if ffn == "koopman":
        mlp_ratio = 0.0
    return LMConfig(
        vocab_size=vocab_size,
        d_model=d_model,
        n_layers=len(mix),
        n_heads=n_heads,
        mixer=mix,
        mixer_options=opts,
        mlp_ratio=mlp_ratio,
        tie_embeddings=True,
    )


def echo50m_config(special: str = "ska", ffn: str = "swiglu") -> LMConfig:
    """Echo-50M (§3.4, §4.2): d = 448, 16 blocks, 7 heads (P = 64), r = 56, SKA at 1-based {3, 7, 11, 15}
    (0-based {2, 6, 10, 14}).  ``ffn="swiglu"``: the Mamba-2 + SKA + SwiGLU family; ``"koopman"``:
    Echo proper (Koopman MLP, d_k = 1216)."""
    return hybrid_config(448, 16, 7, [2, 6, 10, 14], special, rank=56, ffn=ffn)


def echo180m_config(special: str = "ska", ffn: str = "swiglu") -> LMConfig:
    """Echo-180M (§3.4): d = 768, 24 blocks, 12 heads, r = 48, SKA at 1-based {8, 16} (0-based {7, 15})."""
    return hybrid_config(768, 24, 12, [7, 15], special, rank=48, ffn=ffn)


def meta_stats(cfg: LMConfig, seq_lens=(2048, 131072)) -> dict[str, Any]:
    """Parameter count and per-sequence state size of a config without allocating its weights."""
    with torch.device("meta"):
        m = LanguageModel(cfg)
    out = {"params": m.num_parameters()}
    for t in seq_lens:
        out[f"state_floats@{t}"] = m.state_size(t)
    return out


def train_cfg(sc: dict, steps: int | None = None, seed: int = 0) -> TrainConfig:
    """The training of scale ``sc`` (``steps`` overrides its step count): AdamW, weight decay 0.01, betas
    (0.9, 0.95), 10 % warm-up, clip 1."""
    return TrainConfig(
        steps=steps or sc["steps"],
        batch_size=sc["batch"],
        lr=sc["lr"],
        weight_decay=0.01,
        warmup_frac=0.1,
        clip=1.0,
        betas=(0.9, 0.95),
        eval_examples=sc["eval_n"],
        eval_batch_size=16,
        log_every=max(1, (steps or sc["steps"]) // 20),
        seed=seed,
    )
