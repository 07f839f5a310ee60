"""build_report: run analyses on a model and write the output contract of DESIGN.md.

    OUT/manifest.json, OUT/<analysis>/{results.csv, summary.json, *.png, <table>.csv},
    OUT/report.html (self-contained, every string escaped), OUT/report.md

Every file is written atomically; each analysis's folder appears whole (staged, then renamed),
and the report files are written last, from what is on disk, so an interrupted run leaves no
report, and `resume=True` skips finished analyses and gives the same report.

The output folder (reports/outputs.py): a run locks OUT, lists every file it writes with its
sha256 in manifest.json, deletes only such files, and with --force writes into a staging folder
beside OUT that replaces OUT only when every analysis succeeded (the user's files in the old
folder are carried over); a failed --force run leaves OUT as it was.

Under torchrun every rank runs every analysis on its shard of the examples (see
analyses/distributed.py) and ends with the same results; rank 0 alone prepares OUT and writes
files, and the ranks agree on each analysis's status.
"""
from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from headscope.analyses.core.registry import ANALYSES, config_class, get_analysis
from headscope.errors import ConfigError, HeadscopeError, OutputError, RunFailedError, TaskFileError
from headscope.execution import distributed
from headscope.reports import io
from headscope.reports.manifest import build_manifest
from headscope.reports.outputs import OutputSession, _make_parents, check_out, replace_folder, sha256

log = logging.getLogger(__name__)
DONE = "summary.json"  # written last in an analysis folder: its presence marks the analysis complete



def default_out(model_name: str) -> Path:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", model_name).strip("-") or "model"
    return Path("headscope-out") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def parse_analyses(names: str | Sequence[str] | None) -> list[str]:
    if names is None:
        return list(ANALYSES)
    items = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    unknown = [n for n in items if n not in ANALYSES]
    if unknown or not items:
        given = ", ".join(map(repr, unknown)) or "(none given)"
        raise ConfigError(f"Unknown analysis {given}; choose from: {', '.join(ANALYSES)}.")
    return items


def prepare_out(out: Path, *, force: bool, resume: bool) -> None:
    """Refuse an OUT no run may write into (exists without --force/--resume, not a headscope output,
    a symlink with --force...), create a missing one; deletes nothing. A run itself opens an
    OutputSession (lock, staging, swap: reports/outputs.py)."""
    out = Path(out)
    check_out(out, force=force, resume=resume)
    if not os.path.lexists(out):
        _make_parents(out)


def _transient() -> list[str]:
    """The staging folders of analyses that a killed run may leave in OUT (headscope's to remove)."""
    return [f".{name}.partial" for name in ANALYSES]


def _check_task_name(task: Any) -> None:
    """A task given by name must be a zoo task (a typo fails here, before any work)."""
    from headscope.analyses.core.tasks import ZOO_TASKS

    if isinstance(task, str) and not Path(task).suffix and task not in ZOO_TASKS:
        raise TaskFileError(f"Unknown task {task!r}: use a zoo task ({', '.join(ZOO_TASKS)}) or a .jsonl/.csv/.parquet file.")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def write_result(result: Any, folder: Path, files: dict[str, str] | None = None) -> dict[str, str]:
    """Stage the analysis's files in a hidden folder, then rename it into place; returns
    {file name: sha256} of the files written.

    An existing `folder` is replaced: its files listed in `files` ({file name: sha256}, what
    headscope wrote there before) go when unchanged, anything else in it is moved into the new
    folder (see reports/outputs.py)."""
    import matplotlib.pyplot as plt

    stage = folder.parent / f".{folder.name}.partial"
    shutil.rmtree(stage, ignore_errors=True)  # a killed run's leftover (the name is headscope's)
    stage.mkdir(parents=True)
    io.write_csv(stage / "results.csv", result.df)
    for name, table in result.tables.items():
        io.write_csv(stage / f"{name}.csv", table)
    for stem, fig in result.plot().items():
        io.write_figure(stage / f"{stem}.png", fig)
        plt.close(fig)
    io.write_json(stage / DONE, result.summary)
    hashes = {entry.name: sha256(Path(entry.path)) for entry in sorted(os.scandir(stage), key=lambda e: e.name)}
    if os.path.lexists(folder):
        replace_folder(stage, folder, files or {})
    else:
        stage.rename(folder)
    return hashes


