"""Findings in words: each headline states its summary's numbers, and says so when a result is uninformative."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
from scipy import stats

from headscope.reports.findings import CAPTIONS, attention_kind, caption, ci_pair, finding

HEADS = {
    "metric": "logit_diff", "baseline_metric": 24.116, "n_examples": 64, "n_heads": 32,
    "max_fraction_prunable_ablation": 0.5625, "heads_prunable_ablation": 18.0,
    "max_fraction_prunable_gradient": 0.0, "heads_prunable_gradient": 0.0,
    "max_fraction_prunable_random": 0.125, "heads_prunable_random": 4.0,
    "roles": {"induction": ["L1H0", "L1H3"], "previous-token": ["L0H2"]},
}


def test_heads_headline_carries_the_summary_numbers():
    text = finding("heads", HEADS)
    assert "18 of 32 heads (56%)" in text  # 0.5625 x 32 = 18, 56.25% rounded
    assert "ordered by ablation" in text and "24.1" in text and "64 examples" in text
    assert "gradient 0%" in text and "random 12%" in text  # 0.125 -> 12% (round half to even)
    assert "2 induction (L1H0, L1H3)" in text and "1 previous-token (L0H2)" in text
    assert "chance" not in text


def test_a_recorded_interval_is_two_finite_numbers_and_compare_asks_them_in_order():
    assert ci_pair([0.25, 1]) == (0.25, 1.0) and ci_pair((-3, -1)) == (-3.0, -1.0)
    for bad in (None, [0.5], [0.1, 0.2, 0.3], [float("nan"), 1.0], [0.0, float("inf")], [True, 1.0], ["0.1", 0.2], "ab"):
        assert ci_pair(bad) is None, bad
    assert ci_pair([2.0, 1.0]) == (2.0, 1.0) and ci_pair([2.0, 1.0], ordered=True) is None  # high below low
    assert ci_pair([1.0, 1.0], ordered=True) == (1.0, 1.0)  # a single value is an interval


def test_a_model_at_chance_is_called_so():
    text = finding("heads", {**HEADS, "baseline_metric": 0.03})
    assert "at chance" in text and "0.03" in text
    patching = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 8,
                "clean_metric": -0.02, "corrupted_metric": 0.05, "top_sites": {}}
    assert "at chance" in finding("patching", patching)
    assert "at chance" in finding("circuits", {"dla_final_logit": 0.01, "dla_top_components": {"mlp0": 0.004}})


def test_patching_reports_the_share_of_the_clean_corrupted_gap():
    summary = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 8,
               "clean_metric": 2.0, "corrupted_metric": -2.0,
               "top_sites": {"resid_pre": [{"layer": 1, "head": None, "pos": 3, "token": "3: Mary", "effect": 3.0}],
                             "head_out": [{"layer": 2, "head": 5, "pos": None, "token": "", "effect": -1.0}]},
               "attribution_correlation": {"resid_pre": {"pearson": 0.9876, "spearman": 0.9, "n": 10}}}
    text = finding("patching", summary)
    assert "resid_pre at layer 1, position 3 ('3: Mary'): 0.75 of the clean-corrupted gap (+3 logit difference)" in text
    assert "head_out at L2H5 (-0.25)" in text  # -1 / (2 - -2); named as every section names heads (linked)
    # Fisher z: tanh(atanh(0.9876) -+ 1.96 / sqrt(10 - 3)) = 0.947, 0.997
    assert "resid_pre r = 0.988 (n = 10 cells, 95% CI [0.947, 0.997])" in text
    # with the recorded t intervals of the mean per-example effect: the share's is the effect's over the gap of 4
    summary["top_sites"]["resid_pre"][0].update(ci=[2.2, 3.8], n=8)
    summary["top_sites"]["head_out"][0].update(ci=[-1.6, -0.4], n=8)
    text = finding("patching", summary)
    assert ("resid_pre at layer 1, position 3 ('3: Mary'): 0.75 of the clean-corrupted gap, 95% CI [0.55, 0.95] over "
            "8 examples (+3 logit difference)") in text
    assert "head_out at L2H5 (-0.25, 95% CI [-0.40, -0.10] over 8 examples)" in text
    down = {**summary, "clean_metric": -2.0, "corrupted_metric": 2.0}  # a negative gap: the bounds swap
    assert "-0.75 of the clean-corrupted gap, 95% CI [-0.95, -0.55] over 8 examples" in finding("patching", down)
    shares = {**summary, "metric": "normalized_logit_diff", "normalized": True}  # the effects are shares already
    assert "('3: Mary'): 3.00, 95% CI [2.20, 3.80] over 8 examples." in finding("patching", shares)


AT_CHANCE = {"at_chance": True, "metric": "logit_diff", "mean": -0.008, "chance_value": 0.0, "ci": [-0.05, 0.034],
             "ci_level": 0.95, "reason": "the 95% CI [-0.05, 0.034] of the mean logit difference contains chance (0)"}


def test_the_chance_guard_heads_the_finding_and_drops_relative_thresholds():
    heads = {**HEADS, "baseline_metric": -0.008, "l0_min_heads_within_tolerance": 3, "chance": AT_CHANCE}
    text = finding("heads", heads)
    assert text.startswith("The model is at chance on this task (logit difference -0.008 against chance 0 (no "
                           "preference on average between the answer and the wrong answer), 95% CI [-0.05, 0.034]); "
                           "relative findings are not reported.")
    assert "within 1%" not in text and "can be removed" not in text and "within tolerance" not in text
    assert "2 induction (L1H0, L1H3)" in text  # absolute facts stay
    # issue 34: the unpruned metric is the chance sentence's mean (-0.008): said there once, not again
    assert text.count("-0.008") == 1 and "The logit difference above is the unpruned model's, over 64 examples." in text
    assert text.count("at chance") == 1  # the old heuristic does not repeat it
    kv = {"metric_unevicted": 0.01, "metric_per_policy_budget": {"window": {"8": 0.01}}, "chance": AT_CHANCE}
    # review 14a A2: the same prompts' full-cache value is stated once, the chance sentence's (the whole pass)
    assert "within 1%" not in finding("kv", kv) and "The full-cache metric is the metric above." in finding("kv", kv)
    assert "0.01" not in finding("kv", kv)
    patching = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 8,
                "clean_metric": -0.008, "corrupted_metric": 0.02, "chance": AT_CHANCE,
                "top_sites": {"resid_pre": [{"layer": 1, "head": None, "pos": 3, "token": "x", "effect": 0.02}]}}
    text = finding("patching", patching)
    assert "at chance on this task" in text and "clean-corrupted gap" not in text and "Clean prompts give" in text
    probes = {"metric": "accuracy", "labels": "answer", "best_layer": 1, "best_accuracy": 0.36, "majority_baseline": 0.34,
              "chance": {**AT_CHANCE, "metric": "probe accuracy", "mean": 0.36, "chance_value": 0.34, "ci": None}}
    assert finding("probes", probes).startswith("The probe scores at chance (probe accuracy 0.36 against chance 0.34 "
                                             "(the majority class's share)); relative findings are not reported.")


def test_the_guard_overrules_the_old_heuristic_when_the_model_is_above_chance():
    above = {"at_chance": False, "metric": "logit_diff", "mean": 0.05, "chance_value": 0.0, "ci": [0.04, 0.06]}
    text = finding("heads", {**HEADS, "baseline_metric": 0.05, "chance": above})  # consistent, if small: not chance
    assert "chance" not in text and "18 of 32 heads (56%) can be removed staying no more than 1% below" in text
    assert "at chance" not in finding("circuits", {"dla_final_logit": 0.05, "dla_top_components": {"mlp0": 0.04},
                                                   "chance": above})


def test_flat_position_curve_at_ceiling_and_a_layer_that_does_nothing():
    position = {"primary_metric": "accuracy", "metric_per_position": {"accuracy": {"1": 1.0, "3": 1.0, "5": 0.995}},
                "ratio_middle_to_ends": {"accuracy": 1.0}, "sink_mass_per_layer": [0.1, 0.6], "sink_uniform_baseline": 0.05,
                "n_sink": 1}
    text = finding("position", position)
    assert "flat at its ceiling" in text and "cannot show lost-in-the-middle" in text
    assert "0.60 in layer 1 against 0.05" in text and "attention sink" in text
    u_shape = {**position, "metric_per_position": {"accuracy": {"1": 0.9, "3": 0.45, "5": 0.8}},
               "ratio_middle_to_ends": {"accuracy": 0.5}, "n_examples": 32,
               "ci_per_position": {"accuracy": {"1": [0.8, 0.97], "3": [0.3, 0.6], "5": [0.66, 0.9]}}}
    text = finding("position", u_shape)
    assert "from 0.45 (gold at position 3) to 0.90" in text and "(32 examples)" in text
    assert "[0.30, 0.60] lies below both ends' (n = 32 examples per position): a U-shape, the middle is neglected" in text
    attribution = {"median_permutation_tvd": 3e-7, "permutation_layer": 3, "output_change": "tvd",
                   "mean_tau_attention_loo": 0.04, "n_examples": 10}
    text = finding("attribution", attribution)
    assert "barely moves the output" in text and "says nothing about faithfulness" in text
    assert "leave-one-out at mean Kendall tau 0.04" in text and "weak" in text


def test_probes_kv_mlp_and_odd_summaries():
    probes = {"metric": "accuracy", "labels": "answer", "best_layer": 1, "best_accuracy": 0.05,
              "majority_baseline": 0.04, "best_selectivity": 0.01}
    assert "chance level" in finding("probes", probes) and "layer 1 with accuracy 0.05" in finding("probes", probes)
    kv = {"bytes_per_token": 1024, "dtype": "float32", "bytes_at_n_ctx": 131072, "gqa_saving": 0.75,
          "mha_bytes_per_token": 4096, "n_heads": 8, "n_kv_heads": 2,
          "metric_unevicted": 10.0, "metric_per_policy_budget": {"window": {"8": 5.0, "16": 9.95, "32": 10.0}}}
    text = finding("kv", kv)
    assert "1.0 KiB per token" in text and "128.0 KiB" in text and "saves 75% of the cache" in text
    assert "window from 16 positions" in text
    mlp = {"agreement_per_layer": {"0": 0.02, "1": 0.03}, "agreement_shuffled_per_layer": {"0": 0.02, "1": 0.025}}
    assert "no better than the control" in finding("mlp", mlp)
    assert finding("heads", {"metric": None, "n_heads": "x", "max_fraction_prunable_a": "?"}) == ""
    assert finding("patching", {"skipped": "an encoder"}) == "Skipped: an encoder"
    assert finding("unknown", {"a": 1}) == ""


def test_captions_name_units():
    assert "share of the clean-corrupted gap" in caption("exact_resid_pre") and "resid pre" in caption("exact_resid_pre")
    assert "log2" in caption("kv_eviction") and caption("no_such_figure") == ""
    assert all(text.endswith(".") for text in CAPTIONS.values())


def test_probes_finding_names_the_capacity_sweep_and_the_first_selective_layer():
    from headscope.reports.findings import probes_finding

    s = {"metric": "accuracy", "best_accuracy": 0.99, "best_layer": 3, "labels": "answer", "majority_baseline": 0.03,
         "best_selectivity": 0.76, "capacity": {"param": "C", "grid": [0.001, 0.01, 1.0]}, "first_selective_layer": 1}
    text = probes_finding(s)
    assert "most selective probe over C in {0.001, 0.01, 1}" in text and "reaches selectivity 0.5 is layer 1" in text
    assert "no layer's most selective probe" in probes_finding({**s, "first_selective_layer": None})
    assert "capacity sweep" not in probes_finding({**s, "capacity": None})


def test_a_u_shape_is_claimed_only_when_the_intervals_separate():
    """MiniLM's 8-example curve 0.67 -> 0.52 -> 0.55: the 95% intervals overlap, so no neglected middle."""
    s = {"primary_metric": "accuracy", "n_examples": 8, "ratio_middle_to_ends": {"accuracy": 0.52 / 0.67},
         "metric_per_position": {"accuracy": {"1": 0.67, "5": 0.52, "10": 0.55}},
         "ci_per_position": {"accuracy": {"1": [0.4, 0.9], "5": [0.25, 0.8], "10": [0.3, 0.8]}}}
    text = finding("position", s)
    assert "overlaps both ends' (n = 8 examples per position): no evidence that the middle is neglected" in text
    assert "a U-shape" not in text and "is neglected" not in text.replace("no evidence that the middle is neglected", "")
    declining = {**s, "ci_per_position": {"accuracy": {"1": [0.6, 0.75], "5": [0.45, 0.58], "10": [0.4, 0.7]}}}
    assert "below the first end's only" in finding("position", declining) and "not a U-shape" in finding("position", declining)
    assert "no U-shape is claimed" in finding("position", {**s, "ci_per_position": {}})


def test_a_position_beats_the_no_gold_baseline_only_when_the_intervals_separate():
    """Review 11a C6: an encoder's curve (cosine 0.67 -> 0.52 -> 0.55 over 8 examples, as MiniLM's) against Liu et
    al.'s no-gold baseline, the passage of the same distractors without the relevant sentence, 0.50 [0.46, 0.57].
    Built as the analysis builds it (no_gold_summary over its curve and baseline tables): only position 1's interval
    [0.60, 0.74] clears the baseline's; 2 and 3 lie above it in their means but their intervals overlap it."""
    import pandas as pd

    from headscope.analyses.position.analysis import no_gold_summary

    def curve(bands):
        return pd.DataFrame([{"condition": "full", "metric": "cosine", "position": p, "mean": m, "ci_low": lo,
                              "ci_high": hi} for p, (m, lo, hi) in bands.items()])

    baseline = pd.DataFrame([{"metric": "cosine", "mean": 0.50, "ci_low": 0.46, "ci_high": 0.57, "n": 8,
                              "interval": "bootstrap"}])
    bands = {1: (0.67, 0.60, 0.74), 2: (0.52, 0.45, 0.58), 3: (0.55, 0.50, 0.61)}
    s = {"task": "retrieval", "primary_metric": "cosine", "n_examples": 8, "ratio_middle_to_ends": {"cosine": 0.52 / 0.67},
         "metric_per_position": {"cosine": {str(p): b[0] for p, b in bands.items()}},
         "ci_per_position": {"cosine": {str(p): [b[1], b[2]] for p, b in bands.items()}},
         **no_gold_summary(baseline, curve(bands))}
    assert s["no_gold_baseline"]["cosine"] == {"mean": 0.50, "ci": [0.46, 0.57], "n": 8, "interval": "bootstrap",
                                               "above": [1], "overlap": [2, 3], "below": []}
    text = finding("position", s)
    assert ("Without the relevant sentence (the same distractors in the same order: Liu et al.'s no-gold baseline), the "
            "cosine is 0.50 (95% bootstrap CI [0.46, 0.57], n = 8 examples); gold position 1 lies above it (the 95% "
            "intervals separate); at 2-3 the intervals overlap it: no evidence that the relevant sentence helps there "
            "at this sample size.") in text
    # every interval clear of it; none clear of it, one below it
    clear = {**s, **no_gold_summary(baseline.assign(ci_high=0.44, ci_low=0.40, mean=0.42), curve(bands))}
    assert "every gold position's 95% interval lies above it: the relevant sentence helps at every position" in finding(
        "position", clear)
    low = {1: (0.52, 0.47, 0.58), 2: (0.40, 0.35, 0.44), 3: (0.51, 0.47, 0.56)}
    none = {**s, **no_gold_summary(baseline, curve(low))}
    assert ("no gold position's 95% interval lies above it; at 1, 3 the intervals overlap it: no evidence that the "
            "relevant sentence helps there at this sample size; at 2 the cosine lies below it") in finding("position", none)
    assert "no-gold" not in finding("position", {k: v for k, v in s.items() if k != "no_gold_baseline"})  # older runs


def test_degenerate_importance_and_ties_are_said_and_not_ranked():
    """MiniLM: gradient importance 1e-8..2e-7 under a float32 floor; its pruning order is random."""
    why = "every head's |gradient importance| is below 2.2e-07, under the numerical floor 1.9e-06"
    s = {**HEADS, "max_fraction_prunable_gradient": 0.25, "heads_prunable_gradient": 8.0,
         "max_fraction_prunable_gradient_recompute": 0.5, "degenerate_gradient": why,
         "tied_top_heads_zero": ["L0H1", "L0H2"]}
    text = finding("heads", s)
    # review 15a B2: the gradients are measured; what lies under the floor is the loss change they predict
    assert (f"Gradient importance measures no head: the loss changes its gradients predict are under the rounding "
            f"floor, though the gradients themselves are measured: {why}.") in text and "rounding, not a" not in text
    assert "gradient 25%" not in text and "gradient recompute" not in text and "by gradient" not in text
    assert "By zero-ablation, L0H1 and L0H2 tie within rounding among the top heads: their order is arbitrary." in text
    assert "18 of 32 heads (56%)" in text  # the ablation ordering is a measurement and stays


def test_heads_finding_leads_with_the_head_that_stands_clear():
    """Review 11b A3: zero-ablating L0H3 costs 2.21, 66x the next head, and the finding named only the ties behind
    it. The lead sentence names it with its interval and n; where the next head's interval reaches it, it says the
    examples single out no head."""
    top = {"head": "L0H3", "importance": 2.2133, "ci": [0.23, 4.19], "next_head": "L0H0", "next_importance": 0.0335,
           "next_ci": [-0.0027, 0.0697], "n_examples": 16, "clear": True}
    s = {**HEADS, "metric": "logprob", "baseline_metric": -0.0069, "top_head_zero": top,
         "tied_top_heads_zero": ["L0H0", "L3H1"]}
    text = finding("heads", s)
    lead = ("Zero-ablating L0H3 alone costs 2.21 answer log-probability (95% CI [0.23, 4.19], 16 examples); no other "
            "head costs more than 0.034 (L0H0).")
    assert lead in text and text.index(lead) < text.index("tie within rounding")  # first, then the ties
    close = {**top, "clear": False, "next_importance": 1.9, "next_ci": [1.1, 2.7]}
    text = finding("heads", {**s, "top_head_zero": close})
    assert ("Zero-ablating L0H3 alone costs 2.21 answer log-probability (95% CI [0.23, 4.19], 16 examples), the most "
            "of any head, but the next, L0H0, costs 1.9 and their 95% intervals overlap (L0H3 [0.23, 4.19], L0H0 "
            "[1.1, 2.7]; marginal intervals, no paired test: this run kept no per-example costs): these examples do not "
            "single out one head.") in text
    assert "no other head" not in text
    assert "L0H3" not in finding("heads", {**s, "top_head_zero": {**top, "importance": -0.01}})  # costs nothing


def test_heads_leading_sentence_decides_by_the_paired_difference():
    """Review 12b A5 (out_full, mean ablation, 40 examples): L0H2 3.08 [1.74, 4.42], L0H3 1.06 [0.387, 1.74]; the
    marginal intervals overlap by 0.004, but the paired L0H2 - L0H3 (plain HF, mean_ablate_check.py) is +2.02
    [+0.39, +3.64]: the sentence states that difference with its interval and n and says L0H2 stands clear; a
    paired interval reaching 0 says the examples do not single out one head."""
    top = {"head": "L0H2", "importance": 3.0794, "ci": [1.7384, 4.4204], "next_head": "L0H3",
           "next_importance": 1.0645, "next_ci": [0.3872, 1.7418], "n_examples": 40, "clear": True,
           "diff": 2.0149, "diff_ci": [0.39, 3.64], "diff_n": 40}
    text = finding("heads", {**HEADS, "top_head_mean": top})
    assert ("Mean-ablating L0H2 alone costs 3.08 logit difference (95% CI [1.74, 4.42], 40 examples), 2.01 more than "
            "the next, L0H3 (1.06; paired difference L0H2 - L0H3 over the same 40 examples +2.01, 95% CI [+0.39, "
            "+3.64]): L0H2 stands clear of the next head on these examples.") in text
    assert "overlap" not in text and "do not single out" not in text
    text = finding("heads", {**HEADS, "top_head_mean": {**top, "diff_ci": [-0.2, 4.2], "clear": False}})
    assert ("paired difference L0H2 - L0H3 over the same 40 examples +2.01, 95% CI [-0.2, +4.2]): the paired "
            "interval reaches 0, so these examples do not single out one head.") in text


def test_heads_gradient_lead_is_decided_by_the_paired_difference_of_per_example_gradients():
    """#34 items 2/5: top_head_gradient (each example's own |dL/d gate|) gets its own lead sentence after the
    ablation one, in the gradient's units, and stands clear of the next head only when the paired interval of
    first - next over the same examples lies above 0 (hand-built numbers)."""
    zero = {"head": "L0H2", "importance": 3.0794, "ci": [1.7384, 4.4204], "next_head": "L0H3",
            "next_importance": 1.0645, "next_ci": [0.3872, 1.7418], "n_examples": 40, "clear": True,
            "diff": 2.0149, "diff_ci": [0.39, 3.64], "diff_n": 40}
    grad = {"head": "L1H0", "importance": 0.412, "ci": [0.30, 0.52], "next_head": "L0H2", "next_importance": 0.35,
            "next_ci": [0.25, 0.45], "n_examples": 40, "clear": True, "diff": 0.062, "diff_ci": [0.021, 0.103],
            "diff_n": 40}
    text = finding("heads", {**HEADS, "top_head_gradient": grad, "top_head_zero": zero})
    lead = ("By gate gradient, L1H0 ranks first with E|dL/d gate| 0.412 (95% CI [0.3, 0.52], 40 examples), 0.062 more "
            "than the next, L0H2 (0.35; paired difference L1H0 - L0H2 over the same 40 examples +0.062, 95% CI "
            "[+0.021, +0.103]): L1H0 stands clear of the next head on these examples.")
    assert lead in text and text.index("Zero-ablating L0H2 alone costs 3.08") < text.index(lead)
    text = finding("heads", {**HEADS, "top_head_gradient": {**grad, "diff_ci": [-0.01, 0.134], "clear": False}})
    assert ("L1H0 - L0H2 over the same 40 examples +0.062, 95% CI [-0.01, +0.134]): the paired interval reaches 0, so "
            "these examples do not single out one head.") in text and "stands clear" not in text
    old = {k: v for k, v in grad.items() if not k.startswith("diff")}  # no per-example gradients: marginal, said so
    assert ("no paired test: this run kept no per-example gradients): these examples do not single out one head."
            in finding("heads", {**HEADS, "top_head_gradient": {**old, "clear": False}}))


def test_heads_l0_sentence_gives_its_change_interval_and_n_and_says_it_is_in_sample():
    """Review 12b C1 (out_full, l0.csv): "L0 gates keep the metric within tolerance with 3 heads" had no n and no
    interval and is measured on the 40 examples the gates were trained on: 7.425 at lambda 0.03 against 7.451
    unpruned. The sentence gives the change with its interval and n and says it is in-sample; an older summary
    without the record still says in-sample."""
    rec = {"heads": 3, "lambda": 0.03, "metric": 7.4247, "change": -0.0263, "ci": [-0.0912, 0.0386],
           "n_examples": 40, "in_sample": True}
    heads = {**HEADS, "l0_min_heads_within_tolerance": 3, "l0_lambdas": [0.001, 0.1], "l0_within_tolerance": rec}
    assert ("L0 gates keep the metric within tolerance with 3 heads (lambda 0.03: 7.425, a change of -0.0263 from "
            "unpruned, 95% CI [-0.0912, +0.0386] over 40 examples; in-sample: measured on the examples the gates "
            "were trained on, no held-out check).") in finding("heads", heads)
    old = {k: v for k, v in heads.items() if k != "l0_within_tolerance"}
    assert ("L0 gates keep the metric within tolerance with 3 heads (in-sample: measured on the examples the gates "
            "were trained on, no held-out check).") in finding("heads", old)


def test_heads_l0_sentence_reports_the_held_out_change_first_and_the_in_sample_one_after_or_why_in_sample():
    """#34 item 2: gates fitted on 32 examples and scored on 32 held-out ones: the sentence gives the held-out change
    with its interval and n and the fitting count, then the training examples' (in-sample) change; a task too small to
    split says it is in-sample and why."""
    rec = {"heads": 3, "lambda": 0.03, "metric": 7.4247, "change": -0.0263, "ci": [-0.0912, 0.0386],
           "n_examples": 32, "in_sample": False, "in_sample_reason": "", "n_train": 32, "in_sample_change": 0.0121,
           "in_sample_ci": [-0.02, 0.0442]}
    heads = {**HEADS, "l0_min_heads_within_tolerance": 3, "l0_lambdas": [0.001, 0.1], "l0_within_tolerance": rec}
    assert ("L0 gates keep the metric within tolerance with 3 heads on held-out examples (gates fitted on 32 "
            "examples; lambda 0.03: 7.425 on 32 others, a change of -0.0263 from unpruned, 95% CI [-0.0912, +0.0386]; "
            "in-sample, on the 32 training examples, +0.0121, 95% CI [-0.02, +0.0442]; the lambda was chosen on those "
            "held-out examples too, so this point is optimistic).") in finding("heads", heads)  # an older summary
    chosen = {**rec, "chosen_on": "training examples", "band": 0.0745, "held_out_within": True}
    assert ("On the 32 examples the gates were fitted on, L0 gates keep the metric within tolerance with 3 heads "
            "(lambda 0.03, the fewest heads within tolerance there: a change of +0.0121, 95% CI [-0.02, +0.0442]); "
            "scored on 32 held-out examples, that mask gives 7.425, a change of -0.0263 from unpruned, 95% CI "
            "[-0.0912, +0.0386], within the tolerance band (0.0745 below unpruned) there.") in \
        finding("heads", {**heads, "l0_within_tolerance": chosen})
    fails = {**chosen, "change": -0.2, "ci": [-0.31, -0.09], "held_out_within": False}
    assert ("a change of -0.2 from unpruned, 95% CI [-0.31, -0.09], below the tolerance band (0.0745 below unpruned) "
            "there: the choice made on the training examples does not hold on new ones.") in \
        finding("heads", {**heads, "l0_within_tolerance": fails})
    small = {**rec, "n_examples": 12, "in_sample": True, "n_train": 12,
             "in_sample_reason": "only 12 examples, too few to hold some out (at least 16)"}
    assert ("a change of -0.0263 from unpruned, 95% CI [-0.0912, +0.0386] over 12 examples; in-sample: measured on the "
            "examples the gates were trained on (only 12 examples, too few to hold some out (at least 16))).") in \
        finding("heads", {**heads, "l0_within_tolerance": small})


def test_heads_that_cannot_be_told_apart_are_said_by_their_overlapping_intervals():
    """Review 11c (bf16 MoE, c_out_t): L0H2 costs 4.49 [2.21, 6.76], L0H1 1.92 [0.622, 3.22]; the rule
    (analysis._leading: clear where 2.21 > the next's 3.22) tests overlap, so 1.92, below L0H2's interval, was said
    to "lie within" it. The words say what is tested; a record without `clear` whose intervals do not overlap
    (2.21 > 1.5) is clear by the same rule."""
    top = {"head": "L0H2", "importance": 4.4873, "ci": [2.2132, 6.7614], "next_head": "L0H1", "next_importance": 1.9213,
           "next_ci": [0.6222, 3.2204], "n_examples": 16, "clear": False}
    text = finding("heads", {**HEADS, "top_head_zero": top})
    assert ("Zero-ablating L0H2 alone costs 4.49 logit difference (95% CI [2.21, 6.76], 16 examples), the most of any "
            "head, but the next, L0H1, costs 1.92 and their 95% intervals overlap (L0H2 [2.21, 6.76], L0H1 [0.622, "
            "3.22]; marginal intervals, no paired test: this run kept no per-example costs): these examples do not "
            "single out one head.") in text
    assert "within its interval" not in text
    apart = {k: v for k, v in top.items() if k != "clear"} | {"next_ci": [0.4, 1.5]}
    assert "; no other head costs more than 1.9 (L0H1)." in finding("heads", {**HEADS, "top_head_zero": apart})


def test_small_heads_values_keep_two_significant_digits():
    """Review 11b N5 (float32, out_f32): the ablation order's first heads drop 0.000227 and 0.000240 nats with
    standard errors 0.0000619 and 0.0000600, printed "(0.00 and 0.00)"; a tie of 0.0123 and 0.003 beside larger
    ties printed "0.01 and 0.00". Each is said to two significant digits."""
    close = {**HEADS, "close_first_pruned_zero": {"heads": ["L2H2", "L2H0"], "importance": [0.00022652, 0.00023963],
                                                   "se": [6.1857e-05, 5.9989e-05], "moves_count": False}}
    text = finding("heads", close)
    assert ("The first heads of the ablation order, L2H2 and L2H0 (0.00023 and 0.00024), differ from their neighbours "
            "by less than their standard errors over examples (0.000062 and 0.000060)") in text
    assert "0.00 " not in text and "0.00)" not in text
    ties = {**HEADS, "top_heads_zero": ["L0H0", "L0H1", "L1H0", "L1H1", "L2H0"],
            "tied_top_heads_zero": ["L0H0", "L0H1", "L1H0", "L1H1"],
            "tied_top_groups_zero": [["L0H0", "L0H1"], ["L1H0", "L1H1"]],
            "tied_top_values_zero": [[0.5, 0.5], [0.0123, 0.003]]}
    assert "as do L1H0 and L1H1 (0.012 and 0.003)" in finding("heads", ties)


def test_sink_heads_name_their_token_and_say_where_they_also_rank_by_importance():
    """Review 13b C2 (out_t's heads summary: Gemma 2, every prompt starts with <bos>): "Head roles: 2 sink (L1H2,
    L1H3)" named neither the token nor that the two carry the fact; zero-ablation ranks them 1st and 2nd, the gradient
    L1H2 1st. Prompts that start with different tokens leave the token unnamed; at chance no rank is said."""
    s = {**HEADS, "roles": {"sink": ["L1H2", "L1H3"]}, "sink_token": {"token": "<bos>", "special": True},
         "top_heads_zero": ["L1H2", "L1H3", "L2H3", "L0H1", "L1H1"],
         "top_heads_gradient": ["L1H2", "L1H0", "L0H0", "L0H2", "L1H1"]}
    text = finding("heads", s)
    assert ("Head roles: 2 sink (L1H2, L1H3). Sink heads put half or more of their attention, averaged over the "
            "queries, on each prompt's first token, '<bos>' on every prompt (a special token). Sink heads among the "
            "top heads by importance: L1H2 (1st by gradient, 1st by zero-ablation); L1H3 (2nd by zero-ablation): a "
            "sink head can also carry the task at the answer position, so the role is not all that head does "
            "here.") in text
    plain = finding("heads", {**s, "sink_token": None, "top_heads_zero": ["L0H0"], "top_heads_gradient": []})
    assert "on each prompt's first token. " in plain + " " and "among the top heads" not in plain
    assert "among the top heads" not in finding("heads", {**s, "baseline_metric": 0.03})  # at chance (HEADS's band)


def test_gradient_values_name_their_unit_raw_or_layer_normalised():
    """Review 11b N6 (seed 1, out_s1): the top heads tie by raw |dL/d gate| (0.00028 and 0.00027) and the gradient
    order's heads by |dL/d gate| over the layer's L2 norm (0.36 each, raw 8.4e-05): each value says which."""
    s = {**HEADS, "ordering_basis": {"ablation": "raw zero-ablation drop", "gradient": "|dL/d gate| / its layer's L2 norm"},
         "top_heads_gradient": ["L0H3", "L0H0", "L0H1", "L0H2", "L3H1"], "tied_top_heads_gradient": ["L0H2", "L3H1"],
         "tied_top_groups_gradient": [["L0H2", "L3H1"]], "tied_top_values_gradient": [[0.00027620, 0.00026779]],
         "tied_first_pruned_gradient": [["L2H0", "L0H1"], ["L3H3", "L3H2"]], "tied_first_pruned_at_gradient": [2, 5],
         "tied_first_pruned_values_gradient": [[0.36033, 0.36416], [0.48197, 0.48249]],
         "tied_first_pruned_moves_gradient": [False, False]}
    text = finding("heads", s)
    assert ("By gradient, L0H2 and L3H1 tie within rounding (0.00028 and 0.00027, raw |dL/d gate|) among the top "
            "heads") in text
    assert ("In the gradient order, L2H0 and L0H1 (removed 2nd and 3rd; 0.36 each, layer-normalised, as the gradient "
            "ordering ranks them) tie within rounding, as do L3H3 and L3H2 (removed 5th and 6th; 0.48 each): ") in text
    raw = {**s, "ordering_basis": {"gradient": "raw |dL/d gate|"}}
    assert "(removed 2nd and 3rd; 0.36 each, raw |dL/d gate|, as the gradient ordering ranks them)" in finding("heads", raw)


def test_a_bootstrap_interval_of_one_count_is_not_printed_as_a_range():
    """Review 11c (c_out_t): "gradient ... 50% (6-6 heads)" printed a single-value interval as a range; the leading
    ordering's and the random seeds' ("range 6-6") alike."""
    base = {"metric": "logit_diff", "baseline_metric": 8.4, "n_examples": 16, "n_heads": 12}
    s = {**base, **_prunable("ablation", 11, 11, 11), **_prunable("gradient", 6, 6, 6), **_prunable("random", 6, 5, 6)}
    s["prunable_ci_random"].update(per_seed_heads=[6.0, 6.0, 6.0])
    text = finding("heads", s)
    assert "11 of 12 heads (92%, 95% bootstrap interval 11 heads, a single value, over 16 examples)" in text
    assert "gradient 50% (6 heads, a single value)" in text
    assert "random 50% (6, 6 and 6 heads over 3 random orders; too few seeds for an interval)" in text
    assert "11-11" not in text and "6-6" not in text
    one = finding("heads", {**base, **_prunable("ablation", 11, 11, 11), **_prunable("gradient", 1, 1, 1)})
    assert "gradient 8% (1 head, a single value)" in one and not re.search(r"\b1 heads", one)  # review 20: "1 heads"


def test_a_tie_says_which_rounding_floor_it_is_within():
    """#34 (f5 ties): the floor is measured by null ablations where it can be, one analytic step elsewhere;
    the finding says which, in the units of the tied method's importance."""
    s = {**HEADS, "tied_top_heads_zero": ["L1H1", "L1H0"], "rounding_floor_zero": 0.09375,
         "rounding_floor_source": {"zero": "measured", "gradient": "analytic"}, "rounding_null": {"n_runs": 8}}
    text = finding("heads", s)
    assert ("Within rounding here means closer than 0.094 by zero-ablation (measured: twice the largest change of the "
            "metric in 8 null ablations, which replace a layer's heads with themselves, so only rounding moves "
            "it).") in text
    s.update(rounding_floor_source={"zero": "analytic"}, rounding_floor_zero=0.2032)
    assert ("closer than 0.2 by zero-ablation (one rounding step of the metric at the model's dtype: no null "
            "ablation measured it).") in finding("heads", s)
    # the floor holds for metrics of about its size; larger ablated metrics tie within a grown floor, said so
    grown = finding("heads", {**s, "rounding_floor_size": 26.0})
    assert ("ablation measured it), a floor for metric values up to 26 in size; two heads whose larger ablated metric "
            "(unpruned minus the importance), S, is larger in size tie within that floor times S / 26, as one "
            "rounding step grows with the number rounded.") in grown
    # review 11b A2: an answer log-probability's analytic floor is the logits' step times its 1 - p, and says so
    lp = {**s, "metric": "logprob", "rounding_floor_zero": 0.00055, "rounding_logit_step": 0.0794,
          "rounding_sensitivity": 0.00693}
    assert ("closer than 0.00055 by zero-ablation (the metric's rounding: one step of the logits at the model's dtype, "
            "0.079, times the answer's 1 - p summed over its tokens, 0.0069 on average; no null ablation measured "
            "it).") in finding("heads", lp)
    del s["tied_top_heads_zero"]
    assert "Within rounding" not in finding("heads", s)  # no tie, nothing to explain


def test_a_log_probability_floor_names_the_logits_size_and_a_pair_is_named_once():
    """Review 15cv B1 (bfloat16 RoBERTa at <mask>): "a floor for metric values up to 13 in size" named the logits'
    size as the metric's (log P about 0.003), and L1H0/L0H3 were named under the rounding tie and again under the
    standard-error run that holds them. One sentence names them; the floor says what it grows with."""
    s = {**HEADS, "metric": "logprob", "rounding_floor_zero": 3.1e-05, "rounding_floor_size": 12.98,
         "rounding_floor_tokens": 1, "rounding_sensitivity": 0.002957, "rounding_logit_step": 0.1014,
         "rounding_floor_source": {"zero": "measured"}, "rounding_null": {"n_runs": 12},
         "tied_first_pruned_zero": [["L1H0", "L0H3"]], "tied_first_pruned_at_zero": [2],
         "tied_first_pruned_values_zero": [[-0.0006, -0.00059]], "tied_first_pruned_moves_zero": [False],
         "close_first_pruned_zero": {"heads": ["L0H0", "L1H0", "L0H3"], "importance": [-0.00083, -0.0006, -0.00059],
                                     "se": [0.00075, 0.00076, 0.00077], "moves_count": False}}
    text = finding("heads", s)
    assert "tie within rounding" not in text and "metric values up to" not in text  # named once, below
    assert ("differ from their neighbours by less than their standard errors over examples (0.00075, 0.00076 and "
            "0.00077), L1H0 and L0H3 (removed 2nd and 3rd) by less than rounding too: which is removed first") in text
    assert ("(measured: twice the largest change of the metric in 12 null ablations, which replace a layer's heads "
            "with themselves, so only rounding moves it), at the unpruned answers' 1 - p (0.003 on average, summed "
            "over each answer's tokens); a log-probability carries its logits' rounding times 1 - p, so two heads "
            "whose larger ablated log-probability is -S tie within that floor times (1 - e^(-S)) / 0.003, and once "
            "S passes the logits' size (13) within one rounding step of S.") in text


