"""Review 20d (redone): Glm4's attention biases sit on q, k and v only (config.attention_bias True, o_proj unbiased),
its partial rotary turns interleaved pairs of dims, and its blocks norm before and after each sublayer; OLMo 2 norms
after each sublayer only. Each fact against Hugging Face's own modules (tiny random Glm4, 2 layers)."""
import warnings

import pytest
import torch

import headscope as hs
from headscope.models.config_facts import header_words
from tests_support import N_WORDS, SPECIALS, save_random_checkpoint, word_tokenizer


@pytest.fixture(scope="module")
def glm4(tmp_path_factory):
    from transformers import Glm4Config

    config = Glm4Config(vocab_size=len(SPECIALS) + N_WORDS, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                        bos_token_id=2, eos_token_id=3, pad_token_id=1)
    folder = tmp_path_factory.mktemp("glm4")
    hf = save_random_checkpoint(config, folder, word_tokenizer())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hf.eval(), hs.load_model(folder, device="cpu", dtype="float32")


def test_glm4_biases_named_as_its_modules_hold_them(glm4):
    hf, model = glm4
    attn = hf.model.layers[0].self_attn
    held = tuple(name for name, proj in (("q", attn.q_proj), ("k", attn.k_proj), ("v", attn.v_proj),
                                         ("output", attn.o_proj)) if proj.bias is not None)
    assert held == ("q", "k", "v") and hf.config.attention_bias is True  # the config alone would claim the output
    assert model.facts.attention_bias_on == held
    assert "attention_bias=True (on q, k and v (none on the output))" in repr(model)
    facts = {"attention_bias": True, "attention_bias_on": list(held)}
    from headscope.models.particulars import header_words as particular_words

    assert "attention biases on q, k and v (none on the output)" in particular_words(facts)


def test_glm4_interleaved_rotary_and_sandwich_norms(glm4):
    """Interleaved pairs: HF's Glm4 rotate_half sends dim 0 to dim 1 (Llama's to dim r/2); norms before and after
    each sublayer: its layers hold input_layernorm, post_self_attn_layernorm, post_attention_layernorm (pre-MLP) and
    post_mlp_layernorm."""
    from transformers.models.glm4.modeling_glm4 import rotate_half as glm_rotate
    from transformers.models.llama.modeling_llama import rotate_half as llama_rotate

    first = torch.eye(4)[0]  # dim 0 of a 4-dim rotary part
    assert glm_rotate(first).tolist() == [0.0, 1.0, 0.0, 0.0] and llama_rotate(first).tolist() == [0.0, 0.0, 1.0, 0.0]
    hf, model = glm4
    layer = hf.model.layers[0]
    assert all(isinstance(getattr(layer, n, None), torch.nn.Module) for n in
               ("input_layernorm", "post_self_attn_layernorm", "post_attention_layernorm", "post_mlp_layernorm"))
    assert model.facts.norm_placement == "before and after each sublayer"
    assert model.facts.rotary_interleaved is True and model.facts.rotary_dims == 4
    text = repr(model)
    assert "rotary on interleaved pairs of dims (2i, 2i + 1; GPT-J style)" in text
    assert "norms=before and after each sublayer" in text
    assert "norms before and after each sublayer" in header_words({"norm_placement": model.facts.norm_placement})


def test_olmo2_norms_after_each_sublayer_and_llama_rotary_by_halves(more_arch_dirs, tiny_models):
    olmo = hs.load_model(more_arch_dirs("olmo2"), device="cpu")
    hf_layer = olmo.bridge.original_model.model.layers[0]
    assert not hasattr(hf_layer, "input_layernorm") and hasattr(hf_layer, "post_feedforward_layernorm")
    assert olmo.facts.norm_placement == "after each sublayer only"
    llama = tiny_models["llama"]
    assert llama.facts.rotary_interleaved is False and llama.facts.norm_placement is None
    assert "interleaved" not in repr(llama) and "norms=" not in repr(llama)


def test_biases_read_off_the_modules_where_the_config_has_no_flag(tmp_path):
    """Qwen2 holds q/k/v biases with no attention_bias in its config (HF's Qwen2Attention hard-codes them): the facts
    and header name them, read off the modules as for Glm4."""
    from headscope.models.particulars import header_words as particular_words
    from tests_support import build_tiny_model

    model = hs.load_model(build_tiny_model("qwen2", tmp_path / "qwen2"), device="cpu")
    attn = model.bridge.original_model.model.layers[0].self_attn
    held = tuple(name for name, proj in (("q", attn.q_proj), ("k", attn.k_proj), ("v", attn.v_proj),
                                         ("output", attn.o_proj)) if proj.bias is not None)
    assert held == ("q", "k", "v") and getattr(model.bridge.original_model.config, "attention_bias", None) is None
    assert model.facts.attention_bias is True and model.facts.attention_bias_on == held
    assert "attention biases on q, k and v (none on the output)" in particular_words(vars(model.facts))
