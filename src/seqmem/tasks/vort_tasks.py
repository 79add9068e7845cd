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
seeds for validation and test).  These two are not LM tasks: they feed :class:`seqmem.repro.vort.RetrievalModel`
(the structured retrieval model of ``seqmem repro vort``, with an initialisation of ours).

``vort_zipf`` (:class:`VortZipfTask`, registered) is Table 1's task as a token sequence for a *learned* language model
(``seqmem train`` / ``seqmem sweep``): the same anchor/query placement as :class:`ZipfLagRetrieval`, each of the
paper's ``n`` positions written as two tokens (so ``seq_len = 2n``)::

    anchor   KEY_k  LABEL_y          query   QUERY  KEY_k   -> target LABEL_y at the KEY_k token
    filler   FILL   FILL

A query's key appears exactly once before it (at its anchor, ``d`` positions = ``2d`` tokens earlier, ``d`` the
Zipf lag); the model must copy the token that followed it (an induction/recall step).

``layout = "dense"`` is the paper's layout (§6 "Task design": an anchor at every position, and at every position
t ≥ 1 a query for the anchor at lag d_t ~ Zipf(β) truncated to [1, t]), written as four tokens per position
(``seq_len = 4n``; ``n_keys ≥ n_positions``, keys distinct within a sequence; ``n_queries`` is unused)::

    position t   KEY_t  LABEL_t  QUERY  KEY_{t−d_t}   -> target LABEL_{t−d_t} at the last token

Every position then writes one association and queries an older one, so a memory holds n items, not n_queries.

