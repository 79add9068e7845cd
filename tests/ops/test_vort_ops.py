"""VORT retrieval ops: merged SOE retention (recurrent / chunk / parallel) vs the literal K-bank eqs. (14)-(16)
and vs the unrolled sums of eqs. (13)/(16); local attention + entropy; plasticity loss and refinement."""

from __future__ import annotations

import math

import pytest
import torch

from seqmem.ops import (
    gl_weights,
    local_window_attention,
    refine_alpha,
    retrieval_loss,
    soe_coefficients,
    soe_kernel,
    soe_retention,
)

B, T, H, F, D = 2, 41, 2, 5, 3


def data(dtype=torch.float64, seed=0, t=T):
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(B, t, H, F, generator=g, dtype=dtype)
    k = torch.rand(B, t, H, F, generator=g, dtype=dtype)
    v = torch.randn(B, t, H, D, generator=g, dtype=dtype)
    a = 0.1 + 0.9 * torch.rand(B, t, generator=g, dtype=dtype)
    return q, k, v, a


def unrolled(q, k, v, a, S, Tz, normalizer="kernel", strict=False, eps0=1e-6):
    """o_t = Σ_i s_ti ŵ_{t-i}^(α_i) v_i / (Σ_i s_ti [ŵ or 1] + ε0), straight from eqs. (13)/(16)."""
    out = torch.zeros(B, q.shape[1], H, D, dtype=q.dtype)
    W = soe_kernel(a, torch.arange(q.shape[1]), S, Tz)  # W[b, i, lag] = ŵ_lag^(α_i)
    for b in range(B):
        for t in range(q.shape[1]):
            idx = range(t) if strict else range(t + 1)
            w = torch.stack([W[b, i, t - i] for i in idx]) if len(idx) else None
            if w is None:
                continue
            s = torch.einsum("hf,ihf->ih", q[b, t], k[b, list(idx)])
            num = (s * w[:, None])[..., None] * v[b, list(idx)]
            den = (s * w[:, None]).sum(0) if normalizer == "kernel" else s.sum(0)
            out[b, t] = num.sum(0) / (den + eps0)[:, None]
    return out


@pytest.mark.parametrize("normalizer", ["kernel", "plain"])
@pytest.mark.parametrize("strict", [False, True])
def test_modes_agree_and_match_unrolled(normalizer, strict):
    q, k, v, a = data()
    c, xi, cn = soe_coefficients(a, 6, 64)
    outs = {}
    for mode in ("recurrent", "chunk", "parallel"):
        outs[mode] = soe_retention(q, k, v, c, xi, cn, normalizer=normalizer, strict_causal=strict, mode=mode,
                                   chunk_size=8)
    ref = unrolled(q, k, v, a, 6, 64, normalizer, strict)
    for mode, (o, st) in outs.items():
        torch.testing.assert_close(o, ref, rtol=1e-10, atol=1e-12, msg=mode)
        for key in st:
            torch.testing.assert_close(st[key], outs["recurrent"][1][key], rtol=1e-10, atol=1e-12)


def test_merged_equals_literal_k_banks():
    """Eqs. (14)-(16) with K banks and hard routing == merged states with c_s(α_{k*})."""
    q, k, v, a = data(seed=1)
    K, delta = 4, 0.1
    banks = delta + (1 - delta) * torch.arange(1, K + 1, dtype=torch.float64) / K
    kstar = (a[..., None] - banks).abs().argmin(-1)
    C, xi, Cn = soe_coefficients(banks, 8, 100)  # (K, S'), (S',), (K,)
    lam = torch.exp(-xi)
    G = torch.zeros(B, K, H, xi.numel(), F, D, dtype=torch.float64)
    bb = torch.zeros(B, K, H, xi.numel(), F, dtype=torch.float64)
    outs = []
    for t in range(T):
        onehot = torch.nn.functional.one_hot(kstar[:, t], K).double()  # 1[k_t* = k]
        w = onehot[:, :, None] * C[None]  # (B, K, S')
        G = lam[:, None, None] * G + w[:, :, None, :, None, None] * torch.einsum(
            "bhf,bhd->bhfd", k[:, t], v[:, t])[:, None, :, None]
        bb = lam[:, None] * bb + w[:, :, None, :, None] * k[:, t][:, None, :, None]
        cnow = (onehot * Cn).sum(1)[:, None] * (q[:, t] * k[:, t]).sum(-1)  # λ = 0 lump of the routed bank
        num = torch.einsum("bhf,bkhsfd->bhd", q[:, t], G) + cnow[..., None] * v[:, t]
        den = torch.einsum("bhf,bkhsf->bh", q[:, t], bb) + cnow
        outs.append(num / (den + 1e-6)[..., None])
    lit = torch.stack(outs, 1)
    c, xi2, cn = soe_coefficients(banks[kstar], 8, 100)
    merged, _ = soe_retention(q, k, v, c, xi2, cn, mode="chunk", chunk_size=7)
    torch.testing.assert_close(merged, lit, rtol=1e-10, atol=1e-12)


