"""Figures of the `heads` analysis: importance heat map, pruning curves, best head per layer,
the L0 trade-off and head-role scores.

reports/plots.py's convention: `plot_<what>(data, *, ax=None, ...) -> Axes` over one of the Result's
tidy tables, summary values by keyword; `importance_figure` (two panels) returns the Figure;
`pruning_figure` (the whole curve and a zoom on the 1% band) returns the Figure;
`figures(result)` gives every figure the Result has data for, by file stem.

This module is the family's whole presentation (reports/families.py): after the figures, `GUIDE`
(how to read its section), `CAPTIONS` (each figure's, by stem) and `finding(summary)`, its headline.
"""
from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from headscope.analyses.core.chance import clear_of, t_quantile
from headscope.reports.findings import _at_chance, _chance, _num, _pct, _words
from headscope.reports.plots import axes, color_scale, laid_out, quiet_reason, symmetric_bound

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
                    normalized: bool = False, ax: Any = None) -> Any:
    """Heat map layer x head of one method's importance (`data`: the heads Result's df) in its own
    units: ablation effects, signed (below 0, removing the head helps), on a diverging map centred
    on 0 even when every value is >= 0; the gradient's |dL/d gate|, unsigned, on a sequential map from 0.
    `degenerate` (the summary's degenerate_<method> sentence: every value under the noise floor)
    fixes the scale to the metric's own size, max(1, |baseline|), so rounding stays white; `quiet`
    (plots.quiet_reason: the model at chance) mutes the colours; both say so in the title.
    normalized=True shows each layer divided by its L2 norm instead, labelled so: it makes every
    layer's largest head bright, however small, so it is an option, not the default."""
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
    sns.heatmap(grid, ax=ax, **scale, annot=annotate, fmt=".2g", annot_kws={"fontsize": "x-small"},
                cbar_kws={"label": label}, xticklabels=True, yticklabels=True)
    title = f"head importance: {METHOD_WORDS.get(method, method)}" + (" (normalised per layer)" if normalized else "")
    notes = []
    if degenerate:  # importance under the numerical floor: say so on the figure, not only in the finding
        notes.append("ROUNDING ONLY: no head measurably matters by this method"
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
                      normalized: bool = False) -> Any:
    """Figure-level: the gradient and the first ablation method (zero when present) side by side,
    each in its own units (different quantities: no shared scale); returns the Figure.
    `degenerate`: {method: sentence} for methods under the noise floor."""
    methods = list(dict.fromkeys(data["method"]))
    shown = (["gradient"] if "gradient" in methods else []) + [m for m in ("zero", "mean", "resample") if m in methods][:1]
    shown = shown or methods[:2]
    fig, panels = plt.subplots(1, len(shown), figsize=(6 * len(shown), 4 + 0.4 * bool(quiet)), squeeze=False)
    for method, ax in zip(shown, panels[0]):
        plot_importance(data, method=method, metric=metric, baseline=baseline, degenerate=(degenerate or {}).get(method),
                        quiet=quiet, normalized=normalized, ax=ax)
    return fig


def plot_pruning_curve(data: pd.DataFrame, *, metric: str | None = None, baseline: float | None = None,
                       basis: Mapping[str, str] | None = None, ax: Any = None) -> Any:
    """Metric against the fraction of heads pruned (`data`: the curve table), one line per ordering
    (random: band over seeds), with the unpruned `baseline` and its 1% tolerance floor. `basis` (the
    summary's ordering_basis) names what each ordering ranks by in the legend. Where the
    table has ci_low / ci_high (the 95% t-interval of each point's change from the unpruned model,
    paired over examples, drawn around the point), the fixed orderings get that band in their
    colour, so a point whose band crosses the floor reads as uncertain."""
    ax = axes(ax, (8, 4))
    curve = data.copy()
    basis = basis or {}
    curve["ordering "] = [o + (" recomputed" if r else "") + (f" ({basis[o]})" if o in basis else "")
                          for o, r in zip(curve["ordering"], curve["recompute"])]
    levels = list(dict.fromkeys(curve["ordering "]))
    palette = dict(zip(levels, sns.color_palette(n_colors=len(levels))))
    sns.lineplot(data=curve, x="fraction_pruned", y="metric", hue="ordering ", style="ordering ", markers=True,
                 dashes=True, errorbar=("pi", 100), palette=palette, ax=ax)  # a marker and dash per ordering
    banded = {"ci_low", "ci_high"} <= set(curve.columns)
    if banded:
        for level, group in curve[curve["ordering"] != "random"].groupby("ordering ", sort=False):
            group = group.sort_values("fraction_pruned")
            ax.fill_between(group["fraction_pruned"], group["ci_low"], group["ci_high"], color=palette[level],
                            alpha=0.12, linewidth=0)
    band = ";\nshaded: 95% CI of the change from unpruned,\npaired over examples)"
    title = "iterative head pruning (random: range over seeds" + (band if banded else ")")
    return _finish(ax, metric, baseline, "fraction of heads pruned", title)


