"""Headlines `headscope compare` sets side by side beyond each analysis's first numbers (compare_headlines.py's
QUANTITIES): attribution's permutation and adversarial-attention tests, patching's attribution-vs-exact Pearson r
per site type, kv's first-key norm ratio per layer, and the attention on the first token(s) per layer that kv and
position both report (the shared sink records, findings.sink_sentence).

Each number is the one its finding states, with that finding's interval (a t interval over examples, a bootstrap
one, a Fisher interval over cells), or none where the finding states none (a median, a share of examples): then it
is "Not compared" unless equal at the printed precision (compare_headlines.headline_notes' rule). A setting that
changes the quantity (the permuted layer, the adversarial search's steps or bound, the first n_sink tokens) puts it
under "Not compared" with why (`measure_apart`); so does a report that leaves the number out with its reason
(`measure_withheld`: a patching r its finding says rests on too few cells or on one cell, at chance; an adversarial
JSD on a saturated output).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from headscope.reports.compare_run import NOT_COMPARED, SAME, SIDES, Run, _analysis_settings, _number, layers_by_noise
from headscope.reports.findings import _chance, _words, ci_pair, fisher_interval, t_interval

Quantity = tuple[str, Any, "tuple[float, float] | None", Any, str]  # (label, value, its finding's interval, n, unit)
PERMUTATION = "attribution permutation test"
ADVERSARIAL = "attribution adversarial attention"
R_LABEL = "patching attribution-vs-exact Pearson r at "


def _attribution(s: Mapping[str, Any]) -> list[Quantity]:
    """The permutation and adversarial numbers attribution_words._output_tests states: the median output change (no
    interval: a median with its range), the task metric's mean change and mean absolute change (t interval; the
    absolute one's bootstrap interval, or its t interval clipped at 0 in older summaries), the adversarial median JSD
    and share of examples near ln 2 (no interval), and, on a saturated output where the finding states it, the task
    metric's change at the adversarial attention (t interval)."""
    from headscope.reports.attribution_words import _saturated, median_change

    words = _words(s.get("metric", "metric"))
    n_perm = s.get("permutation_change_n", s.get("n_examples"))
    out: list[Quantity] = [(f"{PERMUTATION}: median {s.get('output_change', 'output change')} over permutations",
                            median_change(s), None, n_perm, "examples")]
    for key, what in (("permutation_metric_change", f"{PERMUTATION}: mean change of the {words}"),
                      ("permutation_abs_metric_change", f"{PERMUTATION}: mean absolute change of the {words}"),
                      ("adversarial_metric_change", f"{ADVERSARIAL}: mean change of the {words}")):
        if key == "adversarial_metric_change" and _saturated(s) is None:  # the finding states it on a saturated output
            continue
        mean, sd, n = s.get(key), s.get(f"{key}_sd"), s.get(f"{key}_n")
        ci = t_interval(float(mean), float(sd), int(n)) if _number(mean) and _number(sd) and _number(n) else None
        if key == "permutation_abs_metric_change":  # attribution_words._abs_ci: bootstrap, else t clipped at 0
            ci = ci_pair(s.get(f"{key}_ci"), ordered=True) or (ci and (max(0.0, ci[0]), ci[1]))
        out.append((what, mean if _number(n) and n >= 1 else None, ci, n, "examples"))
    out.append((f"{ADVERSARIAL}: median JSD (nats)", s.get("median_adversarial_jsd"), None, n_perm, "examples"))
    if _saturated(s) is None:  # the finding states the share near ln 2 only on an output that is not saturated
        out.append((f"{ADVERSARIAL}: share of examples within 90% of ln 2", s.get("fraction_adversarial_near_ln2"),
                    None, n_perm, "examples"))
    return out


