"""Language-model backbone: embeddings → pre-norm blocks (RMSNorm → mixer → residual → RMSNorm → SwiGLU →
residual) → final RMSNorm → (tied) head.  One mixer per layer, so hybrids are a list of names."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqmem.mixers._norm import RMSNorm
from seqmem.mixers.base import State, check_fields, check_positive_int
from seqmem.registry import build_mixer


@dataclass
class LMConfig:
    vocab_size: int = 256
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    #: one mixer name for every layer, or one name per layer (hybrids), e.g. ["mamba2", "mamba2", "attention"]
    mixer: str | list[str] = "attention"
    #: options for every layer's mixer, or one dict per layer
    mixer_options: dict[str, Any] | list[dict[str, Any]] = field(default_factory=dict)
    #: SwiGLU hidden width = mlp_ratio·d_model·2/3 rounded up to a multiple of 8 (LLaMA); 0 = no MLP (Mamba-2 stack)
    mlp_ratio: float = 4.0
    tie_embeddings: bool = True
    norm_eps: float = 1e-5
    init_std: float = 0.02

    def __post_init__(self) -> None:
        check_fields(self, {"mlp_ratio": ">=0", "norm_eps": ">0", "init_std": ">0"})  # types, NaN/Inf, domains
        for k in ("vocab_size", "d_model", "n_layers", "n_heads"):
            check_positive_int(k, getattr(self, k))
        if isinstance(self.mixer, (list, tuple)):
            if len(self.mixer) != self.n_layers:
                raise ValueError(f"mixer lists {len(self.mixer)} layers but n_layers={self.n_layers}")
            self.mixer = list(self.mixer)
        elif not isinstance(self.mixer, str):
            raise ValueError(f"mixer must be a name or a list of names, got {self.mixer!r}")
        if isinstance(self.mixer_options, (list, tuple)):
            if len(self.mixer_options) != self.n_layers:
                raise ValueError(
                    f"mixer_options lists {len(self.mixer_options)} layers but n_layers={self.n_layers}"
                )
            self.mixer_options = [dict(o) for o in self.mixer_options]
        elif not isinstance(self.mixer_options, dict):
            raise ValueError("mixer_options must be a dict or a list of dicts (one per layer)")

    def layers(self) -> list[tuple[str, dict[str, Any]]]:
        names = self.mixer if isinstance(self.mixer, list) else [self.mixer] * self.n_layers
        opts = self.mixer_options if isinstance(self.mixer_options, list) else [self.mixer_options] * self.n_layers
        return list(zip(names, opts))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LMConfig:
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"LMConfig got unknown field(s) {sorted(unknown)}; valid: {sorted(known)}")
        return cls(**d)


class SwiGLU(nn.Module):
    def __init__(self, d: int, hidden: int) -> None:
        super().__init__()
        self.gate_up = nn.Linear(d, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        g, u = self.gate_up(x).chunk(2, -1)
        return self.down(F.silu(g) * u)


class Block(nn.Module):
    def __init__(self, cfg: LMConfig, mixer_name: str, options: dict[str, Any]) -> None:
        super().__init__()
        opts = {"n_heads": cfg.n_heads, **options}
        self.norm1 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mixer = build_mixer(mixer_name, cfg.d_model, **opts)
        if cfg.mlp_ratio > 0:
            hidden = 8 * math.ceil(cfg.mlp_ratio * cfg.d_model * 2 / 3 / 8)
            self.norm2 = RMSNorm(cfg.d_model, cfg.norm_eps)
            self.mlp = SwiGLU(cfg.d_model, hidden)
        else:
            self.norm2 = self.mlp = None

    def forward(self, x: Tensor, state: State | None, keep: Tensor | None = None) -> tuple[Tensor, State]:
        """``keep`` (batch, time) bool, optional: after the mixer (which sees every position) only those positions go
        on, flattened to (N, d_model) in row-major order; the MLP is per position, so they equal the full output's
        ``[keep]`` rows."""
        y, state = self.mixer(self.norm1(x), state)
        x = x + y
        if keep is not None:
            x = x[keep]
        if self.mlp is not None:
            x = x + self.mlp(self.norm2(x))
        return x, state


def run_blocks(
    blocks: Iterable[nn.Module], x: Tensor, state: list[Any] | None,
    run_block: Callable[[nn.Module, Tensor, Any], tuple[Tensor, Any]] | None = None,
    outputs: list[Tensor] | None = None,
) -> tuple[Tensor, list[Any]]:
    """``x`` through ``blocks`` in order, block ``i`` with ``state[i]`` (``state`` None: fresh states); returns the
    last output and the new per-layer states.  ``run_block(blk, x, st)`` replaces ``blk(x, st)``; ``outputs``, if
    given, receives every block's output."""
    new_state = []
    for i, blk in enumerate(blocks):
        st = None if state is None else state[i]
        x, st = blk(x, st) if run_block is None else run_block(blk, x, st)
        new_state.append(st)
        if outputs is not None:
            outputs.append(x)
    return x, new_state


