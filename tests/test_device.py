"""Every registered mixer, inside a whole language model, computes the same loss and gradients on a GPU as on the
CPU (float64, same weights, same tokens).  Runs where a GPU is visible, or on ``SEQMEM_TEST_DEVICE``; skipped on a
CPU-only machine, where there is no second device to compare with (``tests/test_contract.py`` takes the same
variable to run the whole mixer contract on that device)."""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.nn.functional as F

from seqmem import get_entry, list_mixers
from seqmem.models import LanguageModel, LMConfig

DEVICE = os.environ.get("SEQMEM_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.skipif(torch.device(DEVICE).type == "cpu",
                                reason="no GPU here: set SEQMEM_TEST_DEVICE=cuda on a machine with one")


def _options(name: str) -> dict:
    cfg = dict(get_entry(name).cls.contract_configs[0])
    cfg.pop("d_model", None)
    cfg.pop("n_heads", None)
    return cfg


@pytest.mark.parametrize("name", list_mixers())
def test_loss_and_gradients_match_the_cpu(name):
    torch.manual_seed(0)
    cpu = LanguageModel(LMConfig(vocab_size=48, d_model=32, n_layers=2, n_heads=2, mixer=name,
                                 mixer_options=_options(name))).double()
    dev = copy.deepcopy(cpu).to(DEVICE)
    ids = torch.randint(0, 48, (2, 41), generator=torch.Generator().manual_seed(1))
    grads = {}
    for tag, m in (("cpu", cpu), ("dev", dev)):
        x = ids.to(next(m.parameters()).device)
        logits, state = m(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, 48), x[:, 1:].reshape(-1))
        loss.backward()
        g = {k: p.grad.detach().cpu() for k, p in m.named_parameters() if p.grad is not None}
        grads[tag] = (float(loss.detach()), g)
    (lc, gc), (ld, gd) = grads["cpu"], grads["dev"]
    assert abs(ld - lc) <= 1e-9 * abs(lc), f"{name}: loss {ld} on {DEVICE} vs {lc} on cpu"
    assert gc.keys() == gd.keys() and gc
    for k in gc:
        scale = float(gc[k].abs().max())
        if scale > 0:
            err = float((gd[k] - gc[k]).abs().max()) / scale
            assert err <= 1e-8, f"{name}: grad of {k} differs by {err:.2e} (relative) on {DEVICE}"


@pytest.mark.parametrize("name", list_mixers())
def test_a_state_from_the_cpu_continues_on_the_device(name):
    """A sequence started on the CPU and continued on the device from its state (moved with ``state_to``) gives
    the CPU's outputs: no part of a state or of a mixer's continuation is tied to the device it was made on."""
    import seqmem

    cfg = dict(get_entry(name).cls.contract_configs[0])
    d = cfg.pop("d_model", 16)
    cfg.setdefault("n_heads", 2)
    torch.manual_seed(0)
    cpu = seqmem.build_mixer(name, d, **cfg).double()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # off the initialisation (a zero projection would make the test vacuous)
        for p in cpu.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    dev = copy.deepcopy(cpu).to(DEVICE)
    x = torch.randn(2, 23, d, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        y, _ = cpu(x)
        _, st = cpu(x[:, :11])
        y2, st2 = dev(x[:, 11:].to(DEVICE), seqmem.state_to(st, DEVICE))
    assert y.abs().max() > 0
    assert all(v.device.type == torch.device(DEVICE).type for v in st2.values())
    err = float((y2.cpu() - y[:, 11:]).abs().max() / y.abs().max())
    assert err <= 1e-9, f"{name}: continued on {DEVICE} differs by {err:.1e}"


def test_lattice_reports_the_form_it_runs_on_the_device():
    """Lattice's fused C++ scan is CPU-only: on the device the op runs another exact form and says which."""
    from seqmem.backends import record_forms
    from seqmem.ops import lattice_scan

    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 9, 2, 4, generator=g).to(DEVICE) for _ in range(2))
    v = torch.randn(1, 9, 2, 6, generator=g).to(DEVICE)
    with record_forms() as forms:
        y, st = lattice_scan(q, k, v, 0.1, chunk_size=4)
    ref, st_ref = lattice_scan(q, k, v, 0.1, mode="recurrent")
    assert set(forms["lattice_scan"]) & {"pytorch", "triton"} and "cpp" not in forms["lattice_scan"]
    assert float((y - ref).abs().max()) <= 1e-4
