"""VORT Table 1 over β from sweep reports: the tune group's chosen row stands for the group at every β, incomplete
rows wait, the mean over β pairs seeds by index, the paper's row stands beside ours, and the paper's gaps between rows
are computed paired by β and seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqmem.repro.vort.table1 import collect, gaps, headline_entry, main, markdown, table

ROOT = Path(__file__).resolve().parents[2]


def _row(setting, mixer, per_bin, tune=None, chosen=None, complete=True):
    extra = {f"hits_{b}/queries_{b}": {"per_seed": v} for b, v in per_bin.items()}
    return {"setting": setting, "mixer": mixer, "tune": tune, "tune_chosen": chosen, "complete": complete,
            "extra": extra}


def _bins(s, m, lo):
    return {"short": [s] * 3, "medium": [m] * 3, "long": lo}


def test_mean_over_beta_with_the_chosen_exponential_under_its_group_name():
    r1 = {"rows": [
        _row("beta=1.0", "power-law", _bins(1.0, 0.9, [0.7, 0.8, 0.9])),
        _row("beta=1.0", "exp-a", _bins(1.0, 0.8, [0.5, 0.5, 0.5]), tune="exponential", chosen=True),
        _row("beta=1.0", "exp-b", _bins(0.0, 0.0, [0.0, 0.0, 0.0]), tune="exponential", chosen=False),
        _row("beta=1.0", "mixture-5", _bins(1.0, 0.8, [0.4, 0.4, 0.4]), complete=False),
    ]}
    r2 = {"rows": [
        _row("beta=1.5", "power-law", _bins(1.0, 0.9, [0.4, 0.5, 0.6])),
        _row("beta=2.0", "power-law", _bins(1.0, 0.9, [0.1, 0.2, 0.3])),
        _row("beta=1.5", "exp-a", _bins(1.0, 0.8, [0.5, 0.5, 0.5])),
    ]}
    data = collect([r1, r2])
    assert set(data) == {"power-law", "exponential"}  # mixture-5 incomplete, exp-b not the group's choice
    assert sorted(data["exponential"]) == [1.0, 1.5]
    rows = {r["row"]: r for r in table(data)}
    pl = rows["power-law"]
    assert pl["complete"] and pl["paper"] == {"short": 91.3, "medium": 87.6, "long": 79.4}
    assert pl["mean_over_beta"]["long"]["per_seed"] == pytest.approx([0.4, 0.5, 0.6])
    assert pl["mean_over_beta"]["long"]["mean"] == pytest.approx(0.5)
    assert pl["mean_over_beta"]["long"]["std"] == pytest.approx(0.1)
    assert not rows["exponential"]["complete"] and "mean_over_beta" not in rows["exponential"]
    assert rows["exponential"]["paper"]["long"] == 52.3


def test_gaps_are_paired_by_beta_and_seed():
    rep = {"rows": [
        _row("beta=1.0", "power-law", _bins(1.0, 0.9, [0.7, 0.8, 0.9])),
        _row("beta=1.0", "exp-a", _bins(1.0, 0.8, [0.5, 0.5, 0.5]), tune="exponential", chosen=True),
        _row("beta=1.5", "power-law", _bins(1.0, 0.9, [0.4, 0.5, 0.6])),
        _row("beta=1.5", "exp-a", _bins(1.0, 0.8, [0.5, 0.5, 0.5])),
        _row("beta=1.0", "mixture-5", _bins(1.0, 0.8, [0.4, 0.4, 0.4]), complete=False),
    ]}
    (g,) = gaps(collect([rep]))  # mixture-5 is not complete: only power-law − exponential
    assert (g["a"], g["b"], g["betas"]) == ("power-law", "exponential", [1.0, 1.5])
    assert g["per_beta"]["1.0"]["long"]["per_seed"] == pytest.approx([0.2, 0.3, 0.4])
    assert g["per_beta"]["1.5"]["long"]["mean"] == pytest.approx(0.0)
    assert g["pairs"]["long"]["n"] == 6 and g["pairs"]["long"]["positive"] == 4  # a tie is not a win
    assert g["pairs"]["long"]["mean"] == pytest.approx(0.15)
    assert g["pairs"]["short"]["mean"] == pytest.approx(0.0) and g["pairs"]["medium"]["mean"] == pytest.approx(0.1)
    assert "mean_over_beta" not in g and g["paper"]["long"] == pytest.approx(27.1)
    md = markdown(table(collect([rep])), ["r.json"], [g])
    assert "| power-law − exponential | +30.0 ± 10.0 | +0.0 ± 10.0 | — | +15.0 ± 18.7 (4 of 6) |" in md
    # every β: the gap of the means over β, per seed index
    rep["rows"] += [_row("beta=2.0", "power-law", _bins(1.0, 0.9, [0.1, 0.2, 0.3])),
                    _row("beta=2.0", "exp-a", _bins(1.0, 0.8, [0.4, 0.5, 0.9]))]
    (g,) = gaps(collect([rep]))
    assert g["mean_over_beta"]["long"]["per_seed"] == pytest.approx([(0.2 - 0.1 - 0.3) / 3, 0.0, (0.4 + 0.1 - 0.6) / 3])
    assert "−3.3 ± 3.3 |" in markdown(table(collect([rep])), ["r.json"], [g])


def test_bad_reports_are_refused():
    no_bins = {"rows": [{"setting": "beta=1.0", "mixer": "x", "complete": True, "extra": {}}]}
    with pytest.raises(ValueError, match="pooled accuracy"):
        collect([no_bins])
    twice = {"rows": [_row("beta=1.0", "x", _bins(1, 1, [1, 1, 1]))]}
    with pytest.raises(ValueError, match="two reports"):
        collect([twice, twice])
    with pytest.raises(ValueError, match="Zipf exponent"):
        collect([{"rows": [_row("default", "x", _bins(1, 1, [1, 1, 1]))]}])


def test_the_committed_reports_make_a_table(tmp_path):
    reports = [ROOT / "docs/results/vort/zipf_tiny/report.json", ROOT / "docs/results/vort/zipf_tiny_beta/report.json"]
    assert main([*map(str, reports), "--out", str(tmp_path)]) == 0
    rows = {r["row"]: r for r in json.loads((tmp_path / "table1.json").read_text())["rows"]}
    assert "power-law" in rows and "1.0" in rows["power-law"]["per_beta"]
    assert "| power-law |" in (tmp_path / "table1.md").read_text()


def test_the_committed_headline_records_the_table_its_reports_give(tmp_path):
    """``headline.json``'s ``table1_over_beta`` is what the committed reports give (refresh_reports.py writes it);
    ``--headline`` records it and keeps the rest of the file."""
    reports = [json.loads((ROOT / f"docs/results/vort/{d}/report.json").read_text()) for d in ("zipf_tiny",
                                                                                               "zipf_tiny_beta")]
    data = collect(reports)
    want = headline_entry(table(data), gaps(data))
    committed = json.loads((ROOT / "docs/results/vort/headline.json").read_text())
    assert committed["table1_over_beta"] == want, "stale: run scripts/refresh_reports.py"
    h = tmp_path / "headline.json"
    h.write_text(json.dumps({"paper": "VORT", "table1_over_beta": {"old": 1}}))
    paths = [str(ROOT / f"docs/results/vort/{d}/report.json") for d in ("zipf_tiny", "zipf_tiny_beta")]
    assert main([*paths, "--out", str(tmp_path), "--headline", str(h)]) == 0
    got = json.loads(h.read_text())
    assert got["paper"] == "VORT" and got["table1_over_beta"] == want
    with pytest.raises(SystemExit):
        main([*paths, "--out", str(tmp_path), "--headline", str(tmp_path / "missing.json")])
