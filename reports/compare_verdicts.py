"""The verdict headlines of `headscope compare` (VERDICTS, review 12b A8; reports/compare_headlines.py): kv's holding
budget per policy (a budget held by the rounding floor said as such; verdicts apart only by the budget grid or one
prompt not compared, `_kv_unsettled`), kv's closing choice of policy where none holds (kv_policy_words.closest_policies,
ties at the finding's precision), mlp's between-layer and per-layer control verdicts and probes' selectivity verdict:
the same words, a difference, or not compared (`_verdict_notes`).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headscope.analyses.core import chance
from headscope.reports.compare_notes import n_words
from headscope.reports.compare_run import NOT_COMPARED, SAME, SIDES, _number
from headscope.reports.findings import _chance, _words


def _holding_words(e: Mapping[str, Any], s: Mapping[str, Any] | None = None) -> str:
    """A kv policy's holding headline as its finding states it: 'from 8 positions (a median 30% of the cache)',
    'not shown to hold (its means within 1% from budget 16 on)', 'never within', 'not shown either way'
    (kv_policy_words.missed_words; also where an older summary's consistent_from rests on one prompt), 'no budget evicts';
    a budget held only by the rounding floor with its reason (review 13b C1)."""
    at = e.get("at")
    few = [str(r["budget"]) for r in e.get("too_few") or [] if isinstance(r, Mapping) and r.get("budget") is not None
           and r["budget"] > (e.get("consistent_from") or (at or {}).get("budget") or 10 ** 9)]
    few_words = f"; budget(s) {', '.join(few)}: too few prompts evicted to say" if few else ""  # review 18c A2
    if isinstance(at, Mapping) and at.get("budget") is not None:
        why = _rounding_reason(at, s or {})
        inner = ([f"a median {100 * at['share']:.0f}% of the cache"] if _number(at.get("share")) else []) + \
            ([f"within the band {why}"] if why else [])
        return f"from {at['budget']} positions" + (f" ({'; '.join(inner)}{few_words})" if inner else
                                                   f" ({few_words[2:]})" if few else "")
    hold = (s or {}).get("holding_budgets")
    tol = float((hold if isinstance(hold, Mapping) else {}).get("tolerance") or 0.01)
    start = e.get("consistent_from")
    rows = [r for r in e.get("not_shown") or [] if isinstance(r, Mapping) and (r.get("budget") or 0) >= (start or 0)]
    if start is not None and all((r.get("n_evicting") or 0) >= 2 for r in rows):  # review 17b A3: an older summary
        # counted a one-prompt row as within whatever its mean (analyses/kv/holding.py no longer does)
        return f"not shown to hold (its means within {100 * tol:.0f}% from budget {e['consistent_from']} on{few_words})"
    if start is not None:
        return "not shown either way"
    if e.get("worst_evicting") is not None:  # review 14bv B1: "never" only where every interval lies outside the band
        from headscope.reports.kv_policy_words import missed_words

        words = missed_words(e, tol)
        return "never within" if words == "never" else words
    return "no budget evicts"


def _kv_budgets(s: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any]]]:
    """Per policy: (label, its holding headline, its verdict per budget) from holding_budgets (review 12b A8: the
    kv headline moved from 8 to 32 positions between float32 and bfloat16 and compare listed it nowhere)."""
    hold = s.get("holding_budgets")
    if not isinstance(hold, Mapping):
        return []
    tol = hold.get("tolerance", 0.01)
    return [(f"kv {policy.replace('_', ' ')} within {100 * float(tol):.0f}% of the full cache",
             _holding_words(e, s), _rounded(e, s), (e.get("at") or {}).get("budget") or _holding_words(e, s))
            for policy, e in (hold.get("policies") or {}).items() if isinstance(e, Mapping)]


def _rounding_reason(row: Mapping[str, Any], s: Mapping[str, Any]) -> str:
    """Review 13b C1: 'up to bfloat16 rounding: its 95% CI passes the band by 0.068 logits, less than one rounding step
    (0.074)' for a holding row held by the rounding floor (holding.py's rounding_miss), else ''."""
    if not (_number(row.get("rounding_miss")) and _number(row.get("rounding_floor"))):
        return ""
    from headscope.reports.kv_numbers import SHORT_UNITS

    unit = SHORT_UNITS.get(str(s.get("metric")), "in the metric's units")
    return (f"up to {s.get('dtype') or 'the model dtype'} rounding: its 95% CI passes the band by "
            f"{row['rounding_miss']:.2g} {unit}, less than one rounding step ({row['rounding_floor']:.2g})")


def _rounded(e: Mapping[str, Any], s: Mapping[str, Any]) -> dict[str, str]:
    """A policy's verdict per budget, a budget held only by the rounding floor saying so (review 13b C1)."""
    verdicts = {str(k): str(v) for k, v in (e.get("verdicts") or {}).items()}
    for r in e.get("rounding_held") or []:
        if isinstance(r, Mapping) and str(r.get("budget")) in verdicts and _rounding_reason(r, s):
            verdicts[str(r["budget"])] += f" up to {s.get('dtype') or 'the model dtype'} rounding"
    return verdicts


