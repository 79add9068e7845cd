"""Packed sequences (``cu_seqlens``), tested for EVERY registered mixer, in the style of ``tests/test_contract.py``.

Packed ≡ each sequence alone (float64): outputs, gradients (input and parameters) and final states, with and
without initial states, on both varlen paths (``output_final_state`` True: segments by length; False: one padded
call).  Lengths cross the small chunk/block sizes of ``contract_configs``; shapes are tiny (d_model 16, T <= 24).
"""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

from conftest import assert_rel_close
from seqmem import build_mixer, get_entry, list_mixers
from seqmem.mixers.base import split_states, stack_states

D, H = 16, 2
TOL = 1e-9
LENS = [5, 9, 1, 9]  # T = 24: two equal lengths (one segment ends two sequences), one of a single token

CASES = [
    pytest.param(name, cfg, id=f"{name}" + (f"-{i}" if i else ""))
    for name in list_mixers()
    for i, cfg in enumerate(get_entry(name).cls.contract_configs)
]


def make(name: str, cfg: dict, seed: int = 0):
    cfg = dict(cfg)
    d = cfg.pop("d_model", D)
    cfg.setdefault("n_heads", H)
    torch.manual_seed(seed)
    m = build_mixer(name, d, **cfg).double()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return m


def seqs(m, lens, seed=3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, n, m.d_model, generator=g, dtype=torch.float64) for n in lens]


def cu(lens) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


def rows(state, n):
    """A varlen call's state as ``n`` batch-1 states."""
    assert isinstance(state, (dict, list))
    out = split_states(state, n)
    assert len(out) == n
    return out


def assert_states_equal(got: dict, want: dict, what: str) -> None:
    assert set(got) == set(want), f"{what}: keys {sorted(got)} != {sorted(want)}"
    for k in want:
        assert got[k].shape == want[k].shape, f"{what}: state[{k}] shape {tuple(got[k].shape)}"
        if want[k].numel() == 0:
            continue
        if want[k].is_floating_point():
            assert_rel_close(got[k], want[k], TOL * 10, f"{what}: state[{k}]")
        else:
            assert torch.equal(got[k], want[k]), f"{what}: state[{k}]"


def grads(m, xs: list[torch.Tensor], ys: list[torch.Tensor], w: list[torch.Tensor]):
    loss = sum((y * wi).sum() for y, wi in zip(ys, w))
    return torch.autograd.grad(loss, [*xs, *m.parameters()], allow_unused=True)


@pytest.mark.parametrize("name,cfg", CASES)
@pytest.mark.parametrize("final", [True, False], ids=["final", "nofinal"])
def test_packed_equals_separate(name, cfg, final):
    m = make(name, cfg)
    xs = [x.requires_grad_(True) for x in seqs(m, LENS)]
    g = torch.Generator().manual_seed(5)
    w = [torch.randn(x.shape, generator=g, dtype=x.dtype) for x in xs]
    alone = [m(x) for x in xs]
    y_ref = [a[0] for a in alone]
    y, st = m(torch.cat(xs, 1), cu_seqlens=cu(LENS), output_final_state=final)
    assert y.shape == (1, sum(LENS), m.d_model)
    assert y.abs().max() > 1e-6, "output identically zero: the test would be vacuous"
    assert_rel_close(y, torch.cat(y_ref, 1), TOL, f"{name}: packed output")
    if final:
        for i, (s, (_, want)) in enumerate(zip(rows(st, len(LENS)), alone)):
            assert_states_equal(s, want, f"{name}: final state of sequence {i}")
    else:
        assert st is None
    ys = list(y.split(LENS, 1))
    got, want = grads(m, xs, ys, w), grads(m, xs, y_ref, w)
    names = [f"x{i}" for i in range(len(xs))] + [n for n, _ in m.named_parameters()]
    for n, a, b in zip(names, got, want):
        assert (a is None) == (b is None), f"{name}: grad of {n} missing on one side"
        if a is not None and b.abs().max() > 0:
            assert_rel_close(a, b, TOL * 10, f"{name}: grad wrt {n}")


