"""The attribution analysis's summary and aggregate tables, from its per-example rows (analysis.py's `attribution`):
the tau means, their paired rollout tests and significance counts (integrated gradients' only on the examples
convergence.py's rule keeps), the permutation and adversarial tests in the metric's units with a bootstrap interval
for means of absolute values, IG convergence, the best head against leave-one-out, leave-one-out's rounding ties and
the sliding window the last layer's taus rank within, and the examples where a method scores every token alike.

Summary keys (attention = the last layer's head mean): loo_metric (what leave-one-out's scores measure:
"tvd", "1-cosine" or, on a saturated output with a logit-difference task, "logit_diff"); loo_rounding (with
"logit_diff": the changes within one rounding step of the clean logits in the model's dtype, methods.logit_rounding_floor,
are ties at 0 before ranking; dtype, floor [min, max] in logits, n_within of n_scores, ranks_rounding when most are;
per example the loo_rounding table); gradient_rounding (the same for |gradient x input| against its floor,
methods.gradient_floor, every run; when ranks_rounding rollout_vs_raw leaves gradient x input out); mean_tau_attention_{gradient,
saliency, loo, ig} with std_tau_*, frac_significant_* and n_tau_*; the same for rollout (mean_tau_rollout_*, ...); rollout_vs_raw
({gradient, loo, ig}: the per-example paired difference tau(rollout) - tau(last layer) against that reference:
mean, sd, n, ci (95% t), p (paired t) and p_holm, Holm-corrected over the three); fraction_significant (over
all four pairs); mean_tau_gradient_loo and mean_tau_ig_loo (agreement among the baselines);
attention_window (a sliding-window last layer that hides ranked tokens from the answer query: every attention
vector of a windowed layer is ranked, against each method, only over the tokens inside its window; the scores
table marks the others `masked`); median_permutation_change (median over examples of the median output change over
permutations, in output_change's units: TVD on decoders, 1 - cosine on encoders), permutation_change_range and
permutation_change_n (the per-example medians' [min, max] and count); permutation_change_over_half and
permutation_change_beyond_logit (decoders, large_changes: the examples whose median TVD exceeds 0.5, and their own
one-logit bound e (1 - p(top))); median_permutation_tvd (the same, its older name, decoders only);
permutation_rounding_floor (encoders: {dtype, floor, ulps}, the 1 - cosine under which a change is rounding of a
cosine near 1 in the dtype it was computed in, rounding_floor); partner_ceiling (encoders: how
many examples' partner cosine, the gradients' metric, is >= 0.99, where it can rise by at most 1 - cosine and the
gradient methods rank changes that small; partner_ceiling);
saturated (decoders: the share of examples whose clean top token has p >= 0.99, the median 1 - p and the
most TVD a one-logit change can give there, permutation.saturation, of the clean runs loo_metric is decided on);
permutation_metric_change and
permutation_abs_metric_change (the task metric's change under the permutations, in its units: per
example the mean over draws of the signed and the absolute change; the mean over examples, with _sd and _n);
adversarial_metric_change (the same at the adversarial attention);
ig_max_abs_delta, ig_max_relative_delta and ig_max_steps_used (IG convergence); ig_converged (every example's
completeness error |sum attributions - (f(x) - f(baseline))| / |f(x) - f(baseline)|, the ig table's relative_error,
is within ig_error_tolerance 0.1), ig_n_converged, ig_n_not_converged, ig_median_relative_error and ig_worst (its
example, sum and change, steps and Captum's delta at them and at half of them), ig_max_steps (the cap the steps doubled
up to), ig_dtype (the precision its gradients ran in); ig_used and ig_examples_used
(convergence.py's rule: IG on every example, on the converged
ones only, or on none; every IG key above (taus, rollout_vs_raw's ig, fraction_significant, mean_tau_ig_loo) and the
tau_summary, tau_by_layer and tau_by_head tables hold only those examples; the per-example tables keep every row);
permutation_abs_metric_change_ci (seeded percentile bootstrap over examples); best_head_vs_loo;
n_tied_scores_{gradient, saliency, loo, ig, attention} (tied_scores: the examples where that method, or last-layer
attention, gives every ranked token the same score, so its tau is undefined there for a reason other than too few tokens);
median_adversarial_jsd and fraction_adversarial_near_ln2 (JSD >= 0.9 ln 2 with the output change
<= adversarial_epsilon; Jain & Wallace's adversarial attention), with adversarial_epsilon and adversarial_steps.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch

from headscope.analyses.attribution.adversarial import LN2
from headscope.analyses.attribution.agreement import paired_differences, summarise
from headscope.analyses.attribution.convergence import IgUse, ig_use

if TYPE_CHECKING:
    from headscope.analyses.attribution.analysis import AttributionConfig


SUMMARY_NAMES = {"grad_x_input": "gradient", "saliency": "saliency", "leave_one_out": "loo", "integrated_gradients": "ig"}
# the references the finding compares rollout with raw attention against (Holm corrects over these three)
ROLLOUT_REFERENCES = ("grad_x_input", "leave_one_out", "integrated_gradients")


def rounding_summary(rows: pd.DataFrame) -> dict[str, Any]:
    """The summary's loo_rounding from the per-example table: dtype, floor [min, max] over examples (logits),
    n_within (scores within it, ties), n_scores, and ranks_rounding: most scores are within it, so leave-one-out's
    tau would rank rounding and the finding leaves it out of its claims; gradient x input's also floor_kind
    ("measured" by a float32 re-run or a worst-case "bound", review 19e A1) and n_examples."""
    n_within, n_scores = int(rows.n_within_floor.sum()), int(rows.n_scores.sum())
    kind = {"floor_kind": str(rows.floor_kind.iloc[0]), "n_examples": len(rows)} if "floor_kind" in rows else {}
    return {"dtype": str(rows.dtype.iloc[0]), "floor": [float(rows.floor.min()), float(rows.floor.max())],
            "n_within": n_within, "n_scores": n_scores, "ranks_rounding": 2 * n_within > n_scores, **kind}


def tau_tables(df: pd.DataFrame, convergence: dict[str, Any]) -> dict[str, pd.DataFrame]:
    """tau_summary, tau_by_layer and tau_by_head from the tau rows (`df`), integrated gradients' only on the examples
    convergence.py's rule keeps (`convergence`: ig_convergence's record); the per-example df keeps every row."""
    used = ig_use({**convergence, "n_examples": int(df.example.nunique())}).rows(df)
    return {"tau_summary": summarise(used, ["attention", "method"]),
            "tau_by_layer": summarise(used[used.attention == "layer_mean"], ["layer", "method"]),
            "tau_by_head": summarise(used[used.attention == "head"], ["layer", "head", "method"])}


def bootstrap_mean_ci(values: np.ndarray, *, seed: int, n_boot: int = 2000, level: float = 0.95) -> list[float] | None:
    """Percentile bootstrap interval of the mean over examples (resampled with replacement, `seed`'s generator);
    None under 2 values. Used for means of absolute values, whose t interval can cross 0 where they cannot."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) < 2:
        return None
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(n_boot, len(values)))].mean(1)  # [n_boot]
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return [float(lo), float(hi)]


