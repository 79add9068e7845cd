"""The mixer contract, tested for EVERY registered mixer (a new mixer gets these tests by registering).

Properties (issue #2 §2): causality; streaming under any split (including splits that cut internal chunks);
token-by-token decoding; impl="reference" == impl="fast" in outputs, final states and gradients; state_size equals
the numbers held in the state; batch independence; T = 1; clear errors for bad input.
Weights are the mixer's own initialisation plus a random perturbation, so zero-initialised projections cannot make
a test vacuous; every test also checks the output is not identically zero.

``SEQMEM_TEST_DEVICE=cuda pytest tests/test_contract.py`` runs the same contract on a GPU (default: cpu); data is
drawn on the CPU and moved, so the cases are the same numbers on every device.
"""

from __future__ import annotations

import io
import os

import pytest
import torch

import seqmem
from conftest import assert_rel_close
from seqmem import build_mixer, count_state, get_entry, list_mixers

B, T, D, H = 2, 37, 16, 2
DEVICE = torch.device(os.environ.get("SEQMEM_TEST_DEVICE", "cpu"))
TOL = {torch.float64: 1e-9, torch.float32: 2e-4}
SPLITS = [[1, 36], [16, 21], [5, 11, 3, 18], [8, 8, 8, 8, 5], [36, 1], [2, 7, 13, 15]]

CASES = [
    pytest.param(name, cfg, id=f"{name}" + (f"-{i}" if i else ""))
    for name in list_mixers()
    for i, cfg in enumerate(get_entry(name).cls.contract_configs)
]


def make(name: str, cfg: dict, impl: str = "fast", dtype=torch.float64, seed: int = 0):
    cfg = dict(cfg)
    d = cfg.pop("d_model", D)
    cfg.setdefault("n_heads", H)
    torch.manual_seed(seed)
    m = build_mixer(name, d, impl=impl, **cfg).to(dtype)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return m.to(DEVICE)


def inputs(m, dtype=torch.float64, b=B, t=T, seed=3):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, t, m.d_model, generator=g, dtype=dtype).to(DEVICE)


def run_pieces(m, x, sizes):
    ys, state = [], None
    i = 0
    for s in sizes:
        y, state = m(x[:, i : i + s], state)
        ys.append(y)
        i += s
    assert i == x.shape[1]
    return torch.cat(ys, 1), state


