"""The `patching` finding in words (reports/plots_patching.py's `finding`, the family's headline): the
site that moves the metric most where the information enters, where it reaches the answer position and
what writes it there (reports/patching_sites.py picks the cells), each with its share of the
clean-corrupted gap, its interval and n; the positions where clean and corrupted prompts differ; how far
attribution patching can stand in for exact patching (slopes, correlations over the non-zero cells,
reversals and misses beyond the rounding floor); at chance, only what was measured.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from headscope.analyses.patching.attribution_patching import MISS, SPARSE, interval_stated
from headscope.reports.findings import _at_chance, _chance, _ci, _num, _words, and_join, fisher_interval, ordinal, sliding_words
from headscope.reports.patching_sites import (
    CITED,
    DEPTH,
    at_answer,
    by_construction,
    changed_there,
    depth,
    differ_offsets,
    differing_positions,
    entering,
    reaching,
    share,
    split_token,
    thin,
    tied,
    writer,
)

KV_SITES = ("k", "v")  # their head index is a KV head, which query heads share under grouped- or multi-query attention


def _head(kind: str, cell: Mapping[str, Any], s: Mapping[str, Any] | None = None) -> str:
    """A head by its name (L1H3), as every section names heads (the report links it to the explorer); a k or v cell's
    head is a KV head, never named as a query head (review 9b A3: "v at L0H0" was layer 0's one KV head, read by
    every query head): "layer 0's KV head 0 (shared by all 4 query heads: multi-query attention)", with the query
    heads that read it where the summary has the head counts (n_heads, n_kv_heads)."""
    layer, head = cell.get("layer"), cell["head"]
    heads, kv = (_num((s or {}).get(k)) for k in ("n_heads", "n_kv_heads"))
    if kind not in KV_SITES or (heads and kv and kv == heads):
        return f"L{layer}H{head}"
    if not (heads and kv and kv < heads):
        return f"layer {layer}'s KV head {head}"
    per = int(heads) // int(kv)
    if kv == 1:
        return f"layer {layer}'s KV head {head} (shared by all {heads:.0f} query heads: multi-query attention)"
    return (f"layer {layer}'s KV head {head} (read by query heads {head * per}-{head * per + per - 1}: grouped-query "
            "attention)")


def _site(cell: Mapping[str, Any], kind: str, differ: frozenset = frozenset(), s: Mapping[str, Any] | None = None) -> str:
    # a head by its name (_head); differ: the offsets from the end where clean and corrupted differ, named once by
    # the finding (no token said there)
    where = [f"layer {cell.get('layer')}" if cell.get("head") is None else _head(kind, cell, s)]
    if cell.get("pos") is not None:
        token = cell.get("token") or ""  # "": the prompts have different tokens there (patching's token column)
        end = cell.get("from_end")  # the figures' axis: the same place in every left-padded prompt
        at = f"position {end} from the end" if isinstance(end, int) else f"position {cell['pos']}"
        if isinstance(end, int):  # the token column's "i: " is the padded frame's index, not this axis
            token = re.sub(r"^\d+: ", "", token)
        named = isinstance(end, int) and end in differ
        where.append(f"{at} ({token!r})" if token else at if named else f"{at} (its token differs across prompts)")
    return f"{kind} at {', '.join(where)}"


RESIDUAL = {"resid_pre": 0, "resid_post": 1}  # resid_post of layer l is resid_pre of layer l + 1: one state


def _state(kind: str, cell: Mapping[str, Any]) -> tuple:
    """A key equal for cells that patch the same activation (resid_post l and resid_pre l + 1)."""
    if kind in RESIDUAL:
        return ("resid", int(cell.get("layer") or 0) + RESIDUAL[kind], cell.get("pos"))
    return (kind, cell.get("layer"), cell.get("head"), cell.get("pos"))


def _distinct_sites(cells: list) -> list:
    """The strongest cell, then the strongest of each other site type, each a different activation
    (the residual stream at one position is one site however many residual kinds name it)."""
    seen_states, seen_kinds, out = set(), set(), []
    for kind, cell in cells:
        state, family = _state(kind, cell), "resid" if kind in RESIDUAL else kind
        if state in seen_states or family in seen_kinds:
            continue
        seen_states.add(state)
        seen_kinds.add(family)
        out.append((kind, cell))
    return out


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
    b, ci, n = _num(stats.get("slope")), stats.get("slope_ci"), stats.get("slope_n", stats.get("n"))
    if b is None or not isinstance(ci, (list, tuple)) or len(ci) != 2 or any(_num(c) is None for c in ci):
        return None
    said = f"least-squares slope {b:.2f} of attribution on exact{_ci(tuple(ci))}, n = {n} cells"
    if not ci[0] <= 1.0 <= ci[1] and not FAR[0] <= b <= FAR[1]:
        advice = ": use it to rank, not to size" if rank and _significant(_num(stats.get("pearson")), int(n or 0)) else ""
        return f"At {kind} attribution patching's effects {_ratio(b)} ({said}){advice}."
    close = "consistent with the exact size" if ci[0] <= 1.0 <= ci[1] else "close to the exact size"
    return f"At {kind} its sizes are {close} ({said})."


def _case(stats: Mapping[str, Any]) -> str:
    """Which reading of r the cells allow: "few" (under 3 non-zero exact effects), "sparse" (under SPARSE
    or half the cells non-zero), "one point" (significant r that is not without its largest cell, or flips
    sign), "mostly" (under half of |r| without it) or "plain" (r over every cell with its interval)."""
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
    return "mostly" if abs(rest) < abs(r) / 2 else "plain"


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
        return (f"{kind} r = {r:.3f} rests on {nonzero:.0f} non-zero exact effect(s) of {n} cells, "
                "so it says nothing about agreement")
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
    if case == "one point":
        return f"{kind} r = {r:.3f} is driven by its largest cell: {without}, so the agreement rests on one point"
    return f"{kind} r = {r:.3f} is mostly carried by its largest cell: {without}, a much weaker agreement"


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


def _measured_only(s: Mapping[str, Any]) -> str:
    """At chance: which sites were patched, over how many examples and cells, without any site's share
    of the gap, any ranking or attribution patching's correlation with exact patching."""
    sites = sorted(set(s.get("top_sites") or {}) | set(s.get("attribution_correlation") or {}))
    corr = s.get("attribution_correlation") if isinstance(s.get("attribution_correlation"), Mapping) else {}
    cells = sum(int(_num(v.get("n")) or 0) for v in corr.values() if isinstance(v, Mapping))
    said = (f"Measured: exact activation patching ({s.get('direction', 'denoise')}, {s.get('n_examples', '?')} examples)"
            + (f" at {and_join([k.replace('_', ' ') for k in sites])}" if sites else "")
            + (f", and attribution patching against it over {cells} cells" if cells else "")
            + "; no site is ranked and no agreement is read at chance.")
    trace = s.get("causal_tracing")
    ends = (_num(trace.get("clean_metric")), _num(trace.get("corrupted_metric"))) if isinstance(trace, Mapping) else (None,)
    if None not in ends:
        said += (f" Causal tracing: metric {trace['clean_metric']:.3g} on the clean prompts, {trace['corrupted_metric']:.3g} "
                 f"with the {trace.get('span', 'subject')} noised.")
    return said


