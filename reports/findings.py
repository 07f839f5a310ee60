"""Findings in words: one paragraph per analysis, read from its summary dict, and one caption per figure.

Each `<analysis>_finding(summary) -> str` states the headline numbers of that analysis and says so
when the result carries no information (a model at chance, a flat curve at its ceiling, a layer
whose attention changes nothing). The text is plain (no markup): callers escape it.

A summary's "chance" entry (analyses/core/chance.py, added by the registry) decides whether the
model is at chance on the task: then `finding` opens with that and the findings stated relative to
the clean metric (heads prunable or L0-kept "within 1%", kv budgets "within 1%" of the full cache,
patching effects as shares of the clean-corrupted gap) are left out. Summaries without the entry
(older results) keep the logit-difference heuristic `_at_chance`.

A finding claims only what its numbers carry (REFERENCES.md, "Claims a reviewer accepts"): each
states its n; a mean tau carries its t interval, a fraction its Wilson interval, a correlation its
Fisher interval and how many points it rests on; a shape (U-shape, neglected middle) is claimed only
when the bootstrap intervals of the positions it contrasts separate; importance that is rounding
(the heads summary's degenerate_<method>) or top heads that tie are said so and not ranked; a
budget or lens layer is named in the figure's own terms (the whole prompt, "after block l").
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

CHANCE_LOGIT_DIFF = 0.1  # |logit(answer) - logit(wrong)| below this: the model does not prefer the answer
FLAT = 0.02  # a curve whose values span less than this (in its own units) is called flat


def _num(value: Any) -> float | None:
    """A finite float, or None for missing, NaN, inf and non-numbers."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _pct(fraction: float) -> str:
    return f"{100 * fraction:.0f}%"


FEW = 10  # fewer examples than this: a rate or a mean is stated with the warning that it is too few to generalise


def t_interval(mean: float, sd: float | None, n: int, level: float = 0.95) -> tuple[float, float] | None:
    """Student-t interval of a mean from its sample sd and n (None when n < 2 or sd is unknown)."""
    if sd is None or n < 2 or not math.isfinite(sd):
        return None
    from scipy import stats

    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n)
    return mean - half, mean + half


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score 95% interval of a proportion k / n."""
    p, denom = k / n, 1 + z * z / n
    centre, half = (p + z * z / (2 * n)) / denom, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def fisher_interval(r: float, n: int, z: float = 1.959964) -> tuple[float, float] | None:
    """Fisher-z 95% interval of a Pearson r over n points (None when n < 4 or |r| = 1)."""
    if n < 4 or abs(r) >= 1:
        return None
    centre, half = math.atanh(r), z / math.sqrt(n - 3)
    return math.tanh(centre - half), math.tanh(centre + half)


def _ci(interval: tuple[float, float] | None, fmt: str = ".2f") -> str:
    return f", 95% CI [{interval[0]:{fmt}}, {interval[1]:{fmt}}]" if interval else ""


METRIC_WORDS = {"logit_diff": "logit difference", "logprob": "answer log-probability", "accuracy": "accuracy",
                "cosine": "cosine similarity"}


def _words(metric: Any) -> str:
    return METRIC_WORDS.get(str(metric), str(metric).replace("_", " "))


def _at_chance(s: Mapping[str, Any], metric: Any, value: float | None) -> bool:
    """The old heuristic, for summaries without a "chance" entry: a logit difference near 0."""
    return ("chance" not in s and metric == "logit_diff" and value is not None
            and abs(value) < CHANCE_LOGIT_DIFF)


def _chance(s: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The summary's chance entry when it says the model is at chance, else None."""
    entry = s.get("chance")
    return entry if isinstance(entry, Mapping) and entry.get("at_chance") is True else None


def _below(entry: Mapping[str, Any]) -> bool:
    """Whether the whole interval lies under chance (older entries: from their CI)."""
    if isinstance(entry.get("below_chance"), bool):
        return entry["below_chance"]
    ci, level = entry.get("ci"), _num(entry.get("chance_value"))
    return (isinstance(ci, (list, tuple)) and len(ci) == 2 and _num(ci[1]) is not None and level is not None
            and ci[1] < level)


def chance_basis(entry: Mapping[str, Any]) -> str:
    """What the chance value is computed from, in words ("" when the entry does not say): one metric's
    chance differs across tasks (answer length, vocabulary, number of answers)."""
    metric, vocab = entry.get("metric"), _num(entry.get("vocab_size"))
    tokens, classes = _num(entry.get("answer_tokens")), _num(entry.get("n_classes"))
    if metric == "logit_diff":
        return "no preference between the answer and the wrong answer"
    if metric == "logprob" and vocab:
        if tokens is None or abs(tokens - 1) < 1e-9:
            return f"log(1/{vocab:.0f}): one answer token, uniform over a {vocab:.0f}-token vocabulary"
        return f"{tokens:.3g} x log(1/{vocab:.0f}): answers of {tokens:.3g} tokens on average, uniform over a " \
               f"{vocab:.0f}-token vocabulary"
    if metric == "accuracy" and classes:
        return f"1/{classes:.0f}: guessing among {classes:.0f} answers"
    if metric == "accuracy" and vocab:
        return f"1/{vocab:.0f}: guessing over a {vocab:.0f}-token vocabulary"
    if metric == "probe accuracy":
        return "the majority class's share"
    return ""


