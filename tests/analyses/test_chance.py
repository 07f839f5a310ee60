"""The chance-level guard (analyses/core/chance.py) and its wiring through the registry: the decision
rule against scipy's own tests on hand-made values, the per-example clean metric against each row run
alone, a random model flagged at chance, and the trained zoo model not."""
from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

import headscope as hs
from headscope.analyses.core import chance
from headscope.analyses.core.registry import config_class, task_used, with_chance
from headscope.analyses.core.result import Result
from headscope.analyses.core.tasks import sentence_task
from headscope.reports.findings import finding


def _scipy_ci(values, level=0.95):
    ci = stats.ttest_1samp(values, 0.0).confidence_interval(level)
    return [ci.low, ci.high]


# ---- the decision rule ---------------------------------------------------------------------------
def test_a_clear_logit_difference_is_not_at_chance_and_its_ci_is_the_t_interval():
    values = [3.1, 2.9, 3.4, 2.7, 3.0, 3.3]
    out = chance.assess(values, "logit_diff")
    assert out["at_chance"] is False and out["chance_value"] == 0.0 and out["n_examples"] == 6
    assert out["mean"] == pytest.approx(18.4 / 6)
    assert out["ci"] == pytest.approx(_scipy_ci(values))
    assert out["p_value"] == pytest.approx(stats.ttest_1samp(values, 0.0).pvalue)
    assert out["effect_size"] == pytest.approx((18.4 / 6) / np.std(values, ddof=1))
    assert "above chance" in out["reason"]


def test_a_ci_that_contains_zero_is_at_chance():
    values = [2.0, -1.5, 3.0, -1.0, 0.5]  # mean 0.6, above the 0.1 floor, but the CI spans 0
    lo, hi = _scipy_ci(values)
    assert lo < 0 < hi
    out = chance.assess(values, "logit_diff")
    assert out["at_chance"] is True and out["ci"] == pytest.approx([lo, hi]) and "contains chance" in out["reason"]


def test_the_floor_catches_a_tiny_but_consistent_bias():
    values = [0.05, 0.06, 0.04, 0.05, 0.05, 0.06]  # significant (p < 1e-4) but 0.05 logits: odds 1.05
    assert stats.ttest_1samp(values, 0.0).pvalue < 1e-4
    out = chance.assess(values, "logit_diff")
    assert out["at_chance"] is True and "less than 0.1 above chance" in out["reason"]
    assert chance.assess([0.05], "logit_diff")["ci"] is None  # one example: no CI, the floor decides
    assert chance.assess([0.5], "logit_diff")["at_chance"] is False


def test_a_small_standardised_effect_over_many_examples_is_at_chance():
    z = np.random.default_rng(0).standard_normal(10_000)
    z = (z - z.mean()) / z.std(ddof=1)  # exactly mean 0, sd 1
    noisy = chance.assess(0.3 + 3.0 * z, "logit_diff")  # d = 0.1: significant, above the floor, drowned in noise
    assert _scipy_ci(0.3 + 3.0 * z)[0] > 0.1
    assert noisy["at_chance"] is True and noisy["effect_size"] == pytest.approx(0.1) and "noise" in noisy["reason"]
    assert chance.assess(0.3 + 0.6 * z, "logit_diff")["at_chance"] is False  # d = 0.5


def test_below_chance_counts_as_at_chance():
    out = chance.assess([-3.0, -2.5, -3.2, -2.8], "logit_diff")
    assert out["at_chance"] is True and out["reason"].startswith("below chance") and "wrong answers" in out["reason"]
    assert out["ci"][1] < 0 and out["below_chance"] is True
    assert chance.assess([-0.5, 0.4, 0.1, -0.2], "logit_diff")["below_chance"] is False  # CI contains 0: at, not below


def test_a_patching_gap_within_noise_is_flagged_from_its_paired_interval():
    clean, corrupted = np.array([0.9, -0.4, 0.6, -0.1, 0.3]), np.array([0.1, 0.2, -0.3, 0.4, -0.2])
    ref = stats.ttest_rel(clean, corrupted).confidence_interval(0.95)  # scipy's paired t interval
    assert ref.low < 0 < ref.high
    flag = chance.gap_within_noise(clean, torch.tensor(corrupted), "logit_diff")
    assert flag["gap"] == pytest.approx(0.22) and flag["ci"] == pytest.approx([ref.low, ref.high])
    assert flag["n_examples"] == 5 and "contains 0" in flag["reason"]
    clear = clean + 2.0  # every pair 2 logits apart on average: no flag
    assert stats.ttest_rel(clear, corrupted).confidence_interval(0.95).low > 0
    assert chance.gap_within_noise(clear, corrupted, "logit_diff") is None
    tiny = chance.gap_within_noise([0.05, 0.06, 0.05], [0.0, 0.0, 0.0], "normalized_logit_diff")  # significant, tiny
    assert "under the 0.1 floor" in tiny["reason"] and tiny["ci"][0] > 0
    assert chance.gap_within_noise([0.05], [0.0], "logprob")["ci"] is None  # one pair: the floor log 2 alone


# ---- answers of several lengths: each row against its own chance (review 11b A1) -----------------
LN_454 = math.log(454)  # the review's vocabulary
SOLVED = np.array([-0.0024, -0.0051, -0.0036, -0.0165, -0.0042, -0.0071, -0.0105])  # log-probabilities near 0
SOLVED_TOKENS = np.array([1, 1, 1, 7, 1, 1, 1])  # one 7-token answer among one-token answers


