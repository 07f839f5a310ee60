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
"""
from __future__ import annotations

import csv
import json
import logging
import math
import os
import re
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from headscope.analyses.core.tasks import ZOO_TASKS, Task, zoo
from headscope.errors import (
    ConfigError,
    HeadscopeWarning,
    InputTypeError,
    TaskFileError,
    TokenizationError,
    TokenizationWarning,
)
from headscope.models.hooked_model import pad_id_of, pad_token_rows, token_strings

log = logging.getLogger(__name__)

FIELDS = ("prompt", "answer", "corrupted_prompt", "wrong_answer")
REQUIRED = ("prompt", "answer")
FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


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
                f"TaskFile takes the path of a .jsonl/.csv/.parquet file (and fields=, strict=), not a "
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


class _HeldPath(type(Path())):  # a path whose readers read `data`, not the disk
    data: bytes


def _open(path: Path):
    """A binary file object of `path`: its held bytes (HeldTaskFile) or the file on disk."""
    import io

    return io.BytesIO(path.data) if isinstance(path, _HeldPath) else open(path, "rb")


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
            f"Unknown task {task!r}: use a zoo task ({', '.join(ZOO_TASKS)}), a .jsonl/.csv/.parquet file, a DataFrame, "
            f"a datasets.Dataset, a list of dicts, a Task, token ids (tokens, answers[, corrupted, wrong]) or one "
            f"prompt with answer=."
        )
    return InputTypeError(
        f"An analysis takes a Task (hs.load_task(model, data, fields)), user data with prompt and answer fields (a "
        f".jsonl/.csv/.parquet path, a DataFrame, a datasets.Dataset or a list of dicts), a zoo task name "
        f"({', '.join(ZOO_TASKS)}), token ids (tokens, answers[, corrupted, wrong]) or one prompt with answer=; got "
        f"{describe(task)}."
    )


# ---- reading rows ------------------------------------------------------------------------------
# Task files are read as a stream of records: memory holds the rows kept (all of them, or a
# seeded sample of n_examples), never the whole file. A sample takes two passes: the first
# checks every row and counts them, the second keeps the rows drawn with the seed.
class _Constant(str):
    """A bare JSON NaN, Infinity or -Infinity (not JSON proper, Python's json reads them): neither
    text nor a value a task can use, so a field holding one is refused."""


class _AmbiguousValue(ValueError):
    pass


def _object(pairs: list[tuple[str, Any]]) -> dict:
    """A JSON object; a key given twice (the last would win silently) is refused."""
    record = dict(pairs)
    if len(record) != len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise ValueError(f"key {twice!r} appears twice in one object; keep one")
    return record


def _text(value: Any) -> str | None:
    """A field value as text; None for a missing value (None, NaN, empty)."""
    if value is None:
        return None
    if isinstance(value, _Constant):
        raise _AmbiguousValue(f"the bare JSON constant {value}, neither text nor a usable number; "
                              f"write \"{value}\" in quotes if it is meant as text")
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    if isinstance(value, (list, tuple, dict)):
        raise TypeError(type(value).__name__)
    try:
        text = str(value)
    except ValueError:  # an integer too long to print (sys.set_int_max_str_digits)
        raise TypeError("number too long") from None
    return text if text.strip() else None


_AS_WRITTEN = {"parse_int": str, "parse_float": str, "parse_constant": _Constant,  # JSON numbers keep their text: 1.50, 1e3
               "object_pairs_hook": _object}


def _label(path: Path) -> str:
    return f"Task file {str(path)!r}"


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, text) of each line of a UTF-8 file (a leading BOM dropped), read lazily."""
    with _open(path) as fh:
        for lineno, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as err:
                raise TaskFileError(
                    f"{_label(path)}, line {lineno}: byte 0x{raw[err.start]:02x} is not valid UTF-8; save the file as UTF-8."
                ) from None
            yield lineno, line


def _is_blank(path: Path) -> bool:
    with _open(path) as fh:
        return all(not raw.strip() for raw in fh)


def _first_char(path: Path) -> str:
    with _open(path) as fh:
        for raw in fh:
            text = raw.lstrip(b"\xef\xbb\xbf").strip()
            if text:
                return chr(text[0])
    return ""


def _file_records(path: Path, only: set[int] | None = None) -> Iterator[tuple[Any, str]]:
    """(record, its place in the file, e.g. "line 3, row 2") of each example, read lazily (a .json
    array is parsed whole); with `only`, just the rows of those indices (JSON lines skips the others
    unparsed; a file checked already)."""
    if only is None or FORMATS[path.suffix.lower()] == "json" and _first_char(path) != "[":
        yield from _all_file_records(path, only)
    else:  # CSV, Parquet, a JSON array: read row by row, keep the chosen ones
        yield from (entry for i, entry in enumerate(_all_file_records(path)) if i in only)


def _all_file_records(path: Path, only: set[int] | None = None) -> Iterator[tuple[Any, str]]:
    """_file_records without the row filter, except in JSON lines (`only` skips rows unparsed)."""
    kind = FORMATS[path.suffix.lower()]
    if kind == "parquet":
        yield from _parquet_records(path)
        return
    if _is_blank(path):
        raise TaskFileError(f"{_label(path)} is empty; add one example per {'line' if kind == 'json' else 'row'}.")
    if kind == "csv":
        reader = csv.DictReader((line for _, line in _lines(path)))
        n = 0
        try:
            _check_header(path, reader.fieldnames or [])
            for record in reader:
                if None in record:  # more cells than header columns
                    raise TaskFileError(
                        f"{_label(path)}, line {reader.line_num}, row {n}: {len(reader.fieldnames or []) + len(record[None])} "
                        f"cells but the header has {len(reader.fieldnames or [])} columns; quote cells that contain commas."
                    )
                yield record, f"line {reader.line_num}, row {n}"
                n += 1
        except csv.Error as err:
            raise TaskFileError(f"{_label(path)}, line {reader.line_num} could not be read as CSV: {err}") from None
        if n == 0:
            raise TaskFileError(f"{_label(path)} is empty: it has a header but no rows; add at least one example.")
        return
    if path.suffix.lower() == ".json" and _first_char(path) == "[":  # a JSON array of objects
        text = "".join(line for _, line in _lines(path))
        try:
            records = json.loads(text, **_AS_WRITTEN)
        except json.JSONDecodeError as err:
            raise TaskFileError(
                f"{_label(path)}, line {err.lineno} could not be read as JSON: {err.msg} (column {err.colno})."
            ) from None
        except (ValueError, RecursionError) as err:  # a number too long, nesting too deep
            raise TaskFileError(f"{_label(path)} could not be read as JSON: {err}.") from None
        if not isinstance(records, list):
            raise TaskFileError(f"{_label(path)}: expected a JSON array of objects, got {type(records).__name__}.")
        for i, record in enumerate(records):
            yield record, f"row {i}"
        return
    n = 0
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        if only is not None and n not in only:
            n += 1
            continue
        try:
            record = json.loads(line, **_AS_WRITTEN)
        except json.JSONDecodeError as err:
            raise TaskFileError(
                f"{_label(path)}, line {lineno} could not be read as JSON: {err.msg} (column {err.colno}); "
                f"write one JSON object per line."
            ) from None
        except (ValueError, RecursionError) as err:  # a number too long, nesting too deep
            raise TaskFileError(f"{_label(path)}, line {lineno} could not be read as JSON: {err}.") from None
        yield record, f"line {lineno}, row {n}"
        n += 1


def _check_header(path: Path | str, names: Sequence[Any], where: str = ", line 1") -> None:
    """A column named twice (text,label,label: the last would win silently) is refused; unnamed
    columns, which no field can map to, may repeat."""
    seen: dict[str, int] = {}
    for i, name in enumerate(names, start=1):
        if str(name).strip() and str(name) in seen:
            label = _label(Path(path)) if isinstance(path, Path) else path
            raise TaskFileError(f"{label}{where}: column {str(name)!r} appears twice in the header (columns {seen[str(name)]} "
                                f"and {i}); rename one so that each field comes from one column.")
        seen.setdefault(str(name), i)


def _parquet_records(path: Path) -> Iterator[tuple[dict, str]]:
    """Parquet rows in batches (pyarrow), so memory holds one batch at a time."""
    try:
        import pyarrow.parquet as pq

        file = pq.ParquetFile(_open(path) if isinstance(path, _HeldPath) else path)
        _check_header(path, file.schema_arrow.names, "")
        batches = file.iter_batches(batch_size=4096)
        n = 0
        for batch in batches:
            for record in batch.to_pylist():
                yield record, f"row {n}"
                n += 1
    except TaskFileError:
        raise
    except Exception as err:  # pyarrow raises many types for unreadable files
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise TaskFileError(f"{_label(path)} could not be read as Parquet: {first}") from None


def _checked_path(path: Path) -> str:
    """The label of a task file's path, after a TaskFileError for an unknown format or a missing file."""
    label = _label(path)
    if path.suffix.lower() not in FORMATS:
        raise TaskFileError(f"{label}: unknown format {path.suffix!r}; use .jsonl, .csv or .parquet.")
    if not path.is_file():
        raise TaskFileError(f"{label} does not exist or is not a file.")
    return label


def _source_records(source: Any) -> tuple[str, Callable[..., Iterable[tuple[Any, str]]]]:
    """(label for messages, a function giving a fresh iterator of (record, place), optionally of
    the rows in `only`) of any supported data source: a file is read again on each call,
    in-memory data is not copied."""
    if isinstance(source, HeldTaskFile):
        path = _HeldPath(source)
        path.data = source.data
        return _label(path), lambda only=None: _file_records(path, only)
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        label = _checked_path(path)
        try:
            open(path, "rb").close()
        except OSError as err:
            raise TaskFileError(f"{label} cannot be read: {err.strerror or type(err).__name__}.") from None
        return label, lambda only=None: _file_records(path, only)
    if isinstance(source, FieldMapped):
        source = source.data
    module = type(source).__module__.split(".")[0]
    if module == "pandas" and hasattr(source, "to_dict"):
        _check_header("Task data (DataFrame)", list(source.columns), "")
        label, records = "Task data (DataFrame)", source.to_dict("records")
    elif module == "datasets" and hasattr(source, "column_names"):
        label, records = "Task data (Dataset)", source
    elif isinstance(source, (list, tuple)):
        label, records = "Task data (list of dicts)", source
        for i, record in enumerate(records):
            if not isinstance(record, Mapping):
                raise TaskFileError(f"{label}, row {i}: expected a dict of fields, got {type(record).__name__}.")
    else:
        raise TaskFileError(
            f"Unsupported task data {type(source).__name__}: pass a .jsonl/.csv/.parquet path, a pandas DataFrame, "
            f"a datasets.Dataset, a list of dicts, a Task, token ids (tokens, answers[, corrupted, wrong]) or one "
            f"prompt with answer=."
        )
    if not len(records):
        raise TaskFileError(f"{label} is empty; add at least one example.")
    return label, lambda only=None: ((record, f"row {i}") for i, record in enumerate(records) if only is None or i in only)


def _scan(label: str, records: Iterable[tuple[Any, str]], fields: Mapping[str, str],
          keep: Callable[[int], bool], visit: Callable[[dict[str, str], str], None] | None = None,
          ) -> tuple[list[dict[str, str]], list[str], int]:
    """Check every record and return (the rows `keep` accepts by index, their places, the row
    count); `visit(row, place)` sees every row as it streams by. Errors come in the order of the
    eager reader: a parse error at once, then a column no row has, then the first row lacking a
    required field, then an optional field given in some rows only."""
    columns = {hs: fields.get(hs, hs) for hs in FIELDS}
    seen: set = set()
    rows: list[dict[str, str]] = []
    places: list[str] = []
    first_missing: str | None = None
    have = {"corrupted_prompt": 0, "wrong_answer": 0}
    lacking: dict[str, list[str]] = {"corrupted_prompt": [], "wrong_answer": []}
    count = 0
    for index, (record, place) in enumerate(records):
        if not isinstance(record, Mapping):
            raise TaskFileError(f"{label}, {place}: expected a JSON object, got {type(record).__name__}.")
        seen.update(record.keys())
        row = {}
        for hs, col in columns.items():
            try:
                value = _text(record.get(col))
            except TypeError as err:
                raise TaskFileError(f"{label}, {place}: field {col!r} is a {err}, not text.") from None
            except UnicodeDecodeError:
                raise TaskFileError(f"{label}, {place}: field {col!r} holds bytes that are not valid UTF-8.") from None
            except _AmbiguousValue as err:
                raise TaskFileError(f"{label}, {place}: field {col!r} is {err}.") from None
            if value is not None:
                row[hs] = value
        missing = [columns[f] for f in REQUIRED if f not in row]
        if missing and first_missing is None:
            named = [c if c == f else f"{c} ({f})" for f, c in columns.items() if c in missing]
            need = [columns[f] for f in REQUIRED]
            first_missing = f"{label}, {place}: missing field(s) {named}; every row needs {need}."
        for optional in have:
            if optional in row:
                have[optional] += 1
            elif len(lacking[optional]) < 6:
                lacking[optional].append(place)
        if visit is not None:
            visit(row, place)
        if keep(index):
            rows.append(row)
            places.append(place)
        count += 1
    if count == 0:
        raise TaskFileError(f"{label} is empty; add one JSON object per line.")
    absent = [f"{col!r} (for {hs})" for hs, col in fields.items() if col not in seen]
    if absent:
        raise TaskFileError(f"{label}: no column {', '.join(absent)}; its columns are {sorted(map(str, seen))}.")
    unmapped = [f"{columns[f]!r}" for f in REQUIRED if columns[f] not in seen]
    if unmapped:  # headscope's own names, in no row: the file has its own columns
        raise TaskFileError(
            f"{label}: no column {', '.join(unmapped)}; its columns are {sorted(map(str, seen))}; name yours with "
            f"--task-fields prompt=COLUMN,answer=COLUMN (also corrupted_prompt=, wrong_answer=; in Python fields={{...}}).")
    if first_missing is not None:
        raise TaskFileError(first_missing)
    for optional, n in have.items():
        if n and n != count:
            few = ", ".join(lacking[optional][:5]) + (f" and {count - n - 5} more" if count - n > 5 else "")
            raise TaskFileError(
                f"{label}: field {columns[optional]!r} is given in {n} of {count} rows but missing in "
                f"{few}; give it in every row or in none."
            )
    return rows, places, count


def sample_indices(n_rows: int, n_examples: int, seed: int) -> list[int]:
    """The rows a seeded sample of n_examples keeps, in file order (torch.randperm with the seed)."""
    return torch.randperm(n_rows, generator=torch.Generator().manual_seed(seed))[:n_examples].sort().values.tolist()


def _rows(source: Any, fields: Mapping[str, str] | str | None, *, n_examples: int | None = None,
          seed: int = 0) -> tuple[str, list[dict[str, str]], list[str], int]:
    """(label, rows under headscope's names, their places, the source's row count): all rows, or a
    seeded sample of n_examples of them (every row is checked either way)."""
    fields = parse_fields(fields if fields is not None else _carried(source, "fields"))
    label, records = _source_records(source)
    if n_examples is None:
        rows, places, count = _scan(label, records(), fields, lambda i: True)
        return label, rows, places, count
    rows, places, count = _scan(label, records(), fields, lambda i: i < n_examples)
    if count <= n_examples:
        return label, rows, places, count
    chosen = set(sample_indices(count, n_examples, seed))
    rows, places, _ = _scan(label, records(chosen), fields, lambda i: True)  # (every row passed _scan above)
    return label, rows, places, count


def read_task_rows(source: Any, fields: Mapping[str, str] | str | None = None, *, n_examples: int | None = None,
                   seed: int = 0) -> list[dict[str, str]]:
    """The examples of a task source as dicts of text under headscope's field names (prompt,
    answer and, where given, corrupted_prompt and wrong_answer), every row checked for the
    required fields. source: a .jsonl/.json/.csv/.parquet path (or TaskFile), a DataFrame, a
    Dataset or a list of dicts; fields: headscope name -> the user's column name; n_examples: a
    seeded sample of that many rows (file order kept), read without holding the whole file."""
    return _rows(source, fields, n_examples=n_examples, seed=seed)[1]


def read_numbered_rows(source: Any, fields: Mapping[str, str] | str | None = None, *, n_examples: int | None = None,
                       seed: int = 0) -> list[dict[str, Any]]:
    """read_task_rows with each row's number first ("row": 0-based, as errors and Task.source_rows number
    rows; None where its place names none), so a table of the rows can say which ones an analysis used."""
    _, rows, places, _ = _rows(source, fields, n_examples=n_examples, seed=seed)
    return [{"row": _row_number(place), **row} for place, row in zip(places, rows)]


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
    n_ctx = getattr(getattr(model, "facts", None), "n_ctx", None)
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
    from headscope.models.hooked_model import unknown_words

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
    if all("wrong_answer" in r for r in rows):
        if several:
            warnings.warn(f"{label}: answers of several tokens are scored by the log-probability of their whole "
                          f"continuation; the wrong answers are not used (logit difference compares one next token).",
                          HeadscopeWarning, stacklevel=2)
        else:
            wrong = torch.tensor([_answer_ids(model, r["wrong_answer"], p, label, "wrong_answer")[0]
                                  for r, p in zip(rows, places)])
    return Task(
        name=name, tokens=tokens, answers=answers, corrupted_tokens=corrupted, wrong_answers=wrong,
        metric="logit_diff" if wrong is not None else "logprob", attention_mask=mask, continuation=continuation,
        paired=paired, source_rows=_row_numbers(places),
    )


def _row_numbers(places: Sequence[str]) -> torch.Tensor | None:
    """[batch] int64: the row number each place names ("line 4, row 3" -> 3), as the messages number rows;
    None if a place names none."""
    found = [_row_number(place) for place in places]
    return None if None in found else torch.tensor(found, dtype=torch.int64)


def _row_number(place: str) -> int | None:
    """The row number a place names ("line 4, row 3" -> 3; None if it names none)."""
    found = re.search(r"\brow (\d+)$", place)
    return int(found.group(1)) if found else None


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
    prompt = rows[glued[0]]["prompt"]
    warnings.warn(f"{label}: {len(glued)} of {len(rows)} answer(s) start without a space and their prompt ends without "
                  f"one ({_few([places[i] for i in glued], 3)}), so {prompt[-12:]!r} + {answer!r} is scored as one "
                  f"word ({(prompt + answer)[-16:]!r}); this tokenizer needs the space in the answer: "
                  f"{' ' + answer!r}.", HeadscopeWarning, stacklevel=3)


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

    source: a .jsonl/.json/.csv/.parquet path (.json: JSON lines or one array of objects), a pandas
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
    "is_task_data", "load_task", "load_task_file", "not_a_task", "one_prompt", "parse_fields", "prompt_task",
    "read_numbered_rows", "read_task_rows", "resolve_task", "takes_prompt", "tensor_task", "with_fields",
]