def test_ties_past_the_top_k_and_at_the_start_of_the_pruning_order_are_named():
    """Review 8b (bf16 OLMo 2): C1, the 5th gradient head's partner is the 6th, outside the top 5 ("L1H0 tie"
    named one head); A2, the ablation order's first two heads tie within rounding and swap between dtypes."""
    s = {**HEADS, "top_heads_gradient": ["L0H1", "L0H3", "L0H0", "L0H2", "L1H0"],
         "tied_top_heads_gradient": ["L1H0"], "tied_top_next_gradient": "L2H1",
         "tied_first_pruned_zero": [["L0H1", "L2H0"]], "tied_first_pruned_values_zero": [[-0.4492, -0.4375]],
         "tied_first_pruned_at_zero": [1]}
    text = finding("heads", s)
    assert "By gradient, L1H0 (5th) ties with L2H1 (6th) within rounding: their order is arbitrary." in text
    assert ("The first heads of the ablation order, L0H1 and L2H0, tie within rounding (-0.45 and -0.44): which is "
            "removed first is arbitrary, and the count's interval can depend on it.") in text
    s.update(tied_first_pruned_values_zero=[[-0.4187, -0.4214]], tied_top_heads_gradient=["L0H2", "L1H0"])
    text = finding("heads", s)
    assert "The first heads of the ablation order, L0H1 and L2H0, tie within rounding (-0.42 each): which" in text
    s.update(tied_first_pruned_zero=[["L0H1", "L2H0"], ["L1H3", "L1H2", "L2H2"]], tied_first_pruned_at_zero=[1, 4],
             tied_first_pruned_values_zero=[[-0.4492, -0.4375], [-0.1719, -0.1406, -0.1094]])
    assert ("In the ablation order, L0H1 and L2H0 (removed 1st and 2nd; -0.45 and -0.44) tie within rounding, as do "
            "L1H3, L1H2 and L2H2 (removed 4th, 5th and 6th; -0.17, -0.14 and -0.11): which of each is removed first "
            "is arbitrary, and the count's interval can depend on it.") in finding("heads", s)
    close = {**HEADS, "close_first_pruned_zero": {"heads": ["L2H0", "L0H1"], "importance": [-0.4187, -0.4141],
                                                   "se": [0.125, 0.312]}}  # float32: no rounding tie
    assert ("The first heads of the ablation order, L2H0 and L0H1 (-0.42 and -0.41), differ from their neighbours by "
            "less than their standard errors over examples (0.12 and 0.31): which is removed first is not measured by "
            "these examples, and the count's interval can depend on it.") in finding("heads", close)
    assert "standard errors" not in finding("heads", {**close, **s})  # the rounding tie at the start says it
    later = {**HEADS, "tied_first_pruned_gradient": [["L2H3", "L0H0"]], "tied_first_pruned_at_gradient": [4],
             "tied_first_pruned_values_gradient": [[0.349, 0.360]]}  # not the first heads: no "The first heads"
    assert ("In the gradient order, L2H3 and L0H0 (removed 4th and 5th; 0.35 and 0.36, as the gradient ordering ranks "
            "them) tie within rounding: which is "
            "removed first is arbitrary") in finding("heads", later)
    assert ("By gradient, L0H2 (4th), L1H0 (5th) and L2H1 (6th) each tie within rounding with a neighbour in the "
            "ranking" in text)  # an older summary: which tie with which is not recorded, so no run of three is claimed
    text = finding("heads", {**s, "tied_top_groups_gradient": [["L0H2", "L1H0", "L2H1"]]})
    assert ("By gradient, L0H2 (4th), L1H0 (5th) and L2H1 (6th) tie within rounding, across the edge of the top "
            "heads") in text


def test_every_head_of_a_tie_across_the_top_edge_gets_its_rank():
    """Review 16v C4 (d_trained's heads summary, DeepSeek-V3): "By zero-ablation, L0H1, L2H0 (5th) and L1H3 (6th) tie"
    gave ordinals to the last two of three, so "L0H1, L2H0 (5th)" read as both 5th; L0H1 is 4th of top_heads_zero.
    Each head now gets its place in the ranking (the top heads' order, the next head k + 1)."""
    s = {**HEADS, "top_heads_zero": ["L0H3", "L0H0", "L1H2", "L0H1", "L2H0"],
         "tied_top_heads_zero": ["L0H1", "L2H0"], "tied_top_next_zero": "L1H3",
         "tied_top_groups_zero": [["L0H1", "L2H0", "L1H3"]],
         "tied_top_values_zero": [[0.001953125, 0.001953125, 0.0009765625]]}
    assert ("By zero-ablation, L0H1 (4th), L2H0 (5th) and L1H3 (6th) tie within rounding (0.002, 0.002 and 0.00098), "
            "across the edge of the top heads: their order is arbitrary.") in finding("heads", s)


def test_separate_ties_are_said_apart_and_only_ties_that_can_move_the_count_say_so():
    """Review 9a A4.2/A4.3 (bf16 Mistral, out_bf): {L2H0, L2H1} (0.531 each) and {L2H3 (5th), L1H0 (6th)} are two
    ties, 0.117 apart, not one run of four; the ablation order's 2nd-4th heads are removed as a set before the
    step that decides its count (4; the 5th), the 5th/6th tie spans it; the gradient's 2nd/3rd tie lies past
    its count's deciding point (count 0, interval 0-0)."""
    s = {**HEADS, "top_heads_zero": ["L2H0", "L2H1", "L0H1", "L0H2", "L2H3"],
         "tied_top_heads_zero": ["L2H0", "L2H1", "L2H3"], "tied_top_next_zero": "L1H0",
         "tied_top_groups_zero": [["L2H0", "L2H1"], ["L2H3", "L1H0"]],
         "tied_top_values_zero": [[0.53125, 0.53125], [0.4141, 0.3398]],
         "tied_first_pruned_zero": [["L1H2", "L1H3", "L0H0"], ["L1H1", "L2H2"]], "tied_first_pruned_at_zero": [2, 5],
         "tied_first_pruned_values_zero": [[0.0508, 0.0586, 0.1094], [0.2734, 0.3242]],
         "tied_first_pruned_moves_zero": [False, True],
         "tied_first_pruned_gradient": [["L0H0", "L2H1"]], "tied_first_pruned_at_gradient": [2],
         "tied_first_pruned_values_gradient": [[0.331, 0.335]], "tied_first_pruned_moves_gradient": [False]}
    text = finding("heads", s)
    assert ("By zero-ablation, L2H0 and L2H1 (0.53 each) tie within rounding among the top heads, as do L2H3 (5th) "
            "and L1H0 (6th) (0.41 and 0.34), across the edge of the top heads: the order within each pair is "
            "arbitrary, not between them.") in text
    assert "L2H0, L2H1, L2H3" not in text
    assert ("In the ablation order, L1H2, L1H3 and L0H0 (removed 2nd, 3rd and 4th; 0.05, 0.06 and 0.11) tie within "
            "rounding, as do L1H1 and L2H2 (removed 5th and 6th; 0.27 and 0.32): which of each is removed first is "
            "arbitrary; the count's interval can depend on the order of L1H1 and L2H2 only (the others change no "
            "step that decides it).") in text
    assert ("In the gradient order, L0H0 and L2H1 (removed 2nd and 3rd; 0.33 and 0.34, as the gradient ordering ranks "
            "them) tie within rounding: which is "
            "removed first is arbitrary, but the count does not depend on it: no step that decides it falls between "
            "them.") in text
    close = {**HEADS, "close_first_pruned_zero": {"heads": ["L2H0", "L0H1"], "importance": [-0.4187, -0.4141],
                                                   "se": [0.125, 0.312], "moves_count": False}}
    assert "not measured by these examples, but the count does not depend on it" in finding("heads", close)


def test_at_chance_no_head_order_or_tie_is_named():
    """Review 9a C6 (untrained Mistral): after "relative findings are not reported" the finding named the first
    six heads of the ablation order and said the count's interval can depend on them."""
    s = {**HEADS, "baseline_metric": -0.0555, "n_heads": 12, "roles": {},
         "chance": {"at_chance": True, "below_chance": False, "chance_value": 0.0, "ci": [-0.239, 0.128],
                    "metric": "logit_diff"},
         "close_first_pruned_zero": {"heads": ["L2H3", "L1H0", "L2H0"], "importance": [-0.0205, -0.0184, -0.0142],
                                     "se": [0.02, 0.01, 0.01]},
         "tied_top_heads_zero": ["L0H1", "L0H2"], "tied_first_pruned_zero": [["L2H3", "L1H0"]],
         "tied_first_pruned_at_zero": [1], "rounding_floor_zero": 0.09, "rounding_floor_source": {"zero": "measured"}}
    text = finding("heads", s)
    assert "L2H3" not in text and "L1H0" not in text and "L0H1" not in text
    assert "tie" not in text and "count's interval" not in text and "Within rounding" not in text
    assert "Unpruned logit difference is -0.0555" in text


def test_a_kv_ceiling_at_the_whole_prompt_says_nothing_is_saved():
    kv = {"metric": "logit_diff", "n_examples": 16, "metric_unevicted": 10.0, "context_positions": 25,
          "metric_per_policy_budget": {"window": {"8": 5.0, "16": 9.0, "25": 10.0}, "sinks_window": {"8": 4.0, "25": 9.99}}}
    text = finding("kv", kv)
    assert "Full-cache logit difference 10 (mean over 16 examples); within 1% of it (|change| <= 1%, averaged over every " \
           "prompt, also those a budget keeps whole): window only with the whole context, sinks window only with the " \
           "whole context." in text
    assert "No eviction policy saves anything here: every policy needs the whole context (25 positions)" in text
    kv["metric_per_policy_budget"]["window"]["16"] = 9.95
    text = finding("kv", kv)
    assert "window from 16 positions of 25" in text and "saves anything" not in text


def test_attribution_names_rollout_when_raw_attention_disagrees_and_sizes_its_significance():
    s = {"n_examples": 4, "mean_tau_attention_gradient": 0.05, "std_tau_attention_gradient": 0.1,
         "mean_tau_attention_loo": -0.02, "mean_tau_rollout_gradient": 0.37, "mean_tau_rollout_loo": 0.52,
         "fraction_significant": 0.5, "n_tau_tests": 16}
    text = finding("attribution", s)
    # t interval: 0.05 -+ t(0.975, 3) 3.182 x 0.1 / 2 = [-0.11, 0.21]
    assert "gradient x input at mean Kendall tau 0.05, 95% CI [-0.11, 0.21]" in text
    assert "leave-one-out at mean Kendall tau 0.78, 95% CI [0.55, 1.00]" in finding(  # 1.01 clipped to tau's range
        "attribution", {**s, "mean_tau_attention_loo": 0.78, "std_tau_attention_loo": 0.1445})
    # no paired per-example test in the summary: rollout's higher means are not called better
    assert "does better" not in text and "not shown to do better" in text and "no paired test" in text
    # Wilson interval of 8 / 16: 0.5 -+ 0.220
    assert ("8 of 16 per-example taus (50%) are significant at p < 0.05 (Kendall's exact test; with tied "
            "scores a permutation test over every ordering up to 8 tokens; its normal approximation beyond), "
            "uncorrected (Wilson 95% CI 28%-72%") in text
    assert "4 examples are too few" in text
    weak = {**s, "mean_tau_rollout_gradient": 0.1, "mean_tau_rollout_loo": 0.05}
    assert ("weak for rollout too (tau from 0.05 to 0.10): attention weights are a poor stand-in"
            in finding("attribution", weak))


def test_rollout_does_better_only_where_the_holm_corrected_paired_test_passes():
    # hand-built per-example taus (12 examples) against gradient x input and leave-one-out
    raw = {"gradient": np.array([0.1, 0.0, 0.05, -0.1, 0.1, 0.0, 0.05, 0.1, -0.05, 0.0, 0.1, 0.05]),
           "loo": np.array([0.1, -0.1, 0.0, 0.05, 0.0, 0.1, -0.05, 0.0, 0.05, 0.1, 0.0, -0.1])}
    roll = {"gradient": raw["gradient"] + np.array([0.3, 0.2, 0.4, 0.25, 0.35, 0.2, 0.3, 0.15, 0.4, 0.3, 0.25, 0.2]),
            "loo": raw["loo"] + np.array([0.4, -0.3, 0.2, 0.5, -0.2, 0.3, 0.1, -0.1, 0.4, 0.0, 0.3, -0.2])}
    s = {"n_examples": 12, "rollout_vs_raw": {}}
    tests = {}
    for key in raw:
        s[f"mean_tau_attention_{key}"], s[f"std_tau_attention_{key}"] = raw[key].mean(), raw[key].std(ddof=1)
        s[f"mean_tau_rollout_{key}"] = roll[key].mean()
        ref = stats.ttest_rel(roll[key], raw[key])
        ci = ref.confidence_interval(0.95)
        tests[key] = (ref.pvalue, (roll[key] - raw[key]).mean(), ci)
    lo_p, hi_p = sorted(p for p, _, _ in tests.values())  # Holm over the two references
    for key, (p, mean, ci) in tests.items():
        s["rollout_vs_raw"][key] = {"mean": mean, "n": 12, "ci": [ci.low, ci.high], "p": p,
                                    "p_holm": min(1, 2 * p) if p == lo_p else max(min(1, 2 * lo_p), hi_p)}
    g, lo = tests["gradient"], tests["loo"]
    assert g[0] < 0.01 and lo[0] > 0.05  # gradient x input clearly better, leave-one-out not
    text = finding("attribution", s)
    assert (f"attention rollout does better (paired per example, rollout minus raw tau over 12 examples, Holm-corrected "
            f"over 2 references) against gradient x input (tau {roll['gradient'].mean():.2f} against raw "
            f"{raw['gradient'].mean():.2f}; paired difference {g[1]:+.2f}, uncorrected 95% CI [{g[2].low:+.2f}, "
            f"{g[2].high:+.2f}], "
            f"Holm-corrected p = {s['rollout_vs_raw']['gradient']['p_holm']:.2g}), but not significantly against "
            f"leave-one-out") in text
    assert "tracks token importance" not in text
    # both pass and raw's intervals stay under 0.2: "where the raw weights do not" may be said
    both = {**s, "rollout_vs_raw": {**s["rollout_vs_raw"], "loo": {**s["rollout_vs_raw"]["loo"], "p_holm": 0.01}}}
    assert "where the last layer's raw weights do not (raw tau's 95% CIs stay under 0.2)" in finding("attribution", both)
    # raw's interval reaching 0.35 (sd 0.4 over 12: 0.1 + 2.201 x 0.4 / sqrt 12 = 0.35): no "do not"
    wide = {**both, "mean_tau_attention_gradient": 0.1, "std_tau_attention_gradient": 0.4}
    text = finding("attribution", wide)
    assert "does better" in text and "raw weights do not" not in text
    assert ("Raw tau's 95% CIs reach up to 0.35, so these examples do not show that the last layer's raw weights fail "
            "to track token importance.") in text
    # the paired difference's sign decides too: a significant drop is not "better"
    worse = {**s, "rollout_vs_raw": {k: {**v, "mean": -abs(v["mean"])} for k, v in s["rollout_vs_raw"].items()}}
    assert "does better" not in finding("attribution", worse)
    # review 19v B1 (Nemotron float32): an uncorrected interval clear of 0 whose Holm-corrected p (2 x 0.0275) fails
    # was printed as "95% CI [+0.08, +0.68]" beside "not shown": now labelled uncorrected, and the two are reconciled
    holm = {**s, "rollout_vs_raw": {**s["rollout_vs_raw"], "gradient": {"mean": 0.38, "n": 12, "ci": [0.08, 0.68],
                                                                         "p": 0.0275, "p_holm": 0.055}}}
    text = finding("attribution", holm)
    assert ("Attention rollout is not shown to do better than raw last-layer attention after Holm's correction (paired "
            "per example, rollout minus raw tau over 12 examples, Holm-corrected over 2 references): gradient x input "
            f"(tau {roll['gradient'].mean():.2f} against raw {raw['gradient'].mean():.2f}; paired difference +0.38, "
            "uncorrected 95% CI [+0.08, +0.68], Holm-corrected p = 0.055: the uncorrected interval excludes 0, but the "
            "test does not pass after Holm's correction (p >= 0.05))") in text, text


def test_patching_correlation_on_one_point_and_next_sites_that_are_one_residual_state():
    cell = {"head": None, "token": "5: x"}
    s = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 8,
         "clean_metric": 2.0, "corrupted_metric": 0.0,
         "top_sites": {"resid_pre": [{**cell, "layer": 1, "pos": 5, "effect": 2.0},
                                     {**cell, "layer": 2, "pos": 5, "effect": 1.9}],
                       "resid_post": [{**cell, "layer": 0, "pos": 5, "effect": 2.0}],  # the same state as resid_pre 1
                       "attn_out": [{**cell, "layer": 1, "pos": 5, "effect": 0.4}],
                       "mlp_out": [{**cell, "layer": 0, "pos": 5, "effect": 0.2}]},
         "attribution_correlation": {"attn_out": {"pearson": 1.0, "spearman": 0.1, "n": 60, "n_nonzero": 1}}}
    text = finding("patching", s)
    assert "most at the resid_pre at layer 1, position 5 ('5: x'): 1.00 of the clean-corrupted gap" in text
    assert "Next, at other sites: attn_out at layer 1, position 5 ('5: x') (0.20); mlp_out at layer 0, position 5" in text
    assert "resid_post" not in text and "layer 2" not in text
    assert "attn_out r = 1.000 rests on 1 non-zero exact effect(s) of 60 cells, so it says nothing about agreement" in text
    s["attribution_correlation"]["attn_out"].update(n_nonzero=7, pearson_without_top=0.02)  # the zoo: 47.8 beside < 0.6
    assert ("attn_out r = 1.000 rests on its 7 non-zero cells of 60 (Spearman 0.10 over all 60 cells, 53 of them tied at "
            "zero; without its largest cell r = 0.020; no interval for r or the slope: the other 53 cells have no exact "
            "effect)") in finding("patching", s)
    s["attribution_correlation"]["attn_out"].update(n_nonzero=40)  # most cells non-zero: Fisher intervals over n
    assert ("attn_out r = 1.000 is driven by its largest cell: without it r = 0.020 (n = 59 cells, 95% CI "
            "[-0.237, 0.275]), so the agreement rests on one point") in finding("patching", s)
    s["attribution_correlation"]["attn_out"].update(pearson=0.95, pearson_without_top=0.9)
    # Fisher z: tanh(atanh(0.95) -+ 1.96 / sqrt(57))
    assert "attn_out r = 0.950 (n = 60 cells, 95% CI [0.917, 0.970])" in finding("patching", s)


def test_circuits_lens_names_the_block_input_row():
    per_layer = {str(i): v for i, v in enumerate([0.0, 0.1, 0.75, 0.9, 1.0])}  # 4 blocks: 0_pre..3_pre, final_post
    s = {"first_top1_layer": 2, "lens_top1_fraction_per_layer": per_layer, "n_examples": 16}
    # Wilson 95%: 12 of 16 -> 50.5%-89.8%; 16 of 16 -> 80.6%-100%; 8 of 8 -> 67.6%-100% (the fourth review's)
    assert ("first ranks the answer top-1 (median over examples) at the input of block 2 (row 2_pre), after 2 of 4 blocks "
            "(top-1 in 12 of 16 examples, 75%, Wilson 95% CI 51%-90%).") in finding("circuits", s)
    assert ("only at the model's output, after all 4 blocks (top-1 in 16 of 16 examples, 100%, Wilson 95% CI 81%-100%)"
            in finding("circuits", {**s, "first_top1_layer": 4}))
    eight = {**s, "n_examples": 8, "lens_top1_count_per_layer": {"4": 8}, "first_top1_layer": 4}
    assert "(top-1 in 8 of 8 examples, 100%, Wilson 95% CI 68%-100%)" in finding("circuits", eight)


def test_circuits_lens_top1_is_held_against_a_constant_guess():
    """Review 8a A1: on is/are the embeddings' 5 of 8 top-1 (Wilson 95% CI 30.6%-86.3%) is a constant
    guess of the commoner answer, not the answer; 8 of 8 at block 1 (Wilson 67.6%-100%) clears 5/8."""
    s = {"first_top1_layer": 0, "n_examples": 8, "lens_n_answers": 2,
         "lens_top1_fraction_per_layer": {"0": 5 / 8, "1": 1.0, "2": 1.0, "3": 1.0},
         "lens_top1_count_per_layer": {"0": 5, "1": 8, "2": 8, "3": 8},
         "lens_mean_logit_diff_per_layer": {"0": 0.5625, "1": 5.51, "2": 7.94, "3": 10.62}}
    for guess, rate in ((5 / 8, "62% (5 of 8)"), (0.54, "54%")):
        text = finding("circuits", {**s, "lens_constant_guess": guess})
        assert "already at the embeddings" not in text
        assert (f"first ranks the answer top-1 more often than a constant guess of the commonest answer, which is "
                f"top-1 on {rate} of these examples, at the input of block 1 (row 1_pre), after 1 of 3 blocks (top-1 in "
                "8 of 8 examples, 100%, Wilson 95% CI 68%-100%); top-1 in 5 of 8 examples at the embeddings (Wilson 95% "
                "CI 31%-86%) does not clear that guess.") in text
        assert ("mean logit difference (answer minus wrong answer) is the measure to read: 0.562 at the embeddings, "
                "5.51 at block 1's input, of 10.6 at the output.") in text
    # with the analysis's 95% t intervals (review 8 B1: every number with its uncertainty) each value carries its own
    cis = {"0": [-0.84, 1.97], "1": [3.51, 7.51], "2": [6.78, 9.10], "3": [9.9, 11.35]}
    text = finding("circuits", {**s, "lens_constant_guess": 5 / 8, "lens_logit_diff_ci_per_layer": cis,
                                "lens_logit_diff_n": 8})
    assert ("is the measure to read (logits, mean over 8 examples): 0.562 (95% CI [-0.84, 1.97]) at the embeddings, "
            "5.51 (95% CI [3.51, 7.51]) at block 1's input, of 10.6 (95% CI [9.9, 11.3]) at the output.") in text
    # a guess right on 7 of 8: 8 of 8's lower bound 67.6% does not clear 87.5%, so no layer is named
    none = finding("circuits", {**s, "lens_constant_guess": 7 / 8})
    assert "ranks the answer top-1 on no layer more often than a constant guess" in none and "block 1 (row" not in none
    # many answers (IOI's names): a guess right on 1 of 8 changes nothing, today's sentence, no logit-difference line
    many = finding("circuits", {**s, "first_top1_layer": 1, "lens_constant_guess": 1 / 8, "lens_n_answers": 8})
    assert many == ("The logit lens first ranks the answer top-1 (median over examples) at the input of block 1 "
                    "(row 1_pre), after 1 of 3 blocks (top-1 in 8 of 8 examples, 100%, Wilson 95% CI 68%-100%).")


def test_probes_selectivity_against_a_negative_control_r2():
    s = {"metric": "r2", "labels": "position", "best_layer": 2, "best_r2": 0.9, "best_control": -0.26,
         "best_selectivity": 1.16, "best_std": 0.03, "cv": 5, "n_examples": 16, "majority_baseline": None}
    text = finding("probes", s)
    assert "layer 2 with R^2 0.90 (sd 0.03 over 5 folds) (16 examples)." in text
    assert "R^2 is -0.26, below 0 (worse than predicting the mean), so score minus control (1.16) overstates " \
           "selectivity; against the control's floor of 0 it is 0.90." in text


def test_mlp_agreement_is_counted_in_neurons_against_the_control():
    s = {"agreement_per_layer": {"0": 0.03, "3": 18 / 256}, "agreement_shuffled_per_layer": {"0": 0.01, "3": 3 / 256},
         "n_prefixes": 1248, "n_neurons_per_layer": 256}
    text = finding("mlp", s)
    # Wilson interval of 18 / 256: 4%-11%, above the control's 1%
    assert "is highest at 7% (18 of 256 neurons, Wilson 95% CI 4%-11%) in layer 3 (over 1248 prefixes)" in text
    # the third review: layer 1's 127 of 256 lies inside layer 0's 130 of 256 interval (45%-57%): no peak is claimed
    tied = {**s, "agreement_per_layer": {"0": 130 / 256, "1": 127 / 256}, "agreement_shuffled_per_layer": {"0": 0.01}}
    assert "in layer 0, with layer 1 inside its interval (no one layer stands out)" in finding("mlp", tied)
    assert "no better" not in text
    close = {**s, "agreement_per_layer": {"3": 6 / 256}, "agreement_shuffled_per_layer": {"3": 3 / 256}}
    assert "(6 of 256 neurons, Wilson 95% CI 1%-5%)" in finding("mlp", close)
    assert "layer 3 cannot be told from it (Fisher's exact test, two-sided, p = 0.5)" in finding("mlp", close)  # 6 vs 3 of 256


def test_circuits_finding_states_mib_metrics():
    text = finding("circuits", {"dla_final_logit": 2.0, "dla_top_components": {"a1.h0": 1.5},
                                "mib_cpr": 0.8123, "mib_cmd": 0.2051, "edge_method": "eap-clean"})
    assert "MIB's circuit metrics (eap-clean scores): CPR 0.812 (higher is better), CMD 0.205 (lower is better)." in text
    text = finding("circuits", {"dla_final_logit": 2.0, "dla_top_components": {"a1.h0": 1.5}, "mib_cpr": 0.945,
                                "mib_cmd": 0.054, "edge_method": "eap-ig", "n_edges": 190, "mib_n_examples": 8,
                                "mib_cpr_ci": [0.9012, 0.9734], "mib_cmd_ci": [0.031, 0.0987]})
    assert ("MIB's circuit metrics (eap-ig scores, top-k of 190 edges, over 8 examples): CPR 0.945 (95% bootstrap CI "
            "[0.901, 0.973] over examples; higher is better), CMD 0.054 (95% bootstrap CI [0.031, 0.099] over examples; "
            "lower is better).") in text


def test_an_interval_wholly_below_chance_is_called_below_chance_and_says_what_it_means():
    below = {**AT_CHANCE, "mean": -0.9, "ci": [-1.2, -0.6], "task": "ioi"}  # no below_chance key: read from the CI
    text = finding("heads", {**HEADS, "baseline_metric": -0.9, "chance": below})
    assert text.startswith("The model is below chance on task ioi (logit difference -0.9 against chance 0 (no "
                           "preference on average between the answer and the wrong answer), 95% CI [-1.2, -0.6]): worse than "
                           "guessing, it systematically prefers the wrong answers; relative findings are not reported.")
    assert "at chance" not in text
    lp = {"at_chance": True, "below_chance": True, "metric": "logprob", "mean": -9.0, "chance_value": -6.2146,
          "ci": [-9.5, -8.5], "ci_level": 0.95, "task": "kv", "vocab_size": 500, "answer_tokens": 1.0}
    text = finding("kv", {"metric_unevicted": -9.0, "chance": lp})  # an older entry, against log(1/V): Jensen
    assert "below chance on task kv" in text and "at or below chance" in text and "Jensen" in text
    assert "systematically dispreferred" not in text
    own = {**lp, "chance_from": "vocabulary_mean"}  # against the model's own every-token mean (review 13a A2)
    text = finding("kv", {"metric_unevicted": -9.0, "chance": own})
    assert "below chance on task kv" in text and "less log-probability than its own average vocabulary token" in text
    assert "systematically dispreferred" in text and "at chance" not in text
    straddle = {**lp, "below_chance": False, "ci": [-7.0, -5.5]}  # the CI contains chance: at chance, not below
    assert finding("kv", {"metric_unevicted": -6.3, "chance": straddle}).startswith("The model is at chance on task kv")


def test_below_chance_on_shipped_sentences_off_distribution_claims_no_preference():
    """Verify 11b A4: below chance on shipped sentences split into 3.9 tokens a word, mlp and kv said "so they are
    systematically dispreferred" right before the off-distribution note; the pieces' answers show no preference."""
    lp = {"at_chance": True, "below_chance": True, "metric": "logprob", "mean": -9.21, "chance_value": -6.12,
          "ci": [-9.5, -8.9], "ci_level": 0.95, "task": "sentences", "vocab_size": 455, "answer_tokens": 1.0}
    fit = {"n_sentences": 64, "tokens_per_word": 3.9375, "unknown_words": 0, "off_distribution": True,
           "note": "the shipped sentences are split into 3.9 tokens a word by this tokenizer: the findings describe the "
                   "model off its training distribution (give it a task of your own: --task)"}
    for name, summary in (("kv", {"metric_unevicted": -9.21}), ("mlp", {})):
        text = finding(name, {**summary, "chance": lp, "shipped_text": fit})
        assert (": below chance on text its tokenizer splits into 3.9 tokens a word: not evidence of a preference; "
                "relative findings are not reported. The shipped sentences are split into 3.9 tokens" in text), text
        assert "systematically" not in text and "less probability than a uniform guess" not in text
    on = finding("kv", {"metric_unevicted": -9.21, "chance": {**lp, "chance_from": "vocabulary_mean"},
                        "shipped_text": {**fit, "off_distribution": False}})
    assert "systematically dispreferred" in on


def test_below_chance_on_few_examples_is_not_called_systematic():
    # review 6, A7: 4 examples of a random model wholly below chance, its 16-example sample of the task at chance
    four = {**AT_CHANCE, "below_chance": True, "mean": -0.133, "ci": [-0.229, -0.0369], "task": "ioi", "n_examples": 4}
    text = finding("heads", {**HEADS, "baseline_metric": -0.133, "chance": four})
    assert ("95% CI [-0.229, -0.0369]): below chance on these 4 examples (too few to say it is systematic); "
            "relative findings are not reported.") in text
    assert "systematically" not in text
    eight = {**four, "n_examples": 8}  # 8 examples, the interval wholly below chance: systematic
    assert "it systematically prefers the wrong answers" in finding("heads", {**HEADS, "chance": eight})


def test_each_chance_sentence_names_its_task_and_the_basis_of_its_chance_level():
    # one metric, three chance levels: log(1/500) = -6.21 per token; 2.5 and 2.83 tokens on average
    entry = {"at_chance": True, "metric": "logprob", "ci_level": 0.95, "vocab_size": 500}
    heads = {**entry, "task": "facts", "answer_tokens": 2.83, "mean": -17.0, "chance_value": -2.83 * 6.2146,
             "ci": [-18.0, -16.5]}
    patching = {**entry, "task": "mine.jsonl", "answer_tokens": 2.5, "mean": -15.0, "chance_value": -2.5 * 6.2146,
                "ci": [-16.0, -14.9]}
    kv = {**entry, "task": "kv", "answer_tokens": 1.0, "mean": -6.0, "chance_value": -6.2146, "ci": [-6.5, -5.8]}
    # entries written before chance.assess_per_row: a mean length that is no whole number had the margins' interval
    # as "ci", the spread of the answer lengths (review 11b A1): it is not printed
    assert finding("heads", {"chance": heads}).startswith(
        "The model is at chance on task facts (answer log-probability -17 against chance -17.6 (2.83 x log(1/500): "
        "answers of 2.83 tokens on average, uniform over a 500-token vocabulary)); relative findings")
    two = {**heads, "answer_tokens": 3.0, "chance_value": -3 * 6.2146}  # one answer length: its interval is the metric's
    assert "uniform over a 500-token vocabulary), 95% CI [-18, -16.5]);" in finding("heads", {"chance": two})
    assert ("on task mine.jsonl (answer log-probability -15 against chance -15.5 (2.5 x log(1/500): answers of 2.5 "
            "tokens on average") in finding("kv", {"chance": patching})
    assert ("on task kv (answer log-probability -6 against chance -6.21 (log(1/500): one answer token, uniform over "
            "a 500-token vocabulary)") in finding("kv", {"chance": kv})
    guess = {"at_chance": True, "metric": "accuracy", "mean": 0.3, "chance_value": 0.25, "n_classes": 4, "task": "t"}
    assert "accuracy 0.3 against chance 0.25 (1/4: guessing among 4 answers)" in finding("kv", {"chance": guess})


def test_circuits_at_chance_names_no_largest_writers():
    s = {"dla_final_logit": 0.01, "dla_top_components": {"mlp0": 0.004, "a1.h0": -0.003}, "mib_cpr": 0.4,
         "mib_cmd": 0.6, "edge_method": "eap"}
    for summary in ({**s, "chance": AT_CHANCE}, s):  # the guard's entry, and the old heuristic without one
        text = finding("circuits", summary)
        assert "largest writers" not in text and "mlp0" not in text and "CPR" not in text, text
        assert "ranks no writer and the circuit's faithfulness is not reported: at chance" in text
    assert text.startswith("Direct logit attribution (final logit difference 0.01, near 0) ranks no writer")
    assert "largest writers are mlp0 (+0.00)" in finding("circuits", {**s, "dla_final_logit": 2.0})


def test_one_point_correlation_only_when_one_point_carries_it():
    s = {"metric": "logit_diff", "normalized": False, "n_examples": 8, "clean_metric": 2.0, "corrupted_metric": 0.0,
         "top_sites": {}}

    def said(r, rest, n=60):
        corr = {"pearson": r, "n": n, "n_nonzero": n, "pearson_without_top": rest}
        return finding("patching", {**s, "attribution_correlation": {"attn_out": corr}})

    # the review's two false alarms: r = -0.07 is not significant (Fisher CI [-0.32, 0.19]) and |r| grows without
    # the point; 0.52 -> 0.34 stays significant (Fisher CI of 0.34 over 59: [0.09, 0.54]) and keeps over half of r
    for r, rest in ((-0.07, -0.28), (0.52, 0.34)):
        text = said(r, rest)
        assert "largest cell" not in text and "one point" not in text, text
        assert f"attn_out r = {r:.3f} (n = 60 cells" in text
    # a true one-point case: r = 0.9 over 20 cells, 0.1 without the point (Fisher CI [-0.37, 0.53] contains 0)
    assert ("attn_out r = 0.900 is driven by its largest cell: without it r = 0.100 (n = 19 cells, 95% CI "
            "[-0.371, 0.530]), so the agreement rests on one point") in said(0.9, 0.1, 20)
    # significant without it too, but under half: 1.000 -> 0.42 over 59 (Fisher CI [0.184, 0.610])
    assert ("attn_out r = 1.000 is mostly carried by its largest cell: without it r = 0.420 (n = 59 cells, 95% CI "
            "[0.184, 0.610]), a much weaker agreement") in said(1.0, 0.42)


