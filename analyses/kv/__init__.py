"""The KV cache: anatomy (bytes per token), key/value norms, sinks and eviction what-ifs.

run(model, task=None, config=None) / kv_analysis(...); cache_bytes is the closed-form size.
"""
from headscope.analyses.core.family import Family
from headscope.analyses.kv.analysis import NEEDS, KVConfig, cache_bytes, default_task, kv_analysis, run
from headscope.analyses.kv.cost import COST

FAMILY = Family(name="kv", run=run, config=KVConfig, needs=NEEDS, cost=COST, default_task=default_task,
                api=("kv_analysis", "KVConfig"))

__all__ = ["FAMILY", "KVConfig", "cache_bytes", "kv_analysis", "run"]
