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
from seqmem.mixers.base import (
    State,
    check_cu_seqlens,
    check_fields,
    check_positive_float,
    check_positive_int,
    split_states,
    stack_states,
)
from seqmem.ops._common import check_action_mask
from seqmem.registry import build_mixer, get_entry


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
        per_layer = isinstance(self.mixer_options, list)
        for i, opts in enumerate(self.mixer_options if per_layer else [self.mixer_options]):
            where = f"mixer_options[{i}]" if per_layer else "mixer_options"
            if not isinstance(opts, dict):
                raise ValueError(f"{where} must be a dict of mixer options, got {opts!r}")
            # the model sets every layer's width and heads: a mixer option for them would fail (d_model) or build
            # a layer that differs from the configuration recorded (n_heads)
            if "d_model" in opts:
                raise ValueError(f"{where}: d_model={opts['d_model']!r} is not a mixer option: every layer has the "
                                 f"model's width (d_model={self.d_model})")
            if "n_heads" in opts and opts["n_heads"] != self.n_heads:
                raise ValueError(f"{where}: n_heads={opts['n_heads']!r} and the model's n_heads={self.n_heads} "
                                 "disagree (the model's n_heads, seqmem train --heads, sets every layer's heads); "
                                 "give one of them")

    def mixer_build_options(self, options: dict[str, Any], mixer: str | None = None) -> dict[str, Any]:
        """A layer's options as its mixer is built with them: the model's ``n_heads`` unless they give it, or give
        the option that sets the heads of ``mixer`` itself (:attr:`~seqmem.mixers.base.Mixer.head_dim_option`:
        Mamba2's ``headdim``, whose heads split ``expand·d_model``, not ``d_model``)."""
        if mixer is not None:
            own = get_entry(mixer).cls.head_dim_option
            if own is not None and options.get(own) is not None:
                return dict(options)
        return {"n_heads": self.n_heads, **options}

    def mlp_init_stds(self) -> tuple[float, float]:
        """The normal std of the SwiGLU's ``gate_up`` and ``down`` weights (``down``'s scaled by 1/sqrt(2 n_layers))."""
        return self.init_std, self.init_std / math.sqrt(2 * self.n_layers)

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
        self.norm1 = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mixer = build_mixer(mixer_name, cfg.d_model, **cfg.mixer_build_options(options, mixer_name))
        if cfg.mlp_ratio > 0:
            hidden = 8 * math.ceil(cfg.mlp_ratio * cfg.d_model * 2 / 3 / 8)
            self.norm2 = RMSNorm(cfg.d_model, cfg.norm_eps)
            self.mlp = SwiGLU(cfg.d_model, hidden)
        else:
            self.norm2 = self.mlp = None

    def forward(
        self, x: Tensor, state: State | list[State] | None, keep: Tensor | None = None, *,
        cu_seqlens: Tensor | None = None, output_final_state: bool = True, action_mask: Tensor | None = None,
    ) -> tuple[Tensor, State | list[State] | None]:
        """``keep`` (batch, time) bool, optional: after the mixer (which sees every position) only those positions go
        on, flattened to (N, d_model) in row-major order; the MLP is per position, so they equal the full output's
        ``[keep]`` rows.  ``cu_seqlens`` / ``output_final_state``: packed sequences, passed to the mixer (see
        :mod:`seqmem.mixers.base`).  ``action_mask`` (batch, time) 0/1: passed to a mixer that takes one
        (:attr:`~seqmem.mixers.base.Mixer.takes_action_mask`, SKA); other mixers do not use it."""
        if action_mask is not None and self.mixer.takes_action_mask:
            y, state = self.mixer(self.norm1(x), state, output_final_state=output_final_state,
                                  action_mask=action_mask)
        elif cu_seqlens is None and output_final_state:
            y, state = self.mixer(self.norm1(x), state)
        else:
            y, state = self.mixer(self.norm1(x), state, cu_seqlens=cu_seqlens, output_final_state=output_final_state)
        x = x + y
        if keep is not None:
            x = x[keep]
        if self.mlp is not None:
            x = x + self.mlp(self.norm2(x))
        return x, state


def run_blocks(
    blocks: Iterable[nn.Module], x: Tensor, state: list[Any] | None,
    run_block: Callable[..., tuple[Tensor, Any]] | None = None,
    outputs: list[Tensor] | None = None, **block_kwargs: Any,
) -> tuple[Tensor, list[Any]]:
    """``x`` through ``blocks`` in order, block ``i`` with ``state[i]`` (``state`` None: fresh states); returns the
    last output and the new per-layer states.  ``run_block(blk, x, st, **block_kwargs)`` replaces
    ``blk(x, st, **block_kwargs)``; ``outputs``, if given, receives every block's output."""
    new_state = []
    for i, blk in enumerate(blocks):
        st = None if state is None else state[i]
        x, st = blk(x, st, **block_kwargs) if run_block is None else run_block(blk, x, st, **block_kwargs)
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
    lo, hi = torch.stack(torch.aminmax(input_ids)).tolist()  # one read of the device
    if lo < 0 or hi >= vocab_size:
        raise ValueError(f"token ids must lie in [0, {vocab_size}), got range [{lo}, {hi}]")