ZOOM = 0.05  # the zoom panel spans the unpruned value +- this share of it: the 1% floor sits a tenth of its height below


def pruning_figure(data: pd.DataFrame, *, metric: str | None = None, baseline: float | None = None,
                   basis: Mapping[str, str] | None = None) -> Any:
    """Figure-level: the whole pruning curve (plot_pruning_curve) and, beside it, the same curves zoomed on
    the unpruned value +- ZOOM of it, where the band within 1% of unpruned and its floor, 1% below (the
    threshold behind the finding's count), are a fifth and a tenth of the panel's height whatever the
    full curve's range (review 7 B2: on a -7..12.5 axis they were a pixel apart). Without a nonzero
    baseline there is no band to zoom on: the full panel alone. Returns the Figure."""
    zoom = baseline is not None and math.isfinite(float(baseline)) and float(baseline) != 0
    if not zoom:
        return plot_pruning_curve(data, metric=metric, baseline=baseline, basis=basis, ax=axes(None, (8, 4))).figure
    fig, (full, near) = plt.subplots(1, 2, figsize=(11.5, 4.6), gridspec_kw={"width_ratios": [3, 2]})
    plot_pruning_curve(data, metric=metric, baseline=baseline, basis=basis, ax=full)
    full.get_legend().remove()  # one legend, right of the zoom panel
    plot_pruning_curve(data, metric=metric, baseline=baseline, basis=basis, ax=near)
    b = float(baseline)
    half = ZOOM * abs(b)
    floor = b - 0.01 * abs(b)
    near.set_yticks([b - half, floor, b, b + half], [f"-{100 * ZOOM:.0f}%: {b - half:.4g}", f"1% below unpruned: {floor:.4g}",
                                                     f"unpruned: {b:.4g}", f"+{100 * ZOOM:.0f}%: {b + half:.4g}"])
    near.set_ylim(b - half, b + half)  # after the ticks: set_yticks may widen the limits
    near.set_title(f"zoom on the 1% band: unpruned ± {100 * ZOOM:.0f}%\n(points beyond it leave the panel)")
    near.set_ylabel("")
    return fig


def _finish(ax: Any, metric: str | None, baseline: float | None, xlabel: str, title: str) -> Any:
    """Unpruned baseline (grey dashed), the band within 1% of it shaded and its -1% floor in black, so
    the floor stays visible where it nearly coincides with the baseline on a wide axis (review 6);
    labels, legend and title."""
    if baseline is not None:
        tol = 0.01 * abs(baseline)
        ax.axhspan(baseline - tol, baseline + tol, color="tab:olive", alpha=0.3, linewidth=0, zorder=0,
                   label="within 1% of unpruned")
        ax.axhline(baseline, color="grey", linestyle="--", linewidth=1, label="unpruned")
        ax.axhline(baseline - tol, color="black", linestyle=":", linewidth=1.2, label="-1% floor")
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
    for i, (column, label) in enumerate(BEST_HEAD_KINDS.items()):
        x = [j + (i - (len(BEST_HEAD_KINDS) - 1) / 2) * width for j in range(len(layers))]
        err = (t * data[f"{column}_se"]).to_numpy(dtype=float) if banded else None
        ax.bar(x, data[column], width, yerr=err, capsize=3 if banded else 0, label=label, color=f"C{i}",
               error_kw={"elinewidth": 1, "ecolor": "black"})
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


