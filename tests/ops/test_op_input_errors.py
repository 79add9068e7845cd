"""Every public sequence op (the cases of ``test_state_convention.py``, one per op and mode) on inputs that are
wrong in a way its shapes alone do not show: an empty sequence, a tensor on another device, a tensor of another
floating dtype, a tensor with one dimension too many.

* T = 0: an empty output and the state unchanged (continuing from it equals continuing from the state given, or
  starting afresh), in every mode, as the linear-attention family always did;
* another device (``meta``) for any tensor argument or state tensor: a ``ValueError`` naming the op, before any
  kernel runs (raw RuntimeErrors, and a segfault in the C++ Lattice kernel, before);
* another floating dtype for one argument or the state: computed in the promoted dtype, the same numbers as with
  that argument cast back (as the core ops do), or a ``ValueError`` naming the op — never a raw "expected scalar
  type" error;
* one dimension too many on any tensor argument: a ``ValueError`` naming the op.

The wrong argument is substituted by wrapping the op (``seqmem.ops.<name>``, which each case calls by attribute),
so every tensor argument of every case is tried without a hand-written list per op.
"""

from __future__ import annotations

import pytest
import torch
from test_state_convention import CASES

import seqmem.ops as ops

PARAMS = [pytest.param(op, cid, make, id=f"{op}-{cid}") for op, cid, make in CASES]


def _tensor_slots(args: tuple, kwargs: dict) -> list[tuple[str, object]]:
    """The tensor arguments of one call, as (slot, name): ``("arg", i)`` positional, ``("kw", name)`` keyword,
    ``("state", key)`` a tensor of ``initial_state``."""
    slots: list[tuple[str, object]] = [("arg", i) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    slots += [("kw", n) for n, a in kwargs.items() if isinstance(a, torch.Tensor)]
    st = kwargs.get("initial_state")
    if st is None and len(args) > 4 and isinstance(args[4], dict):  # lattice_*: the state is the fifth argument
        st = args[4]
    if isinstance(st, dict):
        slots += [("state", k) for k, v in st.items() if isinstance(v, torch.Tensor)]
    return slots


def _replace(args: tuple, kwargs: dict, slot: tuple[str, object], fn) -> tuple[tuple, dict]:
    args, kwargs = list(args), dict(kwargs)
    kind, key = slot
    if kind == "arg":
        args[key] = fn(args[key])  # type: ignore[index]
    elif kind == "kw":
        kwargs[key] = fn(kwargs[key])  # type: ignore[index]
    else:
        where = "kw" if isinstance(kwargs.get("initial_state"), dict) else "arg"
        st = dict(kwargs["initial_state"] if where == "kw" else args[4])
        st[key] = fn(st[key])  # type: ignore[index]
        if where == "kw":
            kwargs["initial_state"] = st
        else:
            args[4] = st
    return tuple(args), kwargs


def _record(monkeypatch, op: str) -> list[tuple[tuple, dict]]:
    """Record the arguments of every call of ``seqmem.ops.<op>``."""
    calls: list[tuple[tuple, dict]] = []
    orig = getattr(ops, op)

    def spy(*a, **kw):
        calls.append((a, kw))
        return orig(*a, **kw)

    monkeypatch.setattr(ops, op, spy)
    return calls


def _call_changed(monkeypatch, op: str, call, sl, st, slot, fn):
    """Run case ``call`` with the tensor in ``slot`` replaced by ``fn(tensor)``."""
    orig = getattr(ops, op)

    def changed(*a, **kw):
        a, kw = _replace(a, kw, slot, fn)
        return orig(*a, **kw)

    monkeypatch.setattr(ops, op, changed)
    try:
        return call(sl, st)
    finally:
        monkeypatch.setattr(ops, op, orig)


def _name(slot) -> str:
    kind, key = slot
    return {"arg": f"argument {key}", "kw": f"{key}=", "state": f"initial_state[{key!r}]"}[kind]


@pytest.mark.parametrize("op,cid,make", PARAMS)
def test_empty_sequence_returns_empty_output_and_the_state_unchanged(op, cid, make):
    T, call = make()
    y, st = call(slice(0, T), None)
    cut = T // 2
    y1, st1 = call(slice(0, cut), None)
    for given in (None, st1):
        y0, st0 = call(slice(cut, cut), given)
        if y0 is not None:
            assert y0.shape[1] == 0, f"{op}[{cid}]: T = 0 gave an output of shape {tuple(y0.shape)}"
        assert isinstance(st0, dict) and set(st0) == set(st), f"{op}[{cid}]: keys {sorted(st0)}"
        if given is None:  # the empty state continues as a fresh start
            y_a, st_a = call(slice(0, T), st0)
        else:  # the state given, unchanged
            y_a, st_a = call(slice(cut, T), st0)
            for key in st1:
                torch.testing.assert_close(st0[key].to(st1[key].dtype), st1[key], rtol=0, atol=0,
                                           msg=f"{op}[{cid}]: T = 0 changed state[{key!r}]")
            y_a = None if y_a is None else torch.cat([y1, y_a], 1)
        if y is not None:
            torch.testing.assert_close(y_a, y, rtol=1e-10, atol=1e-12, msg=f"{op}[{cid}]: after T = 0")
        for key in st:
            a, b = st_a[key], st[key]
            if a.is_floating_point():
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=f"{op}[{cid}]: state[{key!r}]")
            else:
                assert torch.equal(a, b), f"{op}[{cid}]: state[{key!r}]"


