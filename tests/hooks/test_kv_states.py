"""KV states from a forward pass and during cached greedy generation, against plain Hugging Face."""
from __future__ import annotations

import pytest
import torch

import headscope as hs
from tests_support import hf_model, random_tokens


@pytest.mark.parametrize("family", ["gpt2", "llama", "neox"])
def test_forward_kv_equals_hf_cache(family, tiny_dirs, tiny_models):
    tokens = random_tokens(2, 9)
    with torch.no_grad():
        ref = hf_model(tiny_dirs[family])(tokens, use_cache=True).past_key_values
    states = hs.kv_states(tiny_models[family], tokens)
    f = tiny_models[family].facts
    for layer in range(f.n_layers):
        assert states.keys[layer].shape == (2, f.n_kv_heads, 9, f.d_head)
        assert (states.keys[layer] - ref.layers[layer].keys).abs().max().item() <= 1e-4
        assert (states.values[layer] - ref.layers[layer].values).abs().max().item() <= 1e-4


def test_llama_keys_are_the_rotated_keys_at_hook_rot_k(tiny_models):
    model = tiny_models["llama"]
    tokens = random_tokens(1, 7)
    acts = hs.capture(model, tokens, [hs.site("rot_k", 0), hs.site("v", 0)])
    states = hs.kv_states(model, tokens)
    assert (states.keys[0] - acts[hs.site("rot_k", 0)].transpose(1, 2)).abs().max().item() <= 1e-5
    assert (states.values[0] - acts[hs.site("v", 0)].transpose(1, 2)).abs().max().item() <= 1e-5


@pytest.mark.parametrize("family", ["gpt2", "llama", "neox"])
def test_cached_generation_matches_full_forward_and_hf_generate(family, tiny_dirs, tiny_models):
    model = tiny_models[family]
    prompt = random_tokens(2, 6, seed=3)
    new = 8
    trace = hs.generate_with_kv(model, prompt, max_new_tokens=new)
    with torch.no_grad():
        expected = hf_model(tiny_dirs[family]).generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new, do_sample=False, pad_token_id=1
        )
    assert torch.equal(trace.tokens, expected)
    # The K/V appended at each step equal those of one full forward pass over the same tokens.
    full = hs.kv_states(model, trace.tokens[:, :-1])
    stacked = trace.stacked()
    for layer in range(model.facts.n_layers):
        assert (stacked.keys[layer] - full.keys[layer]).abs().max().item() <= 1e-4
        assert (stacked.values[layer] - full.values[layer]).abs().max().item() <= 1e-4
    assert [s.keys[0].shape[2] for s in trace.steps] == [6] + [1] * (new - 1)


def test_generation_past_the_context_is_refused(tiny_models):
    with pytest.raises(hs.ContextLengthError, match="exceeds the context"):
        hs.generate_with_kv(tiny_models["gpt2"], random_tokens(1, 60), max_new_tokens=10)