def test_a_model_that_solves_rows_of_several_answer_lengths_is_above_chance_with_its_own_interval():
    """Review 11b A1: chance is -6.12 on six rows and -42.8 on one. The old guard tested the margins
    (metric_i - chance_i) with one t interval, whose spread is the answer lengths', and printed it shifted onto the
    metric: [-12.8, 12.8] for a mean of -0.0056, "at chance". Now: above chance (each row's margin per answer token,
    6.12 on every row), and "ci" is scipy's t interval of the metric itself."""
    chances = -SOLVED_TOKENS * LN_454
    old = stats.ttest_1samp(SOLVED - chances, 0.0).confidence_interval(0.95)
    assert old.low < 0  # the old test, by scipy: "at chance", its printed interval ~2000x the metric's
    assert old.high - old.low > 1000 * (_scipy_ci(SOLVED)[1] - _scipy_ci(SOLVED)[0])
    entry = chance.assess_per_row(SOLVED, chances, "logprob", tokens=SOLVED_TOKENS)
    assert entry["at_chance"] is False and entry["below_chance"] is False and "lies above 0" in entry["reason"]
    assert entry["mean"] == pytest.approx(SOLVED.mean()) and entry["ci"] == pytest.approx(_scipy_ci(SOLVED), rel=1e-9)
    per_token = (SOLVED - chances) / SOLVED_TOKENS
    assert entry["margin"]["mean"] == pytest.approx(per_token.mean())
    assert entry["margin"]["ci"] == pytest.approx(_scipy_ci(per_token), rel=1e-9)
    assert entry["margin"]["n_above"] == 7 and entry["margin"]["n"] == 7 and entry["margin"]["per_token"] is True
    assert entry["p_value"] == pytest.approx(stats.ttest_1samp(per_token, 0.0).pvalue)
    assert entry["chance_range"] == pytest.approx([-7 * LN_454, -LN_454]) and entry["answer_tokens_range"] == [1, 7]
    assert entry["chance_value"] == pytest.approx(chances.mean())
    assert chance.metric_ci(entry) == pytest.approx(_scipy_ci(SOLVED), rel=1e-9)
    # what a summary written before held (the margins' interval shifted, answers of 1.86 tokens on average): not
    # the metric's; a one-token entry's interval is
    shifted = {"metric": "logprob", "ci": [-12.8, 12.8], "answer_tokens": 1.86, "mean": -0.0056}
    assert chance.metric_ci(shifted) is None
    assert chance.metric_ci({**shifted, "answer_tokens": 1.0, "ci": [-0.01, -0.002]}) == [-0.01, -0.002]
    # one chance value on every row (one answer length): the same verdict and interval as assess on the metric
    same = chance.assess_per_row(SOLVED - 6, np.full(7, -LN_454), "logprob", tokens=np.ones(7))
    plain = chance.assess(SOLVED - 6, "logprob", vocab_size=454)
    assert same["ci"] == pytest.approx(plain["ci"]) and same["at_chance"] is plain["at_chance"]
    assert same["p_value"] == pytest.approx(plain["p_value"])


def test_an_untrained_model_on_rows_of_several_lengths_prints_the_wide_interval_of_its_metric():
    """Review 11b A1, the other way: an untrained model's log-probabilities run from -5.8 (one token) to -48.4
    (8 tokens), about its chance on every row; the old interval (the margins' spread shifted) was ~50x too narrow.
    At chance (each row within log 2 nats a token of its own), "ci" is scipy's t interval of the metric."""
    tokens = np.array([7, 6, 8, 7] + [1] * 12)
    per_token = np.array([-6.02, -6.10, -6.05, -6.08, -5.8, -6.3, -5.9, -6.0, -5.7, -6.2, -6.1, -5.9, -6.4, -5.8, -6.0,
                          -6.2])
    logp = per_token * tokens  # [16]: -42.1 ... -48.4 ... -5.7
    chances = -tokens * LN_454
    entry = chance.with_basis(chance.assess_per_row(logp, chances, "logprob", tokens=tokens), task="owners",
                              vocab_size=454, answer_tokens=float(tokens.mean()))
    ci = _scipy_ci(logp)
    old = np.array(_scipy_ci(logp - chances)) + chances.mean()
    assert (ci[1] - ci[0]) > 20 * (old[1] - old[0])  # the old interval, by scipy: far narrower than the metric's
    assert entry["at_chance"] is True and entry["below_chance"] is False and entry["ci"] == pytest.approx(ci, rel=1e-9)
    margin = _scipy_ci(per_token + LN_454)
    assert entry["margin"]["ci"] == pytest.approx(margin, rel=1e-9)
    text = finding("heads", {"metric": "logprob", "baseline_metric": float(logp.mean()), "n_examples": 16,
                             "chance": entry})
    above = int((per_token + LN_454 > 0).sum())
    assert text.startswith(
        f"The model is at chance on task owners (answer log-probability {logp.mean():.3g}, 95% CI [{ci[0]:.3g}, "
        f"{ci[1]:.3g}], against chance -6.12 to -48.9 per row (1-8 answer tokens, k x log(1/454) for k tokens); margin "
        f"over each row's own chance {(per_token + LN_454).mean():+.3g} per answer token, 95% CI [{margin[0]:.3g}, "
        f"{margin[1]:.3g}], above it on {above} of 16 rows); relative findings are not reported."), text
    # issue 34: the unpruned metric is the chance sentence's mean: said once, with its interval, then its n
    assert text.count(f"{logp.mean():.3g}") == 1 and text.count(f"[{ci[0]:.3g}, {ci[1]:.3g}]") == 1
    assert "relative findings are not reported. The answer log-probability above is the unpruned model's, over 16 " \
           "examples." in text


# ---- the t interval of a mean over examples ------------------------------------------------------
def _scipy_interval(x, level=0.95):
    """scipy's Student-t interval of the mean of x (no NaN; n >= 2, sd > 0)."""
    x = np.asarray(x, dtype=float)
    return list(stats.t.interval(level, len(x) - 1, loc=x.mean(), scale=x.std(ddof=1) / np.sqrt(len(x))))


def test_mean_interval_is_scipys_t_interval_of_the_finite_values():
    assert chance.mean_interval([1.0, 2.0, 4.0]) == pytest.approx(_scipy_interval([1.0, 2.0, 4.0]), rel=1e-12)
    # n = 2: mean 4, sd sqrt(2), se 1, t(0.975, 1) = 12.7062
    assert chance.mean_interval([3.0, 5.0]) == pytest.approx([4 - 12.7062047, 4 + 12.7062047])
    assert chance.mean_interval([3.0, 5.0], alpha=0.1) == pytest.approx(_scipy_interval([3.0, 5.0], 0.9), rel=1e-12)
    # NaN and infinities are left out: the interval of the rest; under two left: None
    with_gaps = [1.0, float("nan"), 2.0, float("inf"), 4.0]
    assert chance.mean_interval(with_gaps) == pytest.approx(_scipy_interval([1.0, 2.0, 4.0]), rel=1e-12)
    assert chance.mean_interval([2.5]) is None and chance.mean_interval([2.5, float("nan")]) is None
    assert chance.mean_interval([]) is None
    assert chance.mean_interval([2.0, 2.0, 2.0]) == [2.0, 2.0]  # no spread: the mean exactly


