"""Accelerated backends for seqmem's ops — on by default on CUDA where installed; the pure-PyTorch forms stay the
references and run everywhere else (public interface: :mod:`seqmem.backends`).

A backend is a function registered for an op name (``"linear_attention"``, ``"delta_rule"``,
``"gated_delta_rule"``, ``"ssd"``) that takes the op's arguments without ``mode`` and returns
``(output, final_state)`` in the op's conventions.  An op asks :func:`select` for one on every ``mode="chunk"``
call (``mode="recurrent"`` is always the reference loop) and gets one only when

* the backend is enabled — :func:`use_backends` (or the :func:`backends` context), else the environment variable
  ``SEQMEM_BACKENDS`` (comma-separated names in order of preference, e.g. ``fla,mamba_ssm``; ``pytorch`` or an
  empty value: none); unset, every built-in backend (``fla``, ``mamba_ssm``) is enabled;
* the backend's package is installed (``available``, checked once); and
* it supports this call (``supports``: every tensor on CUDA, and the dtypes and head sizes its kernels take —
  flash-linear-attention's take float16/bfloat16 with head sizes up to 256, so float32 and float64 calls run the
  PyTorch form);

otherwise the op runs its PyTorch form, silently.  Which form ran is reported: :func:`record_forms` collects the
forms the ops chose inside a block (``seqmem bench speed`` prints them in its ``form`` column), and
:func:`which_form` says which one an op would take for a device, dtype and head size.  The backends registered
here call flash-linear-attention's Triton kernels (``fla``: ``chunk_linear_attn``, ``chunk_delta_rule``,
``chunk_gated_delta_rule``) and Mamba-2's (``mamba_ssm``: ``mamba_chunk_scan_combined``); all follow seqmem's
tensor conventions (``(batch, time, heads, dim)``, state ``(batch, heads, d_k, d_v)``, ``scale`` on ``q``).

Precision on a backend is its kernels', not the PyTorch forms': Triton's ``tl.dot`` on float32 inputs runs in TF32
on NVIDIA GPUs (a relative error of about 1e-3 where the float32 PyTorch form has about 1e-6; mamba_ssm takes
float32 calls), and the kernels keep their per-chunk states in the input's dtype.  For that reason float16
linear attention is not sent to fla (its undecayed state overflows float16 near 65k tokens there); bfloat16 goes
to fla.  ``seqmem.backends.use_backends("pytorch")`` (or ``SEQMEM_BACKENDS=pytorch``) turns every backend off,
VORT's fla kernel included.  Where no backend takes a CUDA call, ``linear_attention``, ``ssd`` and VORT's
retention run seqmem's own chunked Triton kernel (float32 states; full float32 products for float32 inputs),
which is not a backend: it follows the Triton switch (``SEQMEM_TRITON=0``, :func:`seqmem.backends.set_triton`).
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import os
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

__all__ = ["Backend", "backends", "enabled_backends", "list_backends", "note_form", "record_forms",
           "register_backend", "select", "use_backends", "which_form"]

OPS = ("linear_attention", "delta_rule", "gated_delta_rule", "ssd")
DEFAULT = ("fla", "mamba_ssm")  # enabled when neither use_backends nor SEQMEM_BACKENDS says otherwise
OFF = ("pytorch", "none")  # names that mean "no backend: the PyTorch forms"


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
    if name in OFF:
        raise ValueError(f"{name!r} means 'no backend' and cannot name one")
    b = Backend(name, op, fn, available, supports)
    _REGISTRY[op] = [x for x in _REGISTRY.get(op, []) if x.name != name] + [b]
    return b


def unregister_backend(op: str, name: str) -> None:
    _REGISTRY[op] = [x for x in _REGISTRY.get(op, []) if x.name != name]


def list_backends() -> dict[str, list[str]]:
    """Registered backends per op, with whether each is installed: ``{"gated_delta_rule": ["fla (missing)"]}``."""
    return {op: [f"{b.name}" + ("" if b.is_available() else " (missing)") for b in bs] for op, bs in _REGISTRY.items()}


def _known() -> set[str]:
    return {b.name for bs in _REGISTRY.values() for b in bs}


def _parse(names: Iterable[str], where: str) -> tuple[str, ...]:
    """Names in order, checked against the registry; any of :data:`OFF` alone means none."""
    out = tuple(n.strip() for n in names if n.strip())
    if any(n in OFF for n in out):
        if len(out) > 1:
            raise ValueError(f"{where}: {'/'.join(OFF)} means no backend and cannot be combined with others, "
                             f"got {','.join(out)}")
        return ()
    bad = [n for n in out if n not in _known()]
    if bad:
        raise ValueError(f"{where}: unknown backend(s) {bad}; known: {', '.join(sorted(_known()))}, or pytorch")
    return out


def enabled_backends() -> tuple[str, ...]:
    """The backends ops may use, in order of preference: :func:`use_backends`'s setting, else ``SEQMEM_BACKENDS``,
    else every built-in one (:data:`DEFAULT`)."""
    if _ENABLED is not None:
        return _ENABLED
    env = os.environ.get("SEQMEM_BACKENDS")
    if env is None:
        return DEFAULT
    return _parse(env.split(","), "SEQMEM_BACKENDS")


def use_backends(names: Iterable[str] | str | None) -> tuple[str, ...] | None:
    """Enable the backends ``names`` (in order of preference; ``[]`` or ``"pytorch"``: none, the PyTorch forms
    everywhere; ``None``: back to ``SEQMEM_BACKENDS`` / the default); returns the previous setting.  An unknown
    name is an error."""
    global _ENABLED
    prev = _ENABLED
    if isinstance(names, str):
        names = names.split(",")
    _ENABLED = None if names is None else _parse(names, "use_backends")
    return prev


@contextmanager
def backends(names: Iterable[str] | str) -> Iterator[None]:
    """``with backends(["fla"]): ...`` (or ``backends("pytorch")``) — :func:`use_backends` for a block."""
    prev = use_backends(names)
    try:
        yield
    finally:
        global _ENABLED
        _ENABLED = prev


def select(op: str, *tensors: Tensor | None) -> Backend | None:
    """The first enabled, installed backend of ``op`` that supports these tensors, else ``None``."""
    names = enabled_backends()
    if not names:
        return None
    candidates = {b.name: b for b in _REGISTRY.get(op, [])}
    for name in names:
        b = candidates.get(name)
        if b is not None and b.supports(*tensors) and b.is_available():  # supports first: it is the cheap check
            return b
    return None


# ------------------------------------------------------------------------------------------ which form runs
_RECORDERS: list[dict[str, dict[str, int]]] = []


def note_form(op: str, form: str) -> None:
    """Called by an op with the form it runs (``"pytorch"``, a backend's name, ``"cpp"``, ``"triton"``, ...)."""
    for r in _RECORDERS:
        r.setdefault(op, {})
        r[op][form] = r[op].get(form, 0) + 1


@contextmanager
def record_forms() -> Iterator[dict[str, dict[str, int]]]:
    """``with record_forms() as forms: ...`` — afterwards ``forms`` maps each op that chose among forms inside
    the block to ``{form: calls}``, e.g. ``{"gated_delta_rule": {"fla": 2}}``."""
    rec: dict[str, dict[str, int]] = {}
    _RECORDERS.append(rec)
    try:
        yield rec
    finally:
        _RECORDERS.remove(rec)


def forms_text(forms: dict[str, dict[str, int]]) -> str:
    """``{"delta_rule": {"fla": 2}, "lattice_scan": {"cpp": 1}}`` → ``"delta_rule: fla; lattice_scan: cpp"``
    (``"pytorch"`` when no op chose)."""
    if not forms:
        return "pytorch"
    return "; ".join(f"{op}: {'+'.join(sorted(f))}" for op, f in sorted(forms.items()))


class TensorSpec:
    """What ``supports`` reads of a tensor (device, dtype, shape) without the tensor: :func:`which_form` asks the
    backends with these, so it answers for a device this machine does not have."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> None:
        self.shape, self.dtype, self.device = torch.Size(shape), dtype, torch.device(device)

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def dim(self) -> int:
        return len(self.shape)


def which_form(op: str, device: torch.device | str, dtype: torch.dtype, head_dim: int = 64,
               value_dim: int | None = None, state: bool = True) -> str:
    """The form ``op`` (``mode="chunk"``) takes for inputs of ``dtype`` on ``device`` with key/value head sizes
    ``head_dim`` / ``value_dim`` (default: ``head_dim``), with or without an initial ``state``: a backend's name,
    or ``"pytorch"``.  Answers from the backends' ``supports`` alone, so also for a device not present here.
    seqmem's own Triton kernels are not backends and are not answered for here: where no backend applies, ``ssd``
    (and VORT's retention, VLA, Lattice) run them on CUDA when :func:`seqmem.ops._triton.use_triton` says so."""
    if op not in OPS:
        raise ValueError(f"which_form: no op {op!r} takes backends; ops: {list(OPS)}")
    dv = head_dim if value_dim is None else value_dim
    b, t, h = 1, 1, 1

    def spec(*shape: int, dt: torch.dtype = dtype) -> TensorSpec:
        return TensorSpec(shape, dt, device)

    q, v = spec(b, t, h, head_dim), spec(b, t, h, dv)
    if op == "ssd":
        args: tuple[Any, ...] = (v, spec(b, t, h), spec(h), q, q, spec(b, h, dv, head_dim, dt=torch.float32))
    else:
        gates = {"linear_attention": (), "delta_rule": (spec(b, t, h),),
                 "gated_delta_rule": (spec(b, t, h), spec(b, t, h))}[op]
        args = (q, q, v, *gates, spec(b, h, head_dim, dv, dt=torch.float32))
    if not state:
        args = (*args[:-1], None)
    be = select(op, *args)
    return "pytorch" if be is None else be.name


# ------------------------------------------------------------------------------------------ the known backends
def _installed(module: str, kernels: str) -> Callable[[], bool]:
    """Whether ``module`` is installed and its ``kernels`` module imports (a package whose compiled parts are
    missing counts as not installed, rather than failing the first call)."""

    def check() -> bool:
        if importlib.util.find_spec(module) is None:
            return False
        importlib.import_module(kernels)
        return True

    return check


_HALF = (torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 256  # the largest key / value head size flash-linear-attention's chunk kernels take


def _on_cuda(tensors: tuple[Any, ...]) -> list[Any]:
    """The non-None tensors if every one of them is on CUDA, else []."""
    ts = [t for t in tensors if t is not None]
    return ts if ts and all(t.is_cuda for t in ts) else []


def _fla_supports(*tensors: Any, float32_values: bool = False) -> bool:
    """fla's chunk kernels: CUDA, q/k/v (and the gates) in float16/bfloat16 — float32 trips its dtype assertion and
    float64 it has no kernels for —, key and value head sizes up to :data:`MAX_HEAD_DIM`; the state in float32
    (or absent).  ``float32_values``: also float32 ``v`` with bfloat16 ``q``/``k``."""
    if not _on_cuda(tensors):
        return False
    q, k, v, *gates, s0 = tensors
    v_ok = v.dtype == q.dtype or (float32_values and q.dtype == torch.bfloat16 and v.dtype == torch.float32)
    return (q.dim() == 4 and q.dtype in _HALF and k.dtype == q.dtype and v_ok
            and all(g.dtype in (*_HALF, torch.float32) for g in gates)
            and (s0 is None or s0.dtype == torch.float32)
            and q.shape[-1] <= MAX_HEAD_DIM and v.shape[-1] <= MAX_HEAD_DIM)


def _is_hopper(device: Any) -> bool:
    """Whether fla counts this machine as Hopper, or ``device`` is one: fla decides once, at import, from device
    0's name ("NVIDIA H...") and the current device's compute capability (9.x); ``device`` (a CUDA tensor's) is
    checked too.  False where this machine has no CUDA (``which_form`` for a device not here)."""
    if not torch.cuda.is_available():
        return False
    try:
        idx = {torch.cuda.current_device()}
        if getattr(device, "index", None) is not None:
            idx.add(device.index)
        return "NVIDIA H" in torch.cuda.get_device_name(0) or any(
            torch.cuda.get_device_capability(i)[0] == 9 for i in idx)
    except (RuntimeError, AssertionError, ValueError):
        return False


def parse_version(text: str) -> tuple[int, int, int, int] | None:
    """``"3.6.0"`` → ``(3, 6, 0, 1)``: major, minor, patch (missing parts 0) and 1 for a final release, 0 for a
    pre-release or development one (``3.7.1rc1`` sorts below ``3.7.1``, as ``packaging`` orders them); a local
    tag (``+git…``) is ignored.  None where the text does not start with a number."""
    m = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?(.*)$", text.strip().split("+")[0])
    if m is None:
        return None
    major, minor, patch = (int(x) if x else 0 for x in m.groups()[:3])
    pre = re.match(r"[.\-_]?(a|b|c|rc|alpha|beta|pre|preview|dev)\d*", m.group(4) or "", re.IGNORECASE)
    return major, minor, patch, 0 if pre else 1


@functools.lru_cache(maxsize=1)
def _triton_version() -> tuple[int, int, int, int] | None:
    """The version of the ``triton`` that imports here (fla reads ``triton.__version__``; a torch nightly ships it
    as ``pytorch-triton``), parsed by :func:`parse_version`; None where none imports.  Read once."""
    try:
        import triton

        return parse_version(str(triton.__version__))
    except Exception:  # noqa: BLE001 — not installed, or broken: fla's kernels would not import either
        return None


def _fla_gated_backward_refused(device: Any) -> bool:
    """Whether fla's gated backward refuses this machine: on Hopper with 3.4.0 <= triton < 3.7.1 its
    ``chunk_bwd_dqkwg`` raises ("produces incorrect results for gated chunk_bwd_dqkwg"; fla 0.6.0, seen on an H200
    with triton 3.6.0) — the gated delta rule's backward and simple GLA's (VORT's retention on fla) — so a
    training call there crashed in its backward.  Such calls run seqmem's own forms instead; a call without
    gradients stays on fla."""
    tv = _triton_version()
    return tv is not None and (3, 4, 0, 1) <= tv < (3, 7, 1, 1) and _is_hopper(device)


def wants_grad(*tensors: Any) -> bool:
    """Whether a call with these tensors records a backward: grad mode on and one of them requiring a gradient.
    A :class:`TensorSpec` (``which_form``, which answers for training) always counts as wanting one."""
    ts = [t for t in tensors if t is not None]
    if any(isinstance(t, TensorSpec) for t in ts):
        return True
    return torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in ts)


def fla_gated_refuses(*tensors: Any) -> bool:
    """Whether a call of fla's gated kernels (the gated delta rule's, VORT's simple GLA) with these tensors must
    not take them: it wants a gradient (:func:`wants_grad`) on a machine whose fla gated backward refuses
    (:func:`_fla_gated_backward_refused`, for the first tensor's device)."""
    ts = [t for t in tensors if t is not None]
    return bool(ts) and wants_grad(*ts) and _fla_gated_backward_refused(ts[0].device)


def _fla_gated_supports(q: Any, k: Any, v: Any, beta: Any, g: Any, s0: Any) -> bool:
    """As :func:`_fla_supports`, and not where :func:`fla_gated_refuses` the call."""
    return _fla_supports(q, k, v, beta, g, s0) and not fla_gated_refuses(q, k, v, beta, g, s0)


def _fla_linear_supports(q: Any, k: Any, v: Any, s0: Any) -> bool:
    """As :func:`_fla_supports`, bfloat16 only (fla keeps the undecayed per-chunk states in the input's dtype,
    which overflows float16 near 65k tokens; the PyTorch form sums in float32); also a float32 ``v`` with bfloat16
    ``q``/``k`` (the linear-attention mixer's undecayed sums ask for a float32 output): the kernel gets ``v`` in
    bfloat16 and returns the output in float32.  The mixer's ``v`` is a bfloat16 projection widened to float32, so
    narrowing it back is exact; another caller's float32 ``v`` is rounded to bfloat16 (as the kernel's output is)."""
    return getattr(q, "dtype", None) == torch.bfloat16 and _fla_supports(q, k, v, s0, float32_values=True)


def _mamba_supports(x: Any, dt: Any, A: Any, B: Any, C: Any, s0: Any) -> bool:  # noqa: N803
    ts = _on_cuda((x, dt, A, B, C, s0))
    return bool(ts) and x.dim() == 4 and all(t.dtype in (*_HALF, torch.float32) for t in ts) and (
        x.shape[-1] <= MAX_HEAD_DIM and B.shape[-1] <= MAX_HEAD_DIM)


def _head_first_false(fn: Callable[..., Any]) -> dict[str, bool]:
    """``{"head_first": False}`` where ``fn`` still takes the argument (older fla defaults it to True, the
    (batch, heads, time, dim) layout), else ``{}``."""
    try:
        return {"head_first": False} if "head_first" in inspect.signature(fn).parameters else {}
    except (TypeError, ValueError):
        return {}


def _fla_linear(q, k, v, scale, initial_state, chunk_size):  # noqa: ANN001, ANN202
    from fla.ops.linear_attn import chunk_linear_attn

    o, S = chunk_linear_attn(q, k, v.to(q.dtype), scale=scale, initial_state=initial_state, output_final_state=True,
                             normalize=False, **_head_first_false(chunk_linear_attn))  # fmt: skip
    return o.to(v.dtype), S


def _fla_delta_rule(q, k, v, beta, scale, initial_state, chunk_size):  # noqa: ANN001, ANN202
    from fla.ops.delta_rule import chunk_delta_rule

    return chunk_delta_rule(q, k, v, beta, scale=scale, initial_state=initial_state, output_final_state=True,
                            **_head_first_false(chunk_delta_rule))  # fmt: skip


def _fla_gated_delta_rule(q, k, v, beta, g, scale, initial_state, chunk_size):  # noqa: ANN001, ANN202
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    return chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                  output_final_state=True, **_head_first_false(chunk_gated_delta_rule))


def _shared_group(t: Tensor) -> Tensor:
    """``B`` or ``C`` (batch, time, heads, n) as mamba's (batch, time, groups, n): one group when every head holds
    the same values by construction (expanded, stride 0 over the heads: Mamba-2's single group), so the kernel
    computes ``C Bᵀ`` once rather than once per head; else one group per head."""
    return t[:, :, :1] if t.shape[2] > 1 and t.stride(2) == 0 else t


def _mamba_ssd(x, dt, A, B, C, initial_state, chunk_size):  # noqa: ANN001, ANN202, N803
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

    # dt is already positive (seqmem's ssd takes softplus'd steps): dt_softplus stays False, no dt_bias, D or z
    return mamba_chunk_scan_combined(x, dt, A, _shared_group(B), _shared_group(C), chunk_size,
                                     initial_states=initial_state, return_final_states=True)


register_backend("linear_attention", "fla", _fla_linear, _installed("fla", "fla.ops.linear_attn"),
                 _fla_linear_supports)
register_backend("delta_rule", "fla", _fla_delta_rule, _installed("fla", "fla.ops.delta_rule"), _fla_supports)
register_backend("gated_delta_rule", "fla", _fla_gated_delta_rule, _installed("fla", "fla.ops.gated_delta_rule"),
                 _fla_gated_supports)
register_backend("ssd", "mamba_ssm", _mamba_ssd, _installed("mamba_ssm", "mamba_ssm.ops.triton.ssd_combined"),
                 _mamba_supports)