def _cells(site: str, effect, attribution):
    """An exact table joined with attribution estimates for one (layer, head) site type: 3 layers x 4 heads."""
    import pandas as pd

    rows = [{"site_type": site, "layer": i // 4, "head": i % 4, "pos": None, "effect": e} for i, e in enumerate(effect)]
    exact = pd.DataFrame(rows).astype({"head": "Int64", "pos": "Int64"})
    return exact, exact.drop(columns="effect").assign(attribution=attribution)


def test_an_r_set_by_one_cell_is_said_with_r_and_the_slope_without_it():
    """Review 12a: head_out "r = 0.999 (n = 12 cells, 95% CI [0.998, 1.000])" and slope 0.58 [0.57, 0.59] where one
    cell (0.999 of the gap) sets both; the other 11 give r = 0.78. r, the interval and the slopes from scipy."""
    from headscope.analyses.patching.attribution_patching import correlation_with_exact

    rng = np.random.default_rng(0)
    small = rng.uniform(-0.3, 0.3, 11)
    effect = np.r_[7.25, small]
    attribution = np.r_[4.19, 0.63 * small + rng.normal(0, 0.12, 11)]
    _, stats_ = correlation_with_exact(*_cells("head_out", effect, attribution))
    r, rest = stats.pearsonr(effect, attribution)[0], stats.pearsonr(small, attribution[1:])[0]
    assert r > 0.99 and 0.3 < rest < r - 0.1  # the premise: one cell sets r
    z, se = np.arctanh(r), 1 / np.sqrt(12 - 3)
    low, high = np.tanh(z - 1.959964 * se), np.tanh(z + 1.959964 * se)
    assert not low <= rest <= high
    s = {"metric": "logit_diff", "normalized": False, "n_examples": 8, "clean_metric": 7.3, "corrupted_metric": 0.0,
         "top_sites": {}, "attribution_correlation": stats_}
    text = finding("patching", s)
    rz, rse = np.arctanh(rest), 1 / np.sqrt(11 - 3)
    assert (f"head_out r = {r:.3f} (n = 12 cells, 95% CI [{low:.3f}, {high:.3f}]) is set by one cell, its largest: "
            f"without it r = {rest:.3f} (n = 11 cells, 95% CI [{np.tanh(rz - 1.959964 * rse):.3f}, "
            f"{np.tanh(rz + 1.959964 * rse):.3f}]), outside that interval") in text
    slope, slope_rest = stats.linregress(effect, attribution).slope, stats.linregress(small, attribution[1:]).slope
    assert f"least-squares slope {slope:.2f} of attribution on exact" in text
    assert f"n = 12 cells; {slope_rest:.2f} without its largest cell)" in text
    # r that the rest of the cells keep within its interval stays plain: 0.95 over 200 against 0.93
    plain = {"pearson": 0.95, "n": 200, "n_nonzero": 200, "pearson_without_top": 0.93}
    said = finding("patching", {**s, "attribution_correlation": {"attn_out": plain}})
    assert "attn_out r = 0.950 (n = 200 cells" in said and "largest" not in said


def test_no_agreement_is_read_where_every_exact_effect_is_negligible():
    """Review 12b A3: q cells all within 7e-4 of a 15.3 gap got "r = 0.560 ... slope 0.37 ... misses L1H2 ... Do not
    rank sites by it ... at q"; now no r, slope or miss, and the legend of the figure gives no slope for them. A site
    type at 0.02 of the gap is still read."""
    from headscope.analyses.patching.attribution_patching import correlation_with_exact
    from headscope.reports.plots_patching import plot_attribution_vs_exact

    rng = np.random.default_rng(1)
    gap = 15.26
    q = rng.uniform(-0.0106, 0.0106, 12)
    q[3] = -0.0106  # the largest: 0.0007 of the gap
    pattern = np.r_[0.365, rng.uniform(-0.05, 0.05, 11)]
    qx, qa = _cells("q", q, -q[::-1])  # attribution unrelated to exact: a "miss" and a wrong top cell
    px, pa = _cells("pattern", pattern, 0.9 * pattern)
    import pandas as pd

    joined, stats_ = correlation_with_exact(pd.concat([qx, px], ignore_index=True),
                                            pd.concat([qa, pa], ignore_index=True))
    assert stats_["q"]["missed"] is not None or stats_["q"]["top_exact"]["attribution_rank"] > 1  # the premise
    s = {"metric": "logit_diff", "normalized": False, "n_examples": 32, "clean_metric": gap / 2,
         "corrupted_metric": -gap / 2, "top_sites": {}, "attribution_correlation": stats_}
    text = finding("patching", s)
    assert "q: exact effects all below 0.001 of the gap (the largest 0.0007), nothing to rank" in text
    assert "q r =" not in text and "at q" not in text
    assert f"pattern r = {stats.pearsonr(pattern, 0.9 * pattern)[0]:.3f}" in text
    import matplotlib.pyplot as plt

    try:
        shares = joined.assign(effect=joined["effect"] / gap, attribution=joined["attribution"] / gap)
        ax = plot_attribution_vs_exact(shares, negligible=0.001)
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert "q (exact effects all below 0.001 of the gap: no slope)" in labels
        assert any(t.startswith("pattern (slope 0.90") for t in labels)
    finally:
        plt.close("all")


def test_patching_over_a_gap_within_noise_ranks_no_site():
    s = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 12,
         "clean_metric": 0.2, "corrupted_metric": 0.0,
         "top_sites": {"resid_pre": [{"layer": 1, "head": None, "pos": 3, "token": "3: x", "effect": 1.62}],
                       "head_out": [{"layer": 0, "head": 2, "pos": None, "token": "", "effect": -0.4}]},
         "gap_within_noise": {"gap": 0.2, "ci": [-0.3, 0.7], "n_examples": 12, "floor": 0.1,
                              "reason": "mean gap 0.2 logit difference, its 95% CI [-0.3, 0.7] over 12 pairs contains 0"}}
    text = finding("patching", s)
    assert ("The clean-corrupted gap is within noise (mean gap 0.2 logit difference, its 95% CI [-0.3, 0.7] over 12 "
            "pairs contains 0): effects normalised by it (shares of the gap) are not meaningful, so no site is "
            "ranked.") in text
    assert "of the clean-corrupted gap (" not in text and "8.1" not in text and "Next, at" not in text
    assert "Clean prompts give a logit difference of 0.2, corrupted ones 0." in text  # the numbers stay
    del s["gap_within_noise"]
    assert "8.10 of the clean-corrupted gap" in finding("patching", s)  # 1.62 / 0.2


def test_rollout_is_never_called_better_without_a_paired_test_nor_at_chance():
    # the review's at-chance run: rollout 0.06 against integrated gradients is worse than raw attention's 0.17
    s = {"n_examples": 4, "mean_tau_attention_gradient": 0.157, "std_tau_attention_gradient": 0.112,
         "mean_tau_attention_loo": -0.091, "std_tau_attention_loo": 0.135, "mean_tau_attention_ig": 0.168,
         "std_tau_attention_ig": 0.035, "mean_tau_rollout_gradient": 0.2452, "mean_tau_rollout_ig": 0.057,
         "mean_tau_rollout_loo": -0.138}
    text = finding("attribution", {**s, "chance": AT_CHANCE})  # at chance: what was measured, no tau at all
    assert "Measured over 4 examples: Kendall tau between attention and saliency, gradient x input" in text  # review 8 C5
    assert "does better" not in text and "tracks token importance" not in text and "0.25" not in text
    # above chance without paired tests: rollout's higher mean against gradient x input is not called better
    text = finding("attribution", s)
    assert "does better" not in text and "tracks token importance" not in text
    assert ("Attention rollout is not shown to do better than raw last-layer attention: gradient x input (tau 0.25 "
            "against raw 0.16; no paired test)") in text


def test_circuits_below_chance_says_below_chance_in_its_refusal():
    below = {**AT_CHANCE, "below_chance": True, "mean": -12.0, "ci": [-12.7, -11.4], "task": "swapped"}
    text = finding("circuits", {"dla_final_logit": -12.0, "dla_top_components": {"a0.h2": -11.0}, "chance": below})
    assert ("ranks no writer and the circuit's faithfulness is not reported: below chance the model's behaviour is a "
            "preference for the wrong answers, not the task's.") in text
    assert "at chance" not in text and "a0.h2" not in text


def test_a_correlation_over_mostly_zero_cells_rests_on_its_non_zero_cells_without_an_interval():
    s = {"metric": "logit_diff", "normalized": False, "n_examples": 8, "clean_metric": 12.3, "corrupted_metric": -12.3,
         "top_sites": {}, "attribution_correlation": {
             "attn_out": {"n": 96, "n_nonzero": 3, "pearson": 0.99996, "pearson_without_top": 0.985, "spearman": 0.774},
             "head_out": {"n": 12, "n_nonzero": 4, "pearson": 0.9986, "spearman": 0.979, "slope": 0.15}}}
    text = finding("patching", s)
    assert ("attn_out r = 1.000 rests on its 3 non-zero cells of 96 (Spearman 0.77 over all 96 cells, 93 of them tied "
            "at zero; no interval for r or the slope: the other 93 cells have no exact effect)") in text
    assert ("head_out r = 0.999 rests on its 4 non-zero cells of 12 (Spearman 0.98 over all 12 cells, 8 of them tied at "
            "zero; slope 0.15, attribution over exact; no interval for r or the slope: the other 8 cells have no exact "
            "effect)") in text  # 4 < 12 / 2
    assert "CI" not in text and "n = 96 cells" not in text
    s["attribution_correlation"] = {"attn_out": {"n": 30, "n_nonzero": 20, "pearson": 0.95, "spearman": 0.9}}
    # 20 of 30 non-zero: Fisher z over the 30 cells, tanh(atanh(0.95) -+ 1.96 / sqrt(27)) = [0.897, 0.976]
    assert "attn_out r = 0.950 (n = 30 cells, 95% CI [0.897, 0.976])" in finding("patching", s)


def test_prunable_heads_and_answer_promoting_updates_say_their_n():
    assert ("18 of 32 heads (56%) can be removed staying no more than 1% below the unpruned logit difference "
            "(over 64 examples)") in \
        finding("heads", HEADS)
    mlp = {"answer_promoted_fraction": 0.975, "chance": {"at_chance": False, "n_examples": 16}}
    assert "98% of the top task updates (on 16 task examples) promote the answer token." in finding("mlp", mlp)
    # 39 of 40: Wilson 95% CI 0.871-0.996
    assert "39 of 40 top task updates (98%, Wilson 95% CI 87%-100%) promote the answer token." in finding(
        "mlp", {**mlp, "n_task_updates": 40})


def test_answer_promoting_updates_are_set_against_the_wrong_answer():
    # review 8a A2: "143 of 240 top task updates (60%) promote the answer token" had no baseline: 94 of the 143
    # also hold the wrong answer in their top 5. Counts of that run; Wilson closed form, exact binomial sign test.
    from scipy.stats import binomtest

    s = {"answer_promoted_fraction": 143 / 240, "n_task_updates": 240, "n_task_updates_promoting": 143,
         "n_task_updates_answer_only": 49, "n_task_updates_wrong_only": 15, "n_task_updates_both": 94,
         "top_k_tokens": 5, "n_top_updates": 5, "n_task_examples": 16, "chance": {"at_chance": False, "n_examples": 16}}
    text = finding("mlp", s)
    # 49 / 240: Wilson 0.158-0.259; 15 / 240: 0.038-0.101; sign test 2 * P(X >= 49 | 64, 1/2) = 2.4e-5
    assert binomtest(49, 64).pvalue == pytest.approx(2.44e-5, rel=0.01)
    assert ("Of the 240 largest task updates, 49 (20%, Wilson 95% CI 16%-26%) put the answer and not the wrong answer "
            "among their top 5 promoted tokens, 15 (6%, Wilson 95% CI 4%-10%) the reverse, 94 both (49 against 15: "
            "more single out the answer, exact two-sided sign test, p < 0.001).") in text, text
    assert "143 of 240" not in text and "intervals and the test treat them as independent" in text
    # 20 against 14 of 40: 2 * P(X >= 20 | 34, 1/2) = 0.392, no side singled out
    even = finding("mlp", {**s, "n_task_updates": 40, "n_task_updates_promoting": 26, "answer_promoted_fraction": 26 / 40,
                           "n_task_updates_answer_only": 20, "n_task_updates_wrong_only": 14, "n_task_updates_both": 6})
    assert binomtest(20, 34).pvalue == pytest.approx(0.392, abs=1e-3)
    assert "(20 against 14: neither is singled out more often, exact two-sided sign test, p = 0.39)" in even, even
    # no wrong answers (the counts are None): today's wording
    none = {**s, "n_task_updates_answer_only": None, "n_task_updates_wrong_only": None, "n_task_updates_both": None}
    assert "143 of 240 top task updates (60%, Wilson 95% CI 53%-66%) promote the answer token." in finding("mlp", none)


def _prunable(key: str, heads: float, low: float, high: float, n: int = 16) -> dict:
    return {f"max_fraction_prunable_{key}": heads / 12, f"heads_prunable_{key}": heads,
            f"prunable_ci_{key}": {"heads": heads, "fraction": heads / 12, "interval_heads": [low, high], "level": 0.95,
                                   "n_examples": n, "n_boot": 1000, "method": "percentile bootstrap over examples"}}


def test_a_logprob_count_states_its_band_in_nats_from_the_span_from_chance():
    """Review 11b A6: unpruned -0.007 against chance -11.4: the band is 1% of the span, 0.114 nats, and the
    finding says so in the metric's units; its line and shapes too, never "% of unpruned" (-1.3e+03%)."""
    band = 0.01 * 11.393
    tol = {"tolerance": 0.01, "basis": "span", "chance": -11.4, "unpruned": -0.007, "band": band}
    s = {"metric": "logprob", "baseline_metric": -0.007, "n_examples": 16, "n_heads": 16, "pruning_tolerance": tol,
         **_prunable("ablation", 6, 4, 6), **_prunable("gradient", 0, 0, 0)}
    s["max_fraction_prunable_ablation"], s["max_fraction_prunable_gradient"] = 6 / 16, 0.0
    s["prunable_ci_gradient"]["line"] = {"n_pruned": 2, "past": True, "metric": -0.0968, "line": -0.007 - band,
                                         "tolerance": 0.01, "change": -0.0898, "change_low": -0.207,
                                         "change_high": 0.0278, "on_the_line": True}
    s["pruning_shape_ablation"] = {"tolerance": 0.01, "band": band, "basis": "span",
                                   "first_below": {"n_pruned": 8, "metric": -0.25, "change": -0.243,
                                                   "change_rel": -0.243 / 11.393},
                                   "back_within": {"n_pruned": 10, "metric": -0.05, "change": -0.043,
                                                   "change_rel": -0.043 / 11.393, "points": 1, "first": 10}}
    text = finding("heads", s)
    assert ("6 of 16 heads (38%, 95% bootstrap interval 4-6 heads, over 16 examples) can be removed staying no more "
            "than 0.114 nats below the unpruned answer log-probability (1% of the span from chance to unpruned, -0.007 - "
            "(-11.4) = 11.39 nats, where chance, -11.4 nats, is a uniform guess over the vocabulary, k log(1/V) for V "
            "tokens and the answer's k tokens: a log-probability's 0 is its ceiling, not a scale) when ordered by "
            "ablation.") in text  # an older summary: no vocabulary size recorded
    assert "Other orderings (heads removed before each curve first falls more than 0.114 nats below unpruned)" in text
    assert ("Close to the 0.114-nat line: gradient (a first step: -0.0898, -0.79% of the span from chance, paired 95% "
            "CI -0.207 to +0.0278, reaches back to the line 0.114 nats below unpruned)") in text
    assert "leaves the 0.114-nat band at 8 heads removed (-2.1% of the span from chance)" in text
    assert "% of unpruned" not in text and "1% line" not in text and "1% below" not in text


def test_the_logprob_tolerance_sentence_gives_the_numbers_to_recompute_its_line():
    """#34 mends: the line is a share of the span from chance, chance = k log(1/V). With V = 89 and one answer token,
    log(1/89) = -4.48864, the span from -0.007 is 4.48164 nats and 1% of it 0.0448 nats (hand-worked); the sentence
    names V, k, chance, the span and the share. Two answer tokens over V = 1,000: 2 log(1/1000) = -13.8155."""
    import math

    from headscope.analyses.heads.pruning import tolerance_record
    from headscope.reports.pruning_words import band_words

    tol = tolerance_record(-0.007, 0.01, -math.log(89), vocab=89)
    assert tol["vocab"] == 89 and tol["answer_tokens"] == 1.0 and tol["band"] == pytest.approx(0.0448164, abs=1e-7)
    said = band_words({"pruning_tolerance": tol}, full=True)
    assert said == ("0.0448 nats below unpruned (1% of the span from chance to unpruned, -0.007 - (-4.489) = 4.482 "
                    "nats, where chance is a uniform guess over the vocabulary's V = 89 tokens, k log(1/V) = 1 x "
                    "log(1/89) = -4.489 nats for k = 1 answer token: a log-probability's 0 is its ceiling, not a scale)")
    two = tolerance_record(-0.5, 0.05, -2 * math.log(1000), vocab=1000)
    assert two["answer_tokens"] == 2.0 and two["band"] == pytest.approx(0.05 * 13.3155106, abs=1e-6)
    assert ("0.666 nats below unpruned (5% of the span from chance to unpruned, -0.5 - (-13.82) = 13.32 nats, where "
            "chance is a uniform guess over the vocabulary's V = 1,000 tokens, k log(1/V) = 2 x log(1/1,000) = -13.82 "
            "nats for k = 2 answer tokens on average") in band_words({"pruning_tolerance": two}, full=True)
    assert "vocab" not in tolerance_record(2.5, 0.01, None, vocab=89)  # no chance: nothing to say about V


def test_prunable_heads_carry_their_bootstrap_interval_and_an_interval_at_zero_is_no_finding():
    """#34: each prunable count says its 95% bootstrap interval and n; a count whose interval reaches 0
    heads, or a count of 0, is not worded as heads that can be removed."""
    base = {"metric": "logit_diff", "baseline_metric": 3.2, "n_examples": 16, "n_heads": 12}
    s = {**base, **_prunable("ablation", 6, 4, 7), **_prunable("gradient", 2, 0, 3), **_prunable("random", 1.5, 0.5, 2.5)}
    text = finding("heads", s)
    assert ("6 of 12 heads (50%, 95% bootstrap interval 4-7 heads, over 16 examples) can be removed staying no more than "
            "1% below the "
            "unpruned logit difference when ordered by ablation.") in text
    assert ("Other orderings (heads removed before each curve first falls more than 1% below unpruned): gradient 17% (0-3 heads, "
            "reaching none), random 12% (mean over seeds; each seed's count is not recorded, so no interval).") in text
    assert "0.5-2.5" not in text  # a bootstrap of the seeds' mean: no count of heads, and it leaves out the seed spread
    weak = finding("heads", {**base, **_prunable("gradient", 2, 0, 3), **_prunable("ablation", 1, 0, 2)})
    assert ("Ordered by gradient, 2 of 12 heads (17%) stay no more than 1% below the unpruned logit difference, but the 95% "
            "bootstrap interval (0-3 heads, over 16 examples) reaches none: this is no evidence") in weak
    assert "can be removed" not in weak
    none = finding("heads", {**base, **_prunable("gradient", 0, 0, 0), **_prunable("ablation", 0, 0, 1)})
    assert ("No ordering removes a single step of heads staying no more than 1% below the unpruned logit difference "
            "(over 16 examples)") in none
    assert "can be removed" not in none and "0 of 12" not in none


def test_prunable_counts_on_their_line_are_unstable_and_random_is_given_seed_by_seed():
    """Review 5 A2/C2: the Phi-3 run's "gradient 0% (0-0 heads)" rested on a first step just past the line whose
    paired interval reaches back over it, B's "9 of 12" on a point 0.001% past it, and "random 8% (0.5-1 heads)"
    was a bootstrap of the mean of 2 seeds that counted 2 and 0 heads: each is said as it is. Review 10b A3: the
    point is named with its change from unpruned and that change's paired 95% interval (the line moves with the
    examples), and a count whose bootstrap interval is one value ("0-0") is said to be close to the line, not
    fragile in the same breath."""
    base = {"metric": "logit_diff", "baseline_metric": 9.94, "n_examples": 16, "n_heads": 12}
    line = {"n_pruned": 10, "past": True, "metric": 9.8405, "line": 9.8406, "tolerance": 0.01, "change": -0.0995,
            "change_low": -0.66, "change_high": 0.46, "half_width": 0.56, "distance_rel": -1e-05, "margin_rel": 0.056,
            "n_examples": 16, "on_the_line": True}
    first = {**line, "n_pruned": 1, "metric": 9.777, "change": -0.163, "change_low": -0.236, "change_high": -0.09,
             "half_width": 0.073, "distance_rel": -0.0064, "margin_rel": 0.0073}
    s = {**base, **_prunable("ablation", 9, 9, 11), **_prunable("gradient", 0, 0, 0), **_prunable("random", 1, 0.5, 1)}
    s["prunable_ci_ablation"]["line"] = line
    s["prunable_ci_gradient"]["line"] = first
    s["prunable_ci_random"].update(per_seed_heads=[2.0, 0.0], seeds=[0, 1])
    text = finding("heads", s)
    assert ("9 of 12 heads (75%, 95% bootstrap interval 9-11 heads, over 16 examples) can be removed staying no more than "
            "1% below the unpruned logit difference when ordered by ablation.") in text
    assert "gradient 0% (0 heads, a single value)," in text
    assert ("On the 1% line, so fragile (another sample of examples could move the count): ablation (the step to 10 "
            "heads removed: -0.0995, -1% of unpruned, paired 95% CI -0.66 to +0.46, reaches back to the line 1% below "
            "unpruned).") in text
    assert ("Close to the 1% line: gradient (a first step: -0.163, -1.6% of unpruned, paired 95% CI -0.236 to -0.09, "
            "reaches back to the line 1% below unpruned); the count's 95% bootstrap interval is a single value") in text
    assert "A point's interval is the paired 95% t interval over examples of its change from the unpruned metric" in text
    assert "noise margin" not in text and "standard error over examples" not in text
    assert "random 8% (2 and 0 heads over 2 random orders; too few seeds for an interval)" in text
    assert "0.5-1" not in text
    s["prunable_ci_random"].update(per_seed_heads=[0.0, 1.0, 2.0, 1.0], seeds=[0, 1, 2, 3])  # review 8b C4
    assert ("random 8% (0, 1, 2 and 1 heads, range 0-2 over 4 random orders; too few seeds for an interval)"
            in finding("heads", s))
    # off the line (a paired interval clear of the line is recorded as on_the_line False): no such words
    s["prunable_ci_gradient"]["line"] = {**first, "change_high": -0.12, "on_the_line": False}
    off = finding("heads", s)
    assert "gradient 0% (0 heads, a single value)" in off and "gradient (a first step" not in off and "fragile" in off
    assert "Close to the 1% line" not in off
    # a record from before review 10b A3 (its margin the level's standard error, no paired interval): not said
    s["prunable_ci_ablation"]["line"] = {k: v for k, v in line.items() if not k.startswith("change")}
    assert "fragile" not in finding("heads", s)
    # every count 0, the first steps on the line: the "no ordering" sentence is followed by what the 0 depends on
    none = {**base, **_prunable("gradient", 0, 0, 1), **_prunable("ablation", 0, 0, 0)}
    none["prunable_ci_gradient"]["line"] = first
    assert ("the first step already falls below the floor. On the 1% line, so fragile (another sample of examples could "
            "move the count): gradient (a first step: -0.163") in finding("heads", none)
    # the default report's case: orderings with one deciding point are said together, once
    both = {**base, **_prunable("ablation", 9, 9, 11), **_prunable("ablation_recompute", 9, 9, 11)}
    both["prunable_ci_ablation"]["line"] = both["prunable_ci_ablation_recompute"]["line"] = line
    text = finding("heads", both)
    assert ("fragile (another sample of examples could move the count): ablation and ablation recomputed (the step to "
            "10 heads removed: -0.0995, -1% of unpruned, paired 95% CI -0.66 to +0.46, reaches back to the line 1% "
            "below unpruned).") in text
    assert text.count("-0.0995") == 1
    # random leads (every fixed order drops at once): its mean is said as an average with each seed's count
    lead = {**base, **_prunable("gradient", 0, 0, 0), **_prunable("random", 1, 0.5, 1)}
    lead["prunable_ci_random"].update(per_seed_heads=[2.0, 0.0], seeds=[0, 1])
    assert ("Ordered at random, 1 of 12 heads (8%) stay no more than 1% below the unpruned logit difference on average (2 and 0 "
            "heads over 2 random orders; too few seeds for an interval).") in finding("heads", lead)


def test_patching_names_no_token_where_the_prompts_differ():
    """#34: patching's token column is "" where the prompts have different tokens at a position (mixed
    lengths, left padding): the finding says so instead of quoting an empty token."""
    summary = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 6,
               "clean_metric": 2.0, "corrupted_metric": -2.0,
               "top_sites": {"resid_pre": [{"layer": 0, "head": None, "pos": 20, "token": "", "effect": 2.0}]}}
    text = finding("patching", summary)
    assert "resid_pre at layer 0, position 20 (its token differs across prompts): 0.50 of the clean-corrupted gap" in text


def test_third_review_cases_say_what_the_data_can_support():
    """The third review (a GPT-NeoX model and pet-name task nobody built for): patching named padded positions
    the figures do not show; position at chance called a flat curve evidence about position; a negative
    selectivity was read as memorising; one L0 strength was stated as how few heads suffice."""
    patching = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 8,
                "clean_metric": 2.0, "corrupted_metric": -2.0,
                "top_sites": {"resid_pre": [{"layer": 0, "head": None, "pos": 7, "from_end": -3, "token": "",
                                             "effect": 3.0}]}}
    text = finding("patching", patching)
    assert "resid_pre at layer 0, position -3 from the end (its token differs across prompts)" in text
    assert "position 7" not in text
    patching["top_sites"]["resid_pre"][0]["token"] = "7:  is"  # the padded frame's "i: " is not this axis's index
    assert "position -3 from the end (' is'): " in finding("patching", patching) and "7:" not in finding("patching", patching)
    position = {"primary_metric": "accuracy", "n_examples": 4, "chance": {**AT_CHANCE, "metric": "accuracy"},
                "metric_per_position": {"accuracy": {"1": 0.0, "2": 0.0, "3": 0.0, "4": 0.0}}}
    text = finding("position", position)
    assert "flat at the model's floor (0.00-0.00 over 4 gold positions)" in text and "says nothing about position" in text
    assert "makes no measurable difference" not in text
    probes = {"metric": "accuracy", "labels": "answer", "best_layer": 1, "best_accuracy": 0.54,
              "majority_baseline": 0.25, "best_selectivity": -0.09, "best_control": 0.63}
    text = finding("probes", probes)
    assert "below 0 the control task (random labels per word type) is easier to fit" in text
    assert "memorises rather than reads" not in text
    heads = {**HEADS, "l0_min_heads_within_tolerance": 12, "l0_lambdas": [0.03]}
    text = finding("heads", heads)
    assert "L0 gates were trained at one strength only (lambda 0.03)" in text and "within tolerance with" not in text
    assert "L0 gates keep the metric within tolerance with 12 heads" in finding("heads", {**heads, "l0_lambdas": [0.01, 0.1]})
    above = {"at_chance": False, "metric": "logit_diff", "mean": 9.14, "chance_value": 0.0, "ci": [8.30, 9.99]}
    assert "Unpruned logit difference is 9.14 (95% CI [8.3, 9.99]) over 16 examples." in finding(
        "heads", {**HEADS, "baseline_metric": 9.14, "n_examples": 16, "chance": above})


def test_attribution_means_and_intervals_count_only_examples_with_a_defined_tau():
    """The third review: one of 4 prompts had too few tokens to rank, so its taus are NaN; the mean and its t
    interval are over the 3 defined ones: 0.733 -+ t(0.975, 2) = 4.303 x 0.231 / sqrt(3) = [0.16, 1.00] (capped)."""
    s = {"n_examples": 4, "mean_tau_attention_loo": 0.733, "std_tau_attention_loo": 0.231, "n_tau_attention_loo": 3}
    text = finding("attribution", s)
    assert "Over 4 examples (1 without a defined tau: too few tokens to rank, so the means and intervals are over 3)" in text
    assert "leave-one-out at mean Kendall tau 0.73, 95% CI [0.16, 1.00]" in text


def test_attribution_says_each_methods_own_n_and_why_its_tau_is_missing():
    """Review 11a A2: leave-one-out scored every token 0 on 2 of 4 examples (bfloat16 1-cosine), saliency and gradient
    x input have taus on all 4: each mean states its own n, and the reason is the tied scores, not "too few tokens
    to rank". leave-one-out 0.36 -+ t(0.975, 1) = 12.706 x 0.1 / sqrt(2) = [-0.54, 1.00] (capped)."""
    s = {"n_examples": 4, "mean_tau_attention_saliency": 0.2, "std_tau_attention_saliency": 0.1,
         "n_tau_attention_saliency": 4, "mean_tau_attention_loo": 0.36, "std_tau_attention_loo": 0.1,
         "n_tau_attention_loo": 2, "n_tied_scores_loo": 2, "n_tied_scores_saliency": 0}
    text = finding("attribution", s)
    assert ("Over 4 examples, last-layer attention agrees with saliency at mean Kendall tau 0.20, 95% CI [0.04, 0.36], "
            "leave-one-out at mean Kendall tau 0.36 over 2 of 4 examples, 95% CI [-0.54, 1.00]. Leave-one-out has no "
            "tau on 2 of the 4 examples: it gives every token the same score on 2.") in text
    assert "too few tokens" not in text and "means and intervals are over" not in text
    # 3 missing, 2 of them tied; uniform last-layer attention on some example: the third's reason is either
    text = finding("attribution", {**s, "n_tau_attention_loo": 1, "n_tied_scores_attention": 1})
    assert ("Leave-one-out has no tau on 3 of the 4 examples: it gives every token the same score on 2; on the other "
            "1, last-layer attention gives every token the same weight or there are too few tokens to rank.") in text


def _dla_summary(values: dict, dtype=None) -> dict:
    """dla_summary over a hand-made dla table: {component: (kind, [contribution per example])}, in `dtype`
    (None: float32)."""
    import pandas as pd
    import torch

    from headscope.analyses.circuits.analysis import dla_summary

    dla = pd.DataFrame([{"example": e, "component": c, "kind": k, "layer": 0, "head": None, "contribution": x}
                        for c, (k, xs) in values.items() for e, x in enumerate(xs)])
    logits = pd.DataFrame({"example": range(4), "final_logit": dla.groupby("example").contribution.sum().to_numpy()})
    return {**dla_summary(dla, logits, "answer - wrong_answer", 5, dtype=dtype or torch.float32), "n_examples": 4}


def test_dla_writers_carry_intervals_and_ties_are_not_ranked():
    # t(0.975, 3) = 3.1824; mlp1 [2, 4, 2, 4]: mean 3, sd sqrt(4/3), half 3.1824 x 1.1547 / 2 = 1.837
    # mlp2 [3.6, 2.2, 3.6, 2.2]: 2.9, sd 0.8083, half 1.286; paired mlp1 - mlp2 [-1.6, 1.8, -1.6, 1.8]: 0.1,
    # sd 1.963, half 3.124 (contains 0: tied); a0.h1 [-1, -1.2, ...]: -1.1, half 0.184; |mlp1| - |a0.h1| = mlp1 +
    # a0.h1 [1, 2.8, 1, 2.8]: 1.9, sd 1.039, half 1.654 -> [0.25, 3.55] (excludes 0: not tied with the top)
    s = _dla_summary({"mlp1": ("mlp", [2, 4, 2, 4]), "mlp2": ("mlp", [3.6, 2.2, 3.6, 2.2]),
                      "a0.h1": ("head", [-1, -1.2, -1, -1.2]), "embed": ("embed", [0.1] * 4)})
    top = s["dla_top_intervals"]["mlp1"]
    assert top["n"] == 4 and top["mean"] == pytest.approx(3.0) and top["ci"] == pytest.approx([1.1626, 4.8374], abs=1e-4)
    pair = {(d["a"], d["b"]): d for d in s["dla_top_differences"]}
    assert pair["mlp1", "mlp2"]["tied"] is True and pair["mlp1", "mlp2"]["ci"] == pytest.approx([-3.0236, 3.2236], abs=1e-4)
    assert pair["mlp1", "a0.h1"]["tied"] is False and pair["mlp1", "a0.h1"]["difference"] == pytest.approx(1.9)
    text = finding("circuits", s)
    assert ("Direct logit attribution (mean and 95% t interval over 4 examples): mlp1 and mlp2 write the most, tied "
            "within their per-example spread (mlp1 - mlp2 = +0.10, 95% CI [-3.02, 3.22]): mlp1 (+3.00, 95% CI "
            "[1.16, 4.84]), mlp2 (+2.90, 95% CI [1.61, 4.19]); then a0.h1 (-1.10, 95% CI [-1.28, -0.92]) of a final "
            "logit difference 4.9.") in text
    assert "largest writers" not in text
    # separated: mlp1 [3, 3.2, ...] - mlp2 [1.3, 1.1, ...] = [1.7, 2.1, ...]: 1.9, sd 0.2309, half 0.367 -> ranked;
    # |mlp2| - |a0.h1| = [0.3, -0.1, ...]: 0.1 +- 0.367 contains 0 -> those two are tied
    s = _dla_summary({"mlp1": ("mlp", [3, 3.2, 3, 3.2]), "mlp2": ("mlp", [1.3, 1.1, 1.3, 1.1]),
                      "a0.h1": ("head", [-1, -1.2, -1, -1.2]), "embed": ("embed", [0.1] * 4)})
    text = finding("circuits", s)
    assert ("the largest writers are mlp1 (+3.10, 95% CI [2.92, 3.28]), mlp2 (+1.20, 95% CI [1.02, 1.38]), a0.h1 "
            "(-1.10, 95% CI [-1.28, -0.92]) of a final logit difference 3.3. mlp1 writes more than mlp2 (mlp1 - mlp2 = "
            "+1.90, 95% CI [1.53, 2.27]). mlp2 and a0.h1 are tied within their per-example spread (|mlp2| - |a0.h1| = "
            "+0.10, 95% CI [-0.27, 0.47]).") in text
    at_chance = finding("circuits", {**s, "chance": AT_CHANCE})  # at chance: still no writer named
    assert "mlp1" not in at_chance and "ranks no writer" in at_chance


def test_patching_states_attribution_slope_and_says_rank_not_size_when_far_from_one():
    import numpy as np
    import pandas as pd

    from headscope.analyses.patching.attribution_patching import correlation_with_exact

    # exact 1..20, attribution 0.5 x exact + e with e = 0.1 x (+1, -1, -1, +1) repeated: e sums to 0 and is orthogonal
    # to x within every block of four, so least squares gives slope 0.5 exactly; SSR = 20 x 0.01 = 0.2, Sxx = 20 (20^2
    # - 1) / 12 = 665, se = sqrt(0.2 / 18 / 665) = 0.0040876, t(0.975, 18) = 2.1009: 0.5 -+ 0.0085877
    x = np.arange(1.0, 21.0)
    e = 0.1 * np.tile([1.0, -1.0, -1.0, 1.0], 5)
    exact = pd.DataFrame({"site_type": "resid_pre", "layer": 0, "head": None, "pos": range(20), "effect": x})
    _, corr = correlation_with_exact(exact, exact.assign(attribution=0.5 * x + e).drop(columns="effect"))
    assert corr["resid_pre"]["slope"] == pytest.approx(0.5) and corr["resid_pre"]["slope_n"] == 20
    assert corr["resid_pre"]["slope_ci"] == pytest.approx([0.5 - 0.0085877, 0.5 + 0.0085877], abs=1e-6)
    s = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 8, "clean_metric": 20.0,
         "corrupted_metric": 0.0, "attribution_correlation": corr,
         "top_sites": {"resid_pre": [{"layer": 0, "head": None, "pos": 19, "token": "", "effect": 20.0}]}}
    said = ("At resid_pre attribution patching's effects are about half the exact ones (least-squares slope 0.50 of "
            "attribution on exact, 95% CI [0.49, 0.51], n = 20 cells)")
    assert said + ": use it to rank, not to size." in finding("patching", s)
    noise = finding("patching", {**s, "gap_within_noise": {"reason": "its CI contains 0"}})  # no site ranked
    assert said + "." in noise and "rank, not to size" not in noise
    # slope 1 with the same residuals: 1 -+ 0.0086 contains 1, no scale error claimed
    _, same = correlation_with_exact(exact, exact.assign(attribution=x + e).drop(columns="effect"))
    assert ("At resid_pre its sizes are consistent with the exact size (least-squares slope 1.00 of attribution on "
            "exact, 95% CI [0.99, 1.01], n = 20 cells).") in finding("patching", {**s, "attribution_correlation": same})
    # r carried by one cell: its slope is that cell's too, so no size claim (the one-point sentence stands)
    one = {**corr["resid_pre"], "n": 60, "n_nonzero": 60, "pearson": 0.9, "pearson_without_top": 0.02}
    text = finding("patching", {**s, "attribution_correlation": {"resid_pre": one}})
    assert "rests on one point" in text and "least-squares" not in text and "see the per-site slopes" in text


def test_kv_budgets_count_evicting_prompts_and_say_grid_artefacts_and_gains():
    from headscope.analyses.kv.holding import holding_budgets
    from tests_support import hand_eviction_sweep

    s = {"metric": "logit_diff", "n_examples": 4, "metric_unevicted": 10.0, "n_sink": 4,
         "holding_budgets": holding_budgets(hand_eviction_sweep(), n_sink=4)}
    text = finding("kv", s)
    assert "over the prompts a budget evicts from; budgets on the grid 1, 2, 4, 8, 12" in text
    assert ("window from 2 positions (between 1 and 2 on this grid; a median 33% of each prompt's context; 4 of 4 "
            "prompts evict anything there; +0.5% (95% CI") in text
    # review 8b A3: sink window's +0.2% at 8 (10.05 and 9.99 over 2 prompts) has a 95% CI far wider than 1%
    ci = stats.ttest_1samp([0.5, -0.1], 0.0).confidence_interval(0.95)  # in %
    assert ("sink window not shown to hold (at 8: +0.2%, 95% CI "
            f"[{ci.low:+.1f}%, {ci.high:+.1f}%], per example -0.0100 to +0.0500 logits, n = 2: consistent with holding "
            "within 1%, "
            f"but the interval is {(ci.high - ci.low) / 2:.0f} times as wide as the band)") in text
    assert "sink window from" not in text and "keeps no recent token" not in text
    # the same policy with a narrow interval inside 1% at 8 (+0.2% and +0.3%) holds from there
    sweep = hand_eviction_sweep()
    at8 = (sweep.policy == "sink_window") & (sweep.budget == 8) & (sweep.context > 8)
    sweep.loc[at8, "metric"] = [10.02, 10.03]
    assert stats.ttest_1samp([0.2, 0.3], 0.0).confidence_interval(0.95).high < 1
    text8 = finding("kv", {**s, "holding_budgets": holding_budgets(sweep, n_sink=4)})
    assert "sink window from 8 positions (between 4 and 8 on this grid" in text8 and "2 of 4 prompts evict" in text8
    assert "With 4 sink positions, sink window keeps no recent token below budget 5" in text8
    # no policy holds, one is only consistent with holding: "not shown to stay", never "stays"
    wide = holding_budgets(_sweep_with_changes({"window": [-3.0, 3.0, -2.0, 2.4]}, None), n_sink=4)
    only = finding("kv", {**s, "holding_budgets": wide})
    assert "window not shown to hold (at 4: +0.1%, 95% CI" in only and "window from" not in only
    assert ("No policy is shown to stay within 1% at a budget that evicts something; window comes closest: at budget 4 it "
            "keeps 100.1% of the logit difference and is within 1% on average, but its 95% CI reaches past the band: not "
            "shown (+0.1% (95% CI") in only
    assert ("heavy hitters never (at 8, its largest budget that evicts, still more than 1% below the full cache: keeps "
            "90.0% of the full-cache value, -10.0%") in text
    # review 15d-v B2: each fall with its n and 95% CI (every prompt falls by exactly 1: intervals of width 0); review
    # 17a B2: budget 8's, said just before, not again
    assert ("n = 2); on average it falls 1.00 logits below the full cache at budget(s) 1, 2, 4 (their 95% CIs within "
            "[-1.00, -1.00], n = 2 to 4))") in text
    assert ("Window is better than the full cache by more than 1% at budget(s) 1: at 1, +7.5% (95% CI [+2.9%, +12.1%], "
            "per example +0.50 to +1.00 logits, n = 4).") in text
    assert "From budget 12 on, every prompt is kept whole" in text and "saves anything" not in text
    # an older summary (means only): "within 1%" is two-sided, +4.5% is not within
    old = {"metric_unevicted": 10.0, "metric_per_policy_budget": {"window": {"1": 10.45, "2": 10.05, "12": 10.0}}}
    assert "window from 2 positions" in finding("kv", old)


def test_kv_per_example_ranges_are_in_logits_never_shares_of_a_full_cache_value_near_0():
    """Review 10b C2: "per example -1421.9% to +232.2%" divided each prompt's change by its own full-cache logit
    difference, -4 to +0.05 on prompts the model gets wrong or nearly so. Here prompts of full-cache 8, 9, -4, 0.05
    change by -0.1, -0.2, +1, +0.55 logits (as shares: -1.3%, -2.2%, +25%, +1100%)."""
    import pandas as pd

    from headscope.analyses.kv.holding import holding_budgets

    full, evicted = [8.0, 9.0, -4.0, 0.05], [7.9, 8.8, -3.0, 0.6]
    rows = [{"policy": "full", "budget": 12, "example": e, "context": 12, "metric": v} for e, v in enumerate(full)]
    rows += [{"policy": "window", "budget": 4, "example": e, "context": 12, "metric": v} for e, v in enumerate(evicted)]
    hold = holding_budgets(pd.DataFrame(rows), n_sink=1)
    text = finding("kv", {"metric": "logit_diff", "n_examples": 4, "metric_unevicted": float(np.mean(full)),
                          "holding_budgets": hold})
    # review 15d-v B2: the full cache's mean, 3.26, has a 95% CI reaching 0 ([-6.7, +13.3]): no share of it, the change in
    # logits with its own interval (scipy's t over the 4 prompts' changes)
    assert stats.ttest_1samp(full, 0.0).confidence_interval(0.95).low < 0
    ci = stats.ttest_1samp(np.subtract(evicted, full), 0.0).confidence_interval(0.95)
    assert f"+0.31 logits (95% CI [{ci.low:+.2f}, {ci.high:+.2f}], per example -0.20 to +1.00, n = 4)" in text, text
    assert "1100" not in text and "per example -2.2%" not in text and "per example -1" not in text
    assert "of the logit difference" not in text and "% (95% CI" not in text
    # in nats for a log-probability, and an older summary's shares are not said at all
    nats = finding("kv", {"metric": "logprob", "n_examples": 4, "metric_unevicted": 3.26, "holding_budgets": hold})
    assert "per example -0.20 to +1.00, n = 4" in nats and "+0.31 nats (95% CI" in nats
    as_shares = json.loads(re.sub(r'"per_example_diff_(low|high)": [-0-9.e]+', r'"per_example_\1": 11.0', json.dumps(hold)))
    assert "per_example_diff" not in json.dumps(as_shares)
    older = finding("kv", {"metric": "logit_diff", "metric_unevicted": 3.26, "holding_budgets": as_shares})
    assert "per example" not in older and "n = 4" in older


def _sweep_with_changes(changes: dict[str, list[float]], hold_at: int | None = 8):
    """An eviction sweep by hand: 4 prompts of 12 context positions, full-cache metric 10 each; per policy the
    per-prompt change (in %) at budget 4 and, with hold_at, exactly the full value at that budget."""
    import pandas as pd

    rows = []
    for e in range(4):
        rows.append({"policy": "full", "budget": 12, "example": e, "context": 12, "metric": 10.0})
        for policy, pct in changes.items():
            rows.append({"policy": policy, "budget": 4, "example": e, "context": 12, "metric": 10.0 + pct[e] / 10})
            if hold_at is not None:
                rows.append({"policy": policy, "budget": hold_at, "example": e, "context": 12, "metric": 10.0})
    return pd.DataFrame(rows)