def _patching(s: Mapping[str, Any]) -> list[Quantity]:
    """Per site type of attribution_correlation, its Pearson r over n cells with the Fisher 95% interval the patching
    finding prints (patching_agreement._correlation's "plain" and "set" readings); the r without an interval where the
    finding states it without one (measure_withheld says why)."""
    from headscope.reports.patching_agreement import _case

    corr = s.get("attribution_correlation")
    out: list[Quantity] = []
    for kind, stats in (corr.items() if isinstance(corr, Mapping) else ()):
        if not isinstance(stats, Mapping) or not _number(stats.get("pearson")):
            continue
        r, n = float(stats["pearson"]), int(stats.get("n") or 0)
        ci = fisher_interval(r, n) if _case(stats) in ("plain", "set") else None
        out.append((R_LABEL + str(kind), r, ci, n, "cells"))
    return out


MORE = {"attribution": _attribution, "patching": _patching}  # analysis -> more [(label, value, interval, n, unit)]


def paired(qa: list[Quantity], qb: list[Quantity]) -> list[tuple[Quantity, Quantity]]:
    """A's and B's quantities paired by label, A's order first; a label only one side has is paired with a blank
    (label, None, None, None, unit), which headline_notes says is "only A's (B's) report states it"."""
    ia, ib = {q[0]: q for q in qa}, {q[0]: q for q in qb}
    labels = list(dict.fromkeys([*ia, *ib]))
    blank = {label: (label, None, None, None, (ia.get(label) or ib[label])[4]) for label in labels}
    return [(ia.get(label, blank[label]), ib.get(label, blank[label])) for label in labels]


def _steps(run: Run, s: Mapping[str, Any]) -> Any:
    """The adversarial search's Adam steps: the summary's (adversarial_steps), else the manifest's preset with the
    budget's change (summary budget.changed), else None."""
    if _number(s.get("adversarial_steps")):
        return s["adversarial_steps"]
    changed = (s.get("budget") or {}).get("changed") if isinstance(s.get("budget"), Mapping) else None
    moved = (changed or {}).get("adversarial_steps") if isinstance(changed, Mapping) else None
    if isinstance(moved, (list, tuple)) and len(moved) == 2:
        return moved[1]
    return _analysis_settings(run, "attribution").get("adversarial_steps")


def measure_apart(name: str, label: str, sa: Mapping[str, Any], sb: Mapping[str, Any], a: Run, b: Run) -> str:
    """Why A's and B's number under `label` are not one quantity ('' where they are as far as the records tell):
    attribution's tests on other layers; the adversarial search with another bound on the output change or another
    number of steps (a longer search finds attention farther away: a setting, not the model)."""
    if name != "attribution" or not label.startswith((PERMUTATION, ADVERSARIAL)):
        return ""
    why = []
    la, lb = sa.get("permutation_layer"), sb.get("permutation_layer")
    if la is not None and lb is not None and la != lb:
        why.append(f"A's test is on layer {la}'s attention, B's on layer {lb}'s")
    if label.startswith(ADVERSARIAL):
        ea, eb = sa.get("adversarial_epsilon"), sb.get("adversarial_epsilon")
        if _number(ea) and _number(eb) and ea != eb:
            why.append(f"A bounds the output change by {ea:g}, B by {eb:g}")
        ta, tb = _steps(a, sa), _steps(b, sb)
        if _number(ta) and _number(tb) and ta != tb:
            why.append(f"A searched {ta:g} Adam steps, B {tb:g}: a longer search finds attention farther from the "
                       "model's, a setting, not the model")
    return "; ".join(why)


