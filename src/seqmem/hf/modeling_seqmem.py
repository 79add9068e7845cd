"""``SeqmemForCausalLM`` / ``SeqmemModel``: any seqmem model (any registered mixer or per-layer hybrid) as a
``transformers`` causal LM (and base model) with ``generate`` (greedy, sampling, beam search; batched prompts with
left padding and an ``attention_mask``), ``save_pretrained`` / ``from_pretrained`` (safetensors), gradient
checkpointing, ``output_hidden_states``, ``resize_token_embeddings`` and a :class:`SeqmemCache` that carries every
layer's mixer state, so decoding costs one recurrent step per token.

**Padding and packing.** ``attention_mask`` (0 = pad; left or right padding), ``position_ids`` (several sequences
in a row, restarting at 0, as ``transformers``' ``DataCollatorWithFlattening`` makes them) and ``cu_seqlens`` (a
batch-1 row of packed sequences) are mapped onto the mixers' packed sequences (``cu_seqlens``, see
:mod:`seqmem.mixers.base` and :func:`seqmem.models.lm.make_packing`): the real tokens of the batch are packed into one
row and every block runs once per batch, each sequence as if it were alone — no pad enters a state, no sequence
sees another.  Logits and hidden states at pads are zeros.  A mask with holes, values other than 0/1 in the mask,
or position ids that neither count up by one nor restart at 0 are refused.  The cache holds each row's state after
its last real token (after ``cu_seqlens``: one row per sequence); layer by layer the per-row states are one batched
state when their shapes agree and their integer tensors (position counters) are equal — every fixed-size recurrent
state without a position counter — so decoding stays batched; any other layer (an attention KV cache, a state with
a per-row position) keeps one state per row while the rows' lengths differ and runs those rows one at a time.
With ``use_cache`` left unset, a forward in training mode with gradients keeps no cache (so padded or packed
batches take the mixers' one-call path).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from seqmem.hf.configuration_seqmem import SeqmemConfig
from seqmem.mixers._norm import RMSNorm
from seqmem.mixers.base import State
from seqmem.models.lm import LanguageModel, Packing, check_ids, make_packing, run_blocks
from seqmem.registry import build_mixer

__all__ = ["SeqmemCache", "SeqmemForCausalLM", "SeqmemModel", "export_names", "from_run", "publish_export",
           "save_exported"]

#: A layer's cached state: one batched ``State``, or one batch-1 ``State`` per row when the rows' states cannot be
#: stacked (e.g. KV caches of different lengths after left padding).
LayerState = State | list[State]

# transformers >= 5.x names the cache ``cache`` (in forward's arguments and in the outputs), older versions
# ``past_key_values``; both are accepted and the outputs use the installed version's name
_CACHE_FIELD = "cache" if "cache" in getattr(CausalLMOutputWithPast, "__dataclass_fields__", {}) else "past_key_values"


#: Keyword arguments ``transformers`` itself may pass that carry nothing for a seqmem model: ``cache_position`` (the
#: cache counts positions itself) and an all-zero ``token_type_ids`` (a tokenizer's single segment).
_TRANSFORMERS_EXTRA = ("cache_position", "token_type_ids")


def _check_extra(model: nn.Module, kwargs: dict[str, Any], output_attentions: bool | None) -> None:
    """Unknown keyword arguments are errors (``TypeError``), never swallowed; ``output_attentions`` is refused."""
    unknown = sorted(k for k in kwargs if k not in _TRANSFORMERS_EXTRA)
    if unknown:
        raise TypeError(f"{type(model).__name__}.forward() got unexpected keyword argument(s) {unknown}")
    tt = kwargs.get("token_type_ids")
    if tt is not None and bool((tt != 0).any()):
        raise ValueError("token_type_ids: a seqmem model has one segment type; got nonzero token_type_ids")
    want = getattr(model.config, "output_attentions", False) if output_attentions is None else output_attentions
    if want:
        raise ValueError(f"output_attentions=True: {type(model).__name__} has no attention weights to return (its "
                         "mixers are recurrent memories; attention layers use fused kernels); leave it unset")


def _stack_rows(rows: list[State]) -> LayerState:
    """One batched state from per-row (batch-1) states, else the list itself.

    Rows are stacked when every key has the same shape and dtype in all rows and every integer tensor (position
    counters, lengths) is equal in all rows: a mixer may assume that the rows of a batch are at the same position
    (chunk offsets, RoPE), so rows at different positions are never put into one batch."""
    first = rows[0]
    for r in rows[1:]:
        if set(r) != set(first) or any(r[k].shape != first[k].shape or r[k].dtype != first[k].dtype for k in first):
            return rows
        if any(not first[k].is_floating_point() and not torch.equal(r[k], first[k]) for k in first):
            return rows
    if len(rows) == 1:
        return first
    return {k: torch.cat([r[k] for r in rows], 0) for k in first}


def _select_rows(st: LayerState, idx: list[int], copy: bool = False) -> LayerState:
    """Rows ``idx`` (repeats allowed) of a layer's state."""
    if isinstance(st, list):
        rows = [st[i] for i in idx]
        if copy:
            rows = [{k: v.clone() for k, v in r.items()} for r in rows]
        return _stack_rows(rows)
    out = {}
    for k, v in st.items():
        out[k] = v.index_select(0, torch.as_tensor(idx, dtype=torch.long, device=v.device))
    return out


