"""MLP key-value memories: coefficients at mlp.hook_post rebuild the MLP output as sum m_i v_i + b."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import headscope as hs
from tests_support import hf_model, random_tokens


@pytest.mark.parametrize("family", ["gpt2", "llama", "neox"])
def test_sum_of_sub_updates_rebuilds_the_hf_mlp_output(family, tiny_dirs, tiny_models):
    model = tiny_models[family]
    tokens = random_tokens(2, 7)
    hf = hf_model(tiny_dirs[family])
    mlp_module = {"gpt2": lambda: hf.transformer.h[1].mlp, "llama": lambda: hf.model.layers[1].mlp,
                  "neox": lambda: hf.gpt_neox.layers[1].mlp}[family]()
    seen = {}
    handle = mlp_module.register_forward_hook(lambda m, a, o: seen.setdefault("out", o))
    with torch.no_grad():
        hf(tokens)
    handle.remove()
    mem = hs.mlp_memories(model, 1)
    m = hs.capture(model, tokens, [hs.site("mlp_post", 1)])[hs.site("mlp_post", 1)]  # [batch, pos, d_mlp]
    assert mem.keys.shape == mem.values.shape == (model.facts.d_mlp, model.facts.d_model)
    rebuilt = mem.sub_updates(m).sum(-2) + mem.out_bias
    assert (rebuilt - seen["out"]).abs().max().item() <= 1e-4
    assert (mem.output(m) - seen["out"]).abs().max().item() <= 1e-4


def test_gated_keys_and_coefficients_follow_the_hf_weights(tiny_dirs, tiny_models):
    """For SwiGLU, m = silu(x W_gate) * (x W_up); keys are W_up's rows and gate_keys W_gate's."""
    model = tiny_models["llama"]
    hf = hf_model(tiny_dirs["llama"])
    mlp = hf.model.layers[0].mlp
    mem = hs.mlp_memories(model, 0)
    assert mem.gated
    assert torch.allclose(mem.keys, mlp.up_proj.weight, atol=1e-6)
    assert torch.allclose(mem.gate_keys, mlp.gate_proj.weight, atol=1e-6)
    assert torch.allclose(mem.values, mlp.down_proj.weight.T, atol=1e-6)
    tokens = random_tokens(1, 5)
    acts = hs.capture(model, tokens, [hs.site("resid_mid", 0), hs.site("mlp_post", 0)])
    x = hf.model.layers[0].post_attention_layernorm(acts[hs.site("resid_mid", 0)])
    expected = torch.nn.functional.silu(x @ mem.gate_keys.T) * (x @ mem.keys.T)
    assert (acts[hs.site("mlp_post", 0)] - expected).abs().max().item() <= 1e-5


def test_layer_out_of_range(tiny_models):
    with pytest.raises(hs.IndexOutOfRangeError, match=r"layers 0\.\.1"):
        hs.mlp_memories(tiny_models["gpt2"], 2)


@pytest.mark.parametrize("arch", ["mixtral", "qwen2moe"])
def test_expert_memories_rebuild_the_hf_moe_output(arch, more_arch_models, more_arch_dirs):
    """Mixture-of-experts MLPs: memories indexed by (expert, neuron), experts then Qwen2-MoE's shared
    one; each expert's coefficients are 0 exactly on the tokens Hugging Face's router did not send
    to it, and the sum of every sub-update m_i v_i is the MoE block's output in Hugging Face."""
    model = more_arch_models(arch)
    hf = hf_model(more_arch_dirs(arch))
    config = hf.config
    n_experts = getattr(config, "num_local_experts", None) or config.num_experts
    d_expert = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
    shared = getattr(config, "shared_expert_intermediate_size", 0)
    tokens = random_tokens(2, 7, seed=5)
    seen = {}
    handle = hf.model.layers[1].mlp.register_forward_hook(lambda m, a, o: seen.setdefault("out", o))
    with torch.no_grad():
        router_logits = hf(tokens, output_router_logits=True).router_logits[1]  # [batch * pos, expert]
    handle.remove()
    mem = hs.mlp_memories(model, 1)
    m = hs.capture(model, tokens, [hs.site("mlp_post", 1)])[hs.site("mlp_post", 1)]  # [batch, pos, memories]
    assert m.shape == (2, 7, n_experts * d_expert + shared) == (2, 7, mem.values.shape[0])
    assert mem.expert.tolist() == [e for e in range(n_experts) for _ in range(d_expert)] + [n_experts] * shared
    torch.testing.assert_close(mem.sub_updates(m).sum(-2), seen["out"], atol=1e-5, rtol=1e-5)
    chosen = router_logits.topk(config.num_experts_per_tok, -1).indices  # [batch * pos, top_k]
    flat = m.reshape(14, -1)
    for e in range(n_experts):
        routed = (chosen == e).any(-1)  # [batch * pos]
        block = flat[:, mem.expert == e]  # [batch * pos, d_expert]
        assert (block[~routed] == 0).all() and (block[routed].abs().sum(-1) > 0).all()
    assert routed.any() and not routed.all()  # the router split the tokens


