"""Mixed precision for every registered mixer: bfloat16 and float16, in both autocast patterns and with cast weights.

* ``autocast, backward outside``: the forward under ``torch.autocast``, ``loss.backward()`` after the region (the
  standard pattern, and what ``seqmem train --precision bf16`` does); Lattice's hand-written backward crashed here
  ("Input dtypes must be the same") before its op computed half inputs in float32 forward and backward;
* ``autocast, backward inside``: ``backward()`` inside the region (PyTorch then runs the backward's matmuls in the
  autocast dtype too, even where the forward computed in float32);
* ``weights``: ``mixer.to(dtype)`` and input of that dtype, no autocast; compared with a float32 copy of the rounded
  weights and input, so the error measured is the computation's.

Every output and gradient (input and every parameter) must be finite, and within the mixer's ``numerics_amp`` fact
(``Mixer.facts``; :data:`seqmem.mixers.base.AMP_BOUNDS` by default) of float32: the output's relative error, and the
largest relative error over the gradient tensors.  T = 16 with the first contract configuration (chunks of 8):
DeltaNet and Gated DeltaNet's gradients were all NaN here under float16 autocast (the per-head RMSNorm's backward
overflowed float16), Infini's reference backward inside float16 autocast too.

Long inputs: float16 autocast at T = 2,048 (default suite) and T = 65,536 (``slow``), forward over every token and
the gradients of the last piece, via :func:`seqmem.bench.numerics.backward_at_end`; linear attention overflowed
float16 from token ~40,575 (its chunk sums ran in float16 under autocast).
"""

from __future__ import annotations

import contextlib
import copy
import math

import pytest
import torch

import seqmem
from seqmem.bench.numerics import backward_at_end
from seqmem.mixers.base import AMP_BOUNDS
from seqmem.registry import mixer_facts

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
PATTERNS = ("autocast, backward outside", "autocast, backward inside", "weights")


def amp_bounds(name: str) -> dict[str, tuple[float, float]]:
    """The mixer's ``numerics_amp`` fact over the defaults."""
    return {**AMP_BOUNDS, **mixer_facts(name).get("numerics_amp", {})}


def _mixer(name: str, impl: str) -> torch.nn.Module:
    """The first contract configuration, d_model 16, 2 heads, seeded; all-zero weight matrices redrawn (SKA's
    output projection) so no gradient is trivially zero."""
    cfg = dict(seqmem.get_entry(name).cls.contract_configs[0])
    torch.manual_seed(0)
    m = seqmem.build_mixer(name, 16, **{"n_heads": 2, **cfg, "impl": impl}).train()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() >= 2 and not p.any():
                p.normal_(0.0, p.shape[-1] ** -0.5)
    return m


def _run(m: torch.nn.Module, x: torch.Tensor, ctx, backward_inside: bool) -> tuple[torch.Tensor, dict]:
    x = x.clone().requires_grad_()
    r = torch.randn(x.shape, generator=torch.Generator().manual_seed(2))
    with ctx():
        y, _ = m(x)
        loss = (y.float() * r).sum()
        if backward_inside:
            loss.backward()
    if not backward_inside:
        loss.backward()
    return y, {"x": x.grad, **{n: p.grad for n, p in m.named_parameters()}}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach().double() - b.detach().double()).norm() / b.detach().double().norm())


def _autocast(dt: torch.dtype):
    return lambda: torch.autocast("cpu", dtype=dt)


@pytest.mark.parametrize("impl", ["fast", "reference"])
@pytest.mark.parametrize("name", seqmem.list_mixers())
def test_mixed_precision_every_mixer(name, impl):
    torch.set_num_threads(1)
    m = _mixer(name, impl)
    x = torch.randn(2, 16, 16, generator=torch.Generator().manual_seed(1))
    y32, g32 = _run(copy.deepcopy(m), x, contextlib.nullcontext, True)
    bounds = amp_bounds(name)
    failures = []
    for prec, dt in DTYPES.items():
        for pattern in PATTERNS:
            where = f"{name} {impl} {prec} {pattern}"
            if pattern == "weights":
                yr, gr = _run(copy.deepcopy(m).to(dt).float(), x.to(dt).float(), contextlib.nullcontext, True)
                y, g = _run(copy.deepcopy(m).to(dt), x.to(dt), contextlib.nullcontext, True)
                if y.dtype != dt:
                    failures.append(f"{where}: output dtype {y.dtype}")
            else:
                yr, gr = y32, g32
                y, g = _run(copy.deepcopy(m), x, _autocast(dt), pattern.endswith("inside"))
            if not torch.isfinite(y).all():
                failures.append(f"{where}: {int((~torch.isfinite(y)).sum())} NaN/Inf outputs")
                continue
            missing = sorted(k for k in gr if (gr[k] is None) != (g[k] is None))
            bad = sorted(k for k, v in g.items() if v is not None and not torch.isfinite(v).all())
            if missing or bad:
                failures.append(f"{where}: gradients missing {missing}, NaN/Inf in {bad}")
                continue
            err_y = _rel(y, yr)
            errs = {k: _rel(g[k], gr[k]) for k in gr if gr[k] is not None and float(gr[k].norm()) > 0}
            worst = max(errs, key=errs.__getitem__)
            by, bg = bounds[prec]
            if not err_y <= by:
                failures.append(f"{where}: output relative error {err_y:.2e} > {by:.1e}")
            if not errs[worst] <= bg:
                failures.append(f"{where}: gradient of {worst} relative error {errs[worst]:.2e} > {bg:.1e}")
    assert not failures, "\n".join(failures)


def test_amp_facts_are_well_formed():
    for name in seqmem.list_mixers():
        b = amp_bounds(name)
        assert set(b) == set(DTYPES), name
        assert all(len(v) == 2 and all(isinstance(e, float) and 0 < e < 1 for e in v) for v in b.values()), name