def _layer_batch(st: LayerState) -> int:
    if isinstance(st, list):
        return len(st)
    return next(iter(st.values())).shape[0] if st else -1


class SeqmemCache(Cache):
    """Per-layer mixer states of a seqmem model (``states[i]`` is layer ``i``'s ``dict[str, Tensor]``, batch first;
    or, after a padded prompt, a list of one state per row for a layer whose rows' states differ in shape).

    For recurrent mixers the state has a fixed size, so generation memory does not grow with the length; attention
    layers keep their KV cache inside their state.  Supports beam search (:meth:`reorder_cache`) and batch expansion;
    it cannot be cropped (a recurrent state cannot forget the last tokens), so assisted decoding is unavailable.
    """

    def __init__(self, states: list[LayerState] | None = None, seq_len: int = 0) -> None:
        super().__init__(layers=[])
        self.states: list[LayerState] | None = states
        self.seq_len = int(seq_len)

    def __repr__(self) -> str:
        n = 0 if self.states is None else len(self.states)
        return f"SeqmemCache(layers={n}, seq_len={self.seq_len})"

    def __len__(self) -> int:
        return 0 if self.states is None else len(self.states)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seq_len

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1

    def _select(self, idx: list[int]) -> None:
        if self.states is not None:
            self.states = [_select_rows(st, idx, copy=True) for st in self.states]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Select batch rows ``beam_idx`` of every state (beam search)."""
        self._select([int(i) for i in beam_idx.tolist()])

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._select([i for i in range(self.batch_size) for _ in range(repeats)])

    def batch_select_indices(self, indices: Tensor) -> None:
        idx = indices.nonzero().flatten() if indices.dtype == torch.bool else indices
        self._select([int(i) for i in idx.tolist()])

    def reset(self) -> None:
        self.states, self.seq_len = None, 0

    def crop(self, tokens_to_remove: int) -> None:
        raise ValueError("a SeqmemCache holds recurrent states and cannot be cropped")

    @property
    def batch_size(self) -> int:
        if not self.states:
            return -1
        return _layer_batch(self.states[0])

    @property
    def is_compileable(self) -> bool:
        return False

    @property
    def is_initialized(self) -> bool:
        return self.states is not None

    @property
    def is_croppable(self) -> bool:
        return False

    @property
    def is_sliding(self) -> list[bool]:
        return [False] * len(self)

    @property
    def is_linear(self) -> list[bool]:
        return [False] * len(self)

    def numel(self) -> int:
        """Numbers held in the cache (all layers, all batch rows)."""
        total = 0
        for st in self.states or []:
            for r in st if isinstance(st, list) else [st]:
                total += sum(t.numel() for t in r.values())
        return total


class SeqmemPreTrainedModel(PreTrainedModel):
    config_class = SeqmemConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _is_stateful = True  # states cannot be rolled back (no assisted decoding)
    _no_split_modules = ["Block"]

    def __init__(self, config: SeqmemConfig) -> None:
        super().__init__(config)
        # set by gradient_checkpointing_enable() / activation_checkpointing_enable() (with _gradient_checkpointing_func)
        self.gradient_checkpointing = False
        # True while the constructor's post_init() runs: LanguageModel has initialised every weight already
        self._initialised_by_constructor = False
        self._init_pass = None  # see initialize_weights

    def _post_init_constructed(self) -> None:
        """``post_init()`` for a model whose :class:`LanguageModel` initialised every weight in its constructor (so
        the weights equal ``LanguageModel(cfg)``'s under the same seed); ``_init_weights`` serves the weights
        ``transformers`` creates later."""
        self._initialised_by_constructor = True
        try:
            self.post_init()
        finally:
            self._initialised_by_constructor = False

    def _init_weights(self, module: torch.nn.Module) -> None:
        """seqmem's initialisation (:class:`LanguageModel`'s) of the tensors of ``module`` that ``transformers``
        has not loaded: the weights missing from a checkpoint (``from_pretrained``, also with
        ``ignore_mismatched_sizes``) and the new rows of ``resize_token_embeddings(..., mean_resizing=False)``.

        The embedding and an untied head: normal(0, ``init_std``); the MLP: ``gate_up`` normal(0, ``init_std``),
        ``down`` normal(0, ``init_std / sqrt(2 n_layers)``); RMSNorm: ones; a mixer's tensors (its own and its
        submodules'): the values a fresh mixer of the same layer gets from its constructor.  Tensors marked loaded
        (``_is_hf_initialized``) are left as they are (``transformers.initialization``).  ``transformers`` calls
        this once per module, for the tensors the module holds itself."""
        if self._initialised_by_constructor:
            return
        std = float(self.config.init_std)
        role = self._init_roles().get(id(module))
        if role is not None and role[0] == "mixer":
            self._init_from_fresh_mixer(module, role[1], role[2])
        elif role is not None:
            init.normal_(module.weight, mean=0.0, std=role[1])
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, RMSNorm):
            init.ones_(module.weight)
        elif isinstance(module, nn.Linear):  # the head, or a new one from resize_token_embeddings
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)

    def initialize_weights(self) -> None:
        # one pass of _init_weights over the model: the roles and fresh mixers are built once for it
        self._init_pass: dict[Any, Any] | None = {}
        try:
            super().initialize_weights()
        finally:
            self._init_pass = None

    def _init_roles(self) -> dict[int, tuple]:
        """``id(module)`` → ``("mixer", layer, name in the mixer)`` for a mixer and its submodules,
        ``("normal", std)`` for the MLP's two matrices."""
        cache = getattr(self, "_init_pass", None)
        if cache is not None and "roles" in cache:
            return cache["roles"]
        roles: dict[int, tuple] = {}
        std_gate_up, std_down = self.config.to_lm_config().mlp_init_stds()  # LanguageModel's
        for i, blk in enumerate(self._parts()[1]):
            for name, sub in blk.mixer.named_modules():
                roles[id(sub)] = ("mixer", i, name)
            if blk.mlp is not None:
                roles[id(blk.mlp.gate_up)] = ("normal", std_gate_up)
                roles[id(blk.mlp.down)] = ("normal", std_down)
        if cache is not None:
            cache["roles"] = roles
        return roles

    def _init_from_fresh_mixer(self, module: nn.Module, layer: int, name: str) -> None:
        """The not-loaded tensors ``module`` holds itself, from the same module of a freshly built mixer of
        ``layer`` (its name and options from the config)."""
        own = dict(itertools.chain(module.named_parameters(recurse=False), module.named_buffers(recurse=False)))
        if all(getattr(t, "_is_hf_initialized", False) for t in own.values()):
            return
        cache = getattr(self, "_init_pass", None)
        fresh = None if cache is None else cache.get(("mixer", layer))
        if fresh is None:
            cfg = self.config.to_lm_config()
            mixer_name, options = cfg.layers()[layer]
            with torch.device("cpu"):
                fresh = build_mixer(mixer_name, cfg.d_model, **cfg.mixer_build_options(options, mixer_name))
            if cache is not None:
                cache[("mixer", layer)] = fresh
        try:
            ref = fresh.get_submodule(name)
        except AttributeError:  # a module added after construction (an adapter): not the mixer's own
            return
        reference = dict(itertools.chain(ref.named_parameters(recurse=False), ref.named_buffers(recurse=False)))
        for key, t in own.items():
            if key in reference:
                init.copy_(t, reference[key].to(device=t.device, dtype=t.dtype))

    def _return_dict(self, return_dict: bool | None) -> bool:
        """Whether forward returns an output object (else a tuple): ``return_dict`` when given, else
        ``config.return_dict`` (``transformers``' ``can_return_tuple`` rule)."""
        if return_dict is None:
            return_dict = getattr(self.config, "return_dict", True)
        return bool(return_dict)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model creates its own SeqmemCache on the first forward

    # the backbone (embeddings -> blocks -> final norm), shared by SeqmemModel and SeqmemForCausalLM
    def _parts(self) -> tuple[nn.Embedding, nn.ModuleList, nn.Module]:
        raise NotImplementedError

    def _run_block(self, blk: nn.Module, x: Tensor, st: LayerState | None, **kw: Any) -> tuple[Tensor, LayerState]:
        if isinstance(st, list) and kw.get("cu_seqlens") is None:  # rows whose states differ in shape: one at a time
            pairs = [self._run_block(blk, x[i : i + 1], s, **kw) for i, s in enumerate(st)]
            return torch.cat([p[0] for p in pairs], 0), _stack_rows([p[1] for p in pairs])
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            return self._gradient_checkpointing_func(functools.partial(blk.__call__, **kw) if kw else blk.__call__,
                                                     x, st)
        return blk(x, st, **kw)

    def _run(
        self, ids: Tensor, states: list[LayerState] | None, want_hidden: bool, packing: Packing | None = None,
        want_state: bool = True,
    ) -> tuple[Tensor, list[LayerState] | None, list[Tensor] | None]:
        """Embeddings → blocks → final norm, on token ids (batch, time) or on input embeddings (batch, time,
        d_model); with ``packing``, on the packed real tokens (every block once), the outputs unpacked (zeros at
        pads) and the states one per row."""
        embed, blocks, norm = self._parts()
        x = ids if ids.is_floating_point() else embed(ids.long())
        kw: dict[str, Any] = {}
        if packing is not None:
            x = packing.pack(x)
            kw = {"cu_seqlens": packing.cu_seqlens, "output_final_state": want_state}
        hidden = [x] if want_hidden else None
        x, new_states = run_blocks(blocks, x, states, self._run_block, hidden, **kw)
        h = norm(x)
        if hidden is not None:
            hidden[-1] = h  # the last block's output is reported after the final norm
        if packing is None:
            return h, new_states, hidden
        hidden = None if hidden is None else [packing.unpack(t) for t in hidden]
        return packing.unpack(h), [packing.row_states(s) for s in new_states] if want_state else None, hidden

    def _backbone(
        self,
        input_ids: Tensor | None,
        attention_mask: Tensor | None,
        cache: Cache | None,
        use_cache: bool | None,
        output_hidden_states: bool | None,
        inputs_embeds: Tensor | None,
        past_key_values: Cache | None,
        position_ids: Tensor | None = None,
        cu_seqlens: Tensor | None = None,
    ) -> tuple[Tensor, SeqmemCache | None, tuple[Tensor, ...] | None, Packing | None]:
        if past_key_values is not None:
            if cache is not None and cache is not past_key_values:
                raise ValueError("give cache or past_key_values, not both")
            cache = past_key_values
        embed, _, _ = self._parts()
        if inputs_embeds is not None:
            if input_ids is not None:
                raise ValueError("give input_ids or inputs_embeds, not both")
            d = embed.embedding_dim
            if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != d or not inputs_embeds.is_floating_point():
                raise ValueError(f"inputs_embeds must be a float tensor (batch, time, {d}), got "
                                 f"{tuple(inputs_embeds.shape)} {inputs_embeds.dtype}")
            input_ids = inputs_embeds  # _run embeds integer ids and takes float inputs as they are
        elif input_ids is None:
            raise ValueError("input_ids or inputs_embeds is required")
        else:
            check_ids(input_ids, embed.num_embeddings)
        B, T = input_ids.shape[:2]
        if use_cache is None:  # a cache serves decoding: not kept by default while training
            use_cache = bool(self.config.use_cache) and not (self.training and torch.is_grad_enabled())
        if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
            use_cache = False  # as in transformers' own models: states are not kept while checkpointing
        want_hidden = bool(self.config.output_hidden_states if output_hidden_states is None else output_hidden_states)
        states, seen = None, 0
        if isinstance(cache, SeqmemCache) and cache.states is not None:
            states, seen = cache.states, cache.seq_len
            if cu_seqlens is not None:
                raise ValueError("cu_seqlens starts new sequences: it cannot continue a cache (the cache after a "
                                 "packed call holds one row per sequence: continue with input_ids of that many rows)")
            if cache.batch_size != B:
                raise ValueError(f"the cache holds {cache.batch_size} rows but input_ids has {B}")
            n_layers = len(self._parts()[1])
            if len(states) != n_layers:
                raise ValueError(f"the cache holds {len(states)} layers' states but the model has {n_layers} layers "
                                 "(a cache from another model?)")
        elif cache is not None and not isinstance(cache, SeqmemCache) and cache.get_seq_length() != 0:
            raise ValueError(f"the cache must be a SeqmemCache, got {type(cache).__name__}")
        packing = make_packing((B, T), input_ids.device, attention_mask, position_ids, cu_seqlens,
                               continuing=states is not None)
        h, new_states, hidden = self._run(input_ids, states, want_hidden, packing, want_state=bool(use_cache))
        out_cache = None
        if use_cache:
            if isinstance(cache, SeqmemCache):
                out_cache = cache
                out_cache.states, out_cache.seq_len = new_states, seen + T
            else:
                out_cache = SeqmemCache(new_states, seen + T)
        return h, out_cache, tuple(hidden) if hidden is not None else None, packing