@pytest.mark.parametrize("arch", ["mixtral", "qwen2moe"])
def test_expert_layout_says_whether_the_top_k_router_weights_are_renormalised(arch, more_arch_models, more_arch_dirs):
    """Review 12a: a MoE report must say whether a coefficient's router weight is renormalised over the top k.
    Independently: Qwen2-MoE's config norm_topk_prob (False by default), Mixtral's Hugging Face router's own
    top-k weights on random inputs (they sum to 1: it always renormalises); the header and mlp words say which."""
    from headscope.reports.moe_words import layout_clause
    from headscope.reports.plots_mlp import _weights

    hf = hf_model(more_arch_dirs(arch))
    with torch.no_grad():
        _, weights, _ = hf.model.layers[0].mlp.gate(torch.randn(5, hf.config.hidden_size))  # [5, top_k]
    sums_to_one = bool(torch.allclose(weights.sum(-1), torch.ones(5), atol=1e-6))
    want = hf.config.norm_topk_prob if arch == "qwen2moe" else True
    assert sums_to_one == want and (arch != "qwen2moe" or want is False)  # the premise: the default does not
    layout = hs.hooks.expert_layout(more_arch_models(arch), 0)
    assert layout.renormalised is want
    experts = {"0": dataclasses.asdict(layout)}
    header = layout_clause(experts, 1, 64)
    said = ("top-2 whose weights are renormalised to sum to 1" if want else
            "top-2 whose weights are not renormalised (each its softmax probability over all experts)")
    assert said in header, header
    assert _weights(experts) == (" (the router's top-k weights are renormalised to sum to 1)" if want else
                                 " (the router's top-k weights are not renormalised: each is its softmax probability "
                                 "over all experts)")


def test_expert_layout_measures_a_router_once_and_never_runs_the_models_own(more_arch_models):
    """Review diff5 item 5: expert_layout (called for every MoE layer on every chunk) ran the model's router on 8
    random inputs each time, which would move a router's statistics (aux-loss or load counters). Mixtral's router has
    no norm_topk_prob, so it is measured: on a copy (the model's router sees no call) and once (later layouts reuse
    it); the answer stays Mixtral's (it always renormalises its top-k weights: the test above checks it from HF)."""
    from headscope.models import moe_layout

    model = more_arch_models("mixtral")
    router = moe_layout.moe_modules(model.bridge.blocks[0].mlp)[0]
    moe_layout._MEASURED.pop(router, None)  # as a fresh process finds it
    calls = []
    handle = router.register_forward_hook(lambda m, a, o: calls.append(m is router))  # a deepcopy carries it along
    try:
        layouts = [hs.hooks.expert_layout(model, 0) for _ in range(3)]
    finally:
        handle.remove()
    assert calls == [False]  # one measurement, on a copy
    assert [layout.renormalised for layout in layouts] == [True] * 3
