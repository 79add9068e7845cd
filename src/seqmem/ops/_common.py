"""Shared validation and helpers of the core ops (private: not re-exported)."""

from __future__ import annotations

import contextlib
import functools
import math
import numbers
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from seqmem.io import check_int

MODES = ("recurrent", "chunk")


def check_choice(op: str | None, name: str, value, choices) -> Any:
    """``value`` if it is one of ``choices``, else "``op: name`` must be one of [...]" (no prefix for op None)."""
    if value not in choices:
        raise ValueError(f"{_where(op)}{name} must be one of {list(choices)}, got {value!r}")
    return value


def check_mode(op: str | None, mode: str, modes: tuple[str, ...] = MODES) -> str:
    return check_choice(op, "mode", mode, modes)


def check_chunk_size(op: str | None, chunk_size: int) -> int:
    check_int("chunk_size", chunk_size, prefix=_where(op))
    return chunk_size


def _where(op: str | None) -> str:
    return f"{op}: " if op else ""


def check_action_mask(mask: object, shape: tuple[int, int], device: torch.device, owner: str,
                      values: bool = True) -> Tensor:
    """``mask`` as given, after checking it is a (B, T) = ``shape`` tensor on ``device`` whose values are all 0 or 1
    (bool, integer or floating); a ValueError naming ``owner`` otherwise.  ``values=False`` skips the (one
    reduction) check of the values, the only one that reads the data."""
    if not isinstance(mask, Tensor):
        raise ValueError(f"{owner}: the action mask must be a (batch, time) tensor of 0/1, got {type(mask).__name__}")
    if tuple(mask.shape) != tuple(shape):
        raise ValueError(f"{owner}: the action mask must have shape (batch, time) = {tuple(shape)}, "
                         f"got {tuple(mask.shape)}")
    if mask.is_complex():
        raise ValueError(f"{owner}: the action mask must be bool, integer or floating, got {mask.dtype}")
    if mask.device != device:
        raise ValueError(f"{owner}: the action mask is on {mask.device} but the input is on {device}")
    if values and mask.dtype != torch.bool and not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(f"{owner}: the action mask must hold only 0 and 1 (eq. 53: m_t in {{0, 1}})")
    return mask


def promoted_dtype(*tensors: Any) -> torch.dtype:
    """The promoted dtype of the floating tensors among ``tensors`` (None and other entries are skipped; the default
    dtype where there is none): the dtype an op computes in when its inputs mix floating dtypes."""
    dt = None
    for t in tensors:
        if isinstance(t, Tensor) and t.is_floating_point():
            dt = t.dtype if dt is None else torch.promote_types(dt, t.dtype)
    return dt or torch.get_default_dtype()


def check_tensor(op: str, name: str, x, shape: tuple, dims: str) -> Tensor:
    """``x``: a floating tensor of ``len(shape)`` dims whose sizes match the non-None entries of ``shape``."""
    if not isinstance(x, Tensor):
        raise ValueError(f"{op}: {name} must be a torch.Tensor, got {type(x).__name__}")
    want_s = tuple("?" if w is None else w for w in shape)
    if x.dim() != len(shape):
        raise ValueError(f"{op}: {name} must have shape ({dims}) = {want_s}, got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise ValueError(f"{op}: {name} must be a floating-point tensor, got dtype {x.dtype}")
    if any(want is not None and got != want for got, want in zip(x.shape, shape)):
        raise ValueError(f"{op}: {name} must have shape ({dims}) = {want_s}, got {tuple(x.shape)}")
    return x


def check_state_dict(op: str, state, want: dict[str, tuple], dims: dict[str, str]) -> None:
    """Raise unless ``state`` is None or a dict with exactly the keys of ``want``, each a floating tensor of that
    shape (its dims named by ``dims``; :func:`check_tensor`) and ``"pos"`` an integer tensor: a state of another
    batch size would otherwise broadcast, giving every sequence of the batch the one state."""
    if state is None:
        return
    if not isinstance(state, dict) or set(state) != set(want):
        got = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"{op}: initial_state must be a dict with keys {sorted(want)}, got {got}")
    for name, shape in want.items():
        t = state[name]
        if name != "pos":
            check_tensor(op, f"initial_state[{name!r}]", t, shape, dims[name])
        elif not isinstance(t, Tensor) or t.shape != shape or t.is_floating_point() or t.is_complex():
            got = f"shape {tuple(t.shape)}, dtype {t.dtype}" if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{op}: initial_state['pos'] must be an integer tensor of shape (batch,) = {shape}, "
                             f"got {got}")


