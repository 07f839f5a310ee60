"""The analyses `headscope report` knows, and the one signature they share.

Each entry maps a name to "module:function"; the function is
`run(model, config: RunConfig) -> Result`. Imports are lazy so that `headscope --help` is fast
and one broken analysis cannot stop the others from loading.
"""
from __future__ import annotations

from headscope.errors import ConfigError

import importlib
from dataclasses import dataclass
from typing import Any, Callable

ANALYSES: dict[str, str] = {
    "heads": "headscope.analyses.heads.analysis:run",
    "attribution": "headscope.analyses.attribution.analysis:run",
    "position": "headscope.analyses.position.analysis:run",
    "patching": "headscope.analyses.patching.analysis:run",
    "mlp": "headscope.analyses.mlp.analysis:run",
    "kv": "headscope.analyses.kv.analysis:run",
    "probes": "headscope.analyses.probes.analysis:run",
}


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Settings every analysis accepts. `task` None lets the analysis pick its default for the model
    (a zoo task for zoo models, the shipped sentence set for encoders); otherwise a zoo task name
    or a path to a JSONL/CSV/Parquet task file."""

    seed: int = 0
    quick: bool = False  # reduced sizes for smoke tests
    n_examples: int | None = None  # None: the analysis's default (smaller when quick)
    task: str | None = None
    progress: bool = True  # tqdm bars on long loops


def get_analysis(name: str) -> Callable[..., Any]:
    """The run function of an analysis by name; a clear error lists the known names."""
    if name not in ANALYSES:
        raise ConfigError(f"Unknown analysis {name!r}; choose from: {', '.join(ANALYSES)}.")
    module, func = ANALYSES[name].split(":")
    return getattr(importlib.import_module(module), func)