def _effect_ci(cell: Mapping[str, Any], gap: float | None) -> str:
    """', 95% CI [lo, hi] over n examples' of a top site's effect (its recorded t interval over the
    per-example effects, divided by the gap when the finding states a share of it); '' without one."""
    ci, n = cell.get("ci"), _num(cell.get("n"))
    if not isinstance(ci, (list, tuple)) or len(ci) != 2 or any(_num(c) is None for c in ci):
        return f", n = {n:.0f} examples" if n else ""
    lo, hi = sorted((ci[0] / gap, ci[1] / gap)) if gap else (ci[0], ci[1])
    return f", 95% CI [{lo:.2f}, {hi:.2f}] over {n:.0f} examples" if n else f", 95% CI [{lo:.2f}, {hi:.2f}]"


def _where(kind: str, cell: Mapping[str, Any], s: Mapping[str, Any] | None = None) -> str:
    """'<kind> at layer l, position -k from the end' or '<kind> at LlHh' (a rank check's cell; a KV head: _head)."""
    head, end = cell.get("head"), cell.get("from_end")
    at = f"layer {cell.get('layer')}" if head is None else _head(kind, cell, s)
    return f"{kind} at {at}" + (f", position {end} from the end" if isinstance(end, int) else "")


def _size(x: float, gap: float | None) -> str:
    return f"{x / gap:.2f} of the gap" if gap else f"{x:.3g}"