def attention_window(scores: pd.DataFrame, window: int | None) -> dict:
    """{"attention_window": ...} when the last layer's sliding window hides ranked tokens from the answer
    query (else {}): the window, how many ranked tokens its taus rank (min, max over examples) of how many
    ranked tokens there are, and in how many examples it cut."""
    last = scores[scores.method == "last_layer"]
    if not window or "masked" not in last or not last.masked.any():
        return {}
    hidden, total = last.groupby("example").masked.sum(), last.groupby("example").size()
    seen = total - hidden
    return {"attention_window": {"window": int(window), "ranked": [int(seen.min()), int(seen.max())],
                                 "of": [int(total.min()), int(total.max())], "n_examples_cut": int((hidden > 0).sum())}}


def tied_scores(scores: pd.DataFrame) -> dict[str, int]:
    """{n_tied_scores_<short>: the examples whose ranked tokens all get one score from that method} (every method
    scored, 0 included, so a record without the key predates it): Kendall tau is undefined there whatever the
    prompt's length (e.g. leave-one-out's changes all below the output's rounding), which the finding says instead
    of "too few tokens to rank"."""
    out = {}
    for method, short in {"last_layer": "attention", **SUMMARY_NAMES}.items():  # attention: the vector every tau ranks
        rows = scores[scores.method == method]
        if "masked" in rows:
            rows = rows[~rows.masked.astype(bool)]
        if len(rows):
            out[f"n_tied_scores_{short}"] = int((rows.groupby("example").score.nunique() == 1).sum())
    return out


