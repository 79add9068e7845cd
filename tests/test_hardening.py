"""Hardening (issue #16): each case first reproduced the failure it guards against.

The per-case map of what is tested where is in docs/reliability.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from seqmem.cli import main

TRAIN = ["train", "--task", "mqar", "--mixer", "deltanet", "--layers", "1", "--d-model", "16", "--heads", "2",
         "--steps", "4", "--batch-size", "4", "--vocab-size", "32", "--num-pairs", "2", "--seq-len", "16",
         "--eval-examples", "8", "--no-progress", "--checkpoint-every", "2"]


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _main(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse errors exit from inside main (one line, code 2)
        return e.code


def _fails_one_line(argv: list[str], capsys, match: str) -> str:
    capsys.readouterr()
    assert _main(argv) == 2
    text = capsys.readouterr().err
    err = [line for line in text.splitlines() if "error" in line.lower()]
    assert "Traceback" not in text and len(err) == 1, text
    assert err[0].startswith("seqmem") and ": error:" in err[0] and match in err[0], err
    return err[0]


def _final(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


# ------------------------------------------------------------------------------- 1. no lost or mixed runs
def test_rerun_into_existing_run_is_refused_unless_resume_or_overwrite(tmp_path, capsys):
    run = tmp_path / "run"
    assert main([*TRAIN, "--out", str(run)]) == 0
    before = _snapshot(run)
    # the same or another run into the directory: refused, nothing changes (it used to overwrite run.json,
    # truncate metrics.jsonl and keep the old checkpoints, so eval reported the old weights under the new config)
    _fails_one_line([*TRAIN, "--out", str(run)], capsys, "--overwrite")
    _fails_one_line([*TRAIN, "--seed", "1", "--steps", "6", "--out", str(run)], capsys, "--resume")
    _fails_one_line([*TRAIN, "--out", str(run), "--resume", "--overwrite"], capsys, "not both")
    # --overwrite with arguments that fail validation leaves the old run alone
    _fails_one_line([*TRAIN, "--mixer-option", "bogus=1", "--out", str(run), "--overwrite"], capsys, "bogus")
    assert _snapshot(run) == before

    assert main([*TRAIN, "--seed", "1", "--steps", "6", "--out", str(run), "--overwrite"]) == 0
    final = _final(capsys)
    spec = json.loads((run / "run.json").read_text())
    assert spec["train"]["seed"] == 1 and spec["train"]["steps"] == 6
    cks = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert cks == ["ckpt-00000004", "ckpt-00000006"]  # only the new run's checkpoints
    assert [r["step"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())][-1] == 6
    # no leftovers of the old run (the directory's lock file is not one: it stays, released)
    assert not [p for p in run.iterdir() if p.name.startswith(".") and p.name != ".lock"]
    assert main(["eval", "--run", str(run), "--examples", "8"]) == 0
    ev = _final(capsys)
    assert ev["checkpoint"].endswith("ckpt-00000006") and ev["loss"] == pytest.approx(final["eval_loss"], rel=1e-6)


def test_library_train_refuses_to_mix_runs(tmp_path):
    from seqmem.models import LanguageModel, LMConfig
    from seqmem.tasks.mqar import MQARTask
    from seqmem.train import TrainConfig, train

    def setup():
        torch.manual_seed(0)
        task = MQARTask(vocab_size=32, num_pairs=2, seq_len=16)
        return LanguageModel(LMConfig(vocab_size=32, d_model=16, n_layers=1, n_heads=2, mixer="deltanet")), task

    cfg = TrainConfig(steps=2, batch_size=4, eval_examples=8, checkpoint_every=1)
    train(*setup(), cfg, out_dir=tmp_path)
    with pytest.raises(ValueError, match="already holds checkpoints"):
        train(*setup(), cfg, out_dir=tmp_path)


@pytest.mark.parametrize("bad", [["--mixer", "nope"], ["--mixer-option", "bogus=1"], ["--resume"],
                                 ["--task-option", "num_pairs=999"]])
def test_failed_run_leaves_no_directory_it_created(tmp_path, capsys, bad):
    out = tmp_path / "a" / "b" / "run"
    argv = [*TRAIN, "--out", str(out)]
    if bad[0] == "--mixer":
        argv[argv.index("deltanet")] = bad[1]
    else:
        argv += bad
    capsys.readouterr()
    assert main(argv) == 2
    assert list(tmp_path.iterdir()) == []


def test_failed_run_keeps_an_existing_directory(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert main([*TRAIN, "--mixer-option", "bogus=1", "--out", str(tmp_path)]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


# ----------------------------------------------------------------------- 2. nothing executes from a run dir
class _Payload:
    """Unpickling this runs ``os.mkdir(marker)``: what a planted ``trainer.pt`` could do."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return os.mkdir, (self.marker,)


