"""Elastic Memory mixer and baselines (Elastic Memory paper): the mechanism's claims; memory == HiPPO ops."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_rel_close
from seqmem import build_mixer, count_state
from seqmem.mixers.elastic import memory_layer_stack
from seqmem.ops.hippo import hippo_compress, hippo_reconstruct

D, H, L = 16, 2, 8
F64 = torch.float64


def make(name, impl="fast", seed=0, **opts):
    torch.manual_seed(seed)
    opts.setdefault("block_len", L)
    m = build_mixer(name, D, n_heads=H, impl=impl, **opts).to(F64)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=F64))
    return m


def x_(b=2, t=40, seed=3):
    return torch.randn(b, t, D, generator=torch.Generator().manual_seed(seed), dtype=F64)


def test_zero_added_parameters():
    """T10: Elastic Memory adds no trainable parameters (Tables 1–3)."""
    e, t = make("elastic", hippo_n=12), make("block_attention")
    assert [n for n, _ in e.named_parameters()] == [n for n, _ in t.named_parameters()]
    assert sum(p.numel() for p in e.parameters()) == sum(p.numel() for p in t.parameters())
    mt, inf, mel = make("memorizing", n_queue=8), make("infini"), make("melodi", n_summary=3)
    base = sum(p.numel() for p in t.parameters())
    assert sum(p.numel() for p in mt.parameters()) - base == H  # one gate per head
    assert sum(p.numel() for p in inf.parameters()) - base == H
    assert sum(p.numel() for p in mel.parameters()) - base == 3 * D + 3  # N_sum x d_v x H (+ mix logits)


def test_block0_equals_transformerpp_and_memory_is_used():
    """T14: block 0 is Transformer++ with the same weights; T11: later blocks see earlier ones via memory."""
    e = make("elastic", hippo_n=12)
    t = make("block_attention")
    t.load_state_dict(e.state_dict())
    x = x_()
    ye, yt = e(x)[0], t(x)[0]
    assert_rel_close(ye[:, :L], yt[:, :L], 1e-12, "block 0")
    assert (ye[:, L:] - yt[:, L:]).abs().max() > 1e-4
    cases = [
        ("elastic", {"hippo_n": 12}),
        ("memorizing", {"n_queue": 3 * L}),
        ("infini", {}),
        ("melodi", {"n_summary": 3}),
    ]
    for name, opts in cases:
        m = make(name, **opts)
        xx = x[:1].clone().requires_grad_(True)
        m(xx)[0][:, 3 * L :].sum().backward()
        assert xx.grad[:, :L].abs().max() > 1e-6, f"{name}: no gradient path from block 3 to block 0"
    m = make("memorizing", n_queue=L)  # the FIFO holds one block: block 3 sees block 2 but not block 0
    xx = x[:1].clone().requires_grad_(True)
    m(xx)[0][:, 3 * L :].sum().backward()
    assert xx.grad[:, :L].abs().max() == 0 and xx.grad[:, 2 * L : 3 * L].abs().max() > 1e-6
    xx = x[:1].clone().requires_grad_(True)
    t(xx)[0][:, 3 * L :].sum().backward()
    assert xx.grad[:, : 3 * L].abs().max() == 0  # Transformer++ is block-local


def test_memory_state_is_hippo_compression_of_raw_kv():
    """The state after whole blocks is the LegS projection of raw (pre-RoPE) K and V (Eq. 6 == CF5)."""
    N = 10
    e = make("elastic", hippo_n=N)
    x = x_(t=3 * L + 5)
    _, st = e(x)
    _, k, v = e.qkv(x).chunk(3, -1)
    direct = hippo_compress(torch.cat([k, v], -1)[:, : 3 * L], N, mode="direct")
    assert_rel_close(st["mem"], direct, 1e-12, "memory == compress(raw K, V)")
    assert st["k"].shape == (2, 5, D) and int(st["pos"][0]) == 3 * L + 5
    # the memory tokens of block 3 are the reconstruction at the sample points (Eq. 8)
    ctx = e._mem_context(st, 3)
    rec = hippo_reconstruct(st["mem"], 3.0 * L, "exponential", N)
    assert_rel_close(ctx["k"].reshape(2, N, D), rec[..., :D], 1e-12, "K_mem = R C")


def test_trapezoidal_attention_by_hand():
    """One block-1 query, written out from Eqs. 9–10 (joint softmax over [K_mem; causal block keys])."""
    N = 6
    e = make("elastic", hippo_n=N, mem_tokens=4, sampling="uniform")
    x = x_(b=1, t=L + 3)
    y, _ = e(x)
    q, k, v = e.qkv(x).view(1, L + 3, 3, H, D // H).unbind(2)
    from seqmem.mixers.elastic import _apply_rope

    pos = torch.arange(L + 3) % L
    qr, kr = _apply_rope(q, pos), _apply_rope(k, pos)
    kv = torch.cat([k.reshape(1, L + 3, D), v.reshape(1, L + 3, D)], -1)
    C = hippo_compress(kv[:, :L], N, mode="direct")
    mem = hippo_reconstruct(C, float(L), "uniform", 4)[0]  # (4, 2D)
    km, vm = mem[:, :D].view(4, H, D // H), mem[:, D:].view(4, H, D // H)
    i = L + 2  # third token of block 1
    outs = []
    for hh in range(H):
        keys = torch.cat([km[:, hh], kr[0, L : i + 1, hh]])
        vals = torch.cat([vm[:, hh], v[0, L : i + 1, hh]])
        p = torch.softmax(keys @ qr[0, i, hh] / (D // H) ** 0.5, 0)
        outs.append(p @ vals)
    expect = e.out(torch.cat(outs))
    assert_rel_close(y[0, i], expect, 1e-12, "trapezoidal attention")


def test_sampling_switch_changes_only_outputs():
    """T12: test-time inductive-bias injection — same parameters and state, different retrieval."""
    e = make("elastic", hippo_n=12)
    x = x_()
    y1, s1 = e(x)
    e.set_sampling("uniform")
    y2, s2 = e(x)
    for k in s1:
        assert torch.equal(s1[k], s2[k])
    assert_rel_close(y2[:, :L], y1[:, :L], 1e-13, "block 0 has no memory")
    assert (y2[:, L:] - y1[:, L:]).abs().max() > 1e-6
    u = make("elastic_uni", hippo_n=12)
    assert_rel_close(u(x)[0], y2, 1e-13, "elastic_uni == elastic after set_sampling('uniform')")
    with pytest.raises(ValueError):
        e.set_sampling("random")


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_set_sampling_while_decoding_takes_effect_at_once(mode):
    """A switch of the sample points (Section 3.5) mid-block changes the very next decoding step: the memory tokens
    cached for the block (same memory tensor) were built from the former points and must not be reused."""
    import copy

    e = make("elastic", hippo_n=6)
    x = x_(t=20)
    with mode():
        _, s = e(x[:, :17])  # inside block 2: the memory is not empty
        _, s2 = e(x[:, 17:18], s)  # a decoding step caches this block's memory tokens
        e.set_sampling("uniform", eps=0.05)
        y, _ = e(x[:, 18:19], s2)  # same memory tensor, same block
        fresh = copy.deepcopy(e)
        fresh._ctx_cache = None
        y_ref, _ = fresh(x[:, 18:19], {k: v.clone() for k, v in s2.items()})
    assert_rel_close(y, y_ref, 1e-13, "decoding step after set_sampling")


def test_memorizing_fifo_is_bounded_and_holds_last_tokens():
    m = make("memorizing", n_queue=12)
    x = x_(t=5 * L + 3)
    _, st = m(x)
    _, k, _ = m.qkv(x).chunk(3, -1)
    assert torch.equal(st["mem_k"], k[:, 5 * L - 12 : 5 * L])
    assert m.state_size(10 * L) == m.state_size(2 * L) == count_state(st) - 2 * D * 3


def test_infini_linear_memory_is_sum_of_outer_products():
    m = make("infini", update="linear")
    x = x_(t=2 * L)
    _, st = m(x)
    _, k, v = m.qkv(x).view(2, 2 * L, 3, H, D // H).unbind(2)
    sk = torch.nn.functional.elu(k) + 1
    assert_rel_close(st["mem_M"], torch.einsum("blhk,blhv->bhkv", sk, v), 1e-12, "M = sum sigma(k)^T v")
    assert_rel_close(st["mem_z"], sk.sum(1), 1e-12, "z = sum sigma(k)")


def test_state_size_independent_of_context():
    for name, opts in [("elastic", {"hippo_n": 12}), ("infini", {}), ("melodi", {"n_summary": 3})]:
        m = make(name, **opts)
        assert m.state_size(L * 100) == m.state_size(L)


def test_bad_options_raise():
    for name, opts in [
        ("elastic", {"hippo_n": 0}),
        ("elastic", {"mem_tokens": -1}),
        ("elastic", {"sampling": "gauss"}),
        ("elastic", {"alpha": 1.5}),
        ("elastic", {"eps": 0.0}),
        ("block_attention", {"block_len": 0}),
        ("memorizing", {"n_queue": 0}),
        ("infini", {"update": "hebb"}),
        ("melodi", {"n_summary": 0}),
    ]:
        with pytest.raises(ValueError):
            build_mixer(name, D, n_heads=H, **opts)
    with pytest.raises(ValueError):
        build_mixer("elastic", 18, n_heads=2)  # odd head dim: no RoPE


MEMORY_MIXERS = ["elastic", "memorizing", "infini", "melodi"]


@pytest.mark.parametrize("name", MEMORY_MIXERS)
def test_block_options_pass_through_keyword_only(name):
    """The memory mixers declare only their own options; BlockAttention's pass through ``**block_options``,
    keyword-only: a positional second argument is refused (it would once have been ``n_heads``), and the forwarded
    options are listed, checked and reported under the mixer's own name as before."""
    import seqmem

    entry = seqmem.get_entry(name)
    cls = entry.cls
    with pytest.raises(TypeError):
        cls(D, H)
    m = cls(D, n_heads=H, block_len=5, rope_base=500.0, impl="reference")
    assert (m.n_heads, m.block_len, m.rope_base, m.impl) == (H, 5, 500.0, "reference")
    if hasattr(m, "mem_gate"):  # sized from self.n_heads after BlockAttention.__init__
        assert m.mem_gate.shape == (H,)
    opts = entry.valid_options()
    assert opts[:4] == ["n_heads", "impl", "block_len", "rope_base"] and "block_options" not in opts
    owner = cls.__name__
    for opt, bad, want in [("n_heads", "2", "an integer"), ("n_heads", 0, "an integer > 0"),
                           ("block_len", 2.0, "an integer"), ("rope_base", 1, "a finite number > 1")]:
        with pytest.raises(ValueError, match=f"^{owner}: {opt} must be {want}, got"):
            build_mixer(name, D, **{opt: bad})
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['block_lenn'\] \(did you mean 'block_len'\?\)"):
        build_mixer(name, D, block_lenn=8)