@dataclass
class Packing:
    """Where the real tokens of a ``(batch, time)`` grid go when packed into one row of sequences (the mixers'
    ``cu_seqlens``, see :mod:`seqmem.mixers.base`); built by :func:`make_packing`.

    ``index``: the flat positions ``b·time + t`` of the packed tokens, row by row; ``cu_seqlens``: the sequence
    boundaries along them; ``seq_rows``: the row of each sequence.  ``per_sequence``: the states returned are one per
    sequence (an explicit ``cu_seqlens``), else one per row (the state after the row's last sequence, which a later
    call continues)."""

    shape: tuple[int, int]
    index: Tensor
    cu_seqlens: Tensor
    seq_rows: list[int]
    per_sequence: bool = False

    def pack(self, x: Tensor) -> Tensor:
        """``(batch, time, ...)`` → ``(1, n, ...)``: the real tokens, sequence after sequence."""
        return x.reshape(self.shape[0] * self.shape[1], *x.shape[2:]).index_select(0, self.index)[None]

    def unpack(self, y: Tensor) -> Tensor:
        """``(1, n, ...)`` → ``(batch, time, ...)`` with zeros at the positions that were not packed."""
        flat = y.new_zeros((self.shape[0] * self.shape[1], *y.shape[2:])).index_copy(0, self.index, y[0])
        return flat.view(*self.shape, *y.shape[2:])

    def continues(self) -> Tensor:
        """(batch, time - 1) bool: whether position ``t + 1`` continues the sequence of position ``t`` (False where
        either is a pad or a new sequence starts): the next-token targets a loss may count."""
        B, T = self.shape
        seq = torch.searchsorted(self.cu_seqlens, torch.arange(self.index.numel(), device=self.index.device),
                                 right=True) - 1
        sid = torch.full((B * T,), -1, dtype=torch.long, device=self.index.device).index_copy(0, self.index, seq)
        sid = sid.view(B, T)
        return (sid[:, 1:] == sid[:, :-1]) & (sid[:, :-1] >= 0)

    def row_states(self, st: State | list[State] | None) -> State | list[State] | None:
        """Per-sequence states → per-row states (each row's last sequence): one batched state where they stack."""
        if st is None or self.per_sequence or self.seq_rows == list(range(self.shape[0])):
            return st
        per = split_states(st, len(self.seq_rows))
        last = {row: i for i, row in enumerate(self.seq_rows)}
        return stack_states([per[last[r]] for r in range(self.shape[0])])


def _after(keep: Tensor) -> Tensor:
    """``keep`` shifted one column right (False in the first): whether the previous position is kept."""
    return torch.cat([torch.zeros_like(keep[:, :1]), keep[:, :-1]], 1)


