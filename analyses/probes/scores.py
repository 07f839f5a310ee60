"""One probe quantity per layer, with its interval: what the probes finding, summary and figure all state.

- classification: the out-of-fold accuracy pooled over the scored examples (each example is scored once,
  by the fold that held it out, when that fold's training part holds its class): k correct of n, with
  the exact (Clopper-Pearson) 95% binomial interval, the same quantity and interval the chance guard
  tests (analyses/core/chance.py). The mean of the per-fold accuracies differs from it when folds
  differ in size (0.583 against 6 of 11 = 0.545);
- regression: the mean R^2 over folds, with the 95% t interval over folds.

`layer_scores(df)` reduces the probe df (one row per layer, fold and task, with the fold's test size
`n_test` and the test rows it scored, `n_scored`: classifiers score only rows whose class the fold's
training part holds, probes.linear.scoreable) to one row per layer and task: score, correct
(classification), n (rows scored), ci_low, ci_high. Older dfs without `n_scored` count every test row,
without `n_test` every fold alike.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from headscope.analyses.core.chance import t_half_width
from headscope.probes.linear import pooled_correct, pooled_score


def exact_interval(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Clopper-Pearson interval of k successes in n (scipy's binomtest)."""
    from scipy import stats

    ci = stats.binomtest(int(k), int(n)).proportion_ci(level, method="exact")
    return float(ci.low), float(ci.high)


def fold_interval(scores: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """t interval of the mean of per-fold scores (the mean itself for one fold or no spread)."""
    mean, n = float(scores.mean()), len(scores)
    if n < 2:  # cross-validation has two folds or more; one fold (an old df) keeps its point interval
        return mean, mean
    half = t_half_width(float(scores.std(ddof=1)), n, alpha=1 - level)  # 0 for no spread
    return mean - half, mean + half


def pooled(scores: np.ndarray, n_test: np.ndarray, classify: bool) -> dict[str, float]:
    """{score, correct, n, ci_low, ci_high} from per-fold scores and test sizes (see the module doc)."""
    scores, n_test = np.asarray(scores, dtype=float), np.asarray(n_test, dtype=float)
    if not classify:
        lo, hi = fold_interval(scores)
        return {"score": pooled_score(scores, n_test, classify), "correct": math.nan, "n": float(n_test.sum()),
                "ci_low": lo, "ci_high": hi}
    k, n = pooled_correct(scores, n_test)  # probes.linear's pooling, which the capacity sweep and selectivity read
    if n == 0:
        return {"score": math.nan, "correct": 0.0, "n": 0.0, "ci_low": math.nan, "ci_high": math.nan}
    lo, hi = exact_interval(k, n)
    return {"score": k / n, "correct": float(k), "n": float(n), "ci_low": lo, "ci_high": hi}


def layer_scores(df: pd.DataFrame, classify: bool) -> pd.DataFrame:
    """One row per (layer, task): score, correct, n, ci_low, ci_high (see the module doc)."""
    rows = []
    for (layer, task), g in df.groupby(["layer", "task"], sort=True):
        size = "n_scored" if "n_scored" in g else "n_test"
        sizes = g[size].to_numpy() if size in g else np.ones(len(g))
        if "n_test" not in g and classify:  # no fold sizes: the fold mean with its t interval
            lo, hi = fold_interval(g.score.to_numpy())
            rows.append({"layer": layer, "task": task, "score": float(g.score.mean()), "correct": math.nan,
                         "n": math.nan, "ci_low": lo, "ci_high": hi})
            continue
        rows.append({"layer": layer, "task": task, **pooled(g.score.to_numpy(), sizes, classify)})
    return pd.DataFrame(rows)