def measure_withheld(name: str, label: str, s: Mapping[str, Any]) -> str:
    """How the report of `name` leaves the number under `label` out or says it means nothing ('' where it states it
    as a number to read): a patching r at chance, over exact effects below the negligible line, on too few non-zero
    cells, or carried by its largest cell; on a saturated output the permutations' median distance and the adversarial
    JSD, which its finding says show nothing there (attribution_words._output_tests)."""
    if name == "attribution" and label.startswith((f"{ADVERSARIAL}: median JSD", f"{PERMUTATION}: median ")):
        from headscope.reports.attribution_words import _saturated

        if _saturated(s) is None:
            return ""
        if label.startswith(PERMUTATION):
            return ("says its output is saturated, where a small distance does not show that the layer does little "
                    "(the task metric's change is compared instead)")
        return ("says its median JSD says nothing about faithfulness (a saturated output meets the bound on the "
                "output change under almost any attention)")
    if name != "patching" or not label.startswith(R_LABEL):
        return ""
    from headscope.analyses.patching.attribution_patching import NEGLIGIBLE
    from headscope.reports.patching_agreement import _case, negligible
    from headscope.reports.patching_words import _gap

    if _chance(s) is not None:
        return "is at chance and states no r (what was measured only)"
    stats = (s.get("attribution_correlation") or {}).get(label.removeprefix(R_LABEL)) or {}
    if negligible(stats, _gap(s), s) is not None:
        return f"gives no r: its exact effects are all below {NEGLIGIBLE:g} of the gap, nothing to rank"
    case, nz = _case(stats), stats.get("n_nonzero")
    return {"few": f"says its r rests on {nz} non-zero exact effect(s) and says nothing about agreement",
            "sparse": f"states its r over {nz} non-zero cells of {stats.get('n')} without an interval",
            "one point": "says its r is driven by its largest cell (the agreement rests on one point)",
            "mostly": "says its r is mostly carried by its largest cell, without an interval"}.get(case, "")


def site_not_run(name: str, label: str, s: Mapping[str, Any], run: Run) -> str:
    """Why a run's report has no patching r at the site under `label` ('' where that is not recorded): its time
    budget cut the sites (the summary's budget.changed "sites") or its own sites setting left the site out (review
    16b C1: "n differs: not recorded vs 96 cells" was given where A's budget never ran attn_out)."""
    if name != "patching" or not label.startswith(R_LABEL):
        return ""
    site = label.removeprefix(R_LABEL)
    budget = s.get("budget") if isinstance(s.get("budget"), Mapping) else {}
    moved = (budget.get("changed") or {}).get("sites") if isinstance(budget.get("changed"), Mapping) else None
    if isinstance(moved, (list, tuple)) and len(moved) == 2 and isinstance(moved[1], (list, tuple)) \
            and site not in moved[1]:
        from headscope.reports.findings import and_join

        return (f"did not patch {site}: its time budget cut patching's sites to {and_join([str(x) for x in moved[1]])}"
                if moved[1] else f"did not patch {site}: its time budget ran no site")
    sites = _analysis_settings(run, "patching").get("sites")
    if isinstance(sites, (list, tuple)) and sites and site not in sites:
        return f"did not patch {site}: its sites setting ({', '.join(str(x) for x in sites)}) leaves it out"
    return ""


def r_verdict(ra: float, rb: float, na: int, nb: int) -> str:
    """Two Pearson r's by their Fisher 95% intervals (findings.fisher_interval, the ones the findings print): within
    noise where |atanh rb - atanh ra| is inside the two intervals' combined half-widths on the z scale (1.96 /
    sqrt(n - 3) each, compare_heads.pearson_words' interval), beyond it otherwise; the same rule as noise_verdict's."""
    ia, ib = fisher_interval(ra, na), fisher_interval(rb, nb)
    if ia is None or ib is None:
        return ""
    half = 1.959964 / math.sqrt(na - 3) + 1.959964 / math.sqrt(nb - 3)
    diff = abs(math.atanh(rb) - math.atanh(ra))
    spans = f"Fisher 95% CIs A [{ia[0]:.3f}, {ia[1]:.3f}], B [{ib[0]:.3f}, {ib[1]:.3f}]"
    if diff <= half:
        return f" (within noise: |z_B - z_A| = {diff:.3g} is inside the combined Fisher half-widths {half:.3g}; {spans})."
    return f" (beyond noise: |z_B - z_A| = {diff:.3g} exceeds the combined Fisher half-widths {half:.3g}; {spans})."


# the attention on the first token per layer (kv's and position's shared sink records) and kv's first-key norm ratio
SINK_LABEL = "kv attention on the first token per layer"
SINK_VERDICT = "kv attention-sink layers"
NORM_LABEL = "kv first key's norm over the other keys' per layer"


