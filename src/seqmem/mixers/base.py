"""The mixer contract shared by every token mixer in seqmem.

A mixer maps ``x: (batch, time, d_model)`` to ``y`` of the same shape and returns a ``state`` that lets it
continue the sequence later: ``y, state = mixer(x, state)``.  ``state`` is a ``dict[str, Tensor]`` whose tensors
all have the batch as their first dimension, so it can be moved (:func:`state_to`), saved with ``torch.save`` or
safetensors, and checked against the batch it is fed with.

Every mixer has two implementations selected by ``impl``:

* ``"reference"`` — the recurrent loop that reads like the paper;
* ``"fast"`` — the chunked / parallel training form.

Both share parameter names, so ``load_state_dict`` moves weights between them.  The properties promised by the
contract (causality, streaming under any split, token-by-token decoding, reference == fast, ``state_size``) are
tested for every registered mixer by ``tests/test_contract.py``.

**Packed sequences (variable length).**  ``y, states = mixer(x, state, cu_seqlens=cu)`` runs ``N`` sequences
packed along time in one row, flash-linear-attention's convention: ``x`` is ``(1, T, d_model)`` and ``cu`` a 1-D
integer tensor ``[0, l1, l1 + l2, ..., T]`` (every length >= 1); sequence ``i`` is ``x[:, cu[i]:cu[i + 1]]``, and
the state restarts at every boundary, so ``y`` equals each sequence run alone, concatenated (outputs and
gradients; ``tests/test_varlen.py`` checks it for every registered mixer).  A batch larger than 1 is refused, as
in flash-linear-attention: pack every row into one.

* ``state`` (optional) holds each sequence's initial state: one state of batch ``N`` (row ``i`` for sequence
  ``i``), or a list of ``N`` batch-1 states.
* The returned state is each sequence's state after its own last token: one state of batch ``N`` when the ``N``
  states can share a batch (same shapes, equal position counters: the fixed-size states of the recurrent mixers),
  else a list of ``N`` batch-1 states (KV caches of different lengths, states at different positions); either
  form continues the sequences in a later call with ``cu_seqlens``.  ``output_final_state=False`` returns
  ``None`` instead and takes the cheaper one-call path (see :meth:`Mixer._forward_varlen`).
* A mixer that cannot run packed sequences says why in ``varlen_unsupported`` and refuses ``cu_seqlens``.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from seqmem.io import check_int
from seqmem.mixers._fla_names import FlaNamesMeta

State = dict[str, Tensor]
IMPLS = ("reference", "fast")
#: The keys of :attr:`Mixer.facts` (see there).
FACT_KEYS = ("state_promise", "numerics_smoke", "numerics_full", "numerics_amp", "gradcheck")
#: The ``numerics_amp`` bounds of a mixer that gives none (see :attr:`Mixer.facts`): per half dtype, bounds on the
#: relative error against float32 of the output and of every gradient tensor.  Measured over every registered mixer
#: (``tests/test_mixed_precision.py``'s setting, seed 0, torch 2.13 CPU), the largest besides the mixers that give
#: their own: bfloat16 1.1e-2 (output), 4.5e-2 (a gradient); float16 1.5e-3, 4.0e-3; the defaults are about 3x.
AMP_BOUNDS: dict[str, tuple[float, float]] = {"bf16": (3e-2, 1.2e-1), "fp16": (4e-3, 1.2e-2)}

_CHECK_FINITE = False


class NonFiniteError(ValueError, FloatingPointError):
    """A NaN or Inf found by the finite checks (:func:`set_check_finite`); both a ``ValueError`` (bad input) and a
    ``FloatingPointError`` (a diverged computation)."""


def set_check_finite(enabled: bool) -> bool:
    """Turn the NaN/Inf checks of every mixer's input and output on or off; returns the previous setting.

    Off by default: ``torch.isfinite(x).all()`` costs a pass over the tensor and, on a GPU, a host synchronisation.
    The ``seqmem train`` / ``seqmem eval`` commands turn it on (``--no-check-finite`` turns it off)."""
    global _CHECK_FINITE
    if not isinstance(enabled, bool):
        raise ValueError(f"set_check_finite expects True or False, got {enabled!r}")
    prev, _CHECK_FINITE = _CHECK_FINITE, enabled
    return prev


def check_finite_enabled() -> bool:
    """Whether :func:`set_check_finite` is on."""
    return _CHECK_FINITE


def _nonfinite_count(t: Tensor) -> int:
    return int(t.numel() - torch.isfinite(t).sum()) if t.is_floating_point() else 0


def _first_bad(t: Tensor) -> str:
    """Where the first NaN/Inf of ``t`` (batch, time, ...) is, e.g. ``"batch 0, token 13 (nan)"``."""
    idx = (~torch.isfinite(t)).nonzero()[0].tolist()
    where = f"batch {idx[0]}, token {idx[1]}" if len(idx) >= 2 else f"index {idx}"
    return f"{where} ({float(t.detach()[tuple(idx)])})"


def count_state(state: State | None) -> int:
    """Numbers held per sequence in ``state``: every tensor's size divided by the batch (its first dimension)."""
    if not state:
        return 0
    total = 0
    for v in state.values():
        b = v.shape[0]
        total += v.numel() // max(b, 1)
    return total