def plot_l0(data: pd.DataFrame, *, metric: str | None = None, baseline: float | None = None, ax: Any = None) -> Any:
    """Heads kept against the metric over the lambda sweep (`data`: the l0 table; Voita et al.'s L0 gates)."""
    ax = axes(ax, (8, 4))
    sweep = data.sort_values("heads_kept")
    # a hollow circle under a cross drawn on top: on one point (a one-lambda sweep, or equal metrics) both stay visible
    ax.plot(sweep["heads_kept"], sweep["metric_binary"], marker="o", markersize=11, markerfacecolor="none",
            markeredgewidth=1.5, label="kept heads only", zorder=2)
    ax.plot(sweep["heads_kept"], sweep["metric"], marker="x", markersize=7, markeredgewidth=1.5, linestyle="--",
            label="test-time gates", zorder=3)
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
    for i, ((kept, value), lams) in enumerate(sorted(points.items())):
        ax.annotate("λ=" + ", ".join(f"{v:g}" for v in lams), (kept, value), textcoords="offset points",
                    xytext=(4, 8 if i % 2 else -12), fontsize="x-small")  # alternate above and below
    return _finish(ax, metric, baseline, "heads kept", "L0 head pruning")


ROW_INCHES = 0.22  # height of one head's row in the roles map: its 9-point label fits without overlap
LABEL_INCHES = 0.17  # height a tick label needs


def plot_roles(data: pd.DataFrame, *, ax: Any = None) -> Any:
    """Heat map head x role score (`data`: the roles table; positional share, sink, previous-token,
    induction, confidence = mean maximum attention weight) on the sequential map from 0 (plots.color_scale).
    A new figure is sized by the number of heads (ROW_INCHES a row, plus room for the role labels),
    capped at 40 inches; past that every k-th head is labelled, so labels never overlap."""
    rows = len(data)
    ax = axes(ax, (6, min(40.0, max(3.0, ROW_INCHES * rows + 2.5))))
    grid = data.assign(name=[f"L{l}H{h}" for l, h in zip(data["layer"], data["head"])]).set_index("name")
    scores = [c for c in ROLE_SCORES if c in grid.columns]
    shown = grid[scores].rename(columns=lambda c: {"confidence": "confidence\n(max weight)"}.get(c, c.replace("_", "-")))
    height = 0.75 * ax.get_position().height * ax.figure.get_figheight()  # inches the rows keep after tight_layout
    every = max(1, math.ceil(rows * LABEL_INCHES / max(height, 0.1)))  # label every k-th head when they would overlap
    sns.heatmap(shown, ax=ax, **color_scale(bound=1.0, is_signed=False), cbar_kws={"label": "role score (0-1)"},
                yticklabels=every)
    ax.tick_params(axis="y", rotation=0)
    ax.set_ylabel("head (L layer H head)")
    ax.set_xlabel("role")
    ax.set_title("head roles")
    return ax


def figures(result: Any, **kwargs: Any) -> dict[str, Any]:
    """Every figure the Result has data for: importance, pruning_curve, best_head, l0, roles."""
    s, tables, out = result.summary, result.tables, {}
    metric, baseline = s.get("metric"), s.get("baseline_metric")
    if "method" in result.df.columns:
        degenerate = {m: s[f"degenerate_{m}"] for m in set(result.df["method"]) if s.get(f"degenerate_{m}")}
        out["importance"] = importance_figure(result.df, metric=metric, baseline=baseline, degenerate=degenerate,
                                              quiet=quiet_reason(s))
        out["importance"].tight_layout()
    curve = _curve(result)
    draw = {
        "pruning_curve": (curve is not None, lambda: pruning_figure(curve, metric=metric, baseline=baseline,
                                                                            basis=s.get("ordering_basis")).axes[0]),
        "best_head": ("best_head" in tables, lambda: plot_best_head(tables["best_head"], metric=metric)),
        "l0": ("l0" in tables, lambda: plot_l0(tables["l0"], metric=metric, baseline=baseline)),
        "roles": ("roles" in tables, lambda: plot_roles(tables["roles"])),
    }
    for stem, (available, fn) in draw.items():
        if available:
            out[stem] = laid_out(fn())
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
                  "positive, white 0. A panel marked rounding only has no head above the numerical floor.",
    "pruning_curve": "Metric (y, the task's metric) as heads are removed least-important first (x, fraction of all heads), "
                     "each ordering with its own marker and dash, shaded with the 95% interval of each point's change from the "
                     "unpruned model (paired over examples). "
                     "Read where each falls below the dotted black 1% floor (the shaded strip: within 1% of unpruned, the grey "
                     "dashed line); the random band spans the seeds. Left, the whole curve; right, the same curves zoomed "
                     "on the unpruned value ± 5%, where the strip and its floor (1% below unpruned, the threshold behind "
                     "the finding's count) stay visible however far the curve falls. The legend names "
                     "what each ordering ranks by: by default the gradient ordering divides |dL/d gate| by its layer's L2 "
                     "norm (Michel et al.), so its order can differ from the raw values of the importance figure. The "
                     "finding's count is the heads removed before a curve first leaves the band (a curve may come back "
                     "into it later), its interval a bootstrap over examples along the order drawn here.",
    "best_head": "Per layer, metric change from the unpruned model (task metric units) keeping only one head: the most "
                 "important, the best single head found by trying all, or none. Near 0 means one head does the layer's job. "
                 "Error bars: the 95% t-interval of each change over the examples (n in the title), paired with each "
                 "example's unpruned metric; the best single head is chosen on those same examples, so its bar is "
                 "optimistic.",
    "l0": "Heads kept (x) against the metric (y) across the L0 penalty sweep; each point is labelled with its lambda "
          "(lambdas that land on one point share a label).",
    "roles": "Role scores per head (0-1): positional share, sink mass, previous-token, induction and confidence "
             "(the mean maximum attention weight).",
}


