"""The pruning verdict of the `heads` finding in words (reports/heads_words.py's `finding` hands it the
prunable fractions): the prunable heads of each ordering with their bootstrap intervals, the tolerance they are
counted against (1% of unpruned, or a share of the span from chance on a log-probability), the counts that sit on
their tolerance line, random orderings seed by seed, and what the first crossing leaves out of a curve: gains
beyond the band worded by what their interval clears (chance.clear_of), curves back within it. compare reads
`heads_span` and `line_name` here.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from headscope.analyses.core.chance import clear_of
from headscope.reports.findings import _num, _pct, and_join, ci_pair


def span_tolerance(s: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The summary's pruning_tolerance where it is a share of the span from chance (pruning.tolerance_record:
    a log-probability's zero is its ceiling, so 1% of unpruned says nothing; review 11b A6), else None."""
    tol = s.get("pruning_tolerance")
    if isinstance(tol, Mapping) and tol.get("basis") == "span" and all(
            _num(tol.get(k)) is not None for k in ("band", "chance", "unpruned", "tolerance")):
        return tol
    return None


def band_words(s: Mapping[str, Any], full: bool = False) -> str:
    """How far below unpruned a count's points may fall: "1% below unpruned", or on a log-probability "0.108 nats
    below unpruned"; full=True adds what that is, in numbers a reader can recompute: the share of the span from
    chance to unpruned, the span, and chance as k log(1/V) with the vocabulary size V and the answers' k tokens
    (pruning.tolerance_record's vocab and answer_tokens; an older summary without them names the formula only)."""
    tol = span_tolerance(s)
    if tol is None:
        share = _num((s.get("pruning_tolerance") or {}).get("tolerance")) if isinstance(
            s.get("pruning_tolerance"), Mapping) else None
        return f"{100 * (share or 0.01):g}% below unpruned"
    said = f"{tol['band']:.3g} nats below unpruned"
    if full:
        share, chance, unpruned = 100 * tol["tolerance"], tol["chance"], tol["unpruned"]
        vocab, k = _num(tol.get("vocab")), _num(tol.get("answer_tokens"))
        if vocab is not None and k is not None:
            tokens = "1 answer token" if k == 1 else f"{k:.3g} answer tokens on average"
            what = (f"chance is a uniform guess over the vocabulary's V = {int(vocab):,} tokens, k log(1/V) = "
                    f"{k:.3g} x log(1/{int(vocab):,}) = {chance:.4g} nats for k = {tokens}")
        else:
            what = (f"chance, {chance:.4g} nats, is a uniform guess over the vocabulary, k log(1/V) for V tokens and "
                    "the answer's k tokens")
        said += (f" ({share:g}% of the span from chance to unpruned, {unpruned:.4g} - ({chance:.4g}) = "
                 f"{abs(unpruned - chance):.4g} nats, where {what}: a log-probability's 0 is its ceiling, not a scale)")
    return said


def line_name(s: Mapping[str, Any]) -> str:
    """The count's tolerance line by name: "1% line", or "0.153-nat line" on the span from chance."""
    tol = span_tolerance(s)
    return "1% line" if tol is None else f"{tol['band']:.3g}-nat line"


def _rel(s: Mapping[str, Any], x: float) -> str:
    """A change as a share of the tolerance's scale: "+1.3%", or "+1.3% of the span" (curve_shapes' change_rel)."""
    return _signed_pct(x) + (" of the span from chance" if span_tolerance(s) else "")


def _interval(s: Mapping[str, Any], key: str) -> tuple[float, float, Any] | None:
    """(low, high, n_examples) of prunable_ci_<key> (pruning.prunable_intervals), None when absent and for
    random orderings (a bootstrap of their mean over seeds leaves out the seed spread: _seed_words)."""
    ci = s.get(f"prunable_ci_{key}")
    bounds = ci.get("interval_heads") if isinstance(ci, Mapping) and not key.startswith("random") else None
    if (pair := ci_pair(bounds)) is None:
        return None
    return *pair, ci.get("n_examples")


