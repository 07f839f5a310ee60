"""The prunable verdicts for `headscope compare` (compare_pruning.pruning_notes): two runs can remove the same number of
heads while their heads findings say different things of it, because the verdict rests on the count's bootstrap
interval (one that reaches 0 heads is "no evidence that any head is dispensable": reports/pruning_words.py) and on
whether the count sits on its 1% line (fragile). Where the verdicts differ the page says so and why: both
intervals, and where the fixed order's first heads are removed in another order by the two runs, which heads
swap and the start-of-order ties each summary records (tied_first_pruned_<method>, close_first_pruned_<method>:
analyses/heads/analysis.py `numerical_checks`; review 8b A2/A4: float32 and bfloat16 swapped two tied heads and
one interval reached 0 while the other did not).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headscope.reports.compare_run import SIDES, Run, _number, dtype_of, precision_only
from headscope.reports.findings import and_join, ci_pair
from headscope.reports.heads_words import start_of_order
from headscope.reports.pruning_words import heads_span, line_name

ABLATION_METHODS = ("zero", "mean", "resample")  # the ablation order ranks by one of these (its summary keys' suffix)


def interval_heads(s: Mapping[str, Any], ordering: str) -> tuple[float, float] | None:
    """prunable_ci_<ordering>'s bootstrap interval in heads (None where not recorded)."""
    ci = s.get(f"prunable_ci_{ordering}")
    return ci_pair(ci.get("interval_heads")) if isinstance(ci, Mapping) else None


def _reaches_none(s: Mapping[str, Any], ordering: str) -> bool | None:
    """Whether the heads finding sees no evidence that any head is dispensable by `ordering`: its interval reaches 0
    heads, a count above 0 ("no evidence that any head is dispensable": pruning_words `prunable_words`) or a count of
    0 ("0-0 heads" is none; review 11b A7: "A's (0-0 heads) does not [reach none]" contradicted itself); None without
    an interval."""
    ci = interval_heads(s, ordering)
    return None if ci is None else ci[0] <= 0


def _fixed_curve(run: Run, ordering: str, column: str) -> Any:
    """The rows of `ordering`'s fixed (not recomputed) curve in heads/curve.csv, its first seed's, where the table
    has `column`; None where it is not recorded."""
    curve = run.table("heads", "curve")
    if curve is None or not {"ordering", "recompute", "n_pruned", column} <= set(curve.columns):
        return None
    rows = curve[(curve["ordering"] == ordering) & (curve["recompute"].astype(str) != "True")]
    if "seed" in rows.columns and not rows.empty:
        rows = rows[rows["seed"] == rows["seed"].min()]
    return rows


def first_removed(run: Run, ordering: str) -> list[str] | None:
    """The heads `ordering`'s fixed order removes, first first (heads/curve.csv's `pruned`, seed 0's curve); None
    without that column, for random and recomputed orders (which re-rank after each step)."""
    if ordering.startswith("random") or ordering.endswith("_recompute"):
        return None
    rows = _fixed_curve(run, ordering, "pruned")
    if rows is None:
        return None
    out = []
    for cell in rows.sort_values("n_pruned")["pruned"]:
        out += str(cell).split() if isinstance(cell, str) else []
    return out or None


def _swap(orders: list[list[str]], upto: int) -> tuple[int, list[list[str]]] | None:
    """(the place, from 0, where the two orders first remove different heads; the heads each removes from there up to
    where both have removed the same heads again, at most `upto` heads in all): e.g. (7, [[L0H5, L0H1], [L0H1, L0H5]])
    where the orders agree on their first 7 heads; None where they agree that far."""
    n = min(upto, *map(len, orders))
    start = next((i for i in range(n) if orders[0][i] != orders[1][i]), None)
    if start is None:
        return None
    end = next((j for j in range(start + 1, n + 1) if set(orders[0][:j]) == set(orders[1][:j])), n)
    return start, [o[start:end] for o in orders]


