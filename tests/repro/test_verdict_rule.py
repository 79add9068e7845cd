"""Verdicts follow from their evidence (docs/results/README.md, "The rule"): every ``docs/results/<paper>/
headline.json`` carries both protocols' numbers and the rule's word; the word agrees with the numbers, the
numbers with the committed run records, and the free-text verdict says no more than the word."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from seqmem.repro.common import verdict_word as common_verdict_word
from seqmem.repro.verdict import (
    WORDS,
    cell_from_records,
    cell_stats,
    check_rule,
    claim_word,
    protocol_outcome,
    record_seed_lr,
    verdict_word,
)

ROOT = Path(__file__).resolve().parents[2]
PAPERS = ("echo", "elastic", "lattice", "vla", "vort")
HEADLINES = [ROOT / "docs" / "results" / p / "headline.json" for p in PAPERS]
REPORTS = sorted((ROOT / "docs" / "results").glob("*/*/report.json"))


def _cell(vals: list[float], calibrated: bool = True, edge: bool = False) -> dict[str, Any]:
    return {"per_seed": {str(i): v for i, v in enumerate(vals)}, "calibrated": calibrated, "lr_at_edge": edge}


def _order(pa: dict, pb: dict, ta: dict, tb: dict, higher: bool = True) -> dict[str, Any]:
    paper = {"a": 2.0, "b": 1.0} if higher else {"a": 1.0, "b": 2.0}  # A is the paper's better model
    return {"claim": "A beats B", "kind": "order", "higher_is_better": higher, "paper": paper,
            "protocols": {"paper": {"cells": {"a": pa, "b": pb}}, "tuned": {"cells": {"a": ta, "b": tb}}},
            "pending": "x"}


def test_words_from_outcomes():
    assert verdict_word(["agrees", "agrees"]) == "confirmed"
    assert verdict_word({"paper": "disagrees", "tuned": "disagrees"}) == "refuted"
    assert verdict_word(["agrees", "disagrees"]) == "not reproduced at our scale"
    assert verdict_word(["within seeds", "disagrees"]) == "not reproduced at our scale"
    assert verdict_word(["insufficient seeds", "disagrees"]) == "not reproduced at our scale"
    assert verdict_word(["uncalibrated", "out of reach"]) == "out of reach"
    assert verdict_word(["uncalibrated", "not run"]) == "not reproduced at our scale"
    assert common_verdict_word is verdict_word
    with pytest.raises(ValueError):
        verdict_word(["agrees"])
    with pytest.raises(ValueError):
        verdict_word(["agrees", "roughly"])


def test_order_outcomes_use_the_seed_spread():
    up, down = _cell([0.9, 0.92, 0.91]), _cell([0.5, 0.52, 0.51])
    assert claim_word(_order(up, down, up, down)) == "confirmed"
    assert claim_word(_order(down, up, down, up)) == "refuted"
    assert claim_word(_order(up, down, down, up)) == "not reproduced at our scale"
    # lower is better flips the sign
    assert claim_word(_order(down, up, down, up, higher=False)) == "confirmed"
    # a gap inside std_a + std_b is not called
    wide = _cell([0.3, 0.9, 0.6])
    assert protocol_outcome({"cells": {"a": wide, "b": _cell([0.5, 0.52, 0.51])}},
                            _order(up, down, up, down)) == "within seeds"


def test_an_order_claim_whose_paper_numbers_contradict_its_sign_is_refused():
    """The sign came from higher_is_better alone: a claim whose A is the paper's worse model read backwards."""
    up, down = _cell([0.9, 0.92, 0.91]), _cell([0.5, 0.52, 0.51])
    claim = _order(up, down, up, down)
    claim["paper"] = {"a": 1.0, "b": 2.0}
    with pytest.raises(ValueError, match="the claim's A must be the paper's better model"):
        claim_word(claim)
    claim["paper"] = {"a": "~1", "b": None}  # no two numbers to compare: the sign is the claim's
    assert claim_word(claim) == "confirmed"


def test_one_seed_never_confirms_or_refutes():
    up1, down1 = _cell([0.99]), _cell([0.01])
    up, down = _cell([0.9, 0.92, 0.91]), _cell([0.5, 0.52, 0.51])
    c = _order(down1, up1, down, up)
    assert c and protocol_outcome(c["protocols"]["paper"], c) == "insufficient seeds"
    assert claim_word(c) == "not reproduced at our scale"


