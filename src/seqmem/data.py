"""Byte-level text corpora from files on disk (vocabulary 256), split by document into train / val / test.

Built-in corpora (present on any machine with Python and a Debian-like system):

* ``code`` — the Python standard library's ``.py`` files (``sysconfig.get_paths()["stdlib"]``, without
  ``site-packages``);
* ``docs`` — ``/usr/share/doc`` (``.gz`` files are decompressed; binary files are skipped).

Any other name is a path: a directory (every regular, non-hidden text file below it, ``.gz`` decompressed)
or a single file.

Splitting: each document (file) goes to a split by a hash of its path relative to the corpus root —
``u = sha1(relpath) / 2**160``; ``u < f_train`` → train, ``< f_train + f_val`` → val, else test (default
fractions 0.90 / 0.05 / 0.05) — so adding or removing files never moves other files between splits.  If a
split with a nonzero fraction ends up empty (tiny corpora), the train document with the largest ``u`` is moved
into it (as long as train keeps at least one document).  A corpus of a single document is instead cut into
contiguous byte ranges with the same fractions.  Within a split, documents are ordered by relative path and
joined with the separator byte ``0x00`` after every document (files containing NUL bytes are treated as
binary and skipped, so the separator never occurs inside a document).

Exact copies: a document whose bytes also occur in train (a file copied under another path) is counted in the
cache's metadata (``shared_with_train``: bytes per held-out split), and loading a corpus whose validation or test
split has more than 1 % of its bytes in such copies warns: the held-out loss then partly measures memorisation.
Measured: ``docs`` shares 37.1 % of its validation bytes and 32.1 % of its test bytes with train (licence and
changelog files repeated across packages); ``code`` 0.0 %.  The split is kept (it is what earlier runs used).

Binary detection: a file is skipped if it has a known binary extension, is empty, contains a NUL byte, fails
to decompress (``.gz``), or more than 5 % of its first 64 KiB are control bytes other than
``\\t \\n \\v \\f \\r`` and ESC.

Caching: the concatenated splits are written (atomically: temporary directory + rename) to
``$SEQMEM_CACHE`` or ``~/.cache/seqmem`` under ``corpora/<name>-<key>/``, where ``key`` hashes the corpus
root, the selected file list with sizes and modification times, the fractions and the format version; later
loads memory-map them (``np.uint8``).  ``cache=False`` keeps everything in memory.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import sysconfig
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = [
    "BUILTIN_CORPORA",
    "SEPARATOR",
    "SPLITS",
    "Corpus",
    "corpus_files",
    "default_cache_dir",
    "document_split",
    "load_corpus",
    "read_document",
]

SEPARATOR = 0
SPLITS = ("train", "val", "test")
BUILTIN_CORPORA = ("code", "docs")
#: warn when more than this share of a held-out split's bytes are exact copies of train documents
SHARED_WARN = 0.01
DEFAULT_FRACTIONS = (0.9, 0.05, 0.05)
_FORMAT_VERSION = 1
_BINARY_EXT = {
    ".png", ".gif", ".jpg", ".jpeg", ".ico", ".bmp", ".webp", ".pdf", ".zip", ".xz", ".bz2", ".zst", ".lz",
    ".tar", ".tgz", ".so", ".o", ".a", ".pyc", ".pyo", ".woff", ".woff2", ".ttf", ".otf", ".eot", ".mo",
    ".gmo", ".db", ".sqlite", ".bin", ".npy", ".npz", ".pt", ".safetensors", ".wav", ".mp3", ".ogg", ".jar",
    ".class", ".exe", ".dll", ".whl", ".egg", ".gpg", ".pgp",
}
_TEXT_CONTROL = {9, 10, 11, 12, 13, 27}
_CONTROL = np.array([b < 32 and b not in _TEXT_CONTROL or b == 127 for b in range(256)])


def default_cache_dir() -> Path:
    """``$SEQMEM_CACHE`` if set, else ``~/.cache/seqmem``."""
    env = os.environ.get("SEQMEM_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "seqmem"


def _hash_unit(relpath: str) -> float:
    """A deterministic number in [0, 1) from a relative path (sha1; platform independent)."""
    return int.from_bytes(hashlib.sha1(relpath.encode("utf-8", "surrogateescape")).digest(), "big") / 2.0**160


def _check_fractions(fractions: tuple[float, float, float]) -> tuple[float, float, float]:
    try:
        f = tuple(float(x) for x in fractions)
    except (TypeError, ValueError):
        raise ValueError(f"fractions must be three numbers (train, val, test), got {fractions!r}") from None
    if len(f) != 3 or any(x < 0 for x in f) or abs(sum(f) - 1.0) > 1e-9 or f[0] <= 0:
        raise ValueError(
            f"fractions must be three non-negative numbers summing to 1 with train > 0, got {fractions!r}"
        )
    return f  # type: ignore[return-value]


def document_split(relpath: str, fractions: tuple[float, float, float] = DEFAULT_FRACTIONS) -> str:
    """The split (``"train"``, ``"val"`` or ``"test"``) of a document, from a hash of its relative path."""
    f = _check_fractions(fractions)
    u = _hash_unit(relpath)
    return "train" if u < f[0] else "val" if u < f[0] + f[1] else "test"


def _resolve(name_or_path: str | os.PathLike) -> tuple[str, Path, str]:
    """(corpus name, root, kind) with kind ``code`` | ``docs`` | ``dir`` | ``file``."""
    s = str(name_or_path)
    if s == "code":
        return "code", Path(sysconfig.get_paths()["stdlib"]), "code"
    if s == "docs":
        return "docs", Path("/usr/share/doc"), "docs"
    p = Path(s).expanduser()
    if p.is_dir():
        return p.resolve().name or "root", p.resolve(), "dir"
    if p.is_file():
        return p.name, p.resolve(), "file"
    raise ValueError(
        f"corpus {s!r} is neither a built-in corpus ({', '.join(BUILTIN_CORPORA)}) nor an existing file or "
        "directory"
    )


def corpus_files(name_or_path: str | os.PathLike, max_files: int | None = None) -> tuple[Path, list[str]]:
    """The corpus root and the sorted relative paths of its candidate documents (before binary detection).

    ``max_files`` keeps a deterministic pseudo-random subset: the ``max_files`` paths with the smallest hash.
    """
    bad = isinstance(max_files, bool) or not isinstance(max_files, int) or max_files <= 0
    if max_files is not None and bad:
        raise ValueError(f"max_files must be a positive integer or None, got {max_files!r}")
    _, root, kind = _resolve(name_or_path)
    if kind == "file":
        return root.parent, [root.name]
    if not root.is_dir():
        raise ValueError(f"corpus root {str(root)!r} does not exist")
    rel: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        if kind == "code":
            dirnames[:] = [x for x in dirnames if x not in ("site-packages", "dist-packages", "__pycache__")]
        dirnames[:] = sorted(x for x in dirnames if not x.startswith("."))
        for fn in filenames:
            if fn.startswith("."):
                continue
            if kind == "code" and not fn.endswith(".py"):
                continue
            full = d / fn
            if not full.is_file():  # broken symlinks, sockets, ...
                continue
            if _ext(fn) in _BINARY_EXT:
                continue
            rel.append(full.relative_to(root).as_posix())
    rel.sort()
    if max_files is not None and len(rel) > max_files:
        rel = sorted(sorted(rel, key=_hash_unit)[:max_files])
    return root, rel


def _ext(fn: str) -> str:
    low = fn.lower()
    if low.endswith(".gz"):
        low = low[:-3]
    return os.path.splitext(low)[1]


def _is_text(data: bytes) -> bool:
    if not data or b"\x00" in data:
        return False
    head = np.frombuffer(data[:65536], dtype=np.uint8)
    return float(_CONTROL[head].mean()) <= 0.05


def read_document(path: str | os.PathLike) -> bytes | None:
    """The bytes of a text document (``.gz`` decompressed), or ``None`` if it is binary/unreadable/empty."""
    path = Path(path)
    try:
        data = path.read_bytes()
        if path.name.lower().endswith(".gz"):
            data = gzip.decompress(data)
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile):
        return None
    return data if _is_text(data) else None


@dataclass
class Corpus:
    """A loaded corpus: ``splits[name]`` is a 1-D ``np.uint8`` array (memory-mapped when cached)."""

    name: str
    root: str
    splits: dict[str, np.ndarray]
    documents: dict[str, list[str]] = field(default_factory=dict)
    skipped: int = 0
    cache_path: str | None = None

    def split(self, name: str) -> np.ndarray:
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r}; valid: {', '.join(SPLITS)}")
        return self.splits[name]

    @property
    def num_bytes(self) -> dict[str, int]:
        return {k: int(v.shape[0]) for k, v in self.splits.items()}

    def __repr__(self) -> str:
        docs = {k: len(v) for k, v in self.documents.items()}
        return f"Corpus({self.name!r}, root={self.root!r}, bytes={self.num_bytes}, documents={docs})"


def _cache_key(root: Path, files: list[str], fractions: tuple[float, float, float]) -> str:
    h = hashlib.sha256()
    h.update(f"v{_FORMAT_VERSION}\0{root}\0{fractions}\0".encode())
    for rel in files:
        try:
            st = (root / rel).stat()
            h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode("utf-8", "surrogateescape"))
        except OSError:
            h.update(f"{rel}\0missing\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()[:20]


def _assign(docs: list[str], fractions: tuple[float, float, float]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {s: [] for s in SPLITS}
    for rel in docs:
        out[document_split(rel, fractions)].append(rel)
    for s, f in zip(SPLITS[1:], fractions[1:]):  # tiny corpora: never leave a requested split empty
        if f > 0 and not out[s] and len(out["train"]) > 1:
            mv = max(out["train"], key=_hash_unit)
            out["train"].remove(mv)
            out[s].append(mv)
    return {s: sorted(v) for s, v in out.items()}


def _build(root: Path, files: list[str], fractions
           ) -> tuple[dict[str, bytes], dict[str, list[str]], int, dict[str, int]]:
    texts: dict[str, bytes] = {}
    for rel in files:
        data = read_document(root / rel)
        if data is not None:
            texts[rel] = data
    skipped = len(files) - len(texts)
    sep = bytes([SEPARATOR])
    if len(texts) == 1:  # one document: contiguous byte ranges
        (rel, data), = texts.items()
        n = len(data)
        a, b = int(round(fractions[0] * n)), int(round((fractions[0] + fractions[1]) * n))
        parts = {"train": data[:a], "val": data[a:b], "test": data[b:]}
        return ({s: parts[s] + sep for s in SPLITS}, {s: [rel] for s in SPLITS}, skipped, {"val": 0, "test": 0})
    assign = _assign(sorted(texts), fractions)
    blobs = {s: b"".join(texts[r] + sep for r in assign[s]) for s in SPLITS}
    return blobs, assign, skipped, _shared_with_train(texts, assign)


def _shared_with_train(texts: dict[str, bytes], assign: dict[str, list[str]]) -> dict[str, int]:
    """Bytes of each held-out split that lie in documents whose exact content is also a train document."""
    train = {hashlib.sha1(texts[r]).digest() for r in assign["train"]}
    return {s: sum(len(texts[r]) for r in assign[s] if hashlib.sha1(texts[r]).digest() in train) for s in SPLITS[1:]}


def _warn_shared(name: str, meta: dict) -> None:
    import warnings

    shared, size = meta.get("shared_with_train") or {}, meta["bytes"]
    heavy = {s: shared[s] / size[s] for s in shared if size.get(s) and shared[s] / size[s] > SHARED_WARN}
    if heavy:
        warnings.warn(f"corpus {name!r}: " + ", ".join(f"{v:.1%} of the {s} bytes" for s, v in heavy.items())
                      + " are exact copies of train documents (files repeated under other paths): held-out losses "
                      "on it partly measure memorisation", UserWarning, stacklevel=3)


def _file_sha256(path: Path) -> str:
    from seqmem.io import file_sha256

    return file_sha256(path)


def _load_cached(d: Path) -> tuple[dict[str, np.ndarray], dict] | None:
    meta_path = d / "meta.json"
    if not meta_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_text())
        if not isinstance(meta.get("shared_with_train"), dict):  # built before the copies were counted: rebuild
            return None
        splits = {}
        for s in SPLITS:
            p = d / f"{s}.bin"
            if p.stat().st_size != meta["bytes"][s]:
                return None
            # the content, not just the size: a cache edited in place (or from an older format) is rebuilt
            if not isinstance(meta.get("sha256"), dict) or _file_sha256(p) != meta["sha256"].get(s):
                return None
            splits[s] = np.memmap(p, dtype=np.uint8, mode="r") if meta["bytes"][s] else np.zeros(0, np.uint8)
        return splits, meta
    except (OSError, ValueError, KeyError):
        return None


def load_corpus(
    name_or_path: str | os.PathLike = "code",
    *,
    max_files: int | None = None,
    fractions: tuple[float, float, float] = DEFAULT_FRACTIONS,
    cache: bool = True,
    cache_dir: str | os.PathLike | None = None,
) -> Corpus:
    """Load corpus ``code`` | ``docs`` | a directory | a file as byte arrays split into train/val/test.

    Raises ``ValueError`` if the corpus does not exist or holds no text documents.
    """
    fractions = _check_fractions(fractions)
    name, _, _ = _resolve(name_or_path)
    root, files = corpus_files(name_or_path, max_files)
    if not files:
        raise ValueError(f"corpus {str(name_or_path)!r} has no candidate text files under {str(root)!r}")
    cdir = None
    if cache:
        key = _cache_key(root, files, fractions)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:40]
        cdir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        cdir = cdir / "corpora" / f"{safe}-{key}"
        hit = _load_cached(cdir)
        if hit is not None:
            splits, meta = hit
            _warn_shared(name, meta)
            return Corpus(name, str(root), splits, meta["documents"], meta["skipped"], str(cdir))
    blobs, assign, skipped, shared = _build(root, files, fractions)
    if sum(len(v) for v in assign.values()) == 0:
        raise ValueError(
            f"corpus {str(name_or_path)!r} is empty: none of its {len(files)} files under {str(root)!r} is a "
            "non-empty text file"
        )
    splits = {s: np.frombuffer(blobs[s], dtype=np.uint8) for s in SPLITS}
    sizes = {s: len(blobs[s]) for s in SPLITS}
    _warn_shared(name, {"shared_with_train": shared, "bytes": sizes})
    if cdir is not None:
        meta = {"name": name, "root": str(root), "fractions": list(fractions), "documents": assign,
                "skipped": skipped, "bytes": sizes, "version": _FORMAT_VERSION,
                "sha256": {s: hashlib.sha256(blobs[s]).hexdigest() for s in SPLITS},
                "shared_with_train": shared}
        try:
            _write_atomic_dir(cdir, blobs, meta)
            hit = _load_cached(cdir)
            if hit is not None:
                splits = hit[0]
        except OSError:  # read-only home etc.: fall back to the in-memory arrays
            cdir = None
    return Corpus(name, str(root), splits, assign, skipped, None if cdir is None else str(cdir))


def _write_atomic_dir(target: Path, blobs: dict[str, bytes], meta: dict) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    try:
        for s in SPLITS:
            (tmp / f"{s}.bin").write_bytes(blobs[s])
        (tmp / "meta.json").write_text(json.dumps(meta))
        try:
            os.rename(tmp, target)
        except OSError:  # another process won the race (target exists): keep theirs
            if _load_cached(target) is None:
                shutil.rmtree(target, ignore_errors=True)
                os.rename(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
