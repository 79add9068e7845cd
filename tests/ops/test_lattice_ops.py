"""Lattice ops: closed-form updates vs autograd, the sphere projection, Prop. 3.1, the forget-gate finding,
reference loop == fast scan (C++ and PyTorch backends, outputs and gradients), the mini-batch approximation."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_rel_close
from seqmem.ops.lattice import _cpp as _lattice_cpp
from seqmem.ops.lattice import (
    lattice_minibatch,
    lattice_scan,
    lattice_step,
    orthonormal_slots,
    soft_threshold,
    sphere_retract,
)

D64 = torch.float64


def _rand(*shape, g, dtype=D64):
    return torch.randn(*shape, generator=g, dtype=dtype)


def _loss(objective: str, S, k, v):
    """The ½-losses of the paper (eqs. 6, 9, 11, 19, 20) as functions of the state S (d, m)."""
    phi = S / S.norm(dim=0, keepdim=True)
    if objective == "dec":
        return 0.5 * (phi @ k - v).pow(2).sum()
    if objective == "enc":
        return 0.5 * (phi.T @ v - k).pow(2).sum()
    if objective == "sim":
        return -(phi.T @ v) @ k
    if objective == "ttt":
        z = S @ k
        return 0.5 * (z / z.norm() - v).pow(2).sum()
    if objective == "delta":
        return 0.5 * (S @ k - v).pow(2).sum()
    raise AssertionError(objective)


# ---------------------------------------------------------------------------------------------------------------
# closed forms (eqs. 7, 8, 10/21, 12, 13, 19, 20) against autograd
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("objective", ["dec", "enc", "sim", "ttt", "delta"])
def test_closed_form_step_is_one_gradient_step(objective):
    g = torch.Generator().manual_seed(1)
    d, m = 7, 5
    S = _rand(d, m, g=g) * (0.5 + torch.rand(m, generator=g, dtype=D64))  # slots of any norm
    k, v = _rand(m, g=g), _rand(d, g=g)
    gamma = 0.37
    Sg = S.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(_loss(objective, Sg, k, v), Sg)
    step = lattice_step(S, k, v, torch.full((m,), gamma, dtype=D64), objective=objective, normalize=False)
    assert_rel_close(step, S - gamma * grad, 1e-13, f"{objective}: closed form vs autograd")
    assert (step - S).abs().max() > 1e-3  # the step moves the state


@pytest.mark.parametrize("objective", ["dec", "enc", "sim"])
def test_gradient_is_tangent_to_every_slot(objective):
    """Scale invariance of the column-normalised losses: s_iᵀ ∂L/∂s_i = 0 (so the update is orthogonal)."""
    g = torch.Generator().manual_seed(2)
    S = _rand(6, 4, g=g).requires_grad_(True)
    (grad,) = torch.autograd.grad(_loss(objective, S, _rand(4, g=g), _rand(6, g=g)), S)
    radial = (grad * S.detach()).sum(0)
    assert radial.abs().max() < 1e-13 * grad.abs().max()
    assert grad.abs().max() > 1e-3


def test_jacobian_of_column_normalisation_eq8():
    s = torch.randn(5, dtype=D64)
    J = torch.autograd.functional.jacobian(lambda x: x / x.norm(), s)
    P = torch.eye(5, dtype=D64) - torch.outer(s, s) / s.dot(s)
    assert_rel_close(J, P / s.norm(), 1e-14, "J_phi = P(s)/|s|")


def test_delta_special_case_eq20():
    g = torch.Generator().manual_seed(3)
    S, k, v = _rand(5, 4, g=g), _rand(4, g=g), _rand(5, g=g)
    gam = 0.3
    out = lattice_step(S, k, v, torch.full((4,), gam, dtype=D64), objective="delta", normalize=False)
    expect = S @ (torch.eye(4, dtype=D64) - gam * torch.outer(k, k)) + gam * torch.outer(v, k)
    assert_rel_close(out, expect, 1e-14, "S(I - γkkᵀ) + γvkᵀ")


# ---------------------------------------------------------------------------------------------------------------
# the sphere projection (eq. 14) and Prop. 3.1
# ---------------------------------------------------------------------------------------------------------------
def test_sphere_projection_beta_formula_and_pythagoras():
    g = torch.Generator().manual_seed(4)
    S = orthonormal_slots(1, 8, 6, generator=g, dtype=D64)[0]
    h = _rand(8, g=g)
    w = _rand(6, g=g)
    dS = -(h[:, None] * w[None] - S * ((S.T @ h) * w)[None])  # column i: −w_i P(s_i) h
    assert (dS * S).sum(0).abs().max() < 1e-14  # Δs_i ⊥ s_i
    U = S + dS
    assert_rel_close(U.norm(dim=0) ** 2, 1 + dS.norm(dim=0) ** 2, 1e-14, "Pythagoras")
    beta = (1 + dS.norm(dim=0) ** 2) ** -0.5
    assert_rel_close(sphere_retract(U), beta * U, 1e-15, "β-formula == exact renormalisation")


@pytest.mark.parametrize("dtype,steps,tol", [(torch.float64, 2000, 1e-12), (torch.float32, 10000, 2e-6)])
def test_slots_stay_unit_norm(dtype, steps, tol):
    g = torch.Generator().manual_seed(5)
    B, H, d, m = 1, 2, 6, 4
    q = torch.randn(B, steps, H, m, generator=g, dtype=dtype)
    k = torch.nn.functional.normalize(torch.randn(B, steps, H, m, generator=g, dtype=dtype), dim=-1)
    v = torch.randn(B, steps, H, d, generator=g, dtype=dtype)
    gam = torch.rand(B, steps, H, generator=g, dtype=dtype)
    for obj in ("dec", "enc", "sim"):
        S = lattice_scan(q, k, v, gam, objective=obj, chunk_size=256)[1]["S"]
        assert (S.norm(dim=-2) - 1).abs().max() < tol, obj


def test_prop31_retraction_is_second_order():
    """R_s(τu) = (s+τu)/‖s+τu‖ vs the exponential map cos τ s + sin τ u: error O(τ³) (×8 per halving)."""
    g = torch.Generator().manual_seed(6)
    s = torch.nn.functional.normalize(_rand(9, g=g), dim=0)
    u = _rand(9, g=g)
    u = u - s * s.dot(u)
    u = u / u.norm()
    errs = []
    for tau in (0.1, 0.05, 0.025, 0.0125):
        r = sphere_retract((s + tau * u)[:, None])[:, 0]
        t = torch.tensor(tau, dtype=D64)
        errs.append(float((r - (torch.cos(t) * s + torch.sin(t) * u)).norm()))
    ratios = [a / b for a, b in zip(errs, errs[1:])]
    assert all(7.5 < r < 8.5 for r in ratios), ratios
    # first order: d/dτ R_s(τu)|₀ = u, and R_s(0) = s
    eps = 1e-6
    fd = (sphere_retract((s + eps * u)[:, None])[:, 0] - sphere_retract((s - eps * u)[:, None])[:, 0]) / (2 * eps)
    assert_rel_close(fd, u, 1e-8, "dR/dτ at 0")
    assert_rel_close(sphere_retract(s[:, None])[:, 0], s, 1e-15, "R_s(0) = s")


@pytest.mark.parametrize("objective", ["dec", "enc", "sim"])
def test_small_step_decreases_the_loss(objective):
    g = torch.Generator().manual_seed(7)
    fails = 0
    for _ in range(20):
        S = orthonormal_slots(1, 6, 4, generator=g, dtype=D64)[0]
        k, v = _rand(4, g=g), _rand(6, g=g)
        S2 = lattice_step(S, k, v, torch.full((4,), 1e-3, dtype=D64), objective=objective)
        fails += int(_loss(objective, S2, k, v) >= _loss(objective, S, k, v))
    assert fails == 0


@pytest.mark.parametrize("objective", ["dec", "enc", "sim"])
def test_forget_gate_equals_step_rescaling_under_projection(objective):
    """Note §2.7 finding: P_C(μ s + Δ(γ)) = P_C(s + Δ(γ/μ)) — the forget gate (eq. 16) is redundant under (14)."""
    g = torch.Generator().manual_seed(8)
    S = orthonormal_slots(3, 6, 5, generator=g, dtype=D64)
    k, v = _rand(3, 5, g=g), _rand(3, 6, g=g)
    gam = torch.rand(3, 5, generator=g, dtype=D64)
    mu = 0.2 + 0.8 * torch.rand(3, generator=g, dtype=D64)
    a = lattice_step(S, k, v, gam, objective=objective, forget=mu)
    b = lattice_step(S, k, v, gam / mu[:, None], objective=objective)
    assert_rel_close(a, b, 1e-14, "forget gate vs rescaled step")
    c = lattice_step(S, k, v, gam, objective=objective)
    assert (a - c).abs().max() > 1e-3  # the gate does change the step (it is not a no-op)


def test_soft_threshold_is_the_l1_prox():
    y = torch.linspace(-2, 2, 41, dtype=D64)
    tau = 0.3
    grid = torch.linspace(-3, 3, 60001, dtype=D64)
    brute = grid[(0.5 * (grid[None] - y[:, None]) ** 2 + tau * grid[None].abs()).argmin(1)]
    assert (soft_threshold(y, tau) - brute).abs().max() < 2e-4


# ---------------------------------------------------------------------------------------------------------------
# reference loop == fast scan
# ---------------------------------------------------------------------------------------------------------------
def _inputs(B, T, H, m, d, dtype, per_slot=False, forget=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, m, generator=g, dtype=dtype)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, m, generator=g, dtype=dtype), dim=-1)
    v = torch.randn(B, T, H, d, generator=g, dtype=dtype)
    gam = torch.rand(B, T, H, *([m] if per_slot else []), generator=g, dtype=dtype)
    mu = 0.5 + 0.5 * torch.rand(B, T, H, generator=g, dtype=dtype) if forget else None
    S0 = orthonormal_slots(H, d, m, generator=g, dtype=dtype).expand(B, H, d, m).clone()
    return [x if x is None else x.requires_grad_(True) for x in (q, k, v, gam, mu, S0)]


FAST_CASES = [
    ("dec", True, None), ("enc", True, None), ("sim", True, None), ("delta", False, None),
    ("dec", False, None), ("enc", False, None), ("sim", False, None), ("ttt", False, None), ("dec", True, 0.05),
]  # fmt: skip
BACKENDS = ["torch"] + (["cpp"] if _lattice_cpp.available() else [])


@pytest.mark.parametrize("objective,normalize,l1", FAST_CASES)
@pytest.mark.parametrize("per_slot,forget", [(False, False), (True, True)])
@pytest.mark.parametrize("backend", BACKENDS)
def test_scan_equals_reference_float64(objective, normalize, l1, per_slot, forget, backend):
    if backend == "cpp" and l1 is not None:
        pytest.skip("L1 runs the checkpointed scan")
    B, T, H, m, d = 2, 19, 2, 4, 5
    q, k, v, gam, mu, S0 = _inputs(B, T, H, m, d, D64, per_slot, forget)
    ins = [x for x in (q, k, v, gam, mu, S0) if x is not None]
    g = torch.Generator().manual_seed(9)
    wy, wS = torch.randn(B, T, H, d, generator=g, dtype=D64), torch.randn(B, H, d, m, generator=g, dtype=D64)
    res = {}
    for mode in ("recurrent", "scan"):
        y, st = lattice_scan(q, k, v, gam, {"S": S0}, objective=objective, normalize=normalize, forget=mu, l1=l1,
                             mode=mode, chunk_size=5, backend=backend)  # fmt: skip
        S = st["S"]
        grads = torch.autograd.grad((y * wy).sum() + (S * wS).sum(), ins)
        res[mode] = (y, S, grads)
    (yr, Sr, gr), (yf, Sf, gf) = res["recurrent"], res["scan"]
    assert yr.abs().max() > 1e-3
    assert_rel_close(yf, yr, 1e-12, "y")
    assert_rel_close(Sf, Sr, 1e-12, "S_T")
    for a, b in zip(gf, gr):
        assert_rel_close(a, b, 1e-11, "gradient")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("objective", ["dec", "enc", "sim"])
def test_scan_equals_reference_float32(backend, objective):
    B, T, H, m, d = 2, 33, 2, 8, 8
    q, k, v, gam, _, S0 = _inputs(B, T, H, m, d, torch.float32)
    out = {}
    for mode in ("recurrent", "scan"):
        y, S = lattice_scan(q, k, v, gam, {"S": S0}, objective=objective, mode=mode, chunk_size=8, backend=backend)
        out[mode] = (y, S, torch.autograd.grad(y.pow(2).sum(), [q, k, v, gam]))
    assert_rel_close(out["scan"][0], out["recurrent"][0], 1e-5, "y f32")
    for a, b in zip(out["scan"][2], out["recurrent"][2]):
        assert_rel_close(a, b, 1e-4, "grad f32")


def test_gradcheck_tiny():
    q, k, v, gam, mu, S0 = _inputs(1, 6, 1, 3, 4, D64, per_slot=True, forget=True)
    for backend in BACKENDS:
        assert torch.autograd.gradcheck(
            lambda *a, be=backend: lattice_scan(*a[:4], {"S": a[5]}, forget=a[4], chunk_size=4, backend=be)[0],
            (q, k, v, gam, mu, S0),
        )


def test_scan_is_causal_and_streams():
    q, k, v, gam, _, S0 = _inputs(2, 30, 2, 4, 4, D64)
    y, S = lattice_scan(q, k, v, gam, {"S": S0}, chunk_size=7)
    y1, S1 = lattice_scan(q[:, :13], k[:, :13], v[:, :13], gam[:, :13], {"S": S0}, chunk_size=7)
    y2, S2 = lattice_scan(q[:, 13:], k[:, 13:], v[:, 13:], gam[:, 13:], S1, chunk_size=7)
    assert_rel_close(torch.cat([y1, y2], 1), y, 1e-13, "two pieces")
    assert_rel_close(S2["S"], S["S"], 1e-13, "final state")
    with pytest.warns(DeprecationWarning, match=r"\{'S': tensor\}"):  # the former bare-tensor state
        y_old, S_old = lattice_scan(q, k, v, gam, S0, chunk_size=7)
    assert_rel_close(y_old, y, 1e-15, "bare tensor state")
    v2 = v.detach().clone()
    v2[:, 20:] += 1.0
    y3, _ = lattice_scan(q, k, v2, gam, {"S": S0})
    assert_rel_close(y3[:, :20], y[:, :20], 1e-14, "future input changed the past")
    assert (y3[:, 20:] - y[:, 20:]).abs().max() > 1e-3


def test_fast_scan_memory_is_chunk_frugal():
    """The scan's autograd keeps the inputs and one state per chunk, not one state per token."""
    B, T, H, m, d = 1, 256, 2, 32, 32
    q, k, v, gam, _, S0 = _inputs(B, T, H, m, d, torch.float32)
    saved = {}
    for mode in ("recurrent", "scan"):
        total = [0]

        def pack(t, total=total):
            total[0] += t.numel()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y, _ = lattice_scan(q, k, v, gam, {"S": S0}, mode=mode, chunk_size=32)
        saved[mode] = total[0]
    per_token_states = T * B * H * d * m
    assert saved["recurrent"] > per_token_states  # autograd through the loop keeps every state
    assert saved["scan"] < 0.25 * per_token_states, saved


