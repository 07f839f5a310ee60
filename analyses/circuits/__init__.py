"""Circuits (issue #23), part 1: the logit lens and direct logit attribution.

run(model, task=None, config=None) / logit_lens(...) / direct_logit_attribution(...); the
kernels are lens.lens_readout and dla.dla_stack.
"""
from headscope.analyses.circuits.analysis import CircuitsConfig, direct_logit_attribution, logit_lens, run

__all__ = ["CircuitsConfig", "direct_logit_attribution", "logit_lens", "run"]