def _interval(s: Mapping[str, Any], key: str) -> tuple[float, float, Any] | None:
    """(low, high, n_examples) of prunable_ci_<key> (pruning.prunable_intervals), None when absent and for
    random orderings (a bootstrap of their mean over seeds leaves out the seed spread: _seed_words)."""
    ci = s.get(f"prunable_ci_{key}")
    bounds = ci.get("interval_heads") if isinstance(ci, Mapping) and not key.startswith("random") else None
    if not (isinstance(bounds, (list, tuple)) and len(bounds) == 2 and all(_num(b) is not None for b in bounds)):
        return None
    return float(bounds[0]), float(bounds[1]), ci.get("n_examples")


def _line_words(s: Mapping[str, Any], key: str) -> str:
    """'' or, when the count of ordering `key` sits on its tolerance line (prunable_ci_<key>'s `line`,
    pruning.line_record: a deciding point within one standard error or its paired interval of the
    line), what its deciding point is: a bootstrap along the order cannot show that, so "0-0 heads" is
    no certainty."""
    ci = s.get(f"prunable_ci_{key}")
    line = ci.get("line") if isinstance(ci, Mapping) else None
    if not isinstance(line, Mapping) or line.get("on_the_line") is not True:
        return ""
    d, m = _num(line.get("distance_rel")), _num(line.get("margin_rel"))
    if d is None or m is None:
        return ""
    k = line.get("n_pruned")
    within = f"within its noise margin, {100 * m:.2g}%"
    if line.get("past"):
        step = "a first step" if _num(ci.get("heads")) == 0 else f"the step to {k} head{'s' if k != 1 else ''} removed"
        return f"{step} crosses the line by {100 * abs(d):.2g}% of the metric, {within}"
    return f"the point at {k} head{'s' if k != 1 else ''} removed is {100 * abs(d):.2g}% of the metric inside the line, {within}"


def _line_sentence(s: Mapping[str, Any], keys: Any) -> str:
    """One sentence for every ordering whose count sits on the 1% line, orderings with the same deciding
    point said once ("ablation and ablation recomputed (...)"); '' when none does."""
    groups: dict[str, list[str]] = {}
    for key in keys:
        if words := _line_words(s, key):
            groups.setdefault(words, []).append(key.removesuffix("_recompute")
                                                + (" recomputed" if key.endswith("_recompute") else ""))
    if not groups:
        return ""
    said = "; ".join(f"{' and '.join(names)} ({words})" for words, names in groups.items())
    return (f"On the 1% line, so fragile (another sample of examples could move the count): {said}. A noise margin is "
            "the larger of a deciding point's standard error over examples and its paired 95% interval, as a % of the "
            "unpruned metric.")


def _seed_words(s: Mapping[str, Any], key: str) -> str:
    """The random ordering's count in words: each seed's own count and their range (a mean over seeds is
    no count, and a bootstrap of that mean leaves out the seed spread), with no interval from few seeds."""
    ci = s.get(f"prunable_ci_{key}")
    per = ci.get("per_seed_heads") if isinstance(ci, Mapping) else None
    if not (isinstance(per, list) and per and all(_num(x) is not None for x in per)):
        return "mean over seeds; each seed's count is not recorded, so no interval"
    counts = _and([_count(x) for x in per])  # review 8b C4: "1 and 1 heads", not "per seed 1, 1 heads, range 1-1"
    span = f", range {_count(min(per))}-{_count(max(per))}" if len(per) > 2 else ""
    few = "; too few seeds for an interval" if len(per) < 5 else ""
    return f"{counts} heads{span} over {len(per)} random order{'s' if len(per) != 1 else ''}{few}"


