"""Figures of the circuits analysis: the logit lens (layer x position), DLA per head (heads x
layers) and DLA of the embeddings, MLPs and bias terms."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns


def lens_heatmap(lens: pd.DataFrame, ax=None, value: str = "logprob"):
    """Mean over examples of the lens target's log-probability (or "rank") at each layer (block
    input; the last row is the model's output) and position."""
    ax = ax or plt.gca()
    grid = lens.pivot_table(index="layer", columns="position", values=value, aggfunc="mean")
    stages = lens.drop_duplicates("layer").set_index("layer").stage if "stage" in lens else None
    label = {"logprob": "log-probability of the target (nats)", "rank": "rank of the target (0 = top-1)",
             "logit_diff": "logit difference (logits)"}.get(value, value)
    sns.heatmap(grid, ax=ax, cmap="viridis" if value != "rank" else "viridis_r", cbar_kws={"label": label})
    ax.invert_yaxis()
    if stages is not None:
        ax.set_yticklabels([stages.get(l, l) for l in grid.index], rotation=0)
    ax.set(xlabel="position (last = answer position)", ylabel="stream read (top = output)",
           title="Logit lens")
    return ax


def dla_head_heatmap(dla_mean: pd.DataFrame, ax=None):
    """Mean DLA of each head, heads x layers, on a diverging scale centred at 0."""
    ax = ax or plt.gca()
    heads = dla_mean[dla_mean.kind == "head"].astype({"layer": int, "head": int})
    grid = heads.pivot_table(index="head", columns="layer", values="contribution", aggfunc="mean")
    bound = float(np.nanmax(np.abs(grid.to_numpy()))) if grid.size else 1.0
    sns.heatmap(grid, ax=ax, cmap="RdBu_r", center=0.0, vmin=-bound or -1.0, vmax=bound or 1.0,
                cbar_kws={"label": "direct logit attribution (logits)"})
    ax.set(xlabel="layer", ylabel="head", title="Direct logit attribution per head")
    return ax


def dla_component_bars(dla: pd.DataFrame, ax=None):
    """DLA of the embeddings, each MLP, the attention biases and the final norm/unembedding bias
    terms (mean and 95% CI over examples)."""
    ax = ax or plt.gca()
    rows = dla[dla.kind != "head"]
    order = list(dict.fromkeys(rows.component))
    sns.barplot(data=rows, x="component", y="contribution", hue="kind", order=order, dodge=False, ax=ax)
    ax.axhline(0.0, color="grey", lw=1)
    if ax.get_legend() is not None:
        sns.move_legend(ax, "upper left", bbox_to_anchor=(1.01, 1.0), title="kind")
    ax.tick_params(axis="x", labelrotation=60)
    ax.set(xlabel="", ylabel="direct logit attribution (logits)", title="Embeddings, MLPs and bias terms")
    return ax


def figures(result, **kwargs) -> dict:
    """{file stem: Figure} for a circuits Result (whichever of its tables are present)."""
    out = {}
    tables = result.tables
    draws = []
    if "lens" in tables:
        draws.append(("circuits_lens", lambda ax: lens_heatmap(tables["lens"], ax), (7, 4)))
    if "dla_mean" in tables:
        draws.append(("circuits_dla_heads", lambda ax: dla_head_heatmap(tables["dla_mean"], ax), (6, 4)))
    if "dla" in tables:
        draws.append(("circuits_dla_components", lambda ax: dla_component_bars(tables["dla"], ax), (8, 4)))
    for stem, draw, size in draws:
        fig, ax = plt.subplots(figsize=size)
        draw(ax)
        fig.tight_layout()
        out[stem] = fig
    return out