def _swap_words(start: int, swapped: list[list[str]]) -> str:
    """'the first heads removed swap between the runs (A L1H0, L0H1; B L0H1, L1H0)' where the orders part at their
    first head; 'the orders agree on their first 7 heads, then the 8th and 9th heads removed swap between the runs (A
    L0H5, L0H1; B L0H1, L0H5)' otherwise ("differ" where the heads are not the same ones); verification 17v A1: "the
    first heads removed swap" was said of two orders that agreed on their first 7 heads."""
    from headscope.reports.findings import ordinal

    places = and_join([ordinal(start + 1 + i) for i in range(max(map(len, swapped)))])
    heads = f"(A {', '.join(swapped[0])}; B {', '.join(swapped[1])})"
    verb = "swap" if set(swapped[0]) == set(swapped[1]) else "differ"  # the same heads in another order, or not
    if start == 0:
        return f"the first heads removed {verb} between the runs {heads}"
    return (f"the orders agree on their first {start} head{'s' * (start > 1)}, then the {places} heads removed {verb} "
            f"between the runs {heads}")


def _start_tie(s: Mapping[str, Any], ordering: str) -> str:
    """What one summary records of ties at the start of `ordering`'s order, in words ("" where nothing)."""
    if ordering.startswith("random") or ordering.endswith("_recompute"):
        return ""
    methods = ("gradient",) if ordering == "gradient" else ABLATION_METHODS
    for m in methods:
        if found := start_of_order(s, m):
            kind, heads = found
            names = and_join([str(h) for h in heads])
            return (f"{names} tie within rounding at the start of its order" if kind == "tie" else
                    f"{names}, the first heads of its order, differ by less than their standard errors over examples")
    return ""


def verdict_words(a: Run, b: Run, ordering: str, fractions: tuple[float, float], fragile: tuple[bool, bool]) -> str:
    """"" where the two heads findings give `ordering`'s count the same verdict, else how they differ: one interval
    reaches 0 heads and the other does not (both intervals, then the first heads the runs remove in another order
    and the start-of-order ties their summaries record), or one count sits on its 1% line and the other does not."""
    sums = [a.summary("heads") or {}, b.summary("heads") or {}]
    parts = []
    reach = [_reaches_none(s, ordering) for s in sums]
    if None not in reach and reach[0] != reach[1]:
        yes, no = (0, 1) if reach[0] else (1, 0)
        ci = [interval_heads(s, ordering) for s in sums]
        part = (f"{SIDES[yes]}'s 95% bootstrap interval ({heads_span(*ci[yes])}) reaches none, so its finding "
                f"sees no evidence that any head is dispensable, while {SIDES[no]}'s ({heads_span(*ci[no])}) "
                "does not")
        orders = [first_removed(r, ordering) for r in (a, b)]
        counts = [s.get(f"heads_prunable_{ordering}") for s in sums]
        upto = int(max(c for c in counts if _number(c))) + 1 if any(_number(c) for c in counts) else 2
        swapped = _swap(orders, upto) if all(orders) else None
        if swapped:
            part += ": " + _swap_words(*swapped)
        ties = [f"{side}'s summary records that {t}" for side, s in zip(SIDES, sums) if (t := _start_tie(s, ordering))]
        if ties:
            part += (": " if not swapped else ", and ") + "; ".join(ties)
        if swapped or ties:
            part += "; which goes first is not settled, and the interval's low end can depend on it"
        parts.append(part)
    if fragile[0] != fragile[1]:  # review 19v C5: why, from the numbers ("B's does not" read as B off its line)
        from headscope.reports.compare_pruning import on_the_line

        yes, no = (0, 1) if fragile[0] else (1, 0)
        ci = [interval_heads(s, ordering) for s in sums]
        names = [line_name(s) for s in sums]
        spread = f" and its 95% bootstrap interval ({heads_span(*ci[yes])}) spans more than one count" if ci[yes] else ""
        part = f"{SIDES[yes]}'s count sits on its {names[yes]}{spread} (fragile: another sample of examples could move it)"
        if on_the_line((a, b)[no], ordering, fractions[no]) and ci[no] is not None and ci[no][0] == ci[no][1]:
            part += (f"; {SIDES[no]}'s deciding point reaches its {names[no]} too, but its 95% bootstrap interval is the "
                     f"single value {heads_span(*ci[no]).removesuffix(', a single value')}, so its count held in most "
                     "resamples")
        else:
            part += f", {SIDES[no]}'s does not sit on its {names[no]}"
        parts.append(part)
    return "" if not parts else "the verdicts differ: " + "; ".join(parts)