def _top_tie_words(s: Mapping[str, Any], method: str) -> str:
    """Top heads that tie within rounding (tied_top_heads_<method>), naming the (k+1)-th head a tie at the
    k-th runs past (tied_top_next_<method>; review 8b C1: "L1H0 tie" named one head of a pair)."""
    tied, nxt = [str(h) for h in s.get(f"tied_top_heads_{method}") or []], s.get(f"tied_top_next_{method}")
    by = FINDING_METHOD_WORDS.get(method, method)
    if not tied:
        return ""
    if not nxt:
        return f"By {by}, {_and(tied)} tie within rounding among the top heads: their order is arbitrary."
    k = len(s.get(f"top_heads_{method}") or []) or None
    names = tied[:-1] + ([f"{tied[-1]} ({_ordinal(k)})", f"{nxt} ({_ordinal(k + 1)})"] if k else [tied[-1], str(nxt)])
    if len(names) == 2:
        return f"By {by}, {names[0]} ties with {names[1]} within rounding: their order is arbitrary."
    return f"By {by}, {_and(names)} tie within rounding, across the edge of the top heads: their order is arbitrary."


def _first_tie_words(s: Mapping[str, Any], method: str) -> str:
    """The first heads a fixed pruning order removes that tie within rounding (tied_first_pruned_<method>: runs
    of tied neighbours; review 8b A2: which goes first swapped between float32 and bfloat16, and the count's
    interval with it)."""
    groups = [g for g in s.get(f"tied_first_pruned_{method}") or [] if isinstance(g, list) and len(g) > 1]
    values = s.get(f"tied_first_pruned_values_{method}") or []
    if not groups:
        return ""
    starts = s.get(f"tied_first_pruned_at_{method}") or []
    said = []
    for i, g in enumerate(groups):
        nums = [_num(x) for x in values[i]] if i < len(values) and isinstance(values[i], list) else []
        ok = len(nums) == len(g) and all(v is not None for v in nums)
        shown = ("" if not ok else f"{nums[0]:.2f} each" if len({f"{v:.2f}" for v in nums}) == 1
                 else _and([f"{v:.2f}" for v in nums]))
        at = _num(starts[i]) if i < len(starts) else None
        where = f"removed {_and([_ordinal(int(at) + j) for j in range(len(g))])}" if at is not None else ""
        said.append((_and([str(h) for h in g]), shown, where, at == 1))
    order = "gradient" if method == "gradient" else "ablation"
    tail = "arbitrary, and the count's interval can depend on it."
    if len(said) == 1 and said[0][3]:
        shown = f" ({said[0][1]})" if said[0][1] else ""
        return (f"The first heads of the {order} order, {said[0][0]}, tie within rounding{shown}: which is "
                f"removed first is {tail}")
    runs = [f"{names} ({'; '.join(x for x in (where, shown) if x)})" if where or shown else names
            for names, shown, where, _ in said]
    return (f"In the {order} order, {runs[0]} tie within rounding{', as do ' + '; '.join(runs[1:]) if runs[1:] else ''}: "
            f"which {'of each ' if len(runs) > 1 else ''}is removed first is {tail}")


def _first_close_words(s: Mapping[str, Any], method: str) -> str:
    """The first heads of the ablation order within each other's standard errors (close_first_pruned_<method>),
    unless a rounding tie already starts the order (review 8b A2: in float32 the first two are 0.005 apart with
    standard errors 0.12 and 0.31, so which goes first is not measured either)."""
    close = s.get(f"close_first_pruned_{method}")
    if not isinstance(close, Mapping) or 1 in (s.get(f"tied_first_pruned_at_{method}") or []):
        return ""
    heads, imp, se = close.get("heads") or [], close.get("importance") or [], close.get("se") or []
    if len(heads) < 2 or len(imp) != len(heads) or len(se) != len(heads) or any(_num(x) is None for x in [*imp, *se]):
        return ""
    return (f"The first heads of the ablation order, {_and([str(h) for h in heads])} "
            f"({_and([f'{float(v):.2f}' for v in imp])}), differ from their neighbours by less than their standard "
            "errors over examples "
            f"({_and([f'{float(v):.2f}' for v in se])}): which is removed first is not measured by these examples, "
            "and the count's interval can depend on it.")


def _and(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _count(x: float) -> str:
    """A number of heads: whole, or to one decimal (random orderings: a mean over seeds)."""
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}"


