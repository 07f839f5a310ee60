"""The `heads` analysis: which attention heads matter, and how many can be removed.

Follows Michel et al. 2019 (gate-gradient importance, iterative pruning, best head per layer)
and Voita et al. 2019 (L0 Hard Concrete gates, head roles). Public entry points:
- head_importance(model, task) -> Result: gradient and ablation importance per head;
- prune_heads(model, task) -> Result: pruning curves per ordering, heads prunable within 1%;
- run(model, task=None, config=None) -> Result: everything above plus roles, best head per layer and L0 sweep.
Encoders (MiniLM, BERT) are scored with the cosine metric (pooled embedding) on the prompts of the task given (its
answers and corrupted prompts unused: tasks.prompts_only), else on the shipped sentences (sentence_task); a masked LM
whose task's prompts each hold one mask token is scored on its answers at the mask (analyses/core/mask_read.py).

Outputs of run: df (results.csv) has one row per (layer, head, method) with importance and the
role scores; tables "curve" (each point with the 95% t-interval of its paired change from unpruned), "curve_examples"
(each example's metric at each point), "importance_examples" (each ablation method's drop and each example's own
|dL/d gate| per head and example, for paired tests), "best_head", "l0", "l0_gates", "roles"; summary: n_layers,
heads_per_layer, n_heads (all heads), baseline_metric, max_fraction_prunable_<ordering> and
heads_prunable_<ordering> for gradient, gradient_recompute, ablation, ablation_recompute,
random (mean over seeds), prunable_ci_<ordering> (that count with its bootstrap interval over
examples, n_examples and the method: pruning.prunable_intervals), pruning_tolerance (the band those counts allow
below unpruned, in the metric's units: pruning.tolerance_record), top_heads_<method>, top_head_<method> (every
method: the first head and the next with their 95% intervals and the paired difference's, `_leading`),
l0_min_heads_within_tolerance with l0_within_tolerance (l0.l0_choice: the point chosen on the training examples;
its lambda, metric and paired change from unpruned
with its 95% interval over n held-out examples, the gates fitted on the other n_train; in_sample with its reason where
the task is too small to split, and the training examples' change, in_sample_change / in_sample_ci), and
noise_floor (ablation, metric units) / noise_floor_gradient (the loss's units): the analytic rounding (`rounding_step`:
one step of the logits, for an answer log-probability times rounding_sensitivity, E_x sum_t (1 - p_t), with
rounding_logit_step the step);
rounding_floor_<method> with rounding_floor_source ({method: "measured" or "analytic"}) and rounding_null: the
floor each method's checks use, for ablation measured by null ablations (rounding.py) / degenerate_<method> /
tied_top_heads_<method> with tied_top_groups_<method> (`numerical_checks`: importance that is rounding at the model's
dtype, or top heads that tie, is said so and not ranked) / tied_first_pruned_moves_<method> (`tie_reach`: whether
a tie at the start of a pruning order can move its count); role_windows on a sliding-window model (roles.role_windows);
sink_token: every prompt's first token where they share one (roles.sink_token), what the sink role attends to.
redundant_layers (pruning.layer_redundancy, with the best head table): the layers whose joint removal
costs much while each head alone, ablated or kept, moves the metric little.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import torch

import headscope.hooks as hooks
from headscope.analyses.core import default_tasks, task_files, tasks
from headscope.analyses.core.chance import mean_interval, t_half_width
from headscope.analyses.core.config import AnalysisConfig, configure
from headscope.analyses.core.contract import ENCODER_SCORING, Needs, Reads
from headscope.analyses.core.mask_read import mask_metric
from headscope.analyses.core.metrics import noise_floor
from headscope.analyses.core.result import Result, names_source
from headscope.analyses.core.task_files import takes_prompt
from headscope.analyses.core.tasks import Task, sentence_task
from headscope.analyses.heads import rounding
from headscope.analyses.heads.importance import (
    ABLATIONS,
    Scorer,
    ablation_importance,
    evaluate_masks,
    gate_gradient_stats,
    make_scorer,
    normalize_per_layer,
    readout_stats,
)
from headscope.analyses.heads.l0 import L0Config, l0_choice, l0_sweep
from headscope.analyses.heads.pruning import (
    PruningConfig,
    best_head_per_layer,
    curve_shapes,
    head_label,
    layer_redundancy,
    ordering_basis,
    prunable_intervals,
    prunable_summary,
    prune_counts,
    pruning_curves,
    tolerance_record,
)
from headscope.analyses.heads.roles import head_roles, role_windows, sink_token
from headscope.errors import ConfigError, InputTypeError

IMPORTANCE_METHODS = ("gradient", *ABLATIONS)
TaskLike = Task | torch.Tensor | str | None  # a Task, token ids, a zoo task name or a task file


# What the analysis needs from a task and a model (analyses/core/contract.py), checked before it runs.
NEEDS = Needs(answers=False, min_examples=2, next_token=True, continuation=True,
              what="scores each head by its effect on the answers; resample ablation needs a second example")


@dataclass(frozen=True, kw_only=True)
class HeadsConfig(AnalysisConfig):
    """What `run` computes. methods: importance methods ("gradient", "zero", "mean",
    "resample"); pruning: curves (and per-layer L2 normalisation of gradient importance);
    l0 None skips the L0 sweep; n_induction: repeated-token prompts that score head roles;
    best_head: Michel et al.'s best head per layer (every head kept alone: heads + layers passes).
    seed (one per run): the task sample, resample ablation, the random pruning orderings and L0's draws."""

    methods: tuple[str, ...] = IMPORTANCE_METHODS
    pruning: PruningConfig = PruningConfig()
    l0: L0Config | None = L0Config()
    n_induction: int = 8
    best_head: bool = True
    min_examples: ClassVar[int] = 2  # a resample partner (contract.Needs.min_examples)

    QUICK: ClassVar[dict[str, Any]] = {  # a smoke run: every part, at the smallest useful size
        "methods": ("gradient", "zero"), "n_induction": 4, "pruning": PruningConfig(n_random=2, recompute=(False,)),
        "l0": L0Config(lambdas=(0.03,), steps=10, batch_size=8),
    }