class SeqmemModel(SeqmemPreTrainedModel):
    """The backbone without the LM head (``AutoModel``): embeddings → blocks → final norm; returns
    ``last_hidden_state`` (after the final norm), the cache and, on request, ``hidden_states``.  Loads the weights
    of a saved :class:`SeqmemForCausalLM` (the head is left out)."""

    def __init__(self, config: SeqmemConfig) -> None:
        super().__init__(config)
        lm = LanguageModel(config.to_lm_config())  # same initialisation as the causal LM
        self.embed, self.blocks, self.norm = lm.embed, lm.blocks, lm.norm
        self._post_init_constructed()

    def _parts(self) -> tuple[nn.Embedding, nn.ModuleList, nn.Module]:
        return self.embed, self.blocks, self.norm

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.embed = value

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        inputs_embeds: Tensor | None = None,
        past_key_values: Cache | None = None,
        output_attentions: bool | None = None,
        position_ids: Tensor | None = None,
        cu_seqlens: Tensor | None = None,
        **kwargs: Any,
    ) -> BaseModelOutputWithPast | tuple:
        """The backbone's hidden states; arguments as :meth:`SeqmemForCausalLM.forward` (without the loss's)."""
        _check_extra(self, kwargs, output_attentions)
        h, out_cache, hidden, _ = self._backbone(input_ids, attention_mask, cache, use_cache, output_hidden_states,
                                                 inputs_embeds, past_key_values, position_ids, cu_seqlens)
        out = BaseModelOutputWithPast(last_hidden_state=h, hidden_states=hidden, **{_CACHE_FIELD: out_cache})
        return out if self._return_dict(return_dict) else out.to_tuple()


