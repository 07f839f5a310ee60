"""Head importance and pruning (Michel et al. 2019; Voita et al. 2019).

run(model, task=None, config=None) is the whole analysis; head_importance and prune_heads are
its parts; the submodules hold the engines (importance, pruning, l0, roles).
"""
from headscope.analyses.core.family import Family
from headscope.analyses.heads.analysis import NEEDS, HeadsConfig, default_task, head_importance, prune_heads, reads, run
from headscope.analyses.heads.cost import COST
from headscope.analyses.heads.l0 import L0Config
from headscope.analyses.heads.pruning import PruningConfig

FAMILY = Family(name="heads", run=run, config=HeadsConfig, needs=NEEDS, cost=COST, default_task=default_task, reads=reads,
                api=("head_importance", "prune_heads", "HeadsConfig", "PruningConfig", "L0Config"))

__all__ = ["FAMILY", "HeadsConfig", "L0Config", "PruningConfig", "head_importance", "prune_heads", "run"]