def _slots_of(monkeypatch, op, call, T):
    """The tensor slots of a call from a state (so the state's tensors are tried too), and that state."""
    _, st1 = call(slice(0, T // 2), None)
    calls = _record(monkeypatch, op)
    call(slice(T // 2, T), st1)
    monkeypatch.undo()
    (args, kwargs), = calls[:1]
    return _tensor_slots(args, kwargs), st1


@pytest.mark.parametrize("op,cid,make", PARAMS)
def test_a_tensor_on_another_device_is_a_value_error(op, cid, make, monkeypatch):
    T, call = make()
    slots, st1 = _slots_of(monkeypatch, op, call, T)
    for slot in slots:
        with pytest.raises(ValueError, match=rf"^{op}: .*device"):
            _call_changed(monkeypatch, op, call, slice(T // 2, T), st1, slot, lambda t: t.to("meta"))


@pytest.mark.parametrize("op,cid,make", PARAMS)
def test_one_dimension_too_many_is_a_value_error(op, cid, make, monkeypatch):
    T, call = make()
    slots, st1 = _slots_of(monkeypatch, op, call, T)
    for slot in slots:
        try:
            _call_changed(monkeypatch, op, call, slice(T // 2, T), st1, slot, lambda t: t[None])
        except ValueError as e:
            assert str(e).startswith(f"{op}: "), f"{op}[{cid}] {_name(slot)}: {e}"
        else:
            raise AssertionError(f"{op}[{cid}]: {_name(slot)} with one dimension more was accepted")


@pytest.mark.parametrize("op,cid,make", PARAMS)
def test_another_floating_dtype_is_promoted_or_refused(op, cid, make, monkeypatch):
    T, call = make()
    slots, st1 = _slots_of(monkeypatch, op, call, T)
    for slot in slots:
        try:
            got = _call_changed(monkeypatch, op, call, slice(T // 2, T), st1, slot,
                                lambda t: t.float() if t.is_floating_point() else t)
        except ValueError as e:
            assert str(e).startswith(f"{op}: "), f"{op}[{cid}] {_name(slot)}: {e}"
            continue
        want = _call_changed(monkeypatch, op, call, slice(T // 2, T), st1, slot,
                             lambda t: t.float().double() if t.is_floating_point() else t)
        for a, b in ((got[0], want[0]), *((got[1][k], want[1][k]) for k in want[1])):
            if a is None or not a.is_floating_point():
                continue
            torch.testing.assert_close(a.double(), b.double(), rtol=1e-5, atol=1e-6,
                                       msg=f"{op}[{cid}]: {_name(slot)} in float32")