def test_memory_layer_stack():
    assert (
        memory_layer_stack(12, "elastic") == ["block_attention"] * 8 + ["elastic"] + ["block_attention"] * 3
    )
    assert memory_layer_stack(4, "memorizing")[2] == "memorizing"
    assert memory_layer_stack(3, "infini", [0, 1, 2]) == ["infini"] * 3
    with pytest.raises(ValueError):
        memory_layer_stack(4, "elastic", 7)


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_decode_reuses_memory_tokens_within_a_block_and_stays_exact(mode):
    """Token-by-token decoding rebuilds the memory tokens (Eq. 8) once per block, not once per token, and still
    equals the full forward (also under inference_mode, whose tensors have no version counter)."""
    import seqmem

    torch.manual_seed(0)
    m = seqmem.build_mixer("elastic", 32, n_heads=2, block_len=4, hippo_n=4).double()
    x = torch.randn(2, 19, 32, dtype=torch.float64)
    calls = []
    recon = m._recon
    # count rebuilds for this batch only (the first state check builds throw-away states of batch 1)
    m._recon = lambda like: (calls.append(like.shape[0]), recon(like))[1]
    rope, rotated = m._rope, []
    m._rope = lambda z, pos: (rotated.append(z.shape[:2]), rope(z, pos))[1]
    with mode():
        full, _ = m(x)
        calls.clear()
        rotated.clear()
        st, outs = None, []
        for t in range(x.shape[1]):
            y, st = m(x[:, t : t + 1], st)
            outs.append(y)
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-10, atol=1e-12)
    # each step rotates its own query and key only (the block's keys come from the cache), except at most one step
    # right after the first state check (batch 1), whose probe replaces the cache
    assert sum(n > 1 for bsz, n in rotated if bsz == 2) <= 1
    # one rebuild per block (5 blocks), plus at most one after the first state check, not one per token (19)
    assert calls.count(2) <= -(-x.shape[1] // 4) + 1


def test_unstated_choices_lmem_default_and_block_local_transformerpp():
    """The paper never gives L_mem (the number of memory tokens read per block): ours defaults to L_mem = N, the
    size at which the paper matches MemTrans' queue.  Which context Transformer++ and the non-memory layers see
    is not stated either: ours is block-local (each block attends only within itself), so changing block 0's
    input leaves block 1's output of `block_attention` unchanged."""
    assert make("elastic", hippo_n=12).mem_tokens == 12
    assert make("elastic", hippo_n=12, mem_tokens=5).mem_tokens == 5
    t = make("block_attention")
    x = x_()
    x2 = x.clone()
    x2[:, :L] += 1.0
    y, y2 = t(x)[0], t(x2)[0]
    assert_rel_close(y[:, L:], y2[:, L:], 1e-12, "block-local")
    assert (y[:, :L] - y2[:, :L]).abs().max() > 1e-3


def test_block_rope_equals_attention_rope_and_gradchecks():
    """The block mixers' one-node RoPE is attention's RoPE (values and gradients) and twice differentiable."""
    from seqmem.mixers.attention import apply_rope
    from seqmem.mixers.elastic import _apply_rope

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 7, 3, 8, generator=g, dtype=F64, requires_grad=True)
    pos = torch.arange(3, 10)
    w = torch.randn(2, 7, 3, 8, generator=g, dtype=F64)
    ours, ref = _apply_rope(x, pos, 500.0), apply_rope(x, pos, 500.0)
    assert_rel_close(ours, ref, 1e-14, "rope")
    assert_rel_close(torch.autograd.grad((ours * w).sum(), x)[0], torch.autograd.grad((ref * w).sum(), x)[0], 1e-14,
                     "rope gradient")  # fmt: skip
    xs = x[:, :3, :2, :4].detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda z: _apply_rope(z, pos[:3]), (xs,))
    assert torch.autograd.gradgradcheck(lambda z: _apply_rope(z, pos[:3]), (xs,))


