"""Findings in words: one paragraph per analysis, read from its summary dict, and one caption per figure.

Each `<analysis>_finding(summary) -> str` states the headline numbers of that analysis and says so
when the result carries no information (a model at chance, a flat curve at its ceiling, a layer
whose attention changes nothing). The text is plain (no markup): callers escape it.

A summary's "chance" entry (analyses/core/chance.py, added by the registry) decides whether the
model is at chance on the task: then `finding` opens with that and the findings stated relative to
the clean metric (heads prunable or L0-kept "within 1%", kv budgets "within 1%" of the full cache,
patching effects as shares of the clean-corrupted gap) are left out. Summaries without the entry
(older results) keep the logit-difference heuristic `_at_chance`.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
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


def chance_sentence(entry: Mapping[str, Any], name: str = "") -> str:
    """'The model is at chance on this task (<metric> <mean> against chance <c>, 95% CI [..]); relative
    findings are not reported.' (probes: the probe, against its majority baseline)."""
    details = []
    mean, level = _num(entry.get("mean")), _num(entry.get("chance_value"))
    if mean is not None:
        details.append(f"{_words(entry.get('metric', 'metric'))} {mean:.3g}"
                       + (f" against chance {level:.3g}" if level is not None else ""))
    ci = entry.get("ci")
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(_num(x) is not None for x in ci):
        details.append(f"{_pct(_num(entry.get('ci_level')) or 0.95)} CI [{ci[0]:.3g}, {ci[1]:.3g}]")
    who = "The probe scores at chance" if name == "probes" else "The model is at chance on this task"
    said = " (" + ", ".join(details) + ")" if details else ""
    return f"{who}{said}; relative findings are not reported."


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
    prunable = {k.removeprefix("max_fraction_prunable_"): _num(v) for k, v in s.items()
                if relative and k.startswith("max_fraction_prunable_") and _num(v) is not None}
    if prunable and n_heads:
        best = max(prunable, key=lambda k: prunable[k])
        heads = _num(s.get(f"heads_prunable_{best}")) or prunable[best] * n_heads
        parts.append(f"{heads:.0f} of {n_heads} heads ({_pct(prunable[best])}) can be removed within 1% of the "
                     f"unpruned {metric} when ordered by {best.replace('_', ' ')}.")
        others = [f"{k.replace('_', ' ')} {_pct(v)}" for k, v in prunable.items() if k != best]
        if others:
            parts.append("Other orderings: " + ", ".join(others) + ".")
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
    """Kendall tau of attention against gradients and leave-one-out; permutation and adversarial tests."""
    parts = []
    taus = {name: _num(s.get(f"mean_tau_attention_{key}")) for key, name in
            (("gradient", "gradient x input"), ("loo", "leave-one-out"), ("ig", "integrated gradients"))}
    taus = {k: v for k, v in taus.items() if v is not None}
    if taus:
        parts.append(f"Over {s.get('n_examples', '?')} examples, last-layer attention agrees with "
                     + ", ".join(f"{k} at mean Kendall tau {v:.2f}" for k, v in taus.items()) + ".")
        if max(abs(v) for v in taus.values()) < 0.2:
            parts.append("Agreement is weak: attention weights are a poor stand-in for token importance here.")
    frac = _num(s.get("fraction_significant"))
    if frac is not None:
        parts.append(f"{_pct(frac)} of the per-example taus are significant.")
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
                         f"over {len(values)} gold positions.")
    ratio = _num(s.get("ratio_middle_to_ends", {}).get(metric))
    if ratio is not None and values and max(values.values()) - min(values.values()) >= FLAT:
        parts.append(f"The worst middle position reaches {ratio:.2f} of the best end"
                     + (" (a U-shape: the middle is neglected)." if ratio < 0.9 else "."))
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


