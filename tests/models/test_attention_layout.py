"""Review 17a C3: the report's header and print(model) name partial rotary (StableLM's partial_rotary_factor 0.25:
4 of each head's 16 dims turned) and the per-head q/k LayerNorm, read from the model, next to the attention layout."""
from __future__ import annotations

import pytest

import headscope as hs
from headscope.models.attention_layout import qk_norm
from headscope.reports import io
from tests_support import save_random_checkpoint, word_tokenizer


@pytest.fixture(scope="module")
def stablelm(tmp_path_factory):
    """A tiny random StableLmForCausalLM as review 17a's: 4 heads of 16 (2 KV), partial_rotary_factor 0.25,
    qk_layernorm (one LayerNorm per head)."""
    import transformers

    path = tmp_path_factory.mktemp("stablelm") / "stablelm"
    tok = word_tokenizer()
    config = transformers.StableLmConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, partial_rotary_factor=0.25,
                                         qk_layernorm=True, max_position_embeddings=64, bos_token_id=2, eos_token_id=3,
                                         pad_token_id=1)
    save_random_checkpoint(config, path, tok)
    return hs.load_model(str(path), device="cpu")


def test_print_model_names_partial_rotary_and_the_per_head_qk_layernorm(stablelm, tiny_models):
    """16-wide heads x 0.25 = 4 dims turned, 12 without position; StableLM's q_layernorm is a LayerNorm per head.
    A Llama with full rotary and no q/k norm says neither; Pythia-style GPT-NeoX (rotary_pct 0.25) says its part."""
    assert (stablelm.facts.rotary_dims, stablelm.facts.qk_norm) == (4, "LayerNorm per head")
    assert ("(2 KV), partial rotary (4 of each head's 16 dims turned, 12 position-free), q/k LayerNorm per head "
            "(after hook_q/hook_k, before hook_rot_q/hook_rot_k), d_model=64,") in repr(stablelm), repr(stablelm)
    assert (tiny_models["llama"].facts.rotary_dims, tiny_models["llama"].facts.qk_norm) == (None, None)
    assert "rotary" not in repr(tiny_models["llama"]) and "q/k" not in repr(tiny_models["llama"])
    neox = tiny_models["neox"]
    rope = neox.bridge.original_model.config.rope_parameters  # transformers 5: rotary_pct lives here
    assert neox.facts.rotary_dims == int(rope["partial_rotary_factor"] * 16) == 4


def test_stablelm_hook_q_is_before_its_per_head_layernorm(stablelm):
    """Review 20 A2: the words above say hook_q holds q before the per-head norm: StableLM's hook_q at layer 0 equals
    HF's q_proj on the layer's normed input, per head, and differs from its q_layernorm's output."""
    import torch

    from tests_support import random_tokens

    hf = stablelm.bridge.original_model
    layer = hf.model.layers[0]
    tokens = random_tokens(1, 6, seed=2)
    _, cache = stablelm.bridge.run_with_cache(tokens, names_filter=lambda n: n == "blocks.0.attn.hook_q")
    with torch.no_grad():
        x = layer.input_layernorm(hf.model.embed_tokens(tokens))  # [batch, pos, d_model]
        q = layer.self_attn.q_proj(x).view(1, 6, 4, 16)  # [batch, pos, head, d_head]
        normed = layer.self_attn.q_layernorm(q.transpose(1, 2)).transpose(1, 2)  # [batch, pos, head, d_head]
    torch.testing.assert_close(cache["blocks.0.attn.hook_q"], q, rtol=0, atol=1e-6)
    assert not torch.allclose(cache["blocks.0.attn.hook_q"], normed, atol=1e-3)


def test_qk_norm_over_the_whole_projection_is_not_called_per_head():
    """OLMo 2 normalises the whole q (all heads at once, one RMSNorm of n_heads x d_head), Qwen3 each head's own."""
    import transformers
    from transformers.models.olmo2.modeling_olmo2 import Olmo2Attention
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention

    olmo = transformers.Olmo2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    qwen = transformers.Qwen3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    assert qk_norm(Olmo2Attention(olmo, layer_idx=0), 16) == "RMSNorm over all heads"
    assert qk_norm(Qwen3Attention(qwen, layer_idx=0), 16) == "RMSNorm per head"


def test_report_header_names_partial_rotary_and_qk_norm(tmp_path, stablelm):
    """The header from the manifest's model facts (review 17a's words: StableLM's 'grouped-query attention' header
    said neither)."""
    from headscope.reports.html_report import write_report_files
    from headscope.reports.render import escape, md_escape

    f = stablelm.facts
    info = {"name": "m", "family": f.family, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "d_model": 64,
            "d_head": f.d_head, "rotary_dims": f.rotary_dims, "qk_norm": f.qk_norm}
    io.write_json(tmp_path / "manifest.json", {"config": {}, "model": {"name": "m"}})
    write_report_files(tmp_path, [], {}, info)
    header = ("StableLmForCausalLM, 2 layers x 4 heads (2 KV heads: grouped-query attention), partial rotary (4 of "
              "each head's 16 dims turned, 12 position-free), q/k LayerNorm per head (after hook_q/hook_k, "
              "before hook_rot_q/hook_rot_k), d_model 64")
    assert f"<p>{escape(header)}." in (tmp_path / "report.html").read_text()
    assert f"\n\n{md_escape(header)}\n" in (tmp_path / "report.md").read_text()
