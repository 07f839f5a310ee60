"""What a task source is: headscope's field names and the user's mapping to their columns (`parse_fields`),
task file paths that carry it (`TaskFile`; `HeldTaskFile`, its bytes read once) and in-memory data that
does (`FieldMapped`; `RowSubset`: some rows of either), which values are task data (`is_task_data`), and the
one error for what an analysis cannot take as its task (`not_a_task`). Reading the rows is task_rows.py's;
turning them into a Task, task_files.py's.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from headscope.analyses.core.tasks import ZOO_TASKS
from headscope.errors import ConfigError, InputTypeError, TaskError, TaskFileError

FIELDS = ("prompt", "answer", "corrupted_prompt", "wrong_answer")
REQUIRED = ("prompt", "answer")
FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".tsv": "csv", ".parquet": "parquet"}  # .tsv: tab-separated


# ---- field mappings ---------------------------------------------------------------------------
def parse_fields(fields: Mapping[str, str] | str | None) -> dict[str, str]:
    """headscope field -> the user's column, from a mapping or "prompt=text,answer=label"
    (empty when None)."""
    if fields is None:
        return {}
    if isinstance(fields, str):
        pairs: dict[str, str] = {}
        for item in filter(None, (part.strip() for part in fields.split(","))):
            key, sep, value = item.partition("=")
            if not sep or not key.strip() or not value.strip():
                raise ConfigError(
                    f"task fields {fields!r}: {item!r} is not FIELD=COLUMN; write e.g. 'prompt=text,answer=label'."
                )
            if key.strip() in pairs:  # prompt=text,prompt=other: which one was meant?
                raise ConfigError(f"task fields {fields!r}: {key.strip()!r} is mapped twice ({pairs[key.strip()]!r} and "
                                  f"{value.strip()!r}); map each field to one column.")
            pairs[key.strip()] = value.strip()
        fields = pairs
    if not isinstance(fields, Mapping):
        raise ConfigError(
            f"task fields must be a mapping like {{'prompt': 'text'}} or 'prompt=text', got {type(fields).__name__}."
        )
    unknown = [k for k in fields if k not in FIELDS]
    if unknown:
        raise ConfigError(f"task fields {unknown} are not headscope fields; map some of {list(FIELDS)} to your column names.")
    bad = [k for k, v in fields.items() if not isinstance(v, str) or not v]
    if bad:
        raise ConfigError(f"task fields {bad}: each must map to a column name (a non-empty string).")
    shared = {}
    for key, column in fields.items():  # prompt=text,answer=text: every answer would be its prompt
        if column in shared:
            raise ConfigError(f"task fields: column {column!r} is mapped to both {shared[column]!r} and {key!r}; "
                              f"map each field to its own column.")
        shared[column] = key
    return dict(fields)


class TaskFile(str):
    """A task file path that carries its field mapping and strictness: a str, so it goes wherever a
    path does (analyses, build_report, the manifest), and `resolve_task` / `load_task` apply `fields`
    and `strict` (words that become the unknown token raise a TokenizationError, not a warning)."""

    fields: dict[str, str]
    strict: bool

    def __new__(cls, path: str | os.PathLike, fields: Mapping[str, str] | str | None = None,
                strict: bool | None = None) -> TaskFile:
        if not isinstance(path, (str, os.PathLike)):
            raise InputTypeError(
                f"TaskFile takes the path of a .jsonl/.csv/.tsv/.parquet file (and fields=, strict=), not a "
                f"{type(path).__name__}; for a DataFrame, Dataset or list of dicts use hs.load_task(model, data, fields), "
                f"or hs.run_analysis(name, model, data, fields=fields)."
            )
        obj = super().__new__(cls, os.fspath(path))
        obj.fields = parse_fields(fields if fields is not None else getattr(path, "fields", None))
        obj.strict = bool(strict if strict is not None else getattr(path, "strict", False))
        return obj

    def __reduce__(self):  # pickles (torch.distributed broadcasts) keep the mapping and strictness
        return (TaskFile, (str(self), self.fields, self.strict))

    def held(self) -> HeldTaskFile:
        """This file read once: its bytes held in memory, so that every later read (the samples of
        each analysis, strict mode's scan, the sha256 --resume compares) reads them instead of the
        disk. `headscope report` reads its --task file this way, once per run."""
        return HeldTaskFile(self, self.fields, self.strict)


class HeldTaskFile(TaskFile):
    """A TaskFile whose bytes were read once (`TaskFile.held`): the same path, fields and strictness,
    and `data` / `sha256` from that one read. A missing or unreadable file is the TaskFileError the
    readers give."""

    data: bytes
    sha256: str

    def __new__(cls, path: str | os.PathLike, fields: Mapping[str, str] | str | None = None,
                strict: bool | None = None, data: bytes | None = None) -> HeldTaskFile:
        import hashlib

        obj = super().__new__(cls, path, fields, strict)
        if data is None:
            label = _checked_path(Path(obj))  # the readers' one-line errors: unknown format, missing
            try:
                with open(obj, "rb") as fh:
                    data = fh.read()
            except OSError as err:
                raise TaskFileError(f"{label} cannot be read: {err.strerror or type(err).__name__}.") from None
        obj.data = data
        obj.sha256 = hashlib.sha256(data).hexdigest()
        return obj

    def __reduce__(self):
        return (HeldTaskFile, (str(self), self.fields, self.strict, self.data))




class FieldMapped:
    """In-memory task data (a DataFrame, Dataset or list of dicts) with its field mapping and strictness,
    as TaskFile is for a path: hs.run_analysis(name, model, data, fields=...) passes one, and
    resolve_task / load_task read it as the data under those fields (sampled to the analysis's size)."""

    __slots__ = ("data", "fields", "strict")

    def __init__(self, data: Any, fields: Mapping[str, str] | str | None = None, strict: bool | None = None) -> None:
        self.data = data
        self.fields = parse_fields(fields)
        self.strict = bool(strict)

    def __repr__(self) -> str:
        return f"FieldMapped({type(self.data).__name__}, fields={self.fields})"


class RowSubset(FieldMapped):
    """Some rows of the user's task data (a task file, TaskFile or in-memory data): `rows` are the 0-based row
    numbers (as Task.source_rows and the task-file messages number them) that load_task reads, its seeded
    sample drawn among them, each row keeping its own number. `headscope report` hands one to an analysis
    that reads one next-token answer when only some rows have one (analyses/core/contract.py one_token_plan)."""

    __slots__ = ("rows",)

    def __init__(self, data: Any, rows: Sequence[int]) -> None:
        super().__init__(data, _carried(data, "fields"), _carried(data, "strict"))
        rows = sorted({int(r) for r in rows}) if all(isinstance(r, int) and r >= 0 for r in rows) else None
        if not rows:
            raise TaskError("a row subset of the task data needs at least one row number (0-based integers).")
        self.rows = tuple(rows)

    def __repr__(self) -> str:
        return f"RowSubset({self.data!r}, {len(self.rows)} rows)"


def with_fields(task: Any, fields: Mapping[str, str] | str | None, strict: bool | None = None) -> Any:
    """`task` carrying a field mapping (None: unchanged): a path becomes a TaskFile, in-memory data a
    FieldMapped; a Task or zoo task name takes no fields (ConfigError)."""
    if fields is None and strict is None:
        return task
    if isinstance(task, (str, os.PathLike)) and not (isinstance(task, str) and task in ZOO_TASKS):
        return TaskFile(task, fields, strict)
    if is_task_data(task):
        return FieldMapped(task, fields, strict)
    what = (f"the zoo task {task!r}" if isinstance(task, str) else "the default task (pass your data too)"
            if task is None else describe(task))
    raise ConfigError(f"fields= apply to task files and data sets (DataFrame, Dataset, list of dicts), not to {what}.")


def _carried(source: Any, attr: str) -> Any:
    """The fields or strictness a TaskFile or FieldMapped carries (None for anything else: a DataFrame's
    column of that name is data, not a setting)."""
    return getattr(source, attr, None) if isinstance(source, (TaskFile, FieldMapped)) else None


def describe(value: Any) -> str:
    """A value as one short phrase for an error: "a Tensor of shape [1, 9] (int64)", "a dict", ..."""
    if isinstance(value, torch.Tensor):
        return f"a Tensor of shape {list(value.shape)} ({str(value.dtype).removeprefix('torch.')})"
    if isinstance(value, (list, tuple)) and value:
        return f"a {type(value).__name__} of {type(value[0]).__name__}"
    return f"a {type(value).__name__}"


def not_a_task(task: Any) -> Exception:
    """The one error for what an analysis cannot take as its task (resolve_task raises it)."""
    if isinstance(task, str):
        return TaskFileError(
            f"Unknown task {task!r}: use a zoo task ({', '.join(ZOO_TASKS)}), a .jsonl/.csv/.tsv/.parquet file, a DataFrame, "
            f"a datasets.Dataset, a list of dicts, a Task, token ids (tokens, answers[, corrupted, wrong]) or one "
            f"prompt with answer=."
        )
    return InputTypeError(
        f"An analysis takes a Task (hs.load_task(model, data, fields)), user data with prompt and answer fields (a "
        f".jsonl/.csv/.tsv/.parquet path, a DataFrame, a datasets.Dataset or a list of dicts), a zoo task name "
        f"({', '.join(ZOO_TASKS)}), token ids (tokens, answers[, corrupted, wrong]) or one prompt with answer=; got "
        f"{describe(task)}."
    )

def is_task_data(task: Any) -> bool:
    """Whether `task` is user data load_task reads (a task file path, DataFrame, Dataset or list of dicts)."""
    if isinstance(task, (str, os.PathLike)):
        return Path(task).suffix.lower() in FORMATS
    if isinstance(task, FieldMapped):
        return True
    module = type(task).__module__.split(".")[0]
    return (module in ("pandas", "datasets") and hasattr(task, "to_dict" if module == "pandas" else "column_names")) or (
        isinstance(task, (list, tuple)) and bool(task) and all(isinstance(r, Mapping) for r in task)
    )

def _label(path: Path) -> str:
    return f"Task file {str(path)!r}"

def _checked_path(path: Path) -> str:
    """The label of a task file's path, after a TaskFileError for an unknown format or a missing file."""
    label = _label(path)
    if path.suffix.lower() not in FORMATS:
        raise TaskFileError(f"{label}: unknown format {path.suffix!r}; use .jsonl, .csv, .tsv or .parquet.")
    if not path.is_file():
        raise TaskFileError(f"{label} does not exist or is not a file.")
    return label


__all__ = ["FIELDS", "FORMATS", "REQUIRED", "FieldMapped", "HeldTaskFile", "RowSubset", "TaskFile", "describe", "is_task_data",
           "not_a_task", "parse_fields", "with_fields"]
