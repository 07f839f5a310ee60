"""The `heads` finding in words (reports/plots_heads.py's `finding`, the family's headline): the unpruned
metric with its interval, the head that costs most alone, ties within rounding among the top heads and at the
start of each pruning order (their small values written out, `_values`), head roles and the L0 sweep; on
encoders what the cosine metric is, at chance only what was measured. The pruning verdict (prunable counts,
their tolerance and curve shapes) is reports/pruning_words.py's.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from headscope.analyses.core.chance import metric_ci, se_interval
from headscope.analyses.heads.roles import ROLE_THRESHOLDS
from headscope.models.hooked_model import window_words
from headscope.reports.findings import _at_chance, _chance, _num, _words, and_join, ci_pair, ci_words, ordinal
from headscope.reports.moe_words import blocks_subject
from headscope.reports.pruning_words import prunable_words, span_tolerance


def _digits(v: float) -> str:
    """Two significant digits written out ('0.00023', '0.000062'), not '6.2e-05', down to 1e-8."""
    said = f"{v:.2g}"
    if "e" in said and v != 0 and abs(v) >= 1e-8:
        said = f"{v:.{1 - math.floor(math.log10(abs(v)))}f}"
    return said


def _values(nums: list[float]) -> list[str]:
    """Numbers said alike to two decimals ('0.41', '0.34'), or all to two significant digits where the largest is
    below 0.01 or any that is not 0 would print as 0.00 (review 11b N5: '(0.00 and 0.00)' for drops of 0.0002)."""
    small = 0 < max(abs(v) for v in nums) < 0.01 or any(v != 0 and f"{abs(v):.2f}" == "0.00" for v in nums)
    return [_digits(v) if small else f"{v:.2f}" for v in nums]


def _shown(values: Any, n: int) -> str:
    """'0.53 each' or '0.41 and 0.34' for a run's n importances ('0.0002 and 0.00026' below 0.01: two significant
    digits, not '0.00 each'); '' where they are not all numbers."""
    nums = [_num(x) for x in values] if isinstance(values, list) else []
    if not nums or len(nums) != n or any(v is None for v in nums):
        return ""
    said = _values(nums)
    return f"{said[0]} each" if len(set(said)) == 1 else and_join(said)


def _order_unit(s: Mapping[str, Any], method: str) -> str:
    """What the values of `method`'s pruning order are, where they are not the importance the top heads rank by:
    for gradients "layer-normalised, as the gradient ordering ranks them" (ordering_basis: |dL/d gate| over its
    layer's L2 norm; review 11b N6: '0.36 each' beside raw '0.00028' named no unit); '' for ablation."""
    if method != "gradient":
        return ""
    basis = s.get("ordering_basis")
    basis = str(basis.get("gradient") or "") if isinstance(basis, Mapping) else ""
    if "norm" in basis:
        return "layer-normalised, as the gradient ordering ranks them"
    return "raw |dL/d gate|, as the gradient ordering ranks them" if basis.startswith("raw") else \
        "as the gradient ordering ranks them"


def _top_tie_words(s: Mapping[str, Any], method: str) -> str:
    """Top heads that tie within rounding, each run of tied neighbours said apart (tied_top_groups_<method>;
    review 9a A4.2: {L2H0, L2H1} and {L2H3, L1H0} are two ties, not one run of four), naming the (k+1)-th head
    a tie at the k-th runs past (tied_top_next_<method>; review 8b C1: "L1H0 tie" named one head of a pair).
    A summary without the runs has only the tied heads: each is said to tie with a neighbour."""
    tied, nxt = [str(h) for h in s.get(f"tied_top_heads_{method}") or []], s.get(f"tied_top_next_{method}")
    by = FINDING_METHOD_WORDS.get(method, method)
    if not tied:
        return ""
    top = [str(h) for h in s.get(f"top_heads_{method}") or []]
    k = len(top) or None
    rank = {h: i + 1 for i, h in enumerate(top)} | ({str(nxt): k + 1} if nxt and k else {})

    def ranked(g: list[str]) -> list[str]:  # every head its rank, or none does (review 16v C4)
        return [f"{h} ({ordinal(rank[h])})" for h in g] if all(h in rank for h in g) else g

    runs = [[str(h) for h in g] for g in s.get(f"tied_top_groups_{method}") or [] if isinstance(g, list) and len(g) > 1]
    if not runs:  # an older summary: which heads tie with which is not recorded, unless there are only two
        names = tied + ([str(nxt)] if nxt else [])
        if len(names) != 2:
            if nxt and k:
                names = ranked(names)
            return (f"By {by}, {and_join(names)} each tie within rounding with a neighbour in the ranking: the order "
                    "of tied neighbours is arbitrary.")
        runs = [names]
    values = s.get(f"tied_top_values_{method}") or []
    said, raw = [], "raw |dL/d gate|" if method == "gradient" else ""
    for i, g in enumerate(runs):
        edge = bool(nxt) and k is not None and g[-1] == str(nxt) and len(g) > 1
        names = ranked(g) if edge else g
        shown = _shown(values[i] if i < len(values) else None, len(g))
        if shown and raw:  # the top heads rank by raw gradients, the pruning order may not: named once
            shown, raw = f"{shown}, {raw}", ""
        said.append((names, f" ({shown})" if shown else "", edge))
    if len(said) == 1:
        names, shown, edge = said[0]
        if edge and len(names) == 2:
            return f"By {by}, {names[0]} ties with {names[1]} within rounding{shown}: their order is arbitrary."
        where = ", across the edge of the top heads" if edge else " among the top heads"
        return f"By {by}, {and_join(names)} tie within rounding{shown}{where}: their order is arbitrary."
    parts = [f"{and_join(n)}{v}{', across the edge of the top heads' if e else ''}" for n, v, e in said]
    kind = "pair" if all(len(n) == 2 for n, _, _ in said) else "group"
    return (f"By {by}, {parts[0]} tie within rounding among the top heads, as do {'; '.join(parts[1:])}: the order "
            f"within each {kind} is arbitrary, not between them.")


def start_of_order(s: Mapping[str, Any], method: str) -> tuple[str, list] | None:
    """How `method`'s pruning order starts where the summary cannot tell its first heads apart: ("tie", heads)
    for a run tied within rounding that is removed first (tied_first_pruned_<method> at 1), else ("close",
    heads) for first heads within each other's standard errors (close_first_pruned_<method>); None where
    neither. The findings below state them; compare names them for each run."""
    groups, at = s.get(f"tied_first_pruned_{method}") or [], s.get(f"tied_first_pruned_at_{method}") or []
    for g, where in zip(groups, at):
        if where == 1 and isinstance(g, list) and len(g) > 1:
            return "tie", g
    close = s.get(f"close_first_pruned_{method}")
    heads = close.get("heads") if isinstance(close, Mapping) else None
    return ("close", heads) if isinstance(heads, list) and len(heads) > 1 else None


def _first_tie_words(s: Mapping[str, Any], method: str) -> str:
    """The first heads of a fixed pruning order that tie within rounding (tied_first_pruned_<method>: runs
    of tied neighbours; review 8b A2: which goes first swapped between float32 and bfloat16, and the count's
    interval with it). "the count's interval can depend on it" only for a run that can move the count
    (tied_first_pruned_moves_<method>, numerics.tie_reach; review 9a A4.3: not of heads removed as a set before the
    deciding step); a summary without it says so of every run."""
    groups = [g for g in s.get(f"tied_first_pruned_{method}") or [] if isinstance(g, list) and len(g) > 1]
    values = s.get(f"tied_first_pruned_values_{method}") or []
    if not groups:
        return ""
    starts = s.get(f"tied_first_pruned_at_{method}") or []
    reach = s.get(f"tied_first_pruned_moves_{method}")
    reach = [bool(x) for x in reach] if isinstance(reach, list) and len(reach) == len(groups) else [True] * len(groups)
    said, unit = [], _order_unit(s, method)
    for i, g in enumerate(groups):
        shown = _shown(values[i] if i < len(values) else None, len(g))
        if shown and unit:  # named once, with the first values printed
            shown, unit = f"{shown}, {unit}", ""
        at = _num(starts[i]) if i < len(starts) else None
        where = f"removed {and_join([ordinal(int(at) + j) for j in range(len(g))])}" if at is not None else ""
        said.append((and_join([str(h) for h in g]), shown, where, at == 1))
    order = "gradient" if method == "gradient" else "ablation"
    if all(reach):
        tail = "arbitrary, and the count's interval can depend on it."
    elif not any(reach):
        tail = "arbitrary, but the count does not depend on it: no step that decides it falls between them."
    else:
        moving = [said[i][0] for i, r in enumerate(reach) if r]
        tail = (f"arbitrary; the count's interval can depend on the order of {' and of '.join(moving)} only (the "
                "others change no step that decides it).")
    if len(said) == 1 and said[0][3]:
        shown = f" ({said[0][1]})" if said[0][1] else ""
        return (f"The first heads of the {order} order, {said[0][0]}, tie within rounding{shown}: which is "
                f"removed first is {tail}")
    runs = [f"{names} ({'; '.join(x for x in (where, shown) if x)})" if where or shown else names
            for names, shown, where, _ in said]
    return (f"In the {order} order, {runs[0]} tie within rounding{', as do ' + '; '.join(runs[1:]) if runs[1:] else ''}: "
            f"which {'of each ' if len(runs) > 1 else ''}is removed first is {tail}")


def _floor_words(s: Mapping[str, Any]) -> str:
    """What "within rounding" meant for each ablation method that has a tie (rounding_floor_<method> and its
    rounding_floor_source): measured by null ablations, or one analytic rounding step where nothing was measured,
    and how it grows past rounding_floor_size (analysis.ablation_tie) where the summary records that size;
    '' without a tie or a recorded floor (gradient ties are relative to each gradient's size, said nowhere else)."""
    tied = {k.removeprefix(p) for k in s for p in ("tied_top_heads_", "tied_first_pruned_")
            if k.startswith(p) and not k.startswith(("tied_first_pruned_values_", "tied_first_pruned_at_",
                                                     "tied_first_pruned_moves_"))}
    source = s.get("rounding_floor_source") if isinstance(s.get("rounding_floor_source"), Mapping) else {}
    null = s.get("rounding_null") if isinstance(s.get("rounding_null"), Mapping) else {}
    said = []
    for method in sorted(tied - {"gradient"}):
        floor = _num(s.get(f"rounding_floor_{method}"))
        if floor is None:
            continue
        by = FINDING_METHOD_WORDS.get(method, method)
        if source.get(method) == "measured":
            runs = f"{null['n_runs']}" if _num(null.get("n_runs")) is not None else "the"
            how = (f"measured: twice the largest change of the metric in {runs} null ablations, which replace "
                   "a layer's heads with themselves, so only rounding moves it")
        elif _num(s.get("rounding_sensitivity")) is not None and _num(s.get("rounding_logit_step")) is not None:
            how = (f"the metric's rounding: one step of the logits at the model's dtype, {s['rounding_logit_step']:.2g}, "
                   f"times the answer's 1 - p summed over its tokens, {s['rounding_sensitivity']:.2g} on average; "
                   "no null ablation measured it")
        else:
            how = "one rounding step of the metric at the model's dtype: no null ablation measured it"
        said.append(f"closer than {floor:.2g} by {by} ({how})")
    size, sens = _num(s.get("rounding_floor_size")), _num(s.get("rounding_sensitivity"))
    k = _num(s.get("rounding_floor_tokens"))
    if s.get("metric") == "logprob" and size is not None and sens is not None and k is not None:
        # review 15cv B1: the size is the logits', and a log-probability's rounding grows with 1 - p, not its size
        share = "(1 - e^(-S))" if k == 1 else f"{k:.0f} (1 - e^(-S/{k:.0f}))"
        grows = (f", at the unpruned answers' 1 - p ({sens:.2g} on average, summed over each answer's tokens); a "
                 "log-probability carries its logits' rounding times 1 - p, so two heads whose larger ablated "
                 f"log-probability is -S tie within that floor times {share} / {sens:.2g}, and once S passes the "
                 f"logits' size ({size:.3g}) within one rounding step of S" if said else "")
    else:
        grown = ("one rounding step of S at the model's dtype, eps x S" if s.get("metric") == "logprob" else
                 f"that floor times S / {size:.3g}" if size is not None else "")
        grows = (f", a floor for metric values up to {size:.3g} in size; two heads whose larger ablated metric "
                 f"(unpruned minus the importance), S, is larger in size tie within {grown}, as one rounding step "
                 "grows with the number rounded" if said and size is not None else "")
    gradient = _gradient_floor_words(s) if "gradient" in tied else ""
    ablation = f"Within rounding here means {'; '.join(said)}{grows}." if said else ""
    return " ".join(x for x in (ablation, gradient) if x)


def _gradient_floor_words(s: Mapping[str, Any]) -> str:
    """What "within rounding" means for a gate-gradient tie (review 14b verify A1: it was said for zero-ablation only,
    and the summary's analytic rounding_floor_gradient sat beside the measured rounding_gradient unnamed): each head's
    own measured rounding summed over the pair (rounding_gradient_heads), else the largest head's for both, else the
    analytic share of the examples' largest gradient; the analytic floor named as the degeneracy check only."""
    check = s.get("rounding_gradient_check") if isinstance(s.get("rounding_gradient_check"), Mapping) else {}
    largest, analytic = _num(s.get("rounding_gradient")), _num(s.get("rounding_floor_gradient"))
    scaled = (" (in the layer-normalised order, each scaled as that order scales the head's gradient)"
              if "layer-normalised" in _order_unit(s, "gradient") and s.get("tied_first_pruned_gradient") else "")
    if s.get("rounding_gradient_source") == "measured" and largest is not None:
        n, of = _num(check.get("n_examples")), _num(check.get("of"))
        if check.get("exact"):
            how = (f"|its mean |dL/d gate| - the same mean with the weights in float32|, over all {n:.0f} examples "
                   "recomputed" if n is not None else "its mean against a float32 recomputation of every example")
        else:
            how = (f"{_num(check.get('margin')) or 2:g} x its mean |dL/d gate - the float32 one| over the first "
                   f"{n:.0f} of {of:.0f} examples recomputed" if n is not None and of is not None
                   else "its error against a float32 recomputation of some examples")
        own = ("the sum of the two heads' own rounding" if s.get("rounding_gradient_heads") is not None
               else "twice the largest head's rounding")
        said = f"By gate gradient, within rounding means closer than {own}{scaled}, each head's measured as {how} " \
               f"(at most {largest:.2g} for any head)"
    elif largest is not None:
        said = (f"By gate gradient, within rounding means closer than twice {largest:.2g}{scaled}, an analytic bound on "
                "each head's mean gradient's rounding (a few eps of the examples' largest gradient; nothing measured "
                "against float32)")
    else:
        said = "By gate gradient, within rounding means within a few eps of the larger gradient's own size"
    source = s.get("rounding_floor_source") if isinstance(s.get("rounding_floor_source"), Mapping) else {}
    if analytic is not None and source.get("gradient", "analytic") == "analytic" and analytic != largest:
        said += (f"; the analytic floor {analytic:.2g} (one rounding step of the loss it differentiates) only checks "
                 "whether every gradient is rounding")
    elif analytic is not None:  # review 15c A2: the degeneracy floor is the gradients' own rounding, said above
        said += "; whether every gradient is rounding is checked against the largest head's"
    return said + "."


def _inner_ties(s: Mapping[str, Any], method: str) -> list[int]:
    """Indices of tied_first_pruned_<method>'s runs whose heads all lie in close_first_pruned_<method>'s run (review
    15cv B1: the same pair was named under both rules); the close sentence says them, the tie sentence leaves them."""
    close = s.get(f"close_first_pruned_{method}")
    heads = close.get("heads") if isinstance(close, Mapping) else None
    if (start_of_order(s, method) or ("",))[0] != "close" or not isinstance(heads, list):
        return []
    groups = s.get(f"tied_first_pruned_{method}") or []
    return [i for i, g in enumerate(groups) if isinstance(g, list) and len(g) > 1 and set(g) <= set(heads)]


def _first_close_words(s: Mapping[str, Any], method: str) -> str:
    """The first heads of the ablation order within each other's standard errors (close_first_pruned_<method>),
    unless a rounding tie already starts the order (review 8b A2: in float32 the first two are 0.005 apart with
    standard errors 0.12 and 0.31, so which goes first is not measured either); its moves_count (numerics.tie_reach)
    False: the count cannot depend on their order."""
    if (start_of_order(s, method) or ("",))[0] != "close":  # none, or a rounding tie starts the order
        return ""
    close = s[f"close_first_pruned_{method}"]
    heads, imp, se = close["heads"], close.get("importance") or [], close.get("se") or []
    if len(heads) < 2 or len(imp) != len(heads) or len(se) != len(heads) or any(_num(x) is None for x in [*imp, *se]):
        return ""
    groups, starts = s.get(f"tied_first_pruned_{method}") or [], s.get(f"tied_first_pruned_at_{method}") or []
    inner = []
    for i in _inner_ties(s, method):
        at = _num(starts[i]) if i < len(starts) else None
        where = f" (removed {and_join([ordinal(int(at) + j) for j in range(len(groups[i]))])})" if at is not None else ""
        inner.append(f"{and_join([str(h) for h in groups[i]])}{where}")
    also = f", {'; '.join(inner)} by less than rounding too" if inner else ""
    return (f"The first heads of the ablation order, {and_join([str(h) for h in heads])} "
            f"({and_join(_values([float(v) for v in imp]))}), differ from their neighbours by less than their standard "
            "errors over examples "
            f"({and_join(_values([float(v) for v in se]))}){also}: which is removed first is not measured by these "
            "examples"
            + (", but the count does not depend on it: no step that decides it falls between them."
               if close.get("moves_count") is False else ", and the count's interval can depend on it."))


def _tie_sentences(s: Mapping[str, Any]) -> list[str]:
    """Ties among the top heads and at the start of each pruning order, what "within rounding" meant, and the
    first heads of the ablation order within their standard errors."""
    firsts = ("tied_first_pruned_values_", "tied_first_pruned_at_", "tied_first_pruned_moves_")
    said = [_top_tie_words(s, k.removeprefix("tied_top_heads_")) for k in s if k.startswith("tied_top_heads_")]
    methods = [k.removeprefix("tied_first_pruned_") for k in s
               if k.startswith("tied_first_pruned_") and not k.startswith(firsts)]
    said += [_first_tie_words(_without(s, m, _inner_ties(s, m)), m) for m in methods]
    close = [_first_close_words(s, k.removeprefix("close_first_pruned_")) for k in s if k.startswith("close_first_pruned_")]
    if any(_inner_ties(s, m) for m in methods):  # the close sentence names a tie: say what rounding meant after it
        return [x for x in [*said, *close, _floor_words(s)] if x]
    return [x for x in [*said, _floor_words(s), *close] if x]


def _without(s: Mapping[str, Any], method: str, drop: list[int]) -> Mapping[str, Any]:
    """s with the tied_first_pruned_<method> runs at `drop` (and their values, starts, reach) left out."""
    if not drop:
        return s
    out = dict(s)
    for key in ("tied_first_pruned_", "tied_first_pruned_values_", "tied_first_pruned_at_", "tied_first_pruned_moves_"):
        if isinstance(s.get(key + method), list):
            out[key + method] = [x for i, x in enumerate(s[key + method]) if i not in drop]
    return out


def _sink_words(s: Mapping[str, Any], roles: Mapping[str, Any], *, ranked: bool = True) -> str:
    """Review 13b C2: what the sink heads attend to (the first token, named where every prompt shares it: `<bos>` on
    Gemma, not the prompt's first word), and the sink heads that the importance methods also rank at the top, said
    with both: a role is scored over every query, while importance is measured at the answer (ranked False: at
    chance, where the top heads are noise, none are named)."""
    sinks = [str(h) for h in roles.get("sink") or []]
    if not sinks:
        return ""
    first = s.get("sink_token") if isinstance(s.get("sink_token"), Mapping) else None
    what = "each prompt's first token"
    if first and first.get("token"):
        what += f", {first['token']!r} on every prompt" + (" (a special token)" if first.get("special") else "")
    out = f" Sink heads put half or more of their attention, averaged over the queries, on {what}."
    windows = s.get("role_windows") if isinstance(s.get("role_windows"), Mapping) else {}
    out += _local_sink_words(sinks, windows, s.get("n_layers"))
    ranks: dict[str, list[str]] = {}
    for method, words in FINDING_METHOD_WORDS.items() if ranked else ():
        top = s.get(f"top_heads_{method}") or []
        for head in sinks:
            if head in top:
                ranks.setdefault(head, []).append(f"{ordinal(top.index(head) + 1)} by {words}")
    if ranks:
        named = "; ".join(f"{h} ({', '.join(r)})" for h, r in ranks.items())
        out += (f" Sink heads among the top heads by importance: {named}: a sink head can also carry the task at "
                "the answer position, so the role is not all that head does here.")
    return out


def _local_sink_words(sinks: list[str], w: Mapping[str, Any], n_layers: Any) -> str:
    """Review 18v B1b: where sink heads sit on sliding-window layers whose window is shorter than the longest prompt,
    how many, which queries their average covers (1 to window - 1 after the first token) and, where the summary has
    sink_uniform (roles.sink_uniform), what a uniform head scores there and on the global layers, so the reader sees
    what the one threshold means on each kind of layer; '' otherwise."""
    windows = {int(l): int(v) for l, v in (w.get("windows") or {}).items()}
    longest = _num(w.get("longest_prompt"))
    binding = {l: v for l, v in windows.items() if longest is None or v < longest}
    layer_of = {h: int(h[1:].split("H")[0]) for h in sinks if h[:1] == "L" and h[1:].split("H")[0].isdigit()}
    local = [h for h in sinks if layer_of.get(h) in binding]
    if not local:
        return ""
    layers = sorted({layer_of[h] for h in local})
    sizes = sorted({binding[l] for l in layers})
    named = ", ".join(local[:3]) + (", ..." if len(local) > 3 else "")
    some = f"{len(local)} of the {len(sinks)} sink heads" if len(local) < len(sinks) else (
        "the sink head" if len(sinks) == 1 else f"all {len(sinks)} sink heads")
    where = f"layer{'s' if len(layers) > 1 else ''} {and_join([str(l) for l in layers])}"
    reach = " or ".join(f"1-{v - 1}" for v in sizes)
    out = (f" {some[0].upper()}{some[1:]} ({named}) {'is' if some == 'the sink head' else 'are'} on sliding-window "
           f"{where} (a window of {and_join([str(v) for v in sizes])}), where that average covers only queries {reach} "
           "after the first token, those whose window holds it")
    uniform = {int(l): float(v) for l, v in (w.get("sink_uniform") or {}).items()}
    bar = ROLE_THRESHOLDS["sink"]
    slid = [uniform[l] for l in layers if l in uniform]
    if not slid:
        return out + "."
    glob = [v for l, v in uniform.items() if l not in windows]
    span = _span(slid)
    out += f": a uniform head puts {span} of its attention there"
    if glob:
        out += f", against {_span(glob)} on the global layers"
    ratio = f"{bar / max(slid):.1f}x" if len(set(slid)) == 1 else f"{bar / max(slid):.1f}-{bar / min(slid):.1f}x"
    out += f", so the one threshold ({bar:g}) is {ratio} uniform there"
    if glob:
        g = f"{bar / max(glob):.1f}x" if len(set(glob)) == 1 else f"{bar / max(glob):.1f}-{bar / min(glob):.1f}x"
        out += f" and {g} on the global layers"
    return out + "."


def _span(values: list[float]) -> str:
    """'0.245' or '0.19-0.25' (3 significant digits)."""
    lo, hi = min(values), max(values)
    return f"{lo:.3g}" if f"{lo:.3g}" == f"{hi:.3g}" else f"{lo:.3g}-{hi:.3g}"


FINDING_METHOD_WORDS = {"gradient": "gradient", "zero": "zero-ablation", "mean": "mean-ablation", "resample": "resample-ablation"}


GRADIENT_UNDER_FLOOR = ("the loss changes its gradients predict are under the rounding floor, though the gradients "
                        "themselves are measured")  # review 15a B2: the values are measurements, not rounding


def degenerate_words(method: str, why: str) -> str:
    """The sentence for importance under the numerical floor (degenerate_<method>): an ablation's changes are within
    rounding; gradients are measured to their own precision, and what lies under the floor is the loss change they
    predict (review 15a B2: 'rounding, not a measurement' beside a precision of 2.1e-05)."""
    if method == "gradient":
        return f"Gradient importance measures no head: {GRADIENT_UNDER_FLOOR}: {why}."
    return f"{FINDING_METHOD_WORDS.get(method, method).capitalize()} importance is rounding, not a measurement: {why}."


def unpruned_cosine(base: float) -> str:
    """The unpruned cosine, said for what it is: each embedding's cosine with itself, 1 up to float32 rounding
    (1e-6); a value further from 1 is named as the cosine's own rounding (a summary from before the encoder
    metric was computed in float32: 0.999 in bfloat16), not as something the model does."""
    if abs(base - 1.0) <= 1e-6:
        return "1 unpruned: each embedding's cosine with itself"
    return (f"{base:.6g} unpruned, not 1: each embedding's cosine with itself, off 1 by the rounding of the cosine's "
            "own arithmetic, so changes of this size are that rounding, not the model")


def lead_ablation(s: Mapping[str, Any]) -> str | None:
    """The ablation method the finding leads with: the first top_head_<method> recorded other than the gradient
    ("zero", "mean"...; the explorer opens on it, explorer.opening_score); None without one."""
    keys = [k for k in s if k.startswith("top_head_") and k != "top_head_gradient" and isinstance(s[k], Mapping)]
    return keys[0].removeprefix("top_head_") if keys else None


def _leading_words(s: Mapping[str, Any], metric: str) -> str:
    """The head that costs most when ablated alone (top_head_<method>, the first ablation method recorded) and the
    head with the largest gate gradient (top_head_gradient), each with its 95% CI and n and whether it stands clear
    of the next head (`_lead_words`). '' without a record or when no head costs anything."""
    keys = [k for k in s if k.startswith("top_head_") and isinstance(s[k], Mapping)]
    ablation = f"top_head_{lead}" if (lead := lead_ablation(s)) else None
    said = [_lead_words(s[k], k.removeprefix("top_head_"), metric) for k in (ablation, "top_head_gradient") if k in keys]
    return " ".join(x for x in said if x)


def _lead_words(top: Mapping[str, Any], method: str, metric: str) -> str:
    """One method's leading head with its 95% CI and n, and whether it stands clear of the next head: by the paired
    difference over the same examples and its 95% interval where recorded (review 12b A5: overlapping marginal
    intervals are no test of a paired difference; gradient: each example's own |dL/d gate|), else by the two
    marginal intervals, said as such. '' when the value is not positive."""
    value, nxt = _num(top.get("importance")), _num(top.get("next_importance"))
    if value is None or nxt is None or value <= 0:
        return ""
    ci, next_ci, diff_ci = ci_pair(top.get("ci")), ci_pair(top.get("next_ci")), ci_pair(top.get("diff_ci"))
    n, head, other = top.get("n_examples"), top["head"], top["next_head"]
    interval = ci_words(ci, '.3g') + ', ' if ci else ''
    if method == "gradient":  # the loss's first-order change per gate, E_x |dL/d xi|: not the metric's units
        said = f"By gate gradient, {head} ranks first with E|dL/d gate| {value:.3g} ({interval}{n} examples)"
        noun, has, above = "gradients", "has", "no other head's is above"
    else:
        verb = f"{method.capitalize()}-ablating" if method in ("zero", "mean", "resample") else f"Ablating ({method})"
        said = f"{verb} {head} alone costs {value:.3g} {metric} ({interval}{n} examples)"
        noun, has, above = "costs", "costs", "no other head costs more than"
    diff = _num(top.get("diff"))
    if diff_ci and diff is not None:  # the paired difference over the same examples decides
        paired = (f"{diff:.3g} more than the next, {other} ({nxt:.3g}; paired difference {head} - {other} over the "
                  f"same {top.get('diff_n', n)} examples {diff:+.3g}, 95% CI [{diff_ci[0]:+.3g}, {diff_ci[1]:+.3g}])")
        if diff_ci[0] > 0:
            return f"{said}, {paired}: {head} stands clear of the next head on these examples."
        return f"{said}, {paired}: the paired interval reaches 0, so these examples do not single out one head."
    # analysis._leading's rule without per-example values: its interval's low end above the next head's high end
    clear = ci[0] > next_ci[1] if ci and next_ci else bool(top.get("clear"))
    if clear:
        return f"{said}; {above} {_digits(nxt)} ({other})."
    if ci and next_ci:  # review 11c: 1.92 lies below [2.21, 6.76]; what the rule tests is that the intervals overlap
        return (f"{said}, the most of any head, but the next, {other}, {has} {nxt:.3g} and their 95% intervals overlap "
                f"({head} [{ci[0]:.3g}, {ci[1]:.3g}], {other} [{next_ci[0]:.3g}, {next_ci[1]:.3g}]; marginal "
                f"intervals, no paired test: this run kept no per-example {noun}): these examples do not single out "
                "one head.")
    return (f"{said}, the most of any head; the next, {other}, {has} {nxt:.3g}, and without a 95% interval for both "
            "(fewer than 2 examples) these examples do not single out one head.")


def _said_at_chance(s: Mapping[str, Any], base: float) -> bool:
    """Whether the chance sentence that opens the finding at chance (findings.chance_sentence) prints the unpruned
    metric itself: the same metric over the same examples. Then the finding does not repeat it, even where the
    analysis's own batched pass rounds it differently (review 14a verify A1: -2.05 there, -2.04 in heads' padded
    bfloat16 batch; the guard's pass is the plain forward, and a value further off than its tolerance makes the
    guard read the analysis's own mean instead, chance.model_on_task)."""
    entry = _chance(s)
    if entry is None or _num(entry.get("mean")) is None:
        return False
    same_metric = entry.get("metric") in (None, s.get("metric"))
    n, own = _num(entry.get("n_examples")), _num(s.get("n_examples"))
    return same_metric and (n is None or own is None or n == own)


def mask_task_words(s: Mapping[str, Any]) -> str:
    """Review 15c B1: on an encoder whose task's prompts hold the mask token, that the cosine does not score the task's
    mask filling, so the heads verdicts are not about it (the summary's mask_task); '' otherwise."""
    m = s.get("mask_task")
    if not isinstance(m, Mapping) or not _num(m.get("n_prompts")):
        return ""
    mask, k, of = m.get("mask_token") or "[MASK]", _num(m.get("n_prompts")), _num(m.get("of"))
    held = f"{k:.0f} of {of:.0f} prompts hold {mask}" if of is not None else f"{k:.0f} prompts hold {mask}"
    answers = " and the task gives their answers" if m.get("answers") else ""
    if not m.get("mlm_head"):
        head = "the checkpoint has no masked-LM head to read"
    elif not m.get("answers"):
        head = "the task gives no answers to read there"
    else:  # mask_read.mask_positions: read at the mask only where every prompt holds exactly one
        head = f"the checkpoint's masked-LM head is read only where every prompt holds exactly one {mask}"
    return (f"This does not score your task's mask filling: {held}{answers}, but {head}, so no head's importance, "
            f"pruning count or dispensability here is evidence about which heads filling {mask} needs.")


def mask_read_words(s: Mapping[str, Any]) -> str:
    """Review 15c B1: where an encoder's task was scored at its mask (the summary's mask_read), where and through
    what each answer was read; '' otherwise."""
    m = s.get("mask_read")
    if not isinstance(m, Mapping):
        return ""
    mask, head = m.get("mask_token") or "[MASK]", m.get("head") or "its masked-LM head"
    return (f"Each answer is read at its prompt's {mask} through the checkpoint's masked-LM head ({head}), as a "
            "decoder's at its answer position.")


def finding(s: Mapping[str, Any]) -> str:
    """Baseline, prunable heads per ordering, and the head roles found."""
    parts = []
    n_heads = s.get("n_heads")
    base, kind = _num(s.get("baseline_metric")), s.get("metric", "metric")
    metric = _words(kind)
    if base is not None:
        ci = metric_ci(s.get("chance"))  # the metric's own interval (review 11b A1)
        span = f" ({ci_words(ci, '.3g')})" if ci else ""
        if kind == "cosine":  # review 7 C1, 11a C1: unpruned, each embedding's cosine with itself
            parts.append(f"The metric is the cosine of each pruned model's pooled embedding with the unpruned model's "
                         f"own ({unpruned_cosine(base)}, over {s.get('n_examples', '?')} examples); the "
                         "gradient ordering differentiates the in-batch contrastive loss instead (the cosine has no "
                         "gradient at the unpruned gates), so it ranks heads by one objective and is scored on another.")
            if mask_task_words(s):
                parts.append(mask_task_words(s))
        elif _said_at_chance(s, base):  # issue 34: the chance sentence before this one gives it already
            parts.append(f"The {metric} above is the unpruned model's, over {s.get('n_examples', '?')} examples.")
        else:
            parts.append(f"Unpruned {metric} is {base:.3g}{span} over {s.get('n_examples', '?')} examples.")
        if kind != "cosine" and mask_read_words(s):
            parts.append(mask_read_words(s))
    if _at_chance(s, kind, base):
        parts.append(f"The model is at chance on this task (logit difference {base:.3g}, near 0): head importance "
                     "and pruning curves measure noise here, not a mechanism.")
    relative = _chance(s) is None  # "within 1%" of a clean metric at chance says nothing
    if relative and not _at_chance(s, kind, base):
        parts.append(_leading_words(s, metric))
    degenerate = {k.removeprefix("degenerate_"): v for k, v in s.items() if k.startswith("degenerate_")}
    for method, why in degenerate.items():
        parts.append(degenerate_words(method, why))
    noisy = {"gradient"} & set(degenerate) | ({"ablation"} if set(degenerate) & {"zero", "mean", "resample"} else set())
    prunable = {k.removeprefix("max_fraction_prunable_"): _num(v) for k, v in s.items()
                if relative and k.startswith("max_fraction_prunable_") and _num(v) is not None
                and k.removeprefix("max_fraction_prunable_").removesuffix("_recompute") not in noisy}
    if prunable and n_heads:
        parts += prunable_words(s, prunable, n_heads, metric)
        fixed = [k for k in prunable if not k.startswith("random")]
        if fixed and all(_num(s.get(f"heads_prunable_{k}")) == n_heads for k in fixed):
            # review 7 C3 (an untrained BERT: 12 of 12): no head moves the metric, which says nothing of redundancy
            within = "1%" if span_tolerance(s) is None else f"{span_tolerance(s)['band']:.3g} nats"
            parts.append(f"Every ordering removes all {n_heads} heads within {within}: the heads' writes barely move this "
                         "metric (as in an untrained model at its initial scale), so this says the heads do little "
                         "here, not that some are redundant beside others.")
    if s.get("mixture_of_experts") and {"gradient", "ablation"} <= {k.removesuffix("_recompute") for k in prunable}:
        parts.append(blocks_subject(s) + ": removing a head can switch the experts the router picks, "
                     "which the first-order gradient cannot see, so the gradient and ablation orders can disagree "
                     "for that reason.")
    if relative and not _at_chance(s, kind, base):  # review 9a C6: at chance the orders and their ties are noise
        parts += _tie_sentences(s)
    if relative:
        parts += _redundancy_words(s, metric)
    roles = s.get("roles")
    windows = s.get("role_windows") if isinstance(s.get("role_windows"), Mapping) else None
    if isinstance(roles, Mapping):
        if windows:
            parts.append(_role_window_words(windows, s.get("n_layers")))
        if s.get("learned_sinks"):  # review 19b A2: the sink role is first-token attention, not the learned sink
            parts.append("The sink role scores attention on the first token; the model's learned attention sinks (a "
                         "sink logit per head, not a token) are apart from it and take part of every row.")
        found = [f"{len(v)} {k.replace('_', '-')} ({', '.join(map(str, v[:3]))}{', ...' if len(v) > 3 else ''})"
                 for k, v in roles.items() if v]
        blind = set((windows or {}).get("induction_unmeasurable") or ())
        if found:
            parts.append("Head roles: " + "; ".join(found) + "."
                         + _sink_words(s, roles, ranked=relative and not _at_chance(s, kind, base)))
            parts.append(nope_role_words(roles, s.get("nope_layers")))
        elif blind and len(blind) == s.get("n_layers"):  # review 9a A2: a role no head can pass is not an absence
            parts.append("No head passes the previous-token, positional or sink threshold (induction could not be "
                         "measured).")
        else:
            parts.append("No head passes a role threshold" + (" (induction only where measured)." if blind else "."))
    l0 = s.get("l0_min_heads_within_tolerance")
    lambdas = s.get("l0_lambdas")
    if isinstance(l0, int) and relative and isinstance(lambdas, (list, tuple)) and len(lambdas) < 2:
        parts.append(f"L0 gates were trained at one strength only (lambda {lambdas[0]:g}): "
                     "no sweep, so they say nothing about how few heads suffice.")
    elif isinstance(l0, int) and relative:
        parts.append(_l0_words(l0, s.get("l0_within_tolerance")))
    return " ".join(p for p in parts if p)


POSITIONAL_ROLES = ("previous-token", "self", "positional")  # roles.role's labels that name an offset


def nope_role_words(roles: Mapping[str, Any], nope: Any) -> str:
    """Review 20 A3: where a head with a positional role (previous-token, self, positional) sits on a layer without
    rotary (summary nope_layers: SmolLM3, Llama 4, Cohere2's and Exaone4's global layers), that its scores carry no
    position encoding of their own: its offset preference comes from the causal mask and, past the first layer, from
    what earlier layers wrote into the residual stream. '' where none does."""
    layers = {int(x) for x in nope or () if _num(x) is not None}
    by = {str(k).replace("_", "-"): v for k, v in roles.items()}
    named = [(str(h), role, int(m.group(1))) for role in POSITIONAL_ROLES for h in by.get(role) or ()
             if (m := re.fullmatch(r"L(\d+)H\d+", str(h))) and int(m.group(1)) in layers]  # (label, role, layer)
    if not named:
        return ""
    heads = ", ".join(f"{h} ({role})" for h, role, _ in named)
    on = sorted({layer for *_, layer in named})
    which = ("layer " if len(on) == 1 else "layers ") + ", ".join(map(str, on))
    verb = "is" if len(named) == 1 else "are"
    first = " (on layer 0 the causal mask alone)" if 0 in on else ""
    return (f"{heads} {verb} on {which}, which {'applies' if len(on) == 1 else 'apply'} no rotary (NoPE): "
            f"{'its' if len(named) == 1 else 'their'} scores carry no position encoding of their own, so the offset "
            "preference comes from the causal mask and from positions earlier layers wrote into the residual stream"
            f"{first}.")


def _l0_words(heads: int, rec: Any) -> str:
    """The L0 sentence with its point's paired change from unpruned, 95% CI and n where recorded (review 12b C1:
    a bare count): the lambda chosen on the training examples (l0.l0_choice) with its in-sample change, then that
    mask's change on the held-out examples and whether it stays within the band there (#34 item 2); an older summary
    that chose on the held-out examples says so; where the fit is in-sample (a task too small to split, or an older
    summary), it says so and why."""
    change, ci = (_num(rec.get("change")), ci_pair(rec.get("ci"))) if isinstance(rec, Mapping) else (None, None)
    said = f"L0 gates keep the metric within tolerance with {heads} heads"
    if change is None or ci is None:
        return f"{said} (in-sample: measured on the examples the gates were trained on, no held-out check)."
    n = rec.get("n_examples", "?")
    point = f"lambda {float(rec['lambda']):g}: {float(rec['metric']):.4g}"
    if rec.get("in_sample") is False:
        inside, inside_ci = _num(rec.get("in_sample_change")), ci_pair(rec.get("in_sample_ci"))
        n_train = rec.get("n_train", "?")
        if rec.get("chosen_on") == "training examples" and inside is not None and inside_ci:
            # #34 mends: the lambda is chosen on the training examples, then scored on the held-out ones
            band, within = _num(rec.get("band")), rec.get("held_out_within")
            verdict = ("" if band is None or not isinstance(within, bool) else
                       f", within the tolerance band ({band:.3g} below unpruned) there" if within else
                       f", below the tolerance band ({band:.3g} below unpruned) there: the choice made on the training "
                       "examples does not hold on new ones")
            return (f"On the {n_train} examples the gates were fitted on, L0 gates keep the metric within tolerance "
                    f"with {heads} heads (lambda {float(rec['lambda']):g}, the fewest heads within tolerance there: a "
                    f"change of {inside:+.3g}, 95% CI [{inside_ci[0]:+.3g}, {inside_ci[1]:+.3g}]); scored on {n} "
                    f"held-out examples, that mask gives {float(rec['metric']):.4g}, a change of {change:+.3g} from "
                    f"unpruned, 95% CI [{ci[0]:+.3g}, {ci[1]:+.3g}]{verdict}.")
        secondary = (f"; in-sample, on the {n_train} training examples, {inside:+.3g}, 95% CI "
                     f"[{inside_ci[0]:+.3g}, {inside_ci[1]:+.3g}]") if inside is not None and inside_ci else ""
        # an older summary chose the lambda on the held-out examples it then scores: said so
        return (f"{said} on held-out examples (gates fitted on {n_train} examples; {point} on {n} "
                f"others, a change of {change:+.3g} from unpruned, 95% CI [{ci[0]:+.3g}, {ci[1]:+.3g}]{secondary}; "
                "the lambda was chosen on those held-out examples too, so this point is optimistic).")
    why = f" ({rec['in_sample_reason']})" if rec.get("in_sample_reason") else ", no held-out check"
    return (f"{said} ({point}, a change of {change:+.3g} from unpruned, 95% CI [{ci[0]:+.3g}, {ci[1]:+.3g}] over {n} "
            f"examples; in-sample: measured on the examples the gates were trained on{why}).")


def _role_window_words(w: Mapping[str, Any], n_layers: Any) -> str:
    """Review 9a A2: on sliding-window layers, how sink and induction were scored so the mask does not
    decide them: sink over the queries that see the first token, induction on repeats that fit the
    window, or not measurable where they cannot. Review 12b A4: each only where the window binds (a
    window shorter than the longest prompt; a probe the windows cut or cannot fit), else '' (no false cause)."""
    windows = {int(l): int(v) for l, v in (w.get("windows") or {}).items()}
    length, blind = w.get("induction_length"), list(w.get("induction_unmeasurable") or ())
    longest, cut = _num(w.get("longest_prompt")), w.get("induction_cut")
    binding = {l: v for l, v in windows.items() if longest is None or v < longest}  # older summaries: every window
    said = []
    if binding:
        said.append("sink is scored over the queries that can see the first token (within window - 1 positions of it)"
                    + ("" if len(binding) == len(windows) else
                       f" on layer(s) {and_join([str(l) for l in sorted(binding)])}, whose window is shorter than the "
                       f"longest prompt ({longest:.0f} tokens)"))
    if blind:
        where = "every layer" if len(blind) == n_layers else ("layers " if len(blind) > 1 else "layer ") + and_join(
            [str(l) for l in blind])
        narrow = and_join([str(v) for v in sorted({windows[l] for l in blind if l in windows})])
        said.append(f"induction is not measurable on {where} (a window of {narrow}): the probe reads {length - 1} back")
    elif cut or cut is None and length is not None:  # None: an older summary, which did not record why
        said.append(f"induction is probed on repeats of {length} tokens (reading {length - 1} back)"
                    + (" to fit well inside the window, short of its oldest key" if cut else ", within the window"))
    return f"Sliding windows ({window_words(windows, n_layers, short=True)}): {'; '.join(said)}." if said else ""


def _redundancy_words(s: Mapping[str, Any], metric: str) -> list[str]:
    """One sentence per redundant layer (summary["redundant_layers"], heads/pruning.layer_redundancy): removing the
    whole layer costs much, with its 95% t interval, while no one head's own ablation, nor keeping any one head alone,
    moves the metric by more than a tenth of that (review 9b A2: the heads finding left this out)."""
    said = []
    for entry in s.get("redundant_layers") or []:
        if not isinstance(entry, Mapping) or _num(entry.get("layer_removed_change")) is None:
            continue
        layer, n, joint = entry["layer"], int(_num(entry.get("n_examples")) or 0), entry["layer_removed_change"]
        se = _num(entry.get("layer_removed_change_se"))
        ci = se_interval(joint, se, n)  # se = sd / sqrt(n)
        span = f", 95% CI [{ci[0]:+.3g}, {ci[1]:+.3g}]" if ci is not None else ""
        said.append(
            f"Layer {layer}'s {entry['n_heads']} heads are redundant: removing all of them changes the {metric} by "
            f"{joint:+.3g}{span} over {n} examples, while no one head's own ablation moves it by more than "
            f"{abs(entry['max_ablation']):.2g} (L{layer}H{entry['max_ablation_head']}) and keeping any one of them alone "
            f"changes it by at most {entry['worst_change']:+.2g} (L{layer}H{entry['worst_head']}): one head does the "
            "layer's work, so per-head importance and pruning counts understate the layer.")
    return said
