"""The ``ska`` mixer's one-operator mode ``operator_scope="sequence"`` (Echo App. F eq. 53; eqs. 4-6 without a mask):
one operator per sequence from the action-masked tokens, read at every position.  Not in the contract configs (it is
non-causal), so tested here: reference == fast, == the ops ``ska_statistics`` + ``ska_readout`` directly, == the
chunk-causal operator committed right after the last fact, mask None == all ones, what a masked-out token can and
cannot change, gradients at T = 64 (where chunk-causal chunk 64 gives none), refusals (bad masks, streaming, packed
sequences, decoding) and no target leakage through the Echo tasks' oracle masks; and its §3.5 decoding
(``prefix_decode=True``): reference == fast, a split continuation == one call, each decoded token == the one operator
of the sequence up to it, read at it, and ``generate``."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_rel_close
from seqmem import build_mixer, count_state
from seqmem.ops import ska_readout, ska_statistics, spectral_koopman_attention

f64 = torch.float64
D, H, R, T = 16, 2, 4, 37


def make(impl: str = "fast", **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    m = build_mixer("ska", D, **{"n_heads": H, "rank": R, "operator_scope": "sequence", "impl": impl,
                                 "gamma_init": 1.2, **kw}).double()
    with torch.no_grad():
        m.w_o.weight.normal_(0, 0.3)  # the paper's zero-init would make every output 0
    return m


def x_(T: int = T, B: int = 2, seed: int = 1) -> torch.Tensor:
    return torch.randn(B, T, D, dtype=f64, generator=torch.Generator().manual_seed(seed))


def amask(T: int = T, B: int = 2, seed: int = 3) -> torch.Tensor:
    m = torch.rand(B, T, generator=torch.Generator().manual_seed(seed)) < 0.4
    m[:, 2:6] = True
    m[:, 30:] = False  # the last fact at 29 or before: the keys after it do not enter prefix_max's norm
    return m


def projections(m, x):
    B, T_, _ = x.shape
    return (m.w_q(x).view(B, T_, H, R), m.w_k(x).view(B, T_, H, R), m.w_v(x).view(B, T_, H, m.head_dim))


@pytest.mark.parametrize("dtype", [f64, torch.float32])
@pytest.mark.parametrize("norm", ["prefix_max", "seqmax", "none"])
@pytest.mark.parametrize("masked", [True, False])
def test_reference_equals_fast(dtype, norm, masked):
    """impl="reference" (token loop, App. F steps) == impl="fast" (ska_statistics + ska_readout): outputs, every
    parameter's gradient and the returned statistics, float64 and float32."""
    x, mask = x_().to(dtype), (amask() if masked else None)
    tol = 1e-10 if dtype == f64 else 2e-4
    res = {}
    for impl in ("reference", "fast"):
        m = make(impl, norm=norm).to(dtype)
        y, st = m(x, action_mask=mask)
        grads = torch.autograd.grad(y.square().sum(), list(m.parameters()))
        res[impl] = (y, grads, st)
    assert_rel_close(res["fast"][0], res["reference"][0], tol, "output")
    for a, b in zip(res["fast"][1], res["reference"][1], strict=True):
        assert_rel_close(a, b, tol * 10, "gradient")
    for k in ("G", "M", "Cv", "z_prev", "m"):
        assert_rel_close(res["fast"][2][k], res["reference"][2][k], tol, k)
    assert res["fast"][0].abs().min() > 0  # every position reads the operator


