"""build_report: write a report's output folder; the analyses are planned and run by
analyses/core/runner.py, and this module writes what the runner hands it.

    OUT/manifest.json, OUT/<analysis>/{results.csv, summary.json, task.json, *.png, <table>.csv},
    OUT/explorer.json, OUT/report.html (self-contained, every string escaped), OUT/report.md

Every file is written atomically; each analysis's folder appears whole (staged, then renamed),
and the report files are written last, from what is on disk, so an interrupted run leaves no
report, and `resume=True` skips finished analyses and gives the same report.

The output folder (reports/outputs.py): a run locks OUT, lists every file it writes with its
sha256 in manifest.json, deletes only such files, and with --force writes into a staging folder
beside OUT that replaces OUT only when every analysis succeeded (the user's files in the old
folder are carried over); a failed --force run leaves OUT as it was. What --resume must match:
reports/resume_settings.py. The settings and their checks before any write: reports/report_settings.py.

Under torchrun every rank runs every analysis on its shard of the examples (see
execution/distributed.py) and ends with the same results; rank 0 alone prepares OUT and writes
files, and the ranks agree on each analysis's status.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headscope.analyses.core import runner
from headscope.analyses.core.registry import ANALYSES, get_analysis
from headscope.analyses.core.runner import Failure, Plan, plan_analyses
from headscope.errors import (
    ConfigError,
    HeadscopeError,
    OutputError,
    RunFailedError,
    RunInterrupted,
)
from headscope.execution import block_shape, distributed
from headscope.models.hooked_model import layer_windows
from headscope.reports import io
from headscope.reports.manifest import build_manifest
from headscope.reports.outputs import OutputSession, _make_parents, check_modes, check_out, replace_folder, sha256
from headscope.reports.report_settings import ReportOptions, RunSettings, checked_settings
from headscope.reports.resume_settings import DONE, check_resume, damaged_analyses, run_settings

log = logging.getLogger(__name__)



def default_out(model_name: str) -> Path:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", model_name).strip("-") or "model"
    return Path("headscope-out") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"


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
        io.write_csv(stage / "results.csv", result.df)  # always (the output contract); its columns where no rows
        for name, table in result.tables.items():
            if len(table):  # review 16dv C1: a table with no rows (position's masks not run) is neither written nor linked
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


@dataclass(frozen=True)
class ReportRun:
    """A finished report run: OUT, and the analyses that failed (name -> runner.Failure)."""

    out: Path
    failures: dict[str, Failure]


def build_report(model: Any = None, **options: Any) -> Path:
    """Run the analyses and write OUT; returns OUT. `model` is a HookedModel or a spec for load_model;
    the keyword options are ReportOptions' fields (run_report: the same, with the failures).

    trust_remote_code goes to load_model (the model's own code from its files may run). `strict`: a word
    of the task file (any row, any field) that the tokenizer maps to its unknown token stops the run
    before any analysis with a TokenizationError, instead of a TokenizationWarning. `budget`: minutes
    for the analyses (None: 10, 3 with quick; inf: none): each analysis's cost is estimated before it
    runs and its sweeps shrink to fit (analyses/core/budget.py); its summary["budget"] says what changed.
    `prepend_bos` goes to load_model (False: prompts run as the tokenizer tokenizes them, no BOS put in front
    of a decoder's prompt by headscope; None: TransformerLens's habit, a BOS on decoders).
    `substitute`: an analysis that cannot use the given task runs on its own default task, saying so
    (False: a TaskError with the reason, before any analysis runs; the single-analysis commands).

    Under torchrun (WORLD_SIZE > 1) the process group is opened here if needed; only rank 0 writes.
    `force` and `resume` together, and a `device` torch does not offer, are ConfigErrors before
    anything is written; Ctrl-C raises RunInterrupted (a KeyboardInterrupt) saying what OUT holds.
    """
    return run_report(model, ReportOptions(**options)).out


def _experts_per_layer(model: Any) -> dict[str, dict[str, Any]]:
    """{layer: its ExpertLayout as a dict} for the mixture-of-experts blocks ({} for a dense model)."""
    from headscope import hooks

    return {str(layer): layout.as_dict() for layer in range(model.facts.n_layers)
            if (layout := hooks.expert_layout(model, layer)) is not None}


def model_record(model: Any) -> dict[str, Any]:
    """The manifest's "model": its name, source and facts (n_ctx null where it has no fixed context: BLOOM's ALiBi,
    whose 2048 is TransformerLens's default, no limit of the model), parallel blocks, tied embeddings, MoE layout."""
    return {"name": model.name, "source": model.source, **vars(model.facts), "n_ctx": model.facts.context_limit,
            # review 8 C2: parallel blocks change what "mlp1" reads; the header says so
            "parallel_blocks": any(block_shape.is_parallel(b) for b in model.bridge.blocks),
            "tied_embeddings": _tied_embeddings(model),
            # review 11c A3: which blocks are mixtures of experts and their layout (the header names them)
            "experts_per_layer": _experts_per_layer(model),
            # review 17d C2: {layer: window} of the sliding-window (local) layers, the header names them
            "attention_windows": {str(i): w for i, w in enumerate(layer_windows(model)) if w is not None}}


def _tied_embeddings(model: Any) -> bool:
    """Whether the unembedding is the embedding matrix itself (the same storage), as in GPT-2, Qwen3 or Llama 3.2."""
    hf = getattr(getattr(model, "bridge", None), "original_model", None)
    try:
        out, inp = hf.get_output_embeddings(), hf.get_input_embeddings()
        return out is not None and out.weight.data_ptr() == inp.weight.data_ptr()
    except (AttributeError, NotImplementedError):
        return False


def _dtype_name(model: Any) -> str:
    """The model's compute dtype (HookedModel.dtype) as a name ("bfloat16"), for config.json and each
    section's provenance."""
    return str(model.dtype).removeprefix("torch.")


def run_report(model: Any, options: ReportOptions) -> ReportRun:
    """build_report with its failures: the runner's Failure objects (type, message, traceback), which the
    CLI turns into its exit status."""
    from headscope.models import HookedModel, load_model
    from headscope.models.loading import check_device, resolve_dtype

    o = options
    check_modes(force=o.force, resume=o.resume)
    check_device(o.device)  # before the process group opens and anything is written
    dtype = resolve_dtype(o.dtype)
    if dtype is not None and isinstance(model, HookedModel):
        raise ConfigError("dtype is for a model the report loads; cast a loaded model with load_model(..., dtype=...).")
    if o.prepend_bos is not None and isinstance(model, HookedModel):
        raise ConfigError("prepend_bos is for a model the report loads; load it with load_model(..., prepend_bos=...).")
    distributed.init_from_env(model.device if isinstance(model, HookedModel) else o.device)
    run = checked_settings(model, o, distributed.is_main())
    settings = run_settings(model, run.names, run.task, seed=o.seed, quick=o.quick, n_examples=o.n_examples, budget=o.budget,
                            dtype=run.dtype, prepend_bos=run.prepend_bos, overrides=run.overrides)
    session: OutputSession | None = None
    out, mode = o.out, None
    if out is not None:  # locked and checked before the model loads: a refusal costs nothing
        out, session, mode = _open_output(Path(out), force=o.force, resume=o.resume, main=run.main, settings=settings)
    try:
        if not isinstance(model, HookedModel):
            model = load_model(model, device=o.device, dtype=dtype, trust_remote_code=o.trust_remote_code,
                               prepend_bos=o.prepend_bos)
        if out is None:
            out, session, mode = _open_output(default_out(model.name), force=o.force, resume=o.resume, main=run.main)
        failures = _run(model, out, session, mode, run)
    except BaseException as err:
        kept = False
        if session is not None:
            kept = session.mode == "resume" or (session.mode == "fresh" and any(
                (session.root / name / DONE).exists() for name in run.names))
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
    return ReportRun(out=out, failures=failures)


@dataclass
class _Book:
    """What the manifest records as the run goes: each analysis's status, task line, budget and time,
    and the failures (runner.Failure objects) of this run."""

    status: dict[str, str]
    task_used: dict[str, str]
    budget: dict[str, dict]
    timings: dict[str, float]
    failures: dict[str, Failure] = dataclasses.field(default_factory=dict)


def _run(model: Any, out: Path, session: OutputSession | None, mode: str, run: RunSettings) -> dict[str, Failure]:
    """The analyses, written into the session's folder (OUT, or its staging folder under --force):
    the runner plans and runs them (analyses/core/runner.py), this module writes. Returns the failures."""
    root = session.root if session is not None else out
    resuming = run.main and mode == "resume"
    # --resume keeps a finished analysis only when every file the manifest lists for it is there with its sha256
    redo = distributed.broadcast_object(damaged_analyses(root, session.files) if resuming else {})
    for name, why in redo.items():
        log.warning("%s: %s; it runs again (--resume keeps only files that match manifest.json)", name, why)
    names = [*run.names, *(n for n in redo if n not in run.names)]
    if getattr(run.task, "strict", False):  # every row of the file, not the analyses' samples
        from headscope.analyses.core.task_files import check_vocabulary

        check_vocabulary(model, run.task)
    configs = {n: runner.preset(n, run.common, run.overrides) for n in names}  # own records checked under these
    plans = plan_analyses(model, names, run.task, seed=run.seed, substitute=run.substitute,
                          configs=configs)  # the contract, before any work
    finished = distributed.broadcast_object({n for n in names if resuming and (root / n / DONE).exists() and n not in redo})
    writer = _Writer.open(model, out, session, run, names, resuming)
    runs = [n for n in names if plans[n].skip is None]
    plans = runner.resolve_plans(model, plans, runs, run.common, finished=finished,
                                 overrides=run.overrides)  # each Task to run, resolved once
    # before any runs: the budget is shared; rank 0's timing decides, so every rank runs the same settings
    to_run = [n for n in runs if n not in finished]
    fitted = distributed.broadcast_object(runner.fit_to_budget(model, plans, to_run, run.minutes) if run.main else None)
    plans = runner.apply_budget(model, plans, fitted)
    writer.book.budget.update({name: f.timing() for name, f in fitted.items()})
    for name in names:
        writer.analysis(name, plans[name], resumed=name in finished)
    book = writer.book
    failed = [n for n in book.status if n in book.failures]
    if mode == "force" and failed:  # the previous output stays exactly as it was
        first = book.status[failed[0]].removeprefix("failed: ").rstrip(".")
        raise RunFailedError(
            f"{', '.join(failed)} failed ({first}); with --force nothing was replaced: {str(out)!r} is unchanged.",
            user_mistake=all(book.failures[n].mistake for n in failed),
        )
    if run.main:
        writer.pages(plans, [n for n in names if book.status.get(n, "").startswith("done")])
    return book.failures


@dataclass
class _Writer:
    """Writes one report run's files into `root` (OUT, or its staging folder under --force) as the
    runner hands it results: the task's examples, each analysis's folder and task.json, manifest.json
    after each step, explorer.json and the pages. Rank 0 writes; every rank keeps the book."""

    model: Any
    out: Path
    session: OutputSession | None
    run: RunSettings
    book: _Book
    previous: dict
    report_names: list[str]
    model_info: dict
    config_info: dict
    ran: dict = dataclasses.field(default_factory=dict)  # name -> what it ran on (runner.ran_on), for provenance and explorer

    @classmethod
    def open(cls, model: Any, out: Path, session: OutputSession | None, run: RunSettings, names: list[str],
             resuming: bool) -> _Writer:
        """The writer, with what a --resumed OUT already holds adopted and the manifest written once (the
        settings are on record before any analysis folder appears: what --resume checks)."""
        from headscope.reports.provenance import bos_is_eos

        root = session.root if session is not None else out
        if run.task_rows is not None and run.main:  # the user's prompts, shown (escaped) in the report
            import pandas as pd

            with _writing("task_examples.csv", out):
                io.write_csv(root / "task_examples.csv", pd.DataFrame(run.task_rows))
                session.record("task_examples.csv")
        manifest_path = root / "manifest.json"
        previous = io.read_json(manifest_path) if resuming and manifest_path.exists() else {}
        # --resume keeps the analyses an earlier run of these settings finished (check_resume), named now or not
        kept = [n for n in ANALYSES if n not in names and resuming and (root / n / DONE).is_file()]
        report_names = [n for n in ANALYSES if n in names or n in kept]
        book = _Book(status={n: previous.get("status", {}).get(n, "done") for n in kept},
                     task_used={n: previous["task_used"][n] for n in kept if n in previous.get("task_used", {})},
                     budget={n: v for n, v in (previous.get("budget") or {}).items() if n in report_names},
                     timings=dict(previous.get("timings_s", {})))
        for name in kept:
            session.adopt_folder(name)  # (listed already, unless a run was killed before its manifest write)
        settings = run_settings(model, names, run.task, seed=run.seed, quick=run.quick, n_examples=run.n_examples,
                                budget=run.budget, dtype=run.dtype, prepend_bos=run.prepend_bos, overrides=run.overrides)
        old_configs = ((previous.get("config") or {}).get("settings") or {}).get("analysis_configs") or {}
        settings["analysis_configs"] = {n: settings["analysis_configs"].get(n, old_configs.get(n)) for n in report_names}
        config_info = {"analyses": report_names, "task": run.task, "quick": run.quick, "n_examples": run.n_examples,
                       "budget_minutes": run.minutes, "strict": bool(getattr(run.task, "strict", False)),
                       "device": str(model.device), "dtype": _dtype_name(model), "prepend_bos": model.prepend_bos,
                       # review 10b A1: a BOS headscope puts in front that the tokenizer does not add (the header says it)
                       "bos_added": model.added_bos(), "settings": settings,
                       # review 19a C2: that BOS is the eos_token, the tokenizer defining no bos_token
                       **({"bos_is_eos": True} if model.added_bos() and bos_is_eos(model.tokenizer) else {})}
        writer = cls(model=model, out=out, session=session, run=run, book=book, previous=previous,
                     report_names=report_names, model_info=model_record(model), config_info=config_info)
        writer.manifest()
        return writer

    @property
    def root(self) -> Path:
        return self.session.root if self.session is not None else self.out

    def manifest(self) -> None:
        """manifest.json with the run's settings and the book so far (rank 0)."""
        if not self.run.main:
            return
        book = self.book
        with _writing("manifest.json", self.out):
            self.session.write_manifest({**build_manifest(command=self.run.command, config=self.config_info,
                                                          model=self.model_info, seed=self.run.seed, timings=book.timings,
                                                          status=book.status),
                                         "task_used": book.task_used, "budget": book.budget})

    def analysis(self, name: str, plan: Plan, *, resumed: bool) -> None:
        """One analysis of the report: kept (--resume), skipped, or run by the runner and written; the
        book records its status. A failure on any rank fails the analysis; a failed write stops the run."""
        book, main = self.book, self.run.main
        book.task_used[name] = plan.used
        if resumed:
            book.task_used[name] = self.previous.get("task_used", {}).get(name) or plan.used
            book.status[name] = "done (resumed)"
            if main:
                self.session.adopt_folder(name)
            log.info("%s: already complete, skipped (--resume)", name)
            return
        if plan.skip is not None:  # cannot run on this model: no folder, not a failure
            book.status[name] = f"skipped: {plan.skip}"
            log.info("%s: skipped (%s)", name, plan.skip)
            self.manifest()
            return
        log.info("%s: running on %s", name, plan.used)
        start = time.perf_counter()
        outcome = runner.run_planned(self.model, name, plan, self.run.seed, analysis=get_analysis(name))
        state: Any = outcome.failure or "done"
        if outcome.failure is None and main:
            try:
                self._write_result(name, plan, outcome.result)
            except OutputError as err:
                state = f"fatal: {err}"
        states = distributed.gather_objects(state)  # a failure on any rank fails the analysis
        fatal = next((s for s in states if isinstance(s, str) and s.startswith("fatal: ")), None)
        if fatal is not None:
            raise OutputError(fatal.removeprefix("fatal: "))
        failure = next((s for s in states if isinstance(s, Failure)), None)
        if failure is not None:
            book.failures[name] = failure
        book.status[name] = "done" if failure is None else failure.status
        book.timings[name] = round(time.perf_counter() - start, 3)
        self.manifest()

    def _write_result(self, name: str, plan: Plan, result: Any) -> None:
        """OUT/<name>/ (write_result) with task.json, the section's provenance from what the runner ran it on."""
        from headscope.reports.provenance import TASK_FILE, task_record

        summary = result.summary if isinstance(getattr(result, "summary", None), Mapping) else {}
        self.ran[name] = runner.ran_on(self.model, name, plan)
        record = task_record(self.model, name, self.ran[name], summary, plan.used, config=plan.config,
                             user_rows=self.run.task_rows, source=self.run.task)
        with _writing(f"the {name} results", self.out):
            prefix = f"{name}/"
            ours = {r[len(prefix):]: h for r, h in self.session.files.items() if r.startswith(prefix)}
            self.session.record_folder(name, write_result(result, self.root / name, ours, extra={TASK_FILE: record}))

    def pages(self, plans: Mapping[str, Plan], done: list[str]) -> None:
        """explorer.json (the runner captures the patterns; optional: a failure is a warning), then
        report.html and report.md from the files on disk, the manifest last, and the session committed."""
        from headscope.reports.explorer import write_explorer_data
        from headscope.reports.html_report import write_report_files

        run, session = self.run, self.session
        try:  # the attention explorer's data: every task the sections used, their sample prompts first
            captured = runner.explorer_capture(self.model, run.task, plans, done, seed=run.seed, ran=self.ran)
            with _writing("explorer.json", self.out):
                write_explorer_data(self.model, self.root, run.task, seed=run.seed, captured=captured)
            session.record("explorer.json")
        except OutputError:
            raise
        except Exception as err:  # optional: a model without hook_pattern still gets its report
            log.warning("attention explorer skipped: %s: %s", type(err).__name__, err)
        with _writing("report.html and report.md", self.out):
            write_report_files(self.root, self.report_names, self.book.status, self.model_info,
                               task_used=self.book.task_used)
            session.record("report.md")
            session.record("report.html")
        self.manifest()  # last: it lists the report files
        session.commit(transient=_transient())
