"""LMTask: byte windows from the right split, fixed-seed eval/test streams, bits per byte by position."""

import math
import random

import pytest
import torch

from seqmem.tasks import LMTask, build_task
from seqmem.tasks.lm import bucket_edges


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.fixture
def corpus_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQMEM_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "corpus"
    root.mkdir()
    for i in range(40):
        rng = random.Random(i)
        words = " ".join("".join(rng.choice("abcdefghij") for _ in range(5)) for j in range(60))
        (root / f"f{i:02d}.txt").write_text(f"file {i}: {words}\n")
    return root


def _is_window_of(row: torch.Tensor, blob: bytes) -> bool:
    return bytes(row.tolist()) in blob


def test_windows_come_from_the_right_split(corpus_dir):
    task = LMTask(corpus=str(corpus_dir), seq_len=32, n_buckets=4)
    assert task.vocab_size == 256 and task.seq_len == 32
    train = task.corpus.split("train").tobytes()
    val = task.corpus.split("val").tobytes()
    test = task.corpus.split("test").tobytes()
    x, y = task.sample(64, _gen(0))
    assert x.shape == y.shape == (64, 32) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1]), "targets are the inputs shifted by one"
    full = torch.cat([x, y[:, -1:]], 1)
    assert all(_is_window_of(r, train) for r in full)
    ex, ey = task.eval_data(50)
    assert all(_is_window_of(r, val) for r in torch.cat([ex, ey[:, -1:]], 1))
    tx, ty = task.test_data(50)
    assert all(_is_window_of(r, test) for r in torch.cat([tx, ty[:, -1:]], 1))
    assert not any(_is_window_of(r, train) for r in ex), "val windows are not in train (distinct documents)"


def test_streams(corpus_dir):
    a = LMTask(corpus=str(corpus_dir), seq_len=32)
    b = LMTask(corpus=str(corpus_dir), seq_len=32)
    assert torch.equal(a.eval_data(300)[0], b.eval_data(300)[0])
    assert torch.equal(a.eval_data(1000)[0][:300], b.eval_data(300)[0])
    assert torch.equal(a.test_data(20)[0], b.split_data("test", 20)[0])
    assert torch.equal(a.split_data("val", 20)[0], a.eval_data(20)[0])
    assert a.split_data("train", 20)[0].shape == (20, 32)
    assert torch.equal(a.sample(8, _gen(3))[0], b.sample(8, _gen(3))[0])
    assert not torch.equal(a.sample(8, _gen(3))[0], a.sample(8, _gen(4))[0])
    on_train = LMTask(corpus=str(corpus_dir), seq_len=32, eval_split="train")
    blob = on_train.corpus.split("train").tobytes()
    assert all(_is_window_of(r, blob) for r in on_train.eval_data(10)[0])


def test_bucket_edges():
    assert bucket_edges(512, 8)[0] == (0, 64) and bucket_edges(512, 8)[-1] == (448, 512)
    e = bucket_edges(10, 3)
    assert e[0][0] == 0 and e[-1][1] == 10 and all(a[1] == b[0] for a, b in zip(e, e[1:]))


def test_metrics_bits_per_byte(corpus_dir):
    task = LMTask(corpus=str(corpus_dir), seq_len=32, n_buckets=4)
    x, y = task.sample(16, _gen(0))
    m = task.metrics(torch.zeros(16, 32, 256), y)
    assert set(m) == {"bpb", "accuracy", "bpb_pos_0_7", "bpb_pos_8_15", "bpb_pos_16_23", "bpb_pos_24_31"}
    for k, v in m.items():
        if k.startswith("bpb"):
            assert v == pytest.approx(8.0, abs=1e-9), k  # uniform over 256 bytes = 8 bits
    # perfect predictions in the second half of the context only
    logits = torch.zeros(16, 32, 256)
    logits[:, 16:] = 30.0 * torch.nn.functional.one_hot(y[:, 16:], 256).float()
    m = task.metrics(logits, y)
    assert m["bpb_pos_0_7"] == pytest.approx(8.0) and m["bpb_pos_8_15"] == pytest.approx(8.0)
    assert m["bpb_pos_16_23"] < 1e-6 and m["bpb_pos_24_31"] < 1e-6
    assert m["bpb"] == pytest.approx(4.0, abs=1e-5)
    # bpb is the cross-entropy in nats / ln 2
    logits = torch.randn(16, 32, 256)
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), y.reshape(-1)).item()
    assert task.metrics(logits, y)["bpb"] == pytest.approx(ce / math.log(2), rel=1e-5)
    with pytest.raises(ValueError):
        task.metrics(logits[:, :5], y)


