"""A run specification (the ``run.json`` of a training run) and the model and task it describes.

``run.json`` has three sections: ``task`` (``name`` and ``options`` for :func:`seqmem.tasks.build_task`),
``model`` (:class:`seqmem.models.LMConfig` fields except the vocabulary, which comes from the task) and ``train``
(:class:`seqmem.train.TrainConfig` fields).  ``seqmem train`` writes it, ``seqmem sweep`` writes one per grid point,
and ``seqmem eval``, ``seqmem export-hf`` and :mod:`seqmem.hf` rebuild the run from it."""

from __future__ import annotations

from typing import Any


def build_run(spec: dict[str, Any]):
    """``(model, task)`` from a run specification (see the module docstring)."""
    from seqmem.models import LanguageModel, LMConfig
    from seqmem.tasks import build_task

    for key in ("task", "model"):
        if not isinstance(spec.get(key), dict):
            raise ValueError(f"run specification has no {key!r} section (a dict)")
    if not isinstance(spec["task"].get("name"), str):
        raise ValueError("run specification: task has no 'name' (a string)")
    options = spec["task"].get("options", {})
    if not isinstance(options, dict):
        raise ValueError("run specification: task 'options' must be an object")
    if "train" in spec and not isinstance(spec["train"], dict):
        raise ValueError("run specification: 'train' must be an object")
    mcfg = dict(spec["model"])
    check_model_size(mcfg)  # before the task reads its data and before any allocation
    task = build_task(spec["task"]["name"], **options)
    mcfg["vocab_size"] = task.vocab_size
    model = LanguageModel(LMConfig.from_dict(mcfg))
    return model, task


def check_model_size(model: dict[str, Any], vocab_size: int = 0) -> None:
    """Refuse a model whose parameters, gradients and AdamW moments (16 bytes per parameter) would not fit in this
    machine's memory, in one line, instead of an allocator's traceback a minute later."""
    import os

    try:
        d, n = float(model.get("d_model", 0)), float(model.get("n_layers", 1))
        ratio = float(model.get("mlp_ratio", 4.0))
    except (TypeError, ValueError):
        return  # wrong types: LMConfig says which
    params = n * (4 + 3 * ratio) * d * d + vocab_size * d
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    if params * 16 > memory:
        raise ValueError(f"the model (d_model {model.get('d_model')}, {model.get('n_layers')} layers, mlp_ratio "
                         f"{model.get('mlp_ratio', 4.0)}) has about {params:.3g} parameters: with gradients and "
                         f"optimizer state {params * 16 / 2**30:,.0f} GiB, more than this machine's "
                         f"{memory / 2**30:,.0f} GiB")


def check_data_paths(spec: dict[str, Any], source: str, roots: list[Any]) -> None:
    """A run specification read from a file (``run.json``) may name local data — a corpus, a dataset, a tokenizer
    — only under ``roots`` (the current directory and the one holding the run) or a directory listed in
    ``$SEQMEM_DATA_ROOTS``
    (``os.pathsep``-separated): a tampered file must not make a command read anything else (``/etc``).  Names that
    are not local paths (``code``, a Hub dataset) pass.  One ``ValueError`` line naming the file and the option."""
    import os
    from pathlib import Path

    roots = list(roots) + [r for r in os.environ.get("SEQMEM_DATA_ROOTS", "").split(os.pathsep) if r]
    options = (spec.get("task") or {}).get("options") or {}
    if not isinstance(options, dict):
        return
    allowed = [Path(r).resolve() for r in roots]
    for key in ("corpus", "dataset", "tokenizer", "data", "path"):
        v = options.get(key)
        if not isinstance(v, str) or not v:
            continue
        p = Path(v).expanduser()
        if not (p.is_absolute() or p.exists() or v.startswith((".", "~"))):
            continue  # a name (code, docs, a Hub dataset), not a local path
        r = p.resolve()
        if not any(r == a or a in r.parents for a in allowed):
            raise ValueError(f"{source}: task option {key} = {v!r} is outside {' and '.join(map(str, allowed))}; "
                             "a run file may only name data under these (run the command from a directory that "
                             "holds it, or list its directory in SEQMEM_DATA_ROOTS)")
