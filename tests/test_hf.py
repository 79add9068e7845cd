"""Hugging Face integration: Auto classes, cached generate == uncached, beam search, save/load round trip."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

transformers = pytest.importorskip("transformers")

import seqmem  # noqa: E402
import seqmem.hf  # noqa: E402,F401  (registers model_type "seqmem")
from seqmem.hf import SeqmemCache, SeqmemConfig, SeqmemForCausalLM, SeqmemModel  # noqa: E402
from seqmem.models import LanguageModel, LMConfig  # noqa: E402

AutoConfig, AutoModelForCausalLM = transformers.AutoConfig, transformers.AutoModelForCausalLM


def _model(mixer, seed=0, **kw) -> SeqmemForCausalLM:
    torch.manual_seed(seed)
    n = len(mixer) if isinstance(mixer, list) else 2
    cfg = SeqmemConfig(vocab_size=40, d_model=32, n_layers=n, n_heads=2, mixer=mixer, mlp_ratio=2.0,
                      init_std=0.3, **kw)
    return AutoModelForCausalLM.from_config(cfg).eval()


def _cache(out):
    """The cache of a model output (``cache`` in transformers 5.x, ``past_key_values`` before)."""
    return out["cache"] if "cache" in out else out["past_key_values"]


def test_import_seqmem_does_not_import_transformers():
    code = "import sys, seqmem; assert 'transformers' not in sys.modules; print('ok')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_registration_on_import_seqmem_hf_only():
    code = (
        "import sys, seqmem\n"
        "assert 'seqmem.hf' not in sys.modules, 'import seqmem registered'\n"
        "import transformers\n"
        "from transformers import AutoConfig\n"
        "try:\n"
        "    AutoConfig.for_model('seqmem')\n"
        "    raise SystemExit('registered without import seqmem.hf')\n"
        "except ValueError:\n"
        "    pass\n"
        "import seqmem.hf\n"
        "from transformers import AutoModel, AutoModelForCausalLM\n"
        "cfg = AutoConfig.for_model('seqmem', d_model=16, n_heads=2, vocab_size=20)\n"
        "print(type(AutoModel.from_config(cfg)).__name__, type(AutoModelForCausalLM.from_config(cfg)).__name__)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["SeqmemModel", "SeqmemForCausalLM"], r.stdout


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
    cache = _cache(out)
    assert isinstance(cache, SeqmemCache) and cache.get_seq_length() == 16
    sizes = []
    tok = out.logits[:, -1:].argmax(-1)
    for _ in range(20):
        out = m(tok, cache=cache, use_cache=True)
        tok = out.logits[:, -1:].argmax(-1)
        sizes.append(cache.numel())
    assert cache.get_seq_length() == 36
    assert len(set(sizes)) == 1 and sizes[0] == m.model.state_size(36)
    # attention keeps a growing KV cache instead
    a = _model("attention")
    c1 = _cache(a(ids, use_cache=True)).numel()
    c2 = _cache(a(torch.randint(0, 40, (1, 32)), use_cache=True)).numel()
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



def test_constructed_model_has_language_models_initialisation():
    cfg = SeqmemConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=2, mixer=["mamba2", "attention"])
    torch.manual_seed(3)
    lm = LanguageModel(cfg.to_lm_config())
    torch.manual_seed(3)
    hf = SeqmemForCausalLM(cfg)
    sd, sd2 = lm.state_dict(), hf.model.state_dict()
    assert sd.keys() == sd2.keys() and all(torch.equal(sd[k], sd2[k]) for k in sd)


def _std_close(t, std):
    assert bool(torch.isfinite(t).all()), "not finite"
    assert abs(t.float().std().item() / std - 1) < 0.2, (t.float().std().item(), std)


def test_weights_missing_from_a_checkpoint_get_seqmems_initialisation(tmp_path):
    """Weights transformers reports as newly initialised hold seqmem's initialisation, never uninitialised memory."""
    from safetensors.torch import load_file, save_file

    # an untied backbone saved without its head, loaded as a causal LM: the head is missing
    cfg = SeqmemConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, mixer="gated_deltanet",
                       tie_embeddings=False, init_std=0.02)
    SeqmemModel(cfg).save_pretrained(tmp_path / "base")
    m = AutoModelForCausalLM.from_pretrained(tmp_path / "base")
    _std_close(m.model.head.weight, 0.02)
    # a checkpoint lacking a norm, an MLP matrix and a mixer's parameter (mamba2's D: ones at construction)
    torch.manual_seed(0)
    full = SeqmemForCausalLM(SeqmemConfig(vocab_size=64, d_model=64, n_layers=2, n_heads=2, mixer="mamba2",
                                          init_std=0.05))
    with torch.no_grad():
        for p in full.parameters():
            p.add_(1.0)  # loaded values differ from any fresh initialisation
    full.save_pretrained(tmp_path / "full")
    sd = load_file(tmp_path / "full" / "model.safetensors")
    gone = ["model.norm.weight", "model.blocks.1.mlp.down.weight", "model.blocks.0.mixer.D",
            "model.blocks.1.mixer.in_proj.weight"]
    save_file({k: v for k, v in sd.items() if k not in gone}, tmp_path / "full" / "model.safetensors",
              metadata={"format": "pt"})
    m = AutoModelForCausalLM.from_pretrained(tmp_path / "full")
    assert torch.equal(m.model.norm.weight, torch.ones(64))
    assert torch.equal(m.model.blocks[0].mixer.D, torch.ones_like(m.model.blocks[0].mixer.D))
    _std_close(m.model.blocks[1].mlp.down.weight, 0.05 / 2)  # init_std / sqrt(2 n_layers)
    w = m.model.blocks[1].mixer.in_proj.weight  # a mixer submodule's: as a fresh mixer's (torch's default here)
    _std_close(w, torch.nn.Linear(64, 1).weight.std().item())
    loaded = m.state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in sd.items() if k not in gone)  # the rest as saved
    assert bool(torch.isfinite(m(torch.randint(0, 64, (1, 5))).logits).all())


