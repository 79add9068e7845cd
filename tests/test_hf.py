"""Hugging Face integration: Auto classes, cached generate == uncached, beam search, save/load round trip."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

import seqmem  # noqa: E402,F401  (registers model_type "seqmem")
from seqmem.hf import SeqmemCache, SeqmemConfig, SeqmemForCausalLM  # noqa: E402
from seqmem.models import LanguageModel, LMConfig  # noqa: E402

AutoConfig, AutoModelForCausalLM = transformers.AutoConfig, transformers.AutoModelForCausalLM


def _model(mixer, seed=0, **kw) -> SeqmemForCausalLM:
    torch.manual_seed(seed)
    n = len(mixer) if isinstance(mixer, list) else 2
    cfg = SeqmemConfig(vocab_size=40, d_model=32, n_layers=n, n_heads=2, mixer=mixer, mlp_ratio=2.0,
                      init_std=0.3, **kw)
    return AutoModelForCausalLM.from_config(cfg).eval()


def test_import_seqmem_does_not_import_transformers():
    code = "import sys, seqmem; assert 'transformers' not in sys.modules; print('ok')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_auto_config_defaults_and_validation():
    cfg = AutoConfig.for_model("seqmem")
    assert isinstance(cfg, SeqmemConfig) and cfg.model_type == "seqmem"
    assert (cfg.vocab_size, cfg.d_model, cfg.n_layers, cfg.mixer, cfg.mixer_options) == (256, 128, 2, "attention", {})
    assert cfg.hidden_size == 128 and cfg.num_hidden_layers == 2 and cfg.tie_word_embeddings is True
    with pytest.raises(ValueError, match="n_layers"):
        SeqmemConfig(n_layers=3, mixer=["attention", "mamba2"])
    lm = SeqmemConfig(mixer="deltanet", mixer_options={"chunk_size": 8}).to_lm_config()
    assert isinstance(lm, LMConfig) and lm.mixer == "deltanet" and lm.mixer_options == {"chunk_size": 8}


@pytest.mark.parametrize("mixer", [["gated_deltanet", "attention"], "mamba2", "vla"])
def test_greedy_generate_cache_equals_no_cache(mixer):
    m = _model(mixer)
    ids = torch.randint(0, 40, (2, 9), generator=torch.Generator().manual_seed(1))
    cached = m.generate(ids, max_new_tokens=12, do_sample=False)
    uncached = m.generate(ids, max_new_tokens=12, do_sample=False, use_cache=False)
    assert cached.shape == (2, 21)
    assert torch.equal(cached, uncached)
    assert torch.equal(cached, m.model.generate(ids, 12))  # the native seqmem decoder agrees too
    assert len(set(cached[0, 9:].tolist())) > 1  # not a degenerate constant stream


def test_recurrent_cache_has_constant_size_per_token():
    m = _model("gated_deltanet")
    ids = torch.randint(0, 40, (1, 16))
    out = m(ids, use_cache=True)
    cache = out.past_key_values
    assert isinstance(cache, SeqmemCache) and cache.get_seq_length() == 16
    sizes = []
    tok = out.logits[:, -1:].argmax(-1)
    for _ in range(20):
        out = m(tok, past_key_values=cache, use_cache=True)
        tok = out.logits[:, -1:].argmax(-1)
        sizes.append(cache.numel())
    assert cache.get_seq_length() == 36
    assert len(set(sizes)) == 1 and sizes[0] == m.model.state_size(36)
    # attention keeps a growing KV cache instead
    a = _model("attention")
    c1 = a(ids, use_cache=True).past_key_values.numel()
    c2 = a(torch.randint(0, 40, (1, 32)), use_cache=True).past_key_values.numel()
    assert c2 > 1.9 * c1  # grows with the context (plus a position counter per layer)


def test_beam_search_and_sampling():
    m = _model(["gated_deltanet", "attention"])
    ids = torch.randint(0, 40, (2, 6), generator=torch.Generator().manual_seed(3))
    b1 = m.generate(ids, max_new_tokens=8, num_beams=3, do_sample=False)
    b2 = m.generate(ids, max_new_tokens=8, num_beams=3, do_sample=False, use_cache=False)
    assert b1.shape == (2, 14) and torch.equal(b1, b2)
    # beam search finds a sequence at least as likely as greedy
    def logp(seq):
        lg = m(seq, use_cache=False).logits.log_softmax(-1)
        return lg[:, 5:-1].gather(-1, seq[:, 6:, None]).sum((1, 2))
    g = m.generate(ids, max_new_tokens=8, do_sample=False)
    assert bool((logp(b1) >= logp(g) - 1e-5).all())
    torch.manual_seed(0)
    s1 = m.generate(ids, max_new_tokens=8, do_sample=True, top_k=5)
    torch.manual_seed(0)
    s2 = m.generate(ids, max_new_tokens=8, do_sample=True, top_k=5, use_cache=False)
    assert torch.equal(s1, s2) and s1.shape == (2, 14)


def test_save_pretrained_round_trip(tmp_path):
    m = _model(["mamba2", "attention"], mixer_options=[{"chunk_size": 8}, {}])
    m.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file() and (tmp_path / "config.json").is_file()
    m2 = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(m2) is SeqmemForCausalLM and m2.config.mixer == ["mamba2", "attention"]
    assert m2.config.mixer_options == [{"chunk_size": 8}, {}]
    sd, sd2 = m.state_dict(), m2.state_dict()
    assert sd.keys() == sd2.keys() and all(torch.equal(sd[k], sd2[k]) for k in sd)
    assert m2.model.head.weight is m2.model.embed.weight
    ids = torch.randint(0, 40, (1, 10))
    assert torch.equal(m.generate(ids, max_new_tokens=6, do_sample=False),
                       m2.generate(ids, max_new_tokens=6, do_sample=False))


def test_untied_round_trip(tmp_path):
    m = _model("deltanet", tie_embeddings=False)
    assert m.model.head.weight is not m.model.embed.weight
    m.save_pretrained(tmp_path)
    m2 = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert m2.model.head.weight is not m2.model.embed.weight
    assert torch.equal(m.model.head.weight, m2.model.head.weight)


def test_labels_loss_and_from_language_model():
    torch.manual_seed(0)
    lm = LanguageModel(LMConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=2, mixer="linear_attention"))
    hf = SeqmemForCausalLM.from_language_model(lm)
    ids = torch.randint(0, 40, (2, 12))
    out = hf(ids, labels=ids)
    logits, _ = lm(ids)
    assert torch.allclose(out.logits, logits)
    ref = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 40), ids[:, 1:].reshape(-1))
    assert torch.allclose(out.loss, ref)
    out.loss.backward()
    assert hf.model.embed.weight.grad is not None
    assert hf(ids, logits_to_keep=1).logits.shape == (2, 1, 40)


def test_padding_mask_rejected():
    m = _model("deltanet")
    ids = torch.randint(0, 40, (2, 5))
    mask = torch.ones_like(ids)
    mask[0, 0] = 0
    with pytest.raises(ValueError, match="padded"):
        m(ids, attention_mask=mask)


def test_export_training_run(tmp_path, capsys):
    from seqmem.cli import main

    run = tmp_path / "run"
    assert main(["train", "--task", "mqar", "--mixer", "deltanet", "--layers", "1", "--d-model", "16", "--heads", "2",
                 "--steps", "2", "--batch-size", "4", "--vocab", "32", "--num-pairs", "2", "--seq-len", "16",
                 "--eval-examples", "8", "--no-progress", "--out", str(run)]) == 0
    assert main(["export-hf", "--run", str(run), "--out", str(tmp_path / "hf")]) == 0
    m = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    from seqmem.hf import from_run

    ref = from_run(str(run)).eval()
    ids = torch.randint(0, 32, (2, 16))
    assert torch.equal(m(ids).logits, ref(ids).logits) and m.config.mixer == "deltanet"
