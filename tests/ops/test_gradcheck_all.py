"""``torch.autograd.gradcheck`` (float64, tiny sizes) for every public op in ``seqmem.ops.__all__``, every mode and
backend; and a guard that fails when an op is added to ``seqmem.ops.__all__`` without being listed here, either in
:data:`CASES` (gradchecked) or in :data:`EXEMPT` (with the reason it has no gradient to check), or declared by the
mechanism (its ``gradcheck`` fact, :func:`fact_cases`).

Each case builds its inputs from a fixed seed and returns ``(fn, inputs)``; ``fn(*inputs)`` returns a tensor or a
tuple of tensors (op states that are dicts are flattened to their floating-point tensors)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import seqmem.ops as ops
from seqmem.ops.lattice import _cpp as _lattice_cpp

D64 = torch.float64

#: Public names of ``seqmem.ops`` that are not gradchecked, and why.  Keep every entry commented.
EXEMPT: dict[str, str] = {
    # constants, not functions
    "CONSTRUCTIONS": "tuple of SOE construction names",
    "LATTICE_OBJECTIVES": "tuple of Lattice objective names",
    # constructors whose arguments are integers / Python floats / numpy (no tensor input to differentiate)
    "soe_nodes": "numpy Gauss–Legendre nodes from integer sizes (α-independent)",
    "legs_matrices": "HiPPO-LegS (A, B) from an integer N",
    "legs_transition": "(t1/t2)^A from an integer N and Python floats, computed in numpy",
    "legs_input_kernel": "HiPPO input kernel from integer positions, computed in numpy",
    "legs_block": "(P_i, K̄_i) from integers, computed in numpy",
    "legs_block_bank": "stacked legs_block for integer block indices",
    "legs_blocks": "legs_block for integer block indices, kept across calls",
    "clear_legs_blocks": "frees legs_blocks' kept matrices",
    "sample_fractions": "numpy sample points from a rule name and a count",
    "legs_reconstruction_matrix": "Legendre table at numpy sample fractions",
    "orthonormal_slots": "random orthonormal matrices from integer sizes and a generator",
    "ska_init_state": "zero state from integer sizes",
    # detached by design
    "ska_spectral_scale": "power iteration detached on purpose: a constant for autograd (eq. 12, App. D.2); "
    "test_ska_spectral_scale_is_constant checks that",
    "refine_alpha": "test-time projected gradient descent; returns a detached α and a list of floats",
}


def _rand(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=D64) * scale


def _uniform(*shape: int, seed: int, lo: float = 0.0, hi: float = 1.0) -> torch.Tensor:
    return lo + (hi - lo) * torch.rand(*shape, generator=torch.Generator().manual_seed(seed), dtype=D64)


def _flat(out) -> tuple[torch.Tensor, ...]:
    """An op's return value as a tuple of floating-point tensors (dict states flattened in key order)."""
    if isinstance(out, torch.Tensor):
        return (out,)
    res: list[torch.Tensor] = []
    for o in out:
        if isinstance(o, dict):
            res += [v for _, v in sorted(o.items()) if isinstance(v, torch.Tensor) and v.is_floating_point()]
        elif isinstance(o, tuple | list):
            res += list(_flat(o))
        elif isinstance(o, torch.Tensor) and o.is_floating_point():
            res.append(o)
    return tuple(res)


Case = tuple[str, str, Callable[[], tuple[Callable, tuple[torch.Tensor, ...]]]]
CASES: list[Case] = []


def case(op: str, cid: str):
    def deco(make: Callable[[], tuple[Callable, tuple[torch.Tensor, ...]]]):
        CASES.append((op, cid, make))
        return make

    return deco


def _modes(op: str, modes: tuple[str, ...]):
    """Register the decorated ``make(mode)`` once per mode."""

    def deco(make):
        for mode in modes:
            CASES.append((op, mode, lambda make=make, mode=mode: make(mode)))
        return make

    return deco


# ------------------------------------------------------------------------------------------- core linear-RNN ops
B, T, H = 1, 5, 1


