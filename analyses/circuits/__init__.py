"""Circuits (issue #23): the logit lens, direct logit attribution, edge attribution (EAP,
EAP-IG) and exact circuit faithfulness.

run(model, task=None, config=None) / logit_lens(...) / direct_logit_attribution(...); the
kernels are lens.lens_readout, dla.dla_stack, edges.edge_scores and
faithfulness.circuit_metrics / faithfulness_sweep.
"""
from headscope.analyses.circuits.analysis import (
    NEEDS,
    CircuitsConfig,
    default_task,
    direct_logit_attribution,
    logit_lens,
    reads,
    run,
)
from headscope.analyses.circuits.cost import COST
from headscope.analyses.core.family import Family

FAMILY = Family(name="circuits", run=run, config=CircuitsConfig, needs=NEEDS, cost=COST, default_task=default_task,
                reads=reads, api=("logit_lens", "direct_logit_attribution", "CircuitsConfig"))

__all__ = ["FAMILY", "CircuitsConfig", "direct_logit_attribution", "logit_lens", "run"]
