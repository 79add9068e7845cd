
import os

import pytest
import torch

# Without a GPU the Triton kernels can only run in Triton's CPU interpreter, and triton reads TRITON_INTERPRET when
# it is first imported (its own language helpers are decorated then): set it before any test imports triton, so the
# interpreter tests (tests/ops/_triton_util.py) work whatever ran first.  With a GPU the kernels are compiled.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(1)  # as every seqmem command by default (README, "Threads")


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (with a floor so all-zero references do not divide by zero)."""
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def assert_rel_close(a: torch.Tensor, b: torch.Tensor, tol: float, what: str = "") -> None:
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} != {tuple(b.shape)}"
    assert torch.isfinite(a).all(), f"{what}: non-finite values"
    e = rel_err(a, b)
    assert e <= tol, f"{what}: relative error {e:.3e} > {tol:.1e}"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def fake_run_dir(d, steps: list[int], finished: bool, width: int = 2, metrics: bool = False):
    """A sweep run directory at ``d``: ``run.json``, a checkpoint of a ``width``-wide linear model at each of
    ``steps``, ``metrics.jsonl`` when ``metrics``, and ``result.json`` when ``finished``."""
    import json

    from seqmem.train.checkpoint import save_checkpoint

    d.mkdir(parents=True)
    (d / "run.json").write_text("{}")
    if metrics:
        (d / "metrics.jsonl").write_text("{}\n")
    model = torch.nn.Linear(width, width)
    for s in steps:
        save_checkpoint(d / "checkpoints", s, model, {"step": s}, keep=3)
    if finished:
        (d / "result.json").write_text(json.dumps({"status": "finished"}))
    return d


def tiny(**changes) -> dict:
    """The packaged ``tiny`` sweep spec as a dict, with ``section__key=value`` (or ``section=value``) changed."""
    import copy
    import tomllib

    from seqmem.sweep.spec import PACKAGED_SPECS

    raw = copy.deepcopy(tomllib.loads((PACKAGED_SPECS / "tiny.toml").read_text()))
    for k, v in changes.items():
        sect, _, key = k.partition("__")
        if key:
            raw[sect][key] = v
        else:
            raw[sect] = v
    return raw
