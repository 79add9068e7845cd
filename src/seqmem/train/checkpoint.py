"""Crash-safe checkpoints: weights in safetensors, trainer state (optimizer, scheduler, RNG, step) in torch format,
written to a temporary directory and renamed into place, with a SHA-256 manifest checked on load."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from seqmem.io import dir_mode, fsync_path

CKPT_PREFIX = "ckpt-"
#: the files every checkpoint holds, each with its SHA-256 in ``manifest.json``
CKPT_FILES = ("model.safetensors", "trainer.pt")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def unique_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` with a tied weight once, under its first name: what a checkpoint stores (safetensors
    refuses shared storage)."""
    seen: set[int] = set()
    out = {}
    for name, t in model.state_dict().items():
        key = t.data_ptr()
        if key in seen and t.numel() > 0:
            continue
        seen.add(key)
        out[name] = t
    return out


def _weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: t.detach().contiguous().clone() for name, t in unique_state(model).items()}


def save_checkpoint(directory: Path, step: int, model: nn.Module, trainer_state: dict[str, Any], keep: int = 2) -> Path:
    """Write ``directory/ckpt-<step>/`` atomically; keep the newest ``keep`` checkpoints."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    remove_orphans(directory)
    final = directory / f"{CKPT_PREFIX}{step:08d}"
    tmp = Path(tempfile.mkdtemp(dir=directory, prefix=".tmp-ckpt-"))
    try:
        os.chmod(tmp, dir_mode())  # mkdtemp's 0700 would outlive the rename: the umask's mode, as mkdir gives
        try:
            save_file(_weights(model), str(tmp / "model.safetensors"))
            torch.save(trainer_state, tmp / "trainer.pt")
        except RuntimeError as e:  # torch and safetensors report a full disk as "unexpected pos ..."
            raise OSError(f"cannot write checkpoint {final} ({str(e).splitlines()[0]}): is the disk full?") from None
        manifest = {"step": step, "files": {f: _sha256(tmp / f) for f in CKPT_FILES}}
        if isinstance(trainer_state.get("model_config"), str):  # what load_weights compares a model with
            manifest["model_config"] = trainer_state["model_config"]
        (tmp / "manifest.json").write_text(json.dumps(manifest))
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        fsync_path(tmp)  # the directory's entries too, before the rename publishes it
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_path(directory)  # the rename itself: after a power loss the checkpoint is there or not, never lost
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(directory)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def remove_orphans(directory: Path) -> None:
    """Delete the temporary ``.tmp-ckpt-*`` directories of checkpoint writes that a killed process left behind
    (one process writes a run's checkpoints, so none of them is in progress when this runs)."""
    directory = Path(directory)
    if directory.is_dir():
        for p in directory.glob(".tmp-ckpt-*"):
            shutil.rmtree(p, ignore_errors=True)


def checkpoint_step(path: Path) -> int | None:
    """The step of a ``ckpt-<step>`` directory's name, None for any other name."""
    suffix = Path(path).name[len(CKPT_PREFIX):] if Path(path).name.startswith(CKPT_PREFIX) else ""
    return int(suffix) if suffix.isdigit() else None


def list_checkpoints(directory: Path) -> list[Path]:
    """The ``ckpt-<step>`` directories in ``directory``, oldest step first: ordered by the step's number, not by
    name (``ckpt-100000000`` comes after ``ckpt-99999999``); a directory whose suffix is not a step is not one."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if p.is_dir() and checkpoint_step(p) is not None]
    return sorted(found, key=lambda p: (checkpoint_step(p), p.name))


def verify_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a complete checkpoint: a manifest (a JSON object) whose ``files`` maps exactly
    :data:`CKPT_FILES` to their SHA-256 hex digests, all of which match."""
    try:
        manifest = json.loads((Path(path) / "manifest.json").read_text())
        files = manifest.get("files") if isinstance(manifest, dict) else None
        if not isinstance(files, dict) or set(files) != set(CKPT_FILES):
            return False
        return all(isinstance(h, str) and _sha256(Path(path) / f) == h for f, h in files.items())
    except (OSError, ValueError):  # unreadable file, not JSON, not UTF-8
        return False


def read_run_spec(run_dir: Path) -> dict[str, Any]:
    """The ``run.json`` of a training run, checked to be a JSON object with ``task`` and ``model`` objects; errors
    (``ValueError``) name the file."""
    path = Path(run_dir) / "run.json"
    try:
        spec = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{Path(run_dir)} is not a training run directory (no run.json)") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is corrupt (not JSON: {e}); restore it or start a new run") from None
    except RecursionError:
        raise ValueError(f"{path} is corrupt (nested too deeply)") from None
    except IsADirectoryError:
        raise ValueError(f"{path} is a directory, not a run specification") from None
    except NotADirectoryError:
        raise ValueError(f"{Path(run_dir)} is not a training run directory (give the directory, not a file)") from None
    if not isinstance(spec, dict) or not all(isinstance(spec.get(k), dict) for k in ("task", "model")):
        raise ValueError(f"{path} is corrupt (not a run specification with 'task' and 'model' objects)")
    if not isinstance(spec["task"].get("name"), str):
        raise ValueError(f"{path} is corrupt (its task has no 'name')")
    if not isinstance(spec.get("train", {}), dict) or not isinstance(spec["task"].get("options", {}), dict):
        raise ValueError(f"{path} is corrupt ('train' and the task's 'options' must be objects)")
    from seqmem.train.run import check_data_paths

    # the directory that holds the run (runs and their data side by side) and the current one
    check_data_paths(spec, str(path), [Path.cwd(), Path(run_dir).resolve().parent])
    return spec