def test_t_quantile_and_half_width_are_scipys_element_wise_and_nan_under_two():
    assert chance.t_quantile(10) == pytest.approx(stats.t.ppf(0.975, 9), rel=1e-12)
    assert math.isnan(chance.t_quantile(1)) and math.isnan(chance.t_half_width(0.5, 1))
    lo, hi = stats.t.interval(0.9, 4, loc=0.0, scale=2.0 / np.sqrt(5))
    assert chance.t_half_width(2.0, 5, alpha=0.1) == pytest.approx(hi, rel=1e-12) and lo == pytest.approx(-hi)
    sd, n = np.array([1.0, 0.0, 2.0, 3.0, 0.7]), np.array([0, 1, 2, 7, 30])
    half = chance.t_half_width(sd, n)  # [5]
    want = [stats.t.interval(0.95, k - 1, scale=s / np.sqrt(k))[1] if k >= 2 else np.nan for s, k in zip(sd, n)]
    np.testing.assert_allclose(half, want, rtol=1e-12)
    np.testing.assert_allclose(chance.t_half_width(sd[2:], 4), [chance.t_half_width(float(s), 4) for s in sd[2:]],
                               rtol=0)


def test_se_interval_is_the_t_interval_from_a_standard_error_and_n():
    """mean -+ t(0.975, n - 1) x se, the quantile from scipy by hand; the se of a sample gives scipy's own interval of
    its mean; None under two examples or without a finite se."""
    assert chance.se_interval(1.5, 0.4, 6) == pytest.approx([1.5 - stats.t.ppf(0.975, 5) * 0.4,
                                                             1.5 + stats.t.ppf(0.975, 5) * 0.4], rel=1e-12)
    assert chance.se_interval(-2.0, 0.3, 3, alpha=0.1) == pytest.approx([-2.0 - stats.t.ppf(0.95, 2) * 0.3,
                                                                         -2.0 + stats.t.ppf(0.95, 2) * 0.3], rel=1e-12)
    x = np.array([0.3, 1.9, -0.4, 2.2, 0.8])
    assert chance.se_interval(float(x.mean()), float(x.std(ddof=1) / np.sqrt(5)), 5) == pytest.approx(
        _scipy_interval(x), rel=1e-12)
    assert chance.se_interval(1.0, 0.0, 4) == [1.0, 1.0]  # no spread: the mean exactly
    assert chance.se_interval(1.0, 0.4, 1) is None and chance.se_interval(1.0, 0.4, 0) is None
    assert chance.se_interval(1.0, float("nan"), 6) is None and chance.se_interval(1.0, None, 6) is None
    assert chance.se_interval(1.0, float("inf"), 6) is None


def test_mean_intervals_is_mean_interval_along_an_axis():
    x = np.random.default_rng(3).normal(size=(2, 6, 3))
    x[0, :, 0] = np.nan  # n = 0
    x[0, 1:, 1] = np.nan  # n = 1
    x[1, 2:, 1] = np.nan  # n = 2
    x[1, :, 2] = 1.5  # no spread
    x[0, 3, 2] = np.inf  # left out by default
    out = chance.mean_intervals(x, axis=1)  # [2, 3] each
    for i in range(2):
        for j in range(3):
            column = x[i, :, j]
            ci, kept = chance.mean_interval(column), column[np.isfinite(column)]
            assert out["n"][i, j] == len(kept)
            assert out["mean"][i, j] == pytest.approx(kept.mean() if len(kept) else np.nan, rel=1e-12, nan_ok=True)
            got = [out["low"][i, j], out["high"][i, j]]
            assert (ci is None and np.isnan(got).all()) or got == pytest.approx(ci, rel=1e-12)
    assert out["n"].dtype == np.int64 and out["low"].shape == (2, 3)
    np.testing.assert_allclose([out["low"][1, 1], out["high"][1, 1]], _scipy_interval(x[1, :2, 1]), rtol=1e-12)
    with np.errstate(invalid="ignore"):  # inf - inf
        kept_inf = chance.mean_intervals(x, axis=1, where=~np.isnan(x))  # a caller that keeps infinities in
    assert kept_inf["n"][0, 2] == 6 and kept_inf["mean"][0, 2] == np.inf and not np.isfinite(kept_inf["high"][0, 2])


def test_accuracy_uses_the_exact_binomial_test():
    hits = [1.0] * 40 + [0.0] * 24
    out = chance.assess(hits, "accuracy", vocab_size=1000)
    ref = stats.binomtest(40, 64, p=0.001)
    ci = ref.proportion_ci(0.95, method="exact")
    assert out["at_chance"] is False and out["chance_value"] == 0.001 and out["mean"] == 40 / 64
    central = 2 * stats.binom.sf(39, 64, 0.001)  # the upper tail doubled: the p the exact interval inverts
    assert out["ci"] == pytest.approx([ci.low, ci.high]) and out["p_value"] == pytest.approx(central)
    few = chance.assess([1.0] * 3 + [0.0] * 61, "accuracy", vocab_size=1000)  # significant, but 4.7% < 5 points
    assert stats.binomtest(3, 64, p=0.001).pvalue < 0.01 and few["at_chance"] is True
    assert chance.assess([1.0] * 30 + [0.0] * 34, "accuracy", n_classes=2)["at_chance"] is True  # 47% of 2 classes


def test_a_fractional_accuracys_interval_stays_within_0_and_1():
    """Review 20: position's accuracy per example is its share of several gold positions, so its interval is a t
    interval, which read [-0.014, 0.0765] for a mean of 0.031; with the bounds position passes, it stops at 0 (and at
    1), the t interval's other end kept; without bounds (margins over chance, log-odds) the whole t interval."""
    shares = np.array([0.0] * 13 + [0.2, 0.4, 0.2])  # 16 examples, each the share of 5 positions answered right
    out = chance.assess(shares, "accuracy", n_classes=17, bounds=(0.0, 1.0))
    half = stats.t.ppf(0.975, 15) * shares.std(ddof=1) / np.sqrt(16)
    assert shares.mean() - half < 0  # the premise: the plain t interval reaches below 0
    assert out["ci"] == pytest.approx([0.0, shares.mean() + half]) and out["at_chance"] is True
    full = chance.assess(1.0 - shares, "accuracy", n_classes=17, bounds=(0.0, 1.0))
    assert full["ci"] == pytest.approx([1.0 - shares.mean() - half, 1.0])
    margins = chance.assess(shares - 0.05, "accuracy", chance=0.0)  # margins over chance: no bounds
    assert margins["ci"] == pytest.approx([shares.mean() - 0.05 - half, shares.mean() - 0.05 + half])


