"""The `kv` finding in words (reports/plots_kv.py's `finding`, the family's headline): bytes per token and at
full context, the grouped-query attention saving, the first key's norm against the others' (what a k_norm
allows), the attention sinks, and per eviction policy the smallest budget within 1% of the full cache over
the prompts it evicts from, with its interval, its answers and where it misses; at chance only what was
measured. `_span2` is the figures' too.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from headscope.analyses.core.chance import clear_of
from headscope.reports.circuits_words import FEW_ANSWERS
from headscope.reports.findings import _chance, _num, _words, and_join, attention_kind, sink_sentence


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


TOLERANCE = 0.01  # holding.py's band, for rows said without their summary's


def _digits(x: float, tol: float) -> int:
    """Decimals of a percentage: 2 within 0.1 points of the band's edge (review 9a C1: -1.04% printed -1.0% read as
    inside a 1% band it misses), else 1."""
    return 2 if abs(abs(100 * x) - 100 * tol) < 0.1 else 1


def _pc(x: float, tol: float = TOLERANCE) -> str:
    """'+1.4%'; under 0.05% two significant digits ('+0.015%', not '+0.0%' for a change that is not 0)."""
    if x != 0 and abs(100 * x) < 0.05:
        return f"{100 * x:+.2g}%"
    return f"{100 * x:+.{_digits(x, tol)}f}%"


def _share(x: float, tol: float = TOLERANCE) -> str:
    """A change's size or the share it keeps, unsigned: '1.04%' near the band's edge, '24.1%' elsewhere."""
    return f"{100 * abs(x):.{_digits(x, tol)}f}%"


SHORT_UNITS = {"logit_diff": "logits", "logprob": "nats", "accuracy": "(accuracy, 0-1)"}


def _band(row: Mapping[str, Any], tol: float = TOLERANCE) -> str:
    """'+4.5% (95% CI [+3.1%, +5.9%], per example -0.12 to +0.8 logits, n = 16)' from a holding row (two decimals
    near the band's edge). The per-example range is each prompt's policy - full in the metric's units (the row's
    "unit", _with_units), never a share of its own full-cache value (review 10b C2: that value can lie near or
    below 0); an older summary's per-example shares are left out."""
    inner = []
    if _num(row.get("ci_low")) is not None and _num(row.get("ci_high")) is not None:
        inner.append(f"95% CI [{_pc(row['ci_low'], tol)}, {_pc(row['ci_high'], tol)}]")
    if _num(row.get("per_example_diff_low")) is not None:
        unit = row.get("unit") or "in the metric's units"
        inner.append(f"per example {_span_units(row['per_example_diff_low'], row['per_example_diff_high'])} {unit}")
    return f"{_pc(row['change'], tol)}{row.get('of') or ''} (" + ", ".join(inner + [f"n = {row['n_evicting']}"]) + ")"


def _span_units(lo: float, hi: float) -> str:
    """'-37.8 to +0.7': both ends with the decimals of 3 significant digits of the larger |end|."""
    top = max(abs(lo), abs(hi))
    digits = max(0, 2 - math.floor(math.log10(top))) if top > 0 and math.isfinite(top) else 2
    return f"{lo:+.{digits}f} to {hi:+.{digits}f}"


def _with_units(hold: Any, unit: str, of: str | None = None) -> Any:
    """A copy of holding_budgets' record with `unit` on every row that has a per-example range (for _band) and `of`,
    what its change is a share of (" of the span" where the record's basis is the span from chance: review 14b B2)."""
    if of is None:
        of = " of the span" if isinstance(hold, Mapping) and hold.get("basis") == "span" else ""
    if isinstance(hold, Mapping):
        out = {k: _with_units(v, unit, of) for k, v in hold.items()}
        if "per_example_diff_low" in out:
            out["unit"], out["of"] = unit, of
        return out
    if isinstance(hold, list):
        return [_with_units(v, unit, of) for v in hold]
    return hold


def _eps(name: str) -> float | None:
    """torch's machine epsilon of a floating dtype named as the summary records it ("bfloat16"), else None."""
    dtype = getattr(torch, name, None)
    return float(torch.finfo(dtype).eps) if isinstance(dtype, torch.dtype) and dtype.is_floating_point else None


def _rounding(s: Mapping[str, Any], bound: Any, end: str) -> str:
    """Review 9a C4: 'its upper end, +0.02%, lies within one bfloat16 rounding step of the full-cache metric, 0.62%:
    rounding alone can put it either side of 0' where a "reaches 0" bound is that close to 0, else ''. One step: the
    spacing of the model dtype's floats at the full-cache metric, relative to it."""
    full, b = _num(s.get("metric_unevicted")), _num(bound)
    eps = _eps(str(s.get("dtype") or "").removeprefix("torch."))
    if full is None or b is None or eps is None or full == 0:
        return ""
    step = eps * 2.0 ** math.floor(math.log2(abs(full))) / abs(full)  # the float spacing at |full|, relative
    if abs(b) > step:
        return ""
    return (f"its {end} end, {100 * b:+.2f}%, lies within one {s['dtype']} rounding step of the full-cache metric, "
            f"{100 * step:.2g}%: rounding alone can put it either side of 0")


