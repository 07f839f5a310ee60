"""Probes: scikit-learn-compatible linear probes over activations, with control tasks (selectivity)
and selectivity against probe capacity."""
from headscope.probes.capacity import ALPHA_GRID, C_GRID, capacity_sweep
from headscope.probes.linear import LogisticProbe, RidgeProbe, control_labels, cv_splitter, selectivity

__all__ = ["ALPHA_GRID", "C_GRID", "LogisticProbe", "RidgeProbe", "capacity_sweep", "control_labels", "cv_splitter",
           "selectivity"]