def test_float32_and_gradients():
    q, k, v, a = data()
    a = a.requires_grad_(True)
    c, xi, cn = soe_coefficients(a, 10, 200)
    grads = {}
    for mode in ("recurrent", "chunk"):
        o, _ = soe_retention(q, k, v, c, xi, cn, mode=mode, chunk_size=8)
        grads[mode] = torch.autograd.grad(o.square().sum(), a, retain_graph=True)[0]
    torch.testing.assert_close(grads["chunk"], grads["recurrent"], rtol=1e-9, atol=1e-12)
    assert grads["chunk"].abs().max() > 0
    q32, k32, v32, a32 = (x.float() for x in data())
    c32, xi32, cn32 = soe_coefficients(a32, 15, 1000)
    o1, _ = soe_retention(q32, k32, v32, c32, xi32, cn32, mode="recurrent")
    o2, _ = soe_retention(q32, k32, v32, c32, xi32, cn32, mode="chunk", chunk_size=16)
    assert (o1 - o2).abs().max() / o1.abs().max() < 1e-5


def test_alpha_one_is_running_sum_linear_attention():
    q, k, v, _ = data()
    c, xi, cn = soe_coefficients(torch.ones(B, T, dtype=torch.float64), 15, 1000)
    o, _ = soe_retention(q, k, v, c, xi, cn, mode="chunk", chunk_size=8)
    s = torch.einsum("bthf,bihf->bhti", q, k).tril()
    ref = torch.einsum("bhti,bihd->bthd", s, v) / (s.sum(-1).transpose(1, 2)[..., None] + 1e-6)
    torch.testing.assert_close(o, ref, rtol=1e-10, atol=1e-12)


def test_bad_inputs():
    q, k, v, a = data()
    c, xi, cn = soe_coefficients(a, 6, 64)
    with pytest.raises(ValueError):
        soe_retention(q, k, v, c, xi, cn, mode="fast")
    with pytest.raises(ValueError):
        soe_retention(q, k, v, c, xi[:-1], cn)
    with pytest.raises(ValueError):
        soe_retention(q, k[:, :-1], v, c, xi, cn)
    with pytest.raises(ValueError):
        soe_retention(q, k, v, c, xi, cn, normalizer="none")
    with pytest.raises(ValueError):
        local_window_attention(q, k, v, 0)


@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
def test_eps0_is_checked(mode):
    """ε0 < 0 or NaN was taken silently (ε0 = 0 stays: it makes the read-out scale-free)."""
    q, k, v, a = data(t=6)
    c, xi, cn = soe_coefficients(a, 6, 64)
    for bad in (-1e-6, float("nan")):
        with pytest.raises(ValueError, match="soe_retention: eps0 must be a finite number >= 0"):
            soe_retention(q, k, v, c, xi, cn, mode=mode, eps0=bad)
    o, _ = soe_retention(q, k, v, c, xi, cn, mode=mode, eps0=0.0)  # non-strict reads token t with itself written
    assert torch.isfinite(o).all()