def _rows(records: Any, value: str) -> dict[int, Mapping[str, Any]]:
    return {int(r["layer"]): r for r in records or []
            if isinstance(r, Mapping) and _number(r.get(value)) and _number(r.get("layer"))}


def _rounded_layers(label: str, ra: dict, rb: dict, value: str, n: str, rounding: tuple[str, str]) -> list[str]:
    """Per-layer values of one model on the same prompts in two dtypes (verification 17v C3: judged by the prompts'
    intervals while the page's other rows said those do not judge a rounding difference): the same in every layer,
    equal at the shown 2 decimals (SAME, with the digits that show the move), or a ROUNDING note with the largest
    |B - A|; never a sampling verdict."""
    from headscope.reports.compare_run import rounding_text
    from headscope.reports.patching_words import distinct_pair

    low, dtypes = rounding
    layers = sorted(ra)
    diffs = {k: abs(rb[k][value] - ra[k][value]) for k in layers}
    if not any(diffs.values()):
        return [SAME + f"{label}: the same in every layer in both dtypes ({dtypes}), one model on the same prompts: "
                + "; ".join(f"layer {k} {ra[k][value]:.2f}" for k in layers) + f" ({n})."]
    top = max(layers, key=diffs.__getitem__)
    if all(f"{ra[k][value]:.2f}" == f"{rb[k][value]:.2f}" for k in layers):
        shown = {k: distinct_pair(ra[k][value], rb[k][value]) for k in layers}
        return [SAME + f"{label}: equal in every layer at the shown precision (2 decimals), moved below it by {low}'s "
                f"rounding (one model on the same prompts in two dtypes, {dtypes}; largest |B - A| {diffs[top]:.2g}, "
                f"layer {top}): " + "; ".join(f"layer {k} A {shown[k][0]}, B {shown[k][1]}" for k in layers) + f" ({n})."]
    return [rounding_text(f"{label}: layer {top} moved most: A {ra[top][value]:.3g}, B {rb[top][value]:.3g}, "
                          f"|B - A| = {diffs[top]:.3g}; every layer: "
                          + "; ".join(f"layer {k} A {ra[k][value]:.2f}, B {rb[k][value]:.2f}" for k in layers)
                          + f" ({n}).", ra[top][value], rb[top][value])]


def _layers_note(label: str, ra: dict, rb: dict, value: str, unit: str, differ: str,
                 rounding: tuple[str, str] | None = None, why_none: str = "") -> list[str]:
    """Per-layer records (value, ci, n) of A and B judged layer by layer by their recorded 95% intervals
    (noise_verdict): beyond noise where any layer is, naming those and the others within; within noise in every
    layer; not compared where an interval is missing, the runs' layers differ or `differ` says why. Where A and B are
    one model on the same prompts in two dtypes (`rounding`: the lower dtype and the dtypes in words), by rounding
    instead (_rounded_layers), as every other row of the page judges such a pair."""
    from headscope.reports.compare_headlines import NOT_STATED
    from headscope.reports.compare_notes import _n_text

    if not (ra and rb):
        return [NOT_COMPARED + f"{label}: not compared: only {'A' if ra else 'B'}'s report states it."] if ra or rb \
            else []
    if differ or set(ra) != set(rb):
        why = differ or f"the runs' layers differ (A {len(ra)}, B {len(rb)})"
        return [NOT_COMPARED + f"{label}: not compared: {why}."]
    n = _n_text(ra[min(ra)].get("n"), rb[min(rb)].get("n"), unit)
    if rounding is not None:
        return _rounded_layers(label, ra, rb, value, n, rounding)
    layers = []
    for layer in sorted(ra):
        a, b = ra[layer], rb[layer]
        ia, ib = ci_pair(a.get("ci"), ordered=True), ci_pair(b.get("ci"), ordered=True)
        band = [f" [{i[0]:.2f}, {i[1]:.2f}]" if i else "" for i in (ia, ib)]
        layers.append((f"layer {layer} A {a[value]:.2f}{band[0]}, B {b[value]:.2f}{band[1]}", a[value], b[value], ia, ib))
    # as the findings: many layers are summarised, those that differ are named
    return layers_by_noise(layers, label, n, lambda none: f"{label}: not compared{why_none}: {none} ({n})" + NOT_STATED,
                           count_many=True, why_none=why_none)


