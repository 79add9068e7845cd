"""Multi-query associative recall (MQAR) in two layouts.

``layout="zoology"`` — the layout of Arora et al., *Zoology* (2023) and the Based recipe
(``multiquery_ar``)::

    k1 v1 k2 v2 ... kn vn | . . q . . . q . q . . .     (T tokens; the query region is T - 2n long)

  * keys are ``n`` distinct tokens from ``[1, V//2)``, values ``n`` distinct tokens from ``[V//2, V)``
    (disjoint halves of the vocabulary);
  * every key is queried exactly once.  The query region is viewed as ``space = (T - 2n) // 2`` slots of
    two tokens; the slot ("gap") ``g_i`` of key ``i`` is drawn without replacement from
    ``P(g) ∝ (g + 1) ** (power_a - 1)``, ``g = 0 .. space - 1`` (a power law: small gaps, i.e. queries soon
    after the context, are likely; ``power_a = 1`` is uniform), and key ``k_i`` is written at position
    ``2n + 2 g_i``;
  * the target at that position is ``v_i`` (the token that follows a query key in the input is filler, not
    the value); all other targets are ``-100``;
  * every other position is filler: uniform random tokens from ``[0, V)`` (``random_non_queries=True``,
    zoology's default; they may coincide with keys or values, as in zoology) or ``pad_token`` (zoology's 0).

``layout="vla"`` — the layout of the VLA paper (Fig. 1; see docs/tasks.md)::

    k1 v1 ... kn vn  [filler]  SEP  kσ(1) kσ(2) ... kσ(n)       T = 3n + 1 (+ filler)

  * ``SEP = V - 1``; keys ``n`` distinct tokens from ``[0, V - 1)``; values i.i.d. uniform from
    ``[0, V - 1)`` (duplicates allowed); σ a uniform random permutation;
  * the target at the position of query ``kσ(j)`` (position ``T - n + j``) is ``vσ(j)``; all others ``-100``
    (teacher-forced: the answers are never inputs);
  * if ``seq_len > 3n + 1`` the extra ``T - 3n - 1`` tokens are filler between the context and SEP (the query
    section stays at the end): uniform from ``[0, V - 1)`` excluding the example's keys
    (``random_non_queries=True``) or ``pad_token``.

``key_range`` / ``value_range`` (half-open ``(lo, hi)``) override the token ranges, e.g. the VLA OOD
experiment trains with ``key_range=(0, 64)`` and evaluates a second task built with ``key_range=(64, 127)``.

The metric is per-query accuracy: top-1 accuracy over the scored positions (``targets != -100``);
:meth:`MQARTask.metrics` also reports ``sequence_accuracy`` (all queries of an example right).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from seqmem.io import check_int
from seqmem.tasks.base import DEFAULT_EVAL_SEED, IGNORE_INDEX, Task, masked_accuracy, register_task

LAYOUTS = ("zoology", "vla")

__all__ = ["LAYOUTS", "MQARTask", "power_law_gap_probs"]


def power_law_gap_probs(space: int, power_a: float) -> Tensor:
    """Zoology's query-gap distribution ``P(g) ∝ power_a · (g+1)^(power_a-1)``, g = 0..space-1 (float64)."""
    g = torch.arange(1, space + 1, dtype=torch.float64)
    p = power_a * g ** (power_a - 1.0)
    return p / p.sum()


