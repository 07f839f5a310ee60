"""Figures of the `heads` analysis: importance heat map, pruning curves, best head per layer,
the L0 trade-off and head-role scores.

reports/plots.py's convention: `plot_<what>(data, *, ax=None, ...) -> Axes` over one of the Result's
tidy tables, summary values by keyword; `importance_figure` (two panels) returns the Figure;
`pruning_figure` (the whole curve and a zoom on its tolerance floor) returns the Figure;
`figures(result)` gives every figure the Result has data for, by file stem.

This module is the family's whole presentation (reports/families.py): after the figures, `GUIDE`
(how to read its section), `CAPTIONS` (each figure's, by stem) and `finding(summary)`, its headline,
whose words live in reports/heads_words.py.
"""
from __future__ import annotations

import math
import textwrap
from collections.abc import Collection, Mapping
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from headscope.analyses.core.chance import t_quantile
from headscope.reports.heads_words import finding as finding  # the headline: families.py reads it here
from headscope.reports.plots import (
    MUTE,
    axes,
    color_scale,
    fit_title,
    hatch_cells,
    laid_out,
    mute_drawn,
    quiet_reason,
    symmetric_bound,
    wrap_to_width,
)

ROLE_SCORES = ("positional", "sink", "previous_token", "induction", "confidence")


def _curve(result: Any) -> pd.DataFrame | None:
    if "curve" in result.tables:
        return result.tables["curve"]
    return result.df if "fraction_pruned" in result.df.columns else None


METHOD_WORDS = {"gradient": "gradient |dL/d gate|", "zero": "zero ablation", "mean": "mean ablation",
                "resample": "resample ablation"}
METRIC_WORDS = {"logit_diff": "logit difference (answer - wrong)", "logprob": "answer log-probability (nats)",
                "accuracy": "accuracy (0-1)", "cosine": "cosine similarity"}


def _metric_label(metric: str | None) -> str:
    metric = metric or "metric"
    return METRIC_WORDS.get(metric, str(metric).replace("_", " "))


def plot_importance(data: pd.DataFrame, *, method: str | None = None, metric: str | None = None,
                    baseline: float | None = None, degenerate: str | None = None, quiet: str | None = None,
                    normalized: bool = False, floor: float | None = None, ax: Any = None) -> Any:
    """Heat map layer x head of one method's importance (`data`: the heads Result's df) in its own
    units: ablation effects, signed (below 0, removing the head helps), on a diverging map centred
    on 0 even when every value is >= 0; the gradient's |dL/d gate|, unsigned, on a sequential map from 0.
    `degenerate` (the summary's degenerate_<method> sentence: every value under the noise floor)
    fixes the scale to the metric's own size, max(1, |baseline|), so rounding stays white; `quiet`
    (plots.quiet_reason: the model at chance) mutes the colours; both say so in the title.
    normalized=True shows each layer divided by its L2 norm instead, labelled so: it makes every
    layer's largest head bright, however small, so it is an option, not the default. `floor` (an ablation
    method's rounding_floor_<method>): cells within it are annotated "≈0", not a signed number (review 13a C3:
    "9.9e-06" read as a cost where float32 says removing the head helps), and the title says so."""
    ax = axes(ax, (6, 4))
    method = method or ("gradient" if "gradient" in set(data["method"]) else data["method"].iloc[0])
    column = "importance_layer_norm" if normalized else "importance"
    grid = data[data["method"] == method].pivot(index="layer", columns="head", values=column)  # [layer, head]
    loss = {"cosine": "in-batch contrastive loss", "accuracy": "answer log-probability"}.get(
        metric, _metric_label(metric))  # what the gate gradient differentiates
    unit = f"|dL/d gate|, L = {loss}" if method == "gradient" else f"drop in {_metric_label(metric)}"
    label = "importance / its layer's L2 norm (normalised view)" if normalized else unit
    values = grid.to_numpy(dtype=float)
    bound = symmetric_bound(values)
    if degenerate and not normalized:
        bound = max(bound, 1.0 if baseline is None else max(1.0, abs(float(baseline))))
    annotate = grid.size <= 96 and grid.shape[1] <= 8  # wider grids: numbers would collide
    scale = color_scale(values, bound=bound, quiet=bool(quiet or degenerate), is_signed=method != "gradient")
    rounding = (floor is not None and floor > 0 and not normalized and method != "gradient" and annotate
                and bool((abs(values) < floor).any()))
    annot: Any = annotate
    if rounding:  # [layer, head] labels: the value, or "≈0" within the rounding floor
        annot = [[("≈0" if abs(v) < floor else f"{v:.2g}") if v == v else "" for v in row] for row in values]
    sns.heatmap(grid, ax=ax, **scale, annot=annot, fmt="" if rounding else ".2g", annot_kws={"fontsize": "x-small"},
                cbar_kws={"label": label}, xticklabels=True, yticklabels=True)
    title = f"head importance: {METHOD_WORDS.get(method, method)}" + (" (normalised per layer)" if normalized else "")
    if rounding:
        title += f"\n(≈0: within the rounding floor {floor:.2g})"
    notes = []
    if degenerate:  # importance under the numerical floor: say so on the figure, not only in the finding
        notes.append(("UNDER THE FLOOR: the loss changes these gradients predict are under one rounding step, so no "
                      "head measurably matters by this method" if method == "gradient"  # review 15a B2
                      else "ROUNDING ONLY: no head measurably matters by this method")
                     + ("" if normalized else f" (scale fixed to the metric's size ±{bound:.3g})"))
    if quiet:
        notes.append(quiet)
    if notes:  # wrapped to the panel: two panels side by side must not run into each other (review 7 B4)
        lines = [line for note in notes for line in textwrap.wrap(note, 44)]
        ax.set_title("\n".join([title, *lines]), fontsize="medium", color="C3")
    else:
        ax.set_title(title)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    return ax


