"""MQAR generators: layout invariants (zoology and VLA), streams, power-law placement, validation, metrics."""

import itertools

import numpy as np
import pytest
import torch
from scipy import stats

from seqmem.tasks import IGNORE_INDEX, MQARTask, Task, build_task, list_tasks, task_options
from seqmem.tasks.mqar import power_law_gap_probs


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _pairs(x_row, n):
    keys = x_row[0 : 2 * n : 2].tolist()
    values = x_row[1 : 2 * n : 2].tolist()
    return keys, values


@pytest.mark.parametrize("rnq", [True, False])
@pytest.mark.parametrize("V,n,T", [(8192, 8, 64), (64, 4, 37), (40, 16, 64)])
def test_zoology_layout_invariants(V, n, T, rnq):
    task = MQARTask(vocab_size=V, num_pairs=n, seq_len=T, layout="zoology", random_non_queries=rnq)
    x, y = task.sample(200, _gen(1))
    assert x.shape == y.shape == (200, T) and x.dtype == y.dtype == torch.int64
    assert int(x.min()) >= 0 and int(x.max()) < V
    for b in range(200):
        keys, values = _pairs(x[b], n)
        assert len(set(keys)) == n and len(set(values)) == n, "keys / values distinct within an example"
        assert all(1 <= k < V // 2 for k in keys) and all(V // 2 <= v < V for v in values), "disjoint halves"
        pos = (y[b] != IGNORE_INDEX).nonzero().flatten().tolist()
        assert len(pos) == n, "every key queried exactly once"
        assert all(p >= 2 * n and (p - 2 * n) % 2 == 0 and p <= T - 2 for p in pos), "queries on even slots"
        kv = dict(zip(keys, values))
        queried = [int(x[b, p]) for p in pos]
        assert sorted(queried) == sorted(keys)
        for p in pos:
            assert int(y[b, p]) == kv[int(x[b, p])], "target = value paired with the query key"
        if not rnq:
            filler = torch.ones(T, dtype=torch.bool)
            filler[: 2 * n] = False
            filler[pos] = False
            assert (x[b][filler] == 0).all(), "zoology zeros as filler"
    if rnq:  # random filler really is random (not all zeros)
        assert (x[:, 2 * n :] != 0).float().mean() > 0.5


def test_zoology_matches_documented_example():
    # zoology's docstring example: V=12, 2 pairs, T=16, zeros as filler
    task = MQARTask(vocab_size=12, num_pairs=2, seq_len=16, random_non_queries=False)
    x, y = task.sample(50, _gen(3))
    assert (x[:, :4:2] < 6).all() and (x[:, :4:2] >= 1).all() and (x[:, 1:4:2] >= 6).all()
    assert ((y != IGNORE_INDEX).sum(1) == 2).all()


@pytest.mark.parametrize("rnq", [True, False])
@pytest.mark.parametrize("V,n,T", [(128, 8, None), (128, 24, 73), (128, 8, 64), (12, 3, 14), (128, 96, None)])
def test_vla_layout_invariants(V, n, T, rnq):
    task = MQARTask(vocab_size=V, num_pairs=n, seq_len=T, layout="vla", random_non_queries=rnq, pad_token=5)
    T = 3 * n + 1 if T is None else T
    assert task.seq_len == T
    x, y = task.sample(100, _gen(2))
    assert x.shape == y.shape == (100, T)
    sep = V - 1
    perms = set()
    for b in range(100):
        keys, values = _pairs(x[b], n)
        assert len(set(keys)) == n and all(0 <= k < V - 1 for k in keys)
        assert all(0 <= v < V - 1 for v in values)
        assert int(x[b, T - n - 1]) == sep and int((x[b] == sep).sum()) == 1, "one SEP, right before queries"
        q = x[b, T - n :].tolist()
        assert sorted(q) == sorted(keys), "queries are a permutation of the keys"
        perms.add(tuple(keys.index(k) for k in q))
        kv = dict(zip(keys, values))
        assert (y[b, : T - n] == IGNORE_INDEX).all()
        assert y[b, T - n :].tolist() == [kv[k] for k in q], "target at each query = its value"
        filler = x[b, 2 * n : T - n - 1]
        assert filler.numel() == T - 3 * n - 1
        if rnq:
            assert not set(filler.tolist()) & set(keys), "noise filler excludes the example's keys"
            assert (filler < V - 1).all()
        else:
            assert (filler == 5).all()
    import math

    assert len(perms) >= min(50, math.factorial(n)), "σ is a random permutation"


def test_vla_values_may_repeat_and_noise_is_uniform():
    task = MQARTask(vocab_size=16, num_pairs=8, seq_len=None, layout="vla")
    x, _ = task.sample(500, _gen(0))
    vals = x[:, 1:16:2]
    dup = [len(set(r.tolist())) < 8 for r in vals]
    assert np.mean(dup) > 0.5, "values i.i.d. with replacement (8 draws of 15 → duplicates likely)"
    t2 = MQARTask(vocab_size=16, num_pairs=3, seq_len=400, layout="vla")
    x, _ = t2.sample(200, _gen(0))
    # every non-SEP token can appear as filler (in examples where it is not a key)
    filler = x[:, 6 : 400 - 4]
    assert set(filler.flatten().tolist()) == set(range(15))


def test_vla_ood_key_ranges():
    train = MQARTask(vocab_size=128, num_pairs=8, seq_len=None, layout="vla", key_range=(0, 64))
    ood = MQARTask(vocab_size=128, num_pairs=8, seq_len=None, layout="vla", key_range=(64, 127))
    x, _ = train.sample(100, _gen(0))
    assert (x[:, 0:16:2] < 64).all() and (x[:, 17:] < 64).all()
    xo, _ = ood.eval_data(100)
    assert (xo[:, 0:16:2] >= 64).all() and (xo[:, 0:16:2] < 127).all()
    assert (x[:, 1:16:2] >= 64).any(), "values still from the full range"


def test_streams_deterministic_separate_and_prefix_consistent():
    task = MQARTask(vocab_size=256, num_pairs=4, seq_len=32)
    a = task.eval_data(300)
    b = MQARTask(vocab_size=256, num_pairs=4, seq_len=32).eval_data(300)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), "eval stream reproducible across instances"
    c = task.eval_data(1000)
    assert torch.equal(c[0][:300], a[0]) and torch.equal(c[1][:300], a[1]), "prefix-consistent"
    assert torch.equal(task.eval_data(10)[0], a[0][:10])
    a[0][0, 0] = -1  # the cache is not aliased
    assert task.eval_data(1)[0][0, 0] != -1
    # training stream: determined by the generator, different from eval
    t1 = task.sample(64, _gen(0))[0]
    assert torch.equal(t1, task.sample(64, _gen(0))[0])
    assert not torch.equal(t1, task.sample(64, _gen(1))[0])
    ev = {tuple(r) for r in c[0].tolist()}
    for seed in range(3):
        tr = {tuple(r) for r in task.sample(1000, _gen(seed))[0].tolist()}
        assert len(ev & tr) == 0, "train examples never equal eval examples here"
    other = MQARTask(vocab_size=256, num_pairs=4, seq_len=32, eval_seed=1).eval_data(10)[0]
    assert not torch.equal(other, a[0][:10])


