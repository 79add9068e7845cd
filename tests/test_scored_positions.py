"""The language model's logits at chosen positions only (``model(x, positions=mask)``), and training's use of it:
equal to the full call's ``logits[mask]`` (outputs, state and gradients), and a training run on a task scored at a
few positions computes its head there alone with the same losses as the dense computation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from seqmem.models import LanguageModel, LMConfig
from seqmem.tasks.mqar import MQARTask
from seqmem.train import TrainConfig, train
from seqmem.train.loop import _micro_steps, scored_logits, takes_positions


def _model(mixer: str, dtype=torch.float64, vocab: int = 32) -> LanguageModel:
    torch.manual_seed(0)
    return LanguageModel(LMConfig(vocab_size=vocab, d_model=16, n_layers=2, n_heads=2, mixer=mixer)).to(dtype)


def _flat(state):
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for k in sorted(state) for t in _flat(state[k])]
    if isinstance(state, list | tuple):
        return [t for s in state for t in _flat(s)]
    return []


@pytest.mark.parametrize("mixer", ["attention", "deltanet", "vort_fixed_alpha", "mamba2"])
def test_positions_give_the_full_logits_rows_state_and_gradients(mixer):
    m = _model(mixer)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 32, (3, 20), generator=g)
    mask = torch.rand(3, 20, generator=g) < 0.2
    mask[1] = False  # a row with nothing scored
    mask[2, -1] = True
    w = torch.randn(int(mask.sum()), 32, generator=g, dtype=torch.float64)

    full, st_full = m(x)
    (full[mask] * w).sum().backward()
    ref = {n: p.grad.clone() for n, p in m.named_parameters()}
    m.zero_grad(set_to_none=True)
    part, st_part = m(x, positions=mask)
    assert part.shape == (int(mask.sum()), 32)
    torch.testing.assert_close(part, full[mask], rtol=1e-12, atol=1e-12)
    for a, b in zip(_flat(st_part), _flat(st_full), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    (part * w).sum().backward()
    for n, p in m.named_parameters():
        if ref[n].abs().max() > 0:
            torch.testing.assert_close(p.grad, ref[n], rtol=1e-10, atol=1e-12, msg=n)

    # streaming: a second segment from the first's state, scored at some positions, equals the full call's rows
    with torch.no_grad():
        x2 = torch.randint(0, 32, (3, 7), generator=g)
        mask2 = torch.zeros(3, 7, dtype=torch.bool)
        mask2[:, 3] = True
        torch.testing.assert_close(m(x2, st_full, positions=mask2)[0], m(x2, st_full)[0][mask2], rtol=1e-12,
                                   atol=1e-12)


def test_bad_positions_are_refused():
    m = _model("attention")
    x = torch.randint(0, 32, (2, 8))
    with pytest.raises(ValueError, match="positions must be a bool tensor"):
        m(x, positions=torch.ones(2, 8))
    with pytest.raises(ValueError, match="positions must be a bool tensor"):
        m(x, positions=torch.ones(2, 7, dtype=torch.bool))


class _Dense(nn.Module):
    """The same model without the ``positions`` argument: training falls back to the full logits."""

    def __init__(self, inner: LanguageModel) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x, state=None):
        return self.inner(x, state)


def test_training_scores_only_the_target_positions_with_the_dense_losses():
    task = MQARTask(vocab_size=32, num_pairs=2, seq_len=16)
    assert takes_positions(_model("deltanet")) and not takes_positions(_Dense(_model("deltanet")))
    cfg = TrainConfig(steps=6, batch_size=8, lr=1e-2, log_every=1, eval_examples=16)

    sparse = _model("deltanet", torch.float32)
    rows_seen = []
    sparse.head.register_forward_hook(lambda mod, inp, out: rows_seen.append(inp[0].shape[0]) if mod.training
                                      else None)
    r_sparse = train(sparse, task, cfg)
    dense = _Dense(_model("deltanet", torch.float32))
    r_dense = train(dense, task, cfg)

    x, y = task.sample(8, torch.Generator().manual_seed(0))
    n_scored = int((y != -100).sum())
    assert 0 < n_scored < y.numel() // 4  # MQAR scores its queries only
    assert rows_seen and max(rows_seen) <= 2 * n_scored < y.numel()  # the head ran on the scored rows
    for a, b in zip(r_sparse.history, r_dense.history, strict=True):
        for k in ("loss", "accuracy"):
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-6), (a["step"], k)
    for (n, p1), p2 in zip(sparse.named_parameters(), dense.inner.parameters(), strict=True):
        assert float((p2 - p1).detach().norm()) <= 1e-4 * float(p1.detach().norm()) + 1e-6, n


def test_micro_steps_with_positions_match_the_dense_path():
    task = MQARTask(vocab_size=32, num_pairs=2, seq_len=16)
    x, y = task.sample(7, torch.Generator().manual_seed(0))
    y[0] = -100  # a micro-batch row with nothing scored
    out = {}
    for sparse in (False, True):
        m = _model("gated_deltanet")
        report, acc = _micro_steps(m, x, y, 3, "fp32", 0, 1, torch.device("cpu"), True, sparse)
        out[sparse] = (float(report), acc, {n: p.grad.clone() for n, p in m.named_parameters()})
    assert out[True][0] == pytest.approx(out[False][0], rel=1e-12)
    assert out[True][1] == out[False][1]
    for n, gr in out[False][2].items():
        torch.testing.assert_close(out[True][2][n], gr, rtol=1e-10, atol=1e-12, msg=n)


def test_scored_logits_on_a_fully_scored_batch_is_the_full_call():
    m = _model("attention")
    x = torch.randint(0, 32, (2, 8))
    y = torch.randint(0, 32, (2, 8))
    logits, tgt = scored_logits(m, x, y, sparse=True)
    torch.testing.assert_close(logits, m(x)[0].reshape(-1, 32))
    assert torch.equal(tgt, y.reshape(-1))


def test_positions_without_an_mlp_and_with_one_layer():
    """The gather happens after the last mixer whether or not a block has an MLP, and with a single block."""
    g = torch.Generator().manual_seed(2)
    x = torch.randint(0, 32, (2, 12), generator=g)
    mask = torch.rand(2, 12, generator=g) < 0.3
    mask[0, 0] = True
    for layers, ratio in ((1, 2.0), (2, 0.0)):
        torch.manual_seed(0)
        m = LanguageModel(LMConfig(vocab_size=32, d_model=16, n_layers=layers, n_heads=2, mixer="gated_deltanet",
                                   mlp_ratio=ratio)).double()
        with torch.no_grad():
            torch.testing.assert_close(m(x, positions=mask)[0], m(x)[0][mask], rtol=1e-12, atol=1e-12)
