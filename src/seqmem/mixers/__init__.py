"""The token mixers.  Every registered mixer class is importable from here by its class name
(``from seqmem.mixers import GatedDeltaNet``), loaded on first access so ``import seqmem`` stays light;
:mod:`seqmem.layers` imports them all at once.  Constructors take seqmem's names (``d_model``, ``n_heads``) or
flash-linear-attention's (``hidden_size``, ``num_heads``, ``head_dim``, ``layer_idx``)."""

from __future__ import annotations

from typing import Any


def _classes() -> dict[str, type]:
    """Class name -> class of every registered mixer (importing every mixer module once)."""
    from seqmem.registry import get_entry, list_mixers

    out: dict[str, type] = {}
    for name in list_mixers():
        cls = get_entry(name).cls
        out.setdefault(cls.__name__, cls)
    return out


def __getattr__(name: str) -> Any:
    if name.startswith("_") or not name[:1].isupper():
        raise AttributeError(f"module 'seqmem.mixers' has no attribute {name!r}")
    if name == "Mixer":
        from seqmem.mixers.base import Mixer

        return Mixer
    classes = _classes()
    if name in classes:
        return classes[name]
    from seqmem.registry import did_you_mean

    raise AttributeError(f"module 'seqmem.mixers' has no attribute {name!r}{did_you_mean(name, classes)}; mixer "
                         f"classes: {', '.join(sorted(classes))}")


def __dir__() -> list[str]:
    return sorted({*globals(), "Mixer", *_classes()})
