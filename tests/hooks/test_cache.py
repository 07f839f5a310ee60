"""run_with_cache and Activations against TransformerLens's own ActivationCache and hand identities.

The reference is `model.bridge.run_with_cache(tokens)`: TransformerLens's ActivationCache over the
same bridge (raw tensors, stack_head_results, accumulated_resid, decompose_resid), plus
identities that need no TransformerLens (the decomposition sums to the stream; the final norm
applied by the plain Hugging Face module).
"""
from __future__ import annotations

import os
import pickle

import pytest
import torch

import headscope as hs
from headscope.errors import ConfigError, IndexOutOfRangeError, SiteError
from headscope.hooks import Activations, parse_site, run_with_cache
from headscope.hooks.capture import norm_scale_names
from tests_support import hf_model, random_tokens

FAMILIES = ["gpt2", "llama", "neox"]
TOL = 1e-5


@pytest.fixture(scope="module")
def runs(tiny_models):
    """Per family: (tokens, headscope (output, acts), TransformerLens (logits, cache))."""
    tokens = random_tokens(2, 7, seed=3)
    out = {}
    for family, model in tiny_models.items():
        with torch.no_grad():
            tl = model.bridge.run_with_cache(tokens)
        out[family] = tokens, run_with_cache(model, tokens), tl
    return out


def close(a, b) -> bool:
    return a.shape == b.shape and (a.numel() == 0 or (a - b).abs().max().item() <= TOL)


@pytest.mark.parametrize("family", FAMILIES)
def test_raw_tensors_and_output_match_transformer_lens(family, runs, tiny_models):
    model = tiny_models[family]
    _, (output, acts), (logits, cache) = runs[family]
    assert close(output, logits) and acts.output is output
    sites = [n for n in hs.available_sites(model) if parse_site(n)[0] != "result"]
    assert set(acts) == set(sites) | set(norm_scale_names(model))  # every site, no hook_result
    for name, value in acts.items():
        assert close(value, cache[name]), name
    assert model.n_active_hooks() == 0


CASES = [
    ("stack_head_results", {}),
    ("stack_head_results", {"incl_remainder": True}),
    ("stack_head_results", {"layer": 1, "incl_remainder": True, "apply_ln": True}),
    ("stack_head_results", {"apply_ln": True}),
    ("stack_head_results", {"layer": 0}),
    ("accumulated_resid", {}),
    ("accumulated_resid", {"apply_ln": True}),
    ("accumulated_resid", {"layer": 1, "apply_ln": True}),
    ("accumulated_resid", {"layer": 1, "mlp_input": True, "apply_ln": True}),
    ("accumulated_resid", {"incl_mid": True, "apply_ln": True}),
    ("decompose_resid", {}),
    ("decompose_resid", {"apply_ln": True}),
    ("decompose_resid", {"layer": 1, "mlp_input": True, "apply_ln": True}),
    ("decompose_resid", {"mode": "attn", "layer": 1}),
    ("decompose_resid", {"mode": "mlp", "incl_embeds": False, "apply_ln": True}),
]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("method,kwargs", CASES, ids=[f"{m}-{'-'.join(k) or 'default'}" for m, k in CASES])
def test_helpers_match_transformer_lens(family, method, kwargs, runs):
    _, (_, acts), (_, cache) = runs[family]
    if family == "neox" and (kwargs.get("incl_mid") or kwargs.get("mlp_input")) and method == "accumulated_resid":
        with pytest.raises(SiteError, match="parallel"):  # GPT-NeoX has no resid_mid; TransformerLens KeyErrors too
            getattr(acts, method)(**kwargs)
        return
    ours, labels = getattr(acts, method)(return_labels=True, **kwargs)
    theirs, tl_labels = getattr(cache, method)(return_labels=True, **kwargs)
    assert labels == tl_labels
    assert close(ours, theirs)


