"""Review 16d B1 and A2: a probe significantly below chance is said as below chance with its p, not "at chance,
narrowly"; path patching refused on post-LN blocks is one sentence in the patching finding."""
from __future__ import annotations

from headscope.reports.plots_probes import correction_words

# the review's random-model probes summary (out_rand_f32/probes/summary.json): accuracy 0 of 40 against 0.15
BELOW = {"alpha": 0.05, "at_chance": True, "below_chance": True, "chance_value": 0.15, "ci": [0.0, 0.1128], "floor": 0.02,
         "ci_level": 0.9833333333333333, "correction": "bonferroni", "mean": 0.0, "metric": "probe accuracy",
         "n_compared": 3, "n_examples": 40, "p_value": 0.008717340530371785, "p_value_uncorrected": 0.0029057801767905954}


def test_below_chance_probe_is_not_called_at_chance():
    """B1: p = 3 x 0.85^40 x 2 (two-sided exact binomial, k = 0 of 40 at 0.15, Bonferroni over 3 layers) = 0.0087 <
    0.05: the verdict says below chance and what that points to; it said "at chance, narrowly (corrected p under twice
    the threshold)"."""
    p_raw = 2 * 0.85 ** 40  # one tail doubled: P(k = 0) is the whole lower tail
    assert abs(p_raw - BELOW["p_value_uncorrected"]) < 1e-4 and abs(3 * p_raw - BELOW["p_value"]) < 3e-4
    assert correction_words({"chance": BELOW}) == (
        "The chance test takes the best of 3 layers, so it is Bonferroni-corrected for that choice (alpha 0.05/3): "
        "corrected p = 0.0087 (uncorrected 0.0029), below chance (corrected p under alpha 0.05): the probe scores "
        "systematically worse than always guessing the majority class, which learning the property cannot cause; it "
        "points to the split or the fit (held-out classes rare in the training folds, or a probe fitting noise), not to "
        "information in the layer.")


def test_narrowly_at_chance_only_between_alpha_and_twice_alpha():
    """"Narrowly" (corrected p under twice the threshold) holds for alpha <= p < 2 alpha only."""
    near = {**BELOW, "below_chance": False, "p_value": 0.07, "p_value_uncorrected": 0.0233}
    assert correction_words({"chance": near}).endswith("at chance, narrowly (corrected p under twice the threshold).")
    inside_floor = {**near, "p_value": 0.01, "p_value_uncorrected": 0.0033}  # at chance by the effect floor, p < alpha
    assert correction_words({"chance": inside_floor}).endswith(  # review 18a A1: p under alpha is not just "at chance"
        "(uncorrected 0.0033), at chance all the same: the gain over the majority baseline is under the 0.02 floor.")


def test_path_patching_not_run_is_one_sentence():
    """A2: the patching finding's path sentence where path patching was refused (post-LN blocks)."""
    from headscope.reports.patching_words import _path_words

    reason = "path patching cannot run on ./opt: its blocks are post-LN (...)"
    assert _path_words({"not_run": reason}, 1.0, "logit difference", True) == (
        "Path patching cannot run on ./opt: its blocks are post-LN (...); it was not run.")


def test_mlp_finding_says_values_went_through_the_blocks_layernorm_on_post_ln():
    """A5: on post-LN blocks (summary values_through_post_ln) the mlp finding says how the value vectors were read."""
    from headscope.reports.findings import finding

    chance = {"at_chance": True, "metric": "logit_diff", "mean": -0.008, "chance_value": 0.0, "ci": [-0.05, 0.034],
              "ci_level": 0.95, "reason": "the 95% CI [-0.05, 0.034] of the mean logit difference contains chance (0)"}
    s = {"agreement_per_layer": {"0": 0.0, "1": 0.005}, "agreement_shuffled_per_layer": {"0": 0.02},
         "n_neurons_per_layer": 192, "n_prefixes": 135, "answer_promoted_fraction": 0.0, "n_task_updates": 48,
         "chance": chance}
    assert finding("mlp", {**s, "values_through_post_ln": True}) == finding("mlp", s) + (
        " The blocks are post-LN: value vectors are taken through their own block's LayerNorm (centred, times its gain; "
        "its shared scale left out), not through the later blocks' LayerNorms that the write also passes on its way to "
        "the logits.")
