"""The Echo tasks' oracle action mask (``action_mask=True``: the fact-bearing tokens, Echo App. G.1 / H.1) and its
way through the trainer and the evaluation to the model's SKA layers."""

from __future__ import annotations

import pytest
import torch

from seqmem.models import LanguageModel, LMConfig
from seqmem.tasks import build_task
from seqmem.tasks.base import split_batch
from seqmem.tasks.echo_tasks import (
    ARROW,
    COLON,
    EchoCommonWord,
    EchoMixture,
    EchoMQAR,
    EchoMultiHop,
    EchoNIAH,
    EchoSysPrompt,
    EchoToolTrace,
)
from seqmem.train import TrainConfig, evaluate, train

TASKS = {
    "niah": (lambda **k: EchoNIAH(seq_len=48, n_kv=3, **k), lambda t: 6),
    "mqar": (lambda **k: EchoMQAR(num_pairs=3, gap=10, **k), lambda t: 6),
    "multihop": (lambda **k: EchoMultiHop(seq_len=40, n_kv=3, **k), lambda t: 12),
    "sysprompt": (lambda **k: EchoSysPrompt(seq_len=48, n_vars=3, decoys=2, **k), lambda t: 10),
    "tooltrace": (lambda **k: EchoToolTrace(seq_len=48, n_calls=5, **k), lambda t: 25),
    "commonword": (lambda **k: EchoCommonWord(seq_len=40, list_len=4, **k), lambda t: 8),
    "mixture": (lambda **k: EchoMixture(seq_len=64, **k), None),
}


@pytest.mark.parametrize("name", list(TASKS))
def test_mask_marks_the_facts_and_changes_nothing_else(name):
    make, count = TASKS[name]
    plain, masked = make(), make(action_mask=True)
    x0, y0 = plain.sample(16, torch.Generator().manual_seed(5))
    batch = masked.sample(16, torch.Generator().manual_seed(5))
    assert len(batch) == 3
    x, y, m = batch
    assert torch.equal(x, x0) and torch.equal(y, y0)  # the mask draws no random numbers
    assert m.shape == x.shape and m.dtype == torch.long and set(m.unique().tolist()) <= {0, 1}
    for b in range(16):
        ones = m[b].nonzero().flatten()
        first_scored = int((y[b] != -100).nonzero()[0])
        assert ones.numel() > 0 and int(ones.max()) < first_scored  # facts come before every query
        if count is not None:
            assert ones.numel() == count(masked)
    xe, ye, me = masked.eval_data(20)
    assert torch.equal(xe, plain.eval_data(20)[0]) and torch.equal(me[:7], masked.eval_data(7)[2])
    cfg = masked.config()
    assert cfg["action_mask"] is True and "action_mask" not in plain.config()
    if name == "mqar":
        cfg.pop("seq_len")  # echo_mqar's config records seq_len = 4M + gap, which its constructor does not take
    again = build_task(cfg.pop("name"), **cfg)
    assert torch.equal(again.eval_data(4)[2], me[:4])


def test_niah_and_tooltrace_masks_hold_the_right_tokens():
    t = EchoNIAH(seq_len=40, n_kv=2, action_mask=True)
    x, y, m = t.sample(32, torch.Generator().manual_seed(0))
    on = x[m.bool()].view(32, 4)  # per example: k v k v in position order
    assert ((on[:, 0::2] >= t.keys[0]) & (on[:, 0::2] < t.keys[1])).all()
    assert ((on[:, 1::2] >= t.values[0]) & (on[:, 1::2] < t.values[1])).all()
    assert m[:, -2:].sum() == 0  # the query "Q k" is not a fact
    tt = EchoToolTrace(seq_len=48, n_calls=4, action_mask=True)
    x, y, m = tt.sample(8, torch.Generator().manual_seed(0))
    calls = x[m.bool()].view(8, 4, 5)
    assert (calls[:, :, 1] == COLON).all() and (calls[:, :, 3] == ARROW).all()


def test_bad_option():
    with pytest.raises(ValueError, match="action_mask"):
        EchoNIAH(action_mask=1)
    with pytest.raises(ValueError, match="batch must be"):
        split_batch((torch.zeros(2, 3),))


