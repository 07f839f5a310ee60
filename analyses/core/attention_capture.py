"""The attention explorer's activations: every layer's pattern on a few examples.

`capture_examples(model, source, more_tasks=...)` runs one forward pass per example (padding
removed; one longer than `max_tokens` shows its first token and its end, `kept_positions`) and returns
`Captured`: each example's tokens and patterns (integers, round(p * SCALE), trailing zeros of each query's row
dropped) and the per-head sums the explorer's grid shows. For a report, `capture_shown(model, shown)` captures every task
the report's sections used (`Shown`, built by the runner, analyses/core/runner.py): each task's
sample prompts first (the ones the sections' provenance lines show, always captured), then a few
more of its examples while the stored values stay under MAX_VALUES. reports/explorer.py turns a
Captured into the explorer's data and writes it: reports only draw.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from headscope.errors import ConfigError
from headscope.hooks import capture, site
from headscope.models.hooked_model import layer_windows, visible_keys
from headscope.models.token_text import prompt_label

SCALE = 10_000
MAX_VALUES = 400_000  # stored pattern values beyond which no other task's example is added (~2 MB of JSON)
SAMPLE_TOKENS = 128  # a section's sample prompt is kept whole up to this length (and the model's context)
# when its patterns alone fit MAX_VALUES


@dataclass(frozen=True)
class Captured:
    """examples: [{tokens, n_tokens_total, truncated, task, patterns: [layer][head][query] -> [int]}];
    sink, peak: [n_layers, n_heads] sums over the examples of each head's mean weight on the first
    token and mean largest weight (a decoder's first query left out); source: the first task's label."""

    examples: list[dict[str, Any]]  # a report's (capture_shown) also: task_name, sections, sample_of
    sink: torch.Tensor
    peak: torch.Tensor
    source: str


def _is_task_name(value: str) -> bool:
    from headscope.analyses.core.task_files import FORMATS
    from headscope.analyses.core.tasks import ZOO_TASKS

    return value in ZOO_TASKS or value in ("sentences", "repeat") or Path(value).suffix.lower() in FORMATS


def _task_rows(model, task: Any, max_examples: int, seed: int = 0) -> tuple[list[torch.Tensor], str]:
    """(token rows with padding removed, task name) of a Task, a task name, the user's task data
    (a task file, DataFrame, Dataset, list of dicts), or None (the heads analysis's default task)."""
    rows, name, _ = _task_rows_pieces(model, task, max_examples, seed)
    return rows, name


def _task_rows_pieces(model, task: Any, max_examples: int,
                      seed: int = 0) -> tuple[list[torch.Tensor], str, dict[tuple[int, ...], int]]:
    """_task_rows with {a row's token ids: its teacher-forced answer pieces} for the rows of several-token answers."""
    from headscope.analyses.core.task_files import is_task_data, resolve_task
    from headscope.analyses.core.tasks import Task

    if is_task_data(task):
        from headscope.analyses.core.contract import quiet_sample_warnings

        with quiet_sample_warnings():  # its own sample: the analyses warn about the rows they use
            task = resolve_task(model, task)
    if not isinstance(task, Task):
        from headscope.analyses.heads.analysis import HeadsConfig, default_task

        task = default_task(model, task, HeadsConfig.preset(quick=True, seed=seed))
    tokens = task.tokens[:max_examples]
    rows = list(tokens)
    if task.attention_mask is not None:
        mask = task.attention_mask[:max_examples].bool()
        rows = [row[m] for row, m in zip(tokens, mask)]
    pieces = {} if task.continuation is None else {
        tuple(int(t) for t in row): int((cont >= 0).sum()) - 1
        for row, cont in zip(rows, task.continuation[:max_examples]) if int((cont >= 0).sum()) > 1}
    return rows, task.name, pieces


def _rows_and_pieces(model, source: Any, max_examples: int,
                     seed: int = 0) -> tuple[list[torch.Tensor], str, dict[tuple[int, ...], int]]:
    """example_rows with the answer pieces of a task's rows ({} for prompts and token tensors)."""
    if isinstance(source, torch.Tensor) or (isinstance(source, str) and not _is_task_name(source)) or (
            isinstance(source, (list, tuple)) and (not source or all(isinstance(s, str) for s in source))):
        return (*example_rows(model, source, max_examples, seed), {})
    return _task_rows_pieces(model, source, max_examples, seed)


def example_rows(model, source: Any, max_examples: int, seed: int = 0) -> tuple[list[torch.Tensor], str]:
    """Token rows ([pos] each) and a label for: a prompt, a list of prompts, a [batch, pos] or
    [pos] token tensor, a Task, a zoo task name or a task file (None: the model's default task)."""
    if isinstance(source, torch.Tensor):
        rows = source.unsqueeze(0) if source.ndim == 1 else source
        if rows.ndim != 2:
            raise ConfigError(f"tokens must have shape [batch, pos] or [pos], got {tuple(source.shape)}.")
        return list(rows[:max_examples]), "tokens"
    if isinstance(source, (list, tuple)) and not source:
        raise ConfigError("attention_explorer_data got an empty list; pass a prompt, prompts, tokens or a task.")
    if isinstance(source, str) and not _is_task_name(source):
        return [model.to_tokens(source)[0]], "prompt"
    if isinstance(source, (list, tuple)) and source and all(isinstance(s, str) for s in source):
        return [model.to_tokens(s)[0] for s in source[:max_examples]], "prompts"
    return _task_rows(model, source, max_examples, seed)


def kept_positions(n_total: int, max_tokens: int) -> list[int]:
    """The positions an example of `n_total` tokens shows within `max_tokens`: all of them when they fit, else the first
    token (the sink every query can see) and the last max_tokens - 1, where a task's query and answer position are
    (review 14c C5: json_kv's first 64 of 108 tokens left out the query and the answer position)."""
    if n_total <= max_tokens:
        return list(range(n_total))
    return [0] + list(range(n_total - max_tokens + 1, n_total)) if max_tokens > 1 else [n_total - 1]


def capture_example(model, row: torch.Tensor, max_tokens: int,
                    pieces: int = 0) -> tuple[dict[str, Any], torch.Tensor, torch.Tensor]:
    """(the example's dict, its sink [L, H], its mean largest weight [L, H]) of one token row [pos]; pieces: how many
    of the row's last tokens are a several-token answer's teacher-forced pieces (Task.continuation), whose first
    index the dict gives as answer_from where they are shown (the explorer marks them). A row longer than max_tokens
    runs whole and shows the queries and keys of `kept_positions` (its first token and its end), their original
    positions as the dict's `positions` and the cut ones as `cut` [first, last]: a shown query's weights on the cut
    keys are not drawn. The sink is the mean weight on the first token over the shown queries that can see it (a
    sliding-window layer's queries within window - 1 of it, models.layer_windows; a decoder's first query, which sees
    only itself, left out)."""
    f = model.facts
    sites = [site("pattern", l) for l in range(f.n_layers)]
    n_total = int(row.shape[0])
    kept = kept_positions(n_total, max_tokens)
    cut = len(kept) < n_total
    full = row.reshape(1, -1)
    with torch.no_grad():  # the whole row, its kept queries only: the patterns of the prompt itself
        acts = capture(model, model.check_tokens(full), sites, positions=kept if cut else None, to_cpu=True)
    whole = torch.stack([acts[s][0] for s in sites]).float()  # [L, H, q kept, k all]
    pat = whole[..., kept]  # [L, H, q kept, k kept]
    pos = torch.tensor(kept)  # [q kept] original positions
    q0 = 1 if (not f.is_encoder and n_total > 1) else 0  # a decoder's first query sees only itself
    ints = torch.round(pat * SCALE).to(torch.int32).tolist()
    for layer in ints:
        for head in layer:
            for q, keys in enumerate(head):
                end = len(keys)
                while end > 1 and keys[end - 1] == 0:
                    end -= 1
                head[q] = keys[:end]
    shown = full[0, kept]
    text = prompt_label(model.tokenizer, shown.tolist())
    if cut:  # the first token's label (none for a BOS), then the end after "…"
        first = prompt_label(model.tokenizer, shown[:1].tolist())
        text = (f"{first} " if first else "") + "\u2026 " + prompt_label(model.tokenizer, shown[1:].tolist())
    example = {"tokens": [str(t) for t in model.to_str_tokens(shown)], "n_tokens_total": n_total,
               "text": text,  # the prompt list's label
               "truncated": cut, "patterns": ints}
    if cut:
        example.update(positions=kept, cut=[kept[0] + 1, kept[1] - 1] if len(kept) > 1 else [0, n_total - 2])
    start = n_total - pieces
    forced = [i for i, p in enumerate(kept) if p >= start > 0]  # the shown answer pieces
    if 0 < pieces < n_total and forced:  # review 11b C1: where the user's prompt ends
        example["answer_from"] = forced[0]
        example["prompt_text"] = prompt_label(model.tokenizer, full[0, :start].tolist())
        example["answer_text"] = prompt_label(model.tokenizer, full[0, start:].tolist())
    sees = torch.stack([(pos >= q0) & visible_keys(pos, 0, w) for w in layer_windows(model)]).float()  # [L, q kept]
    sink = (pat[..., 0] * sees[:, None, :]).sum(-1) / sees.sum(-1).clamp_min(1.0)[:, None]  # [L, H]
    later = pos >= q0  # [q kept]
    peak = whole[..., later, :].max(-1).values.mean(-1) if bool(later.any()) else whole.max(-1).values.mean(-1)
    return example, sink, peak


def _n_values(example: Mapping[str, Any]) -> int:
    return sum(len(r) for layer in example["patterns"] for head in layer for r in head)


def capture_examples(model, source: Any = None, *, max_examples: int = 3, max_tokens: int = 64, seed: int = 0,
                     more_tasks: Mapping[str, Any] | None = None, more_examples: int = 2) -> Captured:
    """Every layer's attention pattern on up to `max_examples` examples of `source` (see example_rows),
    then `more_examples` of each of `more_tasks` ({label: task}) while the stored values stay under
    MAX_VALUES (a task of more_tasks with the first one's name labels the first examples instead)."""
    if max_examples < 1 or max_tokens < 1:
        raise ConfigError(f"max_examples and max_tokens must be >= 1, got {max_examples} and {max_tokens}.")
    f = model.facts
    rows, source_label, pieces = _rows_and_pieces(model, source, max_examples, seed)
    examples = []
    sink = torch.zeros(f.n_layers, f.n_heads)
    peak = torch.zeros(f.n_layers, f.n_heads)
    stored = 0
    more = [(str(label), task) for label, task in (more_tasks or {}).items()]
    same = [label for label, task in more if getattr(task, "name", None) == source_label]  # the first task again
    groups = [(same[0] if same else source_label, rows, None)] + [(label, None, task) for label, task in more
                                                                  if label not in same]
    for label, group, task in groups:
        if group is None:
            if stored >= MAX_VALUES:
                break
            group, _, found = _rows_and_pieces(model, task, more_examples, seed)
            pieces = {**pieces, **found}
        for row in group:
            if task is not None and stored >= MAX_VALUES:
                break
            example, s, m = capture_example(model, row, max_tokens, pieces.get(tuple(int(t) for t in row), 0))
            example["task"] = label
            examples.append(example)
            stored += _n_values(example)
            sink += s
            peak += m
    return Captured(examples=examples, sink=sink, peak=peak, source=source_label)


@dataclass(frozen=True)
class Shown:
    """One task a report's explorer shows. task: its name (as the sections' provenance names it);
    sections: the report sections that ran on it, in report order; samples: ((row [pos], sections whose
    provenance line shows this row as its sample), ...), padding removed; rows: its other examples
    ([pos] each, padding removed), of which a few are added after every task's samples; pieces: {a row's token
    ids: how many of its last tokens are teacher-forced answer pieces} (rows of several-token answers only)."""

    task: str
    sections: tuple[str, ...]
    samples: tuple[tuple[torch.Tensor, tuple[str, ...]], ...]
    rows: tuple[torch.Tensor, ...] = ()
    pieces: Mapping[tuple[int, ...], int] = field(default_factory=dict)  # row's token ids -> its answer pieces


def capture_shown(model, shown: Sequence[Shown], *, more_examples: int = 2, max_tokens: int = 64) -> Captured:
    """Every layer's attention pattern on each task of `shown`: its sample prompts first (every one,
    whatever the budget: a head a section names can always be opened on its prompt; each whole up to
    SAMPLE_TOKENS tokens when its patterns alone fit MAX_VALUES, else its first `max_tokens`), then up to
    `more_examples` of its other rows (a row equal to a sample skipped), task by task, while the stored
    values stay under MAX_VALUES. One forward pass per example. Examples are listed task by task, samples
    first; each carries task (the label: name and sections), task_name, sections and sample_of (the
    sections whose sample it is; [] for the other examples)."""
    if not shown:
        raise ConfigError("capture_shown needs at least one task to show.")
    f = model.facts
    sink, peak = torch.zeros(f.n_layers, f.n_heads), torch.zeros(f.n_layers, f.n_heads)
    groups: list[list[dict[str, Any]]] = [[] for _ in shown]
    stored = 0

    def whole(row: torch.Tensor) -> int:  # a sample's tokens: all of them when they fit, else max_tokens
        n = int(row.shape[0])
        values = f.n_layers * f.n_heads * (n * n if f.is_encoder else n * (n + 1) // 2)
        return n if n <= min(SAMPLE_TOKENS, f.n_ctx) and values <= MAX_VALUES else max_tokens

    def add(i: int, row: torch.Tensor, sample_of: tuple[str, ...]) -> None:
        nonlocal stored, sink, peak
        entry = shown[i]
        example, s, m = capture_example(model, row, max(max_tokens, whole(row)) if sample_of else max_tokens,
                                        entry.pieces.get(tuple(int(t) for t in row), 0))
        example.update(task=f"{entry.task} ({', '.join(entry.sections)})", task_name=entry.task,
                       sections=list(entry.sections), sample_of=list(sample_of))
        groups[i].append(example)
        stored += _n_values(example)
        sink, peak = sink + s, peak + m

    for i, entry in enumerate(shown):
        for row, sections in entry.samples:
            add(i, row, sections)
    for i, entry in enumerate(shown):
        seen = {tuple(int(t) for t in row[:max_tokens]) for row, _ in entry.samples}
        added = 0
        for row in entry.rows:
            if added >= more_examples or stored >= MAX_VALUES:
                break
            key = tuple(int(t) for t in row[:max_tokens])
            if key in seen:
                continue
            seen.add(key)
            add(i, row, ())
            added += 1
    examples = [e for group in groups for e in group]
    return Captured(examples=examples, sink=sink, peak=peak, source=shown[0].task)


__all__ = ["MAX_VALUES", "SAMPLE_TOKENS", "SCALE", "Captured", "Shown", "capture_example", "capture_examples", "capture_shown",
           "example_rows", "kept_positions"]
