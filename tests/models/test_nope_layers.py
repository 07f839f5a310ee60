"""Review 19c A1/A2: SmolLM3's no_rope_layers (1 = rotary, 0 = none, as HF's use_rope reads it) leave some layers
without position encoding. facts.rope_bases has None there and facts.nope_layers names them; print(model), the report
header, model.cfg and `headscope sites` say so, and hook_rot_q / hook_rot_k equal hook_q / hook_k there."""
from __future__ import annotations

import pytest
import torch
import transformers

import headscope as hs
from headscope.hooks.sites import describe_site
from headscope.models.config_facts import header_words, rope_words
from headscope.reports.report import model_record
from tests_support import N_WORDS, SPECIALS, random_tokens, save_random_checkpoint

WORDS = "no rotary (NoPE) on layers 1, 3"


@pytest.fixture(scope="module")
def smol(tiny_dirs, tmp_path_factory):
    """(folder, HookedModel) of a random SmolLM3: 4 layers, d_model 32, no_rope_layers [1, 0, 1, 0]."""
    config = transformers.SmolLM3Config(
        vocab_size=len(SPECIALS) + N_WORDS, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, no_rope_layers=[1, 0, 1, 0],
        bos_token_id=2, eos_token_id=3, pad_token_id=1, tie_word_embeddings=True)
    folder = tmp_path_factory.mktemp("smollm3") / "smol"
    save_random_checkpoint(config, folder, tiny_dirs["llama"])
    return folder, hs.load_model(folder, device="cpu")


def test_rotary_is_skipped_on_the_nope_layers_and_the_words_name_them(smol):
    folder, model = smol
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    assert [bool(layer.self_attn.use_rope) for layer in hf.model.layers] == [True, False, True, False]  # HF's own flag
    _, cache = model.run_with_cache(random_tokens(1, 8, seed=1))
    for layer in range(4):  # by hand: the rotation leaves q and k as they are exactly on the NoPE layers
        same = torch.equal(cache["rot_q", layer], cache["q", layer]) and torch.equal(cache["rot_k", layer], cache["k", layer])
        assert same == (layer in (1, 3)), layer
    assert model.facts.nope_layers == (1, 3)
    base = float(hf.config.rope_parameters["rope_theta"])  # SmolLM3's default, 2e6
    assert model.facts.rope_bases == (base, None, base, None)
    assert f"{WORDS}, " in repr(model)
    assert WORDS in header_words(model_record(model))
    assert list(model.cfg.nope_layers) == [1, 3] and model.cfg.rotary_base == base
    for layer in range(4):
        doc = describe_site("rot_q", facts=model.facts, layer=layer)[1]
        assert ("equal to q: no rotary (NoPE) on this layer" in doc) == (layer in (1, 3)), doc
    assert "equal to k on layers 1, 3: no rotary (NoPE) there" in describe_site("rot_k", facts=model.facts)[1]


def test_rope_words_skip_the_nope_layers():
    assert rope_words((1e4, None, 1e6, None)) == "rotary base 10000 on layer 0 and 1e+06 on layer 2"
    assert rope_words((1e4, None, 1e4, None)) == ""


def test_kv_and_position_words_name_the_nope_layers(smol):
    """Review 19c B2: the review's sink on layer 1 (2.3x uniform) sits on a NoPE layer: the kv and position sink
    sentence says which layers apply no rotary and that the sink is on one; the kv summary records them."""
    from headscope.reports.findings import sink_sentence

    def rec(layer, mass, sink):
        return {"layer": layer, "mass": mass, "baseline": 0.13555, "ci": [mass - 0.02, mass + 0.02],
                "excess_ci": [mass - 0.16, mass - 0.12], "ratio": mass / 0.13555, "n": 16, "sink": sink}

    records = [rec(0, 0.16, False), rec(1, 0.31, True), rec(2, 0.14, False), rec(3, 0.12, False)]
    text = sink_sentence(records, n_sink=1, nope=[1, 3])
    assert text.endswith("95%-CI above 0). Layers 1, 3 apply no rotary (NoPE): attention there has no position "
                         "encoding of its own; positions reach it through the causal mask and what earlier layers "
                         "wrote into the residual stream (the sink on layer 1 is on them)."), text
    assert "NoPE" not in sink_sentence(records, n_sink=1)
    _, model = smol
    s = hs.kv_analysis(model, None, hs.KVConfig.preset(quick=True)).summary
    assert s["nope_layers"] == [1, 3]


def test_position_retrieval_heads_on_a_nope_layer_are_named():
    from headscope.reports.plots_position import _retrieval

    test = {"n_rows": 80, "n_heads": 16, "n_examples": 40, "correction": "holm",
            "heads": [{"layer": 1, "head": 2, "r": 0.61, "ci": [0.4, 0.76], "p_holm": 0.001},
                      {"layer": 2, "head": 0, "r": 0.5, "ci": [0.3, 0.66], "p_holm": 0.01}]}
    said = _retrieval({"retrieval_test": test, "nope_layers": [1, 3]})
    assert said.endswith(" L1H2 is on a layer without rotary (NoPE), which has no position encoding of its own "
                         "(positions reach it through the causal mask and the residual stream)."), said
    assert "NoPE" not in _retrieval({"retrieval_test": test})