@pytest.mark.parametrize("family", FAMILIES)
def test_hand_identities(family, runs, tiny_dirs):
    """Without TransformerLens: the pieces sum to the stream, and the logit-lens entry is the HF final norm."""
    _, (_, acts), _ = runs[family]
    last = acts["resid_post", -1]  # [batch, pos, d_model]
    assert close(acts.decompose_resid().sum(0), last)
    assert close(acts.stack_head_results(incl_remainder=True).sum(0), last)
    assert close(acts.decompose_resid(layer=1).sum(0), acts["resid_pre", 1])
    stream, labels = acts.accumulated_resid(return_labels=True)
    assert labels == ["0_pre", "1_pre", "final_post"]
    assert torch.equal(stream[1], acts["blocks.1.hook_resid_pre"]) and torch.equal(stream[2], last)
    hf = hf_model(tiny_dirs[family])
    final_norm = {"gpt2": lambda: hf.transformer.ln_f, "llama": lambda: hf.model.norm,
                  "neox": lambda: hf.gpt_neox.final_layer_norm}[family]()
    with torch.no_grad():
        assert close(acts.accumulated_resid(apply_ln=True)[-1], final_norm(last))
    bias = {"gpt2": lambda: hf.transformer.h[0].attn.c_proj.bias, "llama": lambda: hf.model.layers[0].self_attn.o_proj.bias,
            "neox": lambda: hf.gpt_neox.layers[0].attention.dense.bias}[family]()
    heads = acts.stack_head_results(layer=1)  # [n_heads, batch, pos, d_model]: block 0's heads
    assert close(heads.sum(0) + (0 if bias is None else bias.detach()), acts["attn_out", 0])


def test_head_stack_uses_captured_results_and_z_alike(tiny_models, runs):
    model = tiny_models["llama"]  # grouped-query attention: z has n_heads heads, k/v have n_kv_heads
    tokens, (_, acts), _ = runs["llama"]
    _, with_results = run_with_cache(model, tokens, lambda n: "hook_result" in n or n.endswith("hook_resid_post"))
    assert all("hook_result" in n or "resid_post" in n for n in with_results)
    assert close(with_results.stack_head_results(), acts.stack_head_results())


def test_short_keys(tiny_models, runs):
    model = tiny_models["gpt2"]
    last = model.facts.n_layers - 1
    tokens, (_, acts), _ = runs["gpt2"]
    assert acts["pattern", -1] is acts[f"blocks.{last}.attn.hook_pattern"]
    assert acts["resid_pre", -1] is acts[f"blocks.{last}.hook_resid_pre"]
    assert acts["embed"] is acts["hook_embed"] and acts["pos_embed"] is acts["hook_pos_embed"]
    assert acts["attn", 0] is acts["blocks.0.attn.hook_pattern"]  # TransformerLens aliases
    assert acts["k1"] is acts["blocks.1.attn.hook_k"] and acts["post", 0] is acts["blocks.0.mlp.hook_post"]
    assert acts["scale", 0, "ln2"] is acts["blocks.0.ln2.hook_scale"] and acts["scale"] is acts["ln_final.hook_scale"]
    assert ("pattern", 1) in acts and ("pattern", 7) not in acts and "nonsense" not in acts
    assert acts["pattern", torch.tensor(1)] is acts["pattern", 1] and acts.get(("pattern", 9)) is None
    with pytest.raises(IndexOutOfRangeError):
        acts.accumulated_resid(layer=3)  # components before layer 0..n_layers (2), or -1 for all
    with pytest.raises(SiteError, match="layer"):
        acts["pattern"]  # two layers stored: ambiguous
    only = hs.capture(model, tokens, [hs.site("pattern", 1)])
    assert only["pattern"] is only["blocks.1.attn.hook_pattern"]  # one layer stored: unambiguous
    with pytest.raises(SiteError, match="hook_embed"):
        acts["hook_embedd"]
    with pytest.raises(SiteError, match="pattern"):
        acts["patern", 0]
    with pytest.raises(SiteError, match="not captured"):
        only["z", 0]
    with pytest.raises(IndexOutOfRangeError):
        acts["pattern", 2]
    with pytest.raises(IndexOutOfRangeError):
        acts["pattern", -3]


@pytest.mark.parametrize("family", FAMILIES)
def test_save_load_round_trip_is_bitwise(family, tmp_path, tiny_models, runs):
    model = tiny_models[family]
    _, (_, acts), _ = runs[family]
    path = tmp_path / "acts.safetensors"
    path.write_bytes(b"old")
    acts.save(path)
    assert os.listdir(tmp_path) == ["acts.safetensors"]  # written via a temp file, nothing left over
    back = Activations.load(path)
    assert list(back) == list(acts) and back.meta == acts.meta and back.model is None
    for name, value in acts.items():
        assert back[name].dtype == value.dtype and torch.equal(back[name], value), name
    assert torch.equal(back.output, acts.output)
    assert torch.equal(back.decompose_resid(), acts.decompose_resid())
    with pytest.raises(ConfigError, match="model"):
        back.stack_head_results()  # z @ W_O needs the weights
    with pytest.raises(ConfigError, match="model"):
        back.decompose_resid(apply_ln=True)  # and so does the norm's weight
    with_model = Activations.load(path, model=model)
    assert torch.equal(with_model.stack_head_results(), acts.stack_head_results())
    assert torch.equal(with_model.decompose_resid(apply_ln=True), acts.decompose_resid(apply_ln=True))