def _gqa(s: Mapping[str, Any]) -> str:
    """The grouped-query sentence whenever the model has fewer KV heads than query heads (from the
    head counts, else from the MHA-equivalent bytes; multi-query with one KV head); gqa_saving is the share of the
    MHA cache saved."""
    per_token, mha = _num(s.get("bytes_per_token")), _num(s.get("mha_bytes_per_token"))
    heads, kv_heads = _num(s.get("n_heads")), _num(s.get("n_kv_heads"))
    latent = s.get("latent")
    if latent and per_token is not None and mha:  # review 15d A2: MLA caches one latent for all heads
        return (f"Multi-head latent attention caches one latent per layer and position for all {heads:.0f} heads "
                f"({latent[0]} + {latent[1]} roped numbers), {100 * (1 - per_token / mha):.0f}% less than the "
                f"{_bytes(mha)} per token of the per-head keys and values it expands to.")
    fewer = heads is not None and kv_heads is not None and kv_heads < heads
    if not fewer and not (per_token is not None and mha is not None and per_token < mha):
        return ""
    saving = _num(s.get("gqa_saving"))
    if saving is None and per_token is not None and mha:
        saving = 1 - per_token / mha
    kind = (attention_kind(heads, kv_heads) or "grouped-query").capitalize()  # from the bytes where no head counts
    who = ""
    if fewer:
        who = (f" (1 KV head shared by {heads:.0f} query heads)" if kv_heads == 1 else
               f" ({kv_heads:.0f} KV heads, each shared by {heads / kv_heads:g} query heads)")
    size = f": {_bytes(per_token)} against {_bytes(mha)} per token" if per_token is not None and mha is not None else ""
    share = f" saves {100 * saving:.0f}% of the cache" if saving is not None else " shrinks the cache"
    return f"{kind} attention{who}{share} against full multi-head attention{size}."


def _holding(s: Mapping[str, Any], hold: Mapping[str, Any], full: float) -> list[str]:
    """The sentences of the summary's holding_budgets (analyses/kv/holding.py)."""
    tol, grid = float(hold.get("tolerance", 0.01)), hold.get("grid") or []
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
    said, notes = [], []
    for policy, e in (hold.get("policies") or {}).items():
        name = policy.replace("_", " ")
        shown: set[int] = set()  # budgets whose row this policy's clause already states
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
            text = _not_shown(name, [r for r in e.get("not_shown") or [] if r["budget"] >= e["consistent_from"]], tol,
                              guess)
        elif e.get("worst_evicting") is not None:
            w, c = e["worst_evicting"], e.get("closest")
            shown.add(w["budget"])  # its interval and how sure are said here: not again below (review 15d C6)
            if c is not None and abs(c["change"]) >= abs(w["change"]) - 1e-9:  # no closer than its largest budget
                c = w
            how = "above" if w["change"] > tol else "below"
            sure = clear_of(w.get("ci_low"), w.get("ci_high"), tol) == "band"  # review 14bv B1
            text = f"{name} {missed_words(e, tol)} ("
            if c is not None and c["budget"] != w["budget"]:
                text += f"closest at budget {c['budget']}: {_kept(c, full, tol)}{_band(c, tol)}{_answers(c, guess)}; "
            text += (f"at its largest budget that evicts, {w['budget']}, its mean is {'still ' if sure else ''}more than "
                     f"{100 * tol:.0f}% {how} the full cache: ")
            text += (_kept(w, full, tol) if c is None or c["budget"] == w["budget"] else "") + \
                f"{_band(w, tol)}{_answers(w, guess)}"
            text += _how_sure(w, how, tol, s, undecided=not sure)
            if e.get("misses"):
                text += f"; {_misses(e, tol)}"
            earlier = [str(r["budget"]) for r in e.get("cannot_tell") or [] if r.get("budget") != w["budget"]]
            if earlier:
                text += (f"; at budget(s) {', '.join(earlier)} its mean is more than {100 * tol:.0f}% off the full cache "
                         f"but its 95% CI reaches into the band: cannot tell there")
            if e.get("monotone") is False:
                text += ("; not monotone: |change| does not shrink as the budget grows"
                         + (f" (budget {c['budget']} is closer than {w['budget']})" if c and c["budget"] != w["budget"] else ""))
            text += ")"
        else:
            text = f"{name}: no budget on the grid evicts anything"
        said.append(text)
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
    if not any((e.get("at") or {}).get("budget") is not None for e in (hold.get("policies") or {}).values()):
        parts.append(_closest_overall(hold, full, tol, _words(s.get("metric", "metric")), guess))
    drops = _drops(s, hold)
    return parts + ([drops] if drops else [])


def _full_value(s: Mapping[str, Any], full: float) -> str:
    """'-1.03 (95% CI [-1.27, -0.783], mean over 16 examples)': the full-cache mean with its t interval over the
    examples (the summary's metric_unevicted_ci; review 14b B2/C4), or without it where none is recorded."""
    n, ci = s.get("n_examples"), s.get("metric_unevicted_ci")
    inner = []
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(_num(v) is not None for v in ci):
        inner.append(f"95% CI [{ci[0]:.3g}, {ci[1]:.3g}]")
    if n:
        inner.append(f"mean over {n} examples")
    return f"{full:.3g}" + (f" ({', '.join(inner)})" if inner else "")


def _split(s: Mapping[str, Any]) -> str:
    """Heavy hitters' recent window as the summary records it (review 13a A1): 'the newest half of its budget'."""
    share = _num(s.get("recent_share"))
    if share is None:
        return ""
    if share == 0:
        return "no recent window"
    return f"the newest {'half' if share == 0.5 else f'{100 * share:.0f}%'} of its budget"


def _positions(n: int) -> str:
    return f"{n} position" + ("" if n == 1 else "s")


def keeps_words(s: Mapping[str, Any], policy: str, budget: Any) -> str:
    """What `policy` keeps and evicts at `budget` in this run's numbers, from the summary's kept_split and context_range
    (mends: the rule's generic words said nothing of the run): 'at budget 8 keeps the 4 newest positions and the 4
    older ones the context's queries attended to most and evicts the other 4 of the 12';
    '' where the summary does not record them (older runs) or a layer slides (each keeps them among its own window)."""
    split = ((s.get("kept_split") or {}).get(policy) or {}).get(str(budget))
    span = s.get("context_range")
    if not isinstance(split, Mapping) or not (isinstance(span, (list, tuple)) and len(span) == 2):
        return ""
    first, recent, heavy = (int(split.get(k) or 0) for k in ("first", "recent", "most_attended"))
    lo, hi, b = int(span[0]), int(span[1]), int(budget)
    if s.get("sliding_windows"):  # a sliding-window layer keeps the policy's positions among its own window's
        return ""
    ends = ([f"the first {first}"] if first else []) + ([f"the {recent} newest"] if recent else [])
    kept_text = f"{and_join(ends)} position{'s' if first + recent != 1 else ''}" if ends else ""
    if heavy:
        who = ("older ones" if heavy != 1 else "older one") if ends else ("positions" if heavy != 1 else "position")
        most = f"the {heavy} {who} the context's queries attended to most"
        kept_text = f"{kept_text} and {most}" if kept_text else most
    kept_text = kept_text or "nothing"
    if hi <= b:
        return f"at budget {b} keeps every prompt whole ({_positions(hi) if lo == hi else f'{lo} to {hi} positions'})"
    if lo == hi:
        n = hi - b
        gone = {"window": f"the oldest {n}", "sink_window": f"the {n} in the middle"}.get(policy, f"the other {n}")
        return f"at budget {b} keeps {kept_text} and evicts {gone} of the {hi}"
    gone = {"window": "the oldest", "sink_window": "those in the middle"}.get(policy, "the others")
    return f"at budget {b} keeps {kept_text} and evicts {gone} of each prompt's {lo} to {hi} positions (up to {hi - b})"