def _reach(s: Mapping[str, Any] | None, kind: str, cell: Mapping[str, Any]) -> str:
    """', a column only 1 of 8 prompts reach' for a cell of a column fewer than half the prompts reach (its n from
    top_sites; review 10a A3), '' otherwise."""
    rows = ((s or {}).get("top_sites") or {}).get(kind) or []
    same = next((c for c in rows if all(c.get(k) == cell.get(k) for k in ("layer", "head", "pos"))), None)
    if same is None or not thin(same, (s or {}).get("n_examples")):
        return ""
    return f", a column only {_num(same['n']):.0f} of {_num(s['n_examples']):.0f} prompts reach"


def _ranking(kind: str, stats: Mapping[str, Any], gap: float | None, s: Mapping[str, Any] | None = None) -> str | None:
    """What a ranking by attribution patching gets wrong at one site type: its top exact site ranked below
    first (not said when that site is tied: another cell's exact effect lies within its 95% interval or the
    rounding floor, so there is no top to misrank; the rank already ignores attribution differences within
    the floor: rank_checks), and a large exact effect it misses (under 1/MISS of it); None when neither."""
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
    if isinstance(miss, Mapping):
        said.append(f"it misses {_where(kind, miss, s).split(' at ', 1)[1]} (attribution {_size(miss['attribution'], gap)} "
                    f"against exact {_size(miss['effect'], gap)}: {under})")
    return "; ".join(said) or None


def _offsets(places: Mapping[str, Any]) -> str:
    """'-8 from the end in 6 prompts and -11 in 2'."""
    items = sorted(((int(o), int(k)) for o, k in places.items()), key=lambda ok: (-ok[1], -ok[0]))  # most prompts first
    said = [f"{o} from the end in {k} prompt{'s' * (k != 1)}" if i == 0 else f"{o} in {k}" for i, (o, k) in enumerate(items)]
    return and_join(said)


def _token_words(info: Mapping[str, Any]) -> tuple[str, str]:
    """(what the aligned position is, its short name): "each prompt's first position that differs from its clean
    prompt" and "the corrupted token", or, where several positions differ per prompt (review 6 A9: the aligned token
    is the first of them), "2 to 4 positions differ per prompt" and "the first position where the prompts differ"."""
    span = info.get("positions_differ")
    if isinstance(span, (list, tuple)) and len(span) == 2 and all(_num(x) is not None for x in span) and max(span) > 1:
        count = f"{span[0]:.0f}" if span[0] == span[1] else f"{span[0]:.0f} to {span[1]:.0f}"
        return f"{count} positions differ per prompt", "the first position where the prompts differ"
    return "each prompt's first position that differs from its clean prompt", "the corrupted token"


def _corrupted_token(s: Mapping[str, Any], gap: float | None) -> str | None:
    """Where the corrupted token sits at one place from the end in every prompt: the effect aligned on it, named
    where it exceeds every end-aligned cell of its site type and layer by 5% (otherwise the end-aligned column is
    that token's and says it). Prompts that put it at different places: the finding leads with it (_aligned_lead)."""
    info = s.get("at_corrupted_token")
    if not isinstance(info, Mapping) or not isinstance(info.get("sites"), Mapping) or split_token(s):
        return None
    records = [(kind, r) for kind, rows in info["sites"].items() for r in rows if _num(r.get("effect")) is not None]
    if not records:
        return None
    kind, best = max(records, key=lambda kr: abs(kr[1]["effect"]))
    end = best.get("end_aligned") or {}
    if abs(best["effect"]) <= 1.05 * abs(_num(end.get("effect")) or 0.0):
        return None
    token, name = _token_words(info)
    size = (f"{best['effect'] / gap:.2f} of the clean-corrupted gap" if gap else f"{best['effect']:.3g}") + _effect_ci(best, gap)
    other = (f" (the largest end-aligned cell of that layer, at {end['from_end']} from the end, "
             f"{_size(end['effect'], gap)})" if isinstance(end.get("from_end"), int) else "")
    return f"Aligned on {name} ({token}): {kind} at layer {best['layer']} moves {size}{other}."


RESIDUAL_ORDER = ("resid_pre", "resid_post", "resid_mid")  # the aligned lead's site type, the first one measured
LAYERS_SAID = 5  # layers named one by one in the aligned lead; the rest as a range