def chance_sentence(entry: Mapping[str, Any], name: str = "") -> str:
    """'The model is at chance on task <t> (<metric> <mean> against chance <c> = <basis>, 95% CI [..]);
    relative findings are not reported.' Below chance (the whole CI under it) says so and what it
    means; probes: the probe, against its majority baseline."""
    details = []
    mean, level = _num(entry.get("mean")), _num(entry.get("chance_value"))
    basis = chance_basis(entry)
    if mean is not None:
        details.append(f"{_words(entry.get('metric', 'metric'))} {mean:.3g}"
                       + (f" against chance {level:.3g}" if level is not None else "")
                       + (f" ({basis})" if basis and level is not None else ""))
    ci = entry.get("ci")
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(_num(x) is not None for x in ci):
        details.append(f"{_pct(_num(entry.get('ci_level')) or 0.95)} CI [{ci[0]:.3g}, {ci[1]:.3g}]")
    below = _below(entry)
    where = "at" if not below else "below"
    task = entry.get("task")
    on = f"on task {task}" if isinstance(task, str) and task else "on this task"
    who = f"The probe scores {where} chance" if name == "probes" else f"The model is {where} chance {on}"
    said = " (" + ", ".join(details) + ")" if details else ""
    if not below:
        return f"{who}{said}; relative findings are not reported."
    metric = entry.get("metric")
    if name == "probes":
        return (f"{who}{said}: the probe does worse than predicting the majority class (overfitting or class "
                "imbalance); relative findings are not reported.")
    why = ("it systematically prefers the wrong answers" if metric == "logit_diff" else
           "it gives the answers less probability than a uniform guess, so they are systematically dispreferred"
           if metric == "logprob" else "it scores under guessing, so its answers are systematically dispreferred")
    return f"{who}{said}: worse than guessing, {why}; relative findings are not reported."


METHOD_WORDS = {"gradient": "gradient", "zero": "zero-ablation", "mean": "mean-ablation", "resample": "resample-ablation"}


def heads_finding(s: Mapping[str, Any]) -> str:
    """Baseline, prunable heads per ordering, and the head roles found."""
    parts = []
    n_heads = s.get("n_heads")
    base, kind = _num(s.get("baseline_metric")), s.get("metric", "metric")
    metric = _words(kind)
    if base is not None:
        parts.append(f"Unpruned {metric} is {base:.3g} over {s.get('n_examples', '?')} examples.")
    if _at_chance(s, kind, base):
        parts.append(f"The model is at chance on this task (logit difference {base:.3g}, near 0): head importance "
                     "and pruning curves measure noise here, not a mechanism.")
    relative = _chance(s) is None  # "within 1%" of a clean metric at chance says nothing
    degenerate = {k.removeprefix("degenerate_"): v for k, v in s.items() if k.startswith("degenerate_")}
    for method, why in degenerate.items():
        parts.append(f"{METHOD_WORDS.get(method, method).capitalize()} importance is rounding, not a measurement: {why}.")
    noisy = {"gradient"} & set(degenerate) | ({"ablation"} if set(degenerate) & {"zero", "mean", "resample"} else set())
    prunable = {k.removeprefix("max_fraction_prunable_"): _num(v) for k, v in s.items()
                if relative and k.startswith("max_fraction_prunable_") and _num(v) is not None
                and k.removeprefix("max_fraction_prunable_").removesuffix("_recompute") not in noisy}
    if prunable and n_heads:
        best = max(prunable, key=lambda k: prunable[k])
        heads = _num(s.get(f"heads_prunable_{best}")) or prunable[best] * n_heads
        over = f" (over {s['n_examples']} examples)" if s.get("n_examples") is not None else ""
        parts.append(f"{heads:.0f} of {n_heads} heads ({_pct(prunable[best])}) can be removed within 1% of the "
                     f"unpruned {metric}{over} when ordered by {best.replace('_', ' ')}.")
        others = [f"{k.replace('_', ' ')} {_pct(v)}" for k, v in prunable.items() if k != best]
        if others:
            parts.append("Other orderings: " + ", ".join(others) + ".")
    for method in (k.removeprefix("tied_top_heads_") for k in s if k.startswith("tied_top_heads_")):
        tied = [str(h) for h in s[f"tied_top_heads_{method}"]]
        if tied:
            parts.append(f"By {METHOD_WORDS.get(method, method)}, {', '.join(tied)} tie within rounding among the top "
                         "heads: their order is arbitrary.")
    roles = s.get("roles")
    if isinstance(roles, Mapping):
        found = [f"{len(v)} {k.replace('_', '-')} ({', '.join(map(str, v[:3]))}{', ...' if len(v) > 3 else ''})"
                 for k, v in roles.items() if v]
        parts.append("Head roles: " + "; ".join(found) + "." if found else "No head passes a role threshold.")
    l0 = s.get("l0_min_heads_within_tolerance")
    if isinstance(l0, int) and relative:
        parts.append(f"L0 gates keep the metric within tolerance with {l0} heads.")
    return " ".join(parts)


