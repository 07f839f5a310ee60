"""Edits to attention scores / patterns that TransformerLens discards (review 16d A1, A3, A6, C3): the probe, and
the one-line refusals of kv eviction, the pattern patching site and streaming attention on a tiny OPT."""
from __future__ import annotations

import pytest
import torch
from transformers import OPTForCausalLM

import headscope as hs
from headscope.analyses.kv.eviction import eviction_sweep
from headscope.analyses.patching.sites import SITE_TYPES, absent, unpatchable
from headscope.analyses.position.sinks import streaming_attention
from headscope.errors import SiteError, UnsupportedModelError
from headscope.hooks.edits import edits_discarded, scores_hold_weights
from headscope.hooks.patterns import reduce_patterns
from headscope.reports.provenance import provenance_lines
from tests_support import pair_task

OPT_SCORES = "TransformerLens hands OPTForCausalLM's attention to the Hugging Face module and discards edits to attention scores"
OPT_PATTERNS = OPT_SCORES.replace("scores", "patterns")


def test_opt_discards_score_edits_that_plain_hf_shows_matter(opt_model):
    """The mask the probe puts on the scores (every key hidden but the query's own, via Hugging Face's own
    attention mask here) moves plain HF OPT's logits, while the bridge's output under the same edit at
    hook_attn_scores is bit-identical to the unedited one: the edit is discarded, and the probe says so."""
    model, path = opt_model
    hf = OPTForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    tokens = torch.tensor([[2, 11, 23, 37, 41]])
    n = tokens.shape[1]
    eye = torch.eye(n, dtype=torch.bool)

    def own_key_only(module, args, kwargs):  # HF's 4D additive mask, every key but the query's own hidden
        mask = kwargs["attention_mask"]
        kwargs["attention_mask"] = mask.masked_fill(~eye, torch.finfo(mask.dtype).min)
        return args, kwargs

    with torch.no_grad():
        full = hf(tokens).logits[0, -1]
        handles = [layer.self_attn.register_forward_pre_hook(own_key_only, with_kwargs=True)
                   for layer in hf.model.decoder.layers]
        own_only = hf(tokens).logits[0, -1]
        for handle in handles:
            handle.remove()
        assert (own_only - full).abs().max() > 1e-2  # the edit matters in the model itself

        def hide(scores, hook):
            return scores.masked_fill(~eye, torch.finfo(scores.dtype).min)

        with pytest.warns(UserWarning, match="edit is discarded"):
            edited = model.run_with_hooks(tokens, fwd_hooks=[(hs.site("scores", L), hide) for L in range(2)])[0, -1]
        assert torch.equal(edited, model(tokens)[0, -1])
    assert edits_discarded(model, "scores") == OPT_SCORES
    assert edits_discarded(model, "pattern") == OPT_PATTERNS


def test_edits_take_effect_where_the_bridge_computes_attention(tiny_models):
    for family in ("gpt2", "llama", "neox"):
        assert edits_discarded(tiny_models[family], "scores") is None
        assert edits_discarded(tiny_models[family], "pattern") is None


def test_one_probe_answers_each_question_apart_per_bridge(opt_model, tiny_models):
    """mend18: edits_discarded and scores_hold_weights share one probe and one cache per bridge; asked in either order
    on one bridge, each question keeps its own answer: OPT's plain AttentionBridge discards both edits and fires
    hook_attn_scores on the weights (layer 0's scores equal its pattern, read here by hand); GPT-2's does neither."""
    model, _ = opt_model
    tokens = torch.tensor([[0, 1, 2, 3]])
    _, cache = model.run_with_cache(tokens, names_filter=lambda name: name.startswith("blocks.0.attn.hook_"))
    assert torch.equal(cache["blocks.0.attn.hook_attn_scores"], cache["blocks.0.attn.hook_pattern"])
    assert scores_hold_weights(model) and edits_discarded(model, "pattern") == OPT_PATTERNS
    assert scores_hold_weights(model) and edits_discarded(model, "scores") == OPT_SCORES
    gpt2 = tiny_models["gpt2"]
    assert edits_discarded(gpt2, "scores") is None and not scores_hold_weights(gpt2)
    assert edits_discarded(gpt2, "pattern") is None and not scores_hold_weights(gpt2)


def test_kv_eviction_refuses_on_opt_in_one_line(opt_model):
    """Before the fix every policy at budget 1 equalled the full cache exactly (+0.0%, review 16d A1)."""
    model, _ = opt_model
    with pytest.raises(UnsupportedModelError) as err:
        eviction_sweep(model, pair_task(), budgets=[1])
    assert str(err.value) == (f"{OPT_SCORES}, so the kv eviction what-if (a mask on the answer query's attention "
                              "scores) cannot run on this model (it would change nothing).")


