"""Tasks from the user's data (a JSONL/CSV/Parquet file, a pandas DataFrame, a `datasets.Dataset`
or a list of dicts) and task resolution.

Each example (row) has the fields
    prompt            text ending where the answer is predicted
    answer            the correct next token (one token under the model's tokenizer; byte-level BPE
                      tokenizers such as GPT-2's need the leading space: " Paris", not "Paris")
    corrupted_prompt  optional: a prompt of the same token length as this row's prompt whose answer
                      differs (for patching; only each clean/corrupted pair must match in length)
    wrong_answer      optional: the corrupted prompt's answer (needed for logit difference)
`fields` maps these names to the user's own column names ({"prompt": "text", "answer": "label"};
on the command line `--task-fields prompt=text,answer=label`). Every field is read as text: a CSV
"0" stays "0", a JSON number becomes str(number). Rows are numbered from 0 in messages (JSONL
messages also give the 1-based line). Prompts may tokenize to different lengths: a Task pads them
with an attention mask, decoders on the left (every row's answer is read at the last position; the
model derives each row's position ids from the mask) and encoders on the right. Words that become
the tokenizer's unknown token warn (TokenizationWarning), or with strict mode (`--strict`,
`strict=True`) raise a TokenizationError.

The rest of the data's path lives beside this module: task_sources.py (field mappings, TaskFile,
FieldMapped, what counts as task data) and task_rows.py (reading and checking rows, row numbers);
their public names are importable from here too.
"""
from __future__ import annotations

import logging
import os
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from headscope.analyses.core.task_rows import (
    _row_numbers,
    _rows,
    _scan,
    _source_records,
    read_numbered_rows,
    read_task_rows,
    sample_indices,  # noqa: F401  (re-exported: task_files' names stay importable from here)
)
from headscope.analyses.core.task_sources import (
    FIELDS,
    FORMATS,
    REQUIRED,
    FieldMapped,
    HeldTaskFile,
    TaskFile,
    _carried,
    describe,  # noqa: F401  (re-exported: position's analysis imports it from here)
    is_task_data,
    not_a_task,
    parse_fields,
    with_fields,
)
from headscope.analyses.core.tasks import ZOO_TASKS, Task, zoo
from headscope.errors import ConfigError, HeadscopeWarning, TaskFileError, TokenizationError, TokenizationWarning
from headscope.models.hooked_model import pad_id_of, pad_token_rows
from headscope.models.token_text import token_strings

log = logging.getLogger(__name__)


# ---- tokenizing ------------------------------------------------------------------------------
def _few(items: Sequence[Any], n: int = 5) -> str:
    shown = ", ".join(map(str, items[:n]))
    return shown + (f" and {len(items) - n} more" if len(items) > n else "")


def _answer_ids(model, text: str, row: int | str, label: str = "Task data", field: str = "answer", *,
                several: bool = False) -> list[int]:
    """The answer's token ids (no special tokens); more than one only where `several` allows (decoders'
    answers, scored by their whole continuation), else a TaskFileError naming the pieces."""
    ids = list(model.tokenizer(text, add_special_tokens=False)["input_ids"])
    if len(ids) == 1 or (several and ids):
        return ids
    where = row if isinstance(row, str) else f"row {row}"
    pieces = token_strings(model.tokenizer, ids)
    why = ("the wrong answer is compared with the answer as one next-token logit" if field == "wrong_answer"
           else "an encoder's answer is read as one token: headscope scores no continuation on an encoder")
    raise TaskFileError(f"{label}, {where}: {field} {text!r} is {len(ids)} tokens under this tokenizer ({pieces}); "
                        f"it must be one token here ({why}).")