def test_real_trainer_state_loads_with_weights_only(tmp_path, capsys):
    from seqmem.train.checkpoint import latest_good_checkpoint, load_trainer_state

    run = tmp_path / "run"
    assert main([*TRAIN, "--out", str(run)]) == 0
    ck = latest_good_checkpoint(run / "checkpoints")
    st = torch.load(ck / "trainer.pt", weights_only=True)  # plain tensors and containers only
    assert st["step"] == 4 and isinstance(st["data_rng"], torch.Tensor) and st["optimizer"]["state"]
    assert load_trainer_state(ck)["train_config"]["seed"] == 0


def test_resume_does_not_unpickle_a_planted_trainer_state(tmp_path, capsys):
    from seqmem.train.checkpoint import _sha256, latest_good_checkpoint

    run = tmp_path / "run"
    assert main([*TRAIN, "--steps", "6", "--out", str(run)]) == 0
    ck = latest_good_checkpoint(run / "checkpoints")
    marker = tmp_path / "pwned"
    torch.save({"step": 2, "x": _Payload(marker)}, ck / "trainer.pt")
    man = json.loads((ck / "manifest.json").read_text())
    man["files"]["trainer.pt"] = _sha256(ck / "trainer.pt")  # the attacker rewrites the hash beside it
    (ck / "manifest.json").write_text(json.dumps(man))
    _fails_one_line([*TRAIN, "--steps", "6", "--out", str(run), "--resume"], capsys, "trainer.pt")
    assert not marker.exists()


def _fresh_lattice_lib(monkeypatch, cache: Path):
    import seqmem.ops.lattice._cpp as lc

    monkeypatch.setenv("SEQMEM_CACHE", str(cache))
    monkeypatch.delenv("SEQMEM_LATTICE_BACKEND", raising=False)
    monkeypatch.setattr(lc, "_LIB", None)
    monkeypatch.setattr(lc, "_FAILED", None)
    return lc


def test_lattice_cache_refuses_a_directory_or_library_writable_by_others(tmp_path, monkeypatch):
    import shutil

    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler")
    good = tmp_path / "good"
    lc = _fresh_lattice_lib(monkeypatch, good)
    assert lc.available()
    so = next(good.glob("lattice_kernel_*.so"))
    assert not so.stat().st_mode & 0o022 and not good.stat().st_mode & 0o077

    # a world-writable cache directory holding a planted library with the predictable name
    bad = tmp_path / "bad"
    bad.mkdir()
    bad.chmod(0o777)
    marker = tmp_path / "loaded"
    src = tmp_path / "evil.c"
    src.write_text(f'#include <stdio.h>\n__attribute__((constructor)) static void f(void)'
                   f'{{ FILE *h = fopen("{marker}", "w"); if (h) fclose(h); }}\n')
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("c++")
    subprocess.run([cc, "-shared", "-fPIC", "-x", "c", str(src), "-o", str(bad / so.name)], check=True)
    lc = _fresh_lattice_lib(monkeypatch, bad)
    with pytest.warns(RuntimeWarning, match="writable by others"):
        assert lc.available()  # built afresh in a private directory instead
    assert not marker.exists()

    # a library file writable by others inside a private directory
    bad.chmod(0o700)
    (bad / so.name).chmod(0o666)
    lc = _fresh_lattice_lib(monkeypatch, bad)
    with pytest.warns(RuntimeWarning, match="writable by others"):
        assert lc.available()
    assert not marker.exists()


