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
