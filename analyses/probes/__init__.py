"""Linear probes per layer with Hewitt & Liang control tasks (the estimators live in headscope.probes).

run(model, task=None, config=None); probe_sweep(model, task, site, labels, ...) for any labels.
"""
from headscope.analyses.probes.analysis import ProbesConfig, probe_sweep, run

__all__ = ["ProbesConfig", "probe_sweep", "run"]
