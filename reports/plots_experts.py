"""The circuits section's per-expert DLA figure (#34 items 3 and 7): each mixture-of-experts block's direct logit
attribution split by expert (analyses/circuits/experts.py's dla_experts_mean table), beside the block's total.

One panel per MoE layer, every panel on one y scale symmetric about 0 (raw logits, so layers compare): a bar per
expert at its mean over examples with its 95% t interval, red toward the answer and blue away (plots.py's
convention), the shared expert hatched and ticked "shared", each tick giving how many examples the router sent to
the expert (its mean counts the others' zeros), and the layer's total, the block's mlpN DLA, grey at the right with
its own interval. Panels wrap four to a row. A model with more experts or MoE layers than bars can show legibly
(Qwen1.5-MoE's 60 experts in 24 layers) gets one heat map instead, MoE layers (rows) x experts (columns) on a
diverging scale centred on 0, the shared expert's and the total's columns right of a line (`experts_map`).
"""
from __future__ import annotations

import math

import matplotlib as mpl
import numpy as np
import pandas as pd

from headscope.analyses.core import chance
from headscope.reports.plots import DIVERGING, MUTE

PER_ROW = 4  # panels per row
MAX_BARS = 17  # experts (and the shared one) a panel draws as bars, with the total; more: the heat map
MAX_PANELS = 8  # MoE layers drawn as panels; more: the heat map
TOTAL = "0.55"  # the layer total's bar colour: not a value colour


def _bar_colour(value: float, quiet: bool) -> tuple:
    """Red (value > 0) or blue (< 0) from the diverging map's ends, white at 0; blended towards white when quiet."""
    rgb = np.array(mpl.colormaps[DIVERGING](0.85 if value > 0 else 0.15 if value < 0 else 0.5)[:3])
    return tuple(rgb * (1 - MUTE) + MUTE) if quiet else tuple(rgb)


def layer_totals(dla: pd.DataFrame | None, means: pd.DataFrame) -> dict[int, tuple[float, float, float, int]]:
    """{layer: (mean, ci_low, ci_high, n)} of each MoE block's mlpN DLA over examples (the dla table); without it, the
    sum of the experts' means (equal up to float rounding) with no interval."""
    out = {}
    for layer, g in means.groupby("layer"):
        rows = None if dla is None else dla[(dla.kind == "mlp") & (dla.component == f"mlp{int(layer)}")]
        if rows is not None and len(rows):
            x = rows.contribution.to_numpy(dtype=float)
            ci = chance.mean_interval(x)
            low, high = (math.nan, math.nan) if ci is None else ci
            out[int(layer)] = (float(x.mean()), low, high, len(x))
        else:
            out[int(layer)] = (float(g.contribution.sum()), math.nan, math.nan, int(g.n.max()))
    return out


def dla_units(cap: float | None) -> str:
    """DLA's axis label: "direct logit attribution (logits)", or where the model soft-caps its final logits (the
    summary's dla_final_softcap) the logits before that cap, which the rows add up to (review 18d C2)."""
    if not cap:
        return "direct logit attribution (logits)"
    return f"direct logit attribution\n(logits before the final soft-cap {cap:g} tanh(x / {cap:g}))"


