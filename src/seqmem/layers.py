"""Every seqmem token mixer as a plain ``torch.nn.Module`` class, for use in a model of your own, plus adapters to
the conventions users bring (see docs/use-a-layer.md).

* ``from seqmem.layers import GatedDeltaNet, VLA, ...``: every registered mixer class (``__all__`` lists them).
  The contract: ``y, state = layer(x, state=None)`` with ``x`` (batch, time, d_model); ``state`` continues a
  sequence.  Constructors take ``d_model``/``n_heads`` or fla's ``hidden_size``/``num_heads``/``head_dim``/
  ``layer_idx``.
* :class:`ZoologyMixer`: zoology's sequence-mixer convention (``forward(x) -> y``,
  ``state_size(sequence_length=...)``), built from a registered mixer name.
* :func:`build_mixer`: a mixer by registered name (variants with their default options, e.g. ``"swa"``).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from seqmem.mixers.base import Mixer
from seqmem.registry import build_mixer, get_entry, list_mixers

_CLASSES: dict[str, type[Mixer]] = {}
for _name in list_mixers():
    _CLASSES.setdefault(get_entry(_name).cls.__name__, get_entry(_name).cls)
globals().update(_CLASSES)


class ZoologyMixer(nn.Module):
    """A seqmem mixer in zoology's sequence-mixer convention: ``ZoologyMixer(d_model, layer_idx=None,
    mixer="gated_deltanet", **options)``, ``forward(x) -> y`` (the state is dropped: zoology trains on whole
    sequences), ``state_size(sequence_length=...)`` the numbers of recurrent state per sequence (per batch row).

    In a zoology config: ``ModuleConfig(name="seqmem.layers.ZoologyMixer", kwargs={"mixer": "vla", "n_heads": 2})``
    (zoology passes ``d_model`` and ``layer_idx``)."""

    def __init__(self, d_model: int, layer_idx: int | None = None, mixer: str = "gated_deltanet",
                 **options: Any) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.mixer = build_mixer(mixer, d_model, **options)

    def forward(self, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        if args or kwargs:
            raise TypeError(f"ZoologyMixer.forward takes x only, got {len(args)} more positional argument(s) and "
                            f"keyword(s) {sorted(kwargs)}")
        y, _ = self.mixer(x)
        return y

    def state_size(self, sequence_length: int = 2048, **kwargs: Any) -> int:
        if kwargs:
            raise TypeError(f"ZoologyMixer.state_size: unexpected keyword argument(s) {sorted(kwargs)}")
        return int(self.mixer.state_size(sequence_length))


__all__ = sorted(_CLASSES) + ["Mixer", "ZoologyMixer", "build_mixer"]