def attribution_finding(s: Mapping[str, Any]) -> str:
    """Kendall tau of attention against gradients and leave-one-out (t intervals), rollout's when raw
    attention disagrees, the fraction of significant taus (Wilson interval); permutation and adversarial tests."""
    parts = []
    n = int(_num(s.get("n_examples")) or 0)
    keys = (("gradient", "gradient x input"), ("loo", "leave-one-out"), ("ig", "integrated gradients"))
    taus = {name: (_num(s.get(f"mean_tau_attention_{key}")), _num(s.get(f"std_tau_attention_{key}"))) for key, name in keys}
    taus = {k: v for k, v in taus.items() if v[0] is not None}
    rollout = {name: _num(s.get(f"mean_tau_rollout_{key}")) for key, name in keys}
    rollout = {k: v for k, v in rollout.items() if v is not None}
    if taus:
        def ci(m: float, sd: float | None) -> str:  # a tau lies in [-1, 1], so its interval too
            interval = t_interval(m, sd, n)
            return _ci(interval and (max(-1.0, interval[0]), min(1.0, interval[1])))

        parts.append(f"Over {n or '?'} examples, last-layer attention agrees with "
                     + ", ".join(f"{k} at mean Kendall tau {m:.2f}{ci(m, sd)}" for k, (m, sd) in taus.items()) + ".")
        if max(abs(m) for m, _ in taus.values()) < 0.2:
            said = _rollout_sentence(s, taus, rollout, n, keys)
            parts += [said] if said else []
    frac = _num(s.get("fraction_significant"))
    tests = int(_num(s.get("n_tau_tests")) or n * len(taus))
    if frac is not None and tests > 0:
        k = round(frac * tests)
        lo, hi = wilson(k, tests)
        parts.append(f"{k} of {tests} per-example taus ({_pct(frac)}) are significant at p < 0.05, uncorrected "
                     f"(Wilson 95% CI {_pct(lo)}-{_pct(hi)}; 5% would be by chance)"
                     + (f"; {n} examples are too few to say how often attention agrees." if 0 < n < FEW else "."))
    elif frac is not None:
        parts.append(f"{_pct(frac)} of the per-example taus are significant (p < 0.05, uncorrected).")
    tvd = _num(s.get("median_permutation_tvd"))
    if tvd is not None:
        layer = s.get("permutation_layer", "?")
        if tvd < 0.01:
            change = s.get("output_change", "change")
            parts.append(f"Permuting layer {layer}'s attention barely moves the output (median {change} "
                         f"{tvd:.3g}): that layer's attention does little for the prediction, so the permutation test "
                         "says nothing about faithfulness.")
        else:
            parts.append(f"Permuting layer {layer}'s attention changes the output by a median {s.get('output_change', '')} "
                         f"of {tvd:.3g}.")
    jsd, near = _num(s.get("median_adversarial_jsd")), _num(s.get("fraction_adversarial_near_ln2"))
    if jsd is not None:
        parts.append(f"Adversarial attention within an output change of {s.get('adversarial_epsilon', '?')} reaches a median "
                     f"JSD of {jsd:.3g} nats (maximum ln 2 = 0.693)"
                     + (f"; {_pct(near)} of examples come within 90% of it." if near is not None else "."))
    return " ".join(parts)


def _rollout_sentence(s: Mapping[str, Any], taus: Mapping[str, tuple], rollout: Mapping[str, float], n: int,
                      keys: tuple) -> str:
    """What rollout adds where raw last-layer attention agrees weakly: "does better" only against a reference
    where rollout's tau reaches 0.2 and exceeds raw attention's against that same reference (when both have
    intervals, rollout's lower bound above raw's upper bound); no such relative claim at chance."""
    spread = (f"tau from {min(rollout.values()):.2f} to {max(rollout.values()):.2f}" if len(rollout) > 1
              else f"tau {next(iter(rollout.values())):.2f}") if rollout else ""
    if _chance(s) is not None:  # relative findings are not reported: the values only
        return f"Attention rollout agrees at {spread} against the same methods." if rollout else ""
    short = {name: key for key, name in keys}
    better, not_better = [], []
    for name, (raw, raw_sd) in taus.items():
        roll = rollout.get(name)
        if roll is None:
            continue
        ri, ai = t_interval(roll, _num(s.get(f"std_tau_rollout_{short[name]}")), n), t_interval(raw, raw_sd, n)
        credible = roll > raw if ri is None or ai is None else ri[0] > ai[1]
        (better if credible and roll >= 0.2 else not_better).append(f"{name} (tau {roll:.2f} against raw {raw:.2f})")
    if better:
        return ("Raw last-layer attention agrees weakly; attention rollout does better against " + ", ".join(better)
                + (f", but not against {', '.join(not_better)}." if not_better else
                   ": attention flow through the layers tracks token importance where the last layer's raw weights "
                   "do not."))
    return ("Agreement is weak" + (f" for rollout too ({spread})" if rollout else "")
            + ": attention weights are a poor stand-in for token importance here.")