@_modes("linear_attention", ("recurrent", "chunk"))
def _linear_attention(mode):
    q, k, v = (_rand(B, T, H, 2, seed=i) for i in range(3))
    s0 = _rand(B, H, 2, 2, seed=3)
    return (lambda q, k, v, s: ops.linear_attention(q, k, v, initial_state={"S": s}, mode=mode, chunk_size=2)), (
        q, k, v, s0)


@_modes("delta_rule", ("recurrent", "chunk"))
def _delta_rule(mode):
    q, v = _rand(B, T, H, 2, seed=0), _rand(B, T, H, 2, seed=2)
    k = F.normalize(_rand(B, T, H, 2, seed=1), dim=-1)
    beta, s0 = _uniform(B, T, H, seed=4, lo=0.2, hi=0.8), _rand(B, H, 2, 2, seed=3)
    return (lambda q, k, v, b, s: ops.delta_rule(q, k, v, b, initial_state={"S": s}, mode=mode, chunk_size=2)), (
        q, k, v, beta, s0)


@_modes("gated_delta_rule", ("recurrent", "chunk"))
def _gated_delta_rule(mode):
    q, v = _rand(B, T, H, 2, seed=0), _rand(B, T, H, 2, seed=2)
    k = F.normalize(_rand(B, T, H, 2, seed=1), dim=-1)
    beta, s0 = _uniform(B, T, H, seed=4, lo=0.2, hi=0.8), _rand(B, H, 2, 2, seed=3)
    g = -_uniform(B, T, H, seed=5, lo=0.05, hi=0.5)
    return (lambda q, k, v, b, g, s: ops.gated_delta_rule(q, k, v, beta=b, g=g, initial_state={"S": s}, mode=mode,
                                                          chunk_size=2)), (q, k, v, beta, g, s0)


@_modes("ssd", ("recurrent", "chunk"))
def _ssd(mode):
    x, Bm, Cm = _rand(B, T, H, 2, seed=0), _rand(B, T, H, 2, seed=1), _rand(B, T, H, 2, seed=2)
    dt, A = _uniform(B, T, H, seed=3, lo=0.1, hi=0.9), -_uniform(H, seed=4, lo=0.5, hi=1.5)
    s0 = _rand(B, H, 2, 2, seed=5)
    return (lambda x, dt, A, Bm, Cm, s: ops.ssd(x, dt, A, Bm, Cm, initial_state={"S": s}, mode=mode,
                                                chunk_size=2)), (
        x, dt, A, Bm, Cm, s0)


# ------------------------------------------------------------------------------------------------------- VLA
@_modes("vla_attention", ("recurrent", "chunk"))
def _vla_attention(mode):
    q, k, v = (_rand(B, 4, H, 3, seed=i) for i in range(3))
    w_u = _rand(H, 3, 3, seed=3, scale=3**-0.5)
    return (lambda q, k, v, w: ops.vla_attention(q, k, v, w, mode=mode, chunk_size=3, refresh_period=2)), (
        q, k, v, w_u)


VLA_VARIANTS = {"fixed_A": {"fixed_A": True}, "unnormalised_alpha": {"normalize_alpha": False, "lam0": 1.0},
                "no_key_norm": {"normalize_key": False}, "normalizer_none": {"normalizer": "none"}}
for _vname, _vkw in VLA_VARIANTS.items():
    for _mode in ("recurrent", "chunk"):
        @case("vla_attention", f"{_vname}-{_mode}")
        def _vla_variant(kw=_vkw, mode=_mode):
            q, k, v = (_rand(B, 4, H, 3, seed=10 + i) for i in range(3))
            w_u = _rand(H, 3, 3, seed=13, scale=3**-0.5)
            return (lambda q, k, v, w: ops.vla_attention(q, k, v, w, mode=mode, chunk_size=3, **kw)), (q, k, v, w_u)


