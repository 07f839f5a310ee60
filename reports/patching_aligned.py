"""Where the corrupted token sits in patching's prompts, in words (reports/patching_words.py's finding): the effect
aligned on each prompt's corrupted token (or first differing position) where it exceeds the end-aligned columns,
the lead layer by layer where the token's place from the end differs across prompts (end-aligned columns then split
its effect), and what such an end-aligned cell holds: the prompts that reach it, the token most of them have there
and how many are changed there, one token or a mixture (column_holds).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headscope.reports.findings import _num, and_join, ci_pair
from headscope.reports.patching_sites import (
    CITED,
    _effect_ci,
    _size,
    changed_there,
    differ_offsets,
    end_words,
    share,
    share_span,
    split_token,
)


def _offsets(places: Mapping[str, Any], ends: str = "from the end") -> str:
    """'-8 from the end in 6 prompts and -11 in 2' (ends: "from the prompt's end" on answers of several tokens)."""
    items = sorted(((int(o), int(k)) for o, k in places.items()), key=lambda ok: (-ok[1], -ok[0]))  # most prompts first
    said = [f"{o} {ends} in {k} prompt{'s' * (k != 1)}" if i == 0 else f"{o} in {k}" for i, (o, k) in enumerate(items)]
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
    if not isinstance(info, Mapping) or not isinstance(info.get("sites"), Mapping) or split_token(s) or _orders(s):
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
        ci = ci_pair(r.get("ci"))
        bits = []
        if ci:
            lo, hi = share_span(r, gap) if gap else sorted(ci)
            bits.append(f"95% CI [{_fine(lo)}, {_fine(hi)}]")
        bits += _n_and_effect(r, total, first and gap, metric)
        unit = " of the clean-corrupted gap" if first and gap else ""
        return f"at layer {r['layer']} {size}{unit}" + (f" ({', '.join(bits)})" if bits else "")

    parts = [cell(r, i == 0) for i, r in enumerate(listed)]
    span = info.get("positions_differ")
    if (kind == "resid_pre" and _num(listed[0].get("layer")) == 0 and isinstance(span, (list, tuple)) and len(span) == 2
            and all(_num(x) == 1 for x in span)):  # review 20a B3: the token is each pair's only difference
        parts[0] += (", by construction (patching the embedding of each pair's only differing token makes the patched "
                     "run the clean run)")
    said = "; ".join(parts)
    if rest:
        span = f"layers {rest[0]['layer']}-{rest[-1]['layer']}"
        values = [value(r) for r in rest]
        if all(small(r) for r in rest):
            said += f"; under {CITED:g} of the gap at {span}"
        elif None not in values:
            said += f"; at {span} {_fine(min(values))} to {_fine(max(values))}"
    token, name = _token_words(info)
    places = _offsets(info.get("from_end") or {}, end_words(s))
    verb = "restores" if s.get("direction", "denoise") == "denoise" and (value(listed[0]) or 0) >= 0 else "moves the metric by"
    return (f"Patching ({s.get('direction', 'denoise')}, {s.get('n_examples', '?')} examples) the {kind} at "
            f"{name} ({token}; it sits at {places}, so end-aligned columns split its effect) {verb} {said}.")


ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth")


def _orders(s: Mapping[str, Any]) -> list:
    """The summary's per-order aligned records (at_corrupted_token.orders: several positions differ in every prompt),
    each as (order, its strongest (site type, record) by |effect|, the order's record); [] where not recorded."""
    info = s.get("at_corrupted_token")
    orders = info.get("orders") if isinstance(info, Mapping) else None
    out = []
    for o in orders if isinstance(orders, list) else []:
        sites = o.get("sites") if isinstance(o, Mapping) else None
        cells = [(k, r) for k, rows in (sites or {}).items() if isinstance(rows, list) for r in rows
                 if isinstance(r, Mapping) and _num(r.get("effect")) is not None]
        if cells and isinstance(o.get("order"), int) and 1 <= o["order"] <= len(ORDINALS):
            out.append((o["order"], max(cells, key=lambda kr: abs(kr[1]["effect"])), o))
    return out if len(out) > 1 else []


def _n_and_effect(r: Mapping[str, Any], total: float | None, effect: Any, metric: str) -> list[str]:
    """A cited cell's "k of n prompts" and, for the first cell said (`effect`), its raw effect in the metric's unit."""
    n, bits = _num(r.get("n")), []
    if n is not None:
        bits.append(f"{n:.0f} of {total:.0f} prompts" if total else f"{n:.0f} prompts")
    if effect:
        bits.append(f"{r['effect']:+.3g} {metric}")
    return bits


def _orders_lead(s: Mapping[str, Any], gap: float | None, metric: str) -> str | None:
    """Review 12b A2: where every prompt has several differing positions (a swap of two names), each is aligned over
    every prompt on its own (the first, the second, ...), and the finding names the one that moves the metric most,
    with its share, 95% interval and n, then the others; where prompts differ in how many positions differ, only the
    ones every prompt has are aligned, and it says so. None where the summary records no orders."""
    orders = _orders(s)
    if not orders:
        return None
    info = s["at_corrupted_token"]
    normalized, total = bool(s.get("normalized")), _num(s.get("n_examples")) or _num(info.get("n"))

    def size(kind: str, r: Mapping[str, Any], first: bool) -> str:
        said = share(r, gap, normalized)
        value = _fine(said[0]) if said else f"{r['effect']:.3g}"
        bits = []
        if said and said[1]:
            bits.append(f"95% CI [{_fine(said[1][0])}, {_fine(said[1][1])}]")
        elif ci_pair(r.get("ci")):
            lo, hi = ci_pair(r["ci"])
            bits.append(f"95% CI [{lo:.3g}, {hi:.3g}]")
        bits += _n_and_effect(r, total, first and gap, metric)
        unit = " of the clean-corrupted gap" if first and said and gap else ""
        return f"{value}{unit} at the {kind} at layer {r['layer']} ({', '.join(bits)})"

    ranked = sorted(orders, key=lambda o: -abs(o[1][1]["effect"]))
    (order, (kind, best), _), rest = ranked[0], ranked[1:]
    span = info.get("positions_differ")
    count = len(orders)
    if isinstance(span, (list, tuple)) and len(span) == 2 and span[0] != span[1]:
        which = (f"prompts differ in how many positions differ ({span[0]:.0f} to {span[1]:.0f}), so the first {count}, "
                 "which every prompt has, are aligned, each")
    else:
        which = f"{count} positions differ per prompt, each aligned"
    verb = "restores" if s.get("direction", "denoise") == "denoise" and best["effect"] >= 0 else "moves the metric by"
    others = "; ".join(f"the {ORDINALS[o - 1]}, at its largest cell, {size(k, r, False)}" for o, (k, r), _ in sorted(rest))
    return (f"Patching ({s.get('direction', 'denoise')}, {s.get('n_examples', '?')} examples) aligned on each "
            f"differing position in order ({which} over every prompt at its own place): the {ORDINALS[order - 1]} "
            f"{verb} {size(kind, best, True)}" + (f"; {others}" if others else "") + ".")


def column_holds(s: Mapping[str, Any], cell: Mapping[str, Any]) -> tuple[str, bool] | None:
    """What an end-aligned cell's column holds, from the summary's at_corrupted_token.column_tokens and the places where
    prompts differ (issue 34: "averaging whatever tokens" was said of every column, one token or not): (words, whether
    it is a mixture). One token on every prompt that reaches it, changed on none: "one token, 'x' on all 8 prompts
    there, changed in none"; each prompt's changed token: "each of the 8 prompts there has its changed token at this
    place, not a mixture"; else a mixture, with the most common token's count and the prompts changed there. None where
    the summary does not record the column (older runs)."""
    info = s.get("at_corrupted_token")
    holds = (info.get("column_tokens") or {}) if isinstance(info, Mapping) else {}
    place = holds.get(str(cell.get("from_end"))) if isinstance(holds, Mapping) else None
    if not isinstance(place, Mapping) or _num(place.get("n")) is None or not _num(place.get("of")):
        return None
    k, of, token = int(place["n"]), int(place["of"]), str(place.get("token", ""))
    here = min(changed_there(s, cell.get("from_end")), of)  # prompts that differ from their corrupted one there
    every = "both" if of == 2 else f"all {of}"
    if here == of:
        return f"not a mixture: each of the {of} prompts there has its changed token at this place", False
    if here == 0 and k == of:
        return f"one token: {token!r} on {every} prompts there, changed in none", False
    changed = (f"changed in {here} of them" if here else "changed in none")
    if k == of:
        return f"a mixture of changed and unchanged tokens: {token!r} on {every} prompts there, {changed}", True
    return f"a mixture of tokens: {token!r} on {k} of the {of} prompts there, other tokens on the rest, {changed}", True


def _column_caveat(s: Mapping[str, Any], cell: Mapping[str, Any]) -> str:
    """' (its CI reaches 0; 5 of 8 prompts reach this column; a mixture of tokens: ...)': what an end-aligned cell holds
    where the corrupted token's place differs across prompts (review 10b C1; issue 34: column_holds, where recorded;
    older summaries: the prompts with their changed token there)."""
    total, n, ci = _num(s.get("n_examples")), _num(cell.get("n")), ci_pair(cell.get("ci"))
    if not total:
        return ""
    bits = [] if n is None or n >= total else [f"{n:.0f} of {total:.0f} prompts reach this column"]
    reaches = ci is not None and min(ci) <= 0 <= max(ci)
    holds = column_holds(s, cell)
    if holds is not None:
        return " (" + "; ".join((["its CI reaches 0"] if reaches else []) + bits + [holds[0]]) + ")"
    here = changed_there(s, cell.get("from_end"))
    several = _token_words(s.get("at_corrupted_token") or {})[1] != "the corrupted token"
    what = "have their changed token there"
    if several:  # the places of every differing position where recorded, else of the first one only
        what = "differ from their corrupted prompt there" if differ_offsets(s) else "have their first differing position there"
    if not here:
        bits.append("no prompt " + what.replace("have their", "has its").replace("differ from their", "differs from its"))
    else:
        bits.append(f"{here} of {total:.0f}" + ("" if bits else " prompts") + f" {what}")
    return f" (its CI reaches 0: {and_join(bits)})" if reaches else f" ({and_join(bits)})"
