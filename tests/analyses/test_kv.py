"""The kv analysis: cache arithmetic, allocated cache tensors, eviction against a real cache crop."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import headscope as hs
from headscope.analyses.core.tasks import Task
from headscope.analyses.kv import analysis as kv
from headscope.analyses.kv import eviction as kv_eviction
from tests_support import hand_eviction_sweep, hf_model, random_tokens


def _task(n: int = 4, pos: int = 12, seed: int = 1) -> Task:
    tokens = random_tokens(n, pos, seed=seed)
    return Task(name="rand", tokens=tokens, answers=tokens[:, 3], wrong_answers=tokens[:, 4])


def test_cache_bytes_reproduces_the_design_essay_example():
    # 5,000 positions x 50 layers x 20 maps (K and V of 10 heads) x 1,000 dims x 2 bytes = 10 GB
    assert kv.cache_bytes(positions=5000, n_layers=50, n_kv_heads=10, d_head=1000, bytes_per_number=2) == 10 * 10**9
    # projecting to r = 200 dims gives 2 GB
    assert kv.cache_bytes(positions=5000, n_layers=50, n_kv_heads=10, d_head=200, bytes_per_number=2) == 2 * 10**9
    with pytest.raises(ValueError, match="positions must be a non-negative int"):
        kv.cache_bytes(positions=-1, n_layers=1, n_kv_heads=1, d_head=1, bytes_per_number=2)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_cache_formula_matches_the_tensors_allocated_during_generation(family, tiny_models):
    model = tiny_models[family]
    trace = hs.generate_with_kv(model, random_tokens(3, 6, seed=2), max_new_tokens=5)
    allocated = sum(t.numel() * t.element_size() for lay in trace.cache.layers for t in (lay.keys, lay.values))
    positions = trace.tokens.shape[1] - 1  # the last generated token is never fed back
    anatomy = kv.cache_anatomy(model)
    assert anatomy.total(positions, batch=3) == allocated
    assert anatomy.bytes_per_token * positions * 3 == allocated
    f = model.facts
    assert anatomy.mha_bytes_per_token == anatomy.bytes_per_token * f.n_heads // f.n_kv_heads
    assert anatomy.gqa_saving == {"gpt2": 0.0, "llama": 0.5}[family]  # llama: 4 query heads share 2 KV heads
    assert kv.cache_anatomy(model, dtype=torch.bfloat16).bytes_per_number == 2


def test_keep_masks_by_hand():
    common = dict(n_layers=1, batch=1, n_kv_heads=1, ctx=10, budget=4, n_sink=2)
    kept = lambda policy, **kw: kv_eviction.keep_mask(policy, **{**common, **kw})[0, 0, 0].nonzero().flatten().tolist()  # noqa: E731
    assert kept("sink_window") == [0, 1, 8, 9]
    assert kept("window") == [6, 7, 8, 9]
    received = torch.tensor([5.0, 0.1, 3.0, 0.2, 0.3, 4.0, 0.0, 9.0, 0.4, 1.0]).reshape(1, 1, 1, 10)
    # H2O (review 13a A1): the newest 2 of the budget 4, then the 2 most attended of the rest (7: 9.0, 0: 5.0)
    assert kept("heavy_hitters", received=received) == [0, 7, 8, 9]
    assert kept("heavy_hitters", received=received, recent_share=0.0) == [0, 2, 5, 7]  # no window: newest go first
    assert kept("heavy_hitters", received=received, recent_share=0.25) == [0, 5, 7, 9]
    assert kept("heavy_hitters", received=received, budget=1) == [9]
    assert kv_eviction.keep_mask("window", **{**common, "budget": 10}).all()
    with pytest.raises(ValueError, match="unknown eviction policy"):
        kv_eviction.keep_mask("lru", **common)
    with pytest.raises(ValueError, match="recent_share must be a share between 0 and 1"):
        kv.KVConfig(recent_share=1.5)  # refused when the config is built, before anything runs
    # layer 0 slides over 4 keys: the answer query (position 10) sees 7, 8, 9 of the context; layer 1 is global
    two = {**common, "n_layers": 2, "windows": (4, None)}
    both = lambda policy, **kw: [m[0, 0].nonzero().flatten().tolist()  # noqa: E731
                                 for m in kv_eviction.keep_mask(policy, **{**two, **kw})]
    assert both("full") == [[7, 8, 9], list(range(10))]
    assert both("window") == [[7, 8, 9], [6, 7, 8, 9]]
    assert both("sink_window") == [[8, 9], [0, 1, 8, 9]]  # the sinks 0, 1 lie outside layer 0's window
    received2 = received.expand(2, 1, 1, 10)
    assert both("heavy_hitters", received=received2) == [[7, 8, 9], [0, 7, 8, 9]]
    assert both("heavy_hitters", received=received2, budget=2) == [[7, 9], [7, 9]]  # 9 recent, 7 the heaviest else


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_attention_received_matches_hf_attentions(family, tiny_dirs, tiny_models):
    model, tokens = tiny_models[family], random_tokens(2, 9, seed=4)
    with torch.no_grad():
        attns = hf_model(tiny_dirs[family])(tokens, output_attentions=True).attentions
    f = model.facts
    got = kv_eviction.attention_received(model, tokens)  # [layer, batch, kv_head, ctx]
    for layer, a in enumerate(attns):  # a: [batch, head, q, k]
        per_head = a[:, :, :8, :8].sum(2)  # queries and keys of the context (all but the last position)
        expected = torch.stack([per_head[:, h * (f.n_heads // f.n_kv_heads):(h + 1) * (f.n_heads // f.n_kv_heads)].sum(1)
                                for h in range(f.n_kv_heads)], dim=1)
        assert (got[layer] - expected).abs().max().item() <= 1e-5


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_eviction_mask_equals_a_real_hf_cache_crop(family, tiny_dirs, tiny_models):
    """Prefill the context in plain HF, keep only the chosen cache entries, feed the last token."""
    model, task = tiny_models[family], _task(n=3, pos=12)
    f, ctx = model.facts, 11
    hf = hf_model(tiny_dirs[family])
    received = kv_eviction.attention_received(model, task.tokens)
    for policy in kv_eviction.POLICIES:
        keep = kv_eviction.keep_mask(policy, n_layers=f.n_layers, batch=3, n_kv_heads=f.n_kv_heads, ctx=ctx,
                                     budget=5, n_sink=2, received=received)
        ours = kv_eviction.evicted_logits(model, task.tokens, keep)[:, -1]
        with torch.no_grad():
            cache = hf(task.tokens[:, :-1], use_cache=True).past_key_values
            for layer, lay in enumerate(cache.layers):
                idx = torch.stack([torch.stack([row.nonzero().flatten() for row in b])
                                   for b in keep[layer]])  # [batch, kv_head, 5]
                idx = idx[..., None].expand(-1, -1, -1, lay.keys.shape[-1])
                lay.keys, lay.values = lay.keys.gather(2, idx), lay.values.gather(2, idx)
            ref = hf(task.tokens[:, -1:], past_key_values=cache, position_ids=torch.full((3, 1), ctx)).logits[:, -1]
        assert (ours - ref).abs().max().item() <= 1e-4, policy
        assert (ours - model(task.tokens)[:, -1]).abs().max().item() > 1e-2  # eviction changed something


def test_full_budget_reproduces_the_unevicted_metric(tiny_models):
    # the sweep decodes the answer query on the prefilled context: equal to the plain pass's last
    # position to float rounding
    model, task = tiny_models["llama"], _task(n=4, pos=12)
    sweep = kv_eviction.eviction_sweep(model, task, budgets=[2, 11, 50], n_sink=2)
    with torch.no_grad():
        last = model(task.tokens)[:, -1]  # [batch, vocab]
    expected = (last[torch.arange(4), task.answers] - last[torch.arange(4), task.wrong_answers]).numpy()
    full = sweep[sweep.budget >= 11]
    assert set(full.policy) == {"full", *kv_eviction.POLICIES}
    for _, group in full.groupby(["policy", "budget"]):
        assert np.abs(group.sort_values("example").metric.to_numpy() - expected).max() <= 1e-5
    assert np.abs(sweep[(sweep.budget == 2) & (sweep.policy == "window")].metric.to_numpy() - expected).max() > 1e-2


def test_kv_analysis_summary_states_and_figures(tiny_models, tiny_dirs):
    model, task = tiny_models["llama"], _task(n=3, pos=8)
    result = kv.kv_analysis(model, task, kv.KVConfig(n_sink=2, budgets=(1, 4, 7)))
    s = result.summary
    assert s["bytes_per_token"] == 2 * 2 * 2 * 16 * 4  # layers x (K, V) x kv_heads x d_head x float32
    # GQA, one convention: the share of the MHA cache saved (4 query heads on 2 KV heads: half), summary and CSV
    assert (s["n_heads"], s["n_kv_heads"], s["mha_bytes_per_token"], s["gqa_saving"]) == (4, 2, 2 * s["bytes_per_token"], 0.5)
    assert (result.tables["anatomy"].gqa_saving == 0.5).all()
    # review 13a C5: no cache longer than the model's context (HF's max_position_embeddings), which is a row itself
    n_ctx = hf_model(tiny_dirs["llama"]).config.max_position_embeddings
    anatomy = result.tables["anatomy"]
    assert sorted(set(anatomy.positions)) == sorted({c for c in (1024, 8192, 32768) if c <= n_ctx} | {n_ctx})
    at_ctx = anatomy[(anatomy.positions == n_ctx) & (anatomy.batch == 8)].bytes.item()
    assert at_ctx == 8 * n_ctx * 2 * 2 * 2 * 16 * 4  # batch x positions x layers x (K, V) x kv_heads x d_head x float32
    assert set(s["holding_budgets"]["policies"]) == set(kv_eviction.POLICIES) and s["holding_budgets"]["grid"] == [1, 4, 7]
    top = max(task.answers.tolist(), key=task.answers.tolist().count)  # the constant guess from the task's own answers
    assert s["holding_budgets"]["constant_guess"] == {"correct": task.answers.tolist().count(top), "n_examples": 3,
                                                      "n_answers": len(set(task.answers.tolist()))}
    assert (result.df.context == 7).all()  # unpadded prompts of 8 tokens: 7 cached context positions each
    assert s["prompt_tokens"] == 8  # the longest prompt, as position records it
    assert set(s["metric_per_policy_budget"]) == set(kv_eviction.POLICIES)
    assert set(s["metric_per_policy_budget"]["window"]) == {"1", "4", "7"}
    # what each policy keeps of a longer prompt, by hand (n_sink 2; H2O's recent window ceil(budget / 2)), and the
    # sweep's own counts of kept positions agree: per layer, the split's total (a prompt of 7 keeps all 7 at 7)
    split = lambda first, recent, heavy: {"first": first, "recent": recent, "most_attended": heavy}  # noqa: E731
    assert s["kept_split"] == {"window": {"1": split(0, 1, 0), "4": split(0, 4, 0), "7": split(0, 7, 0)},
                               "sink_window": {"1": split(1, 0, 0), "4": split(2, 2, 0), "7": split(2, 5, 0)},
                               "heavy_hitters": {"1": split(0, 1, 0), "4": split(0, 2, 2), "7": split(0, 4, 3)}}
    assert s["context_range"] == [7, 7]
    per_layer = result.df[result.df.policy != "full"].groupby(["policy", "budget"]).kept.mean() / model.facts.n_layers
    assert {(p, b): sum(s["kept_split"][p][str(b)].values()) for p, b in per_layer.index} == per_layer.to_dict()
    # the whole context: every cached position before the last, whose query reads the answer
    assert (s["context_positions"], s["n_examples"], s["metric"]) == (task.tokens.shape[1] - 1, 3, task.metric)
    # norms: against the HF cache of the same prompts
    with torch.no_grad():
        cache = hf_model(tiny_dirs["llama"])(task.tokens, use_cache=True).past_key_values
    norms = result.tables["norms"]
    row = norms[(norms.layer == 1) & (norms.kind == "value") & (norms.kv_head == 1) & (norms.position == 5)].norm.item()
    assert row == pytest.approx(cache.layers[1].values[:, 1, 5].norm(dim=-1).mean().item(), abs=1e-5)
    sinks = result.tables["sinks"]
    assert sinks.baseline_mass.iloc[0] == pytest.approx(sum(1 / (q + 1) for q in range(1, 8)) / 7)  # queries q >= 1
    assert set(sinks.baseline) == {"uniform"} and "uniform_share" not in sinks  # rotary: the uniform share itself
    with torch.no_grad():
        attns = hf_model(tiny_dirs["llama"])(task.tokens, output_attentions=True).attentions
    assert sinks.sink_mass.iloc[1] == pytest.approx(attns[1][:, :, 1:, 0].mean().item(), abs=1e-5)
    # review 5 A4: an interval over the prompts (t, from each prompt's own mass) and the shared sink verdict
    from scipy import stats

    for layer in (0, 1):
        per_prompt = attns[layer][:, :, 1:, 0].mean((1, 2)).double().numpy()  # [prompts]
        ci = stats.ttest_1samp(per_prompt, 0.0).confidence_interval(0.95)
        excess = stats.ttest_1samp(per_prompt - sinks.baseline_mass.iloc[0], 0.0).confidence_interval(0.95)
        row = sinks.iloc[layer]
        assert (row.ci_low, row.ci_high) == pytest.approx((ci.low, ci.high), abs=1e-5)
        assert (row.excess_ci_low, row.excess_ci_high) == pytest.approx((excess.low, excess.high), abs=1e-5)
        assert row.sink == (per_prompt.mean() >= 1.5 * row.baseline_mass and excess.low > 0) and row.n_prompts == 3
        assert s["sinks"][layer]["ci"] == pytest.approx([ci.low, ci.high], abs=1e-5)
    # Llama has no key norm (Hugging Face's attention has no k_norm): the keys' norms are free, the ratio is said
    assert not any(hasattr(layer.self_attn, "k_norm") for layer in hf_model(tiny_dirs["llama"]).model.layers)
    assert s["keys_normalised"] is False and s["key_norm"] is None
    from headscope.reports.plots_kv import figures, finding

    assert "The first key's norm over the other keys' per layer" in finding(s) and "normalised" not in finding(s)
    # the first key's norm over the other keys', each prompt's (means over KV heads), with its t interval over the
    # prompts: from Hugging Face's own cache, the numbers the finding states and compare sets against another run's
    for layer in (0, 1):
        k = cache.layers[layer].keys.norm(dim=-1)  # [prompts, kv_head, pos]
        each = (k[:, :, 0].mean(1) / k[:, :, 1:].mean((1, 2))).double().numpy()  # [prompts]
        ci = stats.ttest_1samp(each, 0.0).confidence_interval(0.95)
        record = s["key_norm_ratios"][layer]
        assert (record["layer"], record["n"]) == (layer, 3) and record["ratio"] == pytest.approx(each.mean(), abs=1e-5)
        assert record["ci"] == pytest.approx([ci.low, ci.high], abs=1e-5)
        assert f"layer {layer} {each.mean():.2f} [{ci.low:.2f}, {ci.high:.2f}]" in finding(s)
    assert "(each prompt's ratio, mean over 3 prompts, 95% CI)" in finding(s)
    # review 10b A1: the first key is the <bos> headscope puts in front (the word tokenizer adds none): said
    bos = model.tokenizer.bos_token_id
    assert int(task.tokens[0, 0]) == bos and model.tokenizer("w1")["input_ids"][0] != bos
    assert s["first_token_added_bos"] == "<bos>"
    assert "The first token is '<bos>', the BOS headscope put in front of every prompt" in finding(s)
    assert "The first token is" not in finding({**s, "first_token_added_bos": None})
    from headscope.models import HookedModel

    as_tokenized = HookedModel(model.bridge, model.tokenizer, model.facts, "test", prepend_bos=False)
    assert kv._added_bos_first(as_tokenized, task) is None  # --no-prepend-bos: a <bos> there is the user's own
    from headscope.models.zoo.vocab import build_tokenizer

    zoo = HookedModel(model.bridge, build_tokenizer(), model.facts, "test")  # zoo data start with <bos>, as trained
    assert zoo.added_bos() == "<bos>" and zoo.tokenizer.bos_token_id == bos and kv._added_bos_first(zoo, task) is None
    figs = figures(result)
    assert set(figs) == {"kv_eviction", "kv_norms", "kv_sinks"}
    assert figs["kv_norms"].axes[0].get_ylim()[0] == 0 and "normalised" not in figs["kv_norms"].axes[0].get_title()


def test_holding_budgets_give_each_policys_closest_budget_with_its_answers_and_a_non_monotone_curve():
    """review 5 A3: heavy hitters never within 1%, closest at budget 1 (-1.2%, every answer), worse at 2 and 4
    than at 8: the closest row, the answers kept, the misses and the non-monotone curve, from the sweep by hand."""
    from scipy import stats

    from headscope.analyses.kv.holding import holding_budgets
    from tests_support import hand_heavy_hitters_sweep

    sweep = hand_heavy_hitters_sweep()
    hold = holding_budgets(sweep, n_sink=4)
    heavy = hold["policies"]["heavy_hitters"]
    assert heavy["budget"] is None and heavy["closest"]["budget"] == 1
    diff = (sweep[(sweep.policy == "heavy_hitters") & (sweep.budget == 1)].metric.to_numpy() - 10.0)
    ci = stats.ttest_1samp(diff, 0.0).confidence_interval(0.95)
    c = heavy["closest"]
    assert c["change"] == pytest.approx(-0.012) and (c["ci_low"], c["ci_high"]) == pytest.approx((ci.low / 10, ci.high / 10))
    assert (c["correct"], c["full_correct"], c["n_evicting"]) == (4, 4, 4) and heavy["answers_from"] == 1
    # review 14bv B1: budget 1's interval reaches into the band (its upper end above -1%): cannot tell, not missed
    assert ci.high / 10 > -0.01 and heavy["verdicts"]["1"] == "cannot tell"
    assert heavy["misses"] == pytest.approx([0.019, 0.046]) and heavy["missed"] == [2, 4, 8]
    assert heavy["monotone"] is False and heavy["every_evicting_missed"] is False
    window = hold["policies"]["window"]  # |change| 0.9, 0.7, 0.4, 0.1: monotone; one answer lost at every budget
    assert window["monotone"] is True and window["closest"]["budget"] == 8 and window["answers_from"] is None
    assert (window["closest"]["correct"], window["closest"]["full_correct"]) == (3, 4)


def test_holding_budgets_count_only_prompts_a_budget_evicts_from():
    from scipy import stats

    from headscope.analyses.kv.holding import budget_changes, holding_budgets

    sweep = hand_eviction_sweep()
    table = budget_changes(sweep).set_index(["policy", "budget"])
    assert table.loc[("window", 4), "n_evicting"] == 2 and table.loc[("window", 4), "change"] == pytest.approx(-0.005)
    assert table.loc[("window", 12), "n_evicting"] == 0  # the whole context: no prompt evicts
    hold = holding_budgets(sweep, n_sink=4)
    assert hold["whole_from"] == 12 and hold["grid"] == [1, 2, 4, 8, 12]
    window = hold["policies"]["window"]
    assert (window["budget"], window["below"], window["at"]["n_evicting"]) == (2, 1, 4)
    assert window["at"]["share"] == pytest.approx(np.median([2 / 4, 2 / 4, 2 / 12, 2 / 12]))
    # budget 1 raises the metric by 7.5% (per example +5% to +10%): above the full cache, not "within 1%"
    [above] = window["above"]
    ci = stats.ttest_1samp([1.0, 1.0, 0.5, 0.5], 0.0).confidence_interval(0.95)
    assert above["budget"] == 1 and above["change"] == pytest.approx(0.075)
    assert (above["ci_low"], above["ci_high"]) == pytest.approx((ci.low / 10, ci.high / 10))
    # per example in the metric's units (review 10b C2): 10.5 and 11 against each prompt's own 10
    assert (above["per_example_diff_low"], above["per_example_diff_high"]) == pytest.approx((0.5, 1.0))
    assert above["clear_of"] == "band"  # its interval's lower bound, +2.9%, clears the +1% tolerance
    sink = hold["policies"]["sink_window"]
    # review 8b A3: its mean at 8 is within 1% (+0.2%) but over 2 prompts its interval is [-3.6%, +4.0%]: not shown
    ci = stats.ttest_1samp([0.05, -0.01], 0.0).confidence_interval(0.95)
    [ns] = sink["not_shown"]
    assert (ns["budget"], ns["change"], ns["ci_low"], ns["ci_high"]) == pytest.approx((8, 0.002, ci.low / 10, ci.high / 10))
    assert (sink["budget"], sink["at"], sink["consistent_from"], sink["sinks_only_below"]) == (None, None, 8, 5)
    assert sink["verdicts"] == {"1": "below", "2": "below", "4": "below", "8": "not shown"}
    assert window["verdicts"] == {"1": "above", "2": "holds", "4": "holds", "8": "holds"}
    heavy = hold["policies"]["heavy_hitters"]
    assert heavy["budget"] is None and heavy["worst_evicting"]["budget"] == 8


def test_holding_needs_the_interval_inside_the_band():
    """Review 8b A3: a budget holds only where its 95% CI lies inside +-1% (the equivalence reading); a mean
    within 1% whose interval reaches beyond is "not shown" and does not start "from N". Intervals: scipy's t."""
    import pandas as pd
    from scipy import stats

    from headscope.analyses.kv.holding import holding_budgets

    pct = {"window": [0.2, 0.3, 0.4, 0.3], "sink_window": [-3.0, 3.0, -2.0, 2.4]}  # per-prompt change (%) at 4
    rows = [{"policy": "full", "budget": 12, "example": e, "context": 12, "metric": 10.0} for e in range(4)]
    rows += [{"policy": p, "budget": 4, "example": e, "context": 12, "metric": 10.0 + v[e] / 10}
             for p, v in pct.items() for e in range(4)]
    hold = holding_budgets(pd.DataFrame(rows), n_sink=1)["policies"]
    narrow, wide = (stats.ttest_1samp(v, 0.0).confidence_interval(0.95) for v in pct.values())
    assert -1 < narrow.low and narrow.high < 1 and wide.low < -1 and wide.high > 1  # the premise, in %
    window, sink = hold["window"], hold["sink_window"]
    assert (window["budget"], window["verdicts"]) == (4, {"4": "holds"})
    assert (window["at"]["ci_low"], window["at"]["ci_high"]) == pytest.approx((narrow.low / 100, narrow.high / 100))
    assert (sink["budget"], sink["consistent_from"], sink["verdicts"]) == (None, 4, {"4": "not shown"})
    assert sink["worst_evicting"] is None and sink["not_shown"][0]["change"] == pytest.approx(0.001)
    assert (sink["not_shown"][0]["ci_low"], sink["not_shown"][0]["ci_high"]) == pytest.approx((wide.low / 100, wide.high / 100))