def _sink_baseline_words(sa: Mapping[str, Any], sb: Mapping[str, Any]) -> str:
    """The share each run's sink verdict is judged against (its summary's sink_baseline; review 16cv B1): ALiBi's
    bias alone on an ALiBi model, else the uniform share; each named where the runs differ."""
    words = {"alibi": "the share ALiBi's position bias alone gives", "uniform": "the uniform share"}
    a, b = (words["alibi" if s.get("sink_baseline") == "alibi" else "uniform"] for s in (sa, sb))
    return a if a == b else f"each run's own baseline (A {a}, B {b})"


def sink_note(sa: Mapping[str, Any], sb: Mapping[str, Any], differ: str = "", name: str = "kv",
              rounding: tuple[str, str] | None = None) -> list[str]:
    """Review 14b-v C2: the attention on the first token(s) per layer that the kv and position findings state
    (findings.sink_sentence: mean over prompts or examples with its 95% t interval) compared layer by layer by those
    intervals, and which layers each calls sinks (the same verdict or a difference); not compared where the runs ran
    other tasks (`differ`), other layers, or (position) counted another number of first tokens (n_sink)."""
    from headscope.analyses.position.sinks import SINK_RATIO
    from headscope.reports.findings import beside

    ra, rb = _rows(sa.get("sinks"), "mass"), _rows(sb.get("sinks"), "mass")
    if name == "kv":
        label, verdict_label, unit = SINK_LABEL, SINK_VERDICT, "prompts"
    else:
        k = sa.get("n_sink") if sa.get("n_sink") == sb.get("n_sink") else None
        what = sa.get("sink_label") if sa.get("sink_label") == sb.get("sink_label") and sa.get("sink_label") else \
            ("the first token" if k == 1 else f"the first {k} tokens") if k is not None else "the first tokens"
        label, verdict_label, unit = f"position attention on {what} per layer", "position attention-sink layers", "examples"
        if ra and rb and sa.get("n_sink") != sb.get("n_sink") and not differ:
            differ = (f"A counts the first {sa.get('n_sink')} token(s) as the sink, B the first {sb.get('n_sink')}: "
                      "another quantity")
    if not (ra or rb):
        return []
    if not (ra and rb):
        side = "A" if ra else "B"
        return [NOT_COMPARED + f"{x}: not compared: only {side}'s report states it." for x in (label, verdict_label)]
    if differ or set(ra) != set(rb):
        why = differ or f"the runs' layers differ (A {len(ra)}, B {len(rb)})"
        return [NOT_COMPARED + f"{label} and which layers are sinks: not compared: {why}."]
    ra, rb, copies = _without_copies(ra), _without_copies(rb), _copied_layers(ra) | _copied_layers(rb)
    why = (f" (layer{'s' * (len(copies) > 1)} {', '.join(map(str, sorted(copies)))}: a run's examples are copies of one "
           "input over the queries measured, so it has no interval; a difference there is not judged against noise)"
           if copies else "")
    notes = _layers_note(label, ra, rb, "mass", unit, "", rounding, why)
    sinks = [[layer for layer, r in rows.items() if r.get("sink")] for rows in (ra, rb)]
    words = [f"layer{'s' * (len(x) > 1)} {', '.join(map(str, sorted(x)))}" if x else "none" for x in sinks]
    rule = f"at least {SINK_RATIO:g}x {_sink_baseline_words(sa, sb)}" + _sink_test(sa, sb)
    ratio = [", ".join(f"layer {k} {beside(r['ratio'], SINK_RATIO)}x" for k, r in sorted(rows.items())
                       if _number(r.get("ratio"))) for rows in (ra, rb)]
    if words[0] == words[1]:
        notes.append(SAME + f"{verdict_label} ({rule}): the same verdict: A and B {words[0]}.")
    else:
        notes.append(f"{verdict_label} ({rule}): A {words[0]} ({ratio[0]}), B {words[1]} ({ratio[1]}).")
    return notes


