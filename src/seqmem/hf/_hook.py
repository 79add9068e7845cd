"""Register ``model_type="seqmem"`` with ``transformers``' auto classes without importing ``transformers``.

:func:`install` (called by ``import seqmem``) registers at once the auto modules that are already imported, and
otherwise puts a tiny finder on ``sys.meta_path`` that registers right after ``transformers`` loads
``models.auto.configuration_auto`` (→ ``AutoConfig``) and ``models.auto.modeling_auto`` (→
``AutoModelForCausalLM``).  So ``import seqmem`` stays as fast as before, and ``AutoModelForCausalLM.from_pretrained``
works on a saved seqmem model in any process that imported ``seqmem``.  ``SEQMEM_NO_HF=1`` disables it.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

_CONFIG_MOD = "transformers.models.auto.configuration_auto"
_MODEL_MOD = "transformers.models.auto.modeling_auto"
_done: set[str] = set()


def _register_config() -> None:
    if "config" in _done:
        return
    from transformers.models.auto.configuration_auto import AutoConfig

    from seqmem.hf.configuration_seqmem import SeqmemConfig

    AutoConfig.register("seqmem", SeqmemConfig, exist_ok=True)
    _done.add("config")


def _register_model() -> None:
    if "model" in _done:
        return
    _register_config()
    from transformers.models.auto.modeling_auto import AutoModel, AutoModelForCausalLM

    from seqmem.hf.configuration_seqmem import SeqmemConfig
    from seqmem.hf.modeling_seqmem import SeqmemForCausalLM, SeqmemModel

    AutoModel.register(SeqmemConfig, SeqmemModel, exist_ok=True)
    AutoModelForCausalLM.register(SeqmemConfig, SeqmemForCausalLM, exist_ok=True)
    _done.add("model")


def register() -> None:
    """Register ``seqmem`` with ``AutoConfig``, ``AutoModel`` and ``AutoModelForCausalLM`` now (imports
    ``transformers``)."""
    _register_config()
    _register_model()


_CALLBACKS: dict[str, Callable[[], None]] = {_CONFIG_MOD: _register_config, _MODEL_MOD: _register_model}


def _safe(cb: Callable[[], None]) -> None:
    try:
        cb()
    except Exception as e:  # never break the user's import of transformers
        warnings.warn(f"seqmem: could not register with transformers ({type(e).__name__}: {e})", stacklevel=2)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, callback: Callable[[], None]) -> None:
        self._inner, self._callback = inner, callback

    def create_module(self, spec):  # noqa: ANN001
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:  # noqa: ANN001
        self._inner.exec_module(module)
        _safe(self._callback)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... of the real loader
        return getattr(self._inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path, target=None):  # noqa: ANN001
        cb = _CALLBACKS.get(fullname)
        if cb is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, cb)
                return spec
        return None


def install() -> None:
    """Arrange registration with ``transformers`` (see the module docstring); cheap, idempotent."""
    if os.environ.get("SEQMEM_NO_HF"):
        return
    if _CONFIG_MOD in sys.modules:
        _safe(_register_config)
    if _MODEL_MOD in sys.modules:
        _safe(_register_model)
    if len(_done) == 2 or any(isinstance(f, _Finder) for f in sys.meta_path):
        return
    if importlib.util.find_spec("transformers") is None:
        return
    sys.meta_path.insert(0, _Finder())