# ---- tasks ---------------------------------------------------------------------------------
ENCODER_METRIC = ("cosine of each prompt's mean-pooled embedding with the unpruned model's (1 when nothing is "
                  "pruned); gradient importance differentiates an in-batch contrastive loss (temperature 1) against "
                  "the unpruned embeddings instead, since the cosine's gradient vanishes there")


ENCODER_SCORING_HEADS = (f"{ENCODER_SCORING.split(';')[0]}; heads reads a masked-LM head only where every prompt holds "
                         "exactly one mask token and gives an answer")


def reads(model, config: Any = None, summary: Any = None) -> Reads:
    """What heads reads of a task (contract.Reads): decoders the prompts and answers (never the corrupted
    prompts); encoders the prompts only, scored by their pooled embedding (make_scorer's cosine), or, where the
    summary says the task was scored at its mask (mask_read), the prompts and answers there."""
    read = (summary or {}).get("mask_read") if isinstance(summary, dict) else None
    if model.facts.is_encoder and isinstance(read, dict):
        return Reads(why="heads ablates heads on each prompt, not between clean and corrupted prompts",
                     metric=mask_metric(read))
    if model.facts.is_encoder:
        return Reads(answers=False, why=ENCODER_SCORING_HEADS, metric=ENCODER_METRIC)
    return Reads(why="heads ablates heads on each prompt, not between clean and corrupted prompts")


repeated_tokens_task = default_tasks.repeated_tokens_task  # induction on repeated random tokens (any decoder)