def check_number(op: str | None, name: str, value, *, positive: bool = False, nonnegative: bool = False) -> float:
    """``value`` as a float after checking it is a finite real number (``> 0`` with ``positive``, ``>= 0`` with
    ``nonnegative``): NaN and ±inf pass a bare ``value > 0`` test (``inf > 0``) or fail it without saying why."""
    try:
        f = None if isinstance(value, (bool, str, complex)) else float(value)
    except (TypeError, ValueError):
        f = None
    want = "a finite number" + (" > 0" if positive else " >= 0" if nonnegative else "")
    if f is None or not math.isfinite(f) or (positive and not f > 0) or (nonnegative and not f >= 0):
        raise ValueError(f"{_where(op)}{name} must be {want}, got {value!r}")
    return f


def values_checked() -> bool:
    """Whether the checks that read a tensor's values (one reduction each) run: not inside ``torch.compile``'s
    tracing, where each would be a graph break and a device sync (the convention of
    :func:`seqmem.models.lm.check_ids`; shapes and dtypes are checked there all the same)."""
    return not torch.compiler.is_compiling()


def check_values(op: str, name: str, x: Tensor, ok: Tensor, want: str) -> None:
    """Raise unless ``ok`` (a bool tensor computed from ``x``) holds everywhere: "``op``: ``name`` must be ``want``,
    got values in [min, max]" (NaN / inf named).  One reduction on the good path; the caller skips it under
    ``torch.compile`` (:func:`values_checked`).  The ops write ``ok`` as "not a definite violation" (``~(A >= 0)``),
    so a NaN passes: a NaN in the data propagates, as documented (docs/reliability.md, NaN / Inf), and the finite
    checks of :func:`seqmem.mixers.base.set_check_finite` name it; these checks catch finite wrong values."""
    if bool(ok.all()):
        return
    xd = x.detach()
    finite = torch.isfinite(xd)
    got = []
    if bool(finite.any()):
        got.append(f"values in [{float(xd[finite].min()):.6g}, {float(xd[finite].max()):.6g}]")
    for label, bad in (("NaN", torch.isnan(xd)), ("inf", torch.isinf(xd))):
        if bool(bad.any()):
            got.append(label)
    raise ValueError(f"{op}: {name} must be {want}, got {' and '.join(got) or 'an empty tensor'}")


def check_same_device(op: str, **tensors: Tensor | None) -> None:
    devs = {n: t.device for n, t in tensors.items() if t is not None}
    if len(set(devs.values())) > 1:
        raise ValueError(f"{op}: all tensors must be on one device, got {devs}")


def compile_disabled(fn: Callable) -> Callable:
    """``torch.compiler.disable(fn)``, made at the first call after ``torch._dynamo`` is imported instead of at
    import time: the decorator imports ``torch._dynamo``, which costs about as much CPU time as importing torch
    (2.8 s vs 2.4-2.8 s here), and nothing is compiled before it is imported (commands that never compile or run an
    optimizer start that much faster).  Made while ``torch.compile`` traces, the call is one graph break more on
    that first trace; the values are the same either way."""
    disabled: list[Callable] = []

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not disabled:
            if "torch._dynamo" not in sys.modules:  # nothing can be tracing
                return fn(*args, **kwargs)
            disabled.append(torch.compiler.disable(fn))
        return disabled[0](*args, **kwargs)

    return call


