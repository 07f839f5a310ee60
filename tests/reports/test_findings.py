"""Findings in words: each headline states its summary's numbers, and says so when a result is uninformative."""
from __future__ import annotations

from headscope.reports.findings import CAPTIONS, caption, finding

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
    assert "head_out at layer 2, head 5 (-0.25)" in text  # -1 / (2 - -2)
    assert "resid_pre 0.988" in text


AT_CHANCE = {"at_chance": True, "metric": "logit_diff", "mean": -0.008, "chance_value": 0.0, "ci": [-0.05, 0.034],
             "ci_level": 0.95, "reason": "the 95% CI [-0.05, 0.034] of the mean logit difference contains chance (0)"}


def test_the_chance_guard_heads_the_finding_and_drops_relative_thresholds():
    heads = {**HEADS, "baseline_metric": -0.008, "l0_min_heads_within_tolerance": 3, "chance": AT_CHANCE}
    text = finding("heads", heads)
    assert text.startswith("The model is at chance on this task (logit difference -0.008 against chance 0, "
                           "95% CI [-0.05, 0.034]); relative findings are not reported.")
    assert "within 1%" not in text and "can be removed" not in text and "within tolerance" not in text
    assert "Unpruned logit difference is -0.008" in text and "2 induction (L1H0, L1H3)" in text  # absolute facts stay
    assert text.count("at chance") == 1  # the old heuristic does not repeat it
    kv = {"metric_unevicted": 0.01, "metric_per_policy_budget": {"window": {"8": 0.01}}, "chance": AT_CHANCE}
    assert "within 1%" not in finding("kv", kv) and "Full-cache metric 0.01." in finding("kv", kv)
    patching = {"metric": "logit_diff", "normalized": False, "direction": "denoise", "n_examples": 8,
                "clean_metric": -0.008, "corrupted_metric": 0.02, "chance": AT_CHANCE,
                "top_sites": {"resid_pre": [{"layer": 1, "head": None, "pos": 3, "token": "x", "effect": 0.02}]}}
    text = finding("patching", patching)
    assert "at chance on this task" in text and "clean-corrupted gap" not in text and "Clean prompts give" in text
    probes = {"metric": "accuracy", "labels": "answer", "best_layer": 1, "best_accuracy": 0.36, "majority_baseline": 0.34,
              "chance": {**AT_CHANCE, "metric": "probe accuracy", "mean": 0.36, "chance_value": 0.34, "ci": None}}
    assert finding("probes", probes).startswith("The probe scores at chance (probe accuracy 0.36 against chance 0.34);")


def test_the_guard_overrules_the_old_heuristic_when_the_model_is_above_chance():
    above = {"at_chance": False, "metric": "logit_diff", "mean": 0.05, "chance_value": 0.0, "ci": [0.04, 0.06]}
    text = finding("heads", {**HEADS, "baseline_metric": 0.05, "chance": above})  # consistent, if small: not chance
    assert "chance" not in text and "18 of 32 heads (56%) can be removed within 1%" in text
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
               "ratio_middle_to_ends": {"accuracy": 0.5}}
    text = finding("position", u_shape)
    assert "from 0.45 (gold at position 3) to 0.90" in text and "U-shape" in text
    attribution = {"median_permutation_tvd": 3e-7, "permutation_layer": 3, "output_change": "tvd",
                   "mean_tau_attention_loo": 0.04, "n_examples": 10}
    text = finding("attribution", attribution)
    assert "barely moves the output" in text and "says nothing about faithfulness" in text
    assert "leave-one-out at mean Kendall tau 0.04" in text and "weak" in text


def test_probes_kv_mlp_and_odd_summaries():
    probes = {"metric": "accuracy", "labels": "answer", "best_layer": 1, "best_accuracy": 0.05,
              "majority_baseline": 0.04, "best_selectivity": 0.01}
    assert "chance level" in finding("probes", probes) and "layer 1 with accuracy 0.05" in finding("probes", probes)
    kv = {"bytes_per_token": 1024, "dtype": "float32", "bytes_at_n_ctx": 131072, "gqa_saving": 4.0,
          "metric_unevicted": 10.0, "metric_per_policy_budget": {"window": {"8": 5.0, "16": 9.95, "32": 10.0}}}
    text = finding("kv", kv)
    assert "1.0 KiB per token" in text and "128.0 KiB" in text and "4x less" in text and "window from 16 positions" in text
    mlp = {"agreement_per_layer": {"0": 0.02, "1": 0.03}, "agreement_shuffled_per_layer": {"0": 0.02, "1": 0.025}}
    assert "no better than the control" in finding("mlp", mlp)
    assert finding("heads", {"metric": None, "n_heads": "x", "max_fraction_prunable_a": "?"}) == ""
    assert finding("patching", {"skipped": "an encoder"}) == "Skipped: an encoder"
    assert finding("unknown", {"a": 1}) == ""


def test_captions_name_units():
    assert "normalised logit difference" in caption("exact_resid_pre") and "resid pre" in caption("exact_resid_pre")
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


def test_circuits_finding_states_mib_metrics():
    text = finding("circuits", {"dla_final_logit": 2.0, "dla_top_components": {"a1.h0": 1.5},
                                "mib_cpr": 0.8123, "mib_cmd": 0.2051, "edge_method": "eap-clean"})
    assert "MIB's circuit metrics (eap-clean scores): CPR 0.812 (higher is better), CMD 0.205 (lower is better)." in text