def default_task(model, task: Any = None, config: HeadsConfig | None = None) -> Task:
    """task (a zoo task, "sentences", "repeat", a task file or user data: a DataFrame, Dataset or
    list of dicts), else sentences for encoders, the zoo "kv" task for zoo models, and for other
    decoders the IOI task over the tokenizer's single-token names (repeated random tokens where
    the vocabulary has too few; default_tasks.logit_diff_task)."""
    config = config or HeadsConfig()
    n = config.examples(64, 16)
    if task is not None and not isinstance(task, str):  # user data (analyses.core.task_files)
        return task_files.resolve_task(model, task, n_examples=n, seed=config.seed)
    name = task
    if name is None:
        if model.facts.is_encoder:  # all shipped sentences unless told otherwise
            return sentence_task(model, n_examples=n if config.n_examples or config.quick else None, seed=config.seed)
        return default_tasks.zoo_or(model, "kv", lambda: default_tasks.logit_diff_task(model, n, config.seed), n, config.seed)
    if name in tasks.ZOO_TASKS:
        return tasks.zoo(model, name, n, config.seed)
    if name == "sentences":
        return sentence_task(model, n_examples=n, seed=config.seed)
    if name == "repeat":
        return repeated_tokens_task(model, n, config.seed)
    if Path(name).suffix.lower() in task_files.FORMATS:  # a seeded sample of n rows, as every family takes
        return task_files.resolve_task(model, name, n_examples=n, seed=config.seed)
    raise ConfigError(
        f"The heads analysis does not know task {name!r}; use a zoo task ({', '.join(tasks.ZOO_TASKS)}), "
        f"'sentences' (encoders) or 'repeat' (any decoder), or pass a Task to head_importance / prune_heads."
    )


# ---- public analyses -----------------------------------------------------------------------
def _scorer(model, task: Task | torch.Tensor | Scorer | str | None, config: HeadsConfig | None = None) -> Scorer:
    if isinstance(task, (Task, torch.Tensor, Scorer)):
        return make_scorer(model, task)
    return make_scorer(model, default_task(model, task, config))


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


def importance_table(model, scorer: Scorer, methods: tuple[str, ...], *, seed: int = 0, progress: bool = False,
                     ) -> tuple[pd.DataFrame, dict[str, torch.Tensor], float, float | None, pd.DataFrame]:
    """Long table (layer, head, method, importance, importance_se, importance_layer_norm, rank), the raw
    [L, H] importance per method, the baseline metric, E_x |L(x)| of the loss gradients differentiate
    (None without "gradient"; the size noise_floor_gradient is taken at) and every method's per-example values
    (importance_examples: layer, head, head_name, method, example, effect; effect is the example's drop for an
    ablation method, its own |dL/d gate| for gradient; the paired tests of one head against another read it).
    importance_se: the standard error of the
    importance over examples (sd / sqrt(n); for ablation of each example's drop, for gradient of each
    example's |dL/d gate|), from the same passes; compare mutes B - A differences within it."""
    unknown = set(methods) - set(IMPORTANCE_METHODS)
    if unknown:
        raise ConfigError(f"Unknown importance methods {sorted(unknown)}; use some of {IMPORTANCE_METHODS}.")
    raw: dict[str, torch.Tensor] = {}
    ses: dict[str, torch.Tensor] = {}  # [L, H] standard error over examples per method
    per: dict[str, torch.Tensor | None] = {}  # [L, H, n] each example's drop (ablation) or |dL/d gate| (gradient)
    baseline, loss_size = None, None
    for method in methods:
        if method == "gradient":  # each example's own |dL/d gate| from the same passes (the batched gates)
            stats = gate_gradient_stats(model, scorer, progress=progress)
            raw[method], ses[method], loss_size, per[method] = stats.importance, stats.se, stats.loss_size, stats.examples
        else:
            scores = ablation_importance(model, scorer, method=method, seed=seed, progress=progress)
            raw[method], ses[method], baseline = scores.importance, scores.se, scores.baseline
            per[method] = scores.effects
    if baseline is None:
        baseline = float(evaluate_masks(model, scorer, torch.ones(1, model.facts.n_layers, model.facts.n_heads))[0])
    rows = []
    for method, imp in raw.items():
        normed = normalize_per_layer(imp)
        rank = torch.empty(imp.numel(), dtype=torch.long)
        rank[torch.argsort(imp.flatten(), descending=True, stable=True)] = torch.arange(1, imp.numel() + 1)
        rows += [
            {"layer": l, "head": h, "head_name": head_label(l, h), "method": method,
             "importance": float(imp[l, h]), "importance_se": float(ses[method][l, h]),
             "importance_layer_norm": float(normed[l, h]),
             "rank": int(rank[l * imp.shape[1] + h])}
            for l in range(imp.shape[0]) for h in range(imp.shape[1])
        ]
    return pd.DataFrame(rows), raw, baseline, loss_size, _examples_table(per)


