"""Pruning for `headscope compare` (reports/compare.py's pruning section): the prunable fractions led by the ordering
each report's heads finding leads with (`lead_ordering`), judged against recorded intervals; not compared where the
runs ranked heads on other examples (`examples_differ`), of different models or on different tasks; counts on the
tolerance line flagged alike for A and B (`on_the_line`), random orders seed by seed (under MIN_SEEDS not compared).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from headscope.reports.compare_heads import metric_se
from headscope.reports.compare_notes import n_words
from headscope.reports.compare_prunable import (
    TIE_BROKEN,
    interval_heads,
    point_heads_words,
    precision_words,
    verdict_words,
)
from headscope.reports.compare_run import (
    NO_INTERVAL,
    NOT_COMPARED,
    OVERLAY_TITLE,
    SAME,
    SIDES,
    Run,
    _analysis_settings,
    _img,
    _number,
    _overlay,
    chance_refusal,
    models_differ,
    noise_verdict,
    task_identity,
    tasks_differ,
)
from headscope.reports.findings import and_join
from headscope.reports.pruning_words import line_name
from headscope.reports.render import escape

PRUNABLE = "max_fraction_prunable_"


def _pruning_curves(run: Run) -> pd.DataFrame | None:
    c = run.table("heads", "curve")
    if c is None or not {"ordering", "recompute", "fraction_pruned", "metric"} <= set(c.columns):
        return None
    return c.assign(order=c["ordering"] + np.where(c["recompute"].astype(str) == "True", " (recomputed)", ""))


def pruning_section(a: Run, b: Run) -> tuple[str, list[str]]:
    """Both runs' pruning curves on one axis, and the prunable fractions compared ordering by ordering, the one
    each heads finding leads with first (pruning_notes); no overlay where either run is at chance."""
    curves = [_pruning_curves(r) for r in (a, b)]
    if all(c is None for c in curves):
        return "", []
    refused = chance_refusal(a, b, "heads")
    if refused:  # its report says the curves measure noise: the two reports' own figures are in the figures section
        return ("<p><em>no overlay: pruning curves " + escape(refused) + "; each report's own pruning_curve figure is "
                "below, side by side.</em></p>", [NOT_COMPARED + f"Prunable within 1%: {refused}."])
    fig = _overlay(curves, "order", "fraction_pruned", "metric", "fraction of heads pruned",
                   "task metric (random: mean over seeds)", f"pruning curves: {OVERLAY_TITLE}")
    _pale_rounding(fig.axes[0], a, b)
    return _img(fig, f"pruning curves of A and B on shared axes, {OVERLAY_TITLE}"), pruning_notes(a, b)


def rounding_orderings(s: Mapping[str, Any]) -> set[str]:
    """The orderings of a heads summary whose importance is rounding (degenerate_<method>): "gradient", and
    "ablation" where its ablation method's is."""
    degenerate = {k.removeprefix("degenerate_") for k in s if k.startswith("degenerate_") and s[k]}
    return {"gradient"} & degenerate | ({"ablation"} if degenerate & {"zero", "mean", "resample"} else set())


# the overlay's legend for a pale ordering (rounding_orderings): plots_heads.pale_line's words, broken in two lines
PALE_LABELS = {"gradient": "predicted loss changes under\nthe floor (pale)", "ablation": "rounding, not\na measurement (pale)"}


def _pale_rounding(ax: Any, a: Run, b: Run) -> None:
    """A side's curves of an ordering its report calls rounding (rounding_orderings), drawn pale (MUTE towards white)
    and labelled so in the legend (review 15c C2: B's gradient curve drawn as a measurement)."""
    from matplotlib.colors import to_rgba

    from headscope.reports.plots import MUTE

    pale = {f"{side}: {o}" for side, r in zip(SIDES, (a, b)) for o in rounding_orderings(r.summary("heads") or {})}
    changed = False
    for line in ax.get_lines():
        label = str(line.get_label())
        if label.split(" (recomputed)")[0] in pale:
            r, g, b_, alpha = to_rgba(line.get_color())
            line.set_color((r * (1 - MUTE) + MUTE, g * (1 - MUTE) + MUTE, b_ * (1 - MUTE) + MUTE, alpha))
            line.set_markerfacecolor(line.get_color())
            line.set_markeredgecolor(line.get_color())
            line.set_label(f"{label}: {PALE_LABELS[label.split(' (recomputed)')[0].split(': ', 1)[1]]}")
            changed = True
    if changed:
        ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1))


