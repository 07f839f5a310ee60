"""MLP layers as key-value memories (Geva et al. 2021, 2022).

run(model, task=None, config=None) / mlp_memories_analysis(...): trigger examples, value tokens,
their agreement per layer and a task's largest sub-updates.
"""
from headscope.analyses.core.family import Family
from headscope.analyses.mlp.analysis import NEEDS, MLPConfig, default_inputs, mlp_memories_analysis, run
from headscope.analyses.mlp.cost import COST


def default_task(model, task=None, config: MLPConfig | None = None):
    """The Task `run` uses (default_inputs' first part; its trigger corpus is built by the run)."""
    return default_inputs(model, task, config or MLPConfig.preset())[0]


FAMILY = Family(name="mlp", run=run, config=MLPConfig, needs=NEEDS, cost=COST, default_task=default_task,
                api=("mlp_memories_analysis", "MLPConfig"))

__all__ = ["FAMILY", "MLPConfig", "mlp_memories_analysis", "run"]
