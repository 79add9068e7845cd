"""Tokenizers for exported models: a training run's tokenizer as a ``transformers.PreTrainedTokenizerFast`` with
its end-of-text token as ``eos_token`` and ``pad_token`` (what batched ``generate`` with left padding needs), written
with ``save_pretrained`` so ``AutoTokenizer.from_pretrained(DIR)`` loads it.

* byte-level runs (``--task lm`` without ``--tokenizer``, or ``--tokenizer byte``): a tokenizer whose ids are the
  byte values (0..255, nothing added); the document separator 0 is the EOS/pad token.  Its text form is the
  byte-level character of byte 0 (``"Ā"``), so that character in input text encodes as id 0, not as its UTF-8 bytes.
* ``--tokenizer train:V`` or a ``tokenizer.json``: that tokenizer, EOS/pad ``<|endoftext|>`` (the separator the run
  was trained with).
* a Hugging Face tokenizer: itself, with ``pad_token = eos_token`` when it has no pad token.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["byte_tokenizer", "export_tokenizer", "run_tokenizer"]


def _bytes_to_unicode() -> dict[int, str]:
    """The byte-level (GPT-2) map from bytes to printable characters, used by ``tokenizers``' ``ByteLevel``."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def byte_tokenizer() -> Any:
    """A ``PreTrainedTokenizerFast`` whose token ids are the UTF-8 bytes of the text (seqmem's byte runs)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    b2u = _bytes_to_unicode()
    tok = Tokenizer(models.BPE(vocab={b2u[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=b2u[0], pad_token=b2u[0])


def run_tokenizer(run_dir: str | Path) -> Any | None:
    """The tokenizer of a ``seqmem train`` run as a ``PreTrainedTokenizerFast`` (``None`` for tasks without text,
    e.g. MQAR)."""
    from seqmem.textdata import EOS_TOKEN

    run = Path(run_dir)
    spec = json.loads((run / "run.json").read_text())
    task = spec.get("task", {})
    name, opts = task.get("name"), task.get("options", {})
    tok_dir = run / "tokenizer"
    if name == "lm" or (name == "text" and opts.get("tokenizer", "byte") == "byte") or (
            tok_dir / "byte_tokenizer.json").is_file():
        return byte_tokenizer()
    if (tok_dir / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(tok_dir))
        if tok.pad_token is None and tok.eos_token is not None:
            tok.pad_token = tok.eos_token
        return tok
    if (tok_dir / "tokenizer.json").is_file():
        from tokenizers import Tokenizer
        from transformers import PreTrainedTokenizerFast

        obj = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
        eos = EOS_TOKEN if obj.token_to_id(EOS_TOKEN) is not None else None
        return PreTrainedTokenizerFast(tokenizer_object=obj, eos_token=eos, pad_token=eos)
    return None


def export_tokenizer(run_dir: str | Path, out_dir: str | Path, model: Any = None) -> Any | None:
    """Write the run's tokenizer to ``out_dir`` (``save_pretrained``) and, given the exported ``model``, set
    ``eos_token_id`` / ``pad_token_id`` in its config and generation config.  Returns the tokenizer (or ``None``)."""
    tok = run_tokenizer(run_dir)
    if tok is None:
        return None
    tok.save_pretrained(str(out_dir))
    if model is not None and tok.eos_token_id is not None:
        for cfg in (model.config, getattr(model, "generation_config", None)):
            if cfg is not None:
                cfg.eos_token_id = tok.eos_token_id
                cfg.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return tok
