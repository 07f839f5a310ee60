"""Review 20 A1: Cohere2 and Exaone4 (hybrid sliding/global attention) apply rotary only on their sliding layers; their
global layers are NoPE. facts.nope_layers names them, rope_bases has None there, and print(model), the report header
and model.cfg say so. Checked against the Hugging Face attention modules themselves: on a NoPE layer the module's
output does not move when the position ids change the query-key distances, on a rotary layer it does."""
from __future__ import annotations

import pytest
import torch
import transformers

import headscope as hs
from headscope.models.config_facts import header_words
from headscope.reports.report import model_record

ARCHS = ("cohere2", "exaone4")


@pytest.fixture(scope="module")
def hybrids(more_arch_dirs):
    """arch -> (HookedModel, HF eager model) of the tiny random Cohere2 and Exaone4 (layer 0 sliding, 1 global)."""
    out = {}
    for arch in ARCHS:
        folder = more_arch_dirs(arch)
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
        out[arch] = hs.load_model(folder, device="cpu"), hf
    return out


def hf_position_blind(hf, layer: int) -> bool:
    """Whether HF's own attention module at `layer` gives the same output for position ids 0..7 and 0, 3, .., 21 (the
    query-key distances tripled; a constant shift would leave rotary's scores as they are too)."""
    torch.manual_seed(0)
    x = torch.randn(1, 8, hf.config.hidden_size)  # [batch, pos, d_model]
    attn = hf.model.layers[layer].self_attn
    outs = []
    with torch.no_grad():
        for pos in (torch.arange(8)[None], 3 * torch.arange(8)[None]):  # [1, pos]
            out = attn(hidden_states=x, position_embeddings=hf.model.rotary_emb(x, pos), attention_mask=None)[0]
            outs.append(out)  # [batch, pos, d_model]
    return torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("arch", ARCHS)
def test_global_layers_without_rotary_are_named_nope(hybrids, arch):
    model, hf = hybrids[arch]
    blind = tuple(layer for layer in range(2) if hf_position_blind(hf, layer))
    assert blind == (1,)  # HF's global layer ignores positions, its sliding one does not
    assert model.facts.nope_layers == blind
    base = float(hf.config.rope_parameters["rope_theta"])
    assert model.facts.rope_bases == (base, None)
    assert "no rotary (NoPE) on layer 1, " in repr(model)
    assert "no rotary (NoPE) on layer 1" in header_words(model_record(model))
    assert list(model.cfg.nope_layers) == [1]