def importance_figure(data: pd.DataFrame, *, metric: str | None = None, baseline: float | None = None,
                      degenerate: Mapping[str, str] | None = None, quiet: str | None = None,
                      normalized: bool = False, floors: Mapping[str, float] | None = None) -> Any:
    """Figure-level: the gradient and the first ablation method (zero when present) side by side,
    each in its own units (different quantities: no shared scale); returns the Figure.
    `degenerate`: {method: sentence} for methods under the noise floor; `floors`: {method: rounding floor}."""
    methods = list(dict.fromkeys(data["method"]))
    shown = (["gradient"] if "gradient" in methods else []) + [m for m in ("zero", "mean", "resample") if m in methods][:1]
    shown = shown or methods[:2]
    fig, panels = plt.subplots(1, len(shown), figsize=(6 * len(shown), 4 + 0.4 * bool(quiet)), squeeze=False)
    for method, ax in zip(shown, panels[0]):
        plot_importance(data, method=method, metric=metric, baseline=baseline, degenerate=(degenerate or {}).get(method),
                        quiet=quiet, normalized=normalized, floor=(floors or {}).get(method), ax=ax)
    return fig


def plot_pruning_curve(data: pd.DataFrame, *, metric: str | None = None, baseline: float | None = None,
                       basis: Mapping[str, str] | None = None, tolerance: Mapping[str, Any] | None = None,
                       rounding: Collection[str] = (), ax: Any = None) -> Any:
    """Metric against the fraction of heads pruned (`data`: the curve table), one line per ordering
    (random: band over seeds), with the unpruned `baseline` and its tolerance floor (`tolerance`: the summary's
    pruning_tolerance, whose band a log-probability takes from the span from chance; without it 1% of |baseline|). `basis` (the
    summary's ordering_basis) names what each ordering ranks by in the legend. Where the
    table has ci_low / ci_high (the 95% t-interval of each point's change from the unpruned model,
    paired over examples, drawn around the point), the fixed orderings get that band in their
    colour, so a point whose band crosses the floor reads as uncertain. `rounding`: the orderings whose importance is
    rounding (the summary's degenerate_<ordering>; review 15c C2): drawn pale (MUTE towards white, as importance.png
    mutes that panel) and labelled by `pale_line`."""
    ax = axes(ax, (8, 4))
    curve = data.copy()
    basis = basis or {}
    curve["ordering "] = [o + (" recomputed" if r else "") + (f" ({basis[o]})" if o in basis else "")
                          for o, r in zip(curve["ordering"], curve["recompute"])]
    curve["ordering "] = curve["ordering "].map(_hidden_labels(curve))
    pale = curve["ordering"].isin(list(rounding))
    curve.loc[pale, "ordering "] = [f"{label}:\n{pale_line(o)}" for label, o in
                                    zip(curve.loc[pale, "ordering "], curve.loc[pale, "ordering"])]
    levels = list(dict.fromkeys(curve["ordering "]))
    palette = dict(zip(levels, sns.color_palette(n_colors=len(levels))))
    palette.update({lev: tuple(c * (1 - MUTE) + MUTE for c in palette[lev]) for lev in set(curve.loc[pale, "ordering "])})
    sns.lineplot(data=curve, x="fraction_pruned", y="metric", hue="ordering ", style="ordering ", markers=True,
                 dashes=True, errorbar=("pi", 100), palette=palette, ax=ax)  # a marker and dash per ordering
    banded = {"ci_low", "ci_high"} <= set(curve.columns)
    if banded:
        for level, group in curve[curve["ordering"] != "random"].groupby("ordering ", sort=False):
            group = group.sort_values("fraction_pruned")
            ax.fill_between(group["fraction_pruned"], group["ci_low"], group["ci_high"], color=palette[level],
                            alpha=0.12, linewidth=0)
    seeds = curve.loc[curve["ordering"] == "random", "seed"].nunique() if "seed" in curve.columns else None
    # review 18d C3: where the budget cut the random orders to 1 there is no range to speak of
    spread = {0: "", 1: "1 random order, no range"}.get(seeds, "random: range over seeds")
    said = [x for x in (spread, "shaded: 95% CI of the change from unpruned,\npaired over examples" if banded else "") if x]
    title = "iterative head pruning" + (" (" + ";\n".join(said) + ")" if said else "")
    return _finish(ax, metric, baseline, "fraction of heads pruned", title, tolerance)


ROUNDING_LINE = "rounding, not a measurement (pale)"  # an ordering by importance under the numerical floor
FLOOR_LINE = "predicted loss changes under the floor (pale)"  # gradients are measured; what they predict is not


def pale_line(ordering: str) -> str:
    """The legend's words for a pale ordering: a gradient's values are measured, only the loss changes they predict
    lie under the floor (review 15a B2); an ablation's values under the floor are rounding."""
    return FLOOR_LINE if ordering.split(" ")[0] == "gradient" else ROUNDING_LINE


