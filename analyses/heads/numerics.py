"""The heads analysis's rounding floors and ties (analyses/heads/analysis.py's `_rounding_checks`): the analytic
rounding of a metric or loss (`rounding_step`), the gradients' scale (`gradient_scale`, GRADIENT_TIE_STEPS), and
`numerical_checks`: importance that is rounding at the model's dtype, or top heads that tie, said so and not ranked;
`ablation_tie` and `tie_reach` (whether a tie at the start of a pruning order can move its count).
"""
from __future__ import annotations

import math
from typing import Any

import pandas as pd
import torch

from headscope.analyses.core.metrics import noise_floor
from headscope.analyses.heads import rounding
from headscope.analyses.heads.importance import Scorer, readout_stats
from headscope.analyses.heads.pruning import head_label

# A mean gate gradient E_x |dL_x/d xi_h| rounds by a share of the example's gradients' scale, not of its own size
# (a backward pass sums terms that partly cancel): bfloat16 against float32, the largest |g16 - g32| over heads is
# 0.4-3.5 eps x E_x max_h |dL_x/d xi_h| on tiny random gpt2, llama and neox models (24 tasks; the same errors are
# up to 8.1 eps of the head's own size) and 4.2 eps on review 13a's trained Pythia-style model (7.8 eps of L0H2's
# own size). GRADIENT_TIE_STEPS eps of that scale bounds each head's rounding with a margin of 1.4 over 4.2: the analytic
# bound, used only where rounding.gradient_check measures none (it is 15-30x the measured rounding, reviews 14b A2/14c A1).
GRADIENT_TIE_STEPS = 6


# What each gradient rounding in a summary is for (review 14b verify A1: an analytic 0.0513 and a measured 0.0018 side by
# side, neither named): recorded as rounding_gradient_roles
GRADIENT_FLOOR_ROLES = {
    "rounding_floor_gradient": "analytic: one rounding step of the differentiated loss in the dtype it is computed "
                               "in, or the gradients' own rounding (rounding_gradient) where that is larger and "
                               "measured, or the loss is computed wider than the model (rounding_floor_source says "
                               "which); only the degeneracy check (is every head's gradient below it?), never a tie",
    "noise_floor_gradient": "the analytic step alone: one rounding step of the differentiated loss in its dtype",
    "rounding_gradient": "each head's mean gate gradient's rounding, the largest over heads (measured against float32 "
                         "where rounding_gradient_source says so): compare's B - A band",
    "rounding_gradient_heads": "[layer][head] each head's own measured rounding: two heads tie where their gradients "
                               "differ by less than the sum of theirs",
}


def gradient_scale(per: pd.DataFrame | None) -> float | None:
    """E_x max_h |dL_x/d xi_h|: each example's largest gate gradient, averaged (importance_examples' "gradient"
    rows); the size each head's mean gradient rounds relative to (GRADIENT_TIE_STEPS). None without them."""
    if per is None or not len(per) or "gradient" not in set(per["method"]):
        return None
    rows = per[per["method"] == "gradient"]
    return float(rows.groupby("example")["effect"].max().abs().mean())


def rounding_step(dtype: torch.dtype, size: float, sensitivity: float | None = None) -> float:
    """The analytic rounding of a metric read from numbers of this size: noise_floor(dtype, size) (metrics.noise_floor,
    one step of eps(dtype) x max(1, |size|); the heads analysis passes the larger of the metric and
    importance.readout_size, the logits it is read from: measured, bfloat16 importances differ from float32's by
    0.16-0.6 of this step on random and trained models, tests/analyses/test_heads.py), or for an
    answer log-probability (sensitivity = E_x sum_t (1 - p_t), importance.readout_stats) that step times the
    sensitivity, the most a half-step error in every logit moves it (review 11b A2: 0.079 for logits of 10 in
    bfloat16, 0.00055 for an answer at p = 0.993), and never under one float32 step of the size (the
    log-softmax's own arithmetic, metrics.answer_logprob)."""
    if sensitivity is None:
        return noise_floor(dtype, size)
    return max(noise_floor(dtype, size) * float(sensitivity), noise_floor(torch.promote_types(dtype, torch.float32), size))