Its metrics (either layout) add the accuracy per lag bin (``acc_short`` ≤ 100, ``acc_medium`` ≤ 1000, ``acc_long``
> 1000 positions by default, the paper's bins): ``acc_<bin>`` is each evaluation batch's own accuracy, so its mean
over batches is close to, not equal to, the pooled accuracy ``hits_<bin> / queries_<bin>`` that results report.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch import Tensor

from seqmem.io import check_int
from seqmem.tasks.base import DEFAULT_EVAL_SEED, IGNORE_INDEX, Task, register_task

__all__ = ["ZipfLagRetrieval", "EntityLabelCopy", "VortZipfTask", "lag_bin"]

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
        # The generator's draws, in order, define the examples: per row the key permutation, the labels, then per
        # try a position and a lag, then the filler.  The placements are collected in Python and written once per
        # row (the positions are distinct, so the order of the writes does not matter): the same examples as one
        # tensor write per field and placement, at about half the time.
        B, n = batch_size, self.seq_len
        out = self._empty(B)
        g = generator
        for b in range(B):
            used = bytearray(n)
            keys = torch.randperm(self.n_keys, generator=g)[: self.n_queries]
            labels = torch.randint(0, self.n_labels, (self.n_queries,), generator=g)
            anchors: list[int] = []
            queries: list[int] = []
            lags: list[int] = []
            tries = 0
            while len(queries) < self.n_queries and tries < 50 * self.n_queries:
                tries += 1
                t = int(torch.randint(1, n, (1,), generator=g))
                d = int(torch.multinomial(self._pd[:t], 1, generator=g)) + 1  # truncated Zipf on [1, t]
                a = t - d
                if used[t] or used[a]:
                    continue
                used[t] = used[a] = 1
                anchors.append(a)
                queries.append(t)
                lags.append(d)
            placed = len(queries)
            if placed:
                ai, qi = torch.tensor(anchors), torch.tensor(queries)
                out["mem_key"][b, ai], out["mem_label"][b, ai] = keys[:placed], labels[:placed]
                out["query_key"][b, qi], out["target"][b, qi] = keys[:placed], labels[:placed]
                out["lag"][b, qi] = torch.tensor(lags)
            free = torch.frombuffer(used, dtype=torch.uint8) == 0
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


BIN_NAMES = ("short", "medium", "long")


def _row_key(row: Tensor) -> bytes:
    return hashlib.blake2b(row.detach().to("cpu", torch.int64).contiguous().numpy().tobytes(),
                           digest_size=16).digest()


@register_task("vort_zipf")
class VortZipfTask(Task):
    """VORT Table 1 (Zipf-lag label retrieval) as an LM task: ``seq_len = 2 · n_positions`` tokens.

    Args:
        n_positions: the paper's sequence length n (10,000 in Table 1), in positions of two tokens.
        beta: Zipf exponent of the lag distribution, ``P(d) ∝ d^{-β}`` truncated to ``[1, t]`` (paper: 1, 1.5, 2).
        n_queries: queries (= anchors) per sequence.
        n_keys: key vocabulary (keys are distinct within a sequence).
        n_labels: C, label classes (paper: 16); chance accuracy is ``1/C``.
        n_filler: filler vocabulary.
        lag_edges: ``(short, medium)`` upper bin edges in positions (paper: ≤ 100, 100-1000, > 1000).
        eval_seed: seed of the evaluation stream.

    Vocabulary: ``QUERY = 0``, labels ``[1, 1 + C)``, keys ``[1 + C, 1 + C + n_keys)``, then filler.
    :meth:`metrics` adds, for examples drawn by :meth:`eval_data` / :meth:`valid_data` (their lags are remembered
    by example: the targets alone do not carry the lag), ``acc_<bin>`` (accuracy over the batch's queries in the
    bin; absent for a batch with none) and the per-example counts ``queries_<bin>`` / ``hits_<bin>``, whose ratio
    over the whole evaluation is the exact pooled accuracy of the bin (``bin`` = short, medium, long).
    """

    name = "vort_zipf"
    QUERY = 0
    LAYOUTS = ("sparse", "dense")

    def __init__(
        self,
        n_positions: int = 1024,
        beta: float = 1.0,
        n_queries: int = 64,
        n_keys: int = 512,
        n_labels: int = 16,
        n_filler: int = 64,
        lag_edges: tuple[float, float] = (100, 1000),
        layout: str = "sparse",
        eval_seed: int = DEFAULT_EVAL_SEED,
    ) -> None:
        super().__init__(eval_seed)
        if layout not in self.LAYOUTS:
            raise ValueError(f"layout must be one of {self.LAYOUTS}, got {layout!r}")
        if layout == "dense" and isinstance(n_keys, int) and isinstance(n_positions, int) and n_keys < n_positions:
            raise ValueError(f"layout 'dense' needs n_keys >= n_positions (a key per position), got {n_keys} < "
                             f"{n_positions}")
        self.layout = layout
        for k, v, lo in (("n_positions", n_positions, 4), ("n_queries", n_queries, 1), ("n_keys", n_keys, 1),
                         ("n_labels", n_labels, 2), ("n_filler", n_filler, 1)):
            check_int(k, v, lo)
        if isinstance(beta, bool) or not isinstance(beta, int | float) or not beta > 0:
            raise ValueError(f"beta must be a positive number, got {beta!r}")
        try:
            e0, e1 = (float(e) for e in lag_edges)
        except (TypeError, ValueError):
            raise ValueError(f"lag_edges must be a (short, medium) pair of numbers, got {lag_edges!r}") from None
        if not 0 < e0 < e1:
            raise ValueError(f"lag_edges must satisfy 0 < short < medium, got {lag_edges!r}")
        self.gen = ZipfLagRetrieval(seq_len=n_positions, beta=beta, n_queries=min(n_queries, n_positions // 2),
                                    n_keys=max(n_keys, n_queries), n_labels=n_labels, n_filler=n_filler) \
            if layout == "dense" else ZipfLagRetrieval(seq_len=n_positions, beta=beta, n_queries=n_queries,
                                                       n_keys=n_keys, n_labels=n_labels, n_filler=n_filler)
        self.n_positions, self.beta, self.n_queries = n_positions, float(beta), n_queries
        self.n_keys, self.n_labels, self.n_filler = n_keys, n_labels, n_filler
        self.lag_edges = (e0, e1)
        self.label_range = (1, 1 + n_labels)
        self.key_offset = 1 + n_labels
        self.filler_offset = self.key_offset + n_keys
        self.vocab_size = self.filler_offset + n_filler
        self.seq_len = (4 if layout == "dense" else 2) * n_positions
        self._bins: dict[bytes, Tensor] = {}

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "n_positions": self.n_positions, "beta": self.beta, "n_queries": self.n_queries,
                "n_keys": self.n_keys, "n_labels": self.n_labels, "n_filler": self.n_filler,
                "lag_edges": list(self.lag_edges),
                **({"layout": self.layout} if self.layout != "sparse" else {}),  # runs recorded before: unchanged
                "eval_seed": self.eval_seed}

    def sample_with_lags(self, batch_size: int, generator: torch.Generator | None = None
                         ) -> tuple[Tensor, Tensor, Tensor]:
        """``(input_ids, targets, lags)``, all ``(B, seq_len)``; ``lags`` (in positions) is −1 where not scored."""
        B = self._check_batch(batch_size)
        if self.layout == "dense":
            return self._dense(B, generator)
        d = self.gen.sample(B, generator)
        n = self.n_positions
        anchor = d["mem_label"] >= 0
        query = d["query_key"] >= 0
        filler = d["filler"] >= 0
        first = torch.zeros(B, n, dtype=torch.long)
        second = torch.zeros(B, n, dtype=torch.long)
        first[anchor] = self.key_offset + d["mem_key"][anchor]
        second[anchor] = self.label_range[0] + d["mem_label"][anchor]
        first[query] = self.QUERY
        second[query] = self.key_offset + d["query_key"][query]
        first[filler] = self.filler_offset + d["filler"][filler]
        second[filler] = self.filler_offset + torch.randint(0, self.n_filler, (int(filler.sum()),),
                                                            generator=generator)
        x = torch.stack([first, second], -1).reshape(B, 2 * n)
        y = torch.full((B, n, 2), IGNORE_INDEX, dtype=torch.long)
        y[..., 1][query] = self.label_range[0] + d["target"][query]
        lags = torch.full((B, n, 2), -1, dtype=torch.long)
        lags[..., 1][query] = d["lag"][query]
        return x, y.reshape(B, 2 * n), lags.reshape(B, 2 * n)

    def _dense(self, B: int, generator: torch.Generator | None) -> tuple[Tensor, Tensor, Tensor]:
        """The paper's layout: an anchor at every position, a query at every position t ≥ 1 (class docstring)."""
        n, g = self.n_positions, generator
        keys = torch.stack([torch.randperm(self.n_keys, generator=g)[:n] for _ in range(B)])
        labels = torch.randint(0, self.n_labels, (B, n), generator=g)
        pd = self.gen._pd  # d^{-β} for d = 1 .. n−1
        t = torch.arange(1, n)
        # truncated Zipf on [1, t] by inverse CDF: u · cdf(t) against the cumulative weights
        cdf = torch.cumsum(pd, 0)
        u = torch.rand(B, n - 1, generator=g, dtype=torch.float64) * cdf[t - 1]
        lag = torch.searchsorted(cdf, u.contiguous(), right=False) + 1
        lag = torch.minimum(lag, t.expand(B, -1))
        src = t - lag  # anchor position of each query
        x = torch.zeros(B, n, 4, dtype=torch.long)
        x[..., 0] = self.key_offset + keys
        x[..., 1] = self.label_range[0] + labels
        x[..., 2] = self.QUERY
        x[:, 1:, 3] = self.key_offset + torch.gather(keys, 1, src)
        x[:, 0, 3] = self.QUERY  # position 0 has nothing older to ask for
        y = torch.full((B, n, 4), IGNORE_INDEX, dtype=torch.long)
        y[:, 1:, 3] = self.label_range[0] + torch.gather(labels, 1, src)
        lags = torch.full((B, n, 4), -1, dtype=torch.long)
        lags[:, 1:, 3] = lag
        return x.reshape(B, 4 * n), y.reshape(B, 4 * n), lags.reshape(B, 4 * n)

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        x, y, _ = self.sample_with_lags(batch_size, generator)
        return x, y

    def _eval_sample(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        x, y, lags = self.sample_with_lags(batch_size, generator)
        bins = lag_bin(lags, self.lag_edges)
        for row_y, row_b in zip(y, bins):
            self._bins[_row_key(row_y)] = row_b[row_y != IGNORE_INDEX].to(torch.int8)
        return x, y

    def lag_bins(self, targets: Tensor) -> Tensor | None:
        """Bin (0 short, 1 medium, 2 long) of every scored position of ``targets`` (row-major order), or ``None``
        if some row is not an example of :meth:`eval_data` / :meth:`valid_data`."""
        out = []
        for row in targets:
            b = self._bins.get(_row_key(row))
            if b is None:
                return None
            out.append(b)
        return torch.cat(out) if out else None

    def metrics(self, logits: Tensor, targets: Tensor) -> dict[str, float]:
        out = super().metrics(logits, targets)
        bins = self.lag_bins(targets)
        if bins is None:
            return out
        mask = targets != IGNORE_INDEX
        correct = (logits[mask].argmax(-1) == targets[mask]).cpu()
        B = targets.shape[0]
        for i, name in enumerate(BIN_NAMES):
            sel = bins == i
            n = int(sel.sum())
            hits = int(correct[sel].sum())
            # per-example counts: over all eval batches hits_<bin> / queries_<bin> is the exact pooled accuracy
            out[f"queries_{name}"] = n / B
            out[f"hits_{name}"] = hits / B
            if n:  # left out (not NaN) where this batch has no query in the bin
                out[f"acc_{name}"] = hits / n
        return out
