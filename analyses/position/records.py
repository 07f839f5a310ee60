"""Position sweeps over records: multi-document QA (decoders) and encoder retrieval.

- `qa_sweeps`: multi-document QA over user JSONL (see `load_qa_records`), Liu et al.'s format
  `Document [i](Title: t) text`; the slot labels stay in place, the documents move.
- `retrieval_sweeps`: encoders; a passage of sentences with the relevant one at each slot, and
  the query encoded on its own.

Both build on `prompts.item_sweep`; the loaders check each record's fields with one ConfigError.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from headscope.analyses.position.prompts import PositionSweep, item_sweep
from headscope.errors import ConfigError

QA_INSTRUCTION = (
    "Write a high-quality answer for the given question using only the provided search results "
    "(some of which might be irrelevant)."
)


# ---------------------------------------------------------------- multi-document QA
QA_FIELDS = ("question", "answers", "gold_document", "documents")


def load_qa_records(source: Any, limit: int | None = None) -> list[dict]:
    """Multi-document QA records from a JSONL path (read with `datasets`) or a datasets.Dataset: the
    first `limit` (all when None), so memory holds the records used, not the file.

    Each record: question (str), answers (list of str), gold_document ({"title", "text"}),
    documents (list of {"title", "text"} distractors, may be empty). See
    headscope/analyses/data/multidoc_example.jsonl.
    """
    source = _dataset(source)
    _check_fields(source.column_names, QA_FIELDS, RETRIEVAL_FIELDS, "retrieval records, which position reads on an encoder",
                  lambda missing: f"multi-document QA data lacks field(s) {missing}; each JSONL record needs "
                                  f"{list(QA_FIELDS)} (see headscope/analyses/data/multidoc_example.jsonl)")
    return _first(source, limit)


def _check_fields(columns: Any, fields: tuple, other: tuple, other_kind: str, lacks) -> None:
    """One ConfigError when a record lacks one of `fields`: `lacks(missing)` says what, and records that hold the
    `other` loader's fields instead are named as such (they belong to the other model kind)."""
    missing = [f for f in fields if f not in columns]
    if missing:
        hint = f" (these are {other_kind})" if set(other) <= set(columns) else ""
        raise ConfigError(f"{lacks(missing)}{hint}.")


def _first(source: Any, limit: int | None) -> list[dict]:
    """The first `limit` records of a Dataset (all when None) as dicts."""
    n = len(source) if limit is None else min(limit, len(source))
    return [dict(source[i]) for i in range(n)]


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _has_answer(doc: Mapping[str, str], answers: Sequence[str]) -> bool:
    text = f"{doc['title']} {doc['text']}".lower()
    return any(a.lower() in text for a in answers)


def qa_sweeps(
    tokenizer: Any, records: Sequence[Mapping[str, Any]], *, n_docs: int = 10, seed: int = 0,
    positions: Sequence[int] | None = None, query_aware: bool = False, prepend_bos: bool = True,
) -> list[PositionSweep]:
    """Multi-document QA: the gold document among n_docs - 1 distractors, at each slot.

    Distractors: the record's own documents first, then documents of the other records (seeded
    order); any document containing an answer is dropped (Liu et al.: distractors hold no answer).
    """
    rng = np.random.default_rng([seed, 10])
    pool = [d for r in records for d in (r["gold_document"], *r["documents"])]
    sweeps = []
    for number, r in enumerate(records, 1):
        answers = tuple(r["answers"])
        extra = [pool[i] for i in rng.permutation(len(pool))]
        distractors = []
        for d in (*r["documents"], *extra):
            if len(distractors) == n_docs - 1:
                break
            if d != r["gold_document"] and not _has_answer(d, answers) and d not in distractors:
                distractors.append(d)
        if len(distractors) < n_docs - 1:
            raise ConfigError(
                f"QA record {number} (question {r['question']!r:.60}) has "
                f"{_count(len(distractors), 'answer-free distractor document')} (its own and the other records'), "
                f"and {n_docs} documents a prompt (n_items, --n-items; the gold one included) need {n_docs - 1}; "
                f"add documents to the data or lower --n-items to {len(distractors) + 1} or less."
            )
        question = f"Question: {r['question']}"
        head = f"{QA_INSTRUCTION}\n\n" + (f"{question}\n\n" if query_aware else "")
        sweeps.append(item_sweep(
            tokenizer, items=[f"(Title: {d['title']}) {d['text']}" for d in distractors],
            gold=f"(Title: {r['gold_document']['title']}) {r['gold_document']['text']}",
            positions=positions, head=head, tail=f"\n\n{question}\nAnswer:", sep="\n",
            slot_label=lambda i: f"Document [{i}]", answer=f" {answers[0]}", answers=answers, prepend_bos=prepend_bos,
        ))
    return sweeps


# ------------------------------------------------------------------ encoder retrieval
RETRIEVAL_FIELDS = ("query", "relevant", "distractors")


