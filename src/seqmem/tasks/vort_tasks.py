"""Synthetic retrieval tasks of the VORT paper (000, Section 6, Tables 1-2) — OUR generators (the paper gives no
token format; our layout, adapted to a sparse layout so that the memory holds few items).

Each example is a structured sequence of length n with three aligned integer channels (all (B, n) int64):

* ``mem_key``: the key id written at position t (−1: none); ``mem_label``: its label (−1: none, e.g. a later
  mention carries its name but no label); ``filler``: a filler token id where nothing else is written (−1 else);
* ``query_key``: the key id queried at t (−1: not a query); ``target``: the label to predict (−100: not scored);
* ``lag``: distance from the query to its source (−1 where not scored).

``ZipfLagRetrieval`` (Table 1): ``n_queries`` query positions per sequence; each query at t asks for an anchor
planted at t − d, d ~ P(d) ∝ d^{−β} truncated to [1, t]; anchors have unique keys (from ``n_keys``) and labels
uniform in C = 16; positions that are neither anchor nor query hold filler.
``EntityLabelCopy`` (Table 2): E = 20 entities with names drawn from ``n_names`` and labels from C; each entity is
mentioned at ``mentions`` positions drawn uniformly without replacement over [0, n); the first mention carries
the label, later mentions carry the name (a write without a label) and are queries for the label.

``sample(batch, generator)`` draws training examples; ``eval_data(n, seed)`` is a fixed-seed stream (use distinct
seeds for validation and test).  Not registered as LM tasks: they feed :class:`seqmem.repro.vort.RetrievalModel`.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["ZipfLagRetrieval", "EntityLabelCopy", "lag_bin"]

FIELDS = ("mem_key", "mem_label", "filler", "query_key", "target", "lag")


def lag_bin(lag: Tensor, edges: tuple[float, float]) -> Tensor:
    """0 (short: lag ≤ edges[0]), 1 (medium: ≤ edges[1]), 2 (long) for lag ≥ 0; −1 where lag < 0."""
    out = torch.full_like(lag, -1)
    v = lag >= 0
    out[v & (lag <= edges[0])] = 0
    out[v & (lag > edges[0]) & (lag <= edges[1])] = 1
    out[v & (lag > edges[1])] = 2
    return out


class _Base:
    n_labels: int
    seq_len: int

    def _empty(self, B: int) -> dict[str, Tensor]:
        n = self.seq_len
        d = {k: torch.full((B, n), -1, dtype=torch.long) for k in FIELDS}
        d["target"].fill_(-100)
        return d

    def eval_data(self, n_examples: int, seed: int) -> dict[str, Tensor]:
        """``n_examples`` examples from the stream seeded by ``seed`` (deterministic)."""
        if n_examples <= 0:
            raise ValueError("n_examples must be positive")
        return self.sample(n_examples, torch.Generator().manual_seed(seed))

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> dict[str, Tensor]:
        raise NotImplementedError


class ZipfLagRetrieval(_Base):
    """Table 1: retrieve the label of an anchor at a Zipf(β)-distributed lag (our sparse layout)."""

    def __init__(self, seq_len: int = 10_000, beta: float = 1.0, n_queries: int = 64, n_keys: int = 16_384,
                 n_labels: int = 16, n_filler: int = 256) -> None:
        if seq_len < 4 or n_queries < 1 or 2 * n_queries > seq_len:
            raise ValueError("need seq_len >= 4 and 1 <= n_queries <= seq_len / 2")
        if beta <= 0 or n_labels < 2 or n_filler < 1 or n_keys < n_queries:
            raise ValueError("need beta > 0, n_labels >= 2, n_filler >= 1, n_keys >= n_queries")
        self.seq_len, self.beta, self.n_queries = seq_len, float(beta), n_queries
        self.n_keys, self.n_labels, self.n_filler = n_keys, n_labels, n_filler
        d = torch.arange(1, seq_len, dtype=torch.float64)
        self._pd = d ** (-self.beta)

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> dict[str, Tensor]:
        B, n = batch_size, self.seq_len
        out = self._empty(B)
        g = generator
        for b in range(B):
            used = torch.zeros(n, dtype=torch.bool)
            keys = torch.randperm(self.n_keys, generator=g)[: self.n_queries]
            labels = torch.randint(0, self.n_labels, (self.n_queries,), generator=g)
            placed = 0
            tries = 0
            while placed < self.n_queries and tries < 50 * self.n_queries:
                tries += 1
                t = int(torch.randint(1, n, (1,), generator=g))
                d = int(torch.multinomial(self._pd[:t], 1, generator=g)) + 1  # truncated Zipf on [1, t]
                a = t - d
                if used[t] or used[a]:
                    continue
                used[t] = used[a] = True
                out["mem_key"][b, a], out["mem_label"][b, a] = keys[placed], labels[placed]
                out["query_key"][b, t], out["target"][b, t], out["lag"][b, t] = keys[placed], labels[placed], d
                placed += 1
            free = ~used
            out["filler"][b, free] = torch.randint(0, self.n_filler, (int(free.sum()),), generator=g)
        return out


class EntityLabelCopy(_Base):
    """Table 2: copy an entity's label from its first mention to later mentions at uniform positions."""

    def __init__(self, seq_len: int = 8_000, n_entities: int = 20, mentions: int = 20, n_names: int = 1_000,
                 n_labels: int = 16, n_filler: int = 256) -> None:
        if n_entities * mentions > seq_len or mentions < 2 or n_entities < 1 or n_names < n_entities:
            raise ValueError("need n_entities * mentions <= seq_len, mentions >= 2, n_names >= n_entities")
        self.seq_len, self.n_entities, self.mentions = seq_len, n_entities, mentions
        self.n_keys, self.n_labels, self.n_filler = n_names, n_labels, n_filler

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> dict[str, Tensor]:
        B, n, E, M = batch_size, self.seq_len, self.n_entities, self.mentions
        out = self._empty(B)
        g = generator
        for b in range(B):
            pos = torch.randperm(n, generator=g)[: E * M].view(E, M).sort(1).values
            names = torch.randperm(self.n_keys, generator=g)[:E]
            labels = torch.randint(0, self.n_labels, (E,), generator=g)
            first, later = pos[:, 0], pos[:, 1:]
            out["mem_key"][b, first], out["mem_label"][b, first] = names, labels
            out["mem_key"][b, later] = names[:, None].expand_as(later)
            out["query_key"][b, later] = names[:, None].expand_as(later)
            out["target"][b, later] = labels[:, None].expand_as(later)
            out["lag"][b, later] = later - first[:, None]
            free = torch.ones(n, dtype=torch.bool)
            free[pos.reshape(-1)] = False
            out["filler"][b, free] = torch.randint(0, self.n_filler, (int(free.sum()),), generator=g)
        return out
