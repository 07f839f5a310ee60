"""Where each eviction policy holds the metric: the smallest budget within a tolerance of the full cache.

A budget counts for a prompt only where it evicts something (the policy keeps fewer layer-positions
than the full cache holds, the sweep's kept < cached; sweeps without those columns: the prompt's
context is longer than the budget): a prompt kept whole equals the full cache by construction, so
averaging it in makes a small budget look safe (at budget 8 of a sweep whose prompts are 4 to 13
positions long, most prompts may be kept whole; on a model whose every layer slides over a window of
8, no budget from 7 on evicts anything). Per policy and budget, over the prompts that budget evicts
from (paired with their own full-cache value):

- change: mean(policy - full) / scale over those prompts, scale |mean(full)| or, on a log-probability (given its
  chance, -log V), the span from chance to mean(full) where larger (change_scale, heads' pruning rule: a
  log-probability's 0 is its ceiling, not a scale; review 14b B2); its 95% t interval treats the scale as fixed;
  diff, the mean in the metric's units, and band (tolerance x scale) beside it; per_example_diff: the range of
  policy - full over them, in the metric's own units (review 10b C2: a prompt's own full-cache logit difference
  can lie near or below 0, and a share of it flips sign or runs to -1400%);
- verdict: "holds" where its 95% interval lies inside +-tolerance (chance.inside, the equivalence
  reading), "not shown" where the mean is within the tolerance but its interval reaches beyond it
  (consistent with holding, too few or too varied prompts to show it), "too few" wherever the budget evicts from
  fewer than MIN_EVICTING prompts (no interval: it cannot tell, review 14b B3), "above" / "below" where the
  mean is more than the tolerance off and its interval lies wholly beyond it (chance.clear_of's "band"; two-sided:
  a policy *above* the full cache by more is not "within"), "cannot tell" where the mean is more than the tolerance
  off but its interval reaches into the band (review 14bv B1: [-34.7%, +6.8%] is not "never within"). A mean above
  the full cache by more is reported as above with its interval, which decides the words: "by more than 1%"
  only where the interval's lower bound clears +1%, "higher, but not clearly by more than 1%" where it
  clears only 0, no gain where it reaches 0; chance.clear_of, the rule heads' pruning gain follows too;
- share: the cache kept, kept / cached (layer-positions, so bytes: every layer-position costs the
  same), its median over those prompts; budget / context length where every layer is global (and in
  sweeps without those columns). A sliding-window layer counts with what it holds, so a budget that
  evicts only from the global layers saves only their part;
- correct, full_correct: how many of those prompts the policy and the full cache answer correctly
  (where the sweep has its `correct` column): accuracy beside the metric; lost: those the full cache answers and
  the policy does not, per prompt (review 14b A1: 8/16 against 5/16 lost two of the five), which "answers_from"
  reads; guess_correct (given the
  answers): how many of them a constant guess of the commonest answer over all the task's prompts gets,
  the count a policy's must beat on a task of few answers (review 9a C3: on a yes/no task with 9 of 16
  "yes", 9/16 correct is the guess's).

`holding_budgets` gives per policy the smallest grid budget from which every larger budget that evicts
from MIN_EVICTING prompts or more holds (its interval inside the tolerance; a budget of fewer prompts has no interval
and neither makes nor breaks it, review 18c A2: it is listed in "too_few"), the grid budget just below it (the
crossing lies between the two:
a grid's resolution, not a property of the model) and, for sink_window, the budget below which it keeps
no recent token (n_sink + 1: with n_sink sinks a budget <= n_sink holds sinks only). Whether or not a
policy holds, it also gives each budget's verdict, the budgets "not shown" (where the policy does not
hold from one budget on but its largest evicting budget's mean is within: "consistent_from", the smallest
budget from which every mean is, each over MIN_EVICTING prompts or more: a row of one prompt has no
interval and is never within nor consistent, review 17b A3; else "worst_evicting", that largest row), its
closest result (the evicting budget of smallest |change|) and whether |change| shrinks as the budget grows
(a non-monotone curve: a small budget closer than a larger one).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from headscope.analyses.core.chance import clear_of, inside, t_half_width

TOLERANCE = 0.01
MIN_EVICTING = 2  # fewest prompts a budget must evict from for its result to be a policy's closest or answers' start,
# or a verdict other than "too few" (one prompt has no interval: review 14b B3), or to count for a policy's verdict
FLOOR_SHARE = 0.5  # the rounding allowance makes a verdict only where one step is at most this share of the band


def _interval(diff: np.ndarray, scale: float) -> list[float] | None:
    """95% t interval of mean(diff) / scale (None for n < 2). A NaN in diff makes it NaN, as it makes the
    change beside it (chance.mean_interval would drop the NaN and state an interval about another mean)."""
    if len(diff) < 2:
        return None
    mean, half = float(diff.mean()), t_half_width(float(diff.std(ddof=1)), len(diff))
    return [(mean - half) / scale, (mean + half) / scale]


def change_scale(full_mean: float, chance: float | None = None) -> float:
    """What a budget's change is a share of (review 14b B2, heads' pruning.tolerance_scale): |mean full cache| of the
    prompts compared, or on a log-probability (chance: k log(1/V), its uniform guess) the span from chance to it where
    larger: a log-probability's 0 is its ceiling, not a scale (1% of -1.03 is 0.0103 nats; 1% of the span 0.052)."""
    size = abs(float(full_mean))
    if chance is not None and math.isfinite(chance):
        size = max(size, abs(float(full_mean) - float(chance)))
    return size or 1.0