# ------------------------------------------------------------------- 5. one line + exit 2, never a traceback
@pytest.mark.parametrize("device,match", [
    pytest.param("cuda", "--device cuda", marks=pytest.mark.skipif(torch.cuda.is_available(), reason="has a GPU")),
    ("cuda:99", "--device cuda:99"), ("foo", "--device foo"), ("meta", "--device meta"), ("", "--device")])
def test_bad_device_is_one_line(tmp_path, capsys, device, match):
    _fails_one_line([*TRAIN, "--device", device, "--out", str(tmp_path / "r")], capsys, match)
    assert list(tmp_path.iterdir()) == []


def test_plot_out_is_a_file(tmp_path, capsys):
    run = tmp_path / "run"
    assert main([*TRAIN, "--out", str(run)]) == 0
    f = tmp_path / "file"
    f.write_text("x")
    _fails_one_line(["plot", str(run), "--out", str(f)], capsys, str(f))
    assert f.read_text() == "x"


@pytest.fixture(scope="module")
def two_checkpoint_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("h5") / "run"
    assert main([*TRAIN, "--out", str(run)]) == 0  # checkpoints at steps 2 and 4
    return run


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize("manifest", ["[]", '"x"', "3", "null", '{"step": 4}', '{"files": []}', '{"files": {}}',
                                      '{"files": {"model.safetensors": 5}}', '{"files": {"trainer.pt": "00"}}'])
def test_bad_manifest_falls_back_to_the_older_checkpoint(two_checkpoint_run, tmp_path, capsys, manifest):
    from seqmem.train.checkpoint import latest_good_checkpoint, verify_checkpoint

    run = _copy(two_checkpoint_run, tmp_path / "run")
    newest = run / "checkpoints" / "ckpt-00000004"
    (newest / "manifest.json").write_text(manifest)
    assert not verify_checkpoint(newest)
    with pytest.warns(UserWarning, match="corrupt"):
        assert latest_good_checkpoint(run / "checkpoints").name == "ckpt-00000002"
    capsys.readouterr()
    with pytest.warns(UserWarning, match="corrupt"):
        assert main(["eval", "--run", str(run), "--examples", "8"]) == 0
    assert _final(capsys)["checkpoint"].endswith("ckpt-00000002")


@pytest.mark.parametrize("text", ["{not json", "[]", '"run"', '{"task": 3, "model": {}}', "\xff\xfe"])
def test_corrupt_run_json_names_the_file(two_checkpoint_run, tmp_path, capsys, text):
    run = _copy(two_checkpoint_run, tmp_path / "run")
    (run / "run.json").write_bytes(text.encode("latin-1"))
    line = _fails_one_line(["eval", "--run", str(run)], capsys, "run.json")
    assert str(run / "run.json") in line
    _fails_one_line([*TRAIN, "--out", str(run), "--resume"], capsys, str(run / "run.json"))


# ------------------------------------------------------------------------------------------------ 8. minor
def test_orphaned_tmp_checkpoint_dirs_are_cleaned(tmp_path, capsys):
    run = tmp_path / "run"
    assert main([*TRAIN, "--steps", "6", "--out", str(run)]) == 0
    ck = run / "checkpoints"
    for i in range(2):  # what a kill -9 during a checkpoint write leaves behind
        (ck / f".tmp-ckpt-orphan{i}").mkdir()
        (ck / f".tmp-ckpt-orphan{i}" / "model.safetensors").write_bytes(b"x" * 100)
    assert main([*TRAIN, "--steps", "8", "--out", str(run), "--resume"]) == 0
    assert sorted(p.name for p in ck.iterdir()) == ["ckpt-00000006", "ckpt-00000008"]