def _drops(s: Mapping[str, Any], hold: Mapping[str, Any]) -> str:
    """What each policy that misses the band evicts (review 13a A1: a policy fails where its rule drops the tokens the
    answer needs), and heavy hitters' split whenever it ran: 'Heavy hitters is H2O's policy (the newest half ...)'."""
    policies = hold.get("policies") or {}
    n_sink, split = _num(s.get("n_sink")), _split(s)
    rule = {"window": "window drops the oldest positions first (the first token, a sink where there is one, among them)",
            "sink_window": f"sink window keeps the first {n_sink:.0f} and the newest positions, so it drops the middle"
            if n_sink else "sink window keeps the first and the newest positions, so it drops the middle",
            "heavy_hitters": (f"heavy hitters keeps {split} and, of the older positions, those the context's queries "
                              "attended to most, so it drops older positions little attended before the answer")
            if split and "no recent" not in split else
            ("heavy hitters keeps only the positions the context's queries attended to most, with no recent window"
             + ("" if split else " (a run before headscope kept H2O's recent window)")
             + ": the newest positions, seen by the fewest queries, go first")}
    missed = [p for p, e in policies.items() if p in rule and e.get("at") is None
              and (e.get("worst_evicting") is not None or e.get("consistent_from") is not None)]
    said = {p: keeps_words(s, p, _named_budget(policies[p])) for p in missed}  # in this run's numbers, where recorded
    tails = {"window": "; the first token, a sink where there is one, among them",
             "heavy_hitters": "" if split and "no recent" not in split else ": the newest positions go first"}
    for p, words in said.items():
        if words:
            rule[p] = f"{p.replace('_', ' ')} {words}{tails.get(p, '')}"
    text = ""
    if "heavy_hitters" in policies and split and split != "no recent window" and "heavy_hitters" not in missed:
        at = (policies["heavy_hitters"].get("at") or {}).get("budget")
        own = keeps_words(s, "heavy_hitters", at) if at is not None else ""
        text = (f"Heavy hitters is H2O's policy ({split}, the rest the older positions the context attended to most)"
                + (f": {own.replace(' keeps', ' it keeps', 1)}." if own else "."))
    if missed:
        what = "keeps and evicts at the budget named" if any(said.values()) else "evicts"
        text += (" " if text else "") + (f"Where a policy is not shown within the band, this is what its rule {what}: "
                                         + "; ".join(rule[p] for p in missed) + ".")
    return text


def _named_budget(e: Mapping[str, Any]) -> Any:
    """The budget the finding names for a policy not shown within the band: its largest that evicts ("never"), else
    the first "not shown" one from consistent_from."""
    if e.get("worst_evicting") is not None:
        return e["worst_evicting"].get("budget")
    rows = [r for r in e.get("not_shown") or [] if r.get("budget", -1) >= e.get("consistent_from", 0)]
    return rows[0]["budget"] if rows else None


def _unit(s: Mapping[str, Any]) -> str:
    return SHORT_UNITS.get(str(s.get("metric")), "in the metric's units")


def _rounding_held(name: str, rows: Sequence[Mapping[str, Any]], s: Mapping[str, Any]) -> str:
    """Review 12b A7: 'heavy hitters at budget 16: its 95% interval passes the band by 0.0045 logits, within one
    bfloat16 rounding step of the metric (0.077 logits), so it counts as within.' (holding.py's floor)."""
    unit = SHORT_UNITS.get(str(s.get("metric")), "in the metric's units")
    dtype = s.get("dtype") or "the model's dtype"
    parts = [f"{r['budget']} (by {r['rounding_miss']:.2g} {unit})" for r in rows]
    return (f"{name.capitalize()} at budget{'s' if len(rows) > 1 else ''} {and_join(parts)}: the 95% interval passes "
            f"the band by less than one {dtype} rounding step of the metric ({rows[0]['rounding_floor']:.2g} {unit}, "
            "at its largest full-cache value), so rounding alone can put it outside: counted as within.")


def _not_shown(name: str, rows: Sequence[Mapping[str, Any]], tol: float, guess: bool = False) -> str:
    """A policy whose mean is within the tolerance from a budget on but whose 95% interval never lies inside
    it (holding.py's "not shown", chance.inside): consistent with holding, not shown to hold."""
    if not rows:
        return f"{name} not shown"
    first, pct = rows[0], f"{100 * tol:.0f}%"
    lo, hi = _num(first.get("ci_low")), _num(first.get("ci_high"))
    if abs(first["change"]) > tol and (lo is None or hi is None):  # review 14b B3: one prompt, its mean off the band
        text = (f"{name} cannot be told (at {first['budget']}: {_flat(first, tol)}{_answers(first, guess)}: its mean is "
                f"more than {pct} off the full cache, but it rests on fewer than 2 prompts, with no interval, too few to "
                f"call it within or outside {pct}")
        if len(rows) > 1:
            text += f"; likewise at budget(s) {', '.join(str(r['budget']) for r in rows[1:])}"
        return text + ")"
    if lo is None or hi is None:
        why = "it has no interval (fewer than 2 prompts)"
    elif (hi - lo) / (2 * tol) >= 1.5:
        why = f"the interval is {(hi - lo) / (2 * tol):.0f} times as wide as the band"
    else:
        why = "its interval reaches beyond the band"
    text = (f"{name} not shown to hold (at {first['budget']}: {_flat(first, tol)}{_answers(first, guess)}: "
            f"consistent with holding within {pct}, but {why}")
    if len(rows) > 1:
        text += f"; likewise at budget(s) {', '.join(str(r['budget']) for r in rows[1:])}"
    return text + ")"


