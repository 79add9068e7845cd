"""seqmem.ops.fla_compat: fla's names, argument order and (o, final_state) return, equal to seqmem's own ops; and
seqmem's gated_delta_rule refuses the positional (beta, g) pair that fla orders (g, beta)."""

from __future__ import annotations

import pytest
import torch

from seqmem.ops import delta_rule, gated_delta_rule, linear_attention
from seqmem.ops import fla_compat as fc

B, T, H, K, V = 2, 11, 3, 4, 5


def _inputs(seed: int = 0, dtype: torch.dtype = torch.float64):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=g, dtype=dtype) for _ in range(2))
    k = torch.nn.functional.normalize(k, dim=-1)
    v = torch.randn(B, T, H, V, generator=g, dtype=dtype)
    beta = torch.rand(B, T, H, generator=g, dtype=dtype)
    gate = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=g, dtype=dtype))
    h0 = torch.randn(B, H, K, V, generator=g, dtype=dtype)
    return q, k, v, gate, beta, h0


def test_positional_beta_g_is_refused_in_seqmem_order():
    q, k, v, gate, beta, _ = _inputs()
    with pytest.raises(TypeError, match="takes beta and g by keyword"):
        gated_delta_rule(q, k, v, beta, gate)
    with pytest.raises(TypeError, match="by keyword"):
        gated_delta_rule(q, k, v, beta=beta)