def _hidden_labels(curve: pd.DataFrame) -> dict[str, str]:
    """{legend label: label to show}: a fixed ordering whose curve equals a later-drawn one's at every point (1e-6
    relative) lies exactly under it, so its label says "identical to <that one>, drawn under it" (review 12b B4: a
    legend entry with no visible line)."""
    fixed = curve[curve["ordering"] != "random"]
    series = {lab: g.sort_values("fraction_pruned")[["fraction_pruned", "metric"]].to_numpy(dtype=float)
              for lab, g in fixed.groupby("ordering ", sort=False)}
    labels = list(series)
    out = {lab: lab for lab in curve["ordering "]}
    for i, lab in enumerate(labels):
        over = next((other for other in labels[i + 1:] if series[other].shape == series[lab].shape
                     and np.allclose(series[other], series[lab], rtol=1e-6, atol=1e-12)), None)
        if over is not None:
            out[lab] = f"{lab}:\nidentical to {over.split(' (')[0]}, drawn under it"
    return out


ZOOM = 5  # the zoom panel spans the unpruned value +- this many tolerance bands: the floor sits a tenth of its height below
# metrics bounded above: no zoom past what they can take (review 11b N4: a log-probability's zoom reached +0.76)
MAXIMUM = {"cosine": 1.0, "accuracy": 1.0, "probability": 1.0, "logprob": 0.0}
BOUNDED_NAMES = {"logprob": "log-probability"}  # the metric's name where its key is not a word
NEAR_MAXIMUM = 0.06  # a maximum closer above unpruned than this share of the zoom's height shares its tick label


def floor_band(baseline: float, tolerance: Mapping[str, Any] | None) -> tuple[float, str]:
    """(the band below `baseline` a point may fall and still count, its name on the figure): the summary's
    pruning_tolerance (pruning.tolerance_record) where it applies to this baseline, else 1% of |baseline|."""
    rec = tolerance if isinstance(tolerance, Mapping) else {}
    band, share = rec.get("band"), rec.get("tolerance")
    if rec.get("basis") == "span" and isinstance(band, (int, float)) and isinstance(rec.get("chance"), (int, float)):
        return float(band), (f"{100 * float(share or 0.01):g}% of the span from chance ({float(rec['chance']):.3g}) "
                             f"to unpruned: {float(band):.3g}")
    share = float(share) if isinstance(share, (int, float)) else 0.01
    return share * abs(float(baseline)), f"{100 * share:g}%"


def pruning_figure(data: pd.DataFrame, *, metric: str | None = None, baseline: float | None = None,
                   basis: Mapping[str, str] | None = None, tolerance: Mapping[str, Any] | None = None,
                   rounding: Collection[str] = ()) -> Any:
    """Figure-level: the whole pruning curve (plot_pruning_curve) and, beside it, the same curves zoomed on
    the unpruned value +- ZOOM tolerance bands, where the unpruned line and its floor, one band below (the one-sided
    threshold behind the finding's count; below it shaded), are a tenth of the panel's height apart whatever the
    full curve's range (review 7 B2: on a -7..12.5 axis they were a pixel apart; review 11b B1: a band of 1% of a
    log-probability of -0.006 zoomed on rounding, so a log-probability's band is 1% of the span from chance).
    Without a nonzero band there is no floor to zoom on: the full panel alone. Returns the Figure."""
    finite = baseline is not None and math.isfinite(float(baseline))
    band, name = floor_band(float(baseline), tolerance) if finite else (0.0, "")
    if not band:
        return plot_pruning_curve(data, metric=metric, baseline=baseline, basis=basis, tolerance=tolerance,
                                  rounding=rounding, ax=axes(None, (8, 4))).figure
    fig, (full, near) = plt.subplots(1, 2, figsize=(14, 4.8), gridspec_kw={"width_ratios": [1, 1]})
    plot_pruning_curve(data, metric=metric, baseline=baseline, basis=basis, tolerance=tolerance, rounding=rounding,
                       ax=full)
    full.get_legend().remove()  # one legend, right of the zoom panel
    plot_pruning_curve(data, metric=metric, baseline=baseline, basis=basis, tolerance=tolerance, rounding=rounding,
                       ax=near)
    b = float(baseline)
    half, floor = ZOOM * band, b - band
    # review 12a B2: each tick one number (what a line means is said once, in the title), so the long two-part labels
    # ("-0.49: -0.5125") no longer squeeze the panel to a tenth of the figure
    ticks = {b - half: f"{b - half:.4g}", floor: f"{floor:.4g}", b: f"{b:.4g}"}
    if name.endswith("%"):  # a share of |unpruned|: said as shares
        pct = ZOOM * float(name[:-1])
        reach = f"unpruned ± {pct:g}%"
        floor_said = f"{name} below unpruned"
    else:  # the span's band, in the metric's units
        reach = f"unpruned ± {half:.3g}"
        floor_said = f"{band:.3g} below unpruned ({name.split(':')[0]})"
    cap, top = MAXIMUM.get(str(metric)), b + half
    if cap is not None and top > cap:  # a cosine cannot exceed 1, a log-probability 0: the panel stops there
        height = cap - (b - half)
        top = cap + 0.03 * height  # a margin keeps points at the maximum whole
        reach = (f"from {half:.3g} below unpruned ({b - half:.4g})\nup to {cap:g}, "
                 f"the {BOUNDED_NAMES.get(str(metric), metric)}'s maximum")
        if cap - b > NEAR_MAXIMUM * height:
            ticks[cap] = f"{cap:g} (maximum)"
        else:  # two labels a few points apart would overprint: one says both
            ticks[b] += " (maximum)" if cap - b <= 1e-9 else f" (max. {cap:g} above)"
    else:
        ticks[b + half] = f"{b + half:.4g}"
    title = (f"zoom on the floor: unpruned {b:.4g}, floor {floor:.4g}\n= {floor_said};\n"
             f"y {reach};\npoints beyond leave the panel")
    near.set_yticks(list(ticks), list(ticks.values()))
    near.set_ylim(b - half, top)  # after the ticks: set_yticks may widen the limits
    near.set_title(title, fontsize=9)  # four or five lines
    near.set_ylabel("")
    fig.tight_layout()
    fit_title(near)  # wrapped to the panel's width
    return fig


