"""The kv finding's eviction-policy words (reports/kv_words.py): what a policy keeps at a budget (`keeps_words`,
`_drops`), the budgets not shown to hold, above the full cache or never within (`never_within`, `missed_words`),
sliding windows that bind (`binding_windows`), where a policy misses, and the closest policy where none holds
(`closest_policies`, which compare reads).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from headscope.analyses.core.chance import clear_of
from headscope.reports.findings import _num, and_join
from headscope.reports.kv_numbers import (
    TOLERANCE,
    _answers,
    _band,
    _coarse_why,
    _flat,
    _kept_share,
    _listed,
    _rounding,
    _share,
    _span_units,
    wide_base,
)


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


def _kept_parts(s: Mapping[str, Any], policy: str, budget: Any) -> tuple[str, int, int, int] | None:
    """(what `policy` keeps at `budget` in words, the shortest and longest prompt's positions, the budget) from the
    summary's kept_split and context_range, or None where it does not record them or a layer slides."""
    split = ((s.get("kept_split") or {}).get(policy) or {}).get(str(budget))
    span = s.get("context_range")
    if not isinstance(split, Mapping) or not (isinstance(span, (list, tuple)) and len(span) == 2):
        return None
    if s.get("sliding_windows"):  # a sliding-window layer keeps the policy's positions among its own window's
        return None
    return _kept_text(split), int(span[0]), int(span[1]), int(budget)


def _kept_text(split: Mapping[str, Any]) -> str:
    """A kept_split entry {first, recent, most_attended} in words: 'the first 1 and the 4 newest positions and the 3
    older ones the context's queries attended to most'; 'nothing' where it keeps none."""
    first, recent, heavy = (int(split.get(k) or 0) for k in ("first", "recent", "most_attended"))
    ends = ([f"the first {first}"] if first else []) + ([f"the {recent} newest"] if recent else [])
    kept_text = f"{and_join(ends)} position{'s' if first + recent != 1 else ''}" if ends else ""
    if heavy:
        who = ("older ones" if heavy != 1 else "older one") if ends else ("positions" if heavy != 1 else "position")
        most = f"the {heavy} {who} the context's queries attended to most"
        kept_text = f"{kept_text} and {most}" if kept_text else most
    return kept_text or "nothing"


def _shared_keeps(s: Mapping[str, Any], policies: Mapping[str, Any], missed: Sequence[str]) -> str:
    """Review 15d C6: where every policy not shown within the band is named at one budget on the same prompts, what
    each keeps in one sentence: 'Where a policy is not shown within the band, at budget 32 of each prompt's 19 to 39
    positions (up to 7 evicted): heavy hitters keeps ...; sink window keeps ..., evicting those in the middle; window
    keeps the 32 newest positions, evicting the oldest (the first token, a sink where there is one, among them).'"""
    parts = {p: _kept_parts(s, p, _named_budget(policies[p])) for p in missed}
    got = set(v[1:] for v in parts.values() if v is not None)
    if not missed or any(v is None for v in parts.values()) or len(got) != 1:
        return ""
    lo, hi, b = next(iter(got))
    if hi <= b:
        return ""
    where = (f"of the {hi} positions ({hi - b} evicted)" if lo == hi else
             f"of each prompt's {lo} to {hi} positions (up to {hi - b} evicted)")
    gone = {"window": ", evicting the oldest (the first token, a sink where there is one, among them)",
            "sink_window": ", evicting those in the middle"}
    said = [f"{p.replace('_', ' ')} keeps {parts[p][0]}{gone.get(p, '')}" for p in missed]
    return f"Where a policy is not shown within the band, at budget {b} {where}: {'; '.join(said)}."


def keeps_words(s: Mapping[str, Any], policy: str, budget: Any) -> str:
    """What `policy` keeps and evicts at `budget` in this run's numbers, from the summary's kept_split and context_range
    (mends: the rule's generic words said nothing of the run): 'at budget 8 keeps the 4 newest positions and the 4
    older ones the context's queries attended to most and evicts the other 4 of the 12';
    '' where the summary does not record them (older runs) or a layer slides (each keeps them among its own window)."""
    split = ((s.get("kept_split") or {}).get(policy) or {}).get(str(budget))
    span = s.get("context_range")
    if not isinstance(split, Mapping) or not (isinstance(span, (list, tuple)) and len(span) == 2):
        return ""
    lo, hi, b = int(span[0]), int(span[1]), int(budget)
    if s.get("sliding_windows"):  # a sliding-window layer keeps the policy's positions among its own window's
        return ""
    kept_text = _kept_text(split)
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
    shared = _shared_keeps(s, policies, missed)
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
    if shared:
        return text + (" " if text else "") + shared
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


def _not_shown(name: str, rows: Sequence[Mapping[str, Any]], tol: float, guess: bool = False,
               s: Mapping[str, Any] | None = None) -> str:
    """A policy whose mean is within the tolerance from a budget on but whose 95% interval never lies inside
    it (holding.py's "not shown", chance.inside): consistent with holding, not shown to hold; where its interval
    passes the band by less than a rounding step too large against the band, cannot tell at this precision (review
    18b B1, s: the summary, for its dtype)."""
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
    elif _coarse_why(first, s):
        why = _coarse_why(first, s)
    elif (hi - lo) / (2 * tol) >= 1.5:
        why = f"the interval is {(hi - lo) / (2 * tol):.0f} times as wide as the band"
    else:
        why = "its interval reaches beyond the band"
    text = (f"{name} not shown to hold (at {first['budget']}: {_flat(first, tol)}{_answers(first, guess)}: "
            f"consistent with holding within {pct}, but {why}")
    if len(rows) > 1:
        text += f"; likewise at budget(s) {', '.join(str(r['budget']) for r in rows[1:])}"
    return text + ")"


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


def _where_missed(e: Mapping[str, Any]) -> str:
    """'at every budget that evicts' or 'at budget(s) 4, 8' (a policy within the tolerance at some budgets
    but not from one budget on)."""
    if e.get("every_evicting_missed"):
        return "at every budget that evicts"
    return "at budget(s) " + ", ".join(str(b) for b in e.get("missed") or [])


def _misses(e: Mapping[str, Any], tol: float) -> str:
    """'on average it falls 2.57 logits below the full cache at budget 4 (95% CI [-4.68, -0.45], n = 16) and 3.01 below
    at 8 (95% CI [-5.21, -0.82], n = 16)': how far each missed budget's mean lies from the full cache, in the metric's
    units with its n and 95% interval (holding's missed_rows; review 15d B2: a % of a small, uncertain mean reads too
    precise); more than 2 budgets: the range of the means and of the intervals once. An older summary: 'falls 2.57 to
    3.01 logits ... (the band is 1% of the full-cache mean)', or in % (holding's misses, |change|, two decimals near
    the band's edge: review 9a C1)."""
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
    rows = [r for r in e.get("missed_rows") or [] if _num(r.get("scale")) is not None and _num(r.get("ci_low")) is not None]
    if unit and rows and len(rows) == len(e.get("missed") or []):  # review 15d-v B2: each fall's n and interval
        if len(rows) <= 2:
            return f"on average it {'falls' if set(sides) == {'below'} else 'lies'} {_falls(rows, unit)}"
        los, his = [r["ci_low"] * r["scale"] for r in rows], [r["ci_high"] * r["scale"] for r in rows]
        ns = sorted({int(r["n_evicting"]) for r in rows})
        band = (f"(their 95% CIs within [{_span_units(min(los), max(his)).replace(' to ', ', ')}], n = "
                + (f"{ns[0]}" if len(ns) == 1 else f"{ns[0]} to {ns[-1]}") + ")")
    if set(sides) in ({"below"}, {"above"}):
        return (f"on average it {'falls' if 'below' in sides else 'lies'} {span} {next(iter(sides))} the full cache "
                f"{_where_missed(e)} {band}")
    if set(sides) == {"below", "above"}:
        return (f"on average it lies {span} off the full cache (below at budget(s) {', '.join(sides['below'])}; above at "
                f"{', '.join(sides['above'])}) {band}")
    return f"on average it lies {span} off the full cache {_where_missed(e)} {band}"  # an older summary: no verdicts


def _falls(rows: Sequence[Mapping[str, Any]], unit: str) -> str:
    """'2.57 logits below the full cache at budget 4 (95% CI [-4.68, -0.45], n = 16) and 3.01 below at 8 (95% CI [-5.21,
    -0.82], n = 16)': each missed budget's mean change in the metric's units with its 95% t interval (the change's
    interval times its scale) and n."""
    def one(r: Mapping[str, Any], first: bool) -> str:
        side = "below" if r["diff"] < 0 else "above"
        ci = _span_units(r["ci_low"] * r["scale"], r["ci_high"] * r["scale"]).replace(" to ", ", ")
        what = f"{abs(r['diff']):#.3g} {unit} {side} the full cache at budget " if first else \
            f"{abs(r['diff']):#.3g} {side} at "
        return f"{what}{r['budget']} (95% CI [{ci}], n = {r['n_evicting']})"
    return " and ".join(one(r, i == 0) for i, r in enumerate(rows))


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


def _closest_overall(hold: Mapping[str, Any], full: float, tol: float, metric: str, guess: bool = False,
                     s: Mapping[str, Any] | None = None) -> str:
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
    # review 18c A2: where a budget holds, "at a budget that evicts something" is false: none holds from one on
    some = any("holds" in (p.get("verdicts") or {}).values() for p in hold["policies"].values() if isinstance(p, Mapping))
    where = "at every budget from one on that evicts something" if some else "at a budget that evicts something"
    lead = f"No policy{shown} within {100 * tol:.0f}% {where}; {name} comes closest"
    # review 14b B1: the words follow the 95% interval (chance.clear_of), never "keeps ... within -63.9%"
    side, pct = ("below" if c["change"] < 0 else "above"), f"{100 * tol:.0f}%"
    verdict = clear_of(c.get("ci_low"), c.get("ci_high"), tol)
    if c.get("verdict") == "holds":  # review 18c A2: the words follow the row's verdict
        how = f"holds within {pct} (its 95% CI inside the band), but not every larger budget that evicts does"
    elif _num(c.get("ci_low")) is None:
        how = f"lies {side} the full cache on average, on too few prompts for an interval"
    elif abs(c["change"]) <= tol:
        coarse = _coarse_why(c, s)
        how = f"is within {pct} on average, but " + (f"{coarse}: not shown" if coarse else
                                                     "its 95% CI reaches past the band: not shown")
    elif verdict == "band":
        how = f"lies {side} the full cache by more than {pct}"
    elif verdict == "zero":
        how = f"lies {side} the full cache, but not clearly by more than {pct}"
    else:  # review 9a C4: a bound within rounding of 0 says so (s: the summary, for its dtype)
        near = _rounding(s, c.get("ci_high") if side == "below" else c.get("ci_low"),
                         "upper" if side == "below" else "lower") if s is not None else ""
        whole = " and covers the whole +-" + pct + " band" if c["ci_low"] < -tol and c["ci_high"] > tol else ""
        how = (f"lies {side} the full cache on average, but its 95% CI reaches 0{f' ({near})' if near else ''}{whole}: "
               f"not clearly {side} it at all")
    kept = f"keeps {_kept_share(c, tol)} of the {metric} and " if full > 0 and not wide_base(c) else ""
    # review 14b A1: "every answer the full cache gets" only where no prompt the full cache answers is lost (lost:
    # per prompt; an older summary without it is not said, equal counts can hide an answer lost and another gained)
    every = c.get("lost") == 0 and c.get("full_correct")
    answers = ""
    if every and e.get("answers_from") is not None and e["answers_from"] <= c["budget"]:
        answers = f"; it keeps every answer the full cache gets from budget {e['answers_from']} on"
    elif c.get("lost"):
        answers = (f"; it loses {c['lost']} of the {c['full_correct']} answer(s) the full cache gets on these prompts "
                   "(whatever it gains elsewhere)")
    band = f"{_band(c, tol)}{_answers(c, guess)}"  # review 15d C6: the headline states it; the policy's clause not again
    text = f"{lead}: at budget {c['budget']} it {kept}{how} ({band}){answers}"  # (its misses: in its own clause)
    tied = (closest_policies(hold, tol) or (policy, []))[1]
    if tied:  # review 13c A3: a choice broken below the printed precision is no choice
        names = and_join([p.replace("_", " ") for p in tied])
        text += (f". {names[0].upper() + names[1:]} keep{'s' if len(tied) == 1 else ''} the same {_kept_share(c, tol)} "
                 f"at budget {c['budget']}: tied with {name} at this precision")
    return text + "."