def _flat(row: Mapping[str, Any], tol: float = TOLERANCE) -> str:
    """_band without its parentheses: '+1.4%, 95% CI [+0.1%, +2.7%], per example ..., n = 16'."""
    band = _band(row, tol)
    return band.replace(" (", ", ", 1)[:-1]


def _listed(rows: Sequence[Mapping[str, Any]], flat: bool = False, tol: float = TOLERANCE) -> str:
    """'at 8, <band>; at 16, <band>' for the first and last of `rows` (one row: its band alone when flat)."""
    form = _flat if flat else _band
    if flat and len(rows) == 1:
        return form(rows[0], tol)
    first, last = rows[0], rows[-1]
    return f"at {first['budget']}, {form(first, tol)}" + (f"; at {last['budget']}, {form(last, tol)}"
                                                         if last is not first else "")


def _above_words(name: str, rows: Sequence[Mapping[str, Any]], tol: float, s: Mapping[str, Any] | None = None) -> list[str]:
    """The budgets whose mean is more than the tolerance above the full cache, worded by what each one's 95%
    interval clears (chance.clear_of, heads' pruning gain's rule too): "by more than 1%" only where its lower
    bound is above +1%; "higher, but not clearly by more than 1%" where it clears only 0; no gain where it reaches 0."""
    groups: dict[str | None, list[Mapping[str, Any]]] = {"band": [], "zero": [], None: []}
    for r in rows:
        groups[clear_of(r.get("ci_low"), r.get("ci_high"), tol)].append(r)
    pct, out = f"{100 * tol:.0f}%", []
    for verdict, got in groups.items():
        if not got:
            continue
        budgets = ("budget " if len(got) == 1 else "budgets ") + ", ".join(str(r["budget"]) for r in got)
        if verdict == "band":
            out.append(f"{name.capitalize()} is better than the full cache by more than {pct} at budget(s) "
                       f"{', '.join(str(r['budget']) for r in got)}: {_listed(got, tol=tol)}.")
        elif verdict == "zero":
            out.append(f"{name.capitalize()} is higher than the full cache at {budgets} ({_listed(got, True, tol)}): "
                       f"above it, but not clearly by more than {pct}.")
        else:
            sure = "its 95% CI reaches 0" if any(_num(r.get("ci_low")) is not None for r in got) else \
                "it has no interval (fewer than 2 prompts)"
            near = [(r["budget"], w) for r in got if s is not None and (w := _rounding(s, r.get("ci_low"), "lower"))]
            if near and sure.startswith("its"):  # review 9a C4: a bound within rounding of 0
                sure += " (" + "; ".join(w if len(got) == 1 else f"at {b}, {w}" for b, w in near) + ")"
            out.append(f"{name.capitalize()} is more than {pct} above the full cache on average at {budgets} "
                       f"({_listed(got, True, tol)}), but {sure}: no evidence that it is better.")
    return out


def _how_sure(row: Mapping[str, Any], how: str, tol: float, s: Mapping[str, Any] | None = None,
              undecided: bool = False) -> str:
    """After a policy that does not hold: whether its largest evicting budget's 95% interval supports "more than
    the tolerance above/below" (chance.clear_of), or only a change, or none (with the bound that reaches 0 said to
    be within rounding where it is: _rounding); undecided (review 14bv B1): that whether it stays within the band
    there cannot be told, and where the interval covers the whole band, that too."""
    verdict = clear_of(row.get("ci_low"), row.get("ci_high"), tol)
    if verdict == "band" or _num(row.get("ci_low")) is None:
        return ""
    pct = f"{100 * tol:.0f}%"
    tell = f", so whether it stays within {pct} there cannot be told" if undecided else ""
    if verdict == "zero":
        return f"; its 95% CI reaches inside the {pct} band: {how} it, but not clearly by more than {pct}{tell}"
    end = ("upper", row.get("ci_high")) if how == "below" else ("lower", row.get("ci_low"))
    near = _rounding(s, end[1], end[0]) if s is not None else ""
    whole = f" and covers the whole +-{pct} band" if row["ci_low"] < -tol and row["ci_high"] > tol else ""
    return f"; its 95% CI reaches 0{f' ({near})' if near else ''}{whole}: not clearly {how} it at all{tell}"


def never_within(e: Mapping[str, Any], tol: float = TOLERANCE) -> bool:
    """Whether a policy's holding record supports "never within" (review 14bv B1): every budget that evicts lies
    outside the band by its 95% interval (holding's verdicts "above" / "below", chance.clear_of's "band"; a record
    without verdicts: every_evicting_missed), checked again on the rows the record keeps with an interval, since an
    older summary's verdicts followed the mean alone."""
    if e.get("worst_evicting") is None:
        return False
    verdicts = e.get("verdicts")
    if isinstance(verdicts, Mapping) and verdicts:
        if any(v not in ("above", "below") for v in verdicts.values()):
            return False
    elif not e.get("every_evicting_missed"):
        return False
    rows = [r for r in (e.get("worst_evicting"), e.get("closest"), *(e.get("above") or [])) if isinstance(r, Mapping)]
    return all(clear_of(r.get("ci_low"), r.get("ci_high"), tol) == "band" for r in rows
               if _num(r.get("ci_low")) is not None and _num(r.get("ci_high")) is not None)