def _summary(df: pd.DataFrame, tables: dict, convergence: dict[str, Any], *, kind: str, cfg: AttributionConfig,
             layer: int, encoder: bool, gradient_rounding: dict[str, Any] | None = None) -> dict:
    out: dict[str, Any] = {
        "attention": "last_layer", "metric": kind, "output_change": "1-cosine" if encoder else "tvd",
        "loo_mode": cfg.loo_mode, "n_examples": int(df.example.nunique()),
    }
    # IG's taus enter every claim only on the examples convergence.py's rule keeps (its converged ones, or none
    # when too few converge): the tau means, the paired rollout tests, the count of significant taus, IG vs LOO
    out.update(convergence)
    rule: IgUse = ig_use(out)
    df = rule.rows(df)
    summ = tables["tau_summary"].set_index(["attention", "method"])
    for att, prefix in (("last_layer", "attention"), ("rollout", "rollout")):
        for method, short in SUMMARY_NAMES.items():
            if (att, method) in summ.index:
                row = summ.loc[(att, method)]
                out[f"mean_tau_{prefix}_{short}"] = _num(row.mean_tau)
                out[f"std_tau_{prefix}_{short}"] = _num(row.std_tau)
                out[f"frac_significant_{prefix}_{short}"] = _num(row.frac_significant)
    # rollout against raw last-layer attention, paired per example, Holm over the references the finding names
    # (less gradient x input where most of its scores are rounding, review 18e A1: no test rests on rounding)
    rounds = bool(gradient_rounding and gradient_rounding.get("ranks_rounding"))
    paired = paired_differences(df, [m for m in ROLLOUT_REFERENCES if not (rounds and m == "grad_x_input")])
    out["rollout_vs_raw"] = {SUMMARY_NAMES[m]: {k: v if k in ("n", "ci") else _num(v) for k, v in e.items()}
                             for m, e in paired.items()}
    last = df[(df.attention == "last_layer")].dropna(subset=["tau"])
    flow = df[(df.attention == "rollout")].dropna(subset=["tau"])
    for method, short in SUMMARY_NAMES.items():  # examples with a defined tau (a prompt too short to rank gives NaN)
        if (("last_layer", method)) in summ.index:
            out[f"n_tau_attention_{short}"] = int(last[last.method == method].example.nunique())
        if (("rollout", method)) in summ.index:
            out[f"n_tau_rollout_{short}"] = int(flow[flow.method == method].example.nunique())
    if "scores" in tables:  # (a summary rebuilt from tau tables alone has no per-token scores)
        out.update(tied_scores(tables["scores"]))
    out["fraction_significant"] = _num(last.significant.mean()) if len(last) else None
    out["n_tau_tests"] = int(len(last))  # examples x methods used: the count the fraction is over
    pairs = rule.rows(rule.rows(tables["tau_methods"], "method_a"), "method_b")
    for a, b, key in (("grad_x_input", "leave_one_out", "gradient_loo"), ("integrated_gradients", "leave_one_out", "ig_loo")):
        sel = pairs[(pairs.method_a == a) & (pairs.method_b == b)].tau
        out[f"mean_tau_{key}"] = _num(sel.mean())
    perm = tables["permutation"]  # (its saturation: the caller's, from the clean pre-pass leave-one-out follows)
    out.update(permutation_change(perm, encoder=encoder))
    if encoder:  # the gradients' metric is a cosine to a partner: how many examples sit at its ceiling (review 11a A5)
        out["partner_ceiling"] = partner_ceiling(tables["ig"], tables.get("token_scores"))
    for column, key in (("metric_change", "permutation_metric_change"), ("abs_metric_change", "permutation_abs_metric_change"),
                        ("adversarial_metric_change", "adversarial_metric_change")):
        if column in perm:  # per-example means over draws, in the metric's units: their mean, sd and n
            values = perm[column].dropna()
            out[key] = _num(values.mean())
            out[f"{key}_sd"] = _num(values.std()) if len(values) > 1 else None
            out[f"{key}_n"] = int(len(values))
            if column == "abs_metric_change":  # a mean of |change| is >= 0: a bootstrap interval, not a t interval
                out[f"{key}_ci"] = bootstrap_mean_ci(values.to_numpy(), seed=cfg.seed)
    out["permutation_layer"] = layer
    out["n_permutations"] = cfg.n_permutations
    out["ig_max_abs_delta"] = _num(tables["ig"].delta.abs().max())
    if "adversarial_jsd" in perm:
        out["adversarial_epsilon"] = cfg.adversarial_epsilon
        out["adversarial_steps"] = cfg.adversarial_steps  # a longer search finds attention farther away (compare reads it)
        out["median_adversarial_jsd"] = _num(perm.adversarial_jsd.median())
        out["fraction_adversarial_near_ln2"] = _num((perm.adversarial_jsd >= 0.9 * LN2).mean())
    ig = tables["ig"]
    out["ig_max_relative_delta"] = _num((ig.delta.abs() / (ig.metric_input - ig.metric_baseline).abs()).max())
    out["ig_max_steps_used"] = int(ig.n_steps.max())
    heads = tables["tau_by_head"]
    heads = heads[heads.method == "leave_one_out"].dropna(subset=["mean_tau"])
    if len(heads):
        best = heads.loc[heads.mean_tau.idxmax()]
        out["best_head_vs_loo"] = {"layer": int(best.layer), "head": int(best["head"]), "mean_tau": _num(best.mean_tau)}
    return out