EXCLUDED = "excluded: more than {} below unpruned\n(one-sided rule: at or above the floor counts)"


def _finish(ax: Any, metric: str | None, baseline: float | None, xlabel: str, title: str,
            tolerance: Mapping[str, Any] | None = None) -> Any:
    """Unpruned baseline (grey dashed) and its floor (floor_band: -1%, or a log-probability's band) in black,
    the region below the floor shaded: the rule behind the finding's count is one-sided (a point counts when it
    is no more than the band below unpruned, however far above; review 8 B2: a strip on both sides of unpruned
    read as two-sided), and the floor stays visible where it nearly coincides with the baseline on a wide axis
    (review 6); labels, legend and title."""
    if baseline is not None:
        band, name = floor_band(baseline, tolerance)
        floor = baseline - band
        ax.axhline(baseline, color="grey", linestyle="--", linewidth=1, label="unpruned")
        relative = name.endswith("%")
        ax.axhline(floor, color="black", linestyle=":", linewidth=1.2,
                   label=f"-{name} floor" if relative else f"floor: {band:.3g} below unpruned")
        lo, hi = ax.get_ylim()  # the data's, both lines included
        depth = 1e3 * max(hi - lo, abs(baseline), 1.0)  # down past any later zoom's bottom
        ax.axhspan(floor - depth, floor, color="0.6", alpha=0.25, linewidth=0, zorder=0,
                   label=EXCLUDED.format(name if relative else f"{band:.3g}"))
        ax.set_ylim(lo, hi)  # the span reaches far below: the limits stay the data's
    ax.set_xlabel(xlabel)
    ax.set_ylabel(_metric_label(metric))
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_title(title)
    return ax


BEST_HEAD_KINDS = {"change": "most important head", "oracle_change": "best single head",
                   "layer_removed_change": "no head"}  # column -> legend label


def plot_best_head(data: pd.DataFrame, *, metric: str | None = None, ax: Any = None) -> Any:
    """Per layer (`data`: the best_head table): metric change keeping only the most important head,
    the oracle best single head, or none, as grouped bars. Where the table has <change>_se and
    n_examples (pruning.best_head_per_layer), each bar carries its 95% t-interval (t(n-1) x se, the
    change paired over examples) and the title says n; older tables say that no interval is recorded."""
    ax = axes(ax, (8, 4))
    layers = list(data["layer"])
    width = 0.8 / len(BEST_HEAD_KINDS)
    n = data["n_examples"].iloc[0] if "n_examples" in data.columns and len(data) else None
    t = t_quantile(int(n)) if n is not None else float("nan")
    banded = all(f"{c}_se" in data.columns for c in BEST_HEAD_KINDS) and math.isfinite(t)
    scale = float(np.nanmax(np.abs(data[list(BEST_HEAD_KINDS)].to_numpy(dtype=float)), initial=0.0))
    flat = False
    for i, (column, label) in enumerate(BEST_HEAD_KINDS.items()):
        x = [j + (i - (len(BEST_HEAD_KINDS) - 1) / 2) * width for j in range(len(layers))]
        err = (t * data[f"{column}_se"]).to_numpy(dtype=float) if banded else None
        ax.bar(x, data[column], width, yerr=err, capsize=3 if banded else 0, label=label, color=f"C{i}",
               error_kw={"elinewidth": 1, "ecolor": "black"})
        values = data[column].to_numpy(dtype=float)  # [layer]
        short = np.abs(values) <= 0.005 * scale  # a bar under half a percent of the axis is no bar to the eye (NaN: none)
        if short.any():  # a diamond at 0 tells such a bar from a missing one
            ax.plot(np.asarray(x)[short], np.zeros(int(short.sum())), ls="none", marker="D", markersize=6,
                    color=f"C{i}", markeredgecolor="black", zorder=3, clip_on=False)  # whole where 0 is the axis's edge
            flat = True
    if flat:
        ax.plot([], [], ls="none", marker="D", color="white", markeredgecolor="black",
                label="change near 0\n(bar too short to see)")
    ax.set_xticks(range(len(layers)), [str(x) for x in layers])
    ax.set_xlabel("layer")
    ax.axhline(0, color="grey", linewidth=1)
    ax.set_ylabel(f"change in {_metric_label(metric)}")
    if banded:
        title = (f"keep one head in one layer (n = {int(n)} examples;\n"
                 "error bars: 95% t-interval of the change, paired over examples)")
    else:
        title = "keep one head in one layer" + (f" (n = {int(n)} examples; no interval recorded)" if n is not None
                                                 else " (no interval recorded)")
    ax.set_title(title)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1), title="kept")
    return ax


