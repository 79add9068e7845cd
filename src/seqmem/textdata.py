"""Real text data for language modelling: document sources (local files, ``datasets``) and tokenizers.

Document sources (:func:`load_documents` → ``{"train"|"val"|"test": [bytes, ...]}``):

* ``code`` / ``docs`` / a directory of text files / a text file — the offline corpora of :mod:`seqmem.data`
  (same files, same hash split by path, same cache);
* a ``.jsonl`` / ``.json`` file of records — read without extra packages, the text in ``text_field``;
* a ``.parquet`` / ``.csv`` / ``.arrow`` file, or a ``datasets`` ``save_to_disk`` directory — via ``datasets``;
* anything else is a Hugging Face Hub dataset name, loaded with ``datasets.load_dataset(..., streaming=True)``
  (network needed); the short names ``pg19``, ``proof-pile`` and ``fineweb-edu`` are mapped in
  :data:`DATASET_ALIASES`.  At most ``max_docs`` documents per split are read (default 10 000 for Hub datasets).

Record sources without their own splits are split by document index with
:func:`seqmem.data.document_split` (a hash of ``"doc-<index>"``), so the split never depends on the tokenizer; exact
copies of a record then land in several splits, which is warned about (deduplicate such a source).

Tokenizers (:func:`load_tokenizer`): ``byte`` (256 ids, the byte values; separator 0 as in :mod:`seqmem.data`), a
``tokenizer.json`` file (``tokenizers``), a Hugging Face tokenizer name or local directory (``transformers``), or
``train:<vocab>`` — a byte-level BPE trained with ``tokenizers`` on the train split (cached by a hash of the training
documents and the vocabulary size, so every run and every rank gets the same one).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from seqmem.data import DEFAULT_FRACTIONS, SEPARATOR, SPLITS, default_cache_dir, document_split, load_corpus

__all__ = [
    "DATASET_ALIASES",
    "TextTokenizer",
    "load_documents",
    "load_tokenizer",
    "tokenize_splits",
]

#: short name → (Hub id, config, text field)
DATASET_ALIASES: dict[str, tuple[str, str | None, str]] = {
    "pg19": ("deepmind/pg19", None, "text"),
    "proof-pile": ("hoskinson-center/proof-pile", None, "text"),
    "fineweb-edu": ("HuggingFaceFW/fineweb-edu", "sample-10BT", "text"),
}
_RECORD_EXT = {".jsonl", ".json"}
_DATASETS_EXT = {".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}
_HF_SPLITS = {"train": ("train",), "val": ("validation", "valid", "val", "dev"), "test": ("test",)}
EOS_TOKEN = "<|endoftext|>"


def _need_datasets(what: str):
    try:
        import datasets
    except ImportError:
        raise ValueError(
            f"{what} needs the 'datasets' package (pip install 'seqmem[data]'); local text / .jsonl files work "
            "without it"
        ) from None
    return datasets


def _is_saved_dataset(p: Path) -> bool:
    return p.is_dir() and any((p / f).is_file() for f in ("dataset_dict.json", "dataset_info.json", "state.json"))


def _hash_split(docs: Iterable[bytes], fractions: tuple[float, float, float]) -> dict[str, list[bytes]]:
    out: dict[str, list[bytes]] = {s: [] for s in SPLITS}
    for i, d in enumerate(docs):
        out[document_split(f"doc-{i}", fractions)].append(d)
    for s, f in zip(SPLITS[1:], fractions[1:]):  # tiny sources: never leave a requested split empty
        if f > 0 and not out[s] and len(out["train"]) > 1:
            out[s].append(out["train"].pop())
    _warn_shared_documents(out)
    return out


def _warn_shared_documents(splits: dict[str, list[bytes]]) -> None:
    """Warn when an exact copy of a document is in more than one split: a split by record index puts the copies of
    a repeated record (boilerplate, a duplicated page) in every split, so the held-out splits share text with train.
    The split itself is kept (it is what earlier runs were trained and evaluated on)."""
    import warnings

    where: dict[bytes, set[str]] = {}
    for s, docs in splits.items():
        for d in docs:
            where.setdefault(hashlib.sha1(d).digest(), set()).add(s)
    shared = sum(1 for v in where.values() if len(v) > 1)
    if shared:
        warnings.warn(f"{shared} distinct document(s) occur in more than one split (exact copies; records without "
                      "their own validation and test splits are split by index): the held-out splits share text "
                      "with train; deduplicate the source for a clean evaluation", UserWarning, stacklevel=3)


def _text_of(rec: Any, field: str, where: str) -> bytes:
    if not isinstance(rec, dict) or field not in rec:
        keys = sorted(rec) if isinstance(rec, dict) else type(rec).__name__
        raise ValueError(f"{where}: record has no text field {field!r} (fields: {keys}); set text_field")
    v = rec[field]
    return v.encode("utf-8") if isinstance(v, str) else bytes(v)


def _read_records(path: Path, field: str, max_docs: int | None) -> list[bytes]:
    docs: list[bytes] = []
    if path.suffix == ".jsonl" or path.read_bytes()[:1] not in (b"[",):
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path}:{n}: not a JSON line ({e.msg})") from None
                    docs.append(_text_of(rec, field, f"{path}:{n}"))
                if max_docs is not None and len(docs) >= max_docs:
                    break
    else:
        recs = json.loads(path.read_text(encoding="utf-8"))
        docs = [_text_of(r, field, str(path)) for r in recs[:max_docs]]
    return [d for d in docs if d]


def _from_hf(ds: Any, field: str, max_docs: int | None, fractions) -> dict[str, list[bytes]]:
    """Documents of a ``datasets`` Dataset / DatasetDict / IterableDataset(Dict)."""
    def take(d) -> list[bytes]:
        out = []
        for rec in d:
            t = _text_of(rec, field, "dataset")
            if t:
                out.append(t)
            if max_docs is not None and len(out) >= max_docs:
                break
        return out

    if hasattr(ds, "keys"):  # DatasetDict / IterableDatasetDict
        names = set(ds.keys())
        found = {s: next((n for n in _HF_SPLITS[s] if n in names), None) for s in SPLITS}
        if found["train"] is None:
            raise ValueError(f"dataset has no train split (splits: {sorted(names)})")
        if found["val"] and found["test"]:
            return {s: take(ds[found[s]]) for s in SPLITS}
        return _hash_split(take(ds[found["train"]]), fractions)
    return _hash_split(take(ds), fractions)


def load_documents(
    dataset: str,
    *,
    text_field: str = "text",
    max_docs: int | None = None,
    max_files: int | None = None,
    fractions: tuple[float, float, float] = DEFAULT_FRACTIONS,
    cache: bool = True,
) -> tuple[dict[str, list[bytes]], str]:
    """``({split: [document bytes]}, identity)`` for a dataset name or path (module docstring); ``identity`` is a
    string that changes when the documents change (used in cache keys)."""
    if max_docs is not None and (isinstance(max_docs, bool) or not isinstance(max_docs, int) or max_docs <= 0):
        raise ValueError(f"max_docs must be a positive integer or None, got {max_docs!r}")
    p = Path(str(dataset)).expanduser()
    if p.is_file() and p.suffix.lower() in _RECORD_EXT:
        st = p.stat()
        docs = _hash_split(_read_records(p, text_field, max_docs), fractions)
        return docs, f"records:{p.resolve()}:{st.st_size}:{st.st_mtime_ns}:{text_field}:{max_docs}:{fractions}"
    if p.is_file() and p.suffix.lower() in _DATASETS_EXT:
        datasets = _need_datasets(f"reading {p.suffix} files")
        ds = datasets.load_dataset(_DATASETS_EXT[p.suffix.lower()], data_files=str(p), split="train")
        st = p.stat()
        return (_from_hf(ds, text_field, max_docs, fractions),
                f"file:{p.resolve()}:{st.st_size}:{st.st_mtime_ns}:{text_field}:{max_docs}:{fractions}")
    if _is_saved_dataset(p):
        datasets = _need_datasets("a save_to_disk dataset directory")
        ds = datasets.load_from_disk(str(p))
        stamp = max(f.stat().st_mtime_ns for f in p.rglob("*") if f.is_file())
        return (_from_hf(ds, text_field, max_docs, fractions),
                f"saved:{p.resolve()}:{stamp}:{text_field}:{max_docs}:{fractions}")
    if str(dataset) in ("code", "docs") or p.exists():
        corpus = load_corpus(str(dataset), max_files=max_files, fractions=fractions, cache=cache)
        sep = bytes([SEPARATOR])
        docs = {}
        for s in SPLITS:
            parts = bytes(corpus.split(s)).split(sep)
            docs[s] = [d for d in parts if d][:max_docs]
        ident = f"corpus:{corpus.cache_path or corpus.root}:{corpus.num_bytes}:{max_docs}"
        return docs, ident
    # a Hugging Face Hub dataset
    name, config, field = DATASET_ALIASES.get(str(dataset).lower(), (str(dataset), None, text_field))
    if text_field != "text":
        field = text_field
    datasets = _need_datasets(f"dataset {dataset!r} (neither a local file/directory nor a built-in corpus)")
    n = 10_000 if max_docs is None else max_docs
    try:
        ds = datasets.load_dataset(name, config, streaming=True)
    except Exception as e:  # offline, unknown name, gated dataset, ...
        raise ValueError(f"could not load dataset {name!r} ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    return _from_hf(ds, field, n, fractions), f"hub:{name}:{config}:{field}:{n}:{fractions}"


# ------------------------------------------------------------------------------------------------ tokenizers
class TextTokenizer:
    """A uniform view of a tokenizer: ``encode(bytes) -> list[int]``, ``decode``, ``vocab_size``, ``sep_id``."""

    def __init__(self, kind: str, obj: Any = None, name: str = "byte") -> None:
        self.kind, self.obj, self.name = kind, obj, name
        if kind == "byte":
            self.vocab_size, self.sep_id = 256, SEPARATOR
        elif kind == "tokenizers":
            self.vocab_size = obj.get_vocab_size(with_added_tokens=True)
            self.sep_id = obj.token_to_id(EOS_TOKEN)
        else:  # transformers
            self.vocab_size = len(obj)
            self.sep_id = obj.eos_token_id if obj.eos_token_id is not None else obj.sep_token_id

    def encode_batch(self, docs: list[bytes]) -> list[list[int]]:
        if self.kind == "byte":
            return [list(d) for d in docs]
        texts = [d.decode("utf-8", errors="replace") for d in docs]
        if self.kind == "tokenizers":
            return [e.ids for e in self.obj.encode_batch(texts, add_special_tokens=False)]
        return self.obj(texts, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        if self.kind == "byte":
            return bytes(int(i) for i in ids).decode("utf-8", errors="replace")
        return self.obj.decode(list(map(int, ids)))

    def fingerprint(self) -> str:
        """Changes whenever the token ids of some text would change."""
        if self.kind == "byte":
            return "byte"
        if self.kind == "tokenizers":
            return hashlib.sha256(self.obj.to_str().encode()).hexdigest()[:20]
        backend = getattr(self.obj, "backend_tokenizer", None)
        blob = backend.to_str() if backend is not None else json.dumps(sorted(self.obj.get_vocab().items()))
        return hashlib.sha256(blob.encode()).hexdigest()[:20]

    def save(self, directory: str | os.PathLike) -> None:
        """Write the tokenizer where ``load_tokenizer(directory)`` (or ``AutoTokenizer``) reads it back."""
        from seqmem.io import atomic_write_text, check_within

        d = Path(directory)
        check_within(d.parent, d / "tokenizer.json")  # the directory itself is no link to elsewhere
        d.mkdir(parents=True, exist_ok=True)
        # written beside and renamed over: a link planted under the file's name is replaced, never written through
        if self.kind == "byte":
            atomic_write_text(d / "byte_tokenizer.json", json.dumps({"type": "byte", "vocab_size": 256}), root=d)
        elif self.kind == "tokenizers":
            atomic_write_text(d / "tokenizer.json", self.obj.to_str(pretty=True), root=d)
        else:
            self.obj.save_pretrained(str(d))


def _train_bpe(docs: list[bytes], vocab: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=[EOS_TOKEN], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((d.decode("utf-8", errors="replace") for d in docs), trainer=trainer, length=len(docs))
    return tok


def load_tokenizer(
    spec: str, train_docs: list[bytes] | None = None, cache: bool = True, corpus_id: str = ""
) -> TextTokenizer:
    """``byte`` | ``train:<vocab>`` | a ``tokenizer.json`` path | a Hugging Face tokenizer name or directory."""
    spec = str(spec)
    if spec == "byte":
        return TextTokenizer("byte")
    if spec.startswith("train:"):
        try:
            vocab = int(spec.split(":", 1)[1])
        except ValueError:
            raise ValueError(f"tokenizer {spec!r}: expected train:<vocab size>, e.g. train:4096") from None
        if vocab < 257 + 1:
            raise ValueError(f"tokenizer {spec!r}: the vocabulary must exceed the 256 byte symbols + 1 special")
        if not train_docs:
            raise ValueError("tokenizer train:<vocab> needs training documents (the train split is empty)")
        h = hashlib.sha256(f"bpe-v1\0{vocab}\0{corpus_id}\0".encode())
        for d in train_docs:
            h.update(hashlib.sha1(d).digest())
        path = default_cache_dir() / "tokenizers" / f"bpe{vocab}-{h.hexdigest()[:20]}.json"
        from tokenizers import Tokenizer

        if cache and path.is_file():
            return TextTokenizer("tokenizers", Tokenizer.from_file(str(path)), spec)
        tok = _train_bpe(train_docs, vocab)
        if cache:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
                os.close(fd)
                tok.save(tmp)
                os.replace(tmp, path)
            except OSError:
                pass
        return TextTokenizer("tokenizers", tok, spec)
    p = Path(spec).expanduser()
    if p.is_file() and p.suffix == ".json":
        from tokenizers import Tokenizer

        return TextTokenizer("tokenizers", Tokenizer.from_file(str(p)), spec)
    if p.is_dir() and (p / "byte_tokenizer.json").is_file():
        return TextTokenizer("byte")
    if p.is_dir() and (p / "tokenizer.json").is_file() and not (p / "tokenizer_config.json").is_file():
        from tokenizers import Tokenizer

        return TextTokenizer("tokenizers", Tokenizer.from_file(str(p / "tokenizer.json")), spec)
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ValueError(
            f"tokenizer {spec!r}: Hugging Face tokenizers by name need 'transformers' (pip install seqmem[hf])"
        ) from None
    try:
        tok = AutoTokenizer.from_pretrained(spec)
    except Exception as e:
        raise ValueError(f"could not load tokenizer {spec!r} ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    return TextTokenizer("transformers", tok, spec)


def tokenize_splits(
    docs: dict[str, list[bytes]], tok: TextTokenizer, cache_key: str | None = None
) -> dict[str, np.ndarray]:
    """Each split as one ``int32`` token stream: every document's ids followed by the separator (if any).

    With ``cache_key`` the streams are cached as ``.npy`` under ``$SEQMEM_CACHE/tokens/``."""
    cdir = None
    if cache_key is not None:
        key = hashlib.sha256(f"tok-v1\0{cache_key}\0{tok.fingerprint()}".encode()).hexdigest()[:24]
        cdir = default_cache_dir() / "tokens" / key
        if all((cdir / f"{s}.npy").is_file() for s in SPLITS):
            try:
                return {s: np.load(cdir / f"{s}.npy", mmap_mode="r") for s in SPLITS}
            except (OSError, ValueError):
                pass
    out = {}
    for s in SPLITS:
        ids: list[int] = []
        for chunk in range(0, len(docs[s]), 256):
            for seq in tok.encode_batch(docs[s][chunk : chunk + 256]):
                ids.extend(seq)
                if tok.sep_id is not None:
                    ids.append(tok.sep_id)
        out[s] = np.asarray(ids, dtype=np.int32)
    if cdir is not None:
        try:
            cdir.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=cdir.parent, prefix=".tmp-"))
            for s in SPLITS:
                np.save(tmp / f"{s}.npy", out[s])
            try:
                os.rename(tmp, cdir)
            except OSError:  # another process (rank) won the race
                import shutil

                shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            pass
    return out
