"""Figures of the `heads` analysis: importance heat map, pruning curves, best head per layer,
the L0 trade-off and head-role scores.

Axes-level functions take `ax=` and return the Axes; `figures(result)` gives every figure the
Result has data for, by file stem. Plotting reads the Result's tables only.
"""
from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from headscope.reports.plots import DIVERGING, symmetric_bound

ROLE_SCORES = ("positional", "sink", "previous_token", "induction", "confidence")


def _axes(ax: Any, size: tuple[float, float] = (6, 4)) -> Any:
    return ax if ax is not None else plt.subplots(figsize=size)[1]


def _curve(result: Any) -> pd.DataFrame | None:
    if "curve" in result.tables:
        return result.tables["curve"]
    return result.df if "fraction_pruned" in result.df.columns else None


METHOD_WORDS = {"gradient": "gradient |dL/d gate|", "zero": "zero ablation", "mean": "mean ablation",
                "resample": "resample ablation"}
METRIC_WORDS = {"logit_diff": "logit difference (answer - wrong)", "logprob": "answer log-probability (nats)",
                "accuracy": "accuracy (0-1)", "cosine": "cosine similarity"}


def _metric_label(result: Any) -> str:
    metric = result.summary.get("metric", "metric")
    return METRIC_WORDS.get(metric, str(metric).replace("_", " "))


def plot_importance(result: Any, *, method: str | None = None, normalized: bool = False, ax: Any = None) -> Any:
    """Heat map layer x head of one method's importance in its own units, on a diverging map centred
    on 0 (ablation effects are signed: below 0, removing the head helps). normalized=True shows each
    layer divided by its L2 norm instead, labelled so: it makes every layer's largest head bright,
    however small (a 0.2% effect looks like a large one), so it is an option, not the default."""
    ax = _axes(ax)
    df = result.df
    method = method or ("gradient" if "gradient" in set(df["method"]) else df["method"].iloc[0])
    column = "importance_layer_norm" if normalized else "importance"
    grid = df[df["method"] == method].pivot(index="layer", columns="head", values=column)  # [layer, head]
    loss = {"cosine": "in-batch contrastive loss", "accuracy": "answer log-probability"}.get(
        result.summary.get("metric"), _metric_label(result))  # what the gate gradient differentiates
    unit = f"|dL/d gate|, L = {loss}" if method == "gradient" else f"drop in {_metric_label(result)}"
    label = "importance / its layer's L2 norm (normalised view)" if normalized else unit
    bound = symmetric_bound(grid.to_numpy(dtype=float))
    annotate = grid.size <= 96 and grid.shape[1] <= 8  # wider grids: numbers would collide
    sns.heatmap(grid, ax=ax, cmap=DIVERGING, center=0, vmin=-bound, vmax=bound, annot=annotate, fmt=".2g",
                annot_kws={"fontsize": "x-small"}, cbar_kws={"label": label}, xticklabels=True, yticklabels=True)
    why = result.summary.get(f"degenerate_{method}")
    title = f"head importance: {METHOD_WORDS.get(method, method)}" + (" (normalised per layer)" if normalized else "")
    if why:  # importance under the numerical floor: say so on the figure, not only in the finding
        ax.set_title(title + "\nROUNDING ONLY: no head measurably matters by this method", fontsize="medium", color="C3")
    else:
        ax.set_title(title)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    return ax


def importance_figure(result: Any, *, normalized: bool = False) -> Any:
    """Both methods side by side: the gradient and the first ablation method (zero when present),
    each in its own units (different quantities: no shared scale)."""
    methods = list(dict.fromkeys(result.df["method"]))
    shown = (["gradient"] if "gradient" in methods else []) + [m for m in ("zero", "mean", "resample") if m in methods][:1]
    shown = shown or methods[:2]
    fig, axes = plt.subplots(1, len(shown), figsize=(6 * len(shown), 4), squeeze=False)
    for method, ax in zip(shown, axes[0]):
        plot_importance(result, method=method, normalized=normalized, ax=ax)
    return fig


def plot_pruning_curve(result: Any, *, ax: Any = None) -> Any:
    """Metric against the fraction of heads pruned, one line per ordering (random: band over seeds),
    with the unpruned baseline and the 1% tolerance floor."""
    ax = _axes(ax, (8, 4))
    curve = _curve(result).copy()
    curve["ordering "] = curve["ordering"] + curve["recompute"].map({True: " (recomputed)", False: ""})
    sns.lineplot(data=curve, x="fraction_pruned", y="metric", hue="ordering ", style="ordering ", markers=True,
                 dashes=True, errorbar=("pi", 100), ax=ax)  # a marker and dash per ordering: equal curves stay visible
    return _finish(ax, result, "fraction of heads pruned", "iterative head pruning (random: range over seeds)")