def lead_ordering(s: Mapping[str, Any]) -> tuple[str | None, dict[str, float]]:
    """The ordering the heads finding leads with (the most heads prunable within 1%, orderings whose importance is
    rounding left out, as reports/plots_heads.py's finding does) and {ordering: fraction prunable}."""
    noisy = rounding_orderings(s)
    prunable = {k.removeprefix(PRUNABLE): float(v) for k, v in s.items() if k.startswith(PRUNABLE) and _number(v)
                and k.removeprefix(PRUNABLE).removesuffix("_recompute") not in noisy}
    return (max(prunable, key=lambda k: prunable[k]) if prunable else None), prunable


def prunable_interval(s: Mapping[str, Any], ordering: str) -> tuple[float, float] | None:
    """The interval the heads finding prints for the fraction prunable by `ordering` (reports/plots_heads.py
    `_interval`): heads' prunable_ci_<ordering>, its bootstrap interval in heads, as fractions of n_heads; None
    where the summary has none (no other key is read: compare judges only what the finding states)."""
    n, bounds = s.get("n_heads"), interval_heads(s, ordering)  # heads' bootstrap interval, in heads
    if isinstance(n, int) and n > 0 and bounds is not None:
        return bounds[0] / n, bounds[1] / n
    return None


EDGE = 0.25  # without per-example values: a point closer to the 1% line than this share of the band sits on it


def examples_differ(a: Run, b: Run) -> str:
    """Why A's and B's heads analyses did not rank heads on the same examples ("" when they did, as far as their
    records tell: one task and task file (not the wording of its source), example count, file rows and sample
    prompt, and, where no rows are recorded (a generated task), one seed and model). Each run orders the heads on
    its own examples, so where those differ the prunable counts also differ by re-ranking, which their bootstrap
    intervals do not cover."""
    pa, pb = a.provenance("heads") or {}, b.provenance("heads") or {}
    sa, sb = (pa.get("sample") or {}).get("prompt"), (pb.get("sample") or {}).get("prompt")
    rows = [p.get("rows") if isinstance(p.get("rows"), list) else None for p in (pa, pb)]
    files = [(task_identity(p) or (None, None))[1] for p in (pa, pb)]  # the source's wording of why is no difference
    checks = [("task", pa.get("task"), pb.get("task")), ("task file", *files),
              ("examples", pa.get("n_examples"), pb.get("n_examples"))]
    if rows[0] is None or rows[1] is None:  # a generated task: its seed (and model's tokenizer) draws the examples
        checks.append(("seed", a.manifest.get("seed"), b.manifest.get("seed")))
        if sa is None or sb is None:
            checks.append(("model", *[(r.manifest.get("model") or {}).get("name") for r in (a, b)]))
    diffs = [f"{what} {x} vs {y}" for what, x, y in checks if x != y]
    if rows[0] is not None and rows[1] is not None and rows[0] != rows[1] and pa.get("n_examples") == pb.get("n_examples"):
        diffs.append("other file rows")
    if sa is None or sb is None:
        diffs += [] if diffs else ["no sample prompt recorded to tell whether they are the same"]
    elif sa != sb:
        diffs.append("their sample prompts differ")
    return ", ".join(diffs)


