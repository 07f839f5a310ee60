"""The KV cache: anatomy (bytes per token), key/value norms, sinks and eviction what-ifs.

run(model, task=None, config=None) / kv_analysis(...); cache_bytes is the closed-form size.
"""
from headscope.analyses.kv.analysis import KVConfig, cache_bytes, kv_analysis, run

__all__ = ["KVConfig", "cache_bytes", "kv_analysis", "run"]