def _site(cell: Mapping[str, Any], kind: str) -> str:
    where = [f"layer {cell.get('layer')}"]
    if cell.get("head") is not None:
        where.append(f"head {cell['head']}")
    if cell.get("pos") is not None:
        where.append(f"position {cell['pos']} ('{cell.get('token', '')}')")
    return f"{kind} at {', '.join(where)}"


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
    cells = [(kind, c) for kind, rows in top.items() for c in rows[:1] if _num(c.get("effect")) is not None]
    if _chance(s) is not None:  # shares of a gap between two chance-level metrics are noise
        cells = []
    if cells:
        cells.sort(key=lambda kc: -abs(kc[1]["effect"]))
        kind, best = cells[0]

        def share(effect: float) -> str:  # the effect as a share of the clean-corrupted gap (1 = fully restored)
            return f"{effect / gap:.2f} of the clean-corrupted gap ({effect:+.3g} {metric})" if gap else f"{effect:.2f}"

        parts.append(f"Patching ({s.get('direction', 'denoise')}, {s.get('n_examples', '?')} examples) moves the metric most "
                     f"at the {_site(best, kind)}: {share(best['effect'])}.")
        if gap and abs(best["effect"] / gap) < 0.05:
            parts.append("No single site moves more than 5% of the gap: the effect is spread out or the task is not solved.")
        runners = [f"{_site(c, k)} ({c['effect'] / gap if gap else c['effect']:.2f})" for k, c in cells[1:3]]
        if runners:
            parts.append("Next: " + "; ".join(runners) + ".")
    corr = s.get("attribution_correlation")
    if isinstance(corr, Mapping):
        rs = [(k, _num(v.get("pearson"))) for k, v in corr.items() if isinstance(v, Mapping)]
        rs = [(k, r) for k, r in rs if r is not None]
        if rs:
            parts.append("Attribution patching vs exact (Pearson r): " + ", ".join(f"{k} {r:.3f}" for k, r in rs)
                         + "; a high r can hide a scale error, see the per-site slopes in the figure.")
    trace = s.get("causal_tracing")
    if isinstance(trace, Mapping):
        clean, corrupt = _num(trace.get("clean_metric")), _num(trace.get("corrupted_metric"))
        if clean is not None and corrupt is not None:
            parts.append(f"Causal tracing: noising the {trace.get('span', 'subject')} drops the metric from {clean:.3g} "
                         f"to {corrupt:.3g}.")
    return " ".join(parts)


def mlp_finding(s: Mapping[str, Any]) -> str:
    """Key-value agreement per layer against its shuffled control."""
    agree = {k: _num(v) for k, v in (s.get("agreement_per_layer") or {}).items() if _num(v) is not None}
    shuffled = [v for v in (_num(x) for x in (s.get("agreement_shuffled_per_layer") or {}).values()) if v is not None]
    parts = []
    if agree:
        best = max(agree, key=lambda k: agree[k])
        parts.append(f"Agreement between a neuron's promoted token and what follows its triggers peaks at "
                     f"{_pct(agree[best])} in layer {best} (over {s.get('n_prefixes', '?')} prefixes)")
        control = max(shuffled) if shuffled else None
        parts[-1] += f"; the shuffled control reaches {_pct(control)}." if control is not None else "."
        if control is not None and agree[best] <= control + 0.02:
            parts.append("That is no better than the control: these MLPs show no key-value memory on this corpus.")
    frac = _num(s.get("answer_promoted_fraction"))
    if frac is not None:
        parts.append(f"{_pct(frac)} of the top task updates promote the answer token.")
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
        ok = []
        for policy, by_budget in budgets.items():
            kept = sorted(int(b) for b, v in by_budget.items() if _num(v) is not None and v >= full - 0.01 * abs(full))
            ok.append(f"{policy.replace('_', ' ')} from {kept[0]} positions" if kept else f"{policy.replace('_', ' ')} never")
        parts.append(f"Full-cache metric {full:.3g}; within 1% of it: " + ", ".join(ok) + ".")
    return " ".join(parts)


def probes_finding(s: Mapping[str, Any]) -> str:
    """Best layer, its score against the majority baseline and its selectivity."""
    metric = s.get("metric", "accuracy")
    best = _num(s.get(f"best_{metric}"))
    if best is None:
        return ""
    parts = [f"The {s.get('labels', '')} probe is best at layer {s.get('best_layer', '?')} with {metric} {best:.2f}"]
    majority = _num(s.get("majority_baseline"))
    parts[-1] += f" against a majority baseline of {majority:.2f}." if majority is not None else "."
    if majority is not None and best <= majority + 0.02 and "chance" not in s:
        parts.append("That is chance level: the property is not linearly readable from these activations.")
    sel = _num(s.get("best_selectivity"))
    if sel is not None:
        parts.append(f"Selectivity (score minus the control task) is {sel:.2f}"
                     + ("; low selectivity means the probe memorises rather than reads." if sel < 0.1 else "."))
    capacity = s.get("capacity")
    if isinstance(capacity, Mapping) and capacity.get("grid"):
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
    if first is not None:
        parts.append(f"The logit lens first ranks the answer top-1 at layer {first}.")
    top = {k: _num(v) for k, v in (s.get("dla_top_components") or {}).items() if _num(v) is not None}
    final = _num(s.get("dla_final_logit"))
    if top:
        items = sorted(top.items(), key=lambda kv: -abs(kv[1]))[:3]
        parts.append("Direct logit attribution: the largest writers are " + ", ".join(f"{k} ({v:+.2f})" for k, v in items)
                     + (f" of a final logit difference {final:.3g}." if final is not None else "."))
    cpr, cmd = _num(s.get("mib_cpr")), _num(s.get("mib_cmd"))
    if cpr is not None and cmd is not None:
        parts.append(f"MIB's circuit metrics ({s.get('edge_method', 'edge')} scores): CPR {cpr:.3f} (higher is better), "
                     f"CMD {cmd:.3f} (lower is better).")
    if _at_chance(s, "logit_diff", final):
        parts.append(f"The model is at chance here (final logit difference {final:.3g}, near 0): nothing to attribute.")
    return " ".join(parts)