class SeqmemForCausalLM(SeqmemPreTrainedModel, GenerationMixin):
    """``transformers`` causal LM around :class:`seqmem.models.LanguageModel` (parameters under ``model.``)."""

    _tied_weights_keys = {"model.head.weight": "model.embed.weight"}
    # forward() normalises its loss by ``num_items_in_batch`` when given, so transformers' Trainer must not divide it
    # again by the gradient-accumulation steps (declared here, not inferred from ``**kwargs``)
    accepts_loss_kwargs = True

    def __init__(self, config: SeqmemConfig) -> None:
        super().__init__(config)
        self.model = LanguageModel(config.to_lm_config())
        self._post_init_constructed()

    @classmethod
    def from_language_model(cls, lm: LanguageModel, **config_kwargs: Any) -> SeqmemForCausalLM:
        """Wrap a trained :class:`LanguageModel` (weights copied) — e.g. one loaded from a ``seqmem train`` run."""
        hf = cls(SeqmemConfig.from_lm_config(lm.cfg, **config_kwargs))
        hf.model.load_state_dict(lm.state_dict())
        return hf.to(next(lm.parameters()).device)

    def _parts(self) -> tuple[nn.Embedding, nn.ModuleList, nn.Module]:
        return self.model.embed, self.model.blocks, self.model.norm

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.embed = value

    def get_output_embeddings(self) -> nn.Module:
        return self.model.head

    def set_output_embeddings(self, value: nn.Module) -> None:
        self.model.head = value

    def resize_token_embeddings(self, *args: Any, **kwargs: Any) -> nn.Embedding:
        """``transformers``' resize; the inner :class:`~seqmem.models.LMConfig` follows the new vocabulary."""
        emb = super().resize_token_embeddings(*args, **kwargs)
        n = self.model.embed.num_embeddings
        self.model.cfg = dataclasses.replace(self.model.cfg, vocab_size=n)
        self.config.vocab_size = n
        return emb

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        cache: Cache | None = None,
        labels: Tensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int | Tensor = 0,
        inputs_embeds: Tensor | None = None,
        past_key_values: Cache | None = None,
        output_attentions: bool | None = None,
        num_items_in_batch: int | Tensor | None = None,
        position_ids: Tensor | None = None,
        cu_seqlens: Tensor | None = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast | tuple:
        """Logits for ``input_ids`` (or ``inputs_embeds``, batch × time × d_model, instead) continuing the state in
        ``cache`` (a :class:`SeqmemCache`; older ``transformers`` call it ``past_key_values``, also accepted).

        ``attention_mask`` (batch, past + new): positions with 0 are skipped by every layer (see the module
        docstring); their logits are zeros.  ``position_ids`` / ``cu_seqlens``: packed sequences (the module
        docstring).  ``labels`` (same shape as ``input_ids``; -100 = ignored, so set it at padded positions) are
        shifted inside, as in every ``transformers`` causal LM; with padding or packing, a target whose predicting
        position is a pad or another sequence's last token is ignored too (no sequence sees another).  The loss is
        the mean over the scored tokens, or their sum divided by ``num_items_in_batch`` when given (what
        ``transformers.Trainer`` passes under gradient accumulation: the scored tokens of the whole accumulated
        batch, so the accumulated gradient is that of the batch's token mean).  Unknown keyword arguments raise
        ``TypeError``; ``output_attentions=True`` raises ``ValueError`` (there are no attention weights to return).
        """
        _check_extra(self, kwargs, output_attentions)
        h, out_cache, hidden, packing = self._backbone(input_ids, attention_mask, cache, use_cache,
                                                       output_hidden_states, inputs_embeds, past_key_values,
                                                       position_ids, cu_seqlens)
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            h = h[:, -logits_to_keep:]
        elif isinstance(logits_to_keep, Tensor):
            h = h[:, logits_to_keep]
        logits = self.model.head(h)
        loss = None
        if labels is not None:
            shape = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
            if labels.shape != shape:
                raise ValueError(f"labels {tuple(labels.shape)} must be (batch, time) = {tuple(shape)}")
            if logits.shape[1] != shape[1]:
                raise ValueError("labels need logits for every position (logits_to_keep=0)")
            targets = labels[:, 1:].to(logits.device)
            if packing is not None:  # no target across a pad or a sequence boundary
                targets = targets.masked_fill(~packing.continues().to(targets.device), -100)
            flat_logits = logits[:, :-1].reshape(-1, logits.shape[-1]).float()
            flat_labels = targets.reshape(-1)
            if num_items_in_batch is None:
                loss = F.cross_entropy(flat_logits, flat_labels, ignore_index=-100)
            else:
                loss = F.cross_entropy(flat_logits, flat_labels, ignore_index=-100, reduction="sum")
                if isinstance(num_items_in_batch, Tensor):
                    num_items_in_batch = num_items_in_batch.to(loss.device)
                loss = loss / num_items_in_batch
        out = CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=hidden, **{_CACHE_FIELD: out_cache})
        return out if self._return_dict(return_dict) else out.to_tuple()