def check_ids(input_ids: Tensor, vocab_size: int) -> None:
    """Raise unless ``input_ids`` is a non-empty ``(batch, time)`` integer tensor of ids in ``[0, vocab_size)``.

    Inside ``torch.compile`` only the shape and dtype are checked (they are static); the caller checks the range."""
    if not isinstance(input_ids, Tensor) or input_ids.dim() != 2:
        raise ValueError(f"input_ids must be a (batch, time) tensor, got {getattr(input_ids, 'shape', input_ids)}")
    if input_ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"input_ids must be integer token ids, got dtype {input_ids.dtype}")
    if input_ids.numel() == 0:
        raise ValueError(f"input_ids is empty (shape {tuple(input_ids.shape)})")
    if torch.compiler.is_compiling():
        # The range is data-dependent: reading it would break the compiled graph and sync with the device every
        # call. A compiled training step checks its batch on the host before the call (seqmem.train.loop.train).
        return
    lo, hi = int(input_ids.min()), int(input_ids.max())
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"token ids must lie in [0, {vocab_size}), got range [{lo}, {hi}]")


class LanguageModel(nn.Module):
    """Causal LM over any registered mixer(s): ``logits, state = model(input_ids, state)``."""

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, name, opts) for name, opts in cfg.layers())
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        nn.init.normal_(self.embed.weight, std=cfg.init_std)
        for blk in self.blocks:
            if blk.mlp is not None:
                nn.init.normal_(blk.mlp.gate_up.weight, std=cfg.init_std)
                nn.init.normal_(blk.mlp.down.weight, std=cfg.init_std / math.sqrt(2 * cfg.n_layers))
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight
        else:
            nn.init.normal_(self.head.weight, std=cfg.init_std)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def state_size(self, seq_len: int) -> int:
        """Numbers per sequence held in the recurrent state (all layers) after ``seq_len`` tokens."""
        return sum(blk.mixer.state_size(seq_len) for blk in self.blocks)

    def forward(
        self, input_ids: Tensor, state: list[State] | None = None, positions: Tensor | None = None,
    ) -> tuple[Tensor, list[State]]:
        """``logits (batch, time, vocab), state``.

        ``positions`` (batch, time) bool, optional: the logits of those positions only, ``(N, vocab)`` in row-major
        order — equal to the full call's ``logits[positions]`` — with the last block's MLP, the final norm and the
        head evaluated there alone (every layer's mixer still reads every position, and the state is the same).
        A task scored at a few positions (recall, copying) trains at a fraction of the head's cost."""
        check_ids(input_ids, self.cfg.vocab_size)
        if state is not None and (not isinstance(state, list) or len(state) != len(self.blocks)):
            raise ValueError(f"state must be the list of {len(self.blocks)} per-layer states returned by the model")
        x = self.embed(input_ids.long())
        if positions is None:
            x, new_state = run_blocks(self.blocks, x, state)
            return self.head(self.norm(x)), new_state
        if not isinstance(positions, Tensor) or positions.dtype != torch.bool or positions.shape != input_ids.shape:
            raise ValueError(
                f"positions must be a bool tensor shaped like input_ids {tuple(input_ids.shape)}, got "
                f"{getattr(positions, 'dtype', type(positions).__name__)} {tuple(getattr(positions, 'shape', ()))}"
            )
        positions = positions.to(x.device)
        x, new_state = run_blocks(self.blocks[:-1], x, None if state is None else state[:-1])
        x, last = self.blocks[-1](x, None if state is None else state[-1], keep=positions)
        return self.head(self.norm(x)), new_state + [last]

    @torch.no_grad()
    def generate(
        self,
        input_ids: Tensor,
        max_new_tokens: int,
        temperature: float = 0.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
        use_state: bool = True,
    ) -> Tensor:
        """Extend ``input_ids`` by ``max_new_tokens`` tokens: greedy (temperature 0) or sampled (top-k optional).

        With ``use_state`` the prompt is read once and each new token costs one step of every mixer (streaming);
        without it the whole prefix is recomputed each step (a slow reference; equal outputs).
        """
        check_positive_int("max_new_tokens", max_new_tokens)
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if top_k is not None:
            check_positive_int("top_k", top_k)
        ids = input_ids
        logits, state = self(ids)
        out = [ids]
        for i in range(max_new_tokens):
            nxt = _pick(logits[:, -1], temperature, top_k, generator)
            out.append(nxt)
            if i == max_new_tokens - 1:
                break
            if use_state:
                logits, state = self(nxt, state)
            else:
                logits, _ = self(torch.cat(out, 1))
        return torch.cat(out, 1)


def _pick(logits: Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None) -> Tensor:
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, -1)
    return torch.multinomial(probs, 1, generator=generator)
