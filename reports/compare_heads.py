"""Head importance and pruning for `headscope compare`: A and B's importance on one scale with B - A muted
where the difference lies within the runs' own uncertainty (`noise_band`), and the prunable fractions led by
the ordering each report's heads finding leads with, judged against recorded intervals.
"""
from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from headscope.analyses.core.chance import metric_ci
from headscope.reports.compare_notes import n_words
from headscope.reports.compare_prunable import interval_heads, precision_words, verdict_words
from headscope.reports.compare_run import (
    NO_INTERVAL,
    NOT_COMPARED,
    OVERLAY_TITLE,
    PRECISION_BITS,
    SAME,
    SIDES,
    Run,
    _analysis_settings,
    _img,
    _number,
    _overlay,
    chance_refusal,
    models_differ,
    noise_verdict,
    precision_only,
    same_rows,
    task_identity,
    tasks_differ,
)
from headscope.reports.compare_top import refuses_to_rank, top_heads_notes
from headscope.reports.findings import and_join, ci_pair
from headscope.reports.plots import color_scale, fit_title, symmetric_bound
from headscope.reports.plots_heads import pale_line
from headscope.reports.pruning_words import line_name
from headscope.reports.render import escape

Z95 = 1.96  # two-sided 95% normal quantile: a difference within Z95 x its standard error is within noise


def _importance_grid(run: Run) -> tuple[pd.DataFrame, str, str] | None:
    """([layer, head] importance of the gradient (else the first) method, what it is, the method): raw units like each
    report's own figure and top heads; older reports without the raw column give the layer-normalised one."""
    df = run.table("heads", "results")
    if df is None or not {"method", "layer", "head"} <= set(df.columns):
        return None
    column = next((c for c in ("importance", "importance_layer_norm") if c in df.columns), None)
    if column is None:
        return None
    method = "gradient" if "gradient" in set(df["method"]) else df["method"].iloc[0]
    what = f"{method} importance" + (" (layer-normalised)" if column == "importance_layer_norm" else "")
    return df[df["method"] == method].pivot(index="layer", columns="head", values=column), what, str(method)  # [layer, head]


SE_COLUMNS = ("importance_se", "importance_stderr", "se")  # a per-head standard error, where results.csv has one
MUTED_GREY = "#d9d9d9"


def metric_se(run: Run) -> float | None:
    """The standard error of `run`'s mean task metric in its heads analysis: its chance guard's 95% CI
    half-width / 1.96 (None where the summary records no such interval)."""
    chance = (run.summary("heads") or {}).get("chance")
    if not isinstance(chance, Mapping) or chance.get("ci_level", 0.95) != 0.95:
        return None
    ci = ci_pair(metric_ci(chance), ordered=True)  # the metric's own interval (review 11b A1)
    return (ci[1] - ci[0]) / (2 * Z95) if ci else None


def _head_se(run: Run, method: str) -> pd.DataFrame | None:
    """[layer, head] standard errors of `method`'s importance from results.csv (None without such a column)."""
    df = run.table("heads", "results")
    column = next((c for c in SE_COLUMNS if df is not None and c in df.columns), None)
    if column is None or not {"method", "layer", "head"} <= set(df.columns):
        return None
    return df[df["method"] == method].pivot(index="layer", columns="head", values=column)


def gradient_rounding(run: Run) -> float | None:
    """The share of its own size within which `run`'s gate gradients are rounding: the summary's
    rounding_relative_gradient (GRADIENT_TIE_STEPS eps of the dtype the gradients ran in, analysis.numerical_checks),
    else the same from the manifest's dtype (older reports); None where neither says."""
    from headscope.analyses.heads.analysis import GRADIENT_TIE_STEPS  # the analysis's own tie rule

    rel = (run.summary("heads") or {}).get("rounding_relative_gradient")
    if _number(rel):
        return float(rel)
    bits = PRECISION_BITS.get(str((run.manifest.get("config") or {}).get("dtype")).removeprefix("torch."))
    return None if bits is None else GRADIENT_TIE_STEPS * 2.0 ** (1 - bits)