def _fine(x: float) -> str:
    """A share to 2 decimals, or to one significant digit under 0.01 (0.005, not 0.00)."""
    return f"{x:.2f}" if abs(x) >= 0.01 or x == 0 else f"{x:.1g}"


def _aligned_lead(s: Mapping[str, Any], gap: float | None, metric: str) -> str | None:
    """Review 10a A3 / 10b C1: where the corrupted token sits at different places from the end (split_token), the
    effect at each prompt's own corrupted token, layer by layer, of the residual stream (else the site type that moves
    most there), with its 95% interval and the prompts it holds; the layers after the effect has fallen under CITED
    of the gap for good are said as a range. None where the summary does not record it or the token's place is one."""
    if not split_token(s):
        return None
    info = s["at_corrupted_token"]
    sites = {k: sorted((r for r in rows if _num(r.get("effect")) is not None), key=lambda r: int(r.get("layer") or 0))
             for k, rows in info["sites"].items() if isinstance(rows, list)}
    sites = {k: rows for k, rows in sites.items() if rows}
    if not sites:
        return None
    kind = next((k for k in RESIDUAL_ORDER if k in sites), None) or max(
        sites, key=lambda k: max(abs(r["effect"]) for r in sites[k]))
    rows, normalized = sites[kind], bool(s.get("normalized"))
    total = _num(s.get("n_examples")) or _num(info.get("n"))

    def value(r: Mapping[str, Any]) -> float | None:
        said = share(r, gap, normalized)
        return None if said is None else said[0]

    def small(r: Mapping[str, Any]) -> bool:
        v = value(r)
        return v is not None and abs(v) < CITED

    listed = []
    for i, r in enumerate(rows):
        listed.append(r)
        later = rows[i + 1:]
        if (len(listed) >= LAYERS_SAID and len(later) > 1) or (i and small(r) and all(small(x) for x in later)):
            break
    rest = rows[len(listed):]
    if len(rest) == 1:
        listed, rest = rows, []

    def cell(r: Mapping[str, Any], first: bool) -> str:
        v = value(r)
        size = _fine(v) if v is not None else f"{r['effect']:.3g}"
        ci = r.get("ci")
        ok = isinstance(ci, (list, tuple)) and len(ci) == 2 and all(_num(c) is not None for c in ci)
        bits = []
        if ok:
            lo, hi = sorted((ci[0] / gap, ci[1] / gap)) if gap else sorted(ci)
            bits.append(f"95% CI [{_fine(lo)}, {_fine(hi)}]")
        n = _num(r.get("n"))
        if n is not None:
            bits.append(f"{n:.0f} of {total:.0f} prompts" if total else f"{n:.0f} prompts")
        if first and gap:
            bits.append(f"{r['effect']:+.3g} {metric}")
        unit = " of the clean-corrupted gap" if first and gap else ""
        return f"at layer {r['layer']} {size}{unit}" + (f" ({', '.join(bits)})" if bits else "")

    said = "; ".join(cell(r, i == 0) for i, r in enumerate(listed))
    if rest:
        span = f"layers {rest[0]['layer']}-{rest[-1]['layer']}"
        values = [value(r) for r in rest]
        if all(small(r) for r in rest):
            said += f"; under {CITED:g} of the gap at {span}"
        elif None not in values:
            said += f"; at {span} {_fine(min(values))} to {_fine(max(values))}"
    token, name = _token_words(info)
    places = _offsets(info.get("from_end") or {})
    verb = "restores" if s.get("direction", "denoise") == "denoise" and (value(listed[0]) or 0) >= 0 else "moves the metric by"
    return (f"Patching ({s.get('direction', 'denoise')}, {s.get('n_examples', '?')} examples) the {kind} at "
            f"{name} ({token}; it sits at {places}, so end-aligned columns split its effect) {verb} {said}.")