def _fixed_means(run: Run, ordering: str) -> dict[int, float] | None:
    """{heads removed: mean metric} of `ordering`'s fixed curve (heads/curve.csv, seed 0's), None where not recorded."""
    rows = _fixed_curve(run, ordering, "metric")
    if rows is None:
        return None
    return {int(k): float(v) for k, v in zip(rows["n_pruned"], rows["metric"])} or None


def _tied_groups(s: Mapping[str, Any], ordering: str) -> list[set[str]]:
    """The runs of heads one summary records as tied within rounding for what `ordering` ranks by (the top heads'
    tied_top_groups_<method> / tied_top_heads_<method>, the first removed tied_first_pruned_<method>)."""
    methods = ("gradient",) if ordering == "gradient" else ABLATION_METHODS
    groups = []
    for m in methods:
        runs = [*(s.get(f"tied_top_groups_{m}") or []), *(s.get(f"tied_first_pruned_{m}") or []),
                *([s[f"tied_top_heads_{m}"]] if isinstance(s.get(f"tied_top_heads_{m}"), list) else [])]
        groups += [{str(h) for h in g} for g in runs if isinstance(g, list) and len(g) > 1]
    return groups


def _same_heads_words(means: list[dict[int, float]], orders: list[list[str]], point: int, floor: Any,
                      low: str) -> tuple[str, bool | None]:
    """The curve points next to `point` (the last before it, the first after) where both runs have removed the same
    heads, their changes from unpruned set against the lower precision's rounding step `floor`: (words, True within
    it, False beyond it: the precision changes the computation there; None without such a point or a floor)."""
    same = [k for k in sorted(means[0]) if k > 0 and k in means[1] and k != point
            and set(orders[0][:k]) == set(orders[1][:k])]
    near = [k for k in (max((k for k in same if k < point), default=None), min((k for k in same if k > point),
                                                                              default=None)) if k is not None]
    if not near:
        return "", None
    gaps = [abs((means[0][k] - means[0][0]) - (means[1][k] - means[1][0])) for k in near]
    at = " and ".join(str(k) for k in near)
    said = (f"; with the same heads removed (at {at} heads) the changes are "
            f"{' and '.join(f'{g:.2g}' for g in gaps)} apart")
    if not _number(floor):
        return said, None
    if max(gaps) <= float(floor):
        return said + f", within {low}'s rounding step of the metric ({float(floor):.2g})", True
    return (said + f", more than {low}'s rounding step of the metric ({float(floor):.2g}): the precision changes the "
            "model's computation there, not only its rounding"), False


TIE_BROKEN = "the gap is that tie broken differently"  # compare_pruning files such a gap under "within noise"