def _tokens(model, seqs: list[list[int]], what: str, label: str = "Task data",
            places: Sequence[str] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[batch, pos] ids of token sequences and, for mixed lengths, the [batch, pos] attention mask
    (decoders left-padded, encoders right-padded; None when every sequence has the same length)."""
    places = list(places) if places is not None else [f"row {i}" for i in range(len(seqs))]
    lengths = [len(s) for s in seqs]
    facts = getattr(model, "facts", None)
    n_ctx = getattr(facts, "context_limit", getattr(facts, "n_ctx", None))  # None: no fixed context (ALiBi)
    long = [f"{place} has {n}" for n, place in zip(lengths, places) if n_ctx is not None and n > n_ctx]
    if long:
        raise TaskFileError(f"{label}: {what} longer than {model.name}'s context of {n_ctx} tokens ({_few(long)}); "
                            f"shorten them.")
    if len(set(lengths)) == 1:
        return torch.tensor(seqs, dtype=torch.int64), None  # [batch, pos]
    return pad_token_rows(seqs, pad_id_of(model.tokenizer), left=not model.facts.is_encoder)


def _prompt_ids(model, text: str) -> list[int]:
    return model.to_tokens(text, warn_unknown=False)[0].cpu().tolist()


def _warn_unknown(model, label: str, rows: list[dict[str, str]], places: Sequence[str], *, strict: bool = False) -> None:
    """A TokenizationWarning naming the words of any field that become the unknown token (where),
    or with strict a TokenizationError (one line) instead."""
    found: dict[str, list[str]] = {}
    for row, place in zip(rows, places):
        _collect_unknown(model, row, place, found)
    _report_unknown(model, label, found, strict=strict)


def _collect_unknown(model, row: Mapping[str, str], place: str, found: dict[str, list[str]]) -> None:
    """Add to `found` (word -> where) the words of the row's fields that become the unknown token."""
    from headscope.models.token_text import unknown_words

    for field in FIELDS:
        if field in row:
            for word in unknown_words(model.tokenizer, row[field]):
                found.setdefault(word, []).append(f"{place} {field}")


def _report_unknown(model, label: str, found: Mapping[str, list[str]], *, strict: bool) -> None:
    if found:
        words = ", ".join(f"{w!r} ({_few(where, 2)})" for w, where in list(found.items())[:8])
        more = f" and {len(found) - 8} more" if len(found) > 8 else ""
        message = (f"{label}: {len(found)} word(s) are not in {model.name}'s vocabulary and become "
                   f"{model.tokenizer.unk_token!r}: {words}{more}")
        if strict:
            raise TokenizationError(f"{message}; strict mode refuses them: rephrase those rows, or run without strict mode.")
        warnings.warn(f"{message}; results on those examples mean little.", TokenizationWarning, stacklevel=4)


def build_task(model, rows: list[dict[str, str]], *, name: str, label: str = "Task data",
               places: Sequence[str] | None = None, strict: bool = False) -> Task:
    """A Task from rows under headscope's field names, tokenized with the model's tokenizer: prompts of
    mixed lengths padded (decoders left, encoders right) with an attention mask, each corrupted
    prompt padded as its clean prompt (a pair must have one length)."""
    places = list(places) if places is not None else [f"row {i}" for i in range(len(rows))]
    _warn_unknown(model, label, rows, places, strict=strict)
    decoder = not model.facts.is_encoder
    if decoder:
        _warn_glued(model, label, rows, places)
    answer_ids = [_answer_ids(model, r["answer"], p, label, several=decoder) for r, p in zip(rows, places)]
    several = max(map(len, answer_ids)) > 1
    # answers of several tokens: each prompt goes on with all but the last answer token (teacher forcing)
    extra = [a[:-1] for a in answer_ids]
    prompts = [_prompt_ids(model, r["prompt"]) for r in rows]
    tokens, mask = _tokens(model, [p + e for p, e in zip(prompts, extra)],
                           "prompts and answers" if several else "prompts", label, places)
    answers = torch.tensor([a[-1] for a in answer_ids])  # [batch]
    continuation = None
    if several:
        width = max(map(len, answer_ids))
        continuation = torch.tensor([[-1] * (width - len(a)) + a for a in answer_ids])  # [batch, k], right-aligned
    corrupted = wrong = paired = None
    if all("corrupted_prompt" in r for r in rows):
        seqs = [_prompt_ids(model, r["corrupted_prompt"]) for r in rows]
        seqs, paired = _pairs(seqs, prompts, places, label, strict=strict)
        corrupted = _tokens(model, [c + e for c, e in zip(seqs, extra)], "corrupted prompts", label, places)[0]
    wrong_cont = None
    if all("wrong_answer" in r for r in rows):
        if several:
            warnings.warn(f"{label}: answers of several tokens are scored by the log-probability of their whole "
                          f"continuation; the wrong answers are not used by that metric (logit difference compares one "
                          f"next token), only by the chance guard: the answer's log-probability against the wrong "
                          f"answer's.", HeadscopeWarning, stacklevel=2)
            wrong_ids = [_answer_ids(model, r["wrong_answer"], p, label, "wrong_answer", several=True)
                         for r, p in zip(rows, places)]
            span = max(map(len, wrong_ids))
            wrong_cont = torch.tensor([[-1] * (span - len(a)) + a for a in wrong_ids])  # [batch, k_w], right-aligned
        else:
            wrong = torch.tensor([_answer_ids(model, r["wrong_answer"], p, label, "wrong_answer")[0]
                                  for r, p in zip(rows, places)])
    return Task(
        name=name, tokens=tokens, answers=answers, corrupted_tokens=corrupted, wrong_answers=wrong,
        metric="logit_diff" if wrong is not None else "logprob", attention_mask=mask, continuation=continuation,
        paired=paired, source_rows=_row_numbers(places), wrong_continuation=wrong_cont,
        rows_layout=_json_layout(label, places),
    )


def _warn_glued(model, label: str, rows: list[dict[str, str]], places: Sequence[str]) -> None:
    """One HeadscopeWarning when answers would be glued to their prompt's last word: neither the prompt
    ends in whitespace nor the answer starts with it, and the tokenizer writes a word's leading space
    into its token (byte-level BPE, SentencePiece), so "on the" + "mat" is scored as "on themat"."""
    glued = [i for i, r in enumerate(rows) if r["prompt"][-1:].strip() and r["answer"][:1].strip()]
    if not glued:
        return
    encode = lambda text: list(model.tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    answer = rows[glued[0]]["answer"]
    if encode(" " + answer) == encode(answer):  # word-level or WordPiece: words are tokens either way
        return
    tail = word_tail(rows[glued[0]]["prompt"])
    warnings.warn(f"{label}: {len(glued)} of {len(rows)} answer(s) start without a space and their prompt ends without "
                  f"one ({_few([places[i] for i in glued], 3)}), so {tail!r} + {answer!r} is scored as one "
                  f"word ({tail + answer!r}); this tokenizer needs the space in the answer: "
                  f"{' ' + answer!r}.", HeadscopeWarning, stacklevel=3)


def _json_layout(label: str, places: Sequence[str]) -> str | None:
    """How a .json task file was read (review 15b C2: the rows note named both): "json list" where its rows' places
    are the list's index ("row 3"), "json lines" where they are lines ("line 5, row 3"); None for other sources."""
    if not re.search(r"\.json'$", label, flags=re.IGNORECASE) or not places:
        return None
    return "json lines" if all(p.startswith("line ") for p in places) else "json list"


def word_tail(text: str, limit: int = 12) -> str:
    """The end of `text` in whole words, as many as fit in `limit` characters (at least the last word), with
    "…" in front where words were left out (review 12c C7: a cut at 12 characters read "e map in the")."""
    words = text.split(" ")
    kept = [words.pop()]
    while words and len(" ".join([words[-1], *kept])) <= limit:
        kept.insert(0, words.pop())
    return ("…" if words else "") + " ".join(kept)


def _pairs(seqs: list[list[int]], prompts: list[list[int]], places: Sequence[str], label: str, *,
           strict: bool) -> tuple[list[list[int]], torch.Tensor | None]:
    """(corrupted prompts' ids, Task.paired): a corrupted prompt of another token length than its prompt
    is no pair; its row keeps its prompt as a stand-in and paired False, with one HeadscopeWarning
    naming those rows (strict: a TaskFileError instead). paired is None when every row is a pair."""
    bad = [(i, len(p), len(c)) for i, (c, p) in enumerate(zip(seqs, prompts)) if len(c) != len(p)]
    if not bad:
        return seqs, None
    named = _few([f"{places[i]}: {n} vs {m} tokens" for i, n, m in bad], 8)
    message = (f"{label}: {len(bad)} corrupted prompt(s) have another token length than their prompt "
               f"({named})")
    if strict:
        raise TaskFileError(f"{message}; patching needs each clean and corrupted prompt pair to have one length "
                            f"(strict mode refuses them; without it those rows are left out of patching only).")
    warnings.warn(f"{message}; the analyses that patch pairs leave those rows out, the others use every row.",
                  HeadscopeWarning, stacklevel=3)
    paired = torch.ones(len(seqs), dtype=torch.bool)
    paired[[i for i, _, _ in bad]] = False
    return [c if ok else p for c, p, ok in zip(seqs, prompts, paired.tolist())], paired


def _default_name(source: Any) -> str:
    if isinstance(source, FieldMapped):
        source = source.data
    if isinstance(source, (str, os.PathLike)):
        return Path(source).stem
    module = type(source).__module__.split(".")[0]
    return {"pandas": "dataframe", "datasets": "dataset"}.get(module, "records")


def load_task(model, source: Any, fields: Mapping[str, str] | str | None = None, *, n_examples: int | None = None,
              seed: int = 0, name: str | None = None, strict: bool | None = None) -> Task:
    """A Task from the user's data, tokenized with `model`'s tokenizer.

    source: a .jsonl/.json/.csv/.tsv/.parquet path (.json: JSON lines or one array of objects), a pandas
    DataFrame, a `datasets.Dataset`, a list of dicts, a Task (returned as is, or subsampled) or a
    zoo task name (`zoo`, 64 examples unless n_examples). fields: headscope field -> your column, e.g.
    {"prompt": "text", "answer": "label"} or "prompt=text,answer=label". n_examples: a seeded random
    subset of that many rows (all rows when None or larger; a file is streamed, so only those rows
    are held and tokenized). Every field is read as text. Words the tokenizer maps to its unknown
    token raise a TokenizationWarning naming them (strict=True, or a TaskFile made with strict: a
    TokenizationError instead). An answer of several tokens (decoders) is scored by the log-probability
    of its whole continuation: each prompt goes on with all but the last answer token, and
    `task.continuation` [batch, k] holds the answer tokens (metric "logprob"; wrong answers, which
    logit difference compares as one next token, are then not used, with a warning). Prompts of
    different token lengths are padded, with `task.attention_mask` [batch, pos] (1 on real tokens): decoders on the left, so every
    row's answer is read at the last position (the model derives position ids from the mask),
    encoders on the right. A corrupted prompt must have its own clean prompt's length (pairs only)
    and shares its padding.
    """
    if n_examples is not None and n_examples < 1:
        raise ConfigError(f"n_examples must be >= 1, got {n_examples}.")
    if isinstance(source, str) and not isinstance(source, TaskFile) and source in ZOO_TASKS and fields is None:
        return zoo(model, source, n_examples=n_examples or 64, seed=seed)
    if isinstance(source, Task):
        if n_examples is None or n_examples >= len(source):
            return source
        keep = torch.randperm(len(source), generator=torch.Generator().manual_seed(seed))[:n_examples].sort().values
        sample = source.rows(keep)
        return sample if sample.source_rows is not None else replace(sample, source_rows=keep)  # the given Task's rows
    label, rows, places, count = _rows(source, fields, n_examples=n_examples, seed=seed)
    if len(rows) < count:
        log.info("%s: a seeded sample of %d of its %d rows (seed %d; n_examples sets how many)", label, len(rows), count, seed)
    strict = bool(strict if strict is not None else _carried(source, "strict"))
    return build_task(model, rows, name=name or _default_name(source), label=label, places=places, strict=strict)


def one_token_rows(model, source: Any) -> tuple[list[int], int, int, int]:
    """(the row numbers of `source` whose answer, and wrong answer where the data gives them, is one token under
    `model`'s tokenizer; how many rows it has; its longest answer in tokens; how many rows have an answer of several
    tokens): which rows an analysis that reads one
    next-token answer can use (contract.one_token_plan). Every row is read (a task file held in memory is read
    from memory); only the answers are tokenized."""
    tok = model.tokenizer
    count = lambda text: len(tok(text, add_special_tokens=False)["input_ids"])  # noqa: E731 - as _answer_ids counts
    rows = read_numbered_rows(source)
    keep, longest, several = [], 0, 0
    for i, row in enumerate(rows):
        n = count(row["answer"])
        longest, several = max(longest, n), several + (n > 1)
        if n == 1 and ("wrong_answer" not in row or count(row["wrong_answer"]) == 1):
            keep.append(row["row"] if row["row"] is not None else i)
    return keep, len(rows), longest, several


def check_vocabulary(model, source: Any, fields: Mapping[str, str] | str | None = None) -> None:
    """Strict mode over a whole data source (every row, not a sample): a TokenizationError naming the
    words of any field that become `model`'s unknown token."""
    fields = parse_fields(fields if fields is not None else getattr(source, "fields", None))
    label, records = _source_records(source)
    found: dict[str, list[str]] = {}  # streamed: memory holds the words found, not the rows
    _scan(label, records(), fields, lambda i: False, visit=lambda row, place: _collect_unknown(model, row, place, found))
    _report_unknown(model, label, found, strict=True)


def load_task_file(model, path: str | Path, fields: Mapping[str, str] | str | None = None) -> Task:
    """A Task from a task file (a TaskFile brings its own fields), tokenized with the model's tokenizer."""
    return load_task(model, path, fields)



# ---- one prompt, or tensors -------------------------------------------------------------------
PROMPT_FIELDS = ("prompt", "answer", "corrupted_prompt", "wrong_answer")  # what `takes_prompt` adds to an analysis


def prompt_task(model, prompt: str | Sequence[str], answer: str | Sequence[str] | None = None,
                corrupted_prompt: str | Sequence[str] | None = None, wrong_answer: str | Sequence[str] | None = None,
                *, name: str = "prompt", strict: bool = False) -> Task:
    """A Task of one prompt (or a list of prompts, each other field then a list as long), tokenized
    as a task file's rows are (build_task): `answer` the next token (" Paris", leading space for
    byte-level BPE; several tokens: scored by their whole continuation), `corrupted_prompt` of the
    prompt's token length (patching), `wrong_answer` its answer (logit difference; else log-prob).
    Without `answer`, the prompt's last token is the answer and the rest the prompt."""
    many = not isinstance(prompt, str)
    prompts = list(prompt) if many else [prompt]
    columns = {"answer": answer, "corrupted_prompt": corrupted_prompt, "wrong_answer": wrong_answer}
    rows: list[dict[str, str]] = [{"prompt": p} for p in prompts]
    for field_name, value in columns.items():
        if value is None:
            continue
        values = [value] if isinstance(value, str) else list(value)
        if isinstance(value, str) == many or len(values) != len(prompts):
            shape = f"a list of {len(prompts)} strings" if many else "a string"
            raise ConfigError(f"prompt_task: {field_name} must be {shape} like the prompt, got {value!r}.")
        for row, text in zip(rows, values):
            row[field_name] = text
    if not prompts or any(not isinstance(p, str) or not p.strip() for p in prompts):
        raise ConfigError(f"prompt_task: the prompt must be non-empty text, got {prompt!r}.")
    if answer is None:
        if corrupted_prompt is not None or wrong_answer is not None:
            raise ConfigError("prompt_task: corrupted_prompt and wrong_answer need answer= (the clean prompt's next token).")
        return tensor_task(model, [model.to_tokens(p)[0] for p in prompts], name=name)
    places = ["the prompt"] if not many else [f"prompt {i}" for i in range(len(prompts))]
    return build_task(model, rows, name=name, label="Prompt", places=places, strict=strict)


def _ids(value: Any, what: str) -> torch.Tensor:
    try:
        ids = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        raise ConfigError(f"{what} must be token ids (a tensor or list of ints), got {type(value).__name__}.") from None
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
        raise ConfigError(f"{what} must be integer token ids, got dtype {ids.dtype}.")
    return ids.to(torch.int64).cpu()


def tensor_task(model, tokens: Any, answers: Any = None, corrupted_tokens: Any = None, wrong_answers: Any = None,
                *, name: str = "tokens") -> Task:
    """A Task from token ids: tokens [batch, pos] or [pos] (or a list of [pos] rows, left-padded for
    decoders), answers [batch] (or one int), corrupted_tokens like tokens, wrong_answers like answers.
    Without answers: a decoder predicts each row's last token from the rest (metric "logprob");
    an encoder scores the cosine of its pooled embedding (no answers)."""
    if isinstance(tokens, (list, tuple)) and tokens and not isinstance(tokens[0], int):
        rows = [_ids(t, "tokens").reshape(-1).tolist() for t in tokens]
        mask = None
        if len({len(r) for r in rows}) > 1:
            if answers is None and not model.facts.is_encoder:
                rows, last = [r[:-1] for r in rows], [r[-1] for r in rows]
                ids, mask = pad_token_rows(rows, pad_id_of(model.tokenizer), left=True)
                return Task(name=name, tokens=ids, answers=torch.tensor(last), metric="logprob", attention_mask=mask)
            ids, mask = pad_token_rows(rows, pad_id_of(model.tokenizer), left=not model.facts.is_encoder)
        else:
            ids = torch.tensor(rows, dtype=torch.int64)
        tokens = ids
    else:
        tokens, mask = _ids(tokens, "tokens"), None
    tokens = tokens[None] if tokens.ndim == 1 else tokens  # [batch, pos]
    if tokens.ndim != 2 or tokens.shape[1] == 0:
        raise ConfigError(f"tokens must have shape [batch, pos] or [pos], got {tuple(tokens.shape)}.")
    corrupted = None if corrupted_tokens is None else _ids(corrupted_tokens, "corrupted_tokens")
    corrupted = corrupted[None] if corrupted is not None and corrupted.ndim == 1 else corrupted
    if answers is None:
        if wrong_answers is not None:
            raise ConfigError("wrong_answers need answers (the clean prompts' next tokens).")
        if model.facts.is_encoder:
            return Task(name=name, tokens=tokens, metric="cosine", attention_mask=mask)
        if tokens.shape[1] < 2:
            raise ConfigError("tokens without answers need at least 2 positions: the last token is the answer.")
        return Task(name=name, tokens=tokens[:, :-1], answers=tokens[:, -1], metric="logprob",
                    corrupted_tokens=None if corrupted is None else corrupted[:, :-1],
                    attention_mask=None if mask is None else mask[:, :-1])
    answers = _ids(answers, "answers").reshape(-1)
    wrong = None if wrong_answers is None else _ids(wrong_answers, "wrong_answers").reshape(-1)
    return Task(name=name, tokens=tokens, answers=answers, corrupted_tokens=corrupted, wrong_answers=wrong,
                metric="logit_diff" if wrong is not None else "logprob", attention_mask=mask)


def one_prompt(model, task: Any = None, *, prompt: Any = None, answer: Any = None, corrupted_prompt: Any = None,
               wrong_answer: Any = None, tokens: bool = True) -> Any:
    """Task resolution's one-prompt entry: `task` as a Task where it is one-prompt input, else as given.

    - prompt= (or a prompt string, or a list of them, as `task` with answer=): prompt_task(model,
      prompt, answer, corrupted_prompt, wrong_answer);
    - a tuple (tokens, answers[, corrupted_tokens[, wrong_answers]]) of ids: tensor_task;
    - a bare token tensor [batch, pos] (tokens=True): tensor_task, the last token the answer.
    Anything else (a Task, a task name or file, a DataFrame, None) comes back unchanged."""
    extra = {"answer": answer, "corrupted_prompt": corrupted_prompt, "wrong_answer": wrong_answer}
    prompts = isinstance(task, (list, tuple)) and bool(task) and all(isinstance(t, str) for t in task)
    if prompt is None and (isinstance(task, str) or prompts) and answer is not None:
        prompt, task = task, None
    if prompt is not None:
        if task is not None:
            raise ConfigError("give the prompt either as the task or as prompt=, not both.")
        return prompt_task(model, prompt, **extra)
    given = [k for k, v in extra.items() if v is not None]
    if given:
        raise ConfigError(f"{', '.join(given)} go with a prompt: pass prompt= (or the prompt string as the task).")
    if isinstance(task, tuple) and task and all(isinstance(t, (torch.Tensor, list, int)) or t is None for t in task):
        if len(task) > 4:
            raise ConfigError(f"a task tuple is (tokens, answers[, corrupted_tokens[, wrong_answers]]), got {len(task)} items.")
        return tensor_task(model, *task)
    if tokens and isinstance(task, torch.Tensor):
        return tensor_task(model, task)
    return task


def takes_prompt(fn: Callable[..., Any] | None = None, *, tokens: bool = True) -> Any:
    """Decorate an analysis `fn(model, task, ...)` so that it also takes one prompt: the keywords
    prompt, answer, corrupted_prompt, wrong_answer, a prompt string as `task` with answer=, or a tuple
    of token tensors, each made a Task by `one_prompt` before `fn` runs. tokens=False leaves a bare
    token tensor to `fn` (the heads analysis scores it by its LM loss)."""
    import functools
    import inspect

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(model, *args, prompt=None, answer=None, corrupted_prompt=None, wrong_answer=None, **kwargs):
            task = args[0] if args else kwargs.pop("task", None)
            task = one_prompt(model, task, prompt=prompt, answer=answer, corrupted_prompt=corrupted_prompt,
                              wrong_answer=wrong_answer, tokens=tokens)
            return fn(model, task, *args[1:], **kwargs)

        sig = inspect.signature(fn)
        params = list(sig.parameters.values())
        if len(params) > 1 and params[1].default is inspect.Parameter.empty:  # task becomes optional
            params[1] = params[1].replace(default=None)
        new = [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None) for k in PROMPT_FIELDS]
        at = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params))
        wrapper.__signature__ = sig.replace(parameters=params[:at] + new + params[at:])
        return wrapper

    return wrap if fn is None else wrap(fn)