def cached_constants(cache: dict, key: Any, build: Callable[[], Any]) -> Any:
    """``cache[key]``, made by ``build()`` on first use with autograd off and outside inference mode: tensors kept
    across calls (matrices, nodes, weights computed once) are plain constants, which a later backward may save even
    when the call that built them ran under ``torch.inference_mode`` (an inference tensor cannot be saved)."""
    if key not in cache:
        with torch.inference_mode(False), torch.no_grad():
            cache[key] = build()
    return cache[key]


def compute_dtype(*tensors: Tensor | None) -> torch.dtype:
    """float64 if any input is float64, else float32 (half/bfloat16 inputs are computed in float32)."""
    if any(t is not None and t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32


def full_precision(device: torch.device) -> contextlib.AbstractContextManager:
    """Autocast off where it is on (the computation casts its inputs to the compute dtype itself)."""
    if torch.is_autocast_enabled(device.type):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


def autocast_off(*tensors: Tensor | None) -> contextlib.AbstractContextManager:
    """:func:`full_precision` on the device of the first tensor given (a null context if there is none)."""
    t = next((x for x in tensors if isinstance(x, Tensor)), None)
    return contextlib.nullcontext() if t is None else full_precision(t.device)


def backward_without_autocast(backward: Any) -> Any:
    """Decorator of an ``autograd.Function``'s ``backward`` whose ``forward`` runs with autocast off (its op casts
    the inputs to the compute dtype itself): the backward then runs with autocast off too, whether it is called
    inside an autocast region or not.  Without it, a backward called inside ``torch.autocast`` would recompute
    in the autocast dtype what the forward computed in float32 (the device-generic form of
    ``torch.amp.custom_bwd``, which needs the device type when the class is defined)."""
    import functools

    @functools.wraps(backward)
    def wrapped(ctx: Any, *grads: Any) -> Any:
        with autocast_off(*grads):
            return backward(ctx, *grads)

    return wrapped


def first_order_backward(op: str) -> Any:
    """Decorator of an ``autograd.Function``'s ``backward`` that autograd cannot record (a Triton or C++ kernel, a
    loop under ``no_grad``): differentiating its result again — ``create_graph=True`` (double backward, gradient
    penalties, Hessian-vector products) — would silently drop terms, so that raises a one-line error instead.  The
    backward itself is wrapped in ``torch.autograd.function.once_differentiable``."""
    import functools

    def deco(backward: Any) -> Any:
        once = torch.autograd.function.once_differentiable(backward)

        @functools.wraps(backward)
        def wrapped(ctx: Any, *grads: Any) -> Any:
            if torch.is_grad_enabled():  # autograd runs a backward with grad mode on only for create_graph=True
                raise RuntimeError(f"{op}: its backward is a fused kernel and cannot be differentiated again "
                                   "(create_graph=True: double backward, gradient penalties, Hessian-vector "
                                   "products); use the op's per-token reference form (mode='recurrent') for "
                                   "higher-order gradients")
            return once(ctx, *grads)

        return wrapped

    return deco


def floor(value: float, dtype: torch.dtype) -> float:
    """``value`` as a lower clamp that stays positive in ``dtype``: at least the smallest normal number of ``dtype``
    (a fixed ``1e-30`` is 0 in float16, so ``x / norm.clamp_min(1e-30)`` is 0/0 = NaN for a zero vector).  Equal to
    ``value`` in float32/float64 for any ``value`` they represent as a normal number."""
    return max(float(value), float(torch.finfo(dtype).tiny))


def check_scale(op: str, scale, dk: int) -> float:
    if scale is None:
        return dk**-0.5
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale):
        raise ValueError(f"{op}: scale must be a finite number or None, got {scale!r}")
    return float(scale)