FINDINGS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "heads": heads_finding, "attribution": attribution_finding, "position": position_finding,
    "patching": patching_finding, "mlp": mlp_finding, "kv": kv_finding, "probes": probes_finding,
    "circuits": circuits_finding,
}


def finding(name: str, summary: Mapping[str, Any]) -> str:
    """The headline of one analysis ("" when there is none); never raises on an odd summary."""
    if "skipped" in summary and name not in ("patching", "circuits"):
        return f"Skipped: {summary['skipped']}"
    try:
        text = FINDINGS[name](summary) if name in FINDINGS else ""
        entry = _chance(summary)
        return text if entry is None else f"{chance_sentence(entry, name)} {text}".strip()
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError):
        return ""


CAPTIONS = {
    # heads
    "importance": "Head importance, layer x head, both methods: |dL/d gate| (gradient) and the metric drop when the head "
                  "alone is zero-ablated, each divided by its layer's L2 norm (unitless; below 0: removing the head "
                  "helps). Bright cells are heads to keep.",
    "pruning_curve": "Metric (y, the task's metric) as heads are removed least-important first (x, fraction of all heads). "
                     "Read where each ordering falls below the dotted 1% floor; the random band spans the seeds.",
    "best_head": "Per layer, metric change from the unpruned model (task metric units) keeping only one head: the most "
                 "important, the best single head found by trying all, or none. Near 0 means one head does the layer's job.",
    "l0": "Heads kept (x) against the metric (y) across the L0 penalty sweep; each point is labelled with its lambda.",
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
    "position_curve": "Answer metric (y) by the gold item's slot in the context (x), bootstrap 95% band. A U-shape means "
                      "the middle is neglected; a flat line means position does not matter here.",
    "position_gold_attention": "Attention mass (0-1) on the gold span, layer x gold position, max over heads.",
    "position_sinks": "Per layer, attention mass on the first tokens (0-1) against the uniform-attention baseline (dashed).",
    "position_streaming": "Answer log-probability (nats) by gold position with the full context and with streaming "
                          "windows (sinks + recent tokens).",
    # patching
    "attribution_vs_exact": "Attribution-patching estimate (y) against the exact patching effect (x), both in normalised "
                            "logit difference; the dashed line is y = x and each site type's fitted slope is in the legend "
                            "(slope 0.5 = a 2x underestimate).",
    "path_patching": "Path-patching effect (normalised logit difference) of each sender head on the receivers.",
    # kv
    "kv_eviction": "Task metric at the answer (y) against the number of cached positions kept (x, log2), per eviction "
                   "policy, with a 95% bootstrap band over examples; dashed: the full cache.",
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
                     "norm and unembedding, layer x position.",
    "circuits_dla_heads": "Direct logit attribution per head (logits): each head's write into the answer-minus-wrong "
                          "logit direction, with the final norm frozen.",
    "circuits_dla_components": "Direct logit attribution per component (logits): embeddings, heads, MLPs and bias terms "
                               "add up to the final logit difference.",
    "circuits_faithfulness": "Faithfulness (y, the fraction of the clean-corrupted gap the circuit recovers; 1 = all) of the "
                             "top-k edge circuit against its size k (x, log scale); grey: the range of random circuits of "
                             "the same size, dotted: the 80% target.",
    "circuits_mib": "MIB's faithfulness curve (Mueller et al. 2025): f = (m(C) - m(empty)) / (m(full) - m(empty)) of the "
                    "top p% of the edges (x, log scale) for p = 0.1 ... 100; shaded: CPR, the area under f over linear p "
                    "(higher is better); CMD is the area between f and 1 (lower is better).",
    "circuits_graph": "The strongest edges of the circuit, sender to receiver: x = layer (input left, logits right), "
                      "y = head (MLPs at -1); width = |edge score| (estimated change of the task metric), "
                      "red positive, blue negative.",
    "top_attention": "The top heads' attention patterns on one example: row = query token, column = key token, "
                     "colour = attention weight (0-1).",
}
_PREFIX_CAPTIONS = {
    "exact_": "Exact activation patching: normalised logit difference after patching each cell (1 = clean behaviour fully "
              "restored, 0 = corrupted). ",
    "causal_tracing_": "Causal tracing: average indirect effect (task metric units) of restoring each state after noising "
                       "the subject, position x layer. ",
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