def _sink_test(sa: Mapping[str, Any], sb: Mapping[str, Any]) -> str:
    """The interval half of the two runs' sink rule, worded by what each computed (verification 18v B3: "its excess
    95%-CI above 0" was cited where neither run had an interval, findings.ratio_alone): the interval test where both
    give one in every layer, the ratio alone where neither gives any, else the layers each run decided by the ratio."""
    from headscope.reports.findings import int_ranges, ratio_alone

    rows = [[r for r in s.get("sinks") or [] if isinstance(r, Mapping) and _number(r.get("layer"))] for s in (sa, sb)]
    alone = [ratio_alone(x) for x in rows]
    if not any(alone):
        return ", its excess 95%-CI above 0"
    if all(len(x) == len(r) for x, r in zip(alone, rows)):
        return "; no interval in either run, so the ratio alone decides"
    which = [f"layer{'s' * (len(x) > 1)} {int_ranges(sorted(x))}" for x in alone]
    where = (f"{which[0]} in both" if alone[0] == alone[1] else
             "; ".join(f"{side}'s {w}" for side, w, x in zip(SIDES, which, alone) if x))
    return f", its excess 95%-CI above 0 where a run gives an interval (the ratio alone on {where})"


def _copied_layers(rows: dict[int, Mapping[str, Any]]) -> set[int]:
    """Review 17c C5: layers whose sink record rests on copies of one input: n_distinct 1, or (a summary before
    n_distinct) an interval of width 0 over 2 or more examples, which only identical values give."""
    out = set()
    for layer, r in rows.items():
        ci = ci_pair(r.get("ci"), ordered=True)
        n = r.get("n")
        if r.get("n_distinct") == 1 or (ci is not None and ci[0] == ci[1] and isinstance(n, int) and n >= 2):
            out.add(layer)
    return out


def _without_copies(rows: dict[int, Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    """rows with the interval of every _copied_layers record dropped."""
    copied = _copied_layers(rows)
    return {layer: ({**r, "ci": None} if layer in copied else r) for layer, r in rows.items()}


def norm_note(sa: Mapping[str, Any], sb: Mapping[str, Any], differ: str = "",
              rounding: tuple[str, str] | None = None) -> list[str]:
    """The kv finding's first-key norm ratio per layer (its `key_norm_ratios` records: each prompt's ratio, mean over
    the prompts with its 95% t interval; kv_cache_words._norm_sentence) compared layer by layer by those intervals; layers
    the finding leaves out (keys normalised before caching) are left out here too; an older summary's ratios
    (sink_key_norm_ratio_per_layer, no interval) are not compared."""
    from headscope.reports.kv_cache_words import reported_norm_layers

    rows = []
    for s in (sa, sb):
        keep = reported_norm_layers(s)
        records = s.get("key_norm_ratios")
        if not isinstance(records, list):  # an older summary: ratios without an interval or n
            records = [{"layer": int(k), "ratio": v} for k, v in (s.get("sink_key_norm_ratio_per_layer") or {}).items()]
        rows.append({k: r for k, r in _rows(records, "ratio").items() if str(k) in keep})
    return _layers_note(NORM_LABEL, rows[0], rows[1], "ratio", "prompts", differ, rounding)


def more_notes(a: Run, b: Run) -> list[str]:
    """The position finding's first-token attention (sink_note), compared whatever the curves' chance verdict: the
    finding states it at chance too (a property of the attention, not the task)."""
    from headscope.reports.compare_run import rounding_dtypes, tasks_differ

    sa, sb = a.summary("position"), b.summary("position")
    if sa is None or sb is None:
        return []
    return sink_note(sa, sb, tasks_differ(a, b, "position"), name="position",
                     rounding=rounding_dtypes(a, b, "position"))


__all__ = ["MORE", "SIDES", "measure_apart", "measure_withheld", "more_notes", "norm_note", "paired", "r_verdict",
           "site_not_run",
           "sink_note"]