def _line_words(s: Mapping[str, Any], key: str) -> str:
    """'' or, when the count of ordering `key` sits on its tolerance line (prunable_ci_<key>'s `line`,
    pruning.line_record: the paired 95% interval of a deciding point's change from unpruned reaches the
    line, review 10b A3), that point, its change and the interval: "the point at 11 heads removed:
    +0.683, +13% of unpruned, paired 95% CI -0.294 to +1.66, reaches the line 1% below unpruned". '' for
    an older record (no paired interval: its margin was the level's standard error, the wrong noise)."""
    ci = s.get(f"prunable_ci_{key}")
    line = ci.get("line") if isinstance(ci, Mapping) else None
    if not isinstance(line, Mapping) or line.get("on_the_line") is not True:
        return ""
    change, low, high = (_num(line.get(k)) for k in ("change", "change_low", "change_high"))
    base, tol = _num(s.get("baseline_metric")), _num(line.get("tolerance"))
    if change is None or low is None or high is None:
        return ""
    k = line.get("n_pruned")
    heads = f"{k} head{'s' if k != 1 else ''} removed"
    span = span_tolerance(s)
    rel = (f", {100 * change / abs(base):+.2g}% of unpruned" if base and span is None else
           f", {100 * change / (span['band'] / span['tolerance']):+.2g}% of the span from chance" if span else "")
    line_at = (f"the line {band_words(s)}" if span is not None else
               f"the line {100 * tol:g}% below unpruned" if tol is not None else "the line")
    if line.get("past"):
        step = "a first step" if _num(ci.get("heads")) == 0 else f"the step to {heads}"
        return f"{step}: {change:+.3g}{rel}, paired 95% CI {low:+.3g} to {high:+.3g}, reaches back to {line_at}"
    return f"the point at {heads}: {change:+.3g}{rel}, paired 95% CI {low:+.3g} to {high:+.3g}, reaches {line_at}"


def _line_sentence(s: Mapping[str, Any], keys: Any) -> str:
    """The counts that sit on the 1% line, orderings with the same deciding point said once ("ablation and
    ablation recomputed (...)"); '' when none does. A count whose bootstrap interval is one value is said
    apart, as close to the line rather than fragile: the bootstrap resampled whole sets of examples and the
    count held in 95% of them, while one point's paired t interval reaches the line (review 10b A3)."""
    groups: dict[tuple[str, bool], list[str]] = {}
    for key in keys:
        if words := _line_words(s, key):
            ci = _interval(s, key)
            held = ci is not None and ci[0] == ci[1]
            groups.setdefault((words, held), []).append(key.removesuffix("_recompute")
                                                        + (" recomputed" if key.endswith("_recompute") else ""))
    if not groups:
        return ""
    out = []
    fragile = "; ".join(f"{' and '.join(names)} ({words})" for (words, held), names in groups.items() if not held)
    if fragile:
        out.append(f"On the {line_name(s)}, so fragile (another sample of examples could move the count): {fragile}.")
    held = "; ".join(f"{' and '.join(names)} ({words})" for (words, held), names in groups.items() if held)
    if held:
        out.append(f"Close to the {line_name(s)}: {held}; the count's 95% bootstrap interval is a single value, so it held in "
                   "most resamples of the examples, but this point's own interval does not rule out a move.")
    out.append("A point's interval is the paired 95% t interval over examples of its change from the unpruned metric "
               "(the line moves with the examples, so only the change counts); the bootstrap interval resamples whole "
               "sets of examples along the order.")
    return " ".join(out)


def _seed_words(s: Mapping[str, Any], key: str) -> str:
    """The random ordering's count in words: each seed's own count and their range (a mean over seeds is
    no count, and a bootstrap of that mean leaves out the seed spread), with no interval from few seeds."""
    ci = s.get(f"prunable_ci_{key}")
    per = ci.get("per_seed_heads") if isinstance(ci, Mapping) else None
    if not (isinstance(per, list) and per and all(_num(x) is not None for x in per)):
        return "mean over seeds; each seed's count is not recorded, so no interval"
    counts = and_join([_count(x) for x in per])  # review 8b C4: "1 and 1 heads", not "per seed 1, 1 heads, range 1-1"
    span = f", range {_count(min(per))}-{_count(max(per))}" if len(per) > 2 and min(per) != max(per) else ""
    few = "; too few seeds for an interval" if len(per) < 5 else ""
    return f"{counts} heads{span} over {len(per)} random order{'s' if len(per) != 1 else ''}{few}"


def _count(x: float) -> str:
    """A number of heads: whole, or to one decimal (random orderings: a mean over seeds)."""
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"


def heads_span(low: float, high: float) -> str:
    """A bootstrap interval in heads: "10-11 heads", or "6 heads, a single value" where both ends are one count
    (review 11c: "6-6 heads" printed one value as a range; the count held in at least 95% of the resamples)."""
    if low != high:
        return f"{_count(low)}-{_count(high)} heads"
    return f"{_count(low)} head{'' if float(low) == 1 else 's'}, a single value"  # review 20: "1 heads"


