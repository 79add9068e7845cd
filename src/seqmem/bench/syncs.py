"""Where one mixer's training step waits for the device: the host reads of a forward+backward.

A layer whose step copies a value to the host (``.tolist()``, ``.item()``, ``bool(tensor)``, ``int(tensor)``, a
value check, a data-dependent shape) stops the host until every kernel queued before it has run, so the launches of
the next kernels no longer overlap the device's work: on a launch-bound GPU layer each such read costs about a
kernel's time.  :func:`host_reads` lists them by source line, after one warm step:

* on CUDA, every synchronising call torch reports (``torch.cuda.set_sync_debug_mode("warn")``: the tensor reads
  above and the operators that synchronise inside, such as ``nonzero``), at the Python line that made it;
* elsewhere, the reads of a tensor's value through ``tolist``, ``item``, ``__bool__``, ``__int__``, ``__float__``
  and ``__index__``, and the tensors built from host values with a ``device`` (``torch.tensor`` /
  ``torch.as_tensor``, a blocking copy on CUDA): what would synchronise on CUDA (operators that synchronise inside
  are not seen).

``decode=True`` counts one decode step (a token with the state, no gradients) instead of a training step.

The CPU and the CUDA path of a layer may differ (Triton kernels on CUDA), so a CPU listing says what the CPU path
reads, not what the GPU path does.
"""

from __future__ import annotations

import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from seqmem.bench.common import synchronize
from seqmem.bench.speed import build, training_step

_READS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__")
_MAKERS = ("tensor", "as_tensor")


def _where(filename: str, lineno: int) -> str:
    """``seqmem/…/file.py:line`` for the package's files, the path's last two parts otherwise."""
    parts = filename.replace("\\", "/").split("/")
    if "seqmem" in parts:
        parts = parts[len(parts) - 1 - parts[::-1].index("seqmem"):]
    else:
        parts = parts[-2:]
    return "/".join(parts) + f":{lineno}"


@contextmanager
def _spy(found: Counter) -> Iterator[None]:
    """Count, by the line that made them, the tensor value reads made while inside, and the tensors built from
    host values with a ``device`` (``torch.tensor`` / ``torch.as_tensor``: a blocking copy on CUDA)."""
    saved = {name: getattr(torch.Tensor, name) for name in _READS}
    own = {name for name in _READS if name in vars(torch.Tensor)}  # the rest are inherited: removed again after
    made = {name: getattr(torch, name) for name in _MAKERS}

    def note(name: str) -> None:
        frame = traceback.extract_stack(limit=3)[0]
        found[f"{name} {_where(frame.filename, frame.lineno or 0)}"] += 1

    def wrap(name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
        def read(self: torch.Tensor, *a: Any, **k: Any) -> Any:
            note(name)
            return orig(self, *a, **k)
        return read

    def wrap_maker(name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
        def make(data: Any, *a: Any, **k: Any) -> Any:
            if k.get("device") is not None and not isinstance(data, torch.Tensor):
                note(f"torch.{name}(…, device=)")
            return orig(data, *a, **k)
        return make

    for name, orig in saved.items():
        setattr(torch.Tensor, name, wrap(name, orig))
    for name, orig in made.items():
        setattr(torch, name, wrap_maker(name, orig))
    try:
        yield
    finally:
        for name, orig in saved.items():
            if name in own:
                setattr(torch.Tensor, name, orig)
            else:
                delattr(torch.Tensor, name)
        for name, orig in made.items():
            setattr(torch, name, orig)


def host_reads(args: Any, device: torch.device, dtype: torch.dtype, name: str, seq_len: int,
               impl: str = "fast", decode: bool = False) -> dict[str, Any]:
    """The host reads of one forward+backward of mixer ``name`` at ``seq_len`` tokens (``decode``: of one decode
    step, a token with the state after ``seq_len`` tokens and the warm steps, without gradients), after
    ``args.warmup`` (default 1) warm calls, whose reads are not counted (caches, compilation):
    ``{"mixer", "seq_len", "decode", "total", "reads": [{"where", "count"}, ...] (most first), "how"}``."""
    warm = getattr(args, "warmup", 1)
    if decode:
        m = build(name, args, impl, device, dtype)
        gen = torch.Generator(device="cpu").manual_seed(args.seed)
        x = torch.randn(args.batch, seq_len + warm + 1, args.d_model, generator=gen).to(device=device, dtype=dtype)
        with torch.no_grad():
            state = m(x[:, :seq_len])[1]
        pos = [seq_len]

        def step() -> None:
            nonlocal state
            with torch.no_grad():
                state = m(x[:, pos[0] : pos[0] + 1], state)[1]
            pos[0] += 1
    else:
        step = training_step(args, device, dtype, name, seq_len, impl)
    for _ in range(warm):
        step()
    synchronize(device)
    found: Counter = Counter()
    if device.type == "cuda":
        how = "CUDA synchronising calls (torch.cuda.set_sync_debug_mode)"
        before = torch.cuda.get_sync_debug_mode()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                step()
            finally:
                torch.cuda.set_sync_debug_mode(before)
        for w in caught:
            if "synchroniz" in str(w.message):
                found[_where(w.filename, w.lineno)] += 1
    else:
        how = ("tensor value reads (tolist, item, bool, int, float, index) and tensors built from host values with "
               "a device (torch.tensor / as_tensor)")
        with _spy(found):
            step()
    synchronize(device)
    reads = [{"where": k, "count": c} for k, c in found.most_common()]
    return {"mixer": name, "seq_len": seq_len, "decode": decode, "total": sum(found.values()), "reads": reads,
            "how": how}