# ---------------------------------------------------------------------------------------------------------------
# mini-batch approximation (docs/lattice.md)
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("objective", ["dec", "enc", "sim"])
def test_minibatch_with_chunk_one_is_exact_and_larger_chunks_differ(objective):
    q, k, v, gam, _, S0 = _inputs(2, 24, 2, 4, 6, D64)
    y, S = lattice_scan(q, k, v, gam, {"S": S0}, objective=objective)
    y1, st1 = lattice_minibatch(q, k, v, gam, _mb_state(S0), objective=objective, chunk_size=1)
    assert_rel_close(y1, y, 1e-12, "C=1")
    assert_rel_close(sphere_retract(st1["S"] + st1["A"]), S["S"], 1e-12, "C=1 state")
    y4, _ = lattice_minibatch(q, k, v, gam, _mb_state(S0), objective=objective, chunk_size=4)
    y4, y = y4.detach(), y.detach()
    assert float((y4 - y).abs().max() / y.abs().max()) > 1e-3  # a different model


def _mb_state(S0, pos=0):
    """A lattice_minibatch state at the start of a chunk: slots S0, no update, ``pos`` tokens seen."""
    return {"S": S0, "A": torch.zeros_like(S0), "pos": torch.full((S0.shape[0],), pos)}


def test_minibatch_streams_across_partial_chunks():
    q, k, v, gam, _, S0 = _inputs(1, 21, 2, 4, 4, D64)
    y, full = lattice_minibatch(q, k, v, gam, _mb_state(S0), chunk_size=6)
    ya, sta = lattice_minibatch(q[:, :9], k[:, :9], v[:, :9], gam[:, :9], _mb_state(S0), chunk_size=6)
    yb, stb = lattice_minibatch(q[:, 9:], k[:, 9:], v[:, 9:], gam[:, 9:], sta, chunk_size=6)
    assert_rel_close(torch.cat([ya, yb], 1), y, 1e-13, "minibatch split")
    assert_rel_close(stb["S"], full["S"], 1e-13, "chunk-start state")


