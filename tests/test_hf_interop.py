"""The Hugging Face model under the tools users bring: ``transformers.Trainer`` with gradient accumulation,
``inputs_embeds`` and peft prompt tuning, explicit keyword arguments, registration on ``import seqmem.hf`` and
exported models that load with ``trust_remote_code``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from seqmem.hf import SeqmemConfig, SeqmemForCausalLM, SeqmemModel  # noqa: E402

V = 64


def _tiny(mixer: str = "deltanet") -> SeqmemForCausalLM:
    torch.manual_seed(0)
    return SeqmemForCausalLM(SeqmemConfig(vocab_size=V, d_model=16, n_layers=1, n_heads=2, mixer=mixer, mlp_ratio=2))


class _Rows(torch.utils.data.Dataset):
    """8 rows of 12 tokens; each row scores a different number of tokens (-100 elsewhere), so a mean per
    micro-batch divided by the accumulation steps is NOT the batch's token mean."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, V, (8, 12), generator=g)
        self.labels = self.ids.clone()
        for i in range(8):
            self.labels[i, : 1 + i] = -100

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def _trainer_step(tmp_path, accum: int) -> tuple[float, float, dict[str, torch.Tensor]]:
    model = _tiny()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / f"a{accum}"), per_device_train_batch_size=8 // accum,
        gradient_accumulation_steps=accum, max_steps=1, learning_rate=0.5, optim="sgd", lr_scheduler_type="constant",
        logging_steps=1, report_to="none", use_cpu=True, save_strategy="no", max_grad_norm=1e9, seed=0,
        dataloader_num_workers=0, disable_tqdm=True)
    tr = transformers.Trainer(model=model, args=args, train_dataset=_Rows())
    tr.train()
    log = next(r for r in tr.state.log_history if "loss" in r)
    return log["loss"], log["grad_norm"], {k: v.detach().clone() for k, v in model.named_parameters()}


def test_trainer_gradient_accumulation_1_2_4_equal(tmp_path):
    """Same global batch of 8 rows as 1, 2 or 4 micro-batches: the logged loss, the gradient norm and the updated
    weights agree (the loss is the batch's token mean, ≈ ln V at initialisation)."""
    runs = {a: _trainer_step(tmp_path, a) for a in (1, 2, 4)}
    loss1, gn1, w1 = runs[1]
    assert abs(loss1 - math.log(V)) < 0.2
    ds = _Rows()
    with torch.no_grad():
        ref = _tiny()(input_ids=ds.ids, labels=ds.labels).loss.item()
    assert loss1 == pytest.approx(ref, rel=1e-4)
    for a in (2, 4):
        loss, gn, w = runs[a]
        assert loss == pytest.approx(loss1, rel=1e-4), a
        assert gn == pytest.approx(gn1, rel=1e-4), a
        for k in w1:
            torch.testing.assert_close(w[k], w1[k], rtol=1e-4, atol=1e-6, msg=lambda m, k=k, a=a: f"{a} {k}: {m}")


def test_loss_normalised_by_num_items_in_batch():
    m = _tiny()
    ds = _Rows()
    with torch.no_grad():
        mean = m(input_ids=ds.ids, labels=ds.labels).loss
        n = int((ds.labels[:, 1:] != -100).sum())
        summed = m(input_ids=ds.ids, labels=ds.labels, num_items_in_batch=torch.tensor(2 * n)).loss
    torch.testing.assert_close(summed, mean / 2)


@pytest.mark.parametrize("cls", [SeqmemForCausalLM, SeqmemModel])
def test_inputs_embeds_equal_input_ids(cls):
    torch.manual_seed(0)
    m = cls(SeqmemConfig(vocab_size=V, d_model=16, n_layers=2, n_heads=2, mixer="gated_deltanet")).eval()
    ids = torch.randint(0, V, (2, 7))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    emb = m.get_input_embeddings()(ids)
    with torch.no_grad():
        for am in (None, mask):
            a = m(input_ids=ids, attention_mask=am)[0]
            b = m(inputs_embeds=emb, attention_mask=am)[0]
            torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="not both"):
        m(input_ids=ids, inputs_embeds=emb)
    with pytest.raises(ValueError, match="inputs_embeds must be"):
        m(inputs_embeds=emb[..., :8])


def test_labels_with_inputs_embeds():
    m = _tiny()
    ids = torch.randint(0, V, (2, 7))
    with torch.no_grad():
        a = m(input_ids=ids, labels=ids).loss
        b = m(inputs_embeds=m.get_input_embeddings()(ids), labels=ids).loss
    torch.testing.assert_close(a, b)



