"""The ``ska`` mixer (Echo): construction, parameters, state size, zero-init, chunk-causal behaviour, and the
non-causal paper option (``norm="seqmax"``) that the contract tests exclude."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_rel_close
from seqmem import build_mixer, count_state

f64 = torch.float64


def make(**kw):
    torch.manual_seed(0)
    opts = dict(n_heads=2, rank=4, chunk_size=8)
    opts.update(kw)
    m = build_mixer("ska", 16, **opts).double()
    with torch.no_grad():
        m.w_o.weight.normal_(0, 0.3)  # the paper's zero-init would make every output 0
    return m


def x_(T=37, B=2, seed=1):
    return torch.randn(B, T, 16, dtype=f64, generator=torch.Generator().manual_seed(seed))


def test_parameters_and_init():
    """App. F: 2·d·H·r + 2·d·H·P + 2 parameters; W_o zero-initialised, W_k / W_q orthogonal."""
    d, H, r = 128, 4, 24
    m = build_mixer("ska", d, n_heads=H, rank=r)
    assert sum(p.numel() for p in m.parameters()) == 2 * d * H * r + 2 * d * d + 2
    assert m.w_o.weight.abs().max() == 0
    W = m.w_k.weight  # (H r, d) = (96, 128): orthonormal rows
    assert torch.allclose(W @ W.T, torch.eye(H * r), atol=1e-5)
    y, _ = m(torch.randn(2, 70, d))
    assert y.abs().max() == 0  # SKA starts as a no-op in the residual stream
    assert abs(float(m.eta.detach()) - 1.5) < 1e-6 and 1.0 <= float(m.gamma.detach()) <= 1.0 + 2e-3


def test_state_size():
    m = make()
    for T in (1, 8, 37):
        _, st = m(x_(T))
        assert count_state(st) == m.state_size(T) == 2 * (4 * 16 + 2 * 8 * 4 + 4 + 2) + 1


def test_first_chunk_outputs_zero_and_later_chunks_do_not():
    """Eqs. (7)–(10): chunk 0 reads G = εI, M = 0, C_v = 0, hence zero output."""
    m = make()
    y, _ = m(x_())
    assert y[:, :8].abs().max() == 0
    assert y[:, 8:].abs().min(dim=-1).values.min() > 0


def test_seqmax_option_is_not_causal():
    """The paper's eq. (3) normalisation is available but NOT causal, so it is excluded from the contract."""
    m = make(norm="seqmax")
    x = x_()
    y, _ = m(x)
    x2 = x.clone()
    x2[:, -1] *= 50
    y2, _ = m(x2)
    assert (y2[:, :32] - y[:, :32]).abs().max() > 1e-3 * y.abs().max()
    # the causal default does not leak
    m = make()
    y, _ = m(x)
    y2, _ = m(x2)
    assert_rel_close(y2[:, :36], y[:, :36], 1e-12, "prefix_max leaked")


def test_reference_equals_fast_long_chunks():
    ref, fast = make(impl="reference", chunk_size=16), make(impl="fast", chunk_size=16)
    fast.load_state_dict(ref.state_dict())
    x = x_(T=50)
    assert_rel_close(fast(x)[0], ref(x)[0], 1e-10, "fast vs reference")


def test_gradients_reach_eta_and_gamma():
    m = make(gamma_init=1.2)
    y, _ = m(x_())
    y.pow(2).sum().backward()
    assert m.eta.grad.abs() > 0 and m.gamma_raw.grad.abs() > 0 and m.w_k.weight.grad.abs().max() > 0


@pytest.mark.parametrize(
    "bad",
    [
        dict(rank=0),
        dict(chunk_size=0),
        dict(power=-1),
        dict(norm="l2"),
        dict(eps=0.0),
        dict(gamma_init=2.0),
        dict(operator_form="x"),
        dict(spec_iters=0),
        dict(n_heads=3),
    ],
)
def test_bad_options_raise(bad):
    with pytest.raises(ValueError):
        build_mixer("ska", 16, **{"n_heads": 2, **bad})


def test_koopman_mlp():
    """§3.3 / eq. (14): 2·d·d_k + d_k parameters, d_k = ⌈8d/3⌉₆₄ (448 → 1216, 768 → 2048, 128 → 384),
    |λ_i| ≤ 1 after the clamp (= 1 with unit_circle), and the pair rotation equals W_readout·R·SiLU(W_lift h)."""
    for d, dk in ((448, 1216), (768, 2048), (128, 384)):
        m = build_mixer("koopman_mlp", d)
        assert m.d_k == dk and sum(p.numel() for p in m.parameters()) == 2 * d * dk + dk
    m = build_mixer("koopman_mlp", 16, d_k=8).double()
    with torch.no_grad():
        m.lam_re.copy_(torch.tensor([2.0, 0.5, 0.1, -1.0]))
        m.lam_im.copy_(torch.tensor([0.0, 0.5, 0.2, 1.0]))
    a, w = (t.detach() for t in m.eigenvalues())
    assert (torch.sqrt(a**2 + w**2) <= 1 + 1e-12).all()
    assert torch.allclose(a[1:3], m.lam_re[1:3]) and abs(float(a[0]) - 1.0) < 1e-12
    x = x_(T=5)
    y, st = m(x)
    g = torch.nn.functional.silu(m.w_lift(x))
    R = torch.zeros(8, 8, dtype=f64)
    for i in range(4):
        R[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[a[i], w[i]], [-w[i], a[i]]])
    assert_rel_close(y, m.w_readout(g @ R.T), 1e-12, "eq. 14")
    assert int(st["pos"][0]) == 5
    u = build_mixer("koopman_mlp", 16, d_k=8, unit_circle=True)
    a, w = (t.detach() for t in u.eigenvalues())
    assert torch.allclose(a**2 + w**2, torch.ones(4))
    with pytest.raises(ValueError):
        build_mixer("koopman_mlp", 16, d_k=7)