def test_kv_more_than_1_percent_only_where_the_interval_clears_it():
    """Review 7 A5: a policy above the full cache is "better by more than 1%" only where its 95% CI's lower
    bound clears +1% ([+1.3%, +1.9%]); [+0.2%, +2.6%] is higher, not clearly by more than 1%; [-1.2%, +3.6%]
    shows no gain, though every mean is above +1%. The intervals: scipy's one-sample t over the 4 prompts."""
    from headscope.analyses.kv.holding import holding_budgets

    changes = {"window": [0.5, 1.1, 1.7, 2.3], "sink_window": [1.4, 1.5, 1.7, 1.8], "heavy_hitters": [-0.6, 0.8, 1.6, 3.0]}
    hold = holding_budgets(_sweep_with_changes(changes), n_sink=4)
    text = finding("kv", {"metric": "logit_diff", "n_examples": 4, "metric_unevicted": 10.0, "n_sink": 4,
                          "holding_budgets": hold})

    def band(pct):  # per example: 3 decimals, 3 significant digits of the largest |change| (0.1 to 0.3 logits)
        ci = stats.ttest_1samp(pct, 0.0).confidence_interval(0.95)
        return (f"{np.mean(pct):+.1f}%, 95% CI [{ci.low:+.1f}%, {ci.high:+.1f}%], per example {min(pct) / 10:+.3f} to "
                f"{max(pct) / 10:+.3f} logits, n = 4"), ci

    (window, w_ci), (sink, s_ci), (heavy, h_ci) = (band(changes[p]) for p in changes)
    assert 0 < w_ci.low < 1 and s_ci.low > 1 and h_ci.low < 0 < 1 < min(np.mean(v) for v in changes.values())
    assert [hold["policies"][p]["above"][0]["clear_of"] for p in changes] == ["zero", "band", None]
    assert (f"Window is higher than the full cache at budget 4 ({window}): above it, but not clearly by more than "
            "1%.") in text
    assert ("Sink window is better than the full cache by more than 1% at budget(s) 4: at 4, "
            + sink.replace(", 95%", " (95%", 1) + ").") in text
    assert (f"Heavy hitters is more than 1% above the full cache on average at budget 4 ({heavy}), but its 95% CI "
            "reaches 0: no evidence that it is better.") in text
    assert text.count("by more than 1% at") == 1
    # the same rule below the full cache, where a policy never holds: its largest evicting budget's interval
    below = holding_budgets(_sweep_with_changes({"window": [-v for v in changes["window"]],
                                                 "sink_window": [-v for v in changes["heavy_hitters"]]}, None), n_sink=4)
    text = finding("kv", {"metric": "logit_diff", "n_examples": 4, "metric_unevicted": 10.0, "holding_budgets": below})
    # review 14bv B1: an interval that reaches into the band is no "never": not shown either way
    assert ("window not shown either way (at 4, its largest budget that evicts: keeps 98.6% of the full-cache value, "
            "-1.4% (95% CI") in text and "never" not in text
    assert ("n = 4); its 95% CI reaches inside the 1% band: below it, but not clearly by more than 1%, so whether it stays "
            "within 1% there cannot be told)") in text
    # sink window, the closest, is said in the headline, its interval once (review 15d C6)
    assert text.startswith("No policy is shown to stay within 1% at a budget that evicts something; sink window comes "
                           "closest: at budget 4 it keeps 98.8% of the logit difference and lies below the full cache on "
                           "average, but its 95% CI reaches 0 and covers the whole +-1% band: not clearly below it at "
                           "all (-1.2% (95% CI"), text
    assert "sink window not shown either way (at 4, its largest budget that evicts: as above)" in text


def test_kv_says_what_each_policy_keeps_and_evicts_in_the_runs_numbers():
    """Mends: the rule's generic words ("drops the middle") become this run's numbers, read from the summary's
    kept_split and context_range, at the budget the finding names for each policy (its largest that evicts, 8 here),
    hand-worked: 12 positions, budget 8, n_sink 4, H2O's split 4 + 4; prompts of 9 to 12 positions say a range; a
    heavy hitters that holds says its split at its holding budget."""
    from headscope.analyses.kv.holding import holding_budgets
    from tests_support import hand_heavy_hitters_sweep

    split = lambda first, recent, heavy: {"first": first, "recent": recent, "most_attended": heavy}  # noqa: E731
    kept = {"heavy_hitters": {"8": split(0, 4, 4), "2": split(0, 1, 1)}, "window": {"8": split(0, 8, 0)},
            "sink_window": {"8": split(4, 4, 0)}}
    s = {"metric": "logit_diff", "n_examples": 4, "metric_unevicted": 10.0, "n_sink": 4, "recent_share": 0.5,
         "holding_budgets": holding_budgets(hand_heavy_hitters_sweep(), n_sink=4), "kept_split": kept,
         "context_range": [12, 12]}
    text = finding("kv", s)
    # review 15d C6: every policy named at one budget on the same prompts: one sentence, the budget and span once
    assert text.endswith("Where a policy is not shown within the band, at budget 8 of the 12 positions (4 evicted): heavy "
                         "hitters keeps the 4 newest positions and the 4 older ones the context's queries attended to "
                         "most; sink window keeps the first 4 and the 4 newest positions, evicting those in the middle; "
                         "window keeps the 8 newest positions, evicting the oldest (the first token, a sink where there "
                         "is one, among them)."), text
    ranged = finding("kv", {**s, "context_range": [9, 12]})
    assert ("at budget 8 of each prompt's 9 to 12 positions (up to 4 evicted): heavy hitters keeps the 4 newest positions "
            "and") in ranged
    from headscope.reports.kv_policy_words import keeps_words

    assert keeps_words({**s, "context_range": [9, 12]}, "window", 8) == (
        "at budget 8 keeps the 8 newest positions and evicts the oldest of each prompt's 9 to 12 positions (up to 4)")
    from headscope.reports.kv_policy_words import _drops

    holds = {"policies": {"heavy_hitters": {"budget": 2, "at": {"budget": 2}}}}  # within the band at 2
    assert _drops(s, holds) == ("Heavy hitters is H2O's policy (the newest half of its budget, the rest the older "
                                "positions the context attended to most): at budget 2 it keeps the 1 newest position "
                                "and the 1 older one the context's queries attended to most and evicts the other 10 of "
                                "the 12.")
    assert "keeps and evicts" not in finding("kv", {k: v for k, v in s.items() if k != "kept_split"})  # older runs
    assert "keeps and evicts" not in finding("kv", {**s, "sliding_windows": {"0": 4}})  # counts per layer differ


def test_kv_states_heavy_hitters_split_and_what_a_missing_policy_evicts():
    """Review 13a A1: heavy hitters is H2O's (a recent window of half the budget beside the most attended positions);
    the finding states the split and, for a policy not shown within the band, what its rule evicts; the figure's
    legend names the split too (an older summary, run without the window, gets no split)."""
    import matplotlib.pyplot as plt

    from headscope.analyses.kv.holding import holding_budgets
    from headscope.reports.plots_kv import plot_eviction
    from tests_support import hand_heavy_hitters_sweep

    sweep = hand_heavy_hitters_sweep()
    s = {"metric": "logit_diff", "n_examples": 4, "metric_unevicted": 10.0, "n_sink": 4, "recent_share": 0.5,
         "holding_budgets": holding_budgets(sweep, n_sink=4)}
    text = finding("kv", s)
    assert text.endswith("Where a policy is not shown within the band, this is what its rule evicts: heavy hitters keeps "
                         "the newest half of its budget and, of the older positions, those the context's queries attended "
                         "to most, so it drops older positions little attended before the answer; sink window keeps the "
                         "first 4 and the newest positions, so it drops the middle; window drops the oldest positions "
                         "first (the first token, a sink where there is one, among them)."), text
    old = finding("kv", {**s, "recent_share": None})
    assert "newest half" not in old and ("heavy hitters keeps only the positions the context's queries attended to most, "
                                          "with no recent window (a run before headscope kept H2O's recent window): the "
                                          "newest positions, seen by the fewest queries, go first") in old, old
    assert "with no recent window: the newest positions" in finding("kv", {**s, "recent_share": 0.0})
    from headscope.reports.kv_policy_words import _drops

    holds = {"policies": {"heavy_hitters": {"budget": 4, "at": {"budget": 4}}}}  # within the band: its split alone
    assert _drops({"recent_share": 0.5}, holds) == ("Heavy hitters is H2O's policy (the newest half of its budget, the "
                                                    "rest the older positions the context attended to most).")
    assert _drops({"recent_share": 0.0}, holds) == "" == _drops({}, holds)
    ax = plot_eviction(sweep, metric="logit_diff", ax=plt.subplots()[1], recent_share=0.5)
    try:
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert "heavy hitters (H2O: newest 50%\n+ most attended rest)" in labels, labels
    finally:
        plt.close("all")


def test_kv_says_the_closest_budget_and_the_largest_budgets_fall_once():
    """Review 17a B2: the headline's closest policy sat above the full cache with a 95% CI reaching 0, and the finding
    said so twice ("heavy hitters comes closest: ... not clearly above it at all (+0.19 logits (95% CI [-0.99, +1.38]
    ..." and again "Heavy hitters is more than 1% above the full cache on average at budget 16 (+0.19 logits, 95% CI
    [-0.99, +1.38] ...): no evidence that it is better"); a policy's largest evicting budget was also said twice (in %
    and again in logits among its misses). By hand: 4 prompts of context 40, full cache 10; heavy hitters at 16 changes
    by +0.5, -0.1, +0.4, 0 (+2%, t interval by scipy), at 32 by -1, -1.2, -0.8, -1 (-10%); window -5 at both."""
    import pandas as pd

    from headscope.analyses.kv.holding import holding_budgets

    rows = [{"policy": "full", "budget": 41, "example": e, "context": 40, "metric": 10.0} for e in range(4)]
    for e, (a, b) in enumerate(zip([0.5, -0.1, 0.4, 0.0], [-1.0, -1.2, -0.8, -1.0])):
        rows += [{"policy": "heavy_hitters", "budget": 16, "example": e, "context": 40, "metric": 10 + a},
                 {"policy": "heavy_hitters", "budget": 32, "example": e, "context": 40, "metric": 10 + b},
                 {"policy": "window", "budget": 16, "example": e, "context": 40, "metric": 5.0},
                 {"policy": "window", "budget": 32, "example": e, "context": 40, "metric": 5.0}]
    hold = holding_budgets(pd.DataFrame(rows), n_sink=4)
    text = finding("kv", {"metric": "logit_diff", "metric_unevicted": 10.0, "n_sink": 4, "holding_budgets": hold})
    ci = stats.ttest_1samp([0.5, -0.1, 0.4, 0.0], 0.0).confidence_interval(0.95)  # logits; the change is / 10
    said = f"+2.0% (95% CI [{10 * ci.low:+.1f}%, {10 * ci.high:+.1f}%]"
    assert ("heavy hitters comes closest: at budget 16 it keeps 102.0% of the logit difference and lies above the full "
            "cache on average, but its 95% CI reaches 0") in text and text.count(said) == 1, text
    assert "no evidence that it is better" not in text and "closest at budget 16: as above" in text
    assert text.count("-10.0% (95% CI") == 1 and "1.00 logits below the full cache at budget 32" not in text
    assert ("window never (at 32, its largest budget that evicts, still more than 1% below the full cache: keeps 50.0% "
            "of the full-cache value, -50.0% (95% CI [-50.0%, -50.0%], per example -5.00 logits, n = 4); on "
            "average it falls 5.00 logits below the full cache at budget 16 (95% CI [-5.00, -5.00], n = 4))") in text


def test_kv_names_the_closest_budget_with_its_answers_and_never_says_none_saves_anything():
    """review 5 A3: heavy hitters keeps 98.8% of the logit difference and every answer from budget 1 but is not
    within 1% from any budget on; its curve is not monotone (budget 1 closer than 8)."""
    from headscope.analyses.kv.holding import holding_budgets
    from tests_support import hand_heavy_hitters_sweep

    s = {"metric": "logit_diff", "n_examples": 4, "metric_unevicted": 10.0, "n_sink": 4,
         "holding_budgets": holding_budgets(hand_heavy_hitters_sweep(), n_sink=4)}
    text = finding("kv", s)
    assert "saves anything" not in text
    # review 14bv B1: budget 1's interval [-1.4%, -0.97%] reaches into the band: not "never", not "No policy stays"
    assert ("No policy is shown to stay within 1% at a budget that evicts something; heavy hitters comes closest: at "
            "budget 1 it keeps 98.8% of the logit difference and lies below the full cache, but not clearly by more than 1% "
            "(-1.2% (95% CI [") in text
    assert "; it keeps every answer the full cache gets from budget 1 on. " in text
    assert text.count("-1.2% (95% CI") == 1  # review 15d C6: the closest budget's interval once, in the headline
    # review 15d-v B2: the falls with their n and the range of their 95% CIs: each prompt's change is the budget's mean
    # plus 10 x (-0.002, 0.001, 0, 0.001) logits, so every interval is the mean +- t(3) x sd / 2 (scipy by hand)
    half = stats.t.ppf(0.975, 3) * np.std([-0.02, 0.01, 0.0, 0.01], ddof=1) / 2
    assert ("heavy hitters not within from any budget on (closest at budget 1: as above; at 8, its largest budget that "
            "evicts, still more than 1% below the full cache: -1.9% (95% CI") in text
    # review 17a B2: budget 8's fall is said once, in its own clause, not again among the others
    assert ("; on average it falls 0.270 logits below the full cache at budget 2 (95% CI "
            f"[{-0.27 - half:.3f}, {-0.27 + half:.3f}], n = 4) and 0.460 below at 4 (95% CI [{-0.46 - half:.3f}, "
            f"{-0.46 + half:.3f}], n = 4); cannot tell at budget(s) 1 (its 95% CI reaches into the band); not monotone in "
            "the budget (budget 1 is closer than 8))") in text
    assert text.count("-1.9% (95% CI") == 1 and "0.190 logits" not in text
    assert ("window never (at 8, its largest budget that evicts, still more than 1% below the full cache: keeps 90.0% of "
            "the full-cache value, -10.0% (95% CI") in text and "3/4 answers correct (full cache 4/4)" in text
    # a policy within 1% at budget 4 only (not from one budget on) is not said to miss at every budget
    hold = s["holding_budgets"]
    e = hold["policies"]["heavy_hitters"]
    e.update(missed=[2, 8], every_evicting_missed=False, missed_rows=[r for r in e["missed_rows"] if r["budget"] != 4])
    assert ("on average it falls 0.270 logits below the full cache at budget 2 (95% CI "
            f"[{-0.27 - half:.3f}, {-0.27 + half:.3f}], n = 4); cannot tell at budget(s) 1") in finding("kv", s)
    # no answers recorded and no policy close: the closest is still named, with its size
    bare = holding_budgets(hand_heavy_hitters_sweep().drop(columns="correct"), n_sink=4)
    text = finding("kv", {**s, "holding_budgets": bare})
    assert "heavy hitters comes closest: at budget 1 it keeps 98.8% of the logit difference and lies below" in text
    assert "answers" not in text


def _kv_sweep(pct: dict[int, list[float]], wrong: dict[int, int] | None = None):
    """Heavy hitters by hand: 4 prompts of context 12, full-cache metric 10 and every answer correct; per budget each
    prompt's change (in %) and how many of the first prompts it answers wrongly."""
    import pandas as pd

    rows = [{"policy": "full", "budget": 12, "example": e, "context": 12, "metric": 10.0, "correct": True} for e in range(4)]
    rows += [{"policy": "heavy_hitters", "budget": b, "example": e, "context": 12, "metric": 10.0 + v[e] / 10,
              "correct": e >= (wrong or {}).get(b, 0)} for b, v in pct.items() for e in range(4)]
    return pd.DataFrame(rows)


def test_kv_says_how_far_past_the_band_each_budget_falls_and_which_budget_keeps_what():
    """Review 9a C1-C3: heavy hitters at -1.04% (budget 4) "missed the 1% tolerance by 1.0% to 24.1%" (the changes,
    not the distance past the band, 0.04 points) and "-1.0%" looked inside it; "keeps 99.0% ... from budget 2"
    attached budget 4's share to budget 2; on a yes/no task a constant guess gets 9/16, which the counts left out.
    Here: -24.1% at 2 (every answer kept), -1.04% at 4; 3 of the 4 prompts answer the commonest answer."""
    from headscope.analyses.kv.holding import holding_budgets

    at4 = [-0.5, -1.2, -1.5, -0.96]  # mean -1.04%
    hold = holding_budgets(_kv_sweep({1: [-50.0] * 4, 2: [-24.1] * 4, 4: at4}, wrong={1: 2}), n_sink=4,
                           answers=[7, 7, 9, 7])
    assert hold["constant_guess"] == {"correct": 3, "n_examples": 4, "n_answers": 2}
    text = finding("kv", {"metric": "logit_diff", "n_examples": 4, "metric_unevicted": 10.0, "holding_budgets": hold})
    ci = stats.ttest_1samp(at4, 0.0).confidence_interval(0.95)
    assert (f"(-1.04% (95% CI [{ci.low:+.1f}%, {ci.high:+.1f}%], per example "
            "-0.150 to -0.050 logits, n = 4); 4/4 answers correct (full cache 4/4; a constant guess of the commonest answer "
            "3/4)") in text
    # review 14bv B1: budget 4's interval reaches into the band: not missed, not "No policy stays"
    # review 15d-v B2: each fall with its n and 95% CI (each prompt falls by the same amount: intervals of width 0)
    assert ("on average it falls 5.00 logits below the full cache at budget 1 (95% CI [-5.00, -5.00], n = 4) and 2.41 below "
            "at 2 (95% CI [-2.41, -2.41], n = 4)") in text
    # review 15d C6: the headline first, with the closest budget's interval (once); the policy's clause refers to it
    assert text.startswith("No policy is shown to stay within 1% at a budget that evicts something; heavy hitters comes "
                           "closest: at budget 4 it keeps 98.96% of the logit difference and lies below the full cache, "
                           "but not clearly by more than 1% (-1.04% (95% CI") and text.count("-1.04% (95% CI") == 1
    assert "heavy hitters not shown either way (at 4, its largest budget that evicts: as above; " in text
    assert "; it keeps every answer the full cache gets from budget 2 on. " in text
    assert "misses" not in text and "99.0%" not in text and "-1.0% " not in text
    four = holding_budgets(_kv_sweep({4: at4}), n_sink=4, answers=[1, 2, 3, 7])
    assert "a constant guess of the commonest answer 1/4" in finding("kv", {"metric_unevicted": 10.0,
                                                                            "holding_budgets": four})  # 4 answers: few
    four["constant_guess"]["n_answers"] = 5  # a many-answer task (the lens's rule): the guess is no reference
    assert "a constant guess" not in finding("kv", {"metric_unevicted": 10.0, "holding_budgets": four})


def test_kv_a_bfloat16_bound_that_reaches_0_within_rounding_says_so():
    """Review 9a C4: in bfloat16, heavy hitters' interval "reaches 0" by +0.02%, inside one rounding step of the metric
    (the spacing of bfloat16 at 10 is 2^-7 x 8 = 0.0625, 0.625% of 10); in float32 the same bound is a verdict."""
    from headscope.analyses.kv.holding import holding_budgets

    pct = [-2.58, -3.58, -1.18, -0.78]
    ci = stats.ttest_1samp(pct, 0.0).confidence_interval(0.95)
    assert 0 < ci.high < 0.625 and np.mean(pct) < -1  # the premise, in %
    s = {"metric": "logit_diff", "n_examples": 4, "metric_unevicted": 10.0, "dtype": "bfloat16",
         "holding_budgets": holding_budgets(_kv_sweep({4: pct}), n_sink=4)}
    assert (f"its 95% CI reaches 0 (its upper end, {ci.high:+.2f}%, lies within one bfloat16 rounding step of the "
            "full-cache mean, 0.62% of it (the spacing of bfloat16 numbers at 10: 0.0625 logits): rounding alone can "
            "put it either side of 0): not clearly below it at all") in finding("kv", s)  # review 19v B2: its unit
    assert "rounding step" not in finding("kv", {**s, "dtype": "float32"})


def test_one_kv_head_for_all_query_heads_is_multi_query_and_fewer_is_grouped_query():
    assert attention_kind(71, 1) == "multi-query"  # Falcon-7B: 71 query heads read one KV head
    assert attention_kind(32, 8) == "grouped-query" and attention_kind(4.0, 2.0) == "grouped-query"  # Llama-3-8B
    for heads, kv in ((12, 12), (4, None), (None, 1), (4, 0), (2, 4)):  # multi-head, not recorded, nonsense
        assert attention_kind(heads, kv) is None, (heads, kv)


def test_kv_gqa_saving_is_the_share_saved_and_is_said_whenever_kv_heads_are_fewer():
    gqa = {"bytes_per_token": 768, "mha_bytes_per_token": 1536, "gqa_saving": 0.5, "n_heads": 4, "n_kv_heads": 2}
    assert ("Grouped-query attention (2 KV heads, each shared by 2 query heads) saves 50% of the cache against full "
            "multi-head attention: 768 B against 1.5 KiB per token.") in finding("kv", gqa)
    # one KV head is multi-query attention (review 9b C2: "Grouped-query attention (1 KV heads ...)")
    mqa = {**gqa, "bytes_per_token": 384, "gqa_saving": 0.75, "n_kv_heads": 1}
    assert ("Multi-query attention (1 KV head shared by 4 query heads) saves 75% of the cache against full multi-head "
            "attention: 384 B against 1.5 KiB per token.") in finding("kv", mqa)
    assert "Grouped-query" not in finding("kv", {**gqa, "mha_bytes_per_token": 768, "gqa_saving": 0.0, "n_kv_heads": 4})
    assert "saves 75% of the cache" in finding("kv", {"bytes_per_token": 1024, "mha_bytes_per_token": 4096})
    mqa = {"bytes_per_token": 384, "mha_bytes_per_token": 1536, "gqa_saving": 0.75, "n_heads": 4, "n_kv_heads": 1}
    assert ("Multi-query attention (1 KV head shared by 4 query heads) saves 75% of the cache against full multi-head "
            "attention: 384 B against 1.5 KiB per token.") in finding("kv", mqa)  # review 9b C2: not "1 KV heads"


def test_kv_first_key_standing_out_is_said_from_the_data():
    low = {"sink_key_norm_ratio_per_layer": {"0": 0.83, "1": 0.9}}
    assert "The first key's norm is 0.83 to 0.90 times the other keys' (per layer): the first key's norm does not stand out" \
        in finding("kv", low)
    high = {"sink_key_norm_ratio_per_layer": {"0": 3.0, "1": 1.2}}
    assert "norm stands out in layer(s) 0 only" in finding("kv", high)
    assert "sink keys stand out" not in caption("kv_norms")


def test_kv_normalised_keys_are_not_read_as_a_sink():
    """Review 7 A4: where every layer normalises its keys before caching (OLMo 2: one RMSNorm over both KV heads'
    32 entries, weight 1: every key's norm over its heads is sqrt(32) = 5.66), the ratio is not reported; where
    only some layers do, the ratio is given for the others alone."""
    ratios = {"sink_key_norm_ratio_per_layer": {"0": 1.0, "1": 2.4}}
    olmo = {"module": "k_norm", "kind": "Olmo2RMSNorm", "rms": True, "per_head": False, "dim": 32, "layers": [0, 1],
            "gain": [1.0, 1.0], "bounds": [32 ** 0.5, 32 ** 0.5]}
    text = finding("kv", {**ratios, "keys_normalised": True, "key_norm": olmo})
    # review 8 A1: a norm over all heads bounds a key's norm over its heads, not one head's share: the ratio stands
    assert ("The first key's norm is 1.00 to 2.40 times the other keys' (per layer): the first key's norm stands out in "
            "layer(s) 1 only. Keys are normalised over all KV heads together (k_norm, 32 entries) before caching: that "
            "bounds a key's norm over its heads, not one head's share of it, so the per-head ratio above can still show "
            "a sink.") in text
    assert "cannot mark a sink" not in text
    qwen = {**olmo, "kind": "Qwen3RMSNorm", "per_head": True, "dim": 16, "gain": [0.96, 1.43], "bounds": [3.86, 5.71],
            "measured": [4.09, 4.98]}
    text = finding("kv", {**ratios, "keys_normalised": True, "key_norm": qwen})
    assert ("Keys are RMS-normalised per head (k_norm) before caching, so their norms are set by the norm's weight, not "
            "by the key's input (here 3.86-5.71: sqrt(16) x its |weight| 0.96-1.43; mean norms over prompts per head and "
            "position 4.09-4.98; smaller only for a key near zero against the norm's epsilon), and the first key's norm "
            "cannot mark a sink: not reported.") in text  # review 18v B1: an older summary's means, named as such
    assert "times the other keys'" not in text and "stands out" not in text
    gemma = finding("kv", {**ratios, "keys_normalised": True, "key_norm": {**qwen, "kind": "Gemma3RMSNorm"}})
    assert "sqrt(16) x its gain |1 + weight| 0.96-1.43;" in gemma  # review 11b C4: Gemma stores weight - 1
    some = finding("kv", {**ratios, "keys_normalised": False, "key_norm": {**olmo, "per_head": True, "layers": [0]}})
    assert ("The first key's norm is 2.40 times the other keys' (layer(s) 1; layer(s) 0 normalise their keys (k_norm) "
            "before caching, so their norms are fixed: not reported): the first key's norm stands out in every layer "
            "measured (1)") in some  # review 18d B2: layer 0 is not measured
    assert "The y axis starts at 0" in caption("kv_norms") and "not a sink" in caption("kv_norms")


PROBE = {"metric": "accuracy", "labels": "answer", "site": "resid_post", "n_examples": 19, "cv": 3,
         "majority_baseline": 0.21, "n_classes": 8, "best_layer": 0, "best_accuracy": 1.0, "best_correct": 19,
         "best_ci": [0.824, 1.0], "accuracy_per_layer": {"0": 1.0, "1": 1.0, "2": 1.0},
         "ci_per_layer": {"0": [0.824, 1.0], "1": [0.824, 1.0], "2": [0.824, 1.0]}}


def test_probes_give_the_majority_baseline_one_way_in_every_sentence():
    """Review 16b B3: 7 of 40 rows in the largest class gave "against a majority baseline of 0.17" in the opener and
    "against the majority baseline 0.175" in the Bonferroni sentence; 7/40 = 0.175 in both."""
    rate = 7 / 40
    entry = {"metric": "accuracy", "mean": 1.0, "chance_value": rate, "correction": "bonferroni", "n_compared": 3,
             "p_value": 1.6e-30, "p_value_uncorrected": 5.3e-31, "ci": [0.887, 1.0], "ci_level": 0.983,
             "at_chance": False, "n_examples": 40}
    text = finding("probes", {**PROBE, "n_examples": 40, "best_correct": 40, "majority_baseline": rate, "chance": entry})
    assert "against a majority baseline of 0.175, so these layers" in text, text
    assert "[0.887, 1] against the majority baseline 0.175)" in text and "0.17," not in text and "0.17)" not in text


def test_probes_name_a_best_layer_only_beyond_the_next_ones_interval():
    text = finding("probes", PROBE)
    # verify 11a: three layers at 1.00 (19 of 19) share the top; none "scores highest"
    assert ("No layer stands out for the answer probe (19 examples): layers 0, 1 and 2 (after blocks 0, 1 and 2) each "
            "score accuracy 1.00 (19 of 19 correct out of fold, 95% CI [0.82, 1.00]) against a majority baseline of "
            "0.21, so these layers cannot be told apart.") in text
    assert "best at" not in text and "highest" not in text
    two = {**PROBE, "accuracy_per_layer": {"0": 1.0, "1": 1.0, "2": 0.9},
           "ci_per_layer": {"0": [0.824, 1.0], "1": [0.824, 1.0], "2": [0.67, 0.98]}}
    assert ("layers 0 and 1 (after blocks 0 and 1) each score accuracy 1.00 (19 of 19 correct out of fold, 95% CI "
            "[0.82, 1.00]) against a majority baseline of 0.21; their intervals overlap layer 2's (accuracy 0.90, 95% CI "
            "[0.67, 0.98]), so these layers cannot be told apart.") in finding("probes", two)
    apart = {**PROBE, "accuracy_per_layer": {"0": 0.2, "1": 1.0, "2": 0.9}, "best_layer": 1,
             "ci_per_layer": {"0": [0.06, 0.44], "1": [0.824, 1.0], "2": [0.67, 0.98]}}
    assert "its interval overlaps layer 2's (accuracy 0.90, 95% CI [0.67, 0.98]), so the two" in finding("probes", apart)
    apart["ci_per_layer"]["2"] = [0.5, 0.8]
    assert "The answer probe is best at layer 1 (after block 1) with accuracy 1.00 (19 of 19" in finding("probes", apart)


def test_probes_tie_list_and_verdict_use_one_overlap_rule_and_count_token_positions():
    """Review 11a A4/C9 (out_minilm/probes/per_layer.csv): layer 0 R^2 0.9746 [0.9671, 0.9821] and layer 1 0.9668
    [0.9600, 0.9735] overlap (0.9735 >= 0.9671), layer 2's [0.9363, 0.9527] does not; the old words listed only
    the best ('layers 0 score 0.97'). The 816 examples are the token positions of 64 shipped sentences."""
    s = {"metric": "r2", "labels": "position", "site": "resid_post", "n_examples": 816, "example_unit": "examples",
         "shipped_text": {"n_sentences": 64}, "cv": 3, "best_layer": 0, "best_r2": 0.9746, "best_ci": [0.9671, 0.9821],
         "r2_per_layer": {"0": 0.9746, "1": 0.9668, "2": 0.9445},
         "ci_per_layer": {"0": [0.9671, 0.9821], "1": [0.9600, 0.9735], "2": [0.9363, 0.9527]}}
    text = finding("probes", s)
    assert text.startswith("No layer stands out for the position probe (816 token positions of 64 sentences): layer 0 "
                           "(after block 0) scores highest, R^2 0.975 (mean over 3 folds, 95% CI [0.967, 0.982]); its "
                           "interval overlaps layer 1's (R^2 0.967, 95% CI over 3 folds [0.960, 0.974]), so the two "
                           "cannot be told apart."), text
    assert "layer 2" not in text and "layers 0 score" not in text and "816 examples" not in text
    # the verdict follows the same rule: the runner-up by point (layer 1) clears the best's interval, but layer 2's
    # wider interval reaches it, so layer 2 is tied and nothing stands out
    wide = {**s, "r2_per_layer": {"0": 0.9, "1": 0.8, "2": 0.7},
            "ci_per_layer": {"0": [0.85, 0.95], "1": [0.75, 0.84], "2": [0.4, 0.9]}, "best_ci": [0.85, 0.95]}
    text = finding("probes", wide)
    assert "No layer stands out" in text and "overlaps layer 2's (R^2 0.70, 95% CI over 3 folds [0.40, 0.90])" in text
    assert "layer 1" not in text


def test_an_underpowered_probe_is_not_called_at_chance_and_states_one_accuracy():
    """out_trained_s1: 6 of 11 out of fold (0.545), 5 classes, exact CI [0.23, 0.83]; no 0.58 fold mean anywhere."""
    from headscope.analyses.core import chance

    s = {**PROBE, "n_examples": 11, "n_classes": 5, "majority_baseline": 0.273, "best_accuracy": 6 / 11,
         "best_correct": 6, "best_ci": [0.234, 0.833], "accuracy_per_layer": {"0": 6 / 11, "1": 6 / 11},
         "ci_per_layer": {"0": [0.234, 0.833], "1": [0.234, 0.833]}}
    s["chance"] = chance.from_summary(s)
    text = finding("probes", s)
    assert text.startswith("The probe cannot be told from chance with 11 examples (5 classes, about 2 per class): "
                           "accuracy 0.55 (6 of 11 correct out of fold, 95% CI [0.23, 0.83]) holds both the majority "
                           "baseline 0.273 and 0.637, halfway from it to perfect accuracy. The test is underpowered")
    assert "scores at chance" not in text and "0.58" not in text and "stands out" not in text and "best at" not in text
    tight = {**s, "n_examples": 400, "best_accuracy": 0.28, "best_correct": 112}
    tight["chance"] = chance.from_summary(tight)
    assert finding("probes", tight).startswith("The probe scores at chance")


def test_a_probe_verdict_on_the_best_layer_states_its_correction_and_how_close_it_is():
    """Review 15a B1 (float32: layer 1, 11 of 39 against a majority of 5/39; bfloat16: layer 0, 8 of 39): the verdict
    is Bonferroni-corrected over the 3 layers and the finding says so with both p-values (scipy binomtest by hand)."""
    from headscope.analyses.core import chance

    base = {**PROBE, "n_examples": 39, "n_scored": 39, "n_classes": 12, "majority_baseline": 5 / 39,
            "accuracy_per_layer": {"0": 9 / 39, "1": 11 / 39, "2": 10 / 39}, "best_layer": 1,
            "best_accuracy": 11 / 39, "best_correct": 11}
    ci = stats.binomtest(11, 39, p=5 / 39).proportion_ci(1 - 0.05 / 3, method="exact")
    p11, p8 = (2 * stats.binom.sf(k - 1, 39, 5 / 39) for k in (11, 8))  # central exact p: the upper tail doubled
    above = {**base, "chance": chance.from_summary(base)}
    assert ("The chance test takes the best of 3 layers, so it is Bonferroni-corrected for that choice (alpha 0.05/3; "
            f"its 98.3% exact interval [{ci.low:.3g}, {ci.high:.3g}] against the majority baseline 0.128): corrected p "
            f"= {3 * p11:.2g} (uncorrected {p11:.2g}), above chance, marginally (corrected p between "
            "0.01 and 0.05).") in finding("probes", above)
    low = {**base, "best_layer": 0, "best_accuracy": 8 / 39, "best_correct": 8,
           "accuracy_per_layer": {"0": 8 / 39, "1": 7 / 39, "2": 7 / 39}}
    low["chance"] = chance.from_summary(low)
    text = finding("probes", low)
    assert text.startswith("The probe scores at chance") and (
        "The chance test takes the best of 3 layers, so it is Bonferroni-corrected for that choice (alpha 0.05/3): "
        f"corrected p = {min(1, 3 * p8):.2g} (uncorrected {p8:.2g}), at chance.") in text


def test_probes_without_a_measurable_selectivity_do_not_sweep_by_it():
    why = "selectivity is not measurable here (the control task is degenerate), so no strength is picked by it"
    s = {**PROBE, "control_degenerate": "the control task has one label", "capacity": None, "capacity_skipped": why}
    text = finding("probes", s)
    assert f"No capacity sweep: {why}." in text and "most selective" not in text


UNTRAINED_CHANCE = {**AT_CHANCE, "task": "capitals", "mean": -0.0439, "ci": [-0.395, 0.307]}


def test_attribution_on_a_saturated_output_reads_the_logit_difference():
    """Hand-made logits with p(top) = 0.99988 (the review's trained model): the TVD cannot move, so the finding
    says the output is saturated and gives the permutation's effect in logits, with a t interval worked here."""
    import numpy as np
    import torch
    from scipy import stats

    from headscope.analyses.attribution.permutation import saturation

    logits = torch.zeros(16, 400, dtype=torch.float64)
    logits[:, 7] = float(np.log(0.99988 / 0.00012 * 399))  # the answer against 399 equal others: p = 0.99988
    top = logits.softmax(-1).max(-1).values
    changes = np.array([0.9, 0.4, 0.7, 0.8, 0.5, 0.6, 0.9, 0.7, 0.6, 0.8, 0.5, 0.7, 0.6, 0.8, 0.7, 0.6])  # logits
    s = {"n_examples": 16, "metric": "logit_diff", "output_change": "tvd", "permutation_layer": 2,
         "median_permutation_tvd": 7.36e-6, "n_permutations": 20, "mean_tau_attention_loo": 0.5,
         "std_tau_attention_loo": 0.1, "saturated": saturation(top.tolist()),
         "permutation_metric_change": float(changes.mean()), "permutation_metric_change_sd": float(changes.std(ddof=1)),
         "permutation_metric_change_n": 16, "adversarial_epsilon": 0.01, "median_adversarial_jsd": 0.385,
         "fraction_adversarial_near_ln2": 0.1, "adversarial_metric_change": -0.2, "adversarial_metric_change_sd": 0.1,
         "adversarial_metric_change_n": 16}
    assert s["saturated"]["share"] == 1.0 and s["saturated"]["median_headroom"] == pytest.approx(1.2e-4, rel=1e-2)
    text = finding("attribution", s)
    assert "barely moves" not in text and "does little for the prediction" not in text
    assert "reaches a median JSD" not in text
    assert "The output distribution is saturated: the top token has p >= 0.99 on 16 of 16 examples" in text
    assert "a small distance here does not show that the layer does little" in text  # review 14c A2: no "cannot"
    half = stats.t.ppf(0.975, 15) * changes.std(ddof=1) / 4
    assert (f"permuting layer 2's attention changes the logit difference by a mean of {changes.mean():+.3g}, 95% CI "
            f"[{changes.mean() - half:+.3g}, {changes.mean() + half:+.3g}] over 16 examples") in text
    assert "median JSD of 0.385 nats says nothing about faithfulness; that attention changes the logit difference" in text
    # leave-one-out (review 9a A5): a TVD too unless the summary says it fell back to the logit difference
    bound = f"{np.e * 1.2e-4:.2g}"
    assert (f"Leave-one-out is scored by the total variation distance too, which this saturated output keeps near 0 (at "
            f"most about {bound} per logit) unless a token's removal moves the answer's odds by a logit or more: its tau "
            "rests on a saturated distance and is not evidence of graded agreement.") in text
    for loo, said in (("tvd", "its tau rests on a saturated distance"),
                      ("logit_diff", "Leave-one-out is therefore scored by the absolute change of the logit difference")):
        assert said in finding("attribution", {**s, "loo_metric": loo}), loo
    assert "Leave-one-out is therefore" not in text
    unsaturated = {**s, "saturated": saturation([0.6] * 16), "median_permutation_tvd": 0.002,
                   "permutation_abs_metric_change": 0.05}
    assert "barely moves the output (median tvd 0.002): that layer's attention does little" in finding(
        "attribution", unsaturated)  # the old reading where the metric agrees
    text = finding("attribution", {**unsaturated, "permutation_abs_metric_change": 0.7})  # the metric moves: no "little"
    assert "barely moves the output distribution (median tvd 0.002), yet the task metric moves" in text
    assert "does little" not in text and "Leave-one-out is" not in text  # not saturated: no word on its metric
    # review 10b A4: 2 of 4 saturated is not most, yet their TVDs rank noise: leave-one-out follows the logit
    # difference (analysis.loo_metric on any saturated example) and the finding says on how many and why
    half = saturation([0.9999, 0.9995, 0.7, 0.6])
    assert half["is_saturated"] is False and half["n_saturated"] == 2
    text = finding("attribution", {**unsaturated, "saturated": half, "loo_metric": "logit_diff"})
    assert ("The top token has p >= 0.99 on 2 of 4 examples, where a distribution distance cannot move: leave-one-out "
            "is scored by the absolute change of the logit difference on every example.") in text, text
    assert "The output distribution is saturated" not in text


