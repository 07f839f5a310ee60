"""The analyses `headscope report` knows, and the one contract they share.

Each family exposes `run(model, task=None, config=None) -> Result`, a config class (a subclass of
AnalysisConfig) and NEEDS, what it needs from a task and a model (`needs`, analyses/core/contract.py).
Entries are "module:run:ConfigClass" strings imported lazily, so that `headscope --help` is fast and
one broken analysis cannot stop the others from loading.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from headscope.errors import ConfigError

if TYPE_CHECKING:
    from headscope.analyses.core.contract import Needs

ANALYSES: dict[str, str] = {
    "heads": "headscope.analyses.heads:run:HeadsConfig",
    "attribution": "headscope.analyses.attribution:run:AttributionConfig",
    "position": "headscope.analyses.position:run:PositionConfig",
    "patching": "headscope.analyses.patching:run:PatchingConfig",
    "mlp": "headscope.analyses.mlp:run:MLPConfig",
    "kv": "headscope.analyses.kv:run:KVConfig",
    "probes": "headscope.analyses.probes:run:ProbesConfig",
    "circuits": "headscope.analyses.circuits:run:CircuitsConfig",
}


def _entry(name: str) -> tuple[Any, str, str]:
    if name not in ANALYSES:
        raise ConfigError(f"Unknown analysis {name!r}; choose from: {', '.join(ANALYSES)}.")
    module, func, config = ANALYSES[name].split(":")
    return importlib.import_module(module), func, config


def get_analysis(name: str) -> Callable[..., Any]:
    """The run function of an analysis by name: run(model, task=None, config=None) -> Result."""
    module, func, _ = _entry(name)
    return getattr(module, func)


def config_class(name: str) -> type:
    """The config dataclass of an analysis by name (a subclass of AnalysisConfig)."""
    module, _, config = _entry(name)
    return getattr(module, config)


def needs(name: str) -> Needs:
    """What an analysis needs from a task and a model (its family's NEEDS; analyses/core/contract.py)."""
    from headscope.analyses.core.contract import Needs

    module, _, _ = _entry(name)
    declared = getattr(module, "NEEDS", None)
    if declared is None:
        module = importlib.import_module(f"{module.__name__}.analysis")
        declared = getattr(module, "NEEDS", None)
    return declared if declared is not None else Needs()