def test_chance_values_and_metrics_without_one():
    assert chance.chance_value("logprob", vocab_size=100) == pytest.approx(-math.log(100))
    assert chance.chance_value("accuracy", vocab_size=100, n_classes=4) == 0.25
    assert chance.chance_value("cosine") is None and chance.chance_value("logprob") is None
    assert chance.assess([0.9, 0.8], "cosine") is None
    uniform = chance.assess([-4.7, -4.5, -4.6, -4.62], "logprob", vocab_size=100)  # log(1/100) = -4.61
    assert uniform["at_chance"] is True
    assert chance.assess([-1.0, -1.2, -0.9, -1.1], "logprob", vocab_size=100)["at_chance"] is False


def test_from_a_mean_alone():
    assert chance.assess_mean(-0.008, "logit_diff")["at_chance"] is True  # the random checkpoint
    high = chance.assess_mean(2.0, "logit_diff", n_examples=64)
    assert high["at_chance"] is False and high["ci"] is None and high["n_examples"] == 64
    probe = {"metric": "accuracy", "best_accuracy": 0.36, "majority_baseline": 0.34, "n_examples": 100}
    assert chance.from_summary(probe)["at_chance"] is True
    good = chance.from_summary({**probe, "best_accuracy": 0.69, "n_examples": 1550})
    ref = stats.binomtest(round(0.69 * 1550), 1550, p=0.34).proportion_ci(0.95, method="exact")
    assert good["at_chance"] is False and good["ci"] == pytest.approx([ref.low, ref.high])
    assert chance.from_summary({"metric": "logit_diff", "baseline_metric": 0.03})["at_chance"] is True
    assert chance.from_summary({"metric": "logit_diff", "clean_metric": 1.0, "normalized": True}) is None


# ---- per-example clean values ------------------------------------------------------------------
def _alone(model, task, i):
    """Row i run alone, unpadded: its logit difference or answer log-probability at its last token."""
    row = task.example(i)
    with torch.inference_mode():
        last = model(row.tokens)[0, -1].double()
    if task.metric == "logit_diff":
        return float(last[row.answers[0]] - last[row.wrong_answers[0]])
    return float(last.log_softmax(-1)[row.answers[0]])


def test_clean_values_of_a_left_padded_task_match_each_row_alone(arch_models, mixed_tasks):
    model, task = arch_models("gpt2"), mixed_tasks("gpt2")
    assert task.padded and task.metric == "logit_diff"
    values, vocab = chance.clean_values(model, task)
    assert vocab == model.facts.d_vocab
    assert values.tolist() == pytest.approx([_alone(model, task, i) for i in range(len(task))], abs=1e-4)


def test_clean_values_of_a_right_padded_task_read_each_rows_last_token(arch_models):
    from headscope.analyses.core.tasks import Task
    from headscope.models.hooked_model import pad_token_rows

    model = arch_models("gpt2")
    left = sentence_task(model, n_examples=5)  # decoders: left-padded
    ids, mask = pad_token_rows([left.example(i).tokens[0].tolist() for i in range(len(left))], 0, left=False)
    task = Task(name="right", tokens=ids, answers=left.answers, attention_mask=mask, metric="logprob")
    assert task.padded and task.metric == "logprob"
    assert task.answer_positions().tolist() == (task.attention_mask.sum(1) - 1).tolist()
    values, _ = chance.clean_values(model, task, max_bytes=1)  # one row a pass
    assert values.tolist() == pytest.approx([_alone(model, task, i) for i in range(len(task))], abs=1e-4)


def test_a_task_other_than_the_analysis_ran_on_falls_back_to_the_reported_mean(arch_models, mixed_tasks):
    model, task = arch_models("gpt2"), mixed_tasks("gpt2")
    own = chance.model_on_task(model, task)
    assert own["ci"] is not None and own["task"] == task.name
    near = chance.model_on_task(model, task, expected_mean=own["mean"] + 1e-6)  # the same rows, another pass's rounding
    assert near["ci"] == pytest.approx([own["ci"][0] + 1e-6, own["ci"][1] + 1e-6], abs=1e-9)
    other = chance.model_on_task(model, task, expected_mean=5.0)  # the analysis reported another mean
    assert other["ci"] is None and other["mean"] == 5.0 and other["at_chance"] is False
    assert "no per-example values" in other["reason"]


def test_a_logit_difference_record_is_centred_on_the_analysis_own_mean_within_rounding(arch_models, mixed_tasks):
    """Review 16a B2: heads' summary held baseline_metric 3.8203 (its pass) and chance.mean 3.8242 (the guard's own
    bfloat16 pass on the same 16 rows); the finding quoted the second, compare the first. Within the rounding
    tolerance the record is the analysis's mean with the guard pass's spread: the t interval (scipy) of the clean
    values (row by row, unpadded) shifted to that mean."""
    model, task = arch_models("gpt2"), mixed_tasks("gpt2")
    assert task.metric == "logit_diff"
    values = np.array([_alone(model, task, i) for i in range(len(task))])
    reported = float(values.mean()) + 5e-4  # inside the 1e-3 tolerance: rounding, not another task
    got = chance.model_on_task(model, task, expected_mean=reported)
    shifted = values - values.mean() + reported
    low, high = stats.t.interval(0.95, len(values) - 1, loc=shifted.mean(), scale=stats.sem(shifted))
    assert got["mean"] == pytest.approx(reported, abs=1e-9)
    assert got["ci"] == pytest.approx([low, high], abs=1e-4)


