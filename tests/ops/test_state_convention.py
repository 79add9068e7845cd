"""One state convention for the public ops of ``seqmem.ops``: a sequence op returns ``(output, state)`` with
``state`` a dict of named tensors (each key documented in the op's docstring), and takes that dict back as
``initial_state``: two calls on the halves of a sequence equal one call on all of it (float64, outputs and
every state tensor).  A guard fails when a name in ``seqmem.ops.__all__`` is in none of :data:`CASES`,
:data:`NO_STATE` (with the reason) or :data:`PENDING`."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import seqmem.ops as ops

D64 = torch.float64
B, H = 2, 2


def _rand(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=D64) * scale


def _uniform(*shape: int, seed: int, lo: float = 0.0, hi: float = 1.0) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(*shape, generator=torch.Generator().manual_seed(seed), dtype=D64)


#: ``make() -> (T, call)``; ``call(sl, state)`` runs the op on time slice ``sl`` from ``state`` (None: the start)
#: and returns ``(output, state)``, the output on the time axis 1 (None for an op whose only output is its state)
Make = Callable[[], tuple[int, Callable[[slice, dict | None], tuple[torch.Tensor | None, dict]]]]
CASES: list[tuple[str, str, Make]] = []


def case(op: str, *ids: str):
    """Register ``make(id)`` once per id (a mode or variant)."""

    def deco(make):
        for cid in ids:
            CASES.append((op, cid, lambda make=make, cid=cid: make(cid)))
        return make

    return deco


#: Public names with no recurrent state to carry, and why.
NO_STATE: dict[str, str] = {
    # constants
    "CONSTRUCTIONS": "tuple of SOE construction names",
    "LATTICE_OBJECTIVES": "tuple of Lattice objective names",
    # kernels, constructors and read-outs of one step, not sequence ops
    "gl_weights": "Grünwald-Letnikov weights of given lags",
    "gl_kernel_sum": "a kernel sum up to t",
    "soe_nodes": "quadrature nodes",
    "soe_coefficients": "SOE channel weights of given α",
    "soe_kernel": "the SOE kernel at given lags",
    "soe_density": "the spectral density of the kernel",
    "soe_kernel_matrix": "decay matrix between given positions",
    "legs_matrices": "HiPPO-LegS (A, B)",
    "legs_transition": "one HiPPO transition matrix",
    "legs_input_kernel": "one HiPPO input kernel",
    "legs_block": "one block's (P, K̄)",
    "legs_block_bank": "a bank of legs_block",
    "legs_blocks": "legs_block of consecutive blocks, kept across calls",
    "clear_legs_blocks": "frees legs_blocks' kept matrices",
    "sample_fractions": "sample points of a retrieval rule",
    "legs_reconstruction_matrix": "Legendre table at sample points",
    "hippo_reconstruct": "reads given coefficients (no sequence)",
    "orthonormal_slots": "random initial slots",
    "soft_threshold": "elementwise prox",
    "sphere_retract": "columnwise projection",
    "lattice_step": "one token S_{t-1} -> S_t on a bare slot tensor: the building block lattice_scan iterates",
    "vla_generalized_delta_chunk": "one chunk with a required S0 (..., Dv, Dk): a kernel of the chunked forms",
    "vla_jacobian_norm_closed_form": "a closed form of c",
    "ska_spectral_scale": "power iteration on a given matrix",
    "ska_readout": "reads given statistics",
    "ska_readout_appf": "reads given statistics",
    "ska_ridge_readout": "reads given statistics",
    "ska_statistics": "statistics of one given window",
    "ska_init_state": "builds the empty spectral_koopman_attention state",
    "retrieval_loss": "a loss over a whole given sequence",
    "refine_alpha": "test-time optimisation of α",
    # the memory is passed explicitly
    "kv_retention": "parallel form over an explicit KV cache and decay matrix (no finite state exists)",
    "trapezoidal_attention": "one block's attention over explicitly passed memory tokens (k_mem, v_mem)",
}

#: Sequence ops that do not follow the convention yet, and what they take instead (a case listed here is expected
#: to fail until the op is converted; strict: a pass fails too).
PENDING: dict[str, str] = {}


# ------------------------------------------------------------------------------------------------- the cases
@case("lattice_scan", "recurrent", "scan")
def _lattice_scan(mode):
    T, m, d = 9, 3, 4
    q, v = _rand(B, T, H, m, seed=0), _rand(B, T, H, d, seed=2)
    k = F.normalize(_rand(B, T, H, m, seed=1), dim=-1)
    gam, mu = _uniform(B, T, H, seed=3, lo=0.1, hi=0.9), _uniform(B, T, H, seed=4, lo=0.5, hi=1.0)
    return T, lambda sl, st: ops.lattice_scan(q[:, sl], k[:, sl], v[:, sl], gam[:, sl], st, forget=mu[:, sl],
                                              mode=mode, chunk_size=2)


@case("lattice_minibatch", "recurrent", "chunk")
def _lattice_minibatch(mode):
    T, m, d = 11, 3, 4
    q, v = _rand(B, T, H, m, seed=0), _rand(B, T, H, d, seed=2)
    k = F.normalize(_rand(B, T, H, m, seed=1), dim=-1)
    gam = _uniform(B, T, H, seed=3, lo=0.1, hi=0.9)
    return T, lambda sl, st: ops.lattice_minibatch(q[:, sl], k[:, sl], v[:, sl], gam[:, sl], st, chunk_size=4,
                                                   mode=mode)


@case("vla_attention", "recurrent", "chunk", "fixed_A-chunk", "normalizer_none-recurrent")
def _vla_attention(cid):
    T = 9
    q, k, v = (_rand(B, T, H, 3, seed=i) for i in range(3))
    w_u = _rand(H, 3, 3, seed=3, scale=3**-0.5)
    variant, mode = cid.split("-") if "-" in cid else ("", cid)
    kw = {"fixed_A": {"fixed_A": True}, "normalizer_none": {"normalizer": "none"}}.get(variant, {})
    return T, lambda sl, st: ops.vla_attention(q[:, sl], k[:, sl], v[:, sl], w_u, initial_state=st, mode=mode,
                                               chunk_size=3, refresh_period=4, **kw)


@case("vla_paper_delta_rule", "recurrent", "chunk")
def _vla_paper_delta_rule(mode):
    T = 9
    q, k, v = (_rand(B, T, H, 3, seed=i) for i in range(3))
    beta = _uniform(B, T, H, seed=3, lo=0.2, hi=0.8)
    return T, lambda sl, st: ops.vla_paper_delta_rule(q[:, sl], k[:, sl], v[:, sl], beta[:, sl], initial_state=st,
                                                      mode=mode, chunk_size=2)


@case("soe_retention", "kernel-recurrent", "kernel-chunk", "kernel-parallel", "plain-scaled-chunk",
      "plain-scaled-recurrent")
def _soe_retention(cid):
    T = 10
    normalizer, *rest = cid.split("-")
    mode = rest[-1]
    q, k = (_uniform(B, T, H, 2, seed=i, lo=0.1, hi=1.0) for i in range(2))
    v = _rand(B, T, H, 2, seed=2)
    c, xi, cn = ops.soe_coefficients(_uniform(B, T, seed=3, lo=0.3, hi=0.9), 3, 16)
    beta = _rand(B, T, H, seed=4) * 2.0 if "scaled" in rest else None
    return T, lambda sl, st: ops.soe_retention(
        q[:, sl], k[:, sl], v[:, sl], c[:, sl], xi, cn[:, sl], normalizer=normalizer, initial_state=st, mode=mode,
        chunk_size=3, k_log_scale=None if beta is None else beta[:, sl])


@case("spectral_koopman_attention", "recurrent", "chunk")
def _ska(mode):
    T = 11
    q, k, v = _rand(B, T, H, 3, seed=0), _rand(B, T, H, 3, seed=1), _rand(B, T, H, 2, seed=2)
    return T, lambda sl, st: ops.spectral_koopman_attention(q[:, sl], k[:, sl], v[:, sl], chunk_size=3,
                                                            initial_state=st, mode=mode)


# the linear-RNN ops
def _qkv(T, seed=0):
    q, v = _rand(B, T, H, 3, seed=seed), _rand(B, T, H, 2, seed=seed + 2)
    return q, F.normalize(_rand(B, T, H, 3, seed=seed + 1), dim=-1), v


@case("linear_attention", "recurrent", "chunk")
def _linear_attention(mode):
    T = 9
    q, k, v = _qkv(T)
    return T, lambda sl, st: ops.linear_attention(q[:, sl], k[:, sl], v[:, sl], initial_state=st, mode=mode,
                                                  chunk_size=2)


@case("delta_rule", "recurrent", "chunk")
def _delta_rule(mode):
    T = 9
    q, k, v = _qkv(T)
    beta = _uniform(B, T, H, seed=4, lo=0.2, hi=0.8)
    return T, lambda sl, st: ops.delta_rule(q[:, sl], k[:, sl], v[:, sl], beta[:, sl], initial_state=st, mode=mode,
                                            chunk_size=2)


@case("gated_delta_rule", "recurrent", "chunk")
def _gated_delta_rule(mode):
    T = 9
    q, k, v = _qkv(T)
    beta, g = _uniform(B, T, H, seed=4, lo=0.2, hi=0.8), -_uniform(B, T, H, seed=5, lo=0.05, hi=0.5)
    return T, lambda sl, st: ops.gated_delta_rule(q[:, sl], k[:, sl], v[:, sl], beta=beta[:, sl], g=g[:, sl],
                                                  initial_state=st, mode=mode, chunk_size=2)


@case("ssd", "recurrent", "chunk")
def _ssd(mode):
    T = 9
    x, Bm, Cm = _rand(B, T, H, 2, seed=0), _rand(B, T, H, 3, seed=1), _rand(B, T, H, 3, seed=2)
    dt, A = _uniform(B, T, H, seed=3, lo=0.1, hi=0.9), -_uniform(H, seed=4, lo=0.5, hi=1.5)
    return T, lambda sl, st: ops.ssd(x[:, sl], dt[:, sl], A, Bm[:, sl], Cm[:, sl], initial_state=st, mode=mode,
                                     chunk_size=2)


# the window caches and the HiPPO coefficients
def _window_qkv(T):
    return _rand(B, T, H, 3, seed=0), _rand(B, T, H, 3, seed=1), _rand(B, T, H, 3, seed=2)


@case("sliding_window_attention", "recurrent", "chunk", "parallel")
def _sliding_window_attention(mode):
    T = 9
    q, k, v = _window_qkv(T)
    return T, lambda sl, st: ops.sliding_window_attention(q[:, sl], k[:, sl], v[:, sl], 4, initial_state=st,
                                                          mode=mode, chunk_size=2)


@case("local_window_attention", "recurrent", "chunk")
def _local_window_attention(mode):
    T = 9
    q, k, v = _window_qkv(T)

    def call(sl, st):  # the output: the attention and the entropy feature, side by side
        out, ent, st = ops.local_window_attention(q[:, sl], k[:, sl], v[:, sl], 4, initial_state=st,
                                                  return_state=True, mode=mode, chunk_size=2)
        return torch.cat([out.flatten(2), ent[..., None]], -1), st

    return T, call


@case("hippo_compress", "recurrent", "chunk", "direct")
def _hippo_compress(mode):
    T = 10
    f = _rand(B, T, 2, seed=0)
    return T, lambda sl, st: (None, ops.hippo_compress(f[:, sl], 4, mode=mode, block_len=3, initial_state=st,
                                                       return_state=True)[1])


#: the former bare-tensor ``initial_state`` of converted ops: ``make() -> (call(state), dict state)``
FORMER_TENSOR = ("lattice_scan", "lattice_minibatch", "linear_attention", "delta_rule", "gated_delta_rule", "ssd")


# ------------------------------------------------------------------------------------------------------ tests
def test_every_public_op_is_classified():
    public = set(ops.__all__)
    stateful = {op for op, _, _ in CASES} - set(PENDING)
    for x, y in ((stateful, set(NO_STATE)), (stateful, set(PENDING)), (set(NO_STATE), set(PENDING))):
        assert not x & y, f"listed twice: {sorted(x & y)}"
    missing = public - stateful - set(NO_STATE) - set(PENDING)
    assert not missing, (f"seqmem.ops exports {sorted(missing)}: add a split-continuation case to "
                         "tests/ops/test_state_convention.py, or a NO_STATE entry saying why it has no state")
    stale = (stateful | set(NO_STATE) | set(PENDING)) - public
    assert not stale, f"names not in seqmem.ops.__all__: {sorted(stale)}"
    assert all(r.strip() for r in (*NO_STATE.values(), *PENDING.values()))


def _close(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    if a.is_floating_point():
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=what)
    else:
        assert torch.equal(a, b), what


@pytest.mark.parametrize("op,cid,make", [
    pytest.param(op, cid, make, id=f"{op}-{cid}",
                 marks=[pytest.mark.xfail(strict=True, reason=PENDING[op])] if op in PENDING else [])
    for op, cid, make in CASES
])  # fmt: skip
def test_dict_state_continues_a_split_sequence(op, cid, make):
    T, call = make()
    y, st = call(slice(0, T), None)
    assert isinstance(st, dict) and st and all(isinstance(t, torch.Tensor) for t in st.values()), type(st)
    doc = getattr(ops, op).__doc__
    for key in st:  # every key is documented: one line in the op's docstring
        assert f'``"{key}"``' in doc, f"{op}: state key {key!r} is not listed in its docstring"
    for cut in (1, T // 2, T - 1):
        y1, st1 = call(slice(0, cut), None)
        y2, st2 = call(slice(cut, T), st1)
        assert set(st2) == set(st), f"{op}: keys {sorted(st2)} after the split vs {sorted(st)}"
        if y is not None:
            _close(torch.cat([y1, y2], 1), y, f"{op}[{cid}] output, split at {cut}")
        for key in st:
            _close(st2[key], st[key], f"{op}[{cid}] state[{key!r}], split at {cut}")


@pytest.mark.parametrize("op", FORMER_TENSOR)
def test_former_tensor_state_warns_and_agrees(op):
    (T, call), = [make() for o, cid, make in CASES if o == op][:1]
    y, st = call(slice(0, T), None)
    y_dict, _ = call(slice(0, T), {"S": st["S"]} if op != "lattice_minibatch" else
                     {"S": st["S"], "A": torch.zeros_like(st["S"]), "pos": torch.zeros_like(st["pos"])})
    with pytest.warns(DeprecationWarning, match=rf"{op}: a tensor initial_state is deprecated; pass the state dict"):
        y_old, st_old = call(slice(0, T), st["S"])
    assert isinstance(st_old, dict)
    _close(y_old, y_dict, f"{op}: the bare tensor is read as {{'S': tensor}}")


@pytest.mark.parametrize("op", ["sliding_window_attention", "local_window_attention"])
def test_former_past_k_past_v_warn_and_agree(op):
    T, cut = 9, 5
    q, k, v = _window_qkv(T)
    fn = getattr(ops, op)
    first = fn(q[:, :cut], k[:, :cut], v[:, :cut], 4, chunk_size=2)
    _, st = ops.sliding_window_attention(q[:, :cut], k[:, :cut], v[:, :cut], 4)
    new = fn(q[:, cut:], k[:, cut:], v[:, cut:], 4, initial_state=st, chunk_size=2)
    for how in ({"past_k": st["k"], "past_v": st["v"]}, "positional"):
        args, kw = ((st["k"], st["v"]), {}) if how == "positional" else ((), how)
        with pytest.warns(DeprecationWarning, match=rf"{op}: past_k/past_v are deprecated; pass "
                                                    r"initial_state=\{'k': past_k, 'v': past_v\}"):
            old = fn(q[:, cut:], k[:, cut:], v[:, cut:], 4, *args, chunk_size=2, **kw)
        assert len(old) == len(new) == 2 and len(first) == 2, "the return value keeps its arity"
        for a, b in zip(old, new):
            for key in a if isinstance(a, dict) else (None,):
                _close(a if key is None else a[key], b if key is None else b[key],
                       f"{op}: past_k/past_v are read as initial_state ({key or 'output'})")
    if op == "local_window_attention":  # its state is opt-in: two values by default, the state third
        out, ent, st3 = fn(q[:, cut:], k[:, cut:], v[:, cut:], 4, initial_state=st, return_state=True)
        _close(out, new[0], "return_state keeps the output")
        _close(ent, new[1], "return_state keeps the entropy")
        _, st_swa = ops.sliding_window_attention(q[:, cut:], k[:, cut:], v[:, cut:], 4, initial_state=st)
        for key in ("k", "v"):
            _close(st3[key], st_swa[key], f"the same cache as sliding_window_attention: {key}")
    with pytest.raises(ValueError, match="not both"):
        fn(q, k, v, 4, st["k"], st["v"], initial_state=st)
    with pytest.raises(ValueError, match=r"initial_state must be a dict with keys \['k', 'v'\]"):
        fn(q, k, v, 4, initial_state={"k": st["k"]})


@pytest.mark.parametrize("mode", ["recurrent", "chunk", "direct"])
def test_hippo_compress_former_tensor_and_t0_warn_and_agree(mode):
    T, cut = 10, 4
    f = _rand(B, T, 2, seed=0)
    c1, st = ops.hippo_compress(f[:, :cut], 4, mode=mode, block_len=3, return_state=True)
    _close(c1, st["c"], "the coefficients are the state's 'c'")
    assert st["t"].dtype == torch.long and st["t"].tolist() == [cut] * B
    assert isinstance(ops.hippo_compress(f, 4, mode=mode, block_len=3), torch.Tensor), "default: coefficients only"
    new = ops.hippo_compress(f[:, cut:], 4, mode=mode, block_len=3, initial_state=st)
    match = r"hippo_compress: a tensor initial_state and t0 are deprecated; pass the state dict \{'c'"
    with pytest.warns(DeprecationWarning, match=match):
        old = ops.hippo_compress(f[:, cut:], 4, mode=mode, block_len=3, initial_state=c1, t0=cut)
    _close(old, new, "a bare tensor with t0 is read as {'c': tensor, 't': t0}")
    with pytest.warns(DeprecationWarning, match=match):  # t0 alone: a zero history of t0 tokens, as before
        old = ops.hippo_compress(f[:, cut:], 4, mode=mode, block_len=3, t0=cut)
    zero = {"c": torch.zeros_like(c1), "t": st["t"]}
    _close(old, ops.hippo_compress(f[:, cut:], 4, mode=mode, block_len=3, initial_state=zero), "t0 alone")
    with pytest.warns(DeprecationWarning, match=match):  # a bare tensor at an explicit t0 = 0: an empty history
        old = ops.hippo_compress(f, 4, mode=mode, block_len=3, initial_state=c1, t0=0)
    _close(old, ops.hippo_compress(f, 4, mode=mode, block_len=3), "a bare tensor at t0 = 0 is an empty history")
    # a bare tensor with no t0 was ignored (the history restarted at 0): continuing from it silently gave the
    # coefficients of the new tokens alone; now refused, pointing at the state dict
    with pytest.raises(ValueError, match=r"hippo_compress: a bare coefficient tensor as initial_state needs the "
                                         r"tokens it summarises; pass the state dict \{'c'.*no t0"):
        ops.hippo_compress(f[:, cut:], 4, mode=mode, block_len=3, initial_state=c1)
    with pytest.raises(ValueError, match=r"hippo_compress: initial_state\['c'\] must have shape \(batch, N, "
                                         r"channels\) = \(2, 4, 2\), got \(1, 4, 2\)"):
        ops.hippo_compress(f[:, cut:], 4, mode=mode, initial_state={"c": c1[:1], "t": st["t"]})
    with pytest.raises(ValueError, match=r"initial_state\['c'\] must be a floating-point tensor"):
        ops.hippo_compress(f[:, cut:], 4, mode=mode, initial_state={"c": c1.long(), "t": st["t"]})
    with pytest.raises(ValueError, match="not as t0"):
        ops.hippo_compress(f, 4, initial_state=st, t0=cut)
    with pytest.raises(ValueError, match="one non-negative position"):
        ops.hippo_compress(f, 4, initial_state={"c": c1, "t": torch.tensor([cut, cut + 1])})
    with pytest.raises(ValueError, match=r"keys \['c', 't'\]"):
        ops.hippo_compress(f, 4, initial_state={"c": c1})


def test_lattice_chunked_is_a_deprecated_alias():
    T, m, d = 6, 3, 4
    q, k, v = _rand(1, T, H, m, seed=0), F.normalize(_rand(1, T, H, m, seed=1), dim=-1), _rand(1, T, H, d, seed=2)
    gam = _uniform(1, T, H, seed=3, lo=0.1, hi=0.9)
    y, st = ops.lattice_minibatch(q, k, v, gam, chunk_size=4)
    with pytest.warns(DeprecationWarning, match="lattice_chunked is deprecated; use lattice_minibatch"):
        y_old, (S_old, A_old) = ops.lattice_chunked(q, k, v, gam, chunk_size=4)
    _close(y_old, y, "alias output")
    _close(S_old, st["S"], "alias chunk-start slots")
    _close(A_old, st["A"], "alias update")
    assert "lattice_chunked" not in ops.__all__
