"""Tasks: the prompts an analysis runs on, with their answers, spans and metric.

A Task is data, not behaviour: token ids for clean prompts (and corrupted prompts of the
same length), the correct and incorrect answer ids at the final position, and marked spans.
Builders for the zoo's synthetic tasks live here too (`zoo`).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import torch

from headscope.errors import TaskError
from headscope.models.hooked_model import first_real_positions, pad_id_of, pad_token_rows

CONTINUATION_METRICS = ("logprob", "accuracy")  # the metrics that can score an answer of several tokens


@dataclass(frozen=True, kw_only=True, repr=False)
class Task:
    """Prompts plus what the model should answer at their last position.

    tokens:           [batch, pos] int64, clean prompts, ending where the answer is predicted.
    corrupted_tokens: [batch, pos] int64 or None, same shape as tokens.
    answers:          [batch] int64, the correct next token (with `continuation`: its last token).
    wrong_answers:    [batch] int64 or None, the answer of the corrupted prompt (or a distractor).
    spans:            name -> [batch, 2] int64 half-open [start, end) token ranges
                      (e.g. "subject", "gold", "names").
    name:             short identifier used in reports ("kv", "induction", ...).
    metric:           "logit_diff" (answers vs wrong_answers), "logprob", "accuracy", or "cosine"
                      (encoders: cosine similarity of the pooled embedding to the unmodified model's).
    attention_mask:   [batch, pos] or None; 1 for real tokens. Prompts of mixed lengths are padded:
                      decoders on the left (every row ends at the last position, where its answer is
                      read; the model derives position ids from the mask), encoders on the right.
                      Corrupted prompts share their clean prompt's padding; spans are in padded
                      coordinates.
    continuation:     [batch, k] int64 or None: answers of several tokens, scored by the log-probability
                      of the whole continuation (teacher forcing). The prompt already ends with all
                      but the last answer token, so the last k positions predict the answer's tokens;
                      each row's answer is right-aligned, a shorter one preceded by -1. `answers` is
                      the last column (what position -1 predicts). Decoders only; metric "logprob" or
                      "accuracy" (every token the argmax).
    paired:           [batch] bool or None (every row paired): False where the user's corrupted prompt has
                      another token length than its prompt, so the row has no corrupted pair (its
                      corrupted_tokens row repeats the clean one); the analyses that patch pairs take
                      `pairs()`, the others use every row.
    source_rows:      [batch] int64 or None: each row's row number in the user's data (0-based, as the
                      task-file messages number them: "line 4, row 3"; a seeded sample keeps the file's
                      numbers); None: the rows are numbered as the Task's own. Summaries name rows by it.
    rows_layout:      how a .json task file was read: "json list" (rows are the list's index) or
                      "json lines" (blank lines not counted); None for other sources.
    wrong_continuation: [batch, k_w] int64 or None: with `continuation`, each row's wrong answer as token ids,
                      right-aligned as continuation (-1 before a shorter one). No metric scores it (logit difference
                      compares one next token); the chance guard compares each answer's log-probability with its
                      wrong answer's (chance.against_wrong_answers).
    """

    name: str
    tokens: torch.Tensor
    answers: torch.Tensor | None = None
    corrupted_tokens: torch.Tensor | None = None
    wrong_answers: torch.Tensor | None = None
    spans: Mapping[str, torch.Tensor] = field(default_factory=dict)
    metric: str = "logit_diff"
    attention_mask: torch.Tensor | None = None
    continuation: torch.Tensor | None = None
    paired: torch.Tensor | None = None
    source_rows: torch.Tensor | None = None
    wrong_continuation: torch.Tensor | None = None
    rows_layout: str | None = None  # a .json task file read as "json list" or "json lines" (review 15b C2)

    def __post_init__(self) -> None:
        if self.tokens.ndim != 2 or self.tokens.shape[0] == 0:
            raise TaskError(
                f"Task {self.name!r}: tokens must be a non-empty [batch, pos] tensor, "
                f"got shape {tuple(self.tokens.shape)}."
            )
        if self.corrupted_tokens is not None and self.corrupted_tokens.shape != self.tokens.shape:
            raise TaskError(
                f"Task {self.name!r}: clean tokens {tuple(self.tokens.shape)} and corrupted tokens "
                f"{tuple(self.corrupted_tokens.shape)} differ in shape; pad or trim them to the same length."
            )
        if self.answers is None and self.metric != "cosine":
            raise TaskError(f"Task {self.name!r}: metric {self.metric!r} needs answers= (one token id per prompt).")
        if self.answers is not None and self.answers.shape != (self.tokens.shape[0],):
            raise TaskError(
                f"Task {self.name!r}: answers must have shape [batch]={self.tokens.shape[0]}, "
                f"got {tuple(self.answers.shape)}."
            )

        if self.continuation is not None:
            self._check_continuation()
        if self.paired is not None and (self.corrupted_tokens is None or self.paired.shape != (self.tokens.shape[0],)):
            raise TaskError(f"Task {self.name!r}: paired must be a [batch] bool tensor beside corrupted_tokens.")
        if self.source_rows is not None and self.source_rows.shape != (self.tokens.shape[0],):
            raise TaskError(f"Task {self.name!r}: source_rows must be a [batch] tensor of row numbers.")
        wrong = self.wrong_continuation
        if wrong is not None and (self.continuation is None or wrong.ndim != 2 or wrong.shape[0] != self.tokens.shape[0]
                                  or bool((wrong[:, -1] < 0).any())):
            raise TaskError(f"Task {self.name!r}: wrong_continuation must be [batch, k] ids beside continuation, "
                            "right-aligned (no -1 in its last column).")

    def _check_continuation(self) -> None:
        cont, n = self.continuation, self.tokens.shape[0]
        if cont.ndim != 2 or cont.shape[0] != n or cont.shape[1] > self.tokens.shape[1]:
            raise TaskError(f"Task {self.name!r}: continuation must be [batch={n}, k <= pos], got {tuple(cont.shape)}.")
        if self.metric not in CONTINUATION_METRICS:
            raise TaskError(
                f"Task {self.name!r}: metric {self.metric!r} compares one next token; answers of several tokens "
                f"are scored with {' or '.join(map(repr, CONTINUATION_METRICS))} (the whole continuation)."
            )
        if bool((cont[:, -1] < 0).any()) or (self.answers is not None and not torch.equal(cont[:, -1], self.answers)):
            raise TaskError(f"Task {self.name!r}: continuation's last column must be the answers (no -1 there).")

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __repr__(self) -> str:
        """One line, as print(model) and repr(Result) (review 12c C2: the dataclass repr printed every tensor):
        name, examples, real tokens per row and the padding side, answer tokens, metric and the fields set.
        A Task of no rows cannot be built (__post_init__), but repr never raises: one restored around the check
        (object.__new__, as pickle does) still prints."""
        n, width = self.tokens.shape
        if n == 0:
            return f"Task({self.name!r}: 0 examples)"
        mask = self.attention_mask
        lengths = [width] * n if mask is None else [int(v) for v in mask.sum(1)]
        span = f"{min(lengths)}" if min(lengths) == max(lengths) else f"{min(lengths)}-{max(lengths)}"
        if mask is None or bool(mask.bool().all()):
            pad = "unpadded"
        else:
            side = "left" if bool(mask[:, -1].bool().all()) else "right" if bool(mask[:, 0].bool().all()) else "mixed"
            pad = f"{side}-padded to {width}"
        if self.continuation is not None:
            k = [int(v) for v in (self.continuation >= 0).sum(1)]
            answers = f"answers of {min(k)}" + ("" if min(k) == max(k) else f"-{max(k)}") + " tokens"
        else:
            answers = "no answers" if self.answers is None else "answers of 1 token"
        fields = [f for f in ("corrupted_tokens", "wrong_answers", "wrong_continuation", "paired", "source_rows")
                  if getattr(self, f) is not None]
        if self.spans:
            fields.append("spans " + "/".join(self.spans))
        if self.paired is not None:
            fields[fields.index("paired")] = f"paired ({int(self.paired.sum())} of {n})"
        return (f"Task({self.name!r}: {n} example{'s' if n != 1 else ''}, {span} tokens {pad}, {answers}, "
                f"metric={self.metric!r}" + (f"; {', '.join(fields)}" if fields else "") + ")")

    @property
    def answer_tokens(self) -> torch.Tensor | None:
        """What the metrics score: [batch, k] continuation ids (-1 = none) for answers of several tokens,
        else [batch] answer ids (None without answers)."""
        return self.continuation if self.continuation is not None else self.answers

    @property
    def n_answer_tokens(self) -> int:
        """How many last positions the metrics read (1 for one-token answers)."""
        return 1 if self.continuation is None else int(self.continuation.shape[1])

    @property
    def padded(self) -> bool:
        """Whether any row has padding (attention_mask with a 0)."""
        return self.attention_mask is not None and not bool(self.attention_mask.bool().all())

    def answer_positions(self) -> torch.Tensor:
        """[batch] int64: each row's last real position, where its answer is read (the last column
        without a mask or under left padding; the end of the real tokens under right padding)."""
        n_pos = self.tokens.shape[1]
        if self.attention_mask is None:
            return torch.full((len(self),), n_pos - 1, dtype=torch.int64)
        return (n_pos - 1 - self.attention_mask.cpu().bool().flip(1).int().argmax(1)).to(torch.int64)

    def first_positions(self) -> torch.Tensor:
        """[batch] int64: each row's first real position (its padding length under left padding)."""
        return first_real_positions(self.attention_mask, len(self))

    @property
    def unpaired(self) -> list[int]:
        """The rows whose corrupted prompt is no pair for their prompt (another token length)."""
        return [] if self.paired is None else torch.nonzero(~self.paired.bool()).flatten().tolist()

    @property
    def unpaired_rows(self) -> list[int]:
        """`unpaired` as the user's data numbers those rows (source_rows; the Task's own indices without it):
        what summaries report, so they match the warning that named the rows."""
        rows = self.unpaired
        return rows if self.source_rows is None else [int(self.source_rows[i]) for i in rows]

    def pairs(self, what: str = "this analysis") -> tuple[Task, int]:
        """(the Task of the rows with a corrupted pair, how many rows were left out): what the analyses
        that patch pairs run on. A TaskError when no row has a pair."""
        left_out = self.unpaired
        if not left_out:
            return (self if self.paired is None else replace(self, paired=None)), 0
        if len(left_out) == len(self):
            raise TaskError(no_pairs_reason(self) + f"; {what} patches clean/corrupted pairs of one token length.")
        keep = torch.nonzero(self.paired.bool()).flatten()
        return replace(self.rows(keep), paired=None), len(left_out)

    def rows(self, index: slice | torch.Tensor | Sequence[int]) -> Task:
        """The Task of the rows `index` selects (a slice, indices or a bool mask), every field with them."""
        pick = lambda t: None if t is None else t[index]  # noqa: E731
        return replace(
            self, tokens=self.tokens[index], answers=pick(self.answers), corrupted_tokens=pick(self.corrupted_tokens),
            wrong_answers=pick(self.wrong_answers), spans={k: v[index] for k, v in self.spans.items()},
            attention_mask=pick(self.attention_mask), continuation=pick(self.continuation), paired=pick(self.paired),
            source_rows=pick(self.source_rows), wrong_continuation=pick(self.wrong_continuation))

    def example(self, i: int) -> Task:
        """Row i alone, its padding removed (spans shifted to match): what running one example means."""
        keep = slice(None) if self.attention_mask is None else self.attention_mask[i].bool()  # [pos]
        start = int(self.first_positions()[i])
        pick = lambda t: None if t is None else t[i:i + 1]  # noqa: E731
        cont = None if self.continuation is None else self.continuation[i][self.continuation[i] >= 0][None]
        wrong = None if self.wrong_continuation is None else self.wrong_continuation[i][self.wrong_continuation[i] >= 0][None]
        return Task(
            name=self.name, tokens=self.tokens[i, keep][None], answers=pick(self.answers),
            corrupted_tokens=None if self.corrupted_tokens is None else self.corrupted_tokens[i, keep][None],
            wrong_answers=pick(self.wrong_answers), spans={k: v[i:i + 1] - start for k, v in self.spans.items()},
            metric=self.metric, attention_mask=None, continuation=cont, paired=pick(self.paired),
            source_rows=pick(self.source_rows), wrong_continuation=wrong,
        )


def no_pairs_reason(task: Task) -> str:
    """Why a Task whose every corrupted prompt has another token length cannot be patched."""
    return (f"every corrupted prompt of task {task.name!r} has another token length than its prompt "
            f"({len(task)} of {len(task)} rows), so no clean/corrupted pair is left")


ZOO_TASKS = ("kv", "induction", "facts", "ioi")


def zoo(model, task: str, n_examples: int = 64, seed: int = 0, **kw) -> Task:
    """A Task over the zoo's synthetic data, tokenized with `model.tokenizer` (word level).

    task: "kv" (kw: n_pairs=8), "induction" (kw: length=24, position=length // 2, corrupt="copied" or
    "trigger": which first-half token the corrupted prompt changes, see zoo.data.induction_example),
    "facts" or "ioi" (kw: split="eval", the name pairs held out from training).
    Every prompt of one Task has the same length; corrupted prompts flip the answer
    (another queried key, another subject, the other name repeated), and wrong_answers are
    the corrupted prompts' answers. Spans: kv "gold", "pairs", "query"; induction "source",
    "first", "repeat"; facts "subject", "relation"; ioi "names", "io", "s1", "s2".
    """
    from headscope.models.zoo import data

    if task not in ZOO_TASKS:
        raise TaskError(f"unknown zoo task {task!r}; valid tasks: {', '.join(ZOO_TASKS)}")
    if n_examples < 1:
        raise TaskError(f"n_examples must be >= 1, got {n_examples}")
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise TaskError("zoo tasks need a model with a .tokenizer (a zoo model's word-level tokenizer)")
    if task == "kv":
        kw.setdefault("n_pairs", 8)
    elif task == "induction":
        kw.setdefault("length", 24)
        kw.setdefault("position", kw["length"] // 2)
    elif task == "ioi":
        kw.setdefault("split", "eval")
    exs = list(data.examples(task, n_examples, seed=seed, **kw))

    def encode(words_batch: list[tuple[str, ...]]) -> torch.Tensor:
        ids = [tokenizer.convert_tokens_to_ids(list(words)) for words in words_batch]
        unk = tokenizer.unk_token_id
        # A tokenizer without an unknown token (byte-level BPE: GPT-2, Llama 3, Qwen) returns None.
        if any(i is None or (unk is not None and i == unk) for row in ids for i in row):
            raise TaskError(
                "model's tokenizer does not cover the zoo vocabulary (got unknown or missing ids); "
                "zoo tasks need a zoo model (e.g. 'zoo/synth-llama')"
            )
        return torch.tensor(ids, dtype=torch.int64)  # [batch, pos]

    tokens = encode([e.prompt for e in exs])  # [batch, pos]
    corrupted = encode([e.corrupted for e in exs])  # [batch, pos]
    answers = encode([(e.answer,) for e in exs])[:, 0]  # [batch]
    wrong = encode([(e.corrupted_answer,) for e in exs])[:, 0]  # [batch]
    spans = {
        key: torch.tensor([e.spans[key] for e in exs], dtype=torch.int64)  # [batch, 2]
        for key in exs[0].spans
    }
    return Task(
        name=task, tokens=tokens, corrupted_tokens=corrupted, answers=answers,
        wrong_answers=wrong, spans=spans, metric="logit_diff",
    )


def prompts_only(task: Task) -> Task:
    """`task`'s prompts under the cosine metric (an encoder's pooled embedding against the unmodified
    model's): what headscope scores on an encoder, which reads no masked-LM head, so the answers,
    wrong answers and corrupted prompts are dropped. A cosine Task is returned as is."""
    if task.metric == "cosine":
        return task
    return Task(name=task.name, tokens=task.tokens, spans=task.spans, metric="cosine",
                attention_mask=task.attention_mask, source_rows=task.source_rows)


def shipped_sentences() -> list[str]:
    """The shipped English sentence set (analyses/data/sentences.txt, one per line; lines starting
    with # are comments), used where no task fits the model, e.g. to score encoders."""
    from importlib import resources

    text = (resources.files("headscope.analyses") / "data" / "sentences.txt").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def with_bos(model, ids: list[int]) -> list[int]:
    """ids with the BOS in front as to_tokens would give them (model.bos_prefix; none to add where they start with it)."""
    prefix = model.bos_prefix()
    return [*prefix, *ids] if prefix and (not ids or ids[0] != prefix[0]) else ids


def sentence_task(model, sentences: Sequence[str] | None = None, *, n_examples: int | None = None,
                  seed: int | None = None) -> Task:
    """Sentences as a padded Task (the shipped set when None; seed: a seeded order; n_examples: the
    first n). Encoders (right-padded): the cosine metric over whole sentences (pooled embedding vs the
    unmodified model's). Decoders (left-padded, BOS added as to_tokens adds it): each sentence without its last token is
    the prompt and that token the answer (log-probability)."""
    sentences = list(shipped_sentences() if sentences is None else sentences)
    if seed is not None:
        order = torch.randperm(len(sentences), generator=torch.Generator().manual_seed(seed)).tolist()
        sentences = [sentences[i] for i in order]
    if n_examples is not None:
        if n_examples < 1:
            raise TaskError(f"n_examples must be >= 1, got {n_examples}.")
        sentences = sentences[:n_examples]
    if not sentences:
        raise TaskError("sentence_task needs at least one sentence.")
    tok = model.tokenizer
    rows = [list(tok(text, add_special_tokens=True)["input_ids"]) for text in sentences]
    answers = None
    if not model.facts.is_encoder:
        rows = [with_bos(model, r) for r in rows]  # as to_tokens does (load_model's prepend_bos=False: as tokenized)
        if min(len(r) for r in rows) < 2:
            raise TaskError("Every sentence needs at least one token besides any BOS to serve as the answer, and one before it.")
        answers = torch.tensor([r[-1] for r in rows])  # [batch]
        rows = [r[:-1] for r in rows]
    ids, mask = pad_token_rows(rows, pad_id_of(tok), left=not model.facts.is_encoder)  # [batch, pos] each
    metric = "cosine" if model.facts.is_encoder else "logprob"
    return Task(name="sentences", tokens=ids, answers=answers, attention_mask=mask, metric=metric)
