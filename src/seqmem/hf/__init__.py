"""Hugging Face ``transformers`` integration (optional): :class:`SeqmemConfig`, :class:`SeqmemForCausalLM`,
:class:`SeqmemModel`, :class:`SeqmemCache`, :func:`from_run`, :func:`export_tokenizer`.

``import seqmem.hf`` registers ``model_type="seqmem"`` with ``AutoConfig``, ``AutoModel`` and
``AutoModelForCausalLM`` — at once if ``transformers``' auto classes are already imported, else the moment they are
(see :mod:`seqmem.hf._hook`) — without importing ``transformers`` itself; ``import seqmem`` alone registers nothing.
The names below are loaded on first access.  See docs/ecosystem.md.
"""

from __future__ import annotations

from typing import Any

from seqmem.hf._hook import install as _install

__all__ = ["SeqmemCache", "SeqmemConfig", "SeqmemForCausalLM", "SeqmemModel", "export_tokenizer", "from_run",
           "register"]

_install()


def __getattr__(name: str) -> Any:
    if name == "SeqmemConfig":
        from seqmem.hf.configuration_seqmem import SeqmemConfig

        return SeqmemConfig
    if name in ("SeqmemForCausalLM", "SeqmemModel", "SeqmemCache", "from_run"):
        from seqmem.hf import modeling_seqmem

        return getattr(modeling_seqmem, name)
    if name == "export_tokenizer":
        from seqmem.hf.tokenizer import export_tokenizer

        return export_tokenizer
    if name == "register":
        from seqmem.hf._hook import register

        return register
    raise AttributeError(f"module 'seqmem.hf' has no attribute {name!r}")
