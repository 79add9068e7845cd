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
def test_packed_equals_separate(name, cfg):
    """Both paths: with final states (segments by length) and without (one right-padded call)."""
    m = make(name, cfg)
    xs = [x.requires_grad_(True) for x in seqs(m, LENS)]
    g = torch.Generator().manual_seed(5)
    w = [torch.randn(x.shape, generator=g, dtype=x.dtype) for x in xs]
    alone = [m(x) for x in xs]
    y_ref = [a[0] for a in alone]
    want = grads(m, xs, y_ref, w)
    names = [f"x{i}" for i in range(len(xs))] + [n for n, _ in m.named_parameters()]
    for final in (True, False):
        what = f"{name} (output_final_state={final})"
        y, st = m(torch.cat(xs, 1), cu_seqlens=cu(LENS), output_final_state=final)
        assert y.shape == (1, sum(LENS), m.d_model)
        assert y.abs().max() > 1e-6, "output identically zero: the test would be vacuous"
        assert_rel_close(y, torch.cat(y_ref, 1), TOL, f"{what}: packed output")
        if final:
            for i, (s, (_, ws)) in enumerate(zip(rows(st, len(LENS)), alone)):
                assert_states_equal(s, ws, f"{what}: final state of sequence {i}")
        else:
            assert st is None
        got = grads(m, xs, list(y.split(LENS, 1)), w)
        for n, a, b in zip(names, got, want):
            assert (a is None) == (b is None), f"{what}: grad of {n} missing on one side"
            if a is not None and b.abs().max() > 0:
                assert_rel_close(a, b, TOL * 10, f"{what}: grad wrt {n}")


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


# -- the language model: attention_mask (left / right padding), position_ids (packing), cu_seqlens ----------------
def _lm(name, n_layers=1, seed=0):
    from seqmem.models import LanguageModel, LMConfig

    opts = dict(get_entry(name).cls.contract_configs[0]) if isinstance(name, str) else {}
    d = opts.pop("d_model", D)
    torch.manual_seed(seed)
    cfg = LMConfig(vocab_size=32, d_model=d, n_layers=n_layers, n_heads=H, mixer=name, mixer_options=opts,
                   mlp_ratio=2.0, init_std=0.3)
    return LanguageModel(cfg).double().eval()


def _prompts(lens, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, 32, (n,), generator=g) for n in lens]


def _pad(prompts, left: bool, pad_id: int = 7):
    T = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), T), pad_id)
    mask = torch.zeros(len(prompts), T, dtype=torch.long)
    for i, p in enumerate(prompts):
        sl = slice(T - len(p), T) if left else slice(0, len(p))
        ids[i, sl], mask[i, sl] = p, 1
    return ids, mask


@pytest.mark.parametrize("name", list_mixers())
@pytest.mark.parametrize("left", [True, False], ids=["left", "right"])
def test_lm_padded_equals_unpadded(name, left):
    """Every registered mixer in a language model: a padded batch gives each row's unpadded logits and state, in one
    call of every block (float64)."""
    m = _lm(name)
    prompts = _prompts([3, 9, 6, 9])
    ids, mask = _pad(prompts, left)
    logits, state = m(ids, attention_mask=mask)
    logits2, none = m(ids, attention_mask=mask, output_final_state=False)
    assert none is None
    T = ids.shape[1]
    for i, p in enumerate(prompts):
        want, want_state = m(p[None])
        sl = slice(T - len(p), T) if left else slice(0, len(p))
        assert_rel_close(logits[i, sl], want[0], TOL, f"{name}: row {i}")
        assert_rel_close(logits2[i, sl], want[0], TOL, f"{name}: row {i}, no final state")
        assert bool((logits[i][mask[i] == 0] == 0).all())
        for layer, (st, ws) in enumerate(zip(state, want_state)):
            assert_states_equal(rows(st, len(prompts))[i], ws, f"{name}: layer {layer} state of row {i}")


@pytest.mark.parametrize("name", list_mixers())
def test_lm_continues_a_padded_call_without_a_mask(name):
    """Every registered mixer: the state of a left-padded call continues with a plain call (no attention_mask), each
    row as if alone — for mixers whose rows' states cannot be batched (KV caches of different lengths) too, which
    used to be refused with a message about cu_seqlens the caller never passed."""
    m = _lm(name)
    prompts = _prompts([3, 9, 6])
    ids, mask = _pad(prompts, left=True)
    _, state = m(ids, attention_mask=mask)
    nxt = torch.randint(1, 32, (len(prompts), 4), generator=torch.Generator().manual_seed(5))
    logits, state2 = m(nxt, state)
    for i, p in enumerate(prompts):
        want, want_state = m(torch.cat([p, nxt[i]])[None])
        assert_rel_close(logits[i], want[0, -4:], TOL, f"{name}: row {i}")
        for layer, (st, ws) in enumerate(zip(state2, want_state)):
            assert_states_equal(rows(st, len(prompts))[i], ws, f"{name}: layer {layer} state of row {i}")


