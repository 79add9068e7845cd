"""The VLA fused recurrent Triton kernels (ops/vla/fused_recurrent.py: the Sherman–Morrison update of A and the
value-blocked residual write of S) against the recurrent reference (naive.py) in float32: outputs, every state
tensor, the gradients of every input and state tensor, and a split sequence continued from its state.  Without a
GPU the kernels run in Triton's CPU interpreter: tiny shapes (T = 7, checkpoints every 3 tokens, Dv = 40 so the
last of the two value blocks is partial)."""

from __future__ import annotations

import pytest
import torch
from _triton_util import kernel_module

from conftest import assert_rel_close
from seqmem.ops import _triton
from seqmem.ops.vla import vla_attention, vla_paper_delta_rule
from seqmem.ops.vla.naive import vla_attention_naive, vla_paper_delta_rule_naive

fr, DEVICE = kernel_module("seqmem.ops.vla.fused_recurrent")

B, T, H, D, DV = 2, 7, 2, 16, 40


def _gen(seed):
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(DEVICE).requires_grad_()

    return g, r


def _vla_inputs(seed, fixed_A=False, use_z=True, t=T):  # noqa: N803
    g, r = _gen(seed)
    q, k, v = r(B, t, H, D), r(B, t, H, D), r(B, t, H, DV)
    w_u = r(H, D, D, scale=D**-0.5)
    st = {"S": r(B, H, DV, D, scale=0.1), "pos": torch.tensor([3, 17], device=DEVICE)}
    if not fixed_A:
        a = torch.randn(B, H, D, D, generator=g) * 0.05
        st["A"] = (torch.eye(D) * 8 + a @ a.transpose(-1, -2)).to(DEVICE).requires_grad_()  # symmetric pos. def.
    if use_z:
        st["z"] = torch.rand(B, H, D, generator=g).to(DEVICE).requires_grad_()
    return q, k, v, w_u, st


def _compare(out, ref, ins, tol_grad=1e-4):
    (o, s), (o_r, s_r) = out, ref
    assert set(s) == set(s_r)
    assert_rel_close(o, o_r, 1e-5, "o")
    assert torch.equal(s["pos"], s_r["pos"])
    names = [n for n in s if s[n].is_floating_point()]
    for n in names:
        assert_rel_close(s[n], s_r[n], 1e-5, f"state {n}")
    g = torch.Generator().manual_seed(5)
    wo = torch.randn(o.shape, generator=g).to(DEVICE)
    ws = {n: torch.randn(s[n].shape, generator=g).to(DEVICE) for n in names}

    def loss(o, s):
        return (o * wo).sum() + sum((s[n] * ws[n]).sum() for n in names)

    ga = torch.autograd.grad(loss(o, s), ins, allow_unused=True)
    gb = torch.autograd.grad(loss(o_r, s_r), ins, allow_unused=True)
    for i, (a, b) in enumerate(zip(ga, gb)):
        if b is None:
            assert a is None or not a.abs().any(), f"grad {i}: the reference has none"
            continue
        assert_rel_close(a, b, tol_grad, f"grad of input {i}")


@pytest.mark.parametrize("options", [dict(), dict(fixed_A=True), dict(normalize_alpha=False, normalizer="none",
                                                                          refresh_period=3, lam0=1.0)])
def test_matches_naive(options):
    fixed_A, use_z = options.get("fixed_A", False), options.get("normalizer", "paper") == "paper"  # noqa: N806
    q, k, v, w_u, st = _vla_inputs(0, fixed_A, use_z)
    out = fr.fused_recurrent_vla(q, k, v, w_u, initial_state=st, chunk_size=3, **options)
    ref = vla_attention_naive(q, k, v, w_u, initial_state=st, **options)
    _compare(out, ref, [q, k, v, w_u, *(x for x in st.values() if x.is_floating_point())])


def test_split_sequence_continues_from_state():
    """Split at 4 with refresh period 3 (positions count from the state's pos): refreshes fall in both pieces."""
    q, k, v, w_u, st = _vla_inputs(1)
    ref = vla_attention_naive(q, k, v, w_u, initial_state=st, refresh_period=3)
    o1, s1 = fr.fused_recurrent_vla(q[:, :4], k[:, :4], v[:, :4], w_u, initial_state=st, refresh_period=3,
                                    chunk_size=3)  # fmt: skip
    o2, s2 = fr.fused_recurrent_vla(q[:, 4:], k[:, 4:], v[:, 4:], w_u, initial_state=s1, refresh_period=3,
                                    chunk_size=3)  # fmt: skip
    _compare((torch.cat([o1, o2], 1), s2), ref, [q, k, v, w_u, st["S"], st["A"], st["z"]])