PARTNER_CEILING = 0.99  # a partner cosine from which an encoder example's gradient metric counts as at its ceiling
ROUNDING_ULPS = 8  # the rounding floor of a 1 - cosine: this many units in the last place of the metric's dtype below 1


def rounding_floor(dtype: str) -> float | None:
    """The smallest 1 - cosine a cosine near 1 resolves beyond rounding in `dtype` (ROUNDING_ULPS spacings of the
    dtype just below 1, eps / 2 each: float32 4.8e-07, bfloat16 0.031); None for a dtype torch does not know."""
    try:
        eps = torch.finfo(getattr(torch, dtype)).eps
    except (AttributeError, TypeError):
        return None
    return ROUNDING_ULPS * eps / 2


def permutation_change(perm: pd.DataFrame, *, encoder: bool) -> dict[str, Any]:
    """The summary's permutation-test keys from the permutation table (one row per example, its median change over
    draws): median_permutation_change (the median over examples, in the summary's output_change units: TVD on
    decoders, 1 - cosine on encoders), permutation_change_range ([min, max] of the per-example medians) and
    permutation_change_n; median_permutation_tvd, its older name, only where it is a TVD (decoders); on encoders
    permutation_rounding_floor ({dtype, floor, ulps}: rounding_floor of the dtype the 1 - cosine was computed in,
    the table's change_dtype), under which a change is rounding of the cosine, not a measured effect."""
    values = perm.median_change.dropna()
    out: dict[str, Any] = {"median_permutation_change": _num(values.median()) if len(values) else None,
                           "permutation_change_range": [float(values.min()), float(values.max())] if len(values) else None,
                           "permutation_change_n": int(len(values))}
    if not encoder:
        out["median_permutation_tvd"] = out["median_permutation_change"]
        out.update(large_changes(perm))
    elif "change_dtype" in perm and len(perm):
        dtype = str(perm.change_dtype.iloc[0])
        floor = rounding_floor(dtype)
        if floor is not None:
            out["permutation_rounding_floor"] = {"dtype": dtype, "floor": floor, "ulps": ROUNDING_ULPS}
    return out


