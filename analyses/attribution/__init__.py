"""Attention versus gradient attribution (Jain & Wallace 2019; Captum's integrated gradients).

run(model, task=None, config=None) and attribution(...) compute every method and their Kendall
tau agreement; methods, agreement, permutation and adversarial hold the parts.
"""
from headscope.analyses.attribution.analysis import NEEDS, AttributionConfig, attribution, default_task, reads, run
from headscope.analyses.attribution.cost import COST
from headscope.analyses.core.family import Family

FAMILY = Family(name="attribution", run=run, config=AttributionConfig, needs=NEEDS, cost=COST, default_task=default_task,
                reads=reads, api=("attribution", "AttributionConfig"))

__all__ = ["FAMILY", "AttributionConfig", "attribution", "default_task", "run"]