def test_equals_the_ops_directly():
    """Keys and queries divided by the largest key norm up to the last fact (every key, masked-out ones included:
    App. F step 2), then eq. (53)'s ska_statistics and ska_readout of every query, times η, through W_o."""
    m, x, mask = make(), x_(), amask()
    y, st = m(x, action_mask=mask)
    q, k, v = projections(m, x)
    last = [int(mask[b].nonzero().max()) for b in range(2)]
    norm = torch.stack([k[b, : last[b] + 1].norm(dim=-1).amax(0) for b in range(2)])[:, None, :, None]
    Gt, M, Cv = ska_statistics(k / norm, v, mask, eps=m.eps)
    o = ska_readout(Gt, M, Cv, (q / norm).permute(0, 2, 3, 1), power=m.power, gamma=m.gamma)
    want = m.w_o(m.eta * o.permute(0, 3, 1, 2).reshape(2, T, D))
    assert_rel_close(y, want, 1e-12, "ska_statistics + ska_readout")
    assert_rel_close(st["G"] + m.eps * torch.eye(R, dtype=f64), Gt, 1e-12, "state G")
    assert_rel_close(st["Cv"], Cv, 1e-12, "state Cv")
    assert_rel_close(st["m"], norm[:, 0, :, 0], 1e-12, "state m")


def test_equals_the_chunk_causal_operator_after_the_last_fact():
    """With every row's last fact at position 11, the one operator is the chunk-causal masked operator of chunk 1 at
    chunk size 12 (spectral_koopman_attention, prefix_max): same statistics, same key norm."""
    m, x = make(), x_()
    mask = amask()
    mask[:, 12:] = False
    mask[:, 11] = True
    y, _ = m(x, action_mask=mask)
    q, k, v = projections(m, x)
    o, _ = spectral_koopman_attention(q, k, v, chunk_size=12, power=m.power, eps=m.eps, gamma=m.gamma,
                                      mask=mask)
    want = m.w_o(m.eta * o.reshape(2, T, D))
    assert_rel_close(y[:, 12:24], want[:, 12:24], 1e-12, "chunk 1 of the chunk-causal form")
    assert want[:, :12].abs().max() == 0 and y[:, :12].abs().min() > 0  # chunk 0 reads nothing; here it reads all


