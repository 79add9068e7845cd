"""Pure functional ops on ``(batch, time, heads, dim)`` tensors.

Every op takes ``mode="recurrent"`` (the reference loop) or ``mode="chunk"`` (the fast form) and returns
``(output, final_state)``.  The state is a dict of named tensors (each op's docstring lists its keys and shapes)
that ``initial_state`` takes back to continue a sequence; a bare tensor, the former form, still works with a
DeprecationWarning.  Each module in this package lists its public functions in ``__all__``; they are
re-exported here, so ``seqmem.ops.delta_rule`` works for every op file without editing this one.  Name op
*files* differently from the functions they export (``delta.py`` exports ``delta_rule``).
"""

import importlib as _importlib
import pkgutil as _pkgutil

__all__: list[str] = []
for _m in sorted(_pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _m.name.startswith("_"):
        continue
    _mod = _importlib.import_module(f"{__name__}.{_m.name}")
    for _name in getattr(_mod, "__all__", []):
        if _name in __all__:
            raise ImportError(f"seqmem.ops: {_name!r} is exported by two op modules")
        globals()[_name] = getattr(_mod, _name)
        __all__.append(_name)

# which form an op takes (seqmem.backends), and the deprecated alias of lattice_minibatch: importable, not in __all__
from seqmem.ops._backends import record_forms, which_form  # noqa: E402, F401, I001
from seqmem.ops.lattice import lattice_chunked  # noqa: E402, F401
