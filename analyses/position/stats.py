"""Statistics of the position sweep: bootstrap intervals, the middle-to-ends ratio, retrieval heads."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

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


def _clusters(groups: Sequence[Any] | np.ndarray) -> tuple[np.ndarray, int]:
    """(each row's cluster index [rows], the number of clusters) for any labels."""
    codes, labels = pd.factorize(pd.Series(np.asarray(groups)), sort=True)
    return np.asarray(codes), len(labels)


def cluster_corr(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray, groups: Sequence[Any] | np.ndarray,
                 *, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> dict[str, Any]:
    """Pearson r of x and y over rows that come in clusters (groups [rows]: each row's example), tested and
    bounded over the clusters: rows of one example share its prompt, so they are not independent pairs.

    r: over every row with finite x and y. p: two-sided test of r = 0 as the slope of y on x with the
    cluster-robust CR2 variance (Bell & McCaffrey 2002) and Imbens & Kolesar's (2016) degrees of freedom,
    calibrated with few clusters (a t test of the rows as independent pairs is not). ci: the percentile
    bootstrap over clusters (each draw resamples examples with all their rows). Repeating every cluster's
    rows k times changes none of them, where a test over rows would count k times the pairs. {"r", "p",
    "ci", "n" (clusters), "n_rows", "df"}; p NaN below 3 clusters, ci None below 3 clusters or when most
    draws have no spread.
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)  # [rows]
    keep = np.isfinite(x) & np.isfinite(y)
    code, n = _clusters(np.asarray(groups)[keep])
    x, y = x[keep], y[keep]
    out: dict[str, Any] = {"r": float("nan"), "p": float("nan"), "ci": None, "n": n, "n_rows": int(x.size),
                           "df": float("nan")}
    if x.size < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return out
    xc, yc = x - x.mean(), y - y.mean()
    sxx, syy = float((xc * xc).sum()), float((yc * yc).sum())
    out["r"] = float((xc * yc).sum() / math.sqrt(sxx * syy))
    if n < 3:
        return out
    out["p"], out["df"] = _cr2_slope_p(xc, yc, code, n)
    sums = np.zeros((n, 6))  # [cluster, (rows, x, y, xx, yy, xy)]: each cluster's sums of the centred values
    for j, v in enumerate((np.ones_like(xc), xc, yc, xc * xc, yc * yc, xc * yc)):
        sums[:, j] = np.bincount(code, weights=v, minlength=n)
    draws = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))  # [n_boot, cluster]
    counts = np.bincount((draws + n * np.arange(n_boot)[:, None]).ravel(), minlength=n_boot * n).reshape(n_boot, n)
    w = counts @ sums  # [n_boot, 6] the resampled rows' sums
    rows = w[:, 0]
    mx, my = w[:, 1] / rows, w[:, 2] / rows
    vx, vy, cov = w[:, 3] / rows - mx * mx, w[:, 4] / rows - my * my, w[:, 5] / rows - mx * my
    ok = (vx > 1e-12 * sxx / x.size) & (vy > 1e-12 * syy / x.size)  # a draw without spread has no r
    if ok.sum() * 2 > n_boot:
        r = np.clip(cov[ok] / np.sqrt(vx[ok] * vy[ok]), -1.0, 1.0)
        tail = (1.0 - level) / 2
        out["ci"] = [float(v) for v in np.quantile(r, [tail, 1.0 - tail])]
    return out


def _cr2_slope_p(xc: np.ndarray, yc: np.ndarray, code: np.ndarray, n: int) -> tuple[float, float]:
    """(two-sided p, degrees of freedom) of the slope of yc on xc (both centred, with an intercept) under
    the CR2 cluster-robust variance with Imbens-Kolesar degrees of freedom. With X = [1, xc], M = (X'X)^-1
    = diag(1/rows, 1/sxx) and S = M^(1/2), each cluster's (I - H_gg)^(-1/2) reduces to the 2 x 2
    (I - Q_g)^(-1/2), Q_g = S X_g'X_g S; then the slope's variance is sum_g (a_g' S X_g'e_g)^2 with
    a_g = (I - Q_g)^(-1/2) S c (c picks the slope) and the df is tr(B)^2 / tr(B^2), B = diag(a_g'Q_g a_g)
    - P P' with P's rows (Q_g a_g)'."""
    from scipy import stats

    sxx = float((xc * xc).sum())
    slope = float((xc * yc).sum()) / sxx
    e = yc - slope * xc  # [rows] residuals (mean 0)
    sums = np.stack([np.bincount(code, weights=v, minlength=n) for v in (np.ones_like(xc), xc, xc * xc, e, xc * e)],
                    1)  # [cluster, 5]
    s = np.array([1.0 / math.sqrt(xc.size), 1.0 / math.sqrt(sxx)])  # S's diagonal
    xtx = np.stack([sums[:, [0, 1]], sums[:, [1, 2]]], 1)  # [cluster, 2, 2] X_g'X_g
    q = s[None, :, None] * xtx * s[None, None, :]  # [cluster, 2, 2] Q_g
    vals, vecs = np.linalg.eigh(np.eye(2) - q)  # [cluster, 2], [cluster, 2, 2]
    if not (vals > 1e-10).all():  # a cluster that alone fixes the line: no residual to estimate its variance
        return float("nan"), float("nan")
    root = (vecs / np.sqrt(vals)[:, None, :]) @ vecs.transpose(0, 2, 1)  # [cluster, 2, 2] (I - Q_g)^(-1/2)
    a = root @ np.array([0.0, s[1]])  # [cluster, 2]
    score = (a * (s * sums[:, [3, 4]])).sum(1)  # [cluster] a_g' S X_g'e_g
    qa = np.einsum("gij,gj->gi", q, a)  # [cluster, 2]
    d, pp = (a * qa).sum(1), (qa * qa).sum(1)  # [cluster] B = diag(d) - P P', P's rows qa
    trace_b2 = float((d * d).sum() - 2 * (d * pp).sum() + ((qa.T @ qa) ** 2).sum())  # tr(B^2) without B
    df = float((d.sum() - pp.sum()) ** 2 / trace_b2)
    var = float((score ** 2).sum())
    if not var > 0:
        return (0.0 if slope != 0 else float("nan")), df
    return float(2.0 * stats.t.sf(abs(slope) / math.sqrt(var), df)), df


def cluster_mean_test(values: Sequence[float] | np.ndarray, groups: Sequence[Any] | np.ndarray) -> dict[str, Any]:
    """Whether per-row values (a head's gold-span mass minus the other heads' mean) lie above 0, over the
    clusters: each cluster's mean, then a one-sided one-sample t test across the clusters (n - 1 degrees of
    freedom). {"mean" (of the cluster means), "p", "n" (clusters), "n_rows"}; p NaN below 2 clusters or
    without spread."""
    from scipy import stats

    v = np.asarray(values, dtype=float)  # [rows]
    keep = np.isfinite(v)
    code, n = _clusters(np.asarray(groups)[keep])
    v = v[keep]
    means = np.bincount(code, weights=v, minlength=n) / np.bincount(code, minlength=n).clip(1)  # [cluster]
    out = {"mean": float(means.mean()) if n else float("nan"), "p": float("nan"), "n": n, "n_rows": int(v.size)}
    if n >= 2 and means.std(ddof=1) > 0:
        out["p"] = float(stats.ttest_1samp(means, 0.0, alternative="greater").pvalue)
    return out


def head_tracking(
    gold: pd.DataFrame, obs: pd.DataFrame, *, metrics: Sequence[str], span_share: float, alpha: float = 0.05,
    n_boot: int = 1000, seed: int = 0,
) -> tuple[pd.DataFrame, str]:
    """Per head, whether its gold-span mass tracks the answer across examples, by tests over examples.

    gold: tidy [example, position, layer, head, mass]; obs: [example, position, *metrics]. Returns the
    table [layer, head, mean_mass, mass_above_others, corr_<metric>..., corr_ci_low, corr_ci_high, n, n_rows,
    p_corr, p_corr_holm, p_mass, p_mass_holm, retrieval] and the metric the test tracks: the first of
    `metrics` that varies (accuracy, else the answer log-probability). The rows (examples x gold positions)
    of one example share its prompt, so every test and interval is over the n examples (cluster_corr,
    cluster_mean_test). A retrieval head passes two tests at `alpha`, each Holm-corrected across every
    head: its Pearson r with the tracked metric over the rows is positive with p_corr_holm < alpha, and its
    gold-span mass minus the mean of the other heads' on the same rows, averaged per example, is above 0
    with p_mass_holm < alpha; its mean mass also exceeds the span's uniform share (span_share). corr_ci_*:
    the cluster bootstrap 95% interval of the tracked r (n_boot draws of examples from `seed`).
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
        above = cluster_mean_test((mine - others).to_numpy(dtype=float), mine.index.get_level_values("example"))
        row = {"layer": int(layer), "head": int(head), "mean_mass": float(g["mass"].mean()),
               "mass_above_others": above["mean"]}
        for metric in metrics:
            ok = g[metric].nunique() > 1 and g["mass"].nunique() > 1
            row[f"corr_{metric}"] = float(np.corrcoef(g["mass"], g[metric])[0, 1]) if ok else float("nan")
        corr = cluster_corr(g["mass"], g[tracked], g["example"], n_boot=n_boot, seed=seed)
        row.update({"corr_ci_low": (corr["ci"] or [np.nan])[0], "corr_ci_high": (corr["ci"] or [np.nan, np.nan])[1],
                    "n": corr["n"], "n_rows": int(len(g)), "p_corr": corr["p"], "p_mass": above["p"]})
        rows.append(row)
    table = pd.DataFrame(rows)
    table["p_corr_holm"] = holm(table["p_corr"].tolist())
    table["p_mass_holm"] = holm(table["p_mass"].tolist())
    table["retrieval"] = ((table[f"corr_{tracked}"] > 0) & (table["p_corr_holm"] < alpha)
                          & (table["p_mass_holm"] < alpha) & (table["mean_mass"] > span_share))
    first = ["layer", "head", "mean_mass", "mass_above_others", *(f"corr_{m}" for m in metrics)]
    return table[[*first, "corr_ci_low", "corr_ci_high", "n", "n_rows", "p_corr", "p_corr_holm", "p_mass",
                  "p_mass_holm", "retrieval"]], tracked
