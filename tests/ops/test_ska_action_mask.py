"""The App. F action mask of SKA (Echo eq. 53) in the chunk-causal op: reference loop == parallel form (outputs,
states, gradients; float64 and float32), no mask == all ones exactly, streaming with the mask split, the masked
statistics against eq. (53) built directly (``ska_statistics``), causality, and bad masks."""

from __future__ import annotations

import functools

import pytest
import torch
from test_ska_ops import qkv as ska_qkv

from conftest import assert_rel_close
from seqmem.ops import ska_readout, ska_statistics, spectral_koopman_attention

f64 = torch.float64


qkv = functools.partial(ska_qkv, T=29)  # the SKA op tests' inputs, at a length of 29 here


def action_mask(B=2, T=29, p=0.45, seed=1) -> torch.Tensor:
    """A random 0/1 mask (bool) with both values in every row, and a run of ones so that lag pairs occur."""
    m = torch.rand(B, T, generator=torch.Generator().manual_seed(seed)) < p
    m[:, 3:7] = True
    m[:, 0] = False
    return m


CFGS = [dict(chunk_size=8), dict(chunk_size=5, power=0), dict(chunk_size=8, power=1, norm="none"),
        dict(chunk_size=4, operator_form="unwhitened", gamma=1.4)]
CASES = [pytest.param(c, dt, id=f"{str(dt)[6:]}-" + "-".join(f"{k}={v}" for k, v in c.items()))
         for dt in (f64, torch.float32) for c in CFGS]


@pytest.mark.parametrize("cfg,dtype", CASES)
def test_masked_recurrent_equals_chunk(cfg, dtype):
    """Reference (per token, ``torch.where`` on the mask) == parallel form (masked keys): outputs, states, gradients."""
    tol = 1e-10 if dtype == f64 else 2e-4
    cfg = dict(cfg)
    q, k, v = qkv(dtype=dtype, requires_grad=True)
    gamma = torch.tensor(cfg.pop("gamma", 1.2), dtype=dtype, requires_grad=True)
    mask = action_mask()
    w = torch.randn(v.shape, dtype=dtype, generator=torch.Generator().manual_seed(9))
    res = {}
    for mode in ("recurrent", "chunk"):
        o, st = spectral_koopman_attention(q, k, v, gamma=gamma, mode=mode, mask=mask, **cfg)
        grads = torch.autograd.grad((o * w).sum(), [q, k, v, gamma], allow_unused=True)
        res[mode] = (o, st, grads)
    (o_r, s_r, g_r), (o_c, s_c, g_c) = res["recurrent"], res["chunk"]
    assert o_r.abs().max() > 1e-3
    assert_rel_close(o_c, o_r, tol, "output")
    for a, b in zip(g_c, g_r):
        assert (a is None) == (b is None)
        if a is not None:
            assert_rel_close(a, b, tol * 10, "gradient")
    for key in s_r:
        assert torch.allclose(s_c[key].double(), s_r[key].double(), rtol=tol * 10, atol=tol * 10), key
    # the mask changes the answer (it is not ignored)
    o_u, _ = spectral_koopman_attention(q, k, v, gamma=gamma, mode="chunk", **cfg)
    assert (o_u - o_c).abs().max() > 1e-3


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
@pytest.mark.parametrize("dtype", [f64, torch.float32])
def test_no_mask_equals_all_ones_exactly(mode, dtype):
    q, k, v = qkv(dtype=dtype)
    o, st = spectral_koopman_attention(q, k, v, chunk_size=8, mode=mode)
    for ones in (torch.ones(2, 29, dtype=torch.bool), torch.ones(2, 29), torch.ones(2, 29, dtype=torch.long)):
        o1, st1 = spectral_koopman_attention(q, k, v, chunk_size=8, mode=mode, mask=ones)
        assert torch.equal(o1, o)
        assert all(torch.equal(st1[key], st[key]) for key in st)


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
def test_masked_streaming_splits_equal_full(mode):
    """The state carries the masked sums and the masked previous key: any split, the mask split alike, == one
    call."""
    q, k, v = qkv(T=37)
    mask = action_mask(T=37)
    o, st = spectral_koopman_attention(q, k, v, chunk_size=8, mode=mode, mask=mask)
    splits = ([5, 11, 3, 18], [8, 8, 8, 8, 5], [36, 1]) + (([1] * 37,) if mode == "chunk" else ())
    for sizes in splits:
        i, state, ys = 0, None, []
        for n in sizes:
            y, state = spectral_koopman_attention(q[:, i:i + n], k[:, i:i + n], v[:, i:i + n], chunk_size=8, mode=mode,
                                                  initial_state=state, mask=mask[:, i:i + n])
            ys.append(y)
            i += n
        assert_rel_close(torch.cat(ys, 1), o, 1e-10, f"split {sizes}")
        for key in st:
            assert torch.allclose(state[key].double(), st[key].double(), rtol=1e-10, atol=1e-12), key


