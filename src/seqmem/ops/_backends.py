"""Optional accelerated backends for seqmem's ops — opt-in; the pure-PyTorch forms stay the default and the
references (public interface: :mod:`seqmem.backends`).

A backend is a function registered for an op name (``"delta_rule"``, ``"gated_delta_rule"``, ``"ssd"``) that takes
the op's arguments without ``mode`` and returns ``(output, final_state)`` in the op's conventions.  An op asks
:func:`select` for one on every ``mode="chunk"`` call (``mode="recurrent"`` is always the reference loop) and gets one
only when

* backends are enabled — :func:`use_backends` (or the :func:`backends` context), else the environment variable
  ``SEQMEM_BACKENDS`` (comma-separated names, e.g. ``fla,mamba_ssm``; unset or empty: none);
* the backend's package is installed (``available``, checked once); and
* it supports this call (``supports``, e.g. every tensor on CUDA, a dtype and head size its kernels take);

otherwise the op runs its PyTorch form, silently.  The backends registered here call flash-linear-attention's
Triton kernels (``fla``: ``chunk_delta_rule``, ``chunk_gated_delta_rule``) and Mamba-2's
(``mamba_ssm``: ``mamba_chunk_scan_combined``); both follow the same tensor conventions as seqmem's ops.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from torch import Tensor

__all__ = ["Backend", "backends", "enabled_backends", "list_backends", "register_backend", "select",
           "use_backends"]

OPS = ("delta_rule", "gated_delta_rule", "ssd")


@dataclass
class Backend:
    name: str
    op: str
    fn: Callable[..., tuple[Tensor, Tensor]]
    available: Callable[[], bool]
    supports: Callable[..., bool]
    _available: bool | None = field(default=None, repr=False)

    def is_available(self) -> bool:
        if self._available is None:
            try:
                self._available = bool(self.available())
            except Exception:  # noqa: BLE001 — a broken install is an unavailable backend
                self._available = False
        return self._available


_REGISTRY: dict[str, list[Backend]] = {}
_ENABLED: tuple[str, ...] | None = None  # None: SEQMEM_BACKENDS decides


def register_backend(
    op: str,
    name: str,
    fn: Callable[..., tuple[Tensor, Tensor]],
    available: Callable[[], bool] = lambda: True,
    supports: Callable[..., bool] = lambda *tensors: True,
) -> Backend:
    """Register ``fn`` as backend ``name`` of ``op`` (replacing an earlier one of the same name); see the module
    docstring for the calling convention.  ``supports`` receives the op's tensor arguments (``None`` for an absent
    initial state)."""
    if op not in OPS:
        raise ValueError(f"no op {op!r} takes backends; ops: {list(OPS)}")
    b = Backend(name, op, fn, available, supports)
    _REGISTRY[op] = [x for x in _REGISTRY.get(op, []) if x.name != name] + [b]
    return b


def unregister_backend(op: str, name: str) -> None:
    _REGISTRY[op] = [x for x in _REGISTRY.get(op, []) if x.name != name]


def list_backends() -> dict[str, list[str]]:
    """Registered backends per op, with whether each is installed: ``{"gated_delta_rule": ["fla (missing)"]}``."""
    return {op: [f"{b.name}" + ("" if b.is_available() else " (missing)") for b in bs] for op, bs in _REGISTRY.items()}


def enabled_backends() -> tuple[str, ...]:
    if _ENABLED is not None:
        return _ENABLED
    env = os.environ.get("SEQMEM_BACKENDS", "")
    return tuple(n.strip() for n in env.split(",") if n.strip())


def use_backends(names: Iterable[str] | None) -> tuple[str, ...] | None:
    """Enable the backends ``names`` (in order of preference; ``[]``: none; ``None``: back to ``SEQMEM_BACKENDS``);
    returns the previous setting."""
    global _ENABLED
    prev = _ENABLED
    _ENABLED = None if names is None else tuple(names)
    return prev


@contextmanager
def backends(names: Iterable[str]) -> Iterator[None]:
    """``with backends(["fla"]): ...`` — :func:`use_backends` for a block."""
    prev = use_backends(names)
    try:
        yield
    finally:
        use_backends(prev)


def select(op: str, *tensors: Tensor | None) -> Backend | None:
    """The first enabled, installed backend of ``op`` that supports these tensors, else ``None``."""
    names = enabled_backends()
    if not names:
        return None
    candidates = {b.name: b for b in _REGISTRY.get(op, [])}
    for name in names:
        b = candidates.get(name)
        if b is not None and b.is_available() and b.supports(*tensors):
            return b
    return None


# ------------------------------------------------------------------------------------------ the known backends
def _installed(module: str) -> Callable[[], bool]:
    return lambda: importlib.util.find_spec(module) is not None


def _cuda_floats(*tensors: Tensor | None, max_head_dim: int = 256) -> bool:
    import torch

    ts = [t for t in tensors if t is not None]
    return (all(t.is_cuda for t in ts) and all(t.dtype in (torch.float16, torch.bfloat16, torch.float32) for t in ts)
            and ts[0].dim() == 4 and ts[0].shape[-1] <= max_head_dim)


def _fla_delta_rule(q, k, v, beta, scale, initial_state, chunk_size):  # noqa: ANN001, ANN202
    from fla.ops.delta_rule import chunk_delta_rule

    return chunk_delta_rule(q, k, v, beta, scale=scale, initial_state=initial_state, output_final_state=True)


def _fla_gated_delta_rule(q, k, v, beta, g, scale, initial_state, chunk_size):  # noqa: ANN001, ANN202
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    return chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                  output_final_state=True)


def _mamba_ssd(x, dt, A, B, C, initial_state, chunk_size):  # noqa: ANN001, ANN202, N803
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

    return mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, initial_states=initial_state,
                                     return_final_states=True)


register_backend("delta_rule", "fla", _fla_delta_rule, _installed("fla"), _cuda_floats)
register_backend("gated_delta_rule", "fla", _fla_gated_delta_rule, _installed("fla"), _cuda_floats)
register_backend("ssd", "mamba_ssm", _mamba_ssd, _installed("mamba_ssm"), _cuda_floats)
