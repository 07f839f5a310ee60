"""Reviews 18b A3, A4, C1: Gemma 2/3's scalings, soft-caps and rotary bases in model.facts, model.cfg, print(model)
and the report header, on tiny random Gemmas whose query_pre_attn_scalar (24) is not head_dim (16), so the score
scale 24^-0.5 differs from 1/sqrt(d_head); Gemma 3 with rotary bases 1e4 (sliding) / 1e6 (global) and a final
soft-cap, Gemma 2 with both soft-caps and one rotary base 5e5 (TransformerLens's default is 1e4). Expected values
are the Hugging Face configs' numbers in closed form and plain HF's embedding module."""
from __future__ import annotations

import math

import pytest
import torch

import headscope as hs
from headscope.reports import io
from tests_support import save_random_checkpoint, word_tokenizer

_FIELDS = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               head_dim=16, query_pre_attn_scalar=24, sliding_window=8, max_position_embeddings=64,
               layer_types=["sliding_attention", "full_attention"], bos_token_id=2, eos_token_id=3, pad_token_id=1)


@pytest.fixture(scope="module")
def gemmas(tmp_path_factory):
    """{"gemma3": HookedModel, "gemma2": HookedModel}, float32, random weights (seed 0)."""
    import transformers

    tok, root, out = word_tokenizer(), tmp_path_factory.mktemp("gemma-scales"), {}
    configs = {
        "gemma3": transformers.Gemma3TextConfig(vocab_size=len(tok), final_logit_softcapping=5.0, **_FIELDS),
        "gemma2": transformers.Gemma2Config(vocab_size=len(tok), attn_logit_softcapping=3.0, final_logit_softcapping=6.0,
                                            rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, **_FIELDS),
    }
    assert configs["gemma3"].rope_parameters["sliding_attention"]["rope_theta"] == 10000.0
    assert configs["gemma3"].rope_parameters["full_attention"]["rope_theta"] == 1000000.0
    for name, config in configs.items():
        save_random_checkpoint(config, root / name, tok, plain=True)
        out[name] = hs.load_model(str(root / name), device="cpu", dtype="float32")
    return out


@pytest.mark.parametrize("name", ["gemma3", "gemma2"])
def test_facts_carry_the_embedding_and_score_scales(gemmas, name):
    """A4: embed_scale is sqrt(d_model) = 8 (it was 1.0): HF's embedding module gives W_E[token] x 8; attention_scale
    is query_pre_attn_scalar^-0.5 = 0.2041 (it was None, read as 1/sqrt(16) = 0.25); the soft-caps and rotary bases
    are the configs'."""
    model = gemmas[name]
    f, hf = model.facts, model.bridge.original_model
    assert f.embed_scale == 8.0 == math.sqrt(64)
    tokens = torch.tensor([[2, 7, 9, 11]])
    with torch.no_grad():
        assert torch.equal(hf.get_input_embeddings()(tokens), hf.get_input_embeddings().weight[tokens] * f.embed_scale)
    assert f.attention_scale == pytest.approx(24 ** -0.5, rel=1e-12) and f.d_head == 16
    if name == "gemma3":
        assert (f.final_softcap, f.attn_softcap, f.rope_bases) == (5.0, None, (10000.0, 1000000.0))
    else:
        assert (f.final_softcap, f.attn_softcap, f.rope_bases) == (6.0, 3.0, (500000.0, 500000.0))