def _deciding_point(run: Run, ordering: str) -> dict[str, Any] | None:
    """The point of `run`'s curve for a fixed `ordering` nearest its tolerance line (pruning.line_record): from
    the summary's prunable_ci_<ordering>, else computed from curve_examples.csv (older runs, and records from
    before review 10b A3 that judged the line by the level's standard error: no change_low); None without
    per-example values."""
    ci = (run.summary("heads") or {}).get(f"prunable_ci_{ordering}")
    if isinstance(ci, Mapping) and isinstance(ci.get("line"), Mapping) and "change_low" in ci["line"]:
        return dict(ci["line"]) or None
    examples = run.table("heads", "curve_examples")
    if examples is None or not {"ordering", "recompute", "seed", "n_pruned", "example", "metric"} <= set(examples.columns):
        return None
    from headscope.analyses.heads.pruning import line_record

    order, recompute = ordering.removesuffix("_recompute"), ordering.endswith("_recompute")
    rows = examples[(examples["ordering"] == order) & ((examples["recompute"].astype(str) == "True") == recompute)]
    if rows.empty or rows["seed"].nunique() != 1:
        return None
    wide = rows.pivot(index="n_pruned", columns="example", values="metric").sort_index()  # [points, n]
    return line_record(wide.to_numpy(dtype=float), wide.index.to_numpy(), *run_tolerance(run)) or None


def run_tolerance(run: Run) -> tuple[float, float | None]:
    """(the tolerance share, the chance value its band is measured from or None) of `run`'s heads counts: the
    summary's pruning_tolerance (pruning.tolerance_record: a log-probability's band is a share of the span from
    chance), else its settings' tolerance against |unpruned| (older runs)."""
    rec = (run.summary("heads") or {}).get("pruning_tolerance")
    if isinstance(rec, Mapping) and _number(rec.get("tolerance")):
        return float(rec["tolerance"]), (float(rec["chance"]) if _number(rec.get("chance")) else None)
    return float((_analysis_settings(run, "heads").get("pruning") or {}).get("tolerance") or 0.01), None


def held_count(run: Run, ordering: str) -> Any:
    """The count of heads where `run`'s bootstrap interval for `ordering` is that single value (reports/pruning_words.py
    then says "close to the 1% line", not fragile: the count held in most resamples), else None."""
    bounds = interval_heads(run.summary("heads") or {}, ordering)
    if bounds is None or bounds[0] != bounds[1]:
        return None
    return int(bounds[0]) if bounds[0].is_integer() else bounds[0]


def on_the_line(run: Run, ordering: str, fraction: float) -> str:
    """Where `run`'s fraction prunable by `ordering` turns on a hair: a point that decides it (a point kept, or the
    first point past the line) has a paired 95% interval of its change from unpruned that reaches the line
    (pruning.line_record; the line moves with the examples, so only the paired change counts), so another sample
    of examples could move the fraction a step; judged alike for A and B. Without per-example values: within EDGE
    of the tolerance band (a quarter of 1% of the unpruned metric), the run's standard error of its mean metric
    said for scale.
    "" otherwise, for random orderings (their seeds are stated instead) or where the curve is not recorded."""
    if ordering.startswith("random"):
        return ""
    point = _deciding_point(run, ordering)
    if point is not None:
        change, low, high = (point.get(k) for k in ("change", "change_low", "change_high"))
        if point.get("on_the_line") is not True or not all(map(_number, (change, low, high))):
            return ""
        where = "past" if point.get("past") else "inside"
        offset = float(point["line"]) - float(point["metric"]) + float(change)  # the line less the unpruned metric
        held = held_count(run, ordering)
        verdict = ("the count is fragile: another sample of examples could move it" if held is None else
                   f"its 95% bootstrap interval is the single value {_heads(held)}, so the count held in most "
                   "resamples of the examples, though this point's interval does not rule out a move")
        named = line_name(run.summary("heads") or {})
        return (f"{100 * fraction:.0f}% sits {'close to' if held is not None else 'on'} its {named}: the point at "
                f"{_heads(point.get('n_pruned'))} removed is {float(point['metric']):.4g}, {where} the line "
                f"{float(point['line']):.4g}; its change from unpruned {float(change):+.3g} has a paired 95% CI of "
                f"{float(low):+.3g} to {float(high):+.3g}, reaching the line's {offset:+.3g}: {verdict}")
    curve = _pruning_curves(run)
    if curve is None:
        return ""
    order, recompute = ordering.removesuffix("_recompute"), ordering.endswith("_recompute")
    rows = curve[(curve["ordering"] == order) & ((curve["recompute"].astype(str) == "True") == recompute)]
    means = rows.groupby("fraction_pruned")["metric"].mean()  # random: mean over seeds
    start = np.isclose(means.index.to_numpy(dtype=float), 0.0)
    if means.empty or not start.any():
        return ""
    base = float(means[start].iloc[0])
    from headscope.analyses.heads.pruning import tolerance_band

    tolerance, chance = run_tolerance(run)
    band = tolerance_band(base, tolerance, chance)
    line = base - band
    kept, past = means[means.index <= fraction + 1e-9], means[means.index > fraction + 1e-9]
    points = [("the last point kept", float(kept.iloc[-1]))] if not kept.empty else []
    points += [("the first point past it", float(past.iloc[0]))] if not past.empty else []
    close = [(what, m) for what, m in points if abs(m - line) < EDGE * band]
    if not close or band == 0:
        return ""
    what, m = close[0]
    se = metric_se(run)
    scale = f"; the standard error of its mean metric is {se:.2g}" if se is not None else ""
    return (f"{100 * fraction:.0f}% sits on its {line_name(run.summary('heads') or {})}: {what} is {m:.4g} against the line "
            f"{line:.4g}, " + (f"{100 * abs(m - line) / abs(base):.2g}% of the unpruned metric" if chance is None
                                else f"{abs(m - line):.2g} nats") + f" away{scale}")