def latest_good_checkpoint(directory: Path) -> Path | None:
    """The newest checkpoint whose checksums verify; corrupt newer ones are skipped with a warning."""
    for path in reversed(list_checkpoints(directory)):
        if verify_checkpoint(path):
            return path
        warnings.warn(f"checkpoint {path} is corrupt or incomplete; falling back to an older one", stacklevel=2)
    return None


def model_config_json(model: nn.Module) -> str | None:
    """``model.cfg.to_dict()`` as canonical JSON (what a checkpoint stores and a load compares), ``None`` for a
    model without such a configuration."""
    cfg = getattr(model, "cfg", None)
    if not callable(getattr(cfg, "to_dict", None)):
        return None
    return json.dumps(cfg.to_dict(), sort_keys=True, default=str)


def config_mismatch(stored: str, now: str) -> list[str]:
    """The fields of a stored configuration (canonical JSON of a dict) that ``now`` gives another value; a field
    only one side has is not compared (one added later defaults to the earlier behaviour)."""
    a, b = json.loads(stored), json.loads(now)
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return [] if a == b else ["(the whole configuration)"]
    return sorted(k for k in a if k in b and a[k] != b[k])


def load_weights(model: nn.Module, path: Path) -> None:
    """Load ``model.safetensors`` from a checkpoint directory into ``model`` (strict up to tied weights)."""
    try:
        tensors = load_file(str(Path(path) / "model.safetensors"))
    except Exception as e:  # noqa: BLE001 — safetensors raises its own error types for damaged files
        raise ValueError(f"checkpoint {path}: cannot read model.safetensors ({e}); delete it or use another") from None
    try:
        stored = json.loads((Path(path) / "manifest.json").read_text()).get("model_config")
    except (OSError, ValueError, AttributeError):
        stored = None
    now = model_config_json(model)
    if isinstance(stored, str) and now is not None:
        diff = config_mismatch(stored, now)
        if diff:
            raise ValueError(f"checkpoint {path} was written for another model configuration (fields that differ: "
                             f"{', '.join(diff[:6])}); build the model with the configuration of that run")
    own = model.state_dict()
    wrong = [f"{n} {tuple(t.shape)} vs {tuple(own[n].shape)}" for n, t in tensors.items()
             if n in own and tuple(t.shape) != tuple(own[n].shape)]
    if wrong:
        raise ValueError(
            f"checkpoint {path} was written for another model configuration (checkpoint vs model shapes: "
            f"{'; '.join(wrong[:3])}); build the model with the configuration of that run"
        )
    tie = getattr(getattr(model, "cfg", None), "tie_embeddings", None)
    if tie and "head.weight" in tensors and "embed.weight" in tensors and not torch.equal(
            tensors["head.weight"], tensors["embed.weight"]):
        # an untied run's head would overwrite the tied model's shared embedding
        raise ValueError(f"checkpoint {path} was written by a model with an output head of its own "
                         "(tie_embeddings=False), this model ties it to the embedding: build it with "
                         "tie_embeddings=False")
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if tie is False and "head.weight" in missing:
        raise ValueError(f"checkpoint {path} was written by a model whose output head is its embedding "
                         "(tie_embeddings=True); this model has a head of its own, which would keep its random "
                         "initialisation: build it with tie_embeddings=True")
    tied = {n for n in missing if n == "head.weight" and tie}
    missing = [n for n in missing if n not in tied]
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {path} does not match the model (another mixer or number of layers?): missing "
            f"{missing[:5]}, unexpected {unexpected[:5]}; build the model with the configuration of that run"
        )


