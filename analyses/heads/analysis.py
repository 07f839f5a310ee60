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
a tie at the start of a pruning order can move its count); role_windows on a sliding-window model (roles.role_windows;
its sink_uniform: each layer's sink score of a uniform head, roles.sink_uniform);
sink_token: every prompt's first token where they share one (roles.sink_token), what the sink role attends to;
positions: "alibi" on an ALiBi model (absent otherwise), whose fixed slopes set part of a head's positional role.
redundant_layers (pruning.layer_redundancy, with the best head table): the layers whose joint removal
costs much while each head alone, ablated or kept, moves the metric little.
The rounding floors and ties (`rounding_step`, `numerical_checks`, `tie_reach`) are numerics.py's.
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
from headscope.analyses.core.chance import mean_interval, se_interval
from headscope.analyses.core.config import AnalysisConfig, configure
from headscope.analyses.core.contract import ENCODER_SCORING, Needs, Reads
from headscope.analyses.core.mask_read import mask_metric
from headscope.analyses.core.result import Result, names_source
from headscope.analyses.core.task_files import takes_prompt
from headscope.analyses.core.tasks import Task, sentence_task
from headscope.analyses.heads.importance import (
    ABLATIONS,
    Scorer,
    ablation_importance,
    evaluate_masks,
    gate_gradient_stats,
    make_scorer,
    normalize_per_layer,
)
from headscope.analyses.heads.l0 import L0Config, l0_choice, l0_sweep
from headscope.analyses.heads.numerics import _rounding_checks, tie_reach
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
from headscope.analyses.heads.roles import head_roles, role_windows, sink_token, sink_uniform
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
        # review 19b A2: a learned sink logit per head (GPT-OSS): the sink role's first token is not that sink
        **({"learned_sinks": True} if getattr(f, "learned_sinks", False) else {}),
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
    per_head = roles.drop(columns=["window", "induction_length", "induction_cut", "longest_prompt", "induction_repeat",
                                   "induction_control"])
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
    summary.update(role_windows(roles, sink_uniform(model, scorer.tokens, scorer.attention_mask)))
    summary["sink_token"] = sink_token(model, scorer.tokens, scorer.attention_mask)  # what "first token" is here
    if model.facts.positional == "alibi":  # each head's fixed slope biases it towards near keys (the roles caption)
        summary["positions"] = "alibi"
    if model.facts.nope_layers:  # review 20 A3: layers without rotary, named where a positional role sits on one
        summary["nope_layers"] = list(model.facts.nope_layers)
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
    first, second = ranked.iloc[0], ranked.iloc[1]
    ci, next_ci = (se_interval(float(r["importance"]), float(r["importance_se"]), n) for r in (first, second))
    paired = _paired(per, first["head_name"], second["head_name"]) if per is not None else None
    clear = paired["diff_ci"][0] > 0 if paired else ci is not None and next_ci is not None and ci[0] > next_ci[1]
    return {"head": first["head_name"], "importance": float(first["importance"]), "ci": ci,
            "next_head": second["head_name"], "next_importance": float(second["importance"]), "next_ci": next_ci,
            "n_examples": n, **(paired or {}), "clear": bool(clear)}