# ---------------------------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------------------------
_DEVICE_CHECK = """
import torch, seqmem.ops as O
q = torch.randn(1, 3, 1, 4); k = torch.nn.functional.normalize(torch.randn(1, 3, 1, 4), dim=-1)
v = torch.randn(1, 3, 1, 4); g = torch.rand(1, 3, 1)
_, st = O.lattice_scan(q, k, v, g)
meta = {"v": dict(v=v.to("meta")), "gamma": dict(gamma=g.to("meta")),
        "state": dict(initial_state={"S": st["S"].to("meta")})}
for name, change in meta.items():
    for op, backends in ((O.lattice_scan, ("cpp", "torch", "auto")), (O.lattice_minibatch, (None,))):
        for backend in backends:
            a = {**dict(q=q, k=k, v=v, gamma=g), **change, **({"backend": backend} if backend else {})}
            try:
                op(**a)
            except ValueError as e:
                assert f"{op.__name__}: all tensors must be on one device" in str(e), (name, e)
            else:
                raise AssertionError(f"{op.__name__} accepted {name} on another device")
try:
    O.lattice_minibatch(q, k, v, g, initial_state={"S": st["S"], "A": st["S"].to("meta"),
                                                   "pos": torch.zeros(1, dtype=torch.long)})
except ValueError as e:
    assert "lattice_minibatch: all tensors must be on one device" in str(e), e
else:
    raise AssertionError("lattice_minibatch accepted its update on another device")
print("ok")
"""