def _open_output(out: Path, *, force: bool, resume: bool, main: bool) -> tuple[Path, OutputSession | None, str]:
    """(OUT, the session on rank 0 else None, its mode on every rank); every rank raises rank 0's error."""
    out = distributed.broadcast_object(Path(out))
    session, mode, error = None, None, None
    if main:
        try:
            session = OutputSession.open(out, force=force, resume=resume, transient=_transient())
            mode = session.mode
        except HeadscopeError as err:
            error = err
    error, mode = distributed.broadcast_object((error, mode))  # every rank stops when rank 0 cannot write
    if error is not None:
        raise error
    return out, session, mode


@contextlib.contextmanager
def _writing(what: str, out: Path):
    """An OSError while writing (disk full, permissions) becomes a one-line OutputError."""
    try:
        yield
    except HeadscopeError:
        raise
    except OSError as err:
        raise OutputError(f"Could not write {what} in {str(out)!r}: {err.strerror or err}"
                          + (f" ({err.filename})" if err.filename else "") + ".") from None


def _failure_is_mistake(state: str) -> bool:
    """Whether a "failed: Type: message" status names a HeadscopeError (a user mistake)."""
    from headscope import errors

    kind = state.removeprefix("failed: ").split(":", 1)[0]
    return isinstance(getattr(errors, kind, None), type) and issubclass(getattr(errors, kind), HeadscopeError)


def build_report(
    model: Any = None,
    *,
    out: str | Path | None = None,
    analyses: str | Sequence[str] | None = None,
    task: str | None = None,
    task_fields: dict[str, str] | str | None = None,
    seed: int = 0,
    quick: bool = False,
    n_examples: int | None = None,
    device: str | None = None,
    force: bool = False,
    resume: bool = False,
    progress: bool = True,
    command: list[str] | None = None,
) -> Path:
    """Run the analyses and write OUT; returns OUT. `model` is a HookedModel or a spec for load_model.

    Under torchrun (WORLD_SIZE > 1) the process group is opened here if needed; only rank 0 writes.
    """
    from headscope.models import HookedModel, load_model

    distributed.init_from_env(model.device if isinstance(model, HookedModel) else device)
    main = distributed.is_main()
    names = parse_analyses(analyses)
    task_rows = None
    if task is not None and Path(task).suffix:
        from headscope.analyses.core.task_files import TaskFile, read_task_rows

        task = TaskFile(task, task_fields)  # a path that carries the column names to every analysis
        task_rows = read_task_rows(task)  # bad task files fail before anything is written
    elif task_fields:
        raise ConfigError(f"task fields {task_fields!r} need a task file (--task FILE), not task {task!r}.")
    _check_task_name(task)
    session: OutputSession | None = None
    if out is not None:  # locked and checked before the model loads: a refusal costs nothing
        out, session, mode = _open_output(Path(out), force=force, resume=resume, main=main)
    try:
        if not isinstance(model, HookedModel):
            model = load_model(model, device=device)
        if out is None:
            out, session, mode = _open_output(default_out(model.name), force=force, resume=resume, main=main)
        out = _run(model, out, session, mode, names=names, task=task, task_rows=task_rows, seed=seed, quick=quick,
                   n_examples=n_examples, progress=progress, command=command, main=main)
    except BaseException:
        if session is not None:
            try:
                session.abort(keep_partial=session.mode == "fresh" and any(
                    (session.root / name / DONE).exists() for name in names))
            except Exception:  # the original error matters more
                log.warning("could not clean up %s", session.root, exc_info=True)
        raise
    finally:
        if session is not None:
            session.close()
    distributed.barrier()  # no rank returns before the report exists
    return out


