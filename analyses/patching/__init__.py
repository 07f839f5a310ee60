"""Activation patching: exact (batched), causal tracing, attribution patching and path patching.

run(model, task=None, config=None) runs them all; engine holds the batched patched-run engine.
"""
from headscope.analyses.patching.analysis import PatchingConfig, activation_patching, run
from headscope.analyses.patching.attribution_patching import attribution_patching
from headscope.analyses.patching.causal_tracing import causal_tracing
from headscope.analyses.patching.path_patching import path_patching

__all__ = ["PatchingConfig", "activation_patching", "attribution_patching", "causal_tracing", "path_patching", "run"]