@pytest.mark.parametrize("mode", ["recurrent", "chunk", "parallel"])
def test_soe_retention_checks_its_state(mode):
    """A batch-1 state with a batch-2 input broadcast silently in the recurrent form (a bare RuntimeError in the
    chunked one); an unknown key was dropped and a missing "G" was a KeyError.  Each is a named error now."""
    q, k, v, a = data(t=9)
    c, xi, cn = soe_coefficients(a, 6, 64)
    S = xi.shape[0]
    _, st = soe_retention(q, k, v, c, xi, cn, mode=mode, chunk_size=4)
    with pytest.raises(ValueError, match=rf"soe_retention: initial_state\['G'\] must have shape \(batch, heads, S', "
                                         rf"F, Dv\) = \({B}, {H}, {S}, {F}, {D}\), got \(1, {H}, {S}, {F}, {D}\)"):
        soe_retention(q, k, v, c, xi, cn, mode=mode, initial_state={"G": st["G"][:1], "b": st["b"][:1]})
    with pytest.raises(ValueError, match=rf"initial_state\['b'\] must have shape \(batch, heads, S', F\) = "
                                         rf"\({B}, {H}, {S}, {F}\)"):
        soe_retention(q, k, v, c, xi, cn, mode=mode, initial_state={"G": st["G"], "b": st["b"][:, :, :-1]})
    with pytest.raises(ValueError, match=r"initial_state\['b'\] must be a floating-point tensor"):
        soe_retention(q, k, v, c, xi, cn, mode=mode, initial_state={"G": st["G"], "b": st["b"].long()})
    with pytest.raises(ValueError, match=r"soe_retention: initial_state has no 'G'; it needs the keys \['G', 'b'\], "
                                         r"got \['b'\]"):
        soe_retention(q, k, v, c, xi, cn, mode=mode, initial_state={"b": st["b"]})
    with pytest.raises(ValueError, match=r"soe_retention: initial_state has keys \['B'\] this call does not read"):
        soe_retention(q, k, v, c, xi, cn, mode=mode, initial_state={**st, "B": st["b"]})
    with pytest.raises(ValueError, match=r"initial_state has keys \['m'\] this call does not read \('m' is the key "
                                         r"scale of a state built with k_log_scale; pass k_log_scale\)"):
        soe_retention(q, k, v, c, xi, cn, mode=mode, initial_state={**st, "m": torch.zeros(B, H, dtype=q.dtype)})
    with pytest.raises(ValueError, match=r"initial_state has no 'z' \(normalizer='plain' reads its undecayed key "
                                         r"sum\)"):
        soe_retention(q, k, v, c, xi, cn, mode=mode, normalizer="plain", initial_state=st)
    _, st_p = soe_retention(q, k, v, c, xi, cn, mode=mode, normalizer="plain", chunk_size=4)
    with pytest.raises(ValueError, match=rf"initial_state\['z'\] must have shape \(batch, heads, F\) = "
                                         rf"\({B}, {H}, {F}\), got \(1, {H}, {F}\)"):
        soe_retention(q, k, v, c, xi, cn, mode=mode, normalizer="plain", initial_state={**st_p, "z": st_p["z"][:1]})
    with pytest.raises(ValueError, match=r"initial_state has keys \['z'\] this call does not read"):
        soe_retention(q, k, v, c, xi, cn, mode=mode, initial_state=st_p)
    beta = torch.zeros(B, 9, H, dtype=q.dtype)
    with pytest.raises(ValueError, match=rf"initial_state\['m'\] must have shape \(batch, heads\) = \({B}, {H}\)"):
        soe_retention(q, k, v, c, xi, cn, mode=mode, k_log_scale=beta, initial_state={**st, "m": beta[:, 0, :1]})
    soe_retention(q, k, v, c, xi, cn, mode=mode, k_log_scale=beta, initial_state={**st, "m": beta[:, 0]})  # fine


def test_refine_alpha_refuses_a_non_finite_step():
    """lr = nan passed ``lr <= 0`` and made every α NaN (clamp keeps NaN); lr = inf jumped to the box's corners."""
    a0 = torch.full((1, 4), 0.5, dtype=torch.float64)
    for bad in (float("nan"), float("inf"), 0.0):
        with pytest.raises(ValueError, match=rf"refine_alpha: lr must be a finite number > 0, got {bad!r}"):
            refine_alpha(a0, lambda a: (a**2).sum(), lr=bad)
    with pytest.raises(ValueError, match=r"refine_alpha: min_alpha must be in \(0, 1\], got nan"):
        refine_alpha(a0, lambda a: (a**2).sum(), min_alpha=float("nan"))


def test_local_window_attention_and_entropy():
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(B, T, H, 4, generator=g, dtype=torch.float64) for _ in range(3))
    w = 6
    o_chunk, e_chunk = local_window_attention(q, k, v, w, mode="chunk", chunk_size=8)
    o_rec, e_rec = local_window_attention(q, k, v, w, mode="recurrent")
    torch.testing.assert_close(o_chunk, o_rec)
    torch.testing.assert_close(e_chunk, e_rec)
    # manual row t = 20
    t = 20
    s = torch.einsum("bhd,bkhd->bhk", q[:, t], k[:, t - w + 1 : t + 1]) / 2.0
    p = s.softmax(-1)
    torch.testing.assert_close(o_rec[:, t], torch.einsum("bhk,bkhd->bhd", p, v[:, t - w + 1 : t + 1]))
    ent = (-(p * p.log()).sum(-1) / math.log(w)).mean(1)
    torch.testing.assert_close(e_rec[:, t], ent)
    assert (e_rec[:, 0] == 0).all() and ((e_rec >= 0) & (e_rec <= 1 + 1e-12)).all()
    # continuing from the last window-1 keys gives the same result
    o2, e2 = local_window_attention(q[:, 15:], k[:, 15:], v[:, 15:], w,
                                    initial_state={"k": k[:, 10:15], "v": v[:, 10:15]})
    torch.testing.assert_close(o2, o_rec[:, 15:])
    torch.testing.assert_close(e2, e_rec[:, 15:])