def missed_words(e: Mapping[str, Any], tol: float = TOLERANCE) -> str:
    """A policy whose largest evicting budget's mean is off the band (holding's worst_evicting) in a few words, which
    compare reads too: 'never' (every evicting budget's 95% interval outside the band), 'not shown either way' (the
    largest one's interval reaches into it: review 14bv B1, [-34.7%, +6.8%] said "never"), else 'not within from any
    budget on' (the largest is outside, a smaller one is not)."""
    w = e.get("worst_evicting") or {}
    if never_within(e, tol):
        return "never"
    told = (e.get("verdicts") or {}).get(str(w.get("budget"))) in ("above", "below")
    if _num(w.get("ci_low")) is not None and _num(w.get("ci_high")) is not None:
        told = clear_of(w["ci_low"], w["ci_high"], tol) == "band"
    return "not within from any budget on" if told else "not shown either way"


def _longest(s: Mapping[str, Any]) -> float | None:
    """The longest prompt's tokens: prompt_tokens (position's key too), else context_positions + the answer query."""
    longest, ctx = _num(s.get("prompt_tokens")), _num(s.get("context_positions"))
    return longest if longest is not None else (None if ctx is None else ctx + 1)


def binding_windows(s: Mapping[str, Any]) -> dict[str, int]:
    """{layer: window} of the sliding-window layers whose window binds on these prompts: shorter than the longest
    prompt (prompt_tokens; older summaries without it or context_positions: every window). Review 12b A4: a
    window no prompt reaches hides nothing, so no sentence may suggest it changed a number."""
    windows = {str(k): int(v) for k, v in (s.get("sliding_windows") or {}).items() if _num(v) is not None}
    longest = _longest(s)
    return {k: w for k, w in windows.items() if longest is None or w < longest}


def _windowed(s: Mapping[str, Any], policies: Sequence[str]) -> str:
    """What a budget means on the sliding-window layers (summary sliding_windows {layer: window}), or ''.
    A budget applies to what each layer holds (analyses/kv/eviction.py): a windowed layer holds its last
    window - 1 positions, which window and heavy hitters (ranked inside the window) cut only below that, and
    sink window's sinks lie outside the window on longer prompts."""
    windows = binding_windows(s)
    if not windows:
        return ""
    by_size: dict[int, list[str]] = {}
    for layer, w in windows.items():
        by_size.setdefault(w, []).append(layer)
    held = "; ".join(f"layer(s) {', '.join(layers)} slide over a window of {w} keys and hold at most {w - 1} past "
                     f"positions whatever the budget" for w, layers in sorted(by_size.items()))
    below = str(min(by_size) - 1) if len(by_size) == 1 else "the window - 1"
    layers = [str(k) for k in (s.get("sink_mass_per_layer") or s.get("sink_key_norm_ratio_per_layer") or {})]
    full = [k for k in layers if k not in windows]
    names = [p.replace("_", " ") for p in ("window", "heavy_hitters") if p in policies]
    text = f"Sliding-window layers: {held}. A budget applies to what each layer holds"
    if names:
        text += (f": {' and '.join(names)} evict from such a layer only below {below}"
                 + (" (heavy hitters choose among the positions inside its window)" if "heavy_hitters" in policies else ""))
        if layers and len(by_size) == 1:
            text += (f", so from budget {below} on they evict only from layer(s) {', '.join(full)}" if full
                     else f", so from budget {below} on they evict nothing")
    n_sink = _num(s.get("n_sink"))
    if "sink_window" in policies and n_sink:
        text += (f"; sink window's {n_sink:.0f} sinks fall outside the window on prompts longer than it, where such a "
                 f"layer keeps only the budget - {n_sink:.0f} most recent positions")
    return text + ". The share kept counts every layer's cache as it holds it."


def _kept(row: Mapping[str, Any], full: float, tol: float = TOLERANCE) -> str:
    """'keeps 98.8% of the full-cache value, ' where the full cache's mean is positive (a share reads
    right only there; 98.96% near the band's edge), else ''."""
    return f"keeps {_kept_share(row, tol)} of the full-cache value, " if full > 0 else ""


def _kept_share(row: Mapping[str, Any], tol: float) -> str:
    return f"{100 * (1 + row['change']):.{_digits(row['change'], tol)}f}%"


def _answers(row: Mapping[str, Any], guess: bool = False) -> str:
    """'; 16/16 answers correct (full cache 16/16)' from a holding row with accuracy counts, else ''; with guess
    (a task of few answers, _guess), the count a constant guess of the commonest answer gets there too (review 9a
    C3: on a yes/no task 9/16 is the guess's)."""
    if row.get("correct") is None:
        return ""
    n = row["n_evicting"]
    also = (f"; a constant guess of the commonest answer {row['guess_correct']}/{n}"
            if guess and _num(row.get("guess_correct")) is not None else "")
    return f"; {row['correct']}/{n} answers correct (full cache {row['full_correct']}/{n}{also})"


def _guess(hold: Mapping[str, Any]) -> bool:
    """Whether the task has few distinct answers (at most FEW_ANSWERS, the lens's rule), so that a constant guess
    of the commonest answer is right often enough to be the count's reference (holding's constant_guess)."""
    g = hold.get("constant_guess")
    return isinstance(g, Mapping) and _num(g.get("n_answers")) is not None and g["n_answers"] <= FEW_ANSWERS


def _where_missed(e: Mapping[str, Any]) -> str:
    """'at every budget that evicts' or 'at budget(s) 4, 8' (a policy within the tolerance at some budgets
    but not from one budget on)."""
    if e.get("every_evicting_missed"):
        return "at every budget that evicts"
    return "at budget(s) " + ", ".join(str(b) for b in e.get("missed") or [])


