"""``seqmem repro echo --scale smoke`` end to end, plus the model configs (params, placements, state
sizes)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from seqmem.models import LanguageModel
from seqmem.repro import echo
from seqmem.tasks.echo_tasks import ECHO_TASKS, EchoMixture, EchoMQAR, EchoToolTrace


def test_repro_echo_smoke(tmp_path):
    args = SimpleNamespace(scale="smoke", out=tmp_path, seed=0, models="ssm,ssm_attn,ssm_ska")
    assert echo.run(args) == 0
    for name in ("table2_niah_length", "table3_transfer", "models_state", "mqar_grid"):
        assert (tmp_path / f"{name}.md").exists() and (tmp_path / f"{name}.json").exists()
    assert (tmp_path / "table2_niah_length.png").stat().st_size > 1000
    t3 = (tmp_path / "table3_transfer.md").read_text()
    assert "paper SSM+SKA" in t3 and "ours SSM+SKA" in t3 and "85.3" in t3
    res = json.loads((tmp_path / "echo_results.json").read_text())
    for m in echo.MODELS:
        r = res["models"][m]
        assert set(r["grids"]) == set(ECHO_TASKS)
        assert all(0 <= v <= 100 for g in r["grids"].values() for v in g.values())
    # constant state for SSM and SSM+SKA, growing KV cache for attention
    rs = res["models"]
    assert rs["ssm_ska"]["state_floats@64"] == rs["ssm_ska"]["state_floats@4096"]
    assert rs["ssm_attn"]["state_floats@4096"] > rs["ssm_attn"]["state_floats@64"]


def test_submillion_param_counts():
    """§4.1: with our Mamba-2 the three models are ≈1.04M / 0.96M / 0.95M (paper 1.11M / 998K /
    982K);
    the exact attention − SKA difference per layer is 2·d·d − 2·d·H·r = 8,192 (two layers: 16,384)."""
    n = {m: LanguageModel(echo.submillion_config(m)).num_parameters() for m in echo.MODELS}
    assert n["ssm_attn"] - n["ssm_ska"] == 2 * (2 * 128 * 128 - 2 * 128 * 4 * 24 - 2)
    for m, paper in echo.PAPER_PARAMS.items():
        assert abs(n[m] - paper) / paper < 0.12


def test_50m_placement_and_first_last_rule():
    cfg = echo.echo50m_config()
    assert [i for i, m in enumerate(cfg.mixer) if m == "ska"] == [2, 6, 10, 14]
    assert cfg.mixer[0] == cfg.mixer[-1] == "mamba2"
    with pytest.raises(ValueError):
        echo.hybrid_config(64, 4, 2, [3])
    st = echo.meta_stats(echo.echo50m_config(), (64, 4096))
    assert st["state_floats@64"] == st["state_floats@4096"]  # constant-size state (no KV cache)


def test_echo_tasks_protocol():
    g = torch.Generator().manual_seed(0)
    for task in (EchoMixture(), EchoMQAR(num_pairs=4, gap=64), EchoToolTrace(seq_len=64)):
        x, y = task.sample(3, g)
        assert x.shape == y.shape == (3, task.seq_len) and x.dtype == torch.long
        assert (x >= 0).all() and (x < task.vocab_size).all()
        assert ((y != -100).sum(1) >= 1).all()
        xe, _ = task.eval_data(4)
        assert torch.equal(xe[:2], task.eval_data(2)[0])
    # tool trace: the answer is the LATEST result of the queried (agent, tool) pair
    t = EchoToolTrace(seq_len=64, n_calls=8, n_pairs=2)
    x, y = t.sample(20, g)
    for b in range(20):
        toks = x[b].tolist()
        a, tool = toks[-4], toks[-2]
        latest = [
            toks[i + 4]
            for i in range(len(toks) - 5)
            if toks[i] == a and toks[i + 2] == tool and toks[i + 1] == 4 and toks[i + 3] == 3
        ]
        assert y[b, -1] == latest[-1]
    with pytest.raises(ValueError):
        EchoMQAR(num_pairs=100)


def test_echo_koopman_configs_match_paper_param_counts():
    """With the Koopman MLP, Echo-50M has 50.1M and Echo-180M 184.9M parameters (paper: "50M", "180M";
    ours: 50.1M / 185.0M), tied V = 32,000, Mamba-2 d_state 64."""
    p50 = echo.meta_stats(echo.echo50m_config(ffn="koopman"), (64,))["params"]
    p180 = echo.meta_stats(echo.echo180m_config(ffn="koopman"), (64,))["params"]
    assert abs(p50 - 50.1e6) < 0.05e6 and abs(p180 - 185.0e6) < 0.2e6


def test_repro_echo_seeds_resume_and_aggregate(tmp_path, monkeypatch):
    """--seeds: every (seed, model) record is kept, a rerun takes them instead of training again, Tables 2-3 give
    the mean over seeds and transfer_seeds the mean ± std with the per-seed values; a record from another
    configuration is refused."""
    from seqmem.repro.echo import runner

    args = SimpleNamespace(scale="smoke", out=tmp_path, seed=3, models="ssm,ssm_ska", seeds=2, no_mqar=True)
    assert echo.run(args) == 0
    for s in (3, 4):
        for m in ("ssm", "ssm_ska"):
            assert (tmp_path / "seeds" / f"seed-{s}" / f"{m}.json").exists()
    assert not (tmp_path / "mqar_grid.json").exists()  # --no-mqar
    res = json.loads((tmp_path / "echo_results.json").read_text())
    assert res["seeds"] == [3, 4]
    per = res["per_seed"]
    t3 = json.loads((tmp_path / "table3_transfer.json").read_text())
    seeds_t = json.loads((tmp_path / "transfer_seeds.json").read_text())
    row = next(r for r in t3["rows"] if r["task"] == "MQAR")
    srow = next(r for r in seeds_t["rows"] if r["task"] == "MQAR")
    for m, label in (("ssm", "SSM"), ("ssm_ska", "SSM+SKA")):
        vals = [sum(per[s][m]["grids"]["MQAR"].values()) / len(per[s][m]["grids"]["MQAR"]) for s in ("3", "4")]
        assert srow[f"ours {label} per seed"] == pytest.approx(vals)
        assert row[f"ours {label}"] == pytest.approx(sum(vals) / 2)
        assert srow[f"ours {label}"].startswith(f"{sum(vals) / 2:.1f} ± ")
    assert any(r["task"] == "NIAH T = 64" for r in seeds_t["rows"])
    # Table 3's "Mean" is over all lengths and KV counts (its caption): it stands beside our mean over every cell,
    # and our mean of the task means has no paper value
    for rows in (t3["rows"], seeds_t["rows"]):
        by_task = {r["task"]: r for r in rows}
        assert "paper SSM" not in by_task["Mean (of task means)"]
        assert by_task["Mean (of all cells)"]["paper SSM+SKA"] == 81.1
    srow = next(r for r in seeds_t["rows"] if r["task"] == "Mean (of all cells)")
    for m, label in (("ssm", "SSM"), ("ssm_ska", "SSM+SKA")):
        cells = [[v for g in per[s][m]["grids"].values() for v in g.values()] for s in ("3", "4")]
        assert srow[f"ours {label} per seed"] == pytest.approx([sum(c) / len(c) for c in cells])

    # a rerun trains nothing: every record is kept
    def no_training(*a, **k):
        raise AssertionError("trained again")

    monkeypatch.setattr(runner, "fit_lm", no_training)
    assert echo.run(args) == 0
    assert json.loads((tmp_path / "transfer_seeds.json").read_text())["rows"] == seeds_t["rows"]
    # a record written under another configuration is refused, not silently mixed in
    rec_path = tmp_path / "seeds" / "seed-3" / "ssm.json"
    rec = json.loads(rec_path.read_text())
    rec["key"]["config"]["steps"] = 999
    rec_path.write_text(json.dumps(rec))
    with pytest.raises(ValueError, match="another configuration"):
        echo.run(args)
    with pytest.raises(ValueError, match="--seeds"):
        echo.run(SimpleNamespace(scale="smoke", out=tmp_path / "x", seed=0, models="ssm", seeds=0, no_mqar=True))


def test_a_cut_off_transfer_training_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    """With --seeds each training checkpoints into its run directory: one cut off mid-way (a session's end) continues
    from its newest checkpoint and ends with the uninterrupted run's record; the checkpoints go once it is written."""
    import seqmem.train
    from seqmem.repro.echo import runner
    from seqmem.repro.echo.configs import SCALES
    from seqmem.repro.echo.grids import task_grids

    sc = SCALES["smoke"]
    grids = task_grids(sc["grid"])
    whole = runner._train_and_score("ssm", sc, grids, 0, tmp_path / "whole")
    assert whole["resumed_from_step"] == 0 and whole["train_cpu_seconds"] > 0

    real_train = seqmem.train.train

    def cut(*a, **k):
        real_train(*a, **k, stop_after=2)
        raise KeyboardInterrupt("the session ended")

    monkeypatch.setattr(seqmem.train, "train", cut)
    with pytest.raises(KeyboardInterrupt):
        runner._train_and_score("ssm", sc, grids, 0, tmp_path / "cut")
    assert (tmp_path / "cut" / "checkpoints").is_dir()
    monkeypatch.setattr(seqmem.train, "train", real_train)
    resumed = runner._train_and_score("ssm", sc, grids, 0, tmp_path / "cut")
    assert resumed["resumed_from_step"] == 2
    assert resumed["train_final"] == pytest.approx(whole["train_final"], rel=1e-5)
    assert resumed["niah"] == pytest.approx(whole["niah"])
    assert resumed["grids"] == whole["grids"]

    # through run(): the record is written and the run's checkpoints removed
    args = SimpleNamespace(scale="smoke", out=tmp_path / "o", seed=0, models="ssm", seeds=1, no_mqar=True)
    assert echo.run(args) == 0
    assert (tmp_path / "o" / "seeds" / "seed-0" / "ssm.json").exists()
    assert not (tmp_path / "o" / "seeds" / "seed-0" / "ssm" / "checkpoints").exists()


def test_transfer_suite_ska_chunk_and_power_options(tmp_path, monkeypatch):
    """--ska-chunk / --ska-power reach the SKA layers, the record's configuration key and the command; the
    defaults (chunk 16, K = 2) leave the key as before, so earlier records are kept."""
    from seqmem.repro.echo import runner

    cfg = echo.submillion_config("ssm_ska", chunk_size=64, power=1)
    assert cfg.mixer_options[-1] == {"rank": 24, "chunk_size": 64, "power": 1}
    assert "power" not in echo.submillion_config("ssm_ska").mixer_options[-1]
    seen = []

    def fake_fit(cfg, task, tcfg, seed, out_dir=None):
        seen.append(cfg.mixer_options[-1])
        raise RuntimeError("stop after the config")

    monkeypatch.setattr(runner, "fit_lm", fake_fit)
    args = SimpleNamespace(scale="smoke", out=tmp_path, seed=0, models="ssm_ska", seeds=1, no_mqar=True,
                           ska_chunk=64, ska_power=1)
    with pytest.raises(RuntimeError, match="stop"):
        echo.run(args)
    assert seen == [{"rank": 8, "chunk_size": 64, "power": 1}]
    for bad in (dict(ska_chunk=0), dict(ska_power=-1)):
        with pytest.raises(ValueError, match="--ska"):
            echo.run(SimpleNamespace(**{**vars(args), **bad}))


def test_transfer_suite_action_mask_option(tmp_path, monkeypatch, capsys):
    """--action-mask: the training mixture, NIAH and every grid task give the oracle fact mask; the record's key and
    the command say so; models without SKA and the MQAR grid are refused; chunk >= 64 says SKA cannot train."""
    from seqmem.repro.echo import runner

    seen = []

    def fake_fit(cfg, task, tcfg, seed, out_dir=None):
        seen.append(task)
        raise RuntimeError("stop after the task")

    monkeypatch.setattr(runner, "fit_lm", fake_fit)
    args = SimpleNamespace(scale="smoke", out=tmp_path, seed=0, models="ssm_ska", seeds=1, no_mqar=True,
                           action_mask=True)
    with pytest.raises(RuntimeError, match="stop"):
        echo.run(args)
    assert isinstance(seen[0], EchoMixture) and seen[0].action_mask and len(seen[0].sample(2)) == 3
    grids = echo.task_grids("smoke", action_mask=True)
    plain = echo.task_grids("smoke")
    for tn, cells in grids.items():
        for (lab, t), (lab0, t0) in zip(cells, plain[tn], strict=True):
            assert lab == lab0 and t.action_mask and not t0.action_mask
            assert torch.equal(t.eval_data(3)[0], t0.eval_data(3)[0])
    with pytest.raises(ValueError, match="only SKA layers"):
        echo.run(SimpleNamespace(**{**vars(args), "models": "ssm,ssm_ska"}))
    with pytest.raises(ValueError, match="--no-mqar"):
        echo.run(SimpleNamespace(**{**vars(args), "no_mqar": False}))
    with pytest.raises(RuntimeError, match="stop"):
        echo.run(SimpleNamespace(**{**vars(args), "ska_chunk": 64}))
    assert "no SKA parameter ever gets a gradient" in capsys.readouterr().out


def test_repro_echo_smoke_with_action_mask(tmp_path):
    args = SimpleNamespace(scale="smoke", out=tmp_path, seed=0, models="ssm_ska", no_mqar=True, action_mask=True)
    assert echo.run(args) == 0
    assert "--action-mask" in (tmp_path / "table2_niah_length.md").read_text()
    res = json.loads((tmp_path / "echo_results.json").read_text())
    assert set(res["models"]["ssm_ska"]["grids"]) == set(ECHO_TASKS)


def test_chunk_at_least_the_training_length_trains_no_ska():
    """With SKA chunk 64 and training sequences of 64 tokens, every position is in chunk 0 (eqs. 8-10 read no
    statistics): SKA outputs 0 and, with W_o starting at 0, every SKA parameter's gradient is exactly 0, mask or
    not; with chunk 16 W_o gets a gradient."""
    from seqmem.train.loop import scored_loss

    x, y, am = EchoMixture(seq_len=64, action_mask=True).sample(4, torch.Generator().manual_seed(0))
    for chunk in (64, 16):
        torch.manual_seed(0)
        model = LanguageModel(echo.submillion_config("ssm_ska", d=32, heads=2, rank=8, d_state=8, chunk_size=chunk))
        scored_loss(model, x, y, True, action_mask=am)[0].backward()
        g = max(float(p.grad.abs().max()) for n, p in model.named_parameters() if ".mixer." in n
                and model.blocks[int(n.split(".")[1])].mixer.takes_action_mask)
        assert (g == 0) == (chunk == 64)


def test_transfer_suite_ska_operator_option(tmp_path, monkeypatch):
    """--ska-operator sequence: the SKA layers get operator_scope="sequence", the record's configuration key, the
    command and echo_results.json say so; unknown values, no --action-mask (every token, the answers included, would
    enter the one operator), a --ska-chunk and a task whose oracle mask reaches a scored position are refused."""
    from seqmem.repro.echo import runner

    seen = []

    def fake_fit(cfg, task, tcfg, seed, out_dir=None):
        seen.append((cfg.mixer_options[-1], task))
        raise RuntimeError("stop after the config")

    monkeypatch.setattr(runner, "fit_lm", fake_fit)
    args = SimpleNamespace(scale="smoke", out=tmp_path, seed=0, models="ssm_ska", seeds=1, no_mqar=True,
                           action_mask=True, ska_operator="sequence", ska_power=1)
    with pytest.raises(RuntimeError, match="stop"):
        echo.run(args)
    assert seen[0][0] == {"rank": 8, "chunk_size": 16, "power": 1, "operator_scope": "sequence"}
    assert seen[0][1].action_mask
    assert "operator_scope" not in echo.submillion_config("ssm_ska").mixer_options[-1]
    for bad, msg in ((dict(ska_operator="prefix"), "--ska-operator must be one of"),
                     (dict(action_mask=False), "needs --action-mask"),
                     (dict(ska_chunk=64), "has no chunks")):
        with pytest.raises(ValueError, match=msg):
            echo.run(SimpleNamespace(**{**vars(args), **bad}))
    monkeypatch.setattr(runner, "facts_precede_answers", lambda y, m: torch.zeros(y.shape[0], dtype=torch.bool))
    with pytest.raises(ValueError, match="would read a target"):
        echo.run(args)


def test_repro_echo_smoke_with_the_one_operator_mode(tmp_path):
    args = SimpleNamespace(scale="smoke", out=tmp_path, seed=0, models="ssm_ska", no_mqar=True, action_mask=True,
                           ska_operator="sequence")
    assert echo.run(args) == 0
    t2 = (tmp_path / "table2_niah_length.md").read_text()
    assert "--ska-operator sequence" in t2 and "one operator per sequence" in t2
    res = json.loads((tmp_path / "echo_results.json").read_text())
    assert res["ska_operator"] == "sequence" and set(res["models"]["ssm_ska"]["grids"]) == set(ECHO_TASKS)
    r = res["models"]["ssm_ska"]
    assert r["state_floats@64"] == r["state_floats@4096"]


def test_transfer_suite_lr_option_and_validation_record(tmp_path, monkeypatch):
    """--lr: the training's peak lr, in the record's configuration key and the command; a record written at another
    lr is refused; every record carries the training mixture's validation accuracy (its validation stream, not the
    reported examples); a non-positive or non-finite lr is refused."""
    from seqmem.repro.echo import runner

    args = SimpleNamespace(scale="smoke", out=tmp_path, seed=0, models="ssm_ska", seeds=1, no_mqar=True, lr=2e-3)
    seen = []
    real_fit = runner.fit_lm

    def spy_fit(cfg, task, tcfg, **kw):
        seen.append(tcfg.lr)
        return real_fit(cfg, task, tcfg, **kw)

    monkeypatch.setattr(runner, "fit_lm", spy_fit)
    assert echo.run(args) == 0
    assert seen == [2e-3]
    rec = json.loads((tmp_path / "seeds" / "seed-0" / "ssm_ska.json").read_text())
    assert rec["key"]["config"]["lr"] == 2e-3
    assert 0 <= rec["valid"]["accuracy"] <= 100 and rec["valid"]["n"] == echo.SCALES["smoke"]["eval_n"]
    assert rec["valid"]["pooled"] is True and 0 <= rec["valid"]["batch_mean_accuracy"] <= 100
    assert "--lr 0.002" in (tmp_path / "table2_niah_length.md").read_text()
    with pytest.raises(ValueError, match="another configuration"):
        echo.run(SimpleNamespace(**{**vars(args), "lr": 1e-3}))
    for bad in (0.0, -1e-3, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="--lr must be"):
            echo.run(SimpleNamespace(**{**vars(args), "lr": bad, "out": tmp_path / "bad"}))
    # the validation stream is not the reported one
    mix = EchoMixture(seq_len=64)
    assert not torch.equal(mix.valid_data(8)[0], mix.eval_data(8)[0])


def test_validation_accuracy_both_definitions():
    """valid_accuracies: the pooled accuracy and, from the same pass, the older per-batch mean (batches of 16,
    weighted by batch size) — computed here by hand; they differ on the mixture (examples score 1 or 4 tokens)."""
    from seqmem.models import LanguageModel, LMConfig
    from seqmem.repro.echo.grids import valid_accuracies
    from seqmem.tasks.base import masked_accuracy

    torch.manual_seed(0)
    mix = EchoMixture(seq_len=64)
    model = LanguageModel(LMConfig(vocab_size=mix.vocab_size, d_model=16, n_layers=1, n_heads=2, mixer="attention"))
    got = valid_accuracies(model, mix, 40)
    x, y = mix.valid_data(40)[:2]
    with torch.no_grad():
        logits = model(x)[0]
    scored = y != -100
    pooled = float((logits.argmax(-1)[scored] == y[scored]).float().mean())
    per_batch = [(masked_accuracy(logits[i:i + 16], y[i:i + 16])[0], min(16, 40 - i)) for i in range(0, 40, 16)]
    batch_mean = sum(a * b for a, b in per_batch) / 40
    assert got["accuracy"] == pytest.approx(100 * pooled, abs=1e-5)
    assert got["batch_mean_accuracy"] == pytest.approx(100 * batch_mean, abs=1e-5)
    assert got["accuracy"] != pytest.approx(got["batch_mean_accuracy"], abs=1e-6)
