"""The analyses `headscope report` knows, and the one contract they share.

Each family declares one record, `FAMILY = Family(...)` in analyses/<name>/__init__.py
(analyses/core/family.py: its run, config class, needs, cost model, task resolution and public
names); FAMILIES lists them by name, one line each, in the report's order. A family's package is
imported on first use, so that `headscope --help` is fast and one broken analysis cannot stop the
others from loading.

`get_analysis` wraps each run with the chance-level guard (analyses/core/chance.py): the Result's
summary gains "chance" (whether the model's clean metric on the task is within noise of chance),
so `headscope report`, the CLI subcommands and `hs.run_analysis` all carry it; and, for an encoder
run on the shipped sentences, "shipped_text" (with_text_fit: how its tokenizer writes them).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from headscope.analyses.core.result import with_source
from headscope.errors import ConfigError, HeadscopeError

if TYPE_CHECKING:
    from headscope.analyses.core.contract import Needs
    from headscope.analyses.core.family import Family

log = logging.getLogger(__name__)

FAMILIES: tuple[str, ...] = (  # one line per family: analyses/<name>/__init__.py declares its FAMILY
    "heads",
    "attribution",
    "position",
    "patching",
    "mlp",
    "kv",
    "probes",
    "circuits",
)
ANALYSES: dict[str, str] = {name: f"headscope.analyses.{name}" for name in FAMILIES}  # name -> its package


def family(name: str) -> Family:
    """The record analysis `name` declares (its package's FAMILY), imported on first use."""
    if name not in ANALYSES:
        raise ConfigError(f"Unknown analysis {name!r}; choose from: {', '.join(ANALYSES)}.")
    return importlib.import_module(ANALYSES[name]).FAMILY


def get_analysis(name: str) -> Callable[..., Any]:
    """The run function of an analysis by name: run(model, task=None, config=None) -> Result, its
    summary with "chance" added (with_chance)."""
    run = family(name).run

    @functools.wraps(run)
    def guarded(model, task=None, config=None):
        result = with_text_fit(name, with_chance(name, run(model, task, config), model, task, config), model, task, config)
        return with_source(result, model, task)  # its repr names the model and the task (review 12c C3)

    return guarded


def judges_model(name: str) -> bool:
    """Whether the analysis judges the model on a Task of its family's resolution (Family.judges_model)."""
    return family(name).judges_model


def family_task(name: str, model, task: Any = None, config: Any = None) -> Any:
    """The Task analysis `name` runs on, resolved by its family from `task` (the user's, or None:
    its default) under `config` (None: the family's preset): `task` itself when it is a Task, else
    its Family.default_task(model, task, config). None where the family builds its own data."""
    from headscope.analyses.core.tasks import Task

    if isinstance(task, Task):
        return task
    record = family(name)
    if record.default_task is None:
        return None
    return record.default_task(model, task, config if config is not None else record.config.preset())


def task_used(name: str, model, task: Any = None, config: Any = None) -> Any:
    """The Task the analysis `name` ran on (family_task; None where the family builds its own data).
    An analysis that patches pairs used only the rows with a pair (judged_rows)."""
    used = family_task(name, model, task, config)
    return None if used is None else judged_rows(name, used)


def judged_rows(name: str, task: Any) -> Any:
    """The rows of `task` analysis `name` runs on: those with a clean/corrupted pair of one length when
    it patches pairs (Task.pairs; all of them when none has one, which the analysis itself refuses)."""
    if task.unpaired and needs(name).corrupted and len(task.unpaired) < len(task):
        return task.pairs(name)[0]
    return task


_CLEAN_KEYS = ("baseline_metric", "clean_metric", "metric_unevicted")  # the clean mean a summary reports


def chance_summary(name: str, summary: dict, model, task: Any = None, config: Any = None) -> dict | None:
    """summary["chance"] for one analysis (analyses/core/chance.py): the model's clean metric per example
    on the Task the analysis used (one forward) against chance, checked against the clean mean the
    summary reports; probes: the best probe against its majority baseline; else from the summary."""
    from headscope.analyses.core import chance

    if model.facts.is_encoder and not summary.get("mask_read"):  # a cosine; a masked LM scored at its mask goes on
        return None
    if name == "probes":
        return chance.from_summary(summary)
    try:
        used = task_used(name, model, task, config)
    except HeadscopeError:  # input the family takes but the Task resolution does not (a Scorer, raw tokens)
        used = None
    if used is None:
        return chance.from_summary(summary, vocab_size=model.facts.d_vocab)
    kind = summary.get("metric") if summary.get("metric") in chance.FLOORS else used.metric
    expected = next((summary[k] for k in _CLEAN_KEYS if isinstance(summary.get(k), (int, float))
                     and not (k == "clean_metric" and summary.get("normalized"))), None)
    if isinstance(summary.get("task"), str) and summary["task"] != used.name:  # not the task the analysis ran on
        return chance.from_summary(summary, vocab_size=model.facts.d_vocab)
    return chance.model_on_task(model, used, kind, expected_mean=expected)


def with_chance(name: str, result: Any, model, task: Any = None, config: Any = None) -> Any:
    """`result` with summary["chance"] added (chance_summary); unchanged for skipped results, results
    that already carry it, and where no chance value applies (encoders, cosine, normalised metrics).
    The guard never loses a result: an error in it is logged with its traceback and the result kept."""
    summary = getattr(result, "summary", None)
    if not isinstance(summary, dict) or "skipped" in summary or "chance" in summary:
        return result
    try:
        found = chance_summary(name, summary, model, task, config)
    except Exception:  # noqa: BLE001 - the analysis's own result matters more than its guard
        log.warning("%s: the chance-level guard failed; the summary has no 'chance' entry", name, exc_info=True)
        return result
    if found is None:
        return result
    return dataclasses.replace(result, summary={**summary, "chance": found})


def _data(name: str, model, task: Any, config: Any) -> Any:
    """The Task analysis `name` ran on when it was given `task` (a Task as is; probes' probed Task; its family's)."""
    from headscope.analyses.core.tasks import Task

    if isinstance(task, Task):
        return task
    if name == "probes":  # probes label their own rows (probe_data), not a family Task
        from headscope.analyses.probes.analysis import probe_data

        return probe_data(model, task, config)[0]
    return task_used(name, model, task, config)


def with_text_fit(name: str, result: Any, model, task: Any = None, config: Any = None) -> Any:
    """`result` with summary["shipped_text"] (default_tasks.shipped_fit) where an analysis ran on the
    shipped sentences (an encoder's default; a decoder's where no task of its fits, review 11b A4): tokens a
    word and unknown words under the model's tokenizer; text it splits into
    pieces or unknown words is logged as a warning, and its note goes to the section and the finding. The
    check never loses a result (an error in it is logged)."""
    summary = getattr(result, "summary", None)
    if (not isinstance(summary, dict) or "skipped" in summary or "shipped_text" in summary
            or not (task is None or (isinstance(task, str) and task == "sentences")
                    or getattr(task, "name", None) == "sentences")):
        return result
    from headscope.analyses.core.default_tasks import shipped_fit

    try:
        fit = shipped_fit(model, _data(name, model, task, config if config is not None else family(name).config.preset()))
    except Exception:  # noqa: BLE001 - the analysis's own result matters more than this check
        log.warning("%s: the shipped-sentence check failed; the summary has no 'shipped_text' entry", name, exc_info=True)
        return result
    if fit is None:
        return result
    if fit["off_distribution"]:
        log.warning("%s: %s", name, fit["note"])
    return dataclasses.replace(result, summary={**summary, "shipped_text": fit})


def config_class(name: str) -> type:
    """The config dataclass of an analysis by name (a subclass of AnalysisConfig)."""
    return family(name).config


def cost_model(name: str) -> Any:
    """The family's cost model (its `cost` module's COST; analyses/core/budget.py)."""
    return family(name).cost


def reads(name: str, model, config: Any = None, summary: Any = None) -> Any:
    """Which parts of a task analysis `name` reads on `model` (contract.Reads; its Family.reads, else the
    answers and, where its Needs ask for them, the corrupted prompts). config: its settings (None: the
    preset); summary: its run's summary (what it actually did, e.g. probes' labels)."""
    from headscope.analyses.core.contract import Reads

    record = family(name)
    if record.reads is None:
        return Reads(corrupted=record.needs.corrupted)
    return record.reads(model, config if config is not None else record.config.preset(), summary or {})


def needs(name: str) -> Needs:
    """What an analysis needs from a task and a model (its family's NEEDS; analyses/core/contract.py)."""
    return family(name).needs