def _mlp_between(s: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any]]]:
    """The mlp finding's between-layer verdict (plots_mlp.between_layers), where it states one."""
    from headscope.reports.plots_mlp import between_layers

    said = between_layers(s)
    return [] if said is None else [("mlp between-layer agreement", said, {}, "cannot be told apart" not in said)]


def _mlp_control(s: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any], Any]]:
    """The mlp finding's layers above their own shuffled control (plots_mlp.control_layers), where it states them."""
    from headscope.reports.plots_mlp import control_layers

    said = control_layers(s)
    return [] if said is None else [(f"mlp layers above their own shuffled control at p_Bonferroni < {chance.ALPHA:g}",
                                     said, {}, said)]


def _probes_selectivity(s: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any], Any]]:
    """The probes finding's selectivity verdict (plots_probes.finding): not measurable (a degenerate control, with
    its reason), below 0, low (under 0.1) or measured, with the value; none where the finding states none (at chance,
    no selectivity). Review 13b A1: "-0.33 ... no evidence that the property is read" against "cannot be measured"
    between two seeds was listed nowhere."""
    if _chance(s) is not None:
        return []
    label = "probes selectivity"
    if s.get("control_degenerate"):
        return [(label, f"cannot be measured ({s['control_degenerate']})", {}, "not measurable")]
    sel = s.get("best_selectivity")
    if not _number(sel):
        return []
    kind = "below 0" if sel < 0 else "low" if sel < 0.1 else "measured"
    words = {"below 0": "below 0: no evidence that the property is read rather than memorised",
             "low": "low: the probe memorises rather than reads", "measured": "measured"}[kind]
    return [(label, f"{sel:.2f} ({words})", {}, kind)]


def _verdicts(*getters):
    return lambda s: [v for get in getters for v in get(s)]


VERDICTS = {"kv": _kv_budgets, "mlp": _verdicts(_mlp_between, _mlp_control),
            "probes": _probes_selectivity}  # analysis -> [(label, its headline in words, per-budget verdicts,


def _pct(change: float) -> str:
    return f"{100 * (1 + change):.1f}%"


def _closest_row(s: Mapping[str, Any], policy: str) -> Mapping[str, Any] | None:
    e = ((s.get("holding_budgets") or {}).get("policies") or {}).get(policy)
    return e.get("closest") if isinstance(e, Mapping) and isinstance(e.get("closest"), Mapping) else None


def _change_words(s: Mapping[str, Any], r: Mapping[str, Any]) -> str:
    """What a closest row's change is, as the kv finding says it (review 14b-v C4: "keeps 87.4%" said neither of what
    nor that it fell): '-12.6% of the span from chance to the full cache' where the band's basis is that span (a
    log-probability), else 'keeps 66.9% of the full-cache logit difference'."""
    from headscope.reports.kv_numbers import _pc

    hold = s.get("holding_budgets") if isinstance(s.get("holding_budgets"), Mapping) else {}
    if hold.get("basis") == "span":
        return f"{_pc(r['change'])} of the span from chance to the full cache"
    return f"keeps {_pct(r['change'])} of the full-cache {_words(s.get('metric', 'metric'))}"


def _closest_words(s: Mapping[str, Any], policy: str, tied: list[str]) -> str:
    """'window at budget 16: -12.6% of the span from chance to the full cache (95% CI of the change [-34.8%, +9.6%],
    n = 16; 8/16 answers correct (full cache 5/16); it loses 2 of the 5 answers the full cache gets)', with the
    answers lost as the kv finding states them (holding's per-prompt `lost`) and its tie."""
    from headscope.reports.kv_numbers import _answers

    r = _closest_row(s, policy)
    ci = (f"95% CI of the change [{100 * r['ci_low']:+.1f}%, {100 * r['ci_high']:+.1f}%], "
          if _number(r.get("ci_low")) and _number(r.get("ci_high")) else "")
    answers = _answers(r) if _number(r.get("n_evicting")) else ""
    lost = (f"; it loses {r['lost']} of the {r['full_correct']} answer(s) the full cache gets"
            if _number(r.get("lost")) and r["lost"] > 0 and _number(r.get("full_correct")) else "")
    tie = f"; tied with {' and '.join(p.replace('_', ' ') for p in tied)}" if tied else ""
    return (f"{policy.replace('_', ' ')} at budget {r['budget']}: {_change_words(s, r)} ({ci}n = {r['n_evicting']}"
            f"{answers}{lost}{tie})")


