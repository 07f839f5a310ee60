"""Figures: one entry point that dispatches to each analysis's plotting module.

Each analysis keeps its seaborn figures in `headscope.reports.plots_<analysis>`, exposing
`figures(result) -> {file stem: matplotlib Figure}` (pyplot figures: in a notebook they display
inline at the end of the cell); axes-level functions there take `ax=` and return the Axes.
Plotting never computes analysis results.
"""
from __future__ import annotations

import importlib
from typing import Any

# No matplotlib.use() here: importing headscope or plotting a Result never changes the user's
# backend (a notebook keeps its inline one, and its own figures keep rendering). The CLI, which
# only writes files, selects Agg for its own process (cli.main); a headless machine without a
# display falls back to Agg by itself.


def setup_style() -> None:
    import seaborn as sns

    sns.set_theme(context="notebook", style="whitegrid")


def plot_result(result: Any, **kwargs: Any) -> dict:
    """{figure stem: Figure} for a Result, from its analysis's plotting module."""
    setup_style()
    try:
        module = importlib.import_module(f"headscope.reports.plots_{result.name}")
    except ModuleNotFoundError as err:
        if err.name != f"headscope.reports.plots_{result.name}":
            raise
        return {}
    return module.figures(result, **kwargs)
