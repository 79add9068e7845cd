"""Sweep specifications: a grid of training runs as data (TOML or JSON), validated and expanded to grid points.

A spec (see ``src/seqmem/experiments/*.toml``)::

    name = "compare"                       # names the default output directory runs/sweeps/<name>
    description = "one line"

    [task]                                 # the task and the options every setting shares
    name = "mqar"
    options = { vocab_size = 128 }

    [[settings]]                           # difficulty levels; each one's options are merged over task.options
    label = "4 pairs"
    options = { num_pairs = 4, seq_len = 64 }

    [model]                                # LMConfig fields; a list is an axis of the grid (d_model = [64, 128])
    d_model = [64, 128]
    n_layers = 2
    n_heads = 2

    [train]                                # TrainConfig fields, plus the grid's learning rates and seeds
    steps = 1000
    lrs = [1e-3, 3e-3, 1e-2]
    seeds = [0, 1, 2]
    valid_examples = 512                   # validation examples (choose the lr); eval_examples: reported ones
    lr_extend = 2                          # when the best lr (or one tied with it on validation) is the
                                           # largest (smallest) tried, also try that lr x lr_extend_factor
                                           # (/ factor), at most this many per side; under all_seeds a probe
                                           # with the first seed, which gets the other seeds only if it beats
                                           # the best lr's first seed or is within its seed spread
    lr_confirm = true                      # first_seed only: once the chosen lr has every seed, every lr whose
                                           # first-seed validation is within twice its seed std gets every seed
                                           # too, and the best validation mean over seeds among them is chosen
                                           # (with lr_extend, a mean-over-seeds choice at the grid's edge is
                                           # probed beyond it too, as the first-seed choice is)

    [[mixers]]                             # a registered name, or a table (or mixers = "all"):
    name = "mamba2+ska"                    #   a label, with
    layers = ["mamba2", "ska"]             #   one mixer per layer (a hybrid; n_layers must match)
    options = { rank = 16 }                #   options (per layer: a list of tables); override the length rule
    family = "echo"                        #   line/colour group in the plot (default: the first layer's mixer)
    tune = "exponential"                   #   first_seed only: rows sharing a tune group are one model with a
                                           #   hyperparameter (the rows' options) chosen on validation with the lr:
                                           #   only the group's best row gets the other seeds

    [notes]                                # optional: one line per mixer label, printed in the report
    "mamba2+ska" = "the Echo paper's hybrid"

    extra_metrics = ["hits_long/queries_long"]   # optional: more metrics of the reported split (a key, or a
                                           # ratio "a/b" of two), mean ± std over seeds per row

    [paper]                                # optional: the paper's numbers beside ours ("Paper vs ours" section)
    source = "Table 9 (3 seeds)"           #   where they come from
    scale = "2,000 steps; lr tuned"        #   how our scale differs
    "4 pairs" = { attention = 0.98, "mamba2+ska" = "not reported" }   # setting label -> {mixer label: value}
                                           # (a tune group's name: the value goes beside the group's chosen row)

The grid is settings × model axes × mixers × lrs × seeds; every point is one run directory
``<out>/<setting>/<mixer>/<model axes>/lr<lr>/seed<seed>`` holding the ``run.json`` that ``seqmem train`` would
write.  Options whose meaning is a length are scaled to each setting's sequence length by :data:`LENGTH_RULE`
(per-mixer facts: ``Mixer.length_options``); options given in the spec win.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: One rule for every option whose value is a length in tokens (``Mixer.length_options`` gives each option's
#: kind): value = max(1, floor(fraction · seq_len)).  Windows, blocks and compressed memories get a quarter of the
#: sequence (so they are exercised rather than covering the whole input; Elastic's N/L = 540/2048 ≈ 0.26), FIFO
#: queues half, and chunk-causal chunks an eighth (a query in chunk c sees chunks < c only, so a smaller chunk
#: loses less context; at T = 64 every query after the key-value block sees all of it).
LENGTH_RULE: dict[str, float] = {"window": 0.25, "block": 0.25, "memory": 0.25, "queue": 0.5, "chunk": 0.125}

PACKAGED_SPECS = Path(__file__).resolve().parent.parent / "experiments"

_TOP_KEYS = {"name", "description", "task", "settings", "model", "train", "mixers", "scale_lengths", "select",
             "lr_selection", "notes", "paper", "extra_metrics"}
#: ``"all_seeds"``: every lr × every seed, the lr with the best mean validation metric over seeds wins.
#: ``"first_seed"``: two stages — every lr with the first seed, then the other seeds only at the lr whose
#: first-seed run is best on validation (``len(lrs) + len(seeds) - 1`` runs per row instead of their product).
LR_SELECTIONS = ("all_seeds", "first_seed")
_TRAIN_GRID_KEYS = {"lrs", "seeds", "valid_examples", "lr_extend", "lr_extend_factor", "lr_confirm"}


class SpecError(ValueError):
    """A sweep specification that is malformed (a one-line message naming the key)."""


def length_rule_text() -> str:
    """The length rule in words, for reports."""
    parts = ", ".join(f"{k} {v:g}·T" for k, v in LENGTH_RULE.items())
    return f"options that are lengths are set to max(1, floor(f·T)) for sequence length T: {parts}"


def fair_options(mixer: str, seq_len: int) -> dict[str, Any]:
    """Options :data:`LENGTH_RULE` gives mixer ``mixer`` at sequence length ``seq_len``.

    An option switched off by the registered defaults (``attention``'s ``window=None``, ``vort_fixed_alpha``'s
    ``local_window=0``) stays off."""
    from seqmem import get_entry

    entry = get_entry(mixer)
    out: dict[str, Any] = {}
    for opt, kind in entry.cls.length_options.items():
        if kind not in LENGTH_RULE:
            raise ValueError(f"{entry.cls.__name__}.length_options[{opt!r}] has unknown kind {kind!r}")
        default = entry.defaults.get(opt, _init_default(entry.cls, opt))
        if default is None or default == 0:
            continue
        out[opt] = max(1, int(math.floor(LENGTH_RULE[kind] * seq_len)))
    return out


def _init_default(cls: type, opt: str) -> Any:
    import inspect

    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        p = inspect.signature(init).parameters.get(opt)
        if p is not None and p.default is not inspect.Parameter.empty:
            return p.default
    return None


def slug(value: Any) -> str:
    """A file-name-safe rendering of ``value`` (``"4 pairs, T=64"`` → ``4-pairs-T-64``; ``0.001`` → ``0.001``).

    Never ``.``, ``..`` or a hidden name (leading dots are dropped; nothing left: ``x``), never a separator.  A
    float is written with ``:g`` (six significant digits) when that reads back as the same number — the names of
    every existing run directory — and otherwise in full (``repr``: ``0.0010000001``), so two different values
    never share a name and a name always gives the value that was trained."""
    if isinstance(value, float):
        short = f"{value:g}"
        s = short if float(short) == value else repr(value)
    else:
        s = str(value)
    s = re.sub(r"[^A-Za-z0-9.+_-]+", "-", s).strip("-").lstrip(".-")
    return s or "x"


#: the most grid points a spec may expand to (each is a run directory); a larger grid is refused at validation,
#: before anything expands it (a 10⁶-point grid took minutes to list)
MAX_GRID = 10_000
#: seeds are 63-bit (torch's generators take no more)
MAX_SEED = 2**63 - 1


@dataclass(frozen=True)
class MixerRow:
    label: str
    layers: tuple[str, ...] | None  # None: the named mixer in every layer
    options: Any  # dict, or list of dicts (one per layer)
    family: str
    lrs: tuple[float, ...] | None
    #: tune group: rows that are one model whose hyperparameter (the rows' options) is chosen on validation, as the
    #: lr is; under ``first_seed`` selection only the group's best row (by its first seed at its chosen lr) gets the
    #: other seeds, the rest report their first seed.  None: a row of its own.
    tune: str | None = None


@dataclass
class Setting:
    label: str
    options: dict[str, Any]
    seq_len: int = 0
    vocab_size: int = 0


@dataclass(frozen=True)
class Point:
    """One grid point = one run directory."""

    setting: str
    mixer: str
    family: str
    model_axes: tuple[tuple[str, Any], ...]
    lr: float
    seed: int
    run_spec: dict[str, Any] = field(compare=False, hash=False)

    @property
    def rel_dir(self) -> Path:
        axes = "_".join(f"{k}{slug(v)}" for k, v in self.model_axes) or "model"
        return Path(slug(self.setting)) / slug(self.mixer) / axes / f"lr{slug(self.lr)}" / f"seed{self.seed}"

    @property
    def group(self) -> tuple[str, str, tuple[tuple[str, Any], ...]]:
        """Runs that differ only in lr and seed: one row of the report."""
        return (self.setting, self.mixer, self.model_axes)


@dataclass
class SweepSpec:
    name: str
    description: str
    task: str
    task_options: dict[str, Any]
    settings: list[Setting]
    model: dict[str, Any]
    model_axes: list[str]
    train: dict[str, Any]
    lrs: list[float]
    seeds: list[int]
    valid_examples: int
    mixers: list[MixerRow]
    scale_lengths: bool = True
    select: str = "accuracy"
    lr_selection: str = "all_seeds"
    lr_extend: int = 0
    lr_extend_factor: float = 3.0
    #: ``first_seed`` only: confirm the choice over seeds where another lr is within the seed spread on the first
    #: seed (:func:`seqmem.sweep.runner.confirm_runs`)
    lr_confirm: bool = False
    notes: dict[str, str] = field(default_factory=dict)
    #: the paper's numbers beside ours: ``{setting label: {mixer label: value or "text"}}``
    paper: dict[str, dict[str, float | str]] = field(default_factory=dict)
    #: where the paper's numbers come from (table / figure) and how our scale differs
    paper_source: str = ""
    paper_scale: str = ""
    #: more metrics of the reported split to tabulate (mean ± std over seeds at the chosen lr), e.g. per-bin accuracy
    extra_metrics: list[str] = field(default_factory=list)
    source: str = ""
    raw: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------------------------------------------------
    def layer_options(self, row: MixerRow, setting: Setting, n_layers: int) -> tuple[Any, list[str]]:
        """``(mixer, mixer_options)`` for the run config of ``row`` in ``setting``: the length rule, then the
        spec's options on top."""
        names = list(row.layers) if row.layers else [row.label] * n_layers
        given = row.options if isinstance(row.options, list) else [row.options] * len(names)
        opts = []
        for name, g in zip(names, given):
            o = fair_options(name, setting.seq_len) if self.scale_lengths else {}
            o.update(g)
            opts.append(o)
        if row.layers:
            return list(names), opts
        return names[0], opts[0]

    def tune_of(self, mixer: str) -> str | None:
        """The tune group of the row labelled ``mixer`` (None: a row of its own)."""
        return next((r.tune for r in self.mixers if r.label == mixer), None)

    def is_first_stage(self, p: Point) -> bool:
        """With ``lr_selection = "first_seed"``: whether ``p`` is one of the lr-selection runs (the first seed)."""
        return p.seed == self.seeds[0]

    def point_at(self, p: Point, lr: float, seed: int) -> Point:
        """The point of ``p``'s row at another learning rate and seed (equal to the grid's point if it has one)."""
        run = json.loads(json.dumps(p.run_spec))
        run["train"]["lr"], run["train"]["seed"] = lr, seed
        return Point(p.setting, p.mixer, p.family, p.model_axes, lr, seed, run)

    def points(self) -> list[Point]:
        """Every grid point, in the order settings → model axes → mixers → lrs → seeds."""
        pts: list[Point] = []
        axis_values = [self.model[a] for a in self.model_axes]
        for setting in self.settings:
            for combo in _product(axis_values):
                model = dict(self.model)
                model.update(dict(zip(self.model_axes, combo)))
                axes = tuple(zip(self.model_axes, combo))
                for row in self.mixers:
                    mixer, mopts = self.layer_options(row, setting, model["n_layers"])
                    for lr in row.lrs or self.lrs:
                        for seed in self.seeds:
                            run = {
                                "task": {"name": self.task, "options": {**self.task_options, **setting.options}},
                                "model": {**model, "mixer": mixer, "mixer_options": mopts},
                                "train": {**self.train, "lr": lr, "seed": seed},
                                "sweep": {"name": self.name, "setting": setting.label, "mixer": row.label,
                                          "family": row.family, "valid_examples": self.valid_examples,
                                          "select": self.select},
                            }
                            pts.append(Point(setting.label, row.label, row.family, axes, lr, seed,
                                             json.loads(json.dumps(run))))
        return pts