def _gradient_floor(a: Run, b: Run) -> tuple[np.ndarray, str] | None:
    """[layer, head] rounding of B - A of gradient importance, with the rule in words: where both runs record
    rounding_gradient, their sum (measured against float32 where rounding_gradient_source says so); where both record
    only rounding_gradient_scale, the sum of rel x E_x max_h |dL/d gate| (a head's mean gradient
    rounds by a share of its examples' largest gradient, review 13a C2: 7.8 eps of L0H2's own size); for older
    reports rel_A |g_A| + rel_B |g_B| (relative to each gradient's own size; an absolute floor at the loss's
    rounding mutes the small gradients' real differences). None where neither run records its precision or a grid
    is missing."""
    rels = [gradient_rounding(r) for r in (a, b)]
    grids = [_importance_grid(r) for r in (a, b)]
    if all(r is None for r in rels) or any(g is None or g[2] != "gradient" for g in grids):
        return None
    values = [np.abs(g[0].to_numpy(dtype=float)) for g in grids]  # [layer, head] each run's |importance|
    if values[0].shape != values[1].shape:
        return None
    sums = [r.summary("heads") or {} for r in (a, b)]
    own = [s.get("rounding_gradient") for s in sums]
    if all(_number(x) for x in own):  # reviews 14b A2, 14c A1: each run's own, measured against float32 where it could
        floor = sum(float(x) for x in own) * np.ones_like(values[0])
        # review 15cv A1: "measured" recomputes on the run's own rounded weights upcast (rounding.gradient_check), so
        # it is the arithmetic's rounding only; one model in two dtypes also differs by its weights' rounding
        pair = precision_only(a, b) is not None
        said = ", ".join(f"{side} {float(x):.2g} ({s.get('rounding_gradient_source') or 'analytic'}"
                         + (": arithmetic only, against float32 on its own rounded weights"
                            if pair and s.get("rounding_gradient_source") == "measured" else "") + ")"
                         for side, x, s in zip(SIDES, own, sums))
        return floor, f"each run's gradient rounding (rounding_gradient) summed over the two runs ({said})"
    scales = [s.get("rounding_gradient_scale") for s in sums]
    if all(_number(s) for s in scales):  # review 13a C2: each head rounds by a share of its examples' largest gradient
        floor = sum((r or 0.0) * float(s) for r, s in zip(rels, scales)) * np.ones_like(values[0])
        said = ", ".join(f"{side} {(r or 0.0) * float(s):.2g}" for side, r, s in zip(SIDES, rels, scales))
        return floor, ("each run's gradient rounding, GRADIENT_TIE_STEPS eps x E_x max_h |dL/d gate| summed over "
                       f"the two runs ({said})")
    floor = sum((r or 0.0) * v for r, v in zip(rels, values))
    said = ", ".join(f"{side} {r:.2g}" for side, r in zip(SIDES, rels) if r is not None)
    return floor, f"each head's rounding, rel_A |A| + rel_B |B| with rel the gradients' relative rounding ({said})"


def noise_band(a: Run, b: Run, method: str, raw: bool) -> tuple[Any, str]:
    """The [layer, head] bound (or one number) under which |B - A| of `method`'s importance lies within the runs'
    own uncertainty, and the rule in words: 1.96 x sqrt(seA^2 + seB^2) with per-head standard errors where
    results.csv has them, else with each run's standard error of its mean task metric (an importance is a change
    in that metric; reports from before importance_se do not record its spread, so the metric's stands in), and never
    below the numerical noise floor: for ablation the one either records for its own ties (rounding_floor_<method>,
    measured by null ablations where it could be, else the analytic noise_floor); for gradient importance each
    head's own rounding relative to its size (`_gradient_floor`; none where neither run records its precision);
    None where neither records any (nothing is muted)."""
    if method == "gradient":
        found = _gradient_floor(a, b)
        floor, floor_words = (None, "") if found is None else found
    else:
        floors = [s.get(f"rounding_floor_{method}", s.get("noise_floor"))
                  for s in (a.summary("heads") or {}, b.summary("heads") or {})]
        floor = max((float(f) for f in floors if _number(f)), default=None)
        floor_words = "" if floor is None else f"the noise floor {floor:.3g}"
    if not raw:
        return None, "layer-normalised values have no recorded uncertainty: nothing is muted"
    heads = [_head_se(r, method) for r in (a, b)]
    metric = [metric_se(r) for r in (a, b)]
    if all(h is not None for h in heads) and heads[0].shape == heads[1].shape:
        band = Z95 * np.sqrt(heads[0].to_numpy(dtype=float) ** 2 + heads[1].to_numpy(dtype=float) ** 2)
        rule = "grey where |B - A| < 1.96 x sqrt(seA^2 + seB^2), from each head's standard error in results.csv"
    elif all(m is not None for m in metric):
        band = Z95 * float(np.hypot(*metric))
        rule = (f"grey where |B - A| < 1.96 x sqrt(seA^2 + seB^2) = {band:.3g}, with se each run's standard error of its "
                f"mean task metric (A {metric[0]:.3g}, B {metric[1]:.3g}, from its 95% CI): no per-head standard error is "
                "recorded, and an importance is a change in that metric")
    elif floor is not None:
        rule = (f"grey where |B - A| < {floor:.3g}, the numerical noise floor the runs record" if np.ndim(floor) == 0 else
                f"grey where |B - A| < {floor_words}")
        return floor, rule + ": neither records a sampling interval, so differences above it may still be sampling noise"
    else:
        return None, "neither run records an uncertainty for head importance: nothing is muted"
    if floor is not None:
        if not (np.ndim(band) == 0 and np.all(floor <= band)):  # a scalar band above every head's floor stays one number
            band = np.maximum(band, floor)
        rule += f" (never below {floor_words})"
    return band, rule


def dtype_pair_words(a: Run, b: Run, diff: pd.DataFrame, largest: bool = True) -> str:
    """Review 15cv A1: where A and B are one model run in two dtypes on the same examples (precision_only, same_rows),
    all of B - A is the lower precision's rounding, of the weights (a bfloat16 copy's, or the cast on loading) and of
    the arithmetic, as compare_run.precision_verdict says of the headlines; its largest |B - A| is that rounding's
    size here (said unless `largest` is False: all_within's words already give it), which a gradient rounding
    measured on the run's own rounded weights leaves part of out. '' otherwise."""
    sides = precision_only(a, b)
    values = diff.to_numpy(dtype=float)  # [layer, head]
    if sides is None or not same_rows(a, b, "heads") or not np.isfinite(values).any():
        return ""
    dtypes = [str((r.manifest.get("config") or {}).get("dtype")) for r in (a, b)]
    low = dtypes[sides[1]]
    return (f" One model on the same examples run in two dtypes (A {dtypes[0]}, B {dtypes[1]}): all of B - A is "
            f"{low}'s rounding, of the weights and of the arithmetic"
            + (f" (largest |B - A| {float(np.nanmax(np.abs(values))):.3g})" if largest else "")
            + ", not sampling noise; a gradient rounding measured against float32 on a run's own rounded weights "
            "covers the arithmetic only.")


