"""Agreement between token-importance methods: Kendall tau per example, and its summaries.

Jain & Wallace (2019) compare, per instance, the ranking of input tokens by attention with the
ranking by gradients and by leave-one-out, using Kendall's tau and its p-value; an instance
agrees significantly when p < alpha. `kendall_matrix` computes tau-b (ties handled) for many
vector pairs at once from pairwise sign matrices. Its p-value is the exact one (scipy.stats.kendalltau's
method="exact": the null distribution of discordant pairs over the m! orderings) where neither ranking has ties
and m <= EXACT_MAX_TOKENS, as scipy's "auto" chooses (review 19d A3: at 4 tokens a perfect ranking has p = 2/4! =
0.083, which the normal approximation called 0.042, significant); with ties, the permutation p over all m! orderings
up to TIED_EXACT_MAX_TOKENS (review 19w B1); with ties over that or more tokens, the normal approximation with tie
correction (method="asymptotic"). Calling scipy once per pair costs about 4 ms, and an
example has hundreds of pairs (every head against every method).
Summaries give the mean and standard deviation of tau and the fraction significant per group;
`paired_differences` compares two attention kinds (rollout against the last layer) on the same examples
against each reference method: the paired t test of per-example tau differences, Holm-corrected.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats
from scipy.special import ndtr

from headscope.analyses.core.chance import holm, t_half_width

AttentionKey = tuple  # (attention kind, layer or None, head or None)
EXACT_MAX_TOKENS = 33  # scipy.stats.kendalltau's method="auto" takes the exact null up to this size, without ties
TIED_EXACT_MAX_TOKENS = 8  # with ties, the permutation null over all m! orderings (40,320 at 8) up to this size


def discordance_cdf(m: int) -> np.ndarray:
    """P(D <= d), d = 0 .. m(m-1)/2, for D the discordant pairs of a uniformly random ordering of m tokens (the
    inversions of a random permutation: Mahonian numbers / m!), by convolving each token's uniform 0..i-1 -> [tot+1]."""
    dist = np.ones(1)
    for i in range(2, m + 1):
        dist = np.convolve(dist, np.full(i, 1.0 / i))
    return np.minimum(np.cumsum(dist), 1.0)


_TIED_NULL: dict[tuple, np.ndarray] = {}


def tied_null(a_ranks: tuple, b_ranks: tuple) -> np.ndarray:
    """Sorted |S| (concordant minus discordant pairs) over all m! orderings of b's values against a's, for rankings
    with ties (review 19w B1: the normal approximation called (0,0,1,1,2) against 1..5 significant, p 0.037, where the
    permutation p is 0.067). The distribution depends on the two multisets of ranks only, so it is cached by them."""
    key = (a_ranks, b_ranks)
    if key not in _TIED_NULL:
        from itertools import permutations

        m = len(a_ranks)
        i, j = np.triu_indices(m, k=1)
        a, b = np.asarray(a_ranks, dtype=float), np.asarray(b_ranks, dtype=float)
        orders = b[np.array(list(permutations(range(m))))]  # [m!, m]
        s = np.sign(orders[:, i] - orders[:, j]) @ np.sign(a[i] - a[j])  # [m!]
        _TIED_NULL[key] = np.sort(np.abs(s))
    return _TIED_NULL[key]