@pytest.mark.parametrize("name,cfg", CASES)
def test_packed_from_initial_states(name, cfg):
    """Each sequence continues its own state: prefixes of different lengths (states that may not stack, given
    back as the list a varlen call returns) and of one length (one batched state)."""
    m = make(name, cfg)
    pre, cont = [7, 2, 7], [4, 9, 1]
    xp, xc = seqs(m, pre, seed=4), seqs(m, cont, seed=6)
    st0 = [m(x)[1] for x in xp]
    alone = [m(x, s) for x, s in zip(xc, st0)]
    _, packed_st0 = m(torch.cat(xp, 1), cu_seqlens=cu(pre))  # the same initial states, from one packed call
    for given in (st0, packed_st0):
        y, st = m(torch.cat(xc, 1), given, cu_seqlens=cu(cont))
        assert_rel_close(y, torch.cat([a[0] for a in alone], 1), TOL, f"{name}: packed continuation")
        for i, (s, (_, want)) in enumerate(zip(rows(st, len(cont)), alone)):
            assert_states_equal(s, want, f"{name}: final state of sequence {i}")
        y2, none = m(torch.cat(xc, 1), given, cu_seqlens=cu(cont), output_final_state=False)
        assert none is None
        assert_rel_close(y2, y, TOL, f"{name}: packed continuation, padded path")
    # prefixes of one length: their states stack into one batch of N
    xq = seqs(m, [6, 6, 6], seed=8)
    batched = stack_states([m(x)[1] for x in xq])
    assert isinstance(batched, dict)
    y, _ = m(torch.cat(xc, 1), batched, cu_seqlens=cu(cont))
    ref = [m(x, s)[0] for x, s in zip(xc, split_states(batched, 3))]
    assert_rel_close(y, torch.cat(ref, 1), TOL, f"{name}: packed continuation of a batched state")


def test_stacked_states_where_they_can_be():
    """Fixed-size recurrent states come back as one batch of N; KV caches of different lengths as a list."""
    m = make("gated_deltanet", {"chunk_size": 8})
    _, st = m(torch.cat(seqs(m, LENS), 1), cu_seqlens=cu(LENS))
    assert isinstance(st, dict) and st["S"].shape[0] == len(LENS)
    a = make("attention", {})
    _, st = a(torch.cat(seqs(a, LENS), 1), cu_seqlens=cu(LENS))
    assert isinstance(st, list) and [s["k"].shape[2] for s in st] == LENS


def test_one_call_without_final_state_and_one_per_length_with_it():
    m = make("gated_deltanet", {"chunk_size": 8})
    calls = []
    m.register_forward_pre_hook(lambda *a: None)
    orig = m._forward
    m._forward = lambda x, s: (calls.append(tuple(x.shape[:2])), orig(x, s))[1]  # type: ignore[method-assign]
    x = torch.cat(seqs(m, LENS), 1)
    m(x, cu_seqlens=cu(LENS), output_final_state=False)
    assert calls == [(4, 9)]  # one call, right-padded to the longest
    calls.clear()
    m(x, cu_seqlens=cu(LENS))
    assert calls == [(4, 1), (3, 4), (2, 4)]  # segments ending at lengths 1, 5, 9; finished rows drop out


class _NoPacking:
    varlen_unsupported: ClassVar[str] = "this test's reason"


def test_bad_cu_seqlens_and_states_raise():
    m = make("deltanet", {"chunk_size": 8})
    x = torch.cat(seqs(m, LENS), 1)
    T = x.shape[1]
    bad = [
        (torch.tensor([1, 5, T]), "from 0"),
        (torch.tensor([0, 5, T - 1]), "from 0"),
        (torch.tensor([0, 5, 5, T]), "increase strictly"),
        (torch.tensor([0, 9, 5, T]), "increase strictly"),
        (torch.tensor([0.0, 5.0, float(T)]), "integer"),
        (torch.tensor([[0, 5, T]]), "1-D"),
        (torch.tensor([0]), "from 0"),
        ("0,5", "integer tensor"),
    ]
    for c, match in bad:
        with pytest.raises(ValueError, match=match):
            m(x, cu_seqlens=c)
    with pytest.raises(ValueError, match="batch 1"):
        m(x.expand(2, -1, -1), cu_seqlens=cu(LENS))
    _, st = m(x, cu_seqlens=cu(LENS))
    with pytest.raises(ValueError, match="batch 2 for the 2 sequences in cu_seqlens, got batch 4"):
        m(x[:, :6], st, cu_seqlens=torch.tensor([0, 3, 6]))
    with pytest.raises(ValueError, match="2 per-sequence states for 3"):
        m(x[:, :6], split_states(st, 4)[:2], cu_seqlens=torch.tensor([0, 2, 4, 6]))
    with pytest.raises(ValueError, match="needs cu_seqlens"):
        m(x, split_states(st, 4)[:1])
    with pytest.raises(ValueError, match="output_final_state"):
        m(x, cu_seqlens=cu(LENS), output_final_state=1)
    with pytest.raises(TypeError):
        m(x, cu_seqlens=cu(LENS), seq_idx=None)  # unknown keyword
    # a list form is accepted too
    y, _ = m(x, cu_seqlens=[0, *torch.tensor(LENS).cumsum(0).tolist()])
    assert y.shape == x.shape
    # a mixer that cannot run packed sequences refuses, with its reason
    refuse = type("Refuse", (_NoPacking, type(m)), {})
    r = refuse(D, n_heads=H, chunk_size=8).double()
    with pytest.raises(ValueError, match="cannot take cu_seqlens.*this test's reason"):
        r(x, cu_seqlens=cu(LENS))
    r(x)  # without cu_seqlens it runs