@_modes("vla_paper_delta_rule", ("recurrent", "chunk"))
def _vla_paper_delta(mode):
    q, k, v = (_rand(B, T, H, 3, seed=i) for i in range(3))
    beta = _uniform(B, T, H, seed=3, lo=0.2, hi=0.8)
    return (lambda q, k, v, b: ops.vla_paper_delta_rule(q, k, v, b, mode=mode, chunk_size=2)), (q, k, v, beta)


@case("vla_jacobian_norm_closed_form", "c")
def _vla_jac():
    return ops.vla_jacobian_norm_closed_form, (torch.tensor([-0.7, -0.2, 0.3, 0.8], dtype=D64),)


for _decay in (False, True):
    @case("vla_generalized_delta_chunk", "decay" if _decay else "no-decay")
    def _vla_gen(decay=_decay):
        q, v = _rand(2, 4, 3, seed=0), _rand(2, 4, 2, seed=3)
        a, b = (F.normalize(_rand(2, 4, 3, seed=s), dim=-1) for s in (1, 2))
        S0 = _rand(2, 2, 3, seed=4)
        if not decay:
            return (lambda q, a, b, v, S0: ops.vla_generalized_delta_chunk(q, a, b, v, S0)), (q, a, b, v, S0)
        log_g = -_uniform(2, 4, seed=5, lo=0.05, hi=0.5)
        return ops.vla_generalized_delta_chunk, (q, a, b, v, S0, log_g)


# ------------------------------------------------------------------------------------------------------- VORT
def _soe_inputs(seed=0, t=6):
    q, k = (_uniform(B, t, H, 2, seed=seed + i, lo=0.1, hi=1.0) for i in range(2))
    v = _rand(B, t, H, 2, seed=seed + 2)
    alpha = _uniform(B, t, seed=seed + 3, lo=0.3, hi=0.9)
    c, xi, cn = ops.soe_coefficients(alpha, 3, 16)
    return q, k, v, c.detach().clone(), xi.detach().clone(), cn.detach().clone()


for _normalizer in ("kernel", "plain"):
    for _strict in (False, True):
        for _mode in ("recurrent", "chunk", "parallel"):
            @case("soe_retention", f"{_normalizer}-{'strict' if _strict else 'incl'}-{_mode}")
            def _soe_retention(normalizer=_normalizer, strict=_strict, mode=_mode):
                q, k, v, c, xi, cn = _soe_inputs()
                xi = xi + 0.05  # keep the ξ = 0 lump away from the boundary of ξ ≥ 0 for the finite differences
                return (lambda q, k, v, c, xi, cn: ops.soe_retention(
                    q, k, v, c, xi, cn, normalizer=normalizer, strict_causal=strict, mode=mode, chunk_size=4)), (
                    q, k, v, c, xi, cn)


for _normalizer in ("kernel", "plain"):
    for _mode in ("recurrent", "chunk"):
        @case("soe_retention", f"{_normalizer}-scaled-keys-{_mode}")
        def _soe_retention_scaled(normalizer=_normalizer, mode=_mode):
            q, k, v, c, xi, cn = _soe_inputs()
            beta = _rand(B, 6, H, seed=7) * 3.0  # key log-scales: gradients flow through e^{β_j − m_i}
            return (lambda q, k, v, c, beta: ops.soe_retention(
                q, k, v, c, xi + 0.05, cn, normalizer=normalizer, mode=mode, chunk_size=4, k_log_scale=beta,
                eps0=1e-3)), (q, k, v, c, beta)


for _scores in ("features", "exact"):
    @case("kv_retention", _scores)
    def _kv_retention(scores=_scores):
        q, k, v, c, xi, cn = _soe_inputs()
        pos = torch.arange(6)
        visible = pos[None, :] <= pos[:, None]
        beta = _rand(B, 6, H, seed=8) * 2.0 if scores == "features" else None
        decay = ops.soe_kernel_matrix(pos, pos, c, xi + 0.05, cn) * visible
        return (lambda q, k, v, d, *b: ops.kv_retention(q, k, v, d, visible, scores=scores,
                                                         k_log_scale=b[0] if b else None, eps0=1e-3)), (
            (q, k, v, decay.detach().clone()) + ((beta,) if beta is not None else ()))


