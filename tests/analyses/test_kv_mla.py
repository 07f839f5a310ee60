"""Review 15d on kv with multi-head latent attention (DeepSeek-V3): the cache's bytes are Hugging Face's own cache
tensors (A2), the cache sentence says MLA's saving (A2/B1), heavy hitters keep one set per layer (A6)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from headscope.analyses.kv.analysis import cache_anatomy
from headscope.analyses.kv.eviction import eviction_sweep
from headscope.reports.kv_cache_words import _gqa

# the model: conftest's deepseek_v3_dir, tests_support's "deepseek_v3" (2 layers, 4 heads, kv_lora_rank 32, qk_rope 8,
# qk_nope 12, v_head_dim 16, float32)


@pytest.fixture(scope="module")
def mla(deepseek_v3_dir):
    import headscope as hs

    return hs.load_model(deepseek_v3_dir, device="cpu")


@pytest.fixture(scope="module")
def hf(deepseek_v3_dir):
    from tests_support import hf_model

    return hf_model(deepseek_v3_dir)


def test_mla_cache_bytes_are_hf_cache_tensors(mla, hf):
    """Review 15d A2: headscope said 2 (K, V) x 4 heads x d_head per layer; HF's cache holds per layer the latent
    (kv_lora_rank 32) and the roped key (qk_rope 8): 40 numbers, x 2 layers x 4 B (float32) = 320 B per token, read
    here off HF's DynamicCache after a forward pass. The per-head K and V it expands to, by hand from the config:
    2 layers x 4 heads x (q/k 12 + 8, v 16) x 4 B = 1152 B."""
    from transformers import DynamicCache

    ids = torch.tensor([[4, 5, 6, 7, 8, 9]])
    cache = DynamicCache(config=hf.config)
    with torch.no_grad():
        hf(ids, past_key_values=cache, use_cache=True)
    per_token = sum(t[0, :, 0].numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    a = cache_anatomy(mla)
    assert per_token == 2 * (32 + 8) * 4 == 320
    assert a.bytes_per_token == per_token
    assert a.total(6) == sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert a.mha_bytes_per_token == 2 * 4 * (12 + 8 + 16) * 4 == 1152
    assert a.gqa_saving == pytest.approx(1 - 320 / 1152)


def test_mla_cache_sentence_says_the_latent():
    """Review 15d A2/B1: the cache sentence names the latent and MLA's saving against the per-head cache (240 B
    against 864 B: the review's model in bfloat16, 1 - 240/864 = 72%)."""
    s = {"bytes_per_token": 240, "mha_bytes_per_token": 864, "n_heads": 4, "n_kv_heads": 4, "latent": [32, 8],
         "gqa_saving": 1 - 240 / 864}
    assert _gqa(s) == ("Multi-head latent attention caches one latent per layer and position for all 4 heads "
                       "(32 + 8 roped numbers), 72% less than the 864 B per token of the per-head keys and values it "
                       "expands to.")


def test_mla_heavy_hitters_keep_one_set_per_layer_as_a_cropped_hf_cache(mla, hf):
    """Review 15d A6: MLA caches one latent per position for all heads, so heavy hitters keep one set per layer: by hand,
    HF's attentions over the context summed over heads and queries, the 3 newest plus the 2 heaviest older positions
    (budget 5), HF's latent cache cropped to them, then the answer token decoded on it."""
    from headscope.analyses.core.tasks import Task
    from tests_support import random_tokens

    tokens = random_tokens(3, 12, seed=1)
    task = Task(name="rand", tokens=tokens, answers=tokens[:, 3], wrong_answers=tokens[:, 4])
    ours = eviction_sweep(mla, task, budgets=[5], policies=("heavy_hitters",))
    ours = ours[ours.policy == "heavy_hitters"].sort_values("example").metric.to_numpy()
    ctx = 11
    with torch.no_grad():
        out = hf(tokens[:, :ctx], use_cache=True, output_attentions=True)
        cache = out.past_key_values
        for layer, lay in enumerate(cache.layers):
            received = out.attentions[layer].sum((1, 2))  # [batch, ctx]: over heads and queries
            older = received[:, : ctx - 3].topk(2, -1).indices  # the 3 newest kept as the recent window
            idx = torch.cat([older.sort(-1).values, torch.arange(ctx - 3, ctx).expand(3, -1)], -1)  # [batch, 5]
            lay.keys = lay.keys.gather(2, idx[:, None, :, None].expand(-1, 1, -1, lay.keys.shape[-1]))
            lay.values = lay.values.gather(2, idx[:, None, :, None].expand(-1, 1, -1, lay.values.shape[-1]))
        logits = hf(tokens[:, -1:], past_key_values=cache, position_ids=torch.full((3, 1), ctx)).logits[:, -1]
    ref = (logits.gather(1, tokens[:, 3:4]) - logits.gather(1, tokens[:, 4:5]))[:, 0].numpy()
    assert abs(ours - ref).max() <= 1e-4