def _name(s: Mapping[str, Any], key: str, named: set[str] | None = None) -> str:
    """An ordering key (gradient_recompute) in words, with what it ranks by where the summary records it;
    the basis is said once per finding: an ordering already in `named` (which this adds to) goes bare."""
    ordering = key.removesuffix("_recompute")
    basis = s.get("ordering_basis")
    what = basis.get(ordering) if isinstance(basis, Mapping) and (named is None or ordering not in named) else None
    if named is not None:
        named.add(ordering)
    return ordering + (" recomputed" if key.endswith("_recompute") else "") + (f" ({what})" if what else "")


def _signed_pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def _gain_ci(gain: Mapping[str, Any]) -> tuple[float, float] | None:
    ci = gain.get("ci")
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(_num(c) is not None for c in ci):
        return float(ci[0]), float(ci[1])
    return None


def _band_size(shape: Mapping[str, Any], gain: Mapping[str, Any]) -> float:
    """The band in the metric's units: tolerance x |unpruned| (unpruned = the gain point's metric - its change)."""
    metric, change = _num(gain.get("metric")), _num(gain.get("change"))
    base = metric - change if metric is not None and change is not None else math.nan
    return (_num(shape.get("tolerance")) or 0.01) * abs(base)


def _shape_words(s: Mapping[str, Any], keys: Any, n_heads: int, metric: str, named: set[str]) -> list[str]:
    """What the first crossing leaves out (pruning.curve_shapes), for the ordering `keys` the finding
    counts: curves back within the band after leaving it, and pruning that changes the metric beyond
    the band, with its interval over examples, worded by what the interval clears (chance.clear_of, kv's
    rule too): "more than 1% above unpruned" only where its lower bound clears the band (those gains in
    one sentence), "higher than unpruned, but not clearly by more than 1%" where it clears only 0, "no
    evidence of a gain" where it reaches 0."""
    out, gains = [], []
    n_ex = s.get("n_examples")
    over = f" over {n_ex} examples" if n_ex else ""
    for key in keys:
        shape = s.get(f"pruning_shape_{key}")
        if not isinstance(shape, Mapping):
            continue
        band = _pct(_num(shape.get("tolerance")) or 0.01)
        first, back, gain = shape.get("first_below"), shape.get("back_within"), shape.get("gain")
        if isinstance(first, Mapping) and isinstance(back, Mapping):
            later = "point" if back.get("points") == 1 else "points"
            heads = "head" if first["n_pruned"] == 1 else "heads"
            out.append(f"The {_name(s, key, named)} curve leaves the {band} band at {first['n_pruned']} {heads} removed "
                       f"({_signed_pct(first['change_rel'])}) but is back within it at {back.get('points')} later {later}, "
                       f"from {back.get('first')} heads removed up to {back['n_pruned']} of {n_heads} "
                       f"({back['metric']:.3g}, {_signed_pct(back['change_rel'])}): the order is not monotone; its "
                       "count stops at the first crossing.")
        if isinstance(gain, Mapping):
            heads = [str(h) for h in gain.get("heads") or []]
            which = f" ({', '.join(heads)})" if 0 < len(heads) <= 8 else ""
            ci = _gain_ci(gain)
            span = f"; 95% CI of the change {ci[0]:+.3g} to {ci[1]:+.3g}" if ci else ""
            verdict = clear_of(ci[0], ci[1], _band_size(shape, gain)) if ci else "band"  # no interval: older summaries
            if ci and (verdict is None or ci[0] <= 0):
                # review 6 (A6): an interval that reaches 0 supports no gain, so none is claimed
                out.append(f"Removing {gain['n_pruned']} of {n_heads} heads in the {_name(s, key, named)} order{which} "
                           f"changes the {metric} by {gain['change']:+.3g} ({_signed_pct(gain['change_rel'])}{span}{over}): "
                           "no evidence of a gain.")
                continue
            if verdict != "band":
                # review 7 (A5): above unpruned, but the interval reaches below the band: not "more than 1%"
                out.append(f"Removing {gain['n_pruned']} of {n_heads} heads in the {_name(s, key, named)} order{which} "
                           f"raises the {metric} by {gain['change']:.3g} ({_signed_pct(gain['change_rel'])}{span}{over}): "
                           f"higher than unpruned, but not clearly by more than {band}.")
                continue
            gains.append((key, gain, which, span, band))
    if len(gains) == 1:
        key, gain, which, span, band = gains[0]
        out.append(f"Pruning can raise the metric: removing {gain['n_pruned']} of {n_heads} heads in the "
                   f"{_name(s, key, named)} order{which} raises the {metric} by {gain['change']:.3g} "
                   f"({_signed_pct(gain['change_rel'])}{span}{over}), more than {band} above unpruned.")
    elif gains:
        said = []
        for key, gain, which, _, _ in gains:
            ci = _gain_ci(gain)
            span = f", {ci[0]:+.3g} to {ci[1]:+.3g}" if ci else ""
            said.append(f"removing {gain['n_pruned']} of {n_heads} heads in the {_name(s, key, named)} order{which} "
                        f"by {gain['change']:.3g} ({_signed_pct(gain['change_rel'])}{span})")
        out.append(f"Pruning can raise the {metric} more than {gains[0][4]} above unpruned (95% CIs of the change"
                   f"{over}): " + ", ".join(said) + ".")
    return out