def _misses(e: Mapping[str, Any], tol: float) -> str:
    """'on average it falls 2.57 to 3.01 logits below the full cache at budget(s) 4, 8 (the band is 1% of the full-cache
    mean)' (in the metric's units where the record has them, review 15d B2; else 'falls 1.04% to 24.1% ...'): how far each
    missed budget's mean lies from the full cache (holding's misses, |change|), on the side its verdict says, two
    decimals near the band's edge (review 9a C1: "misses the tolerance by 1.0%" printed the change, 0.04 points
    past the band, as the miss)."""
    lo, hi = (_share(m, tol) for m in e["misses"])
    unit = (e.get("closest") or {}).get("unit")
    if _num((e.get("misses_diff") or [None])[0]) is not None and unit:  # review 15d B2: in the metric's units, as the
        lo, hi = (f"{abs(m):#.3g}" for m in e["misses_diff"])  # figure (a % of a small, uncertain mean reads too precise)
        hi += f" {unit}"
        lo = lo if lo + f" {unit}" != hi else hi
    span = lo if lo == hi else f"{lo} to {hi}"
    verdicts = e.get("verdicts") or {}
    sides: dict[str, list[str]] = {}
    for b in e.get("missed") or []:
        sides.setdefault(str(verdicts.get(str(b))), []).append(str(b))
    band = f"(the band is {100 * tol:.0f}%{' of the full-cache mean' if unit and e.get('misses_diff') else ''})"
    if set(sides) in ({"below"}, {"above"}):
        return (f"on average it {'falls' if 'below' in sides else 'lies'} {span} {next(iter(sides))} the full cache "
                f"{_where_missed(e)} {band}")
    if set(sides) == {"below", "above"}:
        return (f"on average it lies {span} off the full cache (below at budget(s) {', '.join(sides['below'])}; above at "
                f"{', '.join(sides['above'])}) {band}")
    return f"on average it lies {span} off the full cache {_where_missed(e)} {band}"  # an older summary: no verdicts


def closest_policies(hold: Mapping[str, Any], tol: float = TOLERANCE) -> tuple[str, list[str]] | None:
    """Where no policy holds (none has an `at` budget): the policy closest to the full cache and the others tied with
    it at the finding's precision (the same share kept at the same budget: review 13c A3, window and heavy hitters
    both at 66.9%), else None. The kv finding's closing recommendation; compare reads it too."""
    policies = {p: e for p, e in (hold.get("policies") or {}).items() if isinstance(e, Mapping)}
    if any((e.get("at") or {}).get("budget") is not None for e in policies.values()):
        return None
    tried = [(p, e["closest"]) for p, e in policies.items() if e.get("closest") is not None]
    if not tried:
        return None
    best, c = min(tried, key=lambda pc: abs(pc[1]["change"]))
    tied = [p for p, r in tried if p != best and r["budget"] == c["budget"]
            and _kept_share(r, tol) == _kept_share(c, tol)]
    return best, tied


def _closest_overall(hold: Mapping[str, Any], full: float, tol: float, metric: str, guess: bool = False) -> str:
    """When no policy holds: the policy closest to the full cache, what it keeps (metric and answers, each with
    its budget: review 9a C2, "99.0% ... from budget 2" was at 4) and by how much it misses, so a policy that
    keeps most of the metric and every answer is never called useless."""
    tried = [(p, e) for p, e in (hold.get("policies") or {}).items() if e.get("closest") is not None]
    if not tried:
        return "No eviction policy holds the metric at any budget that evicts something."
    policy, e = min(tried, key=lambda pe: abs(pe[1]["closest"]["change"]))
    c, name = e["closest"], policy.replace("_", " ")
    # review 14bv B1: "No policy stays" only where every policy's every evicting budget lies outside by its interval
    shown = " stays" if all(never_within(p, tol) for p in hold["policies"].values() if isinstance(p, Mapping)
                            and (p.get("closest") is not None or p.get("consistent_from") is not None)) \
        else " is shown to stay"
    lead = f"No policy{shown} within {100 * tol:.0f}% at a budget that evicts something; {name} comes closest"
    # review 14b B1: the words follow the 95% interval (chance.clear_of), never "keeps ... within -63.9%"
    side, pct = ("below" if c["change"] < 0 else "above"), f"{100 * tol:.0f}%"
    verdict = clear_of(c.get("ci_low"), c.get("ci_high"), tol)
    if _num(c.get("ci_low")) is None:
        how = f"lies {side} the full cache on average, on too few prompts for an interval"
    elif abs(c["change"]) <= tol:
        how = f"is within {pct} on average, but its 95% CI reaches past the band: not shown"
    elif verdict == "band":
        how = f"lies {side} the full cache by more than {pct}"
    elif verdict == "zero":
        how = f"lies {side} the full cache, but not clearly by more than {pct}"
    else:
        how = f"lies {side} the full cache on average, but its 95% CI reaches 0: not clearly {side} it at all"
    kept = f"keeps {_kept_share(c, tol)} of the {metric} and " if full > 0 else ""
    # review 14b A1: "every answer the full cache gets" only where no prompt the full cache answers is lost (lost:
    # per prompt; an older summary without it is not said, equal counts can hide an answer lost and another gained)
    every = c.get("lost") == 0 and c.get("full_correct")
    answers = ""
    if every and e.get("answers_from") is not None and e["answers_from"] <= c["budget"]:
        answers = f"; it keeps every answer the full cache gets from budget {e['answers_from']} on"
    elif c.get("lost"):
        answers = (f"; it loses {c['lost']} of the {c['full_correct']} answer(s) the full cache gets on these prompts "
                   "(whatever it gains elsewhere)")
    said = (e.get("worst_evicting") or {}).get("budget") == c["budget"] and e.get("consistent_from") is None
    band = "its interval as above" if said else f"{_band(c, tol)}{_answers(c, guess)}"  # review 15d C6: said once
    text = f"{lead}: at budget {c['budget']} it {kept}{how} ({band}){answers}"
    if e.get("misses"):
        text += f"; {_misses(e, tol)}"
    if e.get("monotone") is False:
        text += ", and its curve is not monotone in the budget"
    tied = (closest_policies(hold, tol) or (policy, []))[1]
    if tied:  # review 13c A3: a choice broken below the printed precision is no choice
        names = and_join([p.replace("_", " ") for p in tied])
        text += (f". {names[0].upper() + names[1:]} keep{'s' if len(tied) == 1 else ''} the same {_kept_share(c, tol)} "
                 f"at budget {c['budget']}: tied with {name} at this precision")
    return text + "."