def test_paper_delta_rule_matches_naive():
    g, r = _gen(2)
    q, k, v = r(B, T, H, D), r(B, T, H, D), r(B, T, H, DV)
    beta = torch.rand(B, T, H, generator=g).to(DEVICE).requires_grad_()
    st = {"S": r(B, H, DV, D, scale=0.1), "z": torch.rand(B, H, D, generator=g).to(DEVICE).requires_grad_()}
    out = fr.fused_recurrent_vla_paper_delta_rule(q, k, v, beta, initial_state=st, chunk_size=3)
    ref = vla_paper_delta_rule_naive(q, k, v, beta, initial_state=st)
    # no pos in this state: _compare checks it, so give both one (on the inputs' device)
    out[1]["pos"] = ref[1]["pos"] = torch.zeros(1, device=DEVICE)
    _compare(out, ref, [q, k, v, beta, st["S"], st["z"]])


def test_ops_dispatch(monkeypatch):
    """The ops take the kernels where use_triton says so (CUDA; forced here), in float32 for bf16 inputs."""
    monkeypatch.setattr(_triton, "use_triton", lambda *ts: True)
    q, k, v, w_u, st = _vla_inputs(3, t=5)
    o, s = vla_attention(q.bfloat16(), k, v, w_u, initial_state=st)
    o_r, s_r = vla_attention(q.bfloat16(), k, v, w_u, initial_state=st, mode="recurrent")
    assert o.dtype == torch.float32 and s["A"].dtype == torch.float32
    assert_rel_close(o, o_r, 1e-5, "o")
    assert_rel_close(s["A"], s_r["A"], 1e-5, "A")
    beta = torch.rand(B, 5, H, device=DEVICE)
    o, s = vla_paper_delta_rule(q, k, v, beta)
    o_r, s_r = vla_paper_delta_rule(q, k, v, beta, mode="recurrent")
    assert_rel_close(o, o_r, 1e-5, "o (paper delta rule)")
    monkeypatch.undo()
    assert _triton.use_triton(q) == (DEVICE == "cuda")


def test_padded_dims_and_single_token():
    """D, Dv that are not powers of two (the kernels pad their blocks) and a one-token call (a decode step)."""
    g = torch.Generator().manual_seed(6)
    for t, d, dv in ((3, 12, 7), (1, 12, 7)):
        q, k, v = (torch.randn(B, t, H, n, generator=g).to(DEVICE) for n in (d, d, dv))
        w_u = (torch.randn(H, d, d, generator=g) * d**-0.5).to(DEVICE)
        o, s = fr.fused_recurrent_vla(q, k, v, w_u, refresh_period=2, chunk_size=2)
        o_r, s_r = vla_attention_naive(q, k, v, w_u, refresh_period=2)
        assert_rel_close(o, o_r, 1e-5, f"o (T={t})")
        for n in ("S", "A", "z"):
            assert_rel_close(s[n], s_r[n], 1e-5, f"{n} (T={t})")


def test_mixer_layer_runs_the_kernels(monkeypatch):
    """A whole VLA layer with the kernels dispatched as on CUDA equals the layer on its CPU form."""
    from seqmem.registry import build_mixer

    mixer = build_mixer("vla", 16, n_heads=2).to(DEVICE)
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(9)).to(DEVICE)

    def run():
        y, st = mixer(x)
        grads = torch.autograd.grad(y.square().sum() + st["S"].sum(), list(mixer.parameters()), allow_unused=True)
        return y, st["A"], grads

    y_ref, A_ref, g_ref = run()
    calls = []
    real = fr.fused_recurrent_vla
    monkeypatch.setattr(_triton, "use_triton", lambda *ts: True)
    monkeypatch.setattr(fr, "fused_recurrent_vla", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    from seqmem.ops._backends import record_forms

    with record_forms() as forms:
        y, A, g = run()
    assert calls, "the layer did not reach the kernels"
    assert forms.get("vla_attention") == {"triton": 1}, forms  # what `bench speed`'s form column reports
    assert_rel_close(y, y_ref, 1e-5, "layer output")
    assert_rel_close(A, A_ref, 1e-5, "layer state A")
    for a, b in zip(g, g_ref):
        if b is not None:
            assert_rel_close(a, b, 1e-4, "parameter gradient")