def make_packing(
    shape: tuple[int, int], device: torch.device, attention_mask: Tensor | None = None,
    position_ids: Tensor | None = None, cu_seqlens: Tensor | None = None, continuing: bool = False,
) -> Packing | None:
    """The :class:`Packing` of a batch of ``shape`` (batch, time) from the usual ways of marking its sequences, or
    ``None`` when every row is one whole sequence (nothing to pack).

    * ``attention_mask`` (batch, time; when continuing a state, (batch, >= time) with the new tokens in its last
      ``time`` columns): 1 for a real token, 0 for a pad.  Left padding, right padding or both; the real tokens of
      a row must be one run (a mask with holes is refused), and every row needs at least one.  Values other than 0
      and 1 are refused.
    * ``position_ids`` (batch or 1, time): as from ``transformers``' ``DataCollatorWithFlattening``: a new sequence
      starts wherever it is 0, and counts up by one inside a sequence (anything else is refused).
    * ``cu_seqlens``: the sequences of a batch-1 row, given directly (see :mod:`seqmem.mixers.base`); the states
      are then one per sequence.

    ``continuing``: the call continues a state (a cache), one sequence per row: a row that holds several
    sequences, or whose first token restarts at position 0, is refused."""
    B, T = shape
    if attention_mask is not None:
        if not isinstance(attention_mask, Tensor) or attention_mask.dim() != 2 or attention_mask.shape[0] != B \
                or attention_mask.shape[1] < T:
            raise ValueError(f"attention_mask must be (batch, >= time) = ({B}, >= {T}) zeros and ones, got "
                             f"{tuple(getattr(attention_mask, 'shape', ()))}")
        if not continuing and attention_mask.shape[1] != T:
            raise ValueError(f"attention_mask has {attention_mask.shape[1]} columns for {T} tokens and no state to "
                             "continue: columns before the new tokens describe a cached past, so without one the "
                             f"mask must be (batch, time) = ({B}, {T})")
        bad = attention_mask[(attention_mask != 0) & (attention_mask != 1)]
        if bad.numel():
            raise ValueError(f"attention_mask must hold only 0 (a pad) and 1 (a real token), got "
                             f"{sorted(set(bad.unique().tolist()))[:5]}")
    if cu_seqlens is not None:
        if position_ids is not None:
            raise ValueError("give position_ids or cu_seqlens, not both")
        if B != 1:
            raise ValueError(f"cu_seqlens packs the sequences into one row: input_ids must have batch 1, got {B}")
        if attention_mask is not None and not bool((attention_mask[:, -T:] != 0).all()):
            raise ValueError("attention_mask with pads cannot be combined with cu_seqlens: pack the real tokens only")
        bounds = check_cu_seqlens(cu_seqlens, T)
        return Packing(shape, torch.arange(T, device=device), torch.tensor(bounds, device=device),
                       [0] * (len(bounds) - 1), per_sequence=True)
    keep = None
    if attention_mask is not None:
        keep = attention_mask[:, -T:].to(device) != 0  # the columns of the new tokens
        counts = keep.sum(1)
        if bool((counts == 0).any()):
            raise ValueError(f"attention_mask row {int((counts == 0).nonzero()[0])} has no 1 among the {T} new "
                             "positions: every row needs at least one real token")
        runs = (keep & ~_after(keep)).sum(1)
        if bool((runs > 1).any()):
            row = int((runs > 1).nonzero()[0])
            raise ValueError(f"attention_mask row {row} has pads between real tokens ({keep[row].int().tolist()}); "
                             "only left or right padding is supported (the real tokens of a row in one run)")
    kept = keep if keep is not None else torch.ones(B, T, dtype=torch.bool, device=device)
    after_kept = kept & _after(kept)  # a kept token right after a kept token
    restart = None
    if position_ids is not None:
        if not isinstance(position_ids, Tensor) or position_ids.dim() != 2 or position_ids.shape[1] != T \
                or position_ids.shape[0] not in (1, B) or position_ids.is_floating_point():
            raise ValueError(f"position_ids must be integer positions shaped (batch, time) = ({B}, {T}) (or (1, {T})), "
                             f"got {getattr(position_ids, 'dtype', type(position_ids).__name__)} "
                             f"{tuple(getattr(position_ids, 'shape', ()))}")
        pid = position_ids.to(device).expand(B, T)
        zero = (pid == 0) & kept
        steps = pid[:, 1:] - pid[:, :-1] == 1
        bad = after_kept[:, 1:] & ~zero[:, 1:] & ~steps
        if bool(bad.any()):
            r, t = (int(v) for v in bad.nonzero()[0])
            raise ValueError(f"position_ids must count up by one inside a sequence and restart at 0 for a new one; "
                             f"row {r} goes from {int(pid[r, t])} to {int(pid[r, t + 1])}")
        restart = zero & after_kept  # a sequence starting after another inside the row
        if continuing:
            if bool(restart.any()):
                raise ValueError("position_ids pack several sequences into a row, which cannot continue a cache: "
                                 "continue one sequence per row")
            first = kept & ~after_kept
            if bool((zero & first).any()):
                r = int((zero & first).nonzero()[0, 0])
                raise ValueError(f"position_ids of row {r} restart at 0 although a state (cache) continues it: "
                                 "drop the cache to start new sequences")
        if not bool(restart.any()):
            restart = None
    if keep is None and restart is None:
        return None
    index = kept.flatten().nonzero().flatten()
    starts = (kept & ~after_kept) if restart is None else (kept & ~after_kept) | restart
    where = starts.flatten().index_select(0, index).nonzero().flatten()
    bounds = where.tolist() + [index.numel()]
    seq_rows = (index.index_select(0, where) // T).tolist()
    return Packing(shape, index, torch.tensor(bounds, device=device), seq_rows)


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
        std_gate_up, std_down = cfg.mlp_init_stds()
        for blk in self.blocks:
            if blk.mlp is not None:
                nn.init.normal_(blk.mlp.gate_up.weight, std=std_gate_up)
                nn.init.normal_(blk.mlp.down.weight, std=std_down)
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
        self, input_ids: Tensor, state: list[State] | None = None, positions: Tensor | None = None, *,
        attention_mask: Tensor | None = None, position_ids: Tensor | None = None, cu_seqlens: Tensor | None = None,
        output_final_state: bool = True, action_mask: Tensor | None = None,
    ) -> tuple[Tensor, list[State] | None]:
        """``logits (batch, time, vocab), state``.

        ``positions`` (batch, time) bool, optional: the logits of those positions only, ``(N, vocab)`` in row-major
        order — equal to the full call's ``logits[positions]`` — with the last block's MLP, the final norm and the
        head evaluated there alone (every layer's mixer still reads every position, and the state is the same).
        A task scored at a few positions (recall, copying) trains at a fraction of the head's cost.

        Padding and packing (:func:`make_packing`): ``attention_mask`` (0 = pad, left or right), ``position_ids``
        (several sequences in a row, restarting at 0) or ``cu_seqlens`` (a batch-1 row of packed sequences) run
        every row's sequences as if each were alone, in one call of every block: no pad enters a state and no
        sequence sees another.  Logits at pads are zeros; the state is each row's, after its last real token (with
        ``cu_seqlens``: each sequence's); a later call continues it with or without an ``attention_mask``.
        ``output_final_state=False`` returns ``None`` as the state (cheaper with padding or packing: see
        :meth:`seqmem.mixers.base.Mixer._forward_varlen`).

        ``action_mask`` (batch, time) in {0, 1}, optional: the tokens allowed into the memory of the layers that take
        an action mask (SKA: Echo App. F eq. 53, the oracle "fact-bearing" tokens of App. G.1 / H.1); every other
        layer reads every token as without it.  A model with no such layer refuses it, and so do padding and
        packing.  With a ``state``, the mask covers this call's tokens only (split it as the input is split)."""
        check_ids(input_ids, self.cfg.vocab_size)
        if action_mask is not None:
            if not any(blk.mixer.takes_action_mask for blk in self.blocks):
                names = [getattr(blk.mixer, "registered_name", type(blk.mixer).__name__) for blk in self.blocks]
                raise ValueError("action_mask: no layer of this model takes an action mask (only SKA layers use "
                                 f"one); its layers are {names}")
            if attention_mask is not None or position_ids is not None or cu_seqlens is not None:
                raise ValueError("action_mask cannot be combined with attention_mask, position_ids or cu_seqlens "
                                 "(padding or packing)")
            # checked once here, then handed on as bool: the layers' and ops' checks of a bool mask read nothing
            action_mask = check_action_mask(action_mask, tuple(input_ids.shape), input_ids.device,
                                            "LanguageModel").bool()
        if state is not None and (not isinstance(state, list) or len(state) != len(self.blocks)):
            raise ValueError(f"state must be the list of {len(self.blocks)} per-layer states returned by the model")
        if positions is not None and (not isinstance(positions, Tensor) or positions.dtype != torch.bool
                                      or positions.shape != input_ids.shape):
            raise ValueError(
                f"positions must be a bool tensor shaped like input_ids {tuple(input_ids.shape)}, got "
                f"{getattr(positions, 'dtype', type(positions).__name__)} {tuple(getattr(positions, 'shape', ()))}"
            )
        x = self.embed(input_ids.long())
        if attention_mask is None and position_ids is None and cu_seqlens is None and state is not None \
                and any(isinstance(s, list) for s in state):
            # rows continued from a padded call whose states could not be batched (KV caches of different
            # lengths, rows at different positions): each row as one sequence of a packed call, which takes them
            if action_mask is not None:
                raise ValueError("action_mask cannot continue the per-row states of a padded call (padding and "
                                 "action_mask do not combine): continue without it, or run the rows one at a time")
            attention_mask = torch.ones(input_ids.shape, dtype=torch.long, device=input_ids.device)
        packing = make_packing(tuple(input_ids.shape), x.device, attention_mask, position_ids, cu_seqlens,
                               continuing=state is not None)
        if packing is not None:
            x, new_state = run_blocks(self.blocks, packing.pack(x), state, cu_seqlens=packing.cu_seqlens,
                                      output_final_state=output_final_state)
            logits = packing.unpack(self.head(self.norm(x)))
            if positions is not None:
                logits = logits[positions.to(x.device)]
            return logits, ([packing.row_states(s) for s in new_state] if output_final_state else None)
        am = {} if action_mask is None else {"action_mask": action_mask}
        if positions is None:
            x, new_state = run_blocks(self.blocks, x, state, output_final_state=output_final_state, **am)
            return self.head(self.norm(x)), (new_state if output_final_state else None)
        positions = positions.to(x.device)
        x, new_state = run_blocks(self.blocks[:-1], x, None if state is None else state[:-1],
                                  output_final_state=output_final_state, **am)
        x, last = self.blocks[-1](x, None if state is None else state[-1], keep=positions,
                                  output_final_state=output_final_state, **am)
        return self.head(self.norm(x)), (new_state + [last] if output_final_state else None)

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
        temperature = check_positive_float("temperature", temperature, allow_zero=True)  # finite, >= 0, not a bool
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