def test_uncalibrated_and_edge_cells_are_not_read():
    up, down = _cell([0.9, 0.92, 0.91]), _cell([0.5, 0.52, 0.51])
    assert claim_word(_order(_cell([0.9, 0.92, 0.91], calibrated=False), down, up, down)) \
        == "not reproduced at our scale"
    c = _order(up, down, _cell([0.9, 0.92, 0.91], edge=True), down)
    assert protocol_outcome(c["protocols"]["tuned"], c) == "lr at grid edge"
    c = _order(up, down, dict(up, lr_unsettled=[3e-3]), down)  # rule 1: a seed-0 lr choice within the spread
    assert protocol_outcome(c["protocols"]["tuned"], c) == "lr unsettled"
    assert claim_word(c) == "not reproduced at our scale"
    assert check_rule({"claims": [{**c, "outcomes": {"paper": "agrees", "tuned": "lr unsettled"},
                                   "word": "not reproduced at our scale", "pending": ""}],
                       "headline_claim": "A beats B", "word": "not reproduced at our scale"})  # names no pending
    both = _order(_cell([0.9, 0.92, 0.91], calibrated=False), down, _cell([0.9, 0.92, 0.91], calibrated=False), down)
    assert claim_word(both) == "out of reach"


def test_level_claims_and_same_as():
    claim = {"claim": "A reaches 1.0", "kind": "level", "higher_is_better": True, "paper": {"a": 1.0},
             "tolerance": 0.05, "protocols": {"paper": {"cells": {"a": _cell([0.99, 1.0, 0.995])}},
                                              "tuned": {"same_as": "paper"}}}
    assert claim_word(claim) == "confirmed"
    claim["protocols"]["paper"]["cells"]["a"] = _cell([0.4, 0.5, 0.45])
    assert claim_word(claim) == "refuted"
    claim["protocols"]["paper"]["cells"]["a"] = _cell([0.9, 1.0, 0.8])
    assert claim_word(claim) == "not reproduced at our scale"


def _stats(vals: list[float]) -> dict[str, float]:
    st = cell_stats(vals)
    return {"mean": st["mean"], "std": st["std"]}


def test_a_level_claims_tolerance_needs_its_source():
    claim = {"claim": "A reaches 1.0", "kind": "level", "higher_is_better": True, "paper": {"a": 1.0},
             "tolerance": 0.05, "protocols": {"paper": {"cells": {"a": dict(_cell([0.99, 1.0, 0.995]), n=3,
                                                                            **_stats([0.99, 1.0, 0.995]))}},
                                              "tuned": {"same_as": "paper"}},
             "outcomes": {"paper": "agrees", "tuned": "agrees"}, "word": "confirmed"}
    rule = {"claims": [claim], "headline_claim": "A reaches 1.0", "word": "confirmed"}
    assert any("tolerance needs its source" in x for x in check_rule(rule))
    claim["tolerance_source"] = "ours: the paper gives no spread"
    assert check_rule(rule) == []


