"""``SeqmemForCausalLM``: any seqmem model (any registered mixer or per-layer hybrid) as a ``transformers`` causal LM
with ``generate`` (greedy, sampling, beam search), ``save_pretrained`` / ``from_pretrained`` (safetensors) and a
:class:`SeqmemCache` that carries every layer's mixer state, so decoding costs one recurrent step per token."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.modeling_outputs import CausalLMOutputWithPast

from seqmem.hf.configuration_seqmem import SeqmemConfig
from seqmem.mixers.base import State
from seqmem.models.lm import LanguageModel

__all__ = ["SeqmemCache", "SeqmemForCausalLM", "from_run"]


class SeqmemCache(Cache):
    """Per-layer mixer states of a seqmem model (``states[i]`` is layer ``i``'s ``dict[str, Tensor]``, batch first).

    For recurrent mixers the state has a fixed size, so generation memory does not grow with the length; attention
    layers keep their KV cache inside their state.  Supports beam search (:meth:`reorder_cache`) and batch expansion;
    it cannot be cropped (a recurrent state cannot forget the last tokens), so assisted decoding is unavailable.
    """

    def __init__(self, states: list[State] | None = None, seq_len: int = 0) -> None:
        super().__init__(layers=[])
        self.states: list[State] | None = states
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

    def _map(self, fn) -> None:
        if self.states is not None:
            self.states = [{k: fn(v) for k, v in st.items()} for st in self.states]

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Select batch rows ``beam_idx`` of every state tensor (beam search)."""
        self._map(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: Tensor) -> None:
        self._map(lambda t: t[indices.to(t.device)])

    def reset(self) -> None:
        self.states, self.seq_len = None, 0

    def crop(self, tokens_to_remove: int) -> None:
        raise ValueError("a SeqmemCache holds recurrent states and cannot be cropped")

    @property
    def batch_size(self) -> int:
        if not self.states:
            return -1
        return next(iter(self.states[0].values())).shape[0] if self.states[0] else -1

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
        return sum(t.numel() for st in self.states or [] for t in st.values())


class SeqmemPreTrainedModel(PreTrainedModel):
    config_class = SeqmemConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = False
    _is_stateful = True  # states cannot be rolled back (no assisted decoding)
    _no_split_modules = ["Block"]

    def _init_weights(self, module: torch.nn.Module) -> None:
        # LanguageModel initialises itself (and each mixer its own parameters) in its constructor
        pass

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model creates its own SeqmemCache on the first forward


class SeqmemForCausalLM(SeqmemPreTrainedModel, GenerationMixin):
    """``transformers`` causal LM around :class:`seqmem.models.LanguageModel` (parameters under ``model.``)."""

    _tied_weights_keys = {"model.head.weight": "model.embed.weight"}

    def __init__(self, config: SeqmemConfig) -> None:
        super().__init__(config)
        self.model = LanguageModel(config.to_lm_config())
        self.post_init()

    @classmethod
    def from_language_model(cls, lm: LanguageModel, **config_kwargs: Any) -> SeqmemForCausalLM:
        """Wrap a trained :class:`LanguageModel` (weights copied) — e.g. one loaded from a ``seqmem train`` run."""
        hf = cls(SeqmemConfig.from_lm_config(lm.cfg, **config_kwargs))
        hf.model.load_state_dict(lm.state_dict())
        return hf.to(next(lm.parameters()).device)

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.embed

    def set_input_embeddings(self, value: torch.nn.Module) -> None:
        self.model.embed = value

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.model.head

    def set_output_embeddings(self, value: torch.nn.Module) -> None:
        self.model.head = value

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        past_key_values: Cache | None = None,
        labels: Tensor | None = None,
        use_cache: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int | Tensor = 0,
        inputs_embeds: Tensor | None = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast | tuple:
        """Logits for ``input_ids`` continuing the state in ``past_key_values`` (a :class:`SeqmemCache`).

        ``labels`` (same shape as ``input_ids``; -100 = ignored) are shifted inside, as in every ``transformers``
        causal LM.  ``attention_mask`` may only be all ones: padding inside a recurrent state is not supported.
        """
        if inputs_embeds is not None:
            raise ValueError("SeqmemForCausalLM takes input_ids, not inputs_embeds")
        if input_ids is None:
            raise ValueError("input_ids is required")
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            raise ValueError(
                "attention_mask has zeros: padded batches are not supported by recurrent seqmem states; "
                "generate prompts of equal length (or one at a time)"
            )
        use_cache = self.config.use_cache if use_cache is None else use_cache
        return_dict = True if return_dict is None else return_dict
        m = self.model
        m._check_ids(input_ids)
        states = None
        seen = 0
        if isinstance(past_key_values, SeqmemCache) and past_key_values.states is not None:
            states, seen = past_key_values.states, past_key_values.seq_len
        elif past_key_values is not None and not isinstance(past_key_values, SeqmemCache):
            if past_key_values.get_seq_length() != 0:
                raise ValueError(f"past_key_values must be a SeqmemCache, got {type(past_key_values).__name__}")
        x = m.embed(input_ids.long())
        new_states = []
        for i, blk in enumerate(m.blocks):
            x, st = blk(x, None if states is None else states[i])
            new_states.append(st)
        h = m.norm(x)
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            h = h[:, -logits_to_keep:]
        elif isinstance(logits_to_keep, Tensor):
            h = h[:, logits_to_keep]
        logits = m.head(h)
        loss = None
        if labels is not None:
            if labels.shape != input_ids.shape:
                raise ValueError(f"labels {tuple(labels.shape)} must match input_ids {tuple(input_ids.shape)}")
            if logits.shape[1] != input_ids.shape[1]:
                raise ValueError("labels need logits for every position (logits_to_keep=0)")
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1), ignore_index=-100
            )
        cache = None
        if use_cache:
            if isinstance(past_key_values, SeqmemCache):
                cache = past_key_values
                cache.states, cache.seq_len = new_states, seen + input_ids.shape[1]
            else:
                cache = SeqmemCache(new_states, seen + input_ids.shape[1])
        if not return_dict:
            out = (logits, cache) if cache is not None else (logits,)
            return (loss, *out) if loss is not None else out
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=cache)


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