def seed_counts(run: Run, ordering: str) -> list[float] | None:
    """Each random order's own count of heads prunable (prunable_ci_<ordering>'s per_seed_heads, else from
    curve.csv seed by seed with max_prunable_fraction's rule); None where neither is recorded."""
    s = run.summary("heads") or {}
    ci = s.get(f"prunable_ci_{ordering}")
    per = ci.get("per_seed_heads") if isinstance(ci, Mapping) else None
    if isinstance(per, list) and per and all(_number(x) for x in per):
        return [float(x) for x in per]
    curve, n = run.table("heads", "curve"), s.get("n_heads")
    if curve is None or not isinstance(n, int) or not {"ordering", "seed", "fraction_pruned", "metric"} <= set(curve.columns):
        return None
    from headscope.analyses.heads.pruning import max_prunable_fraction

    rows = curve[curve["ordering"] == ordering.removesuffix("_recompute")]
    tolerance, chance = run_tolerance(run)
    counts = []
    for _, g in rows.groupby("seed"):
        g = g.sort_values("fraction_pruned")
        counts.append(round(max_prunable_fraction(g, float(g["metric"].iloc[0]), tolerance, chance) * n, 3))
    return counts or None


def _seed_text(counts: list[float] | None) -> str:
    if not counts:
        return "per-seed counts not recorded"
    each = [f"{c:g}" for c in counts]  # review 8b C4: "1 and 0 heads", not "per seed 1, 0 heads, range 0-1"
    listed = and_join(each)
    span = f", range {min(counts):g}-{max(counts):g}" if len(counts) > 2 and min(counts) != max(counts) else ""
    return f"{listed} heads{span} over {len(counts)} seed{'s' if len(counts) != 1 else ''}"


MIN_SEEDS = 5  # random orders per run below which their counts' spread is no band