def _size_sentence(s: Mapping[str, Any], per_token: float, full_ctx: float | None) -> str:
    """Bytes per token and at full context; with sliding-window layers, which ones stop growing and the
    all-global size for comparison."""
    text = f"The KV cache takes {_bytes(per_token)} per token ({s.get('dtype', '')})"
    windows = {k: v for k, v in (s.get("sliding_windows") or {}).items() if _num(v) is not None}
    if not windows:
        return text + (f", {_bytes(full_ctx)} at full context." if full_ctx is not None else ".")
    sizes = sorted({int(v) for v in windows.values()})
    size = str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
    kept = str(sizes[0] - 1) if len(sizes) == 1 else f"{sizes[0] - 1}-{sizes[-1] - 1}"
    text += (f" while the context fits the window; layer(s) {', '.join(windows)} attend over a sliding window of "
             f"{size} keys, so their cache keeps at most {kept} past positions")
    everyone = _num(s.get("bytes_at_n_ctx_all_global"))
    ctx = _num(s.get("n_ctx"))
    if full_ctx is not None:
        text += (f": {_bytes(full_ctx)} at full context" + (f" ({int(ctx)} positions)" if ctx else "")
                 + (f", against {_bytes(everyone)} if every layer were global" if everyone is not None else ""))
    return text + "."


def _span2(lo: float, hi: float) -> str:
    return f"{lo:.2f}" if abs(hi - lo) < 0.005 else f"{lo:.2f}-{hi:.2f}"


def _normalised_sentence(key_norm: Mapping[str, Any]) -> str:
    """Why the first key's norm is not reported on a model that normalises its keys before caching them
    (the summary's key_norm, analyses/kv/analysis.key_norm_record) per head: their norms are set by the norm's weight."""
    how = "RMS-normalised" if key_norm.get("rms", True) else "normalised"
    name = key_norm.get("module", "k_norm")
    dim, gain, bounds = _num(key_norm.get("dim")), key_norm.get("gain") or [], key_norm.get("bounds") or []
    here = []
    if len(bounds) == 2:
        here.append(f"here {_span2(*bounds)}")
        if dim and len(gain) == 2:
            one_plus = "gemma" in str(key_norm.get("kind", "")).lower()  # review 11b C4: stored weights near 0
            here[-1] += f": sqrt({dim:.0f}) x its {'gain |1 + weight|' if one_plus else '|weight|'} {_span2(*gain)}"
    measured = key_norm.get("measured") or []
    if len(measured) == 2:
        here.append(f"measured {_span2(*measured)}")
    eps = "; smaller only for a key near zero against the norm's epsilon" if here else ""
    where = f" ({'; '.join(here)}{eps})" if here else ""
    return (f"Keys are {how} per head ({name}) before caching, so their norms are set by the norm's weight, not by "
            f"the key's input{where}, and the first key's norm cannot mark a sink: not reported.")


def _all_heads_note(key_norm: Mapping[str, Any]) -> str:
    """Review 8 A1 (OLMo 2): a norm over all KV heads together bounds a key's norm over its heads, not one
    head's share of it, so the per-head ratio stays meaningful and is reported, with this note."""
    name, dim = key_norm.get("module", "k_norm"), _num(key_norm.get("dim"))
    return (f" Keys are normalised over all KV heads together ({name}{f', {dim:.0f} entries' if dim else ''}) before "
            "caching: that bounds a key's norm over its heads, not one head's share of it, so the per-head ratio above "
            "can still show a sink.")


def reported_norm_layers(s: Mapping[str, Any]) -> set[str]:
    """The layers whose first-key norm ratio the kv finding reports: every layer but those whose per-head key norms
    a k_norm sets (none on a model that normalises every layer's keys per head); compare reads the same ones."""
    key_norm = s.get("key_norm") if isinstance(s.get("key_norm"), Mapping) else None
    all_heads = key_norm is not None and key_norm.get("per_head", True) is False
    if s.get("keys_normalised") and key_norm is not None and not all_heads:
        return set()
    skip = set() if all_heads else {str(v) for v in (key_norm or {}).get("layers") or []}
    records = s.get("key_norm_ratios")
    layers = ([str(r.get("layer")) for r in records if isinstance(r, Mapping)] if isinstance(records, list)
              else [str(k) for k in s.get("sink_key_norm_ratio_per_layer") or {}])
    return {k for k in layers if k not in skip}


