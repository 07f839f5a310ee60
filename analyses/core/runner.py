"""Planning and running a report's analyses; reports/report.py writes what this module returns.

The runner decides everything before any analysis runs, and once:

- `plan_analyses`: the task contract (analyses/core/contract.py): which analyses run on the user's
  task, which on their own default and why, which cannot run on this model at all;
- `resolve_plans`: each analysis's Task, resolved ONCE by its family (`registry.family_task`) from
  the user's task (a task file held in memory, `TaskFile.held`, so the file is read once per run)
  or its default; that same Task goes to the budget, to `run`, to the chance guard, to the
  section's provenance and to the explorer (an analysis --resume keeps: its Task only where the
  explorer reads it);
- `fit_to_budget`: each analysis's settings after the budget (analyses/core/budget.py). A budget
  that changes the examples resolves that analysis's Task once more at the fitted size (from the
  held bytes, not the disk), so the Task an analysis runs on has the rows its settings say;
- `run_planned`: one analysis run from its seed, its summary with "chance" and "budget"; a failure
  is a `Failure` object (type, message, traceback), never a string to parse;
- `explorer_capture`: the attention explorer's activations (analyses/core/attention_capture.py):
  every task the sections used (position's sweeps and probes' data included), each section's sample
  prompt (the one its provenance line shows) first, then a few more of the task's examples.

Position runs on its own sweeps and probes on its probe data (their labels depend on what they are
given), so both are handed the user's task as given; every other family is handed its Task.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import time
import traceback
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from headscope.analyses.core import contract, registry
from headscope.errors import HeadscopeError, TaskError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Plan:
    """What one analysis of a report runs on, decided before any analysis runs.

    task: what it is given (the user's task, or None: its own default); used: where its task came
    from, the line the report and the manifest's "task_used" show; skip: why it cannot run on this
    model at all (None: it runs); resolved: the Task itself (None for position, which builds its own
    sweeps, and where the family's resolution failed: `run` then reports that error); config: its
    settings after the budget; fit: the budget's budget.Fitted (None: no estimate)."""

    task: Any
    used: str
    skip: str | None = None
    resolved: Any = None
    config: Any = None
    fit: Any = None
    load_warnings: tuple[str, ...] = ()  # the resolution's sample warnings, named for this analysis (_named_warnings)

    @property
    def run_task(self) -> Any:
        """What `run` is handed: the resolved Task, else (position, probes, a failed resolution) the task as given."""
        return self.resolved if self.resolved is not None else self.task


@dataclass(frozen=True)
class Failure:
    """An analysis that raised: its name, the error's type and message, the traceback, and whether it
    is the user's mistake (a HeadscopeError: one line, exit status 2) rather than a bug."""

    analysis: str
    error_type: str
    message: str
    traceback: str = ""
    mistake: bool = False
    model: str = ""  # the model's architecture (FalconForCausalLM), where known

    @classmethod
    def of(cls, analysis: str, err: BaseException, model: Any = None) -> Failure:
        facts = getattr(model, "facts", None)
        return cls(analysis=analysis, error_type=type(err).__name__, message=str(err),
                   traceback="".join(traceback.format_exception(err)), mistake=isinstance(err, HeadscopeError),
                   model=str(getattr(facts, "architecture", "") or ""))

    @property
    def status(self) -> str:
        """The manifest's status line: "failed: Type: message" for a user's mistake; a bug's names the analysis and
        the model's architecture and says it is headscope's, in one line (review 17b C3: raw exception text alone
        read as if the user's settings, or the dtype, were at fault): "failed: heads does not run on
        FalconForCausalLM yet, an internal error rather than a setting (RuntimeError: ...); please report it"."""
        if self.mistake:
            return f"failed: {self.error_type}: {self.message}"
        line = (self.message.splitlines() or [""])[0]
        line = line if len(line) <= 200 else line[:199] + "\u2026"
        where = f" on {self.model}" if self.model else ""
        return (f"failed: {self.analysis} does not run{where} yet, an internal error rather than a setting "
                f"({self.error_type}: {line}); please report it")


@dataclass(frozen=True)
class Outcome:
    """One analysis run: its Result, or its Failure; seconds it took."""

    name: str
    result: Any = None
    failure: Failure | None = None
    seconds: float = 0.0


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _task_label(task: Any) -> str:
    return Path(task).name if isinstance(task, str) and Path(task).suffix else str(getattr(task, "name", task))


def plan_analyses(model: Any, names: Sequence[str], task: Any, *, seed: int = 0,
                  substitute: bool = True, configs: Mapping[str, Any] | None = None) -> dict[str, Plan]:
    """Check every analysis against the model and the user's task before any runs (the task contract).

    An analysis that cannot run on the model (a decoder-only one on an encoder) is skipped with its
    reason; one that cannot use the user's task runs on its own default task, and its line says why, except
    that one reading one next-token answer given answers of several tokens on some rows runs on the rows whose
    answer is one token where there are contract.MIN_ONE_TOKEN_ROWS of them (a RowSubset of the user's data,
    its line "your task (x.jsonl): only the rows whose answer is one token ..."; fewer: the default, the count in its reason)
    (substitute=False: a TaskError with the reason instead, for a command that runs one analysis
    the user gave a task), except one that patches pairs when no pair of the task has one token
    length: it is skipped with that reason. The user's task is read once here, so a mistake in it
    stops the run before any work. configs: name -> the config it will run with (`preset`), under which a file of
    its own records is checked (position's --n-items); absent: the family's defaults."""
    from headscope.analyses.core.tasks import Task

    plans: dict[str, Plan] = {}
    resolved: list[Any] = []  # the user's Task, read on first need
    counted: dict[str, Any] = {}  # its one-token rows, counted on first need (contract.one_token_plan)
    for name in names:
        need = registry.needs(name)
        reasons = contract.model_reasons(need, model, task, (configs or {}).get(name))  # own records: no default data
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
        reasons = contract.task_reasons(need, checked, model, (configs or {}).get(name))
        if isinstance(checked, Task) and reasons == [contract.several_tokens_reason(checked)]:
            # answers of several tokens on some rows: the rows whose answer is one token, where there are enough
            subset, why = contract.one_token_plan(need, task, checked, model, seed=seed, counted=counted)
            if subset is not None:
                plans[name] = Plan(task=subset, used=f"your task ({_task_label(task)}): {why}")
                continue
            reasons = [why or reasons[0]]
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


def api_task(model: Any, name: str, task: Any, *, seed: int = 0) -> tuple[Any, str]:
    """What hs.run_analysis hands analysis `name`: the report's rule (plan_analyses) for one that reads one next-token
    answer given answers of several tokens on some rows of the user's task (a Task or task data): (the rows whose
    answer is one token, the plan's line "your task (x): only the rows whose answer is one token ...") where there are
    contract.MIN_ONE_TOKEN_ROWS of them, else a TaskError line that counts them. (task, "") in every other case, the
    analysis then checking the task itself (a task it cannot read raises its own error there)."""
    from headscope.analyses.core.tasks import Task

    need = registry.needs(name)
    if (task is None or need.continuation or not need.task_data or (isinstance(task, str) and task in need.names)
            or contract.takes_own_records(need, task) or contract.model_reasons(need, model)):
        return task, ""
    try:
        checked = contract.resolve(task, model, seed=seed)
    except HeadscopeError:  # the analysis reads the task itself and raises the same error there
        return task, ""
    if not isinstance(checked, Task) or contract.task_reasons(need, checked, model) != [contract.several_tokens_reason(checked)]:
        return task, ""
    subset, why = contract.one_token_plan(need, task, checked, model, seed=seed)
    if subset is None:
        why = why or contract.several_tokens_reason(checked)
        raise TaskError(f"{name} cannot run on your task ({_task_label(task)}): {why}.")
    return subset, f"your task ({_task_label(task)}): {why}"


def with_task_used(result: Any, used: str) -> Any:
    """`result` with summary["task_used"] = used (first, so repr shows it; reports/findings.finding opens the finding
    with provenance.subset_sentence of it): which of the user's rows hs.run_analysis ran it on."""
    if not used or not hasattr(result, "summary"):
        return result
    return dataclasses.replace(result, summary={"task_used": used, **result.summary})


def _resolve(model: Any, name: str, plan: Plan, config: Any) -> tuple[Any, tuple[str, ...]]:
    """The family's Task for `plan` under `config` (None: the family builds its own data, or the
    resolution failed, logged: `run` then raises the same error as the analysis's failure), and the load's
    warnings that count rows of this sample (contract.SAMPLE_WARNINGS), named for `name` (_named_warnings) to be
    shown once the budget has settled the sample (`apply_budget`); other warnings pass on as they are."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            task = registry.family_task(name, model, plan.task, config)
        except Exception as err:  # noqa: BLE001 - the analysis reports its own errors when it runs
            log.info("%s: its task could not be resolved before the run (%s: %s)", name, type(err).__name__, err)
            task = None
    return task, _named_warnings(name, caught, _reads_pairs(model, name, config))


PAIRS_TAIL = "; the analyses that patch pairs leave those rows out, the others use every row."  # task_files._pairs
PAIRS_WARNING = r".*corrupted prompt\(s\) have another token length"  # contract.SAMPLE_WARNINGS' pairs warning


class PairsUnused(str):
    """A pairs warning (task_files._pairs) of an analysis that patches no pairs: nothing changes for it, so it is no
    warning; show_load_warnings folds these into one INFO line (review 18w C2)."""


def _reads_pairs(model: Any, name: str, config: Any) -> bool:
    """Whether analysis `name` patches clean/corrupted pairs under `config` (registry.reads: patching; circuits with its
    edges on), so that a pair of two token lengths changes its rows."""
    try:
        return bool(registry.reads(name, model, config).corrupted)
    except Exception:  # noqa: BLE001 - unknown: say it as a warning
        return True


_REISSUED: set = set()  # other warnings re-issued: one every analysis's resolution raises is shown once per run (a
# registry would not do: catch_warnings clears it), as Python's default filter shows a warning once per place; emptied
# by resolve_plans, so that a second run in one process (a notebook's) shows its own warnings


def _named_warnings(name: str, caught: Sequence[Any], pairs: bool = True) -> tuple[str, ...]:
    """Review 18b C3: a report printed the unequal-token-length warning four times with four counts (one per
    analysis's sample, and again after the budget's cut) and never named the analysis. The sample warnings of one
    resolution, each opened with the analysis's name; the pairs warning ends with what this analysis does with those
    rows, and is a PairsUnused note, not a warning, for an analysis that patches no `pairs` (review 18w C2: five of
    seven warnings said "patches no pairs and uses every row"). Other warnings are re-issued unchanged."""
    import re
    import warnings

    from headscope.errors import HeadscopeWarning

    out = []
    for w in caught:
        text = str(w.message)
        if not (issubclass(w.category, HeadscopeWarning) and any(re.match(m, text) for m in contract.SAMPLE_WARNINGS)):
            key = (w.category, text, w.filename, w.lineno)
            if key not in _REISSUED:  # once per message and place, as the default filter shows them
                _REISSUED.add(key)
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
            continue
        if text.endswith(PAIRS_TAIL):
            if not pairs:
                out.append(PairsUnused(f"{name}: {text[:-len(PAIRS_TAIL)]}"))
                continue
            text = text[:-len(PAIRS_TAIL)] + (f"; {name} patches pairs and leaves those rows out." if
                                              registry.needs(name).corrupted else
                                              f"; {name} leaves those rows out of the parts that patch pairs and uses "
                                              "every row elsewhere.")
        out.append(f"{name}: {text}")
    return tuple(dict.fromkeys(out))


def unused_pairs_line(notes: Sequence[str]) -> str:
    """"Task file 'a.csv': heads (9 rows), kv (9) have corrupted prompts of another token length than their prompt;
    these analyses patch no pairs and use every row." from PairsUnused notes ('' without)."""
    import re

    from headscope.models.hooked_model import and_join

    by_label: dict[str, list[str]] = {}
    for note in notes:
        found = re.match(r"(?P<name>[^:]+): (?P<label>.*): (?P<n>\d+) corrupted prompt\(s\)", note)
        if found:
            said = by_label.setdefault(found["label"], [])
            said.append(f"{found['name']} ({found['n']}{' rows' if not said else ''})")
    lines = []
    for label, said in by_label.items():
        one = len(said) == 1
        lines.append(f"{label}: {and_join(said)} {'has' if one else 'have'} corrupted prompts of another token length "
                     f"than their prompt; {'this analysis patches' if one else 'these analyses patch'} no pairs and "
                     f"{'uses' if one else 'use'} every row.")
    return " ".join(lines)


def show_load_warnings(plans: Mapping[str, Plan]) -> None:
    """Each analysis's sample warnings (Plan.load_warnings), once, after the budget settled its sample; the pairs notes
    of analyses that patch no pairs (PairsUnused) as one INFO line."""
    import warnings

    from headscope.errors import HeadscopeWarning

    unused = []
    for plan in plans.values():
        for text in plan.load_warnings:
            if isinstance(text, PairsUnused):
                unused.append(text)
            else:
                warnings.warn(text, HeadscopeWarning, stacklevel=2)
    if unused:
        log.info("%s", unused_pairs_line(unused))


@contextlib.contextmanager
def quiet_pairs(model: Any, name: str, config: Any) -> Iterator[None]:
    """A context in which the pairs warning of a task analysis `name` loads itself (probes) is not shown when it patches
    no pairs (review 18w C2: probes' load of all 40 rows warned of 17 rows it uses as they are)."""
    import warnings

    from headscope.errors import HeadscopeWarning

    if _reads_pairs(model, name, config):
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=PAIRS_WARNING, category=HeadscopeWarning)
        yield


def _resolution_settings(config: Any) -> tuple:
    """The settings a family's task resolution reads (the Task changes only when one of them does)."""
    return (config.seed, config.quick, config.n_examples)


def preset(name: str, common: Mapping[str, Any], overrides: Mapping[str, Mapping[str, Any]] | None = None) -> Any:
    """Analysis `name`'s preset config for the shared options `common`, with its own fields from `overrides`
    (name -> {field: value}: the options one analysis's command takes, position's --n-items)."""
    return registry.config_class(name).preset(**common, **(overrides or {}).get(name, {}))


def resolve_plans(model: Any, plans: Mapping[str, Plan], names: Sequence[str], common: Mapping[str, Any], *,
                  finished: Collection[str] = (), overrides: Mapping[str, Mapping[str, Any]] | None = None,
                  ) -> dict[str, Plan]:
    """`plans` with each named analysis's preset config (`preset`, with its `overrides`) and its Task resolved
    once under it. An analysis in `finished` (kept by --resume) gets its config only: nothing runs or prices it,
    and the explorer, its Task's one reader, resolves that Task under the same config when it builds (`ran_on`).
    A run's first resolution: the warnings re-issued once (_named_warnings) start afresh, each run showing its own."""
    _REISSUED.clear()
    out = dict(plans)
    for name in names:
        config = preset(name, common, overrides)
        resolved, notes = (None, ()) if name in finished else _resolve(model, name, plans[name], config)
        out[name] = dataclasses.replace(plans[name], config=config, resolved=resolved, load_warnings=notes)
    return out


def fit_to_budget(model: Any, plans: Mapping[str, Plan], names: Sequence[str], minutes: float | None) -> dict:
    """name -> budget.Fitted for the analyses about to run: each one's cost estimated on the Task it
    will use (its plan's), the budget shared among them (budget.plan). An estimate that fails
    leaves that analysis at its preset (logged), never the run."""
    from headscope.analyses.core import budget as B

    entries = {}
    for name in names:
        plan = plans[name]
        try:
            used = registry.judged_rows(name, plan.resolved) if plan.resolved is not None else (
                registry.task_used(name, model, plan.task, plan.config))
            entries[name] = (registry.cost_model(name), used, plan.config)
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


def apply_budget(model: Any, plans: Mapping[str, Plan], fitted: Mapping[str, Any]) -> dict[str, Plan]:
    """`plans` with each fitted analysis's settings after the budget; a Task resolved again only where
    the budget changed what the resolution reads (the examples). Then each analysis's sample warnings, once
    (show_load_warnings: those of the Task it will run on, named for it)."""
    out = dict(plans)
    for name, fit in fitted.items():
        plan = plans[name]
        resolved, notes = plan.resolved, plan.load_warnings
        if resolved is not None and _resolution_settings(fit.config) != _resolution_settings(plan.config):
            resolved, notes = _resolve(model, name, plan, fit.config)
        out[name] = dataclasses.replace(plan, config=fit.config, fit=fit, resolved=resolved, load_warnings=notes)
    show_load_warnings(out)
    return out


def run_planned(model: Any, name: str, plan: Plan, seed: int, analysis: Any = None) -> Outcome:
    """Run one planned analysis from `seed` (seed_everything, so a summary does not depend on what ran
    before) on the plan's Task and settings: its Result with summary["chance"] (the registry's guarded
    run, `analysis` when given, judged on that same Task) and summary["budget"], or its Failure (logged:
    a user mistake as one line, anything else with its traceback)."""
    seed_everything(seed)
    start = time.perf_counter()
    try:
        run = analysis if analysis is not None else registry.get_analysis(name)
        with quiet_pairs(model, name, plan.config):  # probes loads its task here (review 18w C2)
            result = run(model, plan.run_task, plan.config)
        if plan.fit is not None and dataclasses.is_dataclass(result) and isinstance(getattr(result, "summary", None), dict):
            result = dataclasses.replace(result, summary={**result.summary, "budget": plan.fit.summary()})
    except Exception as err:  # one failing analysis must not lose the others
        if isinstance(err, HeadscopeError):  # a user mistake: one line, no traceback
            log.error("%s failed: %s", name, err)
        else:
            log.exception("%s failed", name)
        return Outcome(name, failure=Failure.of(name, err, model), seconds=time.perf_counter() - start)
    return Outcome(name, result=result, seconds=time.perf_counter() - start)


def ran_on(model: Any, name: str, plan: Plan) -> Any:
    """What analysis `name` ran on, for its section's provenance (reports/provenance.py): the plan's
    Task (the rows it judged), probes' probed Task (the rows it kept), position's (sweep kind, first sweep) when it built
    its own sweeps (its default, or a file of its own records: `_sweeps` as the run calls it); None
    where nothing is known; the exception where finding it failed (the report notes it, the result is kept)."""
    try:
        if name == "position" and (plan.task is None or contract.takes_own_records(registry.needs(name), plan.task)):
            from headscope.analyses.position.analysis import _sweeps

            _, sweeps, kind, _ = _sweeps(model, plan.task, plan.config)
            return kind, sweeps[0]
        if name == "probes":
            from headscope.analyses.probes.analysis import probed_task

            with quiet_pairs(model, name, plan.config):  # its pairs are not read (review 18w C2)
                return probed_task(model, plan.task, plan.config)  # the rows it fitted (not those of a one-row answer)
        if plan.resolved is not None:
            return registry.judged_rows(name, plan.resolved)
        return registry.task_used(name, model, plan.task, plan.config)
    except Exception as err:  # noqa: BLE001 - the sample is a courtesy: it never costs the analysis its result
        return err


def _rows(data: Any) -> tuple[str, list[torch.Tensor], dict[tuple[int, ...], int]] | None:
    """(task name, token rows [pos] each, padding removed, the provenance sample first, {a row's token ids: its
    teacher-forced answer pieces} for the rows of several-token answers) of what an analysis ran on (ran_on): a
    Task, or position's (sweep kind, first sweep); None for anything else."""
    if isinstance(data, tuple) and len(data) == 2 and hasattr(data[1], "tokens"):  # position's own sweeps
        kind, sweep = data
        rows = list(sweep.tokens)
        return str(kind), rows[:1] + rows[:0:-1], {}  # the sample (gold in the first slot), then the last slot's
    if hasattr(data, "tokens") and hasattr(data, "example") and len(data) > 0:
        examples = [data.example(i) for i in range(min(len(data), 4))]
        pieces = {tuple(int(t) for t in e.tokens[0]): int(e.continuation.shape[1]) - 1 for e in examples
                  if getattr(e, "continuation", None) is not None and e.continuation.shape[1] > 1}
        return str(data.name), [e.tokens[0] for e in examples], pieces
    return None


def explorer_shown(model: Any, plans: Mapping[str, Plan], done: Sequence[str],
                   ran: Mapping[str, Any] | None = None) -> list[Any]:
    """The tasks the explorer shows (attention_capture.Shown), one per task name the analyses in `done`
    used, in report order: each with the sections that used it, each section's sample prompt (the row its
    provenance line shows: `ran_on`'s data, given in `ran` as the writer kept it, else found again) and a
    few more rows. Position's sweeps (on its own data or the user's records) and probes' probed Task count as tasks;
    an analysis whose data is not known (an error finding it) adds none."""
    from headscope.analyses.core.attention_capture import Shown

    found: dict[str, dict[str, Any]] = {}
    for name in done:
        plan = plans.get(name)
        if plan is None or plan.skip is not None:
            continue
        data = ran[name] if ran is not None and name in ran else ran_on(model, name, plan)
        rows = _rows(data)
        if rows is None:
            continue
        task, tokens, pieces = rows
        entry = found.setdefault(task, {"sections": [], "samples": [], "rows": tokens[1:], "pieces": {}})
        entry["pieces"].update(pieces)
        entry["sections"].append(name)
        key = tuple(int(t) for t in tokens[0])
        for sample in entry["samples"]:
            if sample[0] == key:
                sample[2].append(name)
                break
        else:
            entry["samples"].append((key, tokens[0], [name]))
    return [Shown(task=task, sections=tuple(e["sections"]), samples=tuple((row, tuple(who)) for _, row, who in e["samples"]),
                  rows=tuple(e["rows"]), pieces=e["pieces"]) for task, e in found.items()]


def explorer_capture(model: Any, task: Any, plans: Mapping[str, Plan], done: Sequence[str], *, seed: int = 0,
                     ran: Mapping[str, Any] | None = None) -> Any:
    """The attention explorer's activations for a report (attention_capture.Captured): every task the
    analyses in `done` used, its sections' sample prompts first (explorer_shown; `ran`: what each ran on,
    as `ran_on` found it), one forward pass per prompt; with none, a few examples of the report's task
    (the user's prompt/answer task; None, or a file of an analysis's own records such as position's
    (_own_records_file): the heads analysis's default)."""
    from headscope.analyses.core.attention_capture import capture_examples, capture_shown

    shown = explorer_shown(model, plans, done, ran)
    if shown:
        return capture_shown(model, shown)
    return capture_examples(model, None if _own_records_file(task, plans) else task, seed=seed)


def _own_records_file(task: Any, plans: Mapping[str, Plan]) -> bool:
    """Whether the report's task is a file of an analysis's own records, not a prompt/answer task: one an analysis's
    plan took as its records (position's), or one whose first record has every field of one kind of them (records
    that did not fit the model: no analysis reads them as prompts either). A prompt/answer .jsonl is neither, even
    with position in the plan (it then runs on its default data)."""
    if not isinstance(task, (str, os.PathLike)):
        return False
    takers = [name for name in plans if contract.takes_own_records(registry.needs(name), task)]
    if any(isinstance(plans[name].task, (str, os.PathLike)) and os.fspath(plans[name].task) == os.fspath(task)
           for name in takers):
        return True
    if not takers:
        return False
    from headscope.analyses.position.records import first_fields, records_kind

    try:
        return records_kind(first_fields(task)) is not None
    except HeadscopeError:  # a file that cannot be read: the explorer's own read of it says why
        return False


__all__ = ["Failure", "Outcome", "Plan", "apply_budget", "explorer_capture", "explorer_shown", "fit_to_budget",
           "plan_analyses", "ran_on", "resolve_plans", "run_planned", "seed_everything", "show_load_warnings"]