def test_resize_without_mean_resizing_initialises_new_rows_with_init_std():
    for tie in (True, False):
        torch.manual_seed(0)
        m = SeqmemForCausalLM(SeqmemConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=2, mixer="deltanet",
                                           tie_embeddings=tie, init_std=0.02))
        m.resize_token_embeddings(200, mean_resizing=False)
        _std_close(m.model.embed.weight[40:], 0.02)
        _std_close(m.model.head.weight[40:], 0.02)

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


def _left_pad(prompts, pad_id=0):
    T = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), T, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, T - len(p):], mask[i, T - len(p):] = p, 1
    return ids, mask


def _mixer_model(name, seed=0):
    opts = dict(seqmem.get_entry(name).cls.contract_configs[0])  # small chunk/block sizes, so rows cross them
    d = opts.pop("d_model", 16)
    torch.manual_seed(seed)
    cfg = SeqmemConfig(vocab_size=40, d_model=d, n_layers=2, n_heads=2, mixer=name, mixer_options=opts,
                       mlp_ratio=2.0, init_std=0.3)
    return AutoModelForCausalLM.from_config(cfg).eval()


@pytest.mark.parametrize("name", seqmem.list_mixers())
def test_left_padded_batch_generate_equals_per_example(name):
    """Masked positions enter no mixer's state: a left-padded batch generates what each prompt generates alone."""
    m = _mixer_model(name)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 40, (n,), generator=g) for n in (2, 9, 6, 9)]  # equal lengths share a group
    ids, mask = _left_pad(prompts, pad_id=7)  # an ordinary token id: only the mask tells pads apart
    out = m.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0,
                     output_scores=True, return_dict_in_generate=True)
    T = ids.shape[1]
    for i, p in enumerate(prompts):
        ref = m.generate(p[None], max_new_tokens=6, do_sample=False, pad_token_id=0, output_scores=True,
                         return_dict_in_generate=True)
        assert torch.equal(out.sequences[i, T:], ref.sequences[0, len(p):]), f"{name}: row {i}"
        for s, r in zip(out.scores, ref.scores):
            torch.testing.assert_close(s[i], r[0], rtol=1e-4, atol=1e-5)
    # the same without the cache (the whole padded prefix re-read every step)
    uncached = m.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0,
                          use_cache=False)
    assert torch.equal(uncached, out.sequences)