def _long_options(name: str) -> dict:
    """Registered defaults; a mixer that explodes by design with them (vla_v2: float32 too, its ``numerics_smoke``
    says so) runs its first contract configuration, which is stable."""
    if mixer_facts(name)["numerics_smoke"][0] == "nonfinite":
        return dict(seqmem.get_entry(name).cls.contract_configs[0])
    return {}


def _check_long(name: str, length: int, piece: int) -> None:
    rec = backward_at_end(name, length=length, piece=piece, precision="fp16_autocast",
                          options=_long_options(name), compare=None)
    assert rec["finite"], f"{name}: {rec['nonfinite_outputs']} NaN/Inf outputs under float16 autocast, T={length}"
    assert rec["grads_finite"], f"{name}: NaN/Inf gradients of {rec['nonfinite']} under float16 autocast, T={length}"
    assert math.isfinite(rec["grad_max"])


@pytest.mark.parametrize("name", seqmem.list_mixers())
def test_fp16_autocast_long_input_finite(name):
    """T = 2,048 in pieces of 512, registered options: every output finite, and the last piece's gradients."""
    torch.set_num_threads(1)
    _check_long(name, 2048, 512)


@pytest.mark.slow
@pytest.mark.parametrize("name", seqmem.list_mixers())
def test_fp16_autocast_64k_finite(name):
    """T = 65,536 in pieces of 4,096 (the measured run: docs/results/numerics/fp16_autocast.md)."""
    torch.set_num_threads(1)
    _check_long(name, 65536, 4096)


def test_linear_attention_readout_beyond_float16_range_under_autocast():
    """The undecayed read-out o = Sᵀφ(q) of ``linear_attention`` (``normalize=False``) grows ~t and passes
    65,504 while y = W_o o stays in range (T = 65,536, d_model 64: max |o| 1.1e5, max |y| 6.0e4): here the value
    projection is scaled up and W_o down to get there at T = 8,192.  Under float16 autocast the projection cast o
    to float16 (inf; NaN/Inf from token ~40,575 at 64k, with the op's chunk sums also in float16 then); it runs in
    float32 now and only y is rounded."""
    torch.set_num_threads(1)
    from seqmem.bench.numerics import build_random_mixer

    m, _ = build_random_mixer("linear_attention", 64, 4, 0)
    with torch.no_grad():
        m.qkv.weight[128:] *= 16
        m.out.weight /= 16
    seen = []
    m.out.register_forward_pre_hook(lambda mod, a: seen.append(float(a[0].detach().abs().max())))
    x = torch.randn(1, 8192, 64, generator=torch.Generator().manual_seed(1))
    y32 = m(x)[0]
    assert max(seen) > 65504 and y32.abs().max() < 65504  # the read-out is out of float16's range, y is not
    x16 = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.float16):
        y, _ = m(x16)
    assert y.dtype == torch.float16 and torch.isfinite(y).all()
    assert _rel(y, y32) < 2e-3
    r = torch.randn(y.shape, generator=torch.Generator().manual_seed(2))
    (y.float() * r).sum().div(y.numel() ** 0.5).backward()
    assert torch.isfinite(x16.grad).all() and all(torch.isfinite(p.grad).all() for p in m.parameters())


@pytest.mark.parametrize("name", seqmem.list_mixers())
def test_autocast_continues_its_own_state_and_refuses_another_dtype(name):
    """Under bfloat16 autocast a mixer continues the state it produced; a state in a dtype it never produces there
    (float64 or float16 for a float32 layer) is refused with the dtype named, where some layers used to fail deep
    inside with an unclear dtype error and others silently continued in float64."""
    m = _mixer(name, "fast").eval()
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        _, st = m(x[:, :4])
        m(x[:, 4:], state=st)  # its own state
        floats = [k for k, v in st.items() if v.is_floating_point()]
        if not floats:
            pytest.skip(f"{name}'s state holds no floating tensor")
        for bad in (torch.float64, torch.float16):
            wrong = {k: (v.to(bad) if k in floats else v) for k, v in st.items()}
            with pytest.raises(ValueError, match=f"has dtype {bad}"):
                m(x[:, 4:], state=wrong)



@pytest.mark.parametrize("name,impl", [(n, "fast") for n in seqmem.list_mixers()] + [("ska", "reference")])
def test_bf16_autocast_low_rank_input_close_to_float64(name, impl):
    """Input made of 4 distinct token vectors repeated (T = 128, a topic / MQAR-like stream): keys spanning few
    directions.  SKA's fast op ran its statistics and ridge solve in bfloat16 under autocast, which this input
    turned into a relative error vs float64 of 28 on the output and 3e3 on the input gradient (at most 3e-2 for
    every other mixer), with no error raised; the op computes in float32 with autocast off now (2e-2, 1e-2)."""
    torch.set_num_threads(1)
    m = _mixer(name, impl)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 16, generator=g)[torch.randint(0, 4, (2, 128), generator=g)]
    r = torch.randn(2, 128, 16, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    res = {}
    for tag in ("f64", "bf16"):
        mm = copy.deepcopy(m).double() if tag == "f64" else copy.deepcopy(m)
        xx = (x.double() if tag == "f64" else x.clone()).requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=tag == "bf16"):
            y, _ = mm(xx)
        (y.double() * r).sum().backward()
        res[tag] = (y, xx.grad)
    err_y, err_g = _rel(res["bf16"][0], res["f64"][0]), _rel(res["bf16"][1], res["f64"][1])
    assert err_y <= 4e-2 and err_g <= 5e-2, f"{name} {impl}: output {err_y:.1e}, input gradient {err_g:.1e}"
