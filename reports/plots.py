"""Figures: one entry point that dispatches to each analysis's plotting module.

Each analysis keeps its seaborn figures in `headscope.reports.plots_<analysis>`, exposing
`figures(result) -> {file stem: matplotlib Figure}`; axes-level functions there take `ax=` and
return the Axes. Plotting never computes analysis results.
"""
from __future__ import annotations

import importlib
from typing import Any

import matplotlib

matplotlib.use("Agg", force=False)  # headless by default; notebooks keep their inline backend


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