def test_out_empty_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _fails_one_line([*TRAIN, "--out", ""], capsys, "--out")
    _fails_one_line([*TRAIN, "--out", "  "], capsys, "--out")
    assert list(tmp_path.iterdir()) == []


def test_default_checkpoint_interval_lets_a_killed_run_resume(tmp_path, capsys):
    i = TRAIN.index("--checkpoint-every")
    argv = TRAIN[:i] + TRAIN[i + 2:]
    run = tmp_path / "run"
    assert main([*argv, "--steps", "20", "--out", str(run)]) == 0
    spec = json.loads((run / "run.json").read_text())
    assert spec["train"]["checkpoint_every"] == 2  # max(1, steps // 10)
    from seqmem.cli import default_checkpoint_every

    assert [default_checkpoint_every(s) for s in (1, 9, 10, 1000, 10**6)] == [1, 1, 1, 100, 1000]
    # a run started with another interval (runs from before the default: 0) resumes without the flag
    old = tmp_path / "old"
    assert main([*argv, "--steps", "20", "--checkpoint-every", "0", "--out", str(old)]) == 0
    capsys.readouterr()
    assert main([*argv, "--steps", "20", "--out", str(old), "--resume"]) == 0
    assert json.loads((old / "run.json").read_text())["train"]["checkpoint_every"] == 0


def test_did_you_mean():
    import seqmem
    from seqmem.tasks import build_task

    with pytest.raises(ValueError, match="did you mean 'deltanet'"):
        seqmem.build_mixer("deltnet", 16)
    with pytest.raises(ValueError, match="did you mean 'chunk_size'"):
        seqmem.build_mixer("deltanet", 16, chunksize=8)
    with pytest.raises(ValueError, match="did you mean 'mqar'"):
        build_task("mqr")
    with pytest.raises(ValueError, match="did you mean 'num_pairs'"):
        build_task("mqar", numpairs=3)
    with pytest.raises(ValueError) as e:
        seqmem.build_mixer("zzzzzz", 16)
    assert "did you mean" not in str(e.value) and "registered mixers" in str(e.value)


# ---------------------------------------------------------------------------------- 6. option validation
def _option_types(name: str) -> dict[str, object]:
    import inspect
    import typing

    import seqmem
    from seqmem.mixers.base import Mixer

    entry, out = seqmem.get_entry(name), {}
    for klass in entry.cls.__mro__:
        if klass is object or not issubclass(klass, Mixer):
            continue
        hints = typing.get_type_hints(klass.__init__)
        for p in inspect.signature(klass.__init__).parameters.values():
            if p.name in entry.valid_options() and p.name not in out and p.name in hints:
                out[p.name] = hints[p.name]
    return out


def _base_type(t: object) -> object:
    import typing

    args = [a for a in typing.get_args(t) if a is not type(None)]
    return args[0] if len(args) == 1 else t


_BAD = {float: [float("nan"), float("inf"), float("-inf"), True, "1.0", [1.0]],
        int: [1.5, 2.0, True, "3", float("nan")],
        bool: [1, 0, "true", "false", 2.0, None],
        str: [1, True, None]}


def _fuzz_cases():
    import seqmem

    for name in seqmem.list_mixers():
        for opt, t in _option_types(name).items():
            for v in _BAD.get(_base_type(t), []):
                if v is None and _base_type(t) is not t:
                    continue  # X | None accepts None
                yield name, opt, v