def _examples_table(per: dict[str, torch.Tensor | None]) -> pd.DataFrame:
    """The per-example values [L, H, n] per method (drops, or |dL/d gate|) as a long table (layer, head,
    head_name, method, example, effect), the measured heads only."""
    rows = [{"layer": l, "head": h, "head_name": head_label(l, h), "method": method, "example": i, "effect": float(v)}
            for method, e in per.items() if e is not None
            for l in range(e.shape[0]) for h in range(e.shape[1]) for i, v in enumerate(e[l, h].tolist())
            if math.isfinite(v)]
    return pd.DataFrame(rows, columns=["layer", "head", "head_name", "method", "example", "effect"])


def _base_summary(model, scorer: Scorer, baseline: float) -> dict:
    f, moe = model.facts, hooks.moe_layers(model)
    return {
        "model": f.name, "task": scorer.name, "metric": scorer.kind, "n_examples": len(scorer),
        "n_layers": f.n_layers, "heads_per_layer": f.n_heads, "n_heads": f.n_layers * f.n_heads,
        "baseline_metric": baseline,
        # removing a head can switch the router's experts, which a first-order gradient cannot see
        "mixture_of_experts": bool(moe),
        # which blocks are (a dense MLP among MoE blocks: Qwen2-MoE's mlp_only_layers), for the finding's words
        "moe_layers": moe,
        # review 15c B1: an encoder task's prompts that hold the mask token, whose filling the cosine does not score
        **({"mask_task": scorer.mask_task} if scorer.mask_task else {}),
        # or, where each holds one and the checkpoint has its masked-LM head, the answer read there (mask_read.py)
        **({"mask_read": scorer.mask_read} if scorer.mask_read else {}),
    }


HEAD_IMPORTANCE = HeadsConfig(methods=("gradient", "zero"))  # head_importance's default: the two cheapest methods


@takes_prompt(tokens=False)
@names_source
def head_importance(model, task: TaskLike = None, config: HeadsConfig | None = None, **config_overrides: Any) -> Result:
    """Importance of every head by each method. task: a Task, a [batch, pos] token tensor (LM
    loss on text), a zoo task name or task file, or None for the model's default task. Gradient
    importance is E_x |dL/dxi_h|; ablation importance is the metric drop with the head ablated
    (zero, mean or resample). config: a HeadsConfig (default: methods gradient and zero); its
    methods, seed and progress apply, and config_overrides are its fields (methods=("zero",))."""
    config = configure(HeadsConfig, config, config_overrides, name="head_importance", default=HEAD_IMPORTANCE)
    scorer = _scorer(model, task, config)
    df, raw, baseline, loss_size, per = importance_table(model, scorer, tuple(config.methods), seed=config.seed,
                                                         progress=config.progress)
    summary = _base_summary(model, scorer, baseline)
    summary.update(_rounding_checks(model, scorer, raw, baseline, loss_size, per=per))
    summary.update(_top_heads(df, summary, per))
    return Result(name="heads", df=df, summary=summary, tables={"importance_examples": per},
                  config={"methods": list(config.methods), "seed": config.seed})


@takes_prompt(tokens=False)
@names_source
def prune_heads(model, task: TaskLike = None, config: HeadsConfig | None = None, **config_overrides: Any) -> Result:
    """Iterative pruning curves (df: ordering, recompute, seed, n_pruned, fraction_pruned, metric,
    pruned) and, in the summary, the largest fraction of heads prunable within the tolerance.
    config: a HeadsConfig (its .pruning, .seed for the random orderings and resample ablation, and
    .progress); config_overrides are its fields, e.g. pruning=PruningConfig(step=0.25), seed=3."""
    if isinstance(config, PruningConfig):
        raise InputTypeError("prune_heads takes a HeadsConfig; pass a PruningConfig as pruning=..., "
                             "e.g. prune_heads(model, task, pruning=PruningConfig(step=0.25)).")
    config = configure(HeadsConfig, config, config_overrides, name="prune_heads")
    scorer = _scorer(model, task, config)
    curves, examples = pruning_curves(model, scorer, config.pruning, seed=config.seed, progress=config.progress,
                                      per_example=True)
    baseline = float(curves.loc[curves["n_pruned"] == 0, "metric"].iloc[0])
    summary = _base_summary(model, scorer, baseline)
    summary.update(_pruning_summary(curves, examples, baseline, summary["n_heads"], config, scorer.chance,
                                    model.facts.d_vocab))
    summary["ordering_basis"] = ordering_basis(config.pruning)
    return Result(name="heads", df=curves, summary=summary, tables={"curve_examples": examples},
                  config={**dataclasses.asdict(config.pruning), "seed": config.seed})