def _finish(ax: Any, result: Any, xlabel: str, title: str) -> Any:
    """Unpruned baseline and its 1% floor as grey lines; labels, legend and title."""
    baseline = result.summary.get("baseline_metric")
    if baseline is not None:
        ax.axhline(baseline, color="grey", linestyle="--", linewidth=1, label="unpruned")
        ax.axhline(baseline - 0.01 * abs(baseline), color="grey", linestyle=":", linewidth=1, label="-1%")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(_metric_label(result))
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_title(title)
    return ax


def plot_best_head(result: Any, *, ax: Any = None) -> Any:
    """Per layer: metric change keeping only the most important head, the oracle best head, or none."""
    ax = _axes(ax, (8, 4))
    table = result.tables["best_head"]
    long = table.melt(id_vars="layer", value_vars=["change", "oracle_change", "layer_removed_change"],
                      var_name="kept", value_name="metric_change")
    long["kept"] = long["kept"].map({"change": "most important head", "oracle_change": "best single head",
                                     "layer_removed_change": "no head"})
    sns.barplot(data=long, x="layer", y="metric_change", hue="kept", ax=ax)
    ax.axhline(0, color="grey", linewidth=1)
    ax.set_ylabel(f"change in {_metric_label(result)}")
    ax.set_title("keep one head in one layer")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1), title="kept")
    return ax


def plot_l0(result: Any, *, ax: Any = None) -> Any:
    """Heads kept against the metric over the lambda sweep (Voita et al.'s L0 gates)."""
    ax = _axes(ax, (8, 4))
    sweep = result.tables["l0"].sort_values("heads_kept")
    ax.plot(sweep["heads_kept"], sweep["metric_binary"], marker="o", label="kept heads only")
    ax.plot(sweep["heads_kept"], sweep["metric"], marker="x", linestyle="--", label="test-time gates")
    points: dict[tuple[float, float], list[float]] = {}  # lambdas that land on one point share one label
    for lam, kept, metric in zip(sweep["lambda"], sweep["heads_kept"], sweep["metric_binary"]):
        points.setdefault((float(kept), round(float(metric), 4)), []).append(float(lam))
    for i, ((kept, metric), lams) in enumerate(sorted(points.items())):
        ax.annotate("λ=" + ", ".join(f"{v:g}" for v in lams), (kept, metric), textcoords="offset points",
                    xytext=(4, 8 if i % 2 else -12), fontsize="x-small")  # alternate above and below
    return _finish(ax, result, "heads kept", "L0 head pruning")


def plot_roles(result: Any, *, ax: Any = None) -> Any:
    """Heat map head x role score (positional share, sink, previous-token, induction, confidence = mean
    maximum attention weight), every head labelled."""
    roles = result.tables["roles"]
    ax = _axes(ax, (5, max(3, 0.25 * len(roles))))
    grid = roles.assign(name=[f"L{l}H{h}" for l, h in zip(roles["layer"], roles["head"])]).set_index("name")
    scores = [c for c in ROLE_SCORES if c in grid.columns]
    shown = grid[scores].rename(columns=lambda c: {"confidence": "confidence\n(max weight)"}.get(c, c.replace("_", "-")))
    sns.heatmap(shown, ax=ax, vmin=0, vmax=1, cmap="magma", cbar_kws={"label": "role score (0-1)"}, yticklabels=True)
    ax.set_ylabel("head (L layer H head)")
    ax.set_xlabel("role")
    ax.set_title("head roles")
    return ax


def figures(result: Any) -> dict[str, Any]:
    """Every figure the Result has data for: importance, pruning_curve, best_head, l0, roles."""
    out = {}
    if "method" in result.df.columns:
        out["importance"] = importance_figure(result)
        out["importance"].tight_layout()
    draw = {
        "pruning_curve": (_curve(result) is not None, plot_pruning_curve),
        "best_head": ("best_head" in result.tables, plot_best_head),
        "l0": ("l0" in result.tables, plot_l0),
        "roles": ("roles" in result.tables, plot_roles),
    }
    for stem, (available, fn) in draw.items():
        if available:
            ax = fn(result)
            ax.figure.tight_layout()
            out[stem] = ax.figure
    return out
