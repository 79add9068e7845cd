"""The registered paper tasks used by the headline sweep specs: ``vort_zipf`` (VORT Table 1 as LM tokens) and
``elastic_topic`` (the long-range topic task of the Elastic reproduction)."""

from __future__ import annotations

import math

import pytest
import torch

from seqmem.tasks import IGNORE_INDEX, build_task, list_tasks
from seqmem.tasks.elastic_topic import ElasticTopicTask
from seqmem.tasks.vort_tasks import VortZipfTask, ZipfLagRetrieval


def test_registered():
    assert {"vort_zipf", "elastic_topic"} <= set(list_tasks())


# ------------------------------------------------------------------------------------------------------ vort_zipf
def test_vort_zipf_layout_every_query_key_follows_its_anchor():
    t = build_task("vort_zipf", n_positions=300, beta=1.0, n_queries=20, n_keys=64, n_labels=16, n_filler=8)
    assert t.seq_len == 600 and t.vocab_size == 1 + 16 + 64 + 8
    x, y, lags = t.sample_with_lags(4, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == lags.shape == (4, 600)
    assert x.min() >= 0 and x.max() < t.vocab_size
    for b in range(4):
        pos = (y[b] != IGNORE_INDEX).nonzero().flatten().tolist()
        assert len(pos) == 20
        for p in pos:
            assert p % 2 == 1 and x[b, p - 1] == t.QUERY  # (QUERY, KEY) pair, target at the key token
            key, label, d = int(x[b, p]), int(y[b, p]), int(lags[b, p])
            assert t.key_offset <= key < t.filler_offset and 1 <= label < 1 + 16
            a = p - 1 - 2 * d  # the anchor's first token, d positions earlier
            assert x[b, a] == key and x[b, a + 1] == label
            assert (x[b, :p] == key).sum() == 1  # the key appears once before its query (at the anchor)
        assert (lags[b][y[b] == IGNORE_INDEX] == -1).all()


def test_vort_zipf_dense_layout_queries_every_position():
    """``layout = "dense"`` (the paper's §6 layout): an anchor at every position and a query at every position
    t ≥ 1 for the anchor d_t ≤ t positions back, four tokens per position, lags Zipf(β)-distributed."""
    t = build_task("vort_zipf", n_positions=200, beta=1.0, n_keys=256, n_labels=16, n_filler=8, layout="dense")
    assert t.seq_len == 800 and t.config()["layout"] == "dense" and "layout" not in VortZipfTask().config()
    x, y, lags = t.sample_with_lags(3, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == lags.shape == (3, 800) and x.max() < t.vocab_size
    for b in range(3):
        pos = (y[b] != IGNORE_INDEX).nonzero().flatten().tolist()
        assert pos == [4 * i + 3 for i in range(1, 200)]  # one query per position t >= 1, at its last token
        keys = x[b, 0::4]
        assert len(set(keys.tolist())) == 200  # a distinct key per position
        for p in pos:
            i, d = p // 4, int(lags[b, p])
            assert 1 <= d <= i and x[b, p - 1] == t.QUERY
            assert x[b, p] == x[b, 4 * (i - d)] and y[b, p] == x[b, 4 * (i - d) + 1]  # the anchor's key, label
    # Zipf(1): lag 1 is the most frequent and about twice as frequent as lag 2
    _, y2, lg = t.sample_with_lags(64, torch.Generator().manual_seed(1))
    d = lg[lg > 0]
    assert (d == 1).sum() > 1.6 * (d == 2).sum() > 0
    with pytest.raises(ValueError, match="layout"):
        VortZipfTask(layout="grid")
    with pytest.raises(ValueError, match="n_keys"):
        VortZipfTask(n_positions=300, n_keys=64, layout="dense")


def _copy_last_label_in_window(layout: str) -> list[float]:
    """Per lag bin (short, medium, long) the accuracy of a memory-free rule on the settling specs' task (n 250, lag
    edges 2.5 / 25, β 1, 256 sequences): answer with the most recent label token among the 7 tokens before the
    scored one, i.e. inside a window-8 attention."""
    from seqmem.tasks.vort_tasks import lag_bin

    kw = dict(n_positions=250, n_keys=512, n_labels=16, n_filler=64, lag_edges=[2.5, 25], beta=1.0, layout=layout)
    if layout == "sparse":
        kw["n_queries"] = 16
    t = build_task("vort_zipf", **kw)
    x, y, lags = t.sample_with_lags(256, torch.Generator().manual_seed(5))
    bi, ti = (y != IGNORE_INDEX).nonzero(as_tuple=True)
    is_label = (x >= 1) & (x < 17)  # labels are [1, 1 + n_labels)
    guess = torch.full_like(ti, -1)
    for k in range(7, 0, -1):  # nearest last, so it wins
        j = (ti - k).clamp(min=0)
        guess = torch.where(is_label[bi, j] & (ti - k >= 0), x[bi, j], guess)
    hit = (guess == y[bi, ti]).float()
    b = lag_bin(lags[bi, ti], (2.5, 25))
    return [float(hit[b == i].mean()) for i in range(3)]


def test_vort_zipf_window_answers_short_lags_in_the_sparse_layout_only():
    """docs/results/vort/README.md: in the sparse layout a window-8 attention sees the answer for lags <= 3, so the
    memory-free rule answers the short bin (0.98) and part of the medium bin (0.15), not the long bin (0.01); in the
    dense layout (label 4d + 2 tokens back, among other labels) it is at chance, 1/16, in every bin."""
    short, medium, long_ = _copy_last_label_in_window("sparse")
    assert short > 0.95 and 0.10 < medium < 0.20 and long_ < 0.03
    assert all(a < 0.1 for a in _copy_last_label_in_window("dense"))


def test_vort_zipf_uses_the_paper_generator_lags():
    """Same placement as ZipfLagRetrieval (the generator of ``seqmem repro vort``) for the same RNG stream."""
    t = VortZipfTask(n_positions=400, beta=1.5, n_queries=16, n_keys=32)
    ref = ZipfLagRetrieval(seq_len=400, beta=1.5, n_queries=16, n_keys=32, n_labels=16, n_filler=64)
    _, y, lags = t.sample_with_lags(3, torch.Generator().manual_seed(5))
    d = ref.sample(3, torch.Generator().manual_seed(5))
    assert torch.equal(lags[:, 1::2], d["lag"])
    q = d["target"] >= 0
    assert torch.equal(y[:, 1::2][q], d["target"][q] + 1)


def test_vort_zipf_lag_bin_metrics_are_exact_on_eval_examples():
    t = VortZipfTask(n_positions=1200, beta=1.0, n_queries=40, n_keys=64, lag_edges=(100, 1000))
    x, y = t.eval_data(8)
    logits = torch.zeros(*y.shape, t.vocab_size)
    m = y != IGNORE_INDEX
    g = torch.Generator().manual_seed(1)
    right = torch.rand(y.shape, generator=g) < 0.5
    logits[m & right, y[m & right]] = 1.0  # correct where `right`, else token 0 (never a label)
    logits[..., 0] += 0.5 * (~right).float()
    out = t.metrics(logits, y)
    assert out["accuracy"] == pytest.approx(float(right[m].float().mean()))
    # bins recomputed independently from the generator's lags: ≤100, 100-1000, >1000 positions
    full_x, full_y, full_lags = t.sample_with_lags(256, torch.Generator().manual_seed(t.eval_seed))
    assert torch.equal(full_x[:8], x) and torch.equal(full_y[:8], y)
    lg = full_lags[:8]
    for name, sel in (("short", (lg >= 0) & (lg <= 100)), ("medium", (lg > 100) & (lg <= 1000)),
                      ("long", lg > 1000)):
        n = int(sel.sum())
        assert out[f"queries_{name}"] == pytest.approx(n / 8)
        assert out[f"hits_{name}"] == pytest.approx(int((right & sel).sum()) / 8)
        if n:
            assert out[f"acc_{name}"] == pytest.approx(float(right[sel].float().mean()))
    # training batches are not remembered: only the overall accuracy
    xt, yt = t.sample(2, torch.Generator().manual_seed(9))
    assert set(t.metrics(torch.zeros(*yt.shape, t.vocab_size), yt)) == {"accuracy"}


def _zipf_sample_one_write_per_placement(gen: ZipfLagRetrieval, B: int, g: torch.Generator) -> dict:
    """ZipfLagRetrieval.sample as first written: the same draws, one tensor write per field and placement."""
    n = gen.seq_len
    out = gen._empty(B)
    for b in range(B):
        used = torch.zeros(n, dtype=torch.bool)
        keys = torch.randperm(gen.n_keys, generator=g)[: gen.n_queries]
        labels = torch.randint(0, gen.n_labels, (gen.n_queries,), generator=g)
        placed = tries = 0
        while placed < gen.n_queries and tries < 50 * gen.n_queries:
            tries += 1
            t = int(torch.randint(1, n, (1,), generator=g))
            d = int(torch.multinomial(gen._pd[:t], 1, generator=g)) + 1
            a = t - d
            if used[t] or used[a]:
                continue
            used[t] = used[a] = True
            out["mem_key"][b, a], out["mem_label"][b, a] = keys[placed], labels[placed]
            out["query_key"][b, t], out["target"][b, t], out["lag"][b, t] = keys[placed], labels[placed], d
            placed += 1
        free = ~used
        out["filler"][b, free] = torch.randint(0, gen.n_filler, (int(free.sum()),), generator=g)
    return out


@pytest.mark.parametrize("beta, n_queries, n", [(1.0, 16, 250), (2.0, 40, 100), (1.5, 6, 12)])
def test_zipf_generator_draws_the_examples_of_one_write_per_placement(beta, n_queries, n):
    """The batched writes give the very examples (and leave the generator where) the per-placement writes did,
    also where a row runs out of tries (n = 12, 6 queries)."""
    gen = ZipfLagRetrieval(seq_len=n, beta=beta, n_queries=n_queries, n_keys=512, n_labels=16, n_filler=64)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    for _ in range(2):
        new, old = gen.sample(8, g1), _zipf_sample_one_write_per_placement(gen, 8, g2)
        for key in old:
            assert torch.equal(new[key], old[key]), key
    assert torch.equal(g1.get_state(), g2.get_state())


def test_vort_zipf_rejects_bad_options():
    for bad in (dict(n_positions=2), dict(beta=0), dict(n_labels=1), dict(lag_edges=(10, 5)), dict(n_keys=True)):
        with pytest.raises(ValueError):
            build_task("vort_zipf", **bad)
    cfg = VortZipfTask(n_positions=64, n_queries=8, n_keys=16).config()
    assert build_task(cfg.pop("name"), **cfg).config() == VortZipfTask(n_positions=64, n_queries=8,
                                                                       n_keys=16).config()


# -------------------------------------------------------------------------------------------------- elastic_topic
def test_elastic_topic_task_and_old_import_path():
    from seqmem.repro.elastic import TopicTask

    t = build_task("elastic_topic", vocab_size=50, topic=3, seq_len=40, block_len=10)
    x, y = t.sample(6, torch.Generator().manual_seed(0))
    old = TopicTask(vocab=50, topic=3, seq_len=40)
    xo, yo = old.sample(6, torch.Generator().manual_seed(0))
    assert torch.equal(x, xo) and torch.equal(y, yo)  # the repro class is the registered task
    assert (x[:, 1:] == y[:, :-1]).all() and all(len(set(r.tolist())) <= 3 for r in x)
    with pytest.raises(ValueError, match="multiple"):
        ElasticTopicTask(seq_len=40, block_len=16)


def test_elastic_topic_metrics_see_history_use():
    """An oracle that knows the topic scores ln(topic) everywhere (memory_gain 0 at block 0 level); a block-local
    oracle that learns the topic within each block has loss_block0_q1 == loss_later_q1 (gain 0); one that
    carries the topic across blocks has a positive gain."""
    t = ElasticTopicTask(vocab_size=32, topic=4, seq_len=64, block_len=16)
    x, y = t.eval_data(64)
    B, T = y.shape
    topic_logits = torch.full((B, T, 32), -30.0)
    for b in range(B):
        topic_logits[b, :, torch.unique(torch.cat([x[b], y[b]]))] = 0.0
    uniform = torch.zeros(B, T, 32)
    # history user: uniform in block 0's first quarter only, then the topic
    hist = topic_logits.clone()
    hist[:, :4] = uniform[:, :4]
    # block-local: uniform in the first quarter of every block
    local = topic_logits.clone()
    for blk in range(4):
        local[:, 16 * blk: 16 * blk + 4] = uniform[:, :4]
    mo, mh, ml = t.metrics(topic_logits, y), t.metrics(hist, y), t.metrics(local, y)
    assert mo["excess_loss"] == pytest.approx(0.0, abs=1e-4)
    assert mh["memory_gain"] == pytest.approx(math.log(32) - math.log(4), rel=1e-5)
    assert ml["memory_gain"] == pytest.approx(0.0, abs=1e-4)
    assert ml["loss_later_q1"] == pytest.approx(math.log(32), rel=1e-5)


def test_elastic_topic_one_topic_stream_is_unchanged_by_topic_blocks_support():
    """topic_blocks = 0 draws exactly the original one-topic stream (so committed runs stay reproducible) and keeps
    the original config (no topic_blocks key: run identities unchanged)."""
    t = ElasticTopicTask(vocab_size=40, topic=4, seq_len=48, block_len=12)
    x, y = t.sample(5, torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)
    subsets = torch.stack([torch.randperm(40, generator=g)[:4] for _ in range(5)])
    tok = torch.gather(subsets, 1, torch.randint(0, 4, (5, 49), generator=g))
    assert torch.equal(x, tok[:, :-1]) and torch.equal(y, tok[:, 1:])
    assert "topic_blocks" not in t.config()
    assert ElasticTopicTask(seq_len=48, block_len=12, topic_blocks=2).config()["topic_blocks"] == 2
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="topic_blocks"):
            ElasticTopicTask(seq_len=48, block_len=12, topic_blocks=bad)


def test_elastic_topic_drifting_topics_follow_the_blocks():
    """topic_blocks = k: each k-block segment draws from a topic of its own, aligned with the inputs, so that every
    block's inputs and targets (but its last target) come from one topic — a block-local model sees the same thing
    in a block that starts a topic as in one that continues it; the only cross-topic target is a segment's last."""
    k, L, V = 2, 8, 64
    t = ElasticTopicTask(vocab_size=V, topic=3, seq_len=64, block_len=L, topic_blocks=k)
    x, y = t.sample(32, torch.Generator().manual_seed(1))
    seg_len = k * L
    n_seg = 64 // seg_len
    disjoint = 0
    for b in range(32):
        topics = [set(x[b, s * seg_len:(s + 1) * seg_len].tolist()) for s in range(n_seg)]
        assert all(len(tp) <= 3 for tp in topics)
        for blk in range(64 // L):
            inside = set(x[b, blk * L:(blk + 1) * L].tolist()) | set(y[b, blk * L:(blk + 1) * L - 1].tolist())
            assert inside <= topics[blk // k]
        for s in range(n_seg - 1):  # a segment's last target is the next topic's first token
            assert int(y[b, (s + 1) * seg_len - 1]) in topics[s + 1]
        assert int(y[b, -1]) in topics[-1]
        disjoint += sum(not (topics[s] & topics[s - 1]) for s in range(1, n_seg))
    assert disjoint > 0.5 * 32 * (n_seg - 1)  # fresh topics (3 of 64 tokens overlap rarely)


def test_elastic_topic_block_local_statistics_are_the_same_in_start_and_continuing_blocks():
    """The Bayes predictor that sees only the current block (the best any block-local model can do) has the same
    first-quarter loss in blocks that start a topic and in blocks that continue one: memory_gain ≈ 0 without memory
    (it would not be if a start block's first input came from the previous topic)."""
    V, topic, L = 16, 3, 8
    t = ElasticTopicTask(vocab_size=V, topic=topic, seq_len=128, block_len=L, topic_blocks=2)
    x, y = t.eval_data(512)
    B, T = y.shape
    logits = torch.empty(B, T, V)
    for b in range(B):
        for p in range(T):
            start = p - p % L
            seen = torch.unique(x[b, start:p + 1])  # the block's inputs so far: all in the current topic
            d = len(seen)
            prob = torch.full((V,), (topic - d) / topic / (V - d))
            prob[seen] = 1.0 / topic
            logits[b, p] = prob.log()
    m = t.metrics(logits, y)
    assert abs(m["memory_gain"]) < 0.05  # sampling noise only (start and continuing blocks differ in label alone)
    assert m["loss_cont_q1"] > math.log(topic) + 0.3  # and it does pay the block-local penalty
    # the analytic bound is this predictor's expected first-quarter loss (8,192 scored tokens per kind: SE ≈ 0.012)
    assert m["loss_start_q1"] == pytest.approx(t.block_local_q1(), abs=0.08)
    assert m["loss_cont_q1"] == pytest.approx(t.block_local_q1(), abs=0.08)


def test_elastic_topic_block_local_q1_closed_form():
    """The block-local bound at the headline's task (V 64, topic 4, L 32: 2.557 nats, so a memory that is not
    misled gains at most 2.557 − ln 4 = 1.17) and at the limits: a topic of the whole vocabulary gives ln V at
    every position, a topic of one token is known after its first input."""
    t = ElasticTopicTask(vocab_size=64, topic=4, seq_len=256, block_len=32, topic_blocks=2)
    assert t.block_local_q1() == pytest.approx(2.5566, abs=1e-4)
    # first position alone: the seen token has 1/4, each of the 63 others (3/4)/63
    t1 = ElasticTopicTask(vocab_size=64, topic=4, seq_len=8, block_len=4)
    assert t1.block_local_q1() == pytest.approx(0.25 * math.log(4) + 0.75 * math.log(84), rel=1e-12)
    assert ElasticTopicTask(vocab_size=8, topic=8, seq_len=16, block_len=8).block_local_q1() == pytest.approx(
        math.log(8))
    assert ElasticTopicTask(vocab_size=8, topic=1, seq_len=16, block_len=8).block_local_q1() == 0.0


def test_elastic_topic_metrics_with_drifting_topics():
    """With topic_blocks = k, memory_gain compares the first quarters of topic-starting blocks with those of
    continuing blocks: a model that carries the current topic across blocks and guesses uniformly over the vocabulary
    at a topic's start gains ln(V) − ln(topic) here (a start block predicted as well as a block-local model can
    predict it gives less: ``block_local_q1() − ln(topic)``), a block-local one 0, and one that knows the topic only
    from block 0 (a stale memory) loses on continuing blocks."""
    k, L, V, topic = 2, 16, 32, 4
    t = ElasticTopicTask(vocab_size=V, topic=topic, seq_len=128, block_len=L, topic_blocks=k)
    x, y = t.eval_data(32)
    B, T = y.shape
    seg = t.segments()[1:]  # the segment of each target
    current = torch.full((B, T, V), -30.0)
    stale = torch.full((B, T, V), -30.0)
    for b in range(B):
        for s in seg.unique().tolist():
            pos = (seg == s).nonzero().flatten()
            current[b, pos[:, None], torch.unique(y[b, pos])[None, :]] = 0.0
        stale[b, :, torch.unique(y[b, seg == 0])] = 0.0
    q = L // 4
    carry, local = current.clone(), current.clone()
    for blk in range(T // L):
        local[:, blk * L: blk * L + q] = 0.0
        if blk % k == 0:
            carry[:, blk * L: blk * L + q] = 0.0
    mc, ml, ms = t.metrics(carry, y), t.metrics(local, y), t.metrics(stale, y)
    assert mc["memory_gain"] == pytest.approx(math.log(V) - math.log(topic), rel=1e-4)
    assert mc["loss_cont_q1"] == pytest.approx(math.log(topic), rel=1e-4)
    assert ml["memory_gain"] == pytest.approx(0.0, abs=1e-4)
    assert ms["loss_cont_q1"] > 5.0  # block 0's topic is wrong for the later segments' continuing blocks
