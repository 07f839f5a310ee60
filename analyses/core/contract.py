"""The task contract: what an analysis needs from a model and a task, checked before it runs.

Each family declares `NEEDS = Needs(...)` beside its config class; `check(needs, task, model)`
returns the reasons the analysis cannot use `task` on `model` (an empty list when it can).
`headscope report` checks every analysis before running any: an analysis that cannot run on the
model at all (`model_reasons`: a decoder-only analysis on an encoder) is skipped with its reason,
and one that cannot use the user's task runs on its own default task instead, except that one reading one
next-token answer runs on the user's rows whose answer is one token where there are MIN_ONE_TOKEN_ROWS of them
(`one_token_plan`).
"""
from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from headscope.analyses.core.tasks import ZOO_TASKS, Task, no_pairs_reason, zoo
from headscope.errors import HeadscopeWarning, InputTypeError, TaskError, UnsupportedModelError
from headscope.models.readout import readout_reason


@dataclass(frozen=True, kw_only=True)
class Needs:
    """What an analysis needs.

    answers / wrong_answers / corrupted: the Task fields it reads (one answer token per prompt, the
      corrupted prompts' answers, corrupted prompts of the prompts' shape);
    spans: span names it reads (e.g. "subject");
    labels: it decodes the answers as class labels (`min_classes` distinct answers at least);
    min_examples: the fewest examples it can use (resample ablation, cross-validation folds);
    decoder: it reads next-token logits or a KV cache, so it cannot run on an encoder at all;
    next_token: it scores tasks with next-token logits on decoders (answers needed) and with the
      cosine metric on encoders, which read a task's prompts only (its answers are not scored: Reads);
    task_data: it can run on a prompt/answer Task (False: only on its own data, e.g. position's
      retrieval sweeps); names: task names it reads itself (e.g. position's "kv");
    english: its own data is English text, so the tokenizer must encode English without its unknown
      token (a tokenizer with the zoo vocabulary has zoo data instead); english_text: (model) -> (what
      the data is, its text, how to run on other data), the text checked for this model, or None where this
      model's default data needs no English (position's decoders: word_kv stands in where the tokenizer cannot
      write the key-value prompt, and own_data says where nothing fits; review 17b C2); without it, ENGLISH_PROBE;
    own_data: (model) -> why the family's own data cannot be built for this model's tokenizer, or None
      (position: no default sweep fits it); the analysis is then skipped with that reason, not failed;
    own_records: (model, path, config) -> why a JSONL file of the family's own records does not fit this model
      under the family's config (None: its defaults), or None (position: retrieval records on an encoder,
      multi-document QA records on a decoder, read by the loaders the run uses, at its n_items); such a file is the
      family's data, not a prompt/answer task (`takes_own_records`);
    continuation: it scores answers of several tokens by their whole continuation (Task.continuation:
      the metric reads the last k positions); False: it reads one next-token answer at the last position;
    what: what it does, for messages ("measures next-token answers");
    linear_readout: what of it reads the residual stream linearly into the logits ("the logit lens and direct logit
      attribution"), so it cannot run on post-LN blocks nor without a hooked final norm (models.readout: skipped,
      one line); "" where nothing does;
    model_gap: (model) -> why it cannot read this model's layers (mlp: a mixture-of-experts layout its memories do not
      read, GPT-OSS's), or None; skipped with that reason before any work (review 19b A1).
    """

    answers: bool = True
    wrong_answers: bool = False
    corrupted: bool = False
    spans: tuple[str, ...] = ()
    labels: bool = False
    min_examples: int = 1
    min_classes: int = 0
    decoder: bool = False
    next_token: bool = False
    task_data: bool = True
    names: tuple[str, ...] = ()
    english: bool = False
    english_text: Callable[[Any], tuple[str, str, str] | None] | None = None
    own_data: Callable[[Any], str | None] | None = None
    own_records: Callable[[Any, str, Any], str | None] | None = None
    continuation: bool = False
    what: str = ""
    linear_readout: str = ""
    model_gap: Callable[[Any], str | None] | None = None


@dataclass(frozen=True, kw_only=True)
class Reads:
    """Which parts of a prompt/answer Task an analysis actually reads, for its section's provenance
    (reports/provenance.py): a part the task has and the analysis does not read is named as unused,
    and the sample line leaves it out.

    answers: it reads the answers (and, with logit difference, the wrong answers); answers_as: how,
      where they are not scored as next tokens ("as class labels");
    corrupted: it reads the corrupted prompts (clean/corrupted pairs);
    why: why the unused parts are not read ("headscope scores encoders by their pooled embedding");
    metric: what it scores, in words, where the task's own metric does not say it (encoders).
    A family declares `reads(model, config, summary) -> Reads` (Family.reads); the default reads the
    answers, and the corrupted prompts where its Needs ask for them.
    """

    answers: bool = True
    answers_as: str = ""
    corrupted: bool = False
    why: str = ""
    metric: str = ""


