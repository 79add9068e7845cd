"""Models built from registered mixers."""

from seqmem.models.lm import LanguageModel, LMConfig

__all__ = ["LMConfig", "LanguageModel"]