def _name(s: Mapping[str, Any], key: str, named: set[str] | None = None) -> str:
    """An ordering key (gradient_recompute) in words, with what it ranks by where the summary records it;
    the basis is said once per finding: an ordering already in `named` (which this adds to) goes bare."""
    ordering = key.removesuffix("_recompute")
    basis = s.get("ordering_basis")
    what = basis.get(ordering) if isinstance(basis, Mapping) and (named is None or ordering not in named) else None
    if named is not None:
        named.add(ordering)
    return ordering + (" recomputed" if key.endswith("_recompute") else "") + (f" ({what})" if what else "")


def _signed_pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def _band_size(shape: Mapping[str, Any], gain: Mapping[str, Any]) -> float:
    """The band in the metric's units: the shape's recorded band, else (older summaries) tolerance x |unpruned|
    (unpruned = the gain point's metric - its change)."""
    if _num(shape.get("band")) is not None:
        return float(shape["band"])
    metric, change = _num(gain.get("metric")), _num(gain.get("change"))
    base = metric - change if metric is not None and change is not None else math.nan
    return (_num(shape.get("tolerance")) or 0.01) * abs(base)


def _shape_words(s: Mapping[str, Any], keys: Any, n_heads: int, metric: str, named: set[str]) -> list[str]:
    """What the first crossing leaves out (pruning.curve_shapes), for the ordering `keys` the finding
    counts: curves back within the band after leaving it, and pruning that changes the metric beyond
    the band, with its interval over examples, worded by what the interval clears (chance.clear_of, kv's
    rule too): "more than 1% above unpruned" only where its lower bound clears the band (those gains in
    one sentence), "higher than unpruned, but not clearly by more than 1%" where it clears only 0, "no
    evidence of a gain" where it reaches 0."""
    out, gains = [], []
    n_ex = s.get("n_examples")
    over = f" over {n_ex} examples" if n_ex else ""
    for key in keys:
        shape = s.get(f"pruning_shape_{key}")
        if not isinstance(shape, Mapping):
            continue
        nats = span_tolerance(s) is not None and _num(shape.get("band")) is not None  # the band on the span from chance
        band = f"{shape['band']:.3g} nats" if nats else _pct(_num(shape.get("tolerance")) or 0.01)
        first, back, gain = shape.get("first_below"), shape.get("back_within"), shape.get("gain")
        if isinstance(first, Mapping) and isinstance(back, Mapping):
            later = "point" if back.get("points") == 1 else "points"
            heads = "head" if first["n_pruned"] == 1 else "heads"
            leaves = band.replace(" nats", "-nat")
            out.append(f"The {_name(s, key, named)} curve leaves the {leaves} band at {first['n_pruned']} {heads} removed "
                       f"({_rel(s, first['change_rel'])}) but is back within it at {back.get('points')} later {later}, "
                       f"from {back.get('first')} heads removed up to {back['n_pruned']} of {n_heads} "
                       f"({back['metric']:.3g}, {_rel(s, back['change_rel'])}): the order is not monotone; its "
                       "count stops at the first crossing.")
        if isinstance(gain, Mapping):
            heads = [str(h) for h in gain.get("heads") or []]
            which = f" ({', '.join(heads)})" if 0 < len(heads) <= 8 else ""
            ci = ci_pair(gain.get("ci"))
            span = f"; 95% CI of the change {ci[0]:+.3g} to {ci[1]:+.3g}" if ci else ""
            verdict = clear_of(ci[0], ci[1], _band_size(shape, gain)) if ci else "band"  # no interval: older summaries
            if ci and (verdict is None or ci[0] <= 0):
                # review 6 (A6): an interval that reaches 0 supports no gain, so none is claimed
                out.append(f"Removing {gain['n_pruned']} of {n_heads} heads in the {_name(s, key, named)} order{which} "
                           f"changes the {metric} by {gain['change']:+.3g} ({_rel(s, gain['change_rel'])}{span}{over}): "
                           "no evidence of a gain.")
                continue
            if verdict != "band":
                # review 7 (A5): above unpruned, but the interval reaches below the band: not "more than 1%"
                out.append(f"Removing {gain['n_pruned']} of {n_heads} heads in the {_name(s, key, named)} order{which} "
                           f"raises the {metric} by {gain['change']:.3g} ({_rel(s, gain['change_rel'])}{span}{over}): "
                           f"higher than unpruned, but not clearly by more than {band}.")
                continue
            gains.append((key, gain, which, span, band))
    if len(gains) == 1:
        key, gain, which, span, band = gains[0]
        out.append(f"Pruning can raise the metric: removing {gain['n_pruned']} of {n_heads} heads in the "
                   f"{_name(s, key, named)} order{which} raises the {metric} by {gain['change']:.3g} "
                   f"({_rel(s, gain['change_rel'])}{span}{over}), more than {band} above unpruned.")
    elif gains:
        said = []
        for key, gain, which, _, _ in gains:
            ci = ci_pair(gain.get("ci"))
            span = f", {ci[0]:+.3g} to {ci[1]:+.3g}" if ci else ""
            said.append(f"removing {gain['n_pruned']} of {n_heads} heads in the {_name(s, key, named)} order{which} "
                        f"by {gain['change']:.3g} ({_rel(s, gain['change_rel'])}{span})")
        out.append(f"Pruning can raise the {metric} more than {gains[0][4]} above unpruned (95% CIs of the change"
                   f"{over}): " + ", ".join(said) + ".")
    return out


