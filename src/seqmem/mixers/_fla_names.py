"""Constructor arguments under flash-linear-attention's names: ``hidden_size`` (= ``d_model``), ``num_heads``
(= ``n_heads``), ``head_dim`` (``d_model / n_heads``, unless the mixer has a ``head_dim`` option of its own or
names another in ``head_dim_option``: Mamba2's ``headdim``, whose heads split ``expand·d_model`` as fla's Mamba2's
do, ``num_heads · head_dim = expand · hidden_size``) and ``layer_idx`` (kept as an attribute, as fla layers keep
it).  Applied by :class:`FlaNamesMeta`, the metaclass of
:class:`~seqmem.mixers.base.Mixer`, before ``__init__`` runs, so every mixer class takes them."""

from __future__ import annotations

import inspect
import numbers
from typing import Any

FLA_NAMES = ("hidden_size", "num_heads", "head_dim", "layer_idx")


def _has_option(cls: type, name: str) -> bool:
    """Whether ``name`` is a parameter of ``cls.__init__`` or of a parent's that it forwards ``**kwargs`` to."""
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        params = inspect.signature(init).parameters
        if name in params:
            return True
        if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            return False
    return False


def _merge(cls: type, kwargs: dict[str, Any], ours: str, theirs: str, value: Any) -> None:
    """``kwargs[ours] = value`` unless ``ours`` already holds another value (a ``ValueError`` naming both)."""
    if ours in kwargs and kwargs[ours] != value:
        raise ValueError(f"{cls.__name__}: {theirs}={value!r} and {ours}={kwargs[ours]!r} disagree ({theirs} is "
                         f"flash-linear-attention's name for {ours}); give one of them")
    kwargs[ours] = value


def translate(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """``kwargs`` with fla's names replaced by seqmem's, checked against ``d_model`` given positionally
    (``args``: at most ``(d_model,)``), and the ``layer_idx`` given (or None)."""
    if len(args) > 1:
        raise TypeError(f"{cls.__name__}: with fla's argument names, give the options by keyword")
    kwargs = dict(kwargs)
    layer_idx = kwargs.pop("layer_idx", None)
    if "hidden_size" in kwargs:
        hidden = kwargs.pop("hidden_size")
        if args and args[0] != hidden:
            raise ValueError(f"{cls.__name__}: hidden_size={hidden!r} and d_model={args[0]!r} disagree "
                             "(hidden_size is flash-linear-attention's name for d_model); give one of them")
        if not args:
            _merge(cls, kwargs, "d_model", "hidden_size", hidden)
    if "num_heads" in kwargs:
        _merge(cls, kwargs, "n_heads", "num_heads", kwargs.pop("num_heads"))
    own = getattr(cls, "head_dim_option", None)
    if "head_dim" in kwargs and own is not None:
        _merge(cls, kwargs, own, "head_dim", kwargs.pop("head_dim"))
    if "head_dim" in kwargs and not _has_option(cls, "head_dim"):
        head_dim = kwargs.pop("head_dim")
        d = args[0] if args else kwargs.get("d_model")
        if d is None:
            raise ValueError(f"{cls.__name__}: head_dim={head_dim} needs hidden_size (or d_model)")
        if isinstance(head_dim, bool) or not isinstance(head_dim, numbers.Integral) or head_dim <= 0 or d % head_dim:
            raise ValueError(f"{cls.__name__}: head_dim={head_dim!r} must be a positive divisor of d_model={d} "
                             "(seqmem's heads split d_model: head_dim = d_model / n_heads)")
        if "n_heads" in kwargs and kwargs["n_heads"] * head_dim != d:
            raise ValueError(f"{cls.__name__}: head_dim={head_dim} × n_heads={kwargs['n_heads']} must equal "
                             f"d_model={d} (seqmem's heads split d_model)")
        kwargs["n_heads"] = int(d // head_dim)
    return kwargs, layer_idx


class FlaNamesMeta(type):
    """Metaclass translating fla's constructor names (:func:`translate`) before ``__init__``."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if not any(k in kwargs for k in FLA_NAMES):
            return super().__call__(*args, **kwargs)
        kwargs, layer_idx = translate(cls, args, kwargs)
        obj = super().__call__(*args, **kwargs)
        if layer_idx is not None:
            obj.layer_idx = layer_idx
        return obj