def difference_panel(ax: Any, diff: pd.DataFrame, band: Any) -> float:
    """B - A on `ax`: cells within `band` grey, the rest on a diverging scale centred on 0 whose limit is set by
    the cells beyond noise (never below the band's largest value, so noise alone cannot saturate it); returns
    the limit."""
    from matplotlib.colors import ListedColormap

    from headscope.reports.plots import DIVERGING

    values = diff.to_numpy(dtype=float)  # [layer, head]
    finite = np.isfinite(values)
    within = finite & (np.abs(values) < band) if band is not None else np.zeros_like(finite)
    beyond = finite & ~within
    peaks = [float(np.abs(values[beyond]).max()) if beyond.any() else 0.0,
             float(np.nanmax(band)) if band is not None else 0.0]
    limit = max(peaks) or symmetric_bound(values)
    ticks = {"xticklabels": True, "yticklabels": True}
    if within.any():
        sns.heatmap(diff, ax=ax, mask=~within, cmap=ListedColormap([MUTED_GREY]), cbar=False, **ticks)
    sns.heatmap(diff, ax=ax, mask=~beyond, cmap=DIVERGING, vmin=-limit, vmax=limit,  # symmetric: centred on 0
                cbar_kws={"label": "change in importance (B - A)"}, **ticks)
    return limit


def all_within(diff: pd.DataFrame, band: Any) -> str:
    """"" unless every finite |B - A| lies within `band` (the map is all grey); then that the band is the smallest
    change this pair of runs could detect and no head differs beyond it, so the grey map reads as the test's reach."""
    values = diff.to_numpy(dtype=float)
    finite = np.isfinite(values)
    if band is None or not finite.any() or not (np.abs(values[finite]) < np.broadcast_to(band, values.shape)[finite]).all():
        return ""
    bounds = np.asarray(band, dtype=float)
    reach = f"{float(bounds.min()):.3g}" if np.ndim(band) == 0 or np.ptp(bounds) == 0 else \
        f"{float(bounds.min()):.3g} to {float(bounds.max()):.3g} by head"
    return (f"no head differs beyond noise; the smallest change\nthis pair of runs could detect is {reach} "
            f"(largest |B - A| {float(np.abs(values[finite]).max()):.3g})")


def importance_figure(a: Run, b: Run) -> tuple[Any, list[str], str] | None:
    """The importance heat maps of A and B on one scale (a side whose report does not rank its heads, its importance
    rounding or the model at chance (compare_top.refuses_to_rank), pale and titled with why; and B - A, noise muted,
    when the model shapes and quantities agree), the notes on their correlation and the muting rule (the top heads:
    compare_top), and the alt text; None without data."""
    found = [_importance_grid(a), _importance_grid(b)]
    if all(g is None for g in found):
        return None
    grids = [None if g is None else g[0] for g in found]
    whats = [None if g is None else g[1] for g in found]
    methods = [g[2] for g in found if g is not None]
    other_task = tasks_differ(a, b, "heads")  # importance on another task: no cell is set against the other's
    same = (all(g is not None for g in grids) and grids[0].shape == grids[1].shape and whats[0] == whats[1]
            and not other_task)
    panels = [(f"{side}: {what}", g) for side, g, what in zip(SIDES, grids, whats) if g is not None]
    bound = symmetric_bound(*[g.to_numpy(dtype=float) for g in grids if g is not None])  # A and B: one scale
    if same:
        panels.append(("B - A", grids[1] - grids[0]))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.8), squeeze=False)
    notes, rule = [], ""
    refusals = [None if g is None else refuses_to_rank(run, g[2]) for g, run in zip(found, (a, b))]
    for ax, (title, grid) in zip(axes[0], panels):
        if title == "B - A":
            band, rule = noise_band(a, b, methods[0], "layer-normalised" not in whats[0])
            difference_panel(ax, grid, band)
            muted = ("\n(nothing muted: no uncertainty recorded)" if band is None else
                     f"\n(grey: |B - A| < {float(band):.3g}, within the runs' noise)" if np.ndim(band) == 0 else
                     "\n(grey: |B - A| < 1.96 x its per-head se, within noise)" if "standard error in results" in rule
                     else "\n(grey: |B - A| < each head's rounding, within noise)")
            undetected = all_within(grid, band)
            if undetected:  # an all-grey map is the test's reach, not a finding that nothing changed
                muted += f"\n{undetected}"
                said = undetected.replace("\n", " ")
                rule += f". {said[0].upper()}{said[1:]}"
            ax.set_title("B - A" + muted, **({"fontsize": "medium"} if undetected else {}))
            ax.set(xlabel="head", ylabel="layer")
            notes.append(SAME + f"B - A head importance: {rule}.{dtype_pair_words(a, b, grid, not undetected)}")
            continue
        unsigned = all(m == "gradient" for m in methods)  # |dL/d gate|: sequential from 0
        rounding = refusals[SIDES.index(title[0])]  # review 15c C2: muted as its own importance.png is, and why
        sns.heatmap(grid, ax=ax, **color_scale(grid.to_numpy(dtype=float), bound=bound, is_signed=not unsigned,
                                               quiet=bool(rounding)),
                    cbar_kws={"label": "importance (its own units)"}, xticklabels=True, yticklabels=True)
        why = str(rounding or "").removeprefix("has ").removeprefix("is ")
        ax.set(title=title + "".join(f"\n{line}" for line in textwrap.wrap(f"(pale: {why})", 40) if rounding),
               xlabel="head", ylabel="layer")
        if rounding:
            ax.title.set_color("C3")
    fig.tight_layout()
    if same:  # the B - A title's long lines re-wrapped to its axes, clear of the colour bar's label (11b N1)
        fit_title(axes[0][-1])
    if other_task and all(g is not None for g in grids):
        notes.append(NOT_COMPARED + f"Head importance: not compared: {other_task}; no cell-by-cell difference or "
                     "correlation.")
    elif same and any(refusals):
        why = "; ".join(f"{side} {r}" for side, r in zip(SIDES, refusals) if r)
        notes.insert(0, NOT_COMPARED + f"Head importance ({whats[0]}): the top heads cannot be compared, because {why}, so "
                     f"{'neither report ranks' if all(refusals) else 'that report does not rank'} its heads; no shared "
                     "top heads or correlation is computed.")
    elif same:  # the top heads of every method: top_heads_notes, with the ties each summary records
        cells = [g.to_numpy().ravel() for g in grids]
        r = float(np.corrcoef(*cells)[0, 1])
        text, kind = pearson_words(r, int(np.isfinite(cells[0] + cells[1]).sum()), whats[0])
        sums = [a.summary("heads") or {}, b.summary("heads") or {}]
        if sums[0].get("n_examples") != sums[1].get("n_examples"):  # beside the difference: a setting, not the model
            text = text.removesuffix(".") + f" ({n_words(*sums)})."
        notes.insert(0, {"same": SAME, "not": NOT_COMPARED}.get(kind, "") + text)
    elif all(g is not None for g in grids) and whats[0] != whats[1]:
        notes.append(NOT_COMPARED + f"Head importance: A shows {whats[0]}, B {whats[1]}; different quantities, no "
                     "cell-by-cell difference.")
    elif any(g is None for g in grids):
        side = SIDES[grids.index(None)]
        notes.append(NOT_COMPARED + f"Head importance: {side} has none (no heads/results.csv with an importance column); "
                     "only the other run is drawn.")
    elif all(g is not None for g in grids):
        notes.append(NOT_COMPARED + f"Head importance: the models differ in shape ({grids[0].shape[0]}x{grids[0].shape[1]} "
                     f"vs {grids[1].shape[0]}x{grids[1].shape[1]} layers x heads); no cell-by-cell difference.")
    scale = ("one sequential scale from 0 (|dL/d gate|)" if all(m == "gradient" for m in methods)
             else "one diverging scale centred on 0")
    alt = (f"head importance of A and B on {scale}"
           + (f", and B - A on its own diverging scale centred on 0 ({rule})" if same else ""))
    return fig, notes, alt