def _column_caveat(s: Mapping[str, Any], cell: Mapping[str, Any]) -> str:
    """' (its CI reaches 0: 5 of 8 prompts reach this column and 2 of 8 have their changed token there)': what an
    end-aligned cell holds where the corrupted token's place differs across prompts (review 10b C1)."""
    total, n, ci = _num(s.get("n_examples")), _num(cell.get("n")), cell.get("ci")
    if not total:
        return ""
    bits = [] if n is None or n >= total else [f"{n:.0f} of {total:.0f} prompts reach this column"]
    here = changed_there(s, cell.get("from_end"))
    several = _token_words(s.get("at_corrupted_token") or {})[1] != "the corrupted token"
    what = "have their changed token there"
    if several:  # the places of every differing position where recorded, else of the first one only
        what = "differ from their corrupted prompt there" if differ_offsets(s) else "have their first differing position there"
    if not here:
        bits.append("no prompt " + what.replace("have their", "has its").replace("differ from their", "differs from its"))
    else:
        bits.append(f"{here} of {total:.0f}" + ("" if bits else " prompts") + f" {what}")
    reaches = isinstance(ci, (list, tuple)) and len(ci) == 2 and all(_num(c) is not None for c in ci) \
        and min(ci) <= 0 <= max(ci)
    return f" (its CI reaches 0: {and_join(bits)})" if reaches else f" ({and_join(bits)})"


ANSWER = "the answer position (-1 from the end, where the metric is read)"


def _sites(s: Mapping[str, Any], cells: list, gap: float | None, metric: str, cited: list | None = None) -> list[str]:
    """The sentences on the top sites (cells: every (kind, record), largest |effect| first): the positions where
    clean and corrupted differ, once; the lead, where the information enters (the largest residual cell away from
    the answer position) when the metric is read at the last position, else the strongest cell; what reaches the
    answer position and the attention that writes it there; the residual cells there that carry the whole gap
    by construction, once (patching_sites.py); then the strongest cell of each site type not yet named."""
    differ = frozenset(differ_offsets(s))
    normalized = bool(s.get("normalized"))
    aligned = _aligned_lead(s, gap, metric)  # review 10a A3: the token's places differ, so it leads
    info = s.get("at_corrupted_token") or {}
    several = _token_words(info)[1] != "the corrupted token"
    said = [differing_positions(s) if not aligned or several else None, aligned]  # the lead names the one place each

    def name(kc: tuple) -> str:
        return _site(kc[1], kc[0], differ, s)

    def share(cell: Mapping[str, Any]) -> str:  # the effect as a share of the clean-corrupted gap (1 = fully restored)
        effect = cell["effect"]
        text = f"{effect / gap:.2f} of the clean-corrupted gap" if gap else f"{effect:.2f}"
        return text + _effect_ci(cell, gap) + (f" ({effect:+.3g} {metric})" if gap else "")

    notes: list[str] = []  # what the ties of the cells named imply (heads sharing KV heads, a shared effect)

    def brief(kc: tuple, keep: Any = None) -> str:  # '<site> (0.86, 95% CI [..] over n examples)', and its ties
        kind, c = kc
        others = _tied_cells(s, kc, keep)
        named.extend((kind, o) for o in others)
        notes.extend(_head_notes(s, kc, others, gap))
        return f"{name(kc)} ({c['effect'] / gap if gap else c['effect']:.2f}{_effect_ci(c, gap)})" + _tie(kc, others, gap, s)

    answer = s.get("metric_at_last_position", True) is not False  # older summaries: every default metric is
    whole = by_construction(cells, gap, normalized) if answer else []
    trivial = {_state(k, c) for k, c in whole}
    rest = [kc for kc in cells if _state(kc[0], kc[1]) not in trivial]
    enter = entering(rest, gap, normalized) if answer else None
    lead = enter or (rest or cells)[0]
    run = f"Patching ({s.get('direction', 'denoise')}, {s.get('n_examples', '?')} examples)"
    named: list = []  # every cell the sentences name (cited_cells: the maps keep their ticks)
    if enter and aligned:  # an end-aligned column averages the token with others: what it holds is said
        said.append(f"End-aligned (each column one place from the end, averaging whatever tokens the prompts have "
                    f"there), the largest residual cell away from the answer position is the {name(lead)}: "
                    f"{share(lead[1])}{_column_caveat(s, lead[1])}.")
    elif enter:
        where = (", where the information enters (clean and corrupted differ there)," if depth(*lead) == 0
                 or lead[1].get("from_end") in differ else ",")
        said.append(f"Away from the answer position{where} {run[0].lower()}{run[1:]} moves the metric most at the "
                    f"{name(lead)}: {share(lead[1])}.")
    else:
        said.append(f"{run} moves the metric most at the {name(lead)}: {share(lead[1])}.")
    if gap and abs(cells[0][1]["effect"] / gap) < 0.05:
        said.append("No single site moves more than 5% of the gap: the effect is spread out or the task is not solved.")
    reach = reaching(rest, whole, gap, normalized) if answer else None
    write = writer(rest, gap, normalized) if answer else None
    it = "It" if enter and not aligned else "The information"
    top = depth(*whole[0]) if whole else float("inf")

    def there(kind: str) -> Any:  # review 9a C5: a tie named at the answer position is a cell there
        return lambda c: at_answer(c) and (kind not in DEPTH or depth(kind, c) < top)

    if reach and write:
        said.append(f"{it} has reached the answer position at the {brief(reach, there(reach[0]))}, moved there by "
                    f"attention: {brief(write, there(write[0]))}.")
    elif reach or write:
        said.append(f"{it} has reached the answer position at the {brief(reach, there(reach[0]))}." if reach
                    else f"Attention moves it to the answer position: {brief(write, there(write[0]))}.")
    if whole:
        first, kinds = whole[0], {k for k, _ in whole}
        layers = and_join([str(c["layer"]) for _, c in whole]) if len(kinds) == 1 else ""
        also = "" if len(whole) == 1 else (f"; on this run at {first[0]} layers {layers}" if layers else
                                            "; on this run at " + and_join([f"{k} at layer {c['layer']}" for k, c in whole]))
        said.append(f"The residual stream at {ANSWER} carries the whole gap from the {first[0]} at layer "
                    f"{first[1]['layer']} on ({share(first[1])}{also}): once the information has arrived there this "
                    "holds by construction (every later computation at that position reads it; only later attention from "
                    "other positions goes around it), so it says nothing about where the information enters or how it "
                    "moves.")
    main = [kc for kc in (lead, reach, write) if kc] + whole
    named.extend(main)
    seen = {"resid" if k in RESIDUAL or k == "resid_mid" else k for k, _ in main}
    runners = []
    for kind, c in _distinct_sites([kc for kc in rest if all(kc[1] is not x[1] for x in main)]):
        family = "resid" if kind in RESIDUAL or kind == "resid_mid" else kind
        if family not in seen and len(runners) < 2:
            seen.add(family)
            named.append((kind, c))
            runners.append(brief((kind, c)))
    if runners:
        said.append("Next, at other sites: " + "; ".join(runners) + ".")
    if cited is not None:
        cited.extend(named)
    return [x for x in said if x] + list(dict.fromkeys(notes))


