"""Findings in words, shared: what every family's finding and caption is built from, and the lookups.

Each family states its own headline in its plotting module, reports/plots_<name>.py `finding(summary)
-> str` (found through reports/families.py), with its figures' captions (`CAPTIONS`) beside the
figures they describe; this module holds what they share: number formatting, intervals (t, Wilson,
Fisher), metric words, the chance entry and its sentence, and the two lookups the pages use,
`finding(name, summary)` and `caption(stem)`. A finding states the headline numbers of its analysis
and says so when the result carries no information (a model at chance, a flat curve at its ceiling,
a layer whose attention changes nothing). The text is plain (no markup): callers escape it.

A summary's "chance" entry (analyses/core/chance.py, added by the registry) decides whether the
model is at chance on the task: then `finding` opens with that and the findings stated relative to
the clean metric (heads prunable or L0-kept "within 1%", kv budgets "within 1%" of the full cache,
patching effects as shares of the clean-corrupted gap) are left out, and so is every ranking,
correlation or shape claim read off the task's metric: attribution, patching, position and mlp then
state what was measured (n, methods, sites, settings) and nothing read from it. Summaries without
the entry (older results) keep the logit-difference heuristic `_at_chance`.

A finding claims only what its numbers carry (REFERENCES.md, "Claims a reviewer accepts"): each
states its n; a mean tau carries its t interval, a fraction its Wilson interval, a correlation its
Fisher interval and how many points it rests on, and its least-squares slope (attribution on exact) its
t interval; DLA writers carry their t intervals over examples and tie when their paired difference's does
not exclude 0; a shape (U-shape, neglected middle) is claimed only
when the bootstrap intervals of the positions it contrasts separate; importance that is rounding
(the heads summary's degenerate_<method>) or top heads that tie are said so and not ranked; a
budget or lens layer is named in the figure's own terms (the whole prompt, "after block l").
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from headscope.analyses.core.chance import MIN_SYSTEMATIC_EXAMPLES, does_not_copy, metric_ci, t_half_width
from headscope.models.hooked_model import and_join as and_join  # lists in words, re-exported for the families' words

CHANCE_LOGIT_DIFF = 0.1  # |logit(answer) - logit(wrong)| below this: the model does not prefer the answer


def _num(value: Any) -> float | None:
    """A finite float, or None for missing, NaN, inf and non-numbers."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def ci_pair(value: Any, *, ordered: bool = False) -> tuple[float, float] | None:
    """A recorded interval as (low, high) floats: a list or tuple of two finite numbers (`_num`), else None (missing,
    one end, NaN, a bool). ordered=True also asks low <= high, for callers that read its width (compare's noise)."""
    if not (isinstance(value, (list, tuple)) and len(value) == 2):
        return None
    low, high = _num(value[0]), _num(value[1])
    if low is None or high is None or (ordered and low > high):
        return None
    return low, high