def _version(x: Tensor) -> int | None:
    """The in-place version counter of ``x`` (``None`` for inference-mode tensors, which have none: there the same
    object is the key)."""
    return None if x.is_inference() else x._version


def own_memory(state: State) -> State:
    """``state`` with every tensor that is a view into a larger buffer, or not contiguous, replaced by a contiguous
    copy of its own numbers (the others as they are: no copy).  A state built by slicing a whole call's buffers
    (the last ``k − 1`` padded inputs of a convolution, the keys of a window) otherwise keeps the whole buffer
    alive as long as it lives, ``torch.save`` writes all of it, and safetensors refuses it.  Exact (a copy)."""
    out = {}
    for k, v in state.items():
        if not v.is_contiguous() or v.untyped_storage().nbytes() != v.numel() * v.element_size():
            v = v.clone(memory_format=torch.contiguous_format)
        out[k] = v
    return out


def state_to(state: State | None, device: torch.device | str | None = None, dtype: torch.dtype | None = None):
    """Move a mixer state to ``device`` (and cast its floating tensors to ``dtype``)."""
    if state is None:
        return None
    out = {}
    for k, v in state.items():
        v = v.to(device) if device is not None else v
        if dtype is not None and v.is_floating_point():
            v = v.to(dtype)
        out[k] = v
    return out


def check_cu_seqlens(cu_seqlens: Any, total: int, owner: str = "cu_seqlens") -> list[int]:
    """``cu_seqlens`` (a 1-D integer tensor or a list of ints: ``[0, l1, l1 + l2, ..., total]``, every length
    >= 1) as a list of ints; a ValueError naming ``owner`` otherwise."""
    if isinstance(cu_seqlens, Tensor):
        if cu_seqlens.dim() != 1 or cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{owner}: cu_seqlens must be a 1-D integer tensor, got {cu_seqlens.dtype} of shape "
                             f"{tuple(cu_seqlens.shape)}")
        bounds = [int(v) for v in cu_seqlens.tolist()]
    elif isinstance(cu_seqlens, (list, tuple)) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in cu_seqlens):
        bounds = list(cu_seqlens)
    else:
        raise ValueError(f"{owner}: cu_seqlens must be a 1-D integer tensor, got {type(cu_seqlens).__name__}")
    if len(bounds) < 2 or bounds[0] != 0 or bounds[-1] != total:
        raise ValueError(f"{owner}: cu_seqlens must run from 0 to the {total} packed tokens "
                         f"([0, l1, l1 + l2, ..., {total}]), got {bounds[:4]}{' ...' if len(bounds) > 4 else ''}"
                         f"{bounds[-1:] if len(bounds) > 4 else ''}")
    if any(b <= a for a, b in zip(bounds, bounds[1:])):
        i = next(i for i, (a, b) in enumerate(zip(bounds, bounds[1:])) if b <= a)
        raise ValueError(f"{owner}: cu_seqlens must increase strictly (every sequence holds at least one token), "
                         f"got {bounds[i]} then {bounds[i + 1]} at index {i}")
    return bounds


def _batch_of(state: State) -> int:
    return next(iter(state.values())).shape[0] if state else 0


def _index_rows(state: State, rows: list[int]) -> State:
    idx = None
    out = {}
    for k, v in state.items():
        if idx is None or idx.device != v.device:
            idx = torch.as_tensor(rows, dtype=torch.long, device=v.device)
        out[k] = v.index_select(0, idx)
    return out


def _stack_key(state: State) -> tuple:
    """What two batch-1 states must share to go into one batch: keys, shapes, dtypes and every integer tensor's
    values (position counters: a mixer may assume the rows of a batch are at the same position)."""
    return tuple(sorted(
        (k, tuple(v.shape), v.dtype, None if v.is_floating_point() else tuple(v.flatten().tolist()))
        for k, v in state.items()))


def group_stackable(rows: list[State]) -> list[list[int]]:
    """The indices of ``rows`` (batch-1 states) in groups whose states can share one batch (:func:`stack_states`),
    in order of first appearance."""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault(_stack_key(r), []).append(i)
    return list(groups.values())


def stack_states(rows: list[State]) -> State | list[State]:
    """One batched state from per-sequence (batch-1) states when they can share a batch — same keys, shapes and
    dtypes, and equal integer tensors (position counters) — else the list itself.

    The fixed-size states of recurrent mixers stack; KV caches of different lengths, or states at different
    positions, stay a list (one state per sequence), which a call with ``cu_seqlens`` takes back as ``state``."""
    if len(rows) == 1:
        return rows[0]
    if len(group_stackable(rows)) != 1:
        return list(rows)
    return {k: torch.cat([r[k] for r in rows], 0) for k in rows[0]}


def split_states(state: State | list[State], n: int) -> list[State]:
    """``n`` batch-1 states from a batched state of batch ``n`` (or a list of them, returned as is)."""
    if isinstance(state, list):
        return state
    return [{k: v[j : j + 1] for k, v in state.items()} for j in range(n)]



def check_positive_int(name: str, value: Any) -> int:
    return check_int(name, value)