def position_finding(s: Mapping[str, Any]) -> str:
    """The position curve (U-shape or flat), the sink mass and retrieval heads."""
    parts = []
    metric = s.get("primary_metric", "accuracy")
    per_pos = s.get("metric_per_position", {}).get(metric, {})
    values = {k: _num(v) for k, v in per_pos.items() if _num(v) is not None}
    if values:
        lo, hi = min(values.values()), max(values.values())
        worst = min(values, key=lambda k: values[k])
        if hi - lo < FLAT:
            ceiling = " at its ceiling" if metric in ("accuracy", "probability", "cosine") and lo >= 0.98 else ""
            parts.append(f"The {metric} curve is flat{ceiling} ({lo:.2f}-{hi:.2f} over {len(values)} gold positions): "
                         "position in the context makes no measurable difference on this task, so this sweep "
                         "cannot show lost-in-the-middle.")
        else:
            parts.append(f"{metric.capitalize()} ranges from {lo:.2f} (gold at position {worst}) to {hi:.2f} "
                         f"over {len(values)} gold positions ({s.get('n_examples', '?')} examples).")
    ratio = _num(s.get("ratio_middle_to_ends", {}).get(metric))
    if ratio is not None and values and max(values.values()) - min(values.values()) >= FLAT:
        parts.append(f"The worst middle position reaches {ratio:.2f} of the best end. "
                     + _shape(values, (s.get("ci_per_position") or {}).get(metric) or {}, s.get("n_examples")))
    sinks = [v for v in (_num(x) for x in s.get("sink_mass_per_layer", [])) if v is not None]
    base = _num(s.get("sink_uniform_baseline"))
    if sinks and base is not None:
        top = max(range(len(sinks)), key=lambda i: sinks[i])
        parts.append(f"Attention on the first {s.get('n_sink', '?')} token(s) peaks at {sinks[top]:.2f} in layer {top} "
                     f"against {base:.2f} under uniform attention"
                     + (" (an attention sink)." if sinks[top] > 2 * base else ": no attention sink."))
    heads = s.get("retrieval_heads") or []
    if heads:
        names = ", ".join(f"L{l}H{h}" for l, h in heads[:4]) + (", ..." if len(heads) > 4 else "")
        parts.append(f"{len(heads)} retrieval head(s) track the {s.get('retrieval_tracked_metric', 'metric')}: {names}.")
    return " ".join(parts)


def _shape(values: Mapping[str, float], ci: Mapping[str, Any], n: Any) -> str:
    """What the bootstrap intervals allow about the middle against the ends: a U-shape only when the
    worst middle position's interval lies below both ends' intervals."""
    order = sorted(values, key=lambda k: float(k))
    middle = [k for k in order[1:-1]]
    if not middle:
        return ""
    worst = min(middle, key=lambda k: values[k])
    bounds = {k: ci.get(k) for k in (order[0], worst, order[-1])}
    if not all(isinstance(b, (list, tuple)) and len(b) == 2 and all(_num(x) is not None for x in b) for b in bounds.values()):
        return "No intervals to test the shape: no U-shape is claimed."
    size = f"n = {n} examples per position" if n is not None else "n unknown"
    below = [end for end, name in ((order[0], "first"), (order[-1], "last")) if bounds[worst][1] < bounds[end][0]]
    if len(below) == 2:
        return (f"Its 95% interval [{bounds[worst][0]:.2f}, {bounds[worst][1]:.2f}] lies below both ends' ({size}): "
                "a U-shape, the middle is neglected.")
    if below:
        which = "first" if below[0] == order[0] else "last"
        return (f"Its 95% interval lies below the {which} end's only ({size}): a decline toward the other end, "
                "not a U-shape.")
    return (f"Its 95% interval overlaps both ends' ({size}): no evidence that the middle is neglected at this "
            "sample size.")


def _site(cell: Mapping[str, Any], kind: str) -> str:
    where = [f"layer {cell.get('layer')}"]
    if cell.get("head") is not None:
        where.append(f"head {cell['head']}")
    if cell.get("pos") is not None:
        token = cell.get("token") or ""  # "": the prompts have different tokens there (patching's token column)
        where.append(f"position {cell['pos']} " + (f"('{token}')" if token else "(its token differs across prompts)"))
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


SPARSE = 10  # fewer non-zero exact effects than this (or under half the cells): r is stated on them, without an interval


def _correlation(kind: str, stats: Mapping[str, Any]) -> str:
    """'<kind> r (n points, CI)', or that r rests on too few non-zero points to mean anything, or on
    few (under SPARSE or half the cells: stated on them with Spearman and the slope the summary holds, no
    interval that counts the zero cells as independent), or that one point carries it: r is significant,
    and without its largest cell it is not, flips sign, or falls to under half of |r| (the rest still
    significant: "mostly carried" by that cell)."""
    r, n, nonzero = _num(stats.get("pearson")), int(_num(stats.get("n")) or 0), _num(stats.get("n_nonzero"))
    if nonzero is not None and nonzero < 3:
        return (f"{kind} r = {r:.3f} rests on {nonzero:.0f} non-zero exact effect(s) of {n} cells, "
                "so it says nothing about agreement")
    if nonzero is not None and (nonzero < SPARSE or nonzero < n / 2):  # zeros are not independent evidence
        rho, slope, rest = _num(stats.get("spearman")), _num(stats.get("slope")), _num(stats.get("pearson_without_top"))
        extra = [f"Spearman {rho:.2f}" if rho is not None else "",
                 f"slope {slope:.2f}, attribution over exact" if slope is not None else "",
                 f"without its largest cell r = {rest:.3f}" if rest is not None and r is not None
                 and (rest * r < 0 or abs(rest) < abs(r) / 2) else "",
                 f"no interval: the other {n - nonzero:.0f} cells have no exact effect"]
        return f"{kind} r = {r:.3f} rests on its {nonzero:.0f} non-zero cells of {n} ({'; '.join(e for e in extra if e)})"
    rest = _num(stats.get("pearson_without_top"))
    said = f"{kind} r = {r:.3f} (n = {n} cells{_ci(fisher_interval(r, n), '.3f')})"
    if rest is None or not _significant(r, n):
        return said
    without = f"without it r = {rest:.3f} (n = {n - 1} cells{_ci(fisher_interval(rest, n - 1), '.3f')})"
    if not _significant(rest, n - 1) or rest * r < 0:
        return f"{kind} r = {r:.3f} is driven by its largest cell: {without}, so the agreement rests on one point"
    if abs(rest) < abs(r) / 2:
        return f"{kind} r = {r:.3f} is mostly carried by its largest cell: {without}, a much weaker agreement"
    return said