def test_below_chance_the_corrupted_prompts_tell_a_prompt_independent_preference(arch_models, mixed_tasks):
    """Review 9b (C1): an untrained model's -0.17 below chance was called "systematically prefers the wrong answers"
    while the corrupted prompts gave -0.13 for the same answer pairs. Here each row's wrong answer is its clean
    prompt's top token, so the clean logit difference is below 0; the corrupted prompts' (each row run alone,
    unpadded) and the paired clean-minus-corrupted interval (scipy's ttest_rel) are recorded."""
    from dataclasses import replace

    model, task = arch_models("gpt2"), mixed_tasks("gpt2")
    with torch.no_grad():
        tops = [int(model(task.example(i).tokens)[0, -1].argmax()) for i in range(len(task))]
    task = replace(task, wrong_answers=torch.tensor(tops))
    entry = chance.model_on_task(model, task)
    assert entry["below_chance"] is True
    clean = np.array([_alone(model, task, i) for i in range(len(task))])
    with torch.no_grad():
        lasts = [model(task.example(i).corrupted_tokens)[0, -1].double() for i in range(len(task))]  # [vocab] each
    corrupted = np.array([float(last[int(task.answers[i])] - last[tops[i]]) for i, last in enumerate(lasts)])
    assert entry["corrupted_mean"] == pytest.approx(corrupted.mean(), abs=1e-4)
    assert entry["corrupted_ci"] == pytest.approx(_scipy_ci(corrupted), abs=1e-4)
    paired = stats.ttest_rel(clean, corrupted).confidence_interval(0.95)
    diff = entry["clean_minus_corrupted"]
    assert diff["n"] == len(task) and diff["mean"] == pytest.approx((clean - corrupted).mean(), abs=1e-4)
    assert diff["ci"] == pytest.approx([paired.low, paired.high], abs=1e-4)
    same = abs((clean - corrupted).mean()) < 0.1 or paired.low <= 0 <= paired.high
    assert entry["prompt_independent"] is bool(same)


# ---- through the registry: a random model at chance ---------------------------------------------
def test_a_random_model_is_at_chance_and_its_findings_drop_relative_thresholds(arch_models):
    model = arch_models("gpt2")
    config = config_class("heads").preset(quick=True)
    result = hs.run_analysis("heads", model, None, config)
    entry = result.summary["chance"]
    assert entry["at_chance"] is True and entry["metric"] == "logit_diff" and entry["ci"] is not None
    task = task_used("heads", model, None, config)
    values = [_alone(model, task, i) for i in range(len(task))]  # independent of clean_values
    assert entry["mean"] == pytest.approx(np.mean(values), abs=1e-4)
    assert entry["mean"] == pytest.approx(result.summary["baseline_metric"], abs=1e-4)  # the heads engine's baseline
    assert entry["ci"] == pytest.approx(_scipy_ci(values), abs=1e-4)
    text = finding("heads", result.summary)
    assert text.startswith(f"The model is {'below' if entry['below_chance'] else 'at'} chance on task {task.name} (")
    assert "relative findings are not reported" in text
    assert "within 1%" not in text and "within tolerance" not in text
    kv = hs.run_analysis("kv", model, None, config_class("kv").preset(quick=True))
    assert kv.summary["chance"]["at_chance"] is True and kv.summary["chance"]["metric"] == "logprob"
    assert kv.summary["chance"]["chance_from"] == "vocabulary_mean"  # not log(1/V) (review 13a A2)
    assert kv.summary["chance"]["uniform_chance"] == pytest.approx(-math.log(model.facts.d_vocab))
    assert kv.summary["chance"]["chance_value"] < kv.summary["chance"]["uniform_chance"]  # Jensen
    assert "within 1%" not in finding("kv", kv.summary)


def test_the_guard_keeps_skipped_results_and_never_loses_one(caplog):
    skipped = Result(name="patching", df=pd.DataFrame(), summary={"skipped": "encoder"})
    assert with_chance("patching", skipped, SimpleNamespace()) is skipped
    result = Result(name="heads", df=pd.DataFrame(), summary={"baseline_metric": 1.0})
    with caplog.at_level(logging.WARNING):
        kept = with_chance("heads", result, SimpleNamespace(), task=None)  # no .facts: the guard fails
    assert kept is result and "chance" not in kept.summary and "chance-level guard failed" in caplog.text


# ---- the trained zoo model ------------------------------------------------------------------------
@pytest.mark.slow
def test_the_zoo_model_on_kv_is_not_at_chance(zoo_model):
    result = hs.run_analysis("kv", zoo_model, "kv", config_class("kv").preset(quick=True))
    entry = result.summary["chance"]
    assert entry["at_chance"] is False and entry["metric"] == "logit_diff" and entry["task"] == "kv"
    assert entry["mean"] == pytest.approx(result.summary["metric_unevicted"], rel=1e-4)
    assert entry["ci"][0] > 1.0 and entry["effect_size"] > 1.0
    text = finding("kv", result.summary)
    assert "at chance" not in text  # and the eviction claim is made, whichever way the data go
    assert "within 1%" in text.lower() and "policy" in text  # (whichever way the data go)


def test_position_says_whether_retrieval_beats_guessing_among_the_items(arch_models):
    """Position runs on its own sweeps, so it adds the guard itself: per-example accuracy (mean over the
    gold positions) against 1/n_items, the exact binomial when every example is all right or all wrong."""
    from scipy.stats import binom

    from headscope.analyses.position.analysis import PositionConfig

    result = hs.run_analysis("position", arch_models("gpt2"), None, PositionConfig.preset(quick=True))
    entry, s = result.summary["chance"], result.summary
    assert entry["chance_value"] == pytest.approx(1 / s["n_items"])
    per_example = result.df.groupby("example")["accuracy"].mean()
    assert entry["mean"] == pytest.approx(per_example.mean()) and entry["n_examples"] == len(per_example)
    if per_example.isin([0.0, 1.0]).all():
        k = int(per_example.sum())
        n, p0 = len(per_example), 1 / s["n_items"]
        tails = min(binom.cdf(k, n, p0), binom.sf(k - 1, n, p0))  # the central exact p (what the interval inverts)
        assert entry["p_value"] == pytest.approx(min(1.0, 2 * tails))
    else:  # shares: scipy's t interval, cut at 0 and 1 (review 20: it read [-0.014, 0.0765])
        x = per_example.to_numpy()
        low, high = stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=stats.sem(x)) if x.std() else (x.mean(),) * 2
        assert entry["ci"] == pytest.approx([max(low, 0.0), min(high, 1.0)])
    assert entry["at_chance"]  # a random GPT-2 does not retrieve
    assert entry["n_classes"] == s["n_items"] and entry["task"] == s["task"]  # what the chance sentence names
    # what the model produced, counted over every output (review 10b A2): the gold value, any of the context's values
    df = result.df
    assert entry["outputs"] == len(df) and entry["gold_outputs"] == int(df.accuracy.sum())
    assert entry["copied_outputs"] == int(df.copied.sum()) and entry["copied_outputs"] >= entry["gold_outputs"]
    assert entry["does_not_copy"] is (entry["copied_outputs"] == 0)
    # generation scored by "contains the value" picks no answer from a list: chance is copying one of the values
    assert f"(1/{s['n_items']}: copying one of the {s['n_items']} values in the context)" in finding("position", s)
    # at chance no retrieval head is named, whatever the test found; the test is recorded with its n for every head
    heads = result.tables["heads"]
    assert "retrieval head" not in finding("position", s) and "L0H" not in finding("position", s)
    model = arch_models("gpt2")
    assert s["retrieval_test"]["n_heads"] == len(heads) == model.facts.n_layers * model.facts.n_heads
    assert s["retrieval_test"]["n_rows"] == len(result.df) and s["retrieval_test"]["n_examples"] == s["n_examples"]
    assert {"n", "p_corr", "p_corr_holm", "p_mass", "p_mass_holm"} <= set(heads.columns)


