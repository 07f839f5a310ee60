"""Head importance for `headscope compare`: A and B's importance on one scale with B - A muted where the difference
lies within the runs' own uncertainty (`noise_band`), and the importance r (`pearson_words`); the prunable fractions
are compare_pruning.py's.
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
from headscope.reports.compare_run import (
    NOT_COMPARED,
    PRECISION_BITS,
    SAME,
    SIDES,
    Run,
    _img,
    _number,
    precision_only,
    same_rows,
    tasks_differ,
)
from headscope.reports.compare_top import refuses_to_rank, top_heads_notes
from headscope.reports.findings import ci_pair
from headscope.reports.plots import color_scale, fit_title, symmetric_bound

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
    rounding_relative_gradient (GRADIENT_TIE_STEPS eps of the dtype the gradients ran in, numerics.numerical_checks),
    else the same from the manifest's dtype (older reports); None where neither says."""
    from headscope.analyses.heads.numerics import GRADIENT_TIE_STEPS  # the analysis's own tie rule

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
        side, run = next((sd, r) for sd, r, g in zip(SIDES, (a, b), grids) if g is None)  # `is`: a grid is a DataFrame
        why = run.why_blank("heads") if run.summary("heads") is None else "no heads/results.csv with an importance column"
        notes.append(NOT_COMPARED + f"Head importance: {side} has none ({why}); only the other run is drawn.")
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