def test_compare_counts_the_mla_latent_cache():
    """Review 15d B1: compare's "exact count" is of the cache the model holds: the review's model, 3 layers x (32 + 8)
    numbers x 2 B = 240 B per token in bfloat16 (30 KiB at 128 positions), 480 B in float32."""
    from headscope.reports.compare_notes import _kv_size_note

    side = lambda per, dtype: {"bytes_per_token": per, "bytes_at_n_ctx": 128 * per, "dtype": dtype, "latent": [32, 8]}  # noqa: E731
    latent = " (one MLA latent of 32 + 8 numbers a layer, as the model's cache holds it)"
    assert _kv_size_note(side(3 * 40 * 2, "bfloat16"), side(3 * 40 * 4, "float32")) == [
        f"kv cache size: A 240 B per token (bfloat16), 30.0 KiB at full context{latent}, B 480 B per token (float32), "
        f"60.0 KiB at full context{latent}: an exact count (no sampling noise): the dtypes differ (bfloat16, 2 bytes a "
        "number, against float32, 4): a setting, not the model."]


def test_mla_norms_figure_says_it_plots_the_expanded_keys():
    """Review 15d C3: on MLA the figure's keys are the per-head keys expanded from the latent, not what is cached."""
    import matplotlib.pyplot as plt
    import pandas as pd

    from headscope.reports.plots_kv import plot_norms

    data = pd.DataFrame({"kind": "key", "layer": [0, 0, 1, 1], "position": [0, 1, 0, 1], "norm": [1.0, 2.0, 3.0, 4.0],
                         "n_prompts": 2})
    ax = plot_norms(data, latent=[32, 8])
    assert ax.get_title() == ("Per-head key norms, expanded from the cached latent (mean over heads)\n"
                              "the cache holds one latent of 32 + 8 numbers per position, not these")
    assert ax.get_ylabel() == "L2 norm of the per-head key (expanded from the latent)"
    assert plot_norms(data).get_ylabel() == "L2 norm of the cached key"
    plt.close("all")


def test_misses_are_said_in_the_metrics_units():
    """Review 15d B2: "falls 534.3% to 627.0% below" was a share of a full-cache mean of 0.48 whose own 95% CI spans a
    factor 4. Window on 4 prompts of context 32, full cache 0.5 each; budget 4 moves them by -2.9, -3.1, -3.0, -3.0
    (mean -3.0), budget 8 by -2.4, -2.6, -2.5, -2.5 (mean -2.5): both intervals clear the band, said in logits."""
    import pandas as pd

    from headscope.analyses.kv.holding import holding_budgets
    from headscope.reports.kv_numbers import _with_units
    from headscope.reports.kv_policy_words import _misses

    rows = []
    for e, (d4, d8) in enumerate([(-2.9, -2.4), (-3.1, -2.6), (-3.0, -2.5), (-3.0, -2.5)]):
        rows.append({"policy": "full", "budget": 32, "example": e, "context": 32, "metric": 0.5})
        rows += [{"policy": "window", "budget": b, "example": e, "context": 32, "metric": 0.5 + d}
                 for b, d in ((4, d4), (8, d8))]
    hold = holding_budgets(pd.DataFrame(rows), n_sink=4)
    e = hold["policies"]["window"]
    assert e["misses_diff"] == pytest.approx([2.5, 3.0])
    # review 15d-v B2: each fall with its n and 95% t interval (both budgets' changes: the mean +- 0.1, sd sqrt(2/3)/10)
    from scipy import stats

    c4, c8 = (stats.ttest_1samp(d, 0.0).confidence_interval(0.95) for d in ([-2.9, -3.1, -3.0, -3.0],
                                                                              [-2.4, -2.6, -2.5, -2.5]))
    assert _misses(_with_units(e, "logits"), 0.01) == (
        f"on average it falls 3.00 logits below the full cache at budget 4 (95% CI [{c4.low:+.2f}, {c4.high:+.2f}], n = 4) "
        f"and 2.50 below at 8 (95% CI [{c8.low:+.2f}, {c8.high:+.2f}], n = 4)")
    older = {k: v for k, v in e.items() if k != "missed_rows"}  # a summary written before: the range, the band
    assert _misses(_with_units(older, "logits"), 0.01) == ("on average it falls 2.50 to 3.00 logits below the full cache "
                                                           "at every budget that evicts (the band is 1% of the "
                                                           "full-cache mean)")


