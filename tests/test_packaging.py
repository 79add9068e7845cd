"""Packaging: optional dependencies are extras with clear messages when missing; the torch lower bound covers the
APIs used; `seqmem eval-harness` runs lm-evaluation-harness on an exported model (when lm-eval is installed)."""

from __future__ import annotations

import importlib.util
import sys
import tomllib
from pathlib import Path

import pytest

from seqmem.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_extras_and_core_dependencies():
    proj = _project()
    core = " ".join(proj["dependencies"])
    assert "matplotlib" not in core  # figures only: the plot extra
    extras = proj["optional-dependencies"]
    for name, pkg in (("plot", "matplotlib"), ("hf", "transformers"), ("data", "datasets"), ("eval", "lm-eval"),
                      ("gpu", "triton"), ("gpu", "flash-linear-attention")):
        assert any(d.startswith(pkg) for d in extras[name]), (name, pkg)


def test_torch_lower_bound_covers_the_apis_used():
    torch_req = next(d for d in _project()["dependencies"] if d.startswith("torch"))
    bound = tuple(int(x) for x in torch_req.split(">=")[1].split(".")[:2])
    src = "\n".join(p.read_text() for p in (ROOT / "src" / "seqmem").rglob("*.py"))
    if "get_autocast_dtype" in src or "is_autocast_enabled(x.device.type)" in src:
        assert bound >= (2, 4), torch_req  # both arrived in torch 2.4


def test_missing_matplotlib_names_the_plot_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    from seqmem.io import MissingExtra, pyplot

    with pytest.raises(MissingExtra, match=r"seqmem\[plot\]"):
        pyplot()
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    assert main(["plot", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and 'pip install "seqmem[plot]"' in err


def test_eval_harness_without_lm_eval_names_the_extra(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    assert main(["eval-harness", "--model", str(tmp_path), "--tasks", "piqa"]) == 2
    assert "pip install 'seqmem[eval]'" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None,
                    reason="lm-eval not installed (pip install 'seqmem[eval]'); its absence is tested above")
def test_eval_harness_on_an_exported_model(tmp_path, capsys, monkeypatch):
    """The whole path offline: train, export, then lm-eval's 'hf' model on a task of our own (local JSON data)."""
    import json

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run, out, tasks = tmp_path / "run", tmp_path / "hf", tmp_path / "tasks"
    (tmp_path / "text.txt").write_text("the cat sat on the mat. " * 200)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"context": "the cat sat on the", "target": "mat"}) + "\n" for _ in range(4)))
    tasks.mkdir()
    (tasks / "tiny.yaml").write_text(
        "task: seqmem_tiny_cloze\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: " + str(data) +
        "\ntest_split: test\noutput_type: loglikelihood\ndoc_to_text: \"{{context}}\"\n"
        "doc_to_target: \" {{target}}\"\nmetric_list:\n  - metric: acc\n    aggregation: mean\n"
        "    higher_is_better: true\n")
    assert main(["train", "--task", "lm", "--dataset", str(tmp_path / "text.txt"), "--mixer", "deltanet", "--layers",
                 "1", "--d-model", "16", "--heads", "2", "--steps", "2", "--batch-size", "2", "--seq-len", "32",
                 "--eval-examples", "2", "--no-progress", "--out", str(run)]) == 0
    assert main(["export-hf", "--run", str(run), "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["eval-harness", "--model", str(out), "--tasks", "no_such_task", "--include-path", str(tasks)]) == 2
    assert "no_such_task" in capsys.readouterr().err
    rc = main(["eval-harness", "--model", str(out), "--tasks", "seqmem_tiny_cloze", "--include-path", str(tasks),
               "--limit", "2", "--json", str(tmp_path / "r.json")])
    assert rc == 0
    res = json.loads((tmp_path / "r.json").read_text())["results"]["seqmem_tiny_cloze"]
    assert res["acc,none"] in (0.0, 0.5, 1.0)
