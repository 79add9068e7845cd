"""Synthetic retrieval tasks for the Echo reproduction (Tables 2–3, §4.2).  The paper does NOT specify its
data generators; every layout below is OUR design, documented in docs/echo.md.

One vocabulary layout for all tasks (default ``vocab_size=128``):

* specials ``0..7``: PAD 0, SEP 1, Q (query marker) 2, ARROW 3, COLON 4, EQ 5, LIST_A 6, LIST_B 7;
* keys ``[8, 8 + n)``, values ``[8 + n, 8 + 2n)``, filler (distractors) ``[8 + 2n, V)`` with
  ``n = (V - 8) // 3`` (V = 128: 40 keys, 40 values, 40 filler tokens).

Only answer tokens are scored (``targets = -100`` elsewhere); the answer is predicted at the position of the
last query token (teacher forcing: answers that appear later as inputs never leak into their own prediction).
Every task returns exactly ``seq_len`` tokens (variable-length content is left-padded with filler).

Tasks (all registered):

* ``echo_mqar`` — MQAR with a distractor gap (§4.2): ``k1 v1 … kM vM | gap filler | kσ1 vσ1 … kσM vσM``; the
  value after each queried key is scored.  ``seq_len = 4M + gap``.
* ``echo_niah`` — needle in a haystack (Table 2, Fig. 1a): ``n_kv`` key–value bigrams at random positions in
  filler, then ``Q k`` → the value of one needle.
* ``echo_multihop`` — two-hop retrieval (Fig. 1b): chains ``a b`` and ``b c`` (a, b keys, c a value)
  scattered in filler, then ``Q a`` → ``c``.
* ``echo_sysprompt`` — system-prompt recall (App. G.4 Exp. 3): ``n_vars`` bindings ``var value`` at the start,
  SEP, a filler scratchpad with optional decoy bindings of other variables, then ``Q var`` → value for
  ``n_queries`` variables.
* ``echo_tooltrace`` — tool-trace retrieval (App. G.4 Exp. 1): calls ``agent : tool → result`` (a later call may
  overwrite an earlier (agent, tool) binding), then ``Q agent : tool =`` → the latest result.
* ``echo_commonword`` — common-word identification (undefined in the paper; our choice, docs/echo.md): two
  delimited lists ``LIST_A …`` and ``LIST_B …`` sharing exactly one token (from the value range),
  then ``Q`` → that token.
* ``echo_mixture`` — the training curriculum of §4.1: half system-prompt (every variable queried),
  half tool-trace examples.

Action mask (``action_mask=True``, every task): ``sample`` / ``eval_data`` also return the oracle mask (B, T) of
the "fact-bearing" tokens (App. G.1: "only high-signal tokens contribute to the Gram and cross-covariance
matrices"; App. H.1: "restricts SKA's covariance accumulation to fact-bearing tokens"), which the model gives its
SKA layers (App. F eq. 53).  The paper does not list them per task; ours are the tokens of the facts a query may
ask for, every one of them (not only the one asked), and never the query, the filler or the separators:

* NIAH: both tokens ``k v`` of every needle;
* MQAR: the ``2M`` context tokens ``k1 v1 … kM vM`` (not the query block, whose values repeat the context's);
* MultiHop: both tokens of every chain link ``a b`` and ``b c``;
* SysPrompt: every binding ``var value`` (the decoy bindings in the scratchpad too: they are facts, of variables
  not asked);
* ToolTrace: all five tokens ``agent : tool → result`` of every call (eq. 53's ``M`` then links the call's
  tokens, and ``→`` to its result);
* CommonWord: the items of both lists (not the ``LIST_A`` / ``LIST_B`` markers).

In every task every fact comes before the first scored position (:func:`facts_precede_answers` checks a batch), so
the mask is 0 at every scored position and at every teacher-forced answer: a model that reads the facts with one
non-causal operator (SKA's ``operator_scope="sequence"``, App. F eq. 53) does not see a target through them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from seqmem.io import check_int
from seqmem.tasks.base import DEFAULT_EVAL_SEED, IGNORE_INDEX, Task, register_task

__all__ = [
    "EchoCommonWord",
    "EchoMQAR",
    "EchoMixture",
    "EchoMultiHop",
    "EchoNIAH",
    "EchoSysPrompt",
    "EchoToolTrace",
    "ECHO_TASKS",
    "facts_precede_answers",
]

PAD, SEP, Q, ARROW, COLON, EQ, LIST_A, LIST_B = range(8)
N_SPECIAL = 8


def _int(name: str, value: Any, minimum: int) -> int:
    check_int(name, value, minimum)
    return value


def facts_precede_answers(targets: Tensor, mask: Tensor) -> Tensor:
    """Per row (B,) bool: every scored position (``targets != -100``) comes after every fact (``mask = 1``), so the
    mask is 0 at each scored position ``p`` and at ``p + 1``, where teacher forcing puts ``p``'s answer in the input.
    A row without a scored position or without a fact passes.  ``targets``, ``mask``: (B, T)."""
    if targets.shape != mask.shape or targets.dim() != 2:
        raise ValueError(f"targets and mask must both be (batch, time), got {tuple(targets.shape)} and "
                         f"{tuple(mask.shape)}")
    T = targets.shape[1]
    pos = torch.arange(T, device=targets.device).expand_as(targets)
    last_fact = torch.where(mask != 0, pos, torch.full_like(pos, -1)).amax(1)
    first_scored = torch.where(targets != IGNORE_INDEX, pos, torch.full_like(pos, T)).amin(1)
    return last_fact < first_scored


class _EchoTask(Task):
    """Shared vocabulary layout and per-example assembly (a Python loop per example: fine at these sizes)."""

    def __init__(self, vocab_size: int, seq_len: int, eval_seed: int, action_mask: bool = False) -> None:
        super().__init__(eval_seed)
        if not isinstance(action_mask, bool):
            raise ValueError(f"action_mask must be True or False, got {action_mask!r}")
        self.action_mask = action_mask
        self.vocab_size = _int("vocab_size", vocab_size, N_SPECIAL + 9)
        self.seq_len = _int("seq_len", seq_len, 4)
        n = (self.vocab_size - N_SPECIAL) // 3
        self.n_sub = n
        self.keys = (N_SPECIAL, N_SPECIAL + n)
        self.values = (N_SPECIAL + n, N_SPECIAL + 2 * n)
        self.filler = (N_SPECIAL + 2 * n, self.vocab_size)

    # helpers ------------------------------------------------------------------------------------------------
    @staticmethod
    def _distinct(n: int, lo: int, hi: int, g: torch.Generator | None) -> list[int]:
        if hi - lo < n:
            raise ValueError(f"need {n} distinct tokens from a range of {hi - lo}")
        return (torch.randperm(hi - lo, generator=g)[:n] + lo).tolist()

    def _fill(self, n: int, g: torch.Generator | None) -> list[int]:
        return torch.randint(self.filler[0], self.filler[1], (n,), generator=g).tolist()

    def _finish(
        self, toks: list[int], answers: list[tuple[int, int]], g, facts: list[int]
    ) -> tuple[list[int], list[int], list[int]]:
        """Left-pad ``toks`` with filler to ``seq_len``; ``answers`` = (position in toks, answer token); ``facts`` =
        positions in toks of the fact-bearing tokens (the action mask's ones)."""
        T = self.seq_len
        if len(toks) > T:
            raise ValueError(f"{self.name}: an example needs {len(toks)} tokens but seq_len={T}; "
                f"raise seq_len")
        pad = T - len(toks)
        x = self._fill(pad, g) + toks
        y = [IGNORE_INDEX] * T
        for p, a in answers:
            y[pad + p] = a
        m = [0] * T
        for p in facts:
            m[pad + p] = 1
        return x, y, m

    def _scatter(self, items: list[list[int]], length: int, g) -> tuple[list[int], list[int]]:
        """Place the token groups ``items`` at random non-overlapping positions in ``length`` filler tokens,
        in
        random order; returns (tokens, start position of each item)."""
        used = sum(len(it) for it in items)
        if used > length:
            raise ValueError(f"{self.name}: {used} content tokens do not fit in {length} positions")
        free = length - used
        # positions of the items among the free filler tokens: sorted random slots
        slots = sorted(torch.randint(0, free + 1, (len(items),), generator=g).tolist())
        order = torch.randperm(len(items), generator=g).tolist()
        filler = self._fill(free, g)
        out: list[int] = []
        starts = [0] * len(items)
        prev = 0
        for s, idx in zip(slots, order):
            out += filler[prev:s]
            starts[idx] = len(out)
            out += items[idx]
            prev = s
        out += filler[prev:]
        return out, starts

    def _example(self, g: torch.Generator | None) -> tuple[list[int], list[int], list[int]]:
        """One example: tokens, targets and the 0/1 fact mask (:meth:`_finish`)."""
        raise NotImplementedError

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
        """``(input_ids, targets)``, plus the action mask (B, T) int64 with ``action_mask=True``; the mask draws no
        random numbers, so the examples are the same either way."""
        B = self._check_batch(batch_size)
        xs, ys, ms = zip(*(self._example(generator) for _ in range(B)))
        x, y = torch.tensor(xs, dtype=torch.long), torch.tensor(ys, dtype=torch.long)
        return (x, y, torch.tensor(ms, dtype=torch.long)) if self.action_mask else (x, y)

    def config(self) -> dict[str, Any]:
        # action_mask only when set, so the configurations recorded before the option stay as they were
        return {"name": self.name, "vocab_size": self.vocab_size, "seq_len": self.seq_len, "eval_seed":
        self.eval_seed, **({"action_mask": True} if self.action_mask else {})}


@register_task("echo_mqar")
class EchoMQAR(_EchoTask):
    """MQAR with a distractor gap (Echo §4.2; our layout): ``seq_len = 4·num_pairs + gap``."""

    name = "echo_mqar"

    def __init__(
        self, vocab_size: int = 128, num_pairs: int = 4, gap: int = 64, eval_seed: int = DEFAULT_EVAL_SEED,
        action_mask: bool = False, seq_len: int | None = None,
    ) -> None:
        self.num_pairs = _int("num_pairs", num_pairs, 1)
        self.gap = _int("gap", gap, 0)
        # seq_len is derived; accepted (and checked) so that build_task(**task.config()) rebuilds the task
        if seq_len is not None and seq_len != 4 * num_pairs + gap:
            raise ValueError(f"echo_mqar: seq_len is 4 * num_pairs + gap = {4 * num_pairs + gap}, got {seq_len}")
        super().__init__(vocab_size, 4 * num_pairs + gap, eval_seed, action_mask)
        if num_pairs > self.n_sub:
            raise ValueError(f"num_pairs={num_pairs} exceeds the {self.n_sub} keys of "
                f"vocab_size={vocab_size}")

    def _example(self, g):
        M = self.num_pairs
        ks = self._distinct(M, *self.keys, g)
        vs = self._distinct(M, *self.values, g)
        toks = [t for kv in zip(ks, vs) for t in kv] + self._fill(self.gap, g)
        answers = []
        for i in torch.randperm(M, generator=g).tolist():
            toks.append(ks[i])
            answers.append((len(toks) - 1, vs[i]))
            toks.append(vs[i])
        return self._finish(toks, answers, g, list(range(2 * M)))

    def config(self):
        return {**super().config(), "num_pairs": self.num_pairs, "gap": self.gap}


@register_task("echo_niah")
class EchoNIAH(_EchoTask):
    """Needle in a haystack: ``n_kv`` needles ``k v`` in filler, then ``Q k`` → v (one query per example)."""

    name = "echo_niah"

    def __init__(
        self, vocab_size: int = 128, seq_len: int = 64, n_kv: int = 1, eval_seed: int = DEFAULT_EVAL_SEED,
        action_mask: bool = False,
    ) -> None:
        super().__init__(vocab_size, seq_len, eval_seed, action_mask)
        self.n_kv = _int("n_kv", n_kv, 1)
        if 2 * n_kv + 2 > seq_len or n_kv > self.n_sub:
            raise ValueError(f"n_kv={n_kv} does not fit seq_len={seq_len} / vocab_size={vocab_size}")

    def _example(self, g):
        ks = self._distinct(self.n_kv, *self.keys, g)
        vs = self._distinct(self.n_kv, *self.values, g)
        hay, starts = self._scatter([[k, v] for k, v in zip(ks, vs)], self.seq_len - 2, g)
        i = int(torch.randint(0, self.n_kv, (1,), generator=g))
        toks = hay + [Q, ks[i]]
        return self._finish(toks, [(len(toks) - 1, vs[i])], g, [s + j for s in starts for j in (0, 1)])

    def config(self):
        return {**super().config(), "n_kv": self.n_kv}


@register_task("echo_multihop")
class EchoMultiHop(_EchoTask):
    """Two-hop retrieval: chains ``a b`` and ``b c`` scattered in filler; ``Q a`` → c."""

    name = "echo_multihop"

    def __init__(
        self, vocab_size: int = 128, seq_len: int = 64, n_kv: int = 3, eval_seed: int = DEFAULT_EVAL_SEED,
        action_mask: bool = False,
    ) -> None:
        super().__init__(vocab_size, seq_len, eval_seed, action_mask)
        self.n_kv = _int("n_kv", n_kv, 1)
        if 4 * n_kv + 2 > seq_len or 2 * n_kv > self.n_sub:
            raise ValueError(f"n_kv={n_kv} does not fit seq_len={seq_len} / vocab_size={vocab_size}")

    def _example(self, g):
        n = self.n_kv
        ab = self._distinct(2 * n, *self.keys, g)
        a, b = ab[:n], ab[n:]
        c = self._distinct(n, *self.values, g)
        items = [[a[i], b[i]] for i in range(n)] + [[b[i], c[i]] for i in range(n)]
        hay, starts = self._scatter(items, self.seq_len - 2, g)
        i = int(torch.randint(0, n, (1,), generator=g))
        toks = hay + [Q, a[i]]
        return self._finish(toks, [(len(toks) - 1, c[i])], g, [s + j for s in starts for j in (0, 1)])

    def config(self):
        return {**super().config(), "n_kv": self.n_kv}


@register_task("echo_sysprompt")
class EchoSysPrompt(_EchoTask):
    """System-prompt recall: ``var value`` bindings, SEP, a filler scratchpad (``decoys`` bindings of OTHER
    variables inside it), then ``Q var`` → value for ``n_queries`` variables (teacher-forced)."""

    name = "echo_sysprompt"

    def __init__(
        self,
        vocab_size: int = 128,
        seq_len: int = 64,
        n_vars: int = 4,
        n_queries: int = 2,
        decoys: int = 0,
        eval_seed: int = DEFAULT_EVAL_SEED,
        action_mask: bool = False,
    ) -> None:
        super().__init__(vocab_size, seq_len, eval_seed, action_mask)
        self.n_vars = _int("n_vars", n_vars, 1)
        self.n_queries = _int("n_queries", n_queries, 1)
        self.decoys = _int("decoys", decoys, 0)
        if n_queries > n_vars or n_vars + decoys > self.n_sub:
            raise ValueError("need n_queries <= n_vars and n_vars + decoys <= number of keys")
        if 2 * n_vars + 1 + 2 * decoys + 3 * n_queries > seq_len:
            raise ValueError(f"n_vars={n_vars}, decoys={decoys}, n_queries={n_queries} do not "
                f"fit seq_len={seq_len}")

    def _example(self, g):
        nv, nd = self.n_vars, self.decoys
        ks = self._distinct(nv + nd, *self.keys, g)
        vs = self._distinct(nv + nd, *self.values, g)
        prompt = [t for i in range(nv) for t in (ks[i], vs[i])] + [SEP]
        gap = self.seq_len - len(prompt) - 3 * self.n_queries
        pad, starts = self._scatter([[ks[nv + j], vs[nv + j]] for j in range(nd)], gap, g)
        facts = list(range(2 * nv)) + [len(prompt) + s + j for s in starts for j in (0, 1)]
        toks = prompt + pad
        answers = []
        for i in torch.randperm(nv, generator=g)[: self.n_queries].tolist():
            toks += [Q, ks[i]]
            answers.append((len(toks) - 1, vs[i]))
            toks.append(vs[i])
        return self._finish(toks, answers, g, facts)

    def config(self):
        return {**super().config(), "n_vars": self.n_vars, "n_queries": self.n_queries, "decoys": self.decoys}


@register_task("echo_tooltrace")
class EchoToolTrace(_EchoTask):
    """Tool-trace retrieval: calls ``agent : tool → result``; ``Q agent : tool =`` → the LATEST result of that
    (agent, tool) pair (calls may repeat a pair with a new result).  Agents are the first quarter of the
    keys."""

    name = "echo_tooltrace"

    def __init__(
        self,
        vocab_size: int = 128,
        seq_len: int = 64,
        n_calls: int = 6,
        n_pairs: int | None = None,
        eval_seed: int = DEFAULT_EVAL_SEED,
        action_mask: bool = False,
    ) -> None:
        super().__init__(vocab_size, seq_len, eval_seed, action_mask)
        self.n_calls = _int("n_calls", n_calls, 1)
        self.n_pairs = _int("n_pairs", n_pairs if n_pairs is not None else max(1, (2 * n_calls) // 3), 1)
        if self.n_pairs > self.n_calls:
            raise ValueError("n_pairs must be <= n_calls")
        if 5 * n_calls + 5 > seq_len:
            raise ValueError(f"n_calls={n_calls} needs seq_len >= {5 * n_calls + 5}, got {seq_len}")
        self.n_agents = max(1, self.n_sub // 4)
        self.n_tools = self.n_sub - self.n_agents

    def _example(self, g):
        k0 = self.keys[0]
        pairs: set[tuple[int, int]] = set()
        while len(pairs) < self.n_pairs:
            a = int(torch.randint(0, self.n_agents, (1,), generator=g))
            t = int(torch.randint(0, self.n_tools, (1,), generator=g))
            pairs.add((k0 + a, k0 + self.n_agents + t))
        plist = sorted(pairs)
        seq = [plist[i] for i in torch.randperm(len(plist), generator=g).tolist()]
        extra = torch.randint(0, len(plist), (self.n_calls - len(plist),), generator=g).tolist()
        for e in extra:  # repeated calls overwrite, inserted at random places
            pos = int(torch.randint(0, len(seq) + 1, (1,), generator=g))
            seq.insert(pos, plist[e])
        results = torch.randint(*self.values, (len(seq),), generator=g).tolist()
        latest = {}
        toks: list[int] = []
        for (a, t), r in zip(seq, results):
            toks += [a, COLON, t, ARROW, r]
            latest[(a, t)] = r
        facts = list(range(len(toks)))  # every call, all five tokens
        a, t = seq[int(torch.randint(0, len(seq), (1,), generator=g))]
        toks += [Q, a, COLON, t, EQ]
        return self._finish(toks, [(len(toks) - 1, latest[(a, t)])], g, facts)

    def config(self):
        return {**super().config(), "n_calls": self.n_calls, "n_pairs": self.n_pairs}


@register_task("echo_commonword")
class EchoCommonWord(_EchoTask):
    """Common-word identification (our definition): ``LIST_A a1..an LIST_B b1..bn Q`` → the one shared
    token."""

    name = "echo_commonword"

    def __init__(
        self, vocab_size: int = 128, seq_len: int = 64, list_len: int = 4, eval_seed: int = DEFAULT_EVAL_SEED,
        action_mask: bool = False,
    ) -> None:
        super().__init__(vocab_size, seq_len, eval_seed, action_mask)
        self.list_len = _int("list_len", list_len, 1)
        if 2 * list_len + 3 > seq_len or 2 * list_len - 1 > self.n_sub:
            raise ValueError(f"list_len={list_len} does not fit seq_len={seq_len} / vocab_size={vocab_size}")

    def _example(self, g):
        n = self.list_len
        toks_ = self._distinct(2 * n - 1, *self.values, g)
        common, a_rest, b_rest = toks_[0], toks_[1:n], toks_[n:]
        a = a_rest + [common]
        b = b_rest + [common]
        a = [a[i] for i in torch.randperm(n, generator=g).tolist()]
        b = [b[i] for i in torch.randperm(n, generator=g).tolist()]
        gap = self.seq_len - (2 * n + 3)
        toks = [LIST_A] + a + self._fill(gap, g) + [LIST_B] + b + [Q]
        b0 = 1 + n + gap + 1  # the first item of list B
        facts = list(range(1, 1 + n)) + list(range(b0, b0 + n))
        return self._finish(toks, [(len(toks) - 1, common)], g, facts)

    def config(self):
        return {**super().config(), "list_len": self.list_len}


@register_task("echo_mixture")
class EchoMixture(_EchoTask):
    """The §4.1 training curriculum: each example is a system-prompt or a tool-trace example (prob. 1/2
    each)."""

    name = "echo_mixture"

    def __init__(
        self,
        vocab_size: int = 128,
        seq_len: int = 64,
        n_vars: int = 4,
        n_calls: int = 6,
        eval_seed: int = DEFAULT_EVAL_SEED,
        action_mask: bool = False,
    ) -> None:
        super().__init__(vocab_size, seq_len, eval_seed, action_mask)
        self.n_vars, self.n_calls = n_vars, n_calls
        self.parts = [
            EchoSysPrompt(vocab_size, seq_len, n_vars=n_vars, n_queries=n_vars, eval_seed=eval_seed),
            EchoToolTrace(vocab_size, seq_len, n_calls=n_calls, eval_seed=eval_seed),
        ]

    def _example(self, g):
        return self.parts[int(torch.randint(0, 2, (1,), generator=g))]._example(g)

    def config(self):
        return {**super().config(), "n_vars": self.n_vars, "n_calls": self.n_calls}


ECHO_TASKS = {
    "MQAR": EchoMQAR,
    "SysPrompt": EchoSysPrompt,
    "ToolTrace": EchoToolTrace,
    "NIAH": EchoNIAH,
    "MultiHop": EchoMultiHop,
    "CommonWord": EchoCommonWord,
}
