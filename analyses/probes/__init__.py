"""Linear probes per layer with Hewitt & Liang control tasks (the estimators live in headscope.probes).

run(model, task=None, config=None); probe_sweep(model, task, site, labels, ...) for any labels.
"""
from headscope.analyses.core.family import Family
from headscope.analyses.probes.analysis import NEEDS, ProbesConfig, probe_sweep, reads, run
from headscope.analyses.probes.cost import COST

FAMILY = Family(name="probes", run=run, config=ProbesConfig, needs=NEEDS, cost=COST,  # probe_data labels its own rows
                reads=reads, api=("probe_sweep", "ProbesConfig"))

__all__ = ["FAMILY", "ProbesConfig", "probe_sweep", "run"]
