"""Hugging Face ``transformers`` integration (optional): :class:`SeqmemConfig`, :class:`SeqmemForCausalLM`,
:class:`SeqmemCache`.

Importing :mod:`seqmem` never imports ``transformers``; it registers ``model_type="seqmem"`` with ``AutoConfig`` and
``AutoModelForCausalLM`` the moment ``transformers``' auto classes are imported (see :mod:`seqmem.hf._hook`).
The names below are loaded on first access.  See docs/ecosystem.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SeqmemCache", "SeqmemConfig", "SeqmemForCausalLM", "from_run", "register"]


def __getattr__(name: str) -> Any:
    if name == "SeqmemConfig":
        from seqmem.hf.configuration_seqmem import SeqmemConfig

        return SeqmemConfig
    if name in ("SeqmemForCausalLM", "SeqmemCache", "from_run"):
        from seqmem.hf import modeling_seqmem

        return getattr(modeling_seqmem, name)
    if name == "register":
        from seqmem.hf._hook import register

        return register
    raise AttributeError(f"module 'seqmem.hf' has no attribute {name!r}")
