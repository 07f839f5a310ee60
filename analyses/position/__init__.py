"""Lost in the middle and attention sinks (Liu et al. 2023; Xiao et al. 2023).

run(model, task=None, config=None) / position_bias(...) sweep the gold item over positions;
prompts builds the sweeps, runs executes them, stats and sinks summarise.
"""
from headscope.analyses.core.family import Family
from headscope.analyses.position.analysis import NEEDS, PositionConfig, position_bias, run
from headscope.analyses.position.cost import COST
from headscope.analyses.position.prompts import PositionSweep

FAMILY = Family(name="position", run=run, config=PositionConfig, needs=NEEDS, cost=COST,  # its own sweeps: no default_task
                api=("position_bias", "PositionConfig"))

__all__ = ["FAMILY", "PositionConfig", "PositionSweep", "position_bias", "run"]