def test_inside_is_the_interval_within_the_band():
    """Review 8b A3: "within 1%" needs the whole interval inside +-1% (hand-worked intervals)."""
    from headscope.analyses.core.chance import inside

    assert inside(-0.004, 0.009, 0.01) and inside(-0.01, 0.01, 0.01)
    assert not inside(-0.094, 0.098, 0.01)  # the review's +0.2% mean with [-9.4%, +9.8%]
    assert not inside(0.005, 0.011, 0.01) and not inside(None, 0.005, 0.01) and not inside(float("nan"), 0.0, 0.01)


def _copy_entry(n_examples: int, **counts) -> dict:
    """The position analysis's guard of json_kv by hand: per-example accuracy 0 on every example (4 gold positions
    each), chance 1/4 (copying one of the 4 values in the context), then chance.copy_task with `counts`."""
    entry = chance.with_basis(chance.assess([0.0] * n_examples, "accuracy", n_classes=4), task="json_kv", n_classes=4)
    entry["classes_from"] = "context"
    return chance.copy_task(entry, outputs=4 * n_examples, gold=counts.get("gold", 0), copied=counts.get("copied"))


def test_accuracy_zero_on_a_copy_task_is_not_doing_it_whatever_n():
    """Review 10b A2: a model that copies no value was "at chance" with 8 examples (Clopper-Pearson [0, 0.369]
    contains 1/4) and "below chance ... systematically dispreferred" with 24 ([0, 0.142]). Accuracy 0 with none of
    the context's values produced is "does not do this task" at both n; below chance is kept for a model that copies
    wrong values more than chance allows (the gold one's share among its copies, exact binomial)."""
    assert stats.binomtest(0, 8, 0.25).proportion_ci(0.95, "exact").high > 0.25  # the old verdicts, by scipy
    assert stats.binomtest(0, 24, 0.25).proportion_ci(0.95, "exact").high < 0.25
    for n in (8, 24):
        entry = _copy_entry(n, copied=0)
        assert entry["does_not_copy"] is True and entry["below_chance"] is False and entry["at_chance"] is True
        text = finding("position", {"chance": entry})
        assert text.startswith(f"The model never produces any of the context's values (0 of {4 * n} outputs; accuracy 0 "
                               "against chance 0.25 (1/4: copying one of the 4 values in the context)"), text
        assert "it does not do task json_kv" in text and "below chance" not in text and "guessing" not in text
    # copying not recorded (older runs, QA): accuracy 0 still is no preference, said without the claim on the values
    text = finding("position", {"chance": _copy_entry(24)})
    assert "The model never produces the gold value (0 of 96 outputs; " in text, text
    assert "; which of the context's values it produces instead is not recorded)" in text and "below chance" not in text
    # an entry written before copy_task (below_chance True, classes_from context, mean 0): read the same way
    old = chance.with_basis(chance.assess([0.0] * 24, "accuracy", n_classes=4), task="json_kv", n_classes=4)
    assert old["below_chance"] is True
    text = finding("position", {"chance": {**old, "classes_from": "context"}})
    assert "never produces the gold value" in text and "below chance" not in text
    # copies wrong values: 0 of 40 copies are the gold one, CI [0, 0.088] under 1/4: below chance, said so
    wrong = _copy_entry(24, copied=40)
    high = stats.binomtest(0, 40, 0.25).proportion_ci(0.95, "exact").high
    assert wrong["below_chance"] is True and wrong["gold_share_ci"][1] == pytest.approx(high)
    text = finding("position", {"chance": wrong})
    assert text.startswith("The model is below chance on task json_kv") and "0 are the gold one" in text
    assert "it systematically prefers the wrong values" in text
    # 6 copies: 0 of 6, CI [0, 0.46] contains 1/4: no preference shown, not below chance
    few = _copy_entry(24, copied=6)
    assert few["below_chance"] is False and few["at_chance"] is True and "contains chance" in few["reason"]
    assert finding("position", {"chance": few}).startswith("The model is at chance on task json_kv")


def test_below_chance_accuracy_is_said_once():
    """Review 10b A2: "worse than guessing, it scores under guessing" said one thing twice."""
    entry = chance.with_basis(chance.assess([0.0] * 30, "accuracy", n_classes=4), task="facts", n_classes=4)
    text = finding("position", {"chance": entry})
    assert "below chance on task facts" in text and "it scores under a uniform guess, so its answers are " \
           "systematically dispreferred" in text and "worse than guessing" not in text, text


# ---- review 13a A2: a log-probability's chance is the model's own every-token mean, not log(1/V) ---------------
def test_answers_below_log_one_over_v_but_at_the_models_own_token_mean_are_not_below_chance():
    """Hand-built: 16 answers each 0.4-0.6 nats under log(1/100) (the old rule: "below chance ... dispreferred"),
    but each within noise of the model's own mean log-probability over the vocabulary at that position (by Jensen
    every token of an uneven model averages below log(1/V)). Against its own mean the model is at chance, not below."""
    own = -math.log(100) - np.linspace(0.4, 0.6, 16)  # [rows]: each position's every-token mean
    answers = own + np.tile([0.05, -0.05], 8)  # [rows]: no nearer to or further from it than noise
    task = SimpleNamespace(continuation=None)
    old = chance.assess(answers, "logprob", vocab_size=100)
    assert old["below_chance"] is True  # the log(1/V) rule's verdict
    entry = chance.against_vocabulary_mean(torch.tensor(answers), torch.tensor(own), task, 100)
    assert entry["at_chance"] is True and entry["below_chance"] is False
    assert entry["chance_value"] == pytest.approx(own.mean()) and entry["uniform_chance"] == pytest.approx(-math.log(100))
    assert entry["margin"]["ci"] == pytest.approx(_scipy_ci(answers - own))
    text = finding("kv", {"metric": "logprob", "metric_unevicted": float(answers.mean()), "chance": {**entry, "vocab_size": 100}})
    assert "dispreferred" not in text and "own mean log-probability over its vocabulary" in text