def _tied_cells(s: Mapping[str, Any], kc: tuple, keep: Any = None) -> list:
    """Every other cell of kc's site type (top_sites) within kc's 95% interval with kc within its own (tied), that
    `keep` accepts (review 9b A2: the next cell alone left out two of four equal heads), largest |effect| first."""
    kind, cell = kc
    rows = [c for c in (s.get("top_sites") or {}).get(kind) or [] if _num(c.get("effect")) is not None
            and (c is cell or not thin(c, s.get("n_examples")))]  # review 10a A3: no tie with a one-prompt column
    if not any(c is cell for c in rows):
        return []
    return [c for c in rows if c is not cell and (keep is None or keep(c)) and tied(cell, c)]


def _value(cell: Mapping[str, Any], gap: float | None) -> float:
    return cell["effect"] / gap if gap else cell["effect"]


def _tie(kc: tuple, others: list, gap: float | None, s: Mapping[str, Any] | None = None) -> str:
    """', tied with <cell> (share, CI)' for one tied cell; for several, ', tied with L0H3, L0H2 and L0H0 (0.08-0.10
    each, all four within each other's 95% intervals)' (or each within the named cell's and it within theirs)."""
    kind, cell = kc
    if not others:
        return ""
    where = [_where(kind, o, s).split(" at ", 1)[1] for o in others]
    if len(others) == 1:
        return f", tied with {where[0]} ({_value(others[0], gap):.2f}{_effect_ci(others[0], gap)})"
    values = [f"{_value(c, gap):.2f}" for c in [cell, *others]]
    lo, hi = min(values, key=float), max(values, key=float)
    span = lo if lo == hi else f"{lo}-{hi}"
    own = _where(kind, cell, s).split(" at ", 1)[1]
    pairwise = all(tied(a, b) for i, a in enumerate(others) for b in others[i + 1:])
    how = (f"all {len(others) + 1} within each other's 95% intervals" if pairwise
           else f"each within {own}'s 95% interval and {own} within each of theirs")
    return f", tied with {and_join(where)} ({span} each, {how})"


HEADS = ("head_out", "head_out_by_pos")


