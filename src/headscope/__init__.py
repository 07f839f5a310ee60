"""headscope: attention analysis and mechanistic interpretability on TransformerLens's TransformerBridge.

    import headscope as hs
    model = hs.load_model()                      # the embedded zoo model; or "minilm", a dir, a hub name
    acts = hs.capture(model, tokens, [hs.site("pattern", 0)])
"""
import warnings as _warnings

with _warnings.catch_warnings():  # tqdm.auto in a notebook without ipywidgets: the plain bar, no warning
    _warnings.filterwarnings("ignore", message="IProgress not found")
    import tqdm.auto  # noqa: F401

from headscope import analyses, errors, hooks, models, reports  # reports registers Result's plot/HTML views
from headscope.analyses.core import tasks
from headscope.analyses.core.task_files import TaskFile, load_task, prompt_task, tensor_task
from headscope.analyses.core.tasks import Task
from headscope.errors import (
    ConfigError,
    ContextLengthError,
    HeadscopeError,
    HeadscopeWarning,
    IndexOutOfRangeError,
    InputTypeError,
    MemoryBudgetError,
    MissingExtraError,
    ModelNotFoundError,
    OfflineModelError,
    OutputExistsError,
    PaddingError,
    ShapeMismatchError,
    SiteError,
    TaskError,
    TaskFileError,
    TokenizationError,
    TokenizationWarning,
)
from headscope.execution import hook_free as _hook_free  # noqa: F401 - registers the hook-free forward pass
from headscope.hooks import (
    SITES,
    Activations,
    ablate,
    attention_pattern,
    available_sites,
    capture,
    generate_with_kv,
    head_gates,
    kv_states,
    mlp_memories,
    patch,
    run_with_cache,
    site,
)
from headscope.models import DEFAULT_MODEL, HookedModel, ModelFacts, load_model
from headscope.version import __version__

# Analyses and reports load lazily (hs.head_importance, hs.build_report, ...): `import headscope`
# stays fast, and the CLI's --help does not import every analysis. Each family's public names are
# its record's (analyses/<name>/__init__.py FAMILY.api), found on first use.
_LAZY = {
    "AnalysisConfig": "headscope.analyses.core.config",
    "build_report": "headscope.reports.report",
    "show_attention": "headscope.reports.explorer",
    "show_tokens": "headscope.reports.tokens_view",
    "Result": "headscope.analyses.core.result",
}


_API: dict[str, str] = {}  # {public name: family package}, filled once
_API_FAILED: dict[str, str] = {}  # {family: why its record could not be imported}


def _family_api() -> dict[str, str]:
    """{public name: family package} over every family's record (imports each family once; a family
    that fails to import leaves the others' names working and is named when one of its names is asked for)."""
    if not _API and not _API_FAILED:
        from headscope.analyses.core.registry import ANALYSES, family

        for name, package in ANALYSES.items():
            try:
                _API.update({api: package for api in family(name).api})
            except Exception as err:  # noqa: BLE001 - one broken family must not hide the others
                _API_FAILED[name] = f"{type(err).__name__}: {err}"
    return _API


def run_analysis(name: str, model, task=None, config=None, *, fields=None, strict=None, prompt=None, answer=None,
                 corrupted_prompt=None, wrong_answer=None, **overrides):
    """Run an analysis by its report name ("heads", "attribution", "position", "patching", "mlp",
    "kv", "probes", "circuits"): run(model, task=None, config=None) -> Result of that family.
    fields (and strict) apply to a task file or in-memory data as in hs.load_task: headscope field ->
    your column, e.g. run_analysis("heads", model, df, fields={"prompt": "text", "answer": "label"}).
    One prompt works as in every analysis: prompt= (or the prompt as task) with answer= and, for
    patching, corrupted_prompt= and wrong_answer= (hs.prompt_task). A task whose answers have several tokens on some
    rows runs, for an analysis that reads one next-token answer, on its rows whose answer is one token where there are
    at least 8 (summary["task_used"] and the finding say so), as `headscope report` does; fewer: a TaskError.
    overrides: fields of the family's config, as the named functions take them (run_analysis("heads", model, quick=True)
    is run_analysis("heads", model, config=hs.HeadsConfig(quick=True)); review 14a C6); a mistyped one is one ConfigError
    naming the close fields, before any work."""
    from headscope.analyses.core import runner
    from headscope.analyses.core.config import configure
    from headscope.analyses.core.registry import config_class, get_analysis
    from headscope.analyses.core.task_files import one_prompt, with_fields

    if overrides:
        cls = config_class(name)
        config = configure(cls, config, overrides, name=f"run_analysis({name!r})", default=cls.preset())

    task = one_prompt(model, task, prompt=prompt, answer=answer, corrupted_prompt=corrupted_prompt,
                      wrong_answer=wrong_answer, tokens=False)
    # answers of several tokens on some rows: an analysis reading one next-token answer runs on the one-token rows
    # (as the report does; summary["task_used"] says so) or refuses in one line where there are too few
    task, used = runner.api_task(model, name, with_fields(task, fields, strict), seed=getattr(config, "seed", 0) or 0)
    return runner.with_task_used(get_analysis(name)(model, task, config), used)


def __getattr__(name: str):
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if not name.startswith("_") and name in _family_api():
        return getattr(importlib.import_module(_API[name]), name)
    broken = "".join(f"; the {f} family could not be imported ({why})" for f, why in _API_FAILED.items())
    raise AttributeError(f"module 'headscope' has no attribute {name!r}{broken}")


def __dir__() -> list[str]:  # the families' public names too (imports every family)
    return sorted({*globals(), *_LAZY, *_family_api()})


# `from headscope import *` gives these; a family's names (Family.api) come by attribute, hs.head_importance
__all__ = [
    *_LAZY,
    "DEFAULT_MODEL",
    "SITES",
    "Activations",
    "ConfigError",
    "ContextLengthError",
    "HeadscopeWarning",
    "HeadscopeError",
    "HookedModel",
    "IndexOutOfRangeError",
    "InputTypeError",
    "MemoryBudgetError",
    "MissingExtraError",
    "ModelFacts",
    "ModelNotFoundError",
    "OfflineModelError",
    "OutputExistsError",
    "PaddingError",
    "ShapeMismatchError",
    "SiteError",
    "Task",
    "TaskError",
    "TaskFile",
    "TaskFileError",
    "TokenizationError",
    "TokenizationWarning",
    "__version__",
    "ablate",
    "analyses",
    "attention_pattern",
    "available_sites",
    "capture",
    "errors",
    "generate_with_kv",
    "head_gates",
    "hooks",
    "kv_states",
    "load_model",
    "load_task",
    "mlp_memories",
    "models",
    "patch",
    "prompt_task",
    "reports",
    "run_analysis",
    "run_with_cache",
    "site",
    "tasks",
    "tensor_task",
]