ENCODER_SCORING = ("headscope scores encoders by their pooled embedding; it reads a masked-LM head (heads, attribution) "
                   "only where every prompt holds exactly one mask token and gives a one-token answer")


ENGLISH_PROBE = "Extract the value corresponding to the specified key in the JSON object below."


def model_reasons(needs: Needs, model: Any, task: Any = None, config: Any = None) -> list[str]:
    """Why the analysis cannot run on `model` whatever the task (empty when it can). Where the reason is the
    family's own default data (the English check, own_data) and `task` is a file of its own records that fits the
    model (takes_own_records, task_reasons under `config`), that data is not read: empty (the route the skip reasons
    name, review 15c A3)."""
    facts = model.facts
    if needs.decoder and facts.is_encoder:
        why = f": it {needs.what}" if needs.what else ""
        return [f"{facts.name} is an encoder and this analysis needs a decoder{why}"]
    gap = readout_reason(model, needs.linear_readout) if needs.linear_readout else None
    gap = gap or (needs.model_gap(model) if needs.model_gap is not None else None)
    if gap:  # review 16d A4: OPT's post-LN blocks (or a final norm the bridge does not hook), before any work
        return [gap]
    reasons = _default_data_reasons(needs, model)
    if reasons and task is not None and takes_own_records(needs, task) and not task_reasons(needs, task, model, config):
        return []
    return reasons


def _default_data_reasons(needs: Needs, model: Any) -> list[str]:
    """Why the family's own default data cannot be used on `model`: its words, or own_data (empty when it can)."""
    if needs.english and not _zoo_vocabulary(model):
        from headscope.models.token_text import unknown_words, visible_word

        if needs.english_text is not None:  # the data this model would run on, None where it needs no English
            own = needs.english_text(model)
        else:
            own = (f"{ENGLISH_PROBE!r}, English as this analysis's own data", ENGLISH_PROBE,
                   "it cannot run on this tokenizer")
        if own is not None:  # named with its unknown words, counted, and the way round
            what, text, instead = own
            lost = unknown_words(model.tokenizer, text)
            if lost:
                n = len(set(text.split()))
                return [f"{model.name}'s tokenizer maps {len(lost)} of the {n} distinct words of {what} to its unknown "
                        f"token ({', '.join(map(visible_word, lost[:4]))}{', ...' if len(lost) > 4 else ''}); {instead}"]
    gap = needs.own_data(model) if needs.own_data is not None else None
    return [gap] if gap else []


def _zoo_vocabulary(model: Any) -> bool:
    try:
        zoo(model, "kv", n_examples=1)
    except TaskError:
        return False
    return True


RECORD_SUFFIXES = (".jsonl", ".json")


def takes_own_records(needs: Needs, task: Any) -> bool:
    """Whether `task` is a JSONL path that the analysis reads as its own records (Needs.own_records)."""
    return (needs.own_records is not None and isinstance(task, (str, os.PathLike))
            and Path(task).suffix.lower() in RECORD_SUFFIXES)


