import json
import subprocess
import sys

import pytest

from seqmem.cli import main

TRAIN = ["train", "--task", "mqar", "--mixer", "deltanet", "--layers", "1", "--d-model", "16", "--heads", "2",
         "--steps", "6", "--batch-size", "4", "--vocab", "32", "--num-pairs", "2", "--seq-len", "16",
         "--eval-examples", "16", "--no-progress", "--checkpoint-every", "3"]


def test_list(capsys):
    assert main(["list", "--d-model", "32", "--heads", "2", "--context", "100"]) == 0
    out = capsys.readouterr().out
    assert "attention" in out and "mamba2" in out and "6,401" in out  # attention: 2·32·100 + 1


def test_train_eval_resume(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*TRAIN, "--out", str(out)]) == 0
    final = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0 <= final["eval_accuracy"] <= 1
    assert (out / "run.json").exists() and (out / "metrics.jsonl").exists()
    assert main(["eval", "--run", str(out), "--examples", "16"]) == 0
    ev = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert ev["loss"] == pytest.approx(final["eval_loss"], rel=1e-6) and ev["changed_task_options"] == {}
    # the trained model on another setting of its task: longer sequences (recorded, also as a JSON file)
    rec = tmp_path / "longer" / "eval.json"
    assert main(["eval", "--run", str(out), "--examples", "16", "--task-option", "seq_len=48", "--json", str(rec)]) == 0
    longer = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert longer["task_options"]["seq_len"] == 48 and longer["changed_task_options"] == {"seq_len": 48}
    assert longer["loss"] != pytest.approx(ev["loss"], rel=1e-6) and json.loads(rec.read_text()) == longer
    # a change the model cannot read (another vocabulary), an unknown option, a directory as --json: refused
    assert main(["eval", "--run", str(out), "--task-option", "vocab_size=64"]) == 2
    assert main(["eval", "--run", str(out), "--task-option", "no_such_option=1"]) == 2
    assert main(["eval", "--run", str(out), "--json", str(tmp_path)]) == 2
    assert "vocabulary" in capsys.readouterr().err
    assert main([*TRAIN, "--out", str(out), "--resume"]) == 0  # already finished: resumes at the end
    # resuming with different arguments is refused
    assert main([*TRAIN[:-2], "--out", str(out), "--resume", "--lr", "0.5"]) == 2


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--task", "mqar", "--mixer", "nope", "--out", "X"],
        ["train", "--task", "mqar", "--mixer", "attention", "--steps", "-5", "--out", "X"],
        ["train", "--task", "bogus", "--mixer", "attention", "--out", "X"],
        ["train", "--task", "mqar", "--mixer", "attention", "--mixer-option", "bad_opt=1", "--out", "X"],
        ["train", "--task", "mqar", "--mixer", "attention", "--mixer-option", "noequals", "--out", "X"],
        ["eval", "--run", "/nonexistent/dir"],
        ["demo", "--mixers", "nope"],
        ["repro", "no_such_paper"],
        ["no_such_command"],
    ],
)
def test_bad_arguments_exit_2_with_one_line(argv, tmp_path):
    argv = [str(tmp_path / "X") if a == "X" else a for a in argv]
    p = subprocess.run([sys.executable, "-m", "seqmem", *argv], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip() and "warning" not in line]
    assert len(lines) == 1 and "error" in lines[0], p.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["repro", "vla", "--scale", "smoke", "--models", "foo"],
        ["repro", "vla", "--scale", "smoke", "--experiments", "nope"],
        ["repro", "echo", "--scale", "smoke", "--action-mask", "--no-mqar"],  # action mask without --models ssm_ska
        ["repro", "echo", "--scale", "smoke", "--models", "nope"],
    ],
)
def test_bad_repro_arguments_print_one_line_and_create_nothing(argv, tmp_path, capsys):
    out = tmp_path / "r"
    assert main([*argv, "--out", str(out)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "error" in err[0], err
    assert not out.exists()


def test_unwritable_out_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main([*TRAIN, "--out", str(blocker / "sub")]) == 2


def test_demo_smoke(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--mixers", "attention,deltanet", "--steps", "3", "--jobs", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| mixer |" in text
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert {r["mixer"] for r in rows} == {"attention", "deltanet"}
    assert all(r["error"] is None for r in rows)
    assert (out / "accuracy_vs_state.png").stat().st_size > 1000


def test_demo_scales_long_context_options_only():
    from seqmem.demo import demo_options

    assert demo_options("attention", 32) == {}  # full attention stays full
    assert demo_options("swa", 32) == {"window": 8}
    assert demo_options("deltanet", 32) == {}


def test_train_into_a_directory_another_process_trains_in_is_refused(tmp_path, capsys):
    """While one process trains into --out (it holds the directory's lock), a second `seqmem train` there —
    with or without --resume — is a one-line usage error that touches nothing; once the lock is free it runs."""
    import fcntl
    import os

    from seqmem.io import LOCK

    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the other process (flock locks are per open file)
    try:
        for extra in ([], ["--resume"]):
            capsys.readouterr()
            assert main([*TRAIN, "--out", str(out), *extra]) == 2
            assert "another process is training into" in capsys.readouterr().err
            assert sorted(p.name for p in out.iterdir()) == [LOCK, "notes.txt"]
    finally:
        os.close(fd)
    assert main([*TRAIN, "--out", str(out)]) == 0
    assert (out / "run.json").exists() and (out / "notes.txt").read_text() == "mine"


def test_a_failed_start_leaves_an_existing_directory_as_it_was(tmp_path, monkeypatch):
    """A run that fails after taking the directory's lock, before its first checkpoint, leaves an existing
    directory as it found it (the lock file it created removed too) and removes a directory it created."""
    import seqmem.cli as cli
    from seqmem.io import is_locked

    seen = []

    def boom(args, rank, world, device, out):
        seen.append(is_locked(out))
        raise RuntimeError("failed before the first checkpoint")

    monkeypatch.setattr(cli, "_train_into", boom)
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(RuntimeError):
        main([*TRAIN, "--out", str(out)])
    assert [p.name for p in out.iterdir()] == ["notes.txt"]  # not even the lock file
    with pytest.raises(RuntimeError):
        main([*TRAIN, "--out", str(tmp_path / "new" / "run")])
    assert not (tmp_path / "new").exists()
    assert seen == [True, True]  # the lock was held while it trained


SMALL = ["train", "--task", "mqar", "--mixer", "deltanet", "--layers", "1", "--d-model", "16", "--heads", "2",
         "--steps", "1", "--batch-size", "2", "--vocab-size", "16", "--num-pairs", "2", "--eval-examples", "2",
         "--no-progress"]


def test_flags_and_options_that_disagree_are_refused(tmp_path, capsys):
    """An explicit flag never loses silently to --task-option / --mixer-option; d_model is no mixer option."""
    out = tmp_path / "run"
    cases = [
        (["--seq-len", "16", "--task-option", "seq_len=32"], "--seq-len 16 and --task-option seq_len=32 disagree"),
        (["--task-option", "vocab_size=8"], "--vocab-size 16 and --task-option vocab_size=8 disagree"),
        (["--task-option", "num_pairs=3"], "--num-pairs 2 and --task-option num_pairs=3 disagree"),
        (["--mixer-option", "n_heads=4"], "n_heads=4 and the model's n_heads=2 disagree"),
        (["--mixer-option", "d_model=32"], "d_model=32 is not a mixer option"),
    ]
    for extra, message in cases:
        assert main([*SMALL, *extra, "--out", str(out)]) == 2, extra
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
        assert not out.exists()
    # agreeing values pass; a task option overrides a flag left at its --task default or taken from --config
    assert main([*SMALL, "--seq-len", "24", "--task-option", "seq_len=24", "--mixer-option", "n_heads=2",
                 "--out", str(out)]) == 0
    assert main([*SMALL, "--task-option", "seq_len=20", "--out", str(tmp_path / "b")]) == 0
    assert json.loads((tmp_path / "b" / "run.json").read_text())["task"]["options"]["seq_len"] == 20
    assert main(["train", "--config", str(out), "--task-option", "seq_len=28", "--out", str(tmp_path / "c")]) == 0
    assert json.loads((tmp_path / "c" / "run.json").read_text())["task"]["options"]["seq_len"] == 28


def _exit_code(argv):
    try:
        return main(argv)
    except SystemExit as e:  # argparse's own errors
        return e.code


def test_eval_harness_checks_its_arguments_before_evaluating(tmp_path, capsys, monkeypatch):
    pytest.importorskip("transformers")
    lm_eval = pytest.importorskip("lm_eval")
    import seqmem.io

    calls = []

    def evaluate(**kw):
        calls.append(kw)
        return {"results": {"t": {"acc": 0.5}}}

    monkeypatch.setattr(lm_eval, "simple_evaluate", evaluate)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "seqmem"}')
    (tmp_path / "adir").mkdir()
    base = ["eval-harness", "--model", str(model), "--tasks", "t"]
    for extra, match in ((["--json", str(tmp_path / "adir")], "a directory"), (["--json", ""], "empty path"),
                         (["--limit", "inf"], "--limit"), (["--limit", "nan"], "--limit"),
                         (["--limit", "2.5"], "--limit"), (["--limit", "0"], "--limit"),
                         (["--batch-size", "0"], "--batch-size"), (["--num-fewshot", "-2"], "--num-fewshot"),
                         (["--device", "bogus"], "--device bogus"), (["--device", "meta"], "--device meta")):
        capsys.readouterr()
        assert _exit_code([*base, *extra]) == 2, extra
        err = capsys.readouterr().err
        assert match in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert not calls, extra  # refused before the evaluation
    assert main([*base, "--limit", "3", "--num-fewshot", "0", "--json", str(tmp_path / "r.json")]) == 0
    assert calls[-1]["limit"] == 3 and isinstance(calls[-1]["limit"], int) and calls[-1]["num_fewshot"] == 0
    assert json.loads((tmp_path / "r.json").read_text())["results"] == {"t": {"acc": 0.5}}
    assert main([*base, "--limit", "0.25"]) == 0 and calls[-1]["limit"] == 0.25
    # a file that cannot be written after all: the results were printed first

    def full_disk(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(seqmem.io, "atomic_write_text", full_disk)
    capsys.readouterr()
    assert main([*base, "--json", str(tmp_path / "r2.json")]) == 1
    assert json.loads(capsys.readouterr().out)["results"] == {"t": {"acc": 0.5}}


def test_starting_seqmem_does_not_import_torch_dynamo():
    """Importing the CLI and every mixer leaves ``torch._dynamo`` unimported: it costs about as much CPU time as
    importing torch (``torch.compiler.disable`` imported it at import time; ``ops._common.compile_disabled`` makes
    the disabled function at its first call after something else imported it), so commands that never compile or
    run an optimizer start about twice as fast."""
    code = ("import sys, seqmem.cli, seqmem, torch\n"
            "m = seqmem.build_mixer('vort_fixed_alpha', 16, n_heads=2)\n"
            "m(torch.randn(1, 4, 16))[0].sum().backward()\n"
            "print('torch._dynamo' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "False", p.stderr


def test_a_compile_disabled_function_gives_the_same_values_traced_or_not():
    """``compile_disabled`` made lazily, also when first made inside a trace (one graph break more there)."""
    import torch._dynamo

    from seqmem.ops._common import compile_disabled
    from seqmem.train.loop import check_compiler

    try:
        check_compiler("cpu")
    except ValueError as e:
        pytest.skip(str(e))
    calls = []

    @compile_disabled
    def floats(n: int) -> tuple[float, ...]:
        calls.append(n)
        return tuple(float(i) / n for i in range(n))

    def f(t: torch.Tensor) -> torch.Tensor:
        return t * sum(floats(4))

    t = torch.randn(3)
    torch._dynamo.reset()
    g = torch.compile(f, backend="eager")
    for _ in range(2):
        torch.testing.assert_close(g(t), f(t), rtol=0, atol=0)
    assert calls and all(n == 4 for n in calls)
