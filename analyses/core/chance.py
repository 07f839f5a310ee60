"""The chance-level guard: is the model's clean behaviour on a task distinguishable from chance?

A summary computed on a model at chance is misleading where it states thresholds relative to the
clean metric ("prunable within 1%" of a logit difference of -0.008). `assess` decides `at_chance`
from the per-example clean metric values and returns the dict that analyses put in
`summary["chance"]`; reports.findings then says so and leaves out relative findings.

Chance values (what a model that has learnt nothing about the task scores):
- "logit_diff": 0 (no preference on average between the answer and the wrong answer; the entry's mean_abs and
  n_strong say how strongly single rows prefer one or the other);
- "accuracy": 1/n_classes, by default 1/vocabulary size (top-1 over the vocabulary);
- "logprob": log(1/vocabulary size), the answer's log-probability under a uniform prediction (chance_value);
  but a model's own tasks are tested against its own mean log-probability over the vocabulary at the same
  positions (against_vocabulary_mean): by Jensen every token of a model with uneven logits averages below
  log(1/V), so "below log(1/V)" says nothing about the answers (review 13a A2);
- answers of several tokens (Task.continuation): k log(1/vocabulary size) for a k-token
  continuation's log-probability, (1/vocabulary size)^k for its accuracy; rows of different lengths have
  different chance values, so a log-probability is tested row by row (`assess_per_row`: each row's margin
  over its own chance, per answer token) and the entry's "ci" stays the metric's own interval (`metric_ci`
  reads it, leaving out the shifted interval of entries written before);
- a log-probability on a task with wrong answers (the user's wrong_answer field, one token or several): chance is
  no preference between the answer and the wrong answer, not the vocabulary (review 14a A1: a model whose answers beat
  its vocabulary mean by 14 nats, but not the tools the prompt names, was "above chance" in heads and at chance in
  every section that read logit differences of the same file). `against_wrong_answers` tests each row's log-odds
  log P(answer) - log P(wrong answer) of the whole continuations against 0 with the logit difference's floor (on a
  one-token row it is the logit difference), and the model is at chance where that or the vocabulary-mean test says
  so. Without wrong answers the candidates are not known, and the vocabulary mean stays the only reference;
- "cosine" and normalised metrics have no chance value: `assess` returns None.

The rule: the guard asks whether the model is credibly *above* chance; it is at chance unless
1. the mean clean metric exceeds the chance value by at least an effect floor in the metric's own
   units (FLOORS: 0.1 logits, i.e. odds of at most 1.1 between answer and wrong answer; log 2 nats,
   the answer at most twice as likely as under a uniform guess; 5 accuracy points),
2. the lower end of the two-sided (1 - alpha) confidence interval of the mean lies above chance
   (a one-sided test at alpha/2: a one-sample t interval, cut at the caller's bounds; for 0/1 accuracies the
   exact Clopper-Pearson interval, p_value the central exact binomial p it inverts), and
3. the standardised effect (mean - chance) / sd across examples is at least MIN_EFFECT_SIZE = 0.2
   (Cohen's "small"): below it the per-example noise drowns the behaviour, and a large enough set
   of examples would make any bias of a random model significant (not applied to 0/1 accuracies).
Too wide to tell (review 13b A2: "at chance" from 4 examples, CI [-0.7, 3.3], while 16 of the same run were at 2.54
[0.82, 4.25]): where the interval contains chance but the mean clears the floor by at least UNDETERMINED_EFFECT = 0.5
per-example standard deviations (Cohen's "medium"; with many examples such an interval would clear chance), the
entry's "undetermined" is True and "at_chance" False: the findings say "cannot tell from n examples" and report
the relative findings with that caveat rather than calling the model at chance.
Below chance counts as at chance for the guard (no better than chance: relative findings are left
out), but it is told apart: when the whole interval lies under chance the entry's "below_chance" is
True and the reason says "below chance" (worse than guessing: the answers are systematically
dispreferred, e.g. an untrained model's peaked, random predictions score under a uniform guess, a
negative logit difference prefers the wrong answers). "Systematically" needs at least
MIN_SYSTEMATIC_EXAMPLES = 8 examples (a review saw 4 examples of a random model below chance where 16 of
the same task were at chance): fewer are said as "below chance on these n examples". With one example there is no CI: the floor
alone decides. `assess_mean` applies the floor to a mean alone (no per-example values at hand).
On a copy task (position: chance is copying one of the context's values) `copy_task` reads the accuracy against what
the model produced: one that produces none of the context's values does not do the task (does_not_copy; accuracy 0
is no preference, whatever n), and below chance needs the gold value's share among its copies under chance.

The Student-t interval of a mean over examples has its one home here (`t_quantile`, `t_half_width`,
`se_interval`, `mean_interval`, `mean_intervals`): every family's and report's t interval of a mean calls it.

Below chance on a logit difference, `model_on_task` also runs the corrupted prompts (`corrupted_baseline`):
where they give a similar logit difference for the same answer pair, the clean prompts' is a preference among
the answer tokens that does not depend on the prompt (an untrained model's token prior), not a response to it.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from headscope.analyses.core.mask_read import logits_at, mask_positions
from headscope.analyses.core.tasks import Task

ALPHA = 0.05
FLOORS = {"logit_diff": 0.1, "logprob": math.log(2), "accuracy": 0.05}
MIN_EFFECT_SIZE = 0.2  # (mean - chance) / sd below this: at chance
MIN_SYSTEMATIC_EXAMPLES = 8  # fewer examples wholly below chance: not called systematic
UNDETERMINED_EFFECT = 0.5  # a CI over chance with a mean this many sds above it (and over the floor): too wide to tell
_WORDS = {"logit_diff": "logit difference", "logprob": "answer log-probability", "accuracy": "accuracy"}


def chance_value(metric: str, *, vocab_size: int | None = None, n_classes: int | None = None) -> float | None:
    """The chance value of `metric` (see the module doc); None where there is none or it needs a
    vocabulary size that is not given."""
    if metric == "logit_diff":
        return 0.0
    if metric == "accuracy":
        n = n_classes or vocab_size
        return 1.0 / n if n else None
    if metric == "logprob":
        return -math.log(vocab_size) if vocab_size else None
    return None


def central_binomial_p(k: int, n: int, p0: float) -> float:
    """The two-sided exact binomial p-value that the Clopper-Pearson interval inverts: twice the smaller tail,
    min(1, 2 min(P(X <= k), P(X >= k))), X ~ Binomial(n, p0). The (1 - alpha) exact interval excludes p0 exactly when
    this p is under alpha, so verdict (from the interval) and p agree (review 18a A1: scipy's default two-sided p,
    which sums every outcome as unlikely as k, gave 0.013 for 12 of 39 against 6/39 while the 98.3% exact interval
    held 6/39; the central p is 0.024)."""
    from scipy import stats

    low, high = float(stats.binom.cdf(k, n, p0)), float(stats.binom.sf(k - 1, n, p0))
    return min(1.0, 2.0 * min(low, high))


def _interval(values: np.ndarray, metric: str, chance: float, alpha: float,
              bounds: tuple[float, float] | None = None) -> tuple[list[float] | None, float | None]:
    """The (1 - alpha) CI of the mean and the two-sided p-value against `chance` (None for n < 2); a t interval is cut
    at `bounds`, what the mean can be (a cut interval covers the mean whenever the uncut one does)."""
    from scipy import stats

    n = len(values)
    if metric == "accuracy" and np.isin(values, (0.0, 1.0)).all():
        k, p0 = int(values.sum()), min(max(chance, 0.0), 1.0)
        ci = stats.binomtest(k, n, p=p0).proportion_ci(1 - alpha, method="exact")
        return [float(ci.low), float(ci.high)], central_binomial_p(k, n, p0)
    if n < 2:
        return None, None
    mean, sd = float(values.mean()), float(values.std(ddof=1))
    if sd == 0.0:  # every example the same: the mean is exact
        return [mean, mean], (1.0 if mean == chance else 0.0)
    half = t_half_width(sd, n, alpha=alpha)  # review 20: position's accuracy share's t interval reached -0.014
    return cut([mean - half, mean + half], bounds), float(stats.ttest_1samp(values, chance).pvalue)


def cut(ci: list[float] | None, bounds: tuple[float, float] | None) -> list[float] | None:
    """An interval of a mean cut at `bounds`, what the mean can be (a probability's [0, 1]): a cut interval covers the
    mean whenever the uncut one does. None and no bounds pass through."""
    if ci is None or bounds is None:
        return ci
    return [max(ci[0], bounds[0]), min(ci[1], bounds[1])]


def _flat(x: Any) -> np.ndarray:
    """Values (a tensor, array or sequence) as a flat float64 array."""
    x = x.detach().double().cpu().numpy() if isinstance(x, torch.Tensor) else x
    return np.asarray(x, dtype=np.float64).ravel()


def assess(values: Sequence[float] | np.ndarray | torch.Tensor, metric: str, *, chance: float | None = None,
           vocab_size: int | None = None, n_classes: int | None = None, alpha: float = ALPHA,
           floor: float | None = None, words: str | None = None, against: str | None = None,
           bounds: tuple[float, float] | None = None) -> dict[str, Any] | None:
    """Whether per-example clean metric values are within noise of chance (see the module doc).

    Returns {"at_chance", "below_chance" (the whole CI under chance), "metric", "mean", "chance_value",
    "ci" ([low, high] or None), "ci_level", "p_value", "effect_size" ((mean - chance) / sd, None for
    0/1 accuracies), "floor", "n_examples", "reason"}, or None when the metric has no chance value.
    model_on_task and from_summary add what the chance value was computed from (`with_basis`). words and
    against name the values and their reference in the reason (default: the metric, "chance (<value>)"):
    assess_per_row tests margins over each row's chance against 0. bounds: what the mean can be, where the values are
    not 0/1 but bounded (position's accuracy per example, a share of several gold positions, in [0, 1]): the t
    interval stops there."""
    values = _flat(values)
    values = values[np.isfinite(values)]
    if chance is None:
        chance = chance_value(metric, vocab_size=vocab_size, n_classes=n_classes)
    if chance is None or len(values) == 0:
        return None
    floor = FLOORS.get(metric, 0.0) if floor is None else floor
    mean = float(values.mean())
    ci, p = _interval(values, metric, chance, alpha, bounds)
    words = words or _WORDS.get(metric, metric)
    ref = against or f"chance ({chance:.3g})"
    level = f"{100 * (1 - alpha):.0f}%"
    binary = metric == "accuracy" and bool(np.isin(values, (0.0, 1.0)).all())
    sd = float(values.std(ddof=1)) if len(values) > 1 else 0.0
    effect = None if binary or sd == 0.0 else (mean - chance) / sd
    span = "" if ci is None else f"the {level} CI [{ci[0]:.3g}, {ci[1]:.3g}] of "
    if ci is not None and ci[1] < chance:
        at, reason = True, (f"below chance: {span}the mean {words} lies under {ref}; the model "
                            + ("prefers the wrong answers" if metric == "logit_diff" else "does worse than a uniform guess"))
    elif ci is not None and ci[0] <= chance and mean - chance >= floor and effect is not None and effect >= UNDETERMINED_EFFECT:
        at, reason = False, (f"cannot tell from {len(values)} examples: {span}the mean {words} {mean:.3g} contains {ref} "
                             f"but also effects of {effect:.2f} per-example standard deviations and more: too wide to "
                             "tell; relative findings are reported with that caveat")
    elif ci is not None and ci[0] <= chance:
        at, reason = True, f"{span}the mean {words} contains {ref}"
    elif mean - chance < floor:
        at, reason = True, (f"the mean {words} {mean:.3g} is {'below' if mean < chance else f'less than {floor:.3g} above'} "
                            + ref + ("" if ci is not None else f"; {len(values)} example, no CI"))
    elif effect is not None and effect < MIN_EFFECT_SIZE:
        at, reason = True, (f"the mean {words} {mean:.3g} is {effect:.2f} per-example standard deviations above "
                            f"{ref}, under {MIN_EFFECT_SIZE}: drowned in per-example noise")
    elif ci is None:
        at, reason = False, f"one example: the {words} {mean:.3g} is {floor:.3g} or more above {ref}, no CI"
    else:
        at, reason = False, f"{span}the mean {words} lies above {ref} by more than the noise"
    return {"at_chance": at, "below_chance": ci is not None and ci[1] < chance, "metric": metric, "mean": mean,
            "chance_value": float(chance), "ci": ci, "ci_level": 1 - alpha, "p_value": p, "effect_size": effect,
            "floor": float(floor), "n_examples": int(len(values)), "reason": reason,
            "undetermined": reason.startswith("cannot tell"), **_spread(values, metric, chance)}


STRONG_LOGIT = 1.0  # |logit difference| of a row that clearly prefers one answer (odds e:1), for the spread words


def _spread(values: np.ndarray, metric: str, chance: float) -> dict[str, Any]:
    """Review 17c B2: a logit difference's per-row size beside its mean, {"mean_abs": mean |value - chance|,
    "n_strong": rows with |value - chance| >= STRONG_LOGIT} ({} for other metrics): a mean near 0 can be rows with
    rows that prefer one answer or the other, which "no preference" would misstate."""
    if metric != "logit_diff" or not len(values):
        return {}
    dev = np.abs(values - chance)
    return {"mean_abs": float(dev.mean()), "n_strong": int((dev >= STRONG_LOGIT).sum())}


def copy_task(entry: dict[str, Any] | None, *, outputs: int, gold: int, copied: int | None,
              alpha: float = ALPHA) -> dict[str, Any] | None:
    """A copy task's accuracy guard (chance: copying one of the context's values at random) read against what the
    model produced, over `outputs` outputs: `gold` of them the gold value, `copied` any of the context's values
    (None: not recorded). Review 10b A2: accuracy 0 of a model that copies nothing is "does not do the task", not a
    preference against the gold value, and with 8 examples it was "at chance", with 24 "below chance".
    - no output is any context value (copied 0), or none is the gold one and copying is not recorded: entry
      "does_not_copy" True, "below_chance" False (it stays at chance: relative findings are left out, whatever n);
    - else, with copying recorded, below chance only where the gold value's share among the outputs that copy a
      context value has its exact binomial (1 - alpha) CI under chance: the model prefers the wrong values
      ("gold_share", "gold_share_ci"); otherwise not below chance.
    Adds "outputs", "gold_outputs", "copied_outputs" (None when not recorded)."""
    if entry is None:
        return None
    from scipy import stats

    entry = {**entry, "outputs": int(outputs), "gold_outputs": int(gold),
             "copied_outputs": None if copied is None else int(copied), "does_not_copy": False}
    if copied == 0 or (copied is None and gold == 0):
        entry.update(does_not_copy=True, below_chance=False, at_chance=True,
                     reason=("the model never produces any of the context's values" if copied == 0 else
                             "the model never produces the gold value (which other values it produces is not recorded)")
                     + f" (0 of {outputs} outputs): it does not do this task")
        return entry
    if copied is None or not entry.get("below_chance"):
        return entry
    ci = stats.binomtest(int(gold), int(copied), p=min(max(entry["chance_value"], 0.0), 1.0)).proportion_ci(
        1 - alpha, method="exact")
    below = float(ci.high) < entry["chance_value"]
    entry.update(gold_share=gold / copied, gold_share_ci=[float(ci.low), float(ci.high)], below_chance=below)
    if not below:
        entry["reason"] = (f"the gold value is {gold} of the {copied} outputs that copy one of the context's values, "
                           f"{100 * (1 - alpha):.0f}% CI [{ci.low:.3g}, {ci.high:.3g}], which contains chance "
                           f"({entry['chance_value']:.3g}): no preference against it")
    return entry


def does_not_copy(entry: Mapping[str, Any] | None) -> bool:
    """Whether a copy task's guard says the model does not do the task (copy_task's does_not_copy; entries from
    before it: an accuracy of exactly 0 with chance from the context's values, classes_from "context")."""
    if not isinstance(entry, Mapping):
        return False
    if isinstance(entry.get("does_not_copy"), bool):
        return entry["does_not_copy"]
    return (entry.get("metric") == "accuracy" and entry.get("classes_from") == "context"
            and isinstance(entry.get("mean"), (int, float)) and entry["mean"] == 0)