def patching_finding(s: Mapping[str, Any]) -> str:
    """The strongest patching sites, attribution patching's agreement and causal tracing's peaks."""
    if "skipped" in s:
        return f"Skipped: {s['skipped']}"
    parts = []
    clean, corrupt = _num(s.get("clean_metric")), _num(s.get("corrupted_metric"))
    gap = None if s.get("normalized") or clean is None or corrupt is None or clean == corrupt else clean - corrupt
    metric = _words(s.get("metric", ""))
    if gap is not None:
        parts.append(f"Clean prompts give a {metric} of {clean:.3g}, corrupted ones {corrupt:.3g}.")
        if _at_chance(s, s.get("metric"), clean):
            parts.append("The model is at chance on the clean prompts (logit difference near 0): there is no behaviour to "
                         "restore, so the patching maps show noise.")
    top = s.get("top_sites") or {}
    cells = [(kind, c) for kind, rows in top.items() for c in rows if _num(c.get("effect")) is not None]
    if _chance(s) is not None:  # shares of a gap between two chance-level metrics are noise
        cells = []
    small = s.get("gap_within_noise")
    if isinstance(small, Mapping) and cells:  # a share of a gap that is noise is not a measurement
        cells = []
        parts.append(f"The clean-corrupted gap is within noise ({small.get('reason', 'no reason recorded')}): effects "
                     "normalised by it (shares of the gap) are not meaningful, so no site is ranked.")
    if cells:
        cells.sort(key=lambda kc: -abs(kc[1]["effect"]))
        cells = _distinct_sites(cells)
        kind, best = cells[0]

        def share(effect: float) -> str:  # the effect as a share of the clean-corrupted gap (1 = fully restored)
            return f"{effect / gap:.2f} of the clean-corrupted gap ({effect:+.3g} {metric})" if gap else f"{effect:.2f}"

        parts.append(f"Patching ({s.get('direction', 'denoise')}, {s.get('n_examples', '?')} examples) moves the metric most "
                     f"at the {_site(best, kind)}: {share(best['effect'])}.")
        if gap and abs(best["effect"] / gap) < 0.05:
            parts.append("No single site moves more than 5% of the gap: the effect is spread out or the task is not solved.")
        runners = [f"{_site(c, k)} ({c['effect'] / gap if gap else c['effect']:.2f})" for k, c in cells[1:3]]
        if runners:
            parts.append("Next, at other sites: " + "; ".join(runners) + ".")
    corr = s.get("attribution_correlation")
    if isinstance(corr, Mapping):
        said = [_correlation(k, v) for k, v in corr.items() if isinstance(v, Mapping) and _num(v.get("pearson")) is not None]
        if said:
            parts.append("Attribution patching vs exact (Pearson r): " + "; ".join(said)
                         + ". A high r can hide a scale error: see the per-site slopes in the figure.")
    trace = s.get("causal_tracing")
    if isinstance(trace, Mapping):
        clean, corrupt = _num(trace.get("clean_metric")), _num(trace.get("corrupted_metric"))
        if clean is not None and corrupt is not None:
            n = trace.get("n_examples")
            parts.append(f"Causal tracing: noising the {trace.get('span', 'subject')} drops the metric from {clean:.3g} "
                         f"to {corrupt:.3g}" + (f" (mean over {n} prompts)." if n is not None else "."))
    return " ".join(parts)