for _mode in ("recurrent", "chunk"):
    @case("local_window_attention", _mode)
    def _local(mode=_mode):
        q, k, v = (_rand(B, 6, H, 2, seed=i) for i in range(3))
        pk, pv = _rand(B, 2, H, 2, seed=3), _rand(B, 2, H, 2, seed=4)
        return (lambda q, k, v, pk, pv: ops.local_window_attention(
            q, k, v, 3, initial_state={"k": pk, "v": pv}, mode=mode, chunk_size=4)), (
            q, k, v, pk, pv)


@_modes("sliding_window_attention", ("recurrent", "chunk", "parallel"))
def _sliding(mode):
    q, k, v = (_rand(B, 7, H, 2, seed=i) for i in range(3))
    pk, pv = _rand(B, 3, H, 2, seed=3), _rand(B, 3, H, 2, seed=4)
    return (lambda q, k, v, pk, pv: ops.sliding_window_attention(
        q, k, v, 3, initial_state={"k": pk, "v": pv}, mode=mode, chunk_size=2)), (
        q, k, v, pk, pv)


for _exact in (False, True):
    @case("retrieval_loss", "gl_kernel" if _exact else "soe_kernel")
    def _retrieval(exact=_exact):
        q, k = _rand(B, 6, H, 2, seed=0), _rand(B, 6, H, 2, seed=1)
        alpha = _uniform(B, 6, seed=2, lo=0.3, hi=0.9)
        source = torch.tensor([[-1, -1, 0, 1, -1, 2]])
        return (lambda q, k, a: ops.retrieval_loss(q, k, a, source, n_terms=4, horizon=16, exact_kernel=exact)), (
            q, k, alpha)


@case("soe_kernel_matrix", "coef-xi-now")
def _soe_kernel_matrix():
    coef, xi, cn = _rand(2, 4, 3, seed=0), _uniform(3, seed=1, lo=0.1, hi=1.0), _rand(2, 4, seed=2)
    t_pos, i_pos = torch.arange(2, 7), torch.arange(1, 5)
    return (lambda c, xi, cn: ops.soe_kernel_matrix(t_pos, i_pos, c, xi, cn)), (coef, xi, cn)


# ----------------------------------------------------------------------------------------- fractional (SOE) math
@case("gl_weights", "alpha")
def _gl_weights():
    return (lambda a: ops.gl_weights(a, torch.arange(6))), (_uniform(3, seed=0, lo=0.2, hi=0.9),)


@case("gl_kernel_sum", "alpha")
def _gl_kernel_sum():
    return (lambda a: ops.gl_kernel_sum(a, 7)), (_uniform(3, seed=0, lo=0.2, hi=0.9),)


# "paper" is not listed: its nodes depend on α, and soe_coefficients documents it as not differentiable in α.
for _cons in ("corrected", "theorem", "paper_legendre"):
    @case("soe_coefficients", _cons)
    def _soe_coef(cons=_cons):
        def fn(a):
            c, _, cn = ops.soe_coefficients(a, 3, 16, construction=cons)
            return c, cn

        return fn, (_uniform(2, seed=0, lo=0.3, hi=0.9),)

    @case("soe_kernel", _cons)
    def _soe_kernel(cons=_cons):
        return (lambda a: ops.soe_kernel(a, torch.arange(5), 3, 16, construction=cons)), (
            _uniform(2, seed=1, lo=0.3, hi=0.9),)


for _printed in (False, True):
    @case("soe_density", "printed" if _printed else "corrected")
    def _soe_density(printed=_printed):
        return (lambda a, lam: ops.soe_density(a, lam, printed=printed)), (
            _uniform(3, 1, seed=0, lo=0.3, hi=0.9), _uniform(4, seed=1, lo=0.2, hi=3.0))