def assess_mean(mean: float, metric: str, *, n_examples: int | None = None, chance: float | None = None,
                vocab_size: int | None = None, n_classes: int | None = None, alpha: float = ALPHA,
                floor: float | None = None) -> dict[str, Any] | None:
    """The guard from a mean alone (no per-example values): accuracies as k = round(mean x n) successes
    of n (exact binomial, when n_examples is given); other metrics by the effect floor only."""
    if not isinstance(mean, (int, float)) or isinstance(mean, bool) or not math.isfinite(mean):
        return None
    if metric == "accuracy" and n_examples:
        k = int(round(mean * n_examples))
        return assess([1.0] * k + [0.0] * (n_examples - k), metric, chance=chance, vocab_size=vocab_size,
                      n_classes=n_classes, alpha=alpha, floor=floor)
    if chance is None:
        chance = chance_value(metric, vocab_size=vocab_size, n_classes=n_classes)
    if chance is None:
        return None
    floor = FLOORS.get(metric, 0.0) if floor is None else floor
    words, mean = _WORDS.get(metric, metric), float(mean)
    at = mean - chance < floor
    near = "below" if mean < chance else f"less than {floor:.3g} above" if at else f"at least {floor:.3g} above"
    reason = (f"the mean {words} {mean:.3g} is {near} chance ({chance:.3g}) "
              "(from the summary's mean; no per-example values, no CI)")
    below = mean < chance - floor and metric != "logprob"  # log(1/V) is no floor for one model's answers (Jensen)
    return {"at_chance": at, "below_chance": below, "metric": metric, "mean": mean,
            "chance_value": float(chance), "ci": None,
            "ci_level": None, "p_value": None, "effect_size": None, "floor": float(floor), "n_examples": n_examples,
            "reason": reason}


