"""MLP layers as key-value memories (Geva et al. 2021, 2022).

run(model, task=None, config=None) / mlp_memories_analysis(...): trigger examples, value tokens,
their agreement per layer and a task's largest sub-updates.
"""
from headscope.analyses.mlp.analysis import MLPConfig, mlp_memories_analysis, run

__all__ = ["MLPConfig", "mlp_memories_analysis", "run"]
