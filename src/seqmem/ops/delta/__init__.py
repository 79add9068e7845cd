"""The delta rule and gated delta rule: ``naive.py`` is the recurrent reference, ``chunk.py`` the exact UT/WY
chunkwise form; :func:`delta_rule` / :func:`gated_delta_rule` run either (``mode="recurrent" | "chunk"``)."""

from seqmem.ops.delta.chunk import delta_rule, gated_delta_rule

__all__ = ["delta_rule", "gated_delta_rule"]