#: what a training run writes into its directory (``seqmem train --overwrite`` removes exactly these)
RUN_FILES = ("checkpoints", "metrics.jsonl", "tokenizer", "tensorboard", "wandb", "plots", "run.json")
_TRASH_PREFIX = ".tmp-old-run-"


def holds_run(directory: Path) -> bool:
    """Whether ``directory`` holds (part of) a training run: a ``run.json``, ``metrics.jsonl`` or checkpoint."""
    directory = Path(directory)
    return (directory / "run.json").exists() or (directory / "metrics.jsonl").exists() or bool(
        list_checkpoints(directory / "checkpoints"))


def remove_run(directory: Path) -> None:
    """Remove the training run in ``directory`` (the :data:`RUN_FILES`; other files stay).

    The files are first renamed into one hidden directory beside them (each rename is atomic; ``run.json`` goes
    last, so an interrupted removal still reads as a run and is never mixed with a new one), then deleted; a hidden
    directory left by an earlier interrupted removal is deleted too."""
    directory = Path(directory)
    trash = Path(tempfile.mkdtemp(dir=directory, prefix=_TRASH_PREFIX))
    for name in RUN_FILES:
        src = directory / name
        if src.exists() or src.is_symlink():
            os.replace(src, trash / name)
    for old in directory.glob(f"{_TRASH_PREFIX}*"):
        shutil.rmtree(old, ignore_errors=True)


def load_trainer_state(path: Path) -> dict[str, Any]:
    """The trainer state of a checkpoint: tensors and plain containers only (``weights_only=True``), so a planted
    ``trainer.pt`` cannot run code when a run is resumed (its manifest hash proves integrity, not origin)."""
    f = Path(path) / "trainer.pt"
    try:
        st = torch.load(f, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError:
        raise ValueError(f"checkpoint {path}: trainer.pt holds objects other than tensors and plain containers; "
                         "refusing to load it (that could run code): delete the checkpoint or start a new run"
                         ) from None
    except Exception as e:  # noqa: BLE001 — damaged files raise RuntimeError, EOFError, ...
        raise ValueError(f"checkpoint {path}: cannot read trainer.pt ({type(e).__name__}); delete the checkpoint "
                         "or start a new run") from None
    if not isinstance(st, dict):
        raise ValueError(f"checkpoint {path}: trainer.pt holds a {type(st).__name__}, not a trainer state dict")
    return st