SAME_R = 0.95  # Pearson r at or above which two importance grids are called the same ranking


def pearson_words(r: float, n: int, what: str) -> tuple[str, str]:
    """Review 14b B5: the grids' Pearson r with its n (heads) and its 95% Fisher z interval (tanh(atanh r +- 1.96 /
    sqrt(n - 3)), heads taken as independent), and where it goes: "same" (r >= SAME_R, or its interval reaches SAME_R:
    within noise of the same ranking), "differ" (the interval lies below SAME_R), "not" (n <= 3 or r undefined: no
    interval)."""
    head = f"Head importance ({what}): Pearson r"
    if not np.isfinite(r) or n <= 3:
        return (f"{head} between A and B not compared: " + (f"r = {r:.2f} over {n} heads, too few for an interval"
                if np.isfinite(r) else "r is undefined (a grid is constant)") + "."), "not"
    half = 1.959964 / np.sqrt(n - 3)
    z = np.arctanh(np.clip(r, -1 + 1e-12, 1 - 1e-12))
    low, high = float(np.tanh(z - half)), float(np.tanh(z + half))
    said = f"{head} = {r:.2f} between A and B over {n} heads (95% CI [{low:.2f}, {high:.2f}], Fisher z, heads taken as " \
        "independent)"
    if r >= SAME_R:
        return said + ".", "same"
    if high >= SAME_R:
        return said + f": within noise of the same ranking (the interval reaches {SAME_R:g}).", "same"
    return said + f": the rankings differ beyond noise (the interval lies below {SAME_R:g}).", "differ"


def importance_section(a: Run, b: Run) -> tuple[str, list[str]]:
    """Importance heat maps of A and B on one scale and B - A with the cells within noise muted
    (importance_figure), as an inline PNG, with its notes and every method's top heads compared
    (compare_top.top_heads_notes; the figure's method left out where its note already refuses it)."""
    drawn = importance_figure(a, b)
    if drawn is None:
        return "", top_heads_notes(a, b)
    fig, notes, alt = drawn
    said = {g[2] for g in (_importance_grid(a), _importance_grid(b)) if g is not None} if any(
        "the top heads cannot be compared" in n for n in notes) else set()  # the figure's note refused that method
    return _img(fig, alt), notes + top_heads_notes(a, b, said=said)


PRUNABLE = "max_fraction_prunable_"


def _pruning_curves(run: Run) -> pd.DataFrame | None:
    c = run.table("heads", "curve")
    if c is None or not {"ordering", "recompute", "fraction_pruned", "metric"} <= set(c.columns):
        return None
    return c.assign(order=c["ordering"] + np.where(c["recompute"].astype(str) == "True", " (recomputed)", ""))


