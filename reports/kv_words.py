"""The `kv` finding in words (reports/plots_kv.py's `finding`, the family's headline): bytes per token and at
full context, the grouped-query attention saving, the first key's norm against the others' (what a k_norm
allows), the attention sinks, and per eviction policy the smallest budget within 1% of the full cache over
the prompts it evicts from, with its interval, its answers and where it misses; at chance only what was
measured. Its parts: kv_cache_words.py (size, saving, key norms), kv_numbers.py (one row in words),
kv_policy_words.py (the eviction policies).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headscope.analyses.core.chance import clear_of
from headscope.reports.findings import _chance, _num, _words, sink_sentence
from headscope.reports.kv_cache_words import _gqa, _norm_sentence, _size_sentence, distance_sentence
from headscope.reports.kv_numbers import (
    SHORT_UNITS,
    _answers,
    _band,
    _coarse_note,
    _few_words,
    _full_value,
    _guess,
    _how_sure,
    _kept,
    _rounding_held,
    _unit,
    _with_units,
)
from headscope.reports.kv_policy_words import (
    _above_words,
    _closest_overall,
    _drops,
    _misses,
    _not_shown,
    _windowed,
    binding_windows,
    closest_policies,
    missed_words,
)


def _misses_but(e: Mapping[str, Any], budget: Any) -> Mapping[str, Any]:
    """A policy's holding record without `budget` among its missed rows (the clause states that row already), for
    _misses; `e` itself where that budget is not among them or the record keeps no missed_rows (an older summary)."""
    rows = [r for r in e.get("missed_rows") or [] if isinstance(r, Mapping)]
    if budget not in (e.get("missed") or []) or len(rows) != len(e.get("missed") or []):
        return e
    rows = [r for r in rows if r.get("budget") != budget]
    if not rows:
        return {**e, "missed": [], "missed_rows": [], "misses": None, "misses_diff": None}
    return {**e, "missed": [r["budget"] for r in rows], "missed_rows": rows, "every_evicting_missed": False,
            "misses": [min(abs(r["change"]) for r in rows), max(abs(r["change"]) for r in rows)],
            "misses_diff": [min(abs(r["diff"]) for r in rows), max(abs(r["diff"]) for r in rows)]
            if all(_num(r.get("diff")) is not None for r in rows) else None}


def _holding(s: Mapping[str, Any], hold: Mapping[str, Any], full: float) -> list[str]:
    """The sentences of the summary's holding_budgets (analyses/kv/holding.py)."""
    tol, grid = float(hold.get("tolerance", 0.01)), hold.get("grid") or []
    holds = any((e.get("at") or {}).get("budget") is not None for e in (hold.get("policies") or {}).values())
    headline = None if holds else (closest_policies(hold, tol) or (None, []))[0]  # the policy the headline names
    n_sink, guess = s.get("n_sink"), _guess(hold)
    windowed = _windowed(s, list(hold.get("policies") or {}))
    rounded = (f", or past it by less than one {s.get('dtype') or 'dtype'} rounding step of the metric"
               if any(e.get("rounding_held") for e in (hold.get("policies") or {}).values()) else "")
    head = f"Full-cache {_words(s.get('metric', 'metric'))} {_full_value(s, full)}. "
    chance, band = _num(hold.get("chance")), _num(hold.get("band"))
    if hold.get("basis") == "span" and chance is not None:  # review 14b B2: a log-probability's 0 is no scale
        head += (f"Within {100 * tol:.0f}% of the span from chance ({chance:.3g} {_unit(s)}, a uniform guess over the "
                 f"vocabulary) to the full cache" + (f", {band:.2g} {_unit(s)} at the mean above" if band is not None
                                                     else "") + " (a log-probability's 0 is its ceiling, not a scale; "
                 f"each budget's span from its own prompts' full cache; its 95% CI inside +-{100 * tol:.0f}%")
    else:
        head += f"Within {100 * tol:.0f}% of it (its 95% CI inside +-{100 * tol:.0f}%"
    head += (f"{rounded}, over the prompts a budget evicts from; "
             f"budgets on the grid {', '.join(str(b) for b in grid)}): ")
    said, notes, told = [], [], False
    for policy, e in (hold.get("policies") or {}).items():
        name = policy.replace("_", " ")
        shown: set[int] = set()  # budgets whose row this policy's clause already states
        if policy == headline and isinstance(e.get("closest"), Mapping):  # review 17a B2: the headline states its
            shown.add(e["closest"].get("budget"))  # closest row, above or below the full cache with its interval: once
        at = e.get("at")
        if at is not None:
            where = f"between {e['below']} and {e['budget']} on this grid" if e.get("below") is not None else \
                "from the grid's smallest budget that evicts"
            kept = (f"keeping a median {100 * at['share']:.0f}% of each prompt's cache, every layer as it holds it"
                    if windowed else f"a median {100 * at['share']:.0f}% of each prompt's context")
            held = _num(at.get("rounding_miss")) is not None and _num(at.get("rounding_floor")) is not None
            lead = f", within {100 * tol:.0f}% up to {s.get('dtype') or 'the model dtype'} rounding" if held else ""
            rounding = (f"; its 95% CI passes the band by {at['rounding_miss']:.2g} {_unit(s)}, less than one rounding "
                        f"step of the metric ({at['rounding_floor']:.2g} {_unit(s)})" if held else "")
            text = (f"{name} from {e['budget']} positions{lead} ({where}; {kept}; {at['n_evicting']} of "
                    f"{at['n_examples']} prompts evict anything there; {_band(at, tol)}{rounding}{_answers(at, guess)})")
        elif e.get("consistent_from") is not None:
            rows = [r for r in e.get("not_shown") or [] if r["budget"] >= e["consistent_from"]]
            text = _not_shown(name, rows, tol, guess, s)
            shown.update(r["budget"] for r in rows[:1])  # its rounding (review 18b B1) said in its clause
            held = [str(b) for b, v in (e.get("verdicts") or {}).items()
                    if v == "holds" and int(b) >= e["consistent_from"]]
            if held:  # review 18c A2: a budget that holds is said as such, not folded into "not shown"
                text = text[:-1] + f"; it holds at budget(s) {', '.join(held)} (its 95% CI inside the band))"
        elif e.get("worst_evicting") is not None:
            w, c = e["worst_evicting"], e.get("closest")
            shown.add(w["budget"])  # its interval and how sure are said here: not again below (review 15d C6)
            few = _num(w.get("ci_low")) is None  # review 17b A3: its largest budget evicts from too few prompts
            if c is not None and not few and abs(c["change"]) >= abs(w["change"]) - 1e-9:  # no closer than its largest
                c = w
            how = "above" if w["change"] > tol else "below"
            sure = clear_of(w.get("ci_low"), w.get("ci_high"), tol) == "band"  # review 14bv B1
            text = f"{name} {missed_words(e, tol)} ("
            if c is not None and c["budget"] != w["budget"]:  # the headline's policy: said there (review 15d C6)
                text += f"closest at budget {c['budget']}: " + ("as above; " if policy == headline else
                                                                f"{_kept(c, full, tol)}{_band(c, tol)}{_answers(c, guess)}; ")
            text += f"at {w['budget']}, its largest budget that evicts"  # review 15d C6: short; its sign says the side
            if any(r.get("budget", 0) > w["budget"] for r in e.get("too_few") or []):  # review 18c A2
                text += " from 2 prompts or more"
            text += f", still more than {100 * tol:.0f}% {how} the full cache" if sure else ""
            if policy == headline and (e.get("closest") or {}).get("budget") == w["budget"]:  # review 15d C6: said there
                text += ": as above"
            else:
                text += ": " + (_kept(w, full, tol) if c is None or c["budget"] == w["budget"] else "") + \
                    f"{_band(w, tol)}{_answers(w, guess)}" + _how_sure(w, how, tol, s, undecided=not sure)
                if few:
                    text += (f"; one prompt, no interval: too few to call it within or outside {100 * tol:.0f}%"
                             if w.get("n_evicting") == 1 else "; no interval: too few prompts to call it within or outside "
                             f"{100 * tol:.0f}%")
            rest = _misses_but(e, w["budget"])  # review 17a B2: its largest budget's fall is said above, once
            if rest.get("misses"):
                text += f"; {_misses(rest, tol)}"
            earlier = [str(r["budget"]) for r in e.get("cannot_tell") or [] if r.get("budget") != w["budget"]]
            if earlier:
                text += (f"; cannot tell at budget(s) {', '.join(earlier)}"
                         + ("" if told else " (its 95% CI reaches into the band)"))
                told = True  # review 15d C6: the reason once
            if e.get("monotone") is False:
                text += ("; not monotone in the budget"
                         + (f" (budget {c['budget']} is closer than {w['budget']})" if c and c["budget"] != w["budget"] else ""))
            text += ")"
        else:
            text = f"{name}: no budget on the grid evicts anything"
        few = [r for r in e.get("too_few") or [] if r.get("budget") not in shown]  # review 18c A2: too few to say
        if few and text.endswith(")"):
            text = text[:-1] + _few_words(few, tol) + ")"
        said.append(text)
        coarse = [r for r in e.get("rounding_coarse") or [] if r.get("budget") not in shown]
        if coarse:  # review 18b B1: a rounding step too large against the band: cannot tell at this precision
            notes.append(_coarse_note(name, coarse, s))
        later = [r for r in e.get("rounding_held") or [] if r.get("budget") != (at or {}).get("budget")]
        if later:  # the verdict's own budget says its rounding inside its parenthesis (review 13b C1)
            notes.append(_rounding_held(name, later, s))
        sinks = e.get("sinks_only_below")
        if sinks is not None and e.get("below") is not None and e["below"] < sinks <= e["budget"]:
            notes.append(f"With {n_sink if n_sink is not None else sinks - 1} sink positions, sink window keeps no recent "
                         f"token below budget {sinks}, so its crossing between {e['below']} and {e['budget']} is the "
                         "grid's and the sinks' artefact, not a property of the model.")
        notes += _above_words(name, [r for r in e.get("above") or [] if r.get("budget") not in shown], tol, s)
    parts = [head + "; ".join(said) + "."] + ([windowed] if windowed else []) + notes
    if hold.get("whole_from") is not None:
        parts.append(f"From budget {hold['whole_from']} on, every prompt is kept whole (no prompt evicts anything).")
    if not holds:  # review 15d C6: the headline (no policy holds; the closest, with its interval) comes first
        parts.insert(0, _closest_overall(hold, full, tol, _words(s.get("metric", "metric")), guess, s))
    drops = _drops(s, hold)
    return parts + ([drops] if drops else [])