def test_padded_cache_is_batched_where_states_stack():
    m = _model(["gated_deltanet", "attention"])
    ids, mask = _left_pad([torch.tensor([3, 4]), torch.tensor([5, 6, 7, 8])])
    cache = _cache(m(ids, attention_mask=mask, use_cache=True))
    assert isinstance(cache.states[0], dict) and cache.states[0]["S"].shape[0] == 2  # fixed size: one batch
    assert isinstance(cache.states[1], list) and len(cache.states[1]) == 2  # KV caches of lengths 2 and 4
    assert cache.batch_size == 2 and cache.get_seq_length() == 4


def test_padded_beam_search_and_sampling_equal_per_example():
    m = _model(["gated_deltanet", "attention"])
    prompts = [torch.tensor([3, 9, 4]), torch.tensor([5, 6, 7, 8, 2, 11])]
    ids, mask = _left_pad(prompts)
    b = m.generate(ids, attention_mask=mask, max_new_tokens=5, num_beams=3, do_sample=False, pad_token_id=0)
    for i, p in enumerate(prompts):
        ref = m.generate(p[None], max_new_tokens=5, num_beams=3, do_sample=False, pad_token_id=0)
        assert torch.equal(b[i, ids.shape[1]:], ref[0, len(p):])
    torch.manual_seed(0)
    s1 = m.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=True, top_k=5, pad_token_id=0)
    torch.manual_seed(0)
    s2 = m.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=True, top_k=5, pad_token_id=0,
                    use_cache=False)
    assert torch.equal(s1, s2)


def test_right_padded_forward_and_loss():
    """Training batches padded on the right: real positions get the unpadded logits; pads are skipped."""
    m = _model(["mamba2", "attention"])
    a, b = torch.tensor([3, 9, 4, 1, 5]), torch.tensor([5, 6, 7])
    ids = torch.stack([a, torch.cat([b, torch.tensor([0, 0])])])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    out = m(ids, attention_mask=mask, use_cache=False)
    torch.testing.assert_close(out.logits[0], m(a[None]).logits[0])
    torch.testing.assert_close(out.logits[1, :3], m(b[None]).logits[0])
    assert bool((out.logits[1, 3:] == 0).all())
    labels = ids.masked_fill(mask == 0, -100)
    loss = m(ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    assert torch.isfinite(loss) and m.model.embed.weight.grad is not None
    with pytest.raises(ValueError, match="no 1"):
        m(ids, attention_mask=torch.tensor([[1, 1, 1, 1, 1], [0, 0, 0, 0, 0]]))


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_gradient_checkpointing_equal_gradients():
    ids = torch.randint(0, 40, (2, 12), generator=torch.Generator().manual_seed(2))
    grads, calls = [], []
    for kwargs in (None, {}, {"use_reentrant": True}):
        m = _model(["gated_deltanet", "attention"]).train()
        if kwargs is not None:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs or None)
            assert m.gradient_checkpointing
        runs = []
        m.model.blocks[0].register_forward_pre_hook(lambda *a, runs=runs: runs.append(1))
        m(ids, labels=ids).loss.backward()
        calls.append(len(runs))
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    assert calls == [1, 2, 2]  # checkpointed blocks run again in the backward pass
    for g in grads[1:]:
        assert g.keys() == grads[0].keys() and len(g) > 5
        for k in grads[0]:
            torch.testing.assert_close(g[k], grads[0][k], rtol=1e-5, atol=1e-7)