def from_run(run_dir: str, **config_kwargs: Any) -> SeqmemForCausalLM:
    """The newest good checkpoint of a ``seqmem train`` run directory as a :class:`SeqmemForCausalLM`."""
    import json
    from pathlib import Path

    from seqmem.train.checkpoint import latest_good_checkpoint, load_weights
    from seqmem.train.run import build_run

    run = Path(run_dir)
    if not (run / "run.json").is_file():
        raise ValueError(f"{run} is not a training run directory (no run.json)")
    lm, _ = build_run(json.loads((run / "run.json").read_text()))
    ck = latest_good_checkpoint(run / "checkpoints")
    if ck is None:
        raise ValueError(f"no valid checkpoint under {run / 'checkpoints'}")
    load_weights(lm, ck)
    return SeqmemForCausalLM.from_language_model(lm, **config_kwargs)


#: The files an exported model carries for ``trust_remote_code=True``: they load the classes of the installed
#: ``seqmem`` package (its version's code, not a copy), so ``seqmem`` must be installed where the model is loaded.
REMOTE_CODE = {
    "configuration_seqmem.py": (
        '"""The configuration: the class of the installed seqmem package (pip install \'seqmem[hf]\')."""\n'
        "\n"
        "from seqmem.hf import SeqmemConfig\n"
        "\n"
        '__all__ = ["SeqmemConfig"]\n'
    ),
    "modeling_seqmem.py": (
        '"""A seqmem model: the classes of the installed seqmem package (pip install \'seqmem[hf]\'); importing it\n'
        'registers model_type \'seqmem\' with transformers\' auto classes, as `import seqmem.hf` does."""\n'
        "\n"
        "from seqmem.hf import SeqmemConfig, SeqmemForCausalLM, SeqmemModel\n"
        "\n"
        '__all__ = ["SeqmemConfig", "SeqmemForCausalLM", "SeqmemModel"]\n'
    ),
}
AUTO_MAP = {
    "AutoConfig": "configuration_seqmem.SeqmemConfig",
    "AutoModel": "modeling_seqmem.SeqmemModel",
    "AutoModelForCausalLM": "modeling_seqmem.SeqmemForCausalLM",
}