# ------------------------------------------------------------------------------------------------------ HiPPO
for _mode in ("recurrent", "chunk", "direct"):
    @case("hippo_compress", _mode)
    def _hippo_compress(mode=_mode):
        sig, c0, t0 = _rand(1, 5, 2, seed=0), _rand(1, 3, 2, seed=1), torch.tensor([3])
        return (lambda s, c: ops.hippo_compress(s, 3, mode=mode, block_len=2, initial_state={"c": c, "t": t0})), (
            sig, c0)


@case("hippo_reconstruct", "coeffs")
def _hippo_reconstruct():
    return (lambda c: ops.hippo_reconstruct(c, 10.0, "exponential", num=4)), (_rand(1, 3, 2, seed=0),)


@_modes("trapezoidal_attention", ("recurrent", "chunk"))
def _trapezoidal(mode):
    q, k, v = _rand(1, 2, 2, 1, 2, seed=0), _rand(1, 2, 3, 1, 2, seed=1), _rand(1, 2, 3, 1, 2, seed=2)
    km, vm = _rand(1, 2, 2, 1, 2, seed=3), _rand(1, 2, 2, 1, 2, seed=4)
    valid = torch.tensor([[[False, False], [True, True]]])  # block 0: empty memory
    return (lambda q, k, v, km, vm: ops.trapezoidal_attention(q, k, v, km, vm, valid, offset=1, mode=mode)), (
        q, k, v, km, vm)


# ---------------------------------------------------------------------------------------------------- Lattice
def _lattice_inputs(m=2, d=3, t=5, forget=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, t, H, m, generator=g, dtype=D64)
    k = F.normalize(torch.randn(B, t, H, m, generator=g, dtype=D64), dim=-1)
    v = torch.randn(B, t, H, d, generator=g, dtype=D64)
    gam = 0.1 + 0.8 * torch.rand(B, t, H, generator=g, dtype=D64)
    S0 = ops.orthonormal_slots(H, d, m, generator=g, dtype=D64).expand(B, H, d, m).clone()
    mu = 0.5 + 0.5 * torch.rand(B, t, H, generator=g, dtype=D64) if forget else None
    return q, k, v, gam, S0, mu


LATTICE_SCAN_CASES = [("dec", True, None), ("enc", True, None), ("sim", True, None), ("dec", False, None),
                      ("delta", False, None), ("ttt", False, None), ("dec", True, 0.05)]
LATTICE_BACKENDS = ["torch"] + (["cpp"] if _lattice_cpp.available() else [])
for _obj, _norm, _l1 in LATTICE_SCAN_CASES:
    _tag = f"{_obj}{'' if _norm else '-unnormalised'}{'-l1' if _l1 else ''}"
    # the C++ kernel does not do L1 (that combination runs the checkpointed reference step: backend "torch")
    _scans = [("scan", b) for b in LATTICE_BACKENDS if not (_l1 and b == "cpp")]
    for _mode, _backend in [("recurrent", "torch"), *_scans]:
        @case("lattice_scan", f"{_tag}-{_mode}" + (f"-{_backend}" if _mode == "scan" else ""))
        def _lattice_scan(obj=_obj, norm=_norm, l1=_l1, mode=_mode, backend=_backend):
            q, k, v, gam, S0, mu = _lattice_inputs(forget=True)
            return (lambda q, k, v, g, S0, mu: ops.lattice_scan(
                q, k, v, g, {"S": S0}, objective=obj, normalize=norm, forget=mu, l1=l1, mode=mode, chunk_size=2,
                backend=backend)), (q, k, v, gam, S0, mu)

for _obj in ("dec", "enc", "sim"):
    for _mode in ("recurrent", "chunk"):
        @case("lattice_minibatch", f"{_obj}-{_mode}")
        def _lattice_minibatch(obj=_obj, mode=_mode):
            q, k, v, gam, S0, _ = _lattice_inputs(t=6)
            A0 = 0.1 * _rand(*S0.shape, seed=9)  # resumes mid-chunk: a non-zero update, position 1 of 4
            return (lambda q, k, v, g, S0, A0: ops.lattice_minibatch(
                q, k, v, g, {"S": S0, "A": A0, "pos": torch.ones(B, dtype=torch.long)}, objective=obj, chunk_size=4,
                mode=mode)), (q, k, v, gam, S0, A0)

