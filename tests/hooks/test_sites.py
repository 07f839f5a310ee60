"""Site names: the typed helper, the shape table against real captures, and clear errors."""
from __future__ import annotations

import pytest

import headscope as hs
from headscope.hooks import SITES, available_sites, parse_site
from tests_support import random_tokens


def test_site_builds_transformer_lens_names():
    assert hs.site("pattern", 3) == "blocks.3.attn.hook_pattern"
    assert hs.site("resid_pre", 0) == "blocks.0.hook_resid_pre"
    assert hs.site("mlp_post", 1) == "blocks.1.mlp.hook_post"
    assert hs.site("embed") == "hook_embed"
    assert parse_site("blocks.2.attn.hook_z") == ("z", 2)


@pytest.mark.parametrize("family", ["gpt2", "llama", "neox"])
def test_documented_shapes_match_captured_shapes(family, tiny_models):
    model = tiny_models[family]
    f = model.facts
    dims = {
        "batch": 2, "pos": 7, "query_pos": 7, "key_pos": 7, "d_model": f.d_model, "head": f.n_heads,
        "kv_head": f.n_kv_heads, "d_head": f.d_head, "d_mlp": f.d_mlp,
    }
    names = available_sites(model)
    acts = hs.capture(model, random_tokens(2, 7), names)
    assert set(acts) == set(names)
    for name in names:
        kind, _ = parse_site(name)
        expected = tuple(dims[d.strip()] for d in SITES[kind].shape.strip("[]").split(","))
        assert tuple(acts[name].shape) == expected, name
    assert ("blocks.0.attn.hook_rot_k" in names) == (family == "llama")  # NeoX's partial RoPE has no rot hooks
    assert ("blocks.0.mlp.hook_pre_linear" in names) == f.gated_mlp


def test_unknown_site_suggests_the_closest_names(tiny_models):
    with pytest.raises(hs.SiteError, match="blocks.0.attn.hook_pattern"):
        hs.capture(tiny_models["gpt2"], random_tokens(1, 4), ["blocks.0.attn.hook_patern"])
    with pytest.raises(hs.SiteError, match="pattern"):
        hs.site("patern", 0)


def test_layer_out_of_range_names_the_valid_range(tiny_models):
    with pytest.raises(hs.IndexOutOfRangeError, match=r"layers 0\.\.1"):
        hs.capture(tiny_models["gpt2"], random_tokens(1, 4), [hs.site("resid_post", 5)])
    with pytest.raises(hs.IndexOutOfRangeError, match=r"heads 0\.\.3"):
        with hs.ablate(tiny_models["gpt2"], heads=[(0, 9)]):
            pass


def test_transformerlens_short_names_give_get_act_names_hook(tiny_models):
    """Every short name TransformerLens 4.3's get_act_name knows (its alias table and its own spellings) that
    names a hook point of the model gives the same name through hs.site; ("attn", 1) is the pattern."""
    from transformer_lens.utilities import get_act_name

    model = tiny_models["llama"]  # gated MLP and RoPE: pre_linear and rot_q/rot_k exist
    points = set(model.bridge.hook_dict)
    short = ["attn", "attn_scores", "attn_logits", "key", "query", "value", "pre", "post", "pre_linear", "mlp_pre",
             "mlp_post", "q", "k", "v", "z", "rot_q", "rot_k", "pattern", "result", "resid_pre", "resid_mid",
             "resid_post", "attn_out", "mlp_out"]
    checked = [name for name in short if get_act_name(name, 1) in points]
    assert len(checked) == len(short)  # each is a real hook point here, so each is compared
    assert {name: hs.site(name, 1) for name in checked} == {name: get_act_name(name, 1) for name in checked}
    assert hs.site("attn", 1) == "blocks.1.attn.hook_pattern"
    assert hs.site("embed") == get_act_name("embed")
    with pytest.raises(hs.SiteError, match="Did you mean 'attn'"):
        hs.site("atn", 1)


def test_negative_layers_count_from_the_end_given_the_model(tiny_models):
    """A negative layer needs the model (how many layers there are): with model= it resolves, as a cache's
    acts["resid_pre", -1] does; without one, one line says how."""
    model = tiny_models["gpt2"]  # 2 layers
    assert hs.site("resid_pre", -1, model=model) == "blocks.1.hook_resid_pre"
    assert hs.site("pattern", -2, model=model) == hs.site("pattern", 0)
    acts = hs.capture(model, random_tokens(1, 5), [hs.site("resid_pre", -1, model=model)])
    assert list(acts) == ["blocks.1.hook_resid_pre"]
    with pytest.raises(hs.IndexOutOfRangeError, match=r"needs the model; pass it: site\('resid_pre', -1, model=model\)") as err:
        hs.site("resid_pre", -1)
    assert "\n" not in str(err.value)
    for layer in (-3, 2):
        with pytest.raises(hs.IndexOutOfRangeError, match=r"layers 0\.\.1 \(or -2\.\.-1"):
            hs.site("resid_pre", layer, model=model)
    with pytest.raises(hs.SiteError, match="hs.site"):  # TransformerLens's get_act_name("resid_pre", -1) as a hook name
        model.run_with_hooks(random_tokens(1, 5), fwd_hooks=[("blocks.-1.hook_resid_pre", lambda x, hook: x)])


def test_resid_mid_on_a_parallel_block_says_why_there_is_none(arch_models):
    """Review 8 C1: asked for resid_mid on GPT-NeoX (use_parallel_residual), the error was a generic "Unknown
    site"; it now says the block runs attention and MLP in parallel. A sequential block has the site."""
    from headscope.errors import SiteError
    from headscope.hooks.sites import check_site

    neox = arch_models("neox")
    assert neox.bridge.original_model.config.use_parallel_residual  # the premise, from Hugging Face's config
    with pytest.raises(SiteError, match=r"block 0 of .* has no resid_mid: attention and MLP run in parallel"):
        check_site(neox, "blocks.0.hook_resid_mid")
    assert check_site(arch_models("llama3"), "blocks.0.hook_resid_mid") == "blocks.0.hook_resid_mid"