def _norm_records(s: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """{layer: its key_norm_ratios record} (each prompt's ratio: mean, 95% t interval, n prompts); {} in an older
    summary, whose ratios (sink_key_norm_ratio_per_layer) carry no interval."""
    records = s.get("key_norm_ratios")
    return {str(r.get("layer")): r for r in records if isinstance(r, Mapping)} if isinstance(records, list) else {}


def _norm_sentence(s: Mapping[str, Any]) -> str:
    """Whether the first key stands out, from the per-layer ratio of its norm to the other keys' (each prompt's ratio,
    the mean over prompts with its 95% t interval and n where the summary records them, key_norm_ratios: a layer
    stands out where its interval lies above STANDS_OUT, not where it lies below, else it cannot be told); on a model
    that normalises its keys before caching (keys_normalised: a k_norm), why that ratio is not reported."""
    key_norm = s.get("key_norm") if isinstance(s.get("key_norm"), Mapping) else None
    all_heads = key_norm is not None and key_norm.get("per_head", True) is False
    if s.get("keys_normalised") and key_norm is not None and not all_heads:
        return _normalised_sentence(key_norm)
    # layers whose per-head key norms are set by a norm: their ratio is not reported (a norm over all heads sets none)
    skip = set() if all_heads else {str(v) for v in (key_norm or {}).get("layers") or []}
    if records := _norm_records(s):
        return _norm_interval_sentence(records, skip, key_norm, all_heads)
    given = {k: v for k, v in (s.get("sink_key_norm_ratio_per_layer") or {}).items() if str(k) not in skip}
    ratios = {k: _num(v) for k, v in given.items()}
    ratios = {k: v for k, v in ratios.items() if v is not None}
    missing = sorted(k for k, v in given.items() if _num(v) is None)
    if not ratios:
        return ""
    which = "per layer" if not missing and not skip else f"layer(s) {', '.join(ratios)}"
    if missing:
        which += f"; layer(s) {', '.join(missing)} no longer cache the first key (sliding window)"
    if skip:
        which += (f"; layer(s) {', '.join(sorted(skip, key=int))} normalise their keys ({key_norm.get('module', 'k_norm')}) "
                  "before caching, so their norms are fixed: not reported")
    lo, hi = min(ratios.values()), max(ratios.values())
    span = f"{lo:.2f}" if abs(hi - lo) < 0.005 else f"{lo:.2f} to {hi:.2f}"
    if lo > 1.5:
        verdict = "the first key's norm stands out in every layer (a sink key)"
    elif hi > 1.5:
        verdict = f"the first key's norm stands out in layer(s) {', '.join(k for k, v in ratios.items() if v > 1.5)} only"
    else:
        verdict = "the first key's norm does not stand out" + (" (it is smaller)" if hi < 1 else "")
    return (f"The first key's norm is {span} times the other keys' ({which}): {verdict}."
            + (_all_heads_note(key_norm) if all_heads else ""))


STANDS_OUT = 1.5  # a first key whose norm is more than this multiple of the other keys' stands out (a sink key)


def _norm_interval_sentence(records: Mapping[str, Mapping[str, Any]], skip: set[str], key_norm: Any,
                            all_heads: bool) -> str:
    """'The first key's norm over the other keys' per layer (each prompt's ratio, mean over 16 prompts, 95% CI): layer
    0 1.20 [1.10, 1.30], layer 1 2.40 [2.10, 2.70]: ...': the layers' means with their intervals (more than 6 layers:
    the lowest and highest), and the verdict by the intervals against STANDS_OUT."""
    rows = {k: r for k, r in records.items() if k not in skip and _num(r.get("ratio")) is not None}
    missing = sorted((k for k, r in records.items() if k not in skip and _num(r.get("ratio")) is None), key=int)
    if not rows:
        return ""

    def one(k: str) -> str:
        ci = r["ci"] if isinstance((r := rows[k]).get("ci"), (list, tuple)) and len(r["ci"]) == 2 else None
        return f"{r['ratio']:.2f}" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "")

    order = sorted(rows, key=int)
    lo, hi = (pick(order, key=lambda k: rows[k]["ratio"]) for pick in (min, max))
    listed = (", ".join(f"layer {k} {one(k)}" for k in order) if len(order) <= 6 else
              f"from layer {lo} {one(lo)} to layer {hi} {one(hi)}")
    ns = sorted({int(r.get("n") or 0) for r in rows.values()})
    n = f"{ns[0]}" if len(ns) == 1 else f"{ns[0]}-{ns[-1]}"
    which = [f"layer(s) {', '.join(missing)} no longer cache the first key (sliding window)"] if missing else []
    if skip:
        which.append(f"layer(s) {', '.join(sorted(skip, key=int))} normalise their keys "
                     f"({(key_norm or {}).get('module', 'k_norm')}) before caching, so their norms are fixed: not reported")
    lows = {k: (r["ci"][0] if isinstance(r.get("ci"), (list, tuple)) else r["ratio"]) for k, r in rows.items()}
    highs = {k: (r["ci"][1] if isinstance(r.get("ci"), (list, tuple)) else r["ratio"]) for k, r in rows.items()}
    out = [k for k in order if lows[k] > STANDS_OUT]
    unsure = [k for k in order if lows[k] <= STANDS_OUT < highs[k]]
    rule = f"more than {STANDS_OUT:g}x, its 95% CI above {STANDS_OUT:g}"
    if out and len(out) == len(order):
        verdict = f"the first key's norm stands out in every layer ({rule}: a sink key)"
    elif out:
        verdict = f"the first key's norm stands out in layer(s) {', '.join(out)} only ({rule})"
    elif unsure:
        verdict = f"the first key's norm stands out clearly in no layer ({rule})"
    else:
        verdict = "the first key's norm does not stand out" + (" (it is smaller)" if max(highs.values()) < 1 else "")
    if unsure:
        verdict += f"; in layer(s) {', '.join(unsure)} its 95% CI reaches across {STANDS_OUT:g}: cannot tell"
    return (f"The first key's norm over the other keys' per layer (each prompt's ratio, mean over {n} prompts, 95% CI"
            f"{'; ' + '; '.join(which) if which else ''}): {listed}: {verdict}."
            + (_all_heads_note(key_norm) if all_heads else ""))


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
                          windowed=list(binding_windows(s)))
    if sinks:
        parts.append(sinks)
        bos = s.get("first_token_added_bos")
        if isinstance(bos, str) and bos:  # review 10b A1: not the model's own sink on the user's text
            parts.append(f"The first token is {bos!r}, the BOS headscope put in front of every prompt (the tokenizer "
                         "adds none; --no-prepend-bos leaves it out): the attention on it is on a token the prompts "
                         "as tokenized do not have.")
    full = _num(s.get("metric_unevicted"))
    budgets = s.get("metric_per_policy_budget") or {}
    hold = s.get("holding_budgets")
    if full is not None and _chance(s) is not None:
        mean, n = _num(_chance(s).get("mean")), _num(_chance(s).get("n_examples"))
        # issue 34: the chance sentence gave it: not again. Review 14a A2: not a second value either where the eviction
        # runs' cached decode rounds differently (bfloat16: -0.167 against the whole pass's -0.173, a plain Hugging Face
        # pass's value): the same prompts' full-cache metric is stated once, from the whole pass
        if mean is not None and (n is None or _num(s.get("n_examples")) in (None, n)):
            parts.append(f"The full-cache metric is the {_words(s.get('metric', 'metric'))} above.")
        else:
            parts.append(f"Full-cache metric {_full_value(s, full)}.")
    elif full is not None and isinstance(hold, Mapping):
        parts += _holding(s, _with_units(hold, SHORT_UNITS.get(str(s.get("metric")), "in the metric's units")), full)
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
    return " ".join(parts)
