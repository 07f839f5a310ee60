"""Integrated gradients' completeness, and the one rule for which examples' IG enters any claim.

An example's IG has converged when its attributions add up to the metric's change from the baseline:
relative completeness error |sum - (f(x) - f(b))| / |f(x) - f(b)| at most IG_CONVERGED_ERROR. An example
whose IG has not converged ranks tokens by something that is not IG, so the rule (`ig_rule`) is:

- every example converged: IG is used on all of them ("all");
- some did not, and at least half the examples and at least MIN_CONVERGED did: IG is used on the converged
  examples only ("converged"; every IG claim says "from the k converged examples");
- fewer converged: IG is left out ("none").

The analysis applies it when it summarises (its aggregate tables and summary keys hold only the examples the
rule keeps, and the summary records `ig_used` and `ig_examples_used`); the report's finding, figures and explorer
and `headscope compare` read it back with `ig_use(summary)`, so they all keep the same examples.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

IG_CONVERGED_ERROR = 0.1  # relative completeness error over which an example's IG has not converged
MIN_CONVERGED = 2  # fewer converged examples than this give no interval: IG is left out
ROUNDING_STEPS = 16  # a completeness miss up to this many rounding steps (half of bfloat16's 8 bits) may be rounding
MOVED_STEPS = 2  # a miss that moves by more than this many rounding steps when the steps double is set by the steps
IG_METHOD = "integrated_gradients"


def completeness_error(attribution_sum: float, f_x: float, f_b: float) -> float:
    """|sum of IG attributions - (f(x) - f(baseline))| / |f(x) - f(baseline)|: 0 when IG is complete (NaN when the
    metric does not change, where no relative error is defined)."""
    change = f_x - f_b
    return abs(attribution_sum - change) / abs(change) if change != 0 else float("nan")


def ig_rounding_floor(dtype: str | None, attribution_sum: float, metric_input: float | None,
                      metric_baseline: float | None, metric_change: float = 0.0) -> float | None:
    """One rounding step of what a completeness error is made of, in `dtype` (None: not a floating dtype):
    eps x (max(1, |f(x)|) + max(1, |f(b)|) + |sum of attributions|), the two endpoint metrics' spacing (each
    rounded where it is computed) plus the attributions' own (gradients of the dtype's precision scaled by the
    input's change). Where the endpoints are not known (older summaries) |f(x) - f(b)| + 2 stands in for them
    (it is at most their sum). A miss beyond ROUNDING_STEPS of this is not the precision's (review 12b A6: a
    bfloat16 miss of 10.6 on a sum of 10.2 and a change of -0.44, 66 steps, where float32 missed by 20.8)."""
    import torch

    dt = getattr(torch, str(dtype or "").removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
        return None
    ends = (abs(metric_change) + 2.0 if metric_input is None or metric_baseline is None else
            max(1.0, abs(metric_input)) + max(1.0, abs(metric_baseline)))
    return float(torch.finfo(dt).eps) * (ends + abs(attribution_sum))


def ig_rule(n: int, n_converged: int) -> str:
    """"all", "converged" or "none" for n examples of which n_converged converged (the module's rule)."""
    if n_converged == n:
        return "all"
    return "converged" if n_converged >= MIN_CONVERGED and 2 * n_converged >= n else "none"


def doubling_trend(worst: dict[str, Any]) -> str | None:
    """"moved" where doubling the worst example's steps moved its convergence delta by more than MOVED_STEPS rounding
    steps (ig_worst's rounding_floor, 0 where no dtype was recorded): the step count sets the miss, the integral is
    not resolved at those steps, and no precision changes that; "still" where it moved less (rounding may then
    explain a small miss); None where no earlier count ran or the summary predates the record (ig_worst's delta and
    delta_half). Review 17a B4: a bfloat16 miss of 0.145x blamed on the precision, where float32 missed by 0.138x
    on the same example; its delta went from 0.57 at 16 steps to 1.26 at 32, 4.5 bfloat16 steps (0.15)."""
    now, before = worst.get("delta"), worst.get("delta_half")
    if not all(isinstance(x, (int, float)) and np.isfinite(x) for x in (now, before)):
        return None
    floor = worst.get("rounding_floor")
    floor = float(floor) if isinstance(floor, (int, float)) and np.isfinite(floor) else 0.0
    return "moved" if abs(now - before) > MOVED_STEPS * floor else "still"


def ig_convergence(ig: pd.DataFrame, dtype: str | None = None, routing: dict[str, Any] | None = None,
                   max_steps: int | None = None) -> dict[str, Any]:
    """IG's convergence over examples from the ig table (example, attribution_sum, metric_input, metric_baseline):
    how many examples exceed IG_CONVERGED_ERROR (an undefined error counts as exceeding), whether every example
    converged (ig_converged), the rule's verdict (ig_used) with the examples it keeps (ig_examples_used), the
    worst example (its sum against the change it should add up to) and the precision its gradients ran in
    (ig_dtype, "bfloat16": the tolerance is the same in every dtype, so a low one is named as a likely reason) and,
    on a model with top-k routing, its MoE layers and k (ig_top_k_routing, {"layers": [0, 2], "top_k": 2}: the
    router's choice is piecewise constant along IG's path, whose integral of gradients cannot see its jumps, so
    completeness can fail at any precision; review 11c A4, a float32 run missed by the same 0.18x as bfloat16).
    ig_worst also holds its endpoints, its rounding_floor (ig_rounding_floor in the run's dtype), its steps and
    Captum's delta at those steps and at half of them (doubling_trend); ig_max_steps the cap the steps doubled up to
    (max_steps). The words blame the precision only for a miss within ROUNDING_STEPS of the floor that doubling the
    steps did not move, and name the step cap where it did."""
    change = ig.metric_input - ig.metric_baseline
    rel = pd.Series([completeness_error(a, x, b) for a, x, b in
                     zip(ig.attribution_sum, ig.metric_input, ig.metric_baseline)], index=ig.index, dtype=float)
    ok = rel <= IG_CONVERGED_ERROR  # NaN compares False: not converged
    bad = int((~ok).sum())
    used = ig_rule(len(ig), len(ig) - bad)
    kept = [] if used == "none" else sorted(int(e) for e in ig.example[ok])
    median = float(rel.median())
    out: dict[str, Any] = {"ig_error_tolerance": IG_CONVERGED_ERROR, "ig_n_not_converged": bad,
                           "ig_n_converged": len(ig) - bad, "ig_converged": bad == 0, "ig_used": used,
                           "ig_examples_used": kept, "ig_median_relative_error": None if np.isnan(median) else median}
    if dtype is not None:
        out["ig_dtype"] = dtype
    if routing is not None:
        out["ig_top_k_routing"] = routing
    if max_steps is not None:
        out["ig_max_steps"] = int(max_steps)
    if rel.notna().any():
        worst = rel.idxmax()
        out["ig_worst"] = {"example": int(ig.example[worst]), "attribution_sum": float(ig.attribution_sum[worst]),
                           "metric_change": float(change[worst]), "relative_error": float(rel[worst]),
                           "metric_input": float(ig.metric_input[worst]),
                           "metric_baseline": float(ig.metric_baseline[worst])}
        for key, column in (("n_steps", "n_steps"), ("delta", "delta"), ("delta_half", "delta_half")):
            if column in ig and np.isfinite(float(ig[column][worst])):
                value = ig[column][worst]
                out["ig_worst"][key] = int(value) if key == "n_steps" else float(value)
        floor = ig_rounding_floor(dtype, float(ig.attribution_sum[worst]), float(ig.metric_input[worst]),
                                  float(ig.metric_baseline[worst]))
        if floor is not None:  # review 12b A6: whether the dtype's rounding can explain the worst miss
            out["ig_worst"]["rounding_floor"] = floor
    return out


@dataclass(frozen=True, kw_only=True)
class IgUse:
    """What a summary says about IG's use: mode ("all", "converged", "none"), the examples kept (None: all), the
    counts, and `legacy` for summaries written before the rule (their IG taus include every example, so any
    unconverged example leaves IG out)."""

    mode: str
    examples: frozenset[int] | None
    n: int
    n_converged: int
    n_not_converged: int
    legacy: bool = False

    def keeps(self, example: int) -> bool:
        return self.mode == "all" or (self.mode == "converged" and self.examples is not None and int(example) in self.examples)

    def rows(self, df: pd.DataFrame, column: str = "method") -> pd.DataFrame:
        """`df` (rows with `column` naming the method and an `example` column) without the IG rows of examples the
        rule leaves out."""
        if self.mode == "all" or column not in df:
            return df
        ig = df[column] == IG_METHOD
        if self.mode == "none":
            return df[~ig]
        return df[~ig | df["example"].astype(int).isin(self.examples or frozenset())]


def _int(x: Any, default: int = 0) -> int:
    return int(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and np.isfinite(x) else default


def ig_use(summary: dict[str, Any]) -> IgUse:
    """The rule's verdict as recorded in an attribution summary. Older summaries (no ig_used): "none" where
    ig_converged is false or any example missed the tolerance (their IG taus are over every example), else "all"."""
    n, bad = _int(summary.get("n_examples")), _int(summary.get("ig_n_not_converged"))
    used = summary.get("ig_used")
    if used in ("all", "converged", "none"):
        kept = summary.get("ig_examples_used")
        examples = frozenset(int(e) for e in kept) if isinstance(kept, list) else None
        k = _int(summary.get("ig_n_converged"), n - bad)
        if used == "converged" and examples is None:  # the examples are not recorded: nothing to keep them by
            used = "none"
        return IgUse(mode=used, examples=None if used == "all" else examples or frozenset(), n=n, n_converged=k,
                     n_not_converged=bad)
    legacy_bad = summary.get("ig_converged") is False or bad > 0
    return IgUse(mode="none" if legacy_bad else "all", examples=None if not legacy_bad else frozenset(), n=n,
                 n_converged=n - bad, n_not_converged=bad, legacy=legacy_bad and summary.get("ig_converged") is not False)