def _below(s: Mapping[str, Any], metric: str, full: bool = False) -> str:
    """"1% below the unpruned answer log-probability", or the span's band in nats (band_words)."""
    words = band_words(s, full)
    return words.replace("below unpruned", f"below the unpruned {metric}", 1)


def prunable_words(s: Mapping[str, Any], prunable: Mapping[str, float], n_heads: int, metric: str) -> list[str]:
    """The best ordering's prunable heads with its bootstrap interval, then the others, then the counts
    on their 1% line in one sentence. A count of 0, or one whose interval reaches 0 heads, is not
    presented as heads that can be removed. Each ordering's basis is named once."""
    named: set[str] = set()
    best = max(prunable, key=lambda k: prunable[k])
    heads = _num(s.get(f"heads_prunable_{best}")) or prunable[best] * n_heads
    ci = _interval(s, best)
    n_ex = ci[2] if ci and ci[2] is not None else s.get("n_examples")
    over = f"over {n_ex} examples" if n_ex is not None else ""
    name = _name(s, best, named)
    if prunable[best] <= 0:
        lines = _line_sentence(s, prunable)
        out = [f"No ordering removes a single step of heads staying no more than {_below(s, metric, True)}"
               + (f" ({over})" if over else "") + ": the first step already falls below the floor."]
        out += [lines] if lines else []
        out += _shape_words(s, list(prunable), n_heads, metric, named)
        return out
    if best.startswith("random"):
        out = [f"Ordered at random, {_count(heads)} of {n_heads} heads ({_pct(prunable[best])}) stay no more than "
               f"{_below(s, metric, True)} on average ({_seed_words(s, best)})."]
    elif ci is None:  # an older summary: no per-example data behind the count
        out = [f"{heads:.0f} of {n_heads} heads ({_pct(prunable[best])}) can be removed staying no more than "
               f"{_below(s, metric, True)}" + (f" ({over})" if over else "") + f" when ordered by {name}."]
    elif ci[0] <= 0:
        out = [f"Ordered by {name}, {_count(heads)} of {n_heads} heads ({_pct(prunable[best])}) stay no more than "
               f"{_below(s, metric, True)}, but the 95% bootstrap interval ({heads_span(ci[0], ci[1])}, "
               f"{over}) reaches none: this is no evidence that any head is dispensable."]
    else:
        out = [f"{_count(heads)} of {n_heads} heads ({_pct(prunable[best])}, 95% bootstrap interval "
               f"{heads_span(ci[0], ci[1])}, {over}) can be removed staying no more than "
               f"{_below(s, metric, True)} when ordered by {name}."]
    others = []
    for key, value in prunable.items():
        if key == best:
            continue
        kci = _interval(s, key)
        none = ", reaching none" if kci and value > 0 and kci[0] <= 0 else ""
        span = "" if kci is None else f" ({heads_span(kci[0], kci[1])}{none})"
        if key.startswith("random"):
            span = f" ({_seed_words(s, key)})"
        others.append(f"{_name(s, key, named)} {_pct(value)}{span}")
    if others:
        out.append(f"Other orderings (heads removed before each curve first falls more than {band_words(s)}): "
                   + ", ".join(others) + ".")
    if lines := _line_sentence(s, prunable):
        out.append(lines)
    out += _shape_words(s, list(prunable), n_heads, metric, named)
    if any(_interval(s, key) for key in prunable):
        out.append("The intervals resample the examples along each fixed pruning order; they do not cover a new "
                   "task sample re-ranking the heads.")
    return out
