"""The evaluation of the Echo tables: our task grids over sequence length and KV count, and accuracy on one
cell."""

from __future__ import annotations

from typing import Any

from seqmem.tasks.base import masked_accuracy
from seqmem.tasks.echo_tasks import EchoCommonWord, EchoMQAR, EchoMultiHop, EchoNIAH, EchoSysPrompt, EchoToolTrace
from seqmem.train import evaluate


def task_grids(kind: str, action_mask: bool = False) -> dict[str, list[tuple[str, Any]]]:
    """Per task: list of (cell label, task) — our grids over sequence length and KV count.  ``action_mask``: every
    task gives the oracle fact mask (:mod:`seqmem.tasks.echo_tasks`) with its examples (the same examples)."""
    if action_mask:
        return {tn: [(lab, type(t)(**{**_options(t), "action_mask": True})) for lab, t in cells]
                for tn, cells in task_grids(kind).items()}
    if kind == "smoke":
        return {
            "MQAR": [("M=2,gap=16", EchoMQAR(num_pairs=2, gap=16))],
            "SysPrompt": [("T=64,vars=4", EchoSysPrompt(seq_len=64, n_vars=4))],
            "ToolTrace": [("T=64,calls=6", EchoToolTrace(seq_len=64, n_calls=6))],
            "NIAH": [("T=64,kv=1", EchoNIAH(seq_len=64, n_kv=1))],
            "MultiHop": [("T=32,kv=3", EchoMultiHop(seq_len=32, n_kv=3))],
            "CommonWord": [("T=64,n=4", EchoCommonWord(seq_len=64, list_len=4))],
        }
    lens = [64, 128] if kind == "small" else [64, 128, 256, 512]
    mh = [32, 64, 128] if kind == "small" else [16, 32, 64, 128, 256]
    return {
        "MQAR": [(f"M={m},gap={g}", EchoMQAR(num_pairs=m, gap=g)) for m in (2, 4, 8) for g in (16, 48)],
        "SysPrompt": [
            (f"T={t},vars={v}", EchoSysPrompt(seq_len=t, n_vars=v)) for t in lens for v in (2, 4, 6)
        ],
        "ToolTrace": [
            (f"T={t},calls={c}", EchoToolTrace(seq_len=t, n_calls=c)) for t in lens for c in (4, 8)
        ],
        "NIAH": [(f"T={t},kv={k}", EchoNIAH(seq_len=t, n_kv=k)) for t in lens for k in (1, 4, 8)],
        "MultiHop": [
            (f"T={t},kv={k}", EchoMultiHop(seq_len=t, n_kv=k))
            for t in mh
            for k in (3, 4, 8)
            if 4 * k + 2 <= t
        ],
        "CommonWord": [(f"T={t},n={n}", EchoCommonWord(seq_len=t, list_len=n)) for t in lens for n in (4, 8)],
    }


def _options(task: Any) -> dict[str, Any]:
    """The constructor options of an Echo task (its config without the name and the derived ``seq_len`` of
    ``echo_mqar``)."""
    cfg = {k: v for k, v in task.config().items() if k != "name"}
    if task.name == "echo_mqar":
        cfg.pop("seq_len")
    return cfg


class _BatchMeanAccuracy:
    """``task`` whose task metric is each evaluation batch's scored-token accuracy under its own name, so that
    :func:`~seqmem.train.evaluate` reports it (averaged over batches by batch size) beside the pooled accuracy."""

    def __init__(self, task: Any) -> None:
        self._task = task

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task, name)

    def metrics(self, logits, targets) -> dict[str, float]:
        return {"batch_mean_accuracy": masked_accuracy(logits, targets)[0]}


def valid_accuracies(model, task, n: int) -> dict[str, float]:
    """Validation accuracy (%) of ``model`` on ``n`` examples of ``task``'s validation stream, two ways from one
    pass: ``accuracy``, pooled over every scored position, and ``batch_mean_accuracy``, the mean over evaluation
    batches of 16 of each batch's accuracy (weighted by batch size) — how records before the pooled score computed
    it, kept so that an lr grid spanning both kinds of record is compared on one definition."""
    out = evaluate(model, _BatchMeanAccuracy(task), n_examples=n, batch_size=16, split="valid")
    return {"accuracy": 100.0 * out["accuracy"], "batch_mean_accuracy": 100.0 * out["batch_mean_accuracy"]}


def accuracy(model, task, n: int, split: str = "eval") -> float:
    """Accuracy (%) of ``model`` on ``n`` examples of ``task``'s ``split`` (``"eval"``: the reported examples;
    ``"valid"``: the validation stream for choosing hyper-parameters)."""
    return 100.0 * evaluate(model, task, n_examples=n, batch_size=16, split=split)["accuracy"]