def test_hybrid_lm_streams_exactly():
    """Mamba-2 + SKA (+ Koopman MLP) hybrid through the LM backbone: token-by-token decoding and a split that cuts
    SKA chunks equal the training forward (float64), and the state does not grow with T."""
    from seqmem.models import LanguageModel
    from seqmem.repro.echo import hybrid_config

    cfg = hybrid_config(32, 4, 2, [1, 2], "ska", rank=4, chunk_size=8, d_state=8, vocab_size=50, ffn="koopman")
    cfg.mixer_options = [{"d_state": 8, "chunk_size": 8} if n == "mamba2" else o
                         for n, o in zip(cfg.mixer, cfg.mixer_options)]
    torch.manual_seed(0)
    model = LanguageModel(cfg).double()
    with torch.no_grad():
        for blk in model.blocks:
            if blk.mixer.registered_name == "ska":
                blk.mixer.w_o.weight.normal_(0, 0.3)
    ids = torch.randint(0, 50, (2, 30), generator=torch.Generator().manual_seed(1))
    full, st_full = model(ids)
    outs, st = [], None
    for t in range(30):
        o, st = model(ids[:, t : t + 1], st)
        outs.append(o)
    assert_rel_close(torch.cat(outs, 1), full, 1e-9, "token-by-token")
    a, st = model(ids[:, :13])
    b, _ = model(ids[:, 13:], st)
    assert_rel_close(torch.cat([a, b], 1), full, 1e-9, "split 13/17")
    assert count_state(st_full[2]) == model.blocks[2].mixer.state_size(30) == model.blocks[2].mixer.state_size(3000)


# ----------------------------------------------------------------------------------------------------------------
# the App. F action mask (eq. 53): forward(..., action_mask=)
# ----------------------------------------------------------------------------------------------------------------
def amask(T=37, B=2, seed=3):
    m = torch.rand(B, T, generator=torch.Generator().manual_seed(seed)) < 0.5
    m[:, 2:6] = True
    return m


@pytest.mark.parametrize("dtype", [f64, torch.float32])
def test_action_mask_reference_equals_fast(dtype):
    """impl="reference" (per-token loop) == impl="fast" (chunked) with a mask: outputs and parameter gradients."""
    x, mask = x_().to(dtype), amask()
    tol = 1e-10 if dtype == f64 else 2e-4
    res = {}
    for impl in ("reference", "fast"):
        m = make(impl=impl).to(dtype)
        y, _ = m(x, action_mask=mask)
        grads = torch.autograd.grad(y.square().sum(), list(m.parameters()))
        res[impl] = (y, grads)
    assert_rel_close(res["fast"][0], res["reference"][0], tol, "output")
    for a, b in zip(res["fast"][1], res["reference"][1]):
        assert_rel_close(a, b, tol * 10, "gradient")
    y0, _ = make().to(dtype)(x)
    assert (y0 - res["fast"][0]).abs().max() > 1e-3  # the mask is used


def test_action_mask_none_equals_ones_and_streams():
    m, x, mask = make(), x_(), amask()
    y, st = m(x)
    y1, st1 = m(x, action_mask=torch.ones(2, 37, dtype=torch.bool))
    assert torch.equal(y1, y) and all(torch.equal(st1[k], st[k]) for k in st)
    ym, stm = m(x, action_mask=mask)
    for sizes in ([1] * 37, [5, 11, 3, 18], [36, 1]):  # one-token calls run the reference form (decode)
        i, state, ys = 0, None, []
        for n in sizes:
            yy, state = m(x[:, i:i + n], state, action_mask=mask[:, i:i + n])
            ys.append(yy)
            i += n
        assert_rel_close(torch.cat(ys, 1), ym, 1e-10, f"split {sizes}")
        for k in stm:
            assert torch.allclose(state[k], stm[k], rtol=1e-10, atol=1e-12), k


def test_action_mask_bad_inputs_raise():
    m, x = make(), x_()
    with pytest.raises(ValueError, match="shape"):
        m(x, action_mask=torch.ones(2, 36))
    with pytest.raises(ValueError, match="only 0 and 1"):
        m(x, action_mask=torch.full((2, 37), 3))
    with pytest.raises(ValueError, match="cu_seqlens"):
        m(x[:1], action_mask=torch.ones(1, 37), cu_seqlens=torch.tensor([0, 20, 37]))
    # a failed call leaves no mask behind: the next call without one is the unmasked forward
    y, _ = m(x)
    m2 = make()
    assert torch.equal(y, m2(x)[0])


def test_only_ska_takes_an_action_mask():
    from seqmem.registry import get_entry, list_mixers

    takers = [n for n in list_mixers() if get_entry(n).cls.takes_action_mask]
    assert takers == ["ska"]