@pytest.mark.parametrize("name,opts", [("block_attention", {}), ("elastic", {"hippo_n": 6}),
                                       ("memorizing", {"n_queue": 12}), ("infini", {}), ("melodi", {"n_summary": 3})])
def test_piece_from_inside_a_block_as_padded_square(name, opts):
    """A piece that starts inside a block and has t >= c queries may run as the padded causal square (the fast
    form's choice from square_min_queries on): same outputs, states and gradients as the masked call, and as one
    pass over the whole input."""
    x = x_(t=40)
    w = torch.randn(x.shape, generator=torch.Generator().manual_seed(5), dtype=F64)
    sizes = [3, 5, 2, 6, 11, 13]  # pieces 2 and 4 start 3 and 2 tokens into a block and end it: t >= c
    res = {}
    for square_min in (10**9, 1):
        m = make(name, **opts)
        m.square_min_queries = square_min
        xx = x.clone().requires_grad_(True)
        ys, st, i = [], None, 0
        for s in sizes:
            y, st = m(xx[:, i : i + s], st)
            ys.append(y)
            i += s
        y = torch.cat(ys, 1)
        res[square_min] = (y, st, torch.autograd.grad((y * w).sum(), [xx, *m.parameters()]))
    (y0, s0, g0), (y1, s1, g1) = res[10**9], res[1]
    assert_rel_close(y1, y0, 1e-12, "square vs masked")
    for key in s0:
        assert s1[key].shape == s0[key].shape
        if s0[key].numel():
            assert_rel_close(s1[key].double(), s0[key].double(), 1e-12, f"state {key}")
    for a, b in zip(g1, g0):
        assert_rel_close(a, b, 1e-11, "gradient")
    assert_rel_close(y1, make(name, **opts)(x)[0], 1e-12, "one pass")


