"""build_report: run analyses on a model and write the output contract of DESIGN.md.

    OUT/manifest.json, OUT/<analysis>/{results.csv, summary.json, task.json, *.png, <table>.csv},
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
import dataclasses
import logging
import os
import random
import re
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from headscope.analyses.core.registry import ANALYSES, config_class, get_analysis
from headscope.analyses.core.registry import needs as contract_needs
from headscope.errors import (
    ConfigError,
    HeadscopeError,
    OutputError,
    RunFailedError,
    RunInterrupted,
    TaskError,
    TaskFileError,
)
from headscope.execution import distributed
from headscope.reports import io
from headscope.reports.manifest import build_manifest
from headscope.reports.outputs import OutputSession, _make_parents, check_modes, check_out, replace_folder, sha256

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


@dataclass(frozen=True)
class Plan:
    """What one analysis of a report runs on, decided before any analysis runs (the task contract).

    task: what it is given (the user's task, or None: its own default); used: the line the report
    and the manifest's "task_used" show; skip: why it cannot run on this model at all (None: it runs)."""

    task: Any
    used: str
    skip: str | None = None


def _task_label(task: Any) -> str:
    return Path(task).name if isinstance(task, str) and Path(task).suffix else str(getattr(task, "name", task))


def plan_analyses(model: Any, names: Sequence[str], task: Any, *, seed: int = 0,
                  substitute: bool = True) -> dict[str, Plan]:
    """Check every analysis against the model and the user's task before any runs.

    An analysis that cannot run on the model (a decoder-only one on an encoder) is skipped with its
    reason; one that cannot use the user's task runs on its own default task, and its line says why
    (substitute=False: a TaskError with the reason instead, for a command that runs one analysis
    the user gave a task), except one that patches pairs when no pair of the task has one token
    length: it is skipped with that reason. The user's task is read once here, so a mistake in it
    stops the run before any work."""
    from headscope.analyses.core import contract
    from headscope.analyses.core.registry import needs
    from headscope.analyses.core.tasks import Task

    plans: dict[str, Plan] = {}
    resolved: list[Any] = []  # the user's Task, read on first need
    for name in names:
        need = needs(name)
        reasons = contract.model_reasons(need, model)
        if reasons:
            plans[name] = Plan(task=None, used="none", skip="; ".join(reasons))
            continue
        if task is None:
            plans[name] = Plan(task=None, used="default task")
            continue
        named = isinstance(task, str) and task in need.names
        if not resolved and need.task_data and not named:
            resolved.append(contract.resolve(task, model, seed=seed))
        checked = task if named or not need.task_data else resolved[0]
        reasons = contract.task_reasons(need, checked, model)
        no_pairs = isinstance(checked, Task) and contract.no_pairs_reason(checked) in reasons
        if reasons and not substitute and no_pairs:
            raise TaskError(f"{name} cannot run on your task ({_task_label(task)}): {contract.no_pairs_reason(checked)}. "
                            f"Give each corrupted prompt the token length of its prompt.")
        if reasons and not substitute:
            raise TaskError(f"{name} cannot run on your task ({_task_label(task)}): {'; '.join(reasons)}. Give it a task "
                            f"it can use, or run `headscope report --analyses {name}`, which runs it on its own default task.")
        if no_pairs:
            plans[name] = Plan(task=None, used="none", skip=contract.no_pairs_reason(checked))
        elif reasons:
            plans[name] = Plan(task=None, used=f"default task ({'; '.join(reasons)})")
        else:
            plans[name] = Plan(task=task, used=f"your task ({_task_label(task)})")
    return plans


def _check_examples(names: Sequence[str], n_examples: int | None) -> None:
    """--n-examples below what an analysis can run on is one line before anything is written, not a
    failed analysis: probes' cross-validation needs at least 3 (its fewest folds; answer labels give one
    sample an example) and heads two (a resample partner; its Needs.min_examples)."""
    if n_examples is None:
        return
    floors = {"probes": 3, "heads": contract_needs("heads").min_examples}
    short = {name: floors[name] for name in names if n_examples < floors.get(name, 1)}
    if short:
        needed = ", ".join(f"{name} at least {n}" for name, n in short.items())
        raise ConfigError(f"--n-examples {n_examples} is too few: {needed} (pass more, or --analyses without "
                          f"{' and '.join(short)}).")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def write_result(result: Any, folder: Path, files: dict[str, str] | None = None,
                 extra: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Stage the analysis's files in a hidden folder, then rename it into place; returns
    {file name: sha256} of the files written. `extra`: further JSON files by name (task.json).

    An existing `folder` is replaced: its files listed in `files` ({file name: sha256}, what
    headscope wrote there before) go when unchanged, anything else in it is moved into the new
    folder (see reports/outputs.py)."""
    import matplotlib.pyplot as plt

    stage = folder.parent / f".{folder.name}.partial"
    shutil.rmtree(stage, ignore_errors=True)  # a killed run's leftover (the name is headscope's)
    stage.mkdir(parents=True)
    try:  # a write that fails (a full disk, Ctrl-C) leaves no staging folder behind
        io.write_csv(stage / "results.csv", result.df)
        for name, table in result.tables.items():
            io.write_csv(stage / f"{name}.csv", table)
        for stem, fig in result.plot().items():
            io.write_figure(stage / f"{stem}.png", fig)
            plt.close(fig)
        for file_name, data in (extra or {}).items():
            io.write_json(stage / file_name, data)
        io.write_json(stage / DONE, result.summary)
        hashes = {entry.name: sha256(Path(entry.path)) for entry in sorted(os.scandir(stage), key=lambda e: e.name)}
        if os.path.lexists(folder):
            replace_folder(stage, folder, files or {})
        else:
            stage.rename(folder)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return hashes


def damaged_analyses(root: Path, files: Mapping[str, str]) -> dict[str, str]:
    """name -> why, for each finished analysis folder in `root` (its summary.json there or listed) that
    --resume cannot keep: a file the manifest lists under it (`files`: relative path -> sha256) is missing, not
    a regular file, or unreadable or changed (its sha256), or the manifest lists its files but not its summary.json.
    A folder the manifest lists nothing for (a run killed between the folder's rename and the manifest
    write) is kept: it appeared whole."""
    damaged = {}
    for name in ANALYSES:
        listed = {rel: h for rel, h in files.items() if rel.startswith(f"{name}/")}
        if not listed or not ((root / name / DONE).is_file() or f"{name}/{DONE}" in listed):
            continue  # never finished (or not listed yet): it runs when named, as before
        if f"{name}/{DONE}" not in listed:
            damaged[name] = f"manifest.json does not list {name}/{DONE}"
            continue
        for rel, digest in sorted(listed.items()):
            path = root / rel
            if path.is_symlink() or not path.is_file():
                damaged[name] = f"{rel} is missing"
            elif _hash_or_none(path) != digest:
                damaged[name] = f"{rel} does not match its sha256 in manifest.json (changed since it was written)"
            else:
                continue
            break
    return damaged


def _hash_or_none(path: Path) -> str | None:
    try:
        return sha256(path)
    except OSError:
        return None


def run_settings(model: Any, names: Sequence[str], task: Any, *, seed: int, quick: bool, n_examples: int | None,
                 budget: float | None = None) -> dict:
    """What a --resume must match (the manifest's config "settings"): the model's source and files
    (models/fingerprint.py: new weights saved over the same folder are another model), the task
    (a task file by its bytes, field mapping and strictness, not its path), seed, quick, n_examples, the
    headscope version and each analysis's config. `model` is a HookedModel or a load_model spec."""
    import json

    from headscope.models.fingerprint import model_fingerprint
    from headscope.models.loading import resolve_spec
    from headscope.version import __version__

    source = getattr(model, "source", None) if hasattr(model, "facts") else resolve_spec(model)[1]
    is_file = isinstance(task, str) and bool(Path(task).suffix)
    configs = {}
    for name in names:
        config = config_class(name).preset(seed=seed, quick=quick, n_examples=n_examples).as_dict()
        config.pop("progress", None)
        configs[name] = json.loads(json.dumps(config, default=str))  # as the manifest stores it
    return {
        "model_source": str(source), "model_files": model_fingerprint(source),
        "task": None if task is None else (Path(task).name if is_file else str(task)),
        "task_fields": dict(getattr(task, "fields", None) or {}), "task_sha256": sha256(Path(task)) if is_file else None,
        "strict": bool(getattr(task, "strict", False)), "seed": seed, "quick": quick, "n_examples": n_examples,
        "budget_minutes": budget_minutes(budget, quick), "headscope": __version__, "analysis_configs": configs,
    }


def budget_minutes(budget: float | None, quick: bool) -> float | None:
    """The run's budget in minutes: `budget`, else the default (budget.REPORT_MINUTES, QUICK_MINUTES
    with quick); None for no budget (inf)."""
    import math

    from headscope.analyses.core import budget as B

    if budget is None:
        return B.QUICK_MINUTES if quick else B.REPORT_MINUTES
    if not budget > 0:
        raise ConfigError(f"--budget is in minutes and must be positive (inf: no budget), got {budget:g}.")
    return None if math.isinf(budget) else float(budget)


def fit_to_budget(model: Any, names: Sequence[str], plans: dict[str, Plan], common: dict, minutes: float | None) -> dict:
    """name -> budget.Fitted for the analyses about to run: each one's cost estimated on the task it
    will use, the budget shared among them (budget.plan). An estimate that fails leaves that
    analysis at its preset (logged), never the run."""
    from headscope.analyses.core import budget as B
    from headscope.analyses.core.registry import cost_model, task_used

    entries = {}
    for name in names:
        config = config_class(name).preset(**common)
        try:
            entries[name] = (cost_model(name), task_used(name, model, plans[name].task, config), config)
        except Exception as err:  # noqa: BLE001 - an estimate must not stop the run; its analysis reports its own errors
            log.warning("%s: no cost estimate (%s: %s); it runs at its preset", name, type(err).__name__, err)
    try:
        fitted = B.plan(model, entries, minutes)
    except Exception as err:  # noqa: BLE001
        log.warning("no cost estimates (%s: %s); every analysis runs at its preset", type(err).__name__, err)
        return {}
    for name, f in fitted.items():
        log.info("%s", B.describe(name, f))
    return fitted


def _explorer_tasks(model: Any, names: Sequence[str], plans: dict[str, Plan], common: dict,
                    status: dict[str, str]) -> dict[str, Any]:
    """{label: Task} of each task the analyses that ran used (label: the task's name and those
    analyses), for the explorer's examples; an analysis whose task cannot be resolved is left out."""
    from headscope.analyses.core.registry import task_used as resolve

    by_name: dict[str, tuple[Any, list[str]]] = {}
    for name in names:
        if name not in plans or plans[name].skip is not None or not status.get(name, "").startswith("done"):
            continue
        try:
            used = resolve(name, model, plans[name].task, config_class(name).preset(**common))
        except Exception as err:  # noqa: BLE001 - the explorer is optional; its first task still shows
            log.info("explorer: no examples of %s's task (%s: %s)", name, type(err).__name__, err)
            continue
        if used is not None and hasattr(used, "tokens"):
            by_name.setdefault(str(used.name), (used, []))[1].append(name)
    return {f"{task_name} ({', '.join(who)})": used for task_name, (used, who) in by_name.items()}


def check_resume(out: Path, settings: dict) -> None:
    """Refuse (one line, ConfigError) to --resume OUT with settings other than those its finished
    analyses ran with, so that one report never mixes two configurations."""
    previous = io.read_json(out / "manifest.json") if (out / "manifest.json").is_file() else {}
    recorded = (previous.get("config") or {}).get("settings")
    if not isinstance(recorded, dict):
        finished = [n for n in ANALYSES if (out / n / DONE).is_file()]
        if finished:
            raise ConfigError(
                f"--resume: {str(out)!r} holds finished analyses ({', '.join(finished)}) but its manifest does not record "
                f"the settings they ran with; rerun with --force or choose another --out."
            )
        return
    differ = []
    for key, label in (("model_source", "model"), ("model_files", "model files (weights, config or tokenizer changed)"),
                       ("task", "task"), ("task_sha256", "task file contents"), ("task_fields", "task fields"),
                       ("seed", "seed"), ("quick", "--quick"), ("n_examples", "--n-examples"),
                       ("budget_minutes", "--budget"), ("headscope", "headscope version")):
        if key == "task" and recorded.get("task_sha256") and settings.get("task_sha256"):
            continue  # a task file is its bytes (compared next), wherever it lies now
        if key == "model_files" and differ:
            continue  # another model altogether (said already)
        if recorded.get(key) != settings.get(key):
            differ.append(label if key in ("task_sha256", "model_files") else
                          f"{label} {recorded.get(key)!r} (now {settings.get(key)!r})")
    old_configs = recorded.get("analysis_configs") or {}
    for name, config in settings["analysis_configs"].items():
        if name in old_configs and old_configs[name] != config and "headscope version" not in " ".join(differ):
            changed = sorted(k for k in set(config) | set(old_configs[name]) if config.get(k) != old_configs[name].get(k))
            differ.append(f"{name} config ({', '.join(changed)})")
    if differ:
        shown = "; ".join(differ[:4]) + (f"; and {len(differ) - 4} more" if len(differ) > 4 else "")
        raise ConfigError(
            f"--resume: {str(out)!r} was run with other settings: {shown}; resume with the settings in its manifest.json, "
            f"or use --force or another --out for a new run."
        )


def _open_output(out: Path, *, force: bool, resume: bool, main: bool,
                 settings: dict | None = None) -> tuple[Path, OutputSession | None, str]:
    """(OUT, the session on rank 0 else None, its mode on every rank); every rank raises rank 0's
    error. A resumed OUT must have been run with `settings` (check_resume)."""
    out = distributed.broadcast_object(Path(out))
    session, mode, error = None, None, None
    if main:
        try:
            session = OutputSession.open(out, force=force, resume=resume, transient=_transient())
            mode = session.mode
            if mode == "resume" and settings is not None:
                check_resume(session.root, settings)
        except HeadscopeError as err:
            if session is not None:
                session.close()
                session = None
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


def _after_failure(err: BaseException, out: Path | None, mode: str | None, kept: bool) -> BaseException | None:
    """Ctrl-C, and a write that failed in an OUT kept for --resume: the one line then says what OUT
    holds and how to go on (RunInterrupted, OutputError); None for any other error (raised as is)."""
    import shlex

    if mode is None or out is None:
        now = "nothing was written"
    elif mode == "force":
        now = f"{str(out)!r} is unchanged (--force replaces it only when every analysis finished)"
    elif kept:
        now = f"rerun with --resume --out {shlex.quote(str(out))} to finish the run (its finished analyses are kept)"
    else:
        now = f"no analysis had finished, so {str(out)!r} was removed"
    if isinstance(err, KeyboardInterrupt) and not isinstance(err, RunInterrupted):
        return RunInterrupted(f"interrupted; {now}.")
    if isinstance(err, OutputError) and kept and "--resume" not in str(err):
        return OutputError(f"{str(err).rstrip('.')}; once that is fixed, {now}.")
    return None


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
    progress: bool = False,
    command: list[str] | None = None,
    trust_remote_code: bool = False,
    strict: bool = False,
    budget: float | None = None,
    substitute: bool = True,
) -> Path:
    """Run the analyses and write OUT; returns OUT. `model` is a HookedModel or a spec for load_model
    (`trust_remote_code` goes to it: the model's own code from its files may run). `strict`: a word
    of the task file (any row, any field) that the tokenizer maps to its unknown token stops the run
    before any analysis with a TokenizationError, instead of a TokenizationWarning. `budget`: minutes
    for the analyses (None: 10, 3 with quick; inf: none): each analysis's cost is estimated before it
    runs and its sweeps shrink to fit (analyses/core/budget.py); its summary["budget"] says what changed.
    `substitute`: an analysis that cannot use the given task runs on its own default task, saying so
    (False: a TaskError with the reason, before any analysis runs; the single-analysis commands).

    Under torchrun (WORLD_SIZE > 1) the process group is opened here if needed; only rank 0 writes.
    `force` and `resume` together, and a `device` torch does not offer, are ConfigErrors before
    anything is written; Ctrl-C raises RunInterrupted (a KeyboardInterrupt) saying what OUT holds.
    """
    from headscope.analyses.core.config import check_shared
    from headscope.models import HookedModel, load_model
    from headscope.models.loading import check_device

    check_modes(force=force, resume=resume)
    check_device(device)  # before the process group opens and anything is written
    check_shared(seed=seed, n_examples=n_examples)  # bad numbers: one line, before any file or work
    budget_minutes(budget, quick)
    distributed.init_from_env(model.device if isinstance(model, HookedModel) else device)
    main = distributed.is_main()
    names = parse_analyses(analyses)
    task_rows = None
    if task is not None and Path(task).suffix:
        from headscope.analyses.core.task_files import TaskFile, read_task_rows

        task = TaskFile(task, task_fields, strict=strict or None)  # carries the column names to every analysis
        task_rows = read_task_rows(task, n_examples=200, seed=seed)  # every row checked: bad files fail before any write
    elif task_fields:
        raise ConfigError(f"task fields {task_fields!r} need a task file (--task FILE), not task {task!r}.")
    _check_task_name(task)
    _check_examples(names, n_examples)
    if out is not None and not str(out).strip():
        raise ConfigError("--out is empty; give the output folder's path (or leave --out out for the default).")
    minutes = budget_minutes(budget, quick)
    settings = run_settings(model, names, task, seed=seed, quick=quick, n_examples=n_examples, budget=budget)
    session: OutputSession | None = None
    if out is not None:  # locked and checked before the model loads: a refusal costs nothing
        out, session, mode = _open_output(Path(out), force=force, resume=resume, main=main, settings=settings)
    try:
        if not isinstance(model, HookedModel):
            model = load_model(model, device=device, trust_remote_code=trust_remote_code)
        if out is None:
            out, session, mode = _open_output(default_out(model.name), force=force, resume=resume, main=main)
        out = _run(model, out, session, mode, names=names, task=task, task_rows=task_rows, seed=seed, quick=quick,
                   n_examples=n_examples, progress=progress, command=command, main=main, budget=budget, minutes=minutes,
                   substitute=substitute)
    except BaseException as err:
        kept = False
        if session is not None:
            kept = session.mode == "resume" or (session.mode == "fresh" and any(
                (session.root / name / DONE).exists() for name in names))
            try:
                session.abort(keep_partial=session.mode == "fresh" and kept)
            except Exception:  # the original error matters more
                log.warning("could not clean up %s", session.root, exc_info=True)
        clearer = _after_failure(err, out, session.mode if session is not None else None, kept)
        if clearer is not None:
            raise clearer from None
        raise
    finally:
        if session is not None:
            session.close()
    distributed.barrier()  # no rank returns before the report exists
    return out


def _run(model: Any, out: Path, session: OutputSession | None, mode: str, *, names: list[str], task: Any,
         task_rows: Any, seed: int, quick: bool, n_examples: int | None, progress: bool,
         command: list[str] | None, main: bool, budget: float | None = None, minutes: float | None = None,
         substitute: bool = True) -> Path:
    """The analyses, written into the session's folder (OUT, or its staging folder under --force)."""
    root = session.root if session is not None else out
    transient = _transient()
    # --resume keeps a finished analysis only when every file the manifest lists for it is there with its sha256
    redo = distributed.broadcast_object(damaged_analyses(root, session.files) if main and mode == "resume" else {})
    for name, why in redo.items():
        log.warning("%s: %s; it runs again (--resume keeps only files that match manifest.json)", name, why)
    names = [*names, *(n for n in redo if n not in names)]
    if getattr(task, "strict", False):  # every row of the file, not the analyses' samples
        from headscope.analyses.core.task_files import check_vocabulary

        check_vocabulary(model, task)
    plans = plan_analyses(model, names, task, seed=seed, substitute=substitute)  # the task contract, before any work
    task_used: dict[str, str] = {}
    budget_info: dict[str, dict] = {}  # per analysis: its share of the budget and its estimate, in seconds

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
    finished = distributed.broadcast_object({n for n in names if main and mode == "resume" and (root / n / DONE).exists()
                                             and n not in redo})
    timings: dict[str, float] = dict(previous.get("timings_s", {}))
    # --resume keeps the analyses an earlier run of these settings finished (check_resume), named now or not
    kept = [n for n in ANALYSES if n not in names and main and mode == "resume" and (root / n / DONE).is_file()]
    status: dict[str, str] = {n: previous.get("status", {}).get(n, "done") for n in kept}
    task_used.update({n: previous["task_used"][n] for n in kept if n in previous.get("task_used", {})})
    report_names = [n for n in ANALYSES if n in names or n in kept]
    for name in kept:
        session.adopt_folder(name)  # (listed already, unless a run was killed before its manifest write)
    model_info = {"name": model.name, "source": model.source, **{k: v for k, v in vars(model.facts).items()}}
    settings = run_settings(model, names, task, seed=seed, quick=quick, n_examples=n_examples, budget=budget)
    old_configs = ((previous.get("config") or {}).get("settings") or {}).get("analysis_configs") or {}
    settings["analysis_configs"] = {n: settings["analysis_configs"].get(n, old_configs.get(n)) for n in report_names}
    config_info = {"analyses": report_names, "task": task, "quick": quick, "n_examples": n_examples, "budget_minutes": minutes,
                   "strict": bool(getattr(task, "strict", False)), "device": str(model.device), "settings": settings}

    def save_manifest() -> None:
        if not main:
            return
        with writing("manifest.json"):
            session.write_manifest({**build_manifest(command=command, config=config_info, model=model_info,
                                                     seed=seed, timings=timings, status=status), "task_used": task_used,
                                   "budget": budget_info})

    save_manifest()  # the settings are on record before any analysis folder appears (what --resume checks)
    to_run = [n for n in names if n not in finished and plans[n].skip is None]
    # before any runs: the budget is shared; rank 0's timing decides, so every rank runs the same settings
    fitted = distributed.broadcast_object(fit_to_budget(model, to_run, plans, common, minutes) if main else None)
    budget_info.update({n: v for n, v in (previous.get("budget") or {}).items() if n in report_names})  # --resume
    budget_info.update({name: f.timing() for name, f in fitted.items()})
    for name in names:
        folder = root / name
        plan = plans[name]
        task_used[name] = plan.used
        if name in finished:
            task_used[name] = previous.get("task_used", {}).get(name, plan.used)
            status[name] = "done (resumed)"
            if main:
                session.adopt_folder(name)
            log.info("%s: already complete, skipped (--resume)", name)
            continue
        if plan.skip is not None:  # cannot run on this model: no folder, not a failure
            status[name] = f"skipped: {plan.skip}"
            log.info("%s: skipped (%s)", name, plan.skip)
            save_manifest()
            continue
        log.info("%s: running on %s", name, plan.used)
        seed_everything(seed)
        start = time.perf_counter()
        try:
            fit = fitted.get(name)
            config = config_class(name).preset(**common) if fit is None else fit.config
            result = get_analysis(name)(model, plan.task, config)
            if fit is not None and dataclasses.is_dataclass(result) and isinstance(getattr(result, "summary", None), dict):
                result = dataclasses.replace(result, summary={**result.summary, "budget": fit.summary()})
            state = "done"
        except Exception as err:  # one failing analysis must not lose the others
            if isinstance(err, HeadscopeError):  # a user mistake: one line, no traceback
                log.error("%s failed: %s", name, err)
            else:
                log.exception("%s failed", name)
            state = f"failed: {type(err).__name__}: {err}"
        if state == "done" and main:
            from headscope.reports.provenance import TASK_FILE, task_record

            summary = result.summary if isinstance(getattr(result, "summary", None), Mapping) else {}
            record = task_record(model, name, plan.task, config, summary, plan.used)  # the section's provenance
            try:
                with writing(f"the {name} results"):
                    prefix = f"{name}/"
                    ours = {r[len(prefix):]: h for r, h in session.files.items() if r.startswith(prefix)}
                    session.record_folder(name, write_result(result, folder, ours, extra={TASK_FILE: record}))
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
                write_explorer_data(model, root, task, seed=seed,
                                    more_tasks=_explorer_tasks(model, names, plans, common, status))
            session.record("explorer.json")
        except OutputError:
            raise
        except Exception as err:  # optional: a model without hook_pattern still gets its report
            log.warning("attention explorer skipped: %s: %s", type(err).__name__, err)
        with writing("report.html and report.md"):
            write_report_files(root, report_names, status, model_info, task_used=task_used)
            session.record("report.md")
            session.record("report.html")
        save_manifest()  # last: it lists the report files
        session.commit(transient=transient)
    return out
