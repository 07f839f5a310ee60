"""The `patching` finding in words (reports/plots_patching.py's `finding`, the family's headline): the
site that moves the metric most where the information enters, where it reaches the answer position and
what writes it there (reports/patching_sites.py picks the cells and names them), each with its share of the
clean-corrupted gap, its interval and n, and the cells tied with it; the positions where clean and corrupted
prompts differ; the effect at the corrupted token (reports/patching_aligned.py); how far attribution patching
can stand in for exact patching (reports/patching_agreement.py); at chance, only what was measured.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from headscope.models.hooked_model import window_words
from headscope.reports.findings import _at_chance, _chance, _num, _words, and_join, attention_kind, ci_pair, ci_words
from headscope.reports.patching_agreement import agreement
from headscope.reports.patching_aligned import (
    _aligned_lead,
    _column_caveat,
    _corrupted_token,
    _orders_lead,
    _token_words,
    column_holds,
)
from headscope.reports.patching_sites import (
    DEPTH,
    IDENTITY,
    _effect_ci,
    _head,
    _where,
    at_answer,
    by_construction,
    depth,
    differ_offsets,
    differing_positions,
    end_words,
    entering,
    reaches_zero_by_rounding,
    reaching,
    rebuilds_clean,
    share,
    thin,
    tied,
    writer,
)


def _site(cell: Mapping[str, Any], kind: str, differ: frozenset = frozenset(), s: Mapping[str, Any] | None = None) -> str:
    # a head by its name (_head); differ: the offsets from the end where clean and corrupted differ, named once by
    # the finding (no token said there)
    where = [f"layer {cell.get('layer')}" if cell.get("head") is None else _head(kind, cell, s)]
    if cell.get("pos") is not None:
        token = cell.get("token") or ""  # "": the prompts have different tokens there (patching's token column)
        end = cell.get("from_end")  # the figures' axis: the same place in every left-padded prompt
        at = f"position {end} {end_words(s)}" if isinstance(end, int) else f"position {cell['pos']}"
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
        pair = distinct_pair(*ends)
        said += (f" Causal tracing: metric {pair[0]} on the clean prompts, {pair[1]} "
                 f"with the {trace.get('span', 'subject')} noised.")
    return said


ANSWER = "the answer position (-1 from the end, where the metric is read)"


def _sites(s: Mapping[str, Any], cells: list, gap: float | None, metric: str, cited: list | None = None) -> list[str]:
    """The sentences on the top sites (cells: every (kind, record), largest |effect| first): the positions where
    clean and corrupted differ, once; the lead, where the information enters (the largest residual cell away from
    the answer position) when the metric is read at the last position, else the strongest cell; what reaches the
    answer position and the attention that writes it there; the residual cells there that carry the whole gap
    by construction, once (patching_sites.py); then the strongest cell of each site type not yet named."""
    differ = frozenset(differ_offsets(s))
    normalized = bool(s.get("normalized"))
    # review 10a A3: the token's places differ, so it leads; review 12b A2: each of several differing positions
    aligned = _orders_lead(s, gap, metric) or _aligned_lead(s, gap, metric)
    info = s.get("at_corrupted_token") or {}
    several = _token_words(info)[1] != "the corrupted token"
    said = [differing_positions(s) if not aligned or several else None, aligned]  # the lead names the one place each

    def name(kc: tuple) -> str:
        return _site(kc[1], kc[0], differ, s)

    rounding = _rounding(s, metric)  # review 14c B3: an interval clear of 0 only by rounding reaches it

    def share(cell: Mapping[str, Any]) -> str:  # the effect as a share of the clean-corrupted gap (1 = fully restored)
        effect = cell["effect"]
        text = f"{effect / gap:.2f} of the clean-corrupted gap" if gap else f"{effect:.2f}"
        said = (f"; the effect itself {effect:+.3g} {metric}" if reaches_zero_by_rounding(cell, rounding[0])  # 19w B2:
                else f" ({effect:+.3g} {metric})")  # after the floor's clause, the effect is named as such
        return text + _effect_ci(cell, gap, *rounding) + (said if gap else "")

    notes: list[str] = []  # what the ties of the cells named imply (heads sharing KV heads, a shared effect)

    def brief(kc: tuple, keep: Any = None) -> str:  # '<site> (0.86, 95% CI [..] over n examples)', and its ties
        kind, c = kc
        others = _tied_cells(s, kc, keep)
        named.extend((kind, o) for o in others)
        notes.extend(_head_notes(s, kc, others, gap))
        return f"{name(kc)} ({_value(c, gap):.2f}{_effect_ci(c, gap, *rounding)})" + _tie(kc, others, gap, s)

    answer = s.get("metric_at_last_position", True) is not False  # older summaries: every default metric is
    whole = by_construction(cells, gap, normalized) if answer else []
    trivial = {_state(k, c) for k, c in whole}
    rest = [kc for kc in cells if _state(kc[0], kc[1]) not in trivial]
    enter = entering(rest, gap, normalized) if answer else None
    lead = enter or (rest or cells)[0]
    run = f"Patching ({s.get('direction', 'denoise')}, {s.get('n_examples', '?')} examples)"
    named: list = []  # every cell the sentences name (cited_cells: the maps keep their ticks)
    if enter and aligned:  # an end-aligned column may average the token with others: what it holds is said
        how = ("cells counted from each prompt's end" if column_holds(s, lead[1]) is not None  # older runs: generic
               else "each column one place from the end, averaging whatever tokens the prompts have there")
        said.append(f"End-aligned ({how}), the largest residual cell away from the answer position is the "
                    f"{name(lead)}: {share(lead[1])}{_column_caveat(s, lead[1])}"
                    f"{IDENTITY if rebuilds_clean(s, *lead) else ''}.")
    elif enter:
        where = (", where the information enters (clean and corrupted differ there)," if depth(*lead) == 0
                 or lead[1].get("from_end") in differ else ",")
        said.append(f"Away from the answer position{where} {run[0].lower()}{run[1:]} moves the metric most at the "
                    f"{name(lead)}: {share(lead[1])}{IDENTITY if rebuilds_clean(s, *lead) else ''}.")
    else:
        said.append(f"{run} moves the metric most at the {name(lead)}: {share(lead[1])}"
                    f"{IDENTITY if rebuilds_clean(s, *lead) else ''}.")
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


def _rounding(s: Mapping[str, Any] | None, metric: str = "") -> tuple[float | None, str]:
    """(the summary's rounding floor in the metric's units, the metric in words) for _effect_ci; (None, '') without."""
    record = (s or {}).get("rounding_floor")
    floor = _num(record.get("floor")) if isinstance(record, Mapping) else None
    return (abs(floor), metric) if floor else (None, "")


def _tied_cells(s: Mapping[str, Any], kc: tuple, keep: Any = None) -> list:
    """Every other cell of kc's site type (top_sites) within kc's 95% interval with kc within its own (tied), that
    `keep` accepts (review 9b A2: the next cell alone left out two of four equal heads), largest |effect| first."""
    kind, cell = kc
    rows = [c for c in (s.get("top_sites") or {}).get(kind) or [] if _num(c.get("effect")) is not None
            and (c is cell or not thin(c, s.get("n_examples")))]  # review 10a A3: no tie with a one-prompt column
    if not any(c is cell for c in rows):
        return []
    if rows[0] is cell and any(ci_pair(c.get("vs_top")) for c in rows[1:]):  # review 19e B1: paired against the top
        return [c for c in rows[1:] if (keep is None or keep(c)) and _paired_tie(c)]
    return [c for c in rows if c is not cell and (keep is None or keep(c)) and tied(cell, c)]


def _paired_tie(cell: Mapping[str, Any]) -> bool:
    """Whether the top cell minus this one, paired over the same examples (top_sites' vs_top), reaches 0."""
    ci = ci_pair(cell.get("vs_top"))
    return bool(ci) and min(ci) <= 0.0 <= max(ci)


def _value(cell: Mapping[str, Any], gap: float | None) -> float:
    return cell["effect"] / gap if gap else cell["effect"]


def _tie(kc: tuple, others: list, gap: float | None, s: Mapping[str, Any] | None = None) -> str:
    """', tied with <cell> (share, CI)' for one tied cell; for several, ', tied with L0H3, L0H2 and L0H0 (0.08-0.10
    each, all four within each other's 95% intervals)' (or each within the named cell's and it within theirs)."""
    kind, cell = kc
    if not others or cell.get("within_rounding"):  # review 19w B2: cells tied with one not told apart from 0 say nothing
        return ""
    where = [_where(kind, o, s).split(" at ", 1)[1] for o in others]
    if any(ci_pair(o.get("vs_top")) for o in others):  # review 19e B1: paired differences from the top cell
        own = _where(kind, cell, s).split(" at ", 1)[1]
        values = [f"{_value(c, gap):.2f}" for c in others]
        span = values[0] if values[0] == values[-1] else f"{min(values, key=float)}-{max(values, key=float)}"
        named = where if len(where) <= TIES_SHOWN else [*where[:TIES_SHOWN], f"{len(where) - TIES_SHOWN} more"]
        return (f", not told apart from {and_join(named)} ({span}; {len(others)} cell{'s' * (len(others) > 1)} whose "
                f"paired difference from {own} over the same examples has a 95% t interval reaching 0, largest first)")
    if len(others) == 1:
        return f", tied with {where[0]} ({_value(others[0], gap):.2f}{_effect_ci(others[0], gap, *_rounding(s))})"
    values = [f"{_value(c, gap):.2f}" for c in [cell, *others]]
    lo, hi = min(values, key=float), max(values, key=float)
    span = lo if lo == hi else f"{lo}-{hi}"
    own = _where(kind, cell, s).split(" at ", 1)[1]
    pairwise = all(tied(a, b) for i, a in enumerate(others) for b in others[i + 1:])
    how = (f"all {len(others) + 1} within each other's 95% intervals" if pairwise
           else f"each within {own}'s 95% interval and {own} within each of theirs")
    return f", tied with {and_join(where)} ({span} each, {how})"


HEADS = ("head_out", "head_out_by_pos")
TIES_SHOWN = 6  # cells named as not told apart from the top one; the rest counted


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
    if len(group) > 1 and (sharing := attention_kind(heads, kv)):
        per = int(heads) // int(kv)
        shared = {int(c["head"]) // per for c in group}
        if len(shared) < len(group):
            how = (f"{sharing} attention: one KV head per layer" if kv == 1
                   else f"{sharing} attention: {heads:.0f} query heads on {kv:.0f} KV heads per layer")
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
        ci = ci_pair(together.get("ci")) if together is not None else None
        low = min(ci) if ci else None
        if (together is not None and total * together["effect"] > 0 and abs(together["effect"]) > 1.5 * abs(total)
                and (low is None or (low > total if total > 0 else max(ci) < total))):
            every = "" if heads is None or len(alone) != heads else f"all {len(alone)} of "
            notes.append(f"Patched alone, {every}layer {layer}'s heads restore {total / gap if gap else total:.2f} "
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
    """The clean-corrupted gap the shares divide by (None: normalised, or no gap); compare divides by it too."""
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
    both = clean is not None and corrupt is not None and not s.get("normalized")  # a gap of 0 too (review 15b B3)
    if both and (given := _clean_given(s)):
        parts.append(given)
    elif both:
        article = "an" if metric[:1].lower() in ("a", "e", "i", "o", "u") else "a"  # "an answer log-probability" (review 11b C5)
        said = distinct_pair(clean, corrupt)
        if gap is None:  # clean == corrupted: no gap for a patch to restore
            parts.append(f"Clean and corrupted prompts give the same {metric}, {said[0]}{_metric_ci(s, 'clean')}, "
                         f"{_same_on(s)} (clean minus corrupted exactly 0): {NO_GAP}.")
        else:
            parts.append(f"Clean prompts give {article} {metric} of {said[0]}{_metric_ci(s, 'clean')}, corrupted ones "
                         f"{said[1]}{_metric_ci(s, 'corrupted')}" + (f", over {_prompts(n)}." if (
                             n := _num(s.get("metric_n"))) else "."))
        if _at_chance(s, s.get("metric"), clean):
            parts.append("The model is at chance on the clean prompts (logit difference near 0): there is no behaviour to "
                         "restore, so the patching maps show noise.")
    if pieces := answer_pieces_words(s):
        parts.append(pieces)
    if isinstance(s.get("top_paths"), list) and "top_sites" not in s:  # hs.path_patching's own Result (review 15b B2)
        return " ".join(parts + [_paths_only(s, gap, metric)])
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
    if words := _never_read_words(s.get("never_read")):
        parts.append(words)
    if words := _window_words(s.get("sliding_windows")):
        parts.append(words)
    parts.extend(agreement(s, gap, rank=bool(cells)))  # sites are ranked (not at chance, nor over a gap within noise)
    if cells and (paths := _path_words(s.get("path_patching"), gap, metric, bool(s.get("normalized")))):
        parts.append(paths)
    if words := _tracing_words(s.get("causal_tracing")):
        parts.append(words)
    return " ".join(parts)


TRACING_METRICS = {"prob": "answer probability", "normalized_logit_diff": "normalised logit difference",
                   "task": "task metric"}  # the rest as findings._words names them


def _tracing_words(trace: Any) -> str:
    """'Causal tracing: noising the subject drops the answer probability from 1 (95% CI [..]) to 0.133 (95% CI [..]):
    a paired drop of 0.867, 95% CI [..] over 32 prompts.' (review 20: the metric was unnamed and had no interval;
    summaries written before drop_ci keep the means alone)."""
    if not isinstance(trace, Mapping):
        return ""
    clean, corrupt = _num(trace.get("clean_metric")), _num(trace.get("corrupted_metric"))
    if clean is None or corrupt is None:
        return ""
    n, said = trace.get("n_examples"), distinct_pair(clean, corrupt)
    cis = [ci_pair(trace.get(k)) for k in ("clean_metric_ci", "corrupted_metric_ci", "drop_ci")]
    ends = [f"{v}" + (f" ({ci_words(ci, '.3g')})" if ci else "") for v, ci in zip(said, cis)]
    metric = _words(TRACING_METRICS.get(str(trace.get("metric")), trace.get("metric") or "metric"))
    moves, change = ("drops", "drop") if clean > corrupt else ("raises", "rise")
    out = f"Causal tracing: noising the {trace.get('span', 'subject')} {moves} the {metric} from {ends[0]} to {ends[1]}"
    if cis[2]:  # drop_ci is of clean - noised: a rise's is the other way round
        ci = cis[2] if clean > corrupt else (-cis[2][1], -cis[2][0])
        return out + f": a paired {change} of {abs(clean - corrupt):.3g}, {ci_words(ci, '.3g')} over {n} prompts."
    return out + (f" (mean over {n} prompts)." if n is not None else ".")


NO_GAP = "the corruption does not move the metric, so there is no difference for any patch to restore"


def _same_on(s: Mapping[str, Any]) -> str:
    """Where clean and corrupted give the same mean metric: 'on all n pairs' where every pair's gap is 0 (its paired
    interval [0, 0], or one pair), else 'on average over n pairs' (summary gap_within_noise)."""
    small = s.get("gap_within_noise")
    small = small if isinstance(small, Mapping) else {}
    n, ci = _num(small.get("n_examples")) or _num(s.get("metric_n")), ci_pair(small.get("ci"))
    if n == 1:
        return "on its 1 pair"
    every = _num(small.get("gap")) == 0 and ci is not None and ci[0] == 0 == ci[1]
    return (f"on all {n:.0f} pairs" if every else f"on average over {n:.0f} pairs") if n else "on average"


def _paths_only(s: Mapping[str, Any], gap: float | None, metric: str) -> str:
    """Review 15b B2: hs.path_patching's finding: the top path where the gap is clear (_path_words), else why no path
    is ranked (at chance, a gap of 0 or within noise) and the largest |effect| measured."""
    paths = [r for r in s.get("top_paths") or [] if isinstance(r, Mapping) and _num(r.get("effect")) is not None]
    top = max(paths, key=lambda r: abs(r["effect"]), default=None)
    if top is None:
        largest = "no path was measured"
    elif top["effect"] == 0:
        largest = "every path's effect is 0"
    else:  # review 15b verify B2: every path tied with it in size (to the 3 digits printed) named too
        tied = [r for r in paths if f"{abs(r['effect']):.3g}" == f"{abs(top['effect']):.3g}"]
        who = [f"{r['effect']:+.3g} (L{(r.get('sender') or '??')[0]}H{(r.get('sender') or '??')[1]})" for r in tied]
        largest = (f"the largest effect in size is {who[0].replace(' (', f' {metric} (')}" if len(tied) == 1 else
                   f"the largest effects in size tie, in {metric}: {and_join(who)}")
    small = s.get("gap_within_noise")
    if _chance(s) is not None:
        return f"No path is ranked at chance; {largest}."
    if gap is None and not s.get("normalized"):
        return f"No path is ranked; {largest}."
    if isinstance(small, Mapping):
        return (f"The clean-corrupted gap is within noise ({small.get('reason', 'no reason recorded')}): shares of it "
                f"are not meaningful, so no path is ranked; {largest}.")
    return _path_words(s, gap, metric, bool(s.get("normalized"))) or f"{largest[0].upper()}{largest[1:]}."


def _prompts(n: float) -> str:
    """'1 prompt', '8 prompts'."""
    return f"{n:.0f} prompt{'s' * (round(n) != 1)}"


SIGN = {"noise": "In noising, a share of -1 is the whole gap lost (the metric moved to the corrupted one) and a positive "
                 "share moves the metric away from the corrupted one.",
        "denoise": "In denoising, a share of 1 is the whole gap restored (the metric moved to the clean one) and a "
                   "negative share moves the metric further from the clean one."}


def _path_words(p: Any, gap: float | None, metric: str, normalized: bool) -> str:
    """Review 12c B3: path patching's largest path in size (a head's direct write into the logits, or into its
    receivers) with its share of the gap, 95% interval and n; '' where the summary has no path with an effect.
    Review 15b verify B1/B2: where every effect is 0 none is named; paths whose sizes tie (to the 3 digits printed)
    are all named with their signs; what a share's sign means in the run's direction is said."""
    if not isinstance(p, Mapping):
        return ""
    if isinstance(p.get("not_run"), str):  # review 16d A2: post-LN blocks, the reason in one line
        return f"{p['not_run'][0].upper()}{p['not_run'][1:]}; it was not run."
    paths = [r for r in p.get("top_paths") or [] if isinstance(r, Mapping) and _num(r.get("effect")) is not None
             and isinstance(r.get("sender"), (list, tuple)) and len(r["sender"]) == 2]
    if not paths:
        return ""
    paths.sort(key=lambda r: -abs(r["effect"]))
    top, direction = paths[0], str(p.get("direction", "denoise"))
    receivers = {str(r.get("receiver")) for r in paths}
    receiver = ("the logits" if receivers == {"logits"} else
                f"its receivers ({top.get('receiver')})" if len(receivers) == 1 else "its receivers")
    lead = f"Path patching ({direction}, each head's direct path to {receiver} alone)"
    n = _num(top.get("n"))
    if top["effect"] == 0:  # every path's effect is exactly 0: no path is larger than another
        counted = f" (n = {_prompts(n)})" if n else ""
        return (f"{lead}: every path's effect is exactly 0{counted}: patching any one head's direct path leaves the "
                f"{metric} unchanged at the precision the model ran in, so no path is named.")
    size = f"{abs(top['effect']):.3g}"
    tied = [r for r in paths if f"{abs(r['effect']):.3g}" == size]
    said = share(top, gap, normalized)

    def head(r: Mapping[str, Any]) -> str:
        to = f" -> {r.get('receiver')}" if len(receivers) > 1 and r.get("receiver") != "logits" else ""
        return f"L{r['sender'][0]}H{r['sender'][1]}{to}"

    one = n == 1 and not any(ci_pair(r.get("ci")) for r in tied)
    if len(tied) == 1:
        amount = f"{said[0]:+.2f} of the clean-corrupted gap" if said else f"{top['effect']:+.3g} {metric}"
        ci = said[1] if said else ci_pair(top.get("ci"))
        bits = ([f"95% CI [{ci[0]:+.2f}, {ci[1]:+.2f}]"] if ci else []) + ([f"n = {_prompts(n)}"] if n else [])
        bits += ["one prompt gives no interval"] if one else []
        bits += [f"{top['effect']:+.3g} {metric}"] if said and gap else []
        which = f"the largest in size is {head(top)}, {amount}" + (f" ({', '.join(bits)})" if bits else "")
    else:
        bits = ([f"n = {_prompts(n)} each"] if n else []) + (["one prompt gives no interval"] if one else [])
        more = "; the summary keeps the top 10 paths, so more may tie" if len(tied) == len(paths) >= 10 else ""
        each = []
        for r in tied:
            mine = share(r, gap, normalized)
            ci = mine[1] if mine else ci_pair(r.get("ci"))
            each.append(f"{head(r)} {mine[0]:+.2f}" if mine else f"{head(r)} {r['effect']:+.3g}")
            each[-1] += f" (95% CI [{ci[0]:+.2f}, {ci[1]:+.2f}])" if ci else ""
        unit = " of the clean-corrupted gap" if said else f" {metric}"
        which = (f"{and_join([head(r) for r in tied])} tie for the largest in size, {size} {metric}"
                 + (f" ({', '.join(bits)})" if bits else "") + f"{more}: {', '.join(each)}{unit}")
    sign = f" {SIGN[direction]}" if direction in SIGN and said else ""
    return f"{lead}: {which}.{sign}"


def distinct_pair(a: float, b: float) -> tuple[str, str]:
    """a and b to 3 significant digits, or, where those hide their difference (printed, a - b is off the true one by
    over a tenth), to as many decimals as state a - b to 3 significant digits (review 14b B4: clean -1.00054 and
    corrupted -1.00341 read "-1" and "-1", hiding a gap of 0.00287 the next sentence discusses)."""
    short = (f"{a:.3g}", f"{b:.3g}")
    gap = a - b
    if not gap or not math.isfinite(gap) or abs(float(short[0]) - float(short[1]) - gap) <= 0.1 * abs(gap):
        return short
    decimals = max(0, 2 - math.floor(math.log10(abs(gap))))
    return f"{a:.{decimals}f}", f"{b:.{decimals}f}"


def _clean_given(s: Mapping[str, Any]) -> str:
    """At chance, where the chance sentence before this one gives the clean metric (the same metric over the same
    prompts, from the guard's plain pass), the clean value is not printed again (review 14a verify A1: -1.57 there,
    -1.56291 in patching's batch: one quantity, two values): the corrupted prompts are said by their gap from the clean
    ones in patching's own pass (gap_within_noise's mean and 95% CI where recorded), which both values share. '' where
    the chance sentence does not give it."""
    entry = _chance(s)
    clean, corrupt = _num(s.get("clean_metric")), _num(s.get("corrupted_metric"))
    if entry is None or _num(entry.get("mean")) is None or clean is None or corrupt is None:
        return ""
    n, own = _num(entry.get("n_examples")), _num(s.get("metric_n")) or _num(s.get("n_examples"))
    if entry.get("metric") != s.get("metric") or n is None or n != own:  # the same metric over the same prompts
        return ""
    metric = _words(s.get("metric", ""))
    small = s.get("gap_within_noise")
    gap, ci = clean - corrupt, None
    if isinstance(small, Mapping) and _num(small.get("gap")) is not None:
        gap, ci = float(small["gap"]), ci_pair(small.get("ci"))
    if gap == 0:  # review 15b B3: the quick run's corruption changed nothing; said as the full run says its gap
        zero = f", 95% CI [{ci[0]:.3g}, {ci[1]:.3g}]" if ci else ""
        return (f"Clean prompts give the {metric} above; corrupted ones give the same {_same_on(s)} in patching's own "
                f"pass (clean minus corrupted exactly 0{zero}): {NO_GAP}.")
    side = "below" if gap > 0 else "above"
    size = f"{abs(gap):.3g} "
    paired = (f"clean minus corrupted {gap:+.3g}, 95% CI [{ci[0]:.3g}, {ci[1]:.3g}] over "
              f"{_num(small.get('n_examples')) or own or 0:.0f} pairs" if ci else f"clean minus corrupted {gap:+.3g}")
    return (f"Clean prompts give the {metric} above; corrupted ones lie {size}{side} them on average in patching's own "
            f"pass ({paired}){f', over {own:.0f} prompts' if own and not ci else ''}.")


def _metric_ci(s: Mapping[str, Any], which: str) -> str:
    """' (95% CI [lo, hi])' of the clean or corrupted mean metric (review 12c C6); '' where not recorded."""
    ci = ci_pair(s.get(f"{which}_metric_ci"))
    return f" (95% CI [{ci[0]:.3g}, {ci[1]:.3g}])" if ci else ""


def answer_pieces_words(s: Mapping[str, Any]) -> str:
    """Review 11b C1: where answers have several tokens, what the position axis counts from (summary answer_pieces,
    analyses/patching/prompt_end.py): each prompt's last token is -1 and the answer's teacher-forced pieces are no
    position, their cells (left_out: how many row positions) patched but reported nowhere; "" where no row has any."""
    info = s.get("answer_pieces")
    if not isinstance(info, Mapping) or not _num(info.get("rows")):
        return ""
    rows, most, n = int(info["rows"]), _num(info.get("max")), s.get("n_examples", "?")
    upto = f"up to {most:.0f}" if most and most > 1 else "1"
    left = _num(info.get("left_out"))
    places = f"those {left:.0f} answer positions" if left else "those answer positions"
    return (f"Positions count from each prompt's last token (-1, where the answer's first token is read): {rows} of {n} "
            f"prompts run on with {upto} token{'s' * (upto != '1')} of their answer (teacher forcing), which no "
            f"position shows: the cells at {places} are patched but not reported in any table or map.")


def _never_read_words(w: Any) -> str:
    """Review 12b A1: the last layer's writes at positions before the answer position (summary never_read) are 0
    on every decoder, windowed or not: no attention runs after them to carry them to the answer."""
    if not isinstance(w, Mapping) or not _num(w.get("cells")):
        return ""
    kinds = and_join([str(k) for k in w.get("site_types") or []])
    return (f"{w['cells']:.0f} of the {w.get('of', '?')} position cells are the last layer's writes"
            + (f" ({kinds})" if kinds else "") + " before the answer position: no attention runs after them, so on any "
            "decoder they never reach it and their 0 is by construction (hatched in the maps), not a measured absence.")


def _window_words(w: Any) -> str:
    """Review 9a B2: on a sliding-window model, how many position cells the windows keep from the answer
    (0 by construction, hatched in the maps), so their zeros are not read as a finding."""
    if not isinstance(w, Mapping) or not w.get("unreachable"):
        return ""
    windows = {i: v for i, v in enumerate(w.get("windows") or []) if v}
    return (f"Sliding windows ({window_words(windows, len(w.get('windows') or []), short=True)}): {w['unreachable']} of the "
            f"{w.get('cells', '?')} position cells lie further before the answer position than the windows carry a "
            "change (the sum of window - 1 over the layers from there to the end), so their 0 is by construction "
            "(hatched in the maps), not a measured absence.")