def check_positive_float(name: str, value: Any, allow_zero: bool = False) -> float:
    """A real number > 0 (>= 0 with ``allow_zero``; any ``numbers.Real``: a NumPy float too, not a bool) as a
    float, else a ValueError naming the option."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not (value >= 0 if allow_zero else value > 0):
        raise ValueError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} number, got {value!r}")
    return float(value)


def check_choice(name: str, value: Any, choices: tuple | list) -> Any:
    if value not in choices:
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


_DOMAINS: dict[str, tuple[str, Any]] = {
    ">0": ("> 0", lambda v: v > 0),
    ">1": ("> 1", lambda v: v > 1),
    "even>0": ("> 0 and even", lambda v: v > 0 and v % 2 == 0),
    ">=0": (">= 0", lambda v: v >= 0),
    "(0,1)": ("in (0, 1)", lambda v: 0 < v < 1),
    "(0,1]": ("in (0, 1]", lambda v: 0 < v <= 1),
    "[0,1]": ("in [0, 1]", lambda v: 0 <= v <= 1),
    "[0,1)": ("in [0, 1)", lambda v: 0 <= v < 1),
    "[1,1.5)": ("in [1, 1.5)", lambda v: 1 <= v < 1.5),
}


def check_fields(obj: Any, domains: dict[str, str] | None = None) -> None:
    """:func:`check_option` for every field of the dataclass ``obj`` (by its annotation, and ``domains``)."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        if f.name in hints:
            check_option(type(obj).__name__, f.name, getattr(obj, f.name), hints[f.name], (domains or {}).get(f.name))


def check_option(owner: str, name: str, value: Any, annotation: Any, domain: str | None = None) -> None:
    """Check one constructor option against its type annotation and an optional domain; ``ValueError`` if not.

    ``bool``: exactly ``True``/``False`` (not 0/1 or a string); ``int``: an integer, not a bool or a float;
    ``float``: a finite real number, not a bool (NaN and ±Inf are refused); ``str``: a string; ``X | None``: ``None``
    or an ``X``; other annotations are not checked.  ``domain`` is a key of ``_DOMAINS`` (e.g. ``">0"``)."""
    import types
    import typing

    args = typing.get_args(annotation)
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    if union and type(None) in args:
        if value is None:
            return
        rest = [a for a in args if a is not type(None)]
        annotation = rest[0] if len(rest) == 1 else None
    if annotation is bool:
        ok, want = isinstance(value, bool), "True or False"
    elif annotation is int:
        ok, want = isinstance(value, numbers.Integral) and not isinstance(value, bool), "an integer"
    elif annotation is float:
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
        want = "a finite number"
    elif annotation is str:
        ok, want = isinstance(value, str), "a string"
    else:
        return
    if ok and domain is not None:
        text, test = _DOMAINS[domain]
        ok, want = bool(test(value)), f"{want} {text}"
    if not ok:
        raise ValueError(f"{owner}: {name} must be {want}, got {value!r}")


def _checked_init(init: Any) -> Any:
    """``init`` preceded by :func:`check_option` for every annotated parameter (and ``option_domains``).  Errors
    name the class being built (``type(self)``), so an option a subclass forwards through ``**kwargs`` to a parent's
    ``__init__`` reads as that subclass's own."""
    import functools
    import inspect
    import typing

    sig = inspect.signature(init)
    hints: dict[str, Any] | None = None

    @functools.wraps(init)
    def wrapped(self, *args: Any, **kwargs: Any) -> None:
        nonlocal hints
        if hints is None:
            try:
                hints = typing.get_type_hints(init)
            except Exception:  # noqa: BLE001 — an annotation that cannot be resolved here: check nothing
                hints = {}
        try:
            bound = sig.bind(self, *args, **kwargs)
        except TypeError:
            return init(self, *args, **kwargs)  # let Python report the wrong call
        domains = getattr(type(self), "option_domains", {})
        for name, value in list(bound.arguments.items())[1:]:
            if name in hints:
                check_option(type(self).__name__, name, value, hints[name], domains.get(name))
        return init(self, *args, **kwargs)

    wrapped._checks_options = True  # type: ignore[attr-defined]
    return wrapped