@pytest.mark.parametrize("fn", [fc.chunk_gated_delta_rule, fc.fused_recurrent_gated_delta_rule])
def test_gated_delta_rule_in_fla_order_equals_seqmem(fn):
    q, k, v, gate, beta, h0 = _inputs()
    ref_o, ref_s = gated_delta_rule(q, k, v, beta=beta, g=gate, initial_state={"S": h0}, mode="recurrent")
    o, s = fn(q, k, v, gate, beta=beta, initial_state=h0, output_final_state=True) if "fused" in fn.__name__ \
        else fn(q, k, v, gate, beta, initial_state=h0, output_final_state=True)
    torch.testing.assert_close(o, ref_o, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(s, ref_s["S"], rtol=1e-10, atol=1e-12)
    o2, s2 = fc.chunk_gated_delta_rule(q, k, v, gate, beta)
    assert s2 is None and o2.shape == (B, T, H, V)


@pytest.mark.parametrize("fn", [fc.chunk_delta_rule, fc.fused_recurrent_delta_rule])
def test_delta_rule_in_fla_order_equals_seqmem(fn):
    q, k, v, _, beta, h0 = _inputs(1)
    ref_o, ref_s = delta_rule(q, k, v, beta, initial_state={"S": h0}, mode="recurrent")
    o, s = fn(q, k, v, beta, initial_state=h0, output_final_state=True)
    torch.testing.assert_close(o, ref_o, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(s, ref_s["S"], rtol=1e-10, atol=1e-12)
    o1, _ = fc.fused_recurrent_delta_rule(q, k, v)  # beta None: ones, as in fla
    torch.testing.assert_close(o1, delta_rule(q, k, v, torch.ones(B, T, H, dtype=q.dtype))[0])


def test_gradients_chunk_equal_recurrent():
    q, k, v, gate, beta, h0 = _inputs(2)
    grads = []
    for fn in (fc.chunk_gated_delta_rule, fc.fused_recurrent_gated_delta_rule):
        xs = [t.clone().requires_grad_(True) for t in (q, k, v, gate, beta, h0)]
        o, s = fn(*xs[:4], beta=xs[4], initial_state=xs[5], output_final_state=True)
        (o.pow(2).sum() + s.sum()).backward()
        grads.append([x.grad for x in xs])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_scale_default_and_l2norm_in_kernel():
    q, k, v, gate, beta, _ = _inputs(3)
    o, _ = fc.chunk_gated_delta_rule(q, k, v, gate, beta, use_qk_l2norm_in_kernel=True, scale=0.7)
    qn, kn = (x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6) for x in (q, k))
    ref, _ = gated_delta_rule(qn, kn, v, beta=beta, g=gate, scale=0.7)
    torch.testing.assert_close(o, ref)
    o, _ = fc.chunk_gated_delta_rule(q, k, v, gate, beta)
    torch.testing.assert_close(o, gated_delta_rule(q, k, v, beta=beta, g=gate, scale=K ** -0.5)[0])


def test_cu_seqlens_packed_equals_each_sequence_alone():
    q, k, v, gate, beta, h0 = _inputs(4)
    cu = torch.tensor([0, 3, 3, 9, T])  # 4 sequences, one empty
    h0 = torch.randn(4, H, K, V, dtype=q.dtype)
    packed = [x[:1] for x in (q, k, v, gate, beta)]
    o, s = fc.chunk_gated_delta_rule(*packed, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    for i, (a, b) in enumerate(zip(cu.tolist(), cu.tolist()[1:])):
        oi, si = fc.fused_recurrent_gated_delta_rule(*(x[:, a:b] for x in packed[:4]), beta=packed[4][:, a:b],
                                                     initial_state=h0[i : i + 1], output_final_state=True)
        torch.testing.assert_close(o[:, a:b], oi)
        torch.testing.assert_close(s[i : i + 1], si)
    with pytest.raises(ValueError, match="batch size must be 1"):
        fc.chunk_gated_delta_rule(q, k, v, gate, beta, cu_seqlens=cu)
    with pytest.raises(ValueError, match="initial_state must be"):
        fc.chunk_gated_delta_rule(*packed, initial_state=h0[:2], cu_seqlens=cu)


def test_linear_attn_with_and_without_fla_normaliser():
    q, k, v, _, _, h0 = _inputs(5)
    o, s = fc.chunk_linear_attn(q, k, v, normalize=False, initial_state=h0, output_final_state=True)
    ref_o, ref_s = linear_attention(q, k, v, initial_state={"S": h0})
    torch.testing.assert_close(o, ref_o)
    torch.testing.assert_close(s, ref_s["S"])
    # normalize=True (fla's default for chunk_linear_attn): o / (scale q . cumsum k + 1e-10), states (S, z)
    z0 = torch.rand(B, 1, H, K, dtype=q.dtype)
    o, (s, z) = fc.chunk_linear_attn(q, k, v, initial_state=(h0, z0), output_final_state=True)
    zc = k.cumsum(1) + z0
    den = (q * K ** -0.5 * zc).sum(-1, keepdim=True) + 1e-10
    torch.testing.assert_close(o, ref_o / den)
    torch.testing.assert_close(z, zc[:, -1:])
    o_r, (_, z_r) = fc.fused_recurrent_linear_attn(q, k, v, initial_state=(h0, z0), normalize=True)
    torch.testing.assert_close(o_r, o)
    torch.testing.assert_close(z_r, z)


def test_options_after_the_tensors_are_keyword_only():
    q, k, v, gate, beta, h0 = _inputs()
    with pytest.raises(TypeError):
        fc.chunk_gated_delta_rule(q, k, v, gate, beta, None, h0)  # fla's positional scale, initial_state
    with pytest.raises(TypeError):
        fc.chunk_gated_delta_rule(q, k, v, gate, beta, gk=gate)  # an fla option without seqmem math
    with pytest.raises(ValueError, match="head_first"):
        fc.chunk_delta_rule(q, k, v, beta, head_first=True)


def test_float32_output_dtype_and_state():
    q, k, v, gate, beta, h0 = (x.float() for x in _inputs())
    o, s = fc.chunk_gated_delta_rule(q, k, v, gate, beta, initial_state=h0, output_final_state=True)
    assert o.dtype == torch.float32 and s.dtype == torch.float32


def test_mismatched_tensors_and_states_are_refused():
    """Every tensor shares q's (batch, time, heads) — a longer k, v or gate was cut to q's length silently — and
    states, the normaliser's z and cu_seqlens have their documented shape and type."""
    q, k, v, gate, beta, h0 = _inputs()
    long = {n: torch.cat([x, x[:, :3]], 1) for n, x in (("k", k), ("v", v), ("gate", gate), ("beta", beta))}
    for n in long:
        args = {"k": k, "v": v, "gate": gate, "beta": beta, n: long[n]}
        with pytest.raises(ValueError, match=f"{'g' if n == 'gate' else n} must have q's"):
            fc.chunk_gated_delta_rule(q, args["k"], args["v"], args["gate"], args["beta"])
    with pytest.raises(ValueError, match="k must have q's"):
        fc.fused_recurrent_linear_attn(q, long["k"], v)
    with pytest.raises(ValueError, match=r"initial_state must be \(N, heads, d_k, d_v\)"):
        fc.chunk_delta_rule(q, k, v, beta, initial_state=h0[..., :4])
    # the normaliser state z: (N, 1, heads, d_k) and floating; a pair only with normalize=True
    for z in (torch.rand(1, 1, H, K, dtype=q.dtype), torch.rand(K, dtype=q.dtype), torch.ones(B, 1, H, K).long()):
        with pytest.raises(ValueError, match="normaliser state z"):
            fc.chunk_linear_attn(q, k, v, initial_state=(h0, z))
    with pytest.raises(ValueError, match="normalize=False pass S alone"):
        fc.chunk_linear_attn(q, k, v, initial_state=(h0, torch.rand(B, 1, H, K, dtype=q.dtype)), normalize=False)
    # packed: z must have one row per sequence
    cu = torch.tensor([0, 4, 11])
    q1, k1, v1 = q[:1], k[:1], v[:1]
    with pytest.raises(ValueError, match="normaliser state z"):
        fc.chunk_linear_attn(q1, k1, v1, initial_state=(h0, torch.rand(3, 1, H, K, dtype=q.dtype)), cu_seqlens=cu)
    for bad in ([0, 4, 11], cu.double()):
        with pytest.raises(ValueError, match="cu_seqlens must be an int32 or int64 tensor"):
            fc.chunk_delta_rule(q1, k1, v1, beta[:1], cu_seqlens=bad)