EXPORT_CARD = """# A seqmem model

A causal LM built with seqmem (mixer {mixer}, {layers} layers), saved by `seqmem export-hf`.  It needs the
`seqmem` package (`pip install "seqmem[hf]"`).  Load it either way:

```python
import seqmem.hf  # registers model_type "seqmem" with transformers' auto classes
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained("THIS_DIRECTORY")
```

or, without the import, `AutoModelForCausalLM.from_pretrained("THIS_DIRECTORY", trust_remote_code=True)`: the two
`.py` files here only import the installed seqmem's classes.

The tokenizer alone (when there is one) needs no code: without the import, load it with
`AutoTokenizer.from_pretrained("THIS_DIRECTORY", trust_remote_code=False)` or
`PreTrainedTokenizerFast.from_pretrained("THIS_DIRECTORY")`.  A plain `AutoTokenizer.from_pretrained` reads
`config.json` first, finds its `auto_map` and asks on a terminal whether to run the code here.
"""


def save_exported(model: SeqmemPreTrainedModel, out: str) -> None:
    """``model.save_pretrained(out)`` plus ``auto_map`` in ``config.json`` and the two files it names, so that
    ``AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)`` loads it in a process that never imported
    ``seqmem.hf`` (``seqmem`` installed; without ``trust_remote_code``, ``import seqmem.hf`` first).  The two files
    and the ``README.md`` card (written only where none exists) replace a link rather than write through it.
    ``seqmem export-hf`` builds the whole export in a fresh directory and moves it in (:func:`publish_export`)."""
    import os

    from seqmem.io import atomic_write_text

    model.config.auto_map = dict(AUTO_MAP)
    model.save_pretrained(str(out))
    for name, text in REMOTE_CODE.items():
        atomic_write_text(Path(out) / name, text)
    card = Path(out) / "README.md"
    if not os.path.lexists(card):  # what transformers' refusal points the user to ("inspect the repository content")
        atomic_write_text(card, EXPORT_CARD.format(mixer=model.config.mixer, layers=model.config.n_layers))