@pytest.mark.parametrize("name,cfg", CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_causality(name, cfg, dtype):
    m = make(name, cfg, dtype=dtype)
    x = inputs(m, dtype)
    y, _ = m(x)
    assert y.shape == x.shape
    assert y.abs().max() > 1e-6, "output identically zero: the test would be vacuous"
    for t in (0, 9, 20):
        x2 = x.clone()
        x2[:, t + 1 :] = torch.randn_like(x2[:, t + 1 :])
        y2, _ = m(x2)
        assert_rel_close(y2[:, : t + 1], y[:, : t + 1], TOL[dtype], f"{name}: y[:, :{t + 1}] changed with future input")
    assert (y2 - y).abs().max() > 0, "output does not depend on the input"


@pytest.mark.parametrize("name,cfg", CASES)
@pytest.mark.parametrize("impl", ["fast", "reference"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_streaming_splits(name, cfg, impl, dtype):
    m = make(name, cfg, impl=impl, dtype=dtype)
    x = inputs(m, dtype)
    y, state = m(x)
    for sizes in SPLITS:
        ys, state_s = run_pieces(m, x, sizes)
        assert_rel_close(ys, y, TOL[dtype], f"{name}/{impl}: split {sizes}")
        assert set(state_s) == set(state)
        for k in state:
            what = f"{name}: state[{k}] split {sizes}"
            assert_rel_close(state_s[k].double(), state[k].double(), TOL[dtype] * 10, what)


@pytest.mark.parametrize("name,cfg", CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_token_by_token_decoding(name, cfg, dtype):
    m = make(name, cfg, dtype=dtype)
    x = inputs(m, dtype)
    y, _ = m(x)
    yd, _ = run_pieces(m, x, [1] * T)
    assert_rel_close(yd, y, TOL[dtype], f"{name}: token-by-token decoding")


@pytest.mark.parametrize("name,cfg", CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_reference_equals_fast(name, cfg, dtype):
    ref = make(name, cfg, impl="reference", dtype=dtype)
    fast = make(name, cfg, impl="fast", dtype=dtype)
    fast.load_state_dict(ref.state_dict())  # same parameter names in both impls
    x = inputs(ref, dtype).requires_grad_(True)
    w = torch.randn(x.shape, dtype=dtype, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    outs = {}
    for tag, m in (("reference", ref), ("fast", fast)):
        y, st = m(x)
        gx, *gp = torch.autograd.grad((y * w).sum(), [x, *m.parameters()], allow_unused=True)
        outs[tag] = (y, st, gx, gp)
    yr, sr, gxr, gpr = outs["reference"]
    yf, sf, gxf, gpf = outs["fast"]
    tol = TOL[dtype]
    assert_rel_close(yf, yr, tol, f"{name}: output fast vs reference")
    assert set(sf) == set(sr), f"{name}: state keys differ between impls"
    for k in sr:
        assert_rel_close(sf[k].double(), sr[k].double(), tol * 10, f"{name}: state[{k}] fast vs reference")
    assert_rel_close(gxf, gxr, tol * 10, f"{name}: grad wrt x")
    for (pname, _), a, b in zip(ref.named_parameters(), gpf, gpr):
        assert (a is None) == (b is None), f"{name}: grad of {pname} missing in one impl"
        if a is not None and b.abs().max() > 0:
            assert_rel_close(a, b, tol * 10, f"{name}: grad wrt {pname}")


@pytest.mark.parametrize("name,cfg", CASES)
def test_state_size_and_portability(name, cfg):
    m = make(name, cfg)
    for n in (1, 7, 16, T):
        _, state = m(inputs(m, t=n))
        assert isinstance(state, dict) and all(isinstance(v, torch.Tensor) for v in state.values())
        assert count_state(state) == m.state_size(n), f"{name}: state holds {count_state(state)} != state_size({n})"
    # saved and loaded (tensors only inside), then continued: same as not saving
    x = inputs(m)
    y, _ = m(x)
    y1, st = m(x[:, :20])
    buf = io.BytesIO()
    torch.save(st, buf)
    buf.seek(0)
    st2 = torch.load(buf, weights_only=True, map_location="cpu")
    y2, _ = m(x[:, 20:], seqmem.state_to(st2, DEVICE))
    assert_rel_close(torch.cat([y1, y2], 1), y, TOL[torch.float64], f"{name}: continue from a saved state")


@pytest.mark.parametrize("name,cfg", CASES)
def test_batch_independence_and_t1(name, cfg):
    m = make(name, cfg)
    x = inputs(m, b=3)
    y, _ = m(x)
    for i in range(3):
        yi, _ = m(x[i : i + 1])
        assert_rel_close(yi, y[i : i + 1], TOL[torch.float64], f"{name}: batch element {i}")
    y1, st = m(x[:, :1])
    assert y1.shape == (3, 1, m.d_model) and torch.isfinite(y1).all()


@pytest.mark.parametrize("name,cfg", CASES)
def test_bad_input_raises(name, cfg):
    m = make(name, cfg)
    x = inputs(m)
    with pytest.raises(ValueError):
        m(x[0])  # 2-D
    with pytest.raises(ValueError):
        m(torch.randn(B, 5, m.d_model + 1, dtype=torch.float64, device=DEVICE))  # wrong width
    with pytest.raises(ValueError):
        m(torch.zeros(B, 5, m.d_model, dtype=torch.long, device=DEVICE))  # integer dtype
    with pytest.raises(ValueError):
        m(x.float())  # dtype differs from parameters
    with pytest.raises(ValueError):
        m(x[:, :0])  # empty
    _, st = m(x[:, :5])
    with pytest.raises(ValueError):
        m(inputs(m, b=B + 1, t=3), st)  # state from another batch size
    with pytest.raises(ValueError, match=r"impl must be one of \['reference', 'fast'\], got 'Fast'"):
        m.impl = "Fast"  # checked when set after construction too (it ran the fast form silently)
    assert m.impl == "fast"
    m.impl = "reference"
    assert m.impl == "reference"


@pytest.mark.parametrize("name,cfg", CASES)
def test_cache_of_the_wrong_length_raises(name, cfg):
    """A state tensor whose length grows or shrinks with the sequence (a KV cache, a window's cache, the current
    block's tokens) must hold exactly the tokens its position says: one token fewer (a truncated cache, or a
    window-w state given to a full-attention layer) or one more is refused, never read at shifted positions."""
    m = make(name, cfg)
    x = inputs(m)
    _, st = m(x[:, :20])
    layout = m.state_layout(x)
    assert layout is not None, f"{name}: the state layout probe failed"
    for key, (dims, _) in layout.items():
        for i, d in enumerate(dims):
            if d is not None:
                continue
            n = st[key].shape[i + 1]
            if n:
                bad = st[key].narrow(i + 1, 1, n - 1)
            else:
                bad = torch.cat([st[key], st[key].new_zeros(*st[key].shape[: i + 1], 1, *st[key].shape[i + 2 :])],
                                i + 1)
            with pytest.raises(ValueError, match="expected"):
                m(x[:, 20:], {**st, key: bad})


@pytest.mark.parametrize("name,cfg", CASES)
@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_tensors_are_made_on_the_input_device(name, cfg, impl):
    """Every tensor a mixer makes in its forward and backward is made on its input's device (``device=x.device``,
    ``x.new_*``, ``*_like``), never on the default device: on a GPU a constant made on the host and combined with
    device tensors fails ("Expected all tensors to be on the same device").  Checked on any machine by making the
    default device ``meta`` (no data): a tensor made without a device then lands there and the first operation
    that mixes it with the input's tensors fails, on the CPU as it would on a GPU."""
    m = make(name, cfg, impl=impl)
    x = inputs(m, t=13).requires_grad_(True)
    with torch.device("meta"):
        y1, st = m(x[:, :7])
        y2, st = m(x[:, 7:], st)  # continued from a state
        y3, _ = m(x[:, 12:], st)  # one decoding step
        (y1.sum() + y2.sum() + y3.sum()).backward()
    assert x.grad is not None and x.grad.device == x.device and y3.device == x.device


@pytest.mark.parametrize("name,cfg", CASES)
def test_deepcopy_after_a_training_step(name, cfg):
    """A layer deep-copies (``copy.deepcopy``, ``torch.optim.swa_utils.AveragedModel``, EMA copies) after a forward
    and backward with gradients: no tensor of the autograd graph may be kept on the module (VORT kept its α of the
    last call, a non-leaf tensor, and deepcopy refused it)."""
    import copy

    m = make(name, cfg)
    y, _ = m(inputs(m, t=9))
    y.square().sum().backward()
    c = copy.deepcopy(m)
    x = inputs(m, t=5, seed=4)
    assert_rel_close(c(x)[0], m(x)[0], 0.0, f"{name}: the copy computes what the layer does")


@pytest.mark.parametrize("name,cfg", CASES)
@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_trains_after_a_call_in_inference_mode(name, cfg, impl):
    """A layer evaluated under ``torch.inference_mode`` first (a checkpoint evaluated, then fine-tuned) trains
    after it: what a layer caches across calls (matrices, nodes, channel weights) must not be inference tensors,
    which a later backward cannot save.  The process-wide SOE node cache is emptied first, so that this call
    builds it."""
    from seqmem.ops import fractional

    fractional._NODE_TENSORS.clear()
    m = make(name, cfg, impl)
    x = inputs(m, t=9)
    with torch.inference_mode():
        m(x)
    y, _ = m(x.clone().requires_grad_(True))
    y.square().sum().backward()


POS_CASES = [c for c in CASES if get_entry(c.values[0]).cls.pos_on_host]


@pytest.mark.parametrize("name,cfg", POS_CASES)
def test_a_decode_step_knows_its_position_on_the_host(name, cfg):
    """A layer with ``pos_on_host`` remembers the position of the state it returned, so a step given that state back
    reads no position from the device (a wait for the GPU per layer per token on CUDA); a state whose ``pos`` is
    another tensor, or was modified in place, is read as before, with the same result."""
    from collections import Counter

    from seqmem.bench.syncs import _spy

    def position_reads(found: Counter) -> int:  # Mixer._state_pos / _known_pos, or the op's own (SKA, Lattice)
        return sum(c for k, c in found.items()
                   if k.startswith(("__int__ seqmem/mixers/base.py:", "tolist seqmem/mixers/base.py:",
                                    "tolist seqmem/ops/")))

    m = make(name, cfg)
    x = inputs(m, t=12)
    _, st = m(x[:, :5])
    found: Counter = Counter()
    with _spy(found):
        for i in range(5, 9):
            y, st = m(x[:, i : i + 1], st)
    assert position_reads(found) == 0, found
    assert m._pos_memo[2] == int(st["pos"][0]) == 9
    for other in ({**st, "pos": st["pos"].clone()}, {**st, "pos": st["pos"].add_(0)}):  # another tensor; in place
        found = Counter()
        with _spy(found):
            y2, _ = m(x[:, 9:10], other)
        assert position_reads(found) == 1, found
    y3, _ = make(name, cfg)(x[:, 9:10], {**st, "pos": st["pos"].clone()})  # a fresh layer reads it
    assert_rel_close(y2, y3, 0.0, f"{name}: the step from a read position")
    found = Counter()
    _, s2 = m(x[:, 9:10], {**st, "pos": st["pos"].clone()})  # a state this layer did not return: read once ...
    with _spy(found):
        for i in range(10, 12):  # ... and remembered for the state that step returned
            _, s2 = m(x[:, i : i + 1], s2)
    assert position_reads(found) == 0, found
    with torch.inference_mode():  # a pos made in inference mode has no version counter: an edit is still seen
        _, s3 = m(x[:, :5])
        s3["pos"].add_(0)  # in place (a changed value would not match the rest of the state)
        found = Counter()
        with _spy(found):
            _, s4 = m(x[:, 5:6], s3)
        assert position_reads(found) == 1 and int(s4["pos"][0]) == 6, (found, s4["pos"])


@pytest.mark.parametrize("name,cfg", CASES)
def test_numpy_scalars_are_options_like_python_numbers(name, cfg):
    """Options read from a NumPy array or config (``np.int64(16)``, ``np.float64(1e-3)``) build the layer Python
    numbers build: ``build_mixer("deltanet", np.int64(16))`` was refused ("d_model must be a positive integer, got
    np.int64(16)") while the option checks took NumPy integers."""
    import numpy as np

    def np_(v):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return v
        return np.int64(v) if isinstance(v, int) else np.float64(v)

    opts = {"n_heads": H, **cfg}
    d = opts.pop("d_model", D)
    torch.manual_seed(0)
    a = build_mixer(name, d, **opts)
    torch.manual_seed(0)
    b = build_mixer(name, np_(d), **{k: np_(v) for k, v in opts.items()})
    assert a.extra_repr() == b.extra_repr()
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)
    x = torch.randn(2, 5, d, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a(x)[0], b(x)[0])


@pytest.mark.parametrize("name,cfg", CASES)
def test_state_tensors_own_their_memory(name, cfg):
    """Every tensor of a returned state owns exactly its own numbers: no view into a buffer of the whole call (a
    slice of the padded chunks, of the keys of every token).  Such a view kept the whole buffer alive as long as the
    state lived, and ``torch.save`` wrote all of it (deltanet at T = 4,096, d_model 64: a 10 kB state kept and saved
    3.2 MB); safetensors refused it.  Batch 1 too, where a slice along time is contiguous but still a view."""
    m = make(name, cfg)
    for b in (1, B):
        with torch.no_grad():
            _, st = m(inputs(m, b=b, t=T))
            _, st1 = m(inputs(m, b=b, t=1), st)  # a decoding step from a state
        for which, state in (("after T tokens", st), ("after a decoding step", st1)):
            for key, v in state.items():
                own = v.numel() * v.element_size()
                held = v.untyped_storage().nbytes()
                assert held == own, (f"{name}: state[{key!r}] {which} (batch {b}) holds {held} bytes of storage for "
                                     f"{own} bytes of numbers (a view into a larger buffer)")


@pytest.mark.parametrize("name,cfg", CASES)
def test_state_round_trips_through_safetensors(name, cfg):
    """The README's promise: a state saves with safetensors as it is (``save(state)``: it is a flat dict of
    tensors), and the loaded state continues the sequence exactly.  safetensors refused the views and
    non-contiguous tensors 22 of the 26 mixers returned."""
    st_mod = pytest.importorskip("safetensors.torch", reason="safetensors is not installed")
    m = make(name, cfg)
    x = inputs(m)
    y, _ = m(x)
    for cut in (20, 1):
        y1, st = m(x[:, :cut])
        st2 = seqmem.state_to(st_mod.load(st_mod.save({k: v.cpu() for k, v in st.items()})), DEVICE)
        y2, _ = m(x[:, cut:], st2)
        assert_rel_close(torch.cat([y1, y2], 1), y, TOL[torch.float64], f"{name}: continue from safetensors")


@pytest.mark.parametrize("name,cfg", CASES)
def test_every_parameter_gets_a_gradient(name, cfg):
    """A forward and backward on a random input gives every parameter a gradient, but those the configuration
    names in ``unused_parameters()`` with a reason (a parameter that never gets one inflates parameter counts and
    stops plain DistributedDataParallel; ``vla_fixed_a`` built the unused ``w_u``)."""
    m = make(name, cfg)
    x = inputs(m).requires_grad_(True)
    y, _ = m(x)
    (y * torch.randn(y.shape, generator=torch.Generator().manual_seed(5), dtype=y.dtype).to(DEVICE)).sum().backward()
    unused = m.unused_parameters()
    names = dict(m.named_parameters())
    assert set(unused) <= set(names), f"{name}: unused_parameters names no parameter: {set(unused) - set(names)}"
    assert all(isinstance(r, str) and r.strip() for r in unused.values())
    missing = sorted(k for k, p in names.items() if p.grad is None and k not in unused)
    assert not missing, f"{name}: no gradient for {missing} (list them in unused_parameters() with the reason)"
    stale = sorted(k for k in unused if names[k].grad is not None)
    assert not stale, f"{name}: unused_parameters() lists {stale}, which got a gradient"


@pytest.mark.parametrize("name,option,value", [
    ("exp_decay", "decay_rate", 0.01), ("exp_mixture", "n_exp", 3), ("vla_paper_deltanet", "eps", 1e-3),
    ("vla_paper_deltanet", "normalizer", "none"), ("vla_paper_deltanet", "chunk_size", 8),
    ("lattice", "chunk_size", 8), ("lattice", "conv_size", 2), ("lattice", "gamma_per_slot", True),
    ("lattice", "forget_gate", True), ("lattice", "l1", 0.1), ("koopman_mlp", "d_k", 32), ("vort", "chunk_size", 8),
    ("vort", "horizon", 64), ("vort_fixed_alpha", "alpha", 0.5), ("vort", "entity", "none"),
])
def test_extra_repr_shows_the_options_that_matter(name, option, value):
    """``repr(layer)`` tells two layers apart that compute differently (a state error quotes it too): each of these
    options was missing from it."""
    a, b = build_mixer(name, D, n_heads=H), build_mixer(name, D, n_heads=H, **{option: value})
    assert a.extra_repr() != b.extra_repr() and f"{option}=" in b.extra_repr(), b.extra_repr()


def test_extra_repr_leaves_out_options_the_kernel_does_not_read():
    assert "n_soe" not in build_mixer("exp_decay", D).extra_repr()  # one exponential: no SOE channels
    assert "n_soe" not in build_mixer("exp_mixture", D).extra_repr()


def test_registry_errors():
    with pytest.raises(ValueError, match="registered mixers"):
        build_mixer("no_such_mixer", 16)
    name = list_mixers()[0]
    with pytest.raises(ValueError, match="valid options"):
        build_mixer(name, 16, not_an_option=1)
    with pytest.raises(ValueError):
        build_mixer(name, 16, impl="turbo")
    with pytest.raises(ValueError):
        build_mixer(name, -3)


def test_core_baselines_registered():
    for name in ("attention", "swa", "linear_attention", "deltanet", "gated_deltanet", "mamba2"):
        assert name in list_mixers()