def mlp_finding(s: Mapping[str, Any]) -> str:
    """Key-value agreement per layer against its shuffled control; with the neuron count, both as
    k of n neurons with Wilson intervals, and "no better than the control" when the best layer's
    interval reaches down to the control's best."""
    agree = {k: _num(v) for k, v in (s.get("agreement_per_layer") or {}).items() if _num(v) is not None}
    shuffled = [v for v in (_num(x) for x in (s.get("agreement_shuffled_per_layer") or {}).values()) if v is not None]
    n = int(_num(s.get("n_neurons_per_layer")) or 0)
    parts = []
    if agree:
        best = max(agree, key=lambda k: agree[k])
        interval = wilson(round(agree[best] * n), n) if n else None
        size = (f" ({round(agree[best] * n)} of {n} neurons, Wilson 95% CI {_pct(interval[0])}-{_pct(interval[1])})"
                if interval else "")
        parts.append(f"Agreement between a neuron's promoted token and what follows its triggers peaks at "
                     f"{_pct(agree[best])}{size} in layer {best} (over {s.get('n_prefixes', '?')} prefixes)")
        control = max(shuffled) if shuffled else None
        parts[-1] += f"; the shuffled control reaches {_pct(control)}." if control is not None else "."
        if control is not None and (interval[0] <= control if interval else agree[best] <= control + 0.02):
            parts.append("That is no better than the control: these MLPs show no key-value memory on this corpus.")
    frac = _num(s.get("answer_promoted_fraction"))
    if frac is not None:
        count = _num(s.get("n_task_updates"))  # how many updates the fraction is over (newer summaries)
        examples = _num((s.get("chance") or {}).get("n_examples")) if isinstance(s.get("chance"), Mapping) else None
        if count:
            k = round(frac * count)
            lo, hi = wilson(k, int(count))
            parts.append(f"{k} of {count:.0f} top task updates ({_pct(frac)}, Wilson 95% CI {_pct(lo)}-{_pct(hi)}) "
                         "promote the answer token.")
        else:
            parts.append(f"{_pct(frac)} of the top task updates" + (f" (on {examples:.0f} task examples)" if examples else "")
                         + " promote the answer token.")
    return " ".join(parts)


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def kv_finding(s: Mapping[str, Any]) -> str:
    """Cache size, GQA saving and the smallest budget per policy within 1% of the full cache."""
    parts = []
    per_token, full_ctx = _num(s.get("bytes_per_token")), _num(s.get("bytes_at_n_ctx"))
    if per_token is not None:
        parts.append(f"The KV cache takes {_bytes(per_token)} per token ({s.get('dtype', '')})"
                     + (f", {_bytes(full_ctx)} at full context." if full_ctx is not None else "."))
    saving = _num(s.get("gqa_saving"))
    if saving is not None and saving > 1:
        parts.append(f"Grouped-query attention stores {saving:.3g}x less than full multi-head attention would.")
    full = _num(s.get("metric_unevicted"))
    budgets = s.get("metric_per_policy_budget") or {}
    if full is not None and _chance(s) is not None:
        parts.append(f"Full-cache metric {full:.3g}.")
    elif full is not None and budgets:
        context = _num(s.get("context_positions")) or max((int(b) for v in budgets.values() for b in v), default=None)
        ok, saving = [], False
        for policy, by_budget in budgets.items():
            kept = sorted(int(b) for b, v in by_budget.items() if _num(v) is not None and v >= full - 0.01 * abs(full))
            name = policy.replace("_", " ")
            if not kept:
                ok.append(f"{name} never")
            elif context is not None and kept[0] >= context:
                ok.append(f"{name} only with the whole context")
            else:
                saving = True
                ok.append(f"{name} from {kept[0]} positions" + (f" of {context:.0f}" if context else ""))
        n = s.get("n_examples")
        parts.append(f"Full-cache {_words(s.get('metric', 'metric'))} {full:.3g}"
                     + (f" (mean over {n} examples)" if n is not None else "") + "; within 1% of it: " + ", ".join(ok) + ".")
        if not saving:
            parts.append("No eviction policy saves anything here: every policy needs the whole context"
                         + (f" ({context:.0f} positions)" if context else "") + " to stay within 1% (or never gets there).")
    return " ".join(parts)


def probes_finding(s: Mapping[str, Any]) -> str:
    """Best layer, its score against the majority baseline and its selectivity."""
    metric = s.get("metric", "accuracy")
    best = _num(s.get(f"best_{metric}"))
    if best is None:
        return ""
    sd, folds, n = _num(s.get("best_std")), s.get("cv"), s.get("n_examples")
    spread = f" (sd {sd:.2f} over {folds} folds)" if sd is not None and folds else ""
    parts = [f"The {s.get('labels', '')} probe is best at layer {s.get('best_layer', '?')} with {metric} {best:.2f}{spread}"]
    majority = _num(s.get("majority_baseline"))
    parts[-1] += f" against a majority baseline of {majority:.2f}" if majority is not None else ""
    parts[-1] += f" ({n} examples)." if n is not None else "."
    if majority is not None and best <= majority + 0.02 and "chance" not in s:
        parts.append("That is chance level: the property is not linearly readable from these activations.")
    sel, control = _num(s.get("best_selectivity")), _num(s.get("best_control"))
    if sel is not None and metric == "r2" and control is not None and control < 0 and best is not None:
        floor = best - max(control, 0.0)
        parts.append(f"The control task's R^2 is {control:.2f}, below 0 (worse than predicting the mean), so score minus "
                     f"control ({sel:.2f}) overstates selectivity; against the control's floor of 0 it is {floor:.2f}.")
    elif s.get("control_degenerate"):
        parts.append(f"Selectivity cannot be measured on this task: {s['control_degenerate']}.")
    elif sel is not None:
        parts.append(f"Selectivity (score minus the control task) is {sel:.2f}"
                     + ("; low selectivity means the probe memorises rather than reads." if sel < 0.1 else "."))
    capacity = s.get("capacity")
    if isinstance(capacity, Mapping) and capacity.get("grid") and not s.get("control_degenerate"):
        first = s.get("first_selective_layer")
        grid = ", ".join(f"{v:g}" for v in capacity["grid"])
        where = (f"the first layer whose most selective probe reaches selectivity 0.5 is layer {first}" if first is not None
                 else "no layer's most selective probe reaches selectivity 0.5")
        parts.append(f"Each layer reports its most selective probe over {capacity.get('param', 'C')} in {{{grid}}} "
                     f"(Hewitt & Liang's capacity sweep): {where}.")
    return " ".join(parts)