#: The files an export may hold (``save_pretrained``, a tokenizer's ``save_pretrained``, :func:`save_exported`):
#: what ``seqmem export-hf`` refuses to overwrite without ``--overwrite``, and removes first with it.
EXPORT_FILES = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
                "pytorch_model.bin", "pytorch_model.bin.index.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "tokenizer.model",
                "chat_template.jinja", "chat_template.json", *REMOTE_CODE, "README.md")
EXPORT_PATTERNS = ("model-*-of-*.safetensors", "pytorch_model-*-of-*.bin")


def export_names(directory: str | Path) -> list[str]:
    """The names in ``directory`` (files or links, not followed) that an export writes (:data:`EXPORT_FILES`, weight
    shards); ``[]`` for a missing directory."""
    import fnmatch
    import os

    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n in EXPORT_FILES or any(fnmatch.fnmatch(n, p) for p in EXPORT_PATTERNS))


def publish_export(built: str | Path, out: str | Path, replace: bool = False) -> None:
    """Move the export in directory ``built`` (a fresh directory on the same file system, e.g. a
    ``tempfile.mkdtemp(dir=out)``) into ``out``, file by file with ``os.replace``: a link planted in ``out`` under an
    export file's name is replaced, never written through, and every file gets the umask's mode.

    ``out`` must hold no export yet (:func:`export_names` other than a ``README.md``, which is then kept: a model
    card written there), else ``FileExistsError``; with ``replace``, the export files in ``out`` are removed first,
    ``config.json`` before the others, and the new ``config.json`` comes last, so an interrupted move never leaves a
    ``config.json`` next to weights or files of another export.  Other files in ``out`` stay."""
    import os

    from seqmem.io import file_mode

    built, out = Path(built), Path(out)
    names = sorted(os.listdir(built))
    for n in names:
        if (built / n).is_symlink() or not (built / n).is_file():
            raise ValueError(f"export: {built / n} is not a file")
        os.chmod(built / n, file_mode())  # safetensors and mkstemp write 0600
    old = export_names(out)
    keep_card = False
    if replace:
        for n in sorted(old, key=lambda n: n != "config.json"):
            os.unlink(out / n)  # a link is removed, not followed
    else:
        held = [n for n in old if n != "README.md"]
        if held:
            raise FileExistsError(f"{out} already holds an exported model ({', '.join(held)})")
        keep_card = "README.md" in old
    for n in sorted(names, key=lambda n: n == "config.json"):
        if n == "README.md" and keep_card:
            continue
        os.replace(built / n, out / n)
