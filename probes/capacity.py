"""Selectivity against probe capacity (Hewitt & Liang 2019, section 5: "sweep the regularisation and
report the most selective probe").

A probe strong enough to memorise word types scores well on the control task as well as on the real
one, so one fixed probe can make a representation look unselective. `capacity_sweep` fits the same
probe family at every strength in a grid (LogisticProbe: C, the inverse L2 strength; RidgeProbe:
alpha, the L2 strength), scores the real labels and the control task on the same folds at each, and
reports the most selective setting. The grid is searched on the cross-validated scores themselves,
as H&L do; with few examples and a fine grid this is optimistic, so keep the grid short.
"""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
from sklearn.base import clone

from headscope.errors import ConfigError
from headscope.probes.linear import LogisticProbe, RidgeProbe, pooled_score, selectivity

# Inverse L2 strengths for LogisticProbe (standardised inputs): from a probe that can only follow the
# largest-variance directions (0.001) to scikit-learn's default (1.0).
C_GRID: tuple[float, ...] = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0)
ALPHA_GRID: tuple[float, ...] = (1000.0, 100.0, 10.0, 1.0)


def capacity_sweep(estimator, X, y, types, *, grid: Sequence[float] | None = None, cv: int = 5,
                   seed: int = 0, return_folds: bool = False) -> pd.DataFrame | tuple[pd.DataFrame, list[dict]]:
    """One row per strength in `grid`: strength, score, control, selectivity (linear.pooled_score: accuracy
    over the scored rows, mean R^2 over folds),
    and `most_selective` (True on the row with the largest selectivity; the first on ties).

    estimator: a LogisticProbe (grid over C; default C_GRID) or a RidgeProbe (grid over alpha;
    default ALPHA_GRID); X [n, d]; y [n] real labels; types [n] the control task's word types.
    return_folds: also return `selectivity`'s per-fold results, one dict per row."""
    if isinstance(estimator, LogisticProbe):
        param, grid = "C", C_GRID if grid is None else grid
    elif isinstance(estimator, RidgeProbe):
        param, grid = "alpha", ALPHA_GRID if grid is None else grid
    else:
        raise ConfigError(f"capacity_sweep takes a LogisticProbe or a RidgeProbe, got {type(estimator).__name__}.")
    if not len(grid) or any(not (v > 0) for v in grid):
        raise ConfigError(f"the {param} grid must be non-empty and positive, got {list(grid)}.")
    rows, folds = [], []
    for value in grid:
        res = selectivity(clone(estimator).set_params(**{param: float(value)}), X, y, types, cv=cv, seed=seed)
        folds.append(res)
        classify = param == "C"
        rows.append({"param": param, "strength": float(value), "score": pooled_score(res["score"], res["n_scored"], classify),
                     "control": pooled_score(res["control"], res["n_scored_control"], classify),
                     "selectivity": res["selectivity"]})
    table = pd.DataFrame(rows)
    table["most_selective"] = False
    table.loc[int(table["selectivity"].to_numpy().argmax()), "most_selective"] = True
    return (table, folds) if return_folds else table