def test_attribution_at_chance_reports_what_was_measured_only():
    s = {"n_examples": 4, "mean_tau_attention_gradient": -0.3, "std_tau_attention_gradient": 0.25,
         "mean_tau_attention_loo": -0.47, "std_tau_attention_loo": 0.3, "fraction_significant": 0.125, "n_tau_tests": 16,
         "median_permutation_tvd": 0.000541, "permutation_layer": 2, "n_permutations": 20, "output_change": "tvd",
         "median_adversarial_jsd": 0.106, "adversarial_epsilon": 0.01, "fraction_adversarial_near_ln2": 0.0,
         "chance": UNTRAINED_CHANCE}
    text = finding("attribution", s)
    assert "relative findings are not reported. Measured over 4 examples: Kendall tau between attention" in text
    for said in ("-0.30", "Kendall tau -", "significant", "barely moves", "does little", "median JSD", "0.000541"):
        assert said not in text, said


def test_patching_at_chance_ranks_no_site_and_reads_no_correlation():
    s = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 8,
         "clean_metric": -0.0686, "corrupted_metric": -0.029, "chance": UNTRAINED_CHANCE,
         "top_sites": {"head_out": [{"layer": 1, "head": 2, "pos": -1, "token": "x", "effect": 0.02}]},
         "attribution_correlation": {"head_out": {"pearson": 1.0, "spearman": 1.0, "n": 12, "n_nonzero": 12},
                                     "resid_pre": {"pearson": 0.994, "spearman": 1.0, "n": 42, "n_nonzero": 5}}}
    text = finding("patching", s)
    assert "Clean prompts give a logit difference of -0.0686, corrupted ones -0.029." in text
    assert "Measured: exact activation patching (denoise, 8 examples) at head out and resid pre, and attribution patching " \
           "against it over 54 cells; no site is ranked and no agreement is read at chance." in text
    for said in ("r = ", "95% CI [1.000", "moves the metric most", "Next, at", "of the clean-corrupted gap"):
        assert said not in text, said


def test_patching_on_a_solved_task_with_answers_of_several_lengths_is_not_gated_at_chance():
    """Review 11b A1: 7 rows solved (log-probabilities near 0), one with a 7-token answer: the guard said "at chance"
    (the margins' t interval, stretched by the answer lengths) and patching reported no site. The guard's entry from
    the several-token path (chance._continuation_on_task on the rows' continuations), then the patching finding."""
    import math
    from types import SimpleNamespace

    import torch

    from headscope.analyses.core import chance

    logp = np.array([-0.0024, -0.0051, -0.0036, -0.0165, -0.0042, -0.0071, -0.0105])
    lengths = [1, 1, 1, 7, 1, 1, 1]
    continuation = torch.tensor([[-1] * (7 - k) + list(range(10, 10 + k)) for k in lengths])  # [7, 7], -1: none
    entry = chance._continuation_on_task(torch.tensor(logp), SimpleNamespace(continuation=continuation), "logprob", 454)
    ci = stats.ttest_1samp(logp, 0.0).confidence_interval(0.95)
    assert entry["at_chance"] is False and entry["ci"] == pytest.approx([ci.low, ci.high], rel=1e-9)
    assert entry["chance_range"] == pytest.approx([-7 * math.log(454), -math.log(454)])
    s = {"metric": "logprob", "normalized": False, "direction": "denoise", "n_examples": 7,
         "clean_metric": float(logp.mean()), "corrupted_metric": -10.6, "chance": entry,
         "top_sites": {"resid_pre": [{"layer": 1, "head": None, "pos": -1, "token": " with", "effect": 9.0}]}}
    text = finding("patching", s)
    assert text.startswith("Clean prompts give an answer log-probability of -0.00706, corrupted ones -10.6."), text
    assert "chance" not in text and "no site is ranked" not in text
    assert "0.85 of the clean-corrupted gap" in text  # 9.0 / (-0.00706 + 10.6), ranked as usual


def test_position_at_chance_names_no_retrieval_head_and_no_shape():
    s = {"primary_metric": "accuracy", "n_examples": 8, "metric_per_position": {"accuracy": {"1": 0.1, "2": 0.0, "3": 0.4}},
         "ratio_middle_to_ends": {"accuracy": 0.0}, "ci_per_position": {"accuracy": {"1": [0, .3], "2": [0, 0], "3": [.1, .7]}},
         "sink_mass_per_layer": [0.12, 0.11], "sink_uniform_baseline": 0.12, "n_sink": 4,
         "retrieval_heads": [[0, 3]], "retrieval_tracked_metric": "logprob",
         "retrieval_test": {"n_examples": 8, "n_rows": 32, "n_heads": 12, "correction": "holm",
                            "heads": [{"layer": 0, "head": 3, "r": 0.9, "ci": [0.8, 0.95], "n": 8, "p_holm": 1e-5}]},
         "chance": {**UNTRAINED_CHANCE, "metric": "accuracy", "mean": 0.17, "chance_value": 0.25, "ci": [0.0, 0.37]}}
    text = finding("position", s)
    assert "Measured: accuracy at 3 gold positions over 8 examples; at chance its differences between positions are " \
           "not read." in text
    for said in ("L0H3", "retrieval head", "ranges from", "worst middle", "U-shape", "interval"):
        assert said not in text, said
    assert "no attention sink" in text  # a property of the attention, measured without the task


REVIEW5_SINKS = [  # review 5 A4: Phi-3 kv/sinks.csv, layer 1 puts 0.325 on <s> against 0.180 uniform
    {"layer": 0, "mass": 0.150, "uniform": 0.180, "ci": [0.14, 0.16], "excess_ci": [-0.04, -0.02], "ratio": 0.150 / 0.180,
     "n": 16, "sink": False},
    {"layer": 1, "mass": 0.325, "uniform": 0.180, "ci": [0.30, 0.35], "excess_ci": [0.12, 0.17], "ratio": 0.325 / 0.180,
     "n": 16, "sink": True},
    {"layer": 2, "mass": 0.101, "uniform": 0.180, "ci": [0.09, 0.11], "excess_ci": [-0.09, -0.07], "ratio": 0.101 / 0.180,
     "n": 16, "sink": False}]


def test_kv_and_position_state_the_sink_per_layer_against_uniform_with_one_criterion():
    """review 5 A4: the layer-1 sink the figure shows is said in words, with its interval over prompts; the key-norm
    sentence says it is about norms; position qualifies its sinks with its task and uses the same records."""
    kv = {"task": "kv", "sink_key_norm_ratio_per_layer": {"0": 0.51, "1": 0.65, "2": 0.6}, "sinks": REVIEW5_SINKS}
    text = finding("kv", kv)
    assert "the first key's norm does not stand out (it is smaller)." in text
    assert ("On kv prompts, attention on the first 1 token(s) per layer (mean over 16 prompts, 95% CI, and its multiple "
            "of the uniform share 0.18): layer 0 0.15 [0.14, 0.16] (0.8x), layer 1 0.33 [0.30, 0.35] (1.8x), layer 2 0.10 "
            "[0.09, 0.11] (0.6x). An attention sink in layer(s) 1 (at least 1.5x the uniform share, with its excess over "
            "it 95%-CI above 0).") in text
    pos = {"task": "json_kv", "n_sink": 1, "sinks": [{**r, "n": 8} for r in REVIEW5_SINKS],
           "sink_mass_per_layer": [0.15, 0.325, 0.101], "sink_uniform_baseline": 0.18}
    text = finding("position", pos)
    assert "On json_kv prompts, attention on the first 1 token(s) per layer (mean over 8 examples" in text
    assert "An attention sink in layer(s) 1" in text and "no attention sink" not in text and "peaks at" not in text
    # below the ratio, or an interval that reaches the uniform share: no sink, said with the rule
    none = [{**r, "sink": False} for r in REVIEW5_SINKS]
    assert "No layer is an attention sink (none is at least 1.5x the uniform share" in finding("kv", {**kv, "sinks": none})
    # many layers: the sinks in full, the others as a range
    deep = [{**REVIEW5_SINKS[0], "layer": i, "mass": 0.1 + 0.01 * i} for i in range(8)] + [{**REVIEW5_SINKS[1], "layer": 8}]
    assert "layer 8 0.33 [0.30, 0.35] (1.8x); the other 8 layers 0.10-0.17." in finding("kv", {"sinks": deep})
    # an older position summary (no records): the old rule, now with its task
    old = finding("position", {"task": "json_kv", "n_sink": 4, "sink_mass_per_layer": [0.12], "sink_uniform_baseline": 0.12})
    assert old.startswith("On json_kv prompts, attention on the first 4 token(s) peaks at 0.12")


def test_mlp_at_chance_ranks_no_layer():
    s = {"agreement_per_layer": {"0": 0.0, "1": 0.005, "2": 0.01}, "agreement_shuffled_per_layer": {"0": 0.02},
         "n_neurons_per_layer": 128, "n_prefixes": 135, "answer_promoted_fraction": 0.0, "n_task_updates": 48,
         "chance": UNTRAINED_CHANCE}
    text = finding("mlp", s)
    assert text.endswith("Measured: key-value agreement of 128 neurons per layer in 3 layers over 135 prefixes against a "
                         "shuffled control, and which tokens the largest task updates promote (48 updates); no layer is "
                         "ranked at chance.")
    for said in ("highest", "in layer", "no better than the control", "promote the answer token", "Wilson", "post-MLP"):
        assert said not in text, said
    # review 8b C7: on a post-norm model (OLMo 2, Gemma 2/3) the finding says how the value vectors were read
    assert finding("mlp", {**s, "values_through_post_norm": True}) == (
        text + " Value vectors taken through the post-MLP norm's gain (the norm's shared scale is left out: it does not "
        "change rankings).")


def test_retrieval_heads_are_named_with_their_test_or_not_at_all():
    """n is the examples, the unit of the tests and intervals, with the rows they hold; a summary from the
    older row-level test (no n_examples) says its p-values are too small."""
    test = {"n_examples": 10, "n_rows": 40, "n_heads": 12, "correction": "holm", "unit": "example",
            "heads": [{"layer": 0, "head": 3, "r": 0.91, "ci": [0.83, 0.95], "n": 10, "n_rows": 40, "p_holm": 3e-6}]}
    s = {"retrieval_tracked_metric": "logprob", "retrieval_heads": [[0, 3]], "retrieval_test": test}
    assert ("1 retrieval head(s) track the logprob, with gold-span mass above the other heads' (Holm-corrected across 12 "
            "heads, n = 10 examples, 40 rows of examples x positions; tests and intervals over examples): L0H3 (r = 0.91, "
            "95% CI [0.83, 0.95], adjusted p = 3e-06).") in finding("position", s)
    none = {**s, "retrieval_heads": [], "retrieval_test": {**test, "heads": []}}
    text = finding("position", none)
    assert ("No head's gold-span attention tracks the logprob with its mass above the other heads' (Holm-corrected "
            "across 12 heads, n = 10 examples, 40 rows of examples x positions; tests and intervals over examples): no "
            "retrieval head is named.") in text and "L0H3" not in text
    rows = {k: v for k, v in test.items() if k not in ("n_examples", "unit")}  # an older summary: rows as independent
    text = finding("position", {**s, "retrieval_test": {**rows, "heads": [{**test["heads"][0], "n": 40}]}})
    assert ("1 head(s) passed this run's older retrieval-head test (Holm-corrected across 12 heads), which counted its "
            "n = 40 rows of examples x positions as independent although an example's rows share its prompt, so its "
            "p-values and intervals are too narrow: L0H3 (r = 0.91, adjusted p = 3e-06).") in text
    assert "retrieval head(s) track" not in text and "95% CI" not in text
    old = {"retrieval_tracked_metric": "logprob", "retrieval_heads": [[0, 3]]}  # an older summary: no test behind it
    assert "flagged as tracking the logprob by a threshold without a test: L0H3" in finding("position", old)


def test_pruning_words_name_the_orderings_basis_a_return_into_the_band_and_a_gain():
    """#34 A8 (the zoo model's numbers): the gradient ordering is per-layer normalised and says so; its "0%" is the
    first crossing although the curve is back within 1% with 10 of 12 heads removed; the ablation order raises
    the logit difference by 7.7% with 8 heads removed, said with its interval over examples."""
    base = {"metric": "logit_diff", "baseline_metric": 11.775, "n_examples": 64, "n_heads": 12,
            "ordering_basis": {"gradient": "|dL/d gate| / its layer's L2 norm", "ablation": "raw zero-ablation drop"}}
    gain_heads = ["L1H0", "L1H1", "L1H2", "L1H3", "L2H0", "L2H1", "L2H2", "L2H3"]
    s = {**base, **_prunable("ablation", 8, 6, 9, n=64), **_prunable("gradient", 0, 0, 0, n=64),
         "pruning_shape_gradient": {
             "tolerance": 0.01,
             "first_below": {"n_pruned": 1, "metric": 11.563, "change": -0.212, "change_rel": -0.018},
             "back_within": {"n_pruned": 10, "metric": 11.72, "change": -0.055, "change_rel": -0.0047, "points": 5,
                             "first": 6}},
         "pruning_shape_ablation": {
             "tolerance": 0.01,
             "gain": {"n_pruned": 8, "metric": 12.68, "change": 0.905, "change_rel": 0.0769, "heads": gain_heads,
                      "ci": [0.717, 1.09]}}}
    text = finding("heads", s)
    assert "when ordered by ablation (raw zero-ablation drop)." in text
    assert "gradient (|dL/d gate| / its layer's L2 norm) 0% (0 heads, a single value)" in text
    assert ("The gradient curve leaves the 1% band at 1 head removed (-1.8%) but is "
            "back within it at 5 later points, from 6 heads removed up to 10 of 12 (11.7, -0.5%): the order is not "
            "monotone; its count stops at the first crossing.") in text
    assert ("Pruning can raise the metric: removing 8 of 12 heads in the ablation order (L1H0, L1H1, L1H2, L1H3, "
            "L2H0, L2H1, L2H2, L2H3) raises the logit difference by 0.905 (+7.7%; 95% CI of the change +0.717 to +1.09 "
            "over 64 examples), more than 1% above unpruned.") in text
    assert text.count("(raw zero-ablation drop)") == 1  # each ordering's basis said once, where it is first named
    # two orderings that each raise it: one sentence, each change with its own interval
    two = {**s, **_prunable("ablation_recompute", 8, 6, 9, n=64),
           "pruning_shape_ablation_recompute": {"tolerance": 0.01, "gain": {
               "n_pruned": 9, "metric": 12.6, "change": 0.83, "change_rel": 0.0706, "heads": [], "ci": [0.6, 1.05]}}}
    assert ("Pruning can raise the logit difference more than 1% above unpruned (95% CIs of the change over 64 "
            "examples): removing 8 of 12 heads in the ablation order (L1H0, L1H1, L1H2, L1H3, L2H0, L2H1, L2H2, L2H3) "
            "by 0.905 (+7.7%, +0.717 to +1.09), removing 9 of 12 heads in the ablation recomputed order by 0.83 (+7.1%, "
            "+0.6 to +1.05).") in finding("heads", two)
    # an interval that reaches no gain claims none (review 6, A6); a degenerate gradient's shape is not worded
    weak = {**s, "pruning_shape_ablation": {"tolerance": 0.01, "gain": {**s["pruning_shape_ablation"]["gain"],
                                                                        "ci": [-0.1, 1.9]}},
            "degenerate_gradient": "every head's |gradient importance| is below 1e-08"}
    text = finding("heads", weak)
    assert ("Removing 8 of 12 heads in the ablation order (L1H0, L1H1, L1H2, L1H3, L2H0, "
            "L2H1, L2H2, L2H3) changes the logit difference by +0.905 (+7.7%; 95% CI of the change -0.1 to +1.9 over 64 "
            "examples): no evidence of a gain.") in text
    assert "Pruning can raise" not in text and "within 1%" not in text
    assert "not monotone" not in text


def test_pruning_gain_is_more_than_1_percent_only_where_its_interval_clears_the_band():
    """Review 7 A5, the kv rule for heads: unpruned 10.0, so the 1% band is 0.1. A gain whose 95% CI of the
    change is [+0.12, +0.20] is more than 1% above unpruned; [+0.01, +0.27] is higher, not clearly by more than
    1%; [-0.02, +0.26] is no gain. Every mean (+0.14, +0.16, +0.12) is above the band."""
    base = {"metric": "logit_diff", "baseline_metric": 10.0, "n_examples": 16, "n_heads": 12,
            **_prunable("ablation", 2, 1, 3)}

    def shaped(ci):
        mean = (ci[0] + ci[1]) / 2
        return {**base, "pruning_shape_ablation": {"tolerance": 0.01, "gain": {
            "n_pruned": 2, "metric": 10.0 + mean, "change": mean, "change_rel": mean / 10, "heads": ["L0H1", "L1H2"],
            "ci": ci}}}

    removing = "Removing 2 of 12 heads in the ablation order (L0H1, L1H2)"
    assert (f"{removing} raises the logit difference by 0.14 (+1.4%; 95% CI of the change +0.01 to +0.27 over 16 "
            "examples): higher than unpruned, but not clearly by more than 1%.") in finding("heads", shaped([0.01, 0.27]))
    clear = finding("heads", shaped([0.12, 0.20]))
    assert ("Pruning can raise the metric: removing 2 of 12 heads in the ablation order (L0H1, L1H2) raises the logit "
            "difference by 0.16 (+1.6%; 95% CI of the change +0.12 to +0.2 over 16 examples), more than 1% above "
            "unpruned.") in clear
    none = finding("heads", shaped([-0.02, 0.26]))
    assert (f"{removing} changes the logit difference by +0.12 (+1.2%; 95% CI of the change -0.02 to +0.26 over 16 "
            "examples): no evidence of a gain.") in none
    assert "more than 1% above" not in none and "not clearly" not in none and "higher than" not in none


def _colour_binding(**extra) -> dict:
    """The fifth review's Phi-3 colour-binding run, by hand: gap 19.82 (9.91 - -9.91); the corrupted colour token
    at -8 from the end in 6 prompts and -11 in 2; resid_pre layer 0 restores 0.75 and 0.25 of the gap there."""
    gap = 19.82
    cell = {"head": None, "token": "14:  is", "ci": [19.4, 19.8], "n": 8}
    return {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 8,
            "clean_metric": 9.91, "corrupted_metric": -9.91,
            "top_sites": {"resid_pre": [{**cell, "layer": 2, "pos": 14, "from_end": -1, "effect": 0.99 * gap},
                                        {**cell, "layer": 0, "pos": 7, "from_end": -8, "token": "", "effect": 0.75 * gap},
                                        {**cell, "layer": 0, "pos": 4, "from_end": -11, "token": "", "effect": 0.25 * gap}],
                          "attn_out": [{**cell, "layer": 0, "pos": 14, "from_end": -1, "effect": 0.72 * gap}]},
            "at_corrupted_token": {"from_end": {"-11": 2, "-8": 6}, "n": 8, "sites": {
                "resid_pre": [{"layer": 0, "effect": gap, "ci": [0.99 * gap, 1.01 * gap], "n": 8,
                               "end_aligned": {"effect": 0.75 * gap, "from_end": -8}},
                              {"layer": 1, "effect": 0.01 * gap, "ci": None, "n": 8,
                               "end_aligned": {"effect": 0.72 * gap, "from_end": -1}}]}},
            **extra}


def test_patching_names_the_corrupted_token_that_end_aligned_cells_split():
    """#34 review 5 (A5), review 10a A3: templates of different lengths put the one differing token at -8 and -11 from
    the end; the end-aligned map shows 0.75 and 0.25, and the finding leads with the token's whole effect, aligned on
    it (1.00 = 19.82 / 19.82), layer by layer, before the end-aligned column and what that column holds."""
    s = _colour_binding()
    text = finding("patching", s)
    lead = ("Patching (denoise, 8 examples) the resid_pre at the corrupted token (each prompt's first position that "
            "differs from its clean prompt; it sits at -8 from the end in 6 prompts and -11 in 2, so end-aligned columns "
            "split its effect) restores at layer 0 1.00 of the clean-corrupted gap (95% CI [0.99, 1.01], 8 of 8 prompts, "
            "+19.8 logit difference); at layer 1 0.01 (8 of 8 prompts).")
    end = ("End-aligned (each column one place from the end, averaging whatever tokens the prompts have there), the "
           "largest residual cell away from the answer position is the resid_pre at layer 0, position -8 from the end")
    assert lead in text and end in text and text.index(lead) < text.index(end)
    assert "(6 of 8 prompts have their changed token there)." in text  # its CI [0.98, 1.00] does not reach 0
    assert "moves the metric most" not in text and "Aligned on" not in text
    # one template length: the token's column is the aligned one (its effect the same), nothing to add
    s["at_corrupted_token"]["from_end"] = {"-8": 8}
    s["at_corrupted_token"]["sites"]["resid_pre"][0]["effect"] = 0.75 * 19.82
    text = finding("patching", s)
    assert "corrupted token" not in text and "moves the metric most at the resid_pre at layer 0, position -8" in text


def test_patching_aligned_on_the_first_of_several_differing_positions_says_so():
    """#34 review 6 (A9): 2 to 4 positions differ per prompt; the aligned one is the first of them, not "the"
    corrupted token; one differing position keeps the corrupted-token wording."""
    s = _colour_binding()
    s["at_corrupted_token"]["positions_differ"] = [2, 4]
    text = finding("patching", s)
    assert ("Patching (denoise, 8 examples) the resid_pre at the first position where the prompts differ (2 to 4 "
            "positions differ per prompt; it sits at -8 from the end in 6 prompts and -11 in 2, so end-aligned columns "
            "split its effect) restores at layer 0 1.00 of the clean-corrupted gap") in text
    assert "corrupted token" not in text and "(6 of 8 prompts have their first differing position there)" in text
    s["at_corrupted_token"]["positions_differ"] = [3, 3]
    assert "(3 positions differ per prompt; it sits at -8 from the end" in finding("patching", s)
    s["at_corrupted_token"]["positions_differ"] = [1, 1]
    assert "the resid_pre at the corrupted token (each prompt's first position that differs" in finding("patching", s)
    # review 20a B3: one differing position per pair: layer 0 at it is the clean run by construction, said
    assert ("restores at layer 0 1.00 of the clean-corrupted gap (95% CI [0.99, 1.01], 8 of 8 prompts, +19.8 logit "
            "difference), by construction (patching the embedding of each pair's only differing token makes the patched "
            "run the clean run); at layer 1 0.01 (8 of 8 prompts).") in finding("patching", s)


def test_patching_aligns_each_of_several_differing_positions_and_names_the_one_that_matters():
    """#34 review 12b A2: a swap of two names changes 2 positions per prompt; the first carries nothing (-0.01 of the
    gap), the second (the receiver's name) the whole gap (1.01 = 20.02 / 19.82) in 8 of 8 prompts. The finding aligns
    on each in order and leads with the second, its interval and n; where prompts have 2 to 3 differing positions, it
    says only the first 2 (which all have) are aligned."""
    gap = 19.82
    s = _colour_binding()
    first = {"resid_pre": [{"layer": 0, "effect": -0.01 * gap, "ci": [-0.03 * gap, 0.01 * gap], "n": 8}]}
    second = {"resid_pre": [{"layer": 0, "effect": 1.01 * gap, "ci": [0.99 * gap, 1.03 * gap], "n": 8},
                            {"layer": 1, "effect": 0.02 * gap, "ci": [0.0, 0.04 * gap], "n": 8}]}
    s["at_corrupted_token"].update(positions_differ=[2, 2], sites=first, orders=[
        {"order": 1, "from_end": {"-11": 2, "-8": 6}, "n": 8, "sites": first},
        {"order": 2, "from_end": {"-5": 8}, "n": 8, "sites": second}])
    text = finding("patching", s)
    lead = ("Patching (denoise, 8 examples) aligned on each differing position in order (2 positions differ per prompt, "
            "each aligned over every prompt at its own place): the second restores 1.01 of the clean-corrupted gap at "
            "the resid_pre at layer 0 (95% CI [0.99, 1.03], 8 of 8 prompts, +20 logit difference); the first, at its "
            "largest cell, -0.01 at the resid_pre at layer 0 (95% CI [-0.03, 0.01], 8 of 8 prompts).")
    assert lead in text and "the first position where the prompts differ" not in text
    s.update(clean_metric_ci=[9.5, 10.32], corrupted_metric_ci=[-10.3, -9.52], metric_n=8)  # review 12c C6
    assert finding("patching", s).startswith("Clean prompts give a logit difference of 9.91 (95% CI [9.5, 10.3]), "
                                             "corrupted ones -9.91 (95% CI [-10.3, -9.52]), over 8 prompts.")
    s["at_corrupted_token"]["positions_differ"] = [2, 3]
    assert ("(prompts differ in how many positions differ (2 to 3), so the first 2, which every prompt has, are "
            "aligned, each over every prompt at its own place)") in finding("patching", s)


def test_patching_finding_names_the_top_path_with_its_interval_and_n():
    """#34 review 12c B3: path_patching.png stood with no finding; the finding names the top direct path to the logits
    with its share of the gap (3.96 / 19.82 = 0.20), 95% CI and n."""
    s = _colour_binding(path_patching={"direction": "denoise", "receivers": "logits", "n_examples": 8, "top_paths": [
        {"sender": [0, 3], "receiver": "logits", "effect": 0.5, "ci": [0.1, 0.9], "n": 8},
        {"sender": [2, 1], "receiver": "logits", "effect": 3.964, "ci": [1.982, 5.946], "n": 8}]})
    assert ("Path patching (denoise, each head's direct path to the logits alone): the largest in size is L2H1, +0.20 "
            "of the clean-corrupted gap (95% CI [+0.10, +0.30], n = 8 prompts, +3.96 logit difference). In denoising, a "
            "share of 1 is the whole gap restored") in finding("patching", s)


def _at_chance_gap_zero(n: int = 8) -> dict:
    """Review 15b B3's quick run: at chance (chance entry over the same 8 prompts), and every corrupted prompt gives
    exactly its clean prompt's logit difference (per-pair gaps all 0: mean 0, t interval [0, 0])."""
    return {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": n, "metric_n": n,
            "clean_metric": -0.0703125, "corrupted_metric": -0.0703125,
            "clean_metric_ci": [-0.442, 0.302], "corrupted_metric_ci": [-0.442, 0.302],
            "chance": {"at_chance": True, "mean": -0.0703125, "ci": [-0.442, 0.302], "chance_value": 0.0,
                       "metric": "logit_diff", "n_examples": n, "task": "boxes", "floor": 0.1},
            "gap_within_noise": {"gap": 0.0, "ci": [0.0, 0.0], "n_examples": n, "floor": 0.1,
                                 "reason": f"mean gap 0 logit difference, its 95% CI [0, 0] over {n} pairs contains 0"},
            "top_sites": {"resid_pre": [{"layer": 0, "pos": 1, "from_end": -2, "effect": 0.0, "n": n}]}}


def test_patching_at_chance_says_the_corruption_changes_nothing_when_the_gap_is_exactly_0():
    """Review 15b B3: the quick report's patching finding said nothing of its clean-corrupted gap when it was exactly 0
    on all 8 pairs (the full run states its gap, +0.00195 over 32 pairs): the same sentence for both, here 0."""
    text = finding("patching", _at_chance_gap_zero())
    assert ("Clean prompts give the logit difference above; corrupted ones give the same on all 8 pairs in patching's "
            "own pass (clean minus corrupted exactly 0, 95% CI [0, 0]): the corruption does not move the metric, so "
            "there is no difference for any patch to restore. Measured: exact activation patching") in text
    s = _at_chance_gap_zero()  # a mean gap of 0 whose pairs differ: 'on average', with its interval
    s["gap_within_noise"]["ci"] = [-0.05, 0.05]
    assert ("corrupted ones give the same on average over 8 pairs in patching's own pass (clean minus corrupted "
            "exactly 0, 95% CI [-0.05, 0.05])") in finding("patching", s)


def test_patching_one_prompt_of_equal_metrics_says_so():
    """Review 15b B2/B3: a notebook's one prompt whose corrupted twin gives the same logit difference (not at chance)."""
    s = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 1, "metric_n": 1,
         "clean_metric": -1.1875, "corrupted_metric": -1.1875,
         "gap_within_noise": {"gap": 0.0, "ci": None, "n_examples": 1, "floor": 0.1,
                              "reason": "mean gap 0 logit difference over 1 pair(s) is under the 0.1 floor"}}
    assert finding("patching", s).startswith(
        "Clean and corrupted prompts give the same logit difference, -1.19, on its 1 pair (clean minus corrupted "
        "exactly 0): the corruption does not move the metric, so there is no difference for any patch to restore.")


def test_path_patching_result_names_its_top_path_or_why_none_is_ranked():
    """Review 15b B2: hs.path_patching's own Result had no finding. With a clear gap (2.0 - 0.5 = 1.5): its top path
    as a share of it (0.6 / 1.5 = 0.40); within noise: why no path is ranked, and its largest effect."""
    paths = [{"sender": [0, 1], "receiver": "L1H0", "effect": 0.1, "ci": [0.0, 0.2], "n": 4},
             {"sender": [0, 3], "receiver": "L1H0", "effect": 0.6, "ci": [0.3, 0.9], "n": 4}]
    s = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 4, "metric_n": 4,
         "clean_metric": 2.0, "corrupted_metric": 0.5, "receivers": [[1, 0]], "component": "q", "top_paths": paths}
    assert finding("patching", s) == (
        "Clean prompts give a logit difference of 2, corrupted ones 0.5, over 4 prompts. Path patching (denoise, each "
        "head's direct path to its receivers (L1H0) alone): the largest in size is L0H3, +0.40 of the clean-corrupted "
        "gap (95% CI [+0.20, +0.60], n = 4 prompts, +0.6 logit difference). In denoising, a share of 1 is the whole "
        "gap restored (the metric moved to the clean one) and a negative share moves the metric further from the "
        "clean one.")
    s["gap_within_noise"] = {"gap": 1.5, "ci": [-0.5, 3.5], "n_examples": 4, "floor": 0.1, "reason": "its CI has 0"}
    assert finding("patching", s).endswith(
        "The clean-corrupted gap is within noise (its CI has 0): shares of it are not meaningful, so no path is ranked; "
        "the largest effect in size is +0.6 logit difference (L0H3).")
    paths[0]["effect"] = -0.6  # review 15b verify B2: a tie in size names both, each with its sign
    assert finding("patching", s).endswith(
        "so no path is ranked; the largest effects in size tie, in logit difference: -0.6 (L0H1) and +0.6 (L0H3).")