def circuits_finding(s: Mapping[str, Any]) -> str:
    """Logit lens (first layer with the answer top-1) and direct logit attribution's top writers."""
    if "skipped" in s:
        return f"Skipped: {s['skipped']}"
    parts = []
    first = s.get("lens_first_top1_layer", s.get("first_top1_layer"))
    per_layer = s.get("lens_top1_fraction_per_layer") or {}
    if isinstance(first, int):
        n_layers = len(per_layer) - 1 if per_layer else None
        frac = _num(per_layer.get(str(first)))
        share = f" (top-1 in {_pct(frac)} of {s.get('n_examples', '?')} examples)" if frac is not None else ""
        if n_layers is not None and first >= n_layers:
            parts.append(f"The logit lens ranks the answer top-1 (median over examples) only at the model's output, "
                         f"after all {n_layers} blocks{share}.")
        elif first == 0:
            parts.append(f"The logit lens ranks the answer top-1 (median over examples) already at the embeddings, "
                         f"before block 0{share}.")
        else:
            of = f" of {n_layers}" if n_layers is not None else ""
            parts.append(f"The logit lens first ranks the answer top-1 (median over examples) at the input of block "
                         f"{first} (row {first}_pre), after {first}{of} blocks{share}.")
    top = {k: _num(v) for k, v in (s.get("dla_top_components") or {}).items() if _num(v) is not None}
    final = _num(s.get("dla_final_logit"))
    entry = _chance(s)
    if entry is not None or _at_chance(s, "logit_diff", final):  # at chance: no writer, no circuit to rank
        why = ("below chance the model's behaviour is a preference for the wrong answers, not the task's"
               if entry is not None and _below(entry) else "at chance there is no behaviour to attribute")
        parts.append("Direct logit attribution"
                     + (f" (final logit difference {final:.3g}" + (", near 0" if "chance" not in s else "") + ")"
                        if final is not None else "")
                     + f" ranks no writer and the circuit's faithfulness is not reported: {why}.")
        return " ".join(parts)
    if top:
        items = sorted(top.items(), key=lambda kv: -abs(kv[1]))[:3]
        n = s.get("n_examples")
        parts.append("Direct logit attribution" + (f" (mean over {n} examples)" if n is not None else "")
                     + ": the largest writers are " + ", ".join(f"{k} ({v:+.2f})" for k, v in items)
                     + (f" of a final logit difference {final:.3g}." if final is not None else "."))
    cpr, cmd = _num(s.get("mib_cpr")), _num(s.get("mib_cmd"))
    if cpr is not None and cmd is not None:
        parts.append(f"MIB's circuit metrics ({s.get('edge_method', 'edge')} scores): CPR {cpr:.3f} (higher is better), "
                     f"CMD {cmd:.3f} (lower is better).")
    return " ".join(parts)


def finding(name: str, summary: Mapping[str, Any]) -> str:
    """The headline of one analysis ("" when there is none); never raises on an odd summary."""
    if "skipped" in summary and name not in ("patching", "circuits"):
        return f"Skipped: {summary['skipped']}"
    try:
        from headscope.reports.families import presentation  # each family's finding (reports/families.py)

        shown = presentation(name)
        text = shown.finding(summary) if shown is not None else ""
        entry = _chance(summary)
        return text if entry is None else f"{chance_sentence(entry, name)} {text}".strip()
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError):
        return ""


