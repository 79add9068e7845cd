"""The action mask (Echo App. F eq. 53) through the LM backbone: ``model(ids, action_mask=m)`` reaches the SKA
layers only; no mask == all ones exactly; streaming with the mask split; the scored-positions path; causality;
refusals (no SKA layer, padding/packing, bad masks)."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_rel_close
from seqmem.models import LanguageModel, LMConfig

V, T = 40, 30


def hybrid(chunk_size: int = 4) -> LanguageModel:
    cfg = LMConfig(vocab_size=V, d_model=16, n_layers=3, n_heads=2, mixer=["mamba2", "ska", "ska"],
                   mixer_options=[{"d_state": 4}, {"rank": 4, "chunk_size": chunk_size},
                                  {"rank": 4, "chunk_size": chunk_size}])
    torch.manual_seed(0)
    model = LanguageModel(cfg).double()
    with torch.no_grad():
        for blk in model.blocks:
            if blk.mixer.takes_action_mask:
                blk.mixer.w_o.weight.normal_(0, 0.3)  # zero-init would make SKA a no-op
    return model


def ids_and_mask(B=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, T), generator=g)
    mask = torch.rand(B, T, generator=g) < 0.4
    return ids, mask


def test_mask_reaches_ska_and_none_equals_ones():
    model = hybrid()
    ids, mask = ids_and_mask()
    full, st = model(ids)
    ones, st1 = model(ids, action_mask=torch.ones(2, T, dtype=torch.long))
    assert torch.equal(ones, full)
    assert all(torch.equal(a[k], b[k]) for a, b in zip(st1, st) for k in a)
    masked, _ = model(ids, action_mask=mask)
    assert (masked - full).abs().max() > 1e-3


def test_masked_streaming_and_positions():
    model = hybrid()
    ids, mask = ids_and_mask()
    full, _ = model(ids, action_mask=mask)
    a, st = model(ids[:, :13], action_mask=mask[:, :13])
    b, _ = model(ids[:, 13:], st, action_mask=mask[:, 13:])
    assert_rel_close(torch.cat([a, b], 1), full, 1e-9, "split 13/17")
    pos = torch.zeros(2, T, dtype=torch.bool)
    pos[:, [5, 17, 29]] = True
    sparse, _ = model(ids, positions=pos, action_mask=mask)
    assert_rel_close(sparse, full[pos], 1e-12, "scored positions")


def test_masked_model_is_causal():
    """Flipping m_t changes no logit before the SKA chunk after t's."""
    model = hybrid(chunk_size=5)
    ids, mask = ids_and_mask()
    full, _ = model(ids, action_mask=mask)
    for t in (3, 12, 21):
        m2 = mask.clone()
        m2[:, t] = ~m2[:, t]
        out, _ = model(ids, action_mask=m2)
        nxt = (t // 5 + 1) * 5
        assert_rel_close(out[:, :nxt], full[:, :nxt], 1e-12, f"before position {nxt}")
        assert (out[:, nxt:] - full[:, nxt:]).abs().max() > 0


def test_refusals():
    ids, mask = ids_and_mask()
    plain = LanguageModel(LMConfig(vocab_size=V, d_model=16, n_layers=2, n_heads=2, mixer=["mamba2", "attention"],
                                   mixer_options=[{"d_state": 4}, {}]))
    with pytest.raises(ValueError, match="no layer of this model takes an action mask"):
        plain(ids, action_mask=mask)
    model = hybrid()
    with pytest.raises(ValueError, match="cannot be combined"):
        model(ids, attention_mask=torch.ones(2, T, dtype=torch.long), action_mask=mask)
    with pytest.raises(ValueError, match="shape"):
        model(ids, action_mask=mask[:, :-1])
    with pytest.raises(ValueError, match="only 0 and 1"):
        model(ids, action_mask=mask.long() * 2)


def test_a_non_bool_mask_is_value_checked_once_per_model_call():
    """An integer or float 0/1 mask is checked where it enters (one read of the device) and handed on as bool, so
    the two SKA layers and their ops add no read of their own (they checked it again, three reads per layer)."""
    from collections import Counter

    from seqmem.bench.syncs import _spy

    model = hybrid()
    ids, mask = ids_and_mask()
    with_bool: Counter = Counter()
    with _spy(with_bool):
        want, _ = model(ids, action_mask=mask)
    found: Counter = Counter()
    with _spy(found):
        got, _ = model(ids, action_mask=mask.double())
    assert torch.equal(got, want)
    assert sum(found.values()) == sum(with_bool.values()) + 1, (found, with_bool)
