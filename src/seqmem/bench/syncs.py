"""Where one mixer's training step waits for the device: the host reads of a forward+backward.

A layer whose step copies a value to the host (``.tolist()``, ``.item()``, ``bool(tensor)``, ``int(tensor)``, a
value check, a data-dependent shape) stops the host until every kernel queued before it has run, so the launches of
the next kernels no longer overlap the device's work: on a launch-bound GPU layer each such read costs about a
kernel's time.  :func:`host_reads` lists them by source line, after one warm step:

* on CUDA, every synchronising call torch reports (``torch.cuda.set_sync_debug_mode("warn")``: the tensor reads
  above and the operators that synchronise inside, such as ``nonzero``), at the Python line that made it;
* elsewhere, the reads of a tensor's value through ``tolist``, ``item``, ``__bool__``, ``__int__``, ``__float__``
  and ``__index__`` (what would synchronise on CUDA; operators that synchronise inside are not seen).

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
from seqmem.bench.speed import _step_fn, build

_READS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__")


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
    """Count the tensor value reads made while inside, by the line that made them."""
    saved = {name: getattr(torch.Tensor, name) for name in _READS}

    def wrap(name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
        def read(self: torch.Tensor, *a: Any, **k: Any) -> Any:
            frame = traceback.extract_stack(limit=2)[0]
            found[f"{name} {_where(frame.filename, frame.lineno or 0)}"] += 1
            return orig(self, *a, **k)
        return read

    for name, orig in saved.items():
        setattr(torch.Tensor, name, wrap(name, orig))
    try:
        yield
    finally:
        for name, orig in saved.items():
            setattr(torch.Tensor, name, orig)


def host_reads(args: Any, device: torch.device, dtype: torch.dtype, name: str, seq_len: int,
               impl: str = "fast") -> dict[str, Any]:
    """The host reads of one forward+backward of mixer ``name`` at ``seq_len`` tokens, after ``args.warmup``
    (default 1) warm steps, whose reads are not counted (caches, compilation):
    ``{"mixer", "seq_len", "total", "reads": [{"where", "count"}, ...] (most first), "how"}``."""
    m = build(name, args, impl, device, dtype)
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    x = torch.randn(args.batch, seq_len, args.d_model, generator=gen).to(device=device, dtype=dtype)
    x.requires_grad_(True)
    g = torch.randn(args.batch, seq_len, args.d_model, generator=gen).to(device=device, dtype=dtype)
    step = _step_fn(m, x, g)
    for _ in range(getattr(args, "warmup", 1)):
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
        how = "tensor value reads (tolist, item, bool, int, float, index)"
        with _spy(found):
            step()
    synchronize(device)
    reads = [{"where": k, "count": c} for k, c in found.most_common()]
    return {"mixer": name, "seq_len": seq_len, "total": sum(found.values()), "reads": reads, "how": how}
