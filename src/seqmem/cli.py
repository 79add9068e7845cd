"""``seqmem`` command line: list, train, eval, export-hf, eval-harness, demo, sweep, plot, repro, bench.

Bad arguments print one line on stderr and exit with code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import pkgutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from seqmem.cliargs import (  # noqa: E402  (re-exported: the names older code imports from seqmem.cli)
    UsageError,
    _Parser,
    apply_threads,
    check_device,
    check_out_dir,
    nonnegative_int,
    out_file,
    out_path,
    parse_options,
    positive_float,
    positive_int,
    threads_note,
)
from seqmem.clihelp import add_deprecated_alias, finish_parser
from seqmem.io import MissingExtra

_positive_int, _positive_float, _out_path, _check_out_dir = positive_int, positive_float, out_path, check_out_dir
_out_file = out_file
__all__ = ["UsageError", "build_run", "main", "make_parser", "parse_options"]


def default_checkpoint_every(steps: int) -> int:
    """``--checkpoint-every`` when not given: about ten checkpoints per run, at least every 1,000 steps, so a killed
    run can resume (``max(1, min(steps // 10, 1000))``)."""
    return max(1, min(steps // 10, 1000))


# ----------------------------------------------------------------------------------------------------------- list
def cmd_list(args: argparse.Namespace) -> int:
    import seqmem

    rows = []
    for name in seqmem.list_mixers():
        m = seqmem.build_mixer(name, args.d_model, n_heads=args.heads)
        rows.append((name, m.state_size(args.context), sum(p.numel() for p in m.parameters()),
                     seqmem.get_entry(name).description))
    w = max(len(r[0]) for r in rows)
    print(f"{'mixer':<{w}}  {'state@' + str(args.context):>12}  {'params':>9}  description")
    for name, s, p, d in rows:
        print(f"{name:<{w}}  {s:>12,}  {p:>9,}  {d}")
    print(f"(d_model={args.d_model}, n_heads={args.heads}; state = numbers per sequence after {args.context} tokens)")
    return 0


# ---------------------------------------------------------------------------------------------------------- train
# Defaults of `seqmem train` that depend on --task (argparse default None). MQAR's are the demo's sizes, which
# attention learns to ~1.0 accuracy in about a minute on 2 CPU cores; the MQAR task's own defaults (vocab 8192,
# 8 pairs) need far longer runs.
TRAIN_TASK_DEFAULTS: dict[str, dict[str, Any]] = {
    "mqar": {"d_model": 128, "steps": 800, "lr": 2e-3, "vocab": 32, "num_pairs": 4, "seq_len": 32},
    "lm": {"d_model": 64, "steps": 1000, "lr": 1e-3},
}


def _task_default_help(key: str, text: str, **task_own: Any) -> str:
    """``text (default: mqar: X; lm: Y)`` from TRAIN_TASK_DEFAULTS (``task_own``: a task's own default)."""
    per = {t: d[key] for t, d in TRAIN_TASK_DEFAULTS.items() if key in d} | task_own
    return f"{text} (default: " + "; ".join(f"{t}: {v:g}" if isinstance(v, float) else f"{t}: {v}"
                                            for t, v in per.items()) + ")"


def _fill_task_defaults(args: argparse.Namespace) -> None:
    """Options left at None take --task's default from TRAIN_TASK_DEFAULTS (the options filled are recorded in
    ``args.task_defaults_filled``: they were not given)."""
    filled = set(getattr(args, "task_defaults_filled", ()))
    for key, value in TRAIN_TASK_DEFAULTS.get(args.task, {}).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
            filled.add(key)
    args.task_defaults_filled = filled


def _given(args: argparse.Namespace, dest: str) -> bool:
    """Whether option ``dest`` was given on the command line (not a --task default, not taken from --config)."""
    return (getattr(args, dest, None) is not None and dest not in getattr(args, "task_defaults_filled", ())
            and dest not in getattr(args, "from_config", ()))


def _flag_option(args: argparse.Namespace, opts: dict[str, Any], key: str, flag: str, dest: str) -> None:
    """``opts[key]`` = the value of option ``flag`` (``args.<dest>``, when set) unless ``--task-option key=...`` set
    it: then the two must agree if the flag was given on the command line (a --task default or a --config value
    gives way to the task option)."""
    value = getattr(args, dest, None)
    if value is None:
        return
    if key in opts and opts[key] != value and _given(args, dest):
        raise UsageError(f"{flag} {value} and --task-option {key}={json.dumps(opts[key])} disagree; give one of them")
    opts.setdefault(key, value)


def _task_from_args(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    # a task flag another task has no use for is an error, not silently dropped from the run
    own = {"mqar": (("--vocab-size", "vocab"), ("--num-pairs", "num_pairs")), "lm": (("--corpus", "corpus"),)}
    for task, flags in own.items():
        given = [flag for flag, dest in flags if getattr(args, dest, None) is not None]
        if args.task != task and given:
            raise UsageError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to --task {task} only "
                             f"(this run is --task {args.task}; its own options go in --task-option KEY=VALUE)")
    _fill_task_defaults(args)
    opts = {**getattr(args, "config_task_options", {}), **parse_options(args.task_option)}
    if args.task != "lm" and (getattr(args, "dataset", None) is not None or getattr(args, "tokenizer", None)
                              not in (None, "byte")):
        raise UsageError("--dataset and --tokenizer apply to --task lm only")
    _flag_option(args, opts, "seq_len", "--seq-len", "seq_len")
    if args.task == "mqar":
        _flag_option(args, opts, "vocab_size", "--vocab-size", "vocab")
        _flag_option(args, opts, "num_pairs", "--num-pairs", "num_pairs")
    elif args.task == "lm":
        tokenizer = getattr(args, "tokenizer", None)
        dataset = getattr(args, "dataset", None)
        if dataset is not None or tokenizer not in (None, "byte"):
            # real datasets and/or non-byte tokenizers: the "text" task (seqmem.tasks.text)
            if dataset is not None and args.corpus is not None:
                raise UsageError("give either --dataset or --corpus, not both")
            _flag_option(args, opts, "dataset", "--dataset", "dataset")
            _flag_option(args, opts, "dataset", "--corpus", "corpus")
            opts.setdefault("dataset", "code")
            _flag_option(args, opts, "tokenizer", "--tokenizer", "tokenizer")
            opts.setdefault("tokenizer", "byte")
            return "text", opts
        _flag_option(args, opts, "corpus", "--corpus", "corpus")
    return args.task, opts


from seqmem.train.run import build_run  # noqa: E402  (re-exported: seqmem.cli.build_run)

#: run.json "model" keys with a flag of their own (the others — tie_embeddings, norm_eps, init_std — are carried)
_MODEL_FLAGS = {"d_model": "d_model", "n_layers": "layers", "n_heads": "heads", "mlp_ratio": "mlp_ratio"}


def config_defaults(path: str | Path) -> dict[str, Any]:
    """``seqmem train --config RUN.json``: the train sub-command's defaults (argparse dests) that reproduce the run
    described by a ``run.json`` (written by ``seqmem train`` or ``seqmem sweep``; other sections are ignored)."""
    from seqmem.train import TrainConfig
    from seqmem.train.checkpoint import read_run_spec

    path = Path(path)
    if path.is_dir():
        path = path / "run.json"
    if not path.is_file():
        raise UsageError(f"--config {path}: no such file (give a run.json or a run directory)")
    spec = read_run_spec(path.parent) if path.name == "run.json" else None
    if spec is None:
        try:
            spec = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UsageError(f"--config {path}: not a JSON run specification ({e})") from None
        if not isinstance(spec, dict) or not all(isinstance(spec.get(k), dict) for k in ("task", "model")):
            raise UsageError(f"--config {path}: not a run specification with 'task' and 'model' objects")
    out: dict[str, Any] = {}
    # a misspelt section or task key would otherwise be dropped and the run trained with defaults
    unknown = sorted(set(spec) - {"task", "model", "train", "sweep"})
    if unknown:
        raise UsageError(f"--config {path}: unknown section(s) {unknown} (a run.json has task, model, train and, "
                         "from a sweep, sweep)")
    task = spec["task"]
    unknown = sorted(set(task) - {"name", "options"})
    if unknown:
        raise UsageError(f"--config {path}: task: unknown key(s) {unknown} (a task has a name and options)")
    name, opts = task.get("name"), dict(task.get("options") or {})
    if not isinstance(name, str):
        raise UsageError(f"--config {path}: task has no name")
    if name == "text":  # --task lm with --dataset/--tokenizer
        out["task"] = "lm"
        out["dataset"] = opts.pop("dataset", None)
        out["tokenizer"] = opts.pop("tokenizer", "byte")
    else:
        out["task"] = name
    flags = {"seq_len": "seq_len"}  # task options with a flag of their own; the rest stay task options
    flags.update({"mqar": {"vocab_size": "vocab", "num_pairs": "num_pairs"}, "lm": {"corpus": "corpus"}}.get(name, {}))
    for key, dest in flags.items():
        if key in opts:
            out[dest] = opts.pop(key)
    out["config_task_options"] = opts
    model = dict(spec["model"])
    mixer = model.pop("mixer", None)
    if mixer is not None:
        out["mixer"] = ",".join(mixer) if isinstance(mixer, list) else mixer
    out["config_mixer_options"] = model.pop("mixer_options", {}) or {}
    for key, dest in _MODEL_FLAGS.items():
        if key in model:
            out[dest] = model.pop(key)
    model.pop("vocab_size", None)  # always the task's
    out["config_model_extra"] = model
    fields = set(TrainConfig.__dataclass_fields__)
    if not isinstance(spec.get("train") or {}, dict):
        raise UsageError(f"--config {path}: 'train' must be an object of training fields")
    train = dict(spec.get("train") or {})
    unknown = sorted(set(train) - fields)
    if unknown:
        raise UsageError(f"--config {path}: unknown training field(s) {unknown}")
    try:  # the types and ranges of every field, before argparse takes them as defaults unchecked
        TrainConfig(**{"lr": 1e-3, **train})
    except (TypeError, ValueError) as e:
        raise UsageError(f"--config {path}: train: {e}") from None
    for key, dest in _MODEL_FLAGS.items():
        v = out.get(dest)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int if key != "mlp_ratio" else (int, float))
                              or not v > 0):
            raise UsageError(f"--config {path}: model {key} must be a positive "
                             f"{'number' if key == 'mlp_ratio' else 'integer'}, got {v!r}")
    out.update(train)
    return out


def _check_train_required(args: argparse.Namespace) -> None:
    missing = [flag for flag, dest in (("--task", "task"), ("--mixer", "mixer")) if getattr(args, dest) is None]
    if missing:
        raise UsageError(f"the following arguments are required: {', '.join(missing)} (or --config RUN.json)")


def _init_distributed(device: str) -> tuple[int, int, str]:
    """Under ``torchrun`` (``WORLD_SIZE`` > 1): join the process group — NCCL with one GPU per rank
    (``cuda:$LOCAL_RANK``) when ``--device cuda``, else gloo — and return ``(rank, world_size, device)``."""
    import os

    import torch

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1, device
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise UsageError("--device cuda but no GPU is available")
        torch.cuda.set_device(local)
        device, backend = f"cuda:{local}", "nccl"
    else:
        backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend)
    return dist.get_rank(), dist.get_world_size(), device


def cmd_train(args: argparse.Namespace) -> int:
    _check_train_required(args)
    _fill_task_defaults(args)  # --steps, --lr, ... left unset take --task's defaults before anything reads them
    check_device(args.device)
    rank, world, device = _init_distributed(args.device)
    try:
        return _train(args, rank, world, device)
    finally:
        if world > 1:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


@contextlib.contextmanager
def _finite_checks(args: argparse.Namespace) -> Iterator[None]:
    """The mixers' non-finite checks on for the command (off with ``--no-check-finite``), restored afterwards."""
    from seqmem.mixers.base import set_check_finite

    prev = set_check_finite(not getattr(args, "no_check_finite", False))
    try:
        yield
    finally:
        set_check_finite(prev)


def _train(args: argparse.Namespace, rank: int, world: int, device: str) -> int:
    with _finite_checks(args):
        return _train_checked(args, rank, world, device)


def _train_checked(args: argparse.Namespace, rank: int, world: int, device: str) -> int:
    from seqmem.io import LOCK, run_lock
    from seqmem.train.checkpoint import holds_run, list_checkpoints, read_run_spec

    out = Path(args.out)
    if rank != 0:  # rank 0 checks and locks the directory; every rank resolves the same checkpoint interval
        _resolve_checkpoint_every(args, out, read_run_spec)
        return _train_into(args, rank, world, device, out)
    overwrite = getattr(args, "overwrite", False)
    if args.resume and overwrite:
        raise UsageError("give --resume or --overwrite, not both")
    created = _first_missing(out)  # removed again if this run fails before its first checkpoint
    lock_was_there = (out / LOCK).exists()
    ours = False  # whether this process holds the directory's lock (only then is anything cleaned up)
    try:
        # a second `seqmem train` (or sweep) into the same directory while one trains there is refused
        with run_lock(_check_out_dir(out)) as ours:
            if not ours:
                raise UsageError(f"another process is training into {out} now: wait for it to end (then --resume "
                                 "continues its run), or choose another --out")
            if not args.resume and not overwrite and holds_run(out):
                raise UsageError(f"{out} already holds a training run: --resume continues it, --overwrite replaces "
                                 "it, or choose another --out")
            _resolve_checkpoint_every(args, out, read_run_spec)
            return _train_into(args, rank, world, device, out)
    except BaseException:
        if ours and not list_checkpoints(out / "checkpoints"):
            if created is not None:
                import shutil

                shutil.rmtree(created, ignore_errors=True)
            elif not lock_was_there:  # an existing directory is left as it was found
                (out / LOCK).unlink(missing_ok=True)
        raise


def _resolve_checkpoint_every(args: argparse.Namespace, out: Path, read_run_spec: Any) -> None:
    """``--checkpoint-every`` when not given: on ``--resume`` the run's own interval (0 in runs from before the
    default), else :func:`default_checkpoint_every`.  Every ``torchrun`` rank resolves it the same way (the ranks
    share the run directory, as ``--resume`` already requires), so all of them checkpoint at the same steps."""
    if args.resume and (out / "run.json").exists():
        old = read_run_spec(out)  # a corrupt run.json: one line naming it
        if args.checkpoint_every is None:
            args.checkpoint_every = old.get("train", {}).get("checkpoint_every")
    if args.checkpoint_every is None:
        args.checkpoint_every = default_checkpoint_every(args.steps)


def _first_missing(path: Path) -> Path | None:
    """The outermost directory of ``path`` (``path`` itself included) that does not exist yet, else ``None``."""
    path = Path(path).absolute()
    if path.exists():
        return None
    while not path.parent.exists():
        path = path.parent
    return path


def _train_into(args: argparse.Namespace, rank: int, world: int, device: str, out: Path) -> int:
    import torch

    from seqmem.repro.common import atomic_write_text
    from seqmem.train import TrainConfig, train
    from seqmem.train.checkpoint import remove_run
    from seqmem.train.loop import with_defaults
    from seqmem.train.tracking import make_loggers

    main = rank == 0
    mixers = args.mixer.split(",")
    task_name, task_opts = _task_from_args(args)
    mixer_options: dict[str, Any] | list[dict[str, Any]] = getattr(args, "config_mixer_options", {})
    if isinstance(mixer_options, list):  # per-layer options from --config
        if args.mixer_option:
            raise UsageError("--mixer-option cannot be combined with the per-layer mixer_options of --config")
    else:
        mixer_options = {**mixer_options, **parse_options(args.mixer_option)}
    spec = {
        "task": {"name": task_name, "options": task_opts},
        "model": {
            "d_model": args.d_model, "n_layers": args.layers, "n_heads": args.heads,
            "mixer": mixers if len(mixers) > 1 else mixers[0],
            "mixer_options": mixer_options,
            "mlp_ratio": args.mlp_ratio,
            **getattr(args, "config_model_extra", {}),
        },
        "train": {
            "steps": args.steps, "batch_size": args.batch_size, "lr": args.lr, "seed": args.seed,
            "weight_decay": args.weight_decay, "eval_every": args.eval_every, "eval_examples": args.eval_examples,
            "checkpoint_every": args.checkpoint_every, "log_every": args.log_every,
            "warmup_frac": args.warmup_frac, "min_lr_frac": args.min_lr_frac, "clip": args.clip,
            "betas": list(args.betas), "eval_batch_size": args.eval_batch_size, "grad_accum": args.grad_accum,
            "precision": args.precision,
        },
    }
    spec_path = out / "run.json"
    extended = False
    if args.resume:
        if not spec_path.exists():
            raise UsageError(f"--resume: {spec_path} not found (nothing to resume)")
        old = json.loads(spec_path.read_text())
        new = json.loads(json.dumps(spec))
        old_steps = old.get("train", {}).get("steps")
        # a run.json written before a training field existed ran with that field's default
        old_train = with_defaults(old.get("train", {}))
        if {**old, "train": {**old_train, "steps": spec["train"]["steps"]}} != new:
            raise UsageError(f"--resume: arguments differ from the run in {out}; use the same arguments "
                             "(only --steps may grow, to extend the run)")
        extended = old_steps != args.steps  # run.json takes the new --steps once training succeeded
    torch.manual_seed(args.seed)
    model, task = build_run(spec)
    model.to(device)
    if main and not args.resume:
        if getattr(args, "overwrite", False):
            remove_run(out)  # only now: arguments that fail validation above leave the old run alone
        atomic_write_text(spec_path, json.dumps(spec, indent=2))
    if main and hasattr(task, "save_tokenizer"):
        task.save_tokenizer(out / "tokenizer")
    if world > 1:  # the other ranks wait for rank 0's checks and for --overwrite's removal of the old run: one that
        # ran ahead found the old run's checkpoints and refused to start, or trained while rank 0 refused
        import torch.distributed as dist

        dist.barrier()
    cfg = TrainConfig(**spec["train"])
    fsdp = getattr(args, "fsdp", False)
    if fsdp and world == 1:
        raise UsageError("--fsdp shards the model over the processes of torchrun (WORLD_SIZE > 1); "
                         "run it as: torchrun --nproc-per-node N -m seqmem train ... --fsdp")
    compile_ = getattr(args, "compile", False)
    if compile_:
        if world > 1 or cfg.grad_accum > 1:
            raise UsageError("--compile trains one process without gradient accumulation (--grad-accum 1)")
        from seqmem.train.loop import check_compiler

        try:
            check_compiler(device)
        except ValueError as e:
            raise UsageError(f"--compile: {e}") from None
    if main:
        mode = "FSDP" if fsdp else "DDP"
        dist_note = f", {world} processes ({mode}), {cfg.batch_size} sequences/step in all" if world > 1 else ""
        print(f"model: {model.num_parameters():,} parameters, mixer {spec['model']['mixer']}, "
              f"state {model.state_size(task.seq_len):,} numbers/sequence at T={task.seq_len}{dist_note}; "
              f"{threads_note()}{_config_note(args, cfg.steps)}", file=sys.stderr)
    loggers = make_loggers(args.log, out, spec) if main else []
    try:
        res = train(model, task, cfg, out_dir=out, resume=args.resume, progress=not args.no_progress,
                    loggers=loggers, fsdp=fsdp, compile=compile_)
    finally:
        for lg in loggers:
            lg.close()
    if main and extended:
        atomic_write_text(spec_path, json.dumps(spec, indent=2))
    if main:
        print(json.dumps({"step": cfg.steps, **{f"eval_{k}": v for k, v in res.final.items()}}))
    return 0


def _config_note(args: argparse.Namespace, steps: int) -> str:
    """``; settings from RUN.json (N steps, seed S)``: where ``--config`` took the run's settings from (a run.json
    records a run as it is now: after ``--resume --steps N`` extended it, N steps)."""
    if not getattr(args, "config", None):
        return ""
    return f"; settings from {args.config} ({steps:,} steps, seed {args.seed}; flags given override them)"


def cmd_eval(args: argparse.Namespace) -> int:
    from seqmem.train import evaluate
    from seqmem.train.checkpoint import latest_good_checkpoint, load_weights

    with _finite_checks(args):
        return _eval(args, evaluate, latest_good_checkpoint, load_weights)


def _eval(args: argparse.Namespace, evaluate: Any, latest_good_checkpoint: Any, load_weights: Any) -> int:
    import torch

    from seqmem.tasks import build_task
    from seqmem.train.checkpoint import read_run_spec

    run = Path(args.run)
    spec = read_run_spec(run)
    try:
        model, task = build_run(spec)
    except (ValueError, TypeError) as e:
        raise UsageError(f"{run / 'run.json'}: {e}") from None
    # --task-option: the trained model on another setting of its task (a longer sequence, another distribution)
    changed = parse_options(args.task_option)
    task_options = {**spec["task"].get("options", {}), **changed}
    if changed:
        try:
            shifted = build_task(spec["task"]["name"], **task_options)
        except (ValueError, TypeError) as e:
            raise UsageError(f"--task-option: {e}") from None
        if shifted.vocab_size != task.vocab_size:
            raise UsageError(f"--task-option {', '.join(sorted(changed))}: changes the task's vocabulary "
                             f"({task.vocab_size} -> {shifted.vocab_size} tokens), which the trained model cannot read")
        task = shifted
    out_json = args.json
    if out_json is not None:  # checked before the evaluation, not after it
        if out_json.is_dir() or not out_json.name:
            raise UsageError(f"--json {out_json}: a directory, not a file")
        _check_out_dir(out_json.parent if str(out_json.parent) else Path("."))
    ck = latest_good_checkpoint(run / "checkpoints")
    if ck is None:
        raise UsageError(f"no valid checkpoint under {run / 'checkpoints'}")
    load_weights(model, ck)
    precision = spec.get("train", {}).get("precision", "fp32")  # as the run was trained
    res = evaluate(model, task, args.examples, args.batch_size, precision=precision)
    record = {"checkpoint": str(ck), "task": spec["task"]["name"], "task_options": task_options,
              "changed_task_options": changed, "examples": args.examples, **res, "threads": torch.get_num_threads()}
    print(json.dumps(record))
    if out_json is not None:
        from seqmem.io import atomic_write_text

        atomic_write_text(out_json, json.dumps(record, indent=2) + "\n")
    return 0


def cmd_export_hf(args: argparse.Namespace) -> int:
    try:
        from seqmem.hf import from_run
        from seqmem.hf.modeling_seqmem import export_names, publish_export, save_exported
    except ImportError:
        raise UsageError("export-hf needs transformers (pip install seqmem[hf])") from None
    import shutil
    import tempfile

    from seqmem.hf.tokenizer import export_tokenizer
    from seqmem.train.checkpoint import read_run_spec

    read_run_spec(Path(args.run))  # a missing or corrupt run.json: one line naming it
    ckpts = (Path(args.run) / "checkpoints").resolve()
    target = Path(args.out).resolve()
    if target == ckpts or ckpts in target.parents:  # save_pretrained would overwrite a checkpoint's weights
        raise UsageError(f"--out {args.out} is inside the run's checkpoints ({ckpts}): export elsewhere")
    overwrite = getattr(args, "overwrite", False)
    held = [n for n in export_names(args.out) if n != "README.md"] if Path(args.out).is_dir() else []
    if held and not overwrite:  # checked before the model is built; publish_export checks again
        raise UsageError(f"--out {args.out} already holds an exported model ({', '.join(held)}): --overwrite "
                         "replaces it, or choose another --out")
    model = from_run(str(args.run))
    out = _check_out_dir(args.out)
    # the export is built in a fresh private directory and moved in file by file: nothing is written through a
    # link planted in --out, and an export that fails half-way leaves --out as it was
    built = Path(tempfile.mkdtemp(dir=out, prefix=".seqmem-export-"))
    try:
        # the run's tokenizer (byte-level, trained BPE or Hugging Face) with EOS/pad, and eos_token_id in config.json
        tokenizer = export_tokenizer(args.run, built, model)
        save_exported(model, str(built))
        publish_export(built, out, replace=overwrite)
    finally:
        shutil.rmtree(built, ignore_errors=True)
    print(f"load it with `import seqmem.hf` then AutoModelForCausalLM.from_pretrained({str(args.out)!r}), or without "
          "the import with trust_remote_code=True (seqmem installed)", file=sys.stderr)
    if tokenizer is not None:  # a plain AutoTokenizer call would ask whether to run the directory's code
        print(f"its tokenizer alone, without the import: AutoTokenizer.from_pretrained({str(args.out)!r}, "
              "trust_remote_code=False)", file=sys.stderr)
    print(str(args.out))
    return 0


def harness_limit(s: str) -> int | float:
    """``eval-harness --limit``: an integer >= 1 (examples per task) or a fraction strictly between 0 and 1."""
    import math

    want = "an integer >= 1 (examples per task) or a fraction between 0 and 1"
    try:
        v = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {want}, got {s!r}") from None
    if not math.isfinite(v) or v <= 0 or (v >= 1 and v != int(v)):
        raise argparse.ArgumentTypeError(f"expected {want}, got {s!r}")
    return int(v) if v >= 1 else v


def cmd_eval_harness(args: argparse.Namespace) -> int:
    try:
        import lm_eval
    except ImportError:
        raise UsageError("eval-harness needs lm-evaluation-harness: pip install 'seqmem[eval]'") from None
    try:
        import seqmem.hf  # noqa: F401  (registers model_type "seqmem" with transformers' auto classes)
    except ImportError:
        raise UsageError("eval-harness needs transformers: pip install 'seqmem[eval]'") from None
    model = Path(args.model)
    if not (model / "config.json").is_file():
        raise UsageError(f"--model {model}: not a saved model (no config.json); write one with seqmem export-hf")
    if json.loads((model / "config.json").read_text()).get("model_type") != "seqmem":
        raise UsageError(f"--model {model}: config.json is not a seqmem model (model_type != 'seqmem')")
    tasks = [t for t in args.tasks.split(",") if t]
    if not tasks:
        raise UsageError("--tasks: give at least one task name")
    check_device(args.device)
    if args.json is not None:  # checked before the evaluation (hours with real tasks), not after it
        if args.json.is_dir() or not args.json.name:
            raise UsageError(f"--json {args.json}: a directory, not a file")
        _check_out_dir(args.json.parent if str(args.json.parent) else Path("."))
    limit = args.limit
    task_manager = None
    if args.include_path is not None:
        if not args.include_path.is_dir():
            raise UsageError(f"--include-path {args.include_path}: not a directory of lm-eval task YAML files")
        from lm_eval.tasks import TaskManager

        task_manager = TaskManager(include_path=str(args.include_path))
        unknown = [t for t in tasks if t not in task_manager.all_tasks]
        if unknown:
            raise UsageError(f"--tasks: unknown to lm-eval and to {args.include_path}: {', '.join(unknown)}")
    res = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={model}", tasks=tasks, limit=limit,
                                  num_fewshot=args.num_fewshot, batch_size=args.batch_size, device=args.device,
                                  task_manager=task_manager)
    record = {"model": str(model), "tasks": tasks, "limit": limit, "results": res["results"]}
    text = json.dumps(record, indent=2, default=str)
    print(text, flush=True)  # first: the results are not lost if the file cannot be written
    if args.json is not None:
        from seqmem.io import atomic_write_text

        atomic_write_text(args.json, text + "\n")
    return 0


# ---------------------------------------------------------------------------------------------------------- repro
def _available(pkg: str) -> list[str]:
    mod = importlib.import_module(pkg)
    return sorted(m.name for m in pkgutil.iter_modules(mod.__path__) if not m.name.startswith("_")
                  and m.name != "common")


# Wall-clock of `--scale small` (docs/results/<paper>/README.md: 2-core machines shared with other jobs, so a
# quiet machine is faster); --scale smoke takes seconds (vla: 5.5 s).
REPRO_SMALL_TIME = {"echo": "17 min", "elastic": "17 min", "lattice": "3 min", "vla": "45 min", "vort": "15 min"}
REPRO_SCALES_HELP = ("smoke: tiny budgets that check everything runs, seconds; small (default): the committed "
                     "docs/results, minutes (per paper below); paper: the papers' sizes, CPU-hours to days (a GPU is "
                     "advised)")


def _add_repro(sub) -> None:
    p = sub.add_parser(
        "repro", help="reproduce a paper's experiments (seqmem repro PAPER --help)",
        description="Reproduce one paper's experiments and write Markdown/JSON tables (paper | ours | our scale) "
                    "and PNG plots. --scale " + REPRO_SCALES_HELP + ". Measured wall-clock of --scale small on a "
                    "shared 2-core machine: " + ", ".join(f"{k} {v}" for k, v in REPRO_SMALL_TIME.items()) + ".")
    rsub = p.add_subparsers(dest="paper", metavar="PAPER", parser_class=_Parser)
    for paper in _available("seqmem.repro"):
        try:
            mod = importlib.import_module(f"seqmem.repro.{paper}")
        except Exception as e:  # a broken repro module must not break the whole CLI
            print(f"seqmem: warning: repro {paper} unavailable ({e})", file=sys.stderr)
            continue
        if not hasattr(mod, "run"):
            continue
        summary = " ".join((mod.__doc__ or "").strip().split("\n\n")[0].split()).replace("``", "")
        rp = rsub.add_parser(paper, help=summary, description=summary)
        small = f" (small: {REPRO_SMALL_TIME[paper]} on a shared 2-core machine)" if paper in REPRO_SMALL_TIME else ""
        rp.add_argument("--scale", default="small", choices=getattr(mod, "SCALES", ["smoke", "small", "paper"]),
                        help=getattr(mod, "SCALES_HELP", REPRO_SCALES_HELP) + small)
        rp.add_argument("--out", type=_out_path, default=None,
                        help="output directory (default runs/repro/<paper>)")
        rp.add_argument("--seed", type=int, default=0, help=getattr(mod, "SEED_HELP", "seed"))
        if hasattr(mod, "add_arguments"):
            mod.add_arguments(rp)
        rp.set_defaults(func=_run_repro(mod, paper))


def _run_repro(mod, paper: str):
    def f(args: argparse.Namespace) -> int:
        if hasattr(mod, "check_args"):  # a bad argument: one line, nothing printed or created before it
            mod.check_args(args)
        args.out = _check_out_dir(args.out or Path("runs/repro") / paper)
        if getattr(mod, "THREADS_FIXED", None):  # the reproduction sets its own thread count
            n = mod.THREADS_FIXED
            note = f"{n} torch thread{'s' if n != 1 else ''} (fixed by this reproduction)"
        else:
            note = threads_note()
            if not hasattr(args, "threads"):  # no --threads flag here: OMP_NUM_THREADS is the way
                note = note.replace("--threads N or ", "")
        print(f"seqmem repro {paper}: --scale {args.scale}, {note} -> {args.out}", file=sys.stderr)
        return int(mod.run(args) or 0)

    return f


# ---------------------------------------------------------------------------------------------------------- main
THREADS_HELP = ("torch threads (default: OMP_NUM_THREADS if set, else 1: the fastest for the small models of the "
                "defaults, see docs/BENCHMARKS.md)")


def _add_threads(p: argparse.ArgumentParser) -> None:
    p.add_argument("--threads", type=_positive_int, default=None, help=THREADS_HELP)


def make_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="seqmem", description="Long-context memory layers on one harness.")
    sub = ap.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("list", help="registered mixers with their state size and parameters (a few seconds)",
                       description="Build every registered mixer at one size and print its state size (numbers "
                                   "per sequence after --context tokens), parameters and a one-line description.")
    p.add_argument("--d-model", type=_positive_int, default=128, help="model width")
    p.add_argument("--heads", type=_positive_int, default=4, help="attention / memory heads")
    p.add_argument("--context", type=_positive_int, default=1024, help="tokens after which the state is counted")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser(
        "train", help="train a language model on a task (multi-process: torchrun ... -m seqmem train)",
        description="Train a language model whose layers use the given mixer(s) on MQAR or language modelling "
                    "(byte-level by default; --tokenizer for others); writes run.json, metrics.jsonl and "
                    "checkpoints to --out. The defaults marked 'mqar' learn MQAR in about a minute on 2 CPU cores "
                    "(the demo's sizes).")
    p.add_argument("--config", metavar="RUN.json", default=None,
                   help="the run.json of an earlier run (or its directory): its task, model and training settings "
                        "become the defaults, so it alone reproduces that run; flags given here override them "
                        "(default: none)")
    p.add_argument("--task", default=None, choices=["mqar", "lm"],
                   help="mqar (associative recall) or lm (required unless --config gives it; default: none)")
    p.add_argument("--mixer", default=None,
                   help="mixer name, or a comma-separated list (one per layer; required unless --config gives it; "
                        "default: none)")
    p.add_argument("--mixer-option", action="append", metavar="KEY=VALUE",
                   help="mixer option (repeatable; n_heads must agree with --heads, d_model is --d-model's; default: "
                        "the mixer's own options)")
    p.add_argument("--task-option", action="append", metavar="KEY=VALUE",
                   help="task option (repeatable; one that a flag also sets, e.g. seq_len and --seq-len, must agree "
                        "with the flag when both are given; default: the task's own options)")
    p.add_argument("--layers", type=_positive_int, default=2, help="number of blocks")
    p.add_argument("--d-model", type=_positive_int, default=None, help=_task_default_help("d_model", "model width"))
    p.add_argument("--heads", type=_positive_int, default=2, help="attention / memory heads per layer")
    p.add_argument("--mlp-ratio", type=float, default=4.0,
                   help="SwiGLU MLP size: hidden width mlp_ratio·d_model·2/3, rounded up to a multiple of 8 (LLaMA's "
                        "convention); 0: no MLP")
    p.add_argument("--steps", type=_positive_int, default=None,
                   help=_task_default_help("steps", "training steps (with --resume: may exceed the original run's "
                                                    "--steps to extend it; see docs/reliability.md)"))
    p.add_argument("--batch-size", type=_positive_int, default=32, help="sequences per step (all processes)")
    p.add_argument("--lr", type=_positive_float, default=None,
                   help=_task_default_help("lr", "peak learning rate (AdamW; linear warm-up over --warmup-frac of the "
                                                 "steps, then cosine decay to --min-lr-frac times it)"))
    p.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay of the matrices")
    p.add_argument("--warmup-frac", type=float, default=0.1, help="fraction of the steps spent in linear warm-up")
    p.add_argument("--min-lr-frac", type=float, default=0.0,
                   help="learning rate at the end of the cosine decay, as a fraction of --lr")
    p.add_argument("--clip", type=float, default=1.0, help="gradient-norm clipping (0: off)")
    p.add_argument("--betas", type=float, nargs=2, metavar=("B1", "B2"), default=[0.9, 0.98], help="AdamW betas")
    p.add_argument("--grad-accum", type=_positive_int, default=1,
                   help="micro-batches per step: --batch-size is split into N forward/backward passes whose "
                        "gradients are summed (the same step as one pass, in less memory)")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: forward passes under torch.autocast with bfloat16 (weights and optimizer stay fp32)")
    p.add_argument("--fsdp", action="store_true",
                   help="under torchrun: shard parameters, gradients and optimizer state with FSDP2 instead of "
                        "replicating the model with DDP")
    p.add_argument("--compile", action="store_true",
                   help="training steps through torch.compile (one process, --grad-accum 1; on CPU 0.68-1.04x the "
                        "eager step's wall-clock time after a one-off compile in docs/BENCHMARKS.md's measurements, "
                        "needs a C++ compiler); an execution choice, not part of run.json; the log records carry "
                        "compiled: true")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the training data")
    p.add_argument("--seq-len", type=_positive_int, default=None,
                   help=_task_default_help("seq_len", "tokens per sequence", lm=512))
    p.add_argument("--vocab-size", dest="vocab", metavar="V", type=_positive_int, default=None,
                   help=_task_default_help("vocab", "MQAR vocabulary size"))
    p.add_argument("--num-pairs", type=_positive_int, default=None,
                   help=_task_default_help("num_pairs", "MQAR key-value pairs"))
    p.add_argument("--corpus", default=None,
                   help="LM corpus: code, docs, or a directory of text files (default: code)")
    p.add_argument("--dataset", default=None,
                   help="LM dataset: pg19, proof-pile, fineweb-edu or any Hugging Face dataset name (needs the "
                        "datasets package and network), or a local directory / text, .jsonl, .parquet file, or "
                        "datasets.save_to_disk directory (see docs/ecosystem.md; default: none, --corpus is used)")
    p.add_argument("--tokenizer", default=None,
                   help="LM tokenizer: byte (default), a Hugging Face tokenizer name or local path, a "
                        "tokenizer.json file, or train:VOCAB (byte-level BPE trained on the train split)")
    p.add_argument("--log", action="append", choices=["tensorboard", "wandb"], default=None,
                   help="extra metric backend (repeatable; offline; default: none, metrics.jsonl is always written)")
    p.add_argument("--eval-every", type=int, default=0,
                   help="evaluate every N steps (0: only at the end); each result goes to metrics.jsonl and is "
                        "printed unless --no-progress")
    p.add_argument("--eval-examples", type=_positive_int, default=512, help="held-out examples per evaluation")
    p.add_argument("--eval-batch-size", type=_positive_int, default=64, help="sequences per evaluation forward pass")
    p.add_argument("--checkpoint-every", type=int, default=None,
                   help="write a checkpoint every N steps (0: only at the end; default: steps/10, at least 1 and at "
                        "most 1000; with --resume, the run's own interval)")
    p.add_argument("--log-every", type=_positive_int, default=10,
                   help="write a metrics line every N steps (when stderr is not a terminal, a progress line is "
                        "also printed, at most one every 10 s)")
    p.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:1, mps")
    _add_threads(p)
    p.add_argument("--out", type=_out_path, required=True, help="run directory")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its newest checkpoint, bit-exactly (same arguments; "
                        "a larger --steps extends it)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the training run already in --out (its files are removed first)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or progress lines")
    p.add_argument("--no-check-finite", action="store_true",
                   help="skip the NaN/Inf checks of every layer's input and output (on by default)")
    add_deprecated_alias(p, "--vocab", "--vocab-size")
    add_deprecated_alias(p, "--batch", "--batch-size")
    p.set_defaults(func=cmd_train, config_parser=p)

    p = sub.add_parser("eval", help="evaluate the newest checkpoint of a training run")
    p.add_argument("--run", type=Path, required=True, help="run directory written by seqmem train")
    p.add_argument("--examples", type=_positive_int, default=512, help="held-out examples")
    p.add_argument("--batch-size", type=_positive_int, default=64, help="sequences per forward pass")
    add_deprecated_alias(p, "--batch", "--batch-size")
    p.add_argument("--task-option", action="append", metavar="KEY=VALUE",
                   help="evaluate on the run's task with this option changed, value as JSON (repeatable, e.g. "
                        "beta=2.0 or seq_len=1024: another distribution or length; the vocabulary must not change)")
    p.add_argument("--json", type=_out_file, help="also write the record to this JSON file")
    p.add_argument("--no-check-finite", action="store_true",
                   help="skip the NaN/Inf checks of every layer's input and output (on by default)")
    _add_threads(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("export-hf", help="save a training run as a Hugging Face model (needs transformers)",
                       description="Save the newest good checkpoint of a training run with save_pretrained "
                                   "(config.json + model.safetensors) and, for text runs, its tokenizer with "
                                   "EOS/pad tokens (eos_token_id in config.json).  The export is built in a fresh "
                                   "directory and moved into --out file by file (a link planted there is "
                                   "replaced, never written through; an export that fails leaves --out as it was); "
                                   "an existing export is replaced only with --overwrite.")
    p.add_argument("--run", type=Path, required=True, help="run directory written by seqmem train")
    p.add_argument("--out", type=_out_path, required=True,
                   help="directory for the model; one that already holds an export is refused unless --overwrite")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the export already in --out: its export files (config.json, weights, tokenizer "
                        "files, README.md, the two .py files) are removed first; other files stay")
    p.set_defaults(func=cmd_export_hf)

    p = sub.add_parser("eval-harness", help="run lm-evaluation-harness tasks on an exported model (needs the eval "
                                            "extra)",
                       description="Evaluate a model written by `seqmem export-hf` (or any saved SeqmemForCausalLM) "
                                   "with lm-evaluation-harness (lm_eval.simple_evaluate, its 'hf' model type) and "
                                   "print the results as JSON.  Needs pip install 'seqmem[eval]'.")
    p.add_argument("--model", type=Path, required=True, help="directory written by seqmem export-hf")
    p.add_argument("--tasks", required=True, help="comma-separated lm-eval task names, e.g. lambada_openai,piqa")
    p.add_argument("--limit", type=harness_limit, default=None,
                   help="examples per task (an integer >= 1), or a fraction of each task between 0 and 1 (lm-eval's "
                        "--limit; default: every example)")
    p.add_argument("--num-fewshot", type=nonnegative_int, default=None,
                   help="few-shot examples (lm-eval's default if unset)")
    p.add_argument("--batch-size", type=_positive_int, default=8, help="lm-eval batch size (default 8)")
    p.add_argument("--device", default="cpu", help="torch device: cpu, cuda, cuda:1, mps (default cpu)")
    p.add_argument("--include-path", type=Path, default=None,
                   help="a directory of your own lm-eval task YAML files (e.g. on local data, offline)")
    p.add_argument("--json", type=_out_file,
                   help="also write the results to this JSON file (checked before the evaluation; the results are "
                        "printed first)")
    p.set_defaults(func=cmd_eval_harness)

    from seqmem import demo, plotting

    demo.add_parser(sub)
    from seqmem.sweep import cli as sweep_cli

    sweep_cli.add_parser(sub)
    plotting.add_parser(sub)
    _add_repro(sub)
    try:
        bench = importlib.import_module("seqmem.bench.cli")
    except ImportError:
        bench = None
    if bench is not None:
        bench.add_parser(sub)
    return finish_parser(ap)


def main(argv: list[str] | None = None) -> int:
    ap = make_parser()
    args = ap.parse_args(argv)
    if not getattr(args, "func", None):
        ap.print_help(sys.stderr)
        return 2
    try:
        if getattr(args, "config", None):  # seqmem train --config: the run's settings as defaults, then the flags
            defaults = config_defaults(args.config)
            args.config_parser.set_defaults(**defaults)
            typed = args
            args = ap.parse_args(argv)
            # the options --config set that the command line did not (their parser default is None)
            args.from_config = {k for k in defaults if getattr(typed, k, None) is None}
        args.argv = list(sys.argv[1:] if argv is None else argv)  # as typed, for the records a command writes
        apply_threads(args)  # every command: --threads, else OMP_NUM_THREADS, else 1 (each names it in its first line)
        return int(args.func(args) or 0)
    except (UsageError, ValueError, FileNotFoundError, FloatingPointError, MissingExtra) as e:
        print(f"seqmem: error: {e}".splitlines()[0], file=sys.stderr)
        return 2
    except OSError as e:  # a full disk, a read-only directory: one line naming the file, not a traceback
        print(f"seqmem: error: {e}".splitlines()[0], file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("seqmem: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
