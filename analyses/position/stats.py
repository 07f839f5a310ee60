"""Statistics of the position sweep: bootstrap intervals, the middle-to-ends ratio, retrieval heads."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from headscope.errors import ConfigError


def bootstrap_ci(values: Sequence[float], *, n_boot: int = 1000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the mean and its percentile bootstrap interval (resampling examples)."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ConfigError("bootstrap_ci needs at least one value.")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(1)  # [n_boot]
    tail = (1.0 - level) / 2
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(x.mean()), float(low), float(high)


def curve_table(obs: pd.DataFrame, metrics: Sequence[str], *, n_boot: int, seed: int, condition: str = "full") -> pd.DataFrame:
    """Tidy [metric, position, mean, ci_low, ci_high, n, condition] from per-row observations."""
    rows = []
    for metric in metrics:
        for pos, group in obs.groupby("position", sort=True):
            mean, low, high = bootstrap_ci(group[metric].to_numpy(), n_boot=n_boot, seed=seed)
            rows.append({"condition": condition, "metric": metric, "position": int(pos), "mean": mean,
                         "ci_low": low, "ci_high": high, "n": len(group)})
    return pd.DataFrame(rows)


def middle_to_ends(curve: Mapping[int, float]) -> float | None:
    """min(metric at middle positions) / max(metric at the first and last position).

    None when the grid has fewer than three positions or both ends are 0.
    """
    positions = sorted(curve)
    if len(positions) < 3:
        return None
    ends = max(curve[positions[0]], curve[positions[-1]])
    if ends == 0 or not math.isfinite(ends):
        return None
    return float(min(curve[p] for p in positions[1:-1]) / ends)


def head_tracking(
    gold: pd.DataFrame, obs: pd.DataFrame, *, metrics: Sequence[str], span_share: float, min_corr: float = 0.3
) -> tuple[pd.DataFrame, str]:
    """Per head, how its gold-span mass tracks the answer across rows (examples x positions).

    gold: tidy [example, position, layer, head, mass]; obs: [example, position, *metrics].
    Returns the table [layer, head, mean_mass, corr_<metric>..., retrieval] and the metric used
    to flag retrieval heads: the first of `metrics` that varies (accuracy, else the answer
    log-probability). A retrieval head's Pearson correlation is >= min_corr and its mean mass
    exceeds the gold span's uniform share.
    """
    merged = gold.merge(obs, on=["example", "position"])
    varying = [m for m in metrics if obs[m].nunique() > 1]
    tracked = varying[0] if varying else metrics[0]
    rows = []
    for (layer, head), g in merged.groupby(["layer", "head"], sort=True):
        row = {"layer": int(layer), "head": int(head), "mean_mass": float(g["mass"].mean())}
        for metric in metrics:
            ok = g[metric].nunique() > 1 and g["mass"].nunique() > 1
            row[f"corr_{metric}"] = float(np.corrcoef(g["mass"], g[metric])[0, 1]) if ok else float("nan")
        rows.append(row)
    table = pd.DataFrame(rows)
    table["retrieval"] = (table[f"corr_{tracked}"] >= min_corr) & (table["mean_mass"] > span_share)
    return table, tracked