def _run(model: Any, out: Path, session: OutputSession | None, mode: str, *, names: list[str], task: Any,
         task_rows: Any, seed: int, quick: bool, n_examples: int | None, progress: bool,
         command: list[str] | None, main: bool) -> Path:
    """The analyses, written into the session's folder (OUT, or its staging folder under --force)."""
    root = session.root if session is not None else out
    transient = _transient()

    def writing(what: str):
        return _writing(what, out)

    if task_rows is not None and main:  # the user's prompts, shown (escaped) in the report
        import pandas as pd

        with writing("task_examples.csv"):
            io.write_csv(root / "task_examples.csv", pd.DataFrame(task_rows))
            session.record("task_examples.csv")
    common = dict(seed=seed, quick=quick, n_examples=n_examples, progress=progress and main)
    manifest_path = root / "manifest.json"
    previous = io.read_json(manifest_path) if main and mode == "resume" and manifest_path.exists() else {}
    finished = distributed.broadcast_object({n for n in names if main and mode == "resume" and (root / n / DONE).exists()})
    timings: dict[str, float] = dict(previous.get("timings_s", {}))
    status: dict[str, str] = {}
    model_info = {"name": model.name, "source": model.source, **{k: v for k, v in vars(model.facts).items()}}
    config_info = {"analyses": names, "task": task, "quick": quick, "n_examples": n_examples, "device": str(model.device)}

    def save_manifest() -> None:
        if not main:
            return
        with writing("manifest.json"):
            session.write_manifest(build_manifest(command=command, config=config_info, model=model_info,
                                                  seed=seed, timings=timings, status=status))

    for name in names:
        folder = root / name
        if name in finished:
            status[name] = "done (resumed)"
            if main:
                session.adopt_folder(name)
            log.info("%s: already complete, skipped (--resume)", name)
            continue
        log.info("%s: running", name)
        seed_everything(seed)
        start = time.perf_counter()
        try:
            result = get_analysis(name)(model, task, config_class(name).preset(**common))
            state = "done"
        except Exception as err:  # one failing analysis must not lose the others
            if isinstance(err, HeadscopeError):  # a user mistake: one line, no traceback
                log.error("%s failed: %s", name, err)
            else:
                log.exception("%s failed", name)
            state = f"failed: {type(err).__name__}: {err}"
        if state == "done" and main:
            try:
                with writing(f"the {name} results"):
                    prefix = f"{name}/"
                    ours = {r[len(prefix):]: h for r, h in session.files.items() if r.startswith(prefix)}
                    session.record_folder(name, write_result(result, folder, ours))
            except OutputError as err:
                state = f"fatal: {err}"
        states = distributed.gather_objects(state)  # a failure on any rank fails the analysis
        fatal = next((s for s in states if s.startswith("fatal: ")), None)
        if fatal is not None:
            raise OutputError(fatal.removeprefix("fatal: "))
        status[name] = next((s for s in states if s != "done"), "done")
        timings[name] = round(time.perf_counter() - start, 3)
        save_manifest()
    failed = [n for n, s in status.items() if s.startswith("failed")]
    if mode == "force" and failed:  # the previous output stays exactly as it was
        first = status[failed[0]].removeprefix("failed: ").rstrip(".")
        raise RunFailedError(
            f"{', '.join(failed)} failed ({first}); with --force nothing was replaced: {str(out)!r} is unchanged.",
            user_mistake=all(_failure_is_mistake(status[n]) for n in failed),
        )
    if main:
        from headscope.reports.explorer import write_explorer_data
        from headscope.reports.html_report import write_report_files

        try:  # the attention explorer's data: a few examples of the task, every layer's pattern
            with writing("explorer.json"):
                write_explorer_data(model, root, task, seed=seed)
            session.record("explorer.json")
        except OutputError:
            raise
        except Exception as err:  # optional: a model without hook_pattern still gets its report
            log.warning("attention explorer skipped: %s: %s", type(err).__name__, err)
        with writing("report.html and report.md"):
            write_report_files(root, names, status, model_info)
            session.record("report.md")
            session.record("report.html")
        save_manifest()  # last: it lists the report files
        session.commit(transient=transient)
    return out