@pytest.mark.parametrize("mixer", [["gated_deltanet", "attention"], "vla"])
def test_generate_from_inputs_embeds_equals_input_ids(mixer):
    torch.manual_seed(0)
    m = SeqmemForCausalLM(SeqmemConfig(vocab_size=V, d_model=16, n_layers=2, n_heads=2, mixer=mixer,
                                       init_std=0.3)).eval()
    ids = torch.randint(1, V, (2, 7))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    kw = {"attention_mask": mask, "max_new_tokens": 5, "do_sample": False, "pad_token_id": 0}
    want = m.generate(ids, **kw)[:, 7:]
    emb = m.get_input_embeddings()(ids).detach()
    for use_cache in (True, False):
        got = m.generate(inputs_embeds=emb, use_cache=use_cache, **kw)
        assert torch.equal(got[:, -5:], want), use_cache
    docs = (Path(__file__).resolve().parents[1] / "docs" / "ecosystem.md").read_text()
    assert "no `generate` from `inputs_embeds`" not in docs  # the limit the docs used to claim


@pytest.mark.parametrize("cls", [SeqmemForCausalLM, SeqmemModel])
def test_config_return_dict_false_gives_tuples(cls):
    m = cls(SeqmemConfig(vocab_size=V, d_model=16, n_layers=1, n_heads=2, mixer="deltanet")).eval()
    ids = torch.randint(0, V, (1, 5))
    assert not isinstance(m(ids), tuple)
    m.config.return_dict = False  # transformers' rule: the config's value unless return_dict is given
    out = m(ids)
    assert isinstance(out, tuple) and torch.equal(out[0], m(ids, return_dict=True)[0])
    assert not isinstance(m(ids, return_dict=True), tuple)


def test_cache_from_a_model_with_other_layers_is_refused():
    def make(n):
        return SeqmemForCausalLM(SeqmemConfig(vocab_size=V, d_model=16, n_layers=n, n_heads=2,
                                              mixer="gated_deltanet")).eval()

    m3, m2 = make(3), make(2)
    ids = torch.randint(0, V, (1, 5))
    out = m3(ids, use_cache=True)
    cache = out["cache"] if "cache" in out else out["past_key_values"]
    with pytest.raises(ValueError, match="3 layers' states but the model has 2 layers"):
        m2(ids[:, :1], cache=cache, use_cache=True)
    assert len(cache) == 3  # left as it was

@pytest.mark.parametrize("cls", [SeqmemForCausalLM, SeqmemModel])
def test_unknown_keyword_arguments_are_errors(cls):
    m = cls(SeqmemConfig(vocab_size=V, d_model=16, n_layers=1, n_heads=2, mixer="deltanet"))
    ids = torch.randint(0, V, (1, 5))
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['atention_mask'\]"):
        m(input_ids=ids, atention_mask=torch.ones_like(ids))
    with pytest.raises(ValueError, match="output_attentions=True"):
        m(input_ids=ids, output_attentions=True)
    m(input_ids=ids, token_type_ids=torch.zeros_like(ids), output_attentions=False)  # a tokenizer's single segment
    with pytest.raises(ValueError, match="token_type_ids"):
        m(input_ids=ids, token_type_ids=torch.ones_like(ids))


def test_config_to_dict_has_transformers_size_names(tmp_path):
    c = SeqmemConfig(d_model=16, n_layers=3, n_heads=2)
    d = c.to_dict()
    assert (d["hidden_size"], d["num_hidden_layers"], d["num_attention_heads"]) == (16, 3, 2)
    c.save_pretrained(tmp_path)
    again = SeqmemConfig.from_pretrained(tmp_path)
    assert again.to_dict() == d
    assert SeqmemConfig(hidden_size=32, num_attention_heads=8).n_heads == 8
    with pytest.raises(ValueError, match="hidden_size=32 and d_model=16 disagree"):
        SeqmemConfig(d_model=16, hidden_size=32)
    # a field given with its default's value disagrees too (it used to lose silently to the alias)
    for kw in ({"d_model": 128, "hidden_size": 64}, {"n_layers": 2, "num_hidden_layers": 3},
               {"n_heads": 4, "num_attention_heads": 2}, {"tie_embeddings": False, "tie_word_embeddings": True},
               {"tie_embeddings": True, "tie_word_embeddings": False}):
        with pytest.raises(ValueError, match="disagree"):
            SeqmemConfig(**kw)
    assert SeqmemConfig(d_model=128, hidden_size=128).d_model == 128  # agreeing is fine
    assert SeqmemConfig(tie_word_embeddings=False).tie_embeddings is False
    assert SeqmemConfig(tie_embeddings=False).tie_word_embeddings is False