def test_a_one_prompt_budget_neither_makes_nor_breaks_a_verdict():
    """Review 17b A3: heavy hitters at budget 16 lost 78.4% (-10.7 logits) on the one prompt long enough to be evicted
    there, yet kv's summary counted that row "within" (consistent_from 16). Review 18c A2: the reverse, budget 32
    evicting from one prompt made "holds from 16 (n = 8)" "not shown". A row of one prompt has no interval: "too few",
    said as such, and the verdict rests on the other rows. Here 4 prompts of contexts 8, 20, 20, 40, full cache 10 on
    each: at 4 every policy falls to 5 (below); at 16 (3 prompts, 20, 20, 40) heavy hitters and sink window change by
    +0.3, -0.3, 0 (mean 0, t interval +-4.303 x 0.3 / sqrt(3) = 0.745 logits, 7.5% > 1%: not shown); at 32 only the
    40-token prompt evicts: heavy hitters 2.16 ((2.16 - 10) / 10 = -78.4%), sink window 10.04 (+0.4%). Both are
    consistent (means within) from 16 on the rows of 3 prompts, 32 said apart as too few, in the finding and compare."""
    import pandas as pd

    from headscope.analyses.kv.holding import holding_budgets
    from headscope.reports.compare_verdicts import _holding_words
    from headscope.reports.plots_kv import finding

    ctx = [8, 20, 20, 40]
    rows = [{"policy": "full", "budget": 41, "example": e, "context": c, "metric": 10.0} for e, c in enumerate(ctx)]
    at32 = {"heavy_hitters": 2.16, "sink_window": 10.04}
    for p in at32:
        rows += [{"policy": p, "budget": 4, "example": e, "context": c, "metric": 5.0} for e, c in enumerate(ctx)]
        rows += [{"policy": p, "budget": 16, "example": e, "context": c, "metric": 10.0 + [0, 0.3, -0.3, 0][e]}
                 for e, c in enumerate(ctx)]
        rows += [{"policy": p, "budget": 32, "example": e, "context": c, "metric": at32[p] if c > 32 else 10.0}
                 for e, c in enumerate(ctx)]
    hold = holding_budgets(pd.DataFrame(rows), n_sink=4)
    for p, change in (("heavy_hitters", -0.784), ("sink_window", 0.004)):
        e = hold["policies"][p]
        assert e["verdicts"] == {"4": "below", "16": "not shown", "32": "too few"}
        [at16] = [r for r in e["not_shown"] if r["budget"] == 16]
        assert at16["n_evicting"] == 3 and at16["ci_high"] == pytest.approx(4.302653 * 0.3 / 3 ** 0.5 / 10, rel=1e-5)
        assert e.get("consistent_from") == 16 and e["budget"] is None and e["worst_evicting"] is None
        [few] = e["too_few"]
        assert (few["budget"], few["n_evicting"], few["ci_low"]) == (32, 1, None) and few["change"] == pytest.approx(change)
        s = {"metric": "logit_diff", "metric_unevicted": 10.0, "holding_budgets": hold}
        assert _holding_words(e, s) == ("not shown to hold (its means within 1% from budget 16 on; budget(s) 32: too few "
                                        "prompts evicted to say)")
    text = finding({"metric": "logit_diff", "metric_unevicted": 10.0, "n_sink": 4, "holding_budgets": hold})
    assert ("heavy hitters not shown to hold (at 16: +0.0%, 95% CI [-7.5%, +7.5%], per example -0.300 to +0.300 logits, "
            "n = 3: consistent with holding within 1%, but the interval is 7 times as wide as the band; at budget 32 it "
            "evicts from one prompt only (-78.4%, per example -7.84 logits, n = 1): too few to say, so it "
            "neither makes nor breaks the verdict)") in text, text


