"""VORT (power-law retention): ``naive.py`` is the per-token reference of eqs. (14)–(16), ``chunk.py`` the exact
chunked and parallel forms plus the local attention, kernel-matrix and plasticity ops; :func:`soe_retention`
runs either (``mode="recurrent" | "chunk" | "parallel"``)."""

from seqmem.ops.vort import chunk as _chunk
from seqmem.ops.vort.chunk import *  # noqa: F403  (the public ops: every name in chunk.__all__)

__all__ = list(_chunk.__all__)