def _apart(s: Mapping[str, Any], mine: str, other: str) -> bool | None:
    """Whether, in one run, its closest policy's interval clears the other run's choice's (their closest rows' 95%
    intervals of the change do not overlap); None where either has no interval."""
    a, b = _closest_row(s, mine), _closest_row(s, other)
    if a is None or b is None or not all(_number(r.get(k)) for r in (a, b) for k in ("ci_low", "ci_high")):
        return None
    return a["ci_low"] > b["ci_high"] or b["ci_low"] > a["ci_high"]


def _kv_closest_note(sa: Mapping[str, Any], sb: Mapping[str, Any]) -> list[str]:
    """Review 13c A3: where neither kv finding has a policy within the band, each ends on the policy closest to the
    full cache (kv_policy_words.closest_policies); compare lists those choices: the same (or tied), or a difference judged
    within each run: within noise (SAME) where, in each run, the other run's choice's interval overlaps its own choice's;
    not compared where an interval is missing."""
    from headscope.reports.kv_policy_words import closest_policies

    got = []
    for s in (sa, sb):
        hold = s.get("holding_budgets")
        got.append(closest_policies(hold, float(hold.get("tolerance", 0.01))) if isinstance(hold, Mapping) else None)
    if got[0] is None or got[1] is None:
        return []
    (a, ta), (b, tb) = got
    label = "kv policy closest to the full cache (no policy within the band in either run)"
    said = f"A {_closest_words(sa, a, ta)}, B {_closest_words(sb, b, tb)}"
    n = n_words(sa, sb)
    if a == b:
        return [SAME + f"{label}: the same choice: {said} ({n})."]
    if a in tb or b in ta:
        return [SAME + f"{label}: the same choice up to a tie at the finding's precision: {said} ({n})."]
    apart = [_apart(sa, a, b), _apart(sb, b, a)]
    other = [f"in {side}, {p.replace('_', ' ')} at budget {r['budget']}: {_change_words(s, r)}"
             for side, s, p in (("A", sa, b), ("B", sb, a)) if (r := _closest_row(s, p)) is not None]
    # review 20: a choice that differs within noise was listed among the differences; as _dla_top_note does, it goes
    # with the agreements (SAME), and one without an interval with what was not compared
    if any(x is None for x in apart):
        verdict, head = "an interval is missing: whether the choice differs beyond noise is not known", NOT_COMPARED
    elif any(apart):
        verdict, head = ("beyond noise: " + " and ".join(side for side, x in zip(SIDES, apart) if x)
                         + "'s choice clears the other run's choice in its own run"), ""
    else:
        verdict, head = "within noise: in each run the other run's choice's 95% interval overlaps its own choice's", SAME
    return [head + f"{label}: {said} ({n}); {'; '.join(other)}: {verdict}."]


def _kv_rows_n(s: Mapping[str, Any], label: str) -> dict[str, Any]:
    """{budget: n_evicting} of the policy `label` names (a _kv_budgets label), from every row its holding record
    keeps (above, below, not_shown, at, closest, worst_evicting, rounding_held)."""
    hold = s.get("holding_budgets") if isinstance(s.get("holding_budgets"), Mapping) else {}
    out: dict[str, Any] = {}
    for policy, e in (hold.get("policies") or {}).items():
        if not (isinstance(e, Mapping) and label.startswith(f"kv {policy.replace('_', ' ')} within")):
            continue
        for key in ("above", "below", "not_shown", "rounding_held", "too_few", "at", "closest", "worst_evicting"):
            rows = e.get(key)
            for r in rows if isinstance(rows, list) else [rows]:
                if isinstance(r, Mapping) and r.get("budget") is not None and "n_evicting" in r:
                    out.setdefault(str(r["budget"]), r["n_evicting"])
    return out