def test_mask_none_equals_all_ones_and_prefix_max_equals_seqmax_without_a_mask():
    m, x = make(), x_()
    y, st = m(x)
    y1, st1 = m(x, action_mask=torch.ones(2, T, dtype=torch.long))
    assert torch.equal(y1, y) and all(torch.equal(st1[k], st[k]) for k in st)
    assert_rel_close(make(norm="seqmax")(x)[0], y, 1e-14, "prefix_max == seqmax over every token")
    assert count_state(st) == m.state_size(T) == m.state_size(5000) == H * (2 * R * R + (D // H) * R + R + 1) + 1
    assert set(st) == m.state_keys() == {"G", "M", "Cv", "z_prev", "m", "pos"}


def test_what_a_masked_out_token_changes():
    """A token with m_t = 0 does not enter G, M, C_v but still queries: its value changes nothing anywhere; its key
    changes nothing while the key norm's maximum stays (after the last fact: whatever it is, with prefix_max; with
    seqmax, App. F step 2 over the whole sequence, a large one there changes every output); its query changes its
    own output only.  A fact (m_t = 1) changes every position's output, earlier ones too: the mode is not causal."""
    m, x, mask = make(), x_(), amask()
    y, _ = m(x, action_mask=mask)
    _, k, _ = projections(m, x)
    norms = k.norm(dim=-1)  # (B, T, H)
    argmax = set(norms[:, :30].argmax(1).flatten().tolist())
    t_out = next(t for t in range(30) if not mask[:, t].any() and t not in argmax)  # out in both rows, not the max
    for t, scale in ((t_out, 0.5), (33, 50.0)):  # 33: after every row's last fact
        for which in ("k", "v"):
            out = _with_token_projection(m, x, t, which, scale, mask)
            assert_rel_close(out, y, 1e-12, f"masked-out token {t}, its {which}")
    out = _with_token_projection(m, x, t_out, "q", 3.0, mask)
    others = [s for s in range(T) if s != t_out]
    assert_rel_close(out[:, others], y[:, others], 1e-12, "its query")
    assert (out[:, t_out] - y[:, t_out]).abs().max() > 1e-6
    # the key norm covers masked-out keys before the last fact: a large one changes every output
    big = _with_token_projection(m, x, t_out, "k", 50.0, mask)
    assert (big - y).abs().amax(-1).min() > 0
    # seqmax reads the keys after the last fact too
    ms = make(norm="seqmax")
    ys, _ = ms(x, action_mask=mask)
    assert (_with_token_projection(ms, x, 33, "k", 50.0, mask) - ys).abs().amax(-1).min() > 0
    assert_rel_close(_with_token_projection(ms, x, 33, "v", 50.0, mask), ys, 1e-12, "seqmax, a value after")
    # a fact changes every position, those before it included (non-causal)
    t_in = int(mask[0].nonzero().max())
    x2 = x.clone()
    x2[:, t_in] += 1.0
    y2, _ = m(x2, action_mask=mask)
    assert (y2[:, :t_in] - y[:, :t_in]).abs().max() > 1e-6


def _with_token_projection(m, x, t, which, scale, mask):
    """The mixer's output when token ``t``'s key, value or query (``which``: "k", "v", "q") alone is multiplied by
    ``scale``: the fast path on the projections with that one changed."""
    from seqmem.ops.ska.chunk import ska_sequence_operator

    q, k, v = (p.clone() for p in projections(m, x))
    target = {"q": q, "k": k, "v": v}[which]
    target[:, t] = target[:, t] * scale
    o, _ = ska_sequence_operator(q, k, v, mask, m.eps, m.norm, dict(power=m.power, gamma=m.gamma, eta=1.0,
                                                             spec_iters=m.spec_iters, operator_form=m.operator_form))
    return m.w_o(m.eta * o.reshape(x.shape[0], x.shape[1], D))


def test_fast_helper_is_what_the_mixer_runs():
    m, x, mask = make(), x_(), amask()
    q, k, v = projections(m, x)
    from seqmem.ops.ska.chunk import ska_sequence_operator

    o, _ = ska_sequence_operator(q, k, v, mask, m.eps, m.norm, dict(power=m.power, gamma=m.gamma, eta=1.0,
                                                             spec_iters=m.spec_iters, operator_form=m.operator_form))
    assert torch.equal(m.w_o(m.eta * o.reshape(2, T, D)), m(x, action_mask=mask)[0])


def test_a_row_without_facts_reads_nothing():
    m, x = make(), x_()
    mask = amask()
    mask[1] = False
    y, _ = m(x, action_mask=mask)
    assert y[1].abs().max() == 0 and y[0].abs().min() > 0


def test_gradients_reach_ska_at_the_training_length():
    """Echo's protocol: T = 64 with the oracle mask.  Chunk-causal chunk 64 gives SKA no gradient (chunk 0 reads
    nothing); the one-operator mode gives W_o (zero-initialised) a gradient in every SKA layer, and after one step
    every SKA weight."""
    from seqmem.models import LanguageModel
    from seqmem.repro.echo import submillion_config
    from seqmem.tasks.echo_tasks import EchoMixture
    from seqmem.train.loop import scored_loss

    x, y, am = EchoMixture(seq_len=64, action_mask=True).sample(4, torch.Generator().manual_seed(0))
    for scope in ("sequence", "chunk_causal"):
        torch.manual_seed(0)
        model = LanguageModel(submillion_config("ssm_ska", d=32, heads=2, rank=8, d_state=8, chunk_size=64,
                                                operator_scope=scope))
        scored_loss(model, x, y, True, action_mask=am)[0].backward()
        ska = [blk.mixer for blk in model.blocks if blk.mixer.takes_action_mask]
        assert len(ska) == 2 and all(s.operator_scope == scope for s in ska)
        g = [float(s.w_o.weight.grad.abs().max()) for s in ska]
        assert all(v > 0 for v in g) if scope == "sequence" else all(v == 0 for v in g)
    torch.manual_seed(0)
    model = LanguageModel(submillion_config("ssm_ska", d=32, heads=2, rank=8, d_state=8, operator_scope="sequence"))
    with torch.no_grad():
        for blk in model.blocks:
            if blk.mixer.takes_action_mask:
                blk.mixer.w_o.weight.normal_(0, 0.1)
    scored_loss(model, x, y, True, action_mask=am)[0].backward()
    for blk in model.blocks:
        if blk.mixer.takes_action_mask:
            for name in ("w_k", "w_q", "w_v", "w_o"):
                assert getattr(blk.mixer, name).weight.grad.abs().max() > 0, name


def test_refusals():
    m, x, mask = make(), x_(), amask()
    with pytest.raises(ValueError, match="operator_scope"):
        build_mixer("ska", D, n_heads=H, operator_scope="prefix")
    with pytest.raises(ValueError, match="operator_scope"):
        build_mixer("ska", D, n_heads=H, operator_scope=1)
    with pytest.raises(ValueError, match="shape"):
        m(x, action_mask=mask[:, :-1])
    with pytest.raises(ValueError, match="only 0 and 1"):
        m(x, action_mask=mask.long() * 2)
    _, st = m(x[:, :20], action_mask=mask[:, :20])
    for piece in (x[:, 20:], x[:, 20:21]):  # streaming, and a decode step
        with pytest.raises(ValueError, match="non-causal.*cannot continue from a state"):
            m(piece, st, action_mask=mask[:, 20 : 20 + piece.shape[1]])
        with pytest.raises(ValueError, match="non-causal"):
            m(piece, st)
    with pytest.raises(ValueError, match="cu_seqlens"):
        m(x[:1], cu_seqlens=torch.tensor([0, 20, T]))
    # a refused call leaves nothing behind
    assert torch.equal(m(x, action_mask=mask)[0], make()(x, action_mask=mask)[0])
    # a one-token call with no state is a sequence of one token (both impls agree), not a decode step
    assert_rel_close(m(x[:, :1])[0], make("reference")(x[:, :1])[0], 1e-12, "T = 1")


def test_language_model_refuses_to_decode_and_recomputes_without_state():
    from seqmem.models import LanguageModel, LMConfig

    cfg = LMConfig(vocab_size=40, d_model=16, n_layers=2, n_heads=2, mixer=["mamba2", "ska"],
                   mixer_options=[{"d_state": 4}, {"rank": 4, "operator_scope": "sequence"}])
    torch.manual_seed(0)
    model = LanguageModel(cfg)
    ids = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="non-causal"):
        model.generate(ids, 3)
    out = model.generate(ids, 3, use_state=False)
    assert out.shape == (2, 12)


@pytest.mark.parametrize("task_name", ["niah", "sysprompt", "tooltrace", "mqar", "multihop", "commonword"])
def test_no_target_leak_through_the_echo_oracle_mask(task_name):
    """A Mamba-2 + sequence-mode SKA model fed an Echo task's oracle mask: the logits at and before each row's first
    scored position do not change when every later token (the teacher-forced answers included) changes, since
    every fact precedes it and prefix_max's key norm stops at the last fact."""
    from seqmem.models import LanguageModel, LMConfig
    from seqmem.tasks.echo_tasks import (
        EchoCommonWord,
        EchoMQAR,
        EchoMultiHop,
        EchoNIAH,
        EchoSysPrompt,
        EchoToolTrace,
    )

    task = {"niah": EchoNIAH(seq_len=40, n_kv=2, action_mask=True),
            "sysprompt": EchoSysPrompt(seq_len=40, n_vars=3, decoys=1, action_mask=True),
            "tooltrace": EchoToolTrace(seq_len=48, n_calls=5, action_mask=True),
            "mqar": EchoMQAR(num_pairs=3, gap=10, action_mask=True),
            "multihop": EchoMultiHop(seq_len=40, n_kv=3, action_mask=True),
            "commonword": EchoCommonWord(seq_len=40, list_len=4, action_mask=True)}[task_name]
    x, y, am = task.sample(3, torch.Generator().manual_seed(2))
    cfg = LMConfig(vocab_size=128, d_model=16, n_layers=3, n_heads=2, mixer=["mamba2", "ska", "ska"],
                   mixer_options=[{"d_state": 4}] + [{"rank": 4, "operator_scope": "sequence"}] * 2)
    torch.manual_seed(0)
    model = LanguageModel(cfg).double()
    with torch.no_grad():
        for blk in model.blocks:
            if blk.mixer.takes_action_mask:
                blk.mixer.w_o.weight.normal_(0, 0.3)
    logits, _ = model(x, action_mask=am)
    x2, first = x.clone(), [int((y[b] != -100).nonzero()[0]) for b in range(3)]
    for b, p in enumerate(first):
        x2[b, p + 1 :] = torch.randint(8, 128, (x.shape[1] - p - 1,), generator=torch.Generator().manual_seed(b))
    logits2, _ = model(x2, action_mask=am)
    for b, p in enumerate(first):
        assert_rel_close(logits2[b, : p + 1], logits[b, : p + 1], 1e-12, f"row {b} up to {p}")
    assert (logits2 - logits).abs().max() > 0 or task_name in ("niah", "tooltrace", "multihop", "commonword")


# ---------------------------------------------------------------------------------------------------------------
# §3.5: the prefix mode continued (prefix_decode=True)
@pytest.mark.parametrize("dtype", [f64, torch.float32])
@pytest.mark.parametrize("norm", ["prefix_max", "none"])
@pytest.mark.parametrize("masked", [True, False])
def test_prefix_decode_reference_equals_fast_and_splits_exactly(dtype, norm, masked):
    """The continuation of a prefix: impl="reference" (a token loop, App. F steps) == impl="fast" (prefix sums, one
    batched readout): outputs, every gradient, the state; float64 and float32.  A continuation split into calls
    (5 tokens, then 1 — a decode step —, then the rest) equals one call."""
    x, mask = x_().to(dtype), (amask() if masked else None)
    tol = 1e-10 if dtype == f64 else 2e-4
    res = {}
    for impl in ("reference", "fast"):
        m = make(impl, norm=norm, prefix_decode=True).to(dtype)
        _, st = m(x[:, :20], action_mask=None if mask is None else mask[:, :20])
        y, st2 = m(x[:, 20:], st, action_mask=None if mask is None else mask[:, 20:])
        grads = torch.autograd.grad(y.square().sum(), list(m.parameters()))
        res[impl] = (y, grads, st2)
        pieces, s_ = [], st
        for a, b in ((20, 25), (25, 26), (26, T)):
            yp, s_ = m(x[:, a:b], s_, action_mask=None if mask is None else mask[:, a:b])
            pieces.append(yp)
        assert_rel_close(torch.cat(pieces, 1), y, tol, f"{impl}: split continuation")
        for k in st2:
            assert torch.equal(s_[k], st2[k]) if k == "pos" else bool(((s_[k] - st2[k]).abs() <= tol * (
                1 + st2[k].abs().max())).all()), k
    assert_rel_close(res["fast"][0], res["reference"][0], tol, "output")
    for a, b in zip(res["fast"][1], res["reference"][1], strict=True):
        assert_rel_close(a, b, tol * 10, "gradient")
    for k in ("G", "M", "Cv", "z_prev", "m"):
        assert_rel_close(res["fast"][2][k], res["reference"][2][k], tol, k)
    assert int(res["fast"][2]["pos"][0]) == T


@pytest.mark.parametrize("masked", [True, False])
def test_prefix_decode_reads_the_operator_that_includes_the_token(masked):
    """§3.5, eqs. 4-6 continued: decoded token t reads the one operator of tokens 0..t, i.e. the sequence-mode
    output of x[:, :t+1] at its last position (with the key norm fixed: norm="none"); with a mask, a masked-out
    decoded token still reads, and adds nothing."""
    m, x = make(norm="none", prefix_decode=True), x_()
    mask = amask() if masked else torch.ones(2, T, dtype=torch.bool)
    mask[:, 24] = False
    _, st = m(x[:, :20], action_mask=mask[:, :20])
    y, _ = m(x[:, 20:], st, action_mask=mask[:, 20:])
    for t in range(20, T):
        whole, _ = make(norm="none")(x[:, : t + 1], action_mask=mask[:, : t + 1])  # the same weights
        assert_rel_close(y[:, t - 20], whole[:, -1], 1e-11, f"token {t}")


def test_prefix_decode_keeps_the_prefix_norm():
    """prefix_max: the decoded keys are divided by the prefix's key norm, frozen (a larger key does not change it)."""
    m, x = make(prefix_decode=True), x_()
    _, st = m(x[:, :20])
    big = x[:, 20:].clone() * 50
    _, st2 = m(big, st)
    assert torch.equal(st2["m"], st["m"])
    assert torch.equal(st2["pos"], st["pos"] + T - 20)


def test_prefix_decode_options_and_refusals():
    with pytest.raises(ValueError, match="operator_scope='sequence'"):
        build_mixer("ska", D, n_heads=H, prefix_decode=True)
    with pytest.raises(ValueError, match="prefix_decode"):
        build_mixer("ska", D, n_heads=H, operator_scope="sequence", prefix_decode=1)
    m, x = make(prefix_decode=True), x_()
    assert "prefix_decode=True" in repr(m)
    _, st = m(x[:, :20])
    with pytest.raises(ValueError, match="cu_seqlens"):
        m(x[:1], cu_seqlens=torch.tensor([0, 20, T]))
    with pytest.raises(ValueError, match="state has keys"):  # a chunk-causal state is not a prefix's
        m(x[:, 20:], build_mixer("ska", D, n_heads=H, rank=R).double()(x[:, :20])[1])
    # without prefix_decode the refusal names the way
    with pytest.raises(ValueError, match="prefix_decode=True"):
        make()(x[:, 20:], st)


def test_generate_decodes_the_prefix_mode():
    """A Mamba-2 + SKA(sequence, prefix_decode, norm none) model: generate with the state (one step per token, the
    prompt's operator extended by each token) == generate recomputing the whole sequence each step (one SKA layer:
    the last position of the one operator over the sequence is the decoded token's reading)."""
    from seqmem.models import LanguageModel, LMConfig

    cfg = LMConfig(vocab_size=40, d_model=16, n_layers=2, n_heads=2, mixer=["mamba2", "ska"],
                   mixer_options=[{"d_state": 4}, {"rank": 4, "operator_scope": "sequence", "prefix_decode": True,
                                                   "norm": "none"}])
    torch.manual_seed(0)
    model = LanguageModel(cfg).double()
    with torch.no_grad():
        model.blocks[1].mixer.w_o.weight.normal_(0, 0.3)
    ids = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(0))
    a = model.generate(ids, 6)
    b = model.generate(ids, 6, use_state=False)
    assert a.shape == (2, 15) and torch.equal(a, b)


def test_the_unused_chunk_size_is_not_part_of_the_layer_identity():
    """The one-operator mode reads no chunk_size: layers that differ only there have one identity (a sweep's --reuse
    takes one's run for the other); in the chunk-causal mode chunk_size is the layer's."""
    from seqmem.registry import layer_identity

    seq = {"operator_scope": "sequence", "rank": 4}
    assert layer_identity("ska", {**seq, "chunk_size": 16}) == layer_identity("ska", seq)
    assert layer_identity("ska", {"chunk_size": 16}) != layer_identity("ska", {})
    assert layer_identity("ska", {**seq, "power": 1}) != layer_identity("ska", seq)
