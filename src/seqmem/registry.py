"""Name → mixer registry.  ``@register("name", **defaults)`` on a :class:`~seqmem.mixers.base.Mixer` subclass.

The same class may be registered under several names with different default options (variants).  Every module in
``seqmem.mixers`` is imported on first use, so a new mixer file only needs its ``@register`` line.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from seqmem.io import import_submodules
from seqmem.mixers.base import FACT_KEYS, Mixer


@dataclass(frozen=True)
class MixerEntry:
    name: str
    cls: type[Mixer]
    defaults: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    #: Per-name facts given to ``register(..., facts=)``, merged over the class's ``Mixer.facts``.
    own_facts: dict[str, Any] = field(default_factory=dict)

    @property
    def facts(self) -> dict[str, Any]:
        """What the tests and benchmarks know about this mixer (keys in :attr:`seqmem.mixers.base.Mixer.facts`):
        the class's ``facts`` with this name's ``register(..., facts=)`` merged over them."""
        return {**self.cls.facts, **self.own_facts}

    def _init_params(self) -> list[tuple[type[Mixer], list[inspect.Parameter], bool]]:
        """Per class of the MRO that is a mixer, most derived first: its ``__init__``'s own options (not ``self``,
        ``d_model`` or ``*args`` / ``**kwargs``) and whether it forwards ``**kwargs`` to its parent's."""
        out = []
        for klass in self.cls.__mro__:
            if klass is object or not issubclass(klass, Mixer):
                continue
            params = inspect.signature(klass.__init__).parameters.values()
            own = [p for p in params
                   if p.name not in ("self", "d_model") and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
            out.append((klass, own, any(p.kind == p.VAR_KEYWORD for p in params)))
        return out

    def valid_options(self) -> list[str]:
        """The constructor options, from the class's ``__init__`` and its parents'.  A class whose ``__init__``
        forwards ``**kwargs`` to its parent's lists its own options after the parent's (the order of a signature
        that spelled them all out)."""
        opts: list[str] = []
        after: list[str] = []  # own options of classes that forward **kwargs: they follow their parents'
        for _, own, forwards in self._init_params():
            names = [p.name for p in own]
            if forwards:
                after = names + after
            else:
                opts += [pname for pname in names if pname not in opts]
        return opts + [pname for pname in after if pname not in opts]

    def default_options(self) -> dict[str, Any]:
        """Every constructor option that has a default, with the value the built mixer gets when it is not given:
        the most derived ``__init__``'s default, then this name's registered defaults over them."""
        full: dict[str, Any] = {}
        for _, own, _ in reversed(self._init_params()):  # parents first: a subclass's default wins
            full.update({p.name: p.default for p in own if p.default is not p.empty})
        return {**full, **self.defaults}


def did_you_mean(word: str, choices: Any) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` to a mistyped ``word`` (difflib), else ``""``."""
    import difflib

    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_name(kind: str, name: str, known: Any) -> ValueError:
    """The error for a name no ``kind`` (``"mixer"``, ``"task"``) is registered under: the closest registered name
    (:func:`did_you_mean`) and all of them."""
    return ValueError(f"unknown {kind} {name!r}{did_you_mean(name, known)}; registered {kind}s: "
                      f"{', '.join(sorted(known))}")


_REGISTRY: dict[str, MixerEntry] = {}
#: Deprecated names -> current names (still built, with a DeprecationWarning, so older run.json files load).
ALIASES: dict[str, str] = {}


def _summary(doc: str) -> str:
    """The first paragraph of a docstring on one line (a summary wrapped over several lines is not cut)."""
    return " ".join(doc.split("\n\n")[0].split())


def register(name: str, description: str = "", facts: dict[str, Any] | None = None, **defaults: Any):
    """Class decorator registering a mixer under ``name`` with default options ``defaults``.

    ``facts`` (optional) holds this name's values of the keys documented on :attr:`Mixer.facts` (state-growth
    promise, numerics bounds, gradcheck cases), merged over the class's own ``facts``: variants registered on one
    class under several names give their per-name values here."""

    def deco(cls: type[Mixer]) -> type[Mixer]:
        if name in _REGISTRY and _REGISTRY[name].cls is not cls:
            raise ValueError(f"mixer name {name!r} registered twice ({_REGISTRY[name].cls} and {cls})")
        unknown = sorted(set(facts or {}) - set(FACT_KEYS))
        if unknown:
            raise ValueError(f"register({name!r}): unknown facts {unknown}; known: {list(FACT_KEYS)}")
        doc = description or _summary(inspect.getdoc(cls) or "")
        _REGISTRY[name] = MixerEntry(name, cls, dict(defaults), doc, dict(facts or {}))
        return cls

    return deco


def deprecated_alias(old: str, new: str) -> None:
    """Keep ``old`` building the mixer now registered as ``new`` (with a DeprecationWarning); ``old`` is not listed
    by :func:`list_mixers`."""
    ALIASES[old] = new


def resolve_name(name: str) -> str:
    """``name``, or the current name of a deprecated alias (warning once per call site)."""
    if name in ALIASES:
        import warnings

        warnings.warn(f"mixer name {name!r} is deprecated; use {ALIASES[name]!r}", DeprecationWarning, stacklevel=3)
        return ALIASES[name]
    return name


def unregister(name: str) -> None:
    """Remove ``name`` from the registry (for mechanisms registered for a while only, e.g. in tests)."""
    _REGISTRY.pop(name, None)


def mixer_facts(name: str) -> dict[str, Any]:
    """The facts of the mixer registered as ``name`` (see :attr:`seqmem.mixers.base.Mixer.facts`)."""
    return get_entry(name).facts


def _load_all() -> None:
    import_submodules("seqmem.mixers")  # once (cached)


def list_mixers() -> list[str]:
    """Names of all registered mixers, sorted."""
    _load_all()
    return sorted(_REGISTRY)


def layer_identity(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """The layer that mixer ``name`` with ``options`` builds, as data: its class and every constructor option (the
    signature's defaults, then the name's registered defaults, then ``options``), canonicalised by the class
    (:meth:`Mixer.canonical_options`).  Two (name, options) pairs with equal identities build the same layer,
    whatever the names: ``vort`` with ``alpha_mode="fixed"`` and ``vort_fixed_alpha``, or a linear-family layer
    with ``conv_size`` 0 and None.  Unknown names or options raise ``ValueError``."""
    entry = check_options(name, options)
    return {"class": f"{entry.cls.__module__}.{entry.cls.__qualname__}",
            "options": entry.cls.canonical_options({**entry.default_options(), **options})}


def get_entry(name: str) -> MixerEntry:
    _load_all()
    name = resolve_name(name)
    if name not in _REGISTRY:
        raise unknown_name("mixer", name, _REGISTRY)
    return _REGISTRY[name]


def check_options(name: str, options: Any) -> MixerEntry:
    """The entry of mixer ``name``, after checking that it takes every option named in ``options`` (a
    ``ValueError`` lists the unknown ones, with close matches, and the valid ones); the values are not checked."""
    entry = get_entry(name)
    valid = entry.valid_options()
    unknown = sorted(set(options) - set(valid))
    if unknown:
        hints = "".join(did_you_mean(u, valid) for u in unknown)
        raise ValueError(f"mixer {name!r} got unknown option(s) {unknown}{hints}; valid options: {valid}")
    return entry


def build_mixer(name: str, d_model: int, **options: Any) -> Mixer:
    """Build the mixer registered as ``name``; unknown options raise ``ValueError`` listing the valid ones."""
    entry = check_options(name, options)
    kwargs = {**entry.defaults, **options}
    mixer = entry.cls(d_model, **kwargs)
    mixer.registered_name = entry.name
    return mixer
