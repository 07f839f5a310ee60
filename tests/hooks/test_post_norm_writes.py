"""The cache's per-head and per-neuron writes on post-norm blocks, its logit_attrs under a final soft-cap and the
sites' words, against plain Hugging Face (reviews 18d A1/A2, 18b A1/A2).

Gemma 2 adds post_attention_layernorm(o_proj(z)) and post_feedforward_layernorm(mlp(x)) to the stream: head h's
write is z_h W_O[h] times (1 + w) / rms(o_proj(z)) (the norm's scale frozen at its value on the whole attention
output), neuron n's is act_n W_down[:, n] times (1 + w') / rms(mlp(x)). The hand side reads HF's own module inputs
through forward hooks; the post-norm weights are drawn at random (both copies alike) so that the norm's weight
counts, and the final norm's weight is raised so the logits reach the final soft-cap's curved part (cap 30).
"""
from __future__ import annotations

import warnings

import pytest
import torch

import headscope as hs
from headscope.errors import HeadscopeWarning, UnsupportedModelError
from tests_support import hf_reference, random_tokens


@pytest.fixture(scope="module")
def gemma(arch_dirs):
    """(model, hf, tokens [2, 10], answers, wrong, store of HF module inputs at every position): private copies of
    the matrix's Gemma 2 (2 layers, 4 heads of 16, d_mlp 128, final soft-cap 30) with random post-norm weights."""
    path = arch_dirs["gemma2"]
    model, hf = hs.load_model(path, device="cpu"), hf_reference(path)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for ours, theirs in zip(model.bridge.original_model.model.layers, hf.model.layers):
            for name in ("post_attention_layernorm", "post_feedforward_layernorm"):
                w = 0.5 * torch.randn(getattr(theirs, name).weight.shape, generator=g)
                getattr(ours, name).weight.copy_(w)
                getattr(theirs, name).weight.copy_(w)
        for m in (model.bridge.original_model, hf):
            m.model.norm.weight.fill_(5.0)
    tokens = random_tokens(2, 10, seed=4)
    answers, wrong = tokens[:, 3].clone(), tokens[:, 5].clone()
    store, hooks = {}, []

    def keep(key):
        return lambda module, args: store.__setitem__(key, args[0].detach())

    for i, layer in enumerate(hf.model.layers):
        hooks.append(layer.self_attn.o_proj.register_forward_pre_hook(keep(("z", i))))
        hooks.append(layer.post_attention_layernorm.register_forward_pre_hook(keep(("a", i))))
        hooks.append(layer.mlp.down_proj.register_forward_pre_hook(keep(("act", i))))
        hooks.append(layer.post_feedforward_layernorm.register_forward_pre_hook(keep(("m", i))))
    hooks.append(hf.model.norm.register_forward_pre_hook(keep("final")))
    try:
        with torch.no_grad():
            store["logits"] = hf(tokens).logits.float()  # [batch, pos, vocab], capped by HF's head
    finally:
        for h in hooks:
            h.remove()
    return model, hf, tokens, answers, wrong, store