def test_every_typed_option_of_every_mixer_refuses_nan_inf_bool_str():
    """Every float/int/bool/str option of every registered mixer, fed NaN, ±Inf, a bool, a string, a float for an
    int, an int for a bool (≈ 1,000 cases): a ValueError naming the option (NaN/Inf were accepted by about 40
    float options, non-int seeds and non-bool flags were accepted or crashed with other errors)."""
    import seqmem

    cases = list(_fuzz_cases())
    assert len(cases) > 900
    accepted, wrong = [], []
    for name, opt, v in cases:
        kw = {opt: v} if opt == "n_heads" else {"n_heads": 2, opt: v}
        try:
            seqmem.build_mixer(name, 16, **kw)
            accepted.append((name, opt, v))
        except ValueError as e:
            if opt not in str(e):
                wrong.append((name, opt, v, str(e)))
        except Exception as e:  # noqa: BLE001
            wrong.append((name, opt, v, repr(e)))
    assert not accepted and not wrong, (accepted[:10], wrong[:10])


# values just outside / just inside each kind of domain (keys of seqmem.mixers.base._DOMAINS), for int and float
_EDGES = {
    ">0": {int: ([0, -1], [1]), float: ([0.0, -1e-12], [1e-12])},
    ">=0": {int: ([-1], [0]), float: ([-1e-12], [0.0])},
    ">1": {int: ([1, 0], [2]), float: ([1.0], [1.0 + 1e-9])},
    "even>0": {int: ([0, 1, 3, -2], [2])},
    "(0,1)": {float: ([0.0, 1.0], [1e-9, 1 - 1e-9])},
    "(0,1]": {float: ([0.0, 1.0 + 1e-9], [1e-9, 1.0])},
    "[0,1]": {float: ([-1e-12, 1.0 + 1e-9], [0.0, 1.0])},
    "[0,1)": {float: ([-1e-12, 1.0], [0.0, 1 - 1e-9])},
    "[1,1.5)": {float: ([1 - 1e-9, 1.5], [1.0, 1.5 - 1e-9])},
}


def _domain_cases():
    """(mixer, option, domain, value, inside?) for every declared ``option_domains`` entry of every registered
    mixer that is one of its options (registered variants included)."""
    import seqmem

    for name in seqmem.list_mixers():
        types = _option_types(name)
        for opt, dom in seqmem.get_entry(name).cls.option_domains.items():
            if opt not in types:
                continue
            outside, inside = _EDGES[dom][_base_type(types[opt])]
            yield from ((name, opt, dom, v, False) for v in outside)
            yield from ((name, opt, dom, v, True) for v in inside)


def test_option_domains_are_real_options_with_known_edges():
    """Every declared domain names an annotated int/float parameter of the class (a typo would check nothing)
    and is a domain this test knows edges for."""
    import typing

    import seqmem
    from seqmem.mixers.base import _DOMAINS, Mixer

    assert set(_EDGES) == set(_DOMAINS)
    for name in seqmem.list_mixers():
        cls = seqmem.get_entry(name).cls
        hints = {}
        for klass in cls.__mro__:
            if isinstance(klass, type) and issubclass(klass, Mixer):
                hints = {**typing.get_type_hints(klass.__init__), **hints}
        for opt, dom in cls.option_domains.items():
            assert opt in hints, f"{cls.__name__}.option_domains: {opt} is not an option"
            assert _base_type(hints[opt]) in _EDGES[dom], f"{cls.__name__}: {opt} {hints[opt]} vs {dom}"


def test_every_declared_option_domain_refuses_just_outside_and_accepts_just_inside():
    """From the declarations (``Mixer.option_domains``, merged over the class hierarchy): a value just outside
    each domain is a one-line ValueError naming the option and the domain; a value just inside builds."""
    import seqmem
    from seqmem.mixers.base import _DOMAINS

    cases = list(_domain_cases())
    assert len({(n, o) for n, o, *_ in cases}) > 100
    wrong = []
    for name, opt, dom, v, inside in cases:
        # an option that sets the heads itself (Mamba2's headdim) is given alone: with n_heads beside it the two
        # must agree, a refusal of its own
        alone = opt == "n_heads" or opt == seqmem.get_entry(name).cls.head_dim_option
        kw = {opt: v} if alone else {"n_heads": 2, opt: v}
        try:
            seqmem.build_mixer(name, 16, **kw)
            if not inside:
                wrong.append((name, opt, v, "accepted"))
        except ValueError as e:
            msg = str(e)
            if inside or opt not in msg or _DOMAINS[dom][0] not in msg or "\n" in msg:
                wrong.append((name, opt, v, msg))
        except Exception as e:  # noqa: BLE001
            wrong.append((name, opt, v, repr(e)))
    assert not wrong, wrong[:10]


