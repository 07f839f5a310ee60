"""TransformerLens habits on HookedModel (models/tl_habits.py), each checked against TransformerLens 4.3's
TransformerBridge booted on the same tiny checkpoint (unprocessed, as headscope loads it) or against plain
Hugging Face: string input, return_type="loss", run_with_cache, generate, to_string / to_single_token /
to_str_tokens, cfg, W_U / W_E / W_pos / b_U, hooks(fwd_hooks=...), add_hook / reset_hooks, and the name a
hook function sees. The bridges boot once per module (a tenth of a second each on these checkpoints)."""
from __future__ import annotations

import copy
import functools

import pytest
import torch
from torch.testing import assert_close

import headscope as hs
from headscope.errors import (
    ConfigError,
    ContextLengthError,
    InputTypeError,
    SiteError,
    UnsupportedAttributeError,
    VocabularyError,
)
from tests_support import hf_model

TEXT = "w1 w2 w3 w4 w5"
TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def tl(tiny_dirs):
    """family -> TransformerLens's own TransformerBridge on the tiny checkpoint (shared in this module;
    tests that attach hooks to it reset them)."""
    from transformer_lens.model_bridge import TransformerBridge

    return functools.cache(lambda family: TransformerBridge.boot_transformers(str(tiny_dirs[family]), device="cpu"))


def test_text_input_and_loss_match_transformerlens_and_hf(tiny_models, tiny_dirs, tl):
    model, bridge, hf = tiny_models["gpt2"], tl("gpt2"), hf_model(tiny_dirs["gpt2"])
    tokens = bridge.to_tokens(TEXT)
    assert torch.equal(model.to_tokens(TEXT), tokens)  # BOS prepended, as TransformerLens does
    with torch.no_grad():
        assert_close(model(TEXT), bridge(tokens), **TOL)
        loss = model(TEXT, return_type="loss")
        assert_close(loss, bridge(tokens, return_type="loss"), **TOL)
        assert_close(loss, hf(tokens, labels=tokens).loss, **TOL)
        per_token = model(tokens, return_type="loss", loss_per_token=True)  # [batch, pos - 1]
        assert per_token.shape == (1, tokens.shape[1] - 1)
        assert_close(per_token, bridge(tokens, return_type="loss", loss_per_token=True), **TOL)
        logits, both_loss = model(TEXT, return_type="both")
        assert_close(logits, bridge(tokens), **TOL)
        assert_close(both_loss, loss)
        assert model(TEXT, return_type=None) is None
        # a left-padded batch: the mean over every row's real next-token predictions, each row scored alone by HF
        rows = ["w1 w2 w3", "w4 w5 w6 w7 w8 w9"]
        padded, mask = model.to_tokens(rows, padding=True)
        alone = [model.to_tokens(r) for r in rows]
        total = sum(hf(ids, labels=ids).loss * (ids.shape[1] - 1) for ids in alone)
        expected = total / sum(ids.shape[1] - 1 for ids in alone)
        assert_close(model(padded, attention_mask=mask, return_type="loss"), expected, **TOL)
    with pytest.raises(ConfigError, match="return_type 'probs'"):
        model(TEXT, return_type="probs")


def test_run_with_cache_method_matches_transformerlens(tiny_models, tl):
    model, bridge = tiny_models["llama"], tl("llama")
    tokens = bridge.to_tokens(TEXT)

    def patterns(name: str) -> bool:
        return name.endswith("hook_pattern")

    logits, acts = model.run_with_cache(TEXT, names_filter=patterns)
    ref_logits, ref = bridge.run_with_cache(tokens, names_filter=patterns)
    assert isinstance(acts, hs.Activations) and sorted(acts) == sorted(ref.keys())
    assert_close(logits, ref_logits, **TOL)
    for name in ref.keys():
        assert_close(acts[name], ref[name], **TOL)
    # the same as hs.run_with_cache; a negative layer through hs.site(..., model=) is TransformerLens's cache[kind, -1]
    last = hs.site("resid_post", -1, model=model)
    _, ours = model.run_with_cache(tokens, names_filter=last)
    _, same = hs.run_with_cache(model, tokens, names=[last])
    _, full = bridge.run_with_cache(tokens)
    assert list(ours) == [last] == ["blocks.1.hook_resid_post"]
    assert torch.equal(ours[last], same[last])
    assert_close(ours[last], full["resid_post", -1], **TOL)


