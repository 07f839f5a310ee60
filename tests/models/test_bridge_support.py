"""Architectures TransformerLens's bridge has no adapter for are refused in one line from the config, before anything
loads (models/bridge_support.py, review 19d A1); XLM-R boots through RoBERTa's adapter and equals Hugging Face."""
from __future__ import annotations

from importlib.metadata import version

import pytest
import torch
import transformers

import headscope as hs
from headscope.errors import UnsupportedModelError
from tests.tests_support import N_WORDS, SPECIALS, save_random_checkpoint, word_tokenizer

VOCAB = dict(vocab_size=len(SPECIALS) + N_WORDS, pad_token_id=1)
TL = ".".join(version("transformer-lens").split(".")[:2])
ENCODERS = ("the encoders it loads are BertForMaskedLM, RobertaForMaskedLM, XLMRobertaForMaskedLM (through "
            "RobertaForMaskedLM's adapter)")


def _unsupported(arch: str, model_type: str, folder) -> str:
    return (f"{folder} ({arch}, model_type {model_type}) cannot load: TransformerLens {TL}'s bridge, through which "
            f"headscope loads every model, has no adapter for it; {ENCODERS}. Nothing was loaded or written.")


@pytest.fixture(scope="module")
def unsupported_dirs(tmp_path_factory):
    """Tiny random ELECTRA and DistilBERT masked LMs (d 16, 1 layer) with the word-level tokenizer."""
    root = tmp_path_factory.mktemp("unsupported")
    electra = transformers.ElectraConfig(**VOCAB, embedding_size=8, hidden_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, intermediate_size=32, max_position_embeddings=32)
    distil = transformers.DistilBertConfig(**VOCAB, dim=16, n_layers=1, n_heads=2, hidden_dim=32,
                                           max_position_embeddings=32)
    save_random_checkpoint(electra, root / "electra", word_tokenizer(), model_class=transformers.ElectraForMaskedLM)
    save_random_checkpoint(distil, root / "distil", word_tokenizer(), model_class=transformers.DistilBertForMaskedLM)
    return {"electra": (root / "electra", "ElectraForMaskedLM", "electra"),
            "distil": (root / "distil", "DistilBertForMaskedLM", "distilbert")}


def test_unsupported_encoders_are_refused_in_one_line_before_anything_loads(unsupported_dirs, monkeypatch):
    """Review 19d A1: ELECTRA and DistilBERT ended in TransformerLens's 4,140-character ValueError after loading the
    tokenizer and weights. Now: headscope's UnsupportedModelError, one line naming the architecture and the encoders
    the bridge loads, raised before the tokenizer or the bridge is touched."""
    from transformer_lens.model_bridge import TransformerBridge

    def never(*args, **kwargs):
        raise AssertionError("loading started")

    monkeypatch.setattr(TransformerBridge, "boot_transformers", never)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", never)
    for folder, arch, model_type in unsupported_dirs.values():
        with pytest.raises(UnsupportedModelError) as err:
            hs.load_model(str(folder), device="cpu")
        assert str(err.value) == _unsupported(arch, model_type, folder)


def test_the_cli_refuses_an_unsupported_encoder_with_that_line_and_writes_nothing(unsupported_dirs, tmp_path, capsys):
    from headscope.cli import main

    folder, arch, model_type = unsupported_dirs["electra"]
    out = tmp_path / "out"
    assert main(["report", "-q", "--quick", "--device", "cpu", "--model", str(folder), "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"headscope: error: {_unsupported(arch, model_type, folder)}"]
    assert list(tmp_path.iterdir()) == []  # no OUT, lock or staging folder


def test_a_decoder_without_an_adapter_names_the_nearest_decoders():
    from headscope.models.bridge_support import bridge_boot_kwargs

    with pytest.raises(UnsupportedModelError) as err:
        bridge_boot_kwargs({"architectures": ["FooBarForCausalLM"], "model_type": "foobar"}, "m")
    text = str(err.value)
    assert text.startswith(f"m (FooBarForCausalLM, model_type foobar) cannot load: TransformerLens {TL}'s bridge")
    assert "the nearest decoders it loads by name are " in text and "\n" not in text
    assert bridge_boot_kwargs(transformers.LlamaConfig(), "m") == {}


def test_xlm_roberta_boots_through_robertas_adapter_equal_to_hugging_face(tmp_path):
    """XLM-R's modules are RoBERTa's: with transformers' own XLMRobertaForMaskedLM under RoBERTa's adapter, the logits
    and every head's pattern equal a plain Hugging Face XLMRobertaForMaskedLM (eager) within 1e-5."""
    config = transformers.XLMRobertaConfig(**VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                           intermediate_size=64, max_position_embeddings=40, type_vocab_size=1)
    save_random_checkpoint(config, tmp_path / "xlmr", word_tokenizer(), model_class=transformers.XLMRobertaForMaskedLM)
    model = hs.load_model(str(tmp_path / "xlmr"), device="cpu")
    assert type(model.bridge.original_model).__name__ == "XLMRobertaForMaskedLM" and model.facts.is_encoder
    hf = transformers.XLMRobertaForMaskedLM.from_pretrained(tmp_path / "xlmr", attn_implementation="eager").eval()
    tokens = torch.tensor([[2, 7, 12, 9, 30, 41, 5, 3]])  # no pad id (1): RoBERTa's position ids count from it
    with torch.no_grad():
        ref = hf(tokens, output_attentions=True)
        logits, cache = model.bridge.run_with_cache(tokens)
    assert torch.allclose(logits, ref.logits, atol=1e-5, rtol=0)
    for layer in range(2):
        assert torch.allclose(cache[f"blocks.{layer}.attn.hook_pattern"], ref.attentions[layer], atol=1e-5, rtol=0)
