"""Every command sets torch's thread count in one place (``seqmem.cliargs.apply_threads``): ``--threads``, else
``OMP_NUM_THREADS``, else 1 — and names it in its first line."""

from __future__ import annotations

import json

import pytest
import torch

from seqmem.cli import main

TRAIN = ["train", "--task", "mqar", "--mixer", "deltanet", "--layers", "1", "--d-model", "16", "--heads", "2",
         "--steps", "2", "--batch-size", "4", "--vocab-size", "32", "--num-pairs", "2", "--seq-len", "16",
         "--eval-examples", "8", "--no-progress"]


@pytest.fixture(autouse=True)
def _restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("env,flag,expect,source", [
    (None, None, 1, "default"), ("2", None, 2, "OMP_NUM_THREADS"), ("2", "1", 1, "--threads"),
    ("", None, 1, "default"), ("x", None, 1, "default")])
def test_train_threads_default_env_flag_and_first_line(tmp_path, monkeypatch, capsys, env, flag, expect, source):
    if env is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", env)
    torch.set_num_threads(3)
    argv = [*TRAIN, "--out", str(tmp_path / "r")] + (["--threads", flag] if flag else [])
    assert main(argv) == 0
    assert torch.get_num_threads() == expect
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("model:") and f"{expect} torch thread" in first and source in first, first


def test_eval_records_threads_and_bad_threads_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    run = tmp_path / "r"
    assert main([*TRAIN, "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["eval", "--run", str(run), "--examples", "8"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["threads"] == 1
    with pytest.raises(SystemExit) as e:
        main(["eval", "--run", str(run), "--threads", "0"])
    assert e.value.code == 2


def test_every_running_command_has_threads():
    """train, eval, demo, sweep, the benchmarks and the reproductions take --threads (same default)."""
    from seqmem.cli import make_parser
    from seqmem.clihelp import walk_parsers

    have = {name for name, p in walk_parsers(make_parser())
            if any("--threads" in a.option_strings for a in p._actions)}
    for cmd in ("train", "eval", "demo", "sweep", "bench speed", "bench decode", "bench train", "bench numerics",
                "repro vla", "repro vort"):
        assert f"seqmem {cmd}" in have, cmd