def _gptj_paths(effects: list[float], receiver: str = "logits") -> dict:
    """Review 15b verify's pp3.py on GPT-J in bfloat16: one prompt, clean -0.1875, corrupted -1.8125 (gap 1.625),
    noising each head's direct path; effects as given (sender L0H0, L0H1, ...), no interval from one prompt."""
    paths = [{"sender": [i // 4, i % 4], "receiver": receiver, "effect": e, "n": 1, "ci": None}
             for i, e in enumerate(effects)]
    return {"metric": "logit_diff", "normalized": False, "direction": "noise", "n_examples": 1, "metric_n": 1,
            "clean_metric": -0.1875, "corrupted_metric": -1.8125, "receivers": "logits", "component": "resid",
            "top_paths": sorted(paths, key=lambda r: -abs(r["effect"]))[:10]}


def test_path_patching_names_no_path_when_every_effect_is_0():
    """Review 15b verify B1: with a gap of 1.625 and all 4 paths into L1H0's q exactly 0 (bf16 rounds their fp32
    -0.002..+0.00003 away), the finding named "the largest is L0H0, 0.00 of the clean-corrupted gap"."""
    text = finding("patching", _gptj_paths([0.0, 0.0, 0.0, 0.0], receiver="L1H0"))
    assert text == (
        "Clean prompts give a logit difference of -0.188, corrupted ones -1.81, over 1 prompt. Path patching (noise, "
        "each head's direct path to its receivers (L1H0) alone): every path's effect is exactly 0 (n = 1 prompt): "
        "patching any one head's direct path leaves the logit difference unchanged at the precision the model ran in, "
        "so no path is named.")


def test_path_patching_names_every_path_tied_for_the_largest_size_with_its_sign():
    """Review 15b verify B2: pp3.py's 12 paths to the logits: L2H2 -0.375 and L1H1 +0.375 tie in size; the finding
    named L2H2 alone ("the largest is L2H2, -0.23"). Both are named, each share by hand: -0.375 / 1.625 = -0.2308,
    +0.375 / 1.625 = +0.2308; and what a share's sign means when noising. Then L1H1 at +0.5: it alone, +0.5 / 1.625
    = +0.3077, largest in size though L2H2 is further from 0 below."""
    effects = [-0.1875, 0, 0.125, 0, 0, 0.375, 0, 0, -0.0625, -0.125, -0.375, 0]
    text = finding("patching", _gptj_paths(effects))
    assert ("Path patching (noise, each head's direct path to the logits alone): L1H1 and L2H2 tie for the largest in "
            "size, 0.375 logit difference (n = 1 prompt each, one prompt gives no interval): L1H1 +0.23, L2H2 -0.23 of "
            "the clean-corrupted gap. In noising, a share of -1 is the whole gap lost (the metric moved to the "
            "corrupted one) and a positive share moves the metric away from the corrupted one.") in text
    effects[5] = 0.5
    assert ("alone): the largest in size is L1H1, +0.31 of the clean-corrupted gap (n = 1 prompt, one prompt gives no "
            "interval, +0.5 logit difference). In noising") in finding("patching", _gptj_paths(effects))
    effects[5] = -0.5  # its sign kept: -0.5 / 1.625 = -0.3077
    assert "the largest in size is L1H1, -0.31 of the clean-corrupted gap" in finding("patching", _gptj_paths(effects))


def test_patching_says_where_attribution_patching_would_rank_wrong():
    """#34 review 5 (A6): Spearman over every cell is raised by tied zeros here (the non-zero cells' is stated beside
    it); attribution patching ranks the top exact attn_out site 2nd, 20x under, and misses resid_pre layer 0 at -8,
    so no "use it to rank" there."""
    gap = 19.82
    top = {"layer": 0, "head": None, "pos": 14, "from_end": -1, "effect": 14.25, "attribution": 1.03,
           "attribution_rank": 2}
    corr = {"attn_out": {"pearson": 0.66, "spearman": 0.943, "spearman_nonzero": 0.899, "n": 45, "n_nonzero": 14,
                         "slope": 0.14, "slope_ci": [0.09, 0.19], "slope_n": 45, "top_exact": top, "missed": top},
            "resid_pre": {"pearson": 0.85, "spearman": 0.99, "spearman_nonzero": 0.94, "n": 45, "n_nonzero": 30,
                          "pearson_without_top": 0.80, "slope": 0.33, "slope_ci": [0.26, 0.39], "slope_n": 45,
                          "top_exact": {**top, "layer": 2, "effect": 0.99 * gap, "attribution": 9.68,
                                        "attribution_rank": 1},
                          "missed": {"layer": 0, "head": None, "pos": 7, "from_end": -8, "effect": 0.75 * gap,
                                     "attribution": 0.04 * gap}}}
    text = finding("patching", _colour_binding(attribution_correlation=corr))
    assert ("attn_out r = 0.660 rests on its 14 non-zero cells of 45 (Spearman 0.90 over the 14 non-zero cells (0.94 "
            "over all 45, raised by the 31 tied zeros); slope 0.14, attribution over exact; no interval for r or the "
            "slope: the other 31 cells have no exact effect)") in text
    assert ("Ranked by attribution patching, sites come out wrong: at attn_out, the top exact site (layer 0, position -1 "
            "from the end: exact 0.72 of the gap) ranks only 2nd, at 0.05 of the gap, under 1/5 of it; at resid_pre, it "
            "misses layer 0, position -8 from the end (attribution 0.04 of the gap against exact 0.75 of the gap: under "
            "1/5 of it). Do not rank sites by it on this model at attn_out and resid_pre.") in text
    # resid_pre's slope far from 1 with r significant would say "use it to rank": not where it ranks wrong
    assert "At resid_pre attribution patching's effects are about 0.33 times the exact ones" in text
    assert "use it to rank" not in text
    ok = {k: {**v, "missed": None, "top_exact": {**v["top_exact"], "attribution_rank": 1}} for k, v in corr.items()}
    text = finding("patching", _colour_binding(attribution_correlation=ok))
    assert "come out wrong" not in text and ": use it to rank, not to size." in text



def test_patching_draws_no_verdict_from_a_miss_below_the_negligible_line():
    """Review 13c A1: "it misses L1H2 (attribution 0.00 of the gap against exact -0.00 of the gap ...). Do not rank
    sites by it on this model at q" rested on a cell of under 1/1000 of the gap; a miss is said only above
    NEGLIGIBLE (1e-3) of the gap, as the same cell at 0.01 of it is."""
    gap = 19.82
    top = {"layer": 3, "head": 7, "pos": None, "from_end": None, "effect": 0.05 * gap, "attribution": 0.05 * gap,
           "attribution_rank": 1, "tied": 0}
    corr = {"q": {"pearson": 0.9, "spearman": 0.9, "spearman_nonzero": 0.9, "n": 32, "n_nonzero": 32,
                  "pearson_without_top": 0.9, "slope": 1.0, "slope_ci": [0.9, 1.1], "slope_n": 32, "top_exact": top,
                  "missed": {"layer": 1, "head": 2, "pos": None, "from_end": None, "effect": -0.0008 * gap,
                             "attribution": 0.0001 * gap}}}
    assert "come out wrong" not in finding("patching", _colour_binding(attribution_correlation=corr))
    corr["q"]["missed"]["effect"] = -0.01 * gap
    assert "at q, it misses L1H2" in finding("patching", _colour_binding(attribution_correlation=corr))


def test_patching_says_whether_the_tied_zeros_raise_or_lower_spearman():
    """Review 8 (C4): "inflated by the 27 tied zeros" was said where Spearman over every cell (0.30) was below the
    non-zero cells' (0.43). By hand with scipy: 9 non-zero exact effects 1..9 of 36 cells, attribution ranking them
    with two swaps (0.93); the 27 zero cells' attribution noise lowers Spearman over all 36 to 0.76, attribution 0 there
    raises it to 1.00; two that read the same to 2 decimals say neither."""
    exact = [0.0] * 27 + list(range(1, 10))
    ranked = [1, 3, 2, 5, 4, 7, 6, 9, 8]
    noisy, quiet = [0.5, -0.5, 0.3, -0.3, 0.8, -0.8, 0.1, -0.1, 0.2] * 3 + ranked, [0.0] * 27 + ranked

    def corr(attribution):
        return {"resid_pre": {"pearson": stats.pearsonr(exact, attribution)[0], "n": 36, "n_nonzero": 9,
                              "spearman": stats.spearmanr(exact, attribution)[0],
                              "spearman_nonzero": stats.spearmanr(exact[27:], attribution[27:])[0]}}

    text = finding("patching", _colour_binding(attribution_correlation=corr(noisy)))
    assert "Spearman 0.93 over the 9 non-zero cells (0.76 over all 36, lowered by the 27 tied zeros)" in text, text
    text = finding("patching", _colour_binding(attribution_correlation=corr(quiet)))
    assert "Spearman 0.93 over the 9 non-zero cells (1.00 over all 36, raised by the 27 tied zeros)" in text, text
    same = {"resid_pre": {**corr(noisy)["resid_pre"], "spearman": 0.7112, "spearman_nonzero": 0.7089}}
    text = finding("patching", _colour_binding(attribution_correlation=same))
    assert "Spearman 0.71 over the 9 non-zero cells (0.71 over all 36)" in text, text
    assert "inflated" not in text and "tied zeros" not in text

def test_dla_components_zero_by_construction_are_neither_ranked_nor_tied():
    """Review 13b C3 (Gemma 2, no attention or unembedding bias): "tied with 22 components (..., 4 attn_bias, 1
    remainder, 1 unembed_bias)" counted rows of 1e-8 to 2e-7 and an exact 0 as ties of the third writer. Here
    L1H0 [1.6, 0, 1.6, 0]: 0.8, sd 0.924, t(0.975, 3) = 3.1824, half 1.470 -> [-0.67, 2.27]. By hand: only L0H3
    (+0.78) is a writer inside it; the bias rows, remainder and b_U are 0 up to rounding; a real bias of 0.05 is
    tied (a model with biases keeps its bias rows)."""
    rows = {"mlp0": ("mlp", [5, 5.2, 5, 5.2]), "mlp1": ("mlp", [3, 3.2, 3, 3.2]),
            "L1H0": ("head", [1.6, 0, 1.6, 0]), "L0H3": ("head", [0.78] * 4),
            "attn_bias0": ("attn_bias", [1e-8, -2e-7, 3e-8, 0.0]), "attn_bias1": ("attn_bias", [0.0] * 4),
            "remainder": ("remainder", [9e-8, -5e-8, 1e-7, 0.0]), "b_U": ("unembed_bias", [0.0] * 4)}
    s = _dla_summary(rows)
    assert s["dla_last_named_ties"]["within"] == ["L0H3"]
    # review 17a B3: L1H0's interval reaches 0, so every writer near 0 is inside it: that is said, not a tie list
    text = finding("circuits", s)
    assert "L1H0's 95% interval reaches 0: it is not singled out from writing nothing." in text
    assert "tied with" not in text
    assert not {"attn_bias0", "attn_bias1", "remainder", "b_U"} & set(s["dla_top_components"])
    biased = _dla_summary({**rows, "attn_bias1": ("attn_bias", [0.05] * 4)})
    assert biased["dla_last_named_ties"]["within"] == ["L0H3", "attn_bias1"]


def test_dla_zero_floor_follows_the_runs_dtype():
    """Review 16av-B1 (Cohere, no attention bias, bfloat16): hook_attn_out minus the heads left attn_bias rows of
    -1.9e-4 to +4.1e-4 and a remainder of -1.5e-4, over float32's floor (1e-5 x the largest, 5.2e-5 here), so bf16
    said "tied with 22 components (..., 3 attn_bias, 1 remainder)". By hand: bfloat16's floor is eps/2 = 2^-8 of
    the largest |contribution| 5.2 = 0.0203, over those rows, under a real bias of 0.05; L1H0's interval [-0.67, 2.27]
    holds L0H3 (+0.78) and, in float32, the rounding rows."""
    import torch

    rows = {"mlp0": ("mlp", [5, 5.2, 5, 5.2]), "mlp1": ("mlp", [3, 3.2, 3, 3.2]),
            "L1H0": ("head", [1.6, 0, 1.6, 0]), "L0H3": ("head", [0.78] * 4),
            "attn_bias0": ("attn_bias", [-1.9e-4, 1e-4, -2e-4, 0.0]), "attn_bias1": ("attn_bias", [4.1e-4, 0, 3e-4, 1e-4]),
            "remainder": ("remainder", [-1.5e-4, 1e-4, 0.0, -1e-4])}
    low = _dla_summary(rows, torch.bfloat16)
    assert low["dla_zero_components"] == ["attn_bias0", "attn_bias1", "remainder"]
    assert low["dla_last_named_ties"]["within"] == ["L0H3"]  # L1H0's interval reaches 0: said so (review 17a B3)
    f32 = _dla_summary(rows)  # float32: these rows are over its floor, the old behaviour in every dtype
    assert f32["dla_zero_components"] == [] and f32["dla_last_named_ties"]["within"][0] == "L0H3"
    assert f32["dla_last_named_ties"]["within"] == ["L0H3", "attn_bias1", "attn_bias0"]  # never the remainder
    biased = _dla_summary({**rows, "attn_bias1": ("attn_bias", [0.05] * 4)}, torch.bfloat16)  # a real bias stays
    assert biased["dla_zero_components"] == ["attn_bias0", "remainder"]
    assert biased["dla_last_named_ties"]["within"] == ["L0H3", "attn_bias1"]


def test_dla_ties_never_count_the_remainder_or_the_final_norms_bias():
    """Review 17a B3: "L0H4 (+0.61, 95% CI [-0.21, 1.43]), tied with 23 components (15 heads, 3 MLPs, 3 attn_bias,
    1 ln_final_bias, 1 remainder)". The remainder (what the writers do not sum to) and the final norm's bias are not
    writers. By hand as below: L1H0 [1, 0.6, 1, 0.6] -> [0.43, 1.17] holds L0H3 (+0.78), a remainder of 0.8 and an
    ln_final_bias of 0.7; only L0H3 is tied. The review's own summary (written before) lists them; the words drop
    them, and where the last named writer's interval reaches 0 they say that instead of a list."""
    s = _dla_summary({"mlp0": ("mlp", [5, 5.2, 5, 5.2]), "mlp1": ("mlp", [3, 3.2, 3, 3.2]),
                      "L1H0": ("head", [1, 0.6, 1, 0.6]), "L0H3": ("head", [0.78] * 4),
                      "remainder": ("remainder", [0.8] * 4), "ln_final_bias": ("ln_final_bias", [0.7] * 4)})
    ties = s["dla_last_named_ties"]
    assert ties["within"] == ["L0H3"] and ties["reaches_zero"] is False
    assert "tied with 1 other head within its interval (L0H3 +0.78) of a final" in finding("circuits", s)
    old = {**s, "dla_last_named_ties": {"component": "L1H0", "within": ["remainder", "L0H3", "ln_final_bias"],
                                        "kinds": ["remainder", "head", "ln_final_bias"], "means": [0.8, 0.78, 0.7]}}
    assert "tied with 1 other head within its interval (L0H3 +0.78) of a final" in finding("circuits", old)
    review = {**s, "dla_top_intervals": {**s["dla_top_intervals"], "L1H0": {
        "ci": [-0.2107, 1.4280], "mean": 0.6087, "n": 16, "sd": 1.5377}}}
    text = finding("circuits", review)
    assert "L1H0's 95% interval reaches 0: it is not singled out from writing nothing." in text and "tied with" not in text


def test_dla_third_writer_says_who_is_tied_with_it_and_the_totals_of_heads_and_mlps():
    # #34 fifth review: "mlp0, mlp1, L1H0 (+0.83)" hid four heads inside L1H0's interval and that the heads
    # together write more than mlp0. L1H0 [1, 0.6, 1, 0.6]: 0.8, sd 0.2309, t(0.975, 3) = 3.1824, half 0.3674
    # -> [0.43, 1.17]: L0H3 0.78 and L1H3 0.70 inside, L1H1 0.30 outside. Heads summed per example [2.78, 2.38,
    # ...]: 2.58 +- 0.367; MLPs [8, 8.4, ...]: 8.2 +- 0.367.
    s = _dla_summary({"mlp0": ("mlp", [5, 5.2, 5, 5.2]), "mlp1": ("mlp", [3, 3.2, 3, 3.2]),
                      "L1H0": ("head", [1, 0.6, 1, 0.6]), "L0H3": ("head", [0.78] * 4), "L1H3": ("head", [0.7] * 4),
                      "L1H1": ("head", [0.3] * 4)})
    assert s["dla_last_named_ties"]["component"] == "L1H0"
    assert s["dla_last_named_ties"]["within"] == ["L0H3", "L1H3"]
    heads, mlps = s["dla_total_heads"], s["dla_total_mlps"]
    assert heads["count"] == 4 and heads["n"] == 4 and heads["mean"] == pytest.approx(2.58)
    assert heads["ci"] == pytest.approx([2.58 - 0.36742, 2.58 + 0.36742], abs=1e-4)
    assert mlps["count"] == 2 and mlps["mean"] == pytest.approx(8.2) and mlps["ci"][0] == pytest.approx(7.8326, abs=1e-4)
    text = finding("circuits", s)
    assert ("L1H0 (+0.80, 95% CI [0.43, 1.17]), tied with 2 other heads within its interval (L0H3 +0.78, "
            "L1H3 +0.70) of a final logit difference 10.8.") in text, text
    assert ("In total (summed per example) the 4 heads write +2.58 (95% CI [2.21, 2.95]) and the 2 MLPs "
            "+8.20 (95% CI [7.83, 8.57]).") in text, text
    # L1H0 alone in its interval: no tie clause
    alone = _dla_summary({"mlp0": ("mlp", [5, 5.2, 5, 5.2]), "mlp1": ("mlp", [3, 3.2, 3, 3.2]),
                          "L1H0": ("head", [1, 0.6, 1, 0.6]), "L1H1": ("head", [0.3] * 4)})
    assert alone["dla_last_named_ties"]["within"] == [] and "tied with" not in finding("circuits", alone)
    mixed = _dla_summary({"mlp0": ("mlp", [5, 5.2, 5, 5.2]), "mlp1": ("mlp", [3, 3.2, 3, 3.2]),
                          "L1H0": ("head", [1, 0.6, 1, 0.6]), "L0H3": ("head", [0.78] * 4), "mlp2": ("mlp", [0.5] * 4)})
    assert "tied with 2 components (1 head, 1 MLP) within its interval (L0H3 +0.78, mlp2 +0.50)" in finding(
        "circuits", mixed)
    # review 8 C2: heads tied with a named MLP are not "other heads"
    after_mlp = _dla_summary({"L1H0": ("head", [5, 5.2, 5, 5.2]), "L1H1": ("head", [3, 3.2, 3, 3.2]),
                              "mlp2": ("mlp", [1, 0.6, 1, 0.6]), "L0H3": ("head", [0.78] * 4), "L0H0": ("head", [0.7] * 4)})
    text = finding("circuits", after_mlp)
    assert "mlp2 (+0.80, 95% CI [0.43, 1.17]), tied with 2 heads within its interval (L0H3 +0.78, L0H0 +0.70)" in text


def test_mlp_agreement_is_tested_against_its_control_and_between_layers_by_fisher():
    # #34 fifth review: "highest at 14% (18/128) in layer 0; the shuffled control reaches 8%" set side by side
    # untested. Fisher's exact test (scipy, two-sided) on the 2 x 2 tables of k of n neurons.
    from scipy.stats import fisher_exact

    counts, control = {"0": 18, "1": 3, "2": 8}, {"0": 10, "1": 2, "2": 1}
    s = {"agreement_per_layer": {k: v / 128 for k, v in counts.items()}, "agreement_count_per_layer": counts,
         "agreement_shuffled_per_layer": {k: v / 128 for k, v in control.items()},
         "agreement_shuffled_count_per_layer": control, "n_neurons_per_layer": 128, "n_prefixes": 160}
    p = {name: fisher_exact(table)[1] for name, table in {
        "control": [[18, 110], [10, 118]], "l1": [[18, 110], [3, 125]], "l2": [[18, 110], [8, 120]],
        "pooled": [[18, 110], [11, 245]], "l2_control": [[8, 120], [1, 127]]}.items()}
    assert p["control"] == pytest.approx(0.160, abs=1e-3) and p["l2"] == pytest.approx(0.0609, abs=1e-3)
    assert p["l2_control"] < 0.05 < p["control"]
    text = finding("mlp", s)
    assert (f"Against its own shuffled control (10 of 128 neurons, 8%), layer 0 cannot be told from it (Fisher's "
            f"exact test, two-sided, p = {p['control']:.2g}, p_Bonferroni = {3 * p['control']:.2g} over 3 layers)") in text
    # review 8b A5: layer indices in words, not a bare "2" that reads as a count; review 13b A3: 8 of 128 against 1
    # of 128 is p = 0.036, one of 3 tests (x 3 = 0.11): above its control only before correction
    assert p["l2_control"] * 3 > 0.05
    assert ("Layers above their own control at p_Bonferroni < 0.05 (Fisher's p x 3 layers): none; above it only "
            f"before correction: layer 2 (8 of 128, its control 1) p = {p['l2_control']:.2g}, p_Bonferroni = "
            f"{3 * p['l2_control']:.2g}.") in text, text
    two = {**s, "agreement_shuffled_count_per_layer": {**control, "0": 2, "2": 0},
           "agreement_shuffled_per_layer": {**s["agreement_shuffled_per_layer"], "0": 2 / 128, "2": 0}}
    assert 3 * fisher_exact([[18, 110], [2, 126]])[1] < 0.05 and 3 * fisher_exact([[8, 120], [0, 128]])[1] < 0.05
    assert "Layers above their own control at p_Bonferroni < 0.05 (Fisher's p x 3 layers): layers 0 and 2." in finding(
        "mlp", two)
    flat = {**s, "agreement_shuffled_count_per_layer": counts, "agreement_shuffled_per_layer": s["agreement_per_layer"]}
    assert "Layers above their own control at p_Bonferroni < 0.05 (Fisher's p x 3 layers): none." in finding("mlp", flat)
    assert p["pooled"] * 3 < 0.05
    assert (f"layer 0 against the others pooled (11 of 256) p = {p['pooled']:.2g} (p_Bonferroni = {3 * p['pooled']:.2g} "
            "for picking the best of 3 layers), so the layers differ; against each, uncorrected, "
            f"layer 1 (3 of 128) p < 0.001; layer 2 (8 of 128) p = {p['l2']:.2g}") in text, text
    # review 12b C2 (its bfloat16 counts): 4 of 128 in layer 1 against 1 of 256 is p = 0.044 uncorrected, but the layer
    # was picked as the best of 3, so x 3 = 0.13: the layers cannot be told apart
    bf = {"0": 0, "1": 4, "2": 1}
    post = fisher_exact([[4, 124], [1, 255]])[1]
    assert post == pytest.approx(0.044, abs=1e-3)
    text = finding("mlp", {**s, "agreement_count_per_layer": bf, "agreement_per_layer": {k: v / 128 for k, v in bf.items()}})
    assert (f"layer 1 against the others pooled (1 of 256) p = {post:.2g} (p_Bonferroni = {3 * post:.2g} for picking the "
            "best of 3 layers), so the layers cannot be told apart") in text, text
    # the recorded tests are what the analysis computes from the same counts
    from headscope.analyses.mlp.analysis import agreement_tests

    tests = agreement_tests(counts, control, 128)
    assert tests["best_layer"] == "0" and tests["best_vs_others_p"] == pytest.approx(p["pooled"])
    assert tests["control_p_per_layer"] == pytest.approx({"0": p["control"], "1": fisher_exact([[3, 125], [2, 126]])[1],
                                                          "2": p["l2_control"]})
    # a best layer well above its control: "agrees more"
    strong = {**s, "agreement_shuffled_count_per_layer": {"0": 1, "1": 2, "2": 1}}
    assert "layer 0 agrees more (Fisher's exact test, two-sided, p < 0.001, p_Bonferroni < 0.001 over 3 layers)." in \
        finding("mlp", strong)
    below = {**s, "agreement_shuffled_count_per_layer": {"0": 40, "1": 2, "2": 1}}  # 18 against 40 of 128
    p_below = fisher_exact([[18, 110], [40, 88]])[1]
    assert (f"layer 0 agrees less (Fisher's exact test, two-sided, p = {p_below:.2g}, p_Bonferroni = {3 * p_below:.2g} "
            "over 3 layers): these MLPs show no key-value memory on this corpus that the test can detect after "
            "correction") in finding("mlp", below)


def test_mlp_layers_above_their_control_are_bonferroni_corrected_and_agree_with_the_verdict():
    """Review 13b A3 (its counts): layer 1 is highest (18 of 128, control 10: p = 0.16) and the finding said "these
    MLPs show no key-value memory ... the test can detect" and then "Layers above their own control at p < 0.05:
    layer 3" (10 of 128 against 2: p = 0.034, one of 4 tests, x 4 = 0.14). Both now read the corrected p, in the
    summary's recorded tests and the finding alike, also from a summary recorded before the correction."""
    from scipy.stats import fisher_exact

    from headscope.analyses.mlp.analysis import agreement_tests

    counts, control = {"0": 4, "1": 18, "2": 13, "3": 10}, {"0": 7, "1": 10, "2": 8, "3": 2}
    p = {l: fisher_exact([[counts[l], 128 - counts[l]], [control[l], 128 - control[l]]])[1] for l in counts}
    assert p["3"] == pytest.approx(0.0342, abs=1e-4) and p["1"] == pytest.approx(0.160, abs=1e-3)
    tests = agreement_tests(counts, control, 128)
    assert tests["control_p_bonferroni_per_layer"] == pytest.approx({l: min(1.0, 4 * v) for l, v in p.items()})
    assert tests["above_control_layers"] == [] and tests["above_control_uncorrected_only"] == ["3"]
    s = {"agreement_per_layer": {k: v / 128 for k, v in counts.items()}, "agreement_count_per_layer": counts,
         "agreement_shuffled_per_layer": {k: v / 128 for k, v in control.items()},
         "agreement_shuffled_count_per_layer": control, "n_neurons_per_layer": 128, "n_prefixes": 439}
    old = {l: tests[l] for l in ("best_layer", "best_vs_layer_p", "best_vs_others_p", "control_p_per_layer")}
    for summary in ({**s, "agreement_tests": tests}, {**s, "agreement_tests": old}, s):  # recorded now, before, none
        text = finding("mlp", summary)
        assert (f"layer 1 cannot be told from it (Fisher's exact test, two-sided, p = {p['1']:.2g}, p_Bonferroni = "
                f"{4 * p['1']:.2g} over 4 layers): these MLPs show no key-value memory on this corpus that the test can "
                "detect after correction for the layers tested.") in text, text
        assert ("Layers above their own control at p_Bonferroni < 0.05 (Fisher's p x 4 layers): none; above it only "
                "before correction: layer 3 (10 of 128, its control 2) p = 0.034, p_Bonferroni = 0.14.") in text, text
    # a layer above its control after correction (10 of 128 against 0: p = 0.0014 x 4 = 0.006) is named, and the
    # verdict on "these MLPs" is then not stated, only the highest layer's own
    clear = {**s, "agreement_shuffled_count_per_layer": {**control, "3": 0},
             "agreement_shuffled_per_layer": {**s["agreement_shuffled_per_layer"], "3": 0.0}}
    assert 4 * fisher_exact([[10, 118], [0, 128]])[1] < 0.05
    text = finding("mlp", clear)
    assert "layer 1 cannot be told from it (Fisher's exact test, two-sided, p = 0.16, p_Bonferroni = 0.64 over 4 " \
           "layers). Layers above their own control at p_Bonferroni < 0.05 (Fisher's p x 4 layers): layer 3." in text
    assert "no key-value memory" not in text


def test_mlp_control_verdict_and_its_sentence_read_one_level(monkeypatch):
    """One significance level, chance.ALPHA, read where it is used: at a stricter level (0.01), layer 3 (12 of 128
    against its control's 1: Fisher p = 0.0027, x 4 layers = 0.011, between 0.01 and 0.05) is above its control only
    before correction in the sentence, in the verdict and in compare's label alike, on a summary recorded before the
    verdicts were (older) and on one with no recorded tests; at 0.05 it is above it in all three."""
    from scipy.stats import fisher_exact

    from headscope.analyses.core import chance
    from headscope.reports.compare_verdicts import VERDICTS
    from headscope.reports.plots_mlp import control_layers

    counts, control = {"0": 4, "1": 18, "2": 13, "3": 12}, {"0": 7, "1": 10, "2": 8, "3": 1}
    p = {l: fisher_exact([[counts[l], 128 - counts[l]], [control[l], 128 - control[l]]])[1] for l in counts}
    assert 0.01 < 4 * p["3"] < 0.05 and p["3"] < 0.01 and min(p[l] for l in "012") > 0.05  # the premise
    s = {"agreement_per_layer": {k: v / 128 for k, v in counts.items()}, "agreement_count_per_layer": counts,
         "agreement_shuffled_per_layer": {k: v / 128 for k, v in control.items()},
         "agreement_shuffled_count_per_layer": control, "n_neurons_per_layer": 128, "n_prefixes": 439}
    older = {**s, "agreement_tests": {"control_p_per_layer": p}}  # before the Bonferroni verdicts were recorded
    for level, above, said in ((0.05, "layer 3", ": layer 3."),
                               (0.01, "none", f": none; above it only before correction: layer 3 (12 of 128, its control "
                                               f"1) p = {p['3']:.2g}, p_Bonferroni = {4 * p['3']:.2g}.")):
        monkeypatch.setattr(chance, "ALPHA", level)
        for summary in (older, s):
            text = finding("mlp", summary)
            assert f"Layers above their own control at p_Bonferroni < {level:g} (Fisher's p x 4 layers){said}" in text, text
            assert ("these MLPs show no key-value memory" in text) == (level == 0.01)
            assert control_layers(summary) == above
            assert (f"mlp layers above their own shuffled control at p_Bonferroni < {level:g}", above, {}, above) in \
                VERDICTS["mlp"](summary)


def test_attribution_rollout_does_better_at_the_one_level(monkeypatch):
    """The paired rollout-minus-raw tests pass at chance.ALPHA: Holm-corrected p = 0.02 passes at 0.05, not at 0.01."""
    from headscope.analyses.core import chance

    s = {"n_examples": 4, "metric": "logit_diff", "mean_tau_attention_gradient": -0.09, "std_tau_attention_gradient": 0.1,
         "mean_tau_attention_ig": -0.08, "std_tau_attention_ig": 0.05, "mean_tau_rollout_gradient": 0.40,
         "mean_tau_rollout_ig": 0.38, "ig_converged": True, "ig_used": "all", "ig_n_not_converged": 0,
         "rollout_vs_raw": {"gradient": {"mean": 0.49, "n": 4, "ci": [0.15, 0.82], "p_holm": 0.02},
                            "ig": {"mean": 0.46, "n": 4, "ci": [0.38, 0.55], "p_holm": 0.0012}}}
    assert "does better (paired per example, rollout minus raw tau over 4 examples, Holm-corrected over 2 references) " \
           "against gradient x input" in finding("attribution", s)
    monkeypatch.setattr(chance, "ALPHA", 0.01)
    text = finding("attribution", s)
    assert "Holm-corrected over 2 references) against integrated gradients" in text
    assert "but not significantly against gradient x input (tau 0.40 against raw -0.09; paired difference +0.49" in text


def test_mlp_counts_tests_and_sizes_are_each_layers_own_memories():
    """#34 review 7b, A1: layers with different numbers of memories (a dense layer of 128 beside a mixture of
    4 experts x 32 with a shared expert of 64, as Qwen2-MoE's mlp_only_layers) are each counted, tested and
    named with their own n: Fisher's exact tests from scipy on k of that layer's n, the best layer by share."""
    from scipy.stats import fisher_exact

    from headscope.analyses.mlp.analysis import agreement_tests

    sizes, counts, control = {"0": 128, "1": 192}, {"0": 10, "1": 30}, {"0": 6, "1": 5}
    tests = agreement_tests(counts, control, sizes)
    assert tests["best_layer"] == "1"  # 30/192 = 16% beats 10/128 = 8%
    assert tests["control_p_per_layer"] == pytest.approx({"0": fisher_exact([[10, 118], [6, 122]])[1],
                                                          "1": fisher_exact([[30, 162], [5, 187]])[1]})
    assert tests["best_vs_others_p"] == pytest.approx(fisher_exact([[30, 162], [10, 118]])[1])
    s = {"agreement_per_layer": {k: v / sizes[k] for k, v in counts.items()}, "agreement_count_per_layer": counts,
         "agreement_shuffled_per_layer": {k: v / sizes[k] for k, v in control.items()},
         "agreement_shuffled_count_per_layer": control, "n_memories_per_layer": sizes, "n_prefixes": 160,
         "experts_per_layer": {"1": {"n_experts": 4, "expert_width": 32, "top_k": 2, "shared_width": 64}}}
    text = finding("mlp", s)
    assert text.startswith("Layer 1 is a mixture of experts: its memories are 192 expert neurons (4 experts x 32 + a "
                           "shared expert of 64, top-2 routing), a neuron's coefficient being its expert's router weight"), text
    assert "(30 of 192 expert neurons, Wilson 95% CI 11%-21%) in layer 1" in text  # Wilson, closed form: 0.1117, 0.2143
    assert "(the shared expert's: its sigmoid gate times its activation, on every token)." in text
    import pandas as pd

    from headscope.reports.plots_mlp import neuron_labels  # the shared expert (index 4) is named, never "routed"

    top = pd.DataFrame({"layer": [1, 1], "neuron": [130, 37], "expert": [4, 1], "expert_neuron": [2, 5], "n_routed": [8, 3]})
    assert neuron_labels(top, 8, shared={"1": 4}) == ["L1 shared n2", "L1 E1 n5 (routed 3/8)"]
    assert "Against its own shuffled control (5 of 192 expert neurons, 3%), layer 1 agrees more" in text
    assert f"layer 1 against the others pooled (10 of 128) p = {fisher_exact([[30, 162], [10, 118]])[1]:.2g}" in text
    # a Mixtral run from before the fix (review 7b's summary): counts over one expert's 96 of 384 are not used
    stale = {"agreement_per_layer": {"0": 40 / 384, "1": 33 / 384}, "agreement_count_per_layer": {"0": 10, "1": 8},
             "agreement_shuffled_per_layer": {"0": 15 / 384, "1": 7 / 384},
             "agreement_shuffled_count_per_layer": {"0": 4, "1": 2}, "n_neurons_per_layer": 96, "n_prefixes": 258,
             "agreement_tests": {"control_p_per_layer": {"0": 0.163, "1": 0.100}, "best_layer": "0"},
             "mixture_of_experts": True}
    text = finding("mlp", stale)
    assert text.startswith("These layers are mixtures of experts, and this run is from before headscope counted every "
                           "expert's neurons") and "of 96" not in text and "p = 0.16" not in text, text


def test_attribution_leaves_out_integrated_gradients_that_did_not_converge():
    """Review 6, A3: IG whose attributions sum to -259 for a change of +10 on 3 of 4 examples says so and gives no
    tau, no rollout comparison and no significance count (the summary's fraction already leaves its taus out)."""
    s = {"n_examples": 4, "metric": "logit_diff",
         "mean_tau_attention_gradient": -0.09, "std_tau_attention_gradient": 0.1,
         "mean_tau_attention_ig": -0.08, "std_tau_attention_ig": 0.05,
         "mean_tau_rollout_gradient": 0.40, "mean_tau_rollout_ig": 0.38,
         "rollout_vs_raw": {"gradient": {"mean": 0.49, "n": 4, "ci": [0.15, 0.82], "p_holm": 0.02},
                            "ig": {"mean": 0.46, "n": 4, "ci": [0.38, 0.55], "p_holm": 0.0012}},
         "fraction_significant": 0.25, "n_tau_tests": 8, "ig_max_steps_used": 32}
    converged = finding("attribution", {**s, "ig_converged": True, "ig_used": "all", "ig_n_not_converged": 0})
    assert "integrated gradients at mean Kendall tau -0.08" in converged and "completeness" not in converged
    assert "integrated gradients (tau 0.38 against raw -0.08" in converged
    text = finding("attribution", {**s, "ig_converged": False, "ig_n_not_converged": 3, "ig_n_converged": 1,
                                    "ig_used": "none", "ig_examples_used": [], "ig_error_tolerance": 0.1,
                                    "ig_worst": {"example": 2, "attribution_sum": -259.0, "metric_change": 10.02,
                                                 "relative_error": 26.77}})
    assert ("Integrated gradients missed completeness (error over 0.1x the metric change) on 3 of 4 examples (worst: "
            "attributions sum to -259 for a metric change of +10 on example 2, an error of 26.8x the change; at most 32 "
            "steps): 1 converged, too few (IG is used on its converged examples when they are at least half and at "
            "least 2), so its taus are not used; more steps needed.") in text
    assert "likely reason" not in text  # float32 or no dtype recorded: steps are the remedy
    assert "integrated gradients at mean" not in text and "tau 0.38" not in text and "0.0012" not in text
    assert "gradient x input (tau 0.40 against raw -0.09; paired difference +0.49" in text
    assert "2 of 8 per-example taus" in text



@pytest.mark.parametrize("dtype, bits", [("bfloat16", "8 significant bits, about 2 to 3 significant digits")])
def test_attribution_names_a_half_precision_as_the_likely_reason_ig_missed(dtype, bits):
    """Review 8 (C6), its numbers: in bfloat16 IG missed completeness on 3 of 4 examples (relative errors 0.106,
    0.107, 0.159) where float32 missed on 1; the finding now names a half precision (bfloat16: 8 bits of
    significand, float16: 11) as the likely reason, in place of "more steps needed", and a float32 run keeps it."""
    s = {"n_examples": 4, "metric": "logit_diff", "mean_tau_attention_gradient": 0.05, "std_tau_attention_gradient": 0.2,
         "ig_converged": False, "ig_n_not_converged": 3, "ig_n_converged": 1, "ig_used": "none",
         "ig_examples_used": [], "ig_error_tolerance": 0.1, "ig_dtype": dtype,
         "ig_worst": {"example": 2, "attribution_sum": 0.841, "metric_change": 1.0, "relative_error": 0.159}}
    head = ("Integrated gradients missed completeness (error over 0.1x the metric change) on 3 of 4 examples (worst: "
            "attributions sum to 0.841 for a metric change of +1 on example 2, an error of 0.159x the change): 1 "
            "converged, too few (IG is used on its converged examples when they are at least half and at least 2), so "
            "its taus are not used")
    text = finding("attribution", s)
    assert (f"{head}. A likely reason: the run is in {dtype}, whose gradients carry {bits}; a float32 run may "
            "converge.") in text, text
    assert "more steps needed" not in text
    text = finding("attribution", {**s, "ig_dtype": "float32"})  # steps are the remedy there
    assert head + "; more steps needed." in text and "likely reason" not in text
    some = {**s, "ig_used": "converged", "ig_n_not_converged": 1, "ig_n_converged": 3, "ig_examples_used": [0, 1, 3],
            "mean_tau_attention_ig": 0.3, "std_tau_attention_ig": 0.05, "n_tau_attention_ig": 3}
    text = finding("attribution", some)
    assert "are from the 3 converged examples only. A likely reason: the run is in" in text
    assert "likely reason" not in finding("attribution", {**some, "ig_dtype": "float32"})
    # float16's step is 8x finer (2^-10 x (2 + 1 + 0.841) = 0.0038): the same 0.159 miss is 42 of its steps, not its rounding
    assert "Not float16's rounding: the worst miss, 0.159, is 42 times" in finding("attribution", {**s, "ig_dtype": "float16"})

def test_attribution_blames_bfloat16_only_for_a_miss_its_rounding_can_explain():
    """Review 12b A6, its bfloat16 ig.csv: example 2 sums to 10.2076 for f(x) 8.9375, f(b) 9.375 (change -0.4375):
    a miss of 10.645, where float32 missed by 20.85 on the same example. One bfloat16 step of the endpoints and the
    sum is 2^-7 x (8.9375 + 9.375 + 10.2076) = 0.2228 (by hand), so the miss is 48 steps: not the precision's."""
    import pandas as pd

    from headscope.analyses.attribution.convergence import ig_convergence

    ig = pd.DataFrame({"example": [0, 2, 1, 3], "attribution_sum": [3.1102, 10.2076, 4.9483, 23.8435],
                       "metric_input": [7.8125, 8.9375, 8.0625, 7.125],
                       "metric_baseline": [0.71875, 9.375, 3.125, 1.9375]})
    conv = ig_convergence(ig, dtype="bfloat16")
    assert conv["ig_worst"]["example"] == 2
    assert conv["ig_worst"]["rounding_floor"] == pytest.approx(2.0 ** -7 * (8.9375 + 9.375 + 10.2076), rel=1e-6)
    s = {"n_examples": 4, "metric": "logit_diff", "mean_tau_attention_gradient": 0.05, "std_tau_attention_gradient": 0.2,
         "ig_max_steps_used": 32, **conv}
    text = finding("attribution", s)
    assert "likely reason: the run is in bfloat16" not in text and "float32 run may converge" not in text
    assert ("Not bfloat16's rounding: the worst miss, 10.6, is 48 times one bfloat16 rounding step of the endpoint "
            "metrics and the attributions (0.22; rounding explains up to 16), so a float32 run would miss too") in text
    # a miss of a few steps (review 8: 0.159 on a change of 1) is still put down to the precision
    small = ig.assign(attribution_sum=[6.5, -0.3, 4.9, 5.6])  # example 2 misses by 0.1375 of 0.4375: 0.6 steps
    text = finding("attribution", {**s, **ig_convergence(small, dtype="bfloat16")})
    assert "A likely reason: the run is in bfloat16, whose gradients carry 8 significant bits" in text


def test_attribution_names_the_step_cap_where_doubling_the_steps_moved_the_miss():
    """Review 17a B4, its bfloat16 ig table (StableLM, --quick): example 2 sums to 10.0718 for f(x) 8.5098, f(b)
    -0.2969, Captum's delta 0.5679 at 16 steps and 1.2593 at 32, the cap. The old words blamed bfloat16 (the miss,
    1.27, is 8.3 of its rounding steps, under 16), though float32 missed by 0.138x on the same example and converged
    at 64 steps with the cap at 256. Doubling the steps moved the delta by 0.691 = 4.5 bfloat16 steps
    (2^-7 x (8.5098 + 1 + 10.0718) = 0.153, by hand): the steps set it, so the finding names the cap and how to
    raise it; a delta that doubling moves by rounding only keeps the precision as the likely reason."""
    import pandas as pd

    from headscope.analyses.attribution.convergence import ig_convergence

    ig = pd.DataFrame({"example": [0, 1, 2, 3], "n_steps": [16, 32, 32, 8],
                       "attribution_sum": [8.021571, 0.802731, 10.071774, 6.958617],
                       "delta": [-0.336828, -0.041019, 1.259274, 0.263305],
                       "delta_half": [0.875865, 0.362008, 0.567883, float("nan")],
                       "metric_input": [8.72168, -0.15625, 8.509766, 5.695312],
                       "metric_baseline": [0.359375, -1.03125, -0.296875, -1.0]})
    conv = ig_convergence(ig, dtype="bfloat16", max_steps=32)
    floor = 2.0 ** -7 * (8.509766 + 1 + 10.071774)
    assert conv["ig_max_steps"] == 32 and conv["ig_worst"]["rounding_floor"] == pytest.approx(floor, rel=1e-6)
    assert (conv["ig_worst"]["delta"], conv["ig_worst"]["delta_half"]) == (1.259274, 0.567883)
    s = {"n_examples": 4, "metric": "logit_diff", "mean_tau_attention_gradient": 0.05, "std_tau_attention_gradient": 0.2,
         "ig_max_steps_used": 32, **conv}
    text = finding("attribution", s)
    moved = (1.259274 - 0.567883) / floor
    assert f"{moved:.1f}" == "4.5"
    # review 18v B2: the miss grew (0.568 -> 1.26) as the steps doubled, so no more steps are advised
    assert (" Doubling example 2's steps from 16 to 32 steps (the cap) moved its miss (Captum's convergence delta) from "
            "+0.568 to +1.26, by 4.5 times one bfloat16 rounding step (0.15), so the precision does not set it: a float32 "
            "run would miss too: the miss grew with the steps, so the integral is not converging at these step counts; "
            "the data do not show that more steps would close it, nor that the step count is the cause.") in text, text
    assert "float32 run may converge" not in text and "the run is in bfloat16" not in text
    assert "raise the cap" not in text and "more may converge" not in text and "likely reason: the step cap" not in text
    f32 = finding("attribution", {**s, **ig_convergence(ig, dtype="float32", max_steps=256)})  # no precision, no 32 cap
    assert (" Doubling example 2's steps from 16 to 32 steps moved its miss (Captum's convergence delta) from +0.568 to "
            "+1.26: the miss grew with the steps") in f32 and "--quick" not in f32
    # the same example shrinking by as much (1.26 at 16 steps, 0.568 at 32): the step cap, and how to raise it
    shrank = ig.assign(delta=[-0.336828, -0.041019, 0.567883, 0.263305], delta_half=[0.875865, 0.362008, 1.259274, None])
    text = finding("attribution", {**s, **ig_convergence(shrank, dtype="bfloat16", max_steps=32)})
    assert ("A likely reason: the step cap: doubling example 2's steps from 16 to 32 steps (the cap) moved its miss "
            "(Captum's convergence delta) from +1.26 to +0.568, by 4.5 times one bfloat16 rounding step (0.15), so the "
            "precision does not set it: a float32 run would miss too; the miss shrank with the steps but is not resolved "
            "at these, and more may converge it: raise the cap (ig_max_steps, 32 here; --quick's, a run without --quick "
            "doubles up to 256; in Python hs.attribution(model, task, ig_max_steps=...)).") in text, text
    # the delta moved by one rounding step (under MOVED_STEPS = 2) and the miss is 8.3 steps: the precision may set it
    still = ig.assign(delta_half=[0.875865, 0.362008, 1.259274 - floor, float("nan")])
    text = finding("attribution", {**s, **ig_convergence(still, dtype="bfloat16", max_steps=32)})
    assert ("A likely reason: the run is in bfloat16, whose gradients carry 8 significant bits, about 2 to 3 significant "
            "digits (doubling its steps moved it by rounding only); a float32 run may converge.") in text


@pytest.mark.parametrize("bad", [1, 2])
def test_attribution_says_every_example_whose_integrated_gradients_missed_completeness(bad):
    """Review 7b, A3: 2 of 4 examples missed completeness (errors 0.156 and 0.255 at 32 steps), the summary said
    ig_converged True and the finding gave IG's tau with no caveat. Now any example that misses it is said, with the
    count and the worst error, and IG's tau is named as from the k converged examples, its interval over k (scipy)."""
    k = 4 - bad
    s = {"n_examples": 4, "metric": "logit_diff", "mean_tau_attention_gradient": 0.05, "std_tau_attention_gradient": 0.2,
         "mean_tau_attention_ig": 0.30, "std_tau_attention_ig": 0.05, "n_tau_attention_ig": k,
         "mean_tau_rollout_gradient": 0.1, "mean_tau_rollout_ig": 0.35,
         "ig_converged": False, "ig_n_not_converged": bad, "ig_n_converged": k, "ig_used": "converged",
         "ig_examples_used": [0, 1, 2][:k], "ig_error_tolerance": 0.1, "ig_max_steps_used": 32,
         "ig_worst": {"example": 3, "attribution_sum": -0.633, "metric_change": -0.85, "relative_error": 0.255}}
    text = finding("attribution", s)
    lo, hi = stats.t.interval(0.95, k - 1, loc=0.30, scale=0.05 / k ** 0.5)
    assert "Over 4 examples, last-layer attention agrees with gradient x input at mean Kendall tau 0.05" in text
    assert (f"integrated gradients from the {k} converged examples at mean Kendall tau 0.30, 95% CI "
            f"[{lo:.2f}, {hi:.2f}]") in text
    assert (f"Integrated gradients missed completeness (error over 0.1x the metric change) on {bad} of 4 examples (worst: "
            "attributions sum to -0.633 for a metric change of -0.85 on example 3, an error of 0.255x the change; at most "
            f"32 steps): its taus, and the comparisons that rest on them, are from the {k} converged examples only.") in text
    # the same summary as review 7b's, written before the rule (ig_converged True beside 2 not converged): its IG
    # taus are over every example, so they are not used
    old = {k_: v for k_, v in s.items() if k_ not in ("ig_used", "ig_examples_used", "ig_n_converged")}
    text = finding("attribution", {**old, "ig_converged": True})
    assert "integrated gradients at mean" not in text and "converged examples at mean" not in text
    assert (f"on {bad} of 4 examples (worst: attributions sum to -0.633 for a metric change of -0.85 on example 3, an "
            "error of 0.255x the change; at most 32 steps): this summary's IG taus include those examples, so they are not "
            "used, nor its count of significant taus, which counts them.") in text
    assert "significant at p" not in finding("attribution", {**old, "ig_converged": True, "fraction_significant": 0.25,
                                                             "n_tau_tests": 12})


def test_attribution_mean_absolute_change_has_no_negative_bound():
    """Review 6, A8: 'mean absolute change 1.7, 95% CI [-1.26, 4.66]' is impossible: the summary's bootstrap
    interval is printed, and an older summary's t interval is clipped at 0 and said so."""
    s = {"n_examples": 4, "metric": "logit_diff", "median_permutation_tvd": 0.05, "permutation_layer": 1,
         "permutation_metric_change": 0.2, "permutation_metric_change_sd": 1.0, "permutation_metric_change_n": 4,
         "permutation_abs_metric_change": 1.7, "permutation_abs_metric_change_sd": 1.86,
         "permutation_abs_metric_change_n": 4}
    hi = 1.7 + stats.t.ppf(0.975, 3) * 1.86 / 2  # 4.66; the low end 1.7 - 2.96 < 0
    assert f"(mean absolute change 1.7, 95% CI [0, {hi:.3g}], the t interval's lower bound clipped at 0)" in finding(
        "attribution", s)
    text = finding("attribution", {**s, "permutation_abs_metric_change_ci": [0.45, 3.6]})
    assert "(mean absolute change 1.7, bootstrap 95% CI [0.45, 3.6] over examples)" in text
    assert "-1.26" not in text


def test_heads_finding_names_the_encoder_metric_a_do_nothing_model_and_experts():
    """Review 7 (BERT, Mixtral): the cosine with the model's own output is 1 by construction and the gradient
    differentiates another objective; all heads removable within 1% says the heads do little, not that some
    are redundant; on a mixture of experts the orders can disagree because the router switches experts."""
    enc = {"metric": "cosine", "baseline_metric": 1.0000000149, "n_examples": 16, "n_heads": 12,
           **_prunable("ablation", 12, 12, 12), **_prunable("gradient", 12, 12, 12)}
    text = finding("heads", enc)
    assert ("The metric is the cosine of each pruned model's pooled embedding with the unpruned model's own (1 unpruned: "
            "each embedding's cosine with itself, over 16 examples); the gradient ordering differentiates the in-batch "
            "contrastive loss instead") in text
    assert "Unpruned cosine similarity is" not in text and "by construction" not in text
    # review 11a C1: a summary whose cosine was taken in bfloat16 (0.99902) is not "by construction": its rounding
    rounded = finding("heads", {**enc, "baseline_metric": 0.9990234375})
    assert ("own (0.999023 unpruned, not 1: each embedding's cosine with itself, off 1 by the rounding of the cosine's "
            "own arithmetic, so changes of this size are that rounding, not the model, over 16 examples)") in rounded
    assert ("Every ordering removes all 12 heads within 1%: the heads' writes barely move this metric (as in an untrained "
            "model at its initial scale), so this says the heads do little here, not that some are redundant") in text
    some = finding("heads", {**enc, **_prunable("ablation", 3, 3, 3)})
    assert "Every ordering removes all" not in some and "experts" not in some
    moe = {"metric": "logit_diff", "baseline_metric": 10.4, "n_examples": 16, "n_heads": 8, "mixture_of_experts": True,
           **_prunable("ablation", 4, 4, 5), **_prunable("gradient", 0, 0, 3)}
    assert ("The blocks are mixtures of experts: removing a head can switch the experts the router picks, which the "
            "first-order gradient cannot see") in finding("heads", moe)
    assert "mixtures of experts" not in finding("heads", {**moe, "mixture_of_experts": False})
    assert "by construction" not in finding("heads", moe)  # a decoder's logit difference is measured


def test_moe_words_name_which_blocks_are_mixtures_of_experts():
    """Review 11c A3: on a Qwen2-MoE whose block 1 is dense among MoE blocks 0 and 2 the heads finding said "The
    blocks are mixtures of experts", and the circuits finding named mlp0-mlp2 alike; each says which blocks are."""
    moe = {"metric": "logit_diff", "baseline_metric": 10.4, "n_examples": 16, "n_heads": 12, "n_layers": 3,
           "mixture_of_experts": True, "moe_layers": [0, 2], **_prunable("ablation", 4, 4, 5),
           **_prunable("gradient", 0, 0, 3)}
    text = finding("heads", moe)
    assert "Blocks 0 and 2 are mixtures of experts: removing a head can switch the experts the router picks" in text
    assert "The blocks are" not in text
    assert "Block 2 is a mixture of experts: " in finding("heads", {**moe, "moe_layers": [2]})
    assert "The blocks are mixtures of experts: " in finding("heads", {**moe, "moe_layers": [0, 1, 2]})
    dla = {"n_examples": 8, "n_layers": 3, "moe_layers": [0, 2], "dla_final_logit": 8.79,
           "dla_top_components": {"mlp0": 5.74, "L0H2": 1.2, "mlp1": 0.47}}
    text = finding("circuits", dla)
    assert ("The MLP components mlp0 and mlp2 are whole mixture-of-experts blocks (every expert the router chose and any "
            "shared expert together); mlp1 is a dense MLP.") in text
    assert text.count("mixture-of-experts") == 1
    assert "mixture" not in finding("circuits", {**dla, "moe_layers": []})
    # review 11c C4 (numbers of its Qwen2-MoE): the top MoE block's DLA split by expert, named when it stands clear
    # of the next expert (the paired difference's interval excludes 0), else the two are said to tie
    top = {"layer": 0, "layer_mean": 5.93, "difference": 1.58, "difference_ci": [0.6, 2.56], "tied": False,
           "top": {"expert": 3, "shared": False, "mean": 3.51, "ci": [2.1, 4.9], "n": 16, "n_routed": 12},
           "next": {"expert": 4, "shared": True, "mean": 1.93, "ci": [1.2, 2.7], "n": 16, "n_routed": 16}}
    assert ("Split by expert (dla_experts_mean.csv), mlp0's +5.93 comes most from expert 3 (+3.51, 95% CI [2.10, 4.90], "
            "n = 16, routed on 12 of 16 examples), clear of the shared expert (+1.93, 95% CI [1.20, 2.70], n = 16, on "
            "every example; |expert 3| - |the shared expert| = +1.58, 95% CI [0.60, 2.56]).") in finding(
        "circuits", {**dla, "dla_top_expert": top})
    tied = finding("circuits", {**dla, "dla_top_expert": {**top, "difference_ci": [-0.2, 3.3], "tied": True}})
    assert ("expert 3 (+3.51, 95% CI [2.10, 4.90], n = 16, routed on 12 of 16 examples) and the shared expert (+1.93, "
            "95% CI [1.20, 2.70], n = 16, on every example) tie (|expert 3| - |the shared expert| = +1.58, 95% CI "
            "[-0.20, 3.30]; the interval contains 0)") in tied and "clear of" not in tied
    assert "Split by expert" not in text  # no per-expert entry: nothing said


def test_mlp_finding_says_why_dense_neurons_rank_first_and_names_the_experts_by_their_routed_mean():
    """Review 16b B1: on Qwen3-MoE (dense layer 0, experts in 1-2) the "largest mean updates" could only be layer 0's:
    an expert neuron's mean counts 0 on its unrouted examples. Review 17v B1: the routed ranking named three neurons
    of one expert routed on 2 of 16 examples, with no interval, and said dense neurons rank first "by construction"
    (an expert routed on all 16 loses nothing). Now experts routed on fewer than 5 are not ranked (named instead), each
    mean has its 95% t interval: layer 2 expert 5's neuron 52, 0.458 with sd 0.72 over 7 (the review's hand values):
    t(0.975, 6) = 2.4469 x 0.72 / sqrt(7) = 0.666 -> [-0.208, 1.12]."""
    from scipy import stats

    lo, hi = stats.t.interval(0.95, 6, loc=0.458, scale=0.72 / 7 ** 0.5)
    moe = {"n_experts": 6, "expert_width": 64, "top_k": 2, "shared_width": 0}
    s = {"n_memories_per_layer": {"0": 192, "1": 384, "2": 384}, "experts_per_layer": {"1": moe, "2": moe},
         "n_task_examples": 16, "routed_min": 5,
         "top_neurons": [{"layer": 0, "neuron": 135, "task_update_norm": 0.809},
                         {"layer": 0, "neuron": 57, "task_update_norm": 0.671}],
         "top_expert_neurons_routed": [
             {"layer": 2, "neuron": 372, "expert": 5, "expert_neuron": 52, "task_update_norm_routed": 0.458,
              "ci": [lo, hi], "n_routed": 7},
             {"layer": 2, "neuron": 10, "expert": 0, "expert_neuron": 10, "task_update_norm_routed": 0.301,
              "ci": [0.25, 0.352], "n_routed": 16}],
         "experts_routed_too_few": [{"layer": 1, "expert": 1, "n_routed": 2}]}
    text = finding("mlp", s)
    assert ("The largest mean updates ||m_i v_i|| at the answer are layer 0 neuron 135 (0.809, a dense MLP) and layer 0 "
            "neuron 57 (0.671, a dense MLP). These means count 0 for a routed expert's neuron on the examples not "
            "routed to its expert, so a dense layer's neurons, which write on every example, tend to rank above them; "
            "by the mean over its routed examples alone among experts routed on at least 5 of 16 examples (not ranked, "
            "routed on fewer: layer 1 expert 1 (2)) the largest are layer 2 expert 5's neuron 52 (0.458, 95% CI "
            f"[0.00, {hi:.2f}], over the 7 of 16 examples routed to it) and layer 2 expert 0's neuron 10 (0.301, "
            "95% CI [0.25, 0.35], over the 16 of 16 examples routed to it): their 95% intervals overlap, so their "
            "order is not shown (t intervals over the routed examples, clipped at 0: a norm is never negative).") \
        in text, text
    assert "by construction" not in text
    assert f"[{lo:.2f}, {hi:.2f}]" == "[-0.21, 1.12]"  # review 18v B4: the t interval of a norm reached below 0
    clear = {**s, "top_expert_neurons_routed": [{**s["top_expert_neurons_routed"][0], "ci": [0.4, 0.52],
                                                 "task_update_norm_routed": 0.46}, s["top_expert_neurons_routed"][1]]}
    assert ("over the 16 of 16 examples routed to it): the first's 95% interval lies above the others'.") in finding(
        "mlp", clear)
    everyone = {**s, "top_neurons": [{"layer": 1, "neuron": 81, "task_update_norm": 0.104, "expert": 1,
                                      "expert_neuron": 17, "n_routed": 2, "shared": False}]}
    assert "so the ranking mixes how strongly a neuron writes with how often its expert is chosen" in finding(
        "mlp", everyone)
    none = {**s, "top_expert_neurons_routed": []}
    assert ("no expert is routed on enough examples to rank its neurons by their routed mean (not ranked, routed on "
            "fewer: layer 1 expert 1 (2)).") in finding("mlp", none)
    assert "These means count 0" not in finding("mlp", {k: v for k, v in s.items()
                                                        if k not in ("top_expert_neurons_routed", "experts_routed_too_few")})


def test_mlp_finding_names_top_experts_with_their_routing_and_bfloat16_margins():
    """Review 11c C3, C2: the MoE mlp finding names its top neurons' experts with n_routed in words, and in bfloat16
    how many examples' top-2 choice is within one rounding step per MoE layer (none: said so); "at most one step
    apart", as routing_margins counts a margin of exactly one step (review 16b B2: the words said "less than")."""
    moe = {"n_experts": 4, "expert_width": 64, "top_k": 2, "shared_width": 96}
    s = {"n_memories_per_layer": {"0": 352, "1": 128, "2": 352}, "experts_per_layer": {"0": moe, "2": moe},
         "n_task_examples": 16, "routing_dtype": "bfloat16", "routing_within_rounding": {"0": 0, "2": 3},
         "top_neurons": [{"layer": 0, "neuron": 220, "task_update_norm": 3.04, "expert": 3, "expert_neuron": 28,
                          "n_routed": 12, "shared": False},
                         {"layer": 0, "neuron": 306, "task_update_norm": 2.21, "expert": 4, "expert_neuron": 50,
                          "n_routed": 16, "shared": True},
                         {"layer": 1, "neuron": 5, "task_update_norm": 1.1}]}
    text = finding("mlp", s)
    assert ("The largest mean updates ||m_i v_i|| at the answer are layer 0 expert 3's neuron 28 (3.04, routed on 12 of "
            "16 examples), layer 0's shared expert's neuron 50 (2.21, on every example) and layer 1 neuron 5 (1.1, a "
            "dense MLP).") in text
    assert ("In bfloat16, the router's top-2 choice at the answer position is within one rounding step of its logits "
            "(the last chosen and the next logit at most one step apart) on 0 of 16 examples at layer 0 and 3 of 16 "
            "examples at layer 2") in text
    none = finding("mlp", {**s, "routing_within_rounding": {"0": 0, "2": 0}})
    assert ("In bfloat16, no example's top-2 choice of experts at the answer position is within one rounding step of "
            "the router logits (layers 0 and 2, 16 examples).") in none
    assert "rounding" not in finding("mlp", {k: v for k, v in s.items() if not k.startswith("routing")})
    # review 20e A1: a router that ranks a sigmoid plus a correction bias is said to, with the scores' dtype
    score = {"0": "sigmoid of the logits plus the correction bias (float32)", "2": "logits (bfloat16)"}
    scored = finding("mlp", {**s, "routing_score": score})
    assert ("within one rounding step of the scores it ranks (sigmoid of the logits plus the correction bias "
            "(float32)) (the last chosen and the next score at most one step apart) on 0 of 16") in scored


def test_attribution_states_every_method_its_significance_count_counts():
    """Review 7 C6: "5 of 16 per-example taus are significant" counted saliency's tests (4 examples x 4 methods)
    while saliency's tau was never said; each method's tau is stated and the count is split by method."""
    s = {"n_examples": 4, "n_tau_tests": 16, "fraction_significant": 0.3125}
    for key, mean, frac in (("saliency", -0.0847, 0.5), ("gradient", 0.168, 0.5), ("loo", 0.152, 0.25), ("ig", -0.043, 0.0)):
        s.update({f"mean_tau_attention_{key}": mean, f"std_tau_attention_{key}": 0.2, f"n_tau_attention_{key}": 4,
                  f"frac_significant_attention_{key}": frac})
    text = finding("attribution", s)
    assert "last-layer attention agrees with saliency at mean Kendall tau -0.08" in text
    assert ("5 of 16 per-example taus (31%; saliency 2, gradient x input 2, leave-one-out 1, integrated gradients 0) are "
            "significant at p < 0.05") in text


def _recall(**extra) -> dict:
    """Review 7's recall run (out_t), by hand: gap 20.4 (10.2 - -10.2); clean and corrupted differ at -7, -4 (the
    queried name) and -1; the name's embedding (resid_pre 0 at -4) restores 0.96, the answer position holds 0.87 by
    layer 1 (written by layer 0's attention, 0.86) and the whole gap at layer 2's input, by construction."""
    gap = 20.4

    def cell(layer, end, share, lo, hi, head=None):
        return {"layer": layer, "head": head, "pos": None if end is None else 34 + end, "from_end": end,
                "token": "" if end is not None else "all", "effect": share * gap, "ci": [lo * gap, hi * gap], "n": 8}

    return {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 8, "n_positions": 34,
            "clean_metric": 10.2, "corrupted_metric": -10.2,
            "top_sites": {"resid_pre": [cell(2, -1, 1.0, 0.965, 1.033), cell(0, -4, 0.956, 0.913, 0.998),
                                        cell(1, -1, 0.868, 0.758, 0.979), cell(1, -4, 0.114, -0.034, 0.261)],
                          "attn_out": [cell(0, -1, 0.864, 0.753, 0.974), cell(1, -1, 0.324, 0.107, 0.541)],
                          "mlp_out": [cell(1, -1, 0.501, 0.37, 0.631), cell(0, -5, 0.002, -0.001, 0.005)],
                          "head_out": [{**cell(0, None, 0.146, 0.065, 0.227), "head": 0},
                                       {**cell(0, None, 0.144, 0.036, 0.252), "head": 1},
                                       {**cell(1, None, 0.111, 0.036, 0.186), "head": 0}]},
            "at_corrupted_token": {"from_end": {"-7": 8}, "n": 8, "positions_differ": [3, 3],
                                   "differ_from_end": {"-7": 8, "-4": 8, "-1": 8}, "sites": {}},
            **extra}


def test_patching_names_every_tied_head_their_shared_kv_head_and_a_shared_effect():
    """Review 9b A2 (multi-query Llama, 4 query heads on 1 KV head): head_out L0H1 0.10 [0.06, 0.14], L0H3 0.10,
    L0H2 0.10 [0.04, 0.15], L0H0 0.08 [0.04, 0.11], each inside the others' intervals; "tied with L0H3" named one of
    three. Alone they restore 0.37 of the gap in sum, layer 0's attention at the answer position 0.98 [0.92, 1.05]."""
    gap = 23.74

    def head(h, share, lo, hi, layer=0):
        return {"layer": layer, "head": h, "pos": None, "token": "all", "effect": share * gap,
                "ci": [lo * gap, hi * gap], "n": 8}

    s = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 8, "n_positions": 12,
         "clean_metric": 11.70, "corrupted_metric": -12.04, "n_heads": 4, "n_kv_heads": 1,
         "top_sites": {"attn_out": [{"layer": 0, "head": None, "pos": 11, "from_end": -1, "token": "is",
                                     "effect": 0.98 * gap, "ci": [0.92 * gap, 1.05 * gap], "n": 8}],
                       "head_out": [head(1, 0.101, 0.062, 0.140), head(3, 0.099, 0.059, 0.138),
                                    head(2, 0.096, 0.043, 0.150), head(0, 0.076, 0.042, 0.109),
                                    head(0, 0.009, 0.003, 0.015, layer=1)]}}
    text = finding("patching", s)
    assert ("head_out at L0H1 (0.10, 95% CI [0.06, 0.14] over 8 examples), tied with L0H3, L0H2 and L0H0 (0.08-0.10 "
            "each, all 4 within each other's 95% intervals)") in text
    assert ("The 4 tied layer-0 heads share 1 KV head (multi-query attention: one KV head per layer): they read the same "
            "keys and values.") in text
    total = 0.101 + 0.099 + 0.096 + 0.076  # 0.372
    assert (f"Patched alone, all 4 of layer 0's heads restore {total:.2f} of the gap in sum; together (attn_out at layer "
            "0, position -1 from the end) 0.98, 95% CI [0.92, 1.05] over 8 examples: the effect is shared among them, "
            "not carried by one head.") in text
    # grouped-query, 2 KV heads for 4: L0H0-L0H1 read KV head 0 and L0H2-L0H3 KV head 1, so 4 heads on 2 KV heads
    assert ("The 4 tied layer-0 heads share 2 KV heads (grouped-query attention: 4 query heads on 2 KV heads per layer)"
            in finding("patching", {**s, "n_kv_heads": 2}))
    assert "KV head" not in finding("patching", {**s, "n_kv_heads": 4})  # one KV head per query head: nothing shared
    # L0H0 outside L0H1's interval: it is not listed, and an attn_out no larger than the heads' sum is no shared effect
    s["top_sites"]["head_out"][3].update(effect=0.03 * gap, ci=[0.01 * gap, 0.05 * gap])
    s["top_sites"]["attn_out"][0].update(effect=0.33 * gap, ci=[0.30 * gap, 0.36 * gap])
    text = finding("patching", s)
    assert "tied with L0H3 and L0H2 (0.10 each, all 3 within each other's 95% intervals)" in text
    assert "shared among them" not in text


def test_k_and_v_cells_are_named_by_their_kv_head_and_three_cells_give_no_agreement():
    """Review 9b A3/C4 (out_full, multi-query: one KV head a layer): "v at L0H0 (0.94 ...)" named layer 0's only KV
    head as query head 0 (linked to its pattern); k's and v's 3 cells (one a layer) were worded as mostly zero
    ("the other 0 cells have no exact effect") with r = 0.935 printed as agreement."""
    gap = 24.4
    s = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 32, "n_positions": 12,
         "clean_metric": 12.1, "corrupted_metric": -12.3, "n_heads": 4, "n_kv_heads": 1,
         "top_sites": {"v": [{"layer": 0, "head": 0, "pos": None, "token": "all", "effect": 0.9367 * gap,
                              "ci": [0.86 * gap, 1.01 * gap], "n": 32}]},
         "attribution_correlation": {"k": {"n": 3, "n_nonzero": 3, "pearson": 0.9346, "pearson_without_top": None,
                                           "slope": 0.0066, "slope_ci": [-0.025, 0.039], "slope_n": 3, "spearman": 1.0,
                                           "spearman_nonzero": 1.0}}}
    text = finding("patching", s)
    assert ("moves the metric most at the v at layer 0's KV head 0 (shared by all 4 query heads: multi-query "
            "attention): 0.94 of the clean-corrupted gap, 95% CI [0.86, 1.01] over 32 examples") in text
    assert "L0H0" not in text
    assert ("k: 3 cells (1 KV head per layer), too few to read agreement from r (under 10 cells: no interval; Spearman "
            "1.00; slope 0.01, attribution over exact)") in text
    assert "0.935" not in text and "the other 0 cells" not in text and "0 tied zeros" not in text
    gqa = finding("patching", {**s, "n_kv_heads": 2})  # 4 query heads on 2 KV heads: KV head 0 is read by 0 and 1
    assert "v at layer 0's KV head 0 (read by query heads 0-1: grouped-query attention)" in gqa
    assert "v at L0H0: 0.94" in finding("patching", {**s, "n_kv_heads": 4})  # a KV head per query head is that head