def _random_note(a: Run, b: Run, ordering: str, shown: list[str]) -> str:
    """A random ordering's counts seed by seed and whether their ranges overlap: no noise verdict (a bootstrap of
    the mean over seeds leaves out the seed spread, and a few seeds give no band)."""
    counts = [seed_counts(r, ordering) for r in (a, b)]
    text = (f"Prunable within 1% by {ordering.replace('_', ' ')} (mean over random orders): A {shown[0]} "
            f"({_seed_text(counts[0])}), B {shown[1]} ({_seed_text(counts[1])})")
    if all(counts):
        overlap = max(min(counts[0]), min(counts[1])) <= min(max(counts[0]), max(counts[1]))
        if min(len(c) for c in counts) < MIN_SEEDS:  # review 14a C5: 1-2 seeds are no spread: not compared
            return NOT_COMPARED + text + (f": not compared: too few seeds for a noise verdict (fewer than {MIN_SEEDS} "
                                          f"in {'both runs' if max(len(c) for c in counts) < MIN_SEEDS else 'a run'}; "
                                          f"the seed ranges {'overlap' if overlap else 'do not overlap'}).")
        if overlap:
            return SAME + text + "; within the seeds' spread: the seed ranges overlap."
        return text + "; beyond the seeds' spread: the seed ranges do not overlap."
    return NOT_COMPARED + text + ": not compared: no noise verdict without each seed's count."


def within_words(sums: list[Mapping[str, Any]]) -> str:
    """How far below unpruned the two runs' counts allow: "1%", or where a run's band is a share of the span from
    chance (a log-probability: pruning.tolerance_record), that share and each run's band in the metric's units."""
    recs = [s.get("pruning_tolerance") if isinstance(s.get("pruning_tolerance"), Mapping) else {} for s in sums]
    share = next((float(r["tolerance"]) for r in recs if _number(r.get("tolerance"))), 0.01)
    if not any(r.get("basis") == "span" for r in recs):
        return f"{100 * share:g}%"
    bands = [f"{side} {float(r['band']):.3g} nats" if r.get("basis") == "span" and _number(r.get("band")) else
             f"{side} {100 * share:g}% of |unpruned|" for side, r in zip(SIDES, recs)]
    return f"{100 * share:g}% of the span from chance ({', '.join(bands)} below unpruned)"