def task_reasons(needs: Needs, task: Task | str, model: Any, config: Any = None) -> list[str]:
    """Why the analysis cannot use `task` (a Task, a task name, or a file of its own records) on `model` (empty
    when it can); `config`: the family's config a file of its own records is checked under (None: its defaults)."""
    if isinstance(task, str) and task in needs.names:
        return []
    if takes_own_records(needs, task):
        gap = needs.own_records(model, os.fspath(task), config)
        return [gap] if gap else []
    if not needs.task_data:
        own = f" ({needs.what})" if needs.what else ""
        if needs.own_records is None:
            return [f"it runs on its own data{own}, not on prompt/answer tasks"]
        # review 16c B3: a file that itself places its answers early / middle / late is still not swept
        return [f"it runs on its own data{own}, not on prompt/answer tasks: each row of one is a fixed prompt with "
                "its answer where the row put it, so placements the file varies itself (early, middle, late) are not "
                "read either; its --task takes a JSONL file of its own records"]
    if not isinstance(task, Task):
        raise InputTypeError(f"task_reasons takes a Task or one of {needs.names}, got {task!r}; read data with resolve().")
    reasons = []
    if needs.answers and task.answers is None:
        reasons.append("the task has no answers")
    if needs.wrong_answers and task.wrong_answers is None:
        reasons.append("the task has no wrong answers (needed for logit difference)")
    if needs.corrupted and task.corrupted_tokens is None:
        reasons.append("the task has no corrupted prompts")
    elif needs.corrupted and len(task.unpaired) == len(task):
        reasons.append(no_pairs_reason(task))
    if task.continuation is not None and not needs.continuation:
        reasons.append(several_tokens_reason(task))
    missing = [s for s in needs.spans if s not in task.spans]
    if missing:
        reasons.append(f"the task marks no {', '.join(map(repr, missing))} span")
    if len(task) < needs.min_examples:
        reasons.append(f"the task has {len(task)} example(s); it needs at least {needs.min_examples}")
    if needs.labels and task.answers is None and not needs.answers:
        reasons.append("the task has no answers to use as labels")
    if needs.labels and task.answers is not None:
        values, counts = torch.unique(task.answers, return_counts=True)
        n, repeated = len(values), int((counts >= 2).sum())
        if n < needs.min_classes:
            reasons.append(f"the task's answers take {n} distinct value(s); it needs at least {needs.min_classes} classes")
        elif repeated < needs.min_classes:
            reasons.append(f"only {repeated} of the task's answers occur more than once; cross-validated probes need "
                           f"at least {needs.min_classes} answers seen twice or more")
    if needs.next_token and not model.facts.is_encoder and task.answers is None and not needs.answers:
        reasons.append("the task has no answers to score with next-token logits")
    return reasons


def several_tokens_reason(task: Task) -> str:
    """Why an analysis that reads one next-token answer cannot use `task`'s answers of several tokens."""
    return (f"the task's answers are up to {task.n_answer_tokens} tokens long and this analysis reads one "
            f"next-token answer at the last position (heads and patching score the whole continuation)")


MIN_ONE_TOKEN_ROWS = 8  # the fewest one-token rows a section runs on alone (its t-intervals, --quick's samples of 8)
SUBSET_MARK = "): only the rows "  # in a plan's line "your task (x.jsonl): only the rows whose answer is one token ..."


def one_token_plan(needs: Needs, task: Any, checked: Task, model: Any, *, seed: int = 0,
                   counted: dict | None = None) -> tuple[Any, str]:
    """The one rule for an analysis that reads one next-token answer, given the user's data with answers of
    several tokens on some rows (`checked`: the plan's sample of it, whose only obstacle is those answers).

    Returns (a task_sources.RowSubset of the rows whose answer, and wrong answer where given, is one token under
    the tokenizer, or for a ready-made Task the Task of those rows (one_token_task); the provenance text "only the
    rows whose answer is one token under this tokenizer, 20 of its 40 (...)") when there are MIN_ONE_TOKEN_ROWS of
    them and the analysis can use them; else (None, the fallback reason, which counts them and names the minimum);
    (None, "") where the rule does not apply (no several-token answers, or neither user data nor a Task). counted: a
    dict the caller keeps across analyses, so the rows are counted once."""
    from headscope.analyses.core.task_files import is_task_data, one_token_rows
    from headscope.analyses.core.task_sources import RowSubset

    if checked.continuation is None or needs.continuation or not (isinstance(task, Task) or is_task_data(task)):
        return None, ""
    counted = {} if counted is None else counted
    if "rows" not in counted:
        counted["rows"] = task_one_token_rows(task) if isinstance(task, Task) else one_token_rows(model, task)
    rows, n, longest, n_several = counted["rows"]
    reason = several_tokens_reason(checked)
    if len(rows) < MIN_ONE_TOKEN_ROWS:
        return None, (f"{reason}; only {len(rows)} of its {n} rows have a one-token answer, fewer than the "
                      f"{MIN_ONE_TOKEN_ROWS} it needs to run on those rows alone")
    subset = one_token_task(task, rows) if isinstance(task, Task) else RowSubset(task, rows)
    left = task_reasons(needs, resolve(subset, model, seed=seed), model)
    if left:
        return None, f"{reason}; its {len(rows)} rows with a one-token answer cannot be used either: {'; '.join(left)}"
    others = n - len(rows)
    span = "2 tokens" if longest == 2 else f"2-{longest} tokens"
    what = (f"answers of {span}" if n_several == others
            else f"answers of {span} or wrong answers of several tokens")
    return subset, (f"only the rows whose answer is one token under this tokenizer, {len(rows)} of its {n} (the other "
                    f"{others} have {what}; this analysis reads one next-token answer)")


