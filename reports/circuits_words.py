"""The `circuits` finding in words (reports/plots_circuits.py's `finding`, the family's headline): where the
logit lens first ranks the answer top-1, held against a constant guess of the commonest answer; the direct
logit attribution's largest writers with their intervals, ties and totals, and what they sum to (the final
logit difference, or the answer's logit where the task has no wrong answers: `metric_words`; before the
soft-cap where the model caps its logits); MIB's CPR/CMD with bootstrap intervals, withheld with the gap and
its interval where the clean-corrupted gap they divide by is within noise (gap_within_noise); at chance only
what was measured.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from headscope.analyses.circuits.analysis import NOT_WRITERS
from headscope.reports.findings import _at_chance, _below, _chance, _ci, _num, _pct, ci_pair, wilson
from headscope.reports.moe_words import mlp_components_sentence, top_expert_sentence


def _interval(entry: Any) -> tuple[float, float] | None:
    return ci_pair(entry.get("ci")) if isinstance(entry, Mapping) else None


def _writers(s: Mapping[str, Any], top: Mapping[str, float], final: float | None) -> str:
    """The (up to) three largest DLA writers with their 95% intervals over examples. Writers whose paired
    difference's interval contains 0 (dla_top_differences) are tied within their per-example spread and
    said so instead of ranked; summaries without the intervals (older results) list the means."""
    items = sorted(top.items(), key=lambda kv: -abs(kv[1]))[:3]
    n = s.get("n_examples")
    of = _of_total(s, final)
    intervals = s.get("dla_top_intervals")
    if not isinstance(intervals, Mapping):
        return ("Direct logit attribution" + (f" (mean over {n} examples)" if n is not None else "")
                + ": the largest writers are " + ", ".join(f"{k} ({v:+.2f})" for k, v in items) + of)
    n = (intervals.get(items[0][0]) or {}).get("n", n)
    pairs = {(d.get("a"), d.get("b")): d for d in s.get("dla_top_differences") or [] if isinstance(d, Mapping)}

    def one(k: str, v: float) -> str:
        return f"{k} ({v:+.2f}{_ci(_interval(intervals.get(k)))})"

    def diff(a: str, b: str, signs: Mapping[str, float]) -> str:
        d = pairs[a, b]
        name = f"{a} - {b}" if signs[a] > 0 and signs[b] > 0 else f"|{a}| - |{b}|"
        return f"{name} = {d['difference']:+.2f}{_ci(_interval(d))}"

    def tied(a: str, b: str) -> bool:
        return (a, b) in pairs and pairs[a, b].get("tied") is True and _num(pairs[a, b].get("difference")) is not None

    names, signs = [k for k, _ in items], {k: (1.0 if v >= 0 else -1.0) for k, v in items}
    of = _ties_beyond(s, names[-1]) + of + _reaches_zero(s, names[-1])
    head = (f"Direct logit attribution (mean and 95% t interval over {n} examples)"
            if any(_interval(intervals.get(k)) for k in names)
            else f"Direct logit attribution (mean over {n} example(s), too few for an interval)")
    group = names[:1]
    for k in names[1:]:
        if all(tied(g, k) for g in group):
            group.append(k)
        else:
            break
    if len(group) > 1:
        rest = [one(k, v) for k, v in items[len(group):]]
        together = ", ".join(group[:-1]) + f" and {group[-1]}"
        return (f"{head}: {together} write the most, tied within their per-example spread ("
                + "; ".join(diff(group[0], k, signs) for k in group[1:]) + "): "
                + ", ".join(one(k, v) for k, v in items[:len(group)])
                + (f"; then {', '.join(rest)}" if rest else "") + of)
    text = f"{head}: the largest writers are " + ", ".join(one(k, v) for k, v in items) + of
    if len(names) > 1 and (names[0], names[1]) in pairs and pairs[names[0], names[1]].get("tied") is False:
        text += f" {names[0]} writes more than {names[1]} ({diff(names[0], names[1], signs)})."
    if len(names) > 2 and tied(names[1], names[2]):
        text += (f" {names[1]} and {names[2]} are tied within their per-example spread "
                 f"({diff(names[1], names[2], signs)}).")
    return text


def metric_words(s: Mapping[str, Any]) -> str:
    """What DLA's writers sum to and edge attribution's metric is: "answer logit" where the task has no wrong
    answers (dla_direction "answer", or edge_metric), else "logit difference" (answer minus wrong answer)."""
    answer = s.get("dla_direction") == "answer" or str(s.get("edge_metric", "")).startswith("answer logit")
    return "answer logit" if answer else "logit difference"


def _of_total(s: Mapping[str, Any], final: float | None) -> str:
    """What the writers add up to: ' of a final logit difference 14.2.' (' of a final answer logit 7.05.' where the
    task has no wrong answers: review 14b A3); where the model soft-caps its final logits (dla_final_softcap,
    Gemma 2's cap * tanh(logit / cap)) the writers sum to the logit (difference) before the cap, not to the
    output, and the sentence gives both."""
    cap, before = _num(s.get("dla_final_softcap")), _num(s.get("dla_logit_before_softcap"))
    if final is None:
        return "."
    if cap is None or before is None:
        return f" of a final {metric_words(s)} {final:.3g}."
    what = "logit" if s.get("dla_direction") == "answer" else "logit difference"
    return (f". The components sum to the {what} before the model's final logit soft-cap ({cap:g} tanh(logit / "
            f"{cap:g})): {before:.2f}; the model's output, after the cap, is {final:.2f}.")


KIND_WORDS = {"head": "heads", "mlp": "MLPs"}  # plural names of writer kinds; others say "components"


def _reaches_zero(s: Mapping[str, Any], last: str) -> str:
    """' L0H4's 95% interval reaches 0: it is not singled out from writing nothing.' where the last named writer's
    interval (dla_top_intervals) holds 0, else '' (review 17a B3)."""
    intervals = s.get("dla_top_intervals")
    ci = _interval(intervals.get(last)) if isinstance(intervals, Mapping) else None
    return (f" {last}'s 95% interval reaches 0: it is not singled out from writing nothing."
            if ci is not None and ci[0] <= 0.0 <= ci[1] else "")


def _ties_beyond(s: Mapping[str, Any], last: str) -> str:
    """', tied with N other heads within its interval (A +x, B +y, ...)' when writers beyond the named
    three have means inside the last named writer's interval (dla_last_named_ties), else ''; ', whose 95% interval
    reaches 0: ...' where it does, since every writer near 0 then lies in it (review 17a B3). The remainder and the
    final norm's and unembedding's biases are not writers: never counted (older summaries listed them)."""
    ties = s.get("dla_last_named_ties")
    if not isinstance(ties, Mapping) or ties.get("component") != last:
        return ""
    intervals = s.get("dla_top_intervals")
    ci = _interval(intervals.get(last)) if isinstance(intervals, Mapping) else None
    if ties.get("reaches_zero") or (ci is not None and ci[0] <= 0.0 <= ci[1]):
        return ""  # _reaches_zero says so instead
    rows = list(zip(ties.get("within") or [], ties.get("kinds") or [], ties.get("means") or []))
    if len(rows) != len(ties.get("within") or []):  # kinds or means not recorded: names alone
        rows = [(c, None, None) for c in ties.get("within") or []]
    rows = [r for r in rows if r[1] not in NOT_WRITERS and r[0] not in NOT_WRITERS]
    if not rows:
        return ""
    within, kinds_in, means = [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]
    kinds = {k for k in kinds_in if k is not None}
    word = KIND_WORDS.get(next(iter(kinds)), "components") if len(kinds) == 1 else "components"
    word = word if len(within) > 1 else word[:-1]
    if len(kinds) > 1 and None not in kinds_in:  # mixed: say how many of each kind
        counts = {k: kinds_in.count(k) for k in dict.fromkeys(kinds_in)}
        word += " (" + ", ".join(f"{c} {KIND_WORDS.get(k, k) if c > 1 else KIND_WORDS.get(k, k + 's')[:-1]}"
                                 for k, c in counts.items()) + ")"
    shown = [f"{c} {m:+.2f}" if _num(m) is not None else str(c) for c, m in zip(within[:6], means)]
    more = f", and {len(within) - 6} more" if len(within) > 6 else ""
    # "other" only beside a writer of the same kind (review 8 C2: "mlp2 ..., tied with 2 other heads")
    own = "mlp" if last.startswith("mlp") else "head" if re.fullmatch(r"L\d+H\d+", last) else None
    other = "other " if own is not None and kinds == {own} else ""
    return f", tied with {len(within)} {other}{word} within its interval ({', '.join(shown)}{more})"


def _totals(s: Mapping[str, Any]) -> str:
    """' In total (summed per example) the 12 heads write +5.30 (95% CI [...]) and the 3 MLPs +4.10 (...).'
    from dla_total_heads / dla_total_mlps, so a head's share is read against attention's whole write; else ''."""
    parts = []
    for key, word in (("dla_total_heads", "heads"), ("dla_total_mlps", "MLPs")):
        t = s.get(key)
        if isinstance(t, Mapping) and _num(t.get("mean")) is not None:
            count = _num(t.get("count"))
            ci = _ci(_interval(t))  # ", 95% CI [lo, hi]" or ""
            parts.append([f"the {count:.0f} {word}" if count else f"all {word}",
                          f"{t['mean']:+.2f}" + (f" ({ci[2:]})" if ci else "")])
    if not parts:
        return ""
    parts[0][0] += " write"
    return " In total (summed per example) " + " and ".join(" ".join(p) for p in parts) + "."


def _post_norms(s: Mapping[str, Any]) -> str:
    """' Each head's and MLP's write is taken through its layer's post-attention/post-MLP norm, frozen at its
    actual scale (as the final norm is).' on models whose blocks norm their writes before the residual add
    (dla_post_norms: OLMo 2, Gemma 2/3; review 8: the pre-norm writes there are 2-6x off), else ''."""
    norms = [n for n in ("post-attention", "post-MLP") if n in (s.get("dla_post_norms") or [])]
    if not norms:
        return ""
    whose = "head's and MLP's" if len(norms) == 2 else "head's" if norms[0] == "post-attention" else "MLP's"
    return (f" Each {whose} write is taken through its layer's {'/'.join(norms)} norm, frozen at its actual scale "
            "(as the final norm is).")


def _attn_bias(s: Mapping[str, Any]) -> str:
    """' Each head's row leaves out its position-independent value term (ln1's bias through W_V, then W_O), which
    is in its layer's attn_bias row ...' from dla_attn_bias_parts (TransformerLens's fold_ln + fold_value_biases
    convention, review 15b B1: +0.095 in attn_bias1 on a GPT-J without attention biases), else ''."""
    parts = s.get("dla_attn_bias_parts")
    if not isinstance(parts, Mapping) or not parts.get("value"):
        return ""
    what = " and ".join(str(v) for v in parts["value"])
    where = ("with b_O" if parts.get("b_O")
             else "alone (the attention has no output bias: attn_bias is not a bias of the attention)")
    return (f" Each head's row leaves out its position-independent value term ({what}, then W_O), which is in its "
            f"layer's attn_bias row {where}, as TransformerLens's fold_ln and fold_value_biases place it: a head's row is "
            "not its whole write z_h W_O (what zeroing the head removes).")


def finding(s: Mapping[str, Any]) -> str:
    """Logit lens (first layer with the answer top-1), direct logit attribution's top writers, MIB's
    circuit metrics, or why edge attribution was not run (edges_skipped)."""
    if "skipped" in s:
        return f"Skipped: {s['skipped']}"
    parts = []
    first = s.get("lens_first_top1_layer", s.get("first_top1_layer"))
    per_layer = s.get("lens_top1_fraction_per_layer") or {}
    guess = _num(s.get("lens_constant_guess"))
    n_layers = len(per_layer) - 1 if per_layer else None
    shown = {0, first} if isinstance(first, int) else {0}
    if isinstance(first, int) and guess is not None:
        cleared = _above_guess(s, first, per_layer, guess)
        shown.add(cleared)
        if cleared != first:  # the median's first top-1 layer is within reach of a constant guess
            parts.append(_lens_against_guess(s, first, cleared, per_layer, guess, n_layers))
            first = None
    if isinstance(first, int):
        share = _top1_share(s, first, per_layer)
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
    parts.append(_lens_logit_diff(s, shown))
    parts = [p for p in parts if p]
    top = {k: _num(v) for k, v in (s.get("dla_top_components") or {}).items() if _num(v) is not None}
    final = _num(s.get("dla_final_logit"))
    entry = _chance(s)
    # at chance: no writer, no circuit to rank (the old near-0 heuristic reads a logit difference, not a logit)
    if entry is not None or _at_chance(s, "logit_diff" if metric_words(s) == "logit difference" else None, final):
        why = ("below chance the model's behaviour is a preference among the answer tokens that does not depend on the "
               "prompt, not the task's" if entry is not None and _below(entry) and entry.get("prompt_independent") is True
               else "below chance the model's behaviour is a preference for the wrong answers, not the task's"
               if entry is not None and _below(entry) else "at chance there is no behaviour to attribute")
        what = metric_words(s)  # a logit's 0 is no reference: "near 0" is said of a logit difference only
        near = ", near 0" if "chance" not in s and what == "logit difference" else ""
        given = _num(entry.get("mean")) if entry is not None and entry.get("metric") == "logit_diff" \
            and what == "logit difference" else None
        if final is not None and given is not None:  # review 14a verify A2: one quantity, said once, the other pass named
            total = (f" (of the {what} above as the batched pass it decomposes gives it, {final:.3g}, "
                     f"{abs(final - given):.2g} from the plain pass above over the same rows)")
        else:
            total = f" (final {what} {final:.3g}{near})" if final is not None else ""
        parts.append("Direct logit attribution" + total
                     + f" ranks no writer and the circuit's faithfulness is not reported: {why}.")
        if isinstance(s.get("gap_within_noise"), Mapping) and not isinstance(s.get("edges_skipped"), str):
            parts.append(_gap_noise_words(s))  # review 15a C4: the gap the ratios would divide by is noise too
        return " ".join(parts)
    if top:
        parts.append(_writers(s, top, final) + _totals(s) + _post_norms(s) + _attn_bias(s))
        if moe := mlp_components_sentence(s):  # the writers and totals name mlpN alike, MoE or dense
            parts.append(moe)
        if expert := top_expert_sentence(s):  # which expert of the top MoE block writes the answer, or a tie
            parts.append(expert)
    cpr, cmd = _num(s.get("mib_cpr")), _num(s.get("mib_cmd"))
    if isinstance(s.get("gap_within_noise"), Mapping) and not isinstance(s.get("edges_skipped"), str):
        parts.append(_gap_noise_words(s))
    elif cpr is not None and cmd is not None:
        n, edges = _num(s.get("mib_n_examples", s.get("edges_n_examples"))), _num(s.get("n_edges"))
        over = (f", top-k of {edges:.0f} edges" if edges else "") + (f", over {n:.0f} examples" if n else "")
        parts.append(f"MIB's circuit metrics ({s.get('edge_method', 'edge')} scores{over}): "
                     f"CPR {cpr:.3f} ({_boot(s.get('mib_cpr_ci'))}higher is better), "
                     f"CMD {cmd:.3f} ({_boot(s.get('mib_cmd_ci'))}lower is better).")
    if isinstance(s.get("edges_skipped"), str):  # said in the finding, not only in the summary table
        parts.append(f"Edge attribution, the circuit's faithfulness and MIB's CPR/CMD were not run: "
                     f"{s['edges_skipped'].rstrip('.')}.")
    return " ".join(parts)


def _gap_noise_words(s: Mapping[str, Any]) -> str:
    """Why faithfulness and MIB's CPR/CMD are withheld: the clean-corrupted gap they divide by is within noise by
    patching's rule (gap_within_noise: its reason gives the gap, its 95% CI and n), the metric named."""
    small = s["gap_within_noise"]
    n, edges = _num(s.get("edges_n_examples", s.get("mib_n_examples"))), _num(s.get("n_edges"))
    ran = ", ".join(x for x in (f"{s['edge_method']} scores" if s.get("edge_method") else "",
                                f"{edges:.0f} edges" if edges else "", f"{n:.0f} examples" if n else "") if x)
    return (f"Edge attribution ran{f' ({ran})' if ran else ''}, but the clean-corrupted gap of its metric, the "
            f"{metric_words(s)}, is within noise ({small.get('reason', 'no reason recorded')}): the circuit's "
            "faithfulness, the circuit size reaching 80% of the gap and MIB's CPR/CMD are ratios over that gap, so "
            "none is reported.")


def _boot(ci: Any) -> str:
    """'95% bootstrap CI [lo, hi] over examples; ' for a recorded interval, else ''."""
    if (ci := ci_pair(ci)) is None:
        return ""
    return f"95% bootstrap CI [{ci[0]:.3f}, {ci[1]:.3f}] over examples; "


FEW_ANSWERS = 4  # a task with at most this many distinct answers: a constant guess is often top-1


def _top1_count(s: Mapping[str, Any], layer: int, per_layer: Mapping[str, Any]) -> tuple[int, int] | None:
    """(k, n): examples with the answer top-1 at `layer` and examples; None without n or the layer."""
    frac, n = _num(per_layer.get(str(layer))), _num(s.get("n_examples"))
    if frac is None or not n or n < 1:
        return None
    counted = _num((s.get("lens_top1_count_per_layer") or {}).get(str(layer)))
    return (int(counted) if counted is not None else round(frac * n)), int(n)


def _above_guess(s: Mapping[str, Any], first: int, per_layer: Mapping[str, Any], guess: float) -> int | None:
    """The first layer from `first` on where the answer is top-1 on more than half the examples (the
    median's rule) and the Wilson 95% interval of that count lies above `guess`, the share a constant
    guess of the commonest answer reaches; None when no layer does."""
    for layer in sorted(int(k) for k in per_layer if int(k) >= first):
        kn = _top1_count(s, layer, per_layer)
        if kn is not None and kn[0] * 2 > kn[1] and wilson(*kn)[0] > guess:
            return layer
    return None


def _lens_against_guess(s: Mapping[str, Any], first: int, cleared: int | None, per_layer: Mapping[str, Any],
                        guess: float, n_layers: int | None) -> str:
    """The lens sentence when the median's first top-1 layer does not beat a constant guess: the
    layer that does (or that none does), and why the earlier one does not count."""
    kn = _top1_count(s, first, per_layer)
    n = kn[1] if kn else None
    whole = n and abs(guess * n - round(guess * n)) < 1e-6  # the guess's count among these n examples
    rate = f"{_pct(guess)}" + (f" ({round(guess * n)} of {n})" if whole else "")
    where = ("the embeddings" if first == 0 else "the model's output" if n_layers is not None and first >= n_layers
             else f"the input of block {first}")
    early = (f"top-1 in {kn[0]} of {n} examples at {where} (Wilson 95% CI {_pct(wilson(*kn)[0])}-{_pct(wilson(*kn)[1])}"
             f"{_near_top(s, first)})"
             if kn else f"the top-1 share at {where}")
    baseline = f"a constant guess of the commonest answer, which is top-1 on {rate} of these examples"
    if cleared is None:
        return (f"The logit lens ranks the answer top-1 on no layer more often than {baseline}: "
                f"{early} does not clear that guess, nor does any later layer's interval.")
    of = f" of {n_layers}" if n_layers is not None else ""
    place = (f"only at the model's output, after all {n_layers} blocks" if n_layers is not None and cleared >= n_layers
             else f"at the input of block {cleared} (row {cleared}_pre), after {cleared}{of} blocks")
    return (f"The logit lens first ranks the answer top-1 more often than {baseline}, {place}"
            f"{_top1_share(s, cleared, per_layer)}; {early} does not clear that guess.")


def _lens_logit_diff(s: Mapping[str, Any], layers: set) -> str:
    """Where the answers are few fixed tokens (a top-1 count is then near a coin's), the lens's logit
    difference (answer minus wrong answer) at `layers` and the output as the reader's measure; else ''."""
    few = _num(s.get("lens_n_answers"))
    diffs = {int(k): _num(v) for k, v in (s.get("lens_mean_logit_diff_per_layer") or {}).items() if _num(v) is not None}
    if few is None or few > FEW_ANSWERS or len(diffs) < 2:
        return ""
    last = max(diffs)
    cis = s.get("lens_logit_diff_ci_per_layer") or {}

    def value(l: int) -> str:  # the mean, with its 95% t interval over examples where the summary records one
        ci = ci_pair(cis.get(str(l)))
        return f"{diffs[l]:.3g}" + (f" (95% CI [{ci[0]:.3g}, {ci[1]:.3g}])" if ci else "")

    shown = [value(l) + " at " + ("the embeddings" if l == 0 else f"block {l}'s input")
             for l in sorted(diffs) if l in layers and l != last]
    if not shown:
        return ""
    n = _num(s.get("lens_logit_diff_n"))
    over = f" (logits, mean over {n:.0f} examples)" if n and cis else ""
    return (f"The task has {few:.0f} distinct answers, so the lens's mean logit difference (answer minus wrong answer) "
            f"is the measure to read{over}: {', '.join(shown)}, of {value(last)} at the output.")


def _top1_share(s: Mapping[str, Any], layer: int, per_layer: Mapping[str, Any]) -> str:
    """' (top-1 in k of n examples, p%, Wilson 95% CI lo-hi)' at `layer` (the recorded count, else the
    fraction times n); without n, the share alone."""
    frac, n = _num(per_layer.get(str(layer))), _num(s.get("n_examples"))
    if frac is None:
        return ""
    if not n or n < 1:
        return f" (top-1 in {_pct(frac)} of the examples)"
    counted = _num((s.get("lens_top1_count_per_layer") or {}).get(str(layer)))
    k = int(counted) if counted is not None else round(frac * n)
    lo, hi = wilson(k, int(n))
    return f" (top-1 in {k} of {n:.0f} examples, {_pct(frac)}, Wilson 95% CI {_pct(lo)}-{_pct(hi)}{_near_top(s, layer)})"


def _near_top(s: Mapping[str, Any], layer: int) -> str:
    """Review 20a B1: '; on 3 of them another token's logit is within one rounding step of the answer's, so rounding
    could put either first' where the summary counts such examples at `layer` (half precision), else ''."""
    j = _num((s.get("lens_top1_within_rounding_per_layer") or {}).get(str(layer)))
    if not j:
        return ""
    return (f"; on {j:.0f} of them another token's logit is within one rounding step of the answer's, so rounding "
            "could put either first")