def test_errors_and_config(corpus_dir):
    with pytest.raises(ValueError, match="fewer than seq_len"):
        LMTask(corpus=str(corpus_dir), seq_len=5000)
    with pytest.raises(ValueError, match="eval_split"):
        LMTask(corpus=str(corpus_dir), seq_len=32, eval_split="dev")
    with pytest.raises(ValueError, match="n_buckets"):
        LMTask(corpus=str(corpus_dir), seq_len=32, n_buckets=0)
    with pytest.raises(ValueError, match="neither a built-in"):
        LMTask(corpus=str(corpus_dir / "nope"), seq_len=32)
    with pytest.raises(ValueError, match="seq_len"):
        LMTask(corpus=str(corpus_dir), seq_len=0)
    task = build_task("lm", corpus=str(corpus_dir), seq_len=24, n_buckets=3)
    cfg = task.config()
    again = build_task(cfg.pop("name"), **cfg)
    assert torch.equal(again.eval_data(10)[0], task.eval_data(10)[0])
    with pytest.raises(ValueError, match="valid: .*corpus"):
        build_task("lm", corpora="code")


WINDOW_OPTIONS = ["max_files", "fractions", "n_buckets", "eval_split", "cache", "eval_seed"]


@pytest.mark.parametrize("name,own", [("lm", {"corpus": None}), ("text", {"dataset": None, "tokenizer": "byte"})])
def test_window_options_pass_through_keyword_only(corpus_dir, name, own):
    """lm and text declare only their own options and seq_len; SplitWindowsTask's shared ones (max_files, fractions,
    n_buckets, eval_split, cache, eval_seed) pass through ``**window_options``, keyword-only, and are listed (in the
    old order), defaulted, checked and reported as before."""
    from seqmem.tasks import get_task_class, task_options

    own = {k: str(corpus_dir) if v is None else v for k, v in own.items()}
    cls = get_task_class(name)
    lead = {"lm": ["corpus", "seq_len"], "text": ["dataset", "tokenizer", "seq_len", "text_field", "max_docs"]}[name]
    assert task_options(name) == lead + WINDOW_OPTIONS
    with pytest.raises(TypeError):  # the shared options are keyword-only
        cls(*own.values(), 32, *([] if name == "lm" else ["text", None]), 20)
    task = build_task(name, **own, seq_len=16)
    assert (task.max_files, task.fractions, task.n_buckets, task.eval_split, task.cache, task.eval_seed) == (
        None, (0.9, 0.05, 0.05), 8, "val", True, 2718281)
    cfg = build_task(name, **own, seq_len=16, max_files=30, fractions=[0.5, 0.25, 0.25], n_buckets=4,
                     eval_split="train", cache=False, eval_seed=7).config()
    assert list(cfg)[-6:] == WINDOW_OPTIONS  # config() keeps its key order
    assert [cfg[k] for k in WINDOW_OPTIONS] == [30, [0.5, 0.25, 0.25], 4, "train", False, 7]
    with pytest.raises(ValueError, match="n_buckets must be an integer in"):
        build_task(name, **own, seq_len=16, n_buckets=17)
    with pytest.raises(ValueError, match=r"unknown option\(s\) 'eval_splitt' \(did you mean 'eval_split'\?\)"):
        build_task(name, **own, seq_len=16, eval_splitt="val")


def test_code_corpus_task():
    task = LMTask(corpus="code", seq_len=128, max_files=30, cache=False)
    x, y = task.sample(4, _gen(0))
    assert x.shape == (4, 128) and int(x.max()) < 256
    assert task.eval_data(4)[0].shape == (4, 128)