def test_holding_allows_the_metrics_rounding_floor_past_the_band():
    """Review 12b A7: a budget "not shown" only because its interval passes +1% by less than one rounding step of the
    metric holds (its miss said), where that step is small against the band. Review 18b B1: where it is not (bfloat16:
    one step, 2^-7 of the value, is 78% of a 1% band), the allowance would make the verdict: "not shown", cannot tell
    at this precision. By hand: full metric 8, band 0.08; per-prompt differences 0.064, 0.066, 0.078, 0.080 at budget
    16: mean 0.072, 95% t interval (scipy) passes +0.08 by 0.005 logits; float16's step 2^-10 x 8 = 0.0078 (under
    half the band) covers it; bfloat16's 2^-7 x 8 = 0.0625 also covers it, but is more than half the band."""
    import pandas as pd
    from scipy import stats

    from headscope.analyses.kv.holding import holding_budgets
    from headscope.reports.findings import finding

    diffs = {16: [0.064, 0.066, 0.078, 0.080], 4: [0.25, -0.25, -0.25, -0.5]}
    rows = [{"policy": "full", "budget": 30, "example": e, "context": 30, "metric": 8.0} for e in range(4)]
    rows += [{"policy": "heavy_hitters", "budget": b, "example": e, "context": 30, "metric": 8.0 + d[e] if d else 8.0}
             for b, d in ((4, diffs[4]), (8, None), (16, diffs[16]), (24, None)) for e in range(4)]
    ci16 = stats.ttest_1samp(diffs[16], 0.0).confidence_interval(0.95)
    miss = ci16.high - 0.08
    half, f16, bf16 = 0.04, 2.0 ** -10 * 8, 2.0 ** -7 * 8
    assert 0 < miss < f16 < half < bf16 and sum(diffs[4]) / 4 < -0.08  # the premise, in logits
    sweep = pd.DataFrame(rows)
    plain = holding_budgets(sweep, n_sink=1)["policies"]["heavy_hitters"]  # no floor: the old reading, from 24
    assert plain["verdicts"]["16"] == "not shown" and plain["budget"] == 24
    hold = holding_budgets(sweep, n_sink=1, floor=f16)
    e = hold["policies"]["heavy_hitters"]
    ci4 = stats.ttest_1samp(diffs[4], 0.0).confidence_interval(0.95)  # reaches 0: below on average, cannot tell
    assert ci4.high > 0 and (e["budget"], e["verdicts"]["16"], e["verdicts"]["4"]) == (8, "holds", "cannot tell")
    assert e["rounding_held"][0]["rounding_miss"] == pytest.approx(miss) and hold["rounding_floor"] == f16
    text = finding("kv", {"metric": "logit_diff", "metric_unevicted": 8.0, "n_examples": 4, "dtype": "float16",
                          "holding_budgets": hold})
    assert "heavy hitters from 8 positions" in text, text
    assert (f"Heavy hitters at budget 16 (by {miss:.2g} logits): the 95% interval passes the band by less than one float16 "
            "rounding step of the metric (0.0078 logits, at its largest full-cache value), a miss rounding alone can "
            "make: counted as within.") in text, text

    # review 18b B1: bfloat16's step, 0.0625, is 78% of the band: the allowance cannot make the verdict
    coarse = holding_budgets(sweep, n_sink=1, floor=bf16)["policies"]["heavy_hitters"]
    assert (coarse["budget"], coarse["verdicts"]["16"], coarse["rounding_held"]) == (24, "not shown", [])
    [row] = coarse["rounding_coarse"]
    assert (row["budget"], row["rounding_coarse"], row["rounding_miss"]) == (16, bf16, pytest.approx(miss))
    text = finding("kv", {"metric": "logit_diff", "metric_unevicted": 8.0, "n_examples": 4, "dtype": "bfloat16",
                          "holding_budgets": holding_budgets(sweep, n_sink=1, floor=bf16)})
    assert "heavy hitters from 24 positions" in text and "counted as within" not in text, text
    assert (f"Heavy hitters at budget 16: its 95% CI passes the band by {miss:.2g} logits, less than one bfloat16 rounding "
            "step of the metric at its largest full-cache value (eps 0.0078 x 8 = 0.062 logits, 78% of the band there, "
            "0.08): cannot tell at this precision.") in text, text

    # review 13b C1: where the verdict's own budget holds by rounding, its sentence leads with it (the criterion
    # names the allowance, the reason sits inside the verdict's parenthesis), and compare's flip says why
    from headscope.reports.compare_verdicts import _verdict_notes

    rows = [r for r in rows if r["policy"] == "full"] + [
        {"policy": "heavy_hitters", "budget": b, "example": e, "context": 30, "metric": 8.0 + d[e] if d else 8.0}
        for b, d in ((4, diffs[4]), (8, diffs[16]), (24, None)) for e in range(4)]
    a = {"metric": "logit_diff", "metric_unevicted": 8.0, "n_examples": 4, "dtype": "float32",
         "holding_budgets": holding_budgets(pd.DataFrame(rows), n_sink=1)}  # float32: no floor, not shown at 8
    b = {**a, "dtype": "float16", "holding_budgets": holding_budgets(pd.DataFrame(rows), n_sink=1, floor=f16)}
    text = finding("kv", b)
    assert ("Within 1% of it (its 95% CI inside +-1%, or past it by less than one float16 rounding step of the metric, "
            "over the prompts") in text, text
    assert "heavy hitters from 8 positions, within 1% up to float16 rounding (between 4 and 8 on this grid" in text, text
    assert (f"n = 4); its 95% CI passes the band by {miss:.2g} logits, less than one rounding step of the metric (0.0078 "
            "logits))") in text, text
    assert "counted as within" not in text  # said once, in the verdict
    [note] = _verdict_notes("kv", a, b)
    assert note == ("kv heavy hitters within 1% of the full cache: A from 24 positions (a median 80% of the cache), B from "
                    "8 positions (a median 27% of the cache; within the band up to float16 rounding: its 95% CI passes "
                    f"the band by {miss:.2g} logits, less than one rounding step (0.0078)) (budget verdicts that differ: 8: "
                    "not shown in A, holds up to float16 rounding in B)."), note


