"""Activation patching: exact (batched), causal tracing, attribution patching and path patching.

run(model, task=None, config=None) runs them all; engine holds the batched patched-run engine.
"""
from headscope.analyses.patching.analysis import activation_patching, run
from headscope.analyses.patching.attribution_patching import attribution_patching
from headscope.analyses.patching.causal_tracing import causal_tracing
from headscope.analyses.patching.configs import PatchingConfig, PathPatchingConfig, TracingConfig
from headscope.analyses.patching.path_patching import path_patching

__all__ = ["PatchingConfig", "PathPatchingConfig", "TracingConfig", "activation_patching", "attribution_patching",
           "causal_tracing", "path_patching", "run"]
