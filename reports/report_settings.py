"""A report run's settings: what `headscope report` is asked for (ReportOptions) and the settings it runs
with (RunSettings), built by `checked_settings`, which finds every user mistake before anything is written:
modes and numbers, analysis names, the task (a task file read once and every row checked; a file of
position's own records named as such), --n-examples below an analysis's floor, an empty --out.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headscope.analyses.core.registry import ANALYSES, config_class
from headscope.errors import ConfigError, TaskFileError
from headscope.reports.resume_settings import budget_minutes


@dataclass(frozen=True, kw_only=True)
class ReportOptions:
    """What `headscope report` is asked for (build_report's keyword arguments; see its docstring)."""

    out: str | Path | None = None
    analyses: str | Sequence[str] | None = None
    task: str | None = None
    task_fields: dict[str, str] | str | None = None
    seed: int = 0
    quick: bool = False
    n_examples: int | None = None
    device: str | None = None
    dtype: str | None = None
    force: bool = False
    resume: bool = False
    progress: bool = False
    command: list[str] | None = None
    trust_remote_code: bool = False
    strict: bool = False
    budget: float | None = None
    substitute: bool = True
    prepend_bos: bool | None = None
    n_items: int | None = None  # position's items a prompt, the gold one included (`headscope position --n-items`)


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """One report run's settings after build_report checked them (names parsed, the task file held)."""

    names: list[str]
    task: Any = None
    task_rows: Any = None
    seed: int = 0
    quick: bool = False
    n_examples: int | None = None
    progress: bool = False
    command: list[str] | None = None
    main: bool = True
    budget: float | None = None
    minutes: float | None = None
    substitute: bool = True
    dtype: str | None = None  # the precision's name: --dtype's, else the checkpoint's (loading.run_dtype_name)
    prepend_bos: bool | None = None  # load_model's prepend_bos (None: a BOS on decoders, as TransformerLens)
    n_items: int | None = None  # position's items a prompt (None: its default)

    @property
    def common(self) -> dict[str, Any]:
        """The settings every analysis's preset takes."""
        return dict(seed=self.seed, quick=self.quick, n_examples=self.n_examples, progress=self.progress and self.main)

    @property
    def overrides(self) -> dict[str, dict[str, Any]]:
        """name -> the fields of its config set by an option of its own (runner.preset)."""
        return {"position": {"n_items": self.n_items}} if self.n_items is not None else {}


def parse_analyses(names: str | Sequence[str] | None) -> list[str]:
    if names is None:
        return list(ANALYSES)
    items = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    unknown = [n for n in items if n not in ANALYSES]
    if unknown or not items:
        given = ", ".join(map(repr, unknown)) or "(none given)"
        raise ConfigError(f"Unknown analysis {given}; choose from: {', '.join(ANALYSES)}.")
    return items


def _check_task_name(task: Any) -> None:
    """A task given by name must be a zoo task (a typo fails here, before any work)."""
    from headscope.analyses.core.tasks import ZOO_TASKS

    if isinstance(task, str) and not Path(task).suffix and task not in ZOO_TASKS:
        raise TaskFileError(f"Unknown task {task!r}: use a zoo task ({', '.join(ZOO_TASKS)}) "
                            "or a .jsonl/.csv/.tsv/.parquet file.")


def _check_examples(names: Sequence[str], n_examples: int | None) -> None:
    """--n-examples below what an analysis can run on is one line before anything is written, not a
    failed analysis: probes' cross-validation needs at least 3 (its fewest folds; answer labels give one
    sample an example) and heads two (a resample partner; its Needs.min_examples)."""
    if n_examples is None:
        return
    floors = {name: config_class(name).min_examples for name in names}  # the configs' own floors (AnalysisConfig)
    short = {name: floors[name] for name in names if n_examples < floors[name]}
    if short:
        needed = ", ".join(f"{name} at least {n}" for name, n in short.items())
        raise ConfigError(f"--n-examples {n_examples} is too few: {needed} (pass more, or --analyses without "
                          f"{' and '.join(short)}).")


def check_n_items(n_items: Any, names: Sequence[str]) -> None:
    """--n-items (position's items a prompt, the gold one included) is an integer of 2 or more (the gold item and one
    other, so that its slot can move), given to a run of position: one line before anything is written."""
    import numbers

    if n_items is None:
        return
    if isinstance(n_items, bool) or not isinstance(n_items, numbers.Integral) or not 2 <= n_items <= 10_000:
        raise ConfigError(f"--n-items is position's items a prompt, the gold one included: an integer from 2 to "
                          f"10000, got {n_items!r}.")
    if "position" not in names:
        raise ConfigError(f"--n-items sets position's items a prompt; this run has no position analysis "
                          f"({', '.join(names)}).")


def _records_hint(task: Any, names: Sequence[str]) -> str:
    """' This file holds position's own records ...' when the first line of a JSONL task file that the run could not
    read as a prompt/answer task has the fields of position's retrieval or QA records (`headscope position --task
    FILE` reads those: records.records_kind, the rule position's own check applies); '' otherwise."""
    from headscope.analyses.position.records import first_fields, records_kind
    from headscope.errors import HeadscopeError

    try:
        kind = {"retrieval": "retrieval records", "qa": "multi-document QA records"}.get(records_kind(first_fields(task)))
    except (HeadscopeError, TypeError):
        return ""
    if kind is None:
        return ""
    others = [n for n in names if n != "position"]
    return (f" This file holds position's own {kind}, which only position reads: run `headscope position --task "
            f"{Path(task).name}`" + (f" ({', '.join(others)} need a prompt/answer task)." if others else "."))


def _own_data_only(names: Sequence[str], task: Any) -> str:
    """Why a run whose every analysis runs on its own data only (Needs.task_data False: position) cannot take the task
    file `task`, which is not a file of its own records (_own_records), in one line; '' when some analysis of the run
    reads prompt/answer tasks. Review 14c C3: `headscope position --task dates.tsv` was told to add --task-fields, and
    with them loaded the model only to refuse the task; position reads no prompt/answer file, whatever its fields."""
    from headscope.analyses.core import registry
    from headscope.analyses.position.records import QA_FIELDS, RETRIEVAL_FIELDS

    needs = {name: registry.needs(name) for name in names}
    if not names or any(n.task_data for n in needs.values()):
        return ""
    what = "; ".join((f"{name}: " if len(names) > 1 else "") + (n.what or "its own") for name, n in needs.items())
    takes = ("; its --task takes a JSONL file of its own records, one JSON object a line: multi-document QA records "
             f"({', '.join(QA_FIELDS)}) on a decoder, retrieval records ({', '.join(RETRIEVAL_FIELDS)}) on an encoder"
             if all(n.own_records is not None for n in needs.values()) else "")
    return (f"{' and '.join(names)} run{'s' if len(names) == 1 else ''} on {'its' if len(names) == 1 else 'their'} own "
            f"data ({what}), not on prompt/answer tasks, so {Path(task).name} is not read, whatever --task-fields "
            f"says{takes}. Leave --task out for its default data or run `headscope report --task {Path(task).name} "
            "--task-fields ...` for the analyses that read prompt/answer tasks.")


def _own_records(names: Sequence[str], task: Any) -> bool:
    """Whether every analysis of the run reads the task file as records of its own (contract.takes_own_records:
    `headscope position --task FILE.jsonl`), so it is not read as a prompt/answer task; the file's fit to the model
    is checked with the plan (runner.plan_analyses), after the model loads and before any work."""
    from headscope.analyses.core import contract, registry

    return bool(names) and all(contract.takes_own_records(registry.needs(name), task) for name in names)


def checked_settings(model: Any, o: ReportOptions, main: bool) -> RunSettings:
    """The run's settings, every user mistake found before anything is written: modes, device, numbers,
    analysis names, the task (a task file read once here, TaskFile.held, and every row checked), OUT."""
    from headscope.analyses.core.config import check_shared
    from headscope.models.loading import run_dtype_name

    check_shared(seed=o.seed, n_examples=o.n_examples)  # bad numbers: one line, before any file or work
    budget_minutes(o.budget, o.quick)
    if o.prepend_bos not in (None, True, False):
        raise ConfigError(f"prepend_bos must be None, True or False, got {o.prepend_bos!r}.")
    names = parse_analyses(o.analyses)
    check_n_items(o.n_items, names)
    task, task_rows = o.task, None
    if task is not None and Path(task).suffix and not _own_records(names, task) and (why := _own_data_only(names, task)):
        raise ConfigError(why)  # review 14c C3: before any column is read and before the model loads
    if task is not None and _own_records(names, task):  # position's retrieval/QA records: its loader checks them
        if o.task_fields:
            raise ConfigError(f"--task-fields names a prompt/answer file's columns; {', '.join(names)} reads "
                              f"{Path(task).name} as its own records, by their own field names.")
        task = os.fspath(task)
    elif task is not None and Path(task).suffix:
        from headscope.analyses.core.task_files import TaskFile, read_numbered_rows

        try:
            task = TaskFile(task, o.task_fields, strict=o.strict or None).held()  # read once; fields go to every analysis
            task_rows = read_numbered_rows(task, n_examples=200, seed=o.seed)  # every row checked before any write
        except TaskFileError as err:
            raise TaskFileError(f"{err}{_records_hint(o.task, names)}") from None
    elif o.task_fields:
        raise ConfigError(f"task fields {o.task_fields!r} need a task file (--task FILE), not task {task!r}.")
    _check_task_name(task)
    _check_examples(names, o.n_examples)
    if o.out is not None and not str(o.out).strip():
        raise ConfigError("--out is empty; give the output folder's path (or leave --out out for the default).")
    return RunSettings(names=names, task=task, task_rows=task_rows, seed=o.seed, quick=o.quick, n_examples=o.n_examples,
                       progress=o.progress, command=o.command, main=main, budget=o.budget,
                       minutes=budget_minutes(o.budget, o.quick), substitute=o.substitute,
                       dtype=run_dtype_name(model, o.dtype),
                       prepend_bos=getattr(model, "prepend_bos", None) if o.prepend_bos is None else o.prepend_bos,
                       n_items=o.n_items)