def budget_changes(sweep: pd.DataFrame, answers: Sequence[int] | None = None,
                   chance: float | None = None) -> pd.DataFrame:
    """One row per (policy, budget) of the sweep (not "full"): n_examples, n_evicting (prompts whose
    context is longer than the budget), change, ci_low, ci_high, per_example_diff_low, per_example_diff_high
    (policy - full in the metric's units), base_ci_low / base_ci_high (the 95% t interval of the full cache's mean over
    the evicting prompts, where change is a share of it), share (median kept / cached, the cache kept) over the
    evicting prompts (NaN where none evicts), and with a `correct` column in the sweep, correct and full_correct
    (counts over the evicting prompts); with answers ([example] answer token ids), guess_correct: those of the
    evicting prompts whose answer is the commonest.

    sweep: eviction_sweep's df with its `context` column (each prompt's context length) and, where present,
    `cached` and `kept` (layer-positions held by the full cache and kept by the policy). chance: a log-probability's
    uniform guess (change_scale: change is then a share of the span from chance); also diff (the mean of policy - full
    in the metric's units) and, with `correct`, lost: the evicting prompts the full cache answers and the policy does
    not (review 14b A1: equal counts can hide answers lost and others gained)."""
    full = sweep[sweep.policy == "full"].set_index("example")
    guess = _guess_hits(answers)  # [example] whether the commonest answer is this prompt's, or None
    counted = {"cached", "kept"} <= set(sweep)
    rows = []
    for (policy, budget), g in sweep[sweep.policy != "full"].groupby(["policy", "budget"], sort=True):
        g = g.set_index("example")
        ctx = full.context.reindex(g.index)
        if counted:
            kept_share = (g.kept / g.cached).to_numpy(dtype=float)  # [example]
            evicting = g.index[kept_share < 1.0]
        else:
            kept_share = budget / ctx.to_numpy(dtype=float)
            evicting = g.index[ctx.to_numpy() > budget]
        kept_share = pd.Series(kept_share, index=g.index)
        row = {"policy": policy, "budget": int(budget), "n_examples": len(g), "n_evicting": len(evicting),
               "change": math.nan, "ci_low": math.nan, "ci_high": math.nan, "per_example_diff_low": math.nan,
               "per_example_diff_high": math.nan, "share": math.nan}
        if "correct" in g:
            mine, theirs = (c.reindex(evicting).astype(bool).to_numpy() for c in (g.correct, full.correct))
            row.update(correct=int(mine.sum()), full_correct=int(theirs.sum()), lost=int((theirs & ~mine).sum()))
            if guess is not None:
                row["guess_correct"] = int(guess.reindex(evicting).sum())
        if len(evicting):
            base = full.metric.reindex(evicting).to_numpy(dtype=float)  # [evicting]
            diff = g.metric.reindex(evicting).to_numpy(dtype=float) - base
            scale = change_scale(float(base.mean()), chance)
            ci = _interval(diff, scale)
            row.update(change=float(diff.mean()) / scale, scale=scale, diff=float(diff.mean()),
                       per_example_diff_low=float(diff.min()),
                       per_example_diff_high=float(diff.max()),
                       share=float(np.median(kept_share.reindex(evicting).to_numpy(dtype=float))))
            if ci is not None:
                row.update(ci_low=ci[0], ci_high=ci[1])
            base_ci = _interval(base, 1.0)  # review 15d B2: the full-cache mean's own interval (is a % of it meaningful?)
            if base_ci is not None and scale == abs(float(base.mean())):  # (not where the scale is the span from chance)
                row.update(base_ci_low=base_ci[0], base_ci_high=base_ci[1])
        rows.append(row)
    return pd.DataFrame(rows)