def _int(name: str, value: Any, minimum: int) -> int:
    check_int(name, value, minimum)
    return value


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def _range(name: str, value: Any, default: tuple[int, int], vocab_size: int) -> tuple[int, int]:
    if value is None:
        return default
    try:
        lo, hi = (int(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a (lo, hi) pair of integers, got {value!r}") from None
    if not 0 <= lo < hi <= vocab_size:
        raise ValueError(f"{name}={value!r} must satisfy 0 <= lo < hi <= vocab_size={vocab_size}")
    return lo, hi


def _distinct(batch: int, n: int, lo: int, hi: int, g: torch.Generator | None) -> Tensor:
    """(batch, n) distinct tokens drawn uniformly from [lo, hi), in random order."""
    return torch.rand(batch, hi - lo, generator=g).topk(n, dim=1).indices + lo


@register_task("mqar")
class MQARTask(Task):
    """Multi-query associative recall, ``layout="zoology"`` (default) or ``"vla"`` (see the module docstring).

    Args:
        vocab_size: V, including the SEP token of the VLA layout (``V - 1``).
        num_pairs: n, key-value pairs per example (= number of queries).
        seq_len: T; ``None`` = the minimum (``4n`` zoology, ``3n + 1`` VLA).
        layout: ``"zoology"`` or ``"vla"``.
        power_a: zoology's power-law parameter for query placement (``1`` = uniform); unused by ``"vla"``.
        random_non_queries: filler = random tokens (True) or ``pad_token`` (False).
        key_range, value_range: optional half-open token ranges overriding the layout's defaults.
        pad_token: filler token when ``random_non_queries=False``.
        eval_power_a: ``power_a`` of the eval stream (zoology's ``test_power_a``); ``None`` = ``power_a``.
        eval_seed: seed of the separate evaluation stream.
    """

    name = "mqar"

    def __init__(
        self,
        vocab_size: int = 8192,
        num_pairs: int = 8,
        seq_len: int | None = 64,
        layout: str = "zoology",
        power_a: float = 0.01,
        random_non_queries: bool = True,
        key_range: tuple[int, int] | None = None,
        value_range: tuple[int, int] | None = None,
        pad_token: int = 0,
        eval_power_a: float | None = None,
        eval_seed: int = DEFAULT_EVAL_SEED,
    ) -> None:
        super().__init__(eval_seed)
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        self.layout = layout
        self.vocab_size = _int("vocab_size", vocab_size, 3)
        self.num_pairs = n = _int("num_pairs", num_pairs, 1)
        min_len = 4 * n if layout == "zoology" else 3 * n + 1
        if seq_len is None:
            seq_len = min_len
        self.seq_len = _int("seq_len", seq_len, 1)
        if self.seq_len < min_len:
            need = "4 * num_pairs (zoology: the query region needs >= num_pairs two-token slots)"
            if layout == "vla":
                need = "3 * num_pairs + 1 (vla: k1 v1 .. kn vn SEP q1 .. qn)"
            raise ValueError(f"seq_len={seq_len} is too short for num_pairs={n}: need >= {need} = {min_len}")
        self.power_a = _positive("power_a", power_a)
        self.eval_power_a = None if eval_power_a is None else _positive("eval_power_a", eval_power_a)
        if not isinstance(random_non_queries, bool):
            raise ValueError(f"random_non_queries must be a bool, got {random_non_queries!r}")
        self.random_non_queries = random_non_queries
        V = self.vocab_size
        self.pad_token = _int("pad_token", pad_token, 0)
        if self.pad_token >= V:
            raise ValueError(f"pad_token={pad_token} must be < vocab_size={V}")

        if layout == "zoology":
            self.sep_token = None
            kdef, vdef = (1, V // 2), (V // 2, V)
        else:
            self.sep_token = V - 1
            kdef = vdef = (0, V - 1)
        self.key_range = _range("key_range", key_range, kdef, V)
        self.value_range = _range("value_range", value_range, vdef, V)
        for rname, (lo, hi) in (("key_range", self.key_range), ("value_range", self.value_range)):
            if self.sep_token is not None and lo <= self.sep_token < hi:
                raise ValueError(
                    f"{rname}={(lo, hi)} must not contain the SEP token {self.sep_token} (= vocab_size - 1)"
                )
        nk = self.key_range[1] - self.key_range[0]
        if nk < n:
            raise ValueError(
                f"vocab_size={V} is too small: {n} distinct keys are needed but the key range "
                f"{self.key_range} holds {nk} tokens"
            )
        if layout == "zoology" and self.value_range[1] - self.value_range[0] < n:
            raise ValueError(
                f"vocab_size={V} is too small: zoology needs {n} distinct values but the value range "
                f"{self.value_range} holds {self.value_range[1] - self.value_range[0]} tokens"
            )
        if layout == "zoology":
            self.space = (self.seq_len - 2 * n) // 2
            self._gap_p = power_law_gap_probs(self.space, self.power_a).float()
            ea = self.power_a if self.eval_power_a is None else self.eval_power_a
            self._eval_gap_p = power_law_gap_probs(self.space, ea).float()
        else:
            self.space = 0
            self.filler_len = self.seq_len - (3 * n + 1)
            if self.filler_len > 0 and random_non_queries and (V - 1) - n < 1:
                raise ValueError(f"vocab_size={V} leaves no filler tokens besides the {n} keys and SEP")

    def config(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "vocab_size": self.vocab_size,
            "num_pairs": self.num_pairs,
            "seq_len": self.seq_len,
            "layout": self.layout,
            "power_a": self.power_a,
            "random_non_queries": self.random_non_queries,
            "key_range": list(self.key_range),
            "value_range": list(self.value_range),
            "pad_token": self.pad_token,
            "eval_power_a": self.eval_power_a,
            "eval_seed": self.eval_seed,
        }

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        B = self._check_batch(batch_size)
        if self.layout == "zoology":
            return self._sample_zoology(B, generator, self._gap_p)
        return self._sample_vla(B, generator)

    def _eval_sample(self, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        if self.layout == "zoology":
            return self._sample_zoology(batch_size, generator, self._eval_gap_p)
        return self._sample_vla(batch_size, generator)

    def _filler(self, shape: tuple[int, ...], g: torch.Generator | None) -> Tensor:
        if self.random_non_queries:
            return torch.randint(0, self.vocab_size, shape, generator=g)
        return torch.full(shape, self.pad_token, dtype=torch.long)

    def _sample_zoology(self, B: int, g: torch.Generator | None, gap_p: Tensor) -> tuple[Tensor, Tensor]:
        n, T = self.num_pairs, self.seq_len
        keys = _distinct(B, n, *self.key_range, g)
        values = _distinct(B, n, *self.value_range, g)
        gaps = torch.multinomial(gap_p.expand(B, self.space), n, replacement=False, generator=g)
        x = self._filler((B, T), g)
        x[:, 0 : 2 * n : 2] = keys
        x[:, 1 : 2 * n : 2] = values
        qpos = 2 * n + 2 * gaps
        x.scatter_(1, qpos, keys)
        y = torch.full((B, T), IGNORE_INDEX, dtype=torch.long)
        y.scatter_(1, qpos, values)
        return x, y

    def _sample_vla(self, B: int, g: torch.Generator | None) -> tuple[Tensor, Tensor]:
        n, T, V = self.num_pairs, self.seq_len, self.vocab_size
        keys = _distinct(B, n, *self.key_range, g)
        vlo, vhi = self.value_range
        values = torch.randint(vlo, vhi, (B, n), generator=g)
        perm = torch.rand(B, n, generator=g).argsort(dim=1)
        x = torch.empty((B, T), dtype=torch.long)
        x[:, 0 : 2 * n : 2] = keys
        x[:, 1 : 2 * n : 2] = values
        F = self.filler_len
        if F > 0:
            if self.random_non_queries:
                # uniform over [0, V-1) minus this example's keys: u in [0, V-1-n), then skip the sorted keys
                s = keys.sort(dim=1).values
                adj = (s - torch.arange(n)).contiguous()
                u = torch.randint(0, V - 1 - n, (B, F), generator=g)
                x[:, 2 * n : 2 * n + F] = u + torch.searchsorted(adj, u, right=True)
            else:
                x[:, 2 * n : 2 * n + F] = self.pad_token
        x[:, 2 * n + F] = self.sep_token
        x[:, T - n :] = keys.gather(1, perm)
        y = torch.full((B, T), IGNORE_INDEX, dtype=torch.long)
        y[:, T - n :] = values.gather(1, perm)
        return x, y

    def metrics(self, logits: Tensor, targets: Tensor) -> dict[str, float]:
        """``accuracy`` (per query) and ``sequence_accuracy`` (every query of an example right)."""
        acc, _ = masked_accuracy(logits, targets)
        mask = targets != IGNORE_INDEX
        wrong = ((logits.argmax(-1) != targets) & mask).any(dim=1)
        has = mask.any(dim=1)
        seq_acc = float((~wrong & has).sum()) / max(int(has.sum()), 1)
        return {"accuracy": acc, "sequence_accuracy": seq_acc}
