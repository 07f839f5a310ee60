"""Figures of the probes analysis: probe score against the control task, and selectivity, per layer.

reports/plots.py's convention: `plot_<what>(data, *, ax=None, ...) -> Axes` over the Result's tidy tables;
`figures(result)` draws both side by side in one figure."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from headscope.reports.plots import axes, label


def plot_probe(data: pd.DataFrame, *, metric: str = "accuracy", chance: float | None = None, ax=None):
    """Cross-validated score per layer (`data`: the Result's df) on the real labels and the control task
    (mean, 95% CI over folds), with the majority-class rate as `chance` when given."""
    ax = axes(ax, (5, 4))
    df = data
    sns.lineplot(data=df, x="layer", y="score", hue="task", style="task", markers=True, ax=ax,
                 errorbar=("ci", 95), seed=0)  # a seeded bootstrap: equal Results give byte-identical PNGs
    if chance is not None:
        ax.axhline(chance, color="grey", ls="--", lw=1, label="majority class")
    ax.legend(fontsize="small", title="labels", loc="upper left", bbox_to_anchor=(1.01, 1))  # off the data
    ax.set(ylabel=f"cross-validated {metric.replace('_', ' ')}", title="Linear probe vs control task")
    ax.set_xticks(sorted(df.layer.unique()))
    return ax


def plot_selectivity(data: pd.DataFrame, *, ax=None):
    """Selectivity (score - control) per layer (`data`: the per_layer table)."""
    ax = axes(ax, (5, 4))
    sns.barplot(data=data, x="layer", y="selectivity", color="tab:blue", ax=ax)
    ax.axhline(0, color="grey", lw=1)
    ax.set(title="Selectivity (Hewitt & Liang)", ylabel="selectivity (real - control score)")
    return ax


def figures(result, **kwargs) -> dict:
    """{file stem: Figure} for a probes Result: one figure, score and selectivity side by side."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    plot_probe(result.df, metric=result.summary.get("metric", "score"), chance=result.summary.get("majority_baseline"),
               ax=ax1)
    plot_selectivity(result.tables["per_layer"], ax=ax2)
    fig.suptitle(f"labels: {label(result.summary.get('labels', ''))}, site: {label(result.summary.get('site', ''))}")
    fig.tight_layout()
    return {"probes": fig}