def _guess_hits(answers: Sequence[int] | None) -> pd.Series | None:
    """[example] True where the prompt's answer is the commonest answer (ties: the smallest token id), or None."""
    if answers is None:
        return None
    ids = pd.Series([int(a) for a in answers])
    counts = ids.value_counts()
    top = min(counts.index[counts == counts.max()])
    return ids == top


def constant_guess(answers: Sequence[int] | None) -> dict[str, int] | None:
    """{"correct": prompts whose answer is the commonest, "n_examples", "n_answers": distinct answers}, or None."""
    hits = _guess_hits(answers)
    if hits is None or not len(hits):
        return None
    return {"correct": int(hits.sum()), "n_examples": len(hits), "n_answers": int(len(set(int(a) for a in answers)))}


def _clean(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def no_effect(table: pd.DataFrame) -> list[dict[str, Any]]:
    """Review 16d B2: per policy whose smallest evicting budget leaves every prompt it evicts from (MIN_EVICTING or
    more) exactly at its full-cache metric, {"policy", "budget", "n_evicting"}; empty where none does. Keeping a few
    positions of a long context and changing no prompt's metric by one bit is what a mask that never reached the
    model gives (TransformerLens discarding the edit, hooks/edits.py), not a finding: the words say so instead."""
    out = []
    for policy, rows in table.groupby("policy", sort=False):
        rows = rows[rows.n_evicting >= MIN_EVICTING].sort_values("budget")
        if len(rows) and rows.per_example_diff_low.iloc[0] == 0.0 and rows.per_example_diff_high.iloc[0] == 0.0:
            out.append({"policy": str(policy), "budget": int(rows.budget.iloc[0]), "n_evicting": int(rows.n_evicting.iloc[0])})
    return out


def _verdict(row: dict[str, Any], tolerance: float, floor: float = 0.0) -> str:
    """"holds" (95% interval inside +-tolerance), "not shown" (mean within, interval not), "above", "below" (the
    interval wholly beyond +-tolerance: chance.clear_of's "band"), "cannot tell" (mean beyond, interval reaching into
    the band: review 14bv B1, [-34.7%, +6.8%] is no evidence of "never within"), "too few" (fewer than MIN_EVICTING
    prompts evicted: no interval, review 14b B3; such a row neither makes nor breaks a policy's verdict, review 18c A2).
    floor: one rounding step of the metric in its own units (0: none). An interval whose end passes the band by no
    more than that holds where the step is small against the band (at most FLOOR_SHARE of it: the miss is the metric's
    rounding, review 12b A7); the row gets `rounding_miss` (the miss in the metric's units) and `rounding_floor`.
    Where the step is larger (review 18b B1: 0.066 logits against a band of 0.022; in bfloat16 one step is 0.78% of
    the value, so at a 1% band it always is), rounding cannot make the verdict: "not shown", the row marked
    `rounding_coarse` (the step) with its `rounding_miss`: cannot tell at this precision."""
    change = row["change"]
    if change is None:
        return "no value"
    if (row.get("n_evicting") or 0) < MIN_EVICTING:  # review 14b B3: one prompt, no interval: cannot tell either way
        return "too few"
    if abs(change) > tolerance:  # review 14bv B1: outside only where the 95% interval clears the band (clear_of)
        if clear_of(row.get("ci_low"), row.get("ci_high"), tolerance) == "band":
            return "above" if change > 0 else "below"
        return "cannot tell"
    if inside(row["ci_low"], row["ci_high"], tolerance):
        return "holds"
    lo, hi, scale = row.get("ci_low"), row.get("ci_high"), row.get("scale")
    if floor > 0 and lo is not None and hi is not None and scale is not None and math.isfinite(lo) and math.isfinite(hi):
        miss = max(hi - tolerance, -tolerance - lo, 0.0) * scale  # how far the interval passes the band, in units
        if miss <= floor and floor <= FLOOR_SHARE * tolerance * scale:
            row.update(rounding_miss=miss, rounding_floor=floor)
            return "holds"
        if miss <= floor:  # review 18b B1: an allowance as large as the band would make the verdict, not the data
            row.update(rounding_miss=miss, rounding_coarse=floor)
    return "not shown"


def holding_budgets(sweep: pd.DataFrame, *, n_sink: int, tolerance: float = TOLERANCE,
                    answers: Sequence[int] | None = None, floor: float = 0.0,
                    chance: float | None = None) -> dict[str, Any]:
    """{"tolerance", "grid", "n_examples", "whole_from" (the smallest grid budget no prompt evicts from,
    or None), "policies": {policy: {"budget" (smallest holding budget or None), "below" (the grid budget
    just under it that evicts, or None), "at" (its budget_changes row), "above" (rows whose mean is more
    than the tolerance above the full cache, each with `clear_of`, what its 95% interval clears:
    chance.clear_of, "band" only where its lower bound is above +tolerance), "worst_evicting" (the largest
    evicting budget's row, when its mean is off by more than the tolerance there or it rests on fewer than
    MIN_EVICTING prompts; "never within" only where every_evicting_missed), "verdicts" ({budget: "holds" |
    "not shown" | "above" | "below" | "cannot tell" | "no value"}), "not_shown" (the rows whose mean is within
    but whose interval is not), "cannot_tell" (the rows whose mean is off but whose interval reaches into the
    band), "missed" / "every_evicting_missed" (the budgets whose interval lies wholly outside the band, and whether
    every evicting budget's does; "missed_rows" their rows),
    "rounding_held" (the rows that hold only by the rounding floor), "rounding_coarse" (the rows "not shown" whose
    interval passes the band by less than a floor too large against the band to decide: cannot tell at this
    precision, review 18b B1), "too_few" (the rows of fewer than MIN_EVICTING prompts, which every verdict above
    leaves out: review 18c A2),
    "consistent_from" (when it does not hold but its means are within from a budget on, each over
    MIN_EVICTING prompts or more: that budget), "sinks_only_below" (sink_window: n_sink + 1)}}, "no_effect"
    (no_effect's rows, where any), and with answers ([example] token ids) its
    rows' guess_correct and "constant_guess" (constant_guess: the commonest answer's count and the distinct answers)}.
    floor: the metric's rounding step in its units (_verdict: an interval past the band by no more holds); with
    one, "rounding_floor". chance (a log-probability's uniform guess): each row's change and band are shares of the span
    from chance (change_scale); recorded with "basis" ("span" or "full") and every row's "band" (tolerance x its scale,
    in the metric's units). See the module doc."""
    table = budget_changes(sweep, answers, chance)
    full = sweep[sweep.policy == "full"].metric.to_numpy(dtype=float)  # [example]
    grid = sorted(int(b) for b in table.budget.unique()) if len(table) else []
    evicts = table.groupby("budget").n_evicting.max() if len(table) else pd.Series(dtype=int)
    whole = [b for b in grid if evicts.get(b, 0) == 0]
    out: dict[str, Any] = {"tolerance": tolerance, "grid": grid,
                           "n_examples": int(table.n_examples.max()) if len(table) else 0,
                           "whole_from": whole[0] if whole else None, "policies": {},
                           "chance": chance, "basis": "span" if chance is not None and len(full) and
                           change_scale(float(full.mean()), chance) > abs(float(full.mean())) else "full"}
    if len(full):  # the section's band in the metric's units at the full cache's mean over every prompt
        out["band"] = tolerance * change_scale(float(full.mean()), chance)
    if floor > 0:
        out["rounding_floor"] = floor
    if (guess := constant_guess(answers)) is not None:
        out["constant_guess"] = guess
    if dead := no_effect(table):
        out["no_effect"] = dead
    for policy, rows in table.groupby("policy", sort=False):
        rows = rows[rows.n_evicting > 0].sort_values("budget")
        records = [{k: _clean(v) for k, v in r.items()} for r in rows.to_dict("records")]
        for r in records:
            r["verdict"] = _verdict(r, tolerance, floor)
            if r.get("scale") is not None:
                r["band"] = tolerance * r["scale"]
        # review 18c A2: a row of fewer than MIN_EVICTING prompts (no interval) neither makes nor breaks the verdict
        # (budget 32 evicting from one prompt made "holds from 16" "not shown"; review 17b A3: nor "consistent"): the
        # verdict reads the counted rows, the others are listed apart ("too_few") and said as too few to tell
        counted = [r for r in records if r["n_evicting"] >= MIN_EVICTING]
        within = np.array([r["verdict"] == "holds" for r in counted], dtype=bool)
        mean_within = np.array([r["verdict"] in ("holds", "not shown") for r in counted], dtype=bool)
        entry: dict[str, Any] = {"budget": None, "below": None, "at": None, "worst_evicting": None,
                                 "above": [{**r, "clear_of": clear_of(r["ci_low"], r["ci_high"], tolerance)}
                                           for r in records if r["change"] > tolerance
                                           and r["verdict"] in ("above", "cannot tell")]}
        # the smallest index from which every larger evicting budget holds
        first = next((i for i in range(len(within)) if within[i:].all()), None)
        if first is not None:
            entry.update(budget=counted[first]["budget"], at=counted[first],
                         below=counted[first - 1]["budget"] if first > 0 else None)
        elif counted and mean_within[-1]:  # within on average from a budget on, never shown by the interval
            start = next(i for i in range(len(counted)) if mean_within[i:].all())
            entry["consistent_from"] = counted[start]["budget"]
        elif counted:  # the largest counted budget's mean off the band
            entry["worst_evicting"] = counted[-1]
        elif records:  # only budgets of too few prompts: the largest of them, with no interval
            entry["worst_evicting"] = records[-1]
        entry["too_few"] = [r for r in records if r["verdict"] == "too few"]
        entry["verdicts"] = {str(r["budget"]): r["verdict"] for r in records}
        entry["not_shown"] = [r for r in records if r["verdict"] == "not shown"]
        entry["cannot_tell"] = [r for r in records if r["verdict"] == "cannot tell"]  # mean off, interval in the band
        entry["rounding_held"] = [r for r in records if r.get("rounding_floor") is not None]  # holds by _verdict's floor
        entry["rounding_coarse"] = [r for r in records if r.get("rounding_coarse") is not None]  # review 18b B1
        sizes = [abs(r["change"]) for r in records if r["change"] is not None]
        if sizes:  # closest among budgets that evict from MIN_EVICTING prompts or more where any do (review 10a A4:
            # "keeps 99.8% ... from budget 64" rested on the one prompt long enough to be evicted there)
            sized = [r for r in records if r["change"] is not None]
            entry["closest"] = min([r for r in sized if r["n_evicting"] >= MIN_EVICTING] or sized,
                                   key=lambda r: abs(r["change"]))
            out_of = [r for r in records if r["verdict"] in ("above", "below")]  # (a 1-prompt budget: cannot tell)
            entry["missed"] = [r["budget"] for r in out_of]  # the evicting budgets whose interval clears the band
            entry["every_evicting_missed"] = bool(counted) and len(out_of) == len(counted)
            if out_of:
                entry["misses"] = [min(abs(r["change"]) for r in out_of), max(abs(r["change"]) for r in out_of)]
                # review 15d B2: the same in the metric's units (a share of a small, uncertain mean reads too precise)
                entry["misses_diff"] = [min(abs(r["diff"]) for r in out_of), max(abs(r["diff"]) for r in out_of)]
                entry["missed_rows"] = out_of  # review 15d B2: each fall with its n and interval
            steady = [abs(r["change"]) for r in counted if r["change"] is not None]  # (a 1-prompt row says nothing)
            entry["monotone"] = all(b <= a + 1e-12 for a, b in zip(steady, steady[1:]))
        kept = [r.get("lost") == 0 for r in counted]  # review 14b A1: per prompt, not the counts
        if kept and "correct" in rows:  # the smallest budget from which every evicting budget loses no answer
            entry["answers_from"] = next((counted[i]["budget"] for i in range(len(kept)) if all(kept[i:])), None)
        if policy == "sink_window":
            entry["sinks_only_below"] = n_sink + 1
        out["policies"][str(policy)] = entry
    return out