def run(model, task: TaskLike = None, config: HeadsConfig | None = None) -> Result:
    """The full analysis on the model's default task (or `task`); see the module docstring."""
    hc = config = configure(HeadsConfig, config, {}, name="heads", default=HeadsConfig.preset())
    scorer = _scorer(model, task, hc)
    df, raw, baseline, loss_size, per = importance_table(model, scorer, hc.methods, seed=hc.seed,
                                                         progress=config.progress)
    roles = head_roles(model, scorer.tokens, scorer.attention_mask, n_induction=hc.n_induction, seed=hc.seed)
    per_head = roles.drop(columns=["window", "induction_length", "induction_cut", "longest_prompt"])
    df = df.merge(per_head, on=["layer", "head"], how="left")
    prune_imp = {}  # unpruned importance reused by the fixed-order curves
    if "gradient" in raw:
        prune_imp["gradient"] = normalize_per_layer(raw["gradient"]) if hc.pruning.normalize else raw["gradient"]
    if hc.pruning.method in raw:
        prune_imp["ablation"] = raw[hc.pruning.method]
    curves, examples = pruning_curves(model, scorer, hc.pruning, importance=prune_imp, seed=hc.seed,
                                      progress=config.progress, per_example=True)
    summary = _base_summary(model, scorer, baseline)
    summary.update(_pruning_summary(curves, examples, baseline, summary["n_heads"], hc, scorer.chance,
                                    model.facts.d_vocab))
    summary["ordering_basis"] = ordering_basis(hc.pruning)
    fixed = {method: prune_imp[o] for o, method in (("gradient", "gradient"), ("ablation", hc.pruning.method))
             if o in prune_imp and o in hc.pruning.orderings}  # {method: what its pruning order ranks by}
    summary.update(_rounding_checks(model, scorer, raw, baseline, loss_size, pruning=fixed, df=df, per=per))
    summary.update(tie_reach(summary, prune_counts(summary["n_heads"], hc.pruning.step),
                             {m: "gradient" if m == "gradient" else "ablation" for m in fixed}))
    summary.update(_top_heads(df, summary, per))
    summary["roles"] = {
        role: [head_label(l, h) for l, h, r in zip(roles["layer"], roles["head"], roles["role"]) if r == role]
        for role in sorted(set(roles["role"]) - {"other"})
    }
    summary.update(role_windows(roles))
    summary["sink_token"] = sink_token(model, scorer.tokens, scorer.attention_mask)  # what "first token" is here
    tables = {"curve": curves, "curve_examples": examples, "roles": roles, "importance_examples": per}
    if hc.best_head and raw:
        usable = {m: v for m, v in prune_imp.items() if m != "gradient" or "degenerate_gradient" not in summary}
        name = next(iter(usable), None)  # gradient first, the ablation ordering when the gradient is rounding
        primary = usable[name] if name else next(iter(raw.values()))
        summary["best_head_ranked_by"] = name or next(iter(raw))
        tables["best_head"] = best_head_per_layer(model, scorer, primary, baseline=baseline, progress=config.progress)
        ablated = raw.get(hc.pruning.method, next((v for m, v in raw.items() if m != "gradient"), None))
        summary["redundant_layers"] = layer_redundancy(tables["best_head"], ablated, baseline)
    if hc.l0 is not None:
        sweep, gates = l0_sweep(model, scorer, hc.l0, seed=hc.seed, progress=config.progress)
        tables["l0"], tables["l0_gates"] = sweep, gates
        # review 12b C1, #34 item 2: the point with the fewest heads within tolerance, chosen on the examples the
        # gates were fitted on and scored on the held-out ones (l0_choice: choosing on the held-out rows flatters it)
        summary.update(l0_choice(sweep, hc.pruning.tolerance, scorer.chance))
        summary["l0_lambdas"] = [float(x) for x in hc.l0.lambdas]  # one strength is no sweep (the finding says so)
    run_cfg = {**dataclasses.asdict(hc), "task": scorer.name}
    return Result(name="heads", df=df, summary=summary, tables=tables, config=run_cfg)