def attention_kind(n_heads: Any, n_kv_heads: Any) -> str | None:
    """How query heads share keys and values: "multi-query" where one KV head serves them all (Shazeer 2019),
    "grouped-query" where 1 < n_kv_heads < n_heads, None for multi-head attention or counts not recorded (review 9b
    C2: the kv section, k/v patching and the header name it alike)."""
    heads, kv = _num(n_heads), _num(n_kv_heads)
    if heads is None or kv is None or not 0 < kv < heads:
        return None
    return "multi-query" if kv == 1 else "grouped-query"


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ..., 11th-13th, 21st."""
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _pct(fraction: float) -> str:
    return f"{100 * fraction:.0f}%"


FEW = 10  # fewer examples than this: a rate or a mean is stated with the warning that it is too few to generalise


def t_interval(mean: float, sd: float | None, n: int, level: float = 0.95) -> tuple[float, float] | None:
    """Student-t interval of a mean from the sample sd and n a summary records (None when n < 2 or sd is
    unknown): chance.t_half_width about the mean."""
    if sd is None or n < 2 or not math.isfinite(sd):
        return None
    half = t_half_width(sd, n, alpha=1 - level)
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


def level_words(level: float | None) -> str:
    """'95%', '98.3%': an interval's level as computed, to 3 significant figures (a Bonferroni-corrected
    1 - 0.05/3 is 98.3%, not '98%': review 15av C1); None: 95%."""
    return f"{100 * (0.95 if level is None else float(level)):.3g}%"


def ci_words(interval: tuple[float, float], fmt: str = ".2f", level: float = 0.95) -> str:
    """'95% CI [a, b]': an interval as every finding states it (the bounds in `fmt`; level as level_words)."""
    return f"{level_words(level)} CI [{interval[0]:{fmt}}, {interval[1]:{fmt}}]"


def _ci(interval: tuple[float, float] | None, fmt: str = ".2f") -> str:
    """', 95% CI [a, b]' to follow a number, or '' without an interval."""
    return f", {ci_words(interval, fmt)}" if interval else ""


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
    """Whether the whole interval lies under chance (older entries: from their CI); never for a copy task the
    model does not do (chance.does_not_copy: accuracy 0 there is no preference)."""
    if does_not_copy(entry):
        return False
    if isinstance(entry.get("below_chance"), bool):
        return entry["below_chance"]
    ci, level = entry.get("ci"), _num(entry.get("chance_value"))
    return (isinstance(ci, (list, tuple)) and len(ci) == 2 and _num(ci[1]) is not None and level is not None
            and ci[1] < level)


OWN_CHANCE = ("the model's own mean log-probability over its vocabulary at the same positions, not log(1/V), "
              "under which every token of an uneven model falls (Jensen)")


WRONG_CHANCE = ("the same rows' wrong answers' mean log-probability: no preference on average between the answer and the wrong "
                "answer")


def odds_words(entry: Mapping[str, Any]) -> str:
    """Where the chance of an answer log-probability is its wrong answer's (chance.against_wrong_answers): 'log-odds
    of the answer against the wrong answer -0.538, 95% CI [-1.05, -0.027], the answer ahead on 17 of 40 rows'; ''
    otherwise."""
    margin = entry.get("margin")
    if entry.get("chance_from") != "wrong_answers" or not isinstance(margin, Mapping) or _num(margin.get("mean")) is None:
        return ""
    ci = margin.get("ci")
    return (f"log-odds of the answer against the wrong answer {margin['mean']:+.3g}"
            + (f", {ci_words(ci, '.3g')}" if ci_pair(ci) is not None else "")
            + (f", the answer ahead on {margin['n_above']:.0f} of {margin['n']:.0f} rows"
               if _num(margin.get("n_above")) is not None and _num(margin.get("n")) else ""))


def spread_words(entry: Mapping[str, Any]) -> str:
    """Review 17c B2: where a logit difference's mean is near chance but its rows are far from it (mean |difference|
    at least chance.STRONG_LOGIT and twice |mean - chance|), the rows' size and what the mean's test says (review 18a
    B2: "strong preferences either way that cancel on average" for a mean |ld| of 1.03 whose mean leaned to the wrong
    answer at p = 0.10): 'mean |logit difference| 1.03 (odds about 2.8:1 one way or the other), 19 of 40 rows at +-1
    or beyond: the rows prefer one answer or the other; their mean, on the wrong answer's side, does not differ from 0
    at 95% (t test p = 0.098)'; '' otherwise or for entries without it."""
    from headscope.analyses.core.chance import STRONG_LOGIT

    size, mean, level = _num(entry.get("mean_abs")), _num(entry.get("mean")), _num(entry.get("chance_value"))
    if entry.get("metric") != "logit_diff" or size is None or mean is None or level is None:
        return ""
    if size < STRONG_LOGIT or size < 2 * abs(mean - level):
        return ""
    n, strong, p = _num(entry.get("n_examples")), _num(entry.get("n_strong")), _num(entry.get("p_value"))
    rows = f", {strong:.0f} of {n:.0f} rows at +-{STRONG_LOGIT:g} or beyond" if n and strong is not None else ""
    side = "" if mean == level else f", on the {'wrong ' if mean < level else ''}answer's side,"
    level_words = f"{100 * (_num(entry.get('ci_level')) or 0.95):.0f}%"
    test = f" (t test p = {p:.2g})" if p is not None else ""
    floor, effect = _num(entry.get("floor")), _num(entry.get("effect_size"))
    if p is not None and p < 1 - (_num(entry.get("ci_level")) or 0.95):  # at chance by a rule other than the test
        verdict = f"differs from 0{test}" + (
            f", by less than the {floor:g}-logit floor" if floor is not None and abs(mean - level) < floor else
            f", by {abs(effect):.2f} per-row standard deviations, under 0.2" if effect is not None and abs(effect) < 0.2
            else "")
    else:
        verdict = f"does not differ from 0 at {level_words}{test}"
    return (f"mean |logit difference| {size:.3g} (odds about {math.exp(size):.2g}:1 one way or the other){rows}: "
            f"the rows prefer one answer or the other; their mean{side} {verdict}")


