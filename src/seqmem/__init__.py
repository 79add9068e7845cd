"""seqmem — constant-size long-context memory layers for sequence models, on one contract and one harness."""

from seqmem.mixers.base import Mixer, NonFiniteError, State, count_state, set_check_finite, state_to
from seqmem.registry import build_mixer, get_entry, list_mixers, register

__version__ = "0.1.0"
__all__ = [
    "Mixer",
    "NonFiniteError",
    "State",
    "build_mixer",
    "count_state",
    "get_entry",
    "list_mixers",
    "register",
    "set_check_finite",
    "state_to",
]