def _frozen(norm, x):
    """[..., d_model]: Gemma's RMSNorm gain (1 + w) over rms(x), the norm's scale on x."""
    return (1.0 + norm.weight.detach()) / (x.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()


def test_head_and_neuron_writes_pass_the_post_norms_as_by_hand(gemma):
    """18d A1 / 18b A1: stack_head_results and get_full_resid_decomposition gave z_h W_O and act_n W_down before
    the post-norms (6-25x off) and a "bias" row held the rest on a bias-free model; now each row is the write
    through its block's post-norm frozen at its scale, "bias" is 0 and a head's logit_attrs is its hand DLA."""
    model, hf, tokens, answers, wrong, store = gemma
    n_heads, d_head = model.facts.n_heads, model.facts.d_head
    with torch.no_grad():
        _, cache = hs.run_with_cache(model, tokens)
        heads, labels = cache.stack_head_results(return_labels=True)  # [layer*head, batch, pos, d_model]
        full, flabels = cache.get_full_resid_decomposition(return_labels=True)
    rows = dict(zip(flabels, full))
    for i, layer in enumerate(hf.model.layers):
        z = store[("z", i)].view(*tokens.shape, n_heads, d_head)  # [batch, pos, head, d_head]
        w_o = layer.self_attn.o_proj.weight.detach()  # [d_model, head * d_head]
        post = _frozen(layer.post_attention_layernorm, store[("a", i)])  # [batch, pos, d_model]
        for h in range(n_heads):
            hand = (z[..., h, :] @ w_o[:, h * d_head:(h + 1) * d_head].T) * post
            assert torch.allclose(heads[labels.index(f"L{i}H{h}")], hand, atol=1e-5), (i, h)
            assert torch.allclose(rows[f"L{i}H{h}"], hand, atol=1e-5), (i, h)
        act, w_down = store[("act", i)], layer.mlp.down_proj.weight.detach()  # [batch, pos, d_mlp], [d_model, d_mlp]
        post_ff = _frozen(layer.post_feedforward_layernorm, store[("m", i)])
        for n in (0, 7, 127):
            assert torch.allclose(rows[f"L{i}N{n}"], act[..., n, None] * w_down[:, n] * post_ff, atol=1e-5), (i, n)
    assert rows["bias"].abs().max() < 1e-5  # Gemma 2 has no biases
    assert torch.allclose(full.sum(0), store["final"], atol=1e-4)  # the rows still sum to the stream
    # the README's per-head DLA recipe: L0H1's logit_attrs = its write through the final norm (frozen) on W_U's difference
    w_u = hf.lm_head.weight.detach()  # [vocab, d_model]
    d = (w_u[answers] - w_u[wrong])  # [batch, d_model]
    fin = _frozen(hf.model.norm, store["final"][:, -1])  # [batch, d_model]
    z = store[("z", 0)][:, -1].view(len(tokens), n_heads, d_head)
    w_o = hf.model.layers[0].self_attn.o_proj.weight.detach()
    hand = ((z[:, 1] @ w_o[:, d_head:2 * d_head].T) * _frozen(hf.model.layers[0].post_attention_layernorm,
                                                               store[("a", 0)][:, -1]) * fin * d).sum(-1)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", HeadscopeWarning)
        attrs = cache.logit_attrs(cache.stack_head_results(pos_slice=-1), answers, wrong, pos_slice=-1)
    assert torch.allclose(attrs[1], hand, atol=1e-4)
    assert (hand.abs() > 0.05).all()


def test_a_post_norm_the_frozen_map_cannot_reproduce_is_refused_in_one_line(gemma, monkeypatch):
    """Where the frozen norm does not give the norm's own output (here: the cache is read against a norm with
    other weights than the model's), the split is refused in one line instead of returning wrong rows."""
    import copy

    import headscope.hooks.cache as cache_mod

    model, _, tokens, _, _, _ = gemma
    with torch.no_grad():
        _, cache = hs.run_with_cache(model, tokens)
    real = cache_mod.post_attention_norm
    other = copy.deepcopy(real(model.bridge.blocks[0]))
    with torch.no_grad():
        other.weight.copy_(torch.randn(other.weight.shape, generator=torch.Generator().manual_seed(9)))
    monkeypatch.setattr(cache_mod, "post_attention_norm", lambda block: other)
    with pytest.raises(UnsupportedModelError, match=r"^Block 0's head writes cannot split .* exactly: frozen at its "
                                                    r"scale it gives its output to a relative error of"):
        cache.stack_head_results()


def test_logit_attrs_sum_to_the_logit_difference_before_the_final_softcap_and_say_so(gemma, tiny_models):
    """18b A2: with incl_bias the rows sum to the logit difference before Gemma 2's final soft-cap
    30 tanh(x / 30) (HF's lm_head on its final normed stream), not the model's capped output, and a warning
    says so once per model; a model without a cap gives no warning."""
    model, hf, tokens, answers, wrong, store = gemma
    with torch.no_grad():
        raw = hf.lm_head(hf.model.norm(store["final"][:, -1])).float()  # [batch, vocab] before the cap
        _, cache = hs.run_with_cache(model, tokens)
        stack = cache.get_full_resid_decomposition(pos_slice=-1, expand_neurons=False)
    rows = torch.arange(len(tokens))
    before = raw[rows, answers] - raw[rows, wrong]
    capped = store["logits"][rows, -1, answers] - store["logits"][rows, -1, wrong]
    assert (before - capped).abs().min() > 0.1, (before, capped)  # the cap bites
    model.__dict__.pop("_headscope_softcap_warned", None)
    with pytest.warns(HeadscopeWarning, match=r"sum to the logit \(difference\) before the final soft-cap "
                                              r"30 \* tanh\(x / 30\), not to the model's output"):
        attrs = cache.logit_attrs(stack, answers, wrong, pos_slice=-1, incl_bias=True)
    assert torch.allclose(attrs.sum(0), before, atol=1e-4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cache.logit_attrs(stack, answers, wrong, pos_slice=-1, incl_bias=True)  # once per model
        llama = tiny_models["llama"]
        _, lcache = hs.run_with_cache(llama, random_tokens(1, 6))
        lcache.logit_attrs(lcache.decompose_resid(pos_slice=-1), 5, 6, pos_slice=-1)


def test_sites_say_what_gemma2s_hooks_hold(gemma, arch_dirs, tiny_dirs, capsys):
    """18d A2: `headscope sites` said "attention output (sum of heads + bias)", "MLP output" and "scaled, masked
    attention scores" on Gemma 2, whose hook_attn_out / hook_mlp_out hold the post-normed outputs (HF's
    post_attention_layernorm / post_feedforward_layernorm outputs, checked here) and whose hook_attn_scores holds
    50 tanh(s / 50) of the scaled scores with the float32 minimum at masked keys (checked from rot_q, rot_k and
    the config's query_pre_attn_scalar); a pre-norm Llama keeps the plain words."""
    from headscope.cli import main

    model, hf, tokens, _, _, store = gemma
    with torch.no_grad():
        _, cache = hs.run_with_cache(model, tokens)
    layer = hf.model.layers[1]
    with torch.no_grad():
        assert torch.allclose(cache["attn_out", 1], layer.post_attention_layernorm(store[("a", 1)]), atol=1e-5)
        assert torch.allclose(cache["mlp_out", 1], layer.post_feedforward_layernorm(store[("m", 1)]), atol=1e-5)
        assert (cache["attn_out", 1] - store[("a", 1)]).abs().max() > 0.1  # not the raw o_proj output
    cfg, n_heads = hf.config, model.facts.n_heads
    q, k = cache["rot_q", 1], cache["rot_k", 1].repeat_interleave(n_heads // cfg.num_key_value_heads, dim=2)
    raw = torch.einsum("bqhd,bkhd->bhqk", q, k) * cfg.query_pre_attn_scalar ** -0.5  # [batch, head, q, k]
    causal = torch.ones(tokens.shape[1], tokens.shape[1], dtype=torch.bool).tril()  # layer 1 is global
    capped = cfg.attn_logit_softcapping * torch.tanh(raw / cfg.attn_logit_softcapping)
    scores = cache["scores", 1]
    assert torch.allclose(scores[..., causal], capped[..., causal], atol=1e-4)
    assert (raw - capped)[..., causal].abs().max() > 1e-2  # the cap bites
    assert (scores[..., ~causal] == torch.finfo(torch.float32).min).all()

    def sites(path) -> dict[str, str]:
        assert main(["-q", "sites", "--model", str(path), "--device", "cpu"]) == 0
        lines = [line.split(None, 1) for line in capsys.readouterr().out.splitlines() if line.startswith("  blocks.1.")]
        return {name: rest.split("]", 1)[1].strip() for name, rest in lines}

    said = sites(arch_dirs["gemma2"])
    masked = "masked entries hold the dtype's minimum, as Hugging Face's additive mask gives, not -inf"
    assert said["blocks.1.hook_attn_out"] == ("attention output after the block's post-attention norm, as added to "
                                              "the residual stream (the norm of the heads' sum + bias)")
    assert said["blocks.1.hook_mlp_out"] == "MLP output after the block's post-MLP norm, as added to the residual stream"
    assert said["blocks.1.attn.hook_attn_scores"] == (f"scaled attention scores soft-capped to 50 * tanh(s / 50), "
                                                      f"then masked ({masked})")
    assert said["blocks.1.attn.hook_result"].startswith("per-head output z @ W_O, before the post-attention norm")
    plain = sites(tiny_dirs["llama"])
    assert plain["blocks.1.hook_attn_out"] == "attention output as added to the residual stream (sum of heads + bias)"
    assert plain["blocks.1.attn.hook_attn_scores"] == f"scaled, masked attention scores ({masked})"