def _head_notes(s: Mapping[str, Any], kc: tuple, others: list, gap: float | None) -> list[str]:
    """For a head cell tied with others of its layer (review 9b A2): that they read fewer KV heads than they are
    (summary n_heads / n_kv_heads: query head h reads KV head h // (n_heads / n_kv_heads)), and, where the layer's
    attention output at the same place (attn_out: at the head cell's position, or its largest cell for heads
    patched at every position) restores much more than its heads alone in sum (over 1.5 times, and its 95%
    interval above that sum), that the effect is shared among them, not carried by one head."""
    kind, cell = kc
    if kind not in HEADS or cell.get("head") is None:
        return []
    layer, pos = cell.get("layer"), cell.get("pos")
    group = [c for c in [cell, *others] if c.get("layer") == layer]
    notes = []
    heads, kv = _num(s.get("n_heads")), _num(s.get("n_kv_heads"))
    if len(group) > 1 and heads and kv and kv < heads:
        per = int(heads) // int(kv)
        shared = {int(c["head"]) // per for c in group}
        if len(shared) < len(group):
            how = ("multi-query attention: one KV head per layer" if kv == 1
                   else f"grouped-query attention: {heads:.0f} query heads on {kv:.0f} KV heads per layer")
            notes.append(f"The {len(group)} tied layer-{layer} heads share {len(shared)} KV head"
                         f"{'s' * (len(shared) > 1)} ({how}): they read the same keys and values.")
    if len(group) > 1:
        rows = (s.get("top_sites") or {})
        alone = [c for c in rows.get(kind) or [] if c.get("layer") == layer and c.get("pos") == pos
                 and _num(c.get("effect")) is not None]
        attn = [c for c in rows.get("attn_out") or [] if c.get("layer") == layer and _num(c.get("effect")) is not None
                and (pos is None or c.get("pos") == pos)]
        together = max(attn, key=lambda c: abs(c["effect"]), default=None)
        total = sum(c["effect"] for c in alone)
        ci = together.get("ci") if together is not None else None
        low = min(ci) if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(_num(x) is not None for x in ci) else None
        if (together is not None and total * together["effect"] > 0 and abs(together["effect"]) > 1.5 * abs(total)
                and (low is None or (low > total if total > 0 else max(ci) < total))):
            every = "" if heads is None or len(alone) != heads else f"all {len(alone)} of "
            notes.append(f"Patched alone, {every}layer {layer}'s heads restore {_value({'effect': total}, gap):.2f} "
                         f"{'of the gap ' if gap else ''}in sum; together ({_where('attn_out', together)}) "
                         f"{_value(together, gap):.2f}{_effect_ci(together, gap)}: the effect is shared among them, not "
                         "carried by one head.")
    return notes


def _absent(s: Mapping[str, Any]) -> str:
    """'resid_mid: none on this model; its blocks are parallel (...).': the default site types this model
    never computes, each with why (summary["sites_absent"]); '' when none is left out."""
    left = s.get("sites_absent")
    if not isinstance(left, Mapping):
        return ""
    return " ".join(f"{kind}: {str(why).rstrip('.')}." for kind, why in left.items())


def finding(s: Mapping[str, Any]) -> str:
    """The strongest patching sites, attribution patching's agreement and causal tracing's peaks, and the
    site types this model lacks; at chance the clean and corrupted metrics and what was measured only."""
    if "skipped" in s:
        return f"Skipped: {s['skipped']}"
    text = _finding(s)
    absent = _absent(s)
    return f"{text} {absent}" if text and absent else text or absent


def _gap(s: Mapping[str, Any]) -> float | None:
    """The clean-corrupted gap the shares divide by (None: normalised, or no gap)."""
    clean, corrupt = _num(s.get("clean_metric")), _num(s.get("corrupted_metric"))
    return None if s.get("normalized") or clean is None or corrupt is None or clean == corrupt else clean - corrupt


def _ranked(s: Mapping[str, Any]) -> list:
    """Every top cell as (site type, record), largest |effect| first, leaving out the columns fewer than half the
    prompts reach (patching_sites.thin; review 10a A3), unless that leaves none."""
    cells = [(kind, c) for kind, rows in (s.get("top_sites") or {}).items() for c in rows
             if _num(c.get("effect")) is not None]
    cells.sort(key=lambda kc: -abs(kc[1]["effect"]))
    return [kc for kc in cells if not thin(kc[1], s.get("n_examples"))] or cells


def cited_cells(s: Mapping[str, Any]) -> list:
    """The (site type, top_sites record) pairs the finding names (the maps keep their ticks: review 10a B1); [] where
    it ranks none (skipped, at chance, a gap within noise)."""
    if "skipped" in s or _chance(s) is not None or isinstance(s.get("gap_within_noise"), Mapping):
        return []
    cells, out = _ranked(s), []
    if cells:
        _sites(s, cells, _gap(s), _words(s.get("metric", "")), out)
    return out


def _finding(s: Mapping[str, Any]) -> str:
    parts = []
    clean, corrupt = _num(s.get("clean_metric")), _num(s.get("corrupted_metric"))
    gap = _gap(s)
    metric = _words(s.get("metric", ""))
    if gap is not None:
        parts.append(f"Clean prompts give a {metric} of {clean:.3g}, corrupted ones {corrupt:.3g}.")
        if _at_chance(s, s.get("metric"), clean):
            parts.append("The model is at chance on the clean prompts (logit difference near 0): there is no behaviour to "
                         "restore, so the patching maps show noise.")
    if _chance(s) is not None:  # shares of a gap between two chance-level metrics are noise: what was measured only
        return " ".join(parts + [_measured_only(s)])
    cells = _ranked(s)
    small = s.get("gap_within_noise")
    if isinstance(small, Mapping) and cells:  # a share of a gap that is noise is not a measurement
        cells = []
        parts.append(f"The clean-corrupted gap is within noise ({small.get('reason', 'no reason recorded')}): effects "
                     "normalised by it (shares of the gap) are not meaningful, so no site is ranked.")
    if cells:
        parts.extend(_sites(s, cells, gap, metric))
        aligned = _corrupted_token(s, gap)
        if aligned:
            parts.append(aligned)
    if words := _window_words(s.get("sliding_windows")):
        parts.append(words)
    corr = s.get("attribution_correlation")
    if isinstance(corr, Mapping):
        said = [_correlation(k, v, s) for k, v in corr.items() if isinstance(v, Mapping) and _num(v.get("pearson")) is not None]
        if said:
            parts.append("Attribution patching vs exact (Pearson r): " + "; ".join(said) + ".")
            rank = bool(cells)  # sites are ranked (not at chance, nor over a gap within noise)
            wrong = {k: _ranking(k, v, gap, s) for k, v in corr.items() if isinstance(v, Mapping)} if rank else {}
            wrong = {k: w for k, w in wrong.items() if w}
            slopes = [_slope(k, v, rank and k not in wrong) for k, v in corr.items() if isinstance(v, Mapping)
                      and _num(v.get("pearson")) is not None and _case(v) == "plain"]
            slopes = [x for x in slopes if x]
            parts.append(" ".join(slopes) if slopes
                         else "A high r can hide a scale error: see the per-site slopes in the figure.")
            if wrong:
                parts.append("Ranked by attribution patching, sites come out wrong: " + "; ".join(
                    f"at {k}, {w}" for k, w in wrong.items()) + ". Do not rank sites by it on this model at "
                    + and_join(list(wrong)) + ".")
    trace = s.get("causal_tracing")
    if isinstance(trace, Mapping):
        clean, corrupt = _num(trace.get("clean_metric")), _num(trace.get("corrupted_metric"))
        if clean is not None and corrupt is not None:
            n = trace.get("n_examples")
            parts.append(f"Causal tracing: noising the {trace.get('span', 'subject')} drops the metric from {clean:.3g} "
                         f"to {corrupt:.3g}" + (f" (mean over {n} prompts)." if n is not None else "."))
    return " ".join(parts)


def _window_words(w: Any) -> str:
    """Review 9a B2: on a sliding-window model, how many position cells the windows keep from the answer
    (0 by construction, hatched in the maps), so their zeros are not read as a finding."""
    if not isinstance(w, Mapping) or not w.get("unreachable"):
        return ""
    windows = {i: v for i, v in enumerate(w.get("windows") or []) if v}
    return (f"Sliding windows ({sliding_words(windows, len(w.get('windows') or []))}): {w['unreachable']} of the "
            f"{w.get('cells', '?')} position cells lie further before the answer position than the windows carry a "
            "change (the sum of window - 1 over the layers from there to the end), so their 0 is by construction "
            "(hatched in the maps), not a measured absence.")