def test_lm_position_ids_and_cu_seqlens_packing():
    """Sequences packed in a row (position_ids restarting at 0, or cu_seqlens): each one's logits are its own."""
    m = _lm(["gated_deltanet", "attention"], n_layers=2)
    docs = _prompts([5, 8, 3])
    row = torch.cat(docs)[None]
    pos = torch.cat([torch.arange(len(d)) for d in docs])[None]
    c = cu([len(d) for d in docs])
    alone = [m(d[None]) for d in docs]
    for kw in ({"position_ids": pos}, {"cu_seqlens": c}):
        logits, state = m(row, **kw)
        assert_rel_close(logits, torch.cat([a[0] for a in alone], 1), TOL, f"packed via {list(kw)}")
        if "cu_seqlens" in kw:  # one state per sequence
            for layer in range(2):
                for i, (_, ws) in enumerate(alone):
                    assert_states_equal(rows(state[layer], 3)[i], ws[layer], f"layer {layer} sequence {i}")
        else:  # the row's state is its last sequence's
            for layer in range(2):
                assert_states_equal(rows(state[layer], 1)[0], alone[-1][1][layer], f"layer {layer}")
    # two rows, each packed, with right padding in one
    ids = torch.stack([row[0], torch.cat([docs[2], docs[0], torch.zeros(8, dtype=torch.long)])])
    mask = torch.tensor([[1] * 16, [1] * 8 + [0] * 8])
    pid = torch.stack([pos[0], torch.cat([torch.arange(3), torch.arange(5), torch.zeros(8, dtype=torch.long)])])
    logits, _ = m(ids, attention_mask=mask, position_ids=pid)
    assert_rel_close(logits[1, :8], torch.cat([alone[2][0], alone[0][0]], 1)[0], TOL, "row 1")
    assert_rel_close(logits[0], torch.cat([a[0] for a in alone], 1)[0], TOL, "row 0")
    # scoring positions combine with packing
    positions = torch.zeros(ids.shape, dtype=torch.bool)
    positions[0, 6], positions[1, 2] = True, True
    scored, _ = m(ids, positions=positions, attention_mask=mask, position_ids=pid)
    assert_rel_close(scored, logits[positions], TOL, "positions")


def test_lm_padding_errors():
    m = _lm("deltanet")
    ids = torch.randint(0, 32, (2, 6))
    with pytest.raises(ValueError, match="pads between real tokens"):
        m(ids, attention_mask=torch.tensor([[1, 1, 0, 1, 1, 1], [1] * 6]))
    for bad in (2, -1):
        with pytest.raises(ValueError, match="only 0"):
            m(ids, attention_mask=torch.tensor([[bad, 1, 1, 1, 1, 1], [1] * 6]))
    with pytest.raises(ValueError, match="no 1"):
        m(ids, attention_mask=torch.tensor([[0] * 6, [1] * 6]))
    # wider than the tokens with no state to continue: its extra columns would describe a past that is not there
    # (the last 6 columns were read, silently dropping row 1's padding at the front)
    with pytest.raises(ValueError, match="10 columns for 6 tokens and no state"):
        m(ids, attention_mask=torch.tensor([[1] * 10, [0] * 3 + [1] * 7]))
    with pytest.raises(ValueError, match="count up by one"):
        m(ids, position_ids=torch.tensor([[0, 1, 2, 4, 5, 6], list(range(6))]))
    with pytest.raises(ValueError, match="batch 1"):
        m(ids, cu_seqlens=torch.tensor([0, 3, 6]))
    with pytest.raises(ValueError, match="not both"):
        m(ids[:1], cu_seqlens=torch.tensor([0, 3, 6]), position_ids=torch.arange(6)[None])
    with pytest.raises(ValueError, match="pads cannot be combined"):
        m(ids[:1], cu_seqlens=torch.tensor([0, 3, 6]), attention_mask=torch.tensor([[1, 1, 1, 1, 1, 0]]))
    _, st = m(ids)
    with pytest.raises(ValueError, match="cannot continue a cache"):
        m(ids, st, position_ids=torch.tensor([[3, 4, 5, 0, 1, 2], list(range(6, 12))]))
    with pytest.raises(ValueError, match="restart at 0"):
        m(ids, st, position_ids=torch.tensor([list(range(6)), list(range(6, 12))]))
    m(ids, st, position_ids=torch.tensor([list(range(6, 12)), list(range(6, 12))]))  # a continuation is fine
    m(ids, position_ids=torch.arange(6)[None])  # (1, time) broadcasts over the batch