def _tie_counts(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of [k, m]: sum t(t-1)/2, sum t(t-1)(t-2), sum t(t-1)(2t+5) over groups of t tied values."""
    out = np.zeros((3, len(vectors)))
    for i, row in enumerate(vectors):
        t = np.unique(row, return_counts=True)[1].astype(float)
        t = t[t > 1]
        out[:, i] = ((t * (t - 1) / 2).sum(), (t * (t - 1) * (t - 2)).sum(), (t * (t - 1) * (2 * t + 5)).sum())
    return out[0], out[1], out[2]


def kendall_matrix(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Kendall tau-b and two-sided p-values between every row of a [k, m] and of b [j, m] -> [k, j] each: the exact
    p where neither row has ties and m <= EXACT_MAX_TOKENS, the permutation p with ties up to TIED_EXACT_MAX_TOKENS,
    else the normal approximation (module docstring).

    NaN where a row is constant (tau undefined) or m < 3.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    m = a.shape[1]
    if m < 3:
        nan = np.full((len(a), len(b)), np.nan)
        return nan, nan.copy()
    i, j = np.triu_indices(m, k=1)
    sa = np.sign(a[:, i] - a[:, j])  # [k, pairs]
    sb = np.sign(b[:, i] - b[:, j])  # [j, pairs]
    s = sa @ sb.T  # [k, j] concordant minus discordant
    tot = m * (m - 1) / 2
    xt, x0, x1 = _tie_counts(a)
    yt, y0, y1 = _tie_counts(b)
    with np.errstate(divide="ignore", invalid="ignore"):
        tau = s / np.sqrt(tot - xt)[:, None] / np.sqrt(tot - yt)[None, :]
        mm = m * (m - 1.0)
        var = (
            (mm * (2 * m + 5) - x1[:, None] - y1[None, :]) / 18
            + (2 * xt[:, None] * yt[None, :]) / mm
            + x0[:, None] * y0[None, :] / (9 * mm * (m - 2))
        )
        p = 2 * ndtr(-np.abs(s / np.sqrt(var)))
    if m <= EXACT_MAX_TOKENS:
        untied = (xt == 0)[:, None] & (yt == 0)[None, :]  # [k, j]
        if untied.any():
            cdf = discordance_cdf(m)  # [tot + 1]
            dis = np.rint((tot - s) / 2).astype(int)  # discordant pairs where nothing ties
            low = np.clip(np.minimum(dis, int(tot) - dis), 0, int(tot))
            p = np.where(untied, np.minimum(2 * cdf[low], 1.0), p)
        if m <= TIED_EXACT_MAX_TOKENS and not untied.all():  # ties: the permutation p over all m! orderings
            ra = [tuple(sorted(stats.rankdata(row))) for row in a]
            rb = [tuple(sorted(stats.rankdata(row))) for row in b]
            for r, c in zip(*np.nonzero(~untied)):
                null = tied_null(ra[r], rb[c])  # [m!] sorted
                p[r, c] = (len(null) - np.searchsorted(null, abs(s[r, c]) - 1e-9)) / len(null)
    undefined = (tot - xt)[:, None] * (tot - yt)[None, :] == 0
    tau = np.where(undefined, np.nan, np.clip(tau, -1, 1))
    p = np.where(undefined, np.nan, np.minimum(p, 1.0))
    return tau, p


def tau_rows(
    example: int,
    attention: Mapping[AttentionKey, np.ndarray],
    methods: Mapping[str, np.ndarray],
    *,
    alpha: float = 0.05,
    visible_from: Mapping[AttentionKey, int] | None = None,
) -> Iterator[dict]:
    """One row per (attention vector, other method): tau, p-value, significance, n_tokens (how many it
    ranks). visible_from: per attention vector, the first ranked token it can see (a sliding-window
    layer's answer query sees only its window; the mask gives the rest 0 by construction, a block of
    ties that is no measurement): both rankings are cut to the tokens from there on."""
    names = list(methods)
    starts = {k: (visible_from or {}).get(k, 0) for k in attention}
    for start in sorted(set(starts.values())):
        keys = [k for k in attention if starts[k] == start]
        tau, p = kendall_matrix(np.stack([attention[k][start:] for k in keys]),
                                np.stack([methods[n][start:] for n in names]))
        for r, (kind, layer, head) in enumerate(keys):
            for c, method in enumerate(names):
                yield {
                    "example": example, "attention": kind, "layer": layer, "head": head, "method": method,
                    "tau": tau[r, c], "p_value": p[r, c], "significant": bool(p[r, c] < alpha),
                    "n_tokens": len(attention[(kind, layer, head)]) - start,
                }


def method_pair_rows(example: int, methods: Mapping[str, np.ndarray], *, alpha: float = 0.05) -> Iterator[dict]:
    """Tau between every pair of non-attention methods (how much the baselines agree among themselves)."""
    names: Sequence[str] = list(methods)
    stacked = np.stack([methods[n] for n in names])
    tau, p = kendall_matrix(stacked, stacked)
    for r, a in enumerate(names):
        for c in range(r + 1, len(names)):
            yield {
                "example": example, "method_a": a, "method_b": names[c],
                "tau": tau[r, c], "p_value": p[r, c], "significant": bool(p[r, c] < alpha),
            }


def summarise(df: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    """Mean and std of tau, fraction significant and count per group (NaN taus are left out)."""
    valid = df.dropna(subset=["tau"])
    out = valid.groupby(list(by), dropna=False).agg(
        mean_tau=("tau", "mean"), std_tau=("tau", "std"), frac_significant=("significant", "mean"), n=("tau", "size")
    )
    return out.reset_index()



def paired_differences(df: pd.DataFrame, methods: Sequence[str], *, a: str = "rollout", b: str = "last_layer",
                       level: float = 0.95) -> dict[str, dict]:
    """Per reference method: the per-example difference tau(a) - tau(b) against that method (examples where
    both taus are defined), its mean, sd, n, Student-t interval and two-sided paired t p-value, and the p-value
    Holm-corrected over the methods tested (those with n >= 2 and a non-zero sd). `df`: the tau rows
    (example, attention, method, tau). {method: {"mean", "sd", "n", "ci", "p", "p_holm"}}; a method with fewer
    than 2 pairs gets mean and n only."""
    out: dict[str, dict] = {}
    for method in methods:
        sel = df[(df.method == method) & df.attention.isin([a, b])]
        wide = sel.pivot_table(index="example", columns="attention", values="tau").dropna()
        if a not in wide or b not in wide or wide.empty:
            continue
        diff = (wide[a] - wide[b]).to_numpy(dtype=np.float64)  # [n examples]
        n = len(diff)
        entry: dict = {"mean": float(diff.mean()), "n": n}
        sd = float(diff.std(ddof=1)) if n > 1 else float("nan")
        if n > 1 and sd > 0:
            half = t_half_width(sd, n, alpha=1 - level)
            t = entry["mean"] / (sd / np.sqrt(n))
            entry.update(sd=sd, ci=[entry["mean"] - half, entry["mean"] + half], p=float(2 * stats.t.sf(abs(t), n - 1)))
        out[method] = entry
    tested = [m for m in out if "p" in out[m]]
    for method, adjusted in zip(tested, holm([out[m]["p"] for m in tested])):
        out[method]["p_holm"] = adjusted
    return out