def test_exaone4_q_k_sites_hold_the_projection_before_the_per_head_norm(hybrids):
    """Review 20 A2: Exaone4's hook_q / hook_k hold q_proj / k_proj's output per head, before its per-head q/k RMSNorm;
    hook_q_normed the norm's output; hook_rot_q the normed q rotated, and on the NoPE layer 1 the normed q as it is
    (not hook_q). Each from HF's own modules on the attention's input; the site table and header say so."""
    from headscope.hooks.sites import describe_site
    from headscope.models.attention_layout import attention_words
    from tests_support import random_tokens

    model, hf = hybrids["exaone4"]
    tokens = random_tokens(1, 8, seed=1)
    inputs = {}
    handles = [hf.model.layers[i].self_attn.register_forward_pre_hook(
        lambda mod, args, kw, i=i: inputs.__setitem__(i, kw["hidden_states"]), with_kwargs=True) for i in range(2)]
    with torch.no_grad():
        hf(tokens)
    for h in handles:
        h.remove()
    names = [f"blocks.{i}.attn.{n}" for i in range(2) for n in ("hook_q", "hook_k", "hook_q_normed", "hook_rot_q")]
    _, cache = model.bridge.run_with_cache(tokens, names_filter=lambda n: n in names)
    for i in range(2):
        attn = hf.model.layers[i].self_attn
        q = attn.q_proj(inputs[i]).view(1, 8, -1, attn.head_dim)  # [batch, pos, head, d_head]
        k = attn.k_proj(inputs[i]).view(1, 8, -1, attn.head_dim)  # [batch, pos, kv_head, d_head]
        normed = attn.q_norm(q)  # [batch, pos, head, d_head]
        torch.testing.assert_close(cache[f"blocks.{i}.attn.hook_q"], q, rtol=0, atol=1e-6)
        torch.testing.assert_close(cache[f"blocks.{i}.attn.hook_k"], k, rtol=0, atol=1e-6)
        torch.testing.assert_close(cache[f"blocks.{i}.attn.hook_q_normed"].transpose(1, 2), normed, rtol=0, atol=1e-6)
        rot = cache[f"blocks.{i}.attn.hook_rot_q"]  # [batch, pos, head, d_head]
        assert torch.allclose(rot, normed, rtol=0, atol=1e-6) == (i == 1)  # unrotated on the NoPE layer only
        assert not torch.allclose(rot, q, rtol=0, atol=1e-3)
    before = "the projection's output per head, before the q/k RMSNorm per head and rotary"
    assert before in describe_site("q", facts=model.facts)[1] and before in describe_site("k", facts=model.facts)[1]
    doc = describe_site("rot_q", facts=model.facts, layer=1)[1]
    assert "q after the q/k RMSNorm per head, unrotated: no rotary (NoPE) on this layer" in doc and "(equal to q" not in doc
    assert "after the q/k RMSNorm per head and RoPE)" in describe_site("rot_k", facts=model.facts, layer=0)[1]
    assert "q/k RMSNorm per head (after hook_q/hook_k, before hook_rot_q/hook_rot_k)" in attention_words(
        None, 16, model.facts.qk_norm)
    assert "q/k RMSNorm per head (after hook_q/hook_k, before hook_rot_q/hook_rot_k), " in repr(model)


def test_heads_finding_says_a_positional_role_on_a_nope_layer_has_no_position_encoding(hybrids):
    """Review 20 A3: the heads summary records Exaone4's NoPE layer; a previous-token head named on it is said to have
    no position encoding of its own (the causal mask and the stream's earlier-layer positions), a positional head on
    the rotary layer 0 is not; without nope_layers nothing is said. The roles are set by hand on the real summary
    (a random model's heads pass no role threshold)."""
    from headscope.reports.heads_words import finding

    model, _ = hybrids["exaone4"]
    s = hs.run_analysis("heads", model, config=hs.HeadsConfig(quick=True, l0=None, best_head=False)).summary
    assert s["nope_layers"] == [1]
    s = {**s, "roles": {"positional": ["L0H1"], "previous-token": ["L1H2"], "sink": ["L1H0"]}}
    text = finding(s)
    assert ("L1H2 (previous-token) is on layer 1, which applies no rotary (NoPE): its scores carry no position "
            "encoding of their own, so the offset preference comes from the causal mask and from positions earlier "
            "layers wrote into the residual stream.") in text, text
    assert "L0H1 (positional) is on" not in text and "L1H0 (sink) is on" not in text
    assert "NoPE" not in finding({k: v for k, v in s.items() if k != "nope_layers"})


def test_exaone4_without_a_sliding_window_rotates_every_layer():
    """HF's Exaone4Attention rotates wherever the config sets no sliding_window (a non-hybrid checkpoint): its full
    layers are not NoPE then, as config_facts._rotates reads it; checked on the module's own output."""
    from transformers.models.exaone4.modeling_exaone4 import Exaone4Attention, Exaone4RotaryEmbedding

    from headscope.models.config_facts import _rotates

    config = transformers.Exaone4Config(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                        num_hidden_layers=2, sliding_window=None,
                                        layer_types=["full_attention", "full_attention"])
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    attn, rotary = Exaone4Attention(config, layer_idx=1).eval(), Exaone4RotaryEmbedding(config)
    x = torch.randn(1, 8, 32)  # [batch, pos, d_model]
    with torch.no_grad():
        outs = [attn(hidden_states=x, position_embeddings=rotary(x, p), attention_mask=None)[0]
                for p in (torch.arange(8)[None], 3 * torch.arange(8)[None])]  # [batch, pos, d_model] each
    assert not torch.allclose(outs[0], outs[1], atol=1e-4)  # HF rotates here
    assert _rotates(attn) is True