# -- the Hugging Face model ---------------------------------------------------------------------------------------
def _hf(mixer=("gated_deltanet", "attention")):
    transformers = pytest.importorskip("transformers")
    from seqmem.hf import SeqmemConfig

    torch.manual_seed(0)
    cfg = SeqmemConfig(vocab_size=40, d_model=16, n_layers=len(mixer), n_heads=2, mixer=list(mixer),
                       mlp_ratio=2.0, init_std=0.3)
    return transformers.AutoModelForCausalLM.from_config(cfg).eval()


def _cache(out):
    """The cache of a model output (``cache`` in transformers 5.x, ``past_key_values`` before)."""
    return getattr(out, "cache", None) if "cache" in type(out).__dataclass_fields__ else out.past_key_values


def test_hf_packed_document_logits_equal_document_alone():
    """transformers' DataCollatorWithFlattening packs documents into one row with restarting position_ids: the
    second document's logits equal its logits alone (no state leaks across the boundary), and the loss counts
    no target across it."""
    transformers = pytest.importorskip("transformers")
    m = _hf()
    docs = [[3, 9, 4, 1, 5, 22, 8], [5, 6, 7, 30, 2]]
    batch = transformers.DataCollatorWithFlattening()([{"input_ids": d} for d in docs])
    out = m(**batch)
    alone = [m(torch.tensor([d])) for d in docs]
    torch.testing.assert_close(out.logits[0, len(docs[0]):], alone[1].logits[0])
    torch.testing.assert_close(out.logits[0, : len(docs[0])], alone[0].logits[0])
    losses = [m(torch.tensor([d]), labels=torch.tensor([d])).loss for d in docs]
    want = sum(loss * (len(d) - 1) for loss, d in zip(losses, docs)) / sum(len(d) - 1 for d in docs)
    torch.testing.assert_close(out.loss, want)
    # the same row with explicit cu_seqlens; labels without the collator's separators: the boundary is ignored
    ids = batch["input_ids"]
    out2 = m(ids, cu_seqlens=torch.tensor([0, 7, 12]), labels=ids, use_cache=True)
    torch.testing.assert_close(out2.logits, out.logits)
    torch.testing.assert_close(out2.loss, want)
    assert _cache(out2).batch_size == 2  # one row per packed sequence


def test_hf_padded_batch_runs_every_block_once():
    """Rows of four different lengths: one call of every block (and, without a cache, of every mixer)."""
    m = _hf()
    ids, mask = _pad(_prompts([3, 9, 6, 5]), left=False)
    blocks, mixers = [], []
    for blk in m.model.blocks:
        blk.register_forward_pre_hook(lambda *a: blocks.append(1))
        orig = blk.mixer._forward
        blk.mixer._forward = lambda x, s, orig=orig: (mixers.append(1), orig(x, s))[1]
    m.train()
    out = m(ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100))
    out.loss.backward()
    assert len(blocks) == 2 and len(mixers) == 2
    assert _cache(out) is None  # training: no cache by default
    blocks.clear()
    m.eval()
    left_ids, left_mask = _pad(_prompts([3, 9, 6, 5]), left=True)
    m(left_ids, attention_mask=left_mask, use_cache=True)
    assert len(blocks) == 2


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_hf_gradient_checkpointing_with_padding():
    """Checkpointed blocks get the packing too: equal gradients with and without checkpointing."""
    ids = torch.randint(1, 40, (3, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 10, dtype=torch.long)
    mask[0, 6:], mask[2, :3] = 0, 0
    grads = []
    for kwargs in (None, {}, {"use_reentrant": True}):
        m = _hf().train()
        if kwargs is not None:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs or None)
        m(ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss.backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    for g in grads[1:]:
        assert g.keys() == grads[0].keys() and len(g) > 5
        for k in g:
            torch.testing.assert_close(g[k], grads[0][k], rtol=1e-5, atol=1e-7)