def test_layer_zero_at_the_one_differing_position_is_said_to_rebuild_the_clean_run():
    """Review 20a B3 (redone): where each pair differs at one position only, patching the embeddings there (resid_pre,
    layer 0) makes the corrupted run the clean one: its 1.00 is by construction, said in the lead, start- or
    end-aligned. Where pairs differ at several positions (review 7's three) it is a measurement and says nothing."""
    s = _recall()
    s["at_corrupted_token"] = {**s["at_corrupted_token"], "positions_differ": [1, 1], "differ_from_end": {"-4": 8}}
    text = finding("patching", s)
    assert ("moves the metric most at the resid_pre at layer 0, position -4 from the end: 0.96 of the clean-corrupted "
            "gap, 95% CI [0.91, 1.00] over 8 examples (+19.5 logit difference); at layer 0 this is the embedding of the "
            "one token where each clean prompt differs from its corrupted one, so the patched run is the clean run and "
            "its share is 1 by construction, not a finding about the model.") in text
    assert "by construction, not a finding about the model" not in finding("patching", _recall())
    half = {**s["at_corrupted_token"], "differ_from_end": {"-4": 5, "-5": 3}}  # prompts differ at other places
    assert "not a finding about the model" not in finding("patching", {**s, "at_corrupted_token": half})


def test_a_tie_at_the_answer_position_is_a_cell_there():
    """Review 9a C5: "It has reached the answer position at the resid_pre at layer 2, position -1 (0.33), tied with
    layer 0, position -8 (0.25)": the tied cell was the corrupted token's, away from the answer position."""
    s = _recall()
    rows = s["top_sites"]["resid_pre"]  # the answer position's layer-1 cell (0.87) is followed by one at -6 (0.80)
    rows.insert(3, {**rows[2], "layer": 0, "pos": 28, "from_end": -6, "effect": 0.80 * 20.4, "ci": [0.7 * 20.4, 0.9 * 20.4]})
    text = finding("patching", s)
    assert ("It has reached the answer position at the resid_pre at layer 1, position -1 from the end (0.87, 95% CI "
            "[0.76, 0.98] over 8 examples), moved there by attention") in text
    assert "position -6 from the end (0.80" not in text
    rows[3].update(from_end=-1, pos=33, layer=0)  # the same cell at the answer position is a tie there
    assert ("(0.87, 95% CI [0.76, 0.98] over 8 examples), tied with layer 0, position -1 from the end (0.80, 95% CI "
            "[0.70, 0.90] over 8 examples), moved there") in finding("patching", s)


def test_patching_leads_where_the_information_enters_and_says_the_answer_positions_whole_gap_is_by_construction():
    """#34 review 7 (C1-C2): patching the last block's input at the answer position restores the whole gap by
    construction; the finding leads with the name's embedding (0.96) and the move to the answer position (0.87 by
    layer 1, layer 0's attention 0.86), says once why the 1.00 cell is trivial, names the three positions that differ
    between clean and corrupted once, and a head tied with the next (0.146 and 0.144, each inside the other's
    interval) is called tied."""
    text = finding("patching", _recall())
    lead = ("Away from the answer position, where the information enters (clean and corrupted differ there), patching "
            "(denoise, 8 examples) moves the metric most at the resid_pre at layer 0, position -4 from the end: 0.96 of "
            "the clean-corrupted gap, 95% CI [0.91, 1.00] over 8 examples (+19.5 logit difference).")  # 0.956 x 20.4
    assert lead in text
    assert ("It has reached the answer position at the resid_pre at layer 1, position -1 from the end (0.87, 95% CI "
            "[0.76, 0.98] over 8 examples), moved there by attention: attn_out at layer 0, position -1 from the end "
            "(0.86, 95% CI [0.75, 0.97] over 8 examples).") in text
    trivial = ("The residual stream at the answer position (-1 from the end, where the metric is read) carries the whole "
               "gap from the resid_pre at layer 2 on (1.00 of the clean-corrupted gap, 95% CI [0.96, 1.03] over 8 "
               "examples (+20.4 logit difference)): once the information has arrived there this holds by construction")
    assert trivial in text and text.index(lead) < text.index(trivial)
    assert "most at the resid_pre at layer 2" not in text and text.count("layer 2") == 1  # stated once, as trivial
    # the positions that differ are named once; no clause repeats that its token differs
    assert text.count("Each clean prompt differs from its corrupted one at 3 positions: -7, -4 and -1 from the end.") == 1
    assert "its token differs across prompts" not in text
    assert ("Next, at other sites: mlp_out at layer 1, position -1 from the end (0.50, 95% CI [0.37, 0.63] over 8 "
            "examples); head_out at L0H0 (0.15, 95% CI [0.07, 0.23] over 8 examples), tied with L0H1 and L1H0 "
            "(0.11-0.15 each, all 3 within each other's 95% intervals).") in text  # L1H0's 0.111 is inside L0H0's too
    # a fourth layer whose input at the answer position carries it too: the layers where it holds are named
    s = _recall()
    s["top_sites"]["resid_pre"].append({**s["top_sites"]["resid_pre"][0], "layer": 3})
    assert ("from the resid_pre at layer 2 on (1.00 of the clean-corrupted gap, 95% CI [0.96, 1.03] over 8 examples "
            "(+20.4 logit difference); on this run at resid_pre layers 2 and 3): once") in finding("patching", s)
    # noising: the shares are negative, -1.00 the whole gap destroyed, and the answer position's is as trivial
    s = _recall(direction="noise")
    for rows in s["top_sites"].values():
        for c in rows:
            c.update(effect=-c["effect"], ci=[-c["ci"][1], -c["ci"][0]])
    text = finding("patching", s)
    assert "from the resid_pre at layer 2 on (-1.00 of the clean-corrupted gap, 95% CI [-1.03, -0.96]" in text
    assert "(noise, 8 examples) moves the metric most at the resid_pre at layer 0, position -4 from the end: -0.96" in text
    # L0H1 outside L0H0's interval: not tied; a summary without the differing places says which tokens vary instead
    s = _recall()
    s["top_sites"]["head_out"][1]["effect"] = 0.05 * 20.4
    del s["at_corrupted_token"]["differ_from_end"]
    text = finding("patching", s)
    assert "head_out at L0H0 (0.15, 95% CI [0.07, 0.23] over 8 examples), tied with L1H0 (0.11, 95% CI" in text
    assert "L0H1" not in text
    assert "resid_pre at layer 0, position -4 from the end (its token differs across prompts): 0.96" in text
    # a metric not read at the last position has no answer position there: the strongest cell leads, as before
    text = finding("patching", _recall(metric_at_last_position=False))
    assert "(denoise, 8 examples) moves the metric most at the resid_pre at layer 2, position -1 from the end: 1.00" in text
    assert "by construction" not in text and "Away from the answer position" not in text
    # layer 2's cell short of the whole gap (0.80, interval below 1): nothing is trivial, and it is cited as reached
    s = _recall()
    s["top_sites"]["resid_pre"][0].update(effect=0.80 * 20.4, ci=[0.70 * 20.4, 0.90 * 20.4])
    text = finding("patching", s)
    assert "by construction" not in text and lead in text
    assert "It has reached the answer position at the resid_pre at layer 1, position -1 from the end (0.87" in text


def test_attribution_states_rollouts_taus_with_their_intervals():
    """Review 9b (C5): out_t's rollout agrees with saliency at mean tau 0.93 (sd 0.09 over 4 examples, 3 of 4 taus
    significant), the strongest agreement tau.png draws, and the finding never named rollout; the significance count
    was last-layer attention's only. The t interval by scipy, clipped to tau's [-1, 1]."""
    s = {"n_examples": 4, "n_tau_tests": 16, "fraction_significant": 0.0625}
    last = {"saliency": (0.1389, 0.5828, 0.0), "gradient": (0.4115, 0.2525, 0.25), "loo": (0.1683, 0.4146, 0.0),
            "ig": (0.2663, 0.2126, 0.0)}
    flow = {"saliency": (0.9345, 0.0899, 0.75), "gradient": (0.1087, 0.2742, 0.0), "loo": (0.425, 0.3404, 0.25),
            "ig": (0.3325, 0.2548, 0.0)}
    for prefix, taus in (("attention", last), ("rollout", flow)):
        for key, (mean, sd, frac) in taus.items():
            s.update({f"mean_tau_{prefix}_{key}": mean, f"std_tau_{prefix}_{key}": sd, f"n_tau_{prefix}_{key}": 4,
                      f"frac_significant_{prefix}_{key}": frac})
    text = finding("attribution", s)
    half = stats.t.ppf(0.975, 3) * 0.0899 / 2  # sd / sqrt(4)
    lo, hi = 0.9345 - half, min(1.0, 0.9345 + half)
    assert 0.9345 + half > 1  # the interval is clipped
    assert (f"Attention rollout (attention composed through the layers) agrees with saliency at mean Kendall tau 0.93, "
            f"95% CI [{lo:.2f}, {hi:.2f}], gradient x input at mean Kendall tau 0.11") in text, text
    assert "3 of 4 against saliency" in text
    assert "For last-layer attention, 1 of 16 per-example taus" in text


def test_below_chance_against_the_corrupted_prompts_is_a_preference_the_prompt_does_not_change():
    """Review 9b (C1): the untrained model's logit difference, -0.174 (95% CI [-0.25, -0.099], 16 examples), was
    "worse than guessing, it systematically prefers the wrong answers", while the corrupted prompts give -0.126 for the
    same answer pairs (clean minus corrupted -0.048, its paired interval containing 0)."""
    from headscope.reports.plots import quiet_reason

    entry = {"at_chance": True, "below_chance": True, "metric": "logit_diff", "mean": -0.174, "chance_value": 0.0,
             "ci": [-0.25, -0.099], "ci_level": 0.95, "n_examples": 16, "task": "succ", "corrupted_mean": -0.126,
             "corrupted_ci": [-0.214, -0.038], "clean_minus_corrupted": {"mean": -0.048, "ci": [-0.11, 0.014], "n": 16},
             "prompt_independent": True}
    text = finding("heads", {**HEADS, "chance": entry})
    assert ("The model is below chance on task succ (logit difference -0.174 against chance 0 (no preference on average "
            "between the answer and the wrong answer), 95% CI [-0.25, -0.099]): below 0 by 0.17 logits, and the corrupted "
            "prompts give "
            "a similar -0.126 (95% CI [-0.214, -0.038]; clean minus corrupted -0.048, 95% CI [-0.11, 0.014], paired over "
            "16 prompts: within noise): a preference among the answer tokens that does not depend on the prompt, not a "
            "response to it; relative findings are not reported.") in text, text
    assert "systematically prefers" not in text
    assert "prefers wrong answers" not in quiet_reason({"chance": entry})
    # the untrained run's own numbers: a paired interval clear of 0, but a difference under the 0.1-logit floor
    under = {**entry, "floor": 0.1, "clean_minus_corrupted": {"mean": -0.0483, "ci": [-0.0758, -0.0208], "n": 16}}
    assert ("paired over 16 prompts, under the 0.1-logit effect floor): a preference among the answer tokens"
            in finding("heads", {**HEADS, "chance": under}))
    circuits = finding("circuits", {"dla_final_logit": -0.17, "dla_top_components": {"mlp0": -0.1}, "chance": entry})
    assert "a preference among the answer tokens that does not depend on the prompt, not the task's" in circuits
    assert "wrong answers" not in circuits
    # the clean prompts clearly under the corrupted ones: the old verdict, with both numbers
    clear = {**entry, "corrupted_mean": 0.9, "clean_minus_corrupted": {"mean": -1.07, "ci": [-1.3, -0.8], "n": 16},
             "prompt_independent": False}
    text = finding("heads", {**HEADS, "chance": clear})
    assert ("worse than guessing, it systematically prefers the wrong answers, by 0.17 logits (the corrupted prompts give "
            "0.9, 95% CI [-0.214, -0.038]; clean minus corrupted -1.07") in text, text


def test_heads_says_a_layer_whose_heads_each_suffice_is_redundant():
    """Review 9b (A2): the heads finding left out that any one of the four layer-0 heads does the job while removing
    all four costs the whole metric (best_head.csv: -12.78, SE 1.06 over 16 examples, of 11.85). The t interval by
    scipy; at chance nothing is said."""
    entry = {"layer": 0, "n_heads": 4, "layer_removed_change": -12.78, "layer_removed_change_se": 1.06, "n_examples": 16,
             "max_ablation_head": 2, "max_ablation": -0.1108, "worst_head": 2, "worst_change": -0.649,
             "worst_change_se": 0.209}
    text = finding("heads", {**HEADS, "metric": "logit_diff", "redundant_layers": [entry]})
    half = stats.t.ppf(0.975, 15) * 1.06
    assert (f"Layer 0's 4 heads are redundant: removing all of them changes the logit difference by -12.8, 95% CI "
            f"[{-12.78 - half:+.3g}, {-12.78 + half:+.3g}] over 16 examples, while no one head's own ablation moves it by "
            "more than 0.11 (L0H2) and keeping any one of them alone changes it by at most -0.65 (L0H2): one head does "
            "the layer's work") in text, text
    at_chance = {**HEADS, "redundant_layers": [entry], "chance": {"at_chance": True, "metric": "logit_diff", "mean": 0.01}}
    assert "redundant" not in finding("heads", at_chance)


def _code_word(**extra) -> dict:
    """Review 10a's Phi-3 copy run (out_t), by hand: gap 15.15 (7.6 - -7.55); the code word sits at -59 (1 prompt, the
    only one that long), -35 (2), -30 (2), -14 (1) and -6 (2) from the end. Aligned on it, resid_pre restores 15.15
    [13.83, 16.47] at layer 0, 7.21 [3.71, 10.71] at layer 1 and 0.072 [0.0128, 0.131] at layer 2 (8 prompts each).
    End-aligned, the -59 column holds that one prompt (17.95, no interval), -30 and -35 five."""
    def cell(layer, end, effect, ci, n):
        return {"layer": layer, "head": None, "pos": 64 + end, "from_end": end, "token": "63:  is" if end == -1 else "",
                "effect": effect, "ci": ci, "n": n}

    return {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 8, "n_positions": 64,
            "clean_metric": 7.6, "corrupted_metric": -7.55,
            "top_sites": {"resid_pre": [cell(0, -59, 17.95, None, 1), cell(2, -1, 15.08, [13.79, 16.37], 8),
                                        cell(1, -59, 10.90, None, 1), cell(1, -1, 8.26, [5.48, 11.05], 8),
                                        cell(0, -30, 5.80, [-4.07, 15.67], 5), cell(0, -35, 5.55, [-3.89, 15.0], 5),
                                        cell(0, -6, 3.88, [-2.17, 9.93], 8)],
                          "mlp_out": [cell(0, -1, 2.9, [1.8, 4.1], 8), cell(0, -59, 2.4, None, 1)]},
            "at_corrupted_token": {
                "from_end": {"-6": 2, "-30": 2, "-35": 2, "-14": 1, "-59": 1}, "n": 8, "positions_differ": [1, 1],
                "differ_from_end": {"-59": 1, "-35": 2, "-30": 2, "-14": 1, "-6": 2},
                "sites": {"resid_pre": [
                    {"layer": 0, "effect": 15.15, "ci": [13.83, 16.47], "n": 8,
                     "end_aligned": {"effect": 17.95, "from_end": -59}},
                    {"layer": 1, "effect": 7.21, "ci": [3.71, 10.71], "n": 8,
                     "end_aligned": {"effect": 10.90, "from_end": -59}},
                    {"layer": 2, "effect": 0.072, "ci": [0.0128, 0.131], "n": 8,
                     "end_aligned": {"effect": 15.08, "from_end": -1}}]}},
            **extra}