CAPTIONS = {
    # heads
    "importance": "Head importance, layer x head, both methods in their own units: |dL/d gate| (gradient) and the drop in "
                  "the task metric when the head alone is zero-ablated (below 0, blue: removing the head helps); red is "
                  "positive, white 0. A panel marked rounding only has no head above the numerical floor.",
    "pruning_curve": "Metric (y, the task's metric) as heads are removed least-important first (x, fraction of all heads), "
                     "each ordering with its own marker and dash. Read where each falls below the dotted 1% floor; the "
                     "random band spans the seeds.",
    "best_head": "Per layer, metric change from the unpruned model (task metric units) keeping only one head: the most "
                 "important, the best single head found by trying all, or none. Near 0 means one head does the layer's job.",
    "l0": "Heads kept (x) against the metric (y) across the L0 penalty sweep; each point is labelled with its lambda "
          "(lambdas that land on one point share a label).",
    "roles": "Role scores per head (0-1): positional share, sink mass, previous-token, induction and confidence "
             "(the mean maximum attention weight).",
    # attribution
    "tau": "Kendall tau (-1 to 1) per example between attention and each other attribution; 0 is no agreement.",
    "token_heatmap": "One example: each method's share of importance per token (rows sum to 1).",
    "permutation": "Per example: median output change (total variation distance, 0-1) when the layer's attention is "
                   "permuted, against its maximum attention weight.",
    "adversarial": "Per example: the largest Jensen-Shannon divergence (nats, max ln 2) from the model's attention found "
                   "while the output stays within epsilon.",
    # position
    "position_curve": "Answer metric (y) by the gold item's slot in the context (x), bootstrap 95% band over examples. "
                      "The middle is neglected only where its band lies below both ends' bands; overlapping bands show "
                      "no difference at this sample size.",
    "position_gold_attention": "Attention mass (0-1) on the gold span, layer x gold position, max over heads.",
    "position_sinks": "Per layer, attention mass on the first tokens (0-1) against the uniform-attention baseline (dashed).",
    "position_streaming": "Answer log-probability (nats) by gold position with the full context and with streaming "
                          "windows (sinks + recent tokens); each condition has its own marker and dash, so equal curves "
                          "stay visible.",
    # patching
    "attribution_vs_exact": "Attribution-patching estimate (y) against the exact patching effect (x), both in normalised "
                            "logit difference; the dashed line is y = x and each site type's fitted slope is in the legend "
                            "(slope 0.5 = a 2x underestimate).",
    "path_patching": "Path-patching effect (normalised logit difference) of each sender head on the receivers, layer x "
                     "head; red positive, blue negative, centred on 0.",
    # kv
    "kv_eviction": "Task metric at the answer (y, in the task metric's units) against the number of cached positions kept "
                   "(x, log2), per eviction policy, with a 95% bootstrap band over examples; dashed: the full cache; "
                   "dotted: the whole context, a budget that saves nothing.",
    "kv_norms": "Mean L2 norm of the cached keys by position, one line per layer (mean over KV heads).",
    "kv_sinks": "Per layer, attention mass (0-1) on the first position against the uniform-attention mass.",
    # mlp / probes
    "mlp_agreement": "Per layer, the fraction of neurons (0-1) whose value vector's top token is the token after their "
                     "strongest trigger (top trigger), after any of their top-k triggers (any of top k), and the same with "
                     "triggers shuffled across neurons (control).",
    "mlp_top_neurons": "The neurons whose updates m_i v_i are largest at the task's answer position (L2 norm, residual "
                       "stream units), coloured by layer.",
    "probes": "Left: cross-validated probe score per layer on the real labels and on the control task (95% CI over "
              "folds; dashed: the majority class). Right: selectivity = real minus control. With the capacity sweep, each "
              "layer shows its most selective regularisation strength.",
    # circuits
    "circuits_lens": "Logit lens: the answer's rank or log-probability read from each block's input through the final "
                     "norm and unembedding, layer x position; row l_pre is the input of block l (after l blocks), "
                     "final_post the output.",
    "circuits_dla_heads": "Direct logit attribution per head (logits), layer x head: each head's write into the "
                          "answer-minus-wrong logit direction, with the final norm frozen; red toward the answer, blue away.",
    "circuits_dla_components": "Direct logit attribution per component (logits): embeddings, heads, MLPs and bias terms "
                               "add up to the final logit difference; kinds that are 0 within rounding for every example "
                               "(below 1e-5 of the largest writer, e.g. bias terms of a model without biases) are left "
                               "out and named in the title.",
    "circuits_faithfulness": "Faithfulness (y, the fraction of the clean-corrupted gap the circuit recovers; 1 = all) of the "
                             "top-k edge circuit against its size k (x, log scale); grey: the range of random circuits of "
                             "the same size, dotted: the 80% target.",
    "circuits_mib": "MIB's faithfulness curve (Mueller et al. 2025): f = (m(C) - m(empty)) / (m(full) - m(empty)) of the "
                    "top p% of the edges (x, log scale) for p = 0.1 ... 100; shaded: CPR, the area under f over linear p "
                    "(higher is better); CMD is the area between f and 1 (lower is better).",
    "circuits_graph": "The strongest edges of the circuit, sender to receiver: x = layer (input left, logits right), "
                      "y = head (MLPs at -1, key-value heads just left of and below their layer's query heads, labelled "
                      "on the left); width = |edge score| (estimated change of the task metric), red positive, blue negative.",
    "top_attention": "The top heads' attention patterns on one example: row = query token, column = key token, "
                     "colour = attention weight (0-1).",
}
_PREFIX_CAPTIONS = {
    "exact_": "Exact activation patching: normalised logit difference after patching each cell (1 = clean behaviour fully "
              "restored, 0 = corrupted); red positive, blue negative, one scale shared by every site's map (a site whose "
              "own maximum is much smaller prints it in its title). ",
    "causal_tracing_": "Causal tracing: average indirect effect (task metric units) of restoring each state after noising "
                       "the subject, by token role (several prompts: Meng et al.'s groups, averaged over every prompt) or "
                       "position (one prompt) x layer; red positive, blue negative, one scale for every restored kind. ",
    "logit_lens": "Logit lens: the answer read from each block's input through the final norm and unembedding. ",
    "dla": "Direct logit attribution: each component's contribution (logits) to the final logit difference. ",
}


def caption(stem: str) -> str:
    """What to read from the figure `stem` and its units ("" for an unknown figure)."""
    if stem in CAPTIONS:
        return CAPTIONS[stem]
    for prefix, text in _PREFIX_CAPTIONS.items():
        if stem.startswith(prefix):
            kind = stem[len(prefix):].replace("_", " ")
            return text + (f"Site: {kind}." if kind else "")
    return ""
