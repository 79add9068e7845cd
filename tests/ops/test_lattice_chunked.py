"""lattice_chunked (mini-batch Lattice, docs/lattice.md): the cheap form (no per-token (C, N, d, m) states) equals the
dense per-token-state form and the mixer's per-token loop, outputs and gradients, in float64 and float32."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_rel_close, rel_err
from seqmem.ops import lattice as L
from seqmem.ops.lattice.minibatch import _lattice_chunked, lattice_chunked

D64 = torch.float64


def _inputs(B, T, H, m, d, *, per_slot=False, seed=0, dtype=D64, radial=0.0, objective="dec"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, m, generator=g, dtype=D64)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, m, generator=g, dtype=D64), dim=-1)
    v = torch.randn(B, T, H, d, generator=g, dtype=D64)
    gam = torch.rand(B, T, H, *([m] if per_slot else []), generator=g, dtype=D64)
    S0 = L.orthonormal_slots(H, d, m, generator=g, dtype=D64).expand(B, H, d, m).clone()
    if radial:  # every h_j nearly parallel to slot 0, |h_j| ≈ radial: the cancellation-prone case
        s0 = S0[..., 0].unsqueeze(1)  # (B, 1, H, d)
        if objective == "dec":  # h = S0 k − v
            v = torch.einsum("bhdm,bthm->bthd", S0, k) - radial * s0 + 1e-3 * v
        else:  # h = ±v
            v = radial * s0 + 1e-3 * v
    return [x.to(dtype) for x in (q, k, v, gam, S0)]


def _run(form, ins, A, objective, C, offset, weights):
    """(y, S_chunk_start, update) and the gradients of a random linear loss w.r.t. all inputs."""
    q, k, v, gam, S0 = xs = [x.detach().clone().requires_grad_(True) for x in ins]
    A = None if A is None else A.detach().clone().requires_grad_(True)
    if form == "reference":  # the per-token loop (naive.py; the mixer's impl="reference")
        y, (Sc, Au) = lattice_chunked(q, k, v, gam, S0, objective=objective, chunk_size=C, initial_update=A,
                                      offset=offset, mode="recurrent")  # fmt: skip
    else:
        y, (Sc, Au) = _lattice_chunked(
            q, k, v, gam, S0, objective=objective, chunk_size=C, initial_update=A, offset=offset,
            dense=form == "dense",
        )  # fmt: skip
    loss = sum((o * w).sum() for o, w in zip((y, Sc, Au), weights))
    wrt = xs + ([] if A is None else [A])
    return [y, Sc, Au, *torch.autograd.grad(loss, wrt)]


def _weights(B, T, H, m, d, dtype=D64):
    g = torch.Generator().manual_seed(7)
    shapes = ((B, T, H, d), (B, H, d, m), (B, H, d, m))
    return [torch.randn(s, generator=g, dtype=D64).to(dtype) for s in shapes]


NAMES = ["y", "S_chunk_start", "update", "dq", "dk", "dv", "dgamma", "dS0", "dA"]

# (chunk_size, offset, initial update, T): full chunks, a partial last chunk, a stream that resumes mid-chunk
# with the update of a previous call (A ⊥ S0) or with an arbitrary A, and chunk_size 1 (the exact recurrence)
CASES = [(4, 0, None, 12), (4, 0, None, 11), (5, 2, "stream", 11), (5, 3, "random", 9), (1, 0, None, 5)]


@pytest.mark.parametrize("objective", ["dec", "enc", "sim"])
@pytest.mark.parametrize("C, offset, A_kind, T", CASES)
def test_cheap_form_equals_dense_and_per_token_reference_fp64(objective, C, offset, A_kind, T):
    B, H, m, d = 2, 2, 4, 6
    ins = _inputs(B, T, H, m, d, per_slot=objective == "enc", seed=C + offset)
    A = None
    if A_kind == "stream":  # the update a previous call left in this chunk: columns orthogonal to the slots
        pre = _inputs(B, offset, H, m, d, seed=11)
        _, (_, A) = L.lattice_chunked(*pre[:4], ins[4], objective=objective, chunk_size=C)
    elif A_kind == "random":
        A = 0.3 * torch.randn(B, H, d, m, generator=torch.Generator().manual_seed(5), dtype=D64)
    w = _weights(B, T, H, m, d)
    new = _run("new", ins, A, objective, C, offset, w)
    dense = _run("dense", ins, A, objective, C, offset, w)
    ref = _run("reference", ins, A, objective, C, offset, w)
    for name, a, b, r in zip(NAMES, new, dense, ref):
        if float(r.detach().abs().max()) == 0.0:  # the update after a completed chunk is exactly zero in all forms
            assert float(a.detach().abs().max()) == 0.0 == float(b.detach().abs().max()), name
            continue
        assert_rel_close(a, r, 1e-10, f"{objective} C={C} offset={offset} A={A_kind}: new vs reference {name}")
        assert_rel_close(b, r, 1e-10, f"{objective} C={C} offset={offset} A={A_kind}: dense vs reference {name}")


def test_chunk_one_equals_the_exact_scan():
    q, k, v, gam, S0 = _inputs(2, 7, 2, 4, 6)
    y, S = L.lattice_scan(q, k, v, gam, S0)
    y1, (S1, A1) = L.lattice_chunked(q, k, v, gam, S0, chunk_size=1)
    assert_rel_close(y1, y, 1e-12, "C=1 output")
    assert_rel_close(L.sphere_retract(S1 + A1), S, 1e-12, "C=1 state")


def test_split_calls_equal_one_call():
    q, k, v, gam, S0 = _inputs(1, 23, 2, 4, 6)
    y, (Sc, A) = L.lattice_chunked(q, k, v, gam, S0, chunk_size=5)
    parts, S, Au, off = [], S0, None, 0
    for a, b in ((0, 3), (3, 4), (4, 12), (12, 23)):
        yp, (S, Au) = L.lattice_chunked(q[:, a:b], k[:, a:b], v[:, a:b], gam[:, a:b], S, chunk_size=5,
                                        initial_update=Au, offset=off)  # fmt: skip
        parts.append(yp)
        off = (off + b - a) % 5
    assert_rel_close(torch.cat(parts, 1), y, 1e-12, "split output")
    assert_rel_close(S, Sc, 1e-12, "split chunk-start state")
    assert_rel_close(Au, A, 1e-12, "split update")


def test_never_saves_per_token_states():
    """The autograd graph of the cheap form holds nothing of size C·N·d·m (the dense form's U_t)."""
    B, T, H, m, d, C = 2, 32, 2, 8, 8, 16
    xs = [x.requires_grad_(True) for x in _inputs(B, T, H, m, d)]
    sizes: list[int] = []

    def pack(t):
        sizes.append(t.numel())
        return t

    for form in ("new", "dense"):
        sizes.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            _lattice_chunked(*xs, chunk_size=C, dense=form == "dense")
        if form == "new":
            assert max(sizes) < C * B * H * d * m, max(sizes)
            assert max(sizes) <= B * T * H * max(d, m), max(sizes)  # inputs-sized at most
        else:
            assert max(sizes) >= C * B * H * d * m  # the test can see the dense tensor


@pytest.mark.parametrize("objective", ["dec", "enc", "sim"])
def test_float32_matches_float64_like_the_dense_form(objective):
    """float32 error vs the float64 reference: typical inputs ~1e-7..1e-6, and no worse than a few times the
    dense form's error when every h_j is nearly parallel to a slot (where the expanded ‖U_t‖² cancels)."""
    B, T, H, m, d, C = 1, 64, 2, 32, 32, 32
    for radial, tol_typ in ((0.0, 2e-5), (10.0, None)):
        ins64 = _inputs(B, T, H, m, d, radial=radial, objective=objective, seed=3)
        ins32 = [x.float() for x in ins64]
        ref = _run("dense", ins64, None, objective, C, 0, _weights(B, T, H, m, d))
        w32 = _weights(B, T, H, m, d, torch.float32)
        new = _run("new", ins32, None, objective, C, 0, w32)
        dense = _run("dense", ins32, None, objective, C, 0, w32)
        for name, a, b, r in zip(NAMES, new, dense, ref):
            if name == "update":
                continue  # zero after a completed chunk
            e_new, e_dense = rel_err(a, r), rel_err(b, r)
            if tol_typ is not None:
                assert e_new <= tol_typ, f"{objective} {name}: float32 error {e_new:.1e}"
            else:
                assert e_new <= max(10 * e_dense, 1e-5), f"{objective} radial {name}: {e_new:.1e} vs {e_dense:.1e}"


def test_bad_arguments_raise():
    q, k, v, gam, S0 = _inputs(1, 4, 2, 4, 6)
    with pytest.raises(ValueError, match="objectives"):
        L.lattice_chunked(q, k, v, gam, S0, objective="ttt")
    with pytest.raises(ValueError, match="offset"):
        L.lattice_chunked(q, k, v, gam, S0, chunk_size=4, offset=4)
    with pytest.raises(ValueError, match="initial_update"):
        L.lattice_chunked(q, k, v, gam, S0, initial_update=torch.zeros(1, 2, 6, 3, dtype=D64))