def finding(s: Mapping[str, Any]) -> str:
    """Cache size, GQA saving, the first key's norm and per policy the smallest budget within 1% of the
    full cache over the prompts it evicts from (holding_budgets; older summaries: from the means)."""
    parts = []
    per_token, full_ctx = _num(s.get("bytes_per_token")), _num(s.get("bytes_at_n_ctx"))
    if per_token is not None:
        parts.append(_size_sentence(s, per_token, full_ctx))
    gqa = _gqa(s)
    if gqa:
        parts.append(gqa)
    norms = _norm_sentence(s)
    if norms:
        parts.append(norms)
    sinks = sink_sentence(s.get("sinks"), n_sink=1, task=s.get("task"),  # the attention the first key receives
                          windowed=list(binding_windows(s)), baseline=s.get("sink_baseline"),
                          nope=s.get("nope_layers") or ())  # review 19c B2
    if sinks:
        parts.append(sinks)
        bos = s.get("first_token_added_bos")
        if isinstance(bos, str) and bos:  # review 10b A1: not the model's own sink on the user's text
            parts.append(f"The first token is {bos!r}, the BOS headscope put in front of every prompt (the tokenizer "
                         "adds none; --no-prepend-bos leaves it out): the attention on it is on a token the prompts "
                         "as tokenized do not have.")
    lead = len(parts)  # where the eviction headline goes: after the cache size (review 15d C6)
    full = _num(s.get("metric_unevicted"))
    budgets = s.get("metric_per_policy_budget") or {}
    hold = s.get("holding_budgets")
    if isinstance(s.get("eviction_skipped"), str):  # review 16dv B1: the cache facts above hold; only this part is skipped
        parts.append(f"Eviction what-if not run: {s['eviction_skipped']}.")
    elif full is not None and _chance(s) is not None:
        mean, n = _num(_chance(s).get("mean")), _num(_chance(s).get("n_examples"))
        # issue 34: the chance sentence gave it: not again. Review 14a A2: not a second value either where the eviction
        # runs' cached decode rounds differently (bfloat16: -0.167 against the whole pass's -0.173, a plain Hugging Face
        # pass's value): the same prompts' full-cache metric is stated once, from the whole pass
        if mean is not None and (n is None or _num(s.get("n_examples")) in (None, n)):
            parts.append(f"The full-cache metric is the {_words(s.get('metric', 'metric'))} above.")
        else:
            parts.append(f"Full-cache metric {_full_value(s, full)}.")
    elif full is not None and isinstance(hold, Mapping) and hold.get("no_effect"):
        parts.append(no_effect_sentence(hold["no_effect"], s.get("context_range")))
    elif full is not None and isinstance(hold, Mapping):
        said = _holding(s, _with_units(hold, SHORT_UNITS.get(str(s.get("metric")), "in the metric's units")), full)
        at = 1 if per_token is not None else 0  # review 15d C6: what fits, then what holds, first
        parts = parts[:at] + said[:1] + parts[at:lead] + said[1:]
    elif full is not None and budgets:
        context = _num(s.get("context_positions")) or max((int(b) for v in budgets.values() for b in v), default=None)
        ok, saving = [], False
        for policy, by_budget in budgets.items():
            kept = sorted(int(b) for b, v in by_budget.items() if _num(v) is not None and abs(v - full) <= 0.01 * abs(full))
            name = policy.replace("_", " ")
            if not kept:
                ok.append(f"{name} never")
            elif context is not None and kept[0] >= context:
                ok.append(f"{name} only with the whole context")
            else:
                saving = True
                ok.append(f"{name} from {kept[0]} positions" + (f" of {context:.0f} (the longest prompt)" if context else ""))
        n = s.get("n_examples")
        parts.append(f"Full-cache {_words(s.get('metric', 'metric'))} {full:.3g}"
                     + (f" (mean over {n} examples)" if n is not None else "") + "; within 1% of it (|change| <= 1%, "
                     "averaged over every prompt, also those a budget keeps whole): " + ", ".join(ok) + ".")
        if not saving:
            parts.append("No eviction policy saves anything here: every policy needs the whole context"
                         + (f" ({context:.0f} positions)" if context else "") + " to stay within 1% (or never gets there).")
    evicted = full is not None and _chance(s) is None and (isinstance(hold, Mapping) or budgets)  # eviction reported
    return " ".join(parts + ([distance_sentence(s)] if evicted and distance_sentence(s) else []))


def no_effect_sentence(rows: list, context: Any = None) -> str:
    """Review 16d B2: an eviction that changed no prompt's metric at all, said as such instead of "within 1%"."""
    most = context[1] if isinstance(context, (list, tuple)) and len(context) == 2 else None
    of = f" of up to {most} context positions" if isinstance(most, (int, float)) else ""
    where = "; ".join(f"{str(r['policy']).replace('_', ' ')} at budget {r['budget']}{of} "
                      f"({r['n_evicting']} prompts evicted from)" for r in rows)
    return (f"The eviction had no effect: {where} left every prompt's metric exactly at its full-cache value, to the "
            "last digit, which evicting most of a context does not do; the eviction mask did not reach the model, so "
            "no eviction result is reported here.")