def test_patching_on_a_token_at_different_places_from_the_end_leads_aligned_and_ranks_no_one_prompt_column():
    """Review 10a A3 / 10b C1: "moves the metric most at the resid_pre at layer 0, position -59 from the end: 1.18 of
    the gap, n = 1" was one prompt's column (17.95 / 15.15) ranked against averages; the token-aligned result (1.00,
    0.48, 0.005 of the gap: 15.15, 7.21 and 0.072 over 15.15) was never stated. It now leads; the end-aligned cell
    cited is one at least half the prompts reach, with what it holds and its interval reaching 0; no cell is tied with
    a one-prompt column (review 10a's seed-1 run: "tied with layer 0, position -68 (0.16, n = 1 examples)")."""
    text = finding("patching", _code_word())
    lead = ("Patching (denoise, 8 examples) the resid_pre at the corrupted token (each prompt's first position that "
            "differs from its clean prompt; it sits at -6 from the end in 2 prompts, -30 in 2, -35 in 2, -14 in 1 and "
            "-59 in 1, so end-aligned columns split its effect) restores at layer 0 1.00 of the clean-corrupted gap "
            "(95% CI [0.91, 1.09], 8 of 8 prompts, +15.2 logit difference), by construction (patching the embedding of "
            "each pair's only differing token makes the patched run the clean run); at layer 1 0.48 (95% CI [0.24, 0.71], 8 of 8 "
            "prompts); at layer 2 0.005 (95% CI [0.0008, 0.009], 8 of 8 prompts).")  # 0.072 / 15.15 = 0.0048
    assert lead in text
    end = ("the largest residual cell away from the answer position is the resid_pre at layer 0, position -30 from the "
           "end: 0.38 of the clean-corrupted gap, 95% CI [-0.27, 1.03] over 5 examples (+5.8 logit difference) (its CI "
           "reaches 0: 5 of 8 prompts reach this column and 2 of 8 have their changed token there).")  # 5.80 / 15.15
    assert end in text and text.index(lead) < text.index(end)
    assert "moves the metric most" not in text and "1.18" not in text and "-59 from the end (" not in text
    assert "tied with" not in text  # mlp_out -1 (0.19 [0.12, 0.27]) and the one-prompt -59 cell (0.16) inside it
    assert "mlp_out at layer 0, position -1 from the end (' is') (0.19, 95% CI [0.12, 0.27] over 8 examples)" in text
    # review 10b: the deciding word's column reached by all 8 prompts, its interval across 0, 2 of 8 have it there
    s = _code_word()
    s["top_sites"]["resid_pre"][4:5] = [{**s["top_sites"]["resid_pre"][4], "n": 8, "ci": [-2.42, 11.5]}]
    assert "95% CI [-0.16, 0.76] over 8 examples (+5.8 logit difference) (its CI reaches 0: 2 of 8 prompts have their " \
           "changed token there)." in finding("patching", s)
    # the long prompts half of them: -30 reached by 4 of 8 is cited; by 3 it is not, -6 (8 prompts) is
    s["top_sites"]["resid_pre"][4].update(n=4)
    assert "position -30 from the end: 0.38" in finding("patching", s)
    s["top_sites"]["resid_pre"][4].update(n=3)
    s["top_sites"]["resid_pre"][5].update(n=3)
    assert "position -6 from the end: 0.26 of the clean-corrupted gap" in finding("patching", s)  # 3.88 / 15.15


ENCODER_ATTRIBUTION = {"n_examples": 4, "metric": "cosine", "output_change": "1-cosine", "permutation_layer": 2,
                       "n_permutations": 20, "mean_tau_attention_gradient": 0.06, "std_tau_attention_gradient": 0.3}


def test_attribution_on_an_encoder_says_what_the_partner_cosine_measures_and_where_it_is_at_its_ceiling():
    """Review 11a A5: the encoder's gradient metric is the cosine with a partner example's pooled embedding, 0.9995 for
    two prompts of one label; the finding says what it measures and, from the summary's partner_ceiling, on how many
    examples it is at its ceiling (>= 0.99) and how little can move it there (1 - cosine: hand values below)."""
    cos = np.array([-0.3876, 0.99955, 0.99931, -0.3898])  # the review's ig.csv metric_input
    at = cos[cos >= 0.99]
    headroom = float(np.median(1 - at))  # 0.00057
    entry = {"n_saturated": 2, "n_examples": 4, "threshold": 0.99, "is_saturated": False, "examples": [1, 2],
             "median_headroom": headroom, "median_token_ig": 1.6e-4}
    text = finding("attribution", {**ENCODER_ATTRIBUTION, "partner_ceiling": entry})
    assert ("differentiate the cosine of each prompt's pooled embedding with another example's: a similarity to a "
            "partner, not the model's answer") in text
    assert "at its ceiling (>= 0.99) on 2 of 4 examples (examples 1, 2; median 1 - cosine 0.00057): no token" in text, text
    assert "a median |attribution| of 0.00016" in text and "not evidence of graded agreement" in text
    assert "most examples" not in text  # 2 of 4 is not most
    rounded = finding("attribution", {**ENCODER_ATTRIBUTION, "partner_ceiling": {**entry, "median_headroom": 0.0}})
    assert "median 1 - cosine 0: the cosine rounds to 1)" in rounded  # a bfloat16 cosine of 0.9995
    said = finding("attribution", {**ENCODER_ATTRIBUTION, "partner_ceiling": {**entry, "n_saturated": 0, "examples": [],
                                                                               "median_headroom": None}})
    assert "a similarity to a partner" in said and "ceiling" not in said
    assert "partner" not in finding("attribution", ENCODER_ATTRIBUTION)  # an older summary: no record, no claim


def test_attribution_permutation_within_rounding_is_said_so_with_its_spread():
    """Review 11a B1, C2, C5: a 1 - cosine median under the summary's rounding floor (8 float32 steps below 1,
    8 x 2^-24) is "within float32 rounding", an exact 0 "below the metric's rounding", neither "barely moves"; a
    measured change carries its per-example range and n (the review's MiniLM: 0.39 to 0.44 over 4)."""
    floor = {"dtype": "float32", "floor": 8 * 2.0 ** -24, "ulps": 8}
    s = {**ENCODER_ATTRIBUTION, "median_permutation_change": 2 * 2.0 ** -24, "permutation_rounding_floor": floor,
         "permutation_change_range": [2.0 ** -24, 4 * 2.0 ** -24], "permutation_change_n": 4}
    text = finding("attribution", s)
    assert ("Permuting layer 2's attention leaves the output unchanged within float32 rounding (median 1-cosine "
            "1.19e-07; per-example medians 5.96e-08 to 2.38e-07 over 4 examples, under 8 float32 rounding steps of a "
            "cosine near 1, 4.8e-07)") in text, text
    assert "barely moves" not in text
    zero = finding("attribution", {**s, "median_permutation_change": 0.0, "permutation_change_range": [0.0, 0.0]})
    assert "unchanged below the metric's rounding (median 1-cosine exactly 0" in zero and "barely moves" not in zero
    old = {**ENCODER_ATTRIBUTION, "median_permutation_tvd": 0.0}  # an older summary's key, exact 0 too
    assert "below the metric's rounding" in finding("attribution", old)
    moved = finding("attribution", {**s, "median_permutation_change": 0.401, "permutation_change_range": [0.388, 0.443]})
    assert ("changes the output by a median 1-cosine of 0.401; per-example medians 0.388 to 0.443 over 4 "
            "examples.") in moved, moved


def test_patching_names_its_most_common_differing_positions_before_cutting_the_list():
    """#34 verify 11b N3: nine differing positions, -5 in 4 of 7 pairs and the rest in 1: the cut keeps -5 (it was
    cut by position, so the most common one was "1 more")."""
    from headscope.reports.patching_sites import differing_positions

    places = {str(o): 1 for o in (-22, -19, -16, -15, -14, -13, -12, -11)} | {"-5": 4}
    s = {"at_corrupted_token": {"n": 7, "positions_differ": [1, 6], "differ_from_end": places}}
    text = differing_positions(s)
    assert text.startswith("Each clean prompt differs from its corrupted one at 1 to 6 positions: -5 (4 of 7 pairs), "
                           "-22 (1 of 7 pairs), -19 (1 of 7 pairs)")
    assert "-11 (1 of 7 pairs)" not in text and text.endswith("and 1 more from the end.")


def test_a_sink_ratio_just_under_the_threshold_never_prints_as_the_threshold():
    """Review 12c A2: layer 0's mass 0.176 against the uniform 0.1203 is 1.4636x, which one decimal printed "1.5x"
    beside "none is at least 1.5x"; either side of 1.5 the printed ratio keeps its side."""
    from headscope.reports.findings import beside

    rows = [{"layer": 0, "mass": 0.176, "uniform": 0.1203, "ci": [0.16, 0.19], "excess_ci": [0.041, 0.070],
             "ratio": 1.4636, "n": 16, "sink": False},
            {"layer": 1, "mass": 0.185, "uniform": 0.1203, "ci": [0.17, 0.20], "excess_ci": [0.05, 0.08],
             "ratio": 1.5378, "n": 16, "sink": True}]
    text = finding("kv", {"sinks": rows})
    assert "layer 0 0.18 [0.16, 0.19] (1.46x), layer 1 0.18 [0.17, 0.20] (1.5x)." in text, text
    assert [beside(v, 1.5) for v in (1.4636, 1.46, 1.4999, 1.49999, 1.5, 1.5378, 1.44, 0.6)] == \
        ["1.46", "1.46", "1.4999", "1.4999", "1.5", "1.5", "1.4", "0.6"]


def test_kv_says_nothing_of_windows_that_no_prompt_reaches():
    """Review 12b A4: windows of 48 on prompts of at most 41 tokens (context 40) hide nothing: no sink-window clause,
    no "Sliding-window layers" paragraph, no sinks "outside the window"; the memory sentence (the model's context of
    128, where the window binds) stays. A window of 16 on the same prompts binds and is said."""
    hold = {"grid": [8, 40], "tolerance": 0.01, "n_examples": 16, "policies": {
        "window": {"budget": 8, "below": None, "at": {"budget": 8, "share": 0.3, "n_evicting": 16, "n_examples": 16,
                                                      "change": 0.001, "ci_low": -0.002, "ci_high": 0.004}},
        "sink_window": {"budget": 8, "below": None, "at": {"budget": 8, "share": 0.3, "n_evicting": 16,
                                                           "n_examples": 16, "change": 0.001, "ci_low": -0.002,
                                                           "ci_high": 0.004}}}}
    s = {"sliding_windows": {"0": 48, "1": 48, "2": 48}, "context_positions": 40, "n_sink": 4, "holding_budgets": hold,
         "metric_unevicted": 7.63, "metric": "logit_diff", "n_examples": 16, "sinks": REVIEW5_SINKS,
         "bytes_per_token": 768, "bytes_per_token_per_layer": 256, "bytes_at_n_ctx": 36096, "n_ctx": 128,
         "sink_mass_per_layer": {"0": 0.15, "1": 0.325, "2": 0.101}}
    text = finding("kv", s)
    for said in ("whose window holds the first token", "Sliding-window layers", "outside the window", "slide over"):
        assert said not in text, (said, text)
    assert "sliding window of 48" in text  # the memory sentence, about the full context
    text = finding("kv", {**s, "sliding_windows": {"0": 16, "1": 48, "2": 48}})
    assert "on sliding-window layer 0 over the queries whose window holds the first token" in text, text
    assert ("Sliding-window layers: layer(s) 0 slide over a window of 16 keys and hold at most 15 past positions "
            "whatever the budget. A budget") in text and "so from budget 15 on they evict only from layer(s) 1, 2" in text


def test_a_section_that_cannot_tell_names_the_same_runs_larger_sample_of_its_task():
    """Review 13b A2: attribution's 4 examples (1.3, CI [-0.735, 3.34]) cannot tell; the same report's heads section
    measured 16 of the same task at 2.54 [0.824, 4.25]. The sentence names that larger sample; samples of another task,
    another metric, fewer examples or themselves undetermined are not used."""
    from headscope.reports.findings import larger_sample_sentence

    wide = {"undetermined": True, "at_chance": False, "metric": "logit_diff", "mean": 1.3, "ci": [-0.735, 3.34],
            "n_examples": 4, "task": "recall"}
    heads = {"at_chance": False, "metric": "logit_diff", "mean": 2.54, "ci": [0.824, 4.25], "n_examples": 16,
             "task": "recall"}
    others = {"heads": {"chance": heads}, "patching": {"chance": {**heads, "n_examples": 4, "mean": 3.6}},
              "kv": {"chance": {**heads, "n_examples": 64, "task": "kv"}},
              "mlp": {"chance": {**heads, "n_examples": 32, "metric": "logprob"}}}
    assert larger_sample_sentence(wide, others) == ("The heads section's 16 examples of the same task are above chance "
                                                    "(logit difference 2.54, 95% CI [0.824, 4.25]).")
    at = {"heads": {"chance": {**heads, "at_chance": True, "mean": 0.02, "ci": [-0.3, 0.34]}}}
    assert larger_sample_sentence(wide, at).endswith("are at chance (logit difference 0.02, 95% CI [-0.3, 0.34]).")
    assert larger_sample_sentence({**wide, "undetermined": False}, others) == ""
    assert larger_sample_sentence(wide, {"patching": others["patching"], "kv": others["kv"]}) == ""


def test_the_report_section_that_cannot_tell_cites_the_same_runs_larger_sample(tmp_path):
    from headscope.reports import io as report_io
    from headscope.reports.html_report import _section

    wide = {"undetermined": True, "at_chance": False, "metric": "logit_diff", "mean": 1.3, "ci": [-0.735, 3.34],
            "n_examples": 4, "task": "recall"}
    for name, entry in (("attribution", wide), ("heads", {**wide, "undetermined": False, "n_examples": 16,
                                                          "mean": 2.54, "ci": [0.824, 4.25]})):
        (tmp_path / name).mkdir()
        report_io.write_json(tmp_path / name / "summary.json", {"n_examples": entry["n_examples"], "chance": entry,
                                                                "mean_tau_attention_saliency": 0.48,
                                                                "std_tau_attention_saliency": 0.1})
    _, md, headline = _section(tmp_path, "attribution", "ok")
    assert headline.startswith("On its 4 examples the logit difference (1.3, 95% CI [-0.735, 3.34]) cannot be told")
    assert ("read with that caveat. The heads section's 16 examples of the same task are above chance (logit "
            "difference 2.54, 95% CI [0.824, 4.25]).") in headline


def test_chance_sentence_of_a_log_probability_against_the_wrong_answers():
    """Review 14a A1: where the chance of an answer log-probability is its wrong answer's (chance.against_wrong_answers),
    the sentence names that basis and the log-odds that decided it, and below chance says the model prefers the wrong
    answers (not log(1/V)'s Jensen caveat, nor the vocabulary mean's words)."""
    from headscope.reports.findings import chance_sentence

    entry = {"at_chance": True, "below_chance": True, "metric": "logprob", "mean": -2.15, "ci": [-2.59, -1.72],
             "ci_level": 0.95, "chance_value": -1.61, "chance_from": "wrong_answers", "n_examples": 40, "task": "tools",
             "margin": {"mean": -0.538, "ci": [-1.05, -0.027], "per_token": False, "n_above": 17, "n": 40}}
    assert chance_sentence(entry, "heads") == (
        "The model is below chance on task tools (answer log-probability -2.15 against chance -1.61 (the same rows' "
        "wrong answers' mean log-probability: no preference on average between the answer and the wrong answer), 95% CI [-2.59, "
        "-1.72], log-odds of the answer against the wrong answer -0.538, 95% CI [-1.05, -0.027], the answer ahead on "
        "17 of 40 rows): worse than guessing, it systematically prefers the wrong answers; relative findings are not "
        "reported.")
    at = {**entry, "below_chance": False, "margin": {**entry["margin"], "ci": [-1.2, 0.1]}}
    assert chance_sentence(at, "heads").endswith(
        "log-odds of the answer against the wrong answer -0.538, 95% CI [-1.2, 0.1], the answer ahead on 17 of 40 "
        "rows); relative findings are not reported.")


def test_attribution_saturated_permutation_sentence_follows_the_per_example_distances():
    """Review 14c A2: per-example median TVDs 0.0023, 0.0003, 0.92, 0.0165 (the reviewer's Phi-3 run) have a median
    0.0094; the old finding read that as "Distribution distances cannot show an effect here". Counted by hand: one
    example above 0.5, and two above their own one-logit bound e (1 - p): e x 0.00216 = 0.0059, e x 0.00182 = 0.0049,
    e x 0.00221 = 0.0060, e x 0.00169 = 0.0046 against 0.0023, 0.0003, 0.92, 0.0165."""
    import pandas as pd

    from headscope.analyses.attribution.permutation import saturation
    from headscope.analyses.attribution.summary import large_changes, permutation_change

    top = [0.99784, 0.99818, 0.99779, 0.99831]
    perm = pd.DataFrame({"example": range(4), "median_change": [0.00234, 0.000307, 0.92356, 0.01652], "top_prob": top})
    counts = large_changes(perm)
    assert counts == {"permutation_change_over_half": 1, "permutation_change_beyond_logit": 2}
    s = {"n_examples": 4, "metric": "logit_diff", "output_change": "tvd", "permutation_layer": 2, "loo_metric": "logit_diff",
         "saturated": saturation(top), **permutation_change(perm, encoder=False)}
    assert s["median_permutation_change"] == pytest.approx((0.00234 + 0.01652) / 2)
    text = finding("attribution", s)
    assert "cannot show an effect" not in text
    assert ("Permuting layer 2's attention gives a median tvd of 0.00943; per-example medians 0.000307 to 0.924 over 4 "
            "examples; above its own example's one-logit bound e (1 - p(top)) on 2 of 4 examples (there the clean top "
            "token's log-odds fall by more than one logit), above 0.5 on 1 of 4 (more than half the next-token "
            "probability moves); on the other 2 the distance stays within what one logit allows and cannot tell an "
            "effect from none.") in text
    # unsaturated, a median under 0.01 with one example at 0.92 is not "barely moves ... does little"
    loose = {**s, "saturated": saturation([0.6] * 4), "permutation_abs_metric_change": 0.05}
    text = finding("attribution", loose)
    assert "does little" not in text and "barely moves" not in text
    assert "above 0.5 on 1 of 4 (more than half the next-token probability moves)" in text


def test_circuits_without_wrong_answers_name_the_answer_logit():
    """Review 14b A3: "of a final logit difference 7.05" where the task has no wrong answers (dla_direction
    "answer"): the writers sum to the answer's logit. At chance the logit is named too, with no "near 0" (a logit's 0
    is no reference), and an answer logit near 0 without a chance entry is no sign of chance (the old heuristic reads
    a logit difference)."""
    s = {"dla_direction": "answer", "dla_final_logit": 7.0476, "n_examples": 8,
         "dla_top_components": {"L0H0": 2.86, "L0H3": 1.27, "L0H1": 1.0}}
    text = finding("circuits", s)
    assert text.endswith("the largest writers are L0H0 (+2.86), L0H3 (+1.27), L0H1 (+1.00) of a final answer logit 7.05."), text
    assert "logit difference" not in text
    at = finding("circuits", {**s, "chance": AT_CHANCE})
    assert ("Direct logit attribution (final answer logit 7.05) ranks no writer and the circuit's "
            "faithfulness is not reported: at chance") in at, at
    near = finding("circuits", {**s, "dla_final_logit": 0.01})
    assert "ranks no writer" not in near and "of a final answer logit 0.01." in near, near
    assert "of a final logit difference 7.05." in finding("circuits", {**s, "dla_direction": "answer - wrong_answer"})


def test_dla_components_caption_says_what_attn_bias_holds_on_this_model():
    """Review 15b B1 leftover: the DLA components caption called attn_bias an attention bias; on GPT-J (no attention
    bias, dla_attn_bias_parts as tests/analyses/test_gptj.py records it) it is ln1's bias through W_V W_O alone."""
    gptj = {"dla_attn_bias_parts": {"value": ["ln1's bias through W_V"], "b_O": False}}
    text = caption("circuits_dla_components", gptj)
    assert ("embeddings, MLPs, each layer's attn_bias (ln1's bias through W_V and W_O: a term the head rows leave out; "
            "this model's attention has no output bias, so attn_bias is not an attention bias) and norm biases") in text
    both = caption("circuits_dla_components", {"dla_attn_bias_parts": {"value": ["b_V"], "b_O": True}})
    assert "attn_bias (the attention's output bias b_O plus b_V and W_O, terms the head rows leave out)" in both
    assert "attention and norm biases" not in caption("circuits_dla_components", {}) + text + both


def test_circuits_captions_name_the_answer_logit_and_why_faithfulness_is_withheld():
    """Review 14b A3/A4: the DLA captions say "answer-minus-wrong" and "final logit difference" on a task without wrong
    answers; the faithfulness and MIB figures' captions open with why the findings withhold them."""
    answer = {"dla_direction": "answer"}
    assert "the final answer logit (the task has no wrong answers;" in caption("circuits_dla_components", answer)
    assert "logit difference" not in caption("circuits_dla_components", answer)
    heads = caption("circuits_dla_heads", answer)
    assert "write into the answer's logit direction (its unembedding: the task has no wrong answers)" in heads
    assert "wrong logit" not in heads and "wrong logit" not in caption("circuits_dla_experts", answer)
    assert caption("circuits_mib", answer).endswith("m: the answer's logit (the task has no wrong answers).")
    assert caption("circuits_dla_heads", {"dla_direction": "answer - wrong_answer"}) == CAPTIONS["circuits_dla_heads"]
    noise = {**answer, "gap_within_noise": {"reason": "mean gap -0.0105 answer logit, its 95% CI [-0.0355, 0.0146] "
                                                      "over 8 pairs contains 0"}}
    for stem in ("circuits_faithfulness", "circuits_mib"):
        assert caption(stem, noise).startswith("Not reported in the findings: clean-corrupted gap within noise: mean "
                                               "gap -0.0105 answer logit, its 95% CI [-0.0355, 0.0146] over 8 pairs "
                                               "contains 0. "), stem
    assert not caption("circuits_dla_heads", noise).startswith("Not reported")


def test_patching_clean_and_corrupted_metrics_are_printed_to_digits_that_show_their_gap():
    """Review 14b B4: clean -1.00054 and corrupted -1.00341 (the reviewer's hand values, plain HF) read "-1" and "-1",
    hiding the gap of 0.00287 the next sentence discusses. Now each to the decimals that state the gap to 3 significant
    digits; the printed values' difference is the gap as the finding states it. Values that show their gap at 3
    significant digits keep them."""
    clean, corrupt = -1.0005390355363488, -1.0034079330507666
    s = {"metric": "logprob", "normalized": False, "direction": "denoise", "n_examples": 8, "metric_n": 8,
         "clean_metric": clean, "corrupted_metric": corrupt,
         "gap_within_noise": {"gap": clean - corrupt, "ci": [-0.00111, 0.00685], "reason": "its 95% CI contains 0"},
         "top_sites": {"resid_pre": [{"layer": 0, "head": None, "pos": 24, "effect": 0.00287, "token": ""}]}}
    text = finding("patching", s)
    assert "an answer log-probability of -1.00054, corrupted ones -1.00341, over 8 prompts." in text
    assert f"{-1.00054 - -1.00341:.3g}" == f"{clean - corrupt:.3g}" == "0.00287"
    assert "of 24.1, corrupted ones 23.5," in finding("patching", {**s, "clean_metric": 24.13, "corrupted_metric": 23.52})


def test_patching_agreement_over_cells_that_are_all_rounding_states_no_r():
    """Review 14b B6: the bfloat16 OLMoE run (rounding floor 0.0079, one bf16 step; exact.csv: 5 of 56 attn_out cells
    non-zero, the largest 0.0055) read "attn_out r = 0.223 rests on 0 non-zero exact effect(s) of 56 cells". Now it
    says the cells are rounding, names the floor and withholds r, and no "high r" caveat follows; where the floor
    leaves 2 cells above it, r is stated on those 2, with the floor."""
    stats = {"pearson": 0.22332064283585484, "spearman": 0.3, "n": 56, "n_nonzero": 0, "n_within_rounding": 5,
             "slope": 0.076, "slope_ci": [-0.0145, 0.166], "slope_n": 56}
    s = {"metric": "logprob", "normalized": False, "direction": "denoise", "n_examples": 8,
         "clean_metric": -1.0059947890695184, "corrupted_metric": -1.0048901152331382,
         "gap_within_noise": {"gap": -0.0011, "ci": [-0.0119, 0.00969], "reason": "its 95% CI contains 0"},
         "rounding_floor": {"basis": "one rounding step", "floor": 0.007859334289605613},
         "attribution_correlation": {"attn_out": stats}}
    text = finding("patching", s)
    assert ("attn_out: no r, its exact effects being rounding only (none of its 56 cells above this precision's "
            "rounding floor, 0.0079: one rounding step of the metric; 5 non-zero within it).") in text
    assert "0.223" not in text and "non-zero exact effect(s)" not in text and "A high r can hide" not in text
    s["attribution_correlation"]["attn_out"] = {**stats, "n_nonzero": 2, "n_within_rounding": 3}
    assert ("attn_out r = 0.223 rests on 2 exact effect(s) above this precision's rounding floor (0.0079: one rounding "
            "step of the metric) of 56 cells (3 more non-zero within it), so it says nothing about agreement"
            ) in finding("patching", s)


def test_patching_next_site_whose_interval_clears_0_only_by_rounding_is_said_to_reach_0():
    """Review 14c B3: Phi-3 bf16, L0H0's head_out effect 5.309 logits, 95% CI [+0.025, +10.59] over 8 examples, read
    "(0.30, 95% CI [0.00, 0.60] over 8 examples)" beside the finding's own floor of 0.07 logits (one bf16 step); by
    hand (the reviewer's per-example effects, unbatched HF) the t interval reaches 0. Now the lower end is said to lie
    within the floor; an interval clear of it gets no such clause."""
    per_example = np.array([12.47, 0.12, 3.54, 0.25, 0.34, 15.56, 0.27, 9.71])  # hand_patch.py's effects, logits
    low = per_example.mean() - stats.t.ppf(0.975, 7) * per_example.std(ddof=1) / np.sqrt(8)
    assert low < 0.07  # the hand interval's lower end is within the floor of 0 (it is -0.019)
    cell = {"head": None, "token": "5: x"}
    s = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 8,
         "clean_metric": 8.91, "corrupted_metric": -8.87,
         "rounding_floor": {"basis": "one rounding step", "floor": 0.069580078125},
         "top_sites": {"resid_pre": [{**cell, "layer": 1, "pos": 5, "effect": 17.0, "ci": [16.0, 18.0], "n": 8}],
                       "head_out": [{"layer": 0, "head": 0, "pos": None, "token": "all", "effect": 5.30859375,
                                     "ci": [0.02531291837509375, 10.591874581624907], "n": 8}]}}
    text = finding("patching", s)
    assert ("Next, at other sites: head_out at L0H0 (0.30, 95% CI [0.00, 0.60] over 8 examples, which reaches 0 within "
            "rounding: its end nearest 0, +0.025 logit difference, lies within the rounding floor (0.07 logit "
            "difference)).") in text
    s["top_sites"]["head_out"][0]["ci"] = [0.5, 10.1]
    assert "within rounding" not in finding("patching", s)


# review 14a verify A1: the chance entry of review 14a's quick bfloat16 run (heads: hand -2.0543 one row at a time;
# the padded batch -2.04437), and patching's (hand -1.5726; its own pass -1.56291, corrupted -1.56026)
_TOOLS_CHANCE = {"at_chance": True, "below_chance": False, "chance_from": "wrong_answers", "metric": "logprob",
                 "chance_value": -1.3942214511334896, "ci": [-2.7540041621945424, -1.3544626418330148],
                 "ci_level": 0.95, "mean": -2.0542334020137787, "n_examples": 16, "task": "tools",
                 "margin": {"ci": [-1.477460193708537, 0.15743629194795883], "mean": -0.6600119508802891, "n": 16,
                            "n_above": 7, "per_token": False}}


def test_heads_at_chance_states_the_unpruned_metric_once_even_where_its_pass_rounds_apart():
    text = finding("heads", {"metric": "logprob", "baseline_metric": -2.0443683229386806, "n_examples": 16,
                             "chance": _TOOLS_CHANCE})
    assert "answer log-probability -2.05 against chance -1.39" in text
    assert "-2.04" not in text and text.count("[-2.75, -1.35]") == 1, text
    assert "The answer log-probability above is the unpruned model's, over 16 examples." in text
    # another metric or other rows: not the quantity above, so its own value stays
    other = finding("heads", {"metric": "logprob", "baseline_metric": -2.0443683229386806, "n_examples": 40,
                              "chance": _TOOLS_CHANCE})
    assert "Unpruned answer log-probability is -2.04" in other


def test_patching_at_chance_states_the_clean_metric_once_and_the_corrupted_by_its_gap():
    chance = {**_TOOLS_CHANCE, "mean": -1.572499431669712, "chance_value": -1.465, "n_examples": 8,
              "ci": [-2.68, -0.467]}
    s = {"metric": "logprob", "normalized": False, "direction": "denoise", "n_examples": 8, "metric_n": 8,
         "clean_metric": -1.5629058256745338, "corrupted_metric": -1.5602567866444588,
         "clean_metric_ci": [-2.67, -0.452], "corrupted_metric_ci": [-2.65, -0.469], "chance": chance,
         "gap_within_noise": {"ci": [-0.02942617823046688, 0.024128100170316732], "gap": -0.0026490390300750732,
                              "n_examples": 8}}
    text = finding("patching", s)
    assert "-1.56291" not in text and "-1.56026" not in text and "-1.56 " not in text, text
    # -1.56291 - (-1.56026) = -0.00265: the corrupted prompts lie above the clean ones in patching's own pass
    assert ("Clean prompts give the answer log-probability above; corrupted ones lie 0.00265 above them on average in "
            "patching's own pass (clean minus corrupted -0.00265, 95% CI [-0.0294, 0.0241] over 8 pairs).") in text
    # without the recorded gap: the difference of the two recorded means, -1.5629058 + 1.5602568 = -0.002649
    bare = finding("patching", {k: v for k, v in s.items() if k != "gap_within_noise"})
    assert "corrupted ones lie 0.00265 above them on average in patching's own pass (clean minus corrupted -0.00265), " \
           "over 8 prompts." in bare


def test_circuits_at_chance_names_the_pass_its_dla_total_comes_from():
    """Review 14a verify A2: 'logit difference -0.173' (the guard's plain pass, hand -0.1729) then 'final logit
    difference -0.167' (DLA's batched pass): the second is said to be the batched pass's, 0.0059 from the first."""
    chance = {"at_chance": True, "metric": "logit_diff", "mean": -0.1728515625, "chance_value": 0.0,
              "ci": [-0.707, 0.361], "ci_level": 0.95, "n_examples": 32, "task": "tools"}
    s = {"dla_direction": "answer - wrong_answer", "dla_final_logit": -0.1669921875, "n_examples": 32,
         "chance": chance}
    text = finding("circuits", s)
    assert "final logit difference -0.167" not in text, text
    assert ("Direct logit attribution (of the logit difference above as the batched pass it decomposes gives it, -0.167, "
            "0.0059 from the plain pass above over the same rows) ranks no writer") in text


def test_a_gradient_tie_says_its_rounding_and_which_gradient_floor_is_which():
    """Review 14b verify A1: "within rounding" was defined for zero-ablation only, beside a gradient tie, and the
    summary's analytic 0.0513 sat beside the measured 0.00185 unnamed: the gradient's band is said (each head's own
    measured rounding, every example recomputed), and the analytic floor is named as the degeneracy check."""
    s = {"metric": "logprob", "baseline_metric": -0.9765, "n_examples": 16, "n_heads": 8,
         "ordering_basis": {"gradient": "|dL/d gate| / its layer's L2 norm"},
         "tied_first_pruned_gradient": [["L1H2", "L1H3"]], "tied_first_pruned_at_gradient": [3],
         "tied_first_pruned_values_gradient": [[0.1400, 0.1410]], "tied_first_pruned_moves_gradient": [False],
         "rounding_gradient": 0.00184, "rounding_gradient_source": "measured", "rounding_floor_gradient": 0.0513,
         "rounding_gradient_heads": [[0.0017, 0.0013, 0.0003, 0.0006], [0.0002, 0.00004, 0.00008, 0.0003]],
         "rounding_gradient_check": {"exact": True, "n_examples": 16, "of": 16, "margin": 1.0}}
    text = finding("heads", s)
    assert "In the gradient order, L1H2 and L1H3 (removed 3rd and 4th; 0.14 each, layer-normalised" in text, text
    assert ("By gate gradient, within rounding means closer than the sum of the two heads' own rounding (in the "
            "layer-normalised order, each scaled as that order scales the head's gradient), each head's measured as "
            "|its mean |dL/d gate| - the same mean with the weights in float32|, over all 16 examples recomputed (at "
            "most 0.0018 for any head); the analytic floor 0.051 (one rounding step of the loss it differentiates) only "
            "checks whether every gradient is rounding.") in text
    assert "Within rounding here means closer than" not in text  # no ablation tie: no ablation band


def test_patching_ties_with_the_top_head_are_paired_differences_reaching_zero():
    """Review 19e B1: "tied with L0H5, L1H2 and L0H1" (each inside the other's interval) named L0H1 (0.52 [-1.00, 2.04],
    wide) and left out L1H4 0.93 [0.28, 1.57] and L1H3, whose paired differences from L2H5 over the same 8 examples
    reach 0 (by hand: +0.716 [-0.77, 2.20], +0.730 [-0.56, 2.02]); only L2H4 is told apart (+0.750 [0.08, 1.42]).
    Ties are now every cell whose paired interval (top_sites' vs_top) reaches 0, largest first."""

    def head(layer, h, effect, ci, vs=None):
        return {"layer": layer, "head": h, "pos": None, "token": "all", "effect": effect, "ci": ci, "n": 8,
                **({} if vs is None else {"vs_top": vs})}

    s = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 8, "n_positions": 12,
         "clean_metric": 5.356, "corrupted_metric": -4.039, "n_heads": 6, "n_kv_heads": 2,
         "top_sites": {"attn_out": [{"layer": 2, "head": None, "pos": 11, "from_end": -1, "token": "was",
                                     "effect": 3.1, "ci": [2.0, 4.2], "n": 8}],
                       "head_out": [head(2, 5, 1.643, [0.49, 2.80]), head(0, 5, 1.116, [0.19, 2.04], [-0.3, 1.4]),
                                    head(1, 4, 0.927, [0.28, 1.57], [-0.77, 2.20]),
                                    head(1, 3, 0.913, [0.46, 1.36], [-0.56, 2.02]),
                                    head(2, 4, 0.893, [0.5, 1.3], [0.08, 1.42]),
                                    head(0, 1, 0.522, [-1.00, 2.04], [-0.79, 3.03])]}}
    text = finding("patching", s)
    assert ("head_out at L2H5 (0.17, 95% CI [0.05, 0.30] over 8 examples), not told apart from L0H5, L1H4, L1H3 and "
            "L0H1 (0.06-0.12; 4 cells whose paired difference from L2H5 over the same examples has a 95% t interval "
            "reaching 0, largest first)") in text, text
    assert "L2H4" not in text.split("not told apart from", 1)[1].split(")", 1)[0]


def test_exact_map_captions_say_the_aligned_effects_are_no_cells_of_the_maps():
    """Review 19e C1: the head_out map's shared scale was +-0.53 while the finding quoted resid_pre at layer 0
    restoring 1.00, measured at each prompt's corrupted token (at 5 different places from the end), which is no cell of
    the end-aligned maps. The caption says so, with the largest aligned effect in the map's units (9.39 / 9.39 = 1.00);
    with the token at one place from the end the aligned cell is a map cell and nothing is added."""
    from headscope.reports.plots_patching import caption_for

    s = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 8,
         "clean_metric": 5.356, "corrupted_metric": -4.034,
         "at_corrupted_token": {"from_end": {"-5": 4, "-10": 1, "-20": 1, "-25": 1, "-28": 1}, "n": 8,
                                "sites": {"resid_pre": [{"layer": 0, "effect": 9.39, "n": 8}],
                                          "attn_out": [{"layer": 0, "effect": 3.1, "n": 8}]}}}
    said = ("The finding's effects at each prompt's corrupted token (up to 1.00 in the map's units) are aligned on that "
            "token, which sits at different places from the end, so they are not cells of these end-aligned maps and "
            "may exceed their scale.")
    assert said in (caption_for("exact_head_out", s) or "")
    flipped = {**s, "clean_metric": -4.034, "corrupted_metric": 5.356}  # the diff read's B3: clean below corrupted
    assert "(up to 1.00 in the map's units)" in (caption_for("exact_head_out", flipped) or "")  # |9.39 / -9.39|
    s["at_corrupted_token"]["from_end"] = {"-5": 8}
    assert "aligned on that token" not in (caption_for("exact_head_out", s) or "")


def test_causal_tracing_names_its_metric_and_gives_its_intervals():
    """Review 20: "noising the subject drops the metric from 1 to 0.133 (mean over 32 prompts)" named no metric and had
    no interval; a summary written before the intervals keeps the means alone."""
    from headscope.reports.patching_words import _tracing_words

    trace = {"clean_metric": 0.99999, "corrupted_metric": 0.1331, "metric": "prob", "n_examples": 32, "span": "subject",
             "clean_metric_ci": [0.99998, 1.0], "corrupted_metric_ci": [0.08, 0.19], "drop_ci": [0.81, 0.92]}
    assert _tracing_words(trace) == (
        "Causal tracing: noising the subject drops the answer probability from 1 (95% CI [1, 1]) to 0.133 (95% CI "
        "[0.08, 0.19]): a paired drop of 0.867, 95% CI [0.81, 0.92] over 32 prompts.")
    old = {k: v for k, v in trace.items() if not k.endswith("_ci")}
    assert _tracing_words(old) == ("Causal tracing: noising the subject drops the answer probability from 1 to 0.133 "
                                   "(mean over 32 prompts).")
    up = {**trace, "metric": "logit_diff", "clean_metric": -1.0, "corrupted_metric": 0.5, "drop_ci": [-2.0, -1.0]}
    assert _tracing_words(up).startswith("Causal tracing: noising the subject raises the logit difference from -1 ")
    assert _tracing_words(up).endswith(": a paired rise of 1.5, 95% CI [1, 2] over 32 prompts.")