def pruning_section(a: Run, b: Run) -> tuple[str, list[str]]:
    """Both runs' pruning curves on one axis, and the prunable fractions compared ordering by ordering, the one
    each heads finding leads with first (pruning_notes); no overlay where either run is at chance."""
    curves = [_pruning_curves(r) for r in (a, b)]
    if all(c is None for c in curves):
        return "", []
    refused = chance_refusal(a, b, "heads")
    if refused:  # its report says the curves measure noise: the two reports' own figures are in the figures section
        return ("<p><em>no overlay: pruning curves " + escape(refused) + "; each report's own pruning_curve figure is "
                "below, side by side.</em></p>", [NOT_COMPARED + f"Prunable within 1%: {refused}."])
    fig = _overlay(curves, "order", "fraction_pruned", "metric", "fraction of heads pruned",
                   "task metric (random: mean over seeds)", f"pruning curves: {OVERLAY_TITLE}")
    _pale_rounding(fig.axes[0], a, b)
    return _img(fig, f"pruning curves of A and B on shared axes, {OVERLAY_TITLE}"), pruning_notes(a, b)


def rounding_orderings(s: Mapping[str, Any]) -> set[str]:
    """The orderings of a heads summary whose importance is rounding (degenerate_<method>): "gradient", and
    "ablation" where its ablation method's is."""
    degenerate = {k.removeprefix("degenerate_") for k in s if k.startswith("degenerate_") and s[k]}
    return {"gradient"} & degenerate | ({"ablation"} if degenerate & {"zero", "mean", "resample"} else set())