def _prunable_words(s: Mapping[str, Any], prunable: Mapping[str, float], n_heads: int, metric: str) -> list[str]:
    """The best ordering's prunable heads with its bootstrap interval, then the others, then the counts
    on their 1% line in one sentence. A count of 0, or one whose interval reaches 0 heads, is not
    presented as heads that can be removed. Each ordering's basis is named once."""
    named: set[str] = set()
    best = max(prunable, key=lambda k: prunable[k])
    heads = _num(s.get(f"heads_prunable_{best}")) or prunable[best] * n_heads
    ci = _interval(s, best)
    n_ex = ci[2] if ci and ci[2] is not None else s.get("n_examples")
    over = f"over {n_ex} examples" if n_ex is not None else ""
    name = _name(s, best, named)
    if prunable[best] <= 0:
        lines = _line_sentence(s, prunable)
        out = [f"No ordering removes a single step of heads staying no more than 1% below the unpruned {metric}"
               + (f" ({over})" if over else "") + ": the first step already falls below the floor."]
        out += [lines] if lines else []
        out += _shape_words(s, list(prunable), n_heads, metric, named)
        return out
    if best.startswith("random"):
        out = [f"Ordered at random, {_count(heads)} of {n_heads} heads ({_pct(prunable[best])}) stay no more than 1% below the "
               f"unpruned {metric} on average ({_seed_words(s, best)})."]
    elif ci is None:  # an older summary: no per-example data behind the count
        out = [f"{heads:.0f} of {n_heads} heads ({_pct(prunable[best])}) can be removed staying no more than 1% below the "
               f"unpruned {metric}" + (f" ({over})" if over else "") + f" when ordered by {name}."]
    elif ci[0] <= 0:
        out = [f"Ordered by {name}, {_count(heads)} of {n_heads} heads ({_pct(prunable[best])}) stay no more than 1% below the "
               f"unpruned {metric}, but the 95% bootstrap interval ({_count(ci[0])}-{_count(ci[1])} heads, {over}) reaches "
               "none: this is no evidence that any head is dispensable."]
    else:
        out = [f"{_count(heads)} of {n_heads} heads ({_pct(prunable[best])}, 95% bootstrap interval "
               f"{_count(ci[0])}-{_count(ci[1])} heads, {over}) can be removed staying no more than 1% below the "
               f"unpruned {metric} when ordered by {name}."]
    others = []
    for key, value in prunable.items():
        if key == best:
            continue
        kci = _interval(s, key)
        none = ", reaching none" if kci and value > 0 and kci[0] <= 0 else ""
        span = "" if kci is None else f" ({_count(kci[0])}-{_count(kci[1])} heads{none})"
        if key.startswith("random"):
            span = f" ({_seed_words(s, key)})"
        others.append(f"{_name(s, key, named)} {_pct(value)}{span}")
    if others:
        out.append("Other orderings (heads removed before each curve first falls more than 1% below unpruned): "
                   + ", ".join(others) + ".")
    if lines := _line_sentence(s, prunable):
        out.append(lines)
    out += _shape_words(s, list(prunable), n_heads, metric, named)
    if any(_interval(s, key) for key in prunable):
        out.append("The intervals resample the examples along each fixed pruning order; they do not cover a new "
                   "task sample re-ranking the heads.")
    return out


FINDING_METHOD_WORDS = {"gradient": "gradient", "zero": "zero-ablation", "mean": "mean-ablation", "resample": "resample-ablation"}