@pytest.mark.parametrize("flag,value,match", [
    ("--mlp-ratio", "nan", "mlp_ratio"), ("--mlp-ratio", "inf", "mlp_ratio"), ("--weight-decay", "nan", "weight_decay"),
    ("--weight-decay", "-inf", "weight_decay"), ("--lr", "nan", "--lr")])
def test_cli_float_options_refuse_nan_inf(tmp_path, capsys, flag, value, match):
    line = _fails_one_line([*TRAIN, f"{flag}={value}", "--out", str(tmp_path / "r")], capsys, match)
    assert "learning rate" not in line
    assert list(tmp_path.iterdir()) == []


def test_configs_refuse_nan_and_wrong_types():
    from seqmem.models import LMConfig
    from seqmem.train import TrainConfig

    for kw in ({"mlp_ratio": float("nan")}, {"norm_eps": float("inf")}, {"tie_embeddings": 1}, {"d_model": 16.0}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            LMConfig(**kw)
    for kw in ({"weight_decay": float("nan")}, {"clip": float("inf")}, {"seed": 1.5}, {"betas": (0.9, float("nan"))},
               {"warmup_frac": float("nan")}, {"lr": True}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            TrainConfig(**kw)


# ------------------------------------------------------------------------------------------- 7. NaN input
def _nan_at(t: int = 13) -> torch.Tensor:
    x = torch.randn(1, 24, 16)
    x[0, t, 3] = float("nan")
    return x


def test_check_finite_names_the_bad_input():
    import seqmem
    from seqmem.mixers.base import NonFiniteError, set_check_finite

    prev = set_check_finite(True)
    try:
        for name in ("vla", "vort", "deltanet"):
            with pytest.raises(NonFiniteError, match="input x contains 1 NaN/Inf value.*batch 0, token 13 \\(nan\\)"):
                seqmem.build_mixer(name, 16, n_heads=2)(_nan_at())
    finally:
        set_check_finite(prev)


@pytest.mark.parametrize("name,match", [("vla", "NaN/Inf reached the Sherman-Morrison solve"),
                                        ("vla_v2", "NaN/Inf reached"), ("vort", "NaN/Inf in the input x")])
def test_nan_input_without_checks_is_a_clear_error(name, match):
    """vla raised torch's linear-algebra error and vort 'alpha must be finite' for a NaN input."""
    import seqmem

    torch.manual_seed(0)
    with pytest.raises(ValueError, match=match):
        seqmem.build_mixer(name, 16, n_heads=2)(_nan_at())


def test_reference_forms_keep_nan_causal():
    """Documented in docs/reliability.md: a NaN at token t never reaches an earlier token in the reference forms;
    the fast (chunked/parallel) forms may spread it to earlier tokens of its chunk or block (0·NaN = NaN in a
    masked matmul), so with the checks off a NaN poisons its whole chunk there."""
    import seqmem

    for name in seqmem.list_mixers():
        torch.manual_seed(0)
        m = seqmem.build_mixer(name, 16, n_heads=2, impl="reference").eval()
        try:
            with torch.no_grad():
                y, _ = m(_nan_at())
        except ValueError:
            assert name in ("vla", "vla_v2", "vort"), name  # the clear errors above
            continue
        assert torch.isfinite(y[0, :13]).all(), name