def test_sliding_window_layers_cache_their_window_and_set_their_own_uniform_share(arch_models, hf_of):
    """Review 6 A4/A5: Gemma 2 (layer 0 slides over 8 keys, layer 1 global) and Mistral (every layer
    slides over 8). The cache size is checked against the tensors a real Hugging Face cache holds after
    12 positions; the uniform sink share and the first key's norm against hand computations."""
    gemma, mistral = arch_models("gemma2"), arch_models("mistral")
    from headscope.models.hooked_model import layer_windows

    windows = (layer_windows(gemma), layer_windows(mistral), layer_windows(arch_models("llama3")))
    assert windows == ((8, None), (8, 8), (None, None))
    tokens = random_tokens(2, 12, seed=3)
    trace = hs.generate_with_kv(gemma, tokens, max_new_tokens=1)
    allocated = [sum(t.numel() * t.element_size() for t in (lay.keys, lay.values)) for lay in trace.cache.layers]
    per_token_layer = 2 * 2 * 16 * 4  # (K, V) x kv_heads x d_head x float32
    # batch 2; layer 0 keeps the last window - 1 = 7 positions (the next token's own K/V complete the 8 keys)
    assert allocated == [2 * 7 * per_token_layer, 2 * 12 * per_token_layer]
    anatomy = kv.cache_anatomy(gemma)
    assert anatomy.total(12, batch=2) == sum(allocated)
    assert anatomy.total(128) == (7 + 128) * per_token_layer and anatomy.total(5) == 2 * 5 * per_token_layer
    assert kv.cache_anatomy(mistral).total(100) == 2 * 7 * per_token_layer
    table = kv.anatomy_table(anatomy, contexts=(1024,), batches=(1,))
    assert table.bytes.item() == (7 + 1024) * per_token_layer and table.mha_bytes.item() == 2 * table.bytes.item()

    norms = kv.kv_norms(gemma, tokens)
    stats_ = kv.sink_stats(gemma, tokens, norms, n_sink=1)
    # layer 0 sees position 0 only while q < 8: its mass and uniform share average queries 1..7 (review 11b C7:
    # over all 11, the 4 that cannot see it counted as zeros); layer 1 sees q + 1 keys, queries 1..11
    by_hand = [sum(1 / (q + 1) for q in range(1, 8)) / 7, sum(1 / (q + 1) for q in range(1, 12)) / 11]
    assert stats_.baseline_mass.tolist() == pytest.approx(by_hand)
    with torch.no_grad():
        attns = hf_of("gemma2")(tokens, output_attentions=True).attentions  # [batch, head, q, k] per layer
    hand = [attns[0][:, :, 1:8, 0].mean().item(), attns[1][:, :, 1:12, 0].mean().item()]
    assert stats_.sink_mass.tolist() == pytest.approx(hand, abs=1e-5)
    assert np.isnan(stats_.sink_key_norm_ratio.iloc[0]) and not np.isnan(stats_.sink_key_norm_ratio.iloc[1])
    keys = norms[(norms.kind == "key")]
    assert keys[keys.layer == 0].position.min() == 5 and keys[keys.layer == 1].position.min() == 0  # the last 7 of 12

    from headscope.reports.plots_kv import finding, plot_norms

    summary = {"bytes_per_token": 2 * per_token_layer, "dtype": "float32", "bytes_at_n_ctx": anatomy.total(128),
               "bytes_at_n_ctx_all_global": 2 * 128 * per_token_layer, "n_ctx": 128, "sliding_windows": {"0": 8},
               "sink_key_norm_ratio_per_layer": {"0": None, "1": 1.41}}
    text = finding(summary)
    assert ("layer(s) 0 attend over a sliding window of 8 keys, so their cache keeps at most 7 past positions: "
            "33.8 KiB at full context (128 positions)") in text
    assert "against 64.0 KiB if every layer were global" in text
    assert "(layer(s) 1; layer(s) 0 no longer cache the first key (sliding window))" in text
    assert "layer(s) 0 from position 5 on: a sliding window" in " ".join(plot_norms(norms).get_xlabel().split())
    records = [{"layer": 0, "mass": 0.3, "uniform": 0.2, "ratio": 1.5, "n": 2}]
    assert "on sliding-window layer 0 over the queries whose window holds the first token" in finding(
        {**summary, "sinks": records, "task": "kv"})
    # posqa's rule for kv: a window of 12 keys holds a 12-token prompt whole (query 11 sees key 0: 11 < 12, the
    # visible_keys rule), so only layer 0 (8 < 12) is named as windowed; layer 1 not at all (review 12b A4)
    two = [*records, {"layer": 1, "mass": 0.3, "uniform": 0.2, "ratio": 1.5, "n": 2}]
    text = finding({**summary, "sinks": two, "task": "kv", "sliding_windows": {"0": 8, "1": 12}, "prompt_tokens": 12})
    assert "on sliding-window layer 0 over the queries whose window holds the first token" in text, text
    assert "layers 0-1" not in text and "sliding window of 12" not in text, text
    text = finding({**summary, "sinks": two, "task": "kv", "sliding_windows": {"0": 8, "1": 11}, "prompt_tokens": 12})
    assert "on sliding-window layers 0-1 over the queries" in text, text