@pytest.mark.slow  # ≈ 30 s: dynamo traces the mixer
def test_compiled_forward_reads_prebuilt_block_matrices() -> None:
    """``prepare_compile`` builds R and every block's (P_b, K̄_b) before ``torch.compile`` traces the forward:
    the traced forward then never builds them (before, each block index was a compiled frame of its own, past
    dynamo's recompile limit of 8), and a second and third call compile nothing."""
    from torch._dynamo.utils import counters

    from seqmem.train.loop import check_compiler

    try:
        check_compiler("cpu")
    except ValueError as e:
        pytest.skip(str(e))
    torch.manual_seed(0)
    from seqmem.ops.hippo import chunk as hippo_chunk

    m = build_mixer("elastic", 16, n_heads=2, block_len=4, hippo_n=4)
    x = torch.randn(2, 24, 16)
    hippo_chunk.clear_legs_blocks()
    m.prepare_compile(x.shape[1])
    kept = hippo_chunk._BLOCKS[(4, 4, torch.float32, torch.device("cpu"))][0]
    bank = dict(kept)
    assert sorted(bank) == list(range(6))
    torch._dynamo.reset()
    f = torch.compile(m, backend="eager")  # dynamo's guards and frames only: no code generation (fast)
    frames = []
    with torch._dynamo.config.patch(error_on_recompile=True):  # the old bank recompiled per block index
        for _ in range(3):
            before = counters["stats"]["unique_graphs"]
            y = f(x)[0]
            frames.append(counters["stats"]["unique_graphs"] - before)
    assert frames[1:] == [0, 0], frames
    assert kept.keys() == bank.keys() and all(kept[k] is bank[k] for k in bank)  # read, not rebuilt
    torch.testing.assert_close(y, m(x)[0])