def finding(s: Mapping[str, Any]) -> str:
    """Baseline, prunable heads per ordering, and the head roles found."""
    parts = []
    n_heads = s.get("n_heads")
    base, kind = _num(s.get("baseline_metric")), s.get("metric", "metric")
    metric = _words(kind)
    if base is not None:
        ci = (s.get("chance") or {}).get("ci") if isinstance(s.get("chance"), Mapping) else None
        span = (f" (95% CI [{ci[0]:.3g}, {ci[1]:.3g}])" if isinstance(ci, (list, tuple)) and len(ci) == 2
                and all(_num(x) is not None for x in ci) else "")
        if kind == "cosine":  # review 7 C1: a cosine with the model's own output is 1 by construction
            parts.append(f"The metric is the cosine of each pruned model's pooled embedding with the unpruned model's "
                         f"own ({base:.3g} unpruned by construction, over {s.get('n_examples', '?')} examples); the "
                         "gradient ordering differentiates the in-batch contrastive loss instead (the cosine has no "
                         "gradient at the unpruned gates), so it ranks heads by one objective and is scored on another.")
        else:
            parts.append(f"Unpruned {metric} is {base:.3g}{span} over {s.get('n_examples', '?')} examples.")
    if _at_chance(s, kind, base):
        parts.append(f"The model is at chance on this task (logit difference {base:.3g}, near 0): head importance "
                     "and pruning curves measure noise here, not a mechanism.")
    relative = _chance(s) is None  # "within 1%" of a clean metric at chance says nothing
    degenerate = {k.removeprefix("degenerate_"): v for k, v in s.items() if k.startswith("degenerate_")}
    for method, why in degenerate.items():
        parts.append(f"{FINDING_METHOD_WORDS.get(method, method).capitalize()} importance is rounding, not a measurement: {why}.")
    noisy = {"gradient"} & set(degenerate) | ({"ablation"} if set(degenerate) & {"zero", "mean", "resample"} else set())
    prunable = {k.removeprefix("max_fraction_prunable_"): _num(v) for k, v in s.items()
                if relative and k.startswith("max_fraction_prunable_") and _num(v) is not None
                and k.removeprefix("max_fraction_prunable_").removesuffix("_recompute") not in noisy}
    if prunable and n_heads:
        parts += _prunable_words(s, prunable, n_heads, metric)
        fixed = [k for k in prunable if not k.startswith("random")]
        if fixed and all(_num(s.get(f"heads_prunable_{k}")) == n_heads for k in fixed):
            # review 7 C3 (an untrained BERT: 12 of 12): no head moves the metric, which says nothing of redundancy
            parts.append(f"Every ordering removes all {n_heads} heads within 1%: the heads' writes barely move this "
                         "metric (as in an untrained model at its initial scale), so this says the heads do little "
                         "here, not that some are redundant beside others.")
    if s.get("mixture_of_experts") and {"gradient", "ablation"} <= {k.removesuffix("_recompute") for k in prunable}:
        parts.append("The blocks are mixtures of experts: removing a head can switch the experts the router picks, "
                     "which the first-order gradient cannot see, so the gradient and ablation orders can disagree "
                     "for that reason.")
    for method in (k.removeprefix("tied_top_heads_") for k in s if k.startswith("tied_top_heads_")):
        if words := _top_tie_words(s, method):
            parts.append(words)
    for method in (k.removeprefix("tied_first_pruned_") for k in s if k.startswith("tied_first_pruned_")
                   and not k.startswith(("tied_first_pruned_values_", "tied_first_pruned_at_"))):
        if words := _first_tie_words(s, method):
            parts.append(words)
    for method in (k.removeprefix("close_first_pruned_") for k in s if k.startswith("close_first_pruned_")):
        if words := _first_close_words(s, method):
            parts.append(words)
    roles = s.get("roles")
    if isinstance(roles, Mapping):
        found = [f"{len(v)} {k.replace('_', '-')} ({', '.join(map(str, v[:3]))}{', ...' if len(v) > 3 else ''})"
                 for k, v in roles.items() if v]
        parts.append("Head roles: " + "; ".join(found) + "." if found else "No head passes a role threshold.")
    l0 = s.get("l0_min_heads_within_tolerance")
    lambdas = s.get("l0_lambdas")
    if isinstance(l0, int) and relative and isinstance(lambdas, (list, tuple)) and len(lambdas) < 2:
        parts.append(f"L0 gates were trained at one strength only (lambda {lambdas[0]:g}): "
                     "no sweep, so they say nothing about how few heads suffice.")
    elif isinstance(l0, int) and relative:
        parts.append(f"L0 gates keep the metric within tolerance with {l0} heads.")
    return " ".join(parts)