for _obj, _norm in (("dec", True), ("enc", True), ("sim", True), ("delta", False), ("ttt", False)):
    @case("lattice_step", f"{_obj}{'' if _norm else '-unnormalised'}")
    def _lattice_step(obj=_obj, norm=_norm):
        q, k, v, gam, S0, mu = _lattice_inputs(t=1, forget=True)
        return (lambda S, k, v, g, mu: ops.lattice_step(S, k, v, g, objective=obj, normalize=norm, forget=mu)), (
            S0[:, 0], k[:, 0, 0], v[:, 0, 0], gam[:, 0, 0, None].expand(B, 2).clone(), mu[:, 0, 0])


@case("soft_threshold", "x-tau")
def _soft_threshold():
    x = torch.tensor([-1.3, -0.6, -0.1, 0.05, 0.4, 1.1], dtype=D64)  # no |x| near τ = 0.25 (the kinks)
    return ops.soft_threshold, (x, torch.tensor(0.25, dtype=D64))


@case("sphere_retract", "u")
def _sphere_retract():
    return ops.sphere_retract, (_rand(2, 3, 2, seed=0),)


# -------------------------------------------------------------------------------------------------------- SKA
def _ska_stats(seed=0, r=3, P=2, n=2):
    k, v = _rand(1, 8, 1, r, seed=seed), _rand(1, 8, 1, P, seed=seed + 1)
    Gt, M, Cv = ops.ska_statistics(k, v)
    return Gt.detach().clone(), M.detach().clone(), Cv.detach().clone(), _rand(1, 1, r, n, seed=seed + 2)


@case("ska_statistics", "all-tokens")
def _ska_statistics():
    return ops.ska_statistics, (_rand(1, 6, 1, 3, seed=0), _rand(1, 6, 1, 2, seed=1))


@case("ska_statistics", "masked")
def _ska_statistics_masked():
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0, 0.0, 1.0]], dtype=D64)
    return (lambda k, v: ops.ska_statistics(k, v, mask)), (_rand(1, 6, 1, 3, seed=0), _rand(1, 6, 1, 2, seed=1))


@case("ska_ridge_readout", "stats")
def _ska_ridge():
    Gt, _, Cv, q = _ska_stats()
    return ops.ska_ridge_readout, (Gt, Cv, q)


# The spectral scale c = 1/max(σ_max, 1) is detached by design; the statistics here have σ_max < 1 (whitened
# cross-covariance of independent keys), so c = 1 is locally constant and the full gradient is checkable.
for _fn in ("ska_readout", "ska_readout_appf"):
    for _form in ("whitened", "unwhitened"):
        @case(_fn, _form)
        def _ska_readout(fn=_fn, form=_form):
            Gt, M, Cv, q = _ska_stats()
            op = getattr(ops, fn)
            return (lambda Gt, M, Cv, q, eta: op(Gt, M, Cv, q, power=2, eta=eta, operator_form=form)), (
                Gt, M, Cv, q, torch.tensor(1.3, dtype=D64))

for _mode in ("recurrent", "chunk"):
    for _sknorm in ("prefix_max", "seqmax", "none"):
        @case("spectral_koopman_attention", f"{_sknorm}-{_mode}")
        def _ska(mode=_mode, norm=_sknorm):
            q, k, v = _rand(1, 7, 1, 3, seed=0), _rand(1, 7, 1, 3, seed=1), _rand(1, 7, 1, 2, seed=2)
            return (lambda q, k, v: ops.spectral_koopman_attention(q, k, v, chunk_size=3, norm=norm, mode=mode)), (
                q, k, v)


