"""capture: only what was asked for; per-head attention and outputs against Hugging Face."""
from __future__ import annotations

import pytest
import torch

import headscope as hs
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
