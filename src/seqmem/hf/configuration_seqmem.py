"""``SeqmemConfig``: a ``transformers`` configuration mirroring :class:`seqmem.models.LMConfig`."""

from __future__ import annotations

import difflib
import functools
import threading
from typing import Any

from transformers import PretrainedConfig

from seqmem.models.lm import LMConfig

__all__ = ["SeqmemConfig"]

_given = threading.local()  # the keyword names the current SeqmemConfig(...) call was given (see the end)


class SeqmemConfig(PretrainedConfig):
    """Configuration of :class:`~seqmem.hf.SeqmemForCausalLM` (``model_type = "seqmem"``).

    Fields are those of :class:`seqmem.models.LMConfig`: ``vocab_size``, ``d_model``, ``n_layers``, ``n_heads``,
    ``mixer`` (a registered mixer name, or one name per layer for hybrids), ``mixer_options`` (a dict for every layer,
    or one dict per layer), ``mlp_ratio`` (0 = no MLP), ``tie_embeddings``, ``norm_eps``, ``init_std``.  Every field
    has a default, so ``AutoConfig.for_model("seqmem")`` works (a 2-layer attention model over 256 byte tokens).

    ``transformers``' names are aliases of the fields (``attribute_map``): reading or setting ``hidden_size``,
    ``num_hidden_layers``, ``num_attention_heads`` or ``tie_word_embeddings`` reads or sets ``d_model``,
    ``n_layers``, ``n_heads`` or ``tie_embeddings`` (one value, also after construction and in
    ``from_pretrained(..., tie_word_embeddings=False)``).  The values are checked as :class:`LMConfig` checks them
    (``tie_embeddings="false"`` is an error, not a tied model).
    """

    model_type = "seqmem"
    attribute_map = {"hidden_size": "d_model", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads",
                     "tie_word_embeddings": "tie_embeddings"}

    vocab_size: int = 256
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    mixer: str | list[str] = "attention"
    mixer_options: dict[str, Any] | list[dict[str, Any]] | None = None
    mlp_ratio: float = 4.0
    tie_embeddings: bool = True
    norm_eps: float = 1e-5
    init_std: float = 0.02
    use_cache: bool = True

    def __post_init__(self, **kwargs: Any) -> None:
        given = getattr(_given, "names", None)  # None: not called through __init__ (then: differs from the default)

        def explicit(field: str) -> bool:
            return field in given if given is not None else getattr(self, field) != getattr(type(self), field)

        _refuse_misspelt(kwargs)
        for alias, field in self.attribute_map.items():  # transformers' names (config.json carries both)
            if alias in kwargs:
                value = kwargs.pop(alias)
                if explicit(field) and getattr(self, field) != value:
                    raise ValueError(f"SeqmemConfig: {alias}={value!r} and {field}={getattr(self, field)!r} "
                                     f"disagree ({alias} is transformers' name for {field}); give one of them")
                setattr(self, field, value)
        if self.mixer_options is None:
            self.mixer_options = {}
        if isinstance(self.mixer, tuple):
            self.mixer = list(self.mixer)
        self.to_lm_config()  # validate (clear ValueErrors) before anything is built
        super().__post_init__(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The fields, plus ``transformers``' standard names of the sizes (``hidden_size``, ``num_hidden_layers``,
        ``num_attention_heads``) that tools reading ``config.to_dict()`` expect (peft's prompt tuning does)."""
        d = super().to_dict()
        for alias, field in self.attribute_map.items():
            d.setdefault(alias, getattr(self, field))
        return d

    def to_lm_config(self) -> LMConfig:
        """The equivalent :class:`seqmem.models.LMConfig`."""
        return LMConfig(
            vocab_size=self.vocab_size, d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads,
            mixer=self.mixer, mixer_options=self.mixer_options or {}, mlp_ratio=self.mlp_ratio,
            tie_embeddings=self.tie_embeddings, norm_eps=self.norm_eps, init_std=self.init_std,
        )

    @classmethod
    def from_lm_config(cls, cfg: LMConfig, **kwargs: Any) -> SeqmemConfig:
        """A ``SeqmemConfig`` with the fields of ``cfg`` (extra ``transformers`` kwargs allowed)."""
        return cls(**cfg.to_dict(), **kwargs)


# seqmem's own fields; a keyword that is none of them nor one of transformers' but reads like one is a typo
_OWN_FIELDS = ("vocab_size", "d_model", "n_layers", "n_heads", "mixer", "mixer_options", "mlp_ratio", "tie_embeddings",
               "norm_eps", "init_std")


_MLP = "the SwiGLU width is mlp_ratio * d_model * 2/3 rounded up to a multiple of 8; mlp_ratio=0: no MLP"
#: Names other ``transformers`` models give to sizes and settings that a seqmem model has under another name (or not
#: at all): stored as attributes they would be ignored.  ``PretrainedConfig`` sets none of them on its own, so a
#: config.json of a seqmem model never carries them.  name -> (the seqmem field or None, a note)
_TRANSFORMERS_NAMES: dict[str, tuple[str | None, str]] = {
    "initializer_range": ("init_std", ""),
    "initializer_factor": ("init_std", ""),
    "intermediate_size": ("mlp_ratio", _MLP),
    "n_inner": ("mlp_ratio", _MLP),
    "ffn_dim": ("mlp_ratio", _MLP),
    "d_ff": ("mlp_ratio", _MLP),
    "layer_norm_eps": ("norm_eps", ""),
    "layer_norm_epsilon": ("norm_eps", ""),
    "rms_norm_eps": ("norm_eps", ""),
    "norm_epsilon": ("norm_eps", ""),
    "n_embd": ("d_model", "or its alias hidden_size"),
    "embed_dim": ("d_model", "or its alias hidden_size"),
    "n_layer": ("n_layers", "or its alias num_hidden_layers"),
    "num_layers": ("n_layers", "or its alias num_hidden_layers"),
    "n_head": ("n_heads", "or its alias num_attention_heads"),
    "num_heads": ("n_heads", "or its alias num_attention_heads"),
    "num_key_value_heads": ("n_heads", "seqmem's layers have no grouped key/value heads"),
    "head_dim": (None, "seqmem's heads split d_model (head_dim = d_model / n_heads): give n_heads, or a mixer's own "
                       "head_dim in mixer_options"),
    "hidden_act": (None, "seqmem's MLP is SwiGLU: mlp_ratio sets its width, 0 removes it"),
    "rope_theta": (None, "give the attention mixers' RoPE base as mixer_options={'rope_base': ...}"),
}

def _refuse_misspelt(kwargs: dict[str, Any]) -> None:
    """Refuse an unknown keyword that reads like one of seqmem's fields (``d_modle=32``, ``mixers="vla"``) or is
    another ``transformers`` model's name of one (``initializer_range``, ``intermediate_size``, ``layer_norm_eps``,
    ``n_embd``: :data:`_TRANSFORMERS_NAMES`).

    ``transformers`` keeps every unknown keyword as an attribute (config.json files carry extra keys such as
    ``architectures`` or ``auto_map``), so a misspelt field would otherwise be stored and ignored: the model would be
    built at the default size.  Keywords that ``PretrainedConfig`` knows, and names close to none of the fields, pass.
    """
    base = PretrainedConfig()
    for key in kwargs:
        if key in SeqmemConfig.attribute_map or hasattr(base, key):
            continue
        if key in _TRANSFORMERS_NAMES:
            field, note = _TRANSFORMERS_NAMES[key]
            if field is not None:
                note = f"did you mean {field!r}?" + (f" ({note})" if note else "")
            raise ValueError(f"SeqmemConfig: {key}={kwargs[key]!r} is another transformers model's name, not a "
                             f"seqmem field (a seqmem model would ignore it); {note}")
        close = difflib.get_close_matches(key, _OWN_FIELDS, n=1, cutoff=0.8)
        if close:
            raise ValueError(f"SeqmemConfig: unknown field {key!r}; did you mean {close[0]!r}?")


_dataclass_init = SeqmemConfig.__init__


@functools.wraps(_dataclass_init)
def _init(self: SeqmemConfig, *args: Any, **kwargs: Any) -> None:
    # __post_init__ must tell a field given with its default's value (d_model=128, hidden_size=64: a conflict)
    # from one not given (hidden_size=64 alone): the dataclass __init__ cannot, so the names are kept here
    before = getattr(_given, "names", None)
    _given.names = set(kwargs)
    try:
        _dataclass_init(self, *args, **kwargs)
    finally:
        _given.names = before


SeqmemConfig.__init__ = _init  # type: ignore[method-assign]
