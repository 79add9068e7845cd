"""Fair comparisons: with the sweep's length rule, every memory carries the first token to the end of the sequence.

For every registered mixer, built with the options :data:`seqmem.sweep.LENGTH_RULE` gives it at the demo's and the
comparison's sequence lengths, the output at the last position must change when only the first token changes —
unless the mixer says why it cannot (``Mixer.long_range_reason``: a window, a block without memory, a token-wise
layer), in which case it must not change at all.  A chunk-causal memory whose chunk covered the whole sequence
(SKA at chunk 64 on 32 tokens) fails this test."""

from __future__ import annotations

import pytest
import torch

import seqmem
from seqmem.sweep import fair_options

NAMES = seqmem.list_mixers()


@pytest.mark.parametrize("seq_len", [32, 64])
@pytest.mark.parametrize("name", NAMES)
def test_last_output_depends_on_first_token_unless_by_design(name, seq_len):
    torch.manual_seed(0)
    opts = fair_options(name, seq_len)
    m = seqmem.build_mixer(name, 16, n_heads=2, **opts).double()
    with torch.no_grad():  # generic weights: zero-initialised gates must not hide a path
        for p in m.parameters():
            p.add_(0.2 * torch.randn_like(p))
    x = torch.randn(2, seq_len, 16, dtype=torch.float64)
    x2 = x.clone()
    x2[:, 0] += 3.0
    with torch.no_grad():
        y1, _ = m(x)
        y2, _ = m(x2)
    diff = float((y1[:, -1] - y2[:, -1]).abs().max())
    reason = m.long_range_reason(seq_len)
    if reason is None:
        assert diff > 1e-9, f"{name} with {opts}: the last output ignores the first token (diff {diff:.2e})"
    else:
        assert diff < 1e-12, f"{name} claims '{reason}' but its last output depends on the first token"


def test_the_designed_exceptions_are_the_expected_ones():
    blind = {n for n in NAMES
             if seqmem.build_mixer(n, 16, n_heads=2, **fair_options(n, 64)).long_range_reason(64) is not None}
    assert blind == {"swa", "block_attention", "koopman_mlp", "memorizing"}