def test_an_older_below_log_one_over_v_entry_is_not_read_as_dispreferred():
    entry = {**chance.assess(-math.log(100) - np.linspace(0.4, 0.6, 16), "logprob", vocab_size=100), "vocab_size": 100}
    text = finding("kv", {"metric": "logprob", "metric_unevicted": -5.1, "chance": entry})
    assert "dispreferred" not in text.replace("does not show that the answers are dispreferred", "")
    assert "Jensen" in text and "relative findings are not reported" in text
    assert chance.assess_mean(-5.1, "logprob", vocab_size=100)["below_chance"] is False


def test_a_logprob_tasks_own_chance_matches_plain_hugging_face(arch_models, hf_of):
    """model_on_task on a log-probability task: each row's chance is plain HF's mean log-softmax over the vocabulary
    at the answer position, and the margin's interval is scipy's over answer minus that mean."""
    model, hf = arch_models("gpt2"), hf_of("gpt2")
    task = sentence_task(model, n_examples=6)
    assert task.metric == "logprob"
    entry = chance.model_on_task(model, task)
    ans, own = [], []
    with torch.no_grad():
        for i in range(len(task)):
            lp = hf(task.example(i).tokens).logits[0, -1].double().log_softmax(-1)  # [vocab]
            ans.append(float(lp[int(task.answers[i])]))
            own.append(float(lp.mean()))
    ans, own = np.array(ans), np.array(own)
    assert entry["chance_from"] == "vocabulary_mean" and entry["chance_value"] == pytest.approx(own.mean(), abs=1e-4)
    assert own.mean() < -math.log(model.facts.d_vocab)  # Jensen, on a real (random) model
    assert entry["margin"]["mean"] == pytest.approx((ans - own).mean(), abs=1e-4)
    assert entry["margin"]["ci"] == pytest.approx(_scipy_ci(ans - own), abs=1e-4)


# ---- review 13b A2: an interval too wide to tell is not "at chance" -------------------------------------------------
WIDE = [0.2, 2.9, -0.1, 2.2]  # 4 examples: mean 1.3, sd 1.48 (0.88 sds above 0), t interval about [-1.05, 3.65]


def test_four_examples_whose_interval_is_too_wide_to_tell_are_not_called_at_chance():
    """Hand-built like review 13b A2 (the attribution section's 4 examples, mean 1.3, CI [-0.7, 3.3], were "at chance"
    while 16 of the same run were at 2.54 [0.82, 4.25]): the interval contains 0, but the mean clears the floor by 0.88
    per-example sds, so the guard cannot tell; a mean near 0 (or a small effect) stays at chance."""
    lo, hi = _scipy_ci(WIDE)
    assert lo < 0 < hi
    out = chance.assess(WIDE, "logit_diff")
    assert out["undetermined"] is True and out["at_chance"] is False and out["below_chance"] is False
    assert out["ci"] == pytest.approx([lo, hi]) and out["reason"].startswith("cannot tell from 4 examples")
    assert chance.assess([0.3, -0.4, 0.5, -0.2], "logit_diff")["undetermined"] is False  # mean 0.05: under the floor
    small = chance.assess([2.0, -1.5, 3.0, -1.0, 0.5], "logit_diff")  # 0.31 sds: drowned in noise, at chance
    assert small["at_chance"] is True and small["undetermined"] is False
    tight = chance.assess(np.tile(WIDE, 8), "logit_diff")  # the same spread over 32 examples: clearly above chance
    assert tight["at_chance"] is False and tight["undetermined"] is False


def test_the_findings_report_taus_with_the_caveat_instead_of_withholding_them():
    entry = {**chance.assess(WIDE, "logit_diff"), "task": "recall"}
    s = {"n_examples": 4, "metric": "logit_diff", "chance": entry,
         "mean_tau_attention_saliency": 0.48, "std_tau_attention_saliency": 0.1, "n_tau_attention_saliency": 4}
    text = finding("attribution", s)
    assert text.startswith("On its 4 examples the logit difference (1.3, 95% CI [")
    assert "cannot be told from chance (0) on task recall: the interval is too wide to tell either way" in text
    assert "The model is at chance" not in text and "0.48" in text  # the tau is reported, not withheld
    withheld = finding("attribution", {**s, "chance": {**entry, "at_chance": True, "undetermined": False}})
    assert "0.48" not in withheld and "at chance on task recall" in withheld


def test_the_best_of_several_probe_layers_is_tested_bonferroni_corrected():
    """Review 15a B1: 'above chance' was taken on the best of 3 layers with no correction for choosing it. 10 of 39
    against a majority of 5/39 is above chance alone (central exact p = 0.045, exact 95% interval above 0.128) but not
    as the best of 3 (p x 3 = 0.13; the exact 1 - 0.05/3 interval holds 0.128); 11 of 39 stays above (3 x 0.0164)."""
    probe = {"metric": "accuracy", "majority_baseline": 5 / 39, "n_scored": 39, "n_examples": 40,
             "accuracy_per_layer": {"0": 8 / 39, "1": 10 / 39, "2": 7 / 39}, "best_accuracy": 10 / 39}
    for k, at in ((10, True), (11, False)):
        entry = chance.from_summary({**probe, "best_accuracy": k / 39})
        ref = stats.binomtest(k, 39, p=5 / 39)
        ci = ref.proportion_ci(1 - 0.05 / 3, method="exact")
        assert entry["at_chance"] is at and entry["ci"] == pytest.approx([ci.low, ci.high])
        raw = 2 * stats.binom.sf(k - 1, 39, 5 / 39)  # the upper tail doubled: the central p the interval inverts
        assert entry["p_value"] == pytest.approx(3 * raw) and entry["p_value_uncorrected"] == pytest.approx(raw)
        assert entry["correction"] == "bonferroni" and entry["n_compared"] == 3
    one = chance.from_summary({**probe, "accuracy_per_layer": {"0": 10 / 39}})  # one layer: nothing chosen
    assert one["at_chance"] is False and "correction" not in one