@pytest.mark.parametrize(("name", "opts"), [
    ("elastic", {"block_len": 8, "hippo_n": 6}), ("elastic_uni", {"block_len": 8, "hippo_n": 6}),
    ("memorizing", {"block_len": 8, "n_queue": 12}), ("infini", {"block_len": 8}),
    ("melodi", {"block_len": 8, "n_summary": 3}),
])
def test_fast_forward_and_backward_read_nothing_back_from_the_device(name, opts):
    """Which memory each block sees follows from its index, so the fast form groups blocks without copying a mask
    to the host (on CUDA such a copy waits for every kernel queued before it): no read of a tensor's value and no
    tensor built from host values (``seqmem.bench.syncs``'s spy) in a training step over several blocks, a piece
    continuing the state the layer returned (inside a block), or in decoding one token per call across a block's
    end (Memorizing's and Melodi's take the per-token form there), once a first call has built what it keeps.  The
    values are the same as with the masks read back (the reference form and the op's own tests check that)."""
    from collections import Counter

    from seqmem.bench.syncs import _spy

    m = build_mixer(name, d_model=32, n_heads=2, **opts)
    x = torch.randn(2, 40, 32, requires_grad=True)
    m(x)  # a first call builds what the layer keeps (Elastic's block matrices: copies to the device, once)
    found: Counter = Counter()
    with _spy(found):
        _, st = m(x[:, :3])
        m(x[:, 3:], st)[0].sum().backward()
        m(x)[0].sum().backward()
        with torch.no_grad():  # decoding: one token per call (the single-token path), across a block's end
            _, s = m(x[:, :3])
            for i in range(3, 11):
                s = m(x[:, i : i + 1], s)[1]
    assert not found, f"{name}: read back {dict(found)}"


