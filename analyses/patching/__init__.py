"""Activation patching: exact (batched), causal tracing, attribution patching and path patching.

run(model, task=None, config=None) runs them all; engine holds the batched patched-run engine.
"""
from headscope.analyses.core.family import Family
from headscope.analyses.patching.analysis import NEEDS, activation_patching, default_task, run
from headscope.analyses.patching.attribution_patching import attribution_patching
from headscope.analyses.patching.causal_tracing import causal_tracing
from headscope.analyses.patching.configs import PatchingConfig, PathPatchingConfig, TracingConfig
from headscope.analyses.patching.cost import COST  # noqa: E402 - after the engines it reads
from headscope.analyses.patching.path_patching import path_patching

FAMILY = Family(name="patching", run=run, config=PatchingConfig, needs=NEEDS, cost=COST, default_task=default_task,
                api=("activation_patching", "causal_tracing", "attribution_patching", "path_patching", "PatchingConfig",
                     "PathPatchingConfig", "TracingConfig"))

__all__ = ["FAMILY", "PatchingConfig", "PathPatchingConfig", "TracingConfig", "activation_patching",
           "attribution_patching", "causal_tracing", "path_patching", "run"]
