"""Real-data path on local files only (no network): document sources, tokenizers (byte, trained BPE, Hugging Face
tokenizer from a local directory), the ``text`` task and ``seqmem train --task lm --dataset/--tokenizer``."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from seqmem.cli import main
from seqmem.data import load_corpus
from seqmem.tasks import build_task
from seqmem.textdata import load_documents, load_tokenizer

WORDS = "the quick brown fox jumps over a lazy dog while memory states recur and attention reads tokens".split()


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQMEM_CACHE", str(tmp_path / "cache"))
    rng = random.Random(0)
    d = tmp_path / "corpus"
    d.mkdir()
    for i in range(30):
        (d / f"doc{i:02d}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(200)) + "\n")
    with open(tmp_path / "records.jsonl", "w") as f:
        for i in range(50):
            f.write(json.dumps({"id": i, "body": " ".join(rng.choice(WORDS) for _ in range(80))}) + "\n")
    return d


def test_byte_tokenizer_reproduces_the_byte_corpus(corpus):
    task = build_task("text", dataset=str(corpus), tokenizer="byte", seq_len=32)
    assert task.vocab_size == 256
    ref = load_corpus(str(corpus))
    for s in ("train", "val", "test"):
        assert np.array_equal(np.asarray(task.tokens[s]), np.asarray(ref.split(s)).astype(np.int32))
    x, y = task.sample(4, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 32) and torch.equal(x[:, 1:], y[:, :-1])


def test_trained_bpe_is_deterministic_cached_and_round_trips(corpus, tmp_path):
    docs, ident = load_documents(str(corpus))
    t1 = load_tokenizer("train:300", docs["train"], cache=False)
    t2 = load_tokenizer("train:300", docs["train"], cache=False)
    assert t1.vocab_size == 300 and t1.fingerprint() == t2.fingerprint()
    text = docs["val"][0]
    ids = t1.encode_batch([text])[0]
    assert t1.decode(ids).encode() == text and len(ids) < len(text) / 2  # merges learned: compresses the text
    task = build_task("text", dataset=str(corpus), tokenizer="train:300", seq_len=32)
    assert task.vocab_size == 300 and int(task.tokens["train"].max()) < 300
    assert task.tokenizer.fingerprint() == t1.fingerprint()
    assert list((tmp_path / "cache" / "tokenizers").glob("bpe300-*.json"))
    with pytest.raises(ValueError, match="train:<vocab size>"):
        load_tokenizer("train:lots", docs["train"])


def test_hf_tokenizer_from_local_directory(corpus, tmp_path):
    transformers = pytest.importorskip("transformers")
    bpe = build_task("text", dataset=str(corpus), tokenizer="train:300", seq_len=32)
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe.tokenizer.obj, eos_token="<|endoftext|>")
    hf.save_pretrained(tmp_path / "hftok")
    task = build_task("text", dataset=str(corpus), tokenizer=str(tmp_path / "hftok"), seq_len=32)
    assert task.tokenizer.kind == "transformers" and task.vocab_size == 300
    assert np.array_equal(np.asarray(task.tokens["train"]), np.asarray(bpe.tokens["train"]))
    # and a bare tokenizer.json
    bpe.save_tokenizer(tmp_path / "bare")
    t3 = build_task("text", dataset=str(corpus), tokenizer=str(tmp_path / "bare" / "tokenizer.json"), seq_len=32)
    assert np.array_equal(np.asarray(t3.tokens["val"]), np.asarray(bpe.tokens["val"]))


def test_jsonl_records(corpus, tmp_path):
    path = tmp_path / "records.jsonl"
    docs, _ = load_documents(str(path), text_field="body")
    assert sum(len(v) for v in docs.values()) == 50 and all(docs[s] for s in docs)
    with pytest.raises(ValueError, match="no text field 'text'"):
        load_documents(str(path))
    task = build_task("text", dataset=str(path), text_field="body", tokenizer="byte", seq_len=16, max_docs=40)
    assert sum(task.num_documents.values()) == 40
    m = task.metrics(torch.zeros(2, 16, 256), torch.randint(0, 256, (2, 16)))
    assert m["bits_per_token"] == pytest.approx(8.0) and "loss_pos_0_1" in m


def test_unknown_dataset_is_a_clear_error(corpus):
    with pytest.raises(ValueError, match="datasets|could not load dataset"):
        load_documents("surely-not-a-local-path-or-dataset-xyz")


def test_parquet_and_saved_datasets_directory(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
    datasets = pytest.importorskip("datasets")
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = {}
    for split, n in (("train", 12), ("validation", 2), ("test", 3)):
        files[split] = str(tmp_path / f"{split}.parquet")
        pq.write_table(pa.table({"text": [" ".join(WORDS[i:] + WORDS[:i]) * 5 for i in range(n)]}), files[split])
    task = build_task("text", dataset=files["train"], tokenizer="byte", seq_len=32, fractions=(0.5, 0.25, 0.25))
    assert sum(task.num_documents.values()) == 12  # one parquet file: hash split
    ds = datasets.load_dataset("parquet", data_files=files)
    ds.save_to_disk(str(tmp_path / "saved"))
    task = build_task("text", dataset=str(tmp_path / "saved"), tokenizer="byte", seq_len=32)
    assert task.num_documents == {"train": 12, "val": 2, "test": 3}  # the dataset's own splits


def test_cli_train_with_dataset_and_trained_tokenizer(corpus, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--task", "lm", "--dataset", str(corpus), "--tokenizer", "train:300", "--seq-len", "32",
            "--mixer", "deltanet", "--layers", "1", "--d-model", "16", "--heads", "2", "--steps", "3",
            "--batch-size", "4", "--eval-examples", "8", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    spec = json.loads((out / "run.json").read_text())
    assert spec["task"]["name"] == "text" and spec["task"]["options"]["tokenizer"] == "train:300"
    assert (out / "tokenizer" / "tokenizer.json").is_file()
    final = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert final["eval_loss"] < 7 and "eval_loss_pos_0_3" in final  # ln(300) = 5.7 at init
    assert main(["eval", "--run", str(out), "--examples", "8"]) == 0
    assert main(["train", "--task", "mqar", "--mixer", "deltanet", "--dataset", str(corpus), "--out",
                 str(tmp_path / "bad")]) == 2


@pytest.mark.parametrize("split", ["test", "train"])
def test_lr_selection_on_the_test_or_train_split_is_refused(corpus, split):
    """An LM task's validation windows (what a sweep chooses lrs on) are its eval_split's: eval_split='test' made
    the sweep choose on the windows it reports (and 'train' on the training data), silently.  The validation windows
    and a sweep spec refuse it now; `seqmem train`'s evaluations may still use it."""
    from seqmem.sweep import SpecError, load_spec
    from seqmem.train import TrainConfig, evaluate, train

    for name, opts in (("lm", {"corpus": str(corpus)}), ("text", {"dataset": str(corpus), "tokenizer": "byte"})):
        task = build_task(name, **opts, seq_len=32, eval_split=split)
        with pytest.raises(ValueError, match=f"eval_split='{split}'.*choose on eval_split='val'"):
            task.valid_data(8)
        build_task(name, **opts, seq_len=32).valid_data(8)  # the default, val
        spec = {"name": "s", "task": {"name": name, "options": {**opts, "seq_len": 32, "eval_split": split}},
                "model": {"d_model": 16, "n_layers": 1, "n_heads": 2}, "train": {"steps": 2, "lrs": [1e-3]},
                "mixers": ["attention"]}
        with pytest.raises(SpecError, match=f"eval_split='{split}'"):
            load_spec(spec)
    from seqmem.models import LanguageModel, LMConfig

    model = LanguageModel(LMConfig(vocab_size=task.vocab_size, d_model=16, n_layers=1, n_heads=2, mixer="attention"))
    train(model, task, TrainConfig(steps=1, batch_size=2, eval_examples=4))  # its evaluations on the split
    assert set(evaluate(model, task, 4, 4)) >= {"loss", "accuracy"}


def test_records_copied_into_several_splits_are_warned_about(tmp_path):
    """Records without their own val/test splits are split by index, so 40 copies of one boilerplate document among
    240 records landed in every split (the held-out splits then share text with train), silently; it is warned about
    now (the split is kept: earlier runs were trained on it).  Distinct records: no warning."""
    import warnings

    from seqmem.textdata import load_documents

    rng = random.Random(1)
    recs = [" ".join(rng.choice(WORDS) for _ in range(30)) for _ in range(200)] + ["the same boilerplate"] * 40
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in recs))
    with pytest.warns(UserWarning, match="1 distinct document.* more than one split"):
        docs, _ = load_documents(str(path))
    assert sum(b"the same boilerplate" in d for s in docs for d in docs[s]) == 40
    assert sum(any(d == b"the same boilerplate" for d in docs[s]) for s in docs) > 1
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in recs[:200]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_documents(str(path))