def load_retrieval_records(source: Any = None, limit: int | None = None) -> list[dict]:
    """Encoder retrieval items (query, relevant, distractors); default: the shipped retrieval.jsonl;
    the first `limit` (all when None). A source whose records lack the fields, or whose query or relevant
    sentence is not text or whose distractors are not a non-empty list of text, is one ConfigError."""
    import json

    if source is None:
        from importlib.resources import files

        text = (files("headscope.analyses") / "data" / "retrieval.jsonl").read_text(encoding="utf-8")
        return [json.loads(line) for line in text.splitlines() if line.strip()][:limit]
    data = _dataset(source)
    _check_fields(data.column_names, RETRIEVAL_FIELDS, QA_FIELDS, "multi-document QA records, which position reads on "
                  "a decoder", lambda missing: f"retrieval records lack field(s) {missing}; position on an encoder reads "
                  f"one JSON object a line with {list(RETRIEVAL_FIELDS)} (text, text, a list of text); the records have "
                  f"{sorted(data.column_names)}")
    records = _first(data, limit)
    for i, r in enumerate(records, 1):
        d = r["distractors"]
        if not (isinstance(r["query"], str) and isinstance(r["relevant"], str) and isinstance(d, list) and d
                and all(isinstance(x, str) for x in d)):
            raise ConfigError(f"retrieval record {i} does not fit: query and relevant must be text and distractors a "
                              f"non-empty list of text (one sentence each); got query {r['query']!r:.60}, "
                              f"distractors {d!r:.60}.")
    return records


def first_fields(path: Any) -> set[str] | None:
    """The field names of a records file's first record, read with json alone (no datasets cache, no Arrow types,
    so a prompt/answer file Arrow cannot read is still told apart): its first non-blank line as JSON, or a .json
    file's one document (a list: its first item; a dict of columns: its keys); set() for a file of no records,
    None where the first record is not a JSON object. A missing or unreadable file is one TaskFileError."""
    import json
    import os

    from headscope.errors import TaskFileError

    if not os.path.isfile(path):
        raise TaskFileError(f"no file {os.fspath(path)!r}: give position a JSONL file of its records.")
    try:
        with open(path, encoding="utf-8") as fh:
            line = next((row for row in fh if row.strip()), "")
            if not line:
                return set()
            try:
                first = json.loads(line)
            except ValueError:
                if not line.lstrip().startswith(("[", "{")):
                    return None
                fh.seek(0)
                first = json.load(fh)  # one JSON document over several lines
                first = first[0] if isinstance(first, list) and first else first
    except (OSError, ValueError) as err:  # unreadable, not UTF-8, or not JSON
        if isinstance(err, OSError):
            raise TaskFileError(f"{os.fspath(path)!r} could not be read ({type(err).__name__}: {err}).") from None
        return None
    return set(first) if isinstance(first, dict) else None


def records_kind(fields: set[str] | None) -> str | None:
    """"retrieval" where `fields` hold every RETRIEVAL_FIELDS, "qa" every QA_FIELDS, else None (a prompt/answer
    task: one of them alone, a column named "question" say, does not make records)."""
    if fields and set(RETRIEVAL_FIELDS) <= fields:
        return "retrieval"
    if fields and set(QA_FIELDS) <= fields:
        return "qa"
    return None


def _dataset(source: Any):
    """A datasets.Dataset from a JSONL path (anything else is returned as is); a file that is missing or is not
    JSON lines is one TaskFileError."""
    if isinstance(source, str) or hasattr(source, "__fspath__"):
        import os

        import datasets

        from headscope.errors import TaskFileError

        if not os.path.isfile(source):
            raise TaskFileError(f"no file {os.fspath(source)!r}: give position a JSONL file of its records.")
        from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

        quiet = are_progress_bars_disabled()
        disable_progress_bars()  # its cache's "Generating train split" bar is no step of the user's run
        try:
            return datasets.load_dataset("json", data_files=str(source), split="train")
        except Exception as err:  # noqa: BLE001 - datasets raises many kinds for a file that is not JSON lines
            first = (str(err).splitlines() or [type(err).__name__])[0]
            raise TaskFileError(f"{os.fspath(source)!r} could not be read as JSON lines ({type(err).__name__}: "
                                f"{first[:200]}).") from None
        finally:
            if not quiet:
                enable_progress_bars()
    return source


def retrieval_sweeps(
    tokenizer: Any, records: Sequence[Mapping[str, Any]], *, n_distractors: int | None = None,
    positions: Sequence[int] | None = None,
) -> list[PositionSweep]:
    """A passage of sentences with the relevant one at each slot; the query is encoded alone. n_distractors:
    the first that many of each record's distractors (None: all of them); a record with fewer is one ConfigError
    naming it, so that every prompt holds the same number of sentences."""
    sweeps = []
    for number, r in enumerate(records, 1):
        distractors = list(r["distractors"])[:n_distractors]
        if not distractors:
            raise ConfigError(f"retrieval record {number} (query {r['query']!r:.60}) has no distractor sentences.")
        if n_distractors is not None and len(distractors) < n_distractors:
            raise ConfigError(
                f"retrieval record {number} (query {r['query']!r:.60}) has {_count(len(distractors), 'distractor sentence')}, "
                f"and {n_distractors + 1} sentences a passage (n_items, --n-items; the relevant one included) need "
                f"{n_distractors}; add sentences to the record or lower --n-items to {len(distractors) + 1} or less.")
        sweeps.append(item_sweep(
            tokenizer, items=[f" {s}" for s in distractors], gold=f" {r['relevant']}",
            positions=positions, encoder=True, query=r["query"],
        ))
    return sweeps


def retrieval_lengths(tokenizer: Any, records: Sequence[Mapping[str, Any]]) -> dict[int, int]:
    """{n_items: the most tokens any record's passage (or query, encoded alone) takes with n_items sentences, the
    relevant one and the first n_items - 1 distractors}, for n_items from 2 to every record's count: what
    `retrieval_sweeps` builds, for fitting the sentences a passage to a context."""
    most = min(len(r["distractors"]) for r in records) + 1
    out = {}
    for n in range(2, most + 1):
        sweeps = retrieval_sweeps(tokenizer, records, n_distractors=n - 1, positions=(1,))  # every slot: one length
        out[n] = max(max(sw.prompt_len, int(sw.query_tokens.shape[1])) for sw in sweeps)
    return out