def _pruning_summary(curves: pd.DataFrame, examples: pd.DataFrame, baseline: float, n_heads: int,
                     config: HeadsConfig, chance: float | None, vocab: int | None = None) -> dict[str, Any]:
    """The prunable counts, their intervals and the curves' shapes, all against one tolerance band
    (pruning.tolerance_record: a log-probability's is a share of the span from chance, `chance`, k log(1/vocab)),
    recorded as pruning_tolerance."""
    tol = config.pruning.tolerance
    return {"pruning_tolerance": tolerance_record(baseline, tol, chance, vocab),
            **prunable_summary(curves, baseline, n_heads, tol, chance),
            **prunable_intervals(examples, n_heads, tol, seed=config.seed, chance=chance),
            **curve_shapes(curves, tol, chance)}


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


def _top_heads(df: pd.DataFrame, checks: dict, per: pd.DataFrame | None = None, k: int = 5) -> dict[str, Any]:
    """The k highest-ranked heads per method (top_heads_<method>); none for a degenerate method (its ranking is
    rounding). top_head_<method> for each method: its first head and the next, each with its importance and 95% t
    interval over the examples, the paired difference first - next over the same examples with its 95% t interval
    where per (importance_table's per-example values: drops, or each example's |dL/d gate|) holds both, and
    `clear`: that interval lies above 0 (without per-example values: the first's interval lies above the next's;
    review 12b A5: two marginal intervals overlapping by 0.004 while the paired difference was +2.02 [+0.39, +3.64])."""
    out: dict[str, Any] = {}
    for method, g in df.groupby("method", sort=False):
        ranked = g.sort_values("rank")
        out[f"top_heads_{method}"] = [] if f"degenerate_{method}" in checks else ranked["head_name"].head(k).tolist()
        if f"degenerate_{method}" not in checks and len(ranked) > 1:
            mine = per[per["method"] == method] if per is not None and len(per) else None
            out[f"top_head_{method}"] = _leading(ranked, int(checks.get("n_examples") or 0), mine)
    return out


def _paired(per: pd.DataFrame, first: str, second: str) -> dict[str, Any] | None:
    """first - next per example (the rows both have), its mean, 95% t interval and n; None under 2 examples."""
    a = per[per["head_name"] == first].set_index("example")["effect"]
    b = per[per["head_name"] == second].set_index("example")["effect"]
    d = (a - b).dropna()  # [n] aligned on the example
    ci = mean_interval(d.to_numpy())
    return None if ci is None else {"diff": float(d.mean()), "diff_ci": ci, "diff_n": int(len(d))}


def _leading(ranked: pd.DataFrame, n: int, per: pd.DataFrame | None = None) -> dict[str, Any]:
    """The first two rows of a ranked importance table as {head, importance, ci, next_head, next_importance,
    next_ci, n_examples, clear} and, with per-example drops, diff, diff_ci, diff_n (the paired first - next)
    (ci: importance -+ the 95% t half-width of its standard error; None below 2 examples; clear: the paired
    difference's lower bound above 0, else the first's lower bound above the next's upper bound)."""
    def interval(row: pd.Series) -> list[float] | None:
        se = float(row["importance_se"])
        if n < 2 or not math.isfinite(se):
            return None
        half = float(t_half_width(se * n ** 0.5, n))
        return [float(row["importance"]) - half, float(row["importance"]) + half]

    first, second = ranked.iloc[0], ranked.iloc[1]
    ci, next_ci = interval(first), interval(second)
    paired = _paired(per, first["head_name"], second["head_name"]) if per is not None else None
    clear = paired["diff_ci"][0] > 0 if paired else ci is not None and next_ci is not None and ci[0] > next_ci[1]
    return {"head": first["head_name"], "importance": float(first["importance"]), "ci": ci,
            "next_head": second["head_name"], "next_importance": float(second["importance"]), "next_ci": next_ci,
            "n_examples": n, **(paired or {}), "clear": bool(clear)}