def chance_basis(entry: Mapping[str, Any]) -> str:
    """What the chance value is computed from, in words ("" when the entry does not say): one metric's
    chance differs across tasks (answer length, vocabulary, number of answers)."""
    metric, vocab = entry.get("metric"), _num(entry.get("vocab_size"))
    tokens, classes = _num(entry.get("answer_tokens")), _num(entry.get("n_classes"))
    if metric == "logit_diff":
        return "no preference on average between the answer and the wrong answer"
    if metric == "logprob" and entry.get("chance_from") == "vocabulary_mean":
        return OWN_CHANCE
    if metric == "logprob" and entry.get("chance_from") == "wrong_answers":
        return WRONG_CHANCE
    if metric == "logprob" and vocab:
        if tokens is None or abs(tokens - 1) < 1e-9:
            return f"log(1/{vocab:.0f}): one answer token, uniform over a {vocab:.0f}-token vocabulary"
        return f"{tokens:.3g} x log(1/{vocab:.0f}): answers of {tokens:.3g} tokens on average, uniform over a " \
               f"{vocab:.0f}-token vocabulary"
    if metric == "accuracy" and classes and entry.get("classes_from") == "context":
        return f"1/{classes:.0f}: copying one of the {classes:.0f} values in the context"
    if metric == "accuracy" and classes:
        return f"1/{classes:.0f}: guessing among {classes:.0f} answers"
    if metric == "accuracy" and vocab:
        return f"1/{vocab:.0f}: guessing over a {vocab:.0f}-token vocabulary"
    if metric == "probe accuracy":
        return "the majority class's share"
    return ""


def per_row_chance(entry: Mapping[str, Any]) -> str:
    """Where each row has its own chance (chance.assess_per_row: answers of several lengths), the chance range and
    the paired margin that decides the verdict: 'against chance -6.12 to -42.8 per row (1-7 answer tokens, k x
    log(1/454) for k tokens); margin over each row's own chance +6.11 per answer token, 95% CI [6.11, 6.12], above it
    on 7 of 7 rows'; '' for one chance value (the entry's chance_value says it)."""
    span, margin = entry.get("chance_range"), entry.get("margin")
    if not (isinstance(span, (list, tuple)) and len(span) == 2 and None not in map(_num, span) and span[0] < span[1]):
        return ""
    tokens, vocab = entry.get("answer_tokens_range"), _num(entry.get("vocab_size"))
    how = []
    if isinstance(tokens, (list, tuple)) and len(tokens) == 2 and None not in map(_num, tokens):
        how.append(f"{tokens[0]:.0f}-{tokens[1]:.0f} answer tokens")
    if entry.get("metric") == "logprob" and entry.get("chance_from") == "vocabulary_mean":
        how.append(OWN_CHANCE)
    elif vocab and entry.get("metric") == "logprob":
        how.append(f"k x log(1/{vocab:.0f}) for k tokens")
    said = f"against chance {span[1]:.3g} to {span[0]:.3g} per row" + (f" ({', '.join(how)})" if how else "")
    if isinstance(margin, Mapping) and _num(margin.get("mean")) is not None:
        ci = margin.get("ci")
        ok = ci_pair(ci) is not None
        said += (f"; margin over each row's own chance {margin['mean']:+.3g}"
                 + (" per answer token" if margin.get("per_token") else "") + (f", {ci_words(ci, '.3g')}" if ok else "")
                 + (f", above it on {margin['n_above']} of {margin['n']} rows"
                    if _num(margin.get("n_above")) is not None and _num(margin.get("n")) else ""))
    return said


def _prompt_prior(entry: Mapping[str, Any]) -> str | None:
    """Below chance on a logit difference, against the corrupted prompts (chance.corrupted_baseline): 'below 0 by
    0.17 logits, and the corrupted prompts give a similar -0.126 (...): a preference among the answer tokens that
    does not depend on the prompt', or where the clean prompts sit clearly under the corrupted ones, the old
    verdict with both numbers; None where the entry has no corrupted prompts' numbers (older runs)."""
    mean, corrupt, paired = _num(entry.get("mean")), _num(entry.get("corrupted_mean")), entry.get("clean_minus_corrupted")
    if mean is None or corrupt is None or not isinstance(paired, Mapping) or _num(paired.get("mean")) is None:
        return None
    level = _num(entry.get("chance_value")) or 0.0

    def ci(x: Any) -> str:
        return ci_words(x, ".3g") if ci_pair(x) else "no CI"

    diff = (f"clean minus corrupted {paired['mean']:+.3g}, {ci(paired.get('ci'))}, paired over "
            f"{_num(paired.get('n')) or 0:.0f} prompts")
    span, floor = ci_pair(paired.get("ci")), _num(entry.get("floor"))
    inside = span is not None and span[0] <= 0 <= span[1]
    if entry.get("prompt_independent") is True:  # chance.corrupted_baseline: within noise, or under the floor in size
        diff += ": within noise" if inside else f", under the {floor:.3g}-logit effect floor" if floor is not None else ""
        return (f"below {level:.3g} by {level - mean:.2g} logits, and the corrupted prompts give a similar {corrupt:.3g} "
                f"({ci(entry.get('corrupted_ci'))}; {diff}): a preference among the answer tokens that does not depend on "
                "the prompt, not a response to it")
    return (f"worse than guessing, it systematically prefers the wrong answers, by {level - mean:.2g} logits (the "
            f"corrupted prompts give {corrupt:.3g}, {ci(entry.get('corrupted_ci'))}; {diff})")