def test_calibration_is_read_from_the_reference_not_set_by_hand(monkeypatch):
    """Rule 3: each builder's ``calibrated`` comes from its reference's report (``report_row``); a reference that
    fails its criterion leaves every cell it governs uncalibrated, and the words follow."""
    spec = importlib.util.spec_from_file_location("verdict_rules_cal", ROOT / "scripts" / "verdict_rules.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rule = mod.lattice()
    assert rule["calibration"]["calibrated"] is True
    real = mod.report_row

    def worse(report_dir: str, mixer: str, setting: str) -> dict[str, Any]:
        row = json.loads(json.dumps(real(report_dir, mixer, setting)))
        if mixer == "attention" and setting == "T=256":  # attention no better with twice the context
            row["extra"]["bpb"]["mean"] = 3.0
        return row

    monkeypatch.setattr(mod, "report_row", worse)
    rule = mod.lattice()
    assert rule["calibration"]["calibrated"] is False
    for c in rule["claims"]:
        assert set(c["outcomes"].values()) <= {"uncalibrated", "not run"}, c["outcomes"]


def test_cells_read_sweep_and_repro_seed_records(tmp_path):
    """A cell reads a sweep's finished result.json and a ``seqmem repro echo --seeds`` seed record alike; an
    unfinished sweep run and a seed twice are refused."""
    sweep = {"status": "finished", "seed": 0, "lr": 3e-4, "report": {"loss": 2.0, "hits": 3, "n": 4}}
    repro = {"key": {"seed": 1, "config": {"lr": 3e-4}}, "niah": {"64": 12.5, "2048": 2.0}}
    for name, rec in (("a.json", sweep), ("b.json", repro), ("c.json", {**sweep, "status": "running"})):
        (tmp_path / name).write_text(json.dumps(rec))
    assert cell_from_records(["a.json"], "report.hits/report.n", tmp_path) == {"0": 0.75}
    assert cell_from_records(["b.json"], "niah[2048]", tmp_path) == {"1": 2.0}
    assert record_seed_lr(repro) == (1, 3e-4) and record_seed_lr(sweep) == (0, 3e-4)
    with pytest.raises(ValueError, match="not finished"):
        cell_from_records(["c.json"], "report.loss", tmp_path)
    with pytest.raises(ValueError, match="twice"):
        cell_from_records(["b.json", "b.json"], "niah[64]", tmp_path)


def test_check_rule_finds_a_word_its_numbers_do_not_give():
    up, down = _cell([0.9, 0.92, 0.91]), _cell([0.5, 0.52, 0.51])
    c = _order(up1 := _cell([0.99]), down, up, down)
    del up1
    c["outcomes"] = {"paper": "insufficient seeds", "tuned": "agrees"}
    for cell in (*c["protocols"]["paper"]["cells"].values(), *c["protocols"]["tuned"]["cells"].values()):
        cell.update({k: v for k, v in cell_stats(cell["per_seed"]).items()})
    c["word"] = "confirmed"  # one seed under the paper's protocol: the rule says otherwise
    rule = {"word": "confirmed", "headline_claim": "A beats B", "claims": [c]}
    problems = check_rule(rule)
    assert any("word 'confirmed' recorded" in p for p in problems)
    c["word"] = rule["word"] = "not reproduced at our scale"
    assert check_rule(rule) == []
    c.pop("pending")
    assert any("pending" in p for p in check_rule(rule))


@pytest.mark.parametrize("headline", HEADLINES, ids=PAPERS)
def test_headline_word_follows_its_numbers(headline):
    data = json.loads(headline.read_text())
    rule = data.get("rule")
    assert rule, f"{headline}: no rule block (run scripts/verdict_rules.py)"
    assert rule["word"] in WORDS
    assert check_rule(rule) == []
    # the free-text verdict opens with the rule's word and uses no stronger word than some claim carries
    verdict = data["verdict"]
    assert verdict.startswith(rule["word"]), verdict[:80]
    carried = {c["word"] for c in rule["claims"]}
    for word in ("confirmed", "refuted"):
        if word in verdict:
            assert word in carried, f"{headline.parent.name}: the verdict says {word!r}; no claim's numbers do"


def _cells(obj: Any):
    if isinstance(obj, dict):
        if "runs" in obj and "metric" in obj and "per_seed" in obj:
            yield obj
        else:
            for v in obj.values():
                yield from _cells(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _cells(v)


@pytest.mark.parametrize("headline", HEADLINES, ids=PAPERS)
def test_rule_numbers_are_the_run_records(headline):
    rule = json.loads(headline.read_text())["rule"]
    cells = list(_cells(rule))
    assert cells or headline.parent.name == "lattice"
    for cell in cells:
        got = cell_from_records(cell["runs"], cell["metric"], ROOT)
        assert set(got) == set(cell["per_seed"]), cell["label"]
        for seed, v in got.items():
            assert abs(v - cell["per_seed"][seed]) < 1e-5, (cell["label"], seed)
        for run in cell["runs"]:
            assert abs(record_seed_lr(json.loads((ROOT / run).read_text()))[1] - cell["lr"]) < 1e-12, run


def test_the_rule_blocks_are_what_the_builder_writes():
    spec = importlib.util.spec_from_file_location("verdict_rules", ROOT / "scripts" / "verdict_rules.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--check"]) == 0


def test_echo_table2_tuned_protocol_chooses_on_validation(tmp_path):
    """echo_niah_tuned_k2's records: pending until every lr has 3 seeds; then the lr with the best mean validation
    accuracy, its NIAH cell, and an edge lr flagged."""
    spec = importlib.util.spec_from_file_location("verdict_rules_t2", ROOT / "scripts" / "verdict_rules.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.ROOT = tmp_path
    base = tmp_path / "docs" / "results" / "echo" / "tuned"

    def write(lr_dir: str, lr: float, seed: int, valid: float, niah: float) -> None:
        p = base / lr_dir / "seeds" / f"seed-{seed}" / "ssm_ska.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps({"key": {"seed": seed, "config": {"lr": lr}}, "valid": {"accuracy": valid},
                                 "niah": {"64": niah}}))

    proto, pending = mod.tuned_niah("echo/tuned", 64, True)
    assert proto["status"] == "not run" and pending
    for lr_dir, lr, v in (("lr3e-4", 3e-4, 40.0), ("lr1e-3", 1e-3, 60.0)):
        for seed in range(3):
            write(lr_dir, lr, seed, v + seed, 10.0 * (seed + 1) + lr * 1e4)
    proto, pending = mod.tuned_niah("echo/tuned", 64, True)
    assert proto["status"] == "insufficient seeds" and pending
    for seed in range(3):
        write("lr3e-3", 3e-3, seed, 50.0, 1.0)
    proto, pending = mod.tuned_niah("echo/tuned", 64, True)
    c = proto["cells"]["a"]
    assert c["lr"] == 1e-3 and not c["lr_at_edge"] and pending == ""
    assert c["per_seed"] == {"0": 20.0, "1": 30.0, "2": 40.0} and c["n"] == 3
    for seed in range(3):  # now 3e-3 validates best: at the grid's edge, so not read, and the extension is pending
        write("lr3e-3", 3e-3, seed, 90.0, 1.0)
    proto, pending = mod.tuned_niah("echo/tuned", 64, True)
    assert proto["cells"]["a"]["lr"] == 3e-3 and proto["cells"]["a"]["lr_at_edge"] and "edge" in pending
    assert "mean over evaluation batches" in proto["what"]  # these records predate the pooled validation score
    p = base / "lr1e-2" / "seeds" / "seed-0" / "ssm_ska.json"  # an extension scored the pooled way: not comparable
    p.parent.mkdir(parents=True)
    p.write_text(json.dumps({"key": {"seed": 0, "config": {"lr": 1e-2}}, "valid": {"accuracy": 1.0, "pooled": True},
                             "niah": {"64": 1.0}}))
    with pytest.raises(SystemExit, match="pool"):
        mod.tuned_niah("echo/tuned", 64, True)
    # newer records carry the older definition too: the grid is then compared on it
    for seed in range(3):
        p = base / "lr1e-2" / "seeds" / f"seed-{seed}" / "ssm_ska.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps({"key": {"seed": seed, "config": {"lr": 1e-2}}, "niah": {"64": 7.0},
                                 "valid": {"accuracy": 99.0, "pooled": True, "batch_mean_accuracy": 95.0}}))
    proto, pending = mod.tuned_niah("echo/tuned", 64, True)
    c = proto["cells"]["a"]
    assert c["lr"] == 1e-2 and c["valid_mean_by_lr"]["0.01"] == 95.0 and "mean over evaluation batches" in proto["what"]
    for seed in range(3):  # an extension below 90 on that definition leaves 3e-3 the best
        p = base / "lr1e-2" / "seeds" / f"seed-{seed}" / "ssm_ska.json"
        p.write_text(json.dumps({"key": {"seed": seed, "config": {"lr": 1e-2}}, "niah": {"64": 7.0},
                                 "valid": {"accuracy": 99.0, "pooled": True, "batch_mean_accuracy": 80.0}}))
    proto, pending = mod.tuned_niah("echo/tuned", 64, True)
    assert proto["cells"]["a"]["lr"] == 3e-3 and not proto["cells"]["a"]["lr_at_edge"] and pending == ""
    # all records pooled: compared pooled
    for d in base.glob("lr*/seeds/seed-*/ssm_ska.json"):
        rec = json.loads(d.read_text())
        rec["valid"] = {"accuracy": 50.0 + (rec["key"]["config"]["lr"] == 1e-3), "pooled": True}
        d.write_text(json.dumps(rec))
    proto, _ = mod.tuned_niah("echo/tuned", 64, True)
    assert proto["cells"]["a"]["lr"] == 1e-3 and "mean over evaluation batches" not in proto["what"]


