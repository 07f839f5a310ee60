"""Figures of the probes analysis: probe score against the control task, and selectivity, per layer.

reports/plots.py's convention: `plot_<what>(data, *, ax=None, ...) -> Axes` over the Result's tidy tables;
`figures(result)` draws both side by side in one figure.

This module is the family's whole presentation (reports/families.py): after the figures, `GUIDE`
(how to read its section), `CAPTIONS` (each figure's, by stem) and `finding(summary)`, its headline.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from headscope.reports.findings import _num
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


# Presentation (reports/families.py): the guide, the captions and the finding in words.

GUIDE = (  # how to read this section of the report
    "Linear probes per layer: how well a property can be read linearly from the activations, "
    "and selectivity (accuracy minus a control task with random labels per type, Hewitt & Liang "
    "2019). High accuracy with low selectivity means the probe memorises rather than reads."
)
CAPTIONS = {  # what to read from each figure and its units, by figure stem
    "probes": "Left: cross-validated probe score per layer on the real labels and on the control task (95% CI over "
              "folds; dashed: the majority class). Right: selectivity = real minus control. With the capacity sweep, each "
              "layer shows its most selective regularisation strength.",
}


def finding(s: Mapping[str, Any]) -> str:
    """Best layer, its score against the majority baseline and its selectivity."""
    metric = s.get("metric", "accuracy")
    best = _num(s.get(f"best_{metric}"))
    if best is None:
        return ""
    sd, folds, n = _num(s.get("best_std")), s.get("cv"), s.get("n_examples")
    spread = f" (sd {sd:.2f} over {folds} folds)" if sd is not None and folds else ""
    parts = [f"The {s.get('labels', '')} probe is best at layer {s.get('best_layer', '?')} with {metric} {best:.2f}{spread}"]
    majority = _num(s.get("majority_baseline"))
    parts[-1] += f" against a majority baseline of {majority:.2f}" if majority is not None else ""
    parts[-1] += f" ({n} examples)." if n is not None else "."
    if majority is not None and best <= majority + 0.02 and "chance" not in s:
        parts.append("That is chance level: the property is not linearly readable from these activations.")
    sel, control = _num(s.get("best_selectivity")), _num(s.get("best_control"))
    if sel is not None and metric == "r2" and control is not None and control < 0 and best is not None:
        floor = best - max(control, 0.0)
        parts.append(f"The control task's R^2 is {control:.2f}, below 0 (worse than predicting the mean), so score minus "
                     f"control ({sel:.2f}) overstates selectivity; against the control's floor of 0 it is {floor:.2f}.")
    elif s.get("control_degenerate"):
        parts.append(f"Selectivity cannot be measured on this task: {s['control_degenerate']}.")
    elif sel is not None:
        parts.append(f"Selectivity (score minus the control task) is {sel:.2f}"
                     + ("; below 0 the control task (random labels per word type) is easier to fit than the real "
                        "labels, so this probe shows no evidence that the property is read rather than memorised."
                        if sel < 0 else "; low selectivity means the probe memorises rather than reads."
                        if sel < 0.1 else "."))
    capacity = s.get("capacity")
    if isinstance(capacity, Mapping) and capacity.get("grid") and not s.get("control_degenerate"):
        first = s.get("first_selective_layer")
        grid = ", ".join(f"{v:g}" for v in capacity["grid"])
        where = (f"the first layer whose most selective probe reaches selectivity 0.5 is layer {first}" if first is not None
                 else "no layer's most selective probe reaches selectivity 0.5")
        parts.append(f"Each layer reports its most selective probe over {capacity.get('param', 'C')} in {{{grid}}} "
                     f"(Hewitt & Liang's capacity sweep): {where}.")
    return " ".join(parts)
