"""Reading the rows of a task source (a task file, held or on disk, a DataFrame, a Dataset or a list of
dicts) as dicts of text under headscope's field names, every row checked, and where each row came from:
its place ("line 3, row 2") and its row number, as messages and `Task.source_rows` give them.
"""
from __future__ import annotations

import csv
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from headscope.analyses.core.task_sources import (
    FIELDS,
    FORMATS,
    REQUIRED,
    FieldMapped,
    HeldTaskFile,
    RowSubset,
    _carried,
    _checked_path,
    _label,
    parse_fields,
)
from headscope.errors import TaskFileError


class _HeldPath(type(Path())):  # a path whose readers read `data`, not the disk
    data: bytes


def _open(path: Path):
    """A binary file object of `path`: its held bytes (HeldTaskFile) or the file on disk."""
    import io

    return io.BytesIO(path.data) if isinstance(path, _HeldPath) else open(path, "rb")


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
    if kind == "csv":  # .tsv: the same reader with a tab delimiter
        tabs = path.suffix.lower() == ".tsv"
        reader = csv.DictReader((line for _, line in _lines(path)), delimiter="\t" if tabs else ",")
        n = 0
        try:
            _check_header(path, reader.fieldnames or [])
            for record in reader:
                if None in record:  # more cells than header columns
                    raise TaskFileError(
                        f"{_label(path)}, line {reader.line_num}, row {n}: {len(reader.fieldnames or []) + len(record[None])} "
                        f"cells but the header has {len(reader.fieldnames or [])} columns; quote cells that contain "
                        + ("tabs." if tabs else "commas.")
                    )
                yield record, f"line {reader.line_num}, row {n}"
                n += 1
        except csv.Error as err:
            raise TaskFileError(f"{_label(path)}, line {reader.line_num} could not be read as "
                                f"{'TSV' if tabs else 'CSV'}: {err}") from None
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
            f"Unsupported task data {type(source).__name__}: pass a .jsonl/.csv/.tsv/.parquet path, a pandas DataFrame, "
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
    if isinstance(source, RowSubset):
        return _subset_rows(source, fields, n_examples, seed)
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


def _subset_rows(source: RowSubset, fields: Mapping[str, str], n_examples: int | None,
                 seed: int) -> tuple[str, list[dict[str, str]], list[str], int]:
    """_rows of a RowSubset: its rows (a seeded sample of n_examples among them), each with its place in the
    whole data, so the Task's source_rows number them as the user's data does; the count is the subset's."""
    label, records = _source_records(source.data)
    chosen = list(source.rows)
    if n_examples is not None and n_examples < len(chosen):
        chosen = [chosen[i] for i in sample_indices(len(chosen), n_examples, seed)]
    rows, places, _ = _scan(label, records(set(chosen)), fields, lambda i: True)
    if len(rows) != len(chosen):
        raise TaskFileError(f"{label} has no row {_missing(chosen, places)}; a row subset names rows of the data "
                            f"(0-based).")
    return label, rows, places, len(source.rows)


def _missing(chosen: Sequence[int], places: Sequence[str]) -> str:
    found = {_row_number(p) for p in places}
    return ", ".join(str(r) for r in chosen if r not in found)


def read_task_rows(source: Any, fields: Mapping[str, str] | str | None = None, *, n_examples: int | None = None,
                   seed: int = 0) -> list[dict[str, str]]:
    """The examples of a task source as dicts of text under headscope's field names (prompt,
    answer and, where given, corrupted_prompt and wrong_answer), every row checked for the
    required fields. source: a .jsonl/.json/.csv/.tsv/.parquet path (or TaskFile), a DataFrame, a
    Dataset or a list of dicts; fields: headscope name -> the user's column name; n_examples: a
    seeded sample of that many rows (file order kept), read without holding the whole file."""
    return _rows(source, fields, n_examples=n_examples, seed=seed)[1]


def read_numbered_rows(source: Any, fields: Mapping[str, str] | str | None = None, *, n_examples: int | None = None,
                       seed: int = 0) -> list[dict[str, Any]]:
    """read_task_rows with each row's number first ("row": 0-based, as errors and Task.source_rows number
    rows; None where its place names none), so a table of the rows can say which ones an analysis used."""
    _, rows, places, _ = _rows(source, fields, n_examples=n_examples, seed=seed)
    return [{"row": _row_number(place), **row} for place, row in zip(places, rows)]

def _row_numbers(places: Sequence[str]) -> torch.Tensor | None:
    """[batch] int64: the row number each place names ("line 4, row 3" -> 3), as the messages number rows;
    None if a place names none."""
    found = [_row_number(place) for place in places]
    return None if None in found else torch.tensor(found, dtype=torch.int64)


def _row_number(place: str) -> int | None:
    """The row number a place names ("line 4, row 3" -> 3; None if it names none)."""
    found = re.search(r"\brow (\d+)$", place)
    return int(found.group(1)) if found else None


__all__ = ["read_numbered_rows", "read_task_rows", "sample_indices"]


def count_task_rows(source: Any, fields: Mapping[str, str] | str | None = None) -> int:
    """How many rows `source` (a task file, held file or in-memory data) has: what a section's sample is a sample of
    (review 18a B1: "32 of the file's 40")."""
    return _rows(source, fields, n_examples=1)[3]