def test_the_exact_p_and_the_exact_interval_give_one_verdict():
    """Review 18a A1 (Phi-3, 12 of 39 correct against a majority of 6/39, best of 3 layers): the 98.3% Clopper-Pearson
    interval [0.147, 0.511] holds 6/39 (at chance) while scipy's default two-sided p, 0.0133 (x 3 = 0.040), rejected
    it. The p is now the one that interval inverts: twice the upper tail, P(X >= 12) = 0.01177 by a hand sum of
    binomial terms, so 0.0235 uncorrected, 0.0706 corrected: not under 0.05, as the interval says."""
    from math import comb

    p0 = 6 / 39
    upper = sum(comb(39, j) * p0 ** j * (1 - p0) ** (39 - j) for j in range(12, 40))
    assert upper == pytest.approx(0.01177, abs=1e-5)
    layers = {"0": 12 / 39, "1": 9 / 39, "2": 7 / 39}
    entry = chance.from_summary({"metric": "accuracy", "majority_baseline": p0, "n_scored": 39, "n_examples": 40,
                                 "accuracy_per_layer": layers, "best_accuracy": 12 / 39})
    ci = stats.binomtest(12, 39, p=p0).proportion_ci(1 - 0.05 / 3, method="exact")
    assert entry["ci"] == pytest.approx([ci.low, ci.high]) and ci.low < p0  # the interval's verdict: at chance
    assert entry["at_chance"] is True and entry["p_value_uncorrected"] == pytest.approx(2 * upper)
    assert entry["p_value"] == pytest.approx(3 * 2 * upper) and entry["p_value"] >= 0.05  # the p's verdict: the same
    from headscope.reports.plots_probes import correction_words

    assert correction_words({"chance": entry}).endswith(  # was "corrected p = 0.04 (uncorrected 0.013), at chance."
        "corrected p = 0.071 (uncorrected 0.024), at chance, narrowly (corrected p under twice the threshold).")
    for k in range(40):  # one verdict at every count: p under alpha exactly when the interval leaves p0 out
        ci = stats.binomtest(k, 39, p=p0).proportion_ci(0.95, method="exact")
        e = chance.assess([1.0] * k + [0.0] * (39 - k), "accuracy", chance=p0, floor=0.0)
        assert (e["p_value"] < 0.05) == (not ci.low <= p0 <= ci.high), k


def test_a_mean_near_zero_from_strong_preferences_that_cancel_says_so():
    """Review 17c B2 (StarCoder2 on recall: late rows +2.56, early -1.04, middle -0.87, mean 0.0997, mean |ld| 1.77):
    "at chance ... (no preference between the answer and the wrong answer)" claimed no preference where the rows have
    strong ones that cancel. Hand values: 12 rows +2.5, 14 rows -1.0, 14 rows -0.9: mean 0.085 (at chance), mean
    |difference| 56.6 / 40 = 1.415, 26 rows at |1| or beyond; the sentence says "no preference on average" and gives
    that size. Rows all near 0 get no such words."""
    from headscope.reports.findings import chance_sentence

    values = np.array([2.5] * 12 + [-1.0] * 14 + [-0.9] * 14)
    entry = chance.assess(values, "logit_diff")
    assert entry["at_chance"] and entry["mean"] == pytest.approx(3.4 / 40)
    assert entry["mean_abs"] == pytest.approx(56.6 / 40) and entry["n_strong"] == 26
    text = chance_sentence({**entry, "task": "recall"})
    assert ("(logit difference 0.085 against chance 0 (no preference on average between the answer and the wrong "
            "answer), 95% CI [") in text, text
    assert ("mean |logit difference| 1.42 (odds about 4.1:1 one way or the other), 26 of 40 rows at +-1 or beyond: the "
            f"rows prefer one answer or the other; their mean, on the answer's side, does not differ from 0 at 95% (t test "
            f"p = {stats.ttest_1samp(values, 0).pvalue:.2g})); relative findings are not reported.") in text, text
    quiet = chance.assess(np.array([0.05, -0.04, 0.03, -0.02, 0.01, -0.03, 0.02, -0.01]), "logit_diff")
    assert quiet["mean_abs"] == pytest.approx(0.0262, abs=1e-4) and "mean |logit" not in chance_sentence(quiet)


# review 18a's Phi-3 on colours: each row's logit difference by hand (plain HF, float32, hand_float32.json), 4 decimals
PHI3_LD = np.array([
    0.9356, -0.7057, 1.6751, -2.6266, 1.2944, 0.0924, -1.7727, -0.0309, -1.6388, -2.7327, 1.8328, 0.1150, 1.5521,
    -2.3646, -0.4235, -2.5423, 0.0201, -2.1937, 2.5769, -0.3083, -1.1400, -1.1395, -0.2967, -0.1932, -0.5317,
    -0.3193, -1.3826, 1.0902, -0.4556, -1.0118, 0.1985, 0.0109, -0.8913, 0.0317, -2.4861, -0.3374, 0.7185, 0.5225,
    -0.1796, 1.0273])


def test_rows_either_way_are_worded_by_the_mean_test_not_as_strong_preferences_that_cancel():
    """Review 18a B2: "strong preferences either way that cancel on average" for rows of mean |ld| 1.03 whose mean
    -0.35 leans to the wrong answer (t = -1.69, p = 0.098, scipy by hand): the sentence gives the odds of the size,
    the side and the t test's p, and says no more than 'does not differ from 0 at 95%'."""
    from headscope.reports.findings import chance_sentence

    t = stats.ttest_1samp(PHI3_LD, 0.0)
    assert t.statistic == pytest.approx(-1.69, abs=0.01) and t.pvalue == pytest.approx(0.098, abs=0.002)
    size = np.abs(PHI3_LD).mean()
    assert size == pytest.approx(1.035, abs=1e-3) and (np.abs(PHI3_LD) >= 1).sum() == 19
    text = chance_sentence({**chance.assess(PHI3_LD, "logit_diff"), "task": "colours"})
    assert (f"mean |logit difference| {size:.3g} (odds about {np.exp(size):.2g}:1 one way or the other), 19 of 40 "
            "rows at +-1 or beyond: the rows prefer one answer or the other; their mean, on the wrong answer's side, "
            f"does not differ from 0 at 95% (t test p = {t.pvalue:.2g})); relative findings") in text, text
    assert "strong" not in text and "cancel" not in text
    many = np.array([1.55, -1.45] * 2000)  # mean 0.05: the t test rejects 0, the 0.1 floor keeps it at chance
    p = stats.ttest_1samp(many, 0.0).pvalue
    assert p < 0.05
    text = chance_sentence(chance.assess(many, "logit_diff"))
    assert (f"their mean, on the answer's side, differs from 0 (t test p = {p:.2g}), by less than the 0.1-logit "
            "floor);") in text, text