def test_generate_greedy_equals_hf_and_sampling_equals_transformerlens(tiny_models, tiny_dirs, tl):
    model, bridge, hf = tiny_models["llama"], tl("llama"), hf_model(tiny_dirs["llama"])
    prompt = model.to_tokens(TEXT)
    config = copy.deepcopy(hf.generation_config)
    config.eos_token_id = None  # run the full length, as stop_at_eos=False
    expected = hf.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=config,
                           max_new_tokens=8, do_sample=False)
    greedy = model.generate(TEXT, max_new_tokens=8, do_sample=False, stop_at_eos=False, return_type="tokens")
    assert torch.equal(greedy, expected)
    text = model.generate(TEXT, max_new_tokens=8, do_sample=False, stop_at_eos=False)  # return_type "input": a str
    assert text == model.tokenizer.decode(expected[0], skip_special_tokens=True)
    # seeded sampling draws what TransformerLens draws from the same seed (its fresh bridge decodes without
    # the KV cache: TransformerLens 4.3 alone misses transformers' renamed cache argument, models/loading.py)
    kw = dict(max_new_tokens=8, temperature=0.8, top_k=20, top_p=0.9, stop_at_eos=False)
    torch.manual_seed(0)
    before = torch.rand(3)
    torch.manual_seed(0)
    sampled = model.generate(TEXT, seed=3, return_type="tokens", **kw)
    assert torch.equal(torch.rand(3), before)  # seed= leaves the global generator alone
    torch.manual_seed(3)
    assert torch.equal(sampled, bridge.generate(prompt, use_past_kv_cache=False, verbose=False, **kw))
    assert torch.equal(model.generate(TEXT, seed=3, return_type="tokens", **kw), sampled)
    # prompts of different lengths: left-padded with their mask, each continues as it does alone
    rows = ["w1 w2", "w3 w4 w5 w6 w7"]
    batch = model.generate(rows, max_new_tokens=4, do_sample=False, stop_at_eos=False)
    assert batch == [model.generate(r, max_new_tokens=4, do_sample=False, stop_at_eos=False) for r in rows]
    padded, mask = model.to_tokens(rows, padding=True)
    assert model.generate(padded, attention_mask=mask, max_new_tokens=4, do_sample=False, stop_at_eos=False,
                          return_type="str") == batch
    # through the bridge, so hooks fire: once per step with the KV cache
    calls = []
    with model.hooks(fwd_hooks=[("hook_embed", lambda x, hook: calls.append(x.shape[1]))]):
        model.generate(TEXT, max_new_tokens=4, do_sample=False, stop_at_eos=False)
    assert calls == [prompt.shape[1], 1, 1, 1]
    with pytest.raises(ContextLengthError, match="exceeds"):
        model.generate(TEXT, max_new_tokens=model.facts.n_ctx)


def test_token_helpers_match_transformerlens(tiny_models, tl):
    model, bridge = tiny_models["gpt2"], tl("gpt2")
    assert model.to_str_tokens("w17") == bridge.to_str_tokens("w17") == ["<bos>", "w17"]
    assert model.to_str_tokens(["w1", "w2 w3"]) == bridge.to_str_tokens(["w1", "w2 w3"])
    tokens = model.to_tokens(["w1 w2 w3", "w4 w5 w6"])
    assert model.to_string(tokens) == bridge.to_string(tokens)
    assert model.to_string(tokens[0]) == bridge.to_string(tokens[0]) == "<bos> w1 w2 w3"
    assert model.to_single_token("w7") == bridge.to_single_token("w7") == 4 + 7  # ids: 4 specials, then w0..
    with pytest.raises(VocabularyError, match=r"'w1 w2' is 2 tokens .*\('w1', 'w2'\), not one") as err:
        model.to_single_token("w1 w2")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_cfg_and_weights_equal_transformerlens(family, tiny_models, tiny_dirs, tl):
    from transformers import AutoConfig

    model, bridge = tiny_models[family], tl(family)
    fields = ("n_layers", "n_heads", "d_model", "d_head", "d_vocab", "n_ctx", "d_mlp", "act_fn", "normalization_type",
              "n_key_value_heads", "positional_embedding_type", "d_vocab_out", "eps")
    assert {f: getattr(model.cfg, f) for f in fields} == {f: getattr(bridge.cfg, f) for f in fields}
    hf = AutoConfig.from_pretrained(tiny_dirs[family])
    assert (model.cfg.n_layers, model.cfg.n_heads, model.cfg.d_model, model.cfg.d_vocab) == (
        hf.num_hidden_layers, hf.num_attention_heads, hf.hidden_size, hf.vocab_size)
    with pytest.raises(ConfigError, match="read-only"):
        model.cfg.n_layers = 3
    for name in ("W_U", "W_E", "b_U"):
        assert torch.equal(getattr(model, name), getattr(bridge, name)), name
    assert torch.equal(model.W_E, hf_model(tiny_dirs[family]).get_input_embeddings().weight)
    if family == "gpt2":
        assert torch.equal(model.W_pos, bridge.W_pos) and model.W_pos.shape == (hf.n_positions, hf.n_embd)
    else:  # rotary: no W_pos, and hasattr says so
        with pytest.raises(UnsupportedAttributeError, match="no W_pos: its positions are rotary"):
            model.W_pos  # noqa: B018
        assert not hasattr(model, "W_pos")