def clean_values(model, task: Task, metric: str | None = None, *, max_bytes: int = 1 << 28) -> tuple[torch.Tensor, int]:
    """Per-example clean metric values of `task` on the unmodified model ([batch] float64 on the CPU)
    and the vocabulary size of its logits: plain forwards, in chunks of rows whose logits fit in
    `max_bytes`, each row read at its answer position (Task.answer_positions; a masked LM's at its mask through its masked-LM
    head, mask_read.mask_positions). Decoder metrics only."""
    values, vocab, _ = _clean_pass(model, task, metric, max_bytes=max_bytes)
    return values, vocab


def _clean_pass(model, task: Task, metric: str | None = None, *,
                max_bytes: int = 1 << 28) -> tuple[torch.Tensor, int, torch.Tensor | None]:
    """clean_values and, for "logprob", each row's own chance from the same forward: the model's mean
    log-probability over the vocabulary at the answer positions, summed over the answer's tokens ([batch]
    float64; metrics.vocab_mean_logprob); None for other metrics."""
    from headscope.analyses.core.metrics import task_metric, vocab_mean_logprob

    kind = metric or task.metric
    n, n_pos = task.tokens.shape
    vocab = int(model.facts.d_vocab)
    rows = max(1, int(max_bytes // max(1, n_pos * vocab * 4)))
    at = mask_positions(model, task) if model.facts.is_encoder else None  # a masked LM: read at each prompt's mask
    where, k = task.answer_positions() if at is None else at, task.n_answer_tokens
    out, own = [], []
    with torch.inference_mode():
        for start in range(0, n, rows):
            part = replace(task.rows(slice(start, start + rows)), metric=kind)
            logits = model(part.tokens, attention_mask=part.attention_mask)  # [rows, pos, vocab] ([.., d_model])
            if at is not None:  # the masked-LM head's logits at the mask: [rows, 1, vocab]
                last = logits_at(model, logits, where[start:start + rows]).float()
            elif k == 1:
                idx = where[start:start + rows].to(logits.device)
                last = logits[torch.arange(logits.shape[0], device=logits.device), idx][:, None].float()  # [rows, 1, vocab]
            else:  # answers of several tokens: decoders are left-padded, every continuation ends at -1
                last = logits[:, -k:].float()  # [rows, k, vocab]
            vocab = int(last.shape[-1])
            out.append(task_metric(part, kind=kind)(last).double().cpu())
            if kind == "logprob":
                own.append(vocab_mean_logprob(last, part.answer_tokens.to(last.device)).double().cpu())
    return torch.cat(out), vocab, (torch.cat(own) if own else None)


def model_on_task(model, task: Task, metric: str | None = None, *, expected_mean: float | None = None,
                  tolerance: float = 1e-3) -> dict[str, Any] | None:
    """`assess` of the model's clean metric on `task` (one forward, clean_values), or None for encoders and metrics
    without a chance value; a masked LM scored at its mask (mask_read.mask_positions) is judged as a decoder, its
    record's read_at saying where its answers were read (the chance sentence names it)."""
    out = _on_task(model, task, metric, expected_mean=expected_mean, tolerance=tolerance)
    if out is not None and model.facts.is_encoder:
        out["read_at"] = f"each prompt's {model.tokenizer.mask_token}"
    return out


def _on_task(model, task: Task, metric: str | None = None, *, expected_mean: float | None = None,
             tolerance: float = 1e-3) -> dict[str, Any] | None:
    """model_on_task's record, without where it was read. Accuracy's chance is 1 / the number of distinct answers (a model
    that knows the answer format but guesses among them). expected_mean: the clean mean the analysis
    reported; when the recomputed mean differs by more than tolerance x max(1, |expected|) (at least
    16 machine epsilons of the model's dtype) the task is not the one the analysis ran on, and the
    guard falls back to that mean (assess_mean)."""
    kind = metric or task.metric
    if task.answers is None or chance_value(kind, vocab_size=2) is None:
        return None
    if model.facts.is_encoder and mask_positions(model, task) is None:  # a cosine: no chance (mask_read.py)
        return None
    if kind == "logit_diff" and task.wrong_answers is None:
        return None
    values, vocab, own = _clean_pass(model, task, kind)
    mean = float(values.mean())
    tolerance = max(tolerance, 16 * torch.finfo(model.dtype).eps)  # half precision: the analyses' fused passes round more
    tokens = 1.0 if task.continuation is None else float((task.continuation >= 0).sum(1).double().mean())
    if expected_mean is not None and abs(mean - expected_mean) > tolerance * max(1.0, abs(expected_mean)):
        out = assess_mean(expected_mean, kind, n_examples=len(task), vocab_size=vocab)
        return with_basis(out, task=task.name, vocab_size=vocab, answer_tokens=tokens if kind == "logprob" else None)
    if expected_mean is not None and kind == "logit_diff" and mean != expected_mean:
        # review 16a B2: the same rows, another pass's rounding (bfloat16: the heads summary's 3.8203 against this
        # pass's 3.8242): the record is centred on the analysis's own mean, which its finding and compare both read,
        # with this pass's spread (one number for one quantity)
        values = values.double() + (float(expected_mean) - float(values.double().mean()))
    if own is not None:  # a log-probability: against the model's own every-token mean at the same positions
        out = against_vocabulary_mean(values, own, task, vocab)
        wrong = wrong_values(model, task)  # and, where the task has wrong answers, against them (review 14a A1)
        if wrong is not None:
            out = against_wrong_answers(values, wrong, out)
        return with_basis(out, task=task.name, vocab_size=vocab, answer_tokens=tokens)
    if task.continuation is not None:  # a whole continuation: chance is each token's chance, multiplied
        return with_basis(_continuation_on_task(values, task, kind, vocab), task=task.name, vocab_size=vocab,
                          answer_tokens=tokens)
    classes = int(task.answers.unique().numel()) if kind == "accuracy" else None  # guessing among the answers
    classes = classes if classes and classes > 1 else None
    out = assess(values, kind, vocab_size=vocab, n_classes=classes)
    if out is not None and out["below_chance"] and kind == "logit_diff" and task.corrupted_tokens is not None:
        out.update(corrupted_baseline(model, task, values))
    return with_basis(out, task=task.name, vocab_size=vocab, answer_tokens=1.0 if kind == "logprob" else None,
                      n_classes=classes)


def corrupted_baseline(model, task: Task, values: torch.Tensor, *, alpha: float = ALPHA) -> dict[str, Any]:
    """Below chance on a logit difference: the same answer pair's logit difference on the corrupted prompts
    (one more forward, paired rows only), so that the chance sentence can tell a response to the prompt from a
    preference among the answer tokens that holds whatever the prompt (review 9b C1: an untrained model's -0.17
    on the clean prompts against -0.13 on the corrupted ones). {"corrupted_mean", "corrupted_ci", "clean_minus_corrupted"
    ({"mean", "ci"}: paired per row, t interval), "prompt_independent" (that interval contains 0, or its mean is
    under the floor in size)}; {} where no row has a corrupted pair."""
    rows = torch.arange(len(task)) if task.paired is None else torch.nonzero(task.paired).flatten()
    if len(rows) == 0:
        return {}
    pairs = task.rows(rows)
    corrupted, _ = clean_values(model, replace(pairs, tokens=pairs.corrupted_tokens), "logit_diff")  # [rows]
    clean = values[rows].double()
    diff = (clean - corrupted).numpy()  # [rows] paired
    ci = mean_interval(diff, alpha=alpha)
    mean = float(diff.mean())
    same = abs(mean) < FLOORS["logit_diff"] or (ci is not None and ci[0] <= 0 <= ci[1])
    return {"corrupted_mean": float(corrupted.mean()), "corrupted_ci": mean_interval(corrupted.numpy(), alpha=alpha),
            "clean_minus_corrupted": {"mean": mean, "ci": ci, "n": int(len(rows))}, "prompt_independent": bool(same)}


def with_basis(entry: dict[str, Any] | None, *, task: Any = None, vocab_size: int | None = None,
               answer_tokens: float | None = None, n_classes: int | None = None) -> dict[str, Any] | None:
    """`entry` with what its chance value was computed from, for the findings' chance sentence: the
    task, the vocabulary size, the mean answer length in tokens (log-probability: k log(1/vocab)) and
    the number of answers guessed among (accuracy): one metric's chance differs across tasks."""
    if entry is None:
        return None
    basis = {"task": task if isinstance(task, str) else None, "vocab_size": vocab_size,
             "answer_tokens": answer_tokens, "n_classes": n_classes}
    entry.update({k: v for k, v in basis.items() if v is not None})
    return entry


def _continuation_on_task(values: torch.Tensor, task: Task, kind: str, vocab: int) -> dict[str, Any] | None:
    """The guard for answers of several tokens: a k-token continuation's chance is k log(1/vocab) for "logprob"
    (each row against its own, assess_per_row) and (1/vocab)^k for "accuracy" (their mean)."""
    lengths = (task.continuation >= 0).sum(1).double()  # [batch]
    if kind == "logprob":
        return assess_per_row(values, -lengths * math.log(vocab), kind, tokens=lengths)
    return assess(values, kind, chance=float((vocab ** -lengths).mean()))


def against_vocabulary_mean(values: torch.Tensor, own: torch.Tensor, task: Task, vocab: int) -> dict[str, Any] | None:
    """The guard of an answer log-probability (review 13a A2): each row against its own chance, the model's mean
    log-probability over the vocabulary at the answer positions summed over the answer's k tokens (`own`), per
    answer token (assess_per_row). log(1/V) is not chance here: by Jensen every token of a model with uneven
    logits averages below it, so a random model's answers were "below chance ... dispreferred" whenever n was
    large enough. Adds "chance_from": "vocabulary_mean" and "uniform_chance" (the rows' mean k log(1/V), for
    reference)."""
    lengths = (torch.ones(len(values), dtype=torch.float64) if task.continuation is None
               else (task.continuation >= 0).sum(1).double())  # [batch]
    out = assess_per_row(values, own, "logprob", tokens=lengths)
    if out is None:
        return None
    if out["below_chance"]:
        out["reason"] = out["reason"].replace("does worse than a uniform guess",
                                              "gives the answers less than its own average vocabulary token")
    out.update(chance_from="vocabulary_mean", uniform_chance=float((-lengths * math.log(vocab)).mean()))
    return out


def wrong_values(model, task: Task) -> torch.Tensor | None:
    """Each row's log-probability of its wrong answer ([batch] float64), scored as its answer is: one token at the
    answer position, several as a teacher-forced continuation of the prompt alone (the answer's pieces that the
    Task's tokens end with taken off, the wrong answer's put on); None where the task has no wrong answers."""
    if task.continuation is None:
        if task.wrong_answers is None:
            return None
        return clean_values(model, replace(task, answers=task.wrong_answers, wrong_answers=None), "logprob")[0]
    if task.wrong_continuation is None:
        return None
    from headscope.models.hooked_model import pad_id_of, pad_token_rows

    mask = torch.ones_like(task.tokens) if task.attention_mask is None else task.attention_mask
    pieces = (task.continuation >= 0).sum(1)  # [batch]: the answer's tokens, all but the last in the prompt
    seqs = []
    for i in range(len(task)):
        real = task.tokens[i][mask[i].bool()].tolist()
        wrong = [int(t) for t in task.wrong_continuation[i] if t >= 0]
        seqs.append(real[:len(real) - int(pieces[i]) + 1] + wrong[:-1])
    tokens, attn = pad_token_rows(seqs, pad_id_of(model.tokenizer), left=True)  # [batch, pos']
    other = Task(name=task.name, tokens=tokens, answers=task.wrong_continuation[:, -1], attention_mask=attn,
                 continuation=task.wrong_continuation, metric="logprob")
    return clean_values(model, other, "logprob")[0]


def against_wrong_answers(values: torch.Tensor, wrong: torch.Tensor,
                          vocabulary: dict[str, Any] | None) -> dict[str, Any] | None:
    """The guard of an answer log-probability on a task with wrong answers (review 14a A1): chance is no preference
    between the answer and the wrong answer, tested on each row's log-odds log P(answer) - log P(wrong answer) of the
    whole continuations (`values`, `wrong`: [batch]) against 0 with the logit difference's floor: on one-token rows
    it is their logit difference, so every section of one file is judged on one quantity. Whole continuations, not
    per piece: a model that guesses among the candidates gives both the same probability whatever their lengths,
    where per-piece means would differ. The vocabulary-mean test (`vocabulary`, against_vocabulary_mean) is kept
    beside it: the model is at chance where either says so. Adds "chance_from": "wrong_answers", "chance_value"
    (the wrong answers' mean log-probability), "margin" (the log-odds: mean, ci, n_above, n) and "vocabulary"."""
    values, wrong = _flat(values), _flat(wrong)
    keep = np.isfinite(values) & np.isfinite(wrong)
    values, wrong = values[keep], wrong[keep]
    odds = values - wrong  # [rows]
    out = assess(odds, "logprob", chance=0.0, floor=FLOORS["logit_diff"], against="0 (no preference)",
                 words="log-odds of the answer against the wrong answer")
    if out is None:
        return vocabulary
    if out["below_chance"]:
        out["reason"] = out["reason"].replace("does worse than a uniform guess", "prefers the wrong answers")
    out.update(mean=float(values.mean()), ci=mean_interval(values), chance_value=float(wrong.mean()),
               chance_from="wrong_answers",
               margin={"mean": float(odds.mean()), "ci": out["ci"], "per_token": False,
                       "n_above": int((odds > 0).sum()), "n": int(len(odds))})
    if vocabulary is not None:
        out["vocabulary"] = {k: vocabulary.get(k) for k in ("at_chance", "below_chance", "reason", "margin")}
        if vocabulary.get("at_chance") and not out["at_chance"]:  # ahead of the wrong answers, not of the vocabulary
            out.update(at_chance=True, below_chance=False, undetermined=False,
                       reason=f"{vocabulary['reason']} (against its own vocabulary mean)")
    return out


def assess_per_row(values: Sequence[float] | np.ndarray | torch.Tensor, chances: Sequence[float] | np.ndarray | torch.Tensor,
                   metric: str, *, tokens: Sequence[float] | np.ndarray | torch.Tensor | None = None,
                   alpha: float = ALPHA) -> dict[str, Any] | None:
    """`assess` where each row has its own chance value (answers of k_i tokens: k_i log(1/vocab)). Review 11b A1:
    the t interval of (metric_i - chance_i) shifted back onto the metric is the spread of the answer lengths, not of
    the model (+-12.8 about a mean log-probability of -0.0056), and as a test it drowned a model that solves 7 of 7
    rows (margins 6.1 and 42.8) in that spread. So:
    - the verdict is a paired test of each row's margin over its own chance, per answer token,
      (metric_i - chance_i) / k_i (tokens; 1 without): a one-sample t test against 0 with assess's floor and effect
      size; its sign is the margin's sign, and chance per token is one value, log(1/vocab), whatever k_i;
    - "ci" is the metric's own t interval (of metric_i), the headline's uncertainty, never the margins' shifted;
    - "chance_value" is the rows' mean chance, "chance_range" [lowest, highest], "answer_tokens_range" [min, max] k;
      "margin" {"mean", "ci", "per_token", "n_above" (rows above their own chance), "n"}.
    The test, p_value, effect_size, floor and reason are the margins'. Equal chances (one answer length) give the
    same verdict as assess on the metric, the per-token floor aside."""
    values, chances = _flat(values), _flat(chances)
    units = np.ones_like(values) if tokens is None else _flat(tokens)
    keep = np.isfinite(values) & np.isfinite(chances) & (units > 0)
    values, chances, units = values[keep], chances[keep], units[keep]
    if len(values) == 0:
        return None
    margins = (values - chances) / units  # [rows]: per answer token
    per = " per answer token" if tokens is not None else ""
    out = assess(margins, metric, chance=0.0, alpha=alpha, against="0",
                 words=f"{_WORDS.get(metric, metric)}'s margin over each row's own chance{per}")
    if out is None:
        return None
    out.update(mean=float(values.mean()), ci=mean_interval(values, alpha=alpha), chance_value=float(chances.mean()),
               chance_range=[float(chances.min()), float(chances.max())],
               margin={"mean": float(margins.mean()), "ci": out["ci"], "per_token": tokens is not None,
                       "n_above": int((margins > 0).sum()), "n": int(len(margins))})
    if tokens is not None:
        out["answer_tokens_range"] = [int(units.min()), int(units.max())]
    return out


def metric_ci(entry: Mapping[str, Any] | None) -> list[float] | None:
    """The chance entry's interval of the metric itself, the one a headline prints (None where it has none): "ci",
    except in entries written before assess_per_row for answers of several tokens with a mean length that is not a
    whole number (lengths that differ), whose "ci" was the margins' interval shifted onto the metric, the spread
    of the answer lengths (review 11b A1)."""
    if not isinstance(entry, Mapping):
        return None
    ci = entry.get("ci")
    ok = (isinstance(ci, (list, tuple)) and len(ci) == 2
          and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in ci))
    if not ok:
        return None
    tokens = entry.get("answer_tokens")
    shifted = ("margin" not in entry and entry.get("metric") == "logprob" and isinstance(tokens, (int, float))
               and abs(tokens - round(tokens)) > 1e-9)
    return None if shifted else [float(ci[0]), float(ci[1])]


def t_quantile(n: int | np.ndarray, *, alpha: float = ALPHA) -> float | np.ndarray:
    """The Student-t quantile t(1 - alpha/2, n - 1) of a two-sided (1 - alpha) interval of a mean of n
    values: a float for a whole number n, an array for an array of them; NaN where n < 2 (no interval)."""
    from scipy import stats

    count = np.asarray(n)
    q = np.where(count >= 2, stats.t.ppf(1 - alpha / 2, np.maximum(count - 1, 1)), np.nan)
    return float(q) if q.ndim == 0 else q


def t_half_width(sd: float | np.ndarray, n: int | np.ndarray, *, alpha: float = ALPHA) -> float | np.ndarray:
    """Half the (1 - alpha) Student-t interval of a mean from its sample sd (ddof=1) and n: t_quantile x sd /
    sqrt(n), element-wise over arrays of either; NaN where n < 2 (a NaN sd stays NaN)."""
    root = math.sqrt(max(int(n), 1)) if np.ndim(n) == 0 else np.sqrt(np.maximum(n, 1))
    return t_quantile(n, alpha=alpha) * sd / root


def se_interval(mean: float, se: float | None, n: int, *, alpha: float = ALPHA) -> list[float] | None:
    """The two-sided (1 - alpha) Student-t interval [lo, hi] of a mean from its standard error (sd / sqrt(n)) and n:
    mean -+ t_half_width(se x sqrt(n), n); None under two examples or for a missing or non-finite se."""
    if n < 2 or se is None or not math.isfinite(se):
        return None
    half = float(t_half_width(se * n ** 0.5, n, alpha=alpha))
    return [float(mean) - half, float(mean) + half]


def mean_interval(values: Sequence[float] | np.ndarray, *, alpha: float = ALPHA,
                  bounds: tuple[float, float] | None = None) -> list[float] | None:
    """The two-sided (1 - alpha) Student-t interval of the mean of the finite `values` ([lo, hi]; None
    for fewer than two): what a summary records beside a mean over examples; cut at `bounds` (`cut`)."""
    x = np.asarray(values, dtype=np.float64).ravel()
    x = x[np.isfinite(x)]
    if len(x) < 2:
        return None
    mean, half = float(x.mean()), t_half_width(float(x.std(ddof=1)), len(x), alpha=alpha)
    return cut([mean - half, mean + half], bounds)


def mean_intervals(values: np.ndarray, *, axis: int = -1, where: np.ndarray | None = None,
                   alpha: float = ALPHA) -> dict[str, np.ndarray]:
    """`mean_interval` along `axis` of `values`, over the entries `where` marks (default: the finite ones;
    a caller may keep infinities in): {"mean", "low", "high"} float64 and "n" int64, each of the shape
    without `axis`; low and high NaN under two entries (mean NaN with none)."""
    x = np.moveaxis(np.asarray(values, dtype=np.float64), axis, -1)  # [..., sample]
    real = np.isfinite(x) if where is None else np.moveaxis(np.asarray(where, dtype=bool), axis, -1)
    n = real.sum(-1)  # [...]
    count = np.maximum(n, 1)
    z = np.where(real, x, 0.0)  # [..., sample]: 0 where left out
    mean = np.where(n > 0, z.sum(-1) / count, np.nan)  # [...]
    sd = np.sqrt(np.where(real, (z - mean[..., None]) ** 2, 0.0).sum(-1) / np.maximum(n - 1, 1))  # [...]
    half = t_half_width(sd, n, alpha=alpha)
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": n.astype(np.int64)}


def clear_of(low: Any, high: Any, band: float) -> str | None:
    """What the interval [low, high] of a change clears, the one rule behind every "more than <band>"
    (kv's policies above or below the full cache, heads' pruning gain): "band" when it lies wholly
    beyond +band or wholly beyond -band (a change of more than the band), "zero" when it excludes 0 but
    reaches into the band (a change, not clearly more than the band), None when it reaches 0 or is
    missing (no change shown). A change and its band in the same units (relative or absolute)."""
    try:
        lo, hi = float(low), float(high)
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return None
    if lo > band or hi < -band:
        return "band"
    if lo > 0 or hi < 0:
        return "zero"
    return None


def inside(low: Any, high: Any, band: float) -> bool:
    """Whether the interval [low, high] of a change lies wholly inside [-band, +band]: the equivalence
    reading behind every "within <band>" (kv's holding budgets), the mirror of clear_of's "more than".
    A mean inside the band whose interval reaches beyond it is not shown to be within; a missing
    interval (fewer than 2 examples) shows nothing."""
    try:
        lo, hi = float(low), float(high)
    except (TypeError, ValueError):
        return False
    return math.isfinite(lo) and math.isfinite(hi) and -band <= lo and hi <= band

def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error over the tests given; NaN stays NaN and is not
    counted): the k-th smallest p times (m - k + 1), made monotone, capped at 1."""
    p = np.asarray(p_values, dtype=float)
    ok = np.flatnonzero(np.isfinite(p))
    out = np.full(p.shape, np.nan)
    running = 0.0
    for rank, i in enumerate(ok[np.argsort(p[ok], kind="stable")]):
        running = max(running, min(1.0, (len(ok) - rank) * p[i]))
        out[i] = running
    return out.tolist()


def fisher_p(k1: int, n1: int, k2: int, n2: int) -> float:
    """Two-sided p of Fisher's exact test that k1 of n1 and k2 of n2 come from one proportion (the 2 x 2
    table [[k1, n1 - k1], [k2, n2 - k2]]): counts too small for a normal approximation (e.g. 18 of 128
    neurons against 10 of 128) are tested exactly."""
    from scipy import stats

    return float(stats.fisher_exact([[int(k1), int(n1) - int(k1)], [int(k2), int(n2) - int(k2)]])[1])


def gap_within_noise(clean: Sequence[float] | np.ndarray | torch.Tensor, corrupted: Sequence[float] | np.ndarray | torch.Tensor,
                     metric: str, *, alpha: float = ALPHA) -> dict[str, Any] | None:
    """Whether the clean-corrupted gap that patching normalises by is within noise, from the paired
    per-example values: the two-sided (1 - alpha) t interval of the mean difference contains 0, or
    |mean gap| is under the metric's effect floor (FLOORS; normalized_logit_diff's raw values are logit
    differences). Returns None when the gap is clear, else {"gap", "ci" (None for one pair), "n_examples",
    "floor", "reason"}: a share of such a gap (effect / gap) is noise divided by noise."""
    diff = _flat(clean) - _flat(corrupted)  # [batch]
    diff = diff[np.isfinite(diff)]
    if len(diff) == 0:
        return None
    floor = FLOORS.get(metric.removeprefix("normalized_"), 0.0)
    gap, n = float(diff.mean()), int(len(diff))
    ci = mean_interval(diff, alpha=alpha)
    words = _WORDS.get(metric.removeprefix("normalized_"), metric)
    level = f"{100 * (1 - alpha):.0f}%"
    if ci is not None and ci[0] <= 0.0 <= ci[1]:
        reason = f"mean gap {gap:.3g} {words}, its {level} CI [{ci[0]:.3g}, {ci[1]:.3g}] over {n} pairs contains 0"
    elif abs(gap) < floor:
        reason = f"mean gap {gap:.3g} {words} over {n} pair(s) is under the {floor:.3g} floor"
    else:
        return None
    return {"gap": gap, "ci": ci, "n_examples": n, "floor": float(floor), "reason": reason}


def from_summary(summary: Mapping[str, Any], *, vocab_size: int | None = None) -> dict[str, Any] | None:
    """The guard from summary numbers alone, for results whose per-example values are not at hand:
    a probe's best accuracy against its majority baseline (exact binomial over n_scored, else n_examples; the best
    of L > 1 layers is tested Bonferroni-corrected: its (1 - alpha / L) interval, p_value = min(1, L x p) with
    p_value_uncorrected, correction, n_compared), else the
    clean mean of the task metric (baseline_metric, clean_metric unless normalised, metric_unevicted,
    dla_final_logit) against the effect floor."""
    metric = summary.get("metric")
    majority = summary.get("majority_baseline")
    if isinstance(majority, (int, float)) and metric == "accuracy" and f"best_{metric}" in summary:
        scored = summary.get("n_scored")  # the rows the probe was scored on (probes: not those it could not predict)
        layers = summary.get(f"{metric}_per_layer")
        compared = len(layers) if isinstance(layers, Mapping) and len(layers) > 1 else 1  # the best of these is tested
        out = assess_mean(summary[f"best_{metric}"], "accuracy",
                          n_examples=scored if isinstance(scored, int) else summary.get("n_examples"),
                          chance=float(majority), floor=0.02, alpha=ALPHA / compared)
        if out is not None:
            out["metric"] = "probe accuracy"
            if compared > 1 and out.get("p_value") is not None:  # review 15a B1: choosing the best layer is a choice
                raw = float(out["p_value"])
                out.update(correction="bonferroni", n_compared=compared, p_value_uncorrected=raw,
                           p_value=min(1.0, raw * compared), alpha=ALPHA)
        return out
    for key in ("baseline_metric", "clean_metric", "metric_unevicted", "dla_final_logit"):
        value = summary.get(key)
        if value is None or (key == "clean_metric" and summary.get("normalized")):
            continue
        kind = "logit_diff" if key == "dla_final_logit" else metric
        if kind in FLOORS:
            out = assess_mean(value, kind, n_examples=summary.get("n_examples"), vocab_size=vocab_size)
            return with_basis(out, task=summary.get("task"), vocab_size=vocab_size if kind != "logit_diff" else None,
                              answer_tokens=1.0 if kind == "logprob" else None)
    return None
