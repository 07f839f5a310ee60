"""Circuits (issue #23): the logit lens, direct logit attribution, edge attribution (EAP,
EAP-IG) and exact circuit faithfulness.

run(model, task=None, config=None) / logit_lens(...) / direct_logit_attribution(...); the
kernels are lens.lens_readout, dla.dla_stack, edges.edge_scores and
faithfulness.circuit_metrics / faithfulness_sweep.
"""
from headscope.analyses.circuits.analysis import CircuitsConfig, direct_logit_attribution, logit_lens, run

__all__ = ["CircuitsConfig", "direct_logit_attribution", "logit_lens", "run"]