def test_settling_sweeps_are_read_whole_with_the_unspecified_choice_on_validation(tmp_path):
    """A settling sweep (elastic_settle, elastic_tuned_small, vort_settle) is read only once every row it needs is
    complete; of rows differing in an unspecified choice (α, λ) the one best on the validation mean over seeds is
    read — at the paper's lr, or at each row's chosen lr with the sweep's own edge flag — the others listed."""
    spec = importlib.util.spec_from_file_location("verdict_rules_sw", ROOT / "scripts" / "verdict_rules.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.ROOT = tmp_path
    base = tmp_path / "docs" / "results" / "x" / "settle"
    rows = []

    def row(mixer: str, valid: dict[float, float], best: float, edge: bool, complete: bool = True) -> None:
        for lr in valid:
            for seed in range(3):
                d = base / "runs" / "default" / mixer / "model" / f"lr{lr:g}" / f"seed{seed}"
                d.mkdir(parents=True, exist_ok=True)
                (d / "result.json").write_text(json.dumps({
                    "status": "finished", "setting": "default", "lr": lr, "seed": seed,
                    "report": {"loss": valid[lr] + 0.01 * seed}}))
        rows.append({"setting": "default", "mixer": mixer, "complete": complete, "best_lr": best,
                     "lr_valid": {f"{lr:g}": v for lr, v in valid.items()}, "valid_at_best": valid[best],
                     "lr_at_grid_edge": edge})
        (base / "report.json").write_text(json.dumps({"rows": rows}))

    row("exp-a", {2e-3: 1.9, 4e-3: 1.7}, 4e-3, True)
    row("exp-b", {2e-3: 1.8, 4e-3: 1.75}, 4e-3, False, complete=False)
    assert mod.settled_rows("x/settle", ["exp-a", "exp-b"]) is None  # not read before every row is complete
    rows[-1]["complete"] = True
    (base / "report.json").write_text(json.dumps({"rows": rows}))
    got = mod.settled_rows("x/settle", ["exp-a", "exp-b"])
    kw = {"lower": True, "calibrated": True, "name": "exp"}
    at_paper = mod.swept_cell("x/settle", "default", got, ["exp-a", "exp-b"], "report.loss", lr=2e-3, **kw)
    assert "exp-b" in at_paper["label"] and at_paper["lr"] == 2e-3 and not at_paper["lr_at_edge"]
    assert at_paper["per_seed"] == {"0": 1.8, "1": 1.81, "2": 1.82}
    assert at_paper["variants"]["exp-a"]["valid_mean"] == 1.9
    tuned = mod.swept_cell("x/settle", "default", got, ["exp-a", "exp-b"], "report.loss", **kw)
    assert "exp-a" in tuned["label"] and tuned["lr"] == 4e-3 and tuned["lr_at_edge"]  # the report's edge


def test_rule1_a_seed0_lr_choice_within_the_seed_spread_needs_every_seed(tmp_path):
    """Rule 1: an lr a first_seed sweep chose on seed 0 is not read while another lr whose seed-0 validation value
    is within the seed spread (twice the choice's std) lacks the other seeds ("lr unsettled", its runs named as
    pending); once a settling sweep of the same training runs gives them, the mean over seeds decides — a cell left
    at the beaten lr stops the builder, and the cell at rule 1's lr reads the pooled runs."""
    spec = importlib.util.spec_from_file_location("verdict_rules_r1", ROOT / "scripts" / "verdict_rules.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.ROOT = tmp_path
    res = tmp_path / "docs" / "results"

    def run(d: str, lr: float, seed: int, valid: float, steps: int = 100) -> None:
        rd = res / d / "runs" / "s" / "m" / "model" / f"lr{lr:g}" / f"seed{seed}"
        rd.mkdir(parents=True, exist_ok=True)
        (rd / "result.json").write_text(json.dumps({"status": "finished", "setting": "s", "lr": lr, "seed": seed,
                                                    "valid": {"loss": valid}, "report": {"loss": valid}}))
        (rd / "run.json").write_text(json.dumps({"task": {"name": "t"}, "model": {"d_model": "x"},
                                                 "train": {"steps": steps, "lr": lr, "seed": seed},
                                                 "sweep": {"name": d, "mixer": "m"}}))

    for seed, v in enumerate([1.50, 1.52, 1.54]):  # the seed-0 choice, std 0.02: spread 0.04
        run("x/sweep", 1e-3, seed, v)
    run("x/sweep", 3e-3, 0, 1.53)  # within the spread on seed 0
    run("x/sweep", 3e-4, 0, 1.70)  # beyond it
    (res / "x" / "sweep" / "report.json").write_text(json.dumps({
        "spec": {"lr_selection": "first_seed"}, "select": "loss",
        "rows": [{"mixer": "m", "setting": "s", "best_lr": 1e-3}]}))
    mod.SEEDS_FROM, mod.SEEDS_SPEC = {"x/sweep": ["x/seeds"]}, {"x/sweep": "x_seeds"}
    kw = {"label": "m", "calibrated": True}
    c = mod.cell("x/sweep", "s", "m", 1e-3, "report.loss", **kw)
    assert c["lr_unsettled"] == [3e-3] and "x_seeds" in c["lr_unsettled_pending"]
    assert c["lr_choice"]["compared"] == {"0.003": {"n": 1}}
    claim = {"claim": "level", "kind": "level", "higher_is_better": False, "tolerance": 1.0, "paper": {"a": 1.5},
             "tolerance_source": "ours: a test",
             "protocols": {"paper": {"cells": {"a": dict(c, lr_unsettled=[])}}, "tuned": {"cells": {"a": c}}}}
    done = mod.finish(claim)
    assert done["outcomes"]["tuned"] == "lr unsettled" and done["word"] == "not reproduced at our scale"
    assert "x_seeds" in done["pending"] and check_rule({"claims": [done], "headline_claim": "level",
                                                        "word": done["word"]}) == []
    assert check_rule({"claims": [dict(done, pending="")], "headline_claim": "level", "word": done["word"]})
    # the settling sweep gives 3e-3 every seed, and its mean (1.49) beats the choice's (1.52)
    for seed, v in enumerate([1.53, 1.47, 1.47]):
        run("x/seeds", 3e-3, seed, v)
    with pytest.raises(SystemExit, match="rule 1's mean over seeds chooses 0.003"):
        mod.cell("x/sweep", "s", "m", 1e-3, "report.loss", **kw)
    c = mod.cell("x/sweep", "s", "m", 3e-3, "report.loss", **kw)
    assert c["per_seed"] == {"0": 1.53, "1": 1.47, "2": 1.47} and c["lr_unsettled"] == []
    assert c["lr_choice"]["by"] == "the validation mean over seeds"
    # runs of another training cannot be pooled
    run("x/seeds", 3e-3, 1, 1.47, steps=200)
    with pytest.raises(SystemExit, match="trained differently"):
        mod.cell("x/sweep", "s", "m", 3e-3, "report.loss", **kw)


def test_rule1_better_pooled_lrs_diverged_seeds_and_missing_report_rows(tmp_path):
    """Rule 1's check does not ignore a pooled lr better than the choice beyond the spread, reads a diverged
    pooled seed as the worst value (not as a missing seed), and stops where the report has no chosen lr."""
    spec = importlib.util.spec_from_file_location("verdict_rules_r1b", ROOT / "scripts" / "verdict_rules.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.ROOT = tmp_path
    res = tmp_path / "docs" / "results"

    def run(d: str, lr: float, seed: int, valid: float | None) -> None:
        rd = res / d / "runs" / "s" / "m" / "model" / f"lr{lr:g}" / f"seed{seed}"
        rd.mkdir(parents=True, exist_ok=True)
        rec = {"status": "finished", "setting": "s", "lr": lr, "seed": seed, "valid": {"loss": valid},
               "report": {"loss": valid}} if valid is not None else {"status": "diverged", "setting": "s",
                                                                       "lr": lr, "seed": seed}
        (rd / "result.json").write_text(json.dumps(rec))
        (rd / "run.json").write_text(json.dumps({"task": {"name": "t"}, "model": {"d_model": "x"},
                                                 "train": {"steps": 100, "lr": lr, "seed": seed}}))

    def report(rows: list[dict]) -> None:
        (res / "x" / "sweep" / "report.json").write_text(json.dumps({
            "spec": {"lr_selection": "first_seed"}, "select": "loss", "rows": rows}))

    for seed, v in enumerate([1.50, 1.52, 1.54]):
        run("x/sweep", 1e-3, seed, v)
    run("x/sweep", 3e-4, 0, 1.70)
    report([{"mixer": "m", "setting": "s", "best_lr": 1e-3}])
    mod.SEEDS_FROM, mod.SEEDS_SPEC = {"x/sweep": ["x/seeds"]}, {"x/sweep": "x_seeds"}
    kw = {"label": "m", "calibrated": True}
    run("x/seeds", 1e-2, 0, 1.30)  # a probe better than the choice far beyond its spread: it needs every seed
    c = mod.cell("x/sweep", "s", "m", 1e-3, "report.loss", **kw)
    assert c["lr_unsettled"] == [1e-2]
    run("x/seeds", 1e-2, 1, 1.31)
    run("x/seeds", 1e-2, 2, None)  # diverged: the worst value, so 1e-2's mean cannot win, but it has the seed
    c = mod.cell("x/sweep", "s", "m", 1e-3, "report.loss", **kw)
    assert c["lr_unsettled"] == [] and c["lr_choice"]["compared"]["0.01"] == {"mean": None, "n": 3}
    run("x/seeds", 1e-2, 2, 1.29)  # (a rerun that finished replaces the record): now 1e-2 wins on the mean
    with pytest.raises(SystemExit, match="rule 1's mean over seeds chooses 0.01"):
        mod.cell("x/sweep", "s", "m", 1e-3, "report.loss", **kw)
    report([])  # a report without the row's choice is not trusted to the cell's own lr
    with pytest.raises(SystemExit, match="no chosen lr for m"):
        mod.cell("x/sweep", "s", "m", 1e-3, "report.loss", **kw)


@pytest.mark.parametrize("report", REPORTS, ids=[str(r.parent.relative_to(ROOT / "docs" / "results"))
                                                  for r in REPORTS])
def test_a_reports_lr_is_one_trained(report):
    """Every chosen lr a report prints is the lr of runs that trained (no rounding between record and report)."""
    rows = json.loads(report.read_text()).get("rows") or []
    runs = report.parent / "runs"
    trained: dict[tuple[str, str], set[float]] = {}
    for res in runs.glob("*/*/model/*/*/result.json"):
        rec = json.loads(res.read_text())
        trained.setdefault((rec["setting"], rec["mixer"]), set()).add(float(rec["lr"]))
    for row in rows:
        lr = row.get("best_lr")
        if lr is None or row.get("runs_done", 0) == 0:
            continue
        have = trained.get((row["setting"], row["mixer"]), set())
        if not have:  # rows whose runs live elsewhere (reused): checked where they trained
            continue
        assert any(abs(lr - t) <= 1e-12 * max(1.0, lr) for t in have), (row["setting"], row["mixer"], lr, have)
        for key in row.get("lr_valid") or {}:
            assert any(abs(float(key) - t) <= 1e-12 * max(1.0, t) for t in have), (row["mixer"], key, have)


SETTLE_SPECS = ("lattice_matched", "vort_settle", "vort_settle_dense", "elastic_paper_lr", "elastic_settle",
                "elastic_tuned_small", "echo_mqar_paper_lr", "vla_settle", "vla_copy_identity",
                # rule 1's lr checks: named by a cell's lr_choice (seeds_from) or a claim's pending
                "lattice_matched_seeds", "echo_mqar_small_seeds", "vla_capacity_seeds", "vla_copy_seeds")


@pytest.mark.parametrize("name", SETTLE_SPECS)
def test_settling_specs_load_and_build_their_tasks(name):
    """Every settling experiment named by a rule's ``pending`` is a valid spec with ≥ 3 seeds whose tasks build
    (the new task options included) and whose model configs are complete."""
    from seqmem.sweep import load_spec
    from seqmem.tasks import build_task

    spec = load_spec(name)
    assert len(spec.seeds) >= 3
    pts = spec.points()
    assert pts
    seen = set()
    for p in pts:
        task = p.run_spec["task"]
        key = json.dumps(task, sort_keys=True)
        if key not in seen:
            seen.add(key)
            built = build_task(task["name"], **task["options"])
            assert built.seq_len > 0
    for headline in HEADLINES:
        for c in json.loads(headline.read_text())["rule"]["claims"]:
            if name in (c.get("pending") or "") + (c.get("settled_by") or "") or \
                    f'"seeds_from": "{name}"' in json.dumps(c, ensure_ascii=False):
                break
        else:
            continue
        break
    else:
        pytest.fail(f"{name} is named by no rule's pending experiment (nor as the one that settled a claim or "
                    "checked a cell's lr)")


@pytest.mark.parametrize("paper", PAPERS)
def test_a_readme_edge_lr_is_one_trained(paper):
    """An lr a paper's README prints as a chosen lr at the grid's edge ("2e-2 (edge)") is one its runs trained at
    (the runner rounds extended lrs to one significant digit: 8e-3 x 2 trains at 2e-2, not 1.6e-2)."""
    import re

    root = ROOT / "docs" / "results" / paper
    text = (root / "README.md").read_text()
    trained = {float(json.loads(p.read_text())["lr"]) for p in root.glob("*/runs/*/*/model/*/*/result.json")}
    for m in re.finditer(r"(\d+(?:\.\d+)?e-\d+) \((?:edge|extension)\)", text):
        lr = float(m.group(1))
        assert any(abs(lr - t) <= 1e-9 * lr for t in trained), f"{paper} README prints {m.group(0)}: never trained"


def test_vort_reads_the_dense_layout_once_vort_settle_dense_is_complete(tmp_path):
    """VORT's claims read vort_settle (our sparse layout) once it is complete, with vort_settle_dense pending; once
    vort_settle_dense is complete too, both protocols read the paper's dense layout, calibrated by that sweep's own
    reference, with no layout deviation and nothing pending, and the sparse cells are reported beside them."""
    import shutil

    spec = importlib.util.spec_from_file_location("verdict_rules_vd", ROOT / "scripts" / "verdict_rules.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.ROOT = tmp_path
    res, real = tmp_path / "docs" / "results" / "vort", ROOT / "docs" / "results" / "vort"
    for p in [real / "zipf_tiny" / "report.json", *(real / "zipf_tiny" / "runs").rglob("result.json")]:
        (res / p.relative_to(real)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, res / p.relative_to(real))
    models = ["power-law", "mixture-5", "exp-lambda4e-3", "exp-lambda4e-2", "exp-lambda4e-1"]

    def sweep(name: str, long: dict[str, float], ref_long: float | None = None) -> None:
        rows = []
        for mixer in ([] if ref_long is None else ["swa8+attention"]) + models:
            lrs = [1e-3] if mixer == "swa8+attention" else [3e-4, 1e-3]
            value = ref_long if mixer == "swa8+attention" else long[mixer]
            for lr in lrs:
                for seed in range(3):
                    d = res / name / "runs" / "beta-1.0" / mixer / "model" / f"lr{lr:g}" / f"seed{seed}"
                    d.mkdir(parents=True, exist_ok=True)
                    hits = round(1000 * (value + 0.01 * seed - (0.05 if lr == 3e-4 else 0)))
                    (d / "result.json").write_text(json.dumps({
                        "status": "finished", "setting": "beta=1.0", "lr": lr, "seed": seed,
                        "report": {"hits_long": hits, "queries_long": 1000}}))
            valid = {f"{lr:g}": value - (0.05 if lr == 3e-4 else 0) for lr in lrs}
            extra = {f"hits_{b}/queries_{b}": {"mean": value} for b in ("short", "medium", "long")}
            rows.append({"setting": "beta=1.0", "mixer": mixer, "complete": True, "best_lr": 1e-3,
                         "lr_valid": valid, "valid_at_best": valid["0.001"], "lr_at_grid_edge": False,
                         "extra": extra})
        (res / name / "report.json").write_text(json.dumps({"rows": rows}))

    sweep("settle", {"power-law": 0.8, "mixture-5": 0.5, "exp-lambda4e-3": 0.3, "exp-lambda4e-2": 0.35,
                     "exp-lambda4e-1": 0.2})
    body = mod.vort()
    head = body["claims"][0]
    assert "vort_settle " in head["settled_by"] and "vort_settle_dense" in head["pending"]
    assert "settle/runs" in head["protocols"]["paper"]["cells"]["a"]["runs"][0]
    assert head["protocols"]["paper"]["deviations"] and head["outcomes"]["paper"] == "agrees"
    # the dense layout reverses the order; its reference calibrates
    sweep("settle_dense", {"power-law": 0.3, "mixture-5": 0.4, "exp-lambda4e-3": 0.6, "exp-lambda4e-2": 0.8,
                           "exp-lambda4e-1": 0.5}, ref_long=0.95)
    body = mod.vort()
    head = body["claims"][0]
    assert "pending" not in head and "vort_settle_dense" in head["settled_by"]
    assert head["protocols"]["paper"]["deviations"] == []
    pa, pb = (head["protocols"]["paper"]["cells"][k] for k in "ab")
    assert "settle_dense/runs" in pa["runs"][0] and pa["lr"] == 3e-4 and "exp-lambda4e-2" in pb["label"]
    assert pa["per_seed"] == {"0": 0.25, "1": 0.26, "2": 0.27}
    assert head["outcomes"] == {"paper": "disagrees", "tuned": "disagrees"} and head["word"] == "refuted"
    assert body["calibration"]["calibrated"] and "vort_settle_dense" in body["calibration"]["reference"]
    assert check_rule({"word": head["word"], **body}) == []
    sparse = head["also_reported"]["our sparse layout (vort_settle; not read into the word)"]
    assert "settle/runs" in sparse["paper"]["a"]["runs"][0] and "exponential λ 4e-2 at lr 1e-3, seed 0 (validation " \
        "0.842 vs λ 4e-3's 0.844)" in head["also_reported"]
    # an uncalibrated dense reference leaves every dense cell unread
    sweep("settle_dense", {"power-law": 0.3, "mixture-5": 0.4, "exp-lambda4e-3": 0.6, "exp-lambda4e-2": 0.8,
                           "exp-lambda4e-1": 0.5}, ref_long=0.2)
    body = mod.vort()
    assert not body["calibration"]["calibrated"] and body["claims"][0]["word"] != "refuted"
