import pytest
import torch

from conftest import assert_rel_close
from seqmem.models import LanguageModel, LMConfig


def tiny(mixer="attention", **kw):
    torch.manual_seed(0)
    cfg = LMConfig(vocab_size=50, d_model=32, n_layers=2, n_heads=2, mixer=mixer, **kw)
    return LanguageModel(cfg).double()


@pytest.mark.parametrize("mixer", ["attention", ["swa", "attention"], "deltanet", ["mamba2", "attention"]])
def test_streaming_model_equals_full_forward(mixer):
    m = tiny(mixer, mlp_ratio=0 if mixer == ["mamba2", "attention"] else 4.0)
    ids = torch.randint(0, 50, (2, 23))
    full, _ = m(ids)
    a, st = m(ids[:, :9])
    b, st = m(ids[:, 9:10], st)
    c, _ = m(ids[:, 10:], st)
    assert_rel_close(torch.cat([a, b, c], 1), full, 1e-9, "streamed logits")


@pytest.mark.parametrize("mixer", ["attention", "gated_deltanet"])
def test_generate_with_state_equals_recompute(mixer):
    m = tiny(mixer).float()
    ids = torch.randint(0, 50, (3, 7))
    greedy = m.generate(ids, 12)
    assert greedy.shape == (3, 19) and torch.equal(greedy[:, :7], ids)
    assert torch.equal(greedy, m.generate(ids, 12, use_state=False))
    s1 = m.generate(ids, 12, temperature=0.8, top_k=5, generator=torch.Generator().manual_seed(1))
    s2 = m.generate(ids, 12, temperature=0.8, top_k=5, generator=torch.Generator().manual_seed(1), use_state=False)
    assert torch.equal(s1, s2)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -0.5, True, "0.8"])
def test_generate_refuses_a_temperature_that_is_not_a_finite_number(bad):
    """NaN used to reach torch.multinomial (a RuntimeError), inf sampled uniformly, True passed as 1."""
    m = tiny("attention").float()
    with pytest.raises(ValueError, match="temperature"):
        m.generate(torch.randint(0, 50, (1, 4)), 2, temperature=bad)


def test_state_size_sums_layers_and_hybrid_layers_differ():
    m = tiny(["deltanet", "attention"])
    assert m.blocks[0].mixer.registered_name == "deltanet"
    assert m.blocks[1].mixer.registered_name == "attention"
    _, st = m(torch.randint(0, 50, (1, 10)))
    from seqmem import count_state

    assert sum(count_state(s) for s in st) == m.state_size(10)


def test_tied_head_and_no_mlp():
    m = tiny(mlp_ratio=0)
    assert m.head.weight is m.embed.weight
    assert all(b.mlp is None for b in m.blocks)


@pytest.mark.parametrize(
    "kw",
    [dict(n_layers=0), dict(mixer=["attention"]), dict(mixer_options=[{}]), dict(mlp_ratio=-1), dict(vocab_size=0)],
)
def test_bad_config(kw):
    base = dict(vocab_size=50, d_model=32, n_layers=2, n_heads=2)
    with pytest.raises(ValueError):
        LMConfig(**{**base, **kw})


def test_bad_ids():
    m = tiny()
    with pytest.raises(ValueError, match=r"\[0, 50\)"):
        m(torch.tensor([[1, 50]]))
    with pytest.raises(ValueError):
        m(torch.zeros(2, 3))
    with pytest.raises(ValueError):
        m(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError):
        m(torch.zeros(1, 3, dtype=torch.long), state=[{}])
    for empty in (torch.zeros(1, 0, dtype=torch.long), torch.zeros(0, 3, dtype=torch.long)):
        with pytest.raises(ValueError, match="empty"):
            m(empty)