def _kv_unsettled(label: str, keys: list[str], va: Mapping[str, Any], vb: Mapping[str, Any], sa: Mapping[str, Any],
                  sb: Mapping[str, Any]) -> str:
    """Review 14b C2: why two kv holding headlines that differ are no difference, '' where they are one: every budget
    whose verdicts differ was run by one run only (its grid: the budgets below its prompts' lengths, a setting, not
    the model), rests on at most one evicting prompt in either run (no interval: the verdict is one prompt's) or is
    one run's "cannot tell" (review 14bv B1)."""
    moved = [k for k in keys if va.get(k) != vb.get(k)]
    ns = [_kv_rows_n(s, label) for s in (sa, sb)]
    grid = [k for k in moved if k not in va or k not in vb]
    single = [k for k in moved if k not in grid and any(_number(n.get(k)) and n[k] <= 1 for n in ns)]
    # review 14bv B1: a run that cannot tell at a budget (its mean off the band, its interval reaching into it) shows
    # no verdict there to differ from
    untold = [k for k in moved if k not in grid + single and "cannot tell" in (va.get(k), vb.get(k))]
    if not moved or len(grid) + len(single) + len(untold) < len(moved):
        return ""
    why = []
    if grid:
        said = "; ".join(f"{k}: {va.get(k, 'not run')} in A, {vb.get(k, 'not run')} in B" for k in grid)
        why.append(f"the verdicts differ only at budgets one run did not run ({said}): the runs' budget grids differ "
                   "(each runs the budgets its prompts' lengths allow), a setting, not the model")
    if single:
        said = "; ".join(f"{k}: {va.get(k)} in A (n = {ns[0].get(k, '?')}), {vb.get(k)} in B (n = {ns[1].get(k, '?')})"
                         for k in single)
        why.append(("the other " if grid else "the ") + f"budget verdicts that differ rest on one evicting prompt "
                   f"({said}), with no interval: whether they differ beyond noise is not known")
    if untold:
        said = "; ".join(f"{k}: {va.get(k)} in A, {vb.get(k)} in B" for k in untold)
        why.append(("the other " if grid or single else "the ") + f"budget verdicts that differ include a run that "
                   f"cannot tell ({said}: its mean more than the band off the full cache, its 95% CI reaching into the "
                   "band), so no difference is shown there")
    return "; ".join(why)


def _rounding_flip(a: Any, b: Any, name: str) -> str:
    """Review 16a B1: where A and B are one model on the same examples in two dtypes with the same settings
    (compare_run.precision_verdict's premise), a verdict that moved is the lower precision's rounding, not another
    sample: the words that say so ('' otherwise, or without the runs)."""
    from headscope.reports.compare_run import dtype_of, precision_only, same_rows, settings_apart

    if a is None or b is None or (sides := precision_only(a, b)) is None or not same_rows(a, b, name) \
            or settings_apart(a, b, name):
        return ""
    return (f" (a rounding difference, not sampling noise: one model on the same examples, run in two dtypes (A "
            f"{dtype_of(a)}, B {dtype_of(b)}), so the verdict moved with {dtype_of((a, b)[sides[1]])}'s rounding, "
            "a test near its threshold on either side of it)")


def _verdict_notes(name: str, sa: Mapping[str, Any], sb: Mapping[str, Any], run_a: Any = None,
                   run_b: Any = None) -> list[str]:
    """Each VERDICTS headline of both runs: the same words (SAME), or a difference with the budgets whose verdicts
    differ (a rounding difference where the runs `run_a` and `run_b` are one model in two dtypes, _rounding_flip), or one
    run's only (not compared); for kv also the policy each finding ends on (_kv_closest_note)."""
    get = VERDICTS.get(name)
    if get is None:
        return []
    a, b = ({label: (words, v, key) for label, words, v, key in get(s)} for s in (sa, sb))
    notes = []
    for label in list(a) + [x for x in b if x not in a]:
        if label not in a or label not in b:
            side = "A" if label in a else "B"
            notes.append(NOT_COMPARED + f"{label}: not compared: only {side}'s report states it.")
            continue
        (wa, va, ka), (wb, vb, kb) = a[label], b[label]
        keys = sorted(set(va) | set(vb), key=lambda x: float(x))
        if name == "kv" and ka != kb and (why := _kv_unsettled(label, keys, va, vb, sa, sb)):
            notes.append(NOT_COMPARED + f"{label}: not compared: A {wa}, B {wb}; " + why + ".")
            continue
        moved = [f"{k}: {va.get(k, 'not run')} in A, {vb.get(k, 'not run')} in B" for k in keys if va.get(k) != vb.get(k)]
        if name == "kv" and ka == kb and moved and (why := _kv_unsettled(label, keys, va, vb, sa, sb)):
            notes.append(SAME + f"{label}: the same verdict: A and B {wa}; {why}.")
            continue
        said = (f"A and B {wa}" if wa == wb else f"A {wa}, B {wb}") + (
            f" (budget verdicts that differ: {'; '.join(moved)})" if moved else "") + (
            _rounding_flip(run_a, run_b, name) if ka != kb and name == "mlp" else "")  # mlp's p-value verdicts
        # review 18c C1: a budget verdict that differs is no "same verdict", whatever the headlines' words
        head = (SAME + f"{label}: the same verdict: " if ka == kb and not moved else
                f"{label}: the same headline, but not the same budget verdicts: " if ka == kb else f"{label}: ")
        notes.append(head + said + ".")
    return notes + (_kv_closest_note(sa, sb) if name == "kv" else [])
