"""Figures of the probes analysis: probe score against the control task, and selectivity, per layer."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns


def probe_plot(df: pd.DataFrame, ax=None, metric: str = "accuracy", chance: float | None = None):
    """Cross-validated score per layer on the real labels and the control task (mean, 95% CI over
    folds), with the majority-class rate as `chance` when given."""
    ax = ax or plt.gca()
    sns.lineplot(data=df, x="layer", y="score", hue="task", style="task", markers=True, ax=ax,
                 errorbar=("ci", 95), seed=0)  # a seeded bootstrap: equal Results give byte-identical PNGs
    if chance is not None:
        ax.axhline(chance, color="grey", ls="--", lw=1, label="majority class")
    ax.legend(fontsize="small", title="labels", loc="upper left", bbox_to_anchor=(1.01, 1))  # off the data
    ax.set(ylabel=f"cross-validated {metric.replace('_', ' ')}", title="Linear probe vs control task")
    ax.set_xticks(sorted(df.layer.unique()))
    return ax


def selectivity_plot(per_layer: pd.DataFrame, ax=None):
    """Selectivity (score - control) per layer."""
    ax = ax or plt.gca()
    sns.barplot(data=per_layer, x="layer", y="selectivity", color="tab:blue", ax=ax)
    ax.axhline(0, color="grey", lw=1)
    ax.set(title="Selectivity (Hewitt & Liang)", ylabel="selectivity (real - control score)")
    return ax


def figures(result, **kwargs) -> dict:
    """{file stem: Figure} for a probes Result: one figure, score and selectivity side by side."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    probe_plot(result.df, ax1, metric=result.summary.get("metric", "score"), chance=result.summary.get("majority_baseline"))
    selectivity_plot(result.tables["per_layer"], ax2)
    fig.suptitle(f"labels: {str(result.summary.get('labels', '')).replace('$', chr(92) + '$')}, "
                 f"site: {result.summary.get('site', '')}")
    fig.tight_layout()
    return {"probes": fig}