# ------------------------------------------------------------------------------------------------------ tests
def test_every_public_op_is_gradchecked_or_exempt():
    """A new op in ``seqmem.ops.__all__`` must be added to CASES (gradcheck) or EXEMPT (with a reason)."""
    public = set(ops.__all__)
    checked = {op for op, _, _ in CASES + fact_cases()}
    assert not checked & set(EXEMPT), f"listed both as checked and exempt: {sorted(checked & set(EXEMPT))}"
    missing = public - checked - set(EXEMPT)
    assert not missing, (f"seqmem.ops exports {sorted(missing)} without a gradcheck: add a case to "
                         "tests/ops/test_gradcheck_all.py, or an EXEMPT entry saying why it has no gradient")
    stale = ({op for op, _, _ in CASES} | set(EXEMPT)) - public
    assert not stale, f"tests/ops/test_gradcheck_all.py lists names not in seqmem.ops.__all__: {sorted(stale)}"
    assert all(reason.strip() for reason in EXEMPT.values())


def _check(op: str, cid: str, make, fast: bool) -> None:
    fn, inputs = make()
    inputs = tuple(x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs)
    assert all(x.dtype == D64 for x in inputs if x.is_floating_point())
    out = _flat(fn(*inputs))
    assert out and all(torch.isfinite(o).all() for o in out), f"{op}[{cid}]: non-finite output"
    # outputs that do not depend on the inputs (e.g. SKA's norm state with norm="none") are left out: fast-mode
    # gradcheck (torch 2.x) misaligns outputs when some do not require grad
    keep = [i for i, o in enumerate(out) if o.requires_grad]
    assert keep, f"{op}[{cid}]: no output depends on the inputs"

    def checked(*a: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs = _flat(fn(*a))
        return tuple(outs[i] for i in keep)

    # the undefined-output-gradient check runs one extra backward per output: full mode only (slow marker)
    assert torch.autograd.gradcheck(checked, inputs, eps=1e-6, atol=1e-5, rtol=1e-4, fast_mode=fast,
                                    check_undefined_grad=not fast)


def fact_cases() -> list[Case]:
    """The cases mechanisms declare next to their code: ``facts={"gradcheck": {"op/case": make}}`` at ``register``
    (or on the class's ``facts``), ``make()`` returning ``(fn, float64 inputs)`` like the cases above."""
    from seqmem.registry import list_mixers, mixer_facts

    return [(key.split("/")[0], f"{name}:{key}", make) for name in list_mixers()
            for key, make in mixer_facts(name).get("gradcheck", {}).items()]


ALL_CASES = CASES + fact_cases()
IDS = [f"{op}[{cid}]" for op, cid, _ in ALL_CASES]


@pytest.mark.parametrize("op,cid,make", ALL_CASES, ids=IDS)
def test_gradcheck(op, cid, make):
    """Fast mode: the analytical and finite-difference Jacobians agree along random directions ``vᵀ J u``
    (one backward and two forwards per input instead of one per input element; a wrong gradient fails it
    with probability one)."""
    _check(op, cid, make, fast=True)


@pytest.mark.slow
@pytest.mark.parametrize("op,cid,make", ALL_CASES, ids=IDS)
def test_gradcheck_full_jacobian(op, cid, make):
    """The full Jacobian, element by element (minutes on one core)."""
    _check(op, cid, make, fast=False)


def test_ska_spectral_scale_is_constant():
    """The exempt spectral scale really is detached (a constant for autograd), and ≤ 1."""
    A = _rand(2, 4, 4, seed=0, scale=2.0).requires_grad_(True)
    c = ops.ska_spectral_scale(A)
    assert not c.requires_grad and (c <= 1).all() and (c > 0).all()


def test_refine_alpha_returns_detached_alpha():
    """The exempt refine_alpha returns a detached α (it is an optimiser, not a differentiable op)."""
    a0 = torch.full((1, 4), 0.5, dtype=D64, requires_grad=True)
    a, hist = ops.refine_alpha(a0, lambda a: ((a - 0.8) ** 2).sum(), steps=3)
    assert not a.requires_grad and len(hist) == 4 and hist[-1] < hist[0]