def _product(lists: list[list[Any]]) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = [()]
    for values in lists:
        out = [o + (v,) for o in out for v in values]
    return out


# ---------------------------------------------------------------------------------------------------- loading
def resolve_spec_path(spec: str | Path) -> Path:
    """A path to a spec file, or the name of a packaged spec (``compare`` → ``experiments/compare.toml``)."""
    p = Path(spec)
    if p.is_file():
        return p
    for ext in (".toml", ".json"):
        q = PACKAGED_SPECS / f"{spec}{ext}"
        if q.is_file():
            return q
    known = ", ".join(list_packaged_specs()) or "none"
    raise SpecError(f"sweep spec {str(spec)!r} is neither a file nor a packaged spec (packaged: {known})")


def list_packaged_specs() -> list[str]:
    if not PACKAGED_SPECS.is_dir():
        return []
    return sorted(p.stem for p in PACKAGED_SPECS.iterdir() if p.suffix in (".toml", ".json"))


def load_spec(spec: str | Path | dict[str, Any]) -> SweepSpec:
    """Read and validate a spec file (TOML or JSON), a packaged spec name, or an already-parsed dict."""
    if isinstance(spec, dict):
        return parse_spec(spec, "<dict>")
    path = resolve_spec_path(spec)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise SpecError(f"{path}: cannot read it ({e.strerror or e})") from None
    try:
        if path.suffix == ".json":
            raw = json.loads(text)
        else:
            import tomllib

            raw = tomllib.loads(text)
    except ValueError as e:  # tomllib.TOMLDecodeError and json.JSONDecodeError are ValueErrors
        raise SpecError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'TOML'}: {e}") from None
    except RecursionError:
        raise SpecError(f"{path}: nested too deeply to be a sweep spec") from None
    return parse_spec(raw, str(path))


