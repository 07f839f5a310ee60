"""Probes: scikit-learn-compatible linear probes over activations, with control tasks (selectivity)."""
from headscope.probes.linear import LogisticProbe, RidgeProbe, control_labels, cv_splitter, selectivity

__all__ = ["LogisticProbe", "RidgeProbe", "control_labels", "cv_splitter", "selectivity"]
