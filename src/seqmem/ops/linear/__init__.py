"""Causal linear attention: ``naive.py`` is the recurrent reference, ``chunk.py`` the chunkwise-parallel form;
:func:`linear_attention` runs either (``mode="recurrent" | "chunk"``)."""

from seqmem.ops.linear.chunk import linear_attention

__all__ = ["linear_attention"]