def plot_l0(data: pd.DataFrame, *, metric: str | None = None, baseline: float | None = None,
            tolerance: Mapping[str, Any] | None = None, ax: Any = None) -> Any:
    """Heads kept against the metric over the lambda sweep (`data`: the l0 table; Voita et al.'s L0 gates)."""
    ax = axes(ax, (8, 4))
    sweep = data.sort_values("heads_kept")
    n = int(sweep["n_examples"].iloc[0]) if "n_examples" in sweep.columns and len(sweep) else None
    # a hollow circle under a cross drawn on top: on one point (a one-lambda sweep, or equal metrics) both stay visible
    line, = ax.plot(sweep["heads_kept"], sweep["metric_binary"], marker="o", markersize=11, markerfacecolor="none",
                    markeredgewidth=1.5, label="kept heads only", zorder=2)
    if {"change", "change_ci_low", "change_ci_high"} <= set(sweep.columns):  # review 12b C1: each point's interval
        below = (sweep["change"] - sweep["change_ci_low"]).to_numpy(dtype=float)
        above = (sweep["change_ci_high"] - sweep["change"]).to_numpy(dtype=float)
        ax.errorbar(sweep["heads_kept"], sweep["metric_binary"], yerr=[below, above], fmt="none",
                    ecolor=line.get_color(), elinewidth=1, capsize=3, zorder=1)
    gates, = ax.plot(sweep["heads_kept"], sweep["metric"], marker="x", markersize=7, markeredgewidth=1.5, linestyle="--",
                     label="test-time gates", zorder=3)
    if set(GATES_CI) <= set(sweep.columns):  # review 17a C4: the gates' point carries its paired interval too
        change, low, high = (sweep[c].to_numpy(dtype=float) for c in GATES_CI)
        ax.errorbar(sweep["heads_kept"], sweep["metric"], yerr=[change - low, high - change], fmt="none",
                    ecolor=gates.get_color(), elinewidth=1, capsize=3, zorder=1)
    kept = sorted({int(k) for k in sweep["heads_kept"]})
    if len(kept) <= 12:  # a count of heads: whole-number ticks at the counts reached (and room around one point)
        ax.set_xticks(kept)
        if len(kept) == 1:
            ax.set_xlim(kept[0] - 1, kept[0] + 1)
    else:
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    points: dict[tuple[float, float], list[float]] = {}  # lambdas that land on one point share one label
    for lam, kept, value in zip(sweep["lambda"], sweep["heads_kept"], sweep["metric_binary"]):
        points.setdefault((float(kept), round(float(value), 4)), []).append(float(lam))
    x0, x1 = ax.get_xlim()
    labels = []
    for (kept, value), lams in sorted(points.items()):
        # review 12b B3: a label of the right half reads leftwards and above, off the legend; one of the left half
        # rightwards and below, so neighbours from either half sit on opposite sides of their points
        right = kept > (x0 + x1) / 2
        labels.append(ax.annotate("λ=" + ", ".join(f"{v:g}" for v in lams), (kept, value), textcoords="offset points",
                                  xytext=(-6 if right else 6, 8 if right else -12), ha="right" if right else "left",
                                  fontsize="x-small", annotation_clip=True))
    ax.margins(y=0.12)  # room for the labels above the top point and below the lowest
    _finish(ax, metric, baseline, "heads kept", "L0 head pruning" + _l0_sample(sweep, n), tolerance)
    inside = _coinciding(ax, sweep, line.get_markersize())
    notes = ["(the x inside the circle at " + "; ".join(inside) + ")"] if inside else []
    hidden = _hidden_bars(ax, sweep, {"kept heads only": line.get_markersize(), "gates": gates.get_markersize()})
    if hidden:  # review 17a C4: a bar shorter than its marker (or 0 wide) is no bar to the eye; the legend says so
        notes.append("(bars hidden by their marker, 95% CI of the change from unpruned: " + "; ".join(hidden) + ")")
    if notes:  # review 14av C3: a cross inside the circle reads as one point; the legend says where and the values
        from matplotlib.lines import Line2D

        handles, names = ax.get_legend_handles_labels()
        at = handles.index(gates) + 1
        lines = [Line2D([], [], linestyle="none") for _ in notes]  # legend lines of words under the gates' key
        ax.legend(handles[:at] + lines + handles[at:],
                  names[:at] + ["\n".join(textwrap.wrap(n, 36)) for n in notes] + names[at:],
                  fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    _stack_labels(ax, labels)
    return ax


def _coinciding(ax: Any, sweep: pd.DataFrame, size: float, most: int = 3) -> list[str]:
    """The sweep's points where the test-time gates' metric lies within the kept-heads circle (`size`: its diameter
    in points) at the axes' current limits and height: "18 heads, -1.6768 vs -1.6787" (gates, then kept heads only),
    at most `most`, then a count."""
    lo, hi = ax.get_ylim()
    tall = ax.figure.get_figheight() * 72 * ax.get_position().height  # the axes' height in points
    if hi <= lo or tall <= 0:
        return []
    said = [f"{int(k)} heads, {g:.5g} vs {b:.5g}" for k, g, b in zip(sweep["heads_kept"], sweep["metric"],
                                                                      sweep["metric_binary"])
            if abs(float(g) - float(b)) / (hi - lo) * tall < size / 2]
    return said[:most] + ([f"{len(said) - most} more"] if len(said) > most else [])


GATES_CI = ("gates_change", "gates_change_ci_low", "gates_change_ci_high")  # the test-time gates' change and interval
KEPT_CI = ("change", "change_ci_low", "change_ci_high")  # the kept heads'


def _hidden_bars(ax: Any, sweep: pd.DataFrame, sizes: Mapping[str, float], most: int = 3) -> list[str]:
    """Review 17a C4: the title says "bars: 95% CI", but a bar whose reach either side of its point is under its marker's
    radius (`sizes`: each kind's marker diameter in points), at the axes' current limits and height, is hidden by it;
    each such point in words, "18 heads: kept heads only 0 wide (every head kept: the unpruned model itself), gates
    -0.0098 [-0.013, -0.0066]", or "no interval (under 2 examples)", at most `most` head counts, then a count."""
    lo, hi = ax.get_ylim()
    tall = ax.figure.get_figheight() * 72 * ax.get_position().height  # the axes' height in points
    if hi <= lo or tall <= 0:
        return []
    said = []
    for _, row in sweep.iterrows():
        parts = []
        for name, columns in (("kept heads only", KEPT_CI), ("gates", GATES_CI)):
            if not set(columns) <= set(sweep.columns):
                continue
            change, low, high = (float(row[c]) for c in columns)
            if not (np.isfinite(low) and np.isfinite(high)):
                parts.append(f"{name} no interval (under 2 examples)")
            elif max(change - low, high - change) / (hi - lo) * tall < sizes[name] / 2:
                whole = name == "kept heads only" and float(row.get("fraction_kept", 0.0)) == 1.0 and low == high
                parts.append(f"{name} 0 wide (every head kept: the unpruned model itself)" if whole
                             else f"{name} {change:+.2g} [{low:+.2g}, {high:+.2g}]")
        if parts:
            said.append(f"{int(row['heads_kept'])} heads: " + ", ".join(parts))
    return said[:most] + ([f"{len(said) - most} more"] if len(said) > most else [])


def _stack_labels(ax: Any, labels: list[Any]) -> None:
    """Labels of points at one head count closer than a label's height would print over each other (review 13c
    B1: lambda=0.1 at 22.03 and lambda=0.03 at 21.92, 12 heads): each is moved away from its point's side (above
    for a label above its point, below for one below) until it clears the previous one, in the axes' final
    limits (a label's height as points of the figure; 1.6 x the font size leaves room for a tighter layout)."""
    lo, hi = ax.get_ylim()
    tall = ax.figure.get_figheight() * 72 * ax.get_position().height  # the axes' height in points
    if hi <= lo or tall <= 0:
        return
    by_x: dict[float, list[Any]] = {}
    for text in labels:
        by_x.setdefault(float(text.xy[0]), []).append(text)
    for group in by_x.values():
        up = [t for t in group if t.xyann[1] > 0]  # labels above their points: stacked upwards from the lowest
        down = [t for t in group if t.xyann[1] <= 0]  # below theirs: stacked downwards from the highest
        for side, sign in ((up, 1.0), (down, -1.0)):
            side.sort(key=lambda t: sign * float(t.xy[1]))
            last = None
            for text in side:
                gap = 1.6 * text.get_fontsize()  # points
                at = (float(text.xy[1]) - lo) / (hi - lo) * tall + text.xyann[1]  # the label's baseline, in points
                if last is not None and sign * (at - last) < gap:
                    text.xyann = (text.xyann[0], text.xyann[1] + sign * gap - (at - last))
                    at = last + sign * gap
                last = at


def _l0_sample(sweep: pd.DataFrame, n: int | None) -> str:
    """The L0 title's sample: " on 8 held-out examples (gates fitted on 8 others; bars: 95% CI)" (one line, which
    even_title wraps evenly), or in-sample with its reason where the table gives one (#34 item 2), "" without n."""
    if n is None:
        return ""
    split = str(sweep["split"].iloc[0]) if "split" in sweep.columns else "in_sample"
    if split == "held_out":
        return f" on {n} held-out examples (gates fitted on {int(sweep['n_train'].iloc[0])} others; bars: 95% CI)"
    why = str(sweep["in_sample_reason"].iloc[0]) if "in_sample_reason" in sweep.columns else ""
    why = why if why and why != "nan" else ""
    return f" (bars: 95% CI over {n} examples, in-sample" + (f":\n{why})" if why else ")")


def even_title(ax: Any, room: float = 1.0) -> bool:
    """Review 18v C2 (l0.png: "examples" and "CI)" alone on their lines): each line of `ax`'s title wider than `room` of
    the axes, at the figure's layout, wrapped into as few lines as plots.wrap_to_width needs, of even length and
    never at a hyphen ("held-out"); plots.fit_title, run again on the report's figures, then finds every line within
    the axes. Returns whether the title changed."""
    fig, title = ax.figure, ax.title
    fig.draw_without_rendering()
    renderer = fig.canvas.get_renderer()
    width = room * ax.get_window_extent(renderer).width

    def wide(line: str) -> float:
        return renderer.get_text_width_height_descent(line, title.get_fontproperties(), ismath=False)[0]

    def even(line: str) -> list[str]:
        parts = wrap_to_width(line, wide, width, break_on_hyphens=False)
        for chars in range(-(-len(line) // len(parts)), len(line) + 1):  # the shortest lines that keep that many
            lines = textwrap.wrap(line, chars, break_on_hyphens=False, break_long_words=False)
            if len(lines) <= len(parts) and max(map(wide, lines)) <= width:
                return lines
        return parts

    text = "\n".join(part for line in title.get_text().split("\n") for part in even(line))
    if text == title.get_text():
        return False
    title.set_text(text)
    fig.tight_layout()
    return True


def _scored_baseline(sweep: pd.DataFrame, baseline: float | None) -> float | None:
    """The unpruned metric of the examples the L0 sweep scored (its held-out ones), else the run's baseline."""
    if "unpruned" in sweep.columns and len(sweep) and np.isfinite(float(sweep["unpruned"].iloc[0])):
        return float(sweep["unpruned"].iloc[0])
    return baseline


ROW_INCHES = 0.22  # height of one head's row in the roles map: its 9-point label fits without overlap
LABEL_INCHES = 0.17  # height a tick label needs


def plot_roles(data: pd.DataFrame, *, ax: Any = None) -> Any:
    """Heat map head x role score (`data`: the roles table; positional share, sink, previous-token,
    induction, confidence = mean maximum attention weight) on the sequential map from 0 (plots.color_scale), but
    induction, the signed excess over its control, on the diverging map from -1 to 1 with a colour bar of its own.
    A new figure is sized by the number of heads (ROW_INCHES a row, plus room for the role labels),
    capped at 40 inches; past that every k-th head is labelled, so labels never overlap."""
    rows = len(data)
    two_bars = "induction" in data.columns
    ax = axes(ax, (7 if two_bars else 6, min(40.0, max(3.0, ROW_INCHES * rows + 2.5))))
    grid = data.assign(name=[f"L{l}H{h}" for l, h in zip(data["layer"], data["head"])]).set_index("name")
    scores = [c for c in ROLE_SCORES if c in grid.columns]
    shown = grid[scores].rename(columns=lambda c: {"confidence": "confidence\n(max weight)"}.get(c, c.replace("_", "-")))
    height = 0.75 * ax.get_position().height * ax.figure.get_figheight()  # inches the rows keep after tight_layout
    every = max(1, math.ceil(rows * LABEL_INCHES / max(height, 0.1)))  # label every k-th head when they would overlap
    signed = (shown.columns == "induction")[None, :].repeat(rows, 0)  # [heads, roles] the one signed column
    # the induction bar, drawn second, takes its room from the map's side of the first bar: the first bar's pad leaves
    # room for the second's ticks and label
    sns.heatmap(shown, mask=signed, ax=ax, **color_scale(bound=1.0, is_signed=False),
                cbar_kws={"label": "role score (0-1)", "pad": 0.1 if signed.any() else 0.05}, yticklabels=every)
    if signed.any():  # review 18a C2: induction is an excess over its control, -1 to 1: diverging, centred on 0
        sns.heatmap(shown, mask=~signed, ax=ax, **color_scale(bound=1.0, is_signed=True),
                    cbar_kws={"label": "induction: repeat - control\n(-1 to 1)", "pad": 0.04}, yticklabels=every)
    ax.tick_params(axis="y", rotation=0)
    ax.set_ylabel("head (L layer H head)")
    ax.set_xlabel("role")
    ax.set_title("head roles")
    unreachable = shown.isna().to_numpy()  # [heads, roles] a score the sliding window hides (review 9a A2)
    hatch_cells(ax, unreachable)
    lines = ["head roles"]
    if unreachable.any():
        lines[0] += " (hatched grey: not measurable, the sliding window hides the probe's key)"
    slid = _window_note(data)
    if slid:
        lines.append(slid)
    if len(lines) > 1 or unreachable.any():
        ax.set_title("\n".join(lines), fontsize=9)
    return ax


def _window_note(data: pd.DataFrame) -> str:
    """The roles figure's line on sliding-window layers (review 11b B4): their queries see at most `window`
    keys, so a uniform head's max weight there is at least 1/window against 1/(q + 1) on a global layer:
    confidence and positional share compare within layers of one kind. "" when no layer slides."""
    if "window" not in data.columns:
        return ""
    windows = data.dropna(subset=["window"]).drop_duplicates("layer")
    if windows.empty:
        return ""
    from headscope.reports.findings import int_ranges

    sizes = sorted({int(w) for w in windows["window"]})
    which = f"layer{'s' if len(windows) > 1 else ''} {int_ranges(sorted(int(l) for l in windows['layer']))}"
    over = f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
    verb = "slide" if len(windows) > 1 else "slides"
    return (f"{which} {verb} over {over} keys (uniform max weight >= 1/{sizes[0]}): compare confidence\n"
            "and positional within sliding or within global layers")


def figures(result: Any, **kwargs: Any) -> dict[str, Any]:
    """Every figure the Result has data for: importance, pruning_curve, best_head, l0, roles."""
    s, tables, out = result.summary, result.tables, {}
    metric, baseline = s.get("metric"), s.get("baseline_metric")
    if "method" in result.df.columns:
        degenerate = {m: s[f"degenerate_{m}"] for m in set(result.df["method"]) if s.get(f"degenerate_{m}")}
        floors = {m: float(s[f"rounding_floor_{m}"]) for m in set(result.df["method"])
                  if isinstance(s.get(f"rounding_floor_{m}"), (int, float))}
        out["importance"] = importance_figure(result.df, metric=metric, baseline=baseline, degenerate=degenerate,
                                              quiet=quiet_reason(s), floors=floors)
        out["importance"].tight_layout()
    curve = _curve(result)
    quiet = quiet_reason(s)  # at chance: the curves and bars muted and marked as the importance map is (review 14a B1)
    degenerate = {m for m in ("gradient", "zero", "mean", "resample") if s.get(f"degenerate_{m}")}  # pale, as importance.png
    rounded = {"gradient"} & degenerate | ({"ablation"} if degenerate - {"gradient"} else set())  # mutes its panel
    draw = {
        "pruning_curve": (curve is not None, lambda: pruning_figure(curve, metric=metric, baseline=baseline,
                                                                    basis=s.get("ordering_basis"),
                                                                    tolerance=s.get("pruning_tolerance"),
                                                                    rounding=rounded).axes[0]),
        "best_head": ("best_head" in tables, lambda: plot_best_head(tables["best_head"], metric=metric)),
        "l0": ("l0" in tables, lambda: plot_l0(tables["l0"], metric=metric, baseline=_scored_baseline(tables["l0"], baseline),
                                               tolerance=s.get("pruning_tolerance"))),
        "roles": ("roles" in tables, lambda: plot_roles(tables["roles"])),
    }
    for stem, (available, fn) in draw.items():
        if available:
            ax = fn()
            # review 17c B3: role scores are attention statistics on the prompts and random tokens, which the finding
            # reports at chance too; not muted as noise of the task
            mute_drawn(ax, None if stem == "roles" else quiet)
            for other in ax.figure.axes[1:]:  # the pruning curve's zoom beside the whole curve: muted too
                mute_drawn(other, quiet, say=False)
            out[stem] = laid_out(ax)
            if stem == "l0":
                even_title(ax)
    return out


# Presentation (reports/families.py): the guide, the captions and the finding in words.

GUIDE = (  # how to read this section of the report
    "Which attention heads matter. Importance is Michel et al.'s |dL/d gate| (all heads in one "
    "backward pass) next to the metric drop when a head alone is ablated. The pruning curve removes "
    "the least important heads 10% at a time: a flat start then a cliff means many heads are "
    "redundant; compare the orderings with the random band. Role scores label positional, "
    "previous-token, induction and sink heads."
)
CAPTIONS = {  # what to read from each figure and its units, by figure stem
    "importance": "Head importance, layer x head, both methods in their own units: |dL/d gate| (gradient) and the drop in "
                  "the task metric when the head alone is zero-ablated (below 0, blue: removing the head helps); red is "
                  "positive, white 0. A panel marked rounding only has no head above the numerical floor; an ablation "
                  "cell reading ≈0 lies within the rounding floor, its sign not measured.",
    "pruning_curve": "Metric (y, the task's metric) as heads are removed least-important first (x, fraction of all heads), "
                     "each ordering with its own marker and dash, shaded with the 95% interval of each point's change from the "
                     "unpruned model (paired over examples). "
                     "Read where each falls below the dotted black floor, 1% below unpruned (the grey dashed line; for an "
                     "answer log-probability, whose 0 is its ceiling, 1% of the span from chance to unpruned); the rule "
                     "is one-sided: a point at or above the floor counts however far above unpruned, and the region below "
                     "the floor is shaded grey. The random band spans the seeds (the title says when there is one random "
                     "order: no band). Left, the whole curve; right, the same "
                     "curves zoomed on the unpruned value ± 5 times that band (up to the metric's maximum: 1 for a cosine, "
                     "0 for a log-probability), "
                     "where the floor (the threshold behind the finding's count) stays visible however far the curve "
                     "falls. The legend names "
                     "what each ordering ranks by: by default the gradient ordering divides |dL/d gate| by its layer's L2 "
                     "norm (Michel et al.), so its order can differ from the raw values of the importance figure. The "
                     "finding's count is the heads removed before a curve first falls below the floor (a curve may come back "
                     "above it later), its interval a bootstrap over examples along the order drawn here. An ordering whose "
                     "curve equals another's at every point is drawn exactly under it; its legend entry says which.",
    "best_head": "Per layer, metric change from the unpruned model (task metric units) keeping only one head: the most "
                 "important, the best single head found by trying all, or none. Near 0 means one head does the layer's job. "
                 "Error bars: the 95% t-interval of each change over the examples (n in the title), paired with each "
                 "example's unpruned metric; the best single head is chosen on those same examples, so its bar is "
                 "optimistic. A diamond at 0 marks a bar too short to see (a change near 0), so it reads apart from "
                 "a missing one.",
    "l0": "Heads kept (x) against the metric (y) across the L0 penalty sweep; each point is labelled with its lambda "
          "(lambdas that land on one point share a label), measured on held-out examples: the gates are fitted on a "
          "random part of the task's examples and scored on the others (the title gives both counts; a task under "
          "16 examples is fitted and scored in-sample, and the title says so). Error bars: the 95% t-interval of the "
          "kept heads' change from unpruned, paired over the scored examples; the dashed line is the unpruned metric "
          "of those examples. l0.csv also gives each point's change on the training examples (in-sample, "
          "flattering); the finding's point (the fewest heads within tolerance) is chosen on those training examples "
          "and reported with its held-out change.",
    "roles": "Role scores per head (0-1), induction signed (-1 to 1): positional share, sink mass, previous-token, induction "
             "and confidence (the mean maximum attention weight). Induction is the attention to the token after an earlier "
             "occurrence on repeated random tokens minus the same offset's attention on random tokens without a repeat (a "
             "fixed-offset head scores 0; signed, on its own blue-white-red scale centred on 0: blue, below 0, is less "
             "attention to that offset with a repeat than without); a decoder's layer-0 head is never labelled induction "
             "(no earlier layer to compose with). On sliding-window layers sink averages over the queries that can "
             "see the first token, a hatched grey cell is a score the window makes unmeasurable, and confidence and "
             "positional share are over the window's keys only, so they compare within layers of one kind.",
}
ALIBI_ROLES = (" On ALiBi positions each head adds a fixed -slope x distance to its scores, so a head's positional, "
               "self or previous-token preference is partly set by its slope (a steep slope favours near keys), not "
               "only learned.")


def caption_for(stem: str, summary: Mapping[str, Any] | None) -> str | None:
    """The roles caption on an ALiBi model (summary positions "alibi"): its fixed slopes set part of a head's
    positional preference; None otherwise (CAPTIONS' then holds)."""
    if stem == "roles" and isinstance(summary, Mapping) and summary.get("positions") == "alibi":
        return CAPTIONS["roles"] + ALIBI_ROLES
    return None