def _ska_lm(mixer=("mamba2", "ska")) -> LanguageModel:
    torch.manual_seed(0)
    opts = {"mamba2": {"d_state": 4}, "ska": {"rank": 4, "chunk_size": 8}, "attention": {}}
    model = LanguageModel(LMConfig(vocab_size=128, d_model=16, n_layers=2, n_heads=2, mixer=list(mixer),
                                   mixer_options=[opts[n] for n in mixer]))
    with torch.no_grad():
        for blk in model.blocks:
            if blk.mixer.takes_action_mask:
                blk.mixer.w_o.weight.normal_(0, 0.3)
    return model


def test_evaluate_passes_the_mask():
    model = _ska_lm()
    task = EchoNIAH(seq_len=32, n_kv=2, action_mask=True)
    ev = evaluate(model, task, n_examples=12, batch_size=5)
    x, y, m = task.eval_data(12)
    with torch.no_grad():
        logits, _ = model(x, action_mask=m)
    sc = y != -100
    loss = torch.nn.functional.cross_entropy(logits[sc], y[sc])
    assert abs(ev["loss"] - float(loss)) < 1e-5
    assert abs(ev["loss"] - evaluate(model, EchoNIAH(seq_len=32, n_kv=2), 12, 5)["loss"]) > 1e-6


def test_train_with_a_mask_and_refusal_without_ska():
    task = EchoMixture(seq_len=32, n_vars=2, n_calls=3, action_mask=True)
    cfg = TrainConfig(steps=2, batch_size=4, lr=1e-3, eval_examples=8, eval_batch_size=8, log_every=1)
    res = train(_ska_lm(), task, cfg)
    assert res.final is not None and 0 <= res.final["accuracy"] <= 1
    acc = train(_ska_lm(), task, TrainConfig(**{**cfg.__dict__, "grad_accum": 2}))  # the micro-batch path
    assert acc.final is not None
    with pytest.raises(ValueError, match="no layer of this model takes an action mask"):
        train(_ska_lm(("mamba2", "attention")), task, cfg)


def test_echo_mqar_rebuilds_from_its_config():
    """build_task(**config()) gives the same task (seq_len is derived: accepted when it agrees, refused when not)."""
    import pytest

    from seqmem.tasks import build_task

    t = build_task("echo_mqar", num_pairs=3, gap=10)
    t2 = build_task(**t.config())
    assert t2.config() == t.config() and t2.seq_len == 22
    with pytest.raises(ValueError, match="seq_len is 4 \\* num_pairs \\+ gap"):
        build_task("echo_mqar", num_pairs=3, gap=10, seq_len=21)


def test_facts_precede_every_scored_position_in_every_echo_task():
    """No target leakage for a reader of the whole masked context (SKA's one-operator mode, App. F eq. 53): in the
    training mixture, NIAH at every Table 2 length and every cell of the paper-scale grids, every fact precedes the
    first scored position, so the mask is 0 at each scored position and at its teacher-forced answer."""
    from seqmem.repro.echo import SCALES, task_grids
    from seqmem.tasks.echo_tasks import facts_precede_answers

    tasks = [EchoMixture(seq_len=64, action_mask=True)]
    tasks += [EchoNIAH(seq_len=t, n_kv=1, action_mask=True) for t in SCALES["paper"]["niah"]]
    tasks += [tk for cells in task_grids("paper", action_mask=True).values() for _, tk in cells]
    for task in tasks:
        _, y, m = task.sample(32, torch.Generator().manual_seed(1))
        ok = facts_precede_answers(y, m)
        assert ok.all(), task.config()
        sc = y != -100
        assert (m[sc] == 0).all() and (m[:, 1:][sc[:, :-1]] == 0).all()


def test_facts_precede_answers_detects_a_leak():
    from seqmem.tasks.echo_tasks import facts_precede_answers

    y = torch.full((3, 8), -100)
    y[:, 5] = 9
    m = torch.zeros(3, 8, dtype=torch.long)
    m[0, 4] = 1  # before: fine
    m[1, 6] = 1  # the teacher-forced answer's position: a leak
    m[2, 5] = 1  # the scored position itself
    assert facts_precede_answers(y, m).tolist() == [True, False, False]
    assert facts_precede_answers(torch.full((1, 4), -100), torch.ones(1, 4)).tolist() == [True]
    with pytest.raises(ValueError, match="batch, time"):
        facts_precede_answers(y, m[:, :-1])
