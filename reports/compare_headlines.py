"""The headline numbers of `headscope compare` (reports/compare.py): each analysis's number exactly as its own
finding states it, with the interval that finding prints (none where it prints none), never one compare
computes itself; a number its report withholds (at chance, underpowered) is not compared, with the report's
own numbers and the reason; nor are the numbers of an analysis the runs ran on different tasks
(compare_run.tasks_differ) or, for labels that do not name it, with different metrics; where the runs' example
counts differ, that is said beside the difference.

Where each quantity and its interval come from (the fields of reports/plots_<name>.py's `finding`):
- heads: `baseline_metric`, "Unpruned <metric> is x (95% CI [..])": the CI is `chance.ci`, the metric's own t interval
  (`chance.metric_ci`: none from an older entry whose `ci` was the per-row chance's spread, review 11b A1).
- kv: `metric_unevicted`, "Full-cache <metric> x (95% CI [a, b], mean over n examples)": its interval where recorded
  (metric_unevicted_ci; older runs none); at chance not compared (below).
- probes: `best_<metric>` with `best_ci` where the summary has it (the finding prints it); older summaries' findings
  print only the fold sd, which is no interval. At chance (`chance.at_chance`) the report withholds the probe
  ("at chance", or "underpowered" where the probes finding says its interval is too wide): not compared.
- attribution: each method's `mean_tau_attention_<m>` with its t interval over `n_tau_attention_<m>` examples
  (`std_tau_attention_<m>`), clipped to [-1, 1], as the finding prints it; integrated gradients by
  analyses/attribution/convergence.py's rule (`ig_use`), as the finding: over its converged examples where only those
  are used (n in "converged examples"), not compared where its report leaves it out.
- mlp: the highest layer's `agreement_per_layer` (plots_mlp.best_layer) with its Wilson interval over that layer's
  `n_memories_per_layer` (every expert's neurons on a mixture of experts; older summaries: `n_neurons_per_layer`);
  not compared, as not the same quantity, where the runs' highest layers differ or they looked at different numbers
  of prefixes (mlp_apart, review 13c A2).
- verdict headlines (VERDICTS, review 12b A8): kv's holding budget per policy ("from 8 positions", with each budget's
  verdict where they differ) and mlp's between-layer verdict (plots_mlp.between_layers): the same words, a
  difference, or not compared.
- attribution, mlp and kv at or below chance (the summary's `chance` record, the findings' own test): their reports
  state what was measured only, so neither run's taus, agreement or full-cache metric are compared (withheld_at_chance),
  as patching and position are not (compare_run.chance_refusal).
- attribution's saliency tau (the finding's first number) and attention rollout's taus, by the same rule (14b-v C2);
  rollout's without an interval where the finding states them without one (raw taus weak: its paired sentence).
- patching: the clean and corrupted prompts' mean metric with their t intervals over metric_n (14b-v C2).
- kv: the cache size (an exact count: the same, or a difference said to be the dtype's where it is), the attention on
  the first token per layer judged layer by layer by its recorded 95% intervals, and the sink layers (14b-v C2).
- circuits (review 14b C1): MIB's CPR and CMD with their bootstrap intervals, DLA's totals of the heads and MLPs with
  their t intervals, and the DLA top writer (with its ties) judged by the writers' intervals (_dla_top_note).
Every quantity lands in one list (review 14b C1): within noise or equal at the shown precision (SAME: the page's
"Within noise or the same"), beyond noise (a difference), or not compared with why; no 5% rule. kv budget verdicts
that differ only where one run's grid has no such budget, or only on one evicting prompt, are not compared (14b C2).
Patching, position and pruning are compared in their own sections (reports/compare.py, compare_heads.py). Attribution's
permutation and adversarial tests, patching's attribution-vs-exact r, kv's first-key norm ratio and the first-token
attention of kv and position are compare_measures.py's (MORE, paired by label; sink_note, norm_note, more_notes).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headscope.analyses.attribution.convergence import ig_use
from headscope.analyses.core.chance import does_not_copy, metric_ci
from headscope.reports.attribution_words import gradient_rounds, loo_rounds
from headscope.reports.compare_measures import (
    MORE,
    SINK_LABEL,  # noqa: F401 (the kv sink labels, read by the tests here)
    SINK_VERDICT,  # noqa: F401
    measure_apart,
    measure_withheld,
    more_notes,
    norm_note,
    paired,
    r_verdict,
    sink_note,
    site_not_run,
)
from headscope.reports.compare_notes import _dla_top_note, _kv_size_note, _n_text, dla_top
from headscope.reports.compare_run import NOT_COMPARED, SAME, SIDES, Run, _number, noise_verdict, tasks_differ
from headscope.reports.compare_verdicts import VERDICTS, _verdict_notes
from headscope.reports.findings import _below, _chance, _words, ci_pair, ci_words, t_interval, wilson

NOT_STATED = " (its finding states no interval for it: whether this is beyond noise is not known)."


def _chance_entry(s: Mapping[str, Any]) -> Mapping[str, Any]:
    entry = s.get("chance")
    return entry if isinstance(entry, Mapping) else {}


Quantity = tuple[str, Any, "tuple[float, float] | None", Any, str]  # (label, value, its finding's interval, n, unit)


def _heads(s: Mapping[str, Any]) -> list[Quantity]:
    ci = ci_pair(metric_ci(_chance_entry(s)), ordered=True)  # the interval the heads finding prints (review 11b A1)
    return [(f"heads unpruned {_words(s.get('metric', 'metric'))}", s.get("baseline_metric"), ci, s.get("n_examples"),
             "examples")]


def _kv(s: Mapping[str, Any]) -> list[Quantity]:
    """The full-cache metric with its 95% t interval over the examples where the summary records it (review 14b C4:
    metric_unevicted_ci, which the finding prints; older runs: none); at chance it is not compared."""
    return [(f"kv full-cache {_words(s.get('metric', 'metric'))}", s.get("metric_unevicted"),
             ci_pair(s.get("metric_unevicted_ci"), ordered=True), s.get("n_examples"), "examples")]


def probe_unit(s: Mapping[str, Any]) -> str:
    """"token positions" where each probe example is a token of the shipped sentences (the summary's example_unit and
    shipped_text, as its finding and provenance say "816 token positions of 64 sentences"), else "examples"
    (verification 11b N8: compare called 2375 token positions "examples")."""
    text = s.get("shipped_text")
    sentences = text.get("n_sentences") if isinstance(text, Mapping) else None
    return "token positions" if s.get("example_unit") == "examples" and isinstance(sentences, int) and sentences else \
        "examples"


def _probes(s: Mapping[str, Any]) -> list[Quantity]:
    metric = s.get("metric", "accuracy")
    ci = ci_pair(s.get("best_ci"), ordered=True)
    return [(f"probes best {'R^2' if metric == 'r2' else _words(metric)}", s.get(f"best_{metric}"), ci,
             s.get("n_examples"), probe_unit(s))]


TAU_METHODS = (("saliency", "saliency"), ("gradient", "gradient x input"), ("loo", "leave-one-out"),
               ("ig", "integrated gradients"))  # review 14b-v C2: saliency is the finding's first tau


def _attribution(s: Mapping[str, Any]) -> list[Quantity]:
    """Each method's mean Kendall tau of last-layer attention and of attention rollout with the t interval the
    attribution finding prints: over the examples with a defined tau (n_tau_<attention|rollout>_<method>, else
    n_examples), clipped to [-1, 1] (reports/attribution_words.py). Rollout's taus carry no interval where the finding
    states them without one (raw attention's taus against every reference under WEAK_TAU: its paired sentence)."""
    from headscope.reports.attribution_words import WEAK_TAU

    n = s.get("n_examples")
    rule = ig_use(s)
    raw = [abs(float(s[f"mean_tau_attention_{k}"])) for k, _ in TAU_METHODS[1:]
           if _number(s.get(f"mean_tau_attention_{k}")) and not (k == "ig" and rule.mode == "none")
           and not (k == "loo" and loo_rounds(s)) and not (k == "gradient" and gradient_rounds(s))]
    weak = bool(raw) and max(raw) < WEAK_TAU  # the finding's own test (attribution_words.finding)
    out = []
    for kind, of in (("attention", "attention"), ("rollout", "attention rollout")):
        for key, name in TAU_METHODS:
            label = f"attribution mean Kendall tau of {of} and {name}"
            if key == "gradient" and gradient_rounds(s):  # left out as rounding, its taus undefined where all tie
                out.append((label, None, None, n, "examples"))
                continue
            if kind == "rollout" and not _number(s.get(f"mean_tau_rollout_{key}")):
                continue  # an older summary without rollout's taus: its finding states none
            if key == "ig" and rule.mode == "none":  # its report leaves IG out (the finding): a blank the page explains
                out.append((label, None, None, rule.n_converged, "converged examples"))
                continue
            if key == "loo" and loo_rounds(s):  # its report leaves leave-one-out out: most of its scores are rounding
                out.append((label, None, None, n, "examples"))
                continue
            mean, sd = s.get(f"mean_tau_{kind}_{key}"), s.get(f"std_tau_{kind}_{key}")
            partial = key == "ig" and rule.mode == "converged"
            defined = s.get(f"n_tau_{kind}_{key}") or (rule.n_converged if partial else n)
            ci = t_interval(float(mean), float(sd), int(defined)) if _number(mean) and _number(sd) and _number(defined) \
                else None
            if kind == "rollout" and weak:
                ci = None
            out.append((label, mean, ci and (max(-1.0, ci[0]), min(1.0, ci[1])), defined,
                        "converged examples" if partial else "examples"))
    return out


def withheld_quantity(name: str, label: str, s: Mapping[str, Any]) -> str:
    """How the report of analysis `name` withholds one of its quantities ("" where it states it): attribution's
    integrated gradients where convergence.py's rule leaves it out; circuits' MIB CPR/CMD over a gap within noise."""
    if name == "attribution" and "leave-one-out" in label and loo_rounds(s):
        entry = s["loo_rounding"]
        return (f"leaves leave-one-out out ({entry.get('n_within')} of {entry.get('n_scores')} of its scores are within "
                f"one {entry.get('dtype')} rounding step of the logits)")
    if name == "attribution" and "gradient x input" in label and gradient_rounds(s):  # review 18e A1
        entry = s["gradient_rounding"]
        return (f"leaves gradient x input out ({entry.get('n_within')} of {entry.get('n_scores')} of its scores are "
                f"within its {entry.get('dtype')} rounding floor)")
    if name == "circuits" and label.startswith("circuits MIB") and isinstance(s.get("gap_within_noise"), Mapping):
        gap = s["gap_within_noise"]  # review 14b A4: ratios over a gap within noise, which the finding does not report
        return f"withholds MIB's CPR and CMD, ratios over a clean-corrupted gap within noise ({gap.get('reason')})"
    if name != "attribution" or "integrated gradients" not in label:
        return ""
    rule = ig_use(s)
    if rule.mode != "none":
        return ""
    why = ("its IG taus include examples that missed completeness" if rule.legacy else
           f"it converged on {rule.n_converged} of {rule.n or '?'} examples")
    return f"leaves integrated gradients out ({why})"


def _patching(s: Mapping[str, Any]) -> list[Quantity]:
    """The clean and corrupted prompts' mean metric with the 95% t intervals the patching finding prints (review
    14b-v C2: "Clean prompts give ... -1.00054 (95% CI [-1.46, -0.545]), corrupted ones ..."), over metric_n prompts;
    none where the finding states none (a normalised metric's fixed 1 and 0, or no gap: patching_words._gap)."""
    from headscope.reports.patching_words import _gap

    stated = _gap(s) is not None
    metric = _words(s.get("metric", "metric"))
    return [(f"patching {which} prompts' {metric}", s.get(f"{which}_metric") if stated else None,
             ci_pair(s.get(f"{which}_metric_ci"), ordered=True), s.get("metric_n", s.get("n_examples")), "examples")
            for which in ("clean", "corrupted")]


MLP_LABEL = "mlp highest layer key-value agreement"


def _mlp(s: Mapping[str, Any]) -> list[Quantity]:
    """The highest layer's key-value agreement (plots_mlp.best_layer, the finding's rule) with the Wilson interval the
    mlp finding prints: k of n neurons, n that layer's memories (every expert's neurons on a mixture of experts:
    plots_mlp.memory_sizes) and k the recorded count (agreement_count_per_layer) or the rounded share."""
    from headscope.reports.plots_mlp import best_layer, memory_sizes, unit

    best = best_layer(s)
    if best is None:
        return []
    value = s["agreement_per_layer"][best]
    n = memory_sizes(s).get(str(best))
    counted = (s.get("agreement_count_per_layer") or {}).get(best)
    hits = int(counted) if _number(counted) else round(value * n) if _number(n) else None
    ci = wilson(hits, int(n)) if hits is not None and _number(n) and n > 0 else None
    return [(MLP_LABEL, value, ci, n, unit(s, best))]


def mlp_pairs(sa: Mapping[str, Any], sb: Mapping[str, Any]) -> list[tuple[Quantity, Quantity]]:
    """A's and B's highest-layer agreement as one pair, the label naming the layer where it is the same in both; a
    side without agreement is a blank (the line says which report states it). Whether the two are one quantity
    (one layer, one prefix count) is mlp_apart's."""
    from headscope.reports.plots_mlp import best_layer

    qa, qb = _mlp(sa), _mlp(sb)
    if not (qa or qb):
        return []
    la, lb = best_layer(sa), best_layer(sb)
    label = f"{MLP_LABEL} (layer {la} in both)" if la == lb else MLP_LABEL
    blank = (label, None, None, None, "neurons")
    return [((label, *qa[0][1:]) if qa else blank, (label, *qb[0][1:]) if qb else blank)]


def mlp_apart(sa: Mapping[str, Any], sb: Mapping[str, Any]) -> str:
    """Why A's and B's highest-layer agreement are not one quantity, '' where they are as far as the summaries tell
    (review 13c A2: A's layer 2 over 9,984 prefixes was set against B's layer 1 over 1,248 as a difference "beyond
    noise"): the highest layers differ (each finding's number is of other neurons; the other run's finding states no
    interval at this run's layer), or the runs looked at different numbers of prefixes (the agreement counts
    neurons whose triggers lie among the prefixes, so fewer prefixes find fewer: a setting, not the model)."""
    from headscope.reports.plots_mlp import best_layer

    why = []
    la, lb = best_layer(sa), best_layer(sb)
    if la is not None and lb is not None and la != lb:
        why.append(f"the highest layers differ (A's is layer {la}, B's layer {lb}), so each finding's agreement is of "
                   "other neurons")
    pa, pb = sa.get("n_prefixes"), sb.get("n_prefixes")
    if _number(pa) and _number(pb) and pa != pb:
        ta, tb = sa.get("n_task_examples"), sb.get("n_task_examples")
        tasks = f" of {ta} vs {tb} task examples" if _number(ta) and _number(tb) and ta != tb else ""
        why.append(f"the runs looked at {pa:,} vs {pb:,} prefixes{tasks}, a setting, not the model: the agreement "
                   "counts neurons whose triggers lie among the prefixes, so fewer prefixes find fewer")
    return "; ".join(why)


# the headline's verdict: a budget, whether the layers differ; equal verdicts are the same headline)]


def _circuits(s: Mapping[str, Any]) -> list[Quantity]:
    """MIB's CPR and CMD with the bootstrap intervals the circuits finding prints (over mib_n_examples), and DLA's
    per-example totals of the heads and of the MLPs with their t intervals (review 14b C1: never compared)."""
    n = s.get("mib_n_examples", s.get("edges_n_examples"))
    out = [(f"circuits MIB {name}", s.get(f"mib_{key}"), ci_pair(s.get(f"mib_{key}_ci"), ordered=True), n, "examples")
           for key, name in (("cpr", "CPR"), ("cmd", "CMD"))]
    for key, name in (("heads", "heads"), ("mlps", "MLPs")):
        e = s.get(f"dla_total_{key}")
        e = e if isinstance(e, Mapping) else {}
        out.append((f"circuits DLA total of the {name}", e.get("mean"), ci_pair(e.get("ci"), ordered=True),
                    e.get("n", s.get("n_examples")), "examples"))
    return out


QUANTITIES = {"heads": _heads, "attribution": _attribution, "mlp": _mlp, "kv": _kv,
              "probes": _probes, "circuits": _circuits,
              "patching": _patching}  # analysis -> [(label, value, interval its finding prints, n, its unit)]


def withheld(name: str, s: Mapping[str, Any]) -> str:
    """How the report of analysis `name` withholds its headline ("" where it states it): a probe at chance, or
    underpowered where the probes finding says so (its own chance_sentence), with the numbers it gives."""
    entry = _chance_entry(s)
    if name != "probes":
        return ""
    best, majority = s.get(f"best_{s.get('metric', 'accuracy')}"), s.get("majority_baseline")
    if "chance" not in s and _number(best) and _number(majority) and best <= majority + 0.02:  # an older summary's rule
        return (f"calls the probe chance level ({_words(s.get('metric', 'accuracy'))} {best:.3g} against a majority "
                f"baseline of {majority:.3g}) and withholds it")
    if entry.get("at_chance") is not True:
        return ""
    verdict = "below chance" if entry.get("below_chance") is True else "at chance"
    from headscope.reports import plots_probes

    own = getattr(plots_probes, "chance_sentence", None)  # the probes finding's own opening, where it has one
    try:
        if own is not None and "underpowered" in own(entry, s):
            verdict = "underpowered (its interval cannot tell chance from a good probe)"
    except (TypeError, ValueError, KeyError, AttributeError):
        pass
    n = s.get("n_examples")
    said = _chance_numbers(entry, f"{n} {probe_unit(s)}" if n is not None else "")
    return f"calls the probe {verdict}" + (f" ({said})" if said else "") + " and withholds it"


def _chance_numbers(entry: Mapping[str, Any], count: str) -> str:
    """'<metric> m against chance c, 95% CI [a, b], <count>' (at the record's ci_level): the numbers a chance
    record gives, as a report that withholds its finding at chance states them (count: e.g. '16 examples'; '' for none)."""
    numbers = [f"{_words(entry.get('metric', 'score'))} {entry['mean']:.3g}" if _number(entry.get("mean")) else ""]
    if _number(entry.get("chance_value")):
        numbers[0] = f"{numbers[0]} against chance {entry['chance_value']:.3g}".strip()
    if (ci := ci_pair(entry.get("ci"), ordered=True)) is not None:
        level = entry.get("ci_level")  # a Bonferroni-corrected record's own level (review 15av C1)
        numbers.append(ci_words(ci, ".3g", level if _number(level) else 0.95))
    numbers.append(count)
    return ", ".join(x for x in numbers if x)


CHANCE_WITHHELD = ("attribution", "mlp", "kv", "circuits")  # their findings report what was measured only at chance (_chance)


def withheld_at_chance(name: str, s: Mapping[str, Any]) -> str:
    """How the report of analysis `name` (CHANCE_WITHHELD) withholds every relative finding, its headlines among them,
    because its summary's chance record says the model is at or below chance on that analysis's task (the finding's
    own test, findings._chance), with the numbers that record gives; "" otherwise (verification 11b N2: compare
    set taus and agreements against each other that both reports withheld)."""
    entry = _chance(s) if name in CHANCE_WITHHELD else None
    if entry is None:
        return ""
    verdict = ("says the model does not do its task (accuracy 0 on a copy task)" if does_not_copy(entry) else
               f"calls the model {'below' if _below(entry) else 'at'} chance on "
               + (f"task {entry['task']}" if isinstance(entry.get("task"), str) else "its task"))  # as its finding
    n = entry.get("n_examples", s.get("n_examples"))
    said = _chance_numbers(entry, f"{n} examples" if _number(n) else "")
    return verdict + (f" ({said})" if said else "") + " and withholds its relative findings"


def tau_n_text(sa: Mapping[str, Any], sb: Mapping[str, Any], label: str, na: Any, nb: Any) -> str:
    """Where both runs scored the same number of examples but one method's tau is defined on fewer of them in one run
    (review 11a A3: not "a setting"), the n and why, from that run's own record: the examples where the method gives
    every token the same score (attribution summary n_tied_scores_<key>), else too few tokens to rank; "" otherwise."""
    n = sa.get("n_examples")
    if na == nb or n != sb.get("n_examples") or not isinstance(n, int):
        return ""
    key, name = next(((k, m) for k, m in TAU_METHODS if label.endswith(m)), (None, None))
    if key is None:
        return ""
    said = []
    for side, s, d in zip(SIDES, (sa, sb), (na, nb)):
        if not isinstance(d, int) or d >= n:
            continue
        tied = min(int(s.get(f"n_tied_scores_{key}") or 0), n - d)
        why = [f"{name} gives every token the same score on {tied}"] if tied else []
        rest = n - d - tied
        why += [(f"on {rest}, last-layer attention gives every token the same weight or there are too few tokens to "
                 "rank" if s.get("n_tied_scores_attention") else
                 f"{rest} {'has' if rest == 1 else 'have'} too few tokens to rank")
                if "n_tied_scores_" + key in s else f"its record does not say why for the other {rest}"] if rest else []
        said.append(f"{side} has a tau on {d} of {n} examples ({' and '.join(why)})")
    return f"n differs: {na} vs {nb} of the same {n} examples: " + "; ".join(said) + "; intervals of other widths"


def _joined(labels: list[str]) -> str:
    """'attribution mean Kendall tau of attention and gradient x input, leave-one-out and integrated gradients':
    labels that share their first words said once."""
    if len(labels) < 2:
        return "".join(labels)
    words = [label.split(" ") for label in labels]
    k = 0
    while all(len(w) > k + 1 and w[k] == words[0][k] for w in words):
        k += 1
    tails = [" ".join(w[k:]) for w in words]
    head = " ".join(words[0][:k])
    return (head + " " if head else "") + ", ".join(tails[:-1]) + " and " + tails[-1]


def _metrics_differ(name: str, sa: Mapping[str, Any], sb: Mapping[str, Any]) -> str:
    ma, mb = sa.get("metric"), sb.get("metric")
    if isinstance(ma, str) and isinstance(mb, str) and ma != mb:
        return f"A's {name} measures {_words(ma)}, B's {_words(mb)}"
    return ""


def headline_notes(a: Run, b: Run) -> list[str]:
    """Per analysis in QUANTITIES that both runs have: not compared (NOT_COMPARED) where the runs ran it on different
    tasks (compare_run.tasks_differ) or, its labels equal, with different metrics, or where either report withholds
    its number (the family's or one quantity's: attribution, mlp, kv and circuits at or below chance,
    withheld_at_chance), else the verdict of the intervals the findings print with the n: within noise (SAME) or
    beyond; without an interval, SAME where equal at the shown precision, else not compared (review 14b C1)."""
    notes = []
    for name, quantity in QUANTITIES.items():
        sa, sb = a.summary(name), b.summary(name)
        if sa is None or sb is None:
            continue
        qa_list, qb_list = quantity(sa), quantity(sb)
        # one label each (probes' accuracy against R^2: said to differ), else by label: a quantity one side lacks (an
        # older summary's rollout taus) is said, not dropped by the shorter list
        pairs = list(zip(qa_list, qb_list)) if len(qa_list) == len(qb_list) else paired(qa_list, qb_list)
        same_labels = all(qa[0] == qb[0] for qa, qb in pairs)
        if name in MORE:  # the permutation and adversarial tests, patching's r per site type: paired by label
            pairs += paired(MORE[name](sa), MORE[name](sb))
        differ = tasks_differ(a, b, name) or (_metrics_differ(name, sa, sb) if same_labels else "")
        if name == "kv":  # stated at chance too (what was measured), the size whatever the task (review 14b-v C2)
            from headscope.reports.compare_run import rounding_dtypes

            pair = rounding_dtypes(a, b, name)  # verification 17v C3: one model in two dtypes: rounding, as every row
            notes += _kv_size_note(sa, sb) + sink_note(sa, sb, tasks_differ(a, b, name), rounding=pair) + \
                norm_note(sa, sb, tasks_differ(a, b, name), rounding=pair)
        said = [v[0] for v in VERDICTS.get(name, lambda _: [])(sa)]  # the verdict headlines, by label
        said += [v[0] for v in VERDICTS.get(name, lambda _: [])(sb) if v[0] not in said]
        said += ["circuits DLA top writer"] if name == "circuits" and (dla_top(sa) or dla_top(sb)) else []
        if differ:  # another task (or metric): no number of one is set against the other's
            labels = [qa[0] for qa, qb in pairs if _number(qa[1]) or _number(qb[1])] + said
            if labels:
                notes.append(NOT_COMPARED + f"{_joined(labels)}: not compared: {differ}.")
            continue
        at_chance = [f"{side}'s report {why}" for side, s in zip(SIDES, (sa, sb)) if (why := withheld_at_chance(name, s))]
        if at_chance:  # as compare_run.chance_refusal for patching and position: no number a report withholds
            labels = [qa[0] for qa, qb in pairs if _number(qa[1]) or _number(qb[1])] + said
            if labels:
                notes.append(NOT_COMPARED + f"{_joined(labels)}: not compared: " + "; ".join(at_chance) + ".")
            continue
        wide = [side for side, s in zip(SIDES, (sa, sb)) if isinstance(s.get("chance"), Mapping)
                and s["chance"].get("undetermined") is True]  # too few to tell from chance: each line says so (13b A2)
        caveat = (f"; {' and '.join(wide)}'s report{'s' * (len(wide) > 1)} cannot tell the model from chance on "
                  f"{'its' if len(wide) == 1 else 'their'} examples and read{'s' * (len(wide) == 1)} this with that caveat"
                  if wide else "")
        if name == "mlp":  # named by its layer where both runs' is one (review 13c A2); refused above by MLP_LABEL
            pairs = mlp_pairs(sa, sb)
        for (label, va, ia, na, unit), (label_b, vb, ib, nb, unit_b) in pairs:
            n = (name == "attribution" and unit == unit_b == "examples" and tau_n_text(sa, sb, label, na, nb)
                 or _n_text(na, nb, unit, unit_b)) + caveat
            own = [f"{side}'s report {why}" for side, s, lab in zip(SIDES, (sa, sb), (label, label_b))
                   if (why := withheld_quantity(name, lab, s) or measure_withheld(name, lab, s))]
            unrun = [f"{side}'s report {why}" for side, s, run, v in zip(SIDES, (sa, sb), (a, b), (va, vb))
                     if not _number(v) and (why := site_not_run(name, label, s, run))]
            if unrun:  # the site never ran on one side: that reason first, the other side's n as its own (16b C1)
                stated = [f"n {x} {unit} in {side}" for side, x, v in zip(SIDES, (na, nb), (va, vb)) if _number(v)]
                notes.append(NOT_COMPARED + f"{label}: not compared: " + "; ".join(unrun + own)
                             + (f" ({stated[0]})" if stated else "") + ".")
                continue
            if own:  # said even where both reports leave it out: each report's reason
                notes.append(NOT_COMPARED + f"{label}: not compared: " + "; ".join(own) + f" ({n}).")
                continue
            if not (_number(va) and _number(vb)):  # one report states it, the other not: said, never dropped
                if _number(va) or _number(vb):
                    stated = na if _number(va) else nb  # a blank side has no n of its own: the stating side's n
                    said = n if na is not None and nb is not None else f"n {stated} {unit}{caveat}"
                    notes.append(NOT_COMPARED + f"{label}: not compared: only {'A' if _number(va) else 'B'}'s report "
                                 f"states it ({said}).")
                continue
            refusals = [f"{side}'s report {why}" for side, s in zip(SIDES, (sa, sb)) if (why := withheld(name, s))]
            if refusals:
                notes.append(NOT_COMPARED + f"{label}: not compared: " + "; ".join(refusals) + f" ({n}).")
                continue
            if label != label_b:
                notes.append(NOT_COMPARED + f"{name}: not compared: A states {label}, B {label_b}.")
                continue
            if apart := (mlp_apart(sa, sb) if name == "mlp" else measure_apart(name, label, sa, sb, a, b)):
                notes.append(NOT_COMPARED + f"{label}: not compared, not the same quantity: {apart} (A {va:.3g}, "
                             f"B {vb:.3g}; {n}).")  # review 13c A2: no difference of two quantities
                continue
            from headscope.reports.compare_run import precision_verdict as rounding_pair  # review 17d B3: one model,
            one_model = rounding_pair(a, b, name, va, vb, label) is not None  # two dtypes: r's gap is rounding too
            if unit == unit_b == "cells" and ia is not None and ib is not None and not one_model:  # two r's: Fisher
                verdict = r_verdict(va, vb, int(na), int(nb))
                notes.append((SAME if verdict.startswith(" (within noise") else "") + f"{label}: A {va:.3f}, B "
                             f"{vb:.3f} ({n})" + verdict)
                continue
            from headscope.reports.compare_run import rounding_note

            if (rounding := rounding_note(a, b, name, label, va, vb, n)) is not None:  # review 15c B3: one model, two
                notes.append(rounding)  # dtypes; 17b B1: a short note in the page's rounding group
                continue
            if f"{va:.3g}" == f"{vb:.3g}" and (ia is None or ib is None):  # equal as the findings print them
                notes.append(SAME + f"{label}: A {va:.3g}, B {vb:.3g} ({n}): equal at the shown precision (3 "
                             "significant figures)" + ("." if ia is None and ib is None else
                                                        f"; {ci_words(ia or ib, '.3g')} in {'A' if ia else 'B'}."))
                continue
            if ia is None or ib is None:  # review 13c A3: a noise "not known" is no difference: not compared, and why
                why = NOT_STATED if ia is None and ib is None else (
                    f" (the finding of {'A' if ia is None else 'B'} states no interval for it: whether this is beyond "
                    "noise is not known).")
                notes.append(NOT_COMPARED + f"{label}: not compared: A {va:.3g}, B {vb:.3g} ({n})" + why)
                continue
            verdict = noise_verdict(va, vb, ia, ib)  # review 14b C1: a small difference is listed as within noise
            notes.append((SAME if verdict.startswith(" (within noise") else "") + f"{label}: A {va:.3g}, B {vb:.3g} "
                         f"({n})" + verdict)
        notes += _verdict_notes(name, sa, sb, a, b) + (_dla_top_note(sa, sb) if name == "circuits" else [])
    return notes + more_notes(a, b)