def test_kv_finding_states_each_interval_once():
    """Review 15d C6: window's only evicting budget, 4, moves 4 prompts (full cache 10) by +3, -1, +2, -1 logits: +7.5%,
    its 95% t interval [-25.3%, +40.3%] (scipy by hand) reaching 0. The old finding gave that interval three times (the
    policy's clause, "is more than 1% above ... no evidence that it is better", "window comes closest"): now once."""
    import pandas as pd
    from scipy import stats

    from headscope.analyses.kv.holding import holding_budgets
    from headscope.reports.findings import finding

    diffs = [3.0, -1.0, 2.0, -1.0]
    rows = []
    for e, d in enumerate(diffs):
        rows += [{"policy": "full", "budget": 12, "example": e, "context": 12, "metric": 10.0},
                 {"policy": "window", "budget": 4, "example": e, "context": 12, "metric": 10.0 + d}]
    ci = stats.t.interval(0.95, 3, loc=sum(diffs) / 4, scale=stats.sem(diffs))
    interval = f"+7.5% (95% CI [{10 * ci[0]:+.1f}%, {10 * ci[1]:+.1f}%]"
    assert interval == "+7.5% (95% CI [-25.3%, +40.3%]"
    s = {"metric": "logit_diff", "n_examples": 4, "metric_unevicted": 10.0, "n_sink": 4,
         "holding_budgets": holding_budgets(pd.DataFrame(rows), n_sink=4)}
    text = finding("kv", s)
    assert text.count(interval) == 1, text
    assert "no evidence that it is better" not in text
    # review 15d C6: the headline first, with the interval; window's own clause refers to it
    assert text.startswith("No policy is shown to stay within 1% at a budget that evicts something; window comes "
                           "closest: at budget 4 it keeps 107.5% of the logit difference and lies above the full cache on "
                           "average, but its 95% CI reaches 0 and covers the whole +-1% band: not clearly above it at all "
                           f"({interval}, per example -1.00 to +3.00 logits, n = 4)). "), text
    assert "window not shown either way (at 4, its largest budget that evicts: as above)" in text


def test_no_share_of_a_full_cache_mean_whose_interval_is_wide():
    """Review 15d-v B2: "keeps -129.1% of the full-cache value, -229.1% (95% CI [-713.4%, +255.3%] ...)" took shares of a
    6-prompt full-cache mean whose own interval spans a factor of 2 or more. Here 4 prompts at full cache 0.4, 0.8, 0.5,
    0.7 (mean 0.6, scipy's t interval [0.31, 0.89], a factor 2.9); window at 4 changes them by -1.3, -0.2, -0.9, +0.4
    (mean -0.5): said in logits with its own interval, no percentage; a narrow full cache (10, 10.2, 9.8, 10) keeps
    its shares."""
    import pandas as pd
    from scipy import stats

    from headscope.analyses.kv.holding import holding_budgets
    from headscope.reports.findings import finding
    from headscope.reports.kv_numbers import wide_base

    assert wide_base({"base_ci_low": 0.31, "base_ci_high": 0.89}) and wide_base({"base_ci_low": -0.1, "base_ci_high": 1})
    assert not wide_base({"base_ci_low": 0.5, "base_ci_high": 0.9}) and not wide_base({})  # older rows: as before

    def text(full):
        diffs = [-1.3, -0.2, -0.9, 0.4]
        rows = []
        for e, (f, d) in enumerate(zip(full, diffs)):
            rows += [{"policy": "full", "budget": 12, "example": e, "context": 12, "metric": f},
                     {"policy": "window", "budget": 4, "example": e, "context": 12, "metric": f + d}]
        hold = holding_budgets(pd.DataFrame(rows), n_sink=4)
        return hold, finding("kv", {"metric": "logit_diff", "n_examples": 4, "metric_unevicted": float(np.mean(full)),
                                    "holding_budgets": hold})

    full = [0.4, 0.8, 0.5, 0.7]
    base = stats.ttest_1samp(full, 0.0).confidence_interval(0.95)
    assert base.high / base.low > 2
    hold, wide = text(full)
    row = hold["policies"]["window"]["closest"]
    assert (row["base_ci_low"], row["base_ci_high"]) == pytest.approx((base.low, base.high))
    ci = stats.ttest_1samp([-1.3, -0.2, -0.9, 0.4], 0.0).confidence_interval(0.95)
    assert (f"(-0.50 logits (95% CI [{ci.low:+.2f}, {ci.high:+.2f}], per example -1.30 to +0.40, n = 4))") in wide, wide
    assert "% (95% CI" not in wide and "of the logit difference" not in wide and "of the full-cache value" not in wide
    _, narrow = text([10.0, 10.2, 9.8, 10.0])
    assert "-5.0% (95% CI" in narrow and "keeps 95.0% of the logit difference" in narrow
