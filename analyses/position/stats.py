"""Statistics of the position sweep: bootstrap intervals, the middle-to-ends ratio, retrieval heads."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from headscope.analyses.core.chance import holm
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


BINARY = ("accuracy", "exact")  # 0/1 per row: an exact binomial interval, not a bootstrap


def exact_ci(values: Sequence[float], *, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high) of 0/1 values: the share and its exact Clopper-Pearson interval. A bootstrap of
    8 zeros is [0, 0]; the exact interval of 0/8 is [0, 0.37]."""
    from scipy.stats import binomtest

    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ConfigError("exact_ci needs at least one value.")
    k = int(round(float(x.sum())))
    ci = binomtest(k, x.size).proportion_ci(level, method="exact")
    return float(x.mean()), float(ci.low), float(ci.high)


def curve_table(obs: pd.DataFrame, metrics: Sequence[str], *, n_boot: int, seed: int, condition: str = "full") -> pd.DataFrame:
    """Tidy [metric, position, mean, ci_low, ci_high, n, interval, condition] from per-row observations:
    0/1 metrics (BINARY) with exact Clopper-Pearson intervals, the others with a percentile bootstrap."""
    rows = []
    for metric in metrics:
        for pos, group in obs.groupby("position", sort=True):
            x = group[metric].to_numpy(dtype=float)
            binary = metric in BINARY and bool(np.isin(x, (0.0, 1.0)).all())
            mean, low, high = exact_ci(x) if binary else bootstrap_ci(x, n_boot=n_boot, seed=seed)
            rows.append({"condition": condition, "metric": metric, "position": int(pos), "mean": mean,
                         "ci_low": low, "ci_high": high, "n": len(group),
                         "interval": "clopper-pearson" if binary else "bootstrap"})
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


def pearson_p(r: float, n: int) -> float:
    """Two-sided p-value of a Pearson r over n independent pairs: t = r sqrt((n - 2) / (1 - r^2)) with
    n - 2 degrees of freedom (NaN when n < 3 or r is undefined)."""
    from scipy import stats

    if n < 3 or not math.isfinite(r):
        return float("nan")
    if abs(r) >= 1.0:
        return 0.0
    t = abs(r) * math.sqrt((n - 2) / (1.0 - r * r))
    return float(2.0 * stats.t.sf(t, n - 2))



def mass_above_others_p(diff: np.ndarray) -> float:
    """One-sided p-value that the mean of diff (per row: the head's gold-span mass minus the mean of the
    other heads') is above 0: a one-sample t test over the rows (NaN for fewer than 2 rows or no spread)."""
    from scipy import stats

    n = diff.size
    sd = float(diff.std(ddof=1)) if n > 1 else 0.0
    if n < 2 or not sd > 0:
        return float("nan")
    return float(stats.t.sf(float(diff.mean()) / (sd / math.sqrt(n)), n - 1))


def head_tracking(
    gold: pd.DataFrame, obs: pd.DataFrame, *, metrics: Sequence[str], span_share: float, alpha: float = 0.05
) -> tuple[pd.DataFrame, str]:
    """Per head, whether its gold-span mass tracks the answer across rows (examples x positions), by test.

    gold: tidy [example, position, layer, head, mass]; obs: [example, position, *metrics]. Returns the
    table [layer, head, mean_mass, mass_above_others, corr_<metric>..., n, p_corr, p_corr_holm, p_mass,
    p_mass_holm, retrieval] and the metric the test tracks: the first of `metrics` that varies (accuracy,
    else the answer log-probability). A retrieval head passes two tests at `alpha`, each Holm-corrected
    across every head: its Pearson r with the tracked metric over the n rows is positive with p_corr_holm
    < alpha (t test of r), and its gold-span mass lies above the mean of the other heads' on the same rows
    with p_mass_holm < alpha (one-sided paired t test); its mean mass also exceeds the span's uniform share
    (span_share). Rows of one example share it, so n counts rows, not independent examples: the p-values
    are those of independent rows and the finding states n.
    """
    merged = gold.merge(obs, on=["example", "position"])
    varying = [m for m in metrics if obs[m].nunique() > 1]
    tracked = varying[0] if varying else metrics[0]
    keys = ["example", "position"]
    total = merged.groupby(keys)["mass"].agg(["sum", "count"])  # per row: every head's mass summed, head count
    rows = []
    for (layer, head), g in merged.groupby(["layer", "head"], sort=True):
        mine = g.set_index(keys)["mass"]
        t = total.loc[mine.index]
        others = (t["sum"] - mine) / (t["count"] - 1).where(t["count"] > 1)  # [rows] the other heads' mean mass
        diff = (mine - others).dropna().to_numpy(dtype=float)
        row = {"layer": int(layer), "head": int(head), "mean_mass": float(g["mass"].mean()),
               "mass_above_others": float(diff.mean()) if diff.size else float("nan"), "n": int(len(g))}
        for metric in metrics:
            ok = g[metric].nunique() > 1 and g["mass"].nunique() > 1
            row[f"corr_{metric}"] = float(np.corrcoef(g["mass"], g[metric])[0, 1]) if ok else float("nan")
        row["p_corr"] = pearson_p(row[f"corr_{tracked}"], row["n"])
        row["p_mass"] = mass_above_others_p(diff)
        rows.append(row)
    table = pd.DataFrame(rows)
    table["p_corr_holm"] = holm(table["p_corr"].tolist())
    table["p_mass_holm"] = holm(table["p_mass"].tolist())
    table["retrieval"] = ((table[f"corr_{tracked}"] > 0) & (table["p_corr_holm"] < alpha)
                          & (table["p_mass_holm"] < alpha) & (table["mean_mass"] > span_share))
    return table, tracked
