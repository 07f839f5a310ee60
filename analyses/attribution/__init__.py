"""Attention versus gradient attribution (Jain & Wallace 2019; Captum's integrated gradients).

run(model, task=None, config=None) and attribution(...) compute every method and their Kendall
tau agreement; methods, agreement, permutation and adversarial hold the parts.
"""
from headscope.analyses.attribution.analysis import AttributionConfig, attribution, default_task, run

__all__ = ["AttributionConfig", "attribution", "default_task", "run"]
