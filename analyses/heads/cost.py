"""What the heads analysis costs (analyses/core/budget.py), and its sweeps in the order they give way.

Row passes, for n examples and N = layers x heads (a backward pass counts two more):
- gradient importance: 3n; each ablation method: n (1 + s N) (mean: + n for the means), s the share
  of a pass a run costs that resumes at the ablated head's block (budget.resumed_share);
- the measured rounding floor (any ablation method): n (2 + s G L), G = len(rounding.NULL_GATES): one
  capture of every head's z, the sweep's captured pass and G null ablations per layer;
- roles: n_induction repeated-token rows and as many no-repeat control rows (5 passes' worth, pattern capture);
- pruning: c = len(prune_counts) points per curve: n c per fixed-order curve (gradient, ablation,
  n_random random ones); recomputed gradient: 3n (c - 1) + n; recomputed zero ablation:
  sum over steps of n (1 + heads remaining), or with the cheap ranking (above exact_limit heads)
  3n + n (max(2k, k + 8) + 1) per step;
- best head per layer: n (N + L + 1);
The knobs, in order: random orderings, L0 steps and lambdas, resample then mean ablation, the
recomputed orderings, the L0 sweep, the best head per layer, examples (to 8), and last every
per-head ablation (gradient importance, gradient and random orderings only). Its weight is 2: a
shared budget gives it (and patching) twice the share of the other costly analyses.
- L0: lambdas x steps x 3 x min(batch_size, n) + n per lambda.
"""
from __future__ import annotations

import dataclasses

from headscope.analyses.core.budget import Cost, CostModel, examples_knob, n_rows, resumed_share, task_length
from headscope.analyses.heads.pruning import VERIFY, cheap_ranking, prune_counts
from headscope.analyses.heads.rounding import NULL_GATES

FULL, QUICK = 64, 16  # default examples (HeadsConfig.examples)


def estimate(model, task, config) -> Cost:
    f = model.facts
    n, heads = n_rows(task, config, FULL, QUICK), f.n_layers * f.n_heads
    parts: dict[str, float] = {}
    share = resumed_share(model) if not f.is_encoder else 1.0  # single-head ablations resume at their layer
    for method in config.methods:
        parts[f"importance_{method}"] = 3 * n if method == "gradient" else n * (1 + share * heads + (method == "mean"))
    if set(config.methods) - {"gradient"}:
        parts["rounding_floor"] = n * (2 + share * len(NULL_GATES) * f.n_layers)
    parts["roles"] = 5 * config.n_induction  # the no-repeat control: one more pass
    p = config.pruning
    counts = prune_counts(heads, p.step)
    pruning = 0.0
    for ordering in p.orderings:
        if ordering == "random":
            pruning += p.n_random * n * len(counts)
            continue
        for recompute in p.recompute:
            if not recompute:
                pruning += n * len(counts)
            elif ordering == "gradient":
                pruning += 3 * n * (len(counts) - 1) + n
            elif cheap_ranking(ordering, heads, p):
                pruning += sum(3 * n + n * (min(heads - a, max(VERIFY * (b - a), b - a + 8)) + 1)
                               for a, b in zip(counts, counts[1:])) + n
            else:
                pruning += sum(n * (1 + heads - a) for a in counts[:-1]) + n
    parts["pruning"] = pruning
    if config.best_head and config.methods:
        parts["best_head"] = n * (heads + f.n_layers + 1)
    if config.l0 is not None:
        l0 = config.l0
        parts["l0"] = len(l0.lambdas) * (l0.steps * 3 * min(l0.batch_size, n) + n)
    return Cost(parts=parts, n_pos=task_length(task, model))


def _replace(config, **pruning):
    return dataclasses.replace(config, pruning=dataclasses.replace(config.pruning, **pruning))


def fewer_random(config, model):
    return _replace(config, n_random=config.pruning.n_random // 2) if config.pruning.n_random > 1 else None


def fewer_l0_steps(config, model):
    if config.l0 is None or config.l0.steps <= 25:
        return None
    return dataclasses.replace(config, l0=dataclasses.replace(config.l0, steps=max(25, config.l0.steps // 2)))


def fewer_l0_lambdas(config, model):
    lambdas = () if config.l0 is None else config.l0.lambdas
    if len(lambdas) <= 1:
        return None
    keep = lambdas[1::2] if len(lambdas) > 2 else lambdas[-1:]  # every other one (a spread over the range)
    return dataclasses.replace(config, l0=dataclasses.replace(config.l0, lambdas=tuple(keep)))


def fewer_methods(config, model):
    """Drop resample, then mean ablation (gradient and zero stay)."""
    for method in ("resample", "mean"):
        if method in config.methods:
            return dataclasses.replace(config, methods=tuple(m for m in config.methods if m != method))
    return None


def no_recompute(config, model):
    return _replace(config, recompute=(False,)) if True in config.pruning.recompute else None


def no_l0(config, model):
    return dataclasses.replace(config, l0=None) if config.l0 is not None else None


def no_best_head(config, model):
    return dataclasses.replace(config, best_head=False) if config.best_head else None


def gradient_only(config, model):
    """The last resort: gradient importance alone, pruned by gradient and random orderings (no
    per-head ablation passes at all)."""
    if config.methods == ("gradient",) and "ablation" not in config.pruning.orderings:
        return None
    return _replace(dataclasses.replace(config, methods=("gradient",)),
                    orderings=tuple(o for o in config.pruning.orderings if o != "ablation"))


COST = CostModel(estimate=estimate, knobs=(fewer_random, fewer_l0_steps, fewer_l0_lambdas, fewer_methods,
                                           no_recompute, no_l0, no_best_head, examples_knob(FULL, QUICK),
                                           gradient_only), weight=2.0)

__all__ = ["COST", "estimate"]
