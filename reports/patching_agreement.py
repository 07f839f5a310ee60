"""Attribution patching against exact patching in words (reports/patching_words.py's finding): each site type's
Pearson r as its cells allow it to be read (with its Fisher interval; on few or sparse non-zero cells, or carried by
one point, said as such), the least-squares slope that says whether it sizes effects or only ranks them, the cells
within the run's rounding floor, and what a ranking by it gets wrong (the top exact site ranked lower, a large
effect it misses).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headscope.analyses.patching.attribution_patching import MISS, NEGLIGIBLE, SPARSE, interval_stated
from headscope.reports.findings import _ci, _num, and_join, ci_pair, fisher_interval, ordinal
from headscope.reports.patching_sites import KV_SITES, _reach, _size, _where


def agreement(s: Mapping[str, Any], gap: float | None, rank: bool) -> list[str]:
    """The finding's sentences on attribution patching against exact patching (summary attribution_correlation):
    each site type's r as its cells allow it to be read, the slopes that say whether it sizes effects, and what a
    ranking by it gets wrong where the finding ranks sites (`rank`); [] without a correlation. A site type whose
    exact effects are all negligible (below NEGLIGIBLE of the gap: review 12b A3) gets no r, slope or ranking."""
    corr = s.get("attribution_correlation")
    if not isinstance(corr, Mapping):
        return []
    corr = {k: v for k, v in corr.items() if isinstance(v, Mapping)}
    quiet = {k: peak for k, v in corr.items() if (peak := negligible(v, gap, s)) is not None}
    read = {k: v for k, v in corr.items() if k not in quiet}
    said = [f"{k}: exact effects all below {NEGLIGIBLE:g} of the gap (the largest {quiet[k]:.1g}), nothing to rank"
            if k in quiet else _correlation(k, v, s) for k, v in corr.items()
            if k in quiet or _num(v.get("pearson")) is not None]
    if not said:
        return []
    parts = ["Attribution patching vs exact (Pearson r): " + "; ".join(said) + "."]
    wrong = {k: _ranking(k, v, gap, s) for k, v in read.items()} if rank else {}
    wrong = {k: w for k, w in wrong.items() if w}
    slopes = [_slope(k, v, rank and k not in wrong) for k, v in read.items()
              if _num(v.get("pearson")) is not None and _case(v) in ("plain", "set")]
    slopes = [x for x in slopes if x]
    if slopes or any(_num(v.get("pearson")) is not None and _case(v) != "few" for v in read.values()):  # 14b B6
        parts.append(" ".join(slopes) if slopes
                     else "A high r can hide a scale error: see the per-site slopes in the figure.")
    if wrong:
        parts.append("Ranked by attribution patching, sites come out wrong: " + "; ".join(
            f"at {k}, {w}" for k, w in wrong.items()) + ". Do not rank sites by it on this model at "
            + and_join(list(wrong)) + ".")
    return parts


def negligible(stats: Mapping[str, Any], gap: float | None, s: Mapping[str, Any] | None = None) -> float | None:
    """The largest |exact effect| of a site type as a share of the clean-corrupted gap (its top_exact cell), where it
    is below NEGLIGIBLE (review 12b A3: q cells all within 7e-4 of the gap got an r, a slope and a named miss):
    there is nothing for attribution patching to agree with. None otherwise, or without a gap (a normalised
    metric's effects are shares already)."""
    top = stats.get("top_exact")
    effect = _num(top.get("effect")) if isinstance(top, Mapping) else None
    if effect is None or not (gap or (s or {}).get("normalized")):
        return None
    share = abs(effect / gap) if gap else abs(effect)
    return share if share < NEGLIGIBLE else None


def _significant(r: float | None, n: int) -> bool:
    """Whether a Pearson r over n points differs from 0: its Fisher 95% interval excludes 0 (|r| = 1 on
    three or more points counts as significant; fewer than four points otherwise never do)."""
    if r is None:
        return False
    if abs(r) >= 1:
        return n >= 3
    interval = fisher_interval(r, n)
    return interval is not None and (interval[0] > 0 or interval[1] < 0)


def _ratio(slope: float) -> str:
    """A slope of attribution over exact in words ("about half the exact ones")."""
    if slope <= 0:
        return "point the opposite way to the exact ones"
    for lo, hi, words in ((0.4, 0.6, "about half"), (1.7, 2.3, "about twice")):
        if lo <= slope < hi:
            return f"are {words} the exact ones"
    return f"are about {slope:.2g} times the exact ones"


FAR = (0.8, 1.25)  # a slope outside this range, with a 95% interval that excludes 1, is a scale error worth saying


def _slope(kind: str, stats: Mapping[str, Any], rank: bool) -> str | None:
    """'At <kind> ... (least-squares slope b of attribution on exact, 95% CI [..], n = k cells).': far
    from 1 (FAR, interval excluding 1) its effects are that multiple of the exact ones, so (where r is
    significant and the report ranks sites, `rank`) it ranks but does not size; None without a slope and
    interval (older summaries, fewer than three cells)."""
    b, ci, n = _num(stats.get("slope")), ci_pair(stats.get("slope_ci")), stats.get("slope_n", stats.get("n"))
    if b is None or ci is None:
        return None
    said = f"least-squares slope {b:.2f} of attribution on exact{_ci(tuple(ci))}, n = {n} cells"
    rest = _num(stats.get("slope_without_top"))
    if _case(stats) == "set":  # review 12a: the cell that sets r sets the slope too
        said += f"; {rest:.2f} without its largest cell" if rest is not None else "; set by its largest cell, as r"
    if not ci[0] <= 1.0 <= ci[1] and not FAR[0] <= b <= FAR[1]:
        advice = ": use it to rank, not to size" if rank and _significant(_num(stats.get("pearson")), int(n or 0)) else ""
        return f"At {kind} attribution patching's effects {_ratio(b)} ({said}){advice}."
    close = "consistent with the exact size" if ci[0] <= 1.0 <= ci[1] else "close to the exact size"
    return f"At {kind} its sizes are {close} ({said})."


def _case(stats: Mapping[str, Any]) -> str:
    """Which reading of r the cells allow: "few" (under 3 non-zero exact effects), "sparse" (under SPARSE
    or half the cells non-zero), "one point" (significant r that is not without its largest cell, or flips
    sign), "mostly" (under half of |r| without it), "set" (without it, outside r's interval: _set_by_top) or
    "plain" (r over every cell with its interval)."""
    r, n, nonzero = _num(stats.get("pearson")), int(_num(stats.get("n")) or 0), _num(stats.get("n_nonzero"))
    if nonzero is not None and nonzero < 3:
        return "few"
    if not interval_stated(n, None if nonzero is None else int(nonzero)):  # zeros are not independent evidence
        return "sparse"
    rest = _num(stats.get("pearson_without_top"))
    if rest is None or not _significant(r, n):
        return "plain"
    if not _significant(rest, n - 1) or rest * r < 0:
        return "one point"
    return "mostly" if abs(rest) < abs(r) / 2 else "set" if _set_by_top(r, rest, n) else "plain"


def _set_by_top(r: float, rest: float, n: int) -> bool:
    """Review 12a: r over n cells is set by its largest cell when r without it lies outside r's own Fisher 95%
    interval and leaves at least twice the variance unexplained (1 - rest^2 >= 2 (1 - r^2)): 0.999 over 12 cells
    with 0.78 without the one at 0.999 of the gap; not 0.95 over 200 against 0.93."""
    interval = fisher_interval(r, n)
    outside = interval is None or not interval[0] <= rest <= interval[1]
    return outside and 1 - rest ** 2 >= 2 * (1 - r ** 2)


def _by_ties(rho: float, rho_nonzero: float, zeros: float) -> str:
    """', raised by the k tied zeros' where Spearman over every cell exceeds the one over the non-zero cells
    (as stated, to 2 decimals), ', lowered by ...' where it falls short (review 8: "inflated" was said of
    both), '' where the two read the same."""
    every, some = float(f"{rho:.2f}"), float(f"{rho_nonzero:.2f}")  # as the sentence states them
    if every == some:
        return ""
    return f", {'raised' if every > some else 'lowered'} by the {zeros:.0f} tied zeros"


def _correlation(kind: str, stats: Mapping[str, Any], s: Mapping[str, Any] | None = None) -> str:
    """'<kind> r (n points, CI)', or that r rests on too few non-zero points to mean anything, or on
    few (under SPARSE or half the cells: stated on them with Spearman and the slope the summary holds, no
    interval that counts the zero cells as independent), or that one point carries it: r is significant,
    and without its largest cell it is not, flips sign, or falls to under half of |r| (the rest still
    significant: "mostly carried" by that cell)."""
    r, n, nonzero = _num(stats.get("pearson")), int(_num(stats.get("n")) or 0), _num(stats.get("n_nonzero"))
    case, rest = _case(stats), _num(stats.get("pearson_without_top"))
    if case == "few":
        return _few_effects(kind, r, int(nonzero), n, stats, s)
    if case == "sparse" and nonzero is not None and nonzero >= n:  # review 9b C4: no zero cells, just few cells
        return _few_cells(kind, stats, n, s)
    if case == "sparse":
        rho, slope, rho_nz = _num(stats.get("spearman")), _num(stats.get("slope")), _num(stats.get("spearman_nonzero"))
        spearman = (f"Spearman {rho_nz:.2f} over the {nonzero:.0f} non-zero cells ({rho:.2f} over all {n}"
                    f"{_by_ties(rho, rho_nz, n - nonzero)})" if rho_nz is not None and rho is not None
                    else f"Spearman {rho:.2f} over all {n} cells, {n - nonzero:.0f} of them tied at zero"
                    if rho is not None else "")
        extra = [spearman,
                 f"slope {slope:.2f}, attribution over exact" if slope is not None else "",
                 f"without its largest cell r = {rest:.3f}" if rest is not None and r is not None
                 and (rest * r < 0 or abs(rest) < abs(r) / 2) else "",
                 f"no interval for r or the slope: {_other_cells(n - nonzero, stats, s)}"]
        return f"{kind} r = {r:.3f} rests on its {nonzero:.0f} non-zero cells of {n} ({'; '.join(e for e in extra if e)})"
    if case == "plain":
        return f"{kind} r = {r:.3f} (n = {n} cells{_ci(fisher_interval(r, n), '.3f')})"
    without = f"without it r = {rest:.3f} (n = {n - 1} cells{_ci(fisher_interval(rest, n - 1), '.3f')})"
    if case == "set":
        return (f"{kind} r = {r:.3f} (n = {n} cells{_ci(fisher_interval(r, n), '.3f')}) is set by one cell, its "
                f"largest: {without}, outside that interval")
    if case == "one point":
        return f"{kind} r = {r:.3f} is driven by its largest cell: {without}, so the agreement rests on one point"
    return f"{kind} r = {r:.3f} is mostly carried by its largest cell: {without}, a much weaker agreement"


def _few_effects(kind: str, r: float | None, nonzero: int, n: int, stats: Mapping[str, Any],
                 s: Mapping[str, Any] | None) -> str:
    """Under 3 exact effects that count (n_nonzero: above NONZERO of the largest and the rounding floor): r says
    nothing. Review 14b B6: in bfloat16, "0 non-zero exact effect(s)" where 5 cells were non-zero but within the
    floor (0.0079, one rounding step); where the floor keeps cells from counting it is named, and an r over cells
    that are all rounding (none counts) is not printed."""
    rounding = int(_num(stats.get("n_within_rounding")) or 0)
    record = (s or {}).get("rounding_floor")
    floor = _num(record.get("floor")) if isinstance(record, Mapping) else None
    if rounding and floor is not None:
        how = ("measured on cells that patch an activation with itself" if record.get("basis") == "measured"
               else "one rounding step of the metric")
        if not nonzero:
            return (f"{kind}: no r, its exact effects being rounding only (none of its {n} cells above this precision's "
                    f"rounding floor, {floor:.2g}: {how}; {rounding} non-zero within it)")
        return (f"{kind} r = {r:.3f} rests on {nonzero} exact effect(s) above this precision's rounding floor "
                f"({floor:.2g}: {how}) of {n} cells ({rounding} more non-zero within it), so it says nothing about "
                "agreement")
    if not nonzero:
        return f"{kind}: no r, as no exact effect of its {n} cells is non-zero, so it says nothing about agreement"
    return f"{kind} r = {r:.3f} rests on {nonzero} non-zero exact effect(s) of {n} cells, " \
        "so it says nothing about agreement"


def _other_cells(zeros: float, stats: Mapping[str, Any], s: Mapping[str, Any] | None) -> str:
    """'the other 4 cells have no exact effect', or, where the run's rounding floor (bfloat16) is what keeps some
    of them from counting, that they are within it (review 10a C5: real effects of 0.002-0.016 logits in float32
    read 'no exact effect' in bfloat16, the interval lost to the dtype without a word)."""
    rounding = int(_num(stats.get("n_within_rounding")) or 0)
    record = (s or {}).get("rounding_floor")
    floor = _num(record.get("floor")) if isinstance(record, Mapping) else None
    if not rounding or floor is None:
        return f"the other {zeros:.0f} cells have no exact effect"
    some = "all" if rounding >= zeros else f"{rounding} of them"
    how = ("measured on cells that patch an activation with itself" if record.get("basis") == "measured"
           else "one rounding step of the metric")
    return (f"the other {zeros:.0f} cells have no exact effect beyond this precision's rounding ({some} non-zero but "
            f"within its floor, {floor:.2g}: {how})")


def _few_cells(kind: str, stats: Mapping[str, Any], n: int, s: Mapping[str, Any] | None) -> str:
    """'k: 3 cells (1 KV head per layer), too few to read agreement from r (...)': every cell has an exact effect
    but they are under SPARSE, so r and the slope carry no interval, and r over so few points is no agreement."""
    heads, kv = (_num((s or {}).get(k)) for k in ("n_heads", "n_kv_heads"))
    why = f" ({kv:.0f} KV head{'s' * (kv != 1)} per layer)" if kind in KV_SITES and heads and kv and kv < heads else ""
    rho, slope = _num(stats.get("spearman")), _num(stats.get("slope"))
    shown = [f"Spearman {rho:.2f}" if rho is not None else "", f"slope {slope:.2f}, attribution over exact"
             if slope is not None else ""]
    return (f"{kind}: {n} cells{why}, too few to read agreement from r ("
            + "; ".join([f"under {SPARSE} cells: no interval", *(x for x in shown if x)]) + ")")


def _ranking(kind: str, stats: Mapping[str, Any], gap: float | None, s: Mapping[str, Any] | None = None) -> str | None:
    """What a ranking by attribution patching gets wrong at one site type: its top exact site ranked below
    first (not said when that site is tied: another cell's exact effect lies within its 95% interval or the
    rounding floor, so there is no top to misrank; the rank already ignores attribution differences within
    the floor: rank_checks), and a large exact effect it misses (under 1/MISS of it; rank_checks names only an
    effect whose 95% interval excludes 0, and none below NEGLIGIBLE of the gap is said); None when neither."""
    top, miss = stats.get("top_exact"), stats.get("missed")
    said = []
    under = f"under 1/{MISS:g} of it"
    if (isinstance(top, Mapping) and isinstance(top.get("attribution_rank"), int) and top["attribution_rank"] > 1
            and not top.get("tied")):
        same = isinstance(miss, Mapping) and all(miss.get(k) == top.get(k) for k in ("layer", "head", "pos"))
        said.append(f"the top exact site ({_where(kind, top, s).split(' at ', 1)[1]}: exact {_size(top['effect'], gap)}"
                    f"{_reach(s, kind, top)}) "
                    f"ranks only {ordinal(top['attribution_rank'])}, at {_size(top['attribution'], gap)}"
                    + (f", {under}" if same else ""))
        miss = None if same else miss
    if isinstance(miss, Mapping) and negligible({"top_exact": miss}, gap, s) is not None:
        miss = None  # no verdict on an effect below the negligible line (review 13c A1)
    if isinstance(miss, Mapping):
        said.append(f"it misses {_where(kind, miss, s).split(' at ', 1)[1]} (attribution {_size(miss['attribution'], gap)} "
                    f"against exact {_size(miss['effect'], gap)}: {under})")
    return "; ".join(said) or None
