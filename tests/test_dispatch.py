"""A one-token call in impl="fast" runs the mixer's ``single_token_impl`` (the decode step's cheaper exact path)."""

from __future__ import annotations

from typing import ClassVar

import pytest
import torch

from seqmem import get_entry, list_mixers
from seqmem.mixers.base import Mixer


class _Recorder(Mixer):
    single_token_impl: ClassVar[str] = "reference"

    def __init__(self, d_model: int = 4, fail: bool = False) -> None:
        super().__init__(d_model, 1, "fast")
        self.seen: list[str] = []
        self.fail = fail

    def _forward(self, x, state):
        self.seen.append(self.impl)
        if self.fail:
            raise RuntimeError("boom")
        return x, {}

    def state_size(self, seq_len: int) -> int:
        return 0


def test_one_token_runs_the_single_token_impl_and_restores_impl():
    m = _Recorder()
    m(torch.zeros(2, 1, 4))
    m(torch.zeros(2, 3, 4))
    assert m.seen == ["reference", "fast"] and m.impl == "fast"
    m.impl = "reference"
    m(torch.zeros(2, 1, 4))
    assert m.seen[-1] == "reference"


def test_impl_is_restored_when_the_step_raises():
    m = _Recorder(fail=True)
    with pytest.raises(RuntimeError):
        m(torch.zeros(1, 1, 4))
    assert m.impl == "fast"


@pytest.mark.parametrize("name", list_mixers())
def test_single_token_impl_is_a_known_impl(name):
    assert get_entry(name).cls.single_token_impl in ("fast", "reference")