def resolve_task(model, task: Any = None, *, default: str = "kv", n_examples: int = 64, seed: int = 0,
                 fields: Mapping[str, str] | str | None = None, strict: bool | None = None, **kw) -> Task:
    """The Task an analysis runs on: a Task as given; a zoo task name (n_examples, seed and kw go
    to `zoo`); the user's data (a task file path or TaskFile, DataFrame, Dataset or list of dicts,
    read with `fields` and `strict` by load_task: a seeded sample of n_examples rows when it has more,
    so an analysis's --n-examples and --quick sizes apply to task files too); token ids (a [batch,
    pos] tensor or a tuple (tokens, answers[, corrupted[, wrong]]), `one_prompt`); or `default` when None."""
    task = one_prompt(model, task)
    if isinstance(task, Task):
        return task
    if task is None:
        task = default
    if isinstance(task, str) and not isinstance(task, TaskFile) and task in ZOO_TASKS:
        if fields:
            raise ConfigError(f"task fields apply to task files and data sets, not to the zoo task {task!r}.")
        return zoo(model, task, n_examples=n_examples, seed=seed, **kw)
    if is_task_data(task):
        return load_task(model, task, fields, n_examples=n_examples, seed=seed, strict=strict)
    raise not_a_task(task)


__all__ = [
    "FIELDS", "FORMATS", "PROMPT_FIELDS", "REQUIRED", "FieldMapped", "HeldTaskFile", "TaskFile", "build_task", "check_vocabulary",
    "is_task_data", "load_task", "load_task_file", "not_a_task", "one_prompt", "one_token_rows", "parse_fields", "prompt_task",
    "read_numbered_rows", "read_task_rows", "resolve_task", "takes_prompt", "tensor_task", "with_fields",
]