def test_tensors_on_another_device_are_refused_before_any_kernel():
    """v, gamma or the state on another device than k went to the C++ kernel (which checked k's device only) and
    crashed the process (a segfault); every tensor's device is checked first, a ValueError naming the op.  Run in
    a subprocess so that a crash fails this test instead of the test runner."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", _DEVICE_CHECK], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stdout[-500:]} {r.stderr[-2000:]}"
    assert r.stdout.strip().endswith("ok")


def test_bad_inputs_raise():
    q, k, v, gam, _, S0 = _inputs(1, 5, 1, 4, 4, D64)
    with pytest.raises(ValueError, match="m <= d"):
        orthonormal_slots(1, 3, 4)
    with pytest.raises(ValueError, match="no exact chunk form"):
        lattice_scan(q, k, v, gam, mode="chunk")
    with pytest.raises(ValueError, match="objective"):
        lattice_scan(q, k, v, gam, objective="pca")
    with pytest.raises(ValueError, match="m <= d"):
        lattice_scan(q, k, v[..., :3], gam)
    with pytest.raises(ValueError, match="gamma"):
        lattice_scan(q, k, v, gam[:, :3])
    with pytest.raises(ValueError, match="initial_state"):
        lattice_scan(q, k, v, gam, {"S": S0[:, :, :2]})
    with pytest.raises(ValueError, match="keys"):
        lattice_scan(q, k, v, gam, {"S0": S0})
    with pytest.raises(ValueError, match="chunk_size"):
        lattice_scan(q, k, v, gam, chunk_size=0)
    with pytest.raises(ValueError, match="backend"):
        lattice_scan(q, k, v, gam, backend="cuda")
    with pytest.raises(ValueError, match="l1"):
        lattice_scan(q, k, v, gam, l1=-1.0)
    with pytest.raises(ValueError, match="cpp"):
        lattice_scan(q, k, v, gam, objective="dec", l1=0.1, backend="cpp")


@pytest.mark.parametrize("mode", ["recurrent", "scan"])
def test_options_outside_the_papers_equations_are_refused(mode):
    """ttt and delta took the sphere projection by default (eqs. 19-20 have none: y off by up to 8.6); m > d
    without normalize started from empty identity slots (|y| ~ 1e11); an empty initial slot, or μ outside [0, 1],
    was taken silently."""
    q, k, v, gam, _, S0 = _inputs(1, 5, 1, 4, 4, D64)
    for objective in ("ttt", "delta"):
        with pytest.raises(ValueError, match=rf"objective='{objective}' \(eq. \d+\) has no sphere projection"):
            lattice_scan(q, k, v, gam, objective=objective, mode=mode)
        lattice_scan(q, k, v, gam, objective=objective, normalize=False, mode=mode)  # fine
    for objective in ("dec", "enc", "sim"):
        with pytest.raises(ValueError, match="m <= d"):
            lattice_scan(q, k, v[..., :3], gam, objective=objective, normalize=False, mode=mode)
    empty = S0.detach().clone()
    empty[..., 1] = 0
    with pytest.raises(ValueError, match=r"initial_state\['S'\]'s slot norms must be > 0 without normalize"):
        lattice_scan(q, k, v, gam, {"S": empty}, normalize=False, mode=mode)
    lattice_scan(q, k, v, gam, {"S": empty}, mode=mode)  # with normalize the slot is restarted by its first step
    for mu in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"forget must be in \[0, 1\]"):
            lattice_scan(q, k, v, gam, forget=torch.full((1, 5, 1), mu, dtype=D64), mode=mode)


@pytest.mark.parametrize("normalize", [False, True])
def test_a_non_default_eps_is_honoured_by_the_scan(normalize):
    """The fused forms (C++, Triton, the PyTorch hand-VJP scan) compute with eps = 1e-12; another eps (a slot of
    norm below it is empty) once ran there silently with 1e-12, so the scan and the reference disagreed.  It now
    runs the checkpointed form under ``"auto"`` and ``"torch"``, and the fused backends refuse it."""
    q, k, v, gam, _, S0 = _inputs(1, 7, 1, 3, 4, D64)
    with torch.no_grad():
        S0[..., 0] *= 1e-4  # a slot between 1e-12 and eps = 1e-3: empty for eps = 1e-3, not for the default
    ins = [q, k, v, gam, S0]
    out = {}
    for mode in ("recurrent", "scan"):
        y, st = lattice_scan(q, k, v, gam, {"S": S0}, normalize=normalize, eps=1e-3, mode=mode, chunk_size=3)
        out[mode] = (y, st["S"], torch.autograd.grad(y.sum() + st["S"].sum(), ins))
    (y, S, g), (yf, Sf, gf) = out["recurrent"], out["scan"]
    assert_rel_close(yf, y, 1e-12, "y")
    assert_rel_close(Sf, S, 1e-12, "S_T")
    for a, b in zip(gf, g):
        assert_rel_close(a, b, 1e-11, "gradient")
    y12, _ = lattice_scan(q, k, v, gam, {"S": S0}, normalize=normalize, mode="recurrent")
    assert (y12 - y).abs().max() > 1e-6  # the eps matters for this input
    for backend in ("cpp", "triton"):
        with pytest.raises(ValueError, match="computes with eps = 1e-12"):
            lattice_scan(q, k, v, gam, {"S": S0}, normalize=normalize, eps=1e-3, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("objective", ["dec", "enc", "sim"])
def test_a_slot_emptied_mid_sequence_takes_no_step(objective, backend):
    """Without normalize, a slot emptied mid-sequence (μ_t = 0 and k_i = 0 for dec/sim, or the L1 prox) has no
    φ(s_i) = s_i/‖s_i‖: its step was γc_i/1e-12 · P h (|y| ~ 1e11).  It now reads nothing and takes no step, the
    same in the reference, the fused scan and the checkpointed L1 scan, outputs and gradients."""
    B, T, H, m, d = 1, 9, 1, 3, 4
    q, k, v, gam, mu, S0 = _inputs(B, T, H, m, d, D64, False, True)
    with torch.no_grad():
        mu[:, 3] = 0.0  # U = μ S − γ∇ = −γ∇ at t = 3 ...
        k[:, 3, :, 0] = 0.0 if objective != "enc" else k[:, 3, :, 0]
    ins = [q, k, v, gam, mu, S0]
    kw = dict(objective=objective, normalize=False, forget=mu, chunk_size=4)
    if objective == "enc":  # ENC's c_i = φ_iᵀv − k_i: empty the slot with the L1 prox instead (λ_3 huge)
        kw["l1"] = torch.cat([torch.zeros(B, 3, H), torch.full((B, 1, H), 1e6), torch.zeros(B, T - 4, H)], 1).to(D64)
    res = {}
    for mode in ("recurrent", "scan"):
        if backend == "cpp" and "l1" in kw and mode == "scan":
            continue  # L1 runs the checkpointed scan only
        y, st = lattice_scan(q, k, v, gam, {"S": S0}, mode=mode, backend=backend, **kw)
        grads = torch.autograd.grad(y.sum() + st["S"].sum(), ins)
        res[mode] = (y, st["S"], grads)
    y, S, grads = res["recurrent"]
    assert torch.isfinite(y).all() and y.abs().max() < 1e3 and all(torch.isfinite(x).all() for x in grads)
    assert S[..., 0].abs().max() == 0 or objective == "enc"  # dec/sim: the emptied slot stays empty
    if objective == "enc":
        assert S.abs().max() == 0  # the huge threshold empties every slot, and none takes a step again
    if "scan" in res:
        yf, Sf, gf = res["scan"]
        assert_rel_close(yf, y, 1e-12, "y")
        assert_rel_close(Sf, S, 1e-12, "S_T")
        for a, b in zip(gf, grads):
            assert_rel_close(a, b, 1e-11, "gradient")


@pytest.mark.parametrize("mode", ["recurrent", "scan"])
def test_l1_gamma_and_eps_are_checked_as_numbers_and_as_tensors(mode):
    """A negative l1 was refused as a float but taken as a tensor (eq. 18's threshold γλ < 0 grows every entry
    instead of shrinking it); NaN / inf γ or λ numbers, inf γ or λ tensors, and eps <= 0 or non-finite (the norm
    clamp) passed silently.  A NaN in a γ or λ tensor propagates (the library's NaN policy for data)."""
    q, k, v, gam, _, S0 = (x if x is None else x.detach() for x in _inputs(1, 5, 1, 4, 4, D64))
    lam = torch.full((1, 5, 1), 0.1, dtype=D64)
    for bad, got in ((-0.2, r"values in \[-0.2, 0.1\]"), (float("inf"), "inf"), (-float("inf"), "inf")):
        lb = lam.clone()
        lb[0, 2, 0] = bad
        with pytest.raises(ValueError, match=rf"lattice_scan: l1 must be finite and >= 0 \(eq. 18's λ_t\), "
                                             rf"got .*{got}"):
            lattice_scan(q, k, v, gam, l1=lb, mode=mode)
        if bad != -0.2:
            gb = gam.clone()
            gb[0, 2, 0] = bad
            with pytest.raises(ValueError, match=r"lattice_scan: gamma must be finite, got .*inf"):
                lattice_scan(q, k, v, gb, mode=mode)
    gb, lb = gam.clone(), lam.clone()
    gb[0, 2, 0] = lb[0, 3, 0] = float("nan")
    assert lattice_scan(q, k, v, gb, l1=lb, mode=mode)[0].isnan().any()  # NaN data: propagated, not refused
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=rf"lattice_scan: l1 must be a finite number >= 0, got {bad!r}"):
            lattice_scan(q, k, v, gam, l1=bad, mode=mode)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match=rf"lattice_scan: gamma must be a finite number, got {bad!r}"):
            lattice_scan(q, k, v, bad, mode=mode)
    for bad in (0.0, -1e-12, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=rf"lattice_scan: eps must be a finite number > 0, got {bad!r}"):
            lattice_scan(q, k, v, gam, eps=bad, mode=mode)
    with pytest.raises(ValueError, match=r"lattice_scan: l1 must be a floating-point tensor"):
        lattice_scan(q, k, v, gam, l1=torch.zeros(1, 5, 1, dtype=torch.long), mode=mode)
    with pytest.raises(ValueError, match=r"lattice_minibatch: gamma must be finite"):
        lattice_minibatch(q, k, v, torch.full_like(gam, float("inf")), _mb_state(S0), chunk_size=2)
    y0, _ = lattice_scan(q, k, v, gam, l1=torch.zeros_like(lam), mode=mode)  # λ = 0 is allowed: no shrinkage
    y1, _ = lattice_scan(q, k, v, gam, mode=mode)
    assert_rel_close(y0, y1, 1e-12, "l1 = 0 is no L1 step")