def test_output_hidden_states_and_auto_model(tmp_path):
    m = _model(["deltanet", "attention"])
    ids = torch.randint(0, 40, (2, 7))
    out = m(ids, output_hidden_states=True)
    hs = out.hidden_states
    assert len(hs) == 3 and all(h.shape == (2, 7, 32) for h in hs)
    torch.testing.assert_close(hs[0], m.model.embed(ids))
    torch.testing.assert_close(m.model.head(hs[-1]), out.logits)  # the last one is after the final norm
    assert m(ids).hidden_states is None
    m.save_pretrained(tmp_path)
    base = transformers.AutoModel.from_pretrained(tmp_path).eval()
    assert type(base) is SeqmemModel
    bo = base(ids, output_hidden_states=True)
    torch.testing.assert_close(bo.last_hidden_state, hs[-1])
    assert len(bo.hidden_states) == 3


def test_resize_token_embeddings():
    for tie in (True, False):
        m = _model("gated_deltanet", tie_embeddings=tie)
        ids = torch.randint(0, 40, (1, 6))
        before = m(ids).logits
        m.resize_token_embeddings(48)
        assert m.config.vocab_size == 48 and m.model.cfg.vocab_size == 48
        assert m.model.embed.weight.shape[0] == 48 and m.model.head.weight.shape[0] == 48
        assert (m.model.head.weight is m.model.embed.weight) == tie
        after = m(torch.cat([ids, torch.tensor([[45]])], 1)).logits  # a new id is accepted
        assert after.shape == (1, 7, 48)
        torch.testing.assert_close(after[:, :6, :40], before)
        assert m.generate(ids, max_new_tokens=3, do_sample=False).shape == (1, 9)


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


def test_export_byte_lm_run_with_tokenizer(tmp_path):
    from seqmem.cli import main

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(12):
        (corpus / f"d{i}.txt").write_text(f"document {i} " * 40)
    run = tmp_path / "run"
    assert main(["train", "--task", "lm", "--corpus", str(corpus), "--mixer", "gated_deltanet", "--layers", "1",
                 "--d-model", "16", "--heads", "2", "--steps", "2", "--batch-size", "2", "--seq-len", "16",
                 "--eval-examples", "2", "--no-progress", "--out", str(run)]) == 0
    out = tmp_path / "hf"
    assert main(["export-hf", "--run", str(run), "--out", str(out)]) == 0
    tok = transformers.AutoTokenizer.from_pretrained(out)
    m = AutoModelForCausalLM.from_pretrained(out).eval()
    assert m.config.eos_token_id == tok.eos_token_id == 0 and tok.pad_token_id == 0
    assert tok("hé")["input_ids"] == list("hé".encode())
    batch = tok(["ab", "document 1"], return_tensors="pt", padding=True, padding_side="left")
    gen = m.generate(**batch, max_new_tokens=4, do_sample=False)
    assert gen.shape == (2, 14)
    assert isinstance(tok.decode(gen[1]), str)


def test_export_bpe_run_tokenizer(tmp_path, monkeypatch):
    from seqmem.cli import main
    from seqmem.hf.tokenizer import run_tokenizer

    monkeypatch.setenv("SEQMEM_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    words = "the quick brown fox jumps over a lazy dog".split()
    for i in range(20):
        (corpus / f"d{i}.txt").write_text(" ".join(words[(i + j) % 9] for j in range(150)))
    run = tmp_path / "run"
    assert main(["train", "--task", "lm", "--dataset", str(corpus), "--tokenizer", "train:300", "--seq-len", "16",
                 "--mixer", "deltanet", "--layers", "1", "--d-model", "16", "--heads", "2", "--steps", "2",
                 "--batch-size", "2", "--eval-examples", "2", "--no-progress", "--out", str(run)]) == 0
    assert main(["export-hf", "--run", str(run), "--out", str(tmp_path / "hf")]) == 0
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    cfg = AutoConfig.from_pretrained(tmp_path / "hf")
    assert tok.eos_token == "<|endoftext|>" and tok.pad_token == tok.eos_token
    assert cfg.eos_token_id == tok.eos_token_id == tok.pad_token_id is not None
    # the same ids as the run's own tokenizer
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(run / "tokenizer" / "tokenizer.json"))
    text = "the lazy dog jumps"
    assert tok(text)["input_ids"] == raw.encode(text, add_special_tokens=False).ids
    assert len(run_tokenizer(run)) == len(tok) == cfg.vocab_size