def experts_figure(data: pd.DataFrame, *, dla: pd.DataFrame | None = None, quiet: str | None = None,
                   cap: float | None = None):
    """`data`: the dla_experts_mean table (layer, expert, shared, contribution, ci_low, ci_high, n, n_routed); `dla`:
    the dla table, for each layer's total. -> Figure, one panel per MoE layer on one scale symmetric about 0;
    `quiet` (plots.quiet_reason) mutes the bars and says why in the title; `cap`: the model's final soft-cap (the
    logits are before it, as DLA's other figures say)."""
    import matplotlib.pyplot as plt

    layers = sorted(int(l) for l in data.layer.unique())
    totals = layer_totals(dla, data)
    bars = max(int((data.layer == l).sum()) for l in layers) + 1  # experts and the total
    if bars > MAX_BARS + 1 or len(layers) > MAX_PANELS:
        return experts_map(data, totals=totals, quiet=quiet, cap=cap)
    cols = min(PER_ROW, len(layers))
    rows = math.ceil(len(layers) / cols)
    fig, grid = plt.subplots(rows, cols, figsize=(max(3.2, 0.55 * bars + 1.2) * cols, 3.6 * rows + 0.6),
                             sharey=True, squeeze=False)
    values = np.concatenate([data[["contribution", "ci_low", "ci_high"]].to_numpy(dtype=float).ravel(),
                             np.array([v for t in totals.values() for v in t[:3]], dtype=float)])
    bound = float(np.nanmax(np.abs(values))) if np.isfinite(values).any() else 0.0
    bound = 1.1 * bound if bound > 0 else 1.0
    for ax, layer in zip(grid.ravel(), layers):
        own = data[data.layer == layer].sort_values(["shared", "expert"])
        n = int(own.n.max())
        x = np.arange(len(own) + 1)
        mean = own.contribution.to_numpy(dtype=float)
        low, high = own.ci_low.to_numpy(dtype=float), own.ci_high.to_numpy(dtype=float)
        t_mean, t_low, t_high, _ = totals[layer]
        heights = np.append(mean, t_mean)
        colours = [_bar_colour(v, bool(quiet)) for v in mean] + [TOTAL]
        drawn = ax.bar(x, heights, color=colours, edgecolor="0.25", linewidth=0.6)
        for patch, shared in zip(drawn, own.shared.tolist()):
            if shared:
                patch.set_hatch("//")
        lows, highs = np.append(low, t_low), np.append(high, t_high)
        has = np.isfinite(lows) & np.isfinite(highs)
        ax.errorbar(x[has], heights[has], yerr=[heights[has] - lows[has], highs[has] - heights[has]], fmt="none",
                    ecolor="black", elinewidth=1, capsize=3)
        ax.axhline(0.0, color="grey", lw=1)
        ax.axvline(len(own) - 0.5, color="0.5", lw=0.8, ls=":")
        ticks = [f"{'shared' if s else f'E{e}'}\n{r}/{n}" for e, s, r in zip(own.expert, own.shared, own.n_routed)]
        ax.set_xticks(x, ticks + [f"total\nmlp{layer}"], fontsize=8)
        ax.set_ylim(-bound, bound)
        ax.set_title(f"layer {layer}: total {t_mean:+.2f}, n = {n}", fontsize=10)
        ax.set_xlabel("expert (routed / examples)", fontsize=9)
    for ax in grid.ravel()[len(layers):]:
        ax.set_visible(False)
    for ax in grid[:, 0]:
        ax.set_ylabel(dla_units(cap), fontsize=9)
    head = "Direct logit attribution per expert: mean and 95% CI over examples"
    fig.suptitle(head + (f"\n{quiet}" if quiet else ""), fontsize=11)
    fig.tight_layout()
    return fig


def experts_map(data: pd.DataFrame, *, totals: dict[int, tuple[float, float, float, int]], quiet: str | None = None,
                cap: float | None = None):
    """The many-expert view: MoE layers (rows) x experts (columns), each cell an expert's mean DLA (logits) on
    DIVERGING centred on 0, then "shared" (where the model has one) and "total" (the layer's mlpN) right of a line;
    experts the router never chose for any example hatched (0 by construction). x tick labels that would collide
    are thinned (plots.thin_xtick_labels). -> Figure"""
    import matplotlib.pyplot as plt
    import seaborn as sns

    from headscope.reports.plots import color_scale, hatch_cells, symmetric_bound, thin_xtick_labels

    routed = data[~data.shared]
    grid = routed.pivot_table(index="layer", columns="expert", values="contribution", aggfunc="mean")  # [layer, e]
    never = routed.pivot_table(index="layer", columns="expert", values="n_routed", aggfunc="sum").reindex_like(grid)
    names = [f"E{int(e)}" for e in grid.columns]
    if data.shared.any():
        shared = data[data.shared].set_index("layer").contribution.reindex(grid.index)
        grid, names = grid.assign(shared=shared), names + ["shared"]
    grid = grid.assign(total=[totals[int(l)][0] for l in grid.index])
    names.append("total")
    values = grid.to_numpy(dtype=float)  # [layer, expert + extras]
    n = int(data.n.max())
    width = min(40.0, max(6.0, 0.24 * values.shape[1] + 3.5))  # a rotated tick label per column fits
    fig, ax = plt.subplots(figsize=(width, min(30.0, max(3.0, 0.3 * values.shape[0] + 1.8))))
    bound = symmetric_bound(values)
    sns.heatmap(values, ax=ax, **color_scale(bound=bound, is_signed=True, quiet=bool(quiet)),
                cbar_kws={"label": dla_units(cap)}, xticklabels=names,
                yticklabels=[str(int(l)) for l in grid.index])
    mask = np.zeros(values.shape, dtype=bool)
    mask[:, :never.shape[1]] = never.to_numpy() == 0
    hatch_cells(ax, mask)
    ax.axvline(never.shape[1], color="black", lw=1.2)
    ax.set(xlabel="expert (hatched: never routed; right of the line: shared expert and the layer's total)",
           ylabel="MoE layer", title=f"Direct logit attribution per expert: mean over n = {n} examples"
           + (f"\n{quiet}" if quiet else ""))
    ax.set_xticks(np.arange(len(names)) + 0.5, names, rotation=90)
    fig.tight_layout()
    order = [len(names) - 1] + ([len(names) - 2] if data.shared.any() else []) + list(range(len(names)))
    thin_xtick_labels(ax, order=order)
    return fig
