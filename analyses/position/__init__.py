"""Lost in the middle and attention sinks (Liu et al. 2023; Xiao et al. 2023).

run(model, task=None, config=None) / position_bias(...) sweep the gold item over positions;
prompts builds the sweeps, runs executes them, stats and sinks summarise.
"""
from headscope.analyses.position.analysis import PositionConfig, position_bias, run
from headscope.analyses.position.prompts import PositionSweep

__all__ = ["PositionConfig", "PositionSweep", "position_bias", "run"]