@pytest.mark.parametrize(("name", "opts"), [
    ("elastic", {"block_len": 8, "hippo_n": 6}), ("melodi", {"block_len": 8, "n_summary": 3}),
    ("memorizing", {"block_len": 8, "n_queue": 12}), ("infini", {"block_len": 8}),
])
def test_block_kinds_from_the_index_are_what_the_masks_show(name, opts, monkeypatch):
    """The kinds a block mixer hands to trapezoidal_attention (from ``_mem_visible`` and the block index) are the
    ones its memory mask shows, over pieces that start at a block's start, inside one, and a decode step: a kind
    that disagreed would be a wrong answer that no read of the device catches any more."""
    import seqmem.mixers.elastic as mod
    from seqmem.ops.elastic.chunk import block_kinds

    seen = []
    real = mod.trapezoidal_attention

    def checked(q, k, v, k_mem=None, v_mem=None, mem_valid=None, **kw):
        if kw.get("mem_kinds") is not None:
            seen.append(kw["mem_kinds"])
            assert kw["mem_kinds"] == block_kinds(mem_valid), name
        return real(q, k, v, k_mem, v_mem, mem_valid, **kw)

    monkeypatch.setattr(mod, "trapezoidal_attention", checked)
    m = build_mixer(name, d_model=32, n_heads=2, **opts)
    x = torch.randn(2, 44, 32)
    _, st = m(x[:, :3])
    _, st = m(x[:, 3:30], st)
    _, st = m(x[:, 30:31], st)
    m(x[:, 31:], st)
    m(x)
    if name in ("elastic", "melodi"):  # the ones whose memory goes through the op (Memorizing's, Infini's do not)
        assert seen and any(0 in s for s in seen) and any(1 in s for s in seen)


def test_block_matrices_are_kept_for_a_call_over_more_blocks_than_the_minimum(monkeypatch) -> None:
    """A call over more blocks than :data:`BLOCKS_KEPT_MIN` keeps all of them: the next call computes none of the
    closed forms again (before: the bank was cleared past 64 blocks, so every call over 66 or more recomputed
    nearly all of them, ≈ 0.1 s each at the paper's N = 540; measured 0.65 vs 4.2-4.9 s per call over 130
    blocks).  Layers of the same ``hippo_n`` and ``block_len`` share them; freeing them changes no value."""
    from seqmem.ops.hippo import chunk as hippo_chunk

    built = []
    real = hippo_chunk.legs_block
    monkeypatch.setattr(hippo_chunk, "legs_block", lambda *a, **k: built.append(a[2]) or real(*a, **k))
    monkeypatch.setattr(hippo_chunk, "BLOCKS_KEPT_MIN", 8)
    hippo_chunk.clear_legs_blocks()
    torch.manual_seed(0)
    a = build_mixer("elastic", 8, n_heads=2, block_len=2, hippo_n=3)
    b = build_mixer("elastic", 8, n_heads=2, block_len=2, hippo_n=3)
    x = torch.randn(1, 2 * 20, 8)  # 20 blocks, each folded into the memory
    y = a(x)[0]
    assert sorted(built) == list(range(20))
    built.clear()
    assert torch.equal(a(x)[0], y)
    b(x)
    assert built == []  # kept, and shared by the second layer
    hippo_chunk.clear_legs_blocks()
    assert torch.equal(a(x)[0], y) and sorted(built) == list(range(20))


def test_legs_blocks_refuses_bad_arguments() -> None:
    from seqmem.ops.hippo import legs_blocks

    for first, count in ((-1, 1), (0, -1), (0, 1.5)):
        with pytest.raises(ValueError, match="must be"):
            legs_blocks(3, 2, first, count, torch.float32)
    assert legs_blocks(3, 2, 5, 0, torch.float32) == []


def test_legs_blocks_evicts_nothing_while_traced(monkeypatch) -> None:
    """While ``torch.compile`` traces, the kept blocks are only read and none is evicted (an eviction there made a
    compiled forward rebuild them inside its graph); the next eager call trims the bank back to its size."""
    from seqmem.ops.hippo import chunk as hippo_chunk

    hippo_chunk.clear_legs_blocks()
    monkeypatch.setattr(hippo_chunk, "BLOCKS_KEPT_MIN", 4)
    hippo_chunk.legs_blocks(3, 2, 0, 4, torch.float32)
    bank = hippo_chunk._BLOCKS[(3, 2, torch.float32, torch.device("cpu"))][0]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    hippo_chunk.legs_blocks(3, 2, 4, 1, torch.float32)
    assert list(bank) == [0, 1, 2, 3, 4]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    hippo_chunk.legs_blocks(3, 2, 5, 1, torch.float32)
    assert list(bank) == [2, 3, 4, 5]
    hippo_chunk.clear_legs_blocks()