def test_chunk_reads_eq53_statistics_of_earlier_chunks():
    """Chunk c's queries read exactly eq. (53)'s masked G, M, C_v over tokens < c·S (``ska_statistics``, built
    independently of the op): G over m_t = 1, M over adjacent pairs with m_t = m_{t-1} = 1, C_v over m_t = 1."""
    S, T = 8, 29
    q, k, v = qkv(T=T)
    mask = action_mask(T=T)
    o, _ = spectral_koopman_attention(q, k, v, chunk_size=S, norm="none", power=2, gamma=1.2, mask=mask)
    for c in range(1, (T + S - 1) // S):
        end = c * S
        G, M, Cv = ska_statistics(k[:, :end], v[:, :end], mask=mask[:, :end])
        Q = q[:, end:end + S].permute(0, 2, 3, 1)  # (B, H, r, n)
        y = ska_readout(G, M, Cv, Q, power=2, gamma=1.2).permute(0, 3, 1, 2)
        assert_rel_close(o[:, end:end + S], y, 1e-10, f"chunk {c}")
    assert o[:, :S].abs().max() == 0  # chunk 0 reads nothing (eqs. 8-10)


def test_masked_out_tokens_do_not_enter_the_statistics():
    """With norm="none", the keys and values of masked-out tokens change no output (their queries still read)."""
    q, k, v = qkv()
    mask = action_mask()
    o, _ = spectral_koopman_attention(q, k, v, chunk_size=4, norm="none", mask=mask)
    off = ~mask
    k2 = torch.where(off[..., None, None], 10 * torch.randn_like(k), k)
    v2 = torch.where(off[..., None, None], torch.randn_like(v), v)
    o2, _ = spectral_koopman_attention(q, k2, v2, chunk_size=4, norm="none", mask=mask)
    assert_rel_close(o2, o, 1e-12, "masked-out keys/values")
    assert o.abs().max() > 1e-3


@pytest.mark.parametrize("norm", ["prefix_max", "none"])
def test_mask_is_causal(norm):
    """Flipping m_t changes no output before the chunk after t's (chunk-causal: a chunk reads earlier chunks)."""
    S, T = 6, 29
    q, k, v = qkv(T=T)
    mask = action_mask(T=T)
    o, _ = spectral_koopman_attention(q, k, v, chunk_size=S, norm=norm, mask=mask)
    for t in (4, 13, 20):
        m2 = mask.clone()
        m2[:, t] = ~m2[:, t]
        o2, _ = spectral_koopman_attention(q, k, v, chunk_size=S, norm=norm, mask=m2)
        nxt = (t // S + 1) * S
        # equal up to rounding: the exclusive prefix sum is formed as (inclusive - own chunk)
        assert_rel_close(o2[:, :nxt], o[:, :nxt], 1e-12, f"outputs before chunk {nxt // S}")
        assert (o2[:, nxt:] - o[:, nxt:]).abs().max() > 0


@pytest.mark.parametrize("bad,match", [
    (torch.ones(2, 28), "shape"),
    (torch.ones(29), "shape"),
    (torch.full((2, 29), 2.0), "only 0 and 1"),
    (torch.full((2, 29), float("nan")), "only 0 and 1"),
    (torch.full((2, 29), 0.5), "only 0 and 1"),
    (torch.ones(2, 29, dtype=torch.complex64), "bool, integer or floating"),
    ([[1] * 29] * 2, "tensor"),
])
@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
def test_bad_masks_raise(bad, match, mode):
    q, k, v = qkv(T=29)
    with pytest.raises(ValueError, match=match):
        spectral_koopman_attention(q, k, v, chunk_size=8, mode=mode, mask=bad)