def pruning_notes(a: Run, b: Run) -> list[str]:
    """The fractions prunable within 1%, ordering by ordering: first the one each run's heads finding leads with
    (lead_ordering), said even when equal, then the others that differ by 5 points or more; each with the
    recorded intervals' verdict ("no interval recorded" without them) and where a fraction sits on its 1% line.
    Where the runs are of different models (models_differ), ran heads on different tasks (tasks_differ) or on
    different examples of one task (examples_differ), the fixed orderings' counts are not compared (NOT_COMPARED:
    re-ranking is outside the intervals), with each reason that holds; random orderings get each seed's count and
    no verdict, and are not compared across tasks. Where the findings' verdicts on a count differ (an interval
    reaching 0 heads on one side only, or one count on its 1% line), that is said (compare_prunable.verdict_words),
    and equal counts are then no agreement. One model at two precisions whose counts differ: the point that splits
    them against the lower precision's rounding (compare_prunable.precision_words), said a rounding difference
    instead of a noise verdict where it lies within it."""
    sums = [a.summary("heads") or {}, b.summary("heads") or {}]
    (lead_a, pa), (lead_b, pb) = lead_ordering(sums[0]), lead_ordering(sums[1])
    notes = []
    if lead_a and lead_b and lead_a != lead_b:
        notes.append(f"The heads findings lead with different orderings: A {lead_a.replace('_', ' ')} "
                     f"({100 * pa[lead_a]:.0f}%), B {lead_b.replace('_', ' ')} ({100 * pb[lead_b]:.0f}%).")
    leads = [o for o in dict.fromkeys([lead_a, lead_b]) if o]
    other_task = tasks_differ(a, b, "heads")
    model = models_differ(a, b)
    examples = "" if other_task else examples_differ(a, b)  # another task: its examples differ by that
    ranked = "the runs ranked heads on different examples"
    reranked = (f"{model}, each ranking its own heads, and {ranked} ({examples}): the intervals do not cover re-ranking"
                if model and examples else f"{model}, each ranking its own heads, and the intervals do not cover re-ranking"
                if model else f"{ranked}, and the intervals do not cover re-ranking ({examples})" if examples else "")
    differ = "; ".join(x for x in (other_task, reranked) if x)
    for ordering in [*leads, *sorted(k for k in pa if k in pb and k not in leads)]:
        if ordering not in pa or ordering not in pb:
            continue
        fa, fb = pa[ordering], pb[ordering]
        lead = ordering in leads
        if not lead and abs(fa - fb) < 0.05:
            continue
        counts = [s.get(f"heads_prunable_{ordering}") for s in sums]
        shown = [f"{100 * f:.0f}%" + (f" ({c:.0f} of {s.get('n_heads')} heads)" if _number(c) and s.get("n_heads") else "")
                 for f, c, s in zip((fa, fb), counts, sums)]
        whose = "both heads findings lead" if lead_a == lead_b else f"{'A' if ordering == lead_a else 'B'}'s heads finding leads"
        which = f" (the ordering {whose} with)"
        if ordering.startswith("random"):  # a mean over seeds is no count of heads: the seeds' own counts instead
            note = _random_note(a, b, ordering, [f"{100 * f:.0f}%" for f in (fa, fb)])
            base = note.removeprefix(SAME).removeprefix(NOT_COMPARED).split(": not compared:")[0].split(
                "; within the seeds'")[0].split("; beyond the seeds'")[0].removesuffix(".")
            notes.append(NOT_COMPARED + base + f": not compared: {other_task}." if other_task else
                         SAME + base + ": the same mean at the shown precision." if fa == fb else
                         note)  # random orders re-rank nothing: only another task refuses
            continue
        text = (f"Prunable within {within_words(sums)} by {ordering.replace('_', ' ')}{which if lead else ''}: "
                f"A {shown[0]}, B {shown[1]}"
                + (f" ({n_words(*sums)})" if sums[0].get("n_examples") != sums[1].get("n_examples") else ""))
        intervals = [prunable_interval(s, ordering) for s in sums]
        lines = [on_the_line(run, ordering, f) for run, f in zip((a, b), (fa, fb))]
        fragile = tuple(bool(line) and held_count(run, ordering) is None for line, run in zip(lines, (a, b)))
        fragile = fragile if fa == fb else (False, False)  # else said by the lines below
        verdicts = "" if differ else verdict_words(a, b, ordering, (fa, fb), fragile)
        quiet = False  # review 19e C2: counts apart within noise or by a rounding tie are no difference
        if differ:
            text = NOT_COMPARED + text + f": not compared: {differ}."
        elif fa == fb:  # one count, but the findings' verdicts on it can differ (review 8b A4)
            text = text + f": the same count, but {verdicts}." if verdicts else SAME + text + "."
        else:
            rounding, within = precision_words(a, b, ordering, counts)
            if within:  # one model at two precisions, the counts split by rounding: no verdict about the model
                text += f": {rounding}."
            elif all(intervals):
                text += noise_verdict(fa, fb, *intervals)
            else:
                side = "A" if intervals[0] is None else "B"
                text += NO_INTERVAL if not any(intervals) else (f" (no interval recorded for {side}: whether this is "
                                                                "beyond noise is not known).")
            if not within:
                text += f" The {verdicts.removeprefix('the ')}." if verdicts else ""
                text += f" {rounding[0].upper()}{rounding[1:]}." if rounding else ""
            quiet = within is True or (within is None and ("(within noise" in text or TIE_BROKEN in rounding))
        edges = [f"{side}'s {edge}" for side, edge in zip(SIDES, lines) if edge]
        points = [(_deciding_point(r, ordering) or {}).get("n_pruned") if line else None for r, line in zip((a, b), lines)]
        apart = point_heads_words(a, b, ordering, int(points[0])) if \
            points[0] is not None and points[0] == points[1] and _number(points[0]) else ""
        edges += [f"{apart[0].upper()}{apart[1:]}"] if apart else []  # review 18b C2: one n, two sets of heads
        tail = "" if not edges else " " + "; ".join(edges[:len(edges) - bool(apart)]) + "." + (f" {edges[-1]}." if apart else "")
        notes.append((SAME if quiet else "") + text + tail)
    return notes


def _heads(k: Any) -> str:
    return f"{k} head" if k == 1 else f"{k} heads"
