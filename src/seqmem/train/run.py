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
    task = build_task(spec["task"]["name"], **spec["task"].get("options", {}))
    mcfg = dict(spec["model"])
    mcfg["vocab_size"] = task.vocab_size
    model = LanguageModel(LMConfig.from_dict(mcfg))
    return model, task