def test_kv_runs_on_opt_and_skips_only_the_eviction_in_one_line(opt_model):
    """Review 16dv B1: the whole kv analysis was refused on OPT (plan.skip), losing its cache size, sinks and key
    norms; now only the eviction sweep is skipped. Bytes per token by hand: 2 layers x (K and V) x 4 KV heads x 16
    dims x 4 bytes (float32) = 1024; the first-key norm ratio from plain Hugging Face's cache."""
    from headscope.analyses.core.runner import plan_analyses
    from headscope.reports.kv_words import finding
    from headscope.reports.plots_kv import figures

    model, path = opt_model
    assert plan_analyses(model, ["kv"], None)["kv"].skip is None
    task = pair_task(n=3, n_pos=8)
    result = hs.kv_analysis(model, task)
    s = result.summary
    assert s["bytes_per_token"] == 2 * 2 * 4 * 16 * 4 == 1024
    line = f"{OPT_SCORES}, so a mask on the answer query's attention scores would change nothing"
    assert s["eviction_skipped"] == line
    assert len(result.df) == 0 and "holding_budgets" not in s
    hf = OPTForCausalLM.from_pretrained(path).eval()
    with torch.no_grad():
        cache = hf(task.tokens, use_cache=True).past_key_values
    for layer in range(2):
        keys = (cache.layers[layer].keys if hasattr(cache, "layers") else cache[layer][0]).norm(dim=-1)  # [b, h, pos]
        want = (keys[:, :, :1].mean((1, 2)) / keys[:, :, 1:].mean((1, 2))).mean()
        assert s["key_norm_ratios"][layer]["ratio"] == pytest.approx(float(want), rel=1e-4)
    said = finding(s)
    assert said.count("Eviction what-if not run") == 1 and said.endswith(f"Eviction what-if not run: {line}.")
    assert "1 KiB" in said or "1.0 KiB" in said
    assert set(figures(result)) == {"kv_norms", "kv_sinks"}


def test_pattern_patching_refuses_on_opt_not_zero(opt_model, tiny_models):
    """Before the fix every pattern cell read exactly 0 (review 16d A3); the report's run leaves the site out."""
    model, _ = opt_model
    pattern = SITE_TYPES["pattern"]
    with pytest.raises(SiteError, match="every pattern cell would read exactly 0"):
        hs.activation_patching(model, pair_task(), sites=["pattern", "head_out"])
    assert unpatchable(model, pattern, set(hs.available_sites(model)))
    assert absent(model, pattern) == f"not patched: {OPT_PATTERNS}: every pattern cell would read exactly 0"
    gpt2 = tiny_models["gpt2"]
    assert not unpatchable(gpt2, pattern, set(hs.available_sites(gpt2)))
    assert not unpatchable(model, SITE_TYPES["head_out"], set(hs.available_sites(model)))  # z edits do take effect


def test_streaming_masks_refuse_on_opt(opt_model):
    model, _ = opt_model
    with pytest.raises(UnsupportedModelError, match="streaming attention"):
        with streaming_attention(model, n_sink=1, window=2):
            pass
    keep = torch.ones(6, 6, dtype=torch.bool).tril()
    with pytest.raises(UnsupportedModelError, match="keep mask"):
        reduce_patterns(model, torch.tensor([[2, 11, 23, 37, 41, 5]]), lambda *_: None, layers=(), keep=keep)


def test_a_part_not_run_is_one_report_line():
    """review 16d C3: what headscope could not do is a line of the section's provenance."""
    lines = provenance_lines({"task": "t", "source": "s", "n_examples": 2, "not_run": "the streaming masks: why"})
    assert "not run: the streaming masks: why" in lines


def test_patch_and_ablate_refuse_pattern_sites_on_opt(opt_model):
    model, _ = opt_model
    tokens = torch.tensor([[2, 11, 23, 37]])
    name = hs.site("pattern", 0)
    source = hs.capture(model, tokens, [name])
    with pytest.raises(UnsupportedModelError, match=f"^{OPT_PATTERNS}, so patch at {name} cannot run"):
        with hs.patch(model, source, name):
            pass
    with pytest.raises(UnsupportedModelError, match=f"^{OPT_SCORES}, so ablate at "):
        with hs.ablate(model, sites=[hs.site("scores", 1)]):
            pass