def test_cfg_reads_as_transformer_lens_configs_give_gemma(gemmas):
    """A3: model.cfg's fields as TransformerLens's own Gemma configs give them: attn_scale the scores' divisor
    sqrt(24) (was -1, sqrt(16)), use_qk_norm, window_size 8 with attn_types local/global (were None), rotary_base
    the global layers' 1e6 and rotary_base_local 1e4 (was 10000 everywhere), scale_embedding (was None),
    use_normalization_before_and_after (was False)."""
    g3, g2 = gemmas["gemma3"].cfg, gemmas["gemma2"].cfg
    assert g3.attn_scale == pytest.approx(math.sqrt(24)) and g3.use_attn_scale
    assert (g3.use_qk_norm, g3.window_size, g3.attn_types, g3.use_local_attn) == (True, 8, ["local", "global"], True)
    assert (g3.rotary_base, g3.rotary_base_local, g3.scale_embedding) == (1000000, 10000, True)
    assert (g3.output_logits_soft_cap, g3.d_head) == (5.0, 16)
    assert g3.use_normalization_before_and_after and g2.use_normalization_before_and_after  # four norms per block
    assert g2.attn_scale == pytest.approx(math.sqrt(24)) and g2.use_qk_norm is False  # Gemma 2 has no q/k norm
    assert (g2.rotary_base, getattr(g2, "rotary_base_local", None), g2.attn_types) == (500000, None, ["local", "global"])
    assert (g2.attn_scores_soft_cap, g2.output_logits_soft_cap, g2.scale_embedding) == (3.0, 6.0, True)


def test_print_model_names_the_scales_caps_and_rotary_bases(gemmas):
    """C1: print(model) names the x8 embedding, the score scale, the rotary bases where layers differ and the caps."""
    assert ("sliding_window=8 on layer 0, embed_scale=8, attention_scale=0.204124 (not 1/sqrt(16)), rope_theta=(10000 "
            "on the sliding-window layers; 1e+06 on the global ones), norms=before and after each sublayer, "
            "final_logit_softcap=5, dtype=float32") in repr(gemmas["gemma3"])
    assert ("embed_scale=8, attention_scale=0.204124 (not 1/sqrt(16)), norms=before and after each sublayer, "
            "attn_softcap=3, final_logit_softcap=6, dtype=float32") in repr(gemmas["gemma2"])


def test_report_header_names_the_scales_caps_and_rotary_bases(tmp_path, gemmas):
    """C1/A4: the header from the manifest's facts names the scalings (embedding x8, scores x0.204124), the final
    soft-cap and the two rotary bases."""
    from headscope.models.config_facts import rope_words
    from headscope.reports.html_report import write_report_files
    from headscope.reports.render import md_escape
    from headscope.reports.report import model_record

    info = io.read_json(io.write_json(tmp_path / "m.json", model_record(gemmas["gemma3"])))
    io.write_json(tmp_path / "manifest.json", {"config": {}, "model": {"name": "m"}})
    write_report_files(tmp_path, [], {}, info)  # the facts as the manifest's JSON holds them
    want = ("d_model 64, scalings: embedding x8, attention scores x0.204124 (not 1/sqrt(d_head)), final logits "
            "soft-capped: 5 tanh(logit / 5), rotary base 10000 on the sliding-window layers and 1e+06 on the global ones, "
            "norms before and after each sublayer, layer 0 attends over a sliding window of 8 keys (the others globally)")
    assert md_escape(want) in (tmp_path / "report.md").read_text()
    # bases that do not follow the windows are listed by layer
    assert rope_words((1e4, 1e4, 1e6, 1e4), [0, 1]) == "rotary base 10000 on layers 0, 1, 3 and 1e+06 on layer 2"
    assert rope_words((5e5, 5e5), [0]) == ""


@pytest.mark.parametrize("name", ["gemma3", "gemma2"])
def test_patterns_at_the_unequal_score_scale_are_hugging_faces(gemmas, name):
    """A4's numbers: with query_pre_attn_scalar 24 != head_dim 16, every layer's cached pattern (sliding layer 0,
    global layer 1; Gemma 2's score soft-cap too) is plain HF eager's output_attentions."""
    from transformers import AutoModelForCausalLM

    model = gemmas[name]
    hf = AutoModelForCausalLM.from_pretrained(model.source, dtype=torch.float32, attn_implementation="eager").eval()
    tokens = torch.tensor([[2] + [4 + (7 * i) % 60 for i in range(11)]])  # [1, 12]: past the window of 8
    with torch.no_grad():
        want = hf(tokens, output_attentions=True).attentions  # n_layers x [1, head, q, k]
    _, cache = model.run_with_cache(tokens)
    for layer in range(2):
        assert torch.allclose(cache["pattern", layer], want[layer], atol=1e-6), layer