@pytest.mark.parametrize("objective", ["dec", "enc", "sim"])
@pytest.mark.parametrize("dtype,tol", [(D64, 1e-11), (torch.float32, 2e-4)])
def test_minibatch_recurrent_reference_equals_chunk_form(objective, dtype, tol):
    """mode="recurrent" (naive.py, one token at a time) ≡ the chunked products: outputs, states, gradients,
    from a mid-chunk state (offset and a non-zero accumulated update)."""
    q, k, v, gam, _, S0 = _inputs(2, 17, 2, 4, 6, D64)
    _, sta = lattice_minibatch(q[:, :3], k[:, :3], v[:, :3], gam[:, :3], _mb_state(S0), objective=objective,
                               chunk_size=5)  # fmt: skip
    sta = {n: t.to(dtype) if t.is_floating_point() else t for n, t in sta.items()}
    args = [x[:, 3:].to(dtype).clone().requires_grad_(True) for x in (q, k, v, gam)]
    outs = {}
    for mode in ("recurrent", "chunk"):
        y, st = lattice_minibatch(*args, sta, objective=objective, chunk_size=5, mode=mode)
        S, A = st["S"], st["A"]
        grads = torch.autograd.grad((y * torch.linspace(-1, 1, y.shape[-1], dtype=dtype)).sum() + S.sum() + A.sum(),
                                    args)  # fmt: skip
        outs[mode] = (y, S, A, grads)
    for what, a, b in zip(("y", "S", "A"), outs["recurrent"][:3], outs["chunk"][:3]):
        assert_rel_close(a, b, tol, what)
    for i, (a, b) in enumerate(zip(outs["recurrent"][3], outs["chunk"][3])):
        assert_rel_close(a, b, tol, f"grad {i}")
    with pytest.raises(ValueError, match="mode"):
        lattice_minibatch(*args, sta, mode="scan")


def test_output_dtype_is_k_and_v_promoted():
    """docs/ops.md: lattice_scan's y has the promoted dtype of k and v (not v's alone, as ops.md said)."""
    q, k, v, gam, _, _ = _inputs(1, 4, 1, 4, 4, torch.float32)
    assert lattice_scan(q, k, v.bfloat16(), gam)[0].dtype == torch.float32
    assert lattice_scan(q.bfloat16(), k.bfloat16(), v.bfloat16(), gam)[0].dtype == torch.bfloat16