HALF = 0.5  # a TVD above it: more than half the next-token probability moves


def large_changes(perm: pd.DataFrame) -> dict[str, Any]:
    """How many decoder examples' median TVD shows an effect the median over examples hides (review 14c A2: medians
    0.0003, 0.002, 0.017 and 0.92 were read as "cannot show an effect" from their median 0.009):
    permutation_change_over_half, the examples whose median TVD exceeds HALF (under at least half the draws more
    than half the next-token probability moves; on a clean top token with p > 0.5 it keeps less than half, since a
    TVD is at most the larger of the two distributions' mass off that token), and, where the table
    has each example's clean top_prob, permutation_change_beyond_logit, those whose median TVD exceeds
    e (1 - p(top)), the most a change of up to one logit in the clean top token's odds can give there
    (permutation.saturation's bound, per example): the log-odds moved by more than one logit."""
    rows = perm.dropna(subset=["median_change"])
    change = rows.median_change.to_numpy(dtype=float)  # [examples]
    out: dict[str, Any] = {"permutation_change_over_half": int((change > HALF).sum())}
    if "top_prob" in rows and rows.top_prob.notna().all():
        bound = np.minimum(1.0, np.e * (1.0 - rows.top_prob.to_numpy(dtype=float)))  # [examples]
        out["permutation_change_beyond_logit"] = int((change > bound).sum())
    return out


def partner_ceiling(ig: pd.DataFrame, token_scores: pd.DataFrame | None = None, *,
                    threshold: float = PARTNER_CEILING) -> dict[str, Any]:
    """How many encoder examples have a gradient metric at its ceiling: the cosine of the prompt's pooled embedding
    with its partner's (the ig table's metric_input) at or above `threshold`. There the cosine can rise by at most
    1 - cosine and its gradient is near 0, so saliency, gradient x input and integrated gradients rank the tokens by
    changes of that size (review 11a A5: 0.9995 for two prompts of one label, every token moving it by 1e-4 or
    less). -> n_saturated of n_examples, share, is_saturated (most are), threshold, examples (their ids),
    median_headroom (median 1 - cosine over them), median_token_ig (median |integrated-gradients attribution| of
    their ranked tokens, from token_scores, the first and last tokens left out as in every ranking)."""
    cos = ig.set_index("example").metric_input.astype(float)  # [examples] the partner cosine
    at = cos[cos >= threshold]
    out: dict[str, Any] = {"n_saturated": int(len(at)), "n_examples": int(len(cos)), "threshold": threshold,
                           "share": len(at) / len(cos) if len(cos) else 0.0, "is_saturated": 2 * len(at) > len(cos),
                           "examples": [int(e) for e in at.index],
                           "median_headroom": float((1.0 - at).median()) if len(at) else None}
    if len(at) and token_scores is not None and len(token_scores):
        ig_rows = token_scores[(token_scores.method == "integrated_gradients") & token_scores.example.isin(at.index)]
        ends = ig_rows.groupby("example").position.transform
        ranked = ig_rows[(ig_rows.position > ends("min")) & (ig_rows.position < ends("max"))]
        out["median_token_ig"] = float(ranked.score.abs().median()) if len(ranked) else None
    return out


def _num(x: Any) -> float | None:
    x = float(x)
    return None if np.isnan(x) else x