def _need(cond: bool, where: str, msg: str) -> None:
    if not cond:
        raise SpecError(f"{where}: {msg}")


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def parse_spec(raw: dict[str, Any], source: str = "<spec>") -> SweepSpec:
    """Validate a parsed spec and fill in defaults; every error names the key."""
    from seqmem import get_entry, list_mixers
    from seqmem.models import LMConfig
    from seqmem.registry import ALIASES
    from seqmem.tasks import build_task
    from seqmem.train import TrainConfig

    w = source
    _need(isinstance(raw, dict), w, "a spec must be a table/object")
    unknown = set(raw) - _TOP_KEYS
    _need(not unknown, w, f"unknown key(s) {sorted(unknown)}; valid: {sorted(_TOP_KEYS)}")
    name = raw.get("name")
    _need(isinstance(name, str) and bool(re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]*", name or "")), w,
          "'name' must be a non-empty string of letters, digits, '.', '_' or '-' that does not start with '.'")
    description = raw.get("description", "")
    _need(isinstance(description, str), w, "'description' must be a string")

    task = raw.get("task")
    _need(isinstance(task, dict) and isinstance(task.get("name"), str), w, "[task] needs a 'name'")
    bad = set(task) - {"name", "options"}
    _need(not bad, w, f"[task] has unknown key(s) {sorted(bad)}")
    task_options = task.get("options", {})
    _need(isinstance(task_options, dict), w, "[task] options must be a table")

    settings_raw = raw.get("settings", [{"label": "default", "options": {}}])
    _need(isinstance(settings_raw, list) and settings_raw, w, "'settings' must be a non-empty list of tables")
    settings: list[Setting] = []
    for i, s in enumerate(settings_raw):
        where = f"{w}: settings[{i}]"
        _need(isinstance(s, dict) and isinstance(s.get("label"), str) and s["label"], where, "needs a 'label'")
        _need(not (set(s) - {"label", "options"}), where, f"unknown key(s) {sorted(set(s) - {'label', 'options'})}")
        opts = s.get("options", {})
        _need(isinstance(opts, dict), where, "'options' must be a table")
        try:
            t = build_task(task["name"], **{**task_options, **opts})
            if hasattr(t, "check_selection_split"):  # LM windows: lrs are chosen on eval_split's windows
                t.check_selection_split(t.eval_split)
        except (ValueError, TypeError) as e:
            raise SpecError(f"{where}: task {task['name']!r}: {e}") from None
        settings.append(Setting(s["label"], dict(opts), int(t.seq_len), int(t.vocab_size)))
    labels = [slug(s.label) for s in settings]
    _need(len(set(labels)) == len(labels), w, f"setting labels must be distinct (as directory names): {labels}")

    model = raw.get("model", {})
    _need(isinstance(model, dict), w, "[model] must be a table")
    model = dict(model)
    valid_model = set(LMConfig.__dataclass_fields__) - {"vocab_size", "mixer", "mixer_options"}
    bad = set(model) - valid_model
    _need(not bad, w, f"[model] has unknown key(s) {sorted(bad)}; valid: {sorted(valid_model)}")
    model.setdefault("n_layers", 2)
    model.setdefault("d_model", 64)
    model.setdefault("n_heads", 2)
    axes = [k for k, v in model.items() if isinstance(v, list)]
    for k in axes:
        _need(len(model[k]) > 0 and len(set(map(json.dumps, model[k]))) == len(model[k]), w,
              f"[model] {k} must list distinct values")
    _need("n_layers" not in axes, w, "[model] n_layers cannot be an axis (hybrids list one mixer per layer)")

    train = raw.get("train", {})
    _need(isinstance(train, dict), w, "[train] must be a table")
    train = dict(train)
    lrs = train.pop("lrs", None)
    seeds = train.pop("seeds", [0])
    valid_examples = train.pop("valid_examples", 512)
    lr_extend = train.pop("lr_extend", 0)
    lr_extend_factor = train.pop("lr_extend_factor", 3.0)
    lr_confirm = train.pop("lr_confirm", False)
    _need(isinstance(lr_confirm, bool), w, "[train] lr_confirm must be true or false")
    _need(isinstance(lr_extend, int) and not isinstance(lr_extend, bool) and lr_extend >= 0, w,
          "[train] lr_extend must be a non-negative integer (extra lrs per side when the best is at an edge)")
    _need(_is_num(lr_extend_factor) and lr_extend_factor > 1, w, "[train] lr_extend_factor must be a number > 1")
    _need(isinstance(lrs, list) and lrs and all(_is_num(x) and x > 0 for x in lrs), w,
          "[train] lrs must be a non-empty list of positive numbers")
    _need(len(set(map(float, lrs))) == len(lrs), w, f"[train] lrs must be distinct, got {lrs}")
    _need(isinstance(seeds, list) and seeds and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                     for s in seeds), w,
          "[train] seeds must be a non-empty list of non-negative integers")
    _need(len(set(seeds)) == len(seeds), w, "[train] seeds must be distinct")
    _need(max(seeds) <= MAX_SEED, w, f"[train] seeds must be at most 2**63 - 1, got {max(seeds)}")
    for k in ("steps", "batch_size", "checkpoint_every", "log_every"):
        if k in train:
            v = train[k]
            _need(isinstance(v, int) and not isinstance(v, bool) and v >= (0 if k == "checkpoint_every" else 1),
                  w, f"[train] {k} must be a {'non-negative' if k == 'checkpoint_every' else 'positive'} integer, "
                  f"got {v!r}")
    _need(isinstance(valid_examples, int) and not isinstance(valid_examples, bool) and valid_examples > 0, w,
          "[train] valid_examples must be a positive integer")
    for k in ("lr", "seed"):
        _need(k not in train, w, f"[train] {k!r}: give the grid's values as '{k}s'")
    valid_train = set(TrainConfig.__dataclass_fields__) - {"lr", "seed"}
    bad = set(train) - valid_train
    _need(not bad, w, f"[train] has unknown key(s) {sorted(bad)}; valid: {sorted(valid_train | _TRAIN_GRID_KEYS)}")
    train.setdefault("steps", 1000)
    train.setdefault("batch_size", 32)
    if "checkpoint_every" not in train:  # a killed run loses at most a fifth of its steps
        train["checkpoint_every"] = max(1, int(train["steps"]) // 5)
    train.setdefault("log_every", max(1, int(train["steps"]) // 20))
    try:
        TrainConfig(**{**train, "lr": lrs[0], "seed": seeds[0]})
    except (ValueError, TypeError) as e:
        raise SpecError(f"{w}: [train]: {e}") from None

    mixers_raw = raw.get("mixers")
    registered = set(list_mixers())
    if mixers_raw == "all":  # every registered mixer, registry-driven (the demo)
        mixers_raw = sorted(registered)
    _need(isinstance(mixers_raw, list) and mixers_raw, w, "'mixers' must be a non-empty list (or \"all\")")
    rows: list[MixerRow] = []
    for i, m in enumerate(mixers_raw):
        where = f"{w}: mixers[{i}]"
        if isinstance(m, str):
            m = {"name": m}
        _need(isinstance(m, dict) and isinstance(m.get("name"), str) and m["name"], where,
              "a mixer is a registered name or a table with a 'name'")
        bad = set(m) - {"name", "layers", "options", "family", "lrs", "tune"}
        _need(not bad, where, f"unknown key(s) {sorted(bad)}")
        layers = m.get("layers")
        if layers is not None:
            _need(isinstance(layers, list) and len(layers) == model["n_layers"], where,
                  f"'layers' must list one mixer per layer ({model['n_layers']})")
        names = layers or [m["name"]]
        for n in names:
            if n not in registered and n not in ALIASES:  # a deprecated name still builds (with a warning)
                from difflib import get_close_matches

                hint = get_close_matches(n, sorted(registered), n=1)
                raise SpecError(f"{where}: unknown mixer {n!r}" + (f" (did you mean {hint[0]!r}?)" if hint else ""))
        opts = m.get("options", {})
        if isinstance(opts, list):
            _need(layers is not None and len(opts) == len(layers) and all(isinstance(o, dict) for o in opts),
                  where, "per-layer 'options' need 'layers' and one table per layer")
        else:
            _need(isinstance(opts, dict), where, "'options' must be a table (or one per layer)")
        per_layer = opts if isinstance(opts, list) else [opts] * len(names)
        for n, o in zip(names, per_layer):
            valid = set(get_entry(n).valid_options())
            bad = set(o) - valid
            _need(not bad, where, f"mixer {n!r} has no option(s) {sorted(bad)}; valid: {sorted(valid)}")
        mlrs = m.get("lrs")
        if mlrs is not None:
            _need(isinstance(mlrs, list) and mlrs and all(_is_num(x) and x > 0 for x in mlrs), where,
                  "'lrs' must be a non-empty list of positive numbers")
            _need(len(set(map(float, mlrs))) == len(mlrs), where, f"'lrs' must be distinct, got {mlrs}")
        family = m.get("family", names[0])
        _need(isinstance(family, str), where, "'family' must be a string")
        tune = m.get("tune")
        _need(tune is None or (isinstance(tune, str) and tune.strip()), where,
              "'tune' must be a non-empty string (the name of the rows' tune group)")
        rows.append(MixerRow(m["name"], tuple(layers) if layers else None, opts, family,
                             tuple(mlrs) if mlrs else None, tune))
    mlabels = [slug(r.label) for r in rows]
    _need(len(set(mlabels)) == len(mlabels), w, f"mixer labels must be distinct: {mlabels}")

    scale = raw.get("scale_lengths", True)
    _need(isinstance(scale, bool), w, "'scale_lengths' must be true or false")
    select = raw.get("select", "accuracy")
    lr_selection = raw.get("lr_selection", "all_seeds")
    _need(lr_selection in LR_SELECTIONS, w, f"'lr_selection' must be one of {list(LR_SELECTIONS)}")
    tunes = {r.tune for r in rows if r.tune}
    _need(not (tunes and lr_selection != "first_seed"), w, "'tune' groups need lr_selection = \"first_seed\"")
    _need(not (lr_confirm and lr_selection != "first_seed"), w,
          "[train] lr_confirm needs lr_selection = \"first_seed\" (all_seeds already chooses on the mean over seeds)")
    _need(not (lr_confirm and tunes), w, "[train] lr_confirm is not supported with 'tune' groups")
    clash = tunes & {r.label for r in rows}
    _need(not clash, w, f"a tune group may not be named like a mixer row: {sorted(clash)}")
    notes = raw.get("notes", {})
    _need(isinstance(notes, dict) and all(isinstance(v, str) for v in notes.values()), w,
          "'notes' must be a table of mixer label = \"text\"")
    bad = set(notes) - {r.label for r in rows}
    _need(not bad, w, f"'notes' names mixers that are not rows: {sorted(bad)}")
    _need(select in ("accuracy", "loss"), w, "'select' must be 'accuracy' (highest) or 'loss' (lowest)")
    extra_metrics = raw.get("extra_metrics", [])
    _need(isinstance(extra_metrics, list) and all(isinstance(m, str) and m for m in extra_metrics)
          and len(set(extra_metrics)) == len(extra_metrics), w,
          "'extra_metrics' must be a list of distinct metric names (keys of the task's evaluation)")
    paper_raw = raw.get("paper", {})
    _need(isinstance(paper_raw, dict), w, "'paper' must be a table: source = \"...\", scale = \"...\" and "
          "one table per setting label of mixer label = value")
    paper_source, paper_scale = paper_raw.get("source", ""), paper_raw.get("scale", "")
    _need(isinstance(paper_source, str) and isinstance(paper_scale, str), w,
          "[paper] source and scale must be strings")
    paper: dict[str, dict[str, float | str]] = {}
    labels = {st.label for st in settings}
    for key, vals in paper_raw.items():
        if key in ("source", "scale"):
            continue
        _need(key in labels, w, f"[paper] names a setting that is not in the spec: {key!r} (settings: "
              f"{sorted(labels)})")
        _need(isinstance(vals, dict), w, f"[paper] {key!r} must be a table of mixer label = value")
        unknown = set(vals) - {r.label for r in rows} - tunes
        _need(not unknown, w, f"[paper] {key!r} names mixers that are not rows or tune groups: {sorted(unknown)}")
        for m, v in vals.items():
            ok = isinstance(v, str) or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))
            _need(ok, w, f"[paper] {key!r} {m!r}: a value must be a finite number or a string, got {v!r}")
        paper[key] = {m: (v if isinstance(v, str) else float(v)) for m, v in vals.items()}

    spec = SweepSpec(name=name, description=description, task=task["name"], task_options=dict(task_options),
                     settings=settings, model=model, model_axes=axes, train=train, lrs=[float(x) for x in lrs],
                     seeds=list(seeds), valid_examples=valid_examples, mixers=rows, scale_lengths=scale,
                     select=select, lr_selection=lr_selection, notes=dict(notes), source=source, raw=raw,
                     paper=paper, paper_source=paper_source, paper_scale=paper_scale,
                     extra_metrics=list(extra_metrics),
                     lr_extend=lr_extend, lr_extend_factor=float(lr_extend_factor), lr_confirm=lr_confirm)
    n_grid = len(settings) * math.prod(len(model[a]) for a in axes) * len(spec.seeds) * sum(
        len(r.lrs or spec.lrs) for r in rows)
    _need(n_grid <= MAX_GRID, w, f"the grid has {n_grid:,} points (runs), more than {MAX_GRID:,}: split the spec "
          "into several, or list fewer values")
    dirs: dict[Path, Point] = {}
    for p in spec.points():  # every point its own directory: values that differ never share one
        other = dirs.setdefault(p.rel_dir, p)
        _need(other is p, w, f"two grid points share the run directory {p.rel_dir} (values that name the same "
              "directory, e.g. 64 and 64.0): list each value once")
    # every mixer must build at every setting and model size (catches bad option values before any training)
    _check_builds(spec)
    return spec


def _check_builds(spec: SweepSpec) -> None:
    from seqmem.models import LMConfig

    axis_values = [spec.model[a] for a in spec.model_axes]
    for setting in spec.settings:
        for combo in _product(axis_values):
            model = {**spec.model, **dict(zip(spec.model_axes, combo))}
            for row in spec.mixers:
                mixer, mopts = spec.layer_options(row, setting, model["n_layers"])
                try:
                    cfg = LMConfig(vocab_size=setting.vocab_size, **model, mixer=mixer, mixer_options=mopts)
                    from seqmem.registry import build_mixer

                    for name, o in cfg.layers():
                        build_mixer(name, cfg.d_model, **{"n_heads": cfg.n_heads, **o})
                except (ValueError, TypeError) as e:
                    raise SpecError(f"{spec.source}: mixer {row.label!r} at setting {setting.label!r}, model "
                                    f"{dict(zip(spec.model_axes, combo))}: {e}") from None