def test_config_roundtrip_and_registry():
    assert "mqar" in list_tasks()
    task = build_task("mqar", vocab_size=100, num_pairs=5, seq_len=41, layout="vla", key_range=(0, 50))
    cfg = task.config()
    assert cfg["name"] == "mqar" and isinstance(task, Task)
    name = cfg.pop("name")
    again = build_task(name, **cfg)
    assert torch.equal(again.eval_data(20)[0], task.eval_data(20)[0])
    assert "power_a" in task_options("mqar")
    with pytest.raises(ValueError, match="valid: .*num_pairs"):
        build_task("mqar", n_pairs=3)
    with pytest.raises(ValueError, match="registered tasks: .*mqar"):
        build_task("mqaar")


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(num_pairs=17, seq_len=64), "too short"),
        (dict(num_pairs=8, seq_len=24, layout="vla"), "too short"),
        (dict(vocab_size=16, num_pairs=8, seq_len=64), "too small"),
        (dict(vocab_size=8, num_pairs=8, seq_len=None, layout="vla"), "too small"),
        (dict(layout="based"), "layout"),
        (dict(power_a=0), "power_a"),
        (dict(num_pairs=0), "num_pairs"),
        (dict(vocab_size=128, layout="vla", key_range=(0, 128)), "SEP"),
        (dict(vocab_size=128, key_range=(50, 20)), "key_range"),
        (dict(pad_token=9000), "pad_token"),
        (dict(random_non_queries="yes"), "random_non_queries"),
        (dict(eval_seed=-1), "eval_seed"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        MQARTask(**kwargs)


def test_bad_batch():
    with pytest.raises(ValueError, match="batch_size"):
        MQARTask().sample(0, _gen())
    with pytest.raises(ValueError, match="n_examples"):
        MQARTask().eval_data(0)


def test_first_key_gap_follows_power_law():
    """The gap of key 1 is the first draw of sampling without replacement, so it follows P(g) exactly."""
    n, T, V = 4, 72, 512
    for a in (0.01, 0.5):
        task = MQARTask(vocab_size=V, num_pairs=n, seq_len=T, power_a=a)
        x, y = task.sample(20000, _gen(7))
        k1 = x[:, 0:1]
        pos = ((x[:, 2 * n :] == k1) & (y[:, 2 * n :] != IGNORE_INDEX)).float().argmax(1)
        gaps = (pos // 2).numpy()
        space = (T - 2 * n) // 2
        p = power_law_gap_probs(space, a).numpy()
        obs = np.bincount(gaps, minlength=space)
        keep = p * len(gaps) >= 5  # merge the sparse tail for the chi-square test
        f_obs = np.append(obs[keep], obs[~keep].sum())
        f_exp = np.append(p[keep], p[~keep].sum()) * len(gaps)
        if f_exp[-1] == 0:
            f_obs, f_exp = f_obs[:-1], f_exp[:-1]
        pval = stats.chisquare(f_obs, f_exp).pvalue
        assert pval > 1e-4, f"power_a={a}: chi-square p={pval:.2e}"
    # power_a = 0.01 concentrates queries right after the context; power_a = 1 is uniform
    assert p[0] > 0.05


def test_gap_inclusion_probabilities_exact():
    """P(gap g is used by some key) matches exact enumeration of sampling without replacement."""
    n, space, a = 3, 8, 0.3
    T = 2 * n + 2 * space
    p = power_law_gap_probs(space, a).numpy()
    incl = np.zeros(space)
    for seq in itertools.permutations(range(space), n):
        pr, left = 1.0, 1.0
        for g in seq:
            pr *= p[g] / left
            left -= p[g]
        incl[list(seq)] += pr
    assert abs(incl.sum() - n) < 1e-9
    N = 20000
    task = MQARTask(vocab_size=256, num_pairs=n, seq_len=T, power_a=a)
    _, y = task.sample(N, _gen(11))
    used = (y[:, 2 * n :: 2] != IGNORE_INDEX).double().mean(0).numpy()
    sigma = np.sqrt(incl * (1 - incl) / N)
    assert np.all(np.abs(used - incl) < 5 * sigma + 1e-3), (used, incl)


def test_eval_power_a():
    task = MQARTask(vocab_size=256, num_pairs=2, seq_len=84, power_a=0.01, eval_power_a=1.0)
    _, y = task.sample(4000, _gen(0))
    _, ye = task.eval_data(4000)
    late = lambda t: (t[:, 4 + 2 * 20 :] != IGNORE_INDEX).float().sum(1).mean()  # noqa: E731
    # P(slot >= 20) per key: power law ~0.17, uniform 20/40 = 0.5
    assert late(y) < 0.5 < late(ye)
    assert MQARTask(eval_power_a=1.0).config()["eval_power_a"] == 1.0
    with pytest.raises(ValueError, match="eval_power_a"):
        MQARTask(eval_power_a=-1.0)


def test_uniform_when_power_a_is_one():
    p = power_law_gap_probs(10, 1.0)
    assert torch.allclose(p, torch.full((10,), 0.1, dtype=torch.float64))


def test_metrics():
    task = MQARTask(vocab_size=64, num_pairs=4, seq_len=16)
    x, y = task.sample(8, _gen())
    logits = torch.zeros(8, 16, 64)
    scored = y != IGNORE_INDEX
    logits[scored] = torch.nn.functional.one_hot(y[scored], 64).float()
    m = task.metrics(logits, y)
    assert m["accuracy"] == 1.0 and m["sequence_accuracy"] == 1.0
    # break one query in example 0 and all queries of example 1
    b0 = scored[0].nonzero()[0, 0]
    logits[0, b0] = 0
    logits[0, b0, (y[0, b0] + 1) % 64] = 1
    logits[1] = 0
    logits[1, :, 0] = 1
    m = task.metrics(logits, y)
    assert m["accuracy"] == pytest.approx((32 - 1 - 4) / 32)
    assert m["sequence_accuracy"] == pytest.approx(6 / 8)
    with pytest.raises(ValueError):
        task.metrics(logits[:, :5], y)
