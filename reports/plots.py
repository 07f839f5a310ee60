"""Figures: one entry point that dispatches to each analysis's plotting module.

Each analysis keeps its seaborn figures in `headscope.reports.plots_<analysis>` (found through its
presentation record, reports/families.py), exposing
`figures(result) -> {file stem: matplotlib Figure}` (pyplot figures: in a notebook they display
inline at the end of the cell); axes-level functions there take `ax=` and return the Axes.
Plotting never computes analysis results.

Colour convention, every figure: signed quantities (ablation and patching effects, direct logit
attribution, causal-tracing effects, circuit edges) use DIVERGING, red = positive, blue = negative,
white = 0, with limits symmetric about 0; panels that are compared (the patching sites, the causal
traces of MLP, attention and residual) share one scale, and a panel whose own maximum is much
smaller says so in its title. Unsigned quantities in [0, 1] (attention weights, masses, role
scores) use sequential maps from 0. Values are in their own units; a normalised view is an option
and its colour bar says so. Every head grid is layers (rows) x heads (columns).
"""
from __future__ import annotations

from typing import Any

# No matplotlib.use() here: importing headscope or plotting a Result never changes the user's
# backend (a notebook keeps its inline one, and its own figures keep rendering). The CLI, which
# only writes files, selects Agg for its own process (cli.main); a headless machine without a
# display falls back to Agg by itself.


DIVERGING = "RdBu_r"  # signed values: red positive, blue negative, centred on 0


def symmetric_bound(*arrays: Any) -> float:
    """max |value| over the arrays (NaN ignored), 1 when there is none or it is 0: vmin = -bound, vmax = bound."""
    import numpy as np

    values = [np.abs(np.asarray(a, dtype=float)) for a in arrays]
    peak = max((float(np.nanmax(v)) for v in values if v.size and np.isfinite(v).any()), default=0.0)
    return peak if peak > 0 else 1.0


def setup_style() -> None:
    import seaborn as sns

    sns.set_theme(context="notebook", style="whitegrid")


def plot_result(result: Any, **kwargs: Any) -> dict:
    """{figure stem: Figure} for a Result, from its analysis's plotting module."""
    from headscope.reports.families import presentation

    setup_style()
    shown = presentation(result.name)
    return {} if shown is None else shown.figures(result, **kwargs)