@pytest.mark.parametrize("window,chunk,past", [(6, 8, 0), (6, 2, 3), (9, 4, 8), (3, 7, 11), (1, 5, 0), (5, 23, 2)])
def test_local_window_blocks_equal_the_per_query_loop(window, chunk, past):
    """The batched block form (unfold of the padded keys) against the per-query reference: chunks shorter and
    longer than the window, T not a multiple of the chunk, more or fewer past keys than window - 1, gradients."""
    g = torch.Generator().manual_seed(window * 100 + chunk)
    T_ = 23
    q, k, v = (torch.randn(2, T_, 2, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    pk, pv = (torch.randn(2, past, 2, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    kw = {} if past == 0 else {"initial_state": {"k": pk, "v": pv}}
    outs = {}
    for mode, cs in (("recurrent", 1), ("chunk", chunk), ("parallel", 1)):
        o, e = local_window_attention(q, k, v, window, mode=mode, chunk_size=cs, **kw)
        grads = torch.autograd.grad((o * o).sum() + e.sum(), [q, k, v] + ([pk, pv] if past else []))
        outs[mode] = (o, e, grads)
    for mode in ("chunk", "parallel"):
        for a, b in zip(outs[mode][:2] + outs[mode][2], outs["recurrent"][:2] + outs["recurrent"][2]):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_retrieval_loss_matches_definition_and_refinement():
    g = torch.Generator().manual_seed(2)
    t = 30
    q = torch.randn(1, t, 1, 4, generator=g, dtype=torch.float64)
    k = torch.randn(1, t, 1, 4, generator=g, dtype=torch.float64)
    alpha = torch.full((1, t), 0.5, dtype=torch.float64)
    source = torch.full((1, t), -1)
    source[0, 25], source[0, 29] = 3, 1
    loss = retrieval_loss(q, k, alpha, source, exact_kernel=True, reduction="sum")
    manual = 0.0
    for tt, i_star in ((25, 3), (29, 1)):
        r = torch.tensor([math.exp(float(q[0, tt, 0] @ k[0, i, 0]) / 2) * float(gl_weights(0.5, [tt - i])[0])
                          for i in range(tt)])
        manual -= math.log(float(r[i_star] / r.sum()))
    assert float(loss) == pytest.approx(manual, rel=1e-8)
    soe_loss = retrieval_loss(q, k, alpha, source, n_terms=15, horizon=64, reduction="sum")
    assert float(soe_loss) == pytest.approx(manual, rel=5e-3)
    with pytest.raises(ValueError):
        retrieval_loss(q, k, alpha, torch.full((1, t), 40))
    # long-lag sources favour larger α: projected GD raises α of the source tokens and lowers the loss
    a0 = torch.full((1, t), 0.3, dtype=torch.float64)
    fn = lambda a: retrieval_loss(q, k, a, source, n_terms=15, horizon=64)  # noqa: E731
    a_ref, hist = refine_alpha(a0, fn, min_alpha=0.1, lr=0.5, steps=20)
    assert hist[-1] < hist[0] - 0.1
    assert ((a_ref >= 0.1) & (a_ref <= 1.0)).all()
    assert float(a_ref[0, 1]) > 0.3 and float(a_ref[0, 3]) > 0.3


# ---- keys in scaled form (FAVOR+ stabilisation): φ(k_t) = k_t·e^{β_t}, state relative to the running max of β
def scaled_data(spread: float, dtype=torch.float64, seed=5, t=T):
    q, k, v, a = data(dtype, seed, t)
    g = torch.Generator().manual_seed(seed + 100)
    beta = spread * torch.randn(B, t, H, generator=g, dtype=dtype)
    return q, k, v, a, beta


@pytest.mark.parametrize("normalizer", ["kernel", "plain"])
@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("mode", ["recurrent", "chunk", "parallel"])
def test_scaled_keys_are_the_keys_they_stand_for(mode, normalizer, strict):
    """With ε0 = 0 the read-out is scale-free, so (k̃, β) must give exactly what φ(k) = k̃ e^β gives."""
    q, k, v, a, beta = scaled_data(3.0)
    c, xi, cn = soe_coefficients(a, 6, 64)
    kw = dict(normalizer=normalizer, strict_causal=strict, mode=mode, chunk_size=8, eps0=0.0)
    o_ref, _ = soe_retention(q, k * beta.exp()[..., None], v, c, xi, cn, **kw)
    o, st = soe_retention(q, k, v, c, xi, cn, k_log_scale=beta, **kw)
    rows = slice(1, None) if strict else slice(None)  # a strict first row sees nothing: 0/0 in both
    torch.testing.assert_close(o[:, rows], o_ref[:, rows], rtol=1e-10, atol=0)
    assert st["m"].shape == (B, H)
    torch.testing.assert_close(st["m"], beta.amax(1))  # the state is kept in units of the largest key scale


@pytest.mark.parametrize("normalizer", ["kernel", "plain"])
@pytest.mark.parametrize("strict", [False, True])
def test_scaled_keys_modes_and_streaming_agree_at_any_spread(normalizer, strict):
    """β spread over ±2000 (raw features would be 0 or inf in float64): every mode and every split agree, finite."""
    q, k, v, a, beta = scaled_data(1000.0)
    c, xi, cn = soe_coefficients(a, 6, 64)
    kw = dict(normalizer=normalizer, strict_causal=strict, eps0=1e-3)
    outs = {m: soe_retention(q, k, v, c, xi, cn, k_log_scale=beta, mode=m, chunk_size=8, **kw)
            for m in ("recurrent", "chunk", "parallel")}
    o_ref, st_ref = outs["recurrent"]
    assert torch.isfinite(o_ref).all() and o_ref.abs().amax() > 0
    for m, (o, st) in outs.items():
        torch.testing.assert_close(o, o_ref, rtol=1e-9, atol=1e-12, msg=f"{m} vs recurrent")
        for key in st_ref:
            torch.testing.assert_close(st[key], st_ref[key], rtol=1e-9, atol=1e-12, msg=f"{m} state {key}")
    for mode in ("recurrent", "chunk"):
        pieces, state, i = [], None, 0
        for n in (5, 13, 1, 22):
            sl = slice(i, i + n)
            o, state = soe_retention(q[:, sl], k[:, sl], v[:, sl], c[:, sl], xi, cn[:, sl], k_log_scale=beta[:, sl],
                                     initial_state=state, mode=mode, chunk_size=8, **kw)
            pieces.append(o)
            i += n
        torch.testing.assert_close(torch.cat(pieces, 1), o_ref, rtol=1e-9, atol=1e-12, msg=f"{mode} streamed")


def test_scaled_keys_float32_tracks_float64_and_state_without_m_means_unit_scale():
    q, k, v, a, beta = scaled_data(300.0)
    c, xi, cn = soe_coefficients(a, 6, 64)
    o64, _ = soe_retention(q, k, v, c, xi, cn, k_log_scale=beta, chunk_size=8)
    f = [x.float() for x in (q, k, v, c, xi, cn, beta)]
    o32, _ = soe_retention(*f[:6], k_log_scale=f[6], chunk_size=8)
    assert (o32.double() - o64).norm() / o64.norm() < 1e-5
    # a state without "m" (written by the unscaled form) is read in units of 1
    o1, st = soe_retention(q[:, :9], k[:, :9], v[:, :9], c[:, :9], xi, cn[:, :9], chunk_size=4)
    o2, _ = soe_retention(q[:, 9:], k[:, 9:], v[:, 9:], c[:, 9:], xi, cn[:, 9:], initial_state=st,
                          k_log_scale=torch.zeros_like(beta[:, 9:]), chunk_size=4)
    o_all, _ = soe_retention(q, k, v, c, xi, cn, chunk_size=4)
    torch.testing.assert_close(torch.cat([o1, o2], 1), o_all, rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="k_log_scale"):
        soe_retention(q, k, v, c, xi, cn, k_log_scale=beta[:, :-1])


@pytest.mark.parametrize("normalizer", ["kernel", "plain"])
@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("scaled", [False, True])
def test_kv_retention_with_the_soe_kernel_is_soe_retention(normalizer, strict, scaled):
    """The KV-cache form (any kernel weights) given the SOE kernel's weights is the state form, scaled keys included."""
    from seqmem.ops import kv_retention, soe_kernel_matrix

    q, k, v, a, beta = scaled_data(40.0)
    c, xi, cn = soe_coefficients(a, 6, 64)
    pos = torch.arange(T)
    visible = pos[None, :] < pos[:, None] if strict else pos[None, :] <= pos[:, None]
    decay = soe_kernel_matrix(pos, pos, c, xi, None if strict else cn) * visible
    ls = beta if scaled else None
    o = kv_retention(q, k, v, decay, visible, k_log_scale=ls, normalizer=normalizer, eps0=1e-3)
    o_ref, _ = soe_retention(q, k, v, c, xi, cn, k_log_scale=ls, normalizer=normalizer, strict_causal=strict,
                             eps0=1e-3, mode="recurrent")
    torch.testing.assert_close(o, o_ref, rtol=1e-9, atol=1e-12)


def test_kv_retention_exact_scores_are_softmax_weighted():
    from seqmem.ops import kv_retention

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 6, 1, 4, generator=g, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(6)
    visible = pos[None, :] <= pos[:, None]
    decay = visible.to(torch.float64)[None]  # no decay: the read-out is causal softmax attention (eps0 = 0)
    o = kv_retention(q * 30, k, v, decay, visible, scores="exact", eps0=0.0)
    att = torch.softmax((30 * q[0, :, 0] @ k[0, :, 0].T / 2.0).masked_fill(~visible, float("-inf")), -1)
    torch.testing.assert_close(o[0, :, 0], att @ v[0, :, 0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("normalizer", ["kernel", "plain"])
@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("scaled", [False, True])
@pytest.mark.parametrize("with_state", [False, True])
def test_one_token_step_equals_the_recurrent_step(normalizer, strict, scaled, with_state):
    """mode="chunk" at T = 1 (a decode step) runs a fused one-token update: equal to the recurrent reference in
    float64 (output, every state entry, gradients of inputs and state), and in float32 no further from float64
    than the reference itself."""
    g = torch.Generator().manual_seed(7)
    S, T0 = 6, 7
    q, k = torch.rand(B, T0 + 1, H, F, generator=g) + 0.1, torch.rand(B, T0 + 1, H, F, generator=g) + 0.1
    v = torch.randn(B, T0 + 1, H, D, generator=g)
    coef = torch.rand(B, T0 + 1, H, S, generator=g) + 0.1
    cn, xi = torch.rand(B, T0 + 1, H, generator=g), torch.rand(S, generator=g) + 0.05
    kls = 3 * torch.randn(B, T0 + 1, H, generator=g) if scaled else None
    kw = dict(eps0=1e-3, normalizer=normalizer, strict_causal=strict)

    def run(mode, dtype):
        c = lambda x: None if x is None else x.to(torch.float64).to(dtype)  # noqa: E731
        st = None
        if with_state:
            _, st = soe_retention(c(q[:, :T0]), c(k[:, :T0]), c(v[:, :T0]), c(coef[:, :T0]), c(xi), c(cn[:, :T0]),
                                  mode="recurrent", k_log_scale=None if kls is None else c(kls[:, :T0]), **kw)
            st = {kk: x.requires_grad_() if x.is_floating_point() else x for kk, x in st.items()}
        ins = [c(x[:, T0:]).requires_grad_() for x in (q, k, v, coef, cn)]
        o, s2 = soe_retention(*ins[:4], c(xi), ins[4], mode=mode, initial_state=st,
                              k_log_scale=None if kls is None else c(kls[:, T0:]), **kw)
        wrt = ins + ([x for x in st.values() if x.is_floating_point()] if st else [])
        loss = o.pow(2).sum() + sum(1.3 * x.sum() for x in s2.values())
        grads = torch.autograd.grad(loss, wrt, allow_unused=True)
        return [o, *(s2[kk] for kk in sorted(s2))] + [torch.zeros_like(w) if gr is None else gr
                                                       for w, gr in zip(wrt, grads)], sorted(s2)

    ref64, keys_r = run("recurrent", torch.float64)
    fast64, keys_f = run("chunk", torch.float64)
    assert keys_r == keys_f
    rel = lambda a, b: ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()  # noqa: E731
    for a, b in zip(fast64, ref64):
        assert rel(a, b) < 1e-10
    for a32, r32, b in zip(run("chunk", torch.float32)[0], run("recurrent", torch.float32)[0], ref64):
        assert rel(a32, b) <= 10 * rel(r32, b) + 1e-5  # gradients of a ratio: float32 rounding is amplified


@pytest.mark.parametrize("bmm_min", [0, 10**9])  # D by the bmm over columns / by the broadcast product
@pytest.mark.parametrize("scaled", [False, True])
def test_chunked_d_forms_equal_the_recurrence_with_gradients(monkeypatch, bmm_min, scaled):
    """Both ways of building the chunk's lag-weight matrix D, at the paper's 16 channels and 4 x 4 sequences x heads
    (the size where the bmm form is the default), give the recurrence's outputs, state and gradients, also when
    streamed from a state."""
    from seqmem.ops.vort import chunk as vchunk

    monkeypatch.setattr(vchunk, "D_BMM_MIN", bmm_min)
    g = torch.Generator().manual_seed(5)
    b, t, h, f, d = 4, 23, 4, 6, 3
    q = torch.rand(b, t, h, f, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.rand(b, t, h, f, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(b, t, h, d, generator=g, dtype=torch.float64, requires_grad=True)
    a = (0.1 + 0.9 * torch.rand(b, t, generator=g, dtype=torch.float64)).requires_grad_(True)
    beta = (3 * torch.randn(b, t, h, generator=g, dtype=torch.float64)) if scaled else None
    res = {}
    for mode in ("recurrent", "chunk"):
        c, xi, cn = soe_coefficients(a, 15, 500)
        assert xi.numel() * b * h >= 256
        o1, st = soe_retention(q[:, :9], k[:, :9], v[:, :9], c[:, :9], xi, cn[:, :9], mode=mode, chunk_size=4,
                               k_log_scale=None if beta is None else beta[:, :9])
        o2, st = soe_retention(q[:, 9:], k[:, 9:], v[:, 9:], c[:, 9:], xi, cn[:, 9:], mode=mode, chunk_size=4,
                               initial_state=st, k_log_scale=None if beta is None else beta[:, 9:])
        o = torch.cat([o1, o2], 1)
        res[mode] = (o, st, torch.autograd.grad(o.square().sum(), (q, k, v, a)))
    torch.testing.assert_close(res["chunk"][0], res["recurrent"][0], rtol=1e-10, atol=1e-12)
    for key in res["recurrent"][1]:
        torch.testing.assert_close(res["chunk"][1][key], res["recurrent"][1][key], rtol=1e-10, atol=1e-12)
    for gc, gr in zip(res["chunk"][2], res["recurrent"][2], strict=True):
        assert gr.abs().max() > 0
        torch.testing.assert_close(gc, gr, rtol=1e-9, atol=1e-12)


def _shared_case(dtype, scaled, t=300, seed=7):
    """One set of channel weights for every token (a fixed α, 16 channels) on a sequence longer than LAG_BLOCK."""
    g = torch.Generator().manual_seed(seed)
    b, h, f, d = 2, 2, 4, 3
    q = torch.rand(b, t, h, f, generator=g, dtype=dtype, requires_grad=True)
    k = torch.rand(b, t, h, f, generator=g, dtype=dtype, requires_grad=True)
    v = torch.randn(b, t, h, d, generator=g, dtype=dtype, requires_grad=True)
    a = torch.tensor(0.7, dtype=dtype, requires_grad=True)
    beta = (3 * torch.randn(b, t, h, generator=g, dtype=dtype)).requires_grad_(True) if scaled else None
    return q, k, v, a, beta


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("scaled", [False, True])
def test_lag_kernel_form_equals_the_recurrence_with_gradients(monkeypatch, strict, scaled):
    """Shared weights (coef (S',), coef_now 0-d) and no state wanted: the lag-kernel form gives the recurrence's
    outputs and gradients (of q, k, v, the key scales, α through c and c_now, and the rates ξ) in float64, and in
    float32 stays as close to the float64 recurrence as the float32 recurrence does."""
    from seqmem.ops.vort import chunk as vchunk

    ran = []
    real = vchunk._lag_form
    monkeypatch.setattr(vchunk, "_lag_form", lambda *a: ran.append(1) or real(*a))
    monkeypatch.setattr(vchunk, "LAG_FORM_RATIO", 1e9)  # take it at these small sizes

    def run(mode, dtype):
        q, k, v, a, beta = _shared_case(dtype, scaled)
        c, xi, cn = soe_coefficients(a, 15, 500)
        xi = xi.detach().requires_grad_(True)
        o, st = soe_retention(q, k, v, c, xi, cn, mode=mode, strict_causal=strict, k_log_scale=beta,
                              output_final_state=False)
        assert st is None
        wrt = [q, k, v, a, xi] + ([beta] if scaled else [])
        return o, torch.autograd.grad((o * torch.linspace(-1, 2, o.shape[-1], dtype=dtype)).sum(), wrt)

    ref64 = run("recurrent", torch.float64)
    assert not ran
    lag64 = run("chunk", torch.float64)
    assert ran
    torch.testing.assert_close(lag64[0], ref64[0], rtol=1e-10, atol=1e-12)
    for gl, gr in zip(lag64[1], ref64[1], strict=True):
        assert gr.abs().max() > 0
        torch.testing.assert_close(gl, gr, rtol=1e-9, atol=1e-11)
    lag32, rec32 = run("chunk", torch.float32), run("recurrent", torch.float32)

    def err(x, ref):
        return float((x.detach().double() - ref.detach()).abs().max() / ref.detach().abs().max())

    assert err(lag32[0], ref64[0]) <= 10 * err(rec32[0], ref64[0]) + 1e-6
    for gl, gr, g64 in zip(lag32[1], rec32[1], ref64[1], strict=True):
        assert err(gl, g64) <= 10 * err(gr, g64) + 1e-5


@pytest.mark.parametrize("strict", [False, True])
def test_chunked_form_with_shared_weights_equals_per_token_weights_with_gradients(monkeypatch, strict):
    """Shared weights (coef (S',), coef_now 0-d) in the chunked form (one lag-weight matrix for all chunks,
    sequences and heads) give the per-token chunked form's outputs, carried state and gradients (q, k, v, key
    scales, α through c and c_now, the rates ξ) — against both of its lag-weight paths (bmm and broadcast) and the
    recurrence, in float64; in float32 they stay as close to float64 as the per-token chunked form does."""
    from seqmem.ops.vort import chunk as vchunk

    monkeypatch.setattr(vchunk, "LAG_FORM_RATIO", 0.0)  # never the lag form: the chunked form is under test

    def run(shared, dtype=torch.float64, mode="chunk", bmm_min=vchunk.D_BMM_MIN):
        monkeypatch.setattr(vchunk, "D_BMM_MIN", bmm_min)
        q, k, v, a, beta = _shared_case(dtype, True, t=70)
        c, xi, cn = soe_coefficients(a, 5, 500)
        xi = xi.detach().to(dtype).requires_grad_(True)
        b, t = q.shape[:2]
        o, st = [], None
        for lo, hi in ((0, 50), (50, t)):  # streamed: the second piece starts from the first one's state
            cc, cnn = (c, cn) if shared else (c.expand(b, hi - lo, c.shape[0]), cn.expand(b, hi - lo))
            oi, st = soe_retention(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], cc, xi, cnn, mode=mode, chunk_size=16,
                                   strict_causal=strict, k_log_scale=beta[:, lo:hi], initial_state=st)
            o.append(oi)
        o = torch.cat(o, 1)
        loss = (o * torch.linspace(-1, 2, o.shape[-1], dtype=dtype)).sum() + sum(x.sum() for x in st.values())
        return [o, *st.values(), *torch.autograd.grad(loss, [q, k, v, a, xi, beta])]

    def err(x, ref):
        return float((x.detach().double() - ref.detach()).abs().max() / ref.detach().abs().max())

    new = run(True)
    for ref in (run(False, bmm_min=1), run(False, bmm_min=10**9), run(False, mode="recurrent")):
        for x, r in zip(new, ref, strict=True):
            assert r.abs().max() > 0 and err(x, r) <= 1e-12
    new32, tok32 = run(True, torch.float32), run(False, torch.float32)
    for x, t32, r in zip(new32, tok32, new, strict=True):
        assert err(x, r) <= 10 * err(t32, r) + 1e-6


def test_shared_weights_are_the_per_token_weights_and_the_lag_form_is_chosen_by_cost(monkeypatch):
    """coef (S',) / coef_now 0-d mean the same weights at every token in every form (with the state, streamed);
    the lag-kernel form runs only without a returned or initial state, with the kernel normaliser, in chunk mode, and
    where lag_form_applies; a per-token coef_now with shared coef is refused."""
    from seqmem.ops.vort import chunk as vchunk

    ran = []
    real = vchunk._lag_form
    monkeypatch.setattr(vchunk, "_lag_form", lambda *a: ran.append(1) or real(*a))
    q, k, v, a, beta = _shared_case(torch.float64, True, t=40)
    c, xi, cn = soe_coefficients(a.detach(), 15, 500)
    b, t, h = q.shape[:3]
    for mode in ("recurrent", "chunk", "parallel"):
        for normalizer in ("kernel", "plain"):
            kw = dict(mode=mode, normalizer=normalizer, k_log_scale=beta, chunk_size=16)
            o_tok, st_tok = soe_retention(q, k, v, c.expand(b, t, 16), xi, cn.expand(b, t), **kw)
            o, st = soe_retention(q, k, v, c, xi, cn, **kw)
            torch.testing.assert_close(o, o_tok, rtol=1e-12, atol=1e-14)
            for key in st_tok:
                torch.testing.assert_close(st[key], st_tok[key], rtol=1e-12, atol=1e-14)
            o2, _ = soe_retention(q[:, 20:], k[:, 20:], v[:, 20:], c, xi, cn, initial_state=st,
                                  output_final_state=False, **{**kw, "k_log_scale": beta[:, 20:]})
            assert o2.shape == (b, 20, h, v.shape[-1])
    assert not ran  # the state was wanted, or given
    assert vchunk.lag_form_applies(500, 16, 64, 32) and not vchunk.lag_form_applies(500, 1, 64, 32)
    monkeypatch.setattr(vchunk, "LAG_FORM_RATIO", 0.0)
    soe_retention(q, k, v, c, xi, cn, k_log_scale=beta, output_final_state=False)
    assert not ran  # not the cheaper form here
    monkeypatch.setattr(vchunk, "LAG_FORM_RATIO", 1e9)
    soe_retention(q, k, v, c, xi, cn, k_log_scale=beta, output_final_state=False, normalizer="plain")
    soe_retention(q, k, v, c, xi, cn, k_log_scale=beta, output_final_state=False, mode="parallel")
    assert not ran
    soe_retention(q, k, v, c, xi, None, k_log_scale=beta, output_final_state=False)
    assert ran
    with pytest.raises(ValueError, match="0-d"):
        soe_retention(q, k, v, c, xi, cn.expand(b, t))
    with pytest.raises(ValueError, match="output_final_state"):
        soe_retention(q, k, v, c, xi, cn, output_final_state=None)