def test_failed_save_leaves_the_old_file(tmp_path, runs, monkeypatch):
    import safetensors.torch

    _, (_, acts), _ = runs["gpt2"]
    path = tmp_path / "acts.safetensors"
    path.write_bytes(b"old")

    def broken(tensors, filename, metadata=None):
        open(filename, "wb").write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", broken)
    with pytest.raises(OSError):
        acts.save(path)
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["acts.safetensors"]


def test_to_moves_in_place_and_pickle_drops_the_model(tiny_models):
    model = tiny_models["gpt2"]
    _, acts = run_with_cache(model, random_tokens(1, 4), [hs.site("resid_pre", 0)])
    assert acts.cpu() is acts
    assert acts.to("meta") is acts and acts["resid_pre", 0].device.type == "meta" and acts.output.device.type == "meta"
    _, acts = run_with_cache(model, random_tokens(1, 4), [hs.site("resid_pre", 0)])
    copy = pickle.loads(pickle.dumps(acts))
    assert copy.model is None and copy.meta == acts.meta and torch.equal(copy["resid_pre", 0], acts["resid_pre", 0])


def test_names_positions_and_bad_arguments(tiny_models, runs):
    model = tiny_models["llama"]
    tokens, (_, full), _ = runs["llama"]
    _, acts = run_with_cache(model, tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    assert list(acts) == [hs.site("pattern", 0), hs.site("pattern", 1)]
    _, part = run_with_cache(model, tokens, positions=[-1], to_cpu=True)
    assert part["resid_pre", 1].shape == (2, 1, model.facts.d_model)
    assert torch.equal(part.accumulated_resid(apply_ln=True), full.accumulated_resid(apply_ln=True)[:, :, -1:])
    assert torch.equal(part.decompose_resid(layer=1, apply_ln=True), full.decompose_resid(layer=1, apply_ln=True)[:, :, -1:])
    with pytest.raises(ConfigError):
        run_with_cache(model, tokens, ["hook_embed"], names_filter=["hook_embed"])
    with pytest.raises(ConfigError):
        run_with_cache(model, tokens, lambda n: False)
    with pytest.raises(SiteError):
        run_with_cache(model, tokens, ["blocks.0.attn.hook_patern"])
    with pytest.raises(ConfigError, match="mode"):
        full.decompose_resid(mode="heads")
    with pytest.raises(SiteError, match="scale"):
        run_with_cache(model, tokens, ["hook_embed"])[1].decompose_resid(layer=0, apply_ln=True)
    assert model.n_active_hooks() == 0


def test_run_with_hooks_accepts_transformer_lens_keywords(tiny_models):
    model = tiny_models["gpt2"]
    tokens = random_tokens(2, 5)

    def double(act, hook):
        return act * 2

    hooks = [(hs.site("resid_post", 0), double)]
    ours = model.run_with_hooks(tokens, fwd=hooks)
    assert torch.equal(model.run_with_hooks(tokens, fwd_hooks=hooks), ours)
    assert not torch.equal(model(tokens), ours)
    with pytest.raises(ConfigError, match="fwd_hooks"):
        model.run_with_hooks(tokens, fwd=hooks, fwd_hooks=hooks)
    with pytest.raises(ConfigError, match="bwd_hooks"):
        model.run_with_hooks(tokens, bwd=[], bwd_hooks=[])

    def fail(act, hook):
        raise RuntimeError("boom")

    for kwargs in ({"fwd": [(hs.site("resid_pre", 1), fail)]}, {"fwd_hooks": [(hs.site("resid_pre", 1), fail)]}):
        with pytest.raises(RuntimeError, match="boom"):
            model.run_with_hooks(tokens, **kwargs)
        assert model.n_active_hooks() == 0
