"""Hugging Face ``transformers`` integration (optional; ``pip install "seqmem[hf]"``): :class:`SeqmemConfig`,
:class:`SeqmemForCausalLM`, :class:`SeqmemModel`, :class:`SeqmemCache`, :func:`from_run`, :func:`export_tokenizer`,
:func:`save_exported`.

``import seqmem.hf`` imports ``transformers`` and registers ``model_type="seqmem"`` with ``AutoConfig``,
``AutoModel`` and ``AutoModelForCausalLM`` (``register(..., exist_ok=True)``, the ``transformers`` convention), so
``AutoModelForCausalLM.from_pretrained(DIR)`` loads a saved seqmem model in that process.  A model written by
:func:`save_exported` (what ``seqmem export-hf`` does) also loads without the import, with
``trust_remote_code=True``: its ``config.json`` names two small files in the directory that import this package
(``seqmem`` must be installed).  ``import seqmem`` alone does not import ``transformers``.  See docs/ecosystem.md.
"""

from __future__ import annotations

try:
    import transformers  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(f"seqmem.hf needs transformers: pip install \"seqmem[hf]\" ({e})") from None

from seqmem.hf.configuration_seqmem import SeqmemConfig
from seqmem.hf.modeling_seqmem import SeqmemCache, SeqmemForCausalLM, SeqmemModel, from_run, save_exported
from seqmem.hf.tokenizer import export_tokenizer

__all__ = ["SeqmemCache", "SeqmemConfig", "SeqmemForCausalLM", "SeqmemModel", "export_tokenizer", "from_run",
           "register", "save_exported"]


def register() -> None:
    """Register ``seqmem`` with ``AutoConfig``, ``AutoModel`` and ``AutoModelForCausalLM`` (done on import;
    idempotent)."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    AutoConfig.register("seqmem", SeqmemConfig, exist_ok=True)
    AutoModel.register(SeqmemConfig, SeqmemModel, exist_ok=True)
    AutoModelForCausalLM.register(SeqmemConfig, SeqmemForCausalLM, exist_ok=True)


register()