def test_hooks_take_transformerlens_names_and_report_the_name_given(tiny_models, tl):
    model, bridge = tiny_models["gpt2"], tl("gpt2")
    tokens = model.to_tokens(TEXT)

    def shift(x, hook):
        return x + 1.0

    name = "blocks.0.hook_resid_post"
    with torch.no_grad():
        with model.hooks(fwd_hooks=[(name, shift)]):
            tl_names = model(tokens)
        with model.hooks(fwd=[(name, shift)]):
            ours = model(tokens)
        reference = bridge.run_with_hooks(tokens, fwd_hooks=[(name, shift)])
    assert torch.equal(tl_names, ours)
    assert_close(ours, reference, **TOL)
    # backward hooks see the gradient TransformerLens's do, under the name registered (not blocks.0.hook_out)
    seen, grads = [], {}

    def record(where):
        def hook(grad, hook):
            seen.append(hook.name)
            grads[where] = grad.clone()
        return hook

    model.run_with_hooks(tokens, fwd_hooks=[(name, lambda x, hook: seen.append(hook.name))],
                         bwd_hooks=[(name, record("ours"))]).sum().backward()
    bridge.run_with_hooks(tokens, bwd_hooks=[(name, record("tl"))]).sum().backward()
    assert seen[:2] == [name, name]
    assert_close(grads["ours"], grads["tl"], **TOL)
    # a typo: one line with the close names, and nothing left attached
    with pytest.raises(SiteError, match=r"no hook 'blocks.0.hook_resid_psot'. Did you mean 'blocks.0.hook_resid_post'") as err:
        model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_resid_psot", shift)])
    assert isinstance(err.value, KeyError) and "\n" not in str(err.value)
    with pytest.raises(InputTypeError, match=r"a hook list holds \(name, function\) pairs"):  # one pair, not a list
        model.run_with_hooks(tokens, fwd_hooks=(name, shift))
    with pytest.raises(ConfigError, match="both fwd= and fwd_hooks="):
        model.run_with_hooks(tokens, fwd=[(name, shift)], fwd_hooks=[(name, shift)])
    assert model.n_active_hooks() == 0


def test_add_hook_and_reset_hooks_as_transformerlens(tiny_dirs, tl):
    model, bridge = hs.load_model(tiny_dirs["gpt2"], device="cpu"), tl("gpt2")  # its own: hooks are attached
    tokens = model.to_tokens(TEXT)
    name, calls = "blocks.1.hook_resid_post", []

    def bump(x, hook):
        calls.append(hook.name)
        return x + 1.0

    try:
        with torch.no_grad():
            plain = model(tokens)
            model.add_hook(name, bump)
            bridge.add_hook(name, bump)
            assert_close(model(tokens), bridge(tokens), **TOL)
            assert calls == [name, "blocks.1.hook_out"]  # ours reports the name given; the bridge alone its own
            model.reset_hooks()
            assert model.n_active_hooks() == 0 and torch.equal(model(tokens), plain)
            model.add_hook(name, bump, is_permanent=True)  # survives reset_hooks(), not including_permanent=True
            model.reset_hooks()
            calls.clear()
            model.bridge_forward(tokens)
            assert calls == [name]
            model.reset_hooks(including_permanent=True)
            calls.clear()
            model.bridge_forward(tokens)
            assert calls == []
        with pytest.raises(SiteError, match="Did you mean 'blocks.1.hook_resid_post'"):
            model.add_hook("blocks.1.hook_resid_pots", bump)
        with pytest.raises(ConfigError, match="'fwd' or 'bwd'"):
            model.add_hook(name, bump, dir="forward")
    finally:
        bridge.reset_hooks(including_permanent=True)