def precision_words(a: Run, b: Run, ordering: str, counts: list[Any]) -> tuple[str, bool | None]:
    """Where A and B differ only in precision (compare_run.precision_only) and their counts of heads prunable by a fixed
    `ordering` differ: (the point that decides them, the first of the curve past the smaller count, its change from
    unpruned in each run, and whether the two lie within the lower precision's rounding step of the metric (its
    summary's noise_floor), True then: a rounding difference, not the model's (review 11b A7: a 2-head step of
    -0.0005 nats in float32 that rounds to +0 in bfloat16 decided a count against a 1% line of 0.00006));
    ("", None) otherwise. Where the two orders have removed different heads by that point (heads/curve.csv's
    `pruned`), the gap is not set against rounding: the heads that differ are named, with the summaries that record
    them as tied within rounding (then the gap is that tie broken differently; review 16b A1: "the precision changes
    the model's computation" over two 8-head sets that differed by a tied head), and the precision is judged at the
    neighbouring points where both removed the same heads (False only where the gap there exceeds the rounding)."""
    sides = precision_only(a, b)
    if sides is None or ordering.startswith("random") or ordering.endswith("_recompute") or \
            not all(_number(c) for c in counts) or counts[0] == counts[1]:
        return "", None
    means = [_fixed_means(r, ordering) for r in (a, b)]
    if not all(means):
        return "", None
    point = next((k for k in sorted(means[0]) if k > min(counts)), None)
    if point is None or not all(point in m and 0 in m for m in means):
        return "", None
    change = [m[point] - m[0] for m in means]
    gap, low = abs(change[0] - change[1]), (a, b)[sides[1]]
    floor = (low.summary("heads") or {}).get("noise_floor")
    said = (f"the runs differ only in precision (A {dtype_of(a)}, B {dtype_of(b)}): at {point} heads removed, the "
            f"point that decides the counts, the change from unpruned is {change[0]:+.3g} in A and {change[1]:+.3g} in "
            f"B, {gap:.2g} apart")
    orders = [first_removed(r, ordering) for r in (a, b)]
    if all(orders) and min(map(len, orders)) >= point and set(orders[0][:point]) != set(orders[1][:point]):
        only = [[h for h in orders[i][:point] if h not in orders[1 - i][:point]] for i in (0, 1)]
        differ = {*only[0], *only[1]}
        tied = [side for side, r in zip(SIDES, (a, b))
                if any(differ <= g for g in _tied_groups(r.summary("heads") or {}, ordering))]
        said += (f", but over different heads: by then A has removed {and_join(only[0])} where B has removed "
                 f"{and_join(only[1])}")
        if tied:
            whose = "both heads findings record" if len(tied) == 2 else f"{tied[0]}'s heads finding records"
            said += (f", which {whose} as tied within rounding: {TIE_BROKEN}, not the "
                     "precision changing the model's computation")
        else:
            said += ", which neither heads finding records as tied within rounding"
        same, within = _same_heads_words(means, orders, point, floor, dtype_of(low))
        return said + same, (False if within is False else None)
    if not _number(floor):
        return said + f"; {dtype_of(low)}'s rounding step of the metric is not recorded", None
    if gap <= float(floor):
        return (said + f", within {dtype_of(low)}'s rounding step of the metric ({float(floor):.2g}): a rounding "
                "difference, not a difference in the model"), True
    return (said + f", more than {dtype_of(low)}'s rounding step of the metric ({float(floor):.2g}): the precision "
            "changes the model's computation here, not only its rounding"), False


def point_heads_words(a: Run, b: Run, ordering: str, point: int) -> str:
    """Where A's and B's findings both cite their curve's point at `point` heads removed by the fixed `ordering` and
    the two orders have removed different heads by then (heads/curve.csv's `pruned`), that the two are not one point
    read twice (review 18b C2: A's 4.005 against B's 4.437 "at 10 heads removed", while the orders parted at the 6th
    head and by the 10th removed L3H3 in A, L0H1 in B): where the orders first part, the heads that differ by then,
    whether either summary records those as tied within rounding, and, at two precisions (precision_only), the
    neighbouring points where both removed the same heads against the lower precision's rounding step; "" where the
    orders agree that far or are not recorded."""
    from headscope.reports.findings import ordinal

    orders = [first_removed(r, ordering) for r in (a, b)]
    if not all(orders) or min(map(len, orders)) < point or set(orders[0][:point]) == set(orders[1][:point]):
        return ""
    start = next(i for i in range(point) if orders[0][i] != orders[1][i])
    only = [[h for h in orders[i][:point] if h not in orders[1 - i][:point]] for i in (0, 1)]
    differ = {*only[0], *only[1]}
    tied = [side for side, r in zip(SIDES, (a, b))
            if any(differ <= g for g in _tied_groups(r.summary("heads") or {}, ordering))]
    said = (f"the two points at {point} heads removed are of different heads, not one point read twice: the fixed "
            f"orders part at the {ordinal(start + 1)} head removed (A {orders[0][start]}, B {orders[1][start]}), and by "
            f"{point} heads removed A has removed {and_join(only[0])} where B has removed {and_join(only[1])}")
    if tied:
        whose = "both heads findings record" if len(tied) == 2 else f"{tied[0]}'s heads finding records"
        said += f", which {whose} as tied within rounding"
    else:
        said += ", which neither heads finding records as tied within rounding"
    sides = precision_only(a, b)
    means = [_fixed_means(r, ordering) for r in (a, b)]
    if sides is None or not all(means) or not all(0 in m for m in means):
        return said
    low = (a, b)[sides[1]]
    same, within = _same_heads_words(means, orders, point, (low.summary("heads") or {}).get("noise_floor"),
                                     dtype_of(low))
    if within:
        same += (": where the heads agree the precision moves the curve by less than its rounding, so the gap between "
                 "the two points goes with the heads removed")
    return said + same

