"""Mamba-2 SSD: ``naive.py`` is the recurrent reference, ``chunk.py`` the block decomposition (Listing 1 of the
Mamba-2 paper); :func:`ssd` runs either (``mode="recurrent" | "chunk"``)."""

from seqmem.ops.state_space.chunk import ssd

__all__ = ["ssd"]