def int_span(lo: int, hi: int) -> str:
    """"3" or "3-5": a range of counts or positions from its ends."""
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def int_ranges(values: Sequence[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8" (data rows, positions)."""
    spans: list[list[int]] = []
    for v in values:
        if spans and v == spans[-1][1] + 1:
            spans[-1][1] = v
        else:
            spans.append([v, v])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def said_of(details: Sequence[str]) -> str:
    """' (a, b)' of the chance sentence's details, '' without any."""
    return " (" + ", ".join(details) + ")" if details else ""


def chance_sentence(entry: Mapping[str, Any], name: str = "", shipped: Mapping[str, Any] | None = None) -> str:
    """'The model is at chance on task <t> (<metric> <mean> against chance <c> = <basis>, 95% CI [..]);
    relative findings are not reported.' Below chance (the whole CI under it) says so and what it
    means; probes: the probe, against its majority baseline. `shipped` (the summary's shipped_text): below
    chance on shipped sentences off the model's distribution claims no preference (verify 11b A4)."""
    details = []
    mean, level = _num(entry.get("mean")), _num(entry.get("chance_value"))
    basis = chance_basis(entry)
    ci, span = metric_ci(entry), per_row_chance(entry)
    if mean is not None and span:  # each row its own chance (answers of several lengths; chance.assess_per_row)
        details += [f"{_words(entry.get('metric', 'metric'))} {mean:.3g}"]
        details += [ci_words(ci, ".3g", _num(entry.get("ci_level")) or 0.95)] if ci else []
        details += [span]
    else:
        if mean is not None:
            details.append(f"{_words(entry.get('metric', 'metric'))} {mean:.3g}"
                           + (f" against chance {level:.3g}" if level is not None else "")
                           + (f" ({basis})" if basis and level is not None else ""))
        if ci:
            details.append(ci_words(ci, ".3g", _num(entry.get("ci_level")) or 0.95))
        details += [odds_words(entry)] if odds_words(entry) else []
        details += [spread_words(entry)] if spread_words(entry) else []
    below = _below(entry)
    where = "at" if not below else "below"
    task = entry.get("task")
    on = f"on task {task}" if isinstance(task, str) and task else "on this task"
    if isinstance(entry.get("read_at"), str):  # a masked LM's answers, read at its mask (chance.model_on_task)
        on += f", its answers read at {entry['read_at']}"
    if does_not_copy(entry):  # a copy task it does not do (chance.copy_task; review 10b A2)
        copied, outputs = _num(entry.get("copied_outputs")), _num(entry.get("outputs"))
        what = "never produces any of the context's values" if copied is not None else "never produces the gold value"
        unknown = [] if copied is not None else ["which of the context's values it produces instead is not recorded"]
        count = (f" (0 of {outputs:.0f} outputs" + "".join(f"; {d}" for d in [*details[:1], *unknown]) + ")" if outputs
                 else said_of([*details[:1], *unknown]))
        return (f"The model {what}{count}: it does not do {'task ' + task if isinstance(task, str) and task else 'this task'}, "
                "so its accuracy says nothing of a preference among the values; relative findings are not reported.")
    who = f"The probe scores {where} chance" if name == "probes" else f"The model is {where} chance {on}"
    said = said_of(details)
    if not below:  # copies that hold the gold value as often as chance allows: say so (chance.copy_task)
        why = f": {entry['reason']}" if _num(entry.get("gold_share")) is not None and entry.get("reason") else ""
        return f"{who}{said}{why}; relative findings are not reported."
    metric = entry.get("metric")
    if name == "probes":
        return (f"{who}{said}: the probe does worse than predicting the majority class (overfitting or class "
                "imbalance); relative findings are not reported.")
    n = _num(entry.get("n_examples"))
    if n is not None and n < MIN_SYSTEMATIC_EXAMPLES:  # too few to call a preference systematic (review 6, A7)
        return (f"{who}{said}: below chance on these {n:.0f} examples (too few to say it is systematic); relative "
                "findings are not reported.")
    if isinstance(shipped, Mapping) and shipped.get("off_distribution"):  # character-piece answers: no preference
        per, unknown = _num(shipped.get("tokens_per_word")), _num(shipped.get("unknown_words"))
        text = (f"text its tokenizer splits into {per:.1f} tokens a word" if per is not None else "text")
        text += f" with {unknown:.0f} unknown word{'s' * (unknown != 1)}" if unknown else ""
        return f"{who}{said}: below chance on {text}: not evidence of a preference; relative findings are not reported."
    prior = _prompt_prior(entry) if metric == "logit_diff" else None
    if prior:
        return f"{who}{said}: {prior}; relative findings are not reported."
    share, share_ci = _num(entry.get("gold_share")), entry.get("gold_share_ci")
    if share is not None and isinstance(share_ci, (list, tuple)) and len(share_ci) == 2:  # chance.copy_task
        return (f"{who}{said}: of its {_num(entry.get('copied_outputs')) or 0:.0f} outputs that copy one of the context's "
                f"values, {_num(entry.get('gold_outputs')) or 0:.0f} are the gold one ({share:.3g}{_ci(share_ci, '.3g')}): "
                "it systematically prefers the wrong values; relative findings are not reported.")
    own = entry.get("chance_from") in ("vocabulary_mean", "wrong_answers")
    if metric == "logprob" and not own:  # against log(1/V) (older runs): every token of an uneven model is below it
        return (f"{who}{said}: at or below chance: a model's log-probabilities fall below log(1/V) for every token "
                "(Jensen), so this does not show that the answers are dispreferred; relative findings are not reported.")
    why = ("worse than guessing, it systematically prefers the wrong answers"
           if metric == "logit_diff" or entry.get("chance_from") == "wrong_answers" else
           "it gives the answers less log-probability than its own average vocabulary token at the same positions, so "
           "they are systematically dispreferred" if metric == "logprob" else
           "it scores under a uniform guess, so its answers are systematically dispreferred")
    return f"{who}{said}: {why}; relative findings are not reported."



def undetermined_sentence(entry: Any) -> str:
    """Where the chance guard's interval is too wide to tell (chance.assess's "undetermined"; review 13b A2: "at chance"
    from 4 examples that the same run's 16 contradicted): 'On its 4 examples the logit difference (1.3, 95% CI [-0.735,
    3.34]) cannot be told from chance (0) on task recall: the interval is too wide to tell either way, so what follows
    is read with that caveat.'; '' otherwise."""
    if not isinstance(entry, Mapping) or entry.get("undetermined") is not True:
        return ""
    n, mean, level = _num(entry.get("n_examples")), _num(entry.get("mean")), _num(entry.get("chance_value"))
    ci = metric_ci(entry)
    task = entry.get("task")
    said = [f"{mean:.3g}"] if mean is not None else []
    said += [ci_words(ci, ".3g", _num(entry.get("ci_level")) or 0.95)] if ci else []
    what = _words(entry.get("metric", "metric")) + (f" ({', '.join(said)})" if said else "")
    return (f"On its {n:.0f} examples the {what} cannot be told from chance"
            + (f" ({level:.3g})" if level is not None else "")
            + (f" on task {task}" if isinstance(task, str) and task else "")
            + ": the interval is too wide to tell either way (it is not evidence that the model is at chance), so what "
              "follows is read with that caveat.") if n is not None else ""


def larger_sample_sentence(entry: Any, others: Mapping[str, Mapping[str, Any]]) -> str:
    """Where this section's guard cannot tell (undetermined), what the same report's larger sample of the same task
    and metric says (review 13b A2: attribution's 4 examples against heads' 16 at 2.54 [0.82, 4.25]): 'The heads
    section's 16 examples of the same task are above chance (logit difference 2.54, 95% CI [0.824, 4.25]).', the
    largest such sample first; '' where there is none. `others`: the other sections' summaries by name."""
    if not isinstance(entry, Mapping) or entry.get("undetermined") is not True:
        return ""
    n = _num(entry.get("n_examples")) or 0
    best = None
    for name, summary in others.items():
        other = summary.get("chance") if isinstance(summary, Mapping) else None
        if not (isinstance(other, Mapping) and other.get("task") == entry.get("task") is not None
                and other.get("metric") == entry.get("metric") and other.get("undetermined") is not True
                and (_num(other.get("n_examples")) or 0) > n):
            continue
        if best is None or other["n_examples"] > best[1]["n_examples"]:
            best = (name, other)
    if best is None:
        return ""
    name, other = best
    verdict = ("below chance" if _below(other) else "at chance") if other.get("at_chance") is True else "above chance"
    ci, mean = metric_ci(other), _num(other.get("mean"))
    said = [f"{_words(other.get('metric'))} {mean:.3g}"] if mean is not None else []
    said += [ci_words(ci, ".3g", _num(other.get("ci_level")) or 0.95)] if ci else []
    return (f"The {name} section's {other['n_examples']:.0f} examples of the same task are {verdict}"
            + (f" ({', '.join(said)})" if said else "") + ".")


def finding(name: str, summary: Mapping[str, Any]) -> str:
    """The headline of one analysis ("" when there is none): its family's `finding` (reports/plots_<name>.py),
    opened by the shipped-sentence note where an encoder ran on sentences its tokenizer splits into pieces or
    unknown words (summary["shipped_text"]) and by the chance sentence when the model is at chance, and first of all
    by the one-token-rows sentence where hs.run_analysis ran it on those rows only (summary["task_used"],
    provenance.subset_sentence); never raises on an odd summary."""
    text = _finding(name, summary)
    used = summary.get("task_used")
    if isinstance(used, str) and text and not text.startswith("Skipped"):
        from headscope.reports.provenance import subset_sentence

        said = subset_sentence(used)
        text = f"{said} {text}" if said else text
    return text


def _finding(name: str, summary: Mapping[str, Any]) -> str:
    if "skipped" in summary and name not in ("patching", "circuits"):
        return f"Skipped: {summary['skipped']}"
    try:
        from headscope.reports.families import presentation  # each family's finding (reports/families.py)

        shown = presentation(name)
        text = shown.finding(summary) if shown is not None else ""
        fit = summary.get("shipped_text")
        if isinstance(fit, Mapping) and isinstance(fit.get("note"), str):  # text the model was not trained on
            text = f"{fit['note'][0].upper()}{fit['note'][1:]}. {text}".strip()
        entry = _chance(summary)
        if entry is None:
            wide = undetermined_sentence(summary.get("chance"))
            return f"{wide} {text}".strip() if wide and text else text
        own = shown.chance_sentence if shown is not None else None  # a family's own opening (probes: underpowered)
        said = own(entry, summary) if own else chance_sentence(entry, name, summary.get("shipped_text"))
        return f"{said} {text}".strip()
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError):
        return ""


def caption(stem: str, summary: Mapping[str, Any] | None = None) -> str:
    """What to read from the figure `stem` and its units ("" for an unknown figure): with the run's `summary`, the
    drawing family's caption_for(stem, summary) where it gives one (units that follow the run); else the CAPTIONS of
    the module that draws it, else the PREFIX_CAPTIONS entry its name starts with (then "Site: <rest>.")."""
    from headscope.reports.families import captions, prefix_captions, presentations

    every = captions()
    if summary is not None:  # a prefix's figures too (patching's exact_<site>, review 14bv C3)
        for shown in presentations().values():
            if shown.caption_for is not None and (stem in shown.captions or stem.startswith(tuple(shown.prefix_captions))
                                                  ) and (own := shown.caption_for(stem, summary)):
                return own
    if stem in every:
        return every[stem]
    for prefix, text in prefix_captions().items():
        if stem.startswith(prefix):
            kind = stem[len(prefix):].replace("_", " ")
            return text + (f"Site: {kind}." if kind else "")
    return ""


def __getattr__(name: str) -> Any:
    """`CAPTIONS` (every figure's caption by stem) and `<family>_finding`, the names this module had
    before each family's presentation moved to its plotting module; looked up there on first use."""
    from headscope.reports import families

    if name == "CAPTIONS":
        return families.captions()
    family = name.removesuffix("_finding")
    if name.endswith("_finding") and family in families.names():
        return families.presentation(family).finding
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def beside(value: float, threshold: float, digits: int = 1) -> str:
    """`value` with `digits` decimals, more (up to 4, then cut toward the threshold's side) where rounding would
    put it on the other side of `threshold` or onto it: 1.46 against 1.5 reads "1.46", never "1.5" (review 12c A2)."""
    below = value < threshold
    for d in range(digits, 5):
        text = f"{value:.{d}f}"
        if (float(text) < threshold) == below:
            return text
    step = 10 ** -4
    return f"{(math.floor(value / step) if below else math.ceil(value / step)) * step:.4f}"


def _uniform_words(rows: Any) -> str:
    """The uniform share beside an ALiBi baseline, where the records carry it ("uniform_share"), else 'more'."""
    from headscope.analyses.position.sinks import record_shares
    flat = [_num(record_shares(r)[1]) for r in rows]
    if any(v is None for v in flat) or not flat:
        return "more"
    lo, hi = min(flat), max(flat)
    return f"{lo:.2f}" if hi - lo < 0.005 else f"{lo:.2f}-{hi:.2f}"


def sink_sentence(records: Any, *, n_sink: Any = None, task: Any = None, unit: str = "prompts",
                  windowed: Any = (), what: str | None = None, baseline: Any = None, nope: Any = ()) -> str:
    """The attention-sink sentence the kv and position findings share, from the summary's per-layer
    "sinks" records (analyses/position/sinks.layer_sinks): each layer's mass on the first tokens with
    its 95% interval over examples against the uniform-attention share, and the layers that are sinks
    by the one criterion (at least SINK_RATIO x uniform, the paired excess's interval above 0). Models
    of more than 6 layers: the sink layers in full, the others as a range. windowed: the sliding-window
    layers, whose mass averages only the queries that see the first token (kv's sink_stats). what: the sink
    tokens in words ("[CLS] (the first token)"), else "the first n_sink token(s)". baseline: the summary's
    sink_baseline; "alibi": the records' "baseline" is what ALiBi's bias alone gives (review 16c B1), named so. nope: the
    layers without rotary (summary nope_layers, review 19c B2), named after the verdict (nope_sentence)."""
    rows = [r for r in records or [] if isinstance(r, Mapping) and _num(r.get("mass")) is not None]
    if not rows:
        return ""
    from headscope.analyses.position.sinks import SINK_RATIO, record_shares

    def one(r: Mapping[str, Any]) -> str:
        ci = r.get("ci")
        band = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if isinstance(ci, (list, tuple)) and len(ci) == 2 else ""
        return f"layer {r['layer']} {r['mass']:.2f}{band} ({beside(r['ratio'], SINK_RATIO)}x)"

    sinks = [r for r in rows if r.get("sink")]
    uniform = [record_shares(r)[0] for r in rows]
    base = f"{min(uniform):.2f}" if max(uniform) - min(uniform) < 0.005 else f"{min(uniform):.2f}-{max(uniform):.2f}"
    where = f"On {task} prompts, a" if task else "A"
    n = rows[0].get("n")
    slid = [int(k) for k in windowed or ()]
    over = (f"; on sliding-window layer{'s' if len(slid) > 1 else ''} {int_ranges(sorted(slid))} over the queries "
            "whose window holds the first token") if slid else ""
    what = what or f"the first {n_sink if n_sink is not None else '?'} token(s)"
    alibi = baseline == "alibi"
    share = (f"{base}, the share ALiBi's position bias alone gives them with every score equal (each head's slope; "
             f"uniform attention would give {_uniform_words(rows)})" if alibi else
             f"the uniform share of the mass that reaches the keys {base}" if baseline == "keys" else f"the uniform share {base}")
    copies = _copies_words(rows, unit)
    ci_words = "95% CI, " if any(r.get("ci") for r in rows) else ""
    head = (f"{where}ttention on {what} per layer (mean"
            + (f" over {n} {unit}" if n else "") + f"{over}, {ci_words}and its multiple of {share}): ")
    if len(rows) <= 6:
        listed = ", ".join(one(r) for r in rows)
    else:
        others = [r["mass"] for r in rows if not r.get("sink")]
        listed = ", ".join(one(r) for r in sinks) + ("; " if sinks and others else "") \
            + (f"the other {len(others)} layers {min(others):.2f}-{max(others):.2f}" if others else "")
    rule = f"at least {SINK_RATIO:g}x {'that' if alibi else 'the uniform'} share" + sink_test_words(rows)
    if sinks:
        verdict = f"An attention sink in layer(s) {', '.join(str(r['layer']) for r in sinks)} ({rule})."
    else:
        verdict = f"No layer is an attention sink (none is {rule})."
    note = nope_sentence(nope, [int(r["layer"]) for r in sinks])
    return learned_sink_words(rows, baseline) + head + listed + ". " + copies + verdict + (" " + note if note else "")


def nope_sentence(nope: Any, named: Any = (), what: str = "sink") -> str:
    """Review 19c B2: 'Layers 1, 3 apply no rotary (NoPE): attention there has no position encoding of its own;
    positions reach it through the causal mask and what earlier layers wrote into the residual stream (the sink on
    layer 1 is on one of them).' where the model has such layers (summary nope_layers); named: the layers
    a sentence names (sinks, heads' layers), said where they are NoPE; '' without NoPE layers."""
    layers = sorted({int(x) for x in nope or () if _num(x) is not None})
    if not layers:
        return ""
    on = sorted({int(x) for x in named or ()} & set(layers))
    where = f"Layer{'s' if len(layers) > 1 else ''} {', '.join(map(str, layers))} appl{'y' if len(layers) > 1 else 'ies'}"
    # review 20 A3: past the first layer the stream carries positions earlier (rotary) layers wrote, so not "only"
    said = (f"{where} no rotary (NoPE): attention there has no position encoding of its own; positions reach it "
            "through the causal mask and what earlier layers wrote into the residual stream")
    if on:
        said += (f" (the {what}{'s' if len(on) > 1 else ''} on layer{'s' if len(on) > 1 else ''} "
                 f"{', '.join(map(str, on))} {'are' if len(on) > 1 else 'is'} on {'them' if len(layers) > 1 else 'it'})")
    return said + "."


def learned_sink_words(rows: list[Mapping[str, Any]], baseline: Any) -> str:
    """Review 19b B1: on a model with learned attention sinks (the records' keys_mass, baseline "keys"), the sentence
    before the first-token one: the learned sink's share of a row per layer with its 95% interval, and why the baseline
    is uniform attention over the rest (a row's weights over the keys sum to less than 1); "" on other models."""
    got = [r for r in rows if _num(r.get("keys_mass")) is not None]
    if baseline != "keys" or not got:
        return ""

    def one(r: Mapping[str, Any]) -> str:
        ci = r.get("keys_ci")
        band = f" [{1 - ci[1]:.2f}, {1 - ci[0]:.2f}]" if isinstance(ci, (list, tuple)) and len(ci) == 2 else ""
        return f"layer {r['layer']} {1 - r['keys_mass']:.2f}{band}"

    flat = [_num(r.get("uniform_share")) for r in got]
    plain = ""
    if all(v is not None for v in flat):
        spread = f"-{max(flat):.2f}" if max(flat) - min(flat) >= 0.005 else ""
        plain = f" (were each row to sum to 1, uniform attention would give {min(flat):.2f}{spread})"
    return ("The model has learned attention sinks (a sink logit per head, not a token), which take part of every row "
            f"(mean share per layer over the same queries, 95% CI): {', '.join(one(r) for r in got)}; each row's weights "
            f"over the keys sum to the rest, so the first token's baseline below is the uniform share of that mass"
            f"{plain}. ")


def ratio_alone(rows: list[Mapping[str, Any]]) -> list[int]:
    """The layers whose sink verdict had no interval to test (analyses/position/sinks.layer_sinks: one example, or
    copies of one input, so the ratio alone decided): a record whose excess_ci is recorded as None, n_distinct 1 or n
    under 2."""
    return [int(r["layer"]) for r in rows if ("excess_ci" in r and r["excess_ci"] is None) or r.get("n_distinct") == 1
            or (_num(r.get("n")) is not None and r["n"] < 2)]


def sink_test_words(rows: list[Mapping[str, Any]]) -> str:
    """The interval half of the sink rule, worded by what was computed (verification 18v B3: "its excess over it
    95%-CI above 0" was cited where no layer had an interval): ", with its excess over it 95%-CI above 0" where every
    layer has one; nothing where none has (the rule is then the ratio alone); else the interval where given and the
    layers the ratio alone decided."""
    alone = ratio_alone(rows)
    if not alone:
        return ", with its excess over it 95%-CI above 0"
    if len(alone) == len(rows):
        return ""
    return (f", with its excess over it 95%-CI above 0 where an interval is given (the ratio alone on "
            f"layer{'s' * (len(alone) > 1)} {int_ranges(sorted(alone))})")


def _copies_words(rows: list[Mapping[str, Any]], unit: str) -> str:
    """Review 17c B1: the layers whose examples are copies of one input over the queries measured (a record's
    n_distinct below its n: they read the same first tokens), so their interval is over the distinct inputs or, with
    one, absent and the ratio alone decides; "" where every example is distinct or the records predate n_distinct."""
    said = []
    for k in sorted({int(r["n_distinct"]) for r in rows if _num(r.get("n_distinct")) is not None
                     and _num(r.get("n")) is not None and r["n_distinct"] < r["n"]}):
        layers = [r for r in rows if r.get("n_distinct") == k]
        reads = sorted({int(r["read_tokens"]) for r in layers if _num(r.get("read_tokens")) is not None})
        first = f"the first {reads[0]}" if len(reads) == 1 else f"their first {reads[0]}-{reads[-1]}"
        where = f"layer{'s' if len(layers) > 1 else ''} {int_ranges(sorted(int(r['layer']) for r in layers))}"
        n = layers[0]["n"]
        if k == 1:
            said.append(f"On {where} the queries measured read only {first} tokens, the same in all {n} {unit}: "
                        f"{n} copies of one input, not independent samples, so no interval is given and the verdict "
                        "rests on the ratio alone.")
        else:
            said.append(f"On {where} the queries measured read only {first} tokens, which take {k} distinct values "
                        f"over the {n} {unit}: the interval is over those {k} inputs.")
    return " ".join(said) + (" " if said else "")
