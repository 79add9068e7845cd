"""SKA's K-step readout on NIAH under the oracle action mask, idealised features (seqmem.repro.echo.readout_check)."""

from __future__ import annotations

import json

import pytest

from seqmem.repro.echo.readout_check import main, niah_readout


def test_k2_leaves_the_one_pair_with_raw_features_and_retrieves_with_a_shift():
    k1 = niah_readout(1, False, trials=20)
    k2 = niah_readout(2, False, trials=20)
    assert k1["accuracy"] == 1.0 and k1["output_norm"] > 0.9
    assert k2["accuracy"] == 0.0 and k2["output_norm"] < 1e-9  # a second step leaves the key -> value pair
    s2 = niah_readout(2, True, trials=20)
    assert s2["accuracy"] >= 0.95 and s2["output_norm"] < 0.01 * k1["output_norm"]  # representable, but faint


def test_readout_check_writes_its_table(tmp_path):
    assert main(["--trials", "3", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "readout_check.json").read_text())["rows"]
    assert len(rows) == 8 and "| onehot | own | 2 |" in (tmp_path / "readout_check.md").read_text()
    with pytest.raises(ValueError, match="rank >= vocab"):
        niah_readout(1, False, rank=8, vocab=16, trials=1)
    with pytest.raises(ValueError, match="features"):
        niah_readout(1, False, features="learned", trials=1)
    with pytest.raises(SystemExit):
        main(["--trials", "0", "--out", str(tmp_path)])