def test_tie_word_embeddings_and_tie_embeddings_are_one_value(tmp_path):
    """Untying a tied checkpoint with transformers' flag (or seqmem's) gives a finite head and a loadable save."""
    import json

    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    tied = SeqmemForCausalLM(SeqmemConfig(vocab_size=64, d_model=32, n_layers=1, n_heads=2, mixer="deltanet",
                                          init_std=0.02))
    tied.save_pretrained(tmp_path / "tied")
    ids = torch.randint(0, 64, (1, 6))
    for i, kw in enumerate(({"tie_word_embeddings": False}, {"tie_embeddings": False})):
        m = AutoModelForCausalLM.from_pretrained(tmp_path / "tied", **kw)
        assert m.config.tie_embeddings is False and m.config.tie_word_embeddings is False, kw
        assert m.model.head.weight is not m.model.embed.weight
        assert torch.equal(m.model.embed.weight, tied.model.embed.weight)
        head = m.model.head.weight
        assert bool(torch.isfinite(head).all()) and abs(head.std().item() / 0.02 - 1) < 0.2  # newly initialised
        m.save_pretrained(tmp_path / f"untied{i}")
        again = AutoModelForCausalLM.from_pretrained(tmp_path / f"untied{i}")
        assert torch.equal(again.model.head.weight, head) and torch.equal(again(ids).logits, m(ids).logits)
    c = SeqmemConfig()
    c.tie_word_embeddings = False  # set after construction: the one value changes
    assert c.tie_embeddings is False
    c.save_pretrained(tmp_path / "cfg")
    saved = json.loads((tmp_path / "cfg" / "config.json").read_text())
    assert (saved["tie_embeddings"], saved["tie_word_embeddings"]) == (False, False)
    assert SeqmemConfig.from_pretrained(tmp_path / "cfg").tie_embeddings is False


def test_config_checks_types_as_lm_config_does():
    for kw in ({"tie_embeddings": "false"}, {"tie_word_embeddings": "false"}, {"tie_embeddings": 1},
               {"mlp_ratio": "2"}, {"mlp_ratio": True}, {"norm_eps": "1e-5"}, {"init_std": True}):
        with pytest.raises(ValueError, match="must be"):
            SeqmemConfig(**kw)
    assert SeqmemConfig(mlp_ratio=2).to_lm_config().mlp_ratio == 2

def test_config_refuses_misspelt_fields(tmp_path):
    # transformers keeps unknown keywords as attributes: a misspelt field would build a default-sized model
    for kw, field in (({"d_modle": 32}, "d_model"), ({"mixers": "vla"}, "mixer"), ({"n_layer": 3}, "n_layers"),
                      ({"mixer_option": {}}, "mixer_options"), ({"norm_epsilon": 1e-6}, "norm_eps")):
        with pytest.raises(ValueError, match=f"did you mean '{field}'"):
            SeqmemConfig(**kw)
    # transformers' own keys and unrelated extras pass (config.json files carry them)
    c = SeqmemConfig(d_model=16, architectures=["SeqmemForCausalLM"], auto_map={}, my_note="x", pad_token_id=0)
    assert c.my_note == "x" and c.d_model == 16
    c.save_pretrained(tmp_path)
    assert SeqmemConfig.from_pretrained(tmp_path).to_dict() == c.to_dict()



def test_config_refuses_other_transformers_models_names():
    """initializer_range, intermediate_size, layer_norm_eps, n_embd, ... would be stored and ignored: refused, naming
    the seqmem field (transformers sets none of them on a config by default)."""
    from transformers import PretrainedConfig

    for kw, field in (({"initializer_range": 0.5}, "init_std"), ({"intermediate_size": 4096}, "mlp_ratio"),
                      ({"layer_norm_eps": 1e-2}, "norm_eps"), ({"rms_norm_eps": 1e-6}, "norm_eps"),
                      ({"n_embd": 64}, "d_model"), ({"num_key_value_heads": 2}, "n_heads")):
        assert not hasattr(PretrainedConfig(), next(iter(kw)))
        with pytest.raises(ValueError, match=f"not a seqmem field .*did you mean '{field}'"):
            SeqmemConfig(**kw)
    for kw, what in (({"hidden_act": "gelu"}, "SwiGLU"), ({"head_dim": 8}, "n_heads"),
                     ({"rope_theta": 1e4}, "rope_base")):
        with pytest.raises(ValueError, match=what):
            SeqmemConfig(**kw)

