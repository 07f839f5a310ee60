"""Figures of the `position` analysis: the U-curve, attention onto the gold span, sink mass.

reports/plots.py's convention: `plot_<what>(data, *, ax=None, ...) -> Axes` over the Result's tidy
tables, summary values by keyword; `figures(result)` gives every figure by file stem. Plotting
reads the Result's tables only; nothing is computed from the model here.
"""
from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from headscope.errors import ConfigError
from headscope.reports.plots import axes, color_scale, quiet_reason

LABELS = {"accuracy": "accuracy (greedy output contains the value)", "logprob": "answer log-probability (nats)",
          "probability": "answer probability", "rank": "answer rank", "exact": "exact greedy answer",
          "cosine": "cosine(query, passage)"}


MARKERS = ("o", "s", "^", "D", "v", "P")
DASHES = ("-", "--", ":", "-.")


def plot_curve(data: pd.DataFrame, *, metric: str | None = None, conditions: tuple[str, ...] = ("full",),
               n_items: int | None = None, ratio: float | None = None, title: str | None = None, ax: Any = None) -> Any:
    """Metric against gold position (1-based slot) with bootstrap 95% intervals (`data`: the curve
    table; metric: its first when None): the U-curve. The default title gives `ratio`, min(middle) /
    max(ends) (the summary's ratio_middle_to_ends), or says the curve is flat."""
    ax = axes(ax, (6, 4))
    curve = data
    metric = metric or str(curve["metric"].iloc[0])
    data = curve[(curve["metric"] == metric) & curve["condition"].isin(conditions)]
    if data.empty:
        raise ConfigError(f"no curve for metric {metric!r} and conditions {conditions}; "
                          f"metrics: {sorted(curve['metric'].unique())}.")
    palette = sns.color_palette(n_colors=len(conditions))
    for i, (color, (cond, g)) in enumerate(zip(palette, data.groupby("condition", sort=False))):
        g = g.sort_values("position")  # each condition its own marker and dash: equal curves stay visible
        ax.plot(g["position"], g["mean"], color=color, label=cond, marker=MARKERS[i % len(MARKERS)],
                linestyle=DASHES[i % len(DASHES)], markersize=7 - i % 3, linewidth=2.2 - 0.5 * (i % 3))
        ax.fill_between(g["position"], g["ci_low"], g["ci_high"], color=color, alpha=0.2)
    ax.set_xticks(sorted(data["position"].unique()))
    ax.set_xlabel(f"gold position (of {n_items if n_items is not None else '?'})")
    ax.set_ylabel(LABELS.get(metric, metric))
    lo, hi = float(data["mean"].min()), float(data["mean"].max())
    if title is None and hi - lo < 0.02:
        title = f"flat: {metric} {lo:.2f}-{hi:.2f} at every gold position (position makes no difference)"
    elif title is None:
        title = "min(middle) / max(ends) = " + (f"{ratio:.2f}" if ratio is not None else "n/a (too few positions)")
        title += _verdict(data[data["condition"] == conditions[0]])
    ax.set_title(title, fontsize="medium")
    if len(conditions) > 1:
        ax.legend(title="attention", loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    return ax


def _verdict(curve: pd.DataFrame) -> str:
    """What the bands allow: a U-shape only when the worst middle position's band lies below both ends'."""
    g = curve.sort_values("position")
    if len(g) < 3:
        return ""
    first, last, middle = g.iloc[0], g.iloc[-1], g.iloc[1:-1]
    worst = middle.loc[middle["mean"].idxmin()]
    if worst["ci_high"] < first["ci_low"] and worst["ci_high"] < last["ci_low"]:
        return "\nU-shape: the middle's 95% band lies below both ends'"
    return "\n95% bands of the middle and an end overlap: no U-shape shown"


def plot_gold_attention(data: pd.DataFrame, *, reduce: str = "max", quiet: str | None = None, ax: Any = None) -> Any:
    """Heat map layer x gold position of the attention mass onto the gold span (`data`: the
    gold_attention table; max or mean over heads), on the sequential map from 0 (plots.color_scale);
    `quiet` (plots.quiet_reason: the model at chance, so no head retrieves anything) mutes it and says why."""
    ax = axes(ax, (6, 4))
    table = data
    grid = table.groupby(["layer", "position"])["mass"].agg(reduce).unstack("position")  # [layer, position]
    sns.heatmap(grid, ax=ax, **color_scale(grid.to_numpy(dtype=float), quiet=bool(quiet), is_signed=False),
                annot=grid.shape[1] <= 10, fmt=".2f", cbar_kws={"label": "attention mass (0-1)"})
    ax.set_xlabel("gold position")
    ax.set_ylabel("layer")
    ax.set_title(f"attention onto the gold span ({reduce} over heads)" + (f"\n{quiet}" if quiet else ""))
    return ax


def plot_sink_mass(data: pd.DataFrame, *, n_sink: int | None = None, ax: Any = None) -> Any:
    """Per layer, the mass on the first `n_sink` tokens (`data`: the sinks table), against the uniform baseline."""
    ax = axes(ax, (6, 4))
    sinks = data
    sns.barplot(data=sinks, x="layer", y="sink_mass", ax=ax, color=sns.color_palette()[0])
    baseline = float(sinks["baseline"].iloc[0])
    ax.axhline(baseline, color="black", linestyle="--", label="uniform attention")
    ax.set_ylabel(f"attention mass on the first {n_sink if n_sink is not None else '?'} token(s) (0-1)")
    ax.set_ylim(0, min(1.0, 1.25 * max(float(sinks["sink_mass"].max()), baseline)) or 1.0)  # bars fill the axis
    ax.set_title("attention sink per layer")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    return ax


def figures(result: Any, **kwargs: Any) -> dict[str, Any]:
    """{file stem: Figure}: position_curve, position_gold_attention, position_sinks (+ position_streaming)."""
    s, tables = result.summary, result.tables
    primary = s.get("primary_metric", "accuracy")
    common = {"n_items": s.get("n_items"), "ratio": (s.get("ratio_middle_to_ends") or {}).get(primary)}
    figs = {}
    for stem, draw in (("position_curve", lambda ax: plot_curve(tables["curve"], metric=primary, ax=ax, **common)),
                       ("position_gold_attention", lambda ax: plot_gold_attention(tables["gold_attention"], ax=ax,
                                                                                           quiet=quiet_reason(s))),
                       ("position_sinks", lambda ax: plot_sink_mass(tables["sinks"], n_sink=s.get("n_sink"), ax=ax))):
        fig, ax = plt.subplots(figsize=(7, 4))
        draw(ax)
        fig.tight_layout()
        figs[stem] = fig
    masked = tables.get("masked", pd.DataFrame())
    if len(masked):
        fig, ax = plt.subplots(figsize=(8, 4))
        plot_curve(tables["curve"], metric="logprob", conditions=("full", *masked["condition"].unique()),
                   n_items=s.get("n_items"), ax=ax, title="full context vs streaming windows (sinks + recent tokens)")
        fig.tight_layout()
        figs["position_streaming"] = fig
    return figs