def test_eviction_on_sliding_window_layers_equals_hugging_face_with_both_masks(arch_models, hf_of):
    """Review 6 (#34): Gemma 2's layer 0 slides over 8 keys, so for the answer query of a 14-token prompt it holds
    only context positions 6..12. Each policy's budget applies to what a layer holds: checked against plain
    Hugging Face run with per-layer 4-d masks (the causal, the sliding window and the hand-made eviction of the
    answer query's row; heavy hitters ranked by hand from HF's own attentions, inside the window on layer 0),
    with the cache held and kept counted by hand. Mistral (every layer slides over 8): from budget 7 on nothing
    is evicted, so no prompt counts as evicting and the metric is the full cache's. The finding names the
    windowed layers and what a budget means there."""
    from headscope.analyses.kv.holding import budget_changes
    from headscope.reports.plots_kv import finding

    model, hf = arch_models("gemma2"), hf_of("gemma2")
    tokens = random_tokens(2, 14, seed=7)
    task = Task(name="rand", tokens=tokens, answers=tokens[:, 3], wrong_answers=tokens[:, 4], metric="logit_diff")
    result = kv.kv_analysis(model, task, kv.KVConfig(n_sink=4, budgets=(4, 8)))
    sweep = result.df.set_index(["policy", "budget", "example"]).sort_index()
    ctx, window, f = 13, 8, model.facts
    group = f.n_heads // f.n_kv_heads
    with torch.no_grad():
        attns = hf(tokens, output_attentions=True).attentions  # [batch, head, q, k] per layer
    held = [torch.arange(ctx) > ctx - window, torch.ones(ctx, dtype=torch.bool)]  # layer 0 slides, layer 1 global
    rows = torch.arange(2)

    def hand(policy: str, budget: int) -> tuple[torch.Tensor, list[int]]:
        masks, kept = [], [0, 0]
        for layer in range(2):
            if policy == "window":
                keep = (torch.arange(ctx) >= ctx - budget).expand(2, f.n_kv_heads, ctx)
            elif policy == "sink_window":
                keep = ((torch.arange(ctx) < 4) | (torch.arange(ctx) >= ctx - (budget - 4))).expand(2, f.n_kv_heads, ctx)
            else:  # H2O: the newest budget / 2, then the keys the context's queries attended most, per KV head,
                # ranked among the other held keys (review 13a A1)
                recent = (torch.arange(ctx) >= ctx - budget // 2) & held[layer]
                got = attns[layer][:, :, :ctx, :ctx].sum(2).reshape(2, f.n_kv_heads, group, ctx).sum(2)
                keep = recent.expand(2, f.n_kv_heads, ctx).clone()
                for b in range(2):
                    for h in range(f.n_kv_heads):
                        order = [int(i) for i in got[b, h].argsort(descending=True) if held[layer][i] and not recent[i]]
                        keep[b, h, order[:budget - budget // 2]] = True
            keep = keep & held[layer]
            kept[layer] = int(keep[0, 0].sum())
            allowed = torch.ones(ctx + 1, ctx + 1).tril().bool()
            if layer == 0:
                allowed &= ~torch.ones(ctx + 1, ctx + 1).tril(-window).bool()  # q - k < window
            allowed = allowed.expand(2, f.n_heads, -1, -1).clone()
            allowed[:, :, ctx, :ctx] &= keep.repeat_interleave(group, dim=1)
            masks.append(torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min))
        with torch.no_grad():
            out = hf(tokens, attention_mask={"sliding_attention": masks[0], "full_attention": masks[1]}).logits[:, -1]
        return out[rows, task.answers] - out[rows, task.wrong_answers], kept

    assert (sweep.loc["full"].cached == 13 + 7).all()  # layer 1 holds the 13 context positions, layer 0 its last 7
    for policy in kv_eviction.POLICIES:
        for budget in (4, 8):
            metric, kept = hand(policy, budget)
            got = sweep.loc[(policy, budget)]
            assert np.abs(got.metric.to_numpy() - metric.numpy()).max() <= 1e-4, (policy, budget)
            assert (got.kept == sum(kept)).all(), (policy, budget, kept)
    assert [hand(p, 8)[1][0] for p in ("window", "heavy_hitters", "sink_window")] == [7, 7, 4]
    table = budget_changes(result.df).set_index(["policy", "budget"])
    assert table.loc[("window", 8), "share"] == pytest.approx((8 + 7) / 20)  # not 8 / 13: layer 0 loses nothing
    text = finding(result.summary)
    assert ("layer(s) 0 slide over a window of 8 keys and hold at most 7 past positions whatever the budget. A budget "
            "applies to what each layer holds: window and heavy hitters evict from such a layer only below 7") in text
    assert "so from budget 7 on they evict only from layer(s) 1" in text, text

    mistral = arch_models("mistral")
    sweep = kv_eviction.eviction_sweep(mistral, task, budgets=[4, 8], policies=["window"])
    full, at8 = (sweep[(sweep.policy == p) & (sweep.budget == b)] for p, b in (("full", 13), ("window", 8)))
    assert (at8.kept.to_numpy() == at8.cached.to_numpy()).all() and (at8.cached == 2 * 7).all()
    assert np.abs(at8.metric.to_numpy() - full.metric.to_numpy()).max() <= 1e-5
    table = budget_changes(sweep).set_index(["policy", "budget"])
    assert table.loc[("window", 8), "n_evicting"] == 0 and table.loc[("window", 4), "n_evicting"] == 2


def test_keys_normalised_on_qwen3_are_said_and_bounded_by_hf_k_norm(tmp_path):
    """Review 7 A4: Qwen3 RMS-normalises each key head (k_norm) before RoPE and the cache, so every cached key's
    norm lies within sqrt(d_head) x k_norm's weight range and the first key's norm cannot mark a sink. A tiny
    Qwen3 with k_norm weights drawn in 0.6-1.6: the flag from Hugging Face's own modules, the norms from its
    k_proj and k_norm (no RoPE: a rotation), against the summary, the norms table, the finding and the figure."""
    from tests_support import build_architecture

    path = build_architecture("qwen3", tmp_path / "qwen3")
    hf = hf_model(path)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.k_norm.weight.copy_(torch.rand(16, generator=g) + 0.6)
    hf.save_pretrained(path, safe_serialization=True)
    assert all(isinstance(getattr(layer.self_attn, "k_norm", None), torch.nn.Module) for layer in hf.model.layers)
    model = hs.load_model(path, device="cpu")
    task = _task(n=3, pos=8)
    result = kv.kv_analysis(model, task, kv.KVConfig(n_sink=2, budgets=(4,)))
    s = result.summary
    with torch.no_grad():
        hidden = hf(task.tokens, output_hidden_states=True).hidden_states
        per_layer = []
        for i, layer in enumerate(hf.model.layers):
            attn = layer.self_attn
            k = attn.k_proj(layer.input_layernorm(hidden[i])).view(3, 8, 2, 16)  # [batch, pos, kv_head, d_head]
            per_layer.append(attn.k_norm(k).norm(dim=-1))  # [batch, pos, kv_head]
    weights = [layer.self_attn.k_norm.weight.detach() for layer in hf.model.layers]
    for w, norms in zip(weights, per_layer):  # within sqrt(16) x the layer's own weight range
        assert 4 * float(w.min()) - 1e-4 <= float(norms.min()) and float(norms.max()) <= 4 * float(w.max()) + 1e-4
    assert s["keys_normalised"] is True
    key_norm = s["key_norm"]
    assert (key_norm["module"], key_norm["per_head"], key_norm["dim"], key_norm["layers"]) == ("k_norm", True, 16, [0, 1])
    lo, hi = min(float(w.min()) for w in weights), max(float(w.max()) for w in weights)
    assert key_norm["gain"] == pytest.approx([lo, hi], rel=1e-5)
    assert key_norm["bounds"] == pytest.approx([4 * lo, 4 * hi], rel=1e-5)
    means = torch.stack(per_layer).mean(1)  # [layer, pos, kv_head]: what the norms table averages over prompts
    assert key_norm["measured"] == pytest.approx([float(means.min()), float(means.max())], abs=1e-5)
    each = torch.stack(per_layer)  # [layer, batch, pos, kv_head]: review 18v B1, the keys' own range
    assert key_norm["keys"] == pytest.approx([float(each.min()), float(each.max())], abs=1e-5)
    assert float(each.min()) < float(means.min()) <= float(means.max()) <= float(each.max())  # the premise: wider
    table = result.tables["norms"]
    keys = table[table.kind == "key"].sort_values(["layer", "position", "kv_head"]).norm.to_numpy()
    assert np.abs(keys - means.reshape(-1).numpy()).max() < 1e-5  # the cache's keys after RoPE: the same norms
    from headscope.reports.plots_kv import finding, plot_norms

    text = finding(s)
    assert (f"Keys are RMS-normalised per head (k_norm) before caching, so their norms are set by the norm's weight, "
            f"not by the key's input (here {4 * lo:.2f}-{4 * hi:.2f}: sqrt(16) x its |weight| {lo:.2f}-{hi:.2f}; the cached "
            f"keys {float(each.min()):.2f}-{float(each.max()):.2f} (their means over prompts per head and position "
            f"{float(means.min()):.2f}-{float(means.max()):.2f}); smaller only for a key near zero against the norm's "
            "epsilon), and the first key's norm cannot mark a sink: not reported.") in text
    assert "The first key's norm is" not in text
    import matplotlib.pyplot as plt

    try:  # the figure (reports/plots_kv.figures passes the summary's key_norm): from 0, saying why
        ax = plot_norms(table, key_norm=key_norm, ax=plt.subplots()[1])
        assert ax.get_ylim()[0] == 0 and "keys are normalised (k_norm) before caching" in " ".join(ax.get_title().split())
        assert any(f"k_norm allows {4 * lo:.2f}-{4 * hi:.2f}" == t.get_text() for t in ax.get_legend().get_texts())
    finally:
        plt.close("all")


def test_a_policys_closest_budget_and_answers_rest_on_more_than_one_evicted_prompt():
    """Review 10a A4: with prompts of 7-73 tokens only the longest is evicted at 64; heavy hitters there (-0.2%, n = 1,
    1/1 answers) closed the section as "keeps 99.8% ... and every answer ... from budget 64", while at 32, over 13
    prompts, it lost 25.6%. Here 4 prompts of contexts 8, 40, 40, 70: budget 64 evicts only the last."""
    import pandas as pd

    from headscope.analyses.kv.holding import holding_budgets

    ctx, rows = [8, 40, 40, 70], []
    hh = {4: [2.0, 2.0, 2.0, 2.0], 32: [10.0, 6.0, 8.0, 7.0], 64: [10.0, 10.0, 10.0, 9.98]}  # metric where evicted
    for e in range(4):
        rows.append({"policy": "full", "budget": 80, "example": e, "context": ctx[e], "metric": 10.0, "correct": True})
        for b, values in {**hh, 80: [10.0] * 4}.items():
            value = values[e] if ctx[e] > b else 10.0
            rows.append({"policy": "heavy_hitters", "budget": b, "example": e, "context": ctx[e], "metric": value,
                         "correct": value > 5})
    heavy = holding_budgets(pd.DataFrame(rows), n_sink=4)["policies"]["heavy_hitters"]
    assert heavy["closest"]["budget"] == 32 and heavy["closest"]["n_evicting"] == 3  # not 64's lone prompt
    assert heavy["closest"]["change"] == pytest.approx((6 + 8 + 7) / 3 / 10 - 1)
    assert heavy["verdicts"]["64"] == "too few"  # its one prompt's -0.2% has no interval
    assert heavy["answers_from"] == 32  # every answer kept from 32 (its 3 prompts), not "from 64" on one


def test_first_key_norm_verdict_follows_each_layers_interval_against_one_and_a_half():
    """A layer stands out only where its 95% interval lies above 1.5; one whose interval reaches across 1.5 is said to
    be undecided, not to stand out on its mean (layer 0's 1.6 here), and a layer that no longer caches the first key
    is named."""
    from headscope.reports.plots_kv import finding

    records = [{"layer": 0, "ratio": 1.6, "ci": [1.4, 1.8], "n": 8}, {"layer": 1, "ratio": 2.4, "ci": [2.1, 2.7], "n": 8},
               {"layer": 2, "ratio": None, "ci": None, "n": 0}]
    text = finding({"key_norm_ratios": records})
    assert ("The first key's norm over the other keys' per layer (each prompt's ratio, mean over 8 prompts, 95% CI; "
            "layer(s) 2 no longer cache the first key (sliding window)): layer 0 1.60 [1.40, 1.80], layer 1 2.40 [2.10, "
            "2.70]: the first key's norm stands out in layer(s) 1 only (more than 1.5x, its 95% CI above 1.5); in "
            "layer(s) 0 its 95% CI reaches across 1.5: cannot tell.") in text, text
    low = [{"layer": 0, "ratio": 0.8, "ci": [0.7, 0.9], "n": 8}]
    assert "the first key's norm does not stand out (it is smaller)." in finding({"key_norm_ratios": low})