def test_peft_prompt_tuning_trains():
    peft = pytest.importorskip("peft", reason="peft not installed (pip install peft)")
    m = _tiny()
    pm = peft.get_peft_model(m, peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4))
    trainable = [n for n, p in pm.named_parameters() if p.requires_grad]
    assert trainable and all("prompt" in n for n in trainable)
    ids = torch.randint(0, V, (2, 6))
    out = pm(input_ids=ids, labels=ids)
    assert out.logits.shape == (2, 10, V)
    # the prompt's embeddings go in front of the tokens' as inputs_embeds
    prompt = pm.get_prompt(batch_size=2)
    with torch.no_grad():
        ref = m(inputs_embeds=torch.cat([prompt, m.get_input_embeddings()(ids)], 1)).logits
    torch.testing.assert_close(out.logits, ref)
    opt = torch.optim.Adam([p for p in pm.parameters() if p.requires_grad], lr=0.1)
    losses = []
    for _ in range(5):
        loss = pm(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


_LOAD = """
import sys, torch
from transformers import AutoModelForCausalLM
mode, path = sys.argv[1], sys.argv[2]
if mode == "import":
    import seqmem.hf
try:
    m = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=(mode == "remote") or None)
except Exception as e:
    print("ERROR", type(e).__name__, e)
    raise SystemExit(0)
ids = torch.arange(16).reshape(1, 16) % 32
torch.save(m.eval()(ids).logits.detach(), path + "/logits-" + mode + ".pt")
print("LOADED", type(m).__module__, type(m).__name__)
"""


def test_exported_model_loads_with_trust_remote_code_or_the_import(tmp_path):
    """`seqmem export-hf` output: loads in a fresh process with `import seqmem.hf` or with trust_remote_code=True
    (auto_map and two small files that import the installed seqmem); without either, the error names the fix."""
    import json
    import os
    import subprocess
    import sys

    from seqmem.cli import main

    run, out = tmp_path / "run", tmp_path / "hf"
    assert main(["train", "--task", "mqar", "--mixer", "deltanet", "--layers", "1", "--d-model", "16", "--heads", "2",
                 "--steps", "2", "--batch-size", "4", "--vocab-size", "32", "--num-pairs", "2", "--seq-len", "16",
                 "--eval-examples", "8", "--no-progress", "--out", str(run)]) == 0
    assert main(["export-hf", "--run", str(run), "--out", str(out)]) == 0
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["auto_map"]["AutoModelForCausalLM"] == "modeling_seqmem.SeqmemForCausalLM"
    assert (out / "modeling_seqmem.py").is_file() and (out / "configuration_seqmem.py").is_file()
    assert "import seqmem.hf" in (out / "README.md").read_text()  # where transformers' refusal sends the user
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    res = {}
    for mode in ("import", "remote", "plain"):
        p = subprocess.run([sys.executable, "-c", _LOAD, mode, str(out)], env=env, capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        res[mode] = p.stdout.strip()
    assert res["import"] == "LOADED seqmem.hf.modeling_seqmem SeqmemForCausalLM"
    assert res["remote"] == "LOADED seqmem.hf.modeling_seqmem SeqmemForCausalLM"
    torch.testing.assert_close(torch.load(out / "logits-remote.pt"), torch.load(out / "logits-import.pt"))
    assert "ERROR ValueError" in res["plain"] and "trust_remote_code=True" in res["plain"], res["plain"]


_TOKENIZER = """
import sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1], trust_remote_code=False)
print("LOADED", len(tok), tok.eos_token_id)
"""


def test_exported_tokenizer_loads_alone_without_the_import_or_a_prompt(tmp_path, capsys):
    """config.json's auto_map makes a plain AutoTokenizer call ask whether to run the directory's code; the way the
    card, the docs and export-hf's message give (trust_remote_code=False) loads it without a prompt."""
    import os
    import subprocess
    import sys

    from seqmem.cli import main

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(12):
        (corpus / f"d{i}.txt").write_text(f"document {i} " * 40)
    run, out = tmp_path / "run", tmp_path / "hf"
    assert main(["train", "--task", "lm", "--corpus", str(corpus), "--mixer", "deltanet", "--layers", "1",
                 "--d-model", "16", "--heads", "2", "--steps", "1", "--batch-size", "2", "--seq-len", "16",
                 "--eval-examples", "2", "--no-progress", "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["export-hf", "--run", str(run), "--out", str(out)]) == 0
    assert "trust_remote_code=False" in capsys.readouterr().err
    assert "trust_remote_code=False" in (out / "README.md").read_text()
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-c", _TOKENIZER, str(out)], env=env, capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().splitlines()[-1] == "LOADED 256 0"
    assert "Do you wish to run the custom code" not in p.stdout + p.stderr
