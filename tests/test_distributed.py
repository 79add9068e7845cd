"""torchrun + DistributedDataParallel or FSDP2 (gloo, 2 CPU processes on 127.0.0.1), with and without gradient
accumulation: same loss curve as one process with the same global batch; checkpoints written by rank 0 resume exactly
in a single process (any world size)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seqmem.cli import main
from seqmem.train.checkpoint import list_checkpoints

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed unavailable")

# batch 7 over 2 ranks: uneven shards (4 + 3) must still give the global token-mean gradient
ARGS = ["train", "--task", "mqar", "--mixer", "deltanet", "--layers", "1", "--d-model", "16", "--heads", "2",
        "--steps", "6", "--batch-size", "7", "--lr", "0.01", "--vocab", "32", "--num-pairs", "2", "--seq-len", "16",
        "--eval-examples", "40", "--eval-every", "3", "--log-every", "1", "--checkpoint-every", "3", "--no-progress"]


def _rows(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "tokens_per_s"}
            for line in (path / "metrics.jsonl").read_text().splitlines()]


def _close(a: list[dict], b: list[dict]) -> None:
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys()
        for k in ra:
            assert rb[k] == pytest.approx(ra[k], rel=1e-5, abs=1e-7), (ra["step"], k)


def test_torchrun_two_processes_match_single_process(tmp_path):
    single, multi = tmp_path / "single", tmp_path / "multi"
    assert main([*ARGS, "--out", str(single)]) == 0
    torchrun = Path(sys.executable).with_name("torchrun")
    launcher = [str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"}
    cmd = [*launcher, "--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", "127.0.0.1:0", "-m", "seqmem", *ARGS, "--out", str(multi)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "2 processes (DDP)" in p.stderr
    a, b = _rows(single), _rows(multi)
    assert len(a) == 6 and a[0]["loss"] != a[-1]["loss"]  # it trains
    _close(a, b)  # train loss, accuracy, lr, eval metrics at steps 3 and 6
    # rank 0 alone wrote checkpoints; resume the 2-process run from step 3 in ONE process: exact continuation
    ckpts = list_checkpoints(multi / "checkpoints")
    assert [c.name for c in ckpts] == ["ckpt-00000003", "ckpt-00000006"]
    shutil.rmtree(ckpts[-1])
    assert main([*ARGS, "--out", str(multi), "--resume"]) == 0
    _close(a, _rows(multi))


def _torchrun(args: list[str]) -> subprocess.CompletedProcess:
    torchrun = Path(sys.executable).with_name("torchrun")
    launcher = [str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1"}
    cmd = [*launcher, "--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", "127.0.0.1:0", "-m", "seqmem", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("mode", ["FSDP", "DDP"])
def test_torchrun_grad_accum_and_fsdp_match_single_process(tmp_path, mode):
    """FSDP2 (fully_shard, gloo on CPU) or DDP over 2 ranks with 2 micro-batches per rank (batch 7 = 2+2 | 2+1)
    follows the single-process run with the whole batch; the checkpoints (gathered into the unsharded format under
    FSDP) resume in one process."""
    single, multi = tmp_path / "single", tmp_path / "multi"
    assert main([*ARGS, "--out", str(single)]) == 0
    p = _torchrun([*ARGS, *(["--fsdp"] if mode == "FSDP" else []), "--grad-accum", "2", "--out", str(multi)])
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"2 processes ({mode})" in p.stderr
    a, b = _rows(single), _rows(multi)
    _close(a, b)
    ckpts = list_checkpoints(multi / "checkpoints")
    assert [c.name for c in ckpts] == ["ckpt-00000003", "ckpt-00000006"]
    # the checkpoint holds full (unsharded) weights in the single-process format
    from safetensors.torch import load_file

    single_w = load_file(str(list_checkpoints(single / "checkpoints")[-1] / "model.safetensors"))
    multi_w = load_file(str(ckpts[-1] / "model.safetensors"))
    assert single_w.keys() == multi_w.keys()
    for k in single_w:
        assert single_w[k].shape == multi_w[k].shape
    shutil.rmtree(ckpts[-1])
    assert main([*ARGS, "--grad-accum", "2", "--out", str(multi), "--resume"]) == 0
    _close(a, _rows(multi))


def test_batch_smaller_than_world_is_rejected(monkeypatch):
    from seqmem.train import loop

    monkeypatch.setattr(loop, "dist_info", lambda: (0, 4))
    from seqmem.models import LanguageModel, LMConfig
    from seqmem.tasks.mqar import MQARTask

    model = LanguageModel(LMConfig(vocab_size=32, d_model=16, n_layers=1, n_heads=2, mixer="deltanet"))
    task = MQARTask(vocab_size=32, num_pairs=2, seq_len=16)
    with pytest.raises(ValueError, match="smaller than the number of processes"):
        loop.train(model, task, loop.TrainConfig(steps=2, batch_size=2))


def _documented_torchrun() -> list[str]:
    """The first complete ``torchrun ... -m seqmem train`` command in the README or docs/ecosystem.md (the one
    users paste), as argv."""
    import shlex

    root = Path(__file__).resolve().parents[1]
    for doc in ("README.md", "docs/ecosystem.md"):
        for line in (root / doc).read_text().splitlines():
            line = line.split("#")[0].strip()
            if line.startswith("torchrun ") and " -m seqmem train " in line and "..." not in line:
                return shlex.split(line)
    raise AssertionError("no complete torchrun command in README.md or docs/ecosystem.md")


def test_documented_torchrun_command_runs_with_default_flags(tmp_path):
    """The documented multi-process command as written (default --checkpoint-every: every rank must resolve the same
    interval), only shrunk by appended size flags (later flags win) and two processes on 127.0.0.1."""
    argv = _documented_torchrun()
    assert argv[:2] == ["torchrun", "--standalone"] and "--checkpoint-every" not in argv
    i = argv.index("--nproc-per-node")
    argv[i + 1] = "2"
    seqmem_args = argv[argv.index("seqmem") + 1:]
    out = seqmem_args.index("--out")
    seqmem_args[out + 1] = str(tmp_path / "run")
    small = ["--steps", "2", "--batch-size", "4", "--d-model", "16", "--layers", "1", "--heads", "2", "--vocab", "32",
             "--num-pairs", "2", "--seq-len", "16", "--eval-examples", "8", "--no-progress"]
    p = _torchrun([*seqmem_args, *small])
    assert p.returncode == 0, p.stderr[-3000:]
    assert "2 processes (DDP)" in p.stderr
    assert [c.name for c in list_checkpoints(tmp_path / "run" / "checkpoints")] == ["ckpt-00000001", "ckpt-00000002"]


def test_torchrun_overwrite_replaces_a_run_on_every_rank(tmp_path):
    """`--overwrite` under torchrun: the other ranks wait for rank 0's checks and its removal of the old run (one
    that ran ahead found the old run's checkpoints and refused to start)."""
    out = tmp_path / "run"
    assert main([*ARGS, "--out", str(out)]) == 0
    old = _rows(out)
    p = _torchrun([*ARGS, "--out", str(out), "--overwrite", "--seed", "1"])
    assert p.returncode == 0, p.stderr[-3000:]
    new = _rows(out)
    assert [r["step"] for r in new] == [r["step"] for r in old] and new[0]["loss"] != old[0]["loss"]