def task_one_token_rows(task: Task) -> tuple[list[int], int, int, int]:
    """one_token_rows of a ready-made Task (its wrong answers are one token each by construction): (the indices of
    the rows whose answer is one token, the Task's rows, its longest answer in tokens, the rows with several)."""
    k = [1] * len(task) if task.continuation is None else [int(v) for v in (task.continuation >= 0).sum(1)]  # [batch]
    return [i for i, n in enumerate(k) if n == 1], len(task), max(k, default=0), sum(n > 1 for n in k)


def one_token_task(task: Task, rows: list[int]) -> Task:
    """The Task of `task`'s rows `rows`, whose answers are one token: no continuation (each prompt already ends where
    its answer is read), and the left-padding columns no kept row uses dropped (spans shifted to match)."""
    kept = task.rows(torch.tensor(rows, dtype=torch.long))
    start = int(kept.first_positions().min()) if kept.attention_mask is not None and len(kept) else 0
    if kept.attention_mask is not None and not bool(kept.attention_mask[:, -1].bool().all()):
        start = 0  # right padding (encoders): the columns stay as they are
    cut = lambda t: None if t is None else t[:, start:]  # noqa: E731
    return dataclasses.replace(
        kept, tokens=kept.tokens[:, start:], corrupted_tokens=cut(kept.corrupted_tokens),
        attention_mask=cut(kept.attention_mask), spans={k: v - start for k, v in kept.spans.items()}, continuation=None,
        wrong_continuation=None)


def one_token_answers(task: Task, name: str) -> None:
    """Raise TaskError when `task` has answers of several tokens, which analysis `name` cannot score."""
    if task.continuation is not None:
        raise TaskError(f"{name}: {several_tokens_reason(task)}; give one-token answers, or run heads or patching.")


SAMPLE_WARNINGS = (r".*corrupted prompt\(s\) have another token length", r".*answer\(s\) start without a space")


@contextmanager
def quiet_sample_warnings():
    """Hide the load warnings that count rows of a sample (SAMPLE_WARNINGS) while the task data is
    read for something other than an analysis's own rows (the task check, the explorer's examples):
    their counts would contradict the warning of the rows an analysis uses (#34: 6 vs 4 rows)."""
    with warnings.catch_warnings():
        for message in SAMPLE_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=HeadscopeWarning)
        yield


def resolve(task: Any, model: Any, *, n_examples: int = 64, seed: int = 0) -> Task | None:
    """The Task `check` compares against: a Task as is, a zoo task name built with `zoo`, the user's
    data read with load_task (its errors are the user's, raised here), None for None.

    The warnings that count rows of the sample (pairs of two token lengths, answers glued to their
    prompt) are not shown here (quiet_sample_warnings): this sample is the check's own, not the rows
    an analysis uses (one source: the rows actually used, which each analysis's load warns about and
    its summary records)."""
    if task is None or isinstance(task, Task):
        return task
    if isinstance(task, str) and task in ZOO_TASKS and not getattr(task, "fields", None):
        return zoo(model, task, n_examples=n_examples, seed=seed)
    from headscope.analyses.core.task_files import load_task

    with quiet_sample_warnings():
        return load_task(model, task, n_examples=n_examples, seed=seed)  # a sample: a large file is not tokenized whole


def check(needs: Needs, task: Any, model: Any) -> list[str]:
    """Every reason the analysis cannot use `task` on `model`: the model's first, then the task's
    (a Task, a task name in needs.names, or anything `resolve` reads; None checks the model only)."""
    reasons = model_reasons(needs, model, task)
    if task is None:
        return reasons
    if not (isinstance(task, str) and task in needs.names) and needs.task_data:
        task = resolve(task, model)
    return reasons + task_reasons(needs, task, model)


def require(needs: Needs, model: Any, name: str) -> None:
    """Raise UnsupportedModelError when analysis `name` cannot run on `model` at all."""
    reasons = model_reasons(needs, model)
    if reasons:
        raise UnsupportedModelError(f"{name}: {'; '.join(reasons)}.")


__all__ = ["ENCODER_SCORING", "MIN_ONE_TOKEN_ROWS", "Needs", "RECORD_SUFFIXES", "Reads", "SUBSET_MARK",
           "check", "model_reasons", "one_token_answers", "one_token_plan", "one_token_task", "quiet_sample_warnings",
           "require", "resolve",
           "several_tokens_reason", "takes_own_records", "task_one_token_rows", "task_reasons"]
