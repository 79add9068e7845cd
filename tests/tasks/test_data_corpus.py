"""seqmem.data: text detection, deterministic document splits, concatenation, caching, built-in corpora."""

import gzip
import os
from pathlib import Path

import numpy as np
import pytest

from seqmem.data import (
    SEPARATOR,
    SPLITS,
    corpus_files,
    document_split,
    load_corpus,
    read_document,
)


def _text(i: int) -> bytes:
    return (f"document {i}\n" + "lorem ipsum dolor sit amet " * (3 + i % 5) + "\n").encode()


def make_corpus(root: Path, n: int = 40) -> dict[str, bytes]:
    """n text files (some nested, one gzipped) plus binary / hidden / empty decoys; relpath -> bytes."""
    docs = {}
    for i in range(n):
        rel = f"sub{i % 3}/doc_{i:03d}.txt" if i % 4 else f"doc_{i:03d}.md"
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(_text(i))
        docs[rel] = _text(i)
    gz = "sub0/packed.txt.gz"
    (root / gz).write_bytes(gzip.compress(b"compressed text document\n" * 4))
    docs[gz] = b"compressed text document\n" * 4
    (root / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    (root / "blob.dat").write_bytes(b"abc\x00def" * 10)
    (root / "ctrl.txt").write_bytes(bytes([1, 2, 3, 4, 5, 6, 7, 8]) * 20 + b"text")
    (root / "empty.txt").write_bytes(b"")
    (root / "bad.gz").write_bytes(b"not gzip at all")
    (root / ".hidden.txt").write_bytes(b"hidden text\n")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_bytes(b"[core]\n")
    return docs


@pytest.fixture(autouse=True)
def _cache_env(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQMEM_CACHE", str(tmp_path / "cache"))


def test_read_document_detection(tmp_path):
    docs = make_corpus(tmp_path / "c", 4)
    root = tmp_path / "c"
    for rel, data in docs.items():
        assert read_document(root / rel) == data
    for rel in ("image.png", "blob.dat", "ctrl.txt", "empty.txt", "bad.gz"):
        assert read_document(root / rel) is None, rel
    # latin-1 / utf-8 text with a few escape sequences is text
    (root / "latin.txt").write_bytes("café ü\n".encode("latin-1") + b"\x1b[1mbold\x1b[0m\n")
    assert read_document(root / "latin.txt") is not None


def test_corpus_files_skips_hidden_and_binary_extensions(tmp_path):
    make_corpus(tmp_path / "c", 10)
    root, files = corpus_files(tmp_path / "c")
    assert root == (tmp_path / "c").resolve()
    assert files == sorted(files)
    assert not any(f.startswith(".") or "/." in f for f in files)
    assert "image.png" not in files
    sub, files2 = corpus_files(tmp_path / "c", max_files=5)
    assert len(files2) == 5 and set(files2) <= set(files)
    assert corpus_files(tmp_path / "c", max_files=5)[1] == files2, "deterministic subset"
    with pytest.raises(ValueError, match="max_files"):
        corpus_files(tmp_path / "c", max_files=0)


def test_split_and_concatenation(tmp_path):
    docs = make_corpus(tmp_path / "c", 40)
    c = load_corpus(tmp_path / "c", cache=False)
    assigned = [d for s in SPLITS for d in c.documents[s]]
    assert sorted(assigned) == sorted(docs), "every text document exactly once, decoys skipped"
    assert c.skipped == 4  # blob.dat, ctrl.txt, empty.txt, bad.gz (png excluded by extension before reading)
    assert all(c.documents[s] for s in SPLITS), "no empty split"
    moved = 0
    for s in SPLITS:
        expect = b"".join(docs[d] + bytes([SEPARATOR]) for d in c.documents[s])
        arr = c.split(s)
        assert arr.dtype == np.uint8 and arr.tobytes() == expect
        moved += sum(document_split(d) != s for d in c.documents[s])
    assert moved <= 2, "only the tiny-corpus fallback may override the hash assignment"
    assert len(c.documents["train"]) > len(c.documents["val"])
    assert int((c.split("train") == SEPARATOR).sum()) == len(c.documents["train"])
    with pytest.raises(ValueError, match="unknown split"):
        c.split("dev")


def test_hash_split_is_stable_and_has_the_right_proportions():
    names = [f"pkg{i // 50}/module_{i}.py" for i in range(4000)]
    s = [document_split(n) for n in names]
    assert s == [document_split(n) for n in names]
    frac = {k: s.count(k) / len(s) for k in SPLITS}
    assert abs(frac["train"] - 0.9) < 0.02
    assert abs(frac["val"] - 0.05) < 0.015 and abs(frac["test"] - 0.05) < 0.015
    s2 = [document_split(n, (0.5, 0.25, 0.25)) for n in names]
    assert abs(s2.count("val") / len(s2) - 0.25) < 0.03
    with pytest.raises(ValueError, match="fractions"):
        document_split("a", (0.5, 0.6, 0.1))


def test_adding_files_does_not_move_documents(tmp_path):
    make_corpus(tmp_path / "c", 60)
    a = load_corpus(tmp_path / "c", cache=False)
    for i in range(60, 90):
        (tmp_path / "c" / f"extra_{i}.txt").write_bytes(_text(i))
    b = load_corpus(tmp_path / "c", cache=False)
    for s in SPLITS:
        assert set(a.documents[s]) <= set(b.documents[s])


def test_cache_roundtrip_atomic_and_invalidated(tmp_path):
    make_corpus(tmp_path / "c", 20)
    cache = tmp_path / "mycache"
    a = load_corpus(tmp_path / "c", cache_dir=cache)
    assert a.cache_path is not None and Path(a.cache_path).is_dir()
    assert isinstance(a.split("train"), np.memmap)
    entries = os.listdir(cache / "corpora")
    assert len(entries) == 1 and not entries[0].startswith("."), "no temporary directories left behind"
    b = load_corpus(tmp_path / "c", cache_dir=cache)
    assert b.cache_path == a.cache_path
    fresh = load_corpus(tmp_path / "c", cache=False)
    for s in SPLITS:
        assert np.array_equal(b.split(s), fresh.split(s))
    assert b.documents == fresh.documents
    # changing a file changes the key: a rebuilt, different cache entry
    p = tmp_path / "c" / "doc_000.md"
    p.write_bytes(p.read_bytes() + b"more text\n")
    c = load_corpus(tmp_path / "c", cache_dir=cache)
    assert c.cache_path != a.cache_path
    assert sum(c.num_bytes.values()) == sum(a.num_bytes.values()) + len(b"more text\n")
    # default location from $SEQMEM_CACHE
    d = load_corpus(tmp_path / "c")
    assert d.cache_path.startswith(str(tmp_path / "cache"))


def test_single_file_is_cut_into_contiguous_ranges(tmp_path):
    f = tmp_path / "book.txt"
    data = b"".join(_text(i) for i in range(200))
    f.write_bytes(data)
    c = load_corpus(f, cache=False)
    parts = [c.split(s).tobytes() for s in SPLITS]
    assert all(p.endswith(b"\x00") for p in parts)
    assert b"".join(p[:-1] for p in parts) == data
    assert abs(len(parts[0]) / len(data) - 0.9) < 0.01


def test_errors(tmp_path):
    with pytest.raises(ValueError, match="neither a built-in corpus"):
        load_corpus(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no candidate text files"):
        load_corpus(tmp_path / "empty")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "a.dat").write_bytes(b"\x00\x01" * 50)
    with pytest.raises(ValueError, match="is empty"):
        load_corpus(tmp_path / "bin", cache=False)
    with pytest.raises(ValueError, match="fractions"):
        load_corpus(tmp_path / "bin", fractions=(1.0, 0.5, -0.5))


def test_code_corpus_loads():
    c = load_corpus("code", max_files=25, cache=False)
    assert c.name == "code" and c.num_bytes["train"] > 10_000
    assert all(d.endswith(".py") and "site-packages" not in d for s in SPLITS for d in c.documents[s])
    text = c.split("train").tobytes()
    assert b"def " in text or b"import " in text or b"class " in text


@pytest.mark.skipif(not Path("/usr/share/doc").is_dir(), reason="no /usr/share/doc on this system")
def test_docs_corpus_loads():
    c = load_corpus("docs", max_files=40, cache=False)
    assert c.name == "docs" and sum(c.num_bytes.values()) > 1000


def test_held_out_copies_of_train_documents_are_counted_and_warned(tmp_path):
    import json
    import warnings

    root = tmp_path / "c"
    make_corpus(root, 40)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # distinct documents: no warning
        clean = load_corpus(root, cache_dir=tmp_path / "k")
    meta = json.loads((Path(clean.cache_path) / "meta.json").read_text())
    assert meta["shared_with_train"] == {"val": 0, "test": 0}
    # the same licence text under every held-out document's name and one train document's name
    lic = b"Permission is hereby granted, free of charge ... " * 50
    train_doc = next(r for r in clean.documents["train"] if r.endswith(".txt"))
    held = [r for s in ("val", "test") for r in clean.documents[s] if r.endswith((".txt", ".md"))]
    for rel in [train_doc, *held]:
        (root / rel).write_bytes(lic)
    for cache in (True, False):
        with pytest.warns(UserWarning, match="exact copies of train documents"):
            c = load_corpus(root, cache=cache, cache_dir=tmp_path / "k")
    with pytest.warns(UserWarning, match="exact copies"):  # a cache hit warns too
        c = load_corpus(root, cache_dir=tmp_path / "k")
    meta = json.loads((Path(c.cache_path) / "meta.json").read_text())
    n_val = sum(1 for r in c.documents["val"] if r in held)
    assert meta["shared_with_train"]["val"] == n_val * len(lic)
    # a cache written before the copies were counted is rebuilt, not trusted
    del meta["shared_with_train"]
    (Path(c.cache_path) / "meta.json").write_text(json.dumps(meta))
    with pytest.warns(UserWarning, match="exact copies"):
        again = load_corpus(root, cache_dir=tmp_path / "k")
    assert "shared_with_train" in json.loads((Path(again.cache_path) / "meta.json").read_text())
