"""The `attribution` finding in words (reports/plots_attribution.py's `finding`, the family's headline):
Kendall tau of last-layer attention against saliency, gradient x input, leave-one-out and integrated gradients
with t intervals (leave-one-out left out where its scores are rounding, IG where it did not converge), the
sliding window the taus rank within, rollout's taus or what it adds where raw attention agrees weakly (paired,
Holm-corrected), the count of significant taus (Wilson interval), the permutation and adversarial tests (read
in the task metric's units where the output is saturated); at chance only what was measured.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from headscope.analyses.attribution.convergence import ROUNDING_STEPS, IgUse, doubling_trend, ig_rounding_floor, ig_use
from headscope.analyses.core import chance
from headscope.reports.findings import FEW, _chance, _ci, _num, _pct, _words, and_join, ci_pair, int_span, t_interval, wilson
from headscope.reports.heads_words import mask_read_words


def finding(s: Mapping[str, Any]) -> str:
    """Kendall tau of attention against gradients and leave-one-out (t intervals), rollout's when raw
    attention disagrees, the fraction of significant taus (Wilson interval); permutation and adversarial
    tests, read in the task metric's units when the output is saturated. At chance: what was measured only. A masked
    LM scored at its mask (the summary's mask_read, review 15c B1): led by where each answer was read."""
    said = _finding(s)
    if isinstance(note := s.get("baseline_note"), str) and note:  # review 19a C1: no special token would do
        said = f"{said} Integrated gradients run from baseline {note}.".strip()
    return f"{read} {said}" if (read := mask_read_words(s)) else said


def _finding(s: Mapping[str, Any]) -> str:
    n = int(_num(s.get("n_examples")) or 0)
    if _chance(s) is not None:
        return _measured_only(s, n)
    parts = []
    rule = ig_use(s)
    keys = (("saliency", "saliency"), ("gradient", "gradient x input"), ("loo", "leave-one-out"),
            ("ig", ig_name(rule)))  # every method the significance count below counts (review 7 C6)
    unconverged = ig_sentence(s)
    if rule.mode == "none":  # IG's ranking is not IG's: no tau, no rollout comparison rests on it
        keys = tuple(k for k in keys if k[0] != "ig")
    rounded = loo_rounds(s)
    if rounded:  # most leave-one-out scores are rounding: its tau would rank rounding (review 10a A1)
        keys = tuple(k for k in keys if k[0] != "loo")
    gxi_rounded = gradient_rounds(s)
    if gxi_rounded:  # most |gradient x input| scores are within their rounding floor (review 18e A1)
        keys = tuple(k for k in keys if k[0] != "gradient")
    taus = {name: (_num(s.get(f"mean_tau_attention_{key}")), _num(s.get(f"std_tau_attention_{key}"))) for key, name in keys}
    taus = {k: v for k, v in taus.items() if v[0] is not None}
    # examples with a defined tau per method (older summaries: every example)
    defined = {name: int(_num(s.get(f"n_tau_attention_{key}")) or (rule.n_converged if key == "ig" else n))
               for key, name in keys}
    rollout = {name: _num(s.get(f"mean_tau_rollout_{key}")) for key, name in keys}
    rollout = {k: v for k, v in rollout.items() if v is not None}
    if taus:
        def ci(m: float, sd: float | None, k: str) -> str:  # a tau lies in [-1, 1], so its interval too
            interval = t_interval(m, sd, defined[k])
            return _ci(interval and (max(-1.0, interval[0]), min(1.0, interval[1])))

        ig_only = ig_name(rule) if rule.mode == "converged" else None  # IG's n is its converged examples: said by name
        lost, own_n, why = undefined_taus(s, keys, {k: defined[k] for k in taus if k != ig_only}, n)
        parts.append(f"Over {n or '?'} examples{lost}, last-layer attention agrees with "
                     + ", ".join(f"{k} at mean Kendall tau {m:.2f}{own_n.get(k, '')}{ci(m, sd, k)}"
                                 for k, (m, sd) in taus.items()) + "." + why)
        if words := window_words(s.get("attention_window"), n):
            parts.append(words)
    parts += [said] if (said := rounding_words(s)) else []
    parts += [said] if (said := gradient_rounding_words(s)) else []
    if taus:
        references = {k: v for k, v in taus.items() if k != "saliency"}  # the paired rollout tests' references
        weak = bool(references) and max(abs(m) for m, _ in references.values()) < WEAK_TAU
        if weak:
            tested = tuple(kv for kv in keys if kv[0] != "saliency")
            said = _rollout_sentence(s, references, rollout, defined, tested)
            parts += [said] if said else []
    parts += [unconverged] if unconverged else []
    frac = None if rule.legacy else _num(s.get("fraction_significant"))  # a summary before the rule counts IG's taus
    tests = int(_num(s.get("n_tau_tests")) or n * len(taus))
    for left_out, short in ((rounded, "loo"), (gxi_rounded, "gradient")):
        if frac is not None and left_out:  # the summary's count holds this method's taus: take them out
            m_frac, m_n = _num(s.get(f"frac_significant_attention_{short}")), int(_num(s.get(f"n_tau_attention_{short}")) or 0)
            k = round(frac * tests) - (round(m_frac * m_n) if m_frac is not None else 0)
            tests -= m_n if m_frac is not None else 0
            frac = k / tests if tests > 0 else None
    if frac is not None and tests > 0:
        k = round(frac * tests)
        lo, hi = wilson(k, tests)
        per = {name: _num(s.get(f"frac_significant_attention_{key}")) for key, name in keys}
        per = {name.split(" from the ")[0]: round(f * defined[name]) for name, f in per.items() if f is not None}
        which = f"; {', '.join(f'{name} {c}' for name, c in per.items())}" if per else ""
        parts.append(f"For last-layer attention, {k} of {tests} per-example taus ({_pct(frac)}{which}) are significant "
                     "at p < 0.05 (Kendall's exact test; with tied scores a permutation test over every ordering up to 8 "
                     "tokens; its normal approximation beyond), "
                     "uncorrected "
                     f"(Wilson 95% CI {_pct(lo)}-{_pct(hi)}; 5% would be by chance)"
                     + (f"; {n} examples are too few to say how often attention agrees." if 0 < n < FEW else "."))
    elif frac is not None:
        parts.append(f"{_pct(frac)} of the per-example taus are significant (p < 0.05, uncorrected).")
    if taus and not weak:  # rollout's own taus (the weak case's sentence compares them with raw attention's)
        parts += [_rollout_taus(s, keys, defined)] if _rollout_taus(s, keys, defined) else []
    parts += _output_tests(s)
    return " ".join(parts)


def undefined_taus(s: Mapping[str, Any], keys: tuple, defined: dict[str, int], n: int) -> tuple[str, dict[str, str], str]:
    """Where some methods have no tau on some examples (review 11a A2): (the parenthesis after "Over n examples"
    when every method lacks the same examples for want of tokens, each method's " over k of n examples" beside its
    mean otherwise, the sentence giving each method's reason). A method that scores every token of an example alike
    (summary n_tied_scores_<key>, e.g. leave-one-out's changes all below the output's rounding) is said to, not to
    have too few tokens to rank; where last-layer attention itself is alike on some example (n_tied_scores_attention)
    the rest is said as either."""
    short = {name: key for key, name in keys}
    missing = {k: n - d for k, d in defined.items() if 0 < d < n}
    if not missing:
        return "", {}, ""
    tied = {k: min(int(_num(s.get(f"n_tied_scores_{short[k]}")) or 0), m) for k, m in missing.items()}
    rest = ("last-layer attention gives every token the same weight or there are too few tokens to rank"
            if _num(s.get("n_tied_scores_attention")) else "too few tokens to rank")
    if len(set(defined.values())) == 1 and not any(tied.values()):  # one n for every method, one reason
        d = next(iter(defined.values()))
        return f" ({n - d} without a defined tau: {rest}, so the means and intervals are over {d})", {}, ""
    own_n = {k: f" over {defined[k]} of {n} examples" for k in missing}
    reasons = []
    for k, m in missing.items():
        said = [f"it gives every token the same score on {tied[k]}"] if tied[k] else []
        said += [f"on {'the other ' if tied[k] else ''}{m - tied[k]}, {rest}"] if m > tied[k] else []
        reasons.append(f"{k[:1].upper()}{k[1:]} has no tau on {m} of the {n} examples: {'; '.join(said)}.")
    return "", own_n, " " + " ".join(reasons)


SMALL_METRIC_CHANGE = 0.1  # mean |change| of the task metric (logits, nats) under which "does little" may be said


def window_words(w: Any, n: int | None = None) -> str:
    """Review 9a A3: a sliding-window last layer gives 0 by its mask to the tokens before its window, so
    its taus rank only the tokens inside the answer query's window; say how many and that the rest are out
    (n: the examples)."""
    if not isinstance(w, Mapping) or not w.get("window"):
        return ""
    return (f"The last layer attends over a sliding window of {w['window']} keys, so at the answer position it gives "
            f"0 by construction to every earlier token (in {w.get('n_examples_cut', '?')} of {n or '?'} examples): its taus "
            f"rank only the {int_span(*w['ranked'])} tokens inside that window, of the {int_span(*w['of'])} ranked, and say "
            "nothing of the tokens the window excludes.")


def _saturated(s: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The summary's saturation entry when most examples' outputs are saturated, else None."""
    entry = s.get("saturated")
    return entry if isinstance(entry, Mapping) and entry.get("is_saturated") is True else None


def metric_effect(s: Mapping[str, Any], key: str, size_key: str | None = None) -> str:
    """'changes the <metric> by a mean of +x (95% CI [a, b]) over n examples' from the summary's
    <key>, <key>_sd and <key>_n (per-example means over draws), with the mean absolute change from
    size_key alike ("" without the entry)."""
    mean, n = _num(s.get(key)), int(_num(s.get(f"{key}_n")) or 0)
    if mean is None or n < 1:
        return ""
    words = _words(s.get("metric", ""))
    interval = t_interval(mean, _num(s.get(f"{key}_sd")), n)
    said = f"changes the {words} by a mean of {mean:+.3g}{_ci(interval, '+.3g')} over {n} example{'s' * (n != 1)}"
    size = _num(s.get(size_key)) if size_key else None
    if size is not None:
        said += f" (mean absolute change {size:.3g}{_abs_ci(s, size_key, size, n)})"
    return said


def _abs_ci(s: Mapping[str, Any], key: str, size: float, n: int) -> str:
    """The interval of a mean absolute change, which cannot go below 0: the summary's percentile bootstrap over
    examples (<key>_ci), else (older summaries) the t interval with its lower bound clipped at 0, said so."""
    if (boot := ci_pair(s.get(f"{key}_ci"))) is not None:
        return f", bootstrap 95% CI [{boot[0]:.3g}, {boot[1]:.3g}] over examples"
    interval = t_interval(size, _num(s.get(f"{key}_sd")), n)
    if interval is None or interval[0] >= 0:
        return _ci(interval, ".3g")
    return f"{_ci((0.0, interval[1]), '.3g')}, the t interval's lower bound clipped at 0"


def ig_name(rule: IgUse) -> str:
    """How the findings name integrated gradients: with "from the k converged examples" where only those are used."""
    return (f"integrated gradients from the {rule.n_converged} converged examples" if rule.mode == "converged"
            else "integrated gradients")


def ig_sentence(s: Mapping[str, Any]) -> str:
    """The sentence saying integrated gradients missed completeness on some examples (analyses/attribution/
    convergence.py's rule: then IG is used on its converged examples only, or left out when too few converge), with
    the count and the worst example's sum against the change it should add up to; '' when every example converged."""
    rule = ig_use(s)
    if rule.mode == "all":
        return ""
    worst = s.get("ig_worst") if isinstance(s.get("ig_worst"), Mapping) else {}
    total, change, rel = (_num(worst.get(k)) for k in ("attribution_sum", "metric_change", "relative_error"))
    bad, n = rule.n_not_converged, rule.n
    tol = _num(s.get("ig_error_tolerance")) or 0.1
    steps = _num(s.get("ig_max_steps_used"))
    ex = worst.get("example", "?")
    how = [f"worst: attributions sum to {total:.3g} for a metric change of {change:+.3g} on example {ex}, an error of "
           f"{rel:.3g}x the change" if None not in (total, change, rel) else "",
           f"at most {int(steps)} steps" if steps is not None else ""]
    how = [h for h in how if h]
    said = (f"Integrated gradients missed completeness (error over {tol:g}x the metric change) on {bad} of {n or '?'} "
            "examples" + (f" ({'; '.join(how)})" if how else ""))
    low = _likely_reason(s)
    if rule.mode == "converged":
        return said + (f": its taus, and the comparisons that rest on them, are from the {rule.n_converged} converged "
                       "examples only.") + low
    if rule.legacy:
        return said + (": this summary's IG taus include those examples, so they are not used, nor its count of "
                       "significant taus, which counts them.") + low
    return said + (f": {rule.n_converged} converged, too few (IG is used on its converged examples when they are at least "
                   "half and at least 2), so its taus are not used") + ("." if low else "; more steps needed.") + low


LOW_PRECISION = {"bfloat16": "8 significant bits, about 2 to 3 significant digits",
                 "float16": "11 significant bits, about 3 significant digits"}


def _likely_reason(s: Mapping[str, Any]) -> str:
    """Why IG may miss completeness: top-k routing (ig_top_k_routing) where the model has it, its discontinuity
    being a reason no precision or step count removes (review 11c A4: a float32 run of a Qwen2-MoE missed by the
    same 0.18x as its bfloat16 run, its top-2 router switching 19-60 times along each path); else a half
    precision (_low_precision); where doubling the steps moved the worst miss by more than rounding, the step count
    in any dtype (_step_cap; review 17a B4: a bfloat16 miss of 0.145x blamed on the precision, float32's 0.138x on
    the same example); else ''."""
    routing = s.get("ig_top_k_routing")
    if not isinstance(routing, Mapping):
        worst = s.get("ig_worst") if isinstance(s.get("ig_worst"), Mapping) else {}
        trend = doubling_trend(dict(worst))
        return _step_cap(s, worst) if trend == "moved" else _low_precision(s, still=trend == "still")
    layers = [int(x) for x in routing.get("layers") or []]
    k = routing.get("top_k")
    where = (f" in layer{'s' if len(layers) > 1 else ''} {and_join([str(x) for x in layers])}" if layers else "")
    top = f"its top-{k} experts" if isinstance(k, int) else "its top-k experts"
    return (f" A likely reason: the model routes each token to {top}{where}, a choice that jumps from one set of "
            "experts to another along IG's path from the baseline; the path integral of gradients cannot see those "
            "jumps, so completeness need not hold at any number of steps or in any precision.")


DEFAULT_MAX_STEPS = 256  # AttributionConfig's ig_max_steps (--quick: 32)


def _step_cap(s: Mapping[str, Any], worst: Mapping[str, Any]) -> str:
    """' A likely reason: the step cap: ...' where doubling the worst example's steps shrank its convergence delta by
    more than rounding (convergence.doubling_trend "moved"): the integral is not resolved at those steps, in any
    precision; with the cap and how to raise it. Where the doubling made the miss larger, that is said and no more
    steps are advised (review 18v B2)."""
    steps, cap, floor = _num(worst.get("n_steps")), _num(s.get("ig_max_steps")), _num(worst.get("rounding_floor"))
    now, before = float(worst["delta"]), float(worst["delta_half"])
    ex, dtype = worst.get("example", "?"), s.get("ig_dtype")
    at = f"from {int(steps) // 2} to {int(steps)} steps" if steps is not None else "its steps"
    capped = cap is not None and steps is not None and 2 * steps > cap
    rounding = (f", by {abs(now - before) / floor:.1f} times one {dtype} rounding step ({floor:.2g}), so the precision "
                "does not set it: a float32 run would miss too" if dtype in LOW_PRECISION and floor else "")
    raise_it = ("raise the cap (ig_max_steps" + (f", {int(cap)} here" if cap is not None else "")
                + (f"; --quick's, a run without --quick doubles up to {DEFAULT_MAX_STEPS}"
                   if cap is not None and cap < DEFAULT_MAX_STEPS else "")
                + "; in Python hs.attribution(model, task, ig_max_steps=...))")
    if abs(now) > abs(before):  # review 18v B2: a miss that grew with the steps is not shown to shrink with more
        return (f" Doubling example {ex}'s steps {at}{' (the cap)' if capped else ''} moved its miss (Captum's "
                f"convergence delta) from {before:+.3g} to {now:+.3g}{rounding}: the miss grew with the steps, so the "
                "integral is not converging at these step counts; the data do not show that more steps would close "
                "it, nor that the step count is the cause.")
    return (f" A likely reason: {'the step cap' if capped else 'too few steps'}: doubling example {ex}'s steps {at}"
            f"{' (the cap)' if capped else ''} moved its miss (Captum's convergence delta) from {before:+.3g} to "
            f"{now:+.3g}{rounding}; the miss shrank with the steps but is not resolved at these, and more may converge it: "
            f"{raise_it}.")


def _low_precision(s: Mapping[str, Any], *, still: bool = False) -> str:
    """' A likely reason: the run is in bfloat16, whose gradients carry ...; a float32 run may converge.' where IG
    ran in a half precision (ig_dtype; review 8: its misses were not put down to the precision) and the worst miss
    is of the size its rounding can explain (within ROUNDING_STEPS of convergence.ig_rounding_floor); a larger miss
    is not the precision's (review 12b A6: bfloat16 missed by 24.3x where float32 missed by 44.6x on the same
    example), so then the reason that holds in float32 too is said; '' in float32. Called only where doubling the
    steps did not move the miss beyond rounding (`still`: said) or the summary does not record whether it did."""
    dtype = s.get("ig_dtype")
    if dtype not in LOW_PRECISION:
        return ""
    worst = s.get("ig_worst") if isinstance(s.get("ig_worst"), Mapping) else {}
    total, change = _num(worst.get("attribution_sum")), _num(worst.get("metric_change"))
    floor = _num(worst.get("rounding_floor"))
    if floor is None and total is not None and change is not None:
        floor = ig_rounding_floor(dtype, total, _num(worst.get("metric_input")), _num(worst.get("metric_baseline")),
                                  change)
    miss = abs(total - change) if total is not None and change is not None else None
    flat = " (doubling its steps moved it by rounding only)" if still else ""
    if miss is None or floor is None or miss <= ROUNDING_STEPS * floor:
        return (f" A likely reason: the run is in {dtype}, whose gradients carry {LOW_PRECISION[dtype]}{flat}; a "
                "float32 run may converge.")
    return (f" Not {dtype}'s rounding: the worst miss, {miss:.3g}{flat}, is {miss / floor:.0f} times one {dtype} "
            f"rounding step of the endpoint metrics and the attributions ({floor:.2g}; rounding explains up to "
            f"{ROUNDING_STEPS}), so a float32 run would miss too: too few steps for a path through sharp changes "
            "(softmax saturating along it); more steps or another baseline are needed.")


def _output_tests(s: Mapping[str, Any]) -> list[str]:
    """The permutation and adversarial sentences. A saturated output (the top token's p near 1 on most
    examples) keeps a distribution distance near 0 under any change of a logit or so, so a small distance is not
    read as no effect; the per-example medians that still exceed that bound or 0.5 are counted (large_words, review
    14c A2) and the change of the task metric (logits, nats) is given beside them."""
    parts = []
    tvd, layer = median_change(s), s.get("permutation_layer", "?")
    change = s.get("output_change", "change")
    sat = _saturated(s)
    parts += [said] if (said := partner_words(s)) else []
    effect = metric_effect(s, "permutation_metric_change", "permutation_abs_metric_change")
    if sat is not None:  # review 14c A2: a small distance shows nothing here, a large one still does
        parts.append(f"The output distribution is saturated: {sat.get('why', 'the top token has p near 1')}: a small "
                     "distance here does not show that the layer does little.")
        parts.append(loo_words(s, sat))
        if tvd is not None:
            parts.append(f"Permuting layer {layer}'s attention gives a median {change} of {tvd:.3g}{change_spread(s)}"
                         f"{large_words(s, saturated=True)}.")
        if effect:
            parts.append(f"In the task metric's units, permuting layer {layer}'s attention {effect}.")
    elif tvd is not None:
        size = _num(s.get("permutation_abs_metric_change"))
        spread = change_spread(s)
        rounding = rounding_said(s, tvd)
        if rounding and (size is None or size < SMALL_METRIC_CHANGE):  # review 11a B1, C2: no effect is measured
            parts.append(f"Permuting layer {layer}'s attention leaves the output {rounding}: no effect of that layer's "
                         "attention is measured, so the permutation test says nothing about faithfulness here.")
        elif tvd < 0.01 and (size is None or size < SMALL_METRIC_CHANGE) and not large_words(s):
            parts.append(f"Permuting layer {layer}'s attention barely moves the output (median {change} "
                         f"{tvd:.3g}{spread}): that layer's attention does little for the prediction, so the permutation "
                         "test says nothing about faithfulness.")
        elif tvd < 0.01 and not large_words(s):  # the distribution hardly moves, the metric does: no "does little"
            parts.append(f"Permuting layer {layer}'s attention barely moves the output distribution (median {change} "
                         f"{tvd:.3g}{spread}), yet the task metric moves.")
        else:
            parts.append(f"Permuting layer {layer}'s attention changes the output by a median {change} of {tvd:.3g}"
                         f"{spread}{large_words(s)}.")
        if effect:
            parts.append(f"In the task metric's units, it {effect}.")
        some = s.get("saturated") if isinstance(s.get("saturated"), Mapping) else {}
        if s.get("loo_metric") == "logit_diff" and (_num(some.get("n_saturated")) or 0) > 0:  # review 10b A4
            parts.append(f"The top token has p >= {some.get('threshold', 0.99)} on {some['n_saturated']:.0f} of "
                         f"{some.get('n_examples', '?')} examples, where a distribution distance cannot move: leave-one-out "
                         "is scored by the absolute change of the logit difference on every example.")
    jsd, near = _num(s.get("median_adversarial_jsd")), _num(s.get("fraction_adversarial_near_ln2"))
    if jsd is not None and sat is not None:
        adv = metric_effect(s, "adversarial_metric_change")
        parts.append(f"Adversarial attention is bounded by an output change of {s.get('adversarial_epsilon', '?')}, which a "
                     "saturated output meets under almost any attention, so its median JSD of "
                     f"{jsd:.3g} nats says nothing about faithfulness" + (f"; that attention {adv}." if adv else "."))
    elif jsd is not None:
        parts.append(f"Adversarial attention within an output change of {s.get('adversarial_epsilon', '?')} reaches a median "
                     f"JSD of {jsd:.3g} nats (maximum ln 2 = 0.693)"
                     + (f"; {_pct(near)} of examples come within 90% of it." if near is not None else "."))
    return parts


def median_change(s: Mapping[str, Any]) -> float | None:
    """The median output change under the permutations, in output_change's units (median_permutation_change; older
    summaries: median_permutation_tvd, which held the encoders' 1 - cosine too)."""
    value = _num(s.get("median_permutation_change"))
    return value if value is not None else _num(s.get("median_permutation_tvd"))


def change_spread(s: Mapping[str, Any]) -> str:
    """'; per-example medians 0.39 to 0.44 over 4 examples' from permutation_change_range and _n (review 11a C5: the
    median alone had no size of its spread); '' where the summary has no range."""
    span, n = s.get("permutation_change_range"), int(_num(s.get("permutation_change_n")) or 0)
    if not isinstance(span, Sequence) or len(span) != 2 or None in map(_num, span) or n < 1:
        return ""
    if n == 1:
        return "; 1 example"
    return f"; per-example medians {_num(span[0]):.3g} to {_num(span[1]):.3g} over {n} examples"


def large_words(s: Mapping[str, Any], *, saturated: bool = False) -> str:
    """Where the per-example medians leave the median over examples behind (review 14c A2: 0.92 on one of 4 examples
    behind a median of 0.009), from the summary's permutation_change_over_half and, on a saturated output,
    permutation_change_beyond_logit (summary.large_changes): '; above 0.5 on 1 of 4 examples (...)', with the saturated
    output's '; above its own one-logit bound on 2 of 4 examples (...)' and what the others' distances cannot tell;
    '' where neither count is recorded or, unsaturated, none is above 0.5."""
    n = int(_num(s.get("permutation_change_n")) or 0)
    half, beyond = _num(s.get("permutation_change_over_half")), _num(s.get("permutation_change_beyond_logit"))
    said = []
    if saturated and beyond == 0 and n:
        said.append(f"within its own example's one-logit bound e (1 - p(top)) on every one of the {n} examples, where "
                    "a distance cannot tell an effect from none")
    elif saturated and beyond is not None and n:
        said.append(f"above its own example's one-logit bound e (1 - p(top)) on {beyond:.0f} of {n} examples (there the "
                    "clean top token's log-odds fall by more than one logit)")
    if half and n:
        said.append(f"above 0.5 on {half:.0f} of {n} (more than half the next-token probability moves)")
    if not said:
        return ""
    rest = (f"; on the other {n - beyond:.0f} the distance stays within what one logit allows and cannot tell an effect "
            "from none" if saturated and beyond and 0 < n - beyond else "")
    return "; " + ", ".join(said) + rest


def rounding_said(s: Mapping[str, Any], median: float | None) -> str:
    """How the permutation test's median change reads against the metric's rounding (review 11a B1, C2): 'below the
    metric's rounding (...)' for an exact 0, 'within float32 rounding (...)' for a 1 - cosine under the summary's
    permutation_rounding_floor; '' where the change is measured."""
    if median is None:
        return ""
    change = s.get("output_change", "change")
    if median == 0:
        return (f"unchanged below the metric's rounding (median {change} exactly 0: every change rounds to the clean "
                "value)")
    floor = s.get("permutation_rounding_floor") if isinstance(s.get("permutation_rounding_floor"), Mapping) else {}
    size, dtype = _num(floor.get("floor")), floor.get("dtype", "?")
    if size is None or median > size:
        return ""
    return (f"unchanged within {dtype} rounding (median {change} {median:.3g}{change_spread(s)}, under "
            f"{floor.get('ulps', '?')} {dtype} rounding steps of a cosine near 1, {size:.2g})")


PARTNER = ("the cosine of each prompt's pooled embedding with another example's: a similarity to a partner, not the "
           "model's answer")


def partner_words(s: Mapping[str, Any]) -> str:
    """Encoders (the summary's partner_ceiling, analyses' summary.partner_ceiling): what the gradient methods'
    metric measures, and on how many examples it sits at its ceiling (a partner cosine >= 0.99), where those
    methods rank tokens by changes of about 1 - cosine; '' for a decoder or an older summary (review 11a A5)."""
    entry = s.get("partner_ceiling")
    if not isinstance(entry, Mapping):
        return ""
    wrt = s.get("gradient_input")
    said = (f"On this encoder, saliency, gradient x input and integrated gradients differentiate {PARTNER} ("
            + (f"the gradient is taken with respect to {wrt}; " if isinstance(wrt, str) and wrt else "")
            + "leave-one-out and the permutations measure 1 - cosine to the prompt's own embedding).")
    k, n = int(_num(entry.get("n_saturated")) or 0), int(_num(entry.get("n_examples")) or 0)
    if not k:
        return said
    headroom, token = _num(entry.get("median_headroom")), _num(entry.get("median_token_ig"))
    which = [f"example{'s' * (len(entry.get('examples', [])) != 1)} "
             + ", ".join(str(e) for e in entry.get("examples", [])[:8])] if entry.get("examples") else []
    which += ([f"median 1 - cosine {headroom:.2g}" + (": the cosine rounds to 1" if headroom == 0 else "")]
              if headroom is not None else [])
    ig = (f" (integrated gradients, from its baseline up, gives their tokens a median |attribution| of {token:.2g})"
          if token is not None else "")
    return (said + f" That cosine is at its ceiling (>= {entry.get('threshold', 0.99)}) on {k} of {n} examples"
            + (f" ({'; '.join(which)})" if which else "") + ": no token can raise it by more than 1 - cosine there and "
            f"its gradient is near 0, so saliency and gradient x input rank those examples' tokens by changes that "
            f"small{ig}; their taus there rest on a metric at its ceiling and are not evidence of graded agreement"
            + (" (most examples: read the gradient methods' taus above with that in mind)." if 2 * k > n else "."))


def _measured_only(s: Mapping[str, Any], n: int) -> str:
    """At chance: what was measured (n, the methods, the permutation and adversarial settings), no tau,
    no rate of significant taus, no reading of either test."""
    measured = ["Kendall tau between attention and saliency, gradient x input, leave-one-out and integrated gradients"]
    layer = s.get("permutation_layer")
    if median_change(s) is not None:
        draws = s.get("n_permutations")
        measured.append(f"the output change under {draws or 'random'} permutations of layer {layer}'s attention")
    if _num(s.get("median_adversarial_jsd")) is not None:
        measured.append(f"adversarial attention within an output change of {s.get('adversarial_epsilon', '?')}")
    said = f"Measured over {n or '?'} examples: " + "; ".join(measured) + "."
    sat = _saturated(s)
    if sat is not None:
        said += f" The output distribution is saturated: {sat.get('why', 'the top token has p near 1')}. "
        said += loo_words(s, sat)
    return f"{said} {partner}" if (partner := partner_words(s)) else said


def loo_words(s: Mapping[str, Any], sat: Mapping[str, Any]) -> str:
    """On a saturated output, what leave-one-out's scores measure (the summary's loo_metric): the change of
    the logit difference (analysis.loo_metric's fallback), or still a distribution distance (a log-probability
    metric, or a summary from before the fallback), whose tau then rests on that distance (review 9a A5)."""
    if s.get("loo_metric") == "logit_diff":
        return ("Leave-one-out is therefore scored by the absolute change of the logit difference when a token is "
                "left out, not by a distribution distance.")
    floor = _num(sat.get("tvd_per_logit"))
    bound = f" (at most about {floor:.2g} per logit)" if floor is not None else ""
    return ("Leave-one-out is scored by the total variation distance too, which this saturated output keeps near 0"
            f"{bound} unless a token's removal moves the answer's odds by a logit or more: its tau rests on a saturated "
            "distance and is not evidence of graded agreement.")


def loo_rounds(s: Mapping[str, Any]) -> bool:
    """Whether most of leave-one-out's scores are within one rounding step of the logits (the summary's
    loo_rounding.ranks_rounding): its tau would rank rounding, so no claim rests on it."""
    entry = s.get("loo_rounding")
    return isinstance(entry, Mapping) and entry.get("ranks_rounding") is True


def rounding_words(s: Mapping[str, Any]) -> str:
    """'N of M leave-one-out scores are within one bfloat16 rounding step of the logits (0.075 logits) ...' from
    the summary's loo_rounding (analysis.loo_rounding: those scores are ties at 0); '' where none is."""
    entry = s.get("loo_rounding")
    if not isinstance(entry, Mapping):
        return ""
    k, m, floor = int(_num(entry.get("n_within")) or 0), int(_num(entry.get("n_scores")) or 0), entry.get("floor")
    if not k or not m or not isinstance(floor, Sequence) or len(floor) != 2 or None in map(_num, floor):
        return ""
    size = f"{floor[0]:.2g}" if f"{floor[0]:.2g}" == f"{floor[1]:.2g}" else f"{floor[0]:.2g}-{floor[1]:.2g}"
    said = (f"{k} of {m} leave-one-out scores (changes of the logit difference) are within one {entry.get('dtype', '?')} "
            f"rounding step of the logits ({size} logits) and count as ties")
    if loo_rounds(s):
        return said + (": its tau would rank rounding, so leave-one-out is left out of the taus and the count of "
                       "significant taus here.")
    return said + " (0) in its ranking."


def gradient_rounds(s: Mapping[str, Any]) -> bool:
    """Whether most |gradient x input| scores are within their rounding floor (the summary's
    gradient_rounding.ranks_rounding, analysis.gradient_rounding): its tau would rank rounding, so no claim rests on
    it (review 18e A1)."""
    entry = s.get("gradient_rounding")
    return isinstance(entry, Mapping) and entry.get("ranks_rounding") is True


def gradient_rounding_words(s: Mapping[str, Any]) -> str:
    """'N of M gradient x input scores are within their bfloat16 rounding floor ...' from the summary's
    gradient_rounding (those scores are ties at 0); '' where none is."""
    entry = s.get("gradient_rounding")
    if not isinstance(entry, Mapping):
        return ""
    k, m, floor = int(_num(entry.get("n_within")) or 0), int(_num(entry.get("n_scores")) or 0), entry.get("floor")
    if not k or not m or not isinstance(floor, Sequence) or len(floor) != 2 or None in map(_num, floor):
        return ""
    dtype, n = entry.get("dtype", "?"), _num(entry.get("n_examples"))
    if entry.get("floor_kind") == "measured":  # review 19e A1: the floor measured, not the worst-case bound
        examples = f"all {int(n)} examples" if n else "its examples"
        said = (f"{k} of {m} gradient x input scores are within their {dtype} rounding floor (twice the score's own "
                f"{dtype} rounding error, measured on {examples} by re-running them in float32, up to "
                f"{floor[1]:.2g}: a score within it is mostly the gradient's rounding) and count as ties")
    else:
        said = (f"{k} of {m} gradient x input scores are within their {dtype} rounding floor (a worst-case bound: one "
                f"{dtype} rounding step of the example's largest token gradient times the token's embedding norm, up "
                f"to {floor[1]:.2g}: the product of gradient and embedding nearly cancels, so a score within it may "
                "be the gradient's rounding) and count as ties")
    if gradient_rounds(s):
        return said + (": its tau would rank rounding, so gradient x input is left out of the taus, the rollout "
                       "comparisons and the count of significant taus here.")
    return said + " (0) in its ranking."


def _rollout_taus(s: Mapping[str, Any], keys: tuple, defined: Mapping[str, int]) -> str:
    """'Attention rollout agrees with saliency at mean Kendall tau 0.93, 95% CI [0.79, 1.00], ...; 3 of 4 per-example
    taus significant against saliency, ...': rollout's taus stated as last-layer attention's are, with their t
    intervals (clipped to tau's [-1, 1]) over the examples with a defined tau and, where the summary has them, the
    significant counts (review 9b C5: tau.png drew rollout's, the strongest agreement, and the finding left it out)."""
    said, counts = [], []
    for key, name in keys:
        m, sd = _num(s.get(f"mean_tau_rollout_{key}")), _num(s.get(f"std_tau_rollout_{key}"))
        if m is None:
            continue
        n = int(_num(s.get(f"n_tau_rollout_{key}")) or defined.get(name, 0))
        interval = t_interval(m, sd, n)
        said.append(f"{name} at mean Kendall tau {m:.2f}"
                    + _ci(interval and (max(-1.0, interval[0]), min(1.0, interval[1]))))
        frac = _num(s.get(f"frac_significant_rollout_{key}"))
        if frac is not None and n:
            counts.append(f"{round(frac * n)} of {n} against {name.split(' from the ')[0]}")
    if not said:
        return ""
    tail = f"; per-example taus significant at p < 0.05, uncorrected: {', '.join(counts)}" if counts else ""
    return f"Attention rollout (attention composed through the layers) agrees with {', '.join(said)}{tail}."


WEAK_TAU = 0.2  # |mean tau| under this: agreement is weak


def _paired_words(entry: Mapping[str, Any] | None) -> str:
    """'+0.21, uncorrected 95% CI [+0.05, +0.38], Holm-corrected p = 0.03' from a rollout_vs_raw entry ('' without its
    test). Review 19v B1: the interval is the paired t test's own, not Holm's, so it is labelled uncorrected, and
    where it excludes 0 while the corrected p does not pass, that is said: "[+0.08, +0.68]" beside "not shown" read as
    a contradiction."""
    from headscope.reports.findings import ci_words

    if not isinstance(entry, Mapping):
        return ""
    mean, p, ci = _num(entry.get("mean")), _num(entry.get("p_holm")), ci_pair(entry.get("ci"))
    if mean is None or p is None or ci is None:
        return ""
    said = f"{mean:+.2f}, uncorrected {ci_words(ci, '+.2f')}, Holm-corrected p = {p:.2g}"
    if (ci[0] > 0 or ci[1] < 0) and p >= chance.ALPHA:
        said += (f": the uncorrected interval excludes 0, but the test does not pass after Holm's correction "
                 f"(p >= {chance.ALPHA:g})")
    return said


def _rollout_sentence(s: Mapping[str, Any], taus: Mapping[str, tuple], rollout: Mapping[str, float],
                      defined: Mapping[str, int], keys: tuple) -> str:
    """What rollout adds where raw last-layer attention agrees weakly. "Does better" against a reference only
    where the paired test of per-example tau differences (rollout minus raw, against that reference; the
    summary's rollout_vs_raw) passes after Holm's correction over the references, with the difference and its
    interval; "where the raw weights do not" only when that holds against every reference and every raw tau's
    95% CI stays under 0.2. Summaries without the paired tests claim no comparison. Not called at chance."""
    spread = (f"tau from {min(rollout.values()):.2f} to {max(rollout.values()):.2f}" if len(rollout) > 1
              else f"tau {next(iter(rollout.values())):.2f}") if rollout else ""
    short = {name: key for key, name in keys}
    paired = s.get("rollout_vs_raw") if isinstance(s.get("rollout_vs_raw"), Mapping) else {}
    better, not_better, pairs = [], [], []
    for name, (raw, _) in taus.items():
        roll = rollout.get(name)
        if roll is None:
            continue
        entry = paired.get(short[name])
        said = _paired_words(entry)
        if said:
            pairs.append(int(_num(entry.get("n")) or 0))
        # at the family-wise level chance.ALPHA (Holm over the references)
        passes = bool(said) and _num(entry.get("mean")) > 0 and _num(entry.get("p_holm")) < chance.ALPHA
        (better if passes else not_better).append(
            f"{name} (tau {roll:.2f} against raw {raw:.2f}; " + (f"paired difference {said})" if said else "no paired test)"))
    how = (f"paired per example, rollout minus raw tau over {min(pairs)}"
           + (f"-{max(pairs)}" if max(pairs) != min(pairs) else "") + " examples, Holm-corrected over "
           f"{len(pairs)} reference{'s' * (len(pairs) != 1)}") if pairs else ""
    if better:
        raw_highs = []
        for name, (raw, raw_sd) in taus.items():
            interval = t_interval(raw, raw_sd, defined[name])
            raw_highs.append(None if interval is None else min(1.0, interval[1]))
        said = (f"Raw last-layer attention's mean taus are under {WEAK_TAU}; attention rollout does better ({how}) against "
                + ", ".join(better))
        if not_better:
            return said + f", but not significantly against {', '.join(not_better)}."
        if None not in raw_highs and max(raw_highs) < WEAK_TAU:
            return (said + ": attention flow through the layers tracks token importance where the last layer's raw "
                    f"weights do not (raw tau's 95% CIs stay under {WEAK_TAU}).")
        top = [h for h in raw_highs if h is not None]
        return (said + (f". Raw tau's 95% CIs reach up to {max(top):.2f}" if top else ". Raw tau has no interval")
                + ", so these examples do not show that the last layer's raw weights fail to track token importance.")
    words = ("Attention rollout is not shown to do better than raw last-layer attention"
             + (f" after Holm's correction ({how})" if how else "") + ": " + ", ".join(not_better) + ".") if not_better else ""
    if rollout and max(rollout.values()) >= WEAK_TAU:
        return words
    return (words + " " if words else "") + ("Agreement is weak" + (f" for rollout too ({spread})" if rollout else "")
                                             + ": attention weights are a poor stand-in for token importance here.")