def _pale_rounding(ax: Any, a: Run, b: Run) -> None:
    """A side's curves of an ordering its report calls rounding (rounding_orderings), drawn pale (MUTE towards white)
    and labelled so in the legend (review 15c C2: B's gradient curve drawn as a measurement)."""
    from matplotlib.colors import to_rgba

    from headscope.reports.plots import MUTE

    pale = {f"{side}: {o}" for side, r in zip(SIDES, (a, b)) for o in rounding_orderings(r.summary("heads") or {})}
    changed = False
    for line in ax.get_lines():
        label = str(line.get_label())
        if label.split(" (recomputed)")[0] in pale:
            r, g, b_, alpha = to_rgba(line.get_color())
            line.set_color((r * (1 - MUTE) + MUTE, g * (1 - MUTE) + MUTE, b_ * (1 - MUTE) + MUTE, alpha))
            line.set_markerfacecolor(line.get_color())
            line.set_markeredgecolor(line.get_color())
            words = pale_line(label.split(": ", 1)[1])  # the same words as the report's pruning curve, two lines
            line.set_label(f"{label}: " + words.replace(" (pale)", "").replace(" ", "\n", 1 + words.count(" ") // 2)
                           .replace("\n", " ", words.count(" ") // 2) + " (pale)")
            changed = True
    if changed:
        ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1))


def lead_ordering(s: Mapping[str, Any]) -> tuple[str | None, dict[str, float]]:
    """The ordering the heads finding leads with (the most heads prunable within 1%, orderings whose importance is
    rounding left out, as reports/plots_heads.py's finding does) and {ordering: fraction prunable}."""
    noisy = rounding_orderings(s)
    prunable = {k.removeprefix(PRUNABLE): float(v) for k, v in s.items() if k.startswith(PRUNABLE) and _number(v)
                and k.removeprefix(PRUNABLE).removesuffix("_recompute") not in noisy}
    return (max(prunable, key=lambda k: prunable[k]) if prunable else None), prunable


def prunable_interval(s: Mapping[str, Any], ordering: str) -> tuple[float, float] | None:
    """The interval the heads finding prints for the fraction prunable by `ordering` (reports/plots_heads.py
    `_interval`): heads' prunable_ci_<ordering>, its bootstrap interval in heads, as fractions of n_heads; None
    where the summary has none (no other key is read: compare judges only what the finding states)."""
    n, bounds = s.get("n_heads"), interval_heads(s, ordering)  # heads' bootstrap interval, in heads
    if isinstance(n, int) and n > 0 and bounds is not None:
        return bounds[0] / n, bounds[1] / n
    return None


EDGE = 0.25  # without per-example values: a point closer to the 1% line than this share of the band sits on it


def examples_differ(a: Run, b: Run) -> str:
    """Why A's and B's heads analyses did not rank heads on the same examples ("" when they did, as far as their
    records tell: one task and task file (not the wording of its source), example count, file rows and sample
    prompt, and, where no rows are recorded (a generated task), one seed and model). Each run orders the heads on
    its own examples, so where those differ the prunable counts also differ by re-ranking, which their bootstrap
    intervals do not cover."""
    pa, pb = a.provenance("heads") or {}, b.provenance("heads") or {}
    sa, sb = (pa.get("sample") or {}).get("prompt"), (pb.get("sample") or {}).get("prompt")
    rows = [p.get("rows") if isinstance(p.get("rows"), list) else None for p in (pa, pb)]
    files = [(task_identity(p) or (None, None))[1] for p in (pa, pb)]  # the source's wording of why is no difference
    checks = [("task", pa.get("task"), pb.get("task")), ("task file", *files),
              ("examples", pa.get("n_examples"), pb.get("n_examples"))]
    if rows[0] is None or rows[1] is None:  # a generated task: its seed (and model's tokenizer) draws the examples
        checks.append(("seed", a.manifest.get("seed"), b.manifest.get("seed")))
        if sa is None or sb is None:
            checks.append(("model", *[(r.manifest.get("model") or {}).get("name") for r in (a, b)]))
    diffs = [f"{what} {x} vs {y}" for what, x, y in checks if x != y]
    if rows[0] is not None and rows[1] is not None and rows[0] != rows[1] and pa.get("n_examples") == pb.get("n_examples"):
        diffs.append("other file rows")
    if sa is None or sb is None:
        diffs += [] if diffs else ["no sample prompt recorded to tell whether they are the same"]
    elif sa != sb:
        diffs.append("their sample prompts differ")
    return ", ".join(diffs)


def _deciding_point(run: Run, ordering: str) -> dict[str, Any] | None:
    """The point of `run`'s curve for a fixed `ordering` nearest its tolerance line (pruning.line_record): from
    the summary's prunable_ci_<ordering>, else computed from curve_examples.csv (older runs, and records from
    before review 10b A3 that judged the line by the level's standard error: no change_low); None without
    per-example values."""
    ci = (run.summary("heads") or {}).get(f"prunable_ci_{ordering}")
    if isinstance(ci, Mapping) and isinstance(ci.get("line"), Mapping) and "change_low" in ci["line"]:
        return dict(ci["line"]) or None
    examples = run.table("heads", "curve_examples")
    if examples is None or not {"ordering", "recompute", "seed", "n_pruned", "example", "metric"} <= set(examples.columns):
        return None
    from headscope.analyses.heads.pruning import line_record

    order, recompute = ordering.removesuffix("_recompute"), ordering.endswith("_recompute")
    rows = examples[(examples["ordering"] == order) & ((examples["recompute"].astype(str) == "True") == recompute)]
    if rows.empty or rows["seed"].nunique() != 1:
        return None
    wide = rows.pivot(index="n_pruned", columns="example", values="metric").sort_index()  # [points, n]
    return line_record(wide.to_numpy(dtype=float), wide.index.to_numpy(), *run_tolerance(run)) or None


def run_tolerance(run: Run) -> tuple[float, float | None]:
    """(the tolerance share, the chance value its band is measured from or None) of `run`'s heads counts: the
    summary's pruning_tolerance (pruning.tolerance_record: a log-probability's band is a share of the span from
    chance), else its settings' tolerance against |unpruned| (older runs)."""
    rec = (run.summary("heads") or {}).get("pruning_tolerance")
    if isinstance(rec, Mapping) and _number(rec.get("tolerance")):
        return float(rec["tolerance"]), (float(rec["chance"]) if _number(rec.get("chance")) else None)
    return float((_analysis_settings(run, "heads").get("pruning") or {}).get("tolerance") or 0.01), None


def held_count(run: Run, ordering: str) -> Any:
    """The count of heads where `run`'s bootstrap interval for `ordering` is that single value (reports/pruning_words.py
    then says "close to the 1% line", not fragile: the count held in most resamples), else None."""
    bounds = interval_heads(run.summary("heads") or {}, ordering)
    if bounds is None or bounds[0] != bounds[1]:
        return None
    return int(bounds[0]) if bounds[0].is_integer() else bounds[0]


def on_the_line(run: Run, ordering: str, fraction: float) -> str:
    """Where `run`'s fraction prunable by `ordering` turns on a hair: a point that decides it (a point kept, or the
    first point past the line) has a paired 95% interval of its change from unpruned that reaches the line
    (pruning.line_record; the line moves with the examples, so only the paired change counts), so another sample
    of examples could move the fraction a step; judged alike for A and B. Without per-example values: within EDGE
    of the tolerance band (a quarter of 1% of the unpruned metric), the run's standard error of its mean metric
    said for scale.
    "" otherwise, for random orderings (their seeds are stated instead) or where the curve is not recorded."""
    if ordering.startswith("random"):
        return ""
    point = _deciding_point(run, ordering)
    if point is not None:
        change, low, high = (point.get(k) for k in ("change", "change_low", "change_high"))
        if point.get("on_the_line") is not True or not all(map(_number, (change, low, high))):
            return ""
        where = "past" if point.get("past") else "inside"
        offset = float(point["line"]) - float(point["metric"]) + float(change)  # the line less the unpruned metric
        held = held_count(run, ordering)
        verdict = ("the count is fragile: another sample of examples could move it" if held is None else
                   f"its 95% bootstrap interval is the single value {_heads(held)}, so the count held in most "
                   "resamples of the examples, though this point's interval does not rule out a move")
        named = line_name(run.summary("heads") or {})
        return (f"{100 * fraction:.0f}% sits {'close to' if held is not None else 'on'} its {named}: the point at "
                f"{_heads(point.get('n_pruned'))} removed is {float(point['metric']):.4g}, {where} the line "
                f"{float(point['line']):.4g}; its change from unpruned {float(change):+.3g} has a paired 95% CI of "
                f"{float(low):+.3g} to {float(high):+.3g}, reaching the line's {offset:+.3g}: {verdict}")
    curve = _pruning_curves(run)
    if curve is None:
        return ""
    order, recompute = ordering.removesuffix("_recompute"), ordering.endswith("_recompute")
    rows = curve[(curve["ordering"] == order) & ((curve["recompute"].astype(str) == "True") == recompute)]
    means = rows.groupby("fraction_pruned")["metric"].mean()  # random: mean over seeds
    start = np.isclose(means.index.to_numpy(dtype=float), 0.0)
    if means.empty or not start.any():
        return ""
    base = float(means[start].iloc[0])
    from headscope.analyses.heads.pruning import tolerance_band

    tolerance, chance = run_tolerance(run)
    band = tolerance_band(base, tolerance, chance)
    line = base - band
    kept, past = means[means.index <= fraction + 1e-9], means[means.index > fraction + 1e-9]
    points = [("the last point kept", float(kept.iloc[-1]))] if not kept.empty else []
    points += [("the first point past it", float(past.iloc[0]))] if not past.empty else []
    close = [(what, m) for what, m in points if abs(m - line) < EDGE * band]
    if not close or band == 0:
        return ""
    what, m = close[0]
    se = metric_se(run)
    scale = f"; the standard error of its mean metric is {se:.2g}" if se is not None else ""
    return (f"{100 * fraction:.0f}% sits on its {line_name(run.summary('heads') or {})}: {what} is {m:.4g} against the line "
            f"{line:.4g}, " + (f"{100 * abs(m - line) / abs(base):.2g}% of the unpruned metric" if chance is None
                                else f"{abs(m - line):.2g} nats") + f" away{scale}")


def seed_counts(run: Run, ordering: str) -> list[float] | None:
    """Each random order's own count of heads prunable (prunable_ci_<ordering>'s per_seed_heads, else from
    curve.csv seed by seed with max_prunable_fraction's rule); None where neither is recorded."""
    s = run.summary("heads") or {}
    ci = s.get(f"prunable_ci_{ordering}")
    per = ci.get("per_seed_heads") if isinstance(ci, Mapping) else None
    if isinstance(per, list) and per and all(_number(x) for x in per):
        return [float(x) for x in per]
    curve, n = run.table("heads", "curve"), s.get("n_heads")
    if curve is None or not isinstance(n, int) or not {"ordering", "seed", "fraction_pruned", "metric"} <= set(curve.columns):
        return None
    from headscope.analyses.heads.pruning import max_prunable_fraction

    rows = curve[curve["ordering"] == ordering.removesuffix("_recompute")]
    tolerance, chance = run_tolerance(run)
    counts = []
    for _, g in rows.groupby("seed"):
        g = g.sort_values("fraction_pruned")
        counts.append(round(max_prunable_fraction(g, float(g["metric"].iloc[0]), tolerance, chance) * n, 3))
    return counts or None


def _seed_text(counts: list[float] | None) -> str:
    if not counts:
        return "per-seed counts not recorded"
    each = [f"{c:g}" for c in counts]  # review 8b C4: "1 and 0 heads", not "per seed 1, 0 heads, range 0-1"
    listed = and_join(each)
    span = f", range {min(counts):g}-{max(counts):g}" if len(counts) > 2 and min(counts) != max(counts) else ""
    return f"{listed} heads{span} over {len(counts)} seed{'s' if len(counts) != 1 else ''}"


MIN_SEEDS = 5  # random orders per run below which their counts' spread is no band


def _random_note(a: Run, b: Run, ordering: str, shown: list[str]) -> str:
    """A random ordering's counts seed by seed and whether their ranges overlap: no noise verdict (a bootstrap of
    the mean over seeds leaves out the seed spread, and a few seeds give no band)."""
    counts = [seed_counts(r, ordering) for r in (a, b)]
    text = (f"Prunable within 1% by {ordering.replace('_', ' ')} (mean over random orders): A {shown[0]} "
            f"({_seed_text(counts[0])}), B {shown[1]} ({_seed_text(counts[1])})")
    if all(counts):
        overlap = max(min(counts[0]), min(counts[1])) <= min(max(counts[0]), max(counts[1]))
        if min(len(c) for c in counts) < MIN_SEEDS:  # review 14a C5: 1-2 seeds are no spread: not compared
            return NOT_COMPARED + text + (f": not compared: too few seeds for a noise verdict (fewer than {MIN_SEEDS} "
                                          f"in {'both runs' if max(len(c) for c in counts) < MIN_SEEDS else 'a run'}; "
                                          f"the seed ranges {'overlap' if overlap else 'do not overlap'}).")
        if overlap:
            return SAME + text + "; within the seeds' spread: the seed ranges overlap."
        return text + "; beyond the seeds' spread: the seed ranges do not overlap."
    return NOT_COMPARED + text + ": not compared: no noise verdict without each seed's count."


def within_words(sums: list[Mapping[str, Any]]) -> str:
    """How far below unpruned the two runs' counts allow: "1%", or where a run's band is a share of the span from
    chance (a log-probability: pruning.tolerance_record), that share and each run's band in the metric's units."""
    recs = [s.get("pruning_tolerance") if isinstance(s.get("pruning_tolerance"), Mapping) else {} for s in sums]
    share = next((float(r["tolerance"]) for r in recs if _number(r.get("tolerance"))), 0.01)
    if not any(r.get("basis") == "span" for r in recs):
        return f"{100 * share:g}%"
    bands = [f"{side} {float(r['band']):.3g} nats" if r.get("basis") == "span" and _number(r.get("band")) else
             f"{side} {100 * share:g}% of |unpruned|" for side, r in zip(SIDES, recs)]
    return f"{100 * share:g}% of the span from chance ({', '.join(bands)} below unpruned)"


def pruning_notes(a: Run, b: Run) -> list[str]:
    """The fractions prunable within 1%, ordering by ordering: first the one each run's heads finding leads with
    (lead_ordering), said even when equal, then the others that differ by 5 points or more; each with the
    recorded intervals' verdict ("no interval recorded" without them) and where a fraction sits on its 1% line.
    Where the runs are of different models (models_differ), ran heads on different tasks (tasks_differ) or on
    different examples of one task (examples_differ), the fixed orderings' counts are not compared (NOT_COMPARED:
    re-ranking is outside the intervals), with each reason that holds; random orderings get each seed's count and
    no verdict, and are not compared across tasks. Where the findings' verdicts on a count differ (an interval
    reaching 0 heads on one side only, or one count on its 1% line), that is said (compare_prunable.verdict_words),
    and equal counts are then no agreement. One model at two precisions whose counts differ: the point that splits
    them against the lower precision's rounding (compare_prunable.precision_words), said a rounding difference
    instead of a noise verdict where it lies within it."""
    sums = [a.summary("heads") or {}, b.summary("heads") or {}]
    (lead_a, pa), (lead_b, pb) = lead_ordering(sums[0]), lead_ordering(sums[1])
    notes = []
    if lead_a and lead_b and lead_a != lead_b:
        notes.append(f"The heads findings lead with different orderings: A {lead_a.replace('_', ' ')} "
                     f"({100 * pa[lead_a]:.0f}%), B {lead_b.replace('_', ' ')} ({100 * pb[lead_b]:.0f}%).")
    leads = [o for o in dict.fromkeys([lead_a, lead_b]) if o]
    other_task = tasks_differ(a, b, "heads")
    model = models_differ(a, b)
    examples = "" if other_task else examples_differ(a, b)  # another task: its examples differ by that
    ranked = "the runs ranked heads on different examples"
    reranked = (f"{model}, each ranking its own heads, and {ranked} ({examples}): the intervals do not cover re-ranking"
                if model and examples else f"{model}, each ranking its own heads, and the intervals do not cover re-ranking"
                if model else f"{ranked}, and the intervals do not cover re-ranking ({examples})" if examples else "")
    differ = "; ".join(x for x in (other_task, reranked) if x)
    for ordering in [*leads, *sorted(k for k in pa if k in pb and k not in leads)]:
        if ordering not in pa or ordering not in pb:
            continue
        fa, fb = pa[ordering], pb[ordering]
        lead = ordering in leads
        if not lead and abs(fa - fb) < 0.05:
            continue
        counts = [s.get(f"heads_prunable_{ordering}") for s in sums]
        shown = [f"{100 * f:.0f}%" + (f" ({c:.0f} of {s.get('n_heads')} heads)" if _number(c) and s.get("n_heads") else "")
                 for f, c, s in zip((fa, fb), counts, sums)]
        whose = "both heads findings lead" if lead_a == lead_b else f"{'A' if ordering == lead_a else 'B'}'s heads finding leads"
        which = f" (the ordering {whose} with)"
        if ordering.startswith("random"):  # a mean over seeds is no count of heads: the seeds' own counts instead
            note = _random_note(a, b, ordering, [f"{100 * f:.0f}%" for f in (fa, fb)])
            base = note.removeprefix(SAME).removeprefix(NOT_COMPARED).split(": not compared:")[0].split(
                "; within the seeds'")[0].split("; beyond the seeds'")[0].removesuffix(".")
            notes.append(NOT_COMPARED + base + f": not compared: {other_task}." if other_task else
                         SAME + base + ": the same mean at the shown precision." if fa == fb else
                         note)  # random orders re-rank nothing: only another task refuses
            continue
        text = (f"Prunable within {within_words(sums)} by {ordering.replace('_', ' ')}{which if lead else ''}: "
                f"A {shown[0]}, B {shown[1]}"
                + (f" ({n_words(*sums)})" if sums[0].get("n_examples") != sums[1].get("n_examples") else ""))
        intervals = [prunable_interval(s, ordering) for s in sums]
        lines = [on_the_line(run, ordering, f) for run, f in zip((a, b), (fa, fb))]
        fragile = tuple(bool(line) and held_count(run, ordering) is None for line, run in zip(lines, (a, b)))
        fragile = fragile if fa == fb else (False, False)  # else said by the lines below
        verdicts = "" if differ else verdict_words(a, b, ordering, (fa, fb), fragile)
        if differ:
            text = NOT_COMPARED + text + f": not compared: {differ}."
        elif fa == fb:  # one count, but the findings' verdicts on it can differ (review 8b A4)
            text = text + f": the same count, but {verdicts}." if verdicts else SAME + text + "."
        else:
            rounding, within = precision_words(a, b, ordering, counts)
            if within:  # one model at two precisions, the counts split by rounding: no verdict about the model
                text += f": {rounding}."
            elif all(intervals):
                text += noise_verdict(fa, fb, *intervals)
            else:
                side = "A" if intervals[0] is None else "B"
                text += NO_INTERVAL if not any(intervals) else (f" (no interval recorded for {side}: whether this is "
                                                                "beyond noise is not known).")
            if not within:
                text += f" The {verdicts.removeprefix('the ')}." if verdicts else ""
                text += f" {rounding[0].upper()}{rounding[1:]}." if rounding else ""
        edges = [f"{side}'s {edge}" for side, edge in zip(SIDES, lines) if edge]
        notes.append(text + ("" if not edges else " " + "; ".join(edges) + "."))
    return notes


def _heads(k: Any) -> str:
    return f"{k} head" if k == 1 else f"{k} heads"