def numerical_checks(raw: dict[str, torch.Tensor], dtype: torch.dtype, *, metric_size: float,
                     loss_size: float | None = None, k: int = 5,
                     pruning: dict[str, torch.Tensor] | None = None,
                     ses: dict[str, torch.Tensor] | None = None, measured: float | None = None,
                     metric_sensitivity: float | None = None, loss_sensitivity: float | None = None,
                     scale: float | None = None, baseline: float | None = None,
                     gradient_check: dict[str, Any] | None = None,
                     loss_dtype: torch.dtype | None = None, answer_tokens: int = 1) -> dict[str, Any]:
    """Which importances are rounding at the model's dtype, each in its own units:
    - ablation (zero, mean, resample): a difference of two metric values, so its floor is `measured` (the
      null ablations' floor, rounding.measured_floor) where given, else the metric's analytic rounding
      (rounding_step(dtype, metric_size, metric_sensitivity): summary noise_floor, always recorded);
    - gradient, E_x |dL/d gate|: the loss change that removing the head predicts to first order, so its
      floor is the differentiated loss's analytic rounding (rounding_step(dtype, loss_size, loss_sensitivity):
      noise_floor_gradient; the loss is not the metric for cosine and accuracy tasks; loss_size None: metric_size),
      at loss_dtype where the loss is computed wider than the pass (an encoder's contrastive loss: float32, review 15c
      A2: bfloat16's step of it, 0.017, called gradients of 0.007-0.016 rounding that bfloat16 moved by 4.9e-5); the
      degeneracy check's floor is never below rounding_gradient where that is measured, or where the loss is wider
      (its inputs round at the pass's dtype, which the loss's own step does not cover): rounding_floor_gradient.
      The sensitivities (an answer log-probability's E_x sum_t (1 - p_t); None: one step of the size) size a
      log-probability's rounding (rounding_sensitivity in the summary).
      It stays analytic: recomputing a gradient in another batch composition reproduces it bitwise (nothing
      to measure: bfloat16 zoo model, batches of 3 or 16 and the examples permuted give identical gradients),
      and gradient ties are judged relative to each gradient's own size instead (below).
    rounding_floor_<method>: the floor each method's checks used; rounding_floor_source: {method: "measured"
    or "analytic"}; rounding_relative_gradient: GRADIENT_TIE_STEPS eps, the share of `scale` (gradient_scale:
    E_x max_h |dL_x/d xi_h|, recorded as rounding_gradient_scale) within which each head's mean gradient rounds;
    rounding_gradient: each head's mean gradient's rounding (the gradient ties below, compare's B - A band), from
    `gradient_check` (rounding.gradient_check: the gate gradients recomputed with float32 weights; its record, less the
    floor, as rounding_gradient_check) where it measured one, rounding_gradient_source "measured"; else the analytic
    bound GRADIENT_TIE_STEPS eps x scale, "analytic" (15-30x the measured rounding: reviews 14b A2, 14c A1);
    without either the share is taken of each gradient's own size (a lower bound: no head exceeds the scale).
    degenerate_<method> (a sentence) when every head's |importance| is below its floor (the ranking, the
    pruning order and the top heads are then noise); tied_top_heads_<method>: the heads among the top k whose
    importance lies within rounding of a neighbour's (their order is arbitrary; tied_top_groups_<method> with
    tied_top_values_<method>: each run of tied neighbours apart, the k+1-th head included): within the metric's floor for
    ablation; for gradients within the sum of the two heads' rounding (rounding_gradient each; without `scale`,
    GRADIENT_TIE_STEPS eps of the larger of the two); tied_top_next_<method>: the
    (k+1)-th head where it ties with the k-th (the partner a top-k list leaves out).
    pruning: {method: the [L, H] importance its fixed pruning order ranks by, least important removed first}
    (raw, or per layer normalised gradients); tied_first_pruned_<method> (with tied_first_pruned_values_<method>):
    runs of neighbours among the first k removed (and the next) that tie by the same rule (tied_first_pruned_at_<method>:
    where each run starts in the order, from 1), since which is removed first
    is then arbitrary and the prunable count's interval can depend on it (review 8b A2). ses: {method: [L, H]
    standard error over examples}; close_first_pruned_<method> ({heads, importance, se}): for an ablation order
    ranked by the raw importance, the run of heads from the first removed whose neighbours differ by less than
    the smaller of their two standard errors (in float32 the review's pair is 0.005 apart, far above rounding but
    a sixtieth of L0H1's s.e.).
    baseline: the unpruned metric; with it an ablation tie also scales with the size of the metric values it compares
    (ablation_tie): a head's ablated metric is baseline - importance, two heads' importances differ by their ablated
    metrics' difference (the baseline cancels), and one rounding step of a number grows with it (metrics.noise_floor,
    eps x max(1, |size|): 2.3 in bfloat16 at 300, where the floor holds for a metric of about 10); recorded as
    rounding_floor_size (the size each ablation floor holds for: the logits' for a log-probability, whose floor grows
    with its 1 - p instead, answer_tokens k at most per row)."""
    eps = float(torch.finfo(dtype).eps)
    wider = loss_dtype is not None and torch.promote_types(dtype, loss_dtype) != dtype  # the loss upcasts the pass
    loss_dt = torch.promote_types(dtype, loss_dtype) if wider else dtype

    def analytic(m: str) -> float:
        if m == "gradient":
            return rounding_step(loss_dt, metric_size if loss_size is None else loss_size, loss_sensitivity)
        return rounding_step(dtype, metric_size, metric_sensitivity)

    floors = {m: analytic(m) for m in raw}
    out: dict[str, Any] = {"noise_floor": rounding_step(dtype, metric_size, metric_sensitivity)}
    if "gradient" in raw:
        out["noise_floor_gradient"] = floors["gradient"]
        # a gradient's own rounding is relative to its size (backpropagation rounds each one in this dtype): the
        # share of |g| within which two gradients tie, here and in compare's B - A band (compare_heads.noise_band)
        out["rounding_relative_gradient"] = GRADIENT_TIE_STEPS * eps
        if scale is not None:
            out["rounding_gradient_scale"] = float(scale)
            out["rounding_gradient"] = GRADIENT_TIE_STEPS * eps * float(scale)
            out["rounding_gradient_source"] = "analytic"
        if gradient_check is not None:  # reviews 14b A2, 14c A1: measured against float32 (rounding.gradient_check)
            out["rounding_gradient_check"] = {k: v for k, v in gradient_check.items() if k not in ("floor", "heads")}
            if gradient_check.get("floor") is not None:
                own = GRADIENT_TIE_STEPS * float(torch.finfo(torch.float32).eps) * float(scale or 0.0)  # float32's own
                out["rounding_gradient"] = max(float(gradient_check["floor"]), own)
                out["rounding_gradient_source"] = "measured"
                if gradient_check.get("heads") is not None:  # review 14b verify A1: each head's own, for its ties
                    heads = torch.tensor(gradient_check["heads"], dtype=torch.float64).clamp_min(own)  # [L, H]
                    out["rounding_gradient_heads"] = heads.tolist()
        out["rounding_gradient_roles"] = dict(GRADIENT_FLOOR_ROLES)
    unit = out.get("rounding_gradient")  # the largest head's mean gradient's rounding (compare's band)
    per_head = (torch.tensor(out["rounding_gradient_heads"], dtype=torch.float64).flatten()  # [L * H]
                if "rounding_gradient_heads" in out else None)
    source = {m: "analytic" for m in raw}
    gradient_floor = None  # the gradients' own rounding, where it is the degeneracy floor (review 15c A2)
    if "gradient" in raw and unit is not None and unit > floors["gradient"] and (
            out.get("rounding_gradient_source") == "measured" or wider):
        floors["gradient"], gradient_floor = float(unit), out["rounding_gradient_source"]
        source["gradient"] = gradient_floor
    if measured is not None:
        for m in set(raw) - {"gradient"}:
            floors[m], source[m] = measured, "measured"
    out.update({f"rounding_floor_{m}": floors[m] for m in raw}, rounding_floor_source=source)
    if baseline is not None and set(raw) - {"gradient"}:
        out["rounding_floor_size"] = max(1.0, abs(float(metric_size)))
        if metric_sensitivity is not None:  # a log-probability's tie grows with 1 - p (ablation_tie), k tokens a row
            out["rounding_floor_tokens"] = max(1, int(answer_tokens))
    for method, imp in raw.items():
        floor = floors[method]
        flat = imp.detach().double().flatten().cpu()  # [layer * head]
        peak = float(flat.abs().max()) if flat.numel() else 0.0
        if peak < floor:
            of = "of the loss it differentiates" if method == "gradient" else "of the metric"
            sens = loss_sensitivity if method == "gradient" else metric_sensitivity
            at = f", computed in {str(loss_dt).removeprefix('torch.')}" if method == "gradient" and wider else " at this dtype"
            how = (f"one rounding step {of}{at}" if sens is None else
                   f"the rounding {of}: one step of the logits at this dtype, "
                   f"{noise_floor(dtype, loss_size if method == 'gradient' and loss_size is not None else metric_size):.2g}, "
                   f"times the answer's 1 - p summed over its tokens, {sens:.2g} on average")
            if method == "gradient" and gradient_floor is not None:  # the gradients' own rounding (review 15c A2)
                how = ("the gate gradients' own rounding, measured against float32" if gradient_floor == "measured"
                       else "an analytic bound on the gate gradients' own rounding, a few eps of the examples' "
                            "largest gradient")
            elif source[method] == "measured":
                how = "measured by null ablations"
            elif method == "gradient":  # review 14b verify A1: which gradient floor this is, beside the measured one
                how = f"analytic: {how}"
            # review 12a: the gradient's floor is not its own precision (a bfloat16 gradient is within a few eps of
            # its own size: float32 reproduced a bfloat16 llama's 8 gate gradients within 2.3%, the order exactly);
            # it is the smallest first-order loss change one rounding step of the loss can show, so it is said so
            means = ("; it bounds the loss change removing a head predicts, which an ablation in this dtype could not "
                     "resolve below it, not the gradients' own precision"
                     + (f" (that precision, measured against float32, is at most {unit:.2g} for any head)"
                        if out.get("rounding_gradient_source") == "measured"
                        else " (a few eps of the examples' largest gradient)")
                     if method == "gradient" and gradient_floor is None else "")
            out[f"degenerate_{method}"] = (f"every head's |{method} importance| is below {peak:.2g}, under the numerical "
                                           f"floor {floor:.2g} ({how}{means}): no head "
                                           "measurably matters by this method, so its ranking and pruning order are "
                                           + ("no evidence that any head matters" if method == "gradient" else "noise"))
            continue
        order = torch.argsort(flat, descending=True, stable=True)[: k + 1]
        values, n_heads = flat[order], imp.shape[1]

        def ties(vals: torch.Tensor, share: torch.Tensor, idx: torch.Tensor, floor: float = floor,
                 method: str = method, unit=unit):
            """tol(p, q) for neighbours p, q along vals ([m]; share [m]: each value's share of the raw gradient;
            idx [m]: each value's head, flat). Gradients: the two heads' own measured rounding summed (review 14b
            verify A1: the largest head's, 0.00185, put L1H2 and L1H3 in a tie bfloat16 had moved by 0.00008 and
            0.0003), else the largest head's for both, else a share of the larger gradient."""
            if method != "gradient":
                if baseline is None:
                    return lambda p, q: floor
                return lambda p, q: ablation_tie(dtype, floor, metric_size, baseline, float(vals[p]), float(vals[q]),
                                                 metric_sensitivity, answer_tokens)
            if per_head is not None:
                return lambda p, q: float(per_head[idx[p]] * share[p] + per_head[idx[q]] * share[q])
            if unit is None:
                return lambda p, q: GRADIENT_TIE_STEPS * eps * max(abs(float(vals[p])), abs(float(vals[q])))
            return lambda p, q: unit * float(share[p] + share[q])

        runs = [g for g in _neighbour_groups(values, ties(values, torch.ones(len(values), dtype=torch.float64), order))
                if g[0] < k]  # positions along `order`, each run apart
        tied = {int(order[j]) for g in runs for j in g}
        top = [i for i in order[:k].tolist() if i in tied]
        if top:
            out[f"tied_top_heads_{method}"] = [head_label(i // n_heads, i % n_heads) for i in top]
            out[f"tied_top_groups_{method}"] = [[head_label(int(order[j]) // n_heads, int(order[j]) % n_heads)
                                                 for j in g] for g in runs]
            out[f"tied_top_values_{method}"] = [[float(values[j]) for j in g] for g in runs]
            if len(order) > k and int(order[k]) in tied and int(order[k - 1]) in tied:
                out[f"tied_top_next_{method}"] = head_label(int(order[k]) // n_heads, int(order[k]) % n_heads)
        if pruning is not None and method in pruning:
            by = pruning[method].detach().double().flatten().cpu()  # [layer * head]
            first = torch.argsort(by, stable=True)[: k + 1]  # the pruning order's first heads, as _pruning_curve ranks
            raw_first = flat[first].abs()  # [k + 1] a normalised order's values are the raw gradients rescaled
            share = torch.where(raw_first > 0, by[first].abs() / raw_first.clamp_min(1e-300), torch.ones_like(raw_first))
            # the order removed, descending for the helper (tol is symmetric)
            # tol reads each head's importance (its ablated metric, baseline - importance); the gradient's is |.|
            first_runs = _neighbour_groups(-by[first], ties(by[first], share, first))
            groups = [[int(first[j]) for j in g] for g in first_runs]  # runs of neighbours within tol, in the order removed
            starts = [g[0] + 1 for g in first_runs]  # each run's first position in the order, from 1
            se = ses.get(method) if ses is not None and method != "gradient" else None
            if se is not None and torch.equal(pruning[method].detach().cpu().double(), imp.detach().cpu().double()):
                se = se.detach().double().flatten().cpu()  # [layer * head]
                run = [int(first[0])]
                for j in range(len(first) - 1):
                    a, b = int(first[j]), int(first[j + 1])
                    if j + 1 > k or float(by[b] - by[a]) >= min(float(se[a]), float(se[b])):
                        break
                    run.append(b)
                if len(run) > 1:
                    out[f"close_first_pruned_{method}"] = {
                        "heads": [head_label(i // n_heads, i % n_heads) for i in run],
                        "importance": [float(by[i]) for i in run], "se": [float(se[i]) for i in run]}
            if groups:
                out[f"tied_first_pruned_at_{method}"] = starts
                out[f"tied_first_pruned_{method}"] = [[head_label(i // n_heads, i % n_heads) for i in g] for g in groups]
                out[f"tied_first_pruned_values_{method}"] = [[float(by[i]) for i in g] for g in groups]
    return out


def ablation_tie(dtype: torch.dtype, floor: float, metric_size: float, baseline: float, a: float, b: float,
                 sensitivity: float | None = None, answer_tokens: int = 1) -> float:
    """How far apart two ablation importances a and b may lie and still tie within rounding: `floor` (measured, or
    the analytic step, for a metric of about metric_size) while both ablated metrics (baseline - a, baseline - b) are
    no larger than that; past it the rounding grows with the larger one, S (metrics.noise_floor: eps x max(1, |size|)):
    floor x noise_floor(S) / noise_floor(metric_size), which for the analytic floor of a metric computed in `dtype`
    (a logit difference) is noise_floor(dtype, S) itself. An answer log-probability (`sensitivity`: the unpruned
    answers' E_x sum_t (1 - p_t), the share of the logits' rounding its floor carries; metric_size is then the logits'
    size, not the metric's) rounds in proportion to 1 - p (review 15cv B1: the floor was held for ablated
    log-probabilities up to the logits' size, 13, where 1 - p grows 200-fold by -1): floor x k (1 - e^(-S/k)) /
    sensitivity, k answer_tokens (by Jensen's inequality the most E_x sum_t (1 - p_t) can be at a mean log-probability
    of -S), and past the logits' size never under noise_floor(dtype, S), the step of its logits."""
    size = max(abs(baseline - a), abs(baseline - b))
    base = max(1.0, abs(float(metric_size)))
    if sensitivity is not None:
        k = max(1, int(answer_tokens))
        share = k * -math.expm1(-size / k) / max(float(sensitivity), 1e-300)  # 1 - p's growth from the unpruned one
        return max(floor, floor * share, noise_floor(dtype, size) if size > base else 0.0)
    if size <= base:
        return floor
    return max(floor, floor * noise_floor(dtype, size) / noise_floor(dtype, base))


def _neighbour_groups(values: torch.Tensor, tol) -> list[list[int]]:
    """Runs of neighbours along `values` (descending), each within tol(i, i + 1) (positions) of the next and within
    tol(first, last) from its first to its last: [[positions]], each run separate (review 9a A4: {L2H0, L2H1} and
    {L2H3, L1H0} are two ties, not a run of four). Ties do not chain (review 14c A1: a run spanning 0.36-0.29 by steps
    under the band): each run is the longest from its first head, those inside an earlier run left out, so two runs
    can share a head (a and b tie, b and c tie, a and c do not: [a, b], [b, c])."""
    runs: list[list[int]] = []
    for i in range(len(values) - 1):
        j = i
        while (j + 1 < len(values) and float(values[j] - values[j + 1]) <= tol(j, j + 1)
               and float(values[i] - values[j + 1]) <= tol(i, j + 1)):
            j += 1
        if j > i and (not runs or j > runs[-1][-1]):
            runs.append(list(range(i, j + 1)))
    return runs


def tie_reach(summary: dict[str, Any], counts: list[int], orderings: dict[str, str]) -> dict[str, Any]:
    """Whether each tie at the start of a fixed pruning order can move its prunable count or the count's
    interval (review 9a A4.3). Swapping two heads of a run at positions p..q (from 1) changes only the curve
    points that remove one and not the other (n_pruned p..q-1). The count is decided at the first point past
    it (all examples), a resample's count at most at the first point past the interval's high end: a run
    whose changed points all lie before the deciding point is removed as a set before it and cannot move the
    count, unless one of those points is on its 1% line (prunable_ci's `line`, pruning.line_record).
    counts: the curve's points (pruning.prune_counts); orderings: {method: its fixed ordering's key} ("zero":
    "ablation"). Returns tied_first_pruned_moves_<method> ([bool] per run) and close_first_pruned_<method>
    with moves_count, where the summary has them and the ordering's prunable_ci."""
    out: dict[str, Any] = {}
    for method, key in orderings.items():
        ci = summary.get(f"prunable_ci_{key}")
        if not isinstance(ci, dict) or not isinstance(ci.get("interval_heads"), list):
            continue
        heads, high = float(ci["heads"]), float(ci["interval_heads"][1])
        first = next((c for c in counts if c > heads), None)  # the point that decides the count (None: never crosses)
        last = next((c for c in counts if c > high), math.inf)  # the crossing of the resample with the most heads
        line = ci.get("line") if isinstance(ci.get("line"), dict) else {}
        fragile = line.get("n_pruned") if line.get("on_the_line") is True else None

        def moves(start: int, size: int, first: int | None = first, last: float = last, fragile: Any = fragile) -> bool:
            changed = [c for c in counts if start <= c < start + size - 1]  # points that hold one of the run, not all
            return any(c == fragile or (first is not None and first <= c <= last) for c in changed)

        runs, starts = summary.get(f"tied_first_pruned_{method}"), summary.get(f"tied_first_pruned_at_{method}")
        if runs and starts:
            out[f"tied_first_pruned_moves_{method}"] = [moves(int(a), len(g)) for a, g in zip(starts, runs)]
        close = summary.get(f"close_first_pruned_{method}")
        if isinstance(close, dict) and close.get("heads"):
            out[f"close_first_pruned_{method}"] = {**close, "moves_count": moves(1, len(close["heads"]))}
    return out


def _rounding_checks(model, scorer: Scorer, raw: dict[str, torch.Tensor], baseline: float,
                     loss_size: float | None, pruning: dict[str, torch.Tensor] | None = None,
                     df: pd.DataFrame | None = None, per: pd.DataFrame | None = None) -> dict[str, Any]:
    """numerical_checks at the model's dtype, sizes taken as the larger of each value and the logits it is read
    from, the ablation methods' floor measured by null ablations (rounding.null_effects; rounding_null: their
    gates, how many ran and the largest |change|); df (importance_table's) gives each method's importance_se."""
    readout, sensitivity = readout_stats(model, scorer)
    measured, null = None, {}
    if set(raw) - {"gradient"}:
        effects = rounding.null_effects(model, scorer)  # [gates x layers]
        measured = rounding.measured_floor(effects)
        null = {"rounding_null": {"gates": list(rounding.NULL_GATES), "n_runs": int(effects.numel()),
                                  "max_abs_change": float(effects.abs().max()), "margin": rounding.NULL_MARGIN}}
    ses = None
    if df is not None and pruning:
        ses = {}
        for method, g in df.groupby("method", sort=False):
            se = torch.zeros_like(raw[method], dtype=torch.float64)  # [L, H]
            se[torch.tensor(g["layer"].to_numpy()), torch.tensor(g["head"].to_numpy())] = torch.tensor(
                g["importance_se"].to_numpy(dtype=float))
            ses[method] = se
    # an answer log-probability (computed in float32 from the logits) rounds as its logits do, times its (1 - p)
    # summed over the answer's tokens; accuracy's gradients differentiate that log-probability
    on_metric = sensitivity if scorer.kind == "logprob" else None
    on_loss = sensitivity if scorer.kind in ("logprob", "accuracy") else None
    summary = numerical_checks(raw, model.dtype, metric_size=readout if on_metric is not None else max(abs(baseline), readout),
                               loss_size=None if loss_size is None else readout if on_loss is not None
                               else max(abs(loss_size), readout),
                               pruning=pruning, ses=ses, measured=measured,
                               metric_sensitivity=on_metric, loss_sensitivity=on_loss, scale=gradient_scale(per),
                               baseline=baseline, gradient_check=_gradient_check(model, scorer, raw, per),
                               loss_dtype=scorer.loss_dtype, answer_tokens=_answer_tokens(scorer))
    extra = ({"rounding_sensitivity": sensitivity, "rounding_logit_step": noise_floor(model.dtype, readout)}
             if on_metric is not None or on_loss is not None else {})
    return {**summary, **null, "readout_size": readout, **extra}


def _answer_tokens(scorer: Scorer) -> int:
    """The most answer tokens a row scores (scorer.answers [batch] or [batch, k]; 1 without answers)."""
    a = scorer.answers
    return int(a.shape[-1]) if a is not None and a.dim() == 2 else 1


def _gradient_check(model, scorer: Scorer, raw: dict[str, torch.Tensor], per: pd.DataFrame | None) -> dict | None:
    """rounding.gradient_check on the run's own first examples' |dL/d gate| (importance_examples); None without them."""
    if "gradient" not in raw or per is None or not len(per):
        return None
    rows, m = per[per["method"] == "gradient"], len(scorer)
    if not len(rows):
        return None
    own = torch.full((*raw["gradient"].shape, m), float("nan"), dtype=torch.float64)  # [L, H, n]
    own[torch.tensor(rows["layer"].to_numpy()), torch.tensor(rows["head"].to_numpy()),
        torch.tensor(rows["example"].to_numpy())] = torch.tensor(rows["effect"].to_numpy(dtype=float))
    return rounding.gradient_check(model, scorer, own)