def check_qkv_op(
    op: str, q, k, v, initial_state, scale, mode: str, chunk_size: int, **gates: Tensor | None
) -> tuple[int, int, int, int, int, float]:
    """Validate the ``(q, k, v[, gates], initial_state)`` inputs shared by the linear-attention-family ops.

    ``gates`` are per-token, per-head tensors ``(batch, time, heads)`` (``beta``, ``g``; None = absent).
    Returns ``(b, t, h, d_k, d_v, scale)``.
    """
    check_mode(op, mode)
    check_chunk_size(op, chunk_size)
    check_tensor(op, "q", q, (None, None, None, None), "batch, time, heads, d_k")
    b, t, h, dk = q.shape
    check_tensor(op, "k", k, (b, t, h, dk), "batch, time, heads, d_k")
    check_tensor(op, "v", v, (b, t, h, None), "batch, time, heads, d_v")
    dv = v.shape[-1]
    for name, gate in gates.items():
        if gate is not None:
            check_tensor(op, name, gate, (b, t, h), "batch, time, heads")
    if initial_state is not None:
        check_tensor(op, "initial_state['S']", initial_state, (b, h, dk, dv), "batch, heads, d_k, d_v")
    check_same_device(op, q=q, k=k, v=v, initial_state=initial_state, **gates)
    return b, t, h, dk, dv, check_scale(op, scale, dk)


def state_dict(op: str, initial_state, key: str = "S", stacklevel: int = 3) -> dict | None:
    """``initial_state`` as the op's state dict: a bare tensor (the former form) becomes ``{key: tensor}``, with a
    DeprecationWarning naming the dict to pass instead; anything else is returned as it is (checked by the op)."""
    if isinstance(initial_state, Tensor):
        warnings.warn(f"{op}: a tensor initial_state is deprecated; pass the state dict {{{key!r}: tensor}} "
                      "(the form the op returns)", DeprecationWarning, stacklevel=stacklevel)
        return {key: initial_state}
    return initial_state


def state_tensor(op: str, initial_state, key: str = "S") -> Tensor | None:
    """The tensor of a one-key state dict ``{key: tensor}`` (None for None; a bare tensor, the former form, is
    taken with a DeprecationWarning); the op checks its shape."""
    state = state_dict(op, initial_state, key, stacklevel=4)
    check_state_keys(op, state, (key,))
    return None if state is None else state[key]


def check_state_keys(op: str, state, keys: tuple[str, ...]) -> None:
    """Raise unless ``state`` is None or a dict whose keys are exactly ``keys``."""
    if state is not None and (not isinstance(state, dict) or set(state) != set(keys)):
        got = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"{op}: initial_state must be a dict with keys {sorted(keys)}, got {got}")


def to_chunks(x: Tensor, chunk_size: int) -> Tensor:
    """``(b, h, t, ...)`` -> ``(b, h, n_chunks, chunk_size, ...)``, zero-padding the time axis at the end."""
    t = x.shape[2]
    n = -(-t // chunk_size)
    pad = n * chunk_size - t
    if pad:
        widths = [0, 0] * (x.dim() - 3) + [0, pad]
        x = F.pad(x, widths)
    return x.reshape(*x.shape[:2], n, chunk_size, *x.shape[3:])


def from_chunks(x: Tensor, t: int) -> Tensor:
    """Inverse of :func:`to_chunks`: ``(b, h, n, c, ...)`` -> ``(b, h, t, ...)`` dropping the padding."""
    return x.reshape(*x.shape[:2], x.shape[2] * x.shape[3], *x.shape[4:])[:, :, :t]


def segsum(a: Tensor) -> Tensor:
    """Stable segment sums of log decays: ``out[..., i, j] = sum_{j < m <= i} a[..., m]`` (j <= i), else -inf.

    Computed by a masked cumulative sum (as in Mamba-2's ``ssd_minimal``), never as a difference of cumulative
    sums, so ``exp(out)`` is the exact decay from position ``j`` to position ``i``.
    """
    c = a.shape[-1]
    x = a[..., :, None].expand(*a.shape, c)  # x[..., i, j] = a[..., i]
    strict = torch.tril(torch.ones(c, c, dtype=torch.bool, device=a.device), diagonal=-1)
    x = x.masked_fill(~strict, 0.0)
    out = torch.cumsum(x, dim=-2)
    incl = torch.tril(torch.ones(c, c, dtype=torch.bool, device=a.device), diagonal=0)
    return out.masked_fill(~incl, float("-inf"))
