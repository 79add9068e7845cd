"""lattice_minibatch (mini-batch Lattice, docs/lattice.md): the cheap form (no per-token (C, N, d, m) states) equals
the dense per-token-state form and the mixer's per-token loop, outputs and gradients, in float64 and float32; its
former name lattice_chunked still works, with a DeprecationWarning."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_rel_close, rel_err
from seqmem.ops import lattice as L
from seqmem.ops.lattice.minibatch import _lattice_minibatch, lattice_minibatch

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
        st = {"S": S0, "A": torch.zeros_like(S0) if A is None else A, "pos": torch.full((S0.shape[0],), offset)}
        y, st = lattice_minibatch(q, k, v, gam, st, objective=objective, chunk_size=C, mode="recurrent")
        Sc, Au = st["S"], st["A"]
    else:
        y, (Sc, Au) = _lattice_minibatch(
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
        A = L.lattice_minibatch(*pre[:4], {"S": ins[4], "A": torch.zeros_like(ins[4]), "pos": torch.zeros(B).long()},
                                objective=objective, chunk_size=C)[1]["A"]
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
    y, st = L.lattice_scan(q, k, v, gam, {"S": S0})
    y1, st1 = L.lattice_minibatch(q, k, v, gam, {"S": S0, "A": torch.zeros_like(S0), "pos": torch.zeros(2).long()},
                                  chunk_size=1)
    assert_rel_close(y1, y, 1e-12, "C=1 output")
    assert_rel_close(L.sphere_retract(st1["S"] + st1["A"]), st["S"], 1e-12, "C=1 state")


def test_split_calls_equal_one_call():
    q, k, v, gam, S0 = _inputs(1, 23, 2, 4, 6)
    st0 = {"S": S0, "A": torch.zeros_like(S0), "pos": torch.zeros(1).long()}
    y, full = L.lattice_minibatch(q, k, v, gam, st0, chunk_size=5)
    parts, st = [], st0
    for a, b in ((0, 3), (3, 4), (4, 12), (12, 23)):
        yp, st = L.lattice_minibatch(q[:, a:b], k[:, a:b], v[:, a:b], gam[:, a:b], st, chunk_size=5)
        parts.append(yp)
    assert_rel_close(torch.cat(parts, 1), y, 1e-12, "split output")
    assert_rel_close(st["S"], full["S"], 1e-12, "split chunk-start state")
    assert_rel_close(st["A"], full["A"], 1e-12, "split update")
    assert st["pos"].tolist() == full["pos"].tolist() == [23]


def test_former_name_and_forms_warn_and_agree():
    """lattice_chunked (the former name, tuple state, offset/initial_update) and a bare S⁰ tensor still work."""
    q, k, v, gam, S0 = _inputs(1, 9, 2, 4, 6)
    y, st = L.lattice_minibatch(q, k, v, gam, {"S": S0, "A": torch.zeros_like(S0), "pos": torch.zeros(1).long()},
                                chunk_size=4)
    with pytest.warns(DeprecationWarning, match="use lattice_minibatch"):
        y_old, (S_old, A_old) = L.lattice_chunked(q, k, v, gam, S0, chunk_size=4)
    with pytest.warns(DeprecationWarning, match=r"pass the state dict \{'S': tensor\}"):
        y_bare, st_bare = L.lattice_minibatch(q, k, v, gam, S0, chunk_size=4)
    for a in (y_old, y_bare):
        assert_rel_close(a, y, 1e-14, "output")
    assert_rel_close(S_old, st["S"], 1e-14, "former chunk-start state")
    assert_rel_close(A_old, st["A"], 1e-14, "former update")
    assert st_bare["pos"].tolist() == [9]
    import seqmem.ops as ops

    assert "lattice_chunked" not in ops.__all__ and ops.lattice_chunked is L.lattice_chunked


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
            _lattice_minibatch(*xs, chunk_size=C, dense=form == "dense")
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
    st = {"S": S0, "A": torch.zeros_like(S0), "pos": torch.zeros(1).long()}
    with pytest.raises(ValueError, match="objectives"):
        L.lattice_minibatch(q, k, v, gam, st, objective="ttt")
    with pytest.raises(ValueError, match="keys"):
        L.lattice_minibatch(q, k, v, gam, {"S": S0, "A": S0})
    with pytest.raises(ValueError, match="pos"):
        L.lattice_minibatch(q, k, v, gam, {**st, "pos": torch.zeros(2).long()})
    with pytest.raises(ValueError, match="update"):
        L.lattice_minibatch(q, k, v, gam, {**st, "A": torch.zeros(1, 2, 6, 3, dtype=D64)})
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="offset"):
        L.lattice_chunked(q, k, v, gam, S0, chunk_size=4, offset=4)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="initial_update"):
        L.lattice_chunked(q, k, v, gam, S0, initial_update=torch.zeros(1, 2, 6, 3, dtype=D64))
