"""capture: only what was asked for; per-head attention and outputs against Hugging Face."""
from __future__ import annotations

import pytest
import torch

import headscope as hs
from headscope.errors import UnsupportedModelError
from tests_support import hf_model, random_tokens


def test_capture_holds_only_the_requested_site(tiny_models):
    model = tiny_models["llama"]
    name = hs.site("resid_post", 1)
    acts = hs.capture(model, random_tokens(2, 8), [name])
    assert list(acts) == [name]
    stored = [t for t in acts.values()]
    assert sum(t.numel() for t in stored) == 2 * 8 * model.facts.d_model
    assert not acts[name].requires_grad
    assert model.n_active_hooks() == 0


def test_positions_and_to_cpu_select_inside_the_hook(tiny_models):
    model = tiny_models["gpt2"]
    tokens = random_tokens(2, 8)
    full = hs.capture(model, tokens, [hs.site("resid_pre", 1), hs.site("pattern", 0)])
    part = hs.capture(model, tokens, [hs.site("resid_pre", 1), hs.site("pattern", 0)], positions=[-1, 2], to_cpu=True)
    assert part[hs.site("resid_pre", 1)].shape == (2, 2, 64)
    assert torch.equal(part[hs.site("resid_pre", 1)], full[hs.site("resid_pre", 1)][:, [7, 2]])
    assert torch.equal(part[hs.site("pattern", 0)], full[hs.site("pattern", 0)][:, :, [7, 2]])
    assert part[hs.site("resid_pre", 1)].device.type == "cpu"


@pytest.mark.parametrize("family", ["gpt2", "llama", "neox"])
def test_patterns_match_hf_output_attentions(family, tiny_dirs, tiny_models):
    tokens = random_tokens(2, 10)
    with torch.no_grad():
        expected = hf_model(tiny_dirs[family])(tokens, output_attentions=True).attentions
    names = [hs.site("pattern", layer) for layer in range(2)]
    acts = hs.capture(tiny_models[family], tokens, names)
    for layer, name in enumerate(names):
        assert (acts[name] - expected[layer]).abs().max().item() <= 1e-5


@pytest.mark.parametrize("family", ["gpt2", "llama", "neox"])
def test_per_head_outputs_sum_to_the_hf_attention_output(family, tiny_dirs, tiny_models):
    """hook_result is computed from z and W_O; its head sum plus the HF o_proj bias is HF's attention output."""
    tokens = random_tokens(2, 6)
    hf = hf_model(tiny_dirs[family])
    attn_modules = {
        "gpt2": lambda L: hf.transformer.h[L].attn,
        "llama": lambda L: hf.model.layers[L].self_attn,
        "neox": lambda L: hf.gpt_neox.layers[L].attention,
    }
    out_proj = {"gpt2": lambda m: m.c_proj, "llama": lambda m: m.o_proj, "neox": lambda m: m.dense}
    seen = {}
    handle = attn_modules[family](1).register_forward_hook(lambda m, a, o: seen.setdefault("out", o[0]))
    with torch.no_grad():
        hf(tokens)
    handle.remove()
    bias = out_proj[family](attn_modules[family](1)).bias
    acts = hs.capture(tiny_models[family], tokens, [hs.site("result", 1)])
    total = acts[hs.site("result", 1)].sum(2) + (0 if bias is None else bias)
    assert (total - seen["out"]).abs().max().item() <= 1e-5


@pytest.mark.parametrize("arch", ["mixtral", "qwen2moe"])
def test_router_sites_equal_hugging_faces_router(arch, more_arch_models, more_arch_dirs):
    """router_logits, expert_indices and expert_weights as [batch, pos, ...]: Hugging Face's router
    logits, their top-k experts, and the softmax weights of those experts (renormalised over the
    top k where the config says so, Mixtral always), 0 on the experts a token did not choose."""
    model = more_arch_models(arch)
    hf = hf_model(more_arch_dirs(arch))
    tokens = random_tokens(2, 6, seed=8)
    with torch.no_grad():
        logits = hf(tokens, output_router_logits=True).router_logits[0].view(2, 6, -1)  # [batch, pos, expert]
    names = [hs.site(kind, 0) for kind in ("router_logits", "expert_indices", "expert_weights")]
    acts = hs.capture(model, tokens, names)
    torch.testing.assert_close(acts[names[0]], logits, atol=1e-6, rtol=1e-6)
    probs = logits.softmax(-1)
    top = probs.topk(hf.config.num_experts_per_tok, -1)
    assert torch.equal(acts[names[1]].sort(-1).values, top.indices.sort(-1).values)
    weights = top.values / top.values.sum(-1, keepdim=True) if getattr(hf.config, "norm_topk_prob", True) else top.values
    want = torch.zeros_like(probs).scatter_(-1, top.indices, weights)
    torch.testing.assert_close(acts[names[2]], want, atol=1e-6, rtol=1e-6)
    assert hs.hooks.SITES["expert_weights"].shape == "[batch, pos, expert]"
    with pytest.raises(UnsupportedModelError, match="mixture of experts"):  # mlp.hook_post is not the experts' neurons
        with hs.ablate(model, neurons=[(0, 3)]):
            pass
