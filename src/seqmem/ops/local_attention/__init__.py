"""Causal sliding-window softmax attention: query t sees the ``window`` most recent keys, itself included.

``sliding_window_attention(q, k, v, window, initial_state=state)`` on ``(batch, time, heads, dim)`` tensors returns
``(o, state)`` with ``state = {"k", "v"}`` the last ``min(P + T, window − 1)`` keys and values (what the next call
takes back as ``initial_state``; the former ``past_k, past_v`` arguments still work, with a DeprecationWarning).
``mode="recurrent"`` is the reference, one query at a time (``naive.py``); ``mode="chunk"`` processes all blocks
of ``chunk_size`` queries at once: block i attends to the ``chunk_size + window − 1`` keys ending at its last query,
taken as a strided ``unfold`` view of the left-padded keys, so there is no Python loop and no per-block slice, and
the cost is O(T·(chunk_size + window)) per head instead of the O(T²) of a dense masked attention;
``mode="parallel"`` is one block of all T queries.

:func:`windowed_softmax` is the shared kernel; it can also return the normalised entropy of each query's
attention row (VORT's routing feature, VORT paper eq. 11), which :func:`seqmem.ops.local_window_attention` uses.

``chunk.py`` holds the blocked form, :func:`join_past`, the state helpers :func:`window_cache` /
:func:`window_state` and :func:`sliding_window_attention`; ``naive.py`` the reference.
"""

from seqmem.ops.local_attention.chunk import (  # noqa: F401  (MODES, join_past, windowed_softmax: for other ops)
    MODES,
    join_past,
    sliding_window_attention,
    windowed_softmax,
)

__all__ = ["sliding_window_attention"]