class Mixer(nn.Module, metaclass=FlaNamesMeta):
    """Base class of every token mixer.  Constructors also take flash-linear-attention's names ``hidden_size``,
    ``num_heads``, ``head_dim`` and ``layer_idx`` (see :mod:`seqmem.mixers._fla_names`).

    Subclasses implement :meth:`_forward` (validated input in, ``(y, state)`` out) and :meth:`state_size`.
    They may set ``contract_configs``: a list of option dicts with which the contract tests build the mixer
    (use small chunk/block sizes there so the tests cut through chunks); the default is ``[{}]``.
    """

    contract_configs: ClassVar[list[dict[str, Any]]] = [{}]
    #: What the tests and benchmarks know about the mechanism; a name registered with ``register(..., facts=)``
    #: merges its own values over these (variants on one class differ).  Keys (:data:`FACT_KEYS`):
    #: ``state_promise``: ``("bounded" | "grows", why)``, what the state norm does over a long sequence
    #: (``seqmem.bench.numerics`` reports it; the 64k numerics test checks it);
    #: ``numerics_smoke``: bounds on the relative error vs float64 for float32, bf16 autocast, float16 at T = 2,048
    #: (``tests/test_numerics.py``; a string records a known failure: "unsupported", "nonfinite", "nonfinite_state");
    #: ``numerics_full``: the same at T = 65,536 as ``(all tokens, last 4,096)`` pairs (the slow test);
    #: ``numerics_amp``: ``{"bf16" | "fp16": (output bound, gradient bound)}``, bounds on the relative error against
    #: float32 of the output and of each gradient tensor under mixed precision: autocast with the backward inside
    #: and outside the autocast region, and weights cast to the dtype (``tests/test_mixed_precision.py``, T = 16);
    #: a dtype not given takes :data:`AMP_BOUNDS`;
    #: ``gradcheck``: ``{case_id: make}``, each ``make()`` returning ``(fn, float64 inputs)`` for
    #: ``torch.autograd.gradcheck`` of the mechanism's op (``tests/ops/test_gradcheck_all.py``).
    facts: ClassVar[dict[str, Any]] = {}
    #: Options whose value is a length in tokens, by kind: ``"window"`` (a query sees only this many recent
    #: tokens), ``"block"`` (attention within blocks of this length), ``"chunk"`` (a chunk length that limits what a
    #: query can see, e.g. a chunk-causal memory), ``"queue"`` (a memory of this many past tokens) or ``"memory"``
    #: (a compressed memory of this many slots or tokens).  Comparisons scale them to the task's sequence length
    #: with one rule (:data:`seqmem.sweep.LENGTH_RULE`); chunk sizes of exact chunked forms are not lengths here.
    length_options: ClassVar[dict[str, str]] = {}
    #: The option that sets the head size, and through it the head count, where that is not ``d_model / n_heads``
    #: (Mamba2's ``headdim``: heads = ``expand·d_model / headdim``), or ``None``.  flash-linear-attention's
    #: ``head_dim`` is read as this option (:mod:`seqmem.mixers._fla_names`), and a model
    #: (:meth:`seqmem.models.LMConfig.mixer_build_options`) leaves its ``n_heads`` out of a layer that gives it.
    head_dim_option: ClassVar[str | None] = None
    #: ``name`` is filled in by :func:`seqmem.registry.register`.
    name: ClassVar[str] = "mixer"
    #: Numeric domains of constructor options, e.g. ``{"eps": ">0"}`` (keys of ``_DOMAINS``).  Every subclass's
    #: ``__init__`` is wrapped (:meth:`__init_subclass__`) so each option is checked against its type annotation
    #: (bool, int, finite float, str, ``X | None``; see :func:`check_option`) and its domain here before the
    #: mixer is built: one declaration per option instead of a hand-written check.  A subclass's declaration adds
    #: to (and may override) its parents' (merged in :meth:`__init_subclass__`); ``None`` is always accepted for
    #: an ``X | None`` option, so a domain constrains only the numbers.
    option_domains: ClassVar[dict[str, str]] = {"d_model": ">0", "n_heads": ">0"}
    #: The implementation a one-token call (``x`` of length 1: a decode step) runs when ``impl="fast"``:
    #: ``"reference"`` where the per-token form is measured cheaper at T = 1 (the two are equal by the contract and
    #: share the state layout), else ``"fast"``.  ``seqmem bench decode`` measures both.
    single_token_impl: ClassVar[str] = "fast"
    #: Whether ``forward`` takes ``action_mask=`` (a (batch, time) 0/1 tensor marking the tokens allowed into the
    #: mixer's memory, Echo App. F eq. 53): only SKA does; :class:`~seqmem.models.LanguageModel` passes a model's
    #: action mask to the layers that take one and leaves the others as they are.
    takes_action_mask: ClassVar[bool] = False
    #: False while a ``forward(..., output_final_state=False)`` call (no ``cu_seqlens``) runs ``_forward``: the
    #: state it returns is dropped, so a mixer may leave out what only the state needs (VORT's SOE channel sums)
    _final_state_wanted: bool = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        merged: dict[str, str] = {}
        for base in reversed(cls.__mro__[1:]):
            merged.update(getattr(base, "option_domains", None) or {})
        merged.update(cls.__dict__.get("option_domains", {}))
        unknown = {k: v for k, v in merged.items() if v not in _DOMAINS}
        if unknown:
            raise TypeError(f"{cls.__name__}.option_domains: unknown domain(s) {unknown}; known: {list(_DOMAINS)}")
        cls.option_domains = merged
        init = cls.__dict__.get("__init__")
        if init is not None and not getattr(init, "_checks_options", False):
            cls.__init__ = _checked_init(init)  # type: ignore[method-assign]

    def __init__(self, d_model: int, n_heads: int = 4, impl: str = "fast") -> None:
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.n_heads = check_positive_int("n_heads", n_heads)
        self.impl = check_choice("impl", impl, IMPLS)

    #: the mixer reads a given state's position (tokens seen) through :meth:`_state_pos` (or hands its op
    #: :meth:`_known_pos`) and its returned state's ``"pos"`` is that position plus the call's tokens: the layer then
    #: remembers the position of the state it returned, on the host, and a decode step that passes that state back
    #: reads nothing from the device
    pos_on_host: ClassVar[bool] = False

    def _state_pos(self, state: State) -> int:
        """The position of a given ``state``: known on the host when it is the state this layer returned last (its
        ``pos`` tensor the same object, not modified in place since: a ``pos`` made in inference mode, which has
        no version counter, is returned as a normal tensor, whose counter sees an edit made in inference mode too),
        else read from the device (one wait for the GPU on CUDA) and remembered.  For mixers with
        :attr:`pos_on_host`."""
        d = self.__dict__
        if d.get("_pos_known") is not None:
            return d["_pos_known"]
        p = int(state["pos"][0])
        if "_pos_known" in d:  # inside forward's own call (not a packed segment, not a probe): what it started at
            d["_pos_known"] = p
        return p

    def _known_pos(self, state: State, modulo: int | None = None) -> int | None:
        """Inside forward's own call, for a mixer whose op reads and checks the position itself: the given
        ``state``'s position on the host — remembered for the state this layer returned last, else read here once
        (its rows must agree, modulo ``modulo`` where given: the first row's is returned) and remembered for the
        state this call returns.  None where it is not known and not read here (a packed segment, a probe, a traced
        call, a ``pos`` that is not a 1-D int64 tensor, rows that disagree): the op then reads it, and reports what
        is wrong with it."""
        d = self.__dict__
        if d.get("_pos_known") is not None or "_pos_known" not in d:
            return d.get("_pos_known")
        pos = state.get("pos") if isinstance(state, dict) else None
        if not (isinstance(pos, Tensor) and pos.dtype == torch.long and pos.dim() == 1 and pos.numel() > 0):
            return None
        rows = pos.tolist()  # one read of the device
        if any((r - rows[0]) % (modulo or 1 << 62) for r in rows):
            return None
        d["_pos_known"] = rows[0]
        return rows[0]

    def _remembered_pos(self, state: State) -> int | None:
        """The host position remembered for ``state`` (see :attr:`pos_on_host`), or None."""
        memo = self.__dict__.get("_pos_memo")
        pos = state.get("pos") if isinstance(state, dict) else None
        if memo is None or pos is None or memo[0] is not pos or memo[1] != _version(pos):
            return None
        return memo[2]

    def __setattr__(self, name: str, value: Any) -> None:
        # impl is checked whenever it is set, not only at construction: a typo set later (m.impl = "Fast") ran
        # the fast form without a word
        if name == "impl":
            value = check_choice(f"{type(self).__name__}.impl", value, IMPLS)
        super().__setattr__(name, value)

    def _op_mode(self, fast: str = "chunk") -> str:
        """The ``mode`` of the op this mixer runs: ``"recurrent"`` for ``impl="reference"``, else ``fast``."""
        return "recurrent" if self.impl == "reference" else fast

    def _head_dim(self, rope: bool = False) -> int:
        """``d_model // n_heads``: a ValueError unless ``n_heads`` divides ``d_model`` (and, with ``rope``, unless
        the head dimension is even: RoPE rotates pairs)."""
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")
        head_dim = self.d_model // self.n_heads
        if rope and head_dim % 2:
            raise ValueError(f"head dimension d_model/n_heads={head_dim} must be even for RoPE")
        return head_dim

    @classmethod
    def canonical_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """``options`` (every constructor option, defaults filled in) as the layer reads them, so that two option
        dicts building the same layer compare equal (e.g. the linear family's ``conv_size`` 0 and None).  Used to
        recognise an identical training run under another row label (``seqmem sweep --reuse``)."""
        return dict(options)

    def unused_parameters(self) -> dict[str, str]:
        """The parameters this configuration never reads, by name, each with the reason: they get no gradient (and
        plain ``DistributedDataParallel`` needs ``find_unused_parameters=True`` for them).  Every other parameter
        gets a gradient from a forward and backward (``tests/test_contract.py::test_every_parameter_gets_a_gradient``,
        every mixer and configuration).  A method, not a class fact: it depends on the options."""
        return {}

    def long_range_reason(self, seq_len: int) -> str | None:
        """Why the output at position ``seq_len - 1`` cannot depend on the first token, or ``None`` when it can.

        Every memory must carry the first token to the end of the sequence; a mixer that by design cannot (a
        window, a block-local layer, a token-wise layer) says why, and ``tests/test_comparison.py`` checks the
        answer both ways for every registered mixer."""
        return None

    # -- contract ---------------------------------------------------------------------------------------------
    def forward(
        self, x: Tensor, state: State | list[State] | None = None, *, cu_seqlens: Tensor | None = None,
        output_final_state: bool = True,
    ) -> tuple[Tensor, State | list[State] | None]:
        """``y, state = mixer(x, state)``; with ``cu_seqlens``, packed sequences (see the module docstring).

        ``output_final_state=False`` returns ``(y, None)``: with ``cu_seqlens`` this takes the one-call padded path
        (the cheaper one for training, see :meth:`_forward_varlen`)."""
        self._check_input(x)
        if not isinstance(output_final_state, bool):
            raise ValueError(f"{type(self).__name__}: output_final_state must be True or False, "
                             f"got {output_final_state!r}")
        bounds = None
        if cu_seqlens is not None:
            bounds = self._check_varlen(x, cu_seqlens)
            if state is not None:
                state = self._check_varlen_state(state, x, len(bounds) - 1)
        elif state is not None:
            if isinstance(state, list):
                raise ValueError(f"{type(self).__name__}: state must be the dict of tensors returned by a previous "
                                 "call (a list of per-sequence states needs cu_seqlens: one per packed sequence)")
            self._check_state(state, x)
        if _CHECK_FINITE:
            self._check_finite_inputs(x, state)
        start = None  # the given state's position where it is known on the host (pos_on_host)
        if bounds is None:
            self._final_state_wanted = output_final_state  # a mixer may skip computing a state nobody reads
            if self.pos_on_host and not torch.compiler.is_compiling():
                self.__dict__["_pos_known"] = 0 if state is None else self._remembered_pos(state)
            try:
                y, new_state = self._dispatch(x, state)
            finally:
                self._final_state_wanted = True
                start = self.__dict__.pop("_pos_known", None)
        else:
            y, new_state = self._forward_varlen(x, state, bounds, output_final_state)
        if output_final_state and not torch.compiler.is_compiling():
            # every state tensor owns its numbers (no view keeping a whole call's buffer alive; safetensors saves it)
            if isinstance(new_state, list):
                new_state = [own_memory(s) for s in new_state]
            elif new_state is not None:
                new_state = own_memory(new_state)
                if start is not None and isinstance(new_state.get("pos"), Tensor):
                    pos = new_state["pos"]
                    if pos.is_inference():  # no version counter: a normal tensor's sees an in-place edit
                        with torch.inference_mode(False):
                            pos = new_state["pos"] = pos.clone()
                    self.__dict__["_pos_memo"] = (pos, _version(pos), start + x.shape[1])
        if _CHECK_FINITE:
            bad = _nonfinite_count(y)
            if bad:
                raise NonFiniteError(
                    f"{type(self).__name__}: output contains {bad} NaN/Inf value(s) although the input is finite "
                    f"(dtype {y.dtype}); run in float32 or lower the learning rate"
                )
        return y, (new_state if output_final_state else None)

    def _check_finite_inputs(self, x: Tensor, state: State | list[State] | None) -> None:
        name = type(self).__name__
        bad = _nonfinite_count(x)
        if bad:
            raise NonFiniteError(
                f"{name}: input x contains {bad} NaN/Inf value(s) of {x.numel()}, the first at {_first_bad(x)}; "
                "clean the input, or, if this "
                "happens while training, the model diverged: lower the learning rate or train in float32"
            )
        for st in state if isinstance(state, list) else [state or {}]:
            for k, v in st.items():
                if _nonfinite_count(v):
                    raise NonFiniteError(f"{name}: state[{k!r}] contains NaN/Inf; restart the sequence (state=None)")

    # -- variable length: packed sequences ------------------------------------------------------------------
    #: Why this mixer cannot take ``cu_seqlens`` (``None``: it can).  A call with ``cu_seqlens`` then raises a
    #: ValueError with this reason instead of computing something else.
    varlen_unsupported: ClassVar[str | None] = None

    def _check_varlen(self, x: Tensor, cu_seqlens: Any) -> list[int]:
        """``cu_seqlens`` as a list of ints ``[0, l1, l1 + l2, ..., T]``, after checking it against ``x``."""
        name = type(self).__name__
        if self.varlen_unsupported is not None:
            raise ValueError(f"{name} cannot take cu_seqlens (packed sequences): {self.varlen_unsupported}")
        bounds = check_cu_seqlens(cu_seqlens, x.shape[1], name)
        if x.shape[0] != 1:
            raise ValueError(f"{name}: cu_seqlens needs x of batch 1 (the sequences packed along time, as in "
                             f"flash-linear-attention), got batch {x.shape[0]}")
        return bounds

    def _check_varlen_state(self, state: Any, x: Tensor, n: int) -> State | list[State]:
        """The initial states of ``n`` packed sequences: one batched state of batch ``n``, or a list of ``n``
        batch-1 states (as a call with ``cu_seqlens`` returns them when they cannot be stacked)."""
        name = type(self).__name__
        if isinstance(state, list):
            if len(state) != n:
                raise ValueError(f"{name}: {len(state)} per-sequence states for {n} sequences in cu_seqlens")
            for s in state:
                if not isinstance(s, dict):
                    raise ValueError(f"{name}: state must be a state dict or a list of state dicts, one per "
                                     "sequence")
                self._check_state(s, x)
            return state
        if isinstance(state, dict) and state and all(isinstance(v, Tensor) for v in state.values()):
            b = next(iter(state.values())).shape[0] if next(iter(state.values())).dim() else None
            if b != n:
                raise ValueError(f"{name}: with cu_seqlens the state holds one row per sequence: batch {n} for the "
                                 f"{n} sequences in cu_seqlens, got batch {b}")
        self._check_state(state, x.expand(n, *x.shape[1:]))
        return state

    def _forward_varlen(
        self, x: Tensor, state: State | list[State] | None, bounds: list[int], output_final_state: bool
    ) -> tuple[Tensor, State | list[State] | None]:
        """Packed sequences ``x[:, bounds[i]:bounds[i + 1]]``, each from its own initial state (``state`` row ``i``,
        or a fresh start): the generic form, exact for every causal mixer.  A mixer that runs packed sequences
        natively overrides this (same arguments, same results).

        Without ``output_final_state``: one call on the sequences right-padded into a batch of ``N`` rows.  Each
        sequence starts at position 0 of its row (so block and chunk boundaries fall where they fall when it runs
        alone), and the pads come after its last token, which by causality they cannot change; the padded
        outputs are dropped.  The states after the pads are not those after each sequence's end, so none is
        returned.

        With ``output_final_state``: the sequences, longest first, are run in segments that end at each distinct
        length, carrying the state (the streaming contract: a sequence cut into pieces gives what it gives whole);
        after the segment that ends at its length a sequence drops out and its state is its final state.  Every
        token is processed once and no pad is processed; the cost is one call per distinct length."""
        lens = [b - a for a, b in zip(bounds, bounds[1:])]
        if isinstance(state, list):
            groups = group_stackable(state)
            if len(groups) > 1:  # rows whose states cannot share a batch (e.g. KV caches of different lengths)
                return self._varlen_groups(x, state, bounds, groups, output_final_state)
            state = stack_states(state)
        d = x.shape[-1]
        n, flat = len(lens), x[0]
        if not output_final_state:
            L = max(lens)
            dest = torch.cat([torch.arange(i * L, i * L + t, device=x.device) for i, t in enumerate(lens)])
            xp = flat.new_zeros((n * L, d)).index_copy(0, dest, flat).view(n, L, d)
            yp, _ = self._dispatch(xp, state)
            return yp.reshape(n * L, d).index_select(0, dest)[None], None
        order = sorted(range(n), key=lambda i: -lens[i])  # longest first: the rows still running are a prefix
        cur = None if state is None else _index_rows(state, order)
        finals: list[State | None] = [None] * n
        idx_parts, y_parts, done = [], [], 0
        for end in sorted(set(lens)):
            active = [i for i in order if lens[i] >= end]
            k = len(active)
            if cur is not None and _batch_of(cur) != k:
                cur = {key: v[:k] for key, v in cur.items()}
            idx = torch.tensor([[bounds[i] + p for p in range(done, end)] for i in active], device=x.device)
            ys, cur = self._dispatch(flat.index_select(0, idx.flatten()).view(k, end - done, d), cur)
            idx_parts.append(idx.flatten())
            y_parts.append(ys.reshape(-1, d))
            for j, i in enumerate(active):
                if lens[i] == end:
                    finals[i] = {key: v[j : j + 1] for key, v in cur.items()}
            done = end
        perm = torch.cat(idx_parts)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.numel(), device=perm.device)
        return torch.cat(y_parts).index_select(0, inv)[None], stack_states(finals)  # type: ignore[arg-type]

    def _varlen_groups(
        self, x: Tensor, state: list[State], bounds: list[int], groups: list[list[int]], output_final_state: bool
    ) -> tuple[Tensor, State | list[State] | None]:
        """:meth:`_forward_varlen` once per group of sequences whose initial states stack."""
        pieces: list[Tensor | None] = [None] * len(state)
        finals: list[State | None] = [None] * len(state)
        for g in groups:
            xg = torch.cat([x[:, bounds[i] : bounds[i + 1]] for i in g], 1)
            bg = [0]
            for i in g:
                bg.append(bg[-1] + bounds[i + 1] - bounds[i])
            yg, sg = self._forward_varlen(xg, stack_states([state[i] for i in g]), bg, output_final_state)
            for j, i in enumerate(g):
                pieces[i] = yg[:, bg[j] : bg[j + 1]]
                if sg is not None:
                    finals[i] = split_states(sg, len(g))[j]
        y = torch.cat(pieces, 1)  # type: ignore[arg-type]
        return y, (stack_states(finals) if output_final_state else None)  # type: ignore[arg-type]

    def _dispatch(self, x: Tensor, state: State | None) -> tuple[Tensor, State]:
        """``_forward``, with a one-token call in ``impl="fast"`` sent to :attr:`single_token_impl`."""
        if x.shape[1] == 1 and self.impl == "fast" and self.single_token_impl == "reference":
            self.impl = "reference"
            try:
                return self._forward(x, state)
            finally:
                self.impl = "fast"
        return self._forward(x, state)

    def _forward(self, x: Tensor, state: State | None) -> tuple[Tensor, State]:
        raise NotImplementedError

    def state_size(self, seq_len: int) -> int:
        """Numbers per sequence held in ``state`` after ``seq_len`` tokens (equals ``count_state(state)``)."""
        raise NotImplementedError

    def state_keys(self) -> set[str] | None:
        """The keys of a state produced by this mixer (``None``: not checked)."""
        return None

    # -- validation -------------------------------------------------------------------------------------------
    def _check_input(self, x: Tensor) -> None:
        if not isinstance(x, Tensor):
            raise ValueError(f"{type(self).__name__}: x must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 3:
            raise ValueError(
                f"{type(self).__name__}: x must have shape (batch, time, d_model={self.d_model}), "
                f"got shape {tuple(x.shape)}"
            )
        if x.shape[-1] != self.d_model:
            raise ValueError(
                f"{type(self).__name__}: x has width {x.shape[-1]} but the mixer was built with d_model={self.d_model}"
            )
        if x.shape[0] == 0 or x.shape[1] == 0:
            raise ValueError(
                f"{type(self).__name__}: empty input of shape {tuple(x.shape)} (batch and time must be >= 1)"
            )
        if not x.is_floating_point():
            raise ValueError(f"{type(self).__name__}: x must be a floating-point tensor, got dtype {x.dtype}")
        p = next(self.parameters(), None)
        if p is not None:
            if p.device != x.device:
                raise ValueError(
                    f"{type(self).__name__}: x is on {x.device} but the mixer's parameters are on {p.device}; "
                    "move one of them (mixer.to(device))"
                )
            if p.dtype != x.dtype and not torch.is_autocast_enabled(x.device.type):
                raise ValueError(
                    f"{type(self).__name__}: x has dtype {x.dtype} but the mixer's parameters are {p.dtype}; "
                    "cast one of them (mixer.to(dtype)) or run under torch.autocast"
                )

    def state_layout(self, x: Tensor) -> dict[str, tuple[tuple[int | None, ...], torch.dtype]] | None:
        """Per key, the trailing shape (after the batch; ``None`` for a dimension that grows or shrinks with the
        sequence, like a KV cache's time axis) and the dtype of the state this mixer produces for inputs like
        ``x`` (same dtype, device and autocast setting).

        The default probes the mixer itself: it runs :meth:`_forward` without gradients on zero inputs of batch 1
        and lengths 1, 2 and 3 and compares the states; a dimension that differs between them is marked ``None``.
        The result is cached per dtype/device/autocast; ``None`` means the probe failed (only keys and batch are
        then checked).  Override it for a mixer whose state layout the probe cannot see."""
        amp = torch.is_autocast_enabled(x.device.type)
        key = (x.dtype, x.device, amp, torch.get_autocast_dtype(x.device.type) if amp else None)
        cache = self.__dict__.setdefault("_state_layout_cache", {})
        if key in cache:
            return cache[key]
        layout: dict[str, tuple[tuple[int | None, ...], torch.dtype]] | None = None
        try:
            with torch.no_grad():
                states = [self._forward(x.new_zeros((1, t, self.d_model)), None)[1] for t in (1, 2, 3)]
            if all(set(s) == set(states[0]) for s in states):
                layout = {}
                for k, v in states[0].items():
                    shapes = [s[k].shape[1:] for s in states]
                    if any(len(sh) != len(shapes[0]) for sh in shapes):
                        raise RuntimeError("state rank varies with the length")
                    dims = tuple(d if all(sh[i] == d for sh in shapes) else None for i, d in enumerate(shapes[0]))
                    layout[k] = (dims, v.dtype)
        except Exception:  # noqa: BLE001 — the probe is best effort; fall back to the key/batch checks
            layout = None
        cache[key] = layout
        return layout

    def _check_state(self, state: State, x: Tensor) -> None:
        name = type(self).__name__
        if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, Tensor)
                                                  for k, v in state.items()):
            raise ValueError(f"{name}: state must be the dict of tensors returned by a previous call")
        keys = self.state_keys()
        if keys is not None and set(state) != keys:
            raise ValueError(
                f"{name}: state has keys {sorted(state)} but this mixer expects {sorted(keys)} "
                "(a state from another mixer?); pass state=None to start a new sequence"
            )
        for k, v in state.items():
            if v.dim() == 0 or v.shape[0] != x.shape[0]:
                got = "no batch dimension" if v.dim() == 0 else f"batch size {v.shape[0]}"
                raise ValueError(f"{name}: state[{k!r}] has {got} but x has batch size {x.shape[0]}")
            if v.device != x.device:
                raise ValueError(f"{name}: state[{k!r}] is on {v.device} but x is on {x.device}; use seqmem.state_to")
        if torch.compiler.is_compiling():
            return
        layout = self.state_layout(x)
        if layout is None:
            return
        if set(state) != set(layout):
            raise ValueError(
                f"{name}: state has keys {sorted(state)} but this mixer ({self.extra_repr()}) produces "
                f"{sorted(layout)} (a state from another mixer?); pass state=None to start a new sequence"
            )
        amp = torch.is_autocast_enabled(x.device.type)
        for k, v in state.items():
            dims, dtype = layout[k]
            got = tuple(v.shape[1:])
            if len(got) != len(dims) or any(d is not None and d != g for d, g in zip(dims, got)):
                want = "(batch, " + ", ".join("*" if d is None else str(d) for d in dims) + ")"
                raise ValueError(
                    f"{name}: state[{k!r}] has shape {tuple(v.shape)} but this mixer ({self.extra_repr()}) keeps "
                    f"{want} (a state from another mixer or another configuration?); "
                    "pass state=None to start a new sequence"
                )
            if not amp:
                same = v.dtype == dtype
            elif dtype.is_floating_point:  # under autocast a state is kept in the input's, autocast's or float32
                same = v.dtype in (dtype, torch.get_autocast_dtype(x.device.type), torch.float32)
            else:
                same = not v.is_floating_point()
            if not same:
                also = (f" (or, under autocast, {torch.get_autocast_dtype(x.device.type)} or float32)"
                        if amp and dtype.is_floating_point else "")
                raise ValueError(
                    f"{name}: state[{k!r}] has dtype {v.dtype} but this mixer produces {dtype}{also} for {x.dtype} "
                    "input; cast it with seqmem.state_to(state, dtype=...) or start a new sequence"
                )

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}, impl={self.impl!r}"
