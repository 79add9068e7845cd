"""Elastic Memory's trapezoidal attention (Eqs. 9–10): the one-SDPA-call form equals the per-query reference
(outputs and gradients), both equal a dense softmax written here from the definition, and bad inputs raise."""

from __future__ import annotations

import pytest
import torch

from conftest import assert_rel_close
from seqmem.ops import trapezoidal_attention

D64 = torch.float64


def _inputs(b=2, nb=3, lq=4, lk=5, M=3, h=2, d=4, seed=0, visible="random"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, nb, lq, h, d, generator=g, dtype=D64)
    k, v = (torch.randn(b, nb, lk, h, d, generator=g, dtype=D64) for _ in range(2))
    km, vm = (torch.randn(b, nb, M, h, d, generator=g, dtype=D64) for _ in range(2))
    valid = torch.rand(b, nb, M, generator=g) < 0.7
    if visible == "blocks":  # whole blocks visible or not, as in the Elastic / Melodi mixers
        valid = torch.tensor([False, True, False, True, True])[:nb, None].expand(b, nb, M).clone()
    valid[:, 0] = False  # block 0: the memory is empty
    return [x.requires_grad_(True) for x in (q, k, v, km, vm)], valid


def _dense(q, k, v, km, vm, valid, offset):
    """Per block: scores over [memory; keys], memory columns masked where invalid, keys masked above the diagonal."""
    b, nb, lq, h, d = q.shape
    lk = k.shape[2]
    outs = []
    for c in range(nb):
        keys, vals = torch.cat([km[:, c], k[:, c]], 1), torch.cat([vm[:, c], v[:, c]], 1)  # (b, M + lk, h, d)
        s = torch.einsum("bihd,bjhd->bhij", q[:, c], keys) / d**0.5
        see_key = torch.arange(lk)[None, :] <= torch.arange(lq)[:, None] + offset  # (lq, lk)
        see = torch.cat([valid[:, c, None, :].expand(b, lq, -1), see_key.expand(b, lq, lk)], -1)  # (b, lq, M + lk)
        p = torch.softmax(s.masked_fill(~see[:, None], float("-inf")), -1)
        outs.append(torch.einsum("bhij,bjhd->bihd", p, vals))
    return torch.stack(outs, 1)


@pytest.mark.parametrize("square", [False, True])
@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("memory", [True, False, "blocks"])
def test_chunk_equals_reference_and_dense(offset, memory, square):
    """Square blocks at offset 0 take the causal (flash) path, the rest the masked SDPA call: both are checked;
    ``memory="blocks"``: whole blocks' memory visible or not (the grouped path, blocks out of order)."""
    if square and offset:
        pytest.skip("a square block starts at offset 0")
    ins, valid = _inputs(nb=5 if memory == "blocks" else 3, lk=4 if square else 5,
                         visible="blocks" if memory == "blocks" else "random")  # fmt: skip
    q, k, v, km, vm = ins
    mem = (km, vm, valid) if memory else (None, None, None)
    q_ = q[:, :, : q.shape[2] - offset] if offset else q  # the queries of a block's last lq - offset positions
    g = torch.Generator().manual_seed(9)
    w = torch.randn(q_.shape, generator=g, dtype=D64)
    res = {}
    for mode in ("recurrent", "chunk"):
        y = trapezoidal_attention(q_, k, v, *mem, offset=offset, mode=mode)
        res[mode] = (y, torch.autograd.grad((y * w).sum(), ins, allow_unused=True))
    assert_rel_close(res["chunk"][0], res["recurrent"][0], 1e-12, "chunk vs reference")
    for a, b in zip(res["chunk"][1], res["recurrent"][1]):
        if a is None or b is None:
            assert a is None and b is None
            continue
        assert_rel_close(a, b, 1e-11, "gradient")
    if memory:
        assert_rel_close(res["chunk"][0], _dense(q_, k, v, km, vm, valid, offset), 1e-12, "dense softmax")


def test_bad_inputs_raise():
    (q, k, v, km, vm), valid = _inputs()
    with pytest.raises(ValueError, match="mode"):
        trapezoidal_attention(q, k, v, mode="scan")
    with pytest.raises(ValueError, match="offset"):
        trapezoidal_attention(q, k, v, offset=2)
    with pytest.raises(ValueError, match="together"):
        trapezoidal_attention(q, k, v, km, vm)
    with pytest.raises(ValueError, match="disagree"):
        trapezoidal_attention(q, k[..., :3], v)
    with pytest.raises(ValueError, match="bool"):
        trapezoidal_attention(q, k, v, km, vm, valid.double())


def test_mem_kinds_from_the_host_give_the_same_answer():
    """``mem_kinds`` (what each block sees of its memory, known to the caller) replaces the read-back of
    ``mem_valid`` and gives the same output: blocks with none, all and a part of their memory visible."""
    (q, k, v, km, vm), valid = _inputs(nb=4, lk=4, lq=4)
    valid[:, 1] = True
    valid[:, 2] = False
    valid[:, 3] = torch.tensor([False, True, True])
    full = valid.flatten(2).transpose(0, 1).reshape(4, -1)
    kinds = [0 if not r.any() else 1 if r.all() else 2 for r in full]
    assert kinds == [0, 1, 0, 2]
    y = trapezoidal_attention(q, k, v, km, vm, valid)
    assert torch.equal(trapezoidal_attention(q, k, v, km, vm, valid, mem_kinds=kinds), y)
    assert torch.equal(trapezoidal_attention(q, k, v, km, vm, valid, mem_kinds=kinds, mode="recurrent"),
                       trapezoidal_attention(q, k, v, km, vm, valid, mode="recurrent"))
    for bad in ([0, 1, 0], [0, 1, 0, 3], [0, True, 0, 2]):
        with pytest.raises(ValueError, match="mem_kinds"):
            trapezoidal_attention(q, k, v, km, vm, valid, mem_kinds=bad)
    with pytest.raises(ValueError, match="mem_kinds"):
        trapezoidal_attention(q, k, v, mem_kinds=[0, 0, 0, 0])

