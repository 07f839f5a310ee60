"""`headscope compare OUT_A OUT_B`: one self-contained HTML page setting two reports side by side.

Reads only the files of two output folders (manifest.json, <analysis>/summary.json, task.json and CSVs):
each analysis's finding for A and B, head importance in raw units on one scale (A and B: sequential
from 0 for gradient importance, else diverging; B - A diverging on its own when the shapes agree), the
pruning curves and position curves of both on shared axes, and the top patching sites, with the
differences called out in words: first every setting that differs (per analysis its task, source, n
and budget changes too), each headline difference marked within or beyond the runs' own 95% intervals,
each blank cell with its reason, and both runs' provenance at the end. Top heads are not compared
where a report does not rank them (at chance, importance that is rounding, tied top heads), nor
patching positions of different prompts. Every string from the folders
is escaped; figures are inline PNG.
"""
from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from headscope.errors import ConfigError, OutputError, OutputExistsError
from headscope.reports import io
from headscope.reports.compare_figures import FIGURE_CSS, NOT_COMPARED, figures_section
from headscope.reports.findings import _words, finding, t_interval, wilson
from headscope.reports.html_report import CSS, _provenance
from headscope.reports.plots import color_scale, symmetric_bound
from headscope.reports.provenance import provenance_lines, section_provenance
from headscope.reports.render import escape, figure_png

SIDES = ("A", "B")
SAME = "(same) "  # prefix of a note that reports agreement: shown in its section, not listed as a difference
NO_INTERVAL = " (no interval recorded: whether this is beyond noise is not known)."
HEADLINES = {"heads": "baseline_metric", "kv": "metric_unevicted", "probes": "best_{metric}"}  # what each finding reads


class Run:
    """One output folder: its manifest and, per analysis, its summary and tables (read lazily)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.manifest = json.loads((self.path / "manifest.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise OutputError(f"{str(self.path)!r} is not a headscope output folder (no readable manifest.json: "
                              f"{getattr(err, 'strerror', None) or err}).") from None
        if not isinstance(self.manifest, dict):
            raise OutputError(f"{str(self.path)!r}: manifest.json is not a headscope manifest.")

    @property
    def label(self) -> str:
        model = (self.manifest.get("model") or {}).get("name", "?")
        task = (self.manifest.get("config") or {}).get("task") or "default task"
        return f"{model} ({task}, seed {self.manifest.get('seed', '?')})"

    def summary(self, name: str) -> dict[str, Any] | None:
        try:
            data = io.read_json(self.path / name / "summary.json")
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def status(self, name: str) -> str:
        """The manifest's status of analysis `name` ("" when it records none)."""
        status = self.manifest.get("status") or {}
        return str(status.get(name, "")) if isinstance(status, dict) else ""

    def provenance(self, name: str) -> dict[str, Any] | None:
        """The section provenance of analysis `name` (task, source, n, sample; reports/provenance.py), None
        when it has no summary."""
        if self.summary(name) is None:
            return None
        used = self.manifest.get("task_used") or {}
        return section_provenance(self.path / name, str(used.get(name, "")) if isinstance(used, dict) else "")

    def why_blank(self, name: str) -> str:
        """Why this run has no result for analysis `name`: its manifest status, or that it did not run it."""
        analyses = (self.manifest.get("config") or {}).get("analyses") or []
        state = self.status(name)
        if state and state not in ("done", "done (resumed)"):
            return state
        if name not in analyses:
            return "not part of this run (not among its analyses)"
        return f"no readable {name}/summary.json in this folder"

    def table(self, name: str, stem: str) -> pd.DataFrame | None:
        try:
            return pd.read_csv(self.path / name / f"{stem}.csv")
        except (OSError, ValueError):  # missing, empty or unreadable: the comparison leaves it out
            return None


def _img(fig: Any, alt: str) -> str:
    png = figure_png(fig)
    plt.close(fig)
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}" style="max-width:100%">'


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


Z95 = 1.96  # two-sided 95% normal quantile: a difference within Z95 x its standard error is within noise
SE_COLUMNS = ("importance_se", "importance_stderr", "se")  # a per-head standard error, where results.csv has one
MUTED_GREY = "#d9d9d9"


def metric_se(run: Run) -> float | None:
    """The standard error of `run`'s mean task metric in its heads analysis: its chance guard's 95% CI
    half-width / 1.96 (None where the summary records no such interval)."""
    chance = (run.summary("heads") or {}).get("chance")
    if not isinstance(chance, Mapping) or chance.get("ci_level", 0.95) != 0.95:
        return None
    ci = chance.get("ci")
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(_number(x) for x in ci) and ci[1] >= ci[0]:
        return (float(ci[1]) - float(ci[0])) / (2 * Z95)
    return None


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and bool(np.isfinite(x))


def _head_se(run: Run, method: str) -> pd.DataFrame | None:
    """[layer, head] standard errors of `method`'s importance from results.csv (None without such a column)."""
    df = run.table("heads", "results")
    column = next((c for c in SE_COLUMNS if df is not None and c in df.columns), None)
    if column is None or not {"method", "layer", "head"} <= set(df.columns):
        return None
    return df[df["method"] == method].pivot(index="layer", columns="head", values=column)


def noise_band(a: Run, b: Run, method: str, raw: bool) -> tuple[Any, str]:
    """The [layer, head] bound (or one number) under which |B - A| of `method`'s importance lies within the runs'
    own uncertainty, and the rule in words: 1.96 x sqrt(seA^2 + seB^2) with per-head standard errors where
    results.csv has them, else with each run's standard error of its mean task metric (an importance is a change
    in that metric; its spread over examples is not recorded, so the metric's stands in), and never below the
    numerical noise floor either records; None where neither records any (nothing is muted)."""
    floors = [s.get("noise_floor") for s in (a.summary("heads") or {}, b.summary("heads") or {})]
    floor = max((float(f) for f in floors if _number(f)), default=None)
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
        band = floor
        rule = (f"grey where |B - A| < {floor:.3g}, the numerical noise floor the runs record: neither records a "
                "sampling interval, so differences above it may still be sampling noise")
        return band, rule
    else:
        return None, "neither run records an uncertainty for head importance: nothing is muted"
    if floor is not None:
        band = np.maximum(band, floor)
        rule += f" (never below the noise floor {floor:.3g})"
    return band, rule


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


def importance_figure(a: Run, b: Run) -> tuple[Any, list[str], str] | None:
    """The importance heat maps of A and B on one scale (and B - A, noise muted, when the model shapes and
    quantities agree), the notes on the top heads and the muting rule, and the alt text; None without data."""
    found = [_importance_grid(a), _importance_grid(b)]
    if all(g is None for g in found):
        return None
    grids = [None if g is None else g[0] for g in found]
    whats = [None if g is None else g[1] for g in found]
    methods = [g[2] for g in found if g is not None]
    same = all(g is not None for g in grids) and grids[0].shape == grids[1].shape and whats[0] == whats[1]
    panels = [(f"{side}: {what}", g) for side, g, what in zip(SIDES, grids, whats) if g is not None]
    bound = symmetric_bound(*[g.to_numpy(dtype=float) for g in grids if g is not None])  # A and B: one scale
    if same:
        panels.append(("B - A", grids[1] - grids[0]))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.8), squeeze=False)
    notes, rule = [], ""
    for ax, (title, grid) in zip(axes[0], panels):
        if title == "B - A":
            band, rule = noise_band(a, b, methods[0], "layer-normalised" not in whats[0])
            difference_panel(ax, grid, band)
            ax.set(title="B - A" + ("\n(grey: within the runs' noise)" if band is not None else "\n(nothing muted)"),
                   xlabel="head", ylabel="layer")
            notes.append(SAME + f"B - A head importance: {rule}.")
            continue
        unsigned = all(m == "gradient" for m in methods)  # |dL/d gate|: sequential from 0
        sns.heatmap(grid, ax=ax, **color_scale(grid.to_numpy(dtype=float), bound=bound, is_signed=not unsigned),
                    cbar_kws={"label": "importance (its own units)"}, xticklabels=True, yticklabels=True)
        ax.set(title=title, xlabel="head", ylabel="layer")
    fig.tight_layout()
    refusals = [None if g is None else _refuses_to_rank(run, g[2]) for g, run in zip(found, (a, b))]
    if same and any(refusals):
        why = "; ".join(f"{side} {r}" for side, r in zip(SIDES, refusals) if r)
        notes.insert(0, NOT_COMPARED + f"Head importance ({whats[0]}): the top heads cannot be compared, because {why}, so "
                     f"{'neither report ranks' if all(refusals) else 'that report does not rank'} its heads; no shared "
                     "top heads or correlation is computed.")
    elif same:
        top = [set(map(tuple, g.stack().sort_values(ascending=False).index[:5])) for g in grids]
        shared = sorted(top[0] & top[1])
        r = float(np.corrcoef(grids[0].to_numpy().ravel(), grids[1].to_numpy().ravel())[0, 1])
        text = (f"Head importance ({whats[0]}): Pearson r = {r:.2f} between A and B; {len(shared)} of the top 5 heads "
                "are shared" + (f" ({', '.join(f'L{l}H{h}' for l, h in shared)})." if shared else "."))
        notes.insert(0, text if r < 0.95 or len(shared) < 5 else SAME + text)
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


def importance_section(a: Run, b: Run) -> tuple[str, list[str]]:
    """Importance heat maps of A and B on one scale and B - A with the cells within noise muted
    (importance_figure), as an inline PNG, with its notes."""
    drawn = importance_figure(a, b)
    if drawn is None:
        return "", []
    fig, notes, alt = drawn
    return _img(fig, alt), notes


def _refuses_to_rank(run: Run, method: str) -> str | None:
    """Why run's own heads finding does not rank its heads by `method` (reports/plots_heads.py's finding), or None:
    the model at chance on the task, importance that is rounding (degenerate_<method>), or top heads
    that tie within rounding (tied_top_heads_<method>)."""
    s = run.summary("heads") or {}
    chance = s.get("chance")
    if isinstance(chance, Mapping) and chance.get("at_chance") is True:
        return "is at chance on its task" if chance.get("below_chance") is not True else "is below chance on its task"
    base = s.get("baseline_metric")
    if "chance" not in s and s.get("metric") == "logit_diff" and isinstance(base, (int, float)) and abs(base) < 0.1:
        return f"is at chance on its task (logit difference {base:.3g}, near 0)"
    if s.get(f"degenerate_{method}"):
        return f"has {method} importance that is rounding, not a measurement"
    tied = s.get(f"tied_top_heads_{method}")
    if isinstance(tied, list) and tied:
        return f"has top heads that tie within rounding ({', '.join(map(str, tied))})"
    return None


def chance_refusal(a: Run, b: Run, name: str) -> str:
    """"not compared: A at chance on its task" (or B, or both, or below chance) when either run's
    analysis `name` is at or below chance, as its own report says (a quantity relative to a clean
    metric at chance is refused there, so it is not compared here); "" otherwise."""
    where: dict[str, list[str]] = {}  # "at" / "below" -> the sides there
    for side, run in zip(SIDES, (a, b)):
        chance = (run.summary(name) or {}).get("chance")
        if isinstance(chance, Mapping) and chance.get("at_chance") is True:
            where.setdefault("below" if chance.get("below_chance") is True else "at", []).append(side)
    said = [f"{' and '.join(sides)} {level} chance on {'its task' if len(sides) == 1 else 'their tasks'}"
            for level, sides in where.items()]
    return "not compared: " + " and ".join(said) if said else ""


STYLES = {"A": {"linestyle": "-", "marker": "o", "linewidth": 3.0, "alpha": 0.55, "zorder": 2},  # wide, pale
          "B": {"linestyle": "--", "marker": "s", "linewidth": 1.4, "alpha": 1.0, "zorder": 3}}  # thin, on top


def _overlay(frames: list[pd.DataFrame | None], key: str, x: str, y: str, xlabel: str, ylabel: str, title: str) -> Any:
    """Lines of A and B on one axis, one colour per `key` value: A wide, pale and solid with circles, B thin,
    dashed with squares and drawn on top, so a B line on A's is seen inside it rather than hidden; within a side
    each later line is narrower and above the earlier ones (A's gradient and gradient-recomputed both show)."""
    fig, ax = plt.subplots(figsize=(8, 4))
    keys = list(dict.fromkeys(k for f in frames if f is not None for k in f[key]))
    colours = dict(zip(keys, sns.color_palette(n_colors=max(1, len(keys)))))
    for side, frame in zip(SIDES, frames):
        if frame is None:
            continue
        groups = list(frame.groupby(key, sort=False))
        for i, (k, group) in enumerate(groups):  # each later line narrower and on top: one side's equal curves show too
            mean = group.groupby(x)[y].mean()
            style = {**STYLES[side], "linewidth": STYLES[side]["linewidth"] * (1 + (len(groups) - 1 - i) / len(groups)),
                     "zorder": STYLES[side]["zorder"] + i / len(groups)}
            ax.plot(mean.index, mean.to_numpy(), markersize=4, color=colours[k], label=f"{side}: {k}", **style)
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig


OVERLAY_TITLE = "A wide solid circles, B thin dashed squares"
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
    return _img(fig, f"pruning curves of A and B on shared axes, {OVERLAY_TITLE}"), pruning_notes(a, b)


def lead_ordering(s: Mapping[str, Any]) -> tuple[str | None, dict[str, float]]:
    """The ordering the heads finding leads with (the most heads prunable within 1%, orderings whose importance is
    rounding left out, as reports/plots_heads.py's finding does) and {ordering: fraction prunable}."""
    degenerate = {k.removeprefix("degenerate_") for k in s if k.startswith("degenerate_")}
    noisy = {"gradient"} & degenerate | ({"ablation"} if degenerate & {"zero", "mean", "resample"} else set())
    prunable = {k.removeprefix(PRUNABLE): float(v) for k, v in s.items() if k.startswith(PRUNABLE) and _number(v)
                and k.removeprefix(PRUNABLE).removesuffix("_recompute") not in noisy}
    return (max(prunable, key=lambda k: prunable[k]) if prunable else None), prunable


INTERVAL_WORDS = {"ci", "interval", "intervals"}


def prunable_interval(s: Mapping[str, Any], ordering: str) -> tuple[float, float] | None:
    """The interval the heads summary records for the fraction prunable by `ordering`, if any: a key naming
    pruning and an interval (max_fraction_prunable_<ordering>_ci, ..._interval) holding [low, high], or a
    mapping under such a key ({ordering: [low, high]})."""
    names = {f"{PRUNABLE}{ordering}", f"fraction_prunable_{ordering}", f"prunable_{ordering}"}
    for key, value in s.items():
        words = key.split("_")
        if "prun" not in key or not INTERVAL_WORDS & set(words):
            continue
        stripped = "_".join(w for w in words if w not in INTERVAL_WORDS)
        if isinstance(value, Mapping):
            value = value.get(ordering, value.get(f"{PRUNABLE}{ordering}"))
        elif stripped not in names:
            continue
        if isinstance(value, Mapping):
            value = [value.get(k) for k in ("low", "high")] if "low" in value else [value.get("lower"), value.get("upper")]
        if isinstance(value, (list, tuple)) and len(value) == 2 and all(_number(x) for x in value):
            return float(value[0]), float(value[1])
    return None


EDGE = 0.25  # a curve point closer to the 1% line than this share of the band (0.25% of the metric) sits on it


def on_the_line(run: Run, ordering: str, fraction: float) -> str:
    """Where `run`'s fraction prunable by `ordering` turns on a hair: the last point kept, or the first point past
    it, lies within EDGE of the tolerance band (a quarter of 1% of the unpruned metric) of the line, so a
    resample of the examples could move the fraction a step; "" otherwise or where the curve is not recorded.
    The run's standard error of its mean metric is said beside it for scale."""
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
    tolerance = float((_analysis_settings(run, "heads").get("pruning") or {}).get("tolerance") or 0.01)
    line, band = base - tolerance * abs(base), tolerance * abs(base)
    kept, past = means[means.index <= fraction + 1e-9], means[means.index > fraction + 1e-9]
    points = [("the last point kept", float(kept.iloc[-1]))] if not kept.empty else []
    points += [("the first point past it", float(past.iloc[0]))] if not past.empty else []
    close = [(what, m) for what, m in points if abs(m - line) < EDGE * band]
    if not close or band == 0:
        return ""
    what, m = close[0]
    se = metric_se(run)
    scale = f"; the standard error of its mean metric is {se:.2g}" if se is not None else ""
    return (f"{100 * fraction:.0f}% sits on its {100 * tolerance:g}% line: {what} is {m:.4g} against the line "
            f"{line:.4g}, {100 * abs(m - line) / abs(base):.2g}% of the unpruned metric away{scale}")


def _analysis_settings(run: Run, name: str) -> Mapping[str, Any]:
    settings = ((run.manifest.get("config") or {}).get("settings") or {}).get("analysis_configs") or {}
    found = settings.get(name) if isinstance(settings, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def pruning_notes(a: Run, b: Run) -> list[str]:
    """The fractions prunable within 1%, ordering by ordering: first the one each run's heads finding leads with
    (lead_ordering), said even when equal, then the others that differ by 5 points or more; each with the
    recorded intervals' verdict ("no interval recorded" without them) and where a fraction sits on its 1% line."""
    sums = [a.summary("heads") or {}, b.summary("heads") or {}]
    (lead_a, pa), (lead_b, pb) = lead_ordering(sums[0]), lead_ordering(sums[1])
    notes = []
    if lead_a and lead_b and lead_a != lead_b:
        notes.append(f"The heads findings lead with different orderings: A {lead_a.replace('_', ' ')} "
                     f"({100 * pa[lead_a]:.0f}%), B {lead_b.replace('_', ' ')} ({100 * pb[lead_b]:.0f}%).")
    leads = [o for o in dict.fromkeys([lead_a, lead_b]) if o]
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
        text = (f"Prunable within 1% by {ordering.replace('_', ' ')}{which if lead else ''}: A {shown[0]}, B {shown[1]}")
        intervals = [prunable_interval(s, ordering) for s in sums]
        if fa == fb:
            text = SAME + text + "."
        elif all(intervals):
            text += noise_verdict(fa, fb, *intervals)
        else:
            text += NO_INTERVAL if not any(intervals) else (f" (no interval recorded for {'A' if intervals[0] is None else 'B'}"
                                                            ": whether this is beyond noise is not known).")
        edges = [f"{side}'s {edge}" for side, run, f in zip(SIDES, (a, b), (fa, fb))
                 if (edge := on_the_line(run, ordering, f))]
        notes.append(text + ("" if not edges else " " + "; ".join(edges) + "."))
    return notes


def position_section(a: Run, b: Run) -> tuple[str, list[str]]:
    """Both runs' position curves of the plotted metric on one axis, where they are compared (neither at chance,
    the same metric plotted); otherwise no overlay, only the reason (the reports' own figures are side by side
    in the figures section)."""
    curves = []
    primaries = [(r.summary("position") or {}).get("primary_metric", "accuracy") for r in (a, b)]
    for run, primary in zip((a, b), primaries):
        c = run.table("position", "curve")
        ok = c is not None and {"condition", "metric", "position", "mean"} <= set(c.columns)
        curves.append(c[(c["condition"] == "full") & (c["metric"] == primary)] if ok else None)  # one scale per axis
    if all(c is None for c in curves):
        return "", []
    label = f"Middle/ends ratio of {primaries[0]} (the metric plotted)"
    refused = chance_refusal(a, b, "position")
    if refused or primaries[0] != primaries[1]:
        why = (f"{label}: {refused}." if refused else
               f"Position curves and middle/ends ratio: not compared: A plots {primaries[0]}, B {primaries[1]}.")
        return ("<p><em>no overlay: " + escape(why) + " Each report's own position figures are below, side by side."
                "</em></p>", [NOT_COMPARED + why])
    notes = []
    ratios = [((r.summary("position") or {}).get("ratio_middle_to_ends") or {}).get(m) for r, m in zip((a, b), primaries)]
    if all(isinstance(r, (int, float)) for r in ratios) and abs(ratios[0] - ratios[1]) >= 0.05:
        notes.append(f"{label}: A {ratios[0]:.2f}, B {ratios[1]:.2f}" + NO_INTERVAL)
    fig = _overlay(curves, "metric", "position", "mean", "gold position (slot)", "primary metric (mean over examples)",
                   f"position curves: {OVERLAY_TITLE}")
    return _img(fig, f"position curves of {primaries[0]} of A and B on shared axes, {OVERLAY_TITLE}"), notes


def _site_name(kind: str, cell: Mapping[str, Any]) -> str:
    parts = [kind, f"L{cell.get('layer')}"]
    if cell.get("head") is not None:
        parts.append(f"H{cell['head']}")
    if cell.get("pos") is not None:
        token = str(cell.get("token") or "")  # empty where the prompts' tokens differ there
        parts.append(f"pos {token}" if token.startswith(f"{cell['pos']}:") else f"pos {cell['pos']} {token}".rstrip())
    return " ".join(map(str, parts))


def patching_section(a: Run, b: Run, n: int = 3) -> tuple[str, list[str]]:
    """The top sites of each site type, A and B in adjacent columns; differing first sites are noted."""
    tops = [(r.summary("patching") or {}).get("top_sites") or {} for r in (a, b)]
    kinds = list(dict.fromkeys([*tops[0], *tops[1]]))
    if not kinds:
        return "", []
    rows, notes = [], []
    refused = chance_refusal(a, b, "patching")
    if refused:  # each report ranks no site at chance: shares of a gap between chance-level metrics are noise
        return (f"<p><em>blank: top patching sites {escape(refused)}</em></p>",
                [NOT_COMPARED + f"Top patching sites: {refused} (its report ranks no site)."])
    sums = [r.summary("patching") or {} for r in (a, b)]
    noisy = [side for side, s in zip(SIDES, sums) if isinstance(s.get("gap_within_noise"), Mapping)]
    if noisy:
        why = f"not compared: {' and '.join(noisy)} {'has a' if len(noisy) == 1 else 'have'} clean-corrupted gap within noise"
        return (f"<p><em>blank: top patching sites {escape(why)}</em></p>",
                [NOT_COMPARED + f"Top patching sites: {why} (its report ranks no site)."])
    gaps = [_gap(s) for s in sums]
    differ = prompts_differ(a, b, "patching")
    for kind in kinds:
        cells = [t.get(kind, [])[:n] for t in tops]
        if differ and any(c.get("pos") is not None for side in cells for c in side):
            blank = f"<em>blank: positions are not compared: {escape(differ)}</em>"
            rows.append(f"<tr><td>{escape(kind)}</td><td>{blank}</td><td>{blank}</td></tr>")
            notes.append(NOT_COMPARED + f"Top {kind} sites are not compared: {differ}.")
            continue
        for i in range(max(len(c) for c in cells)):
            row = [escape(kind) if i == 0 else ""]
            for side, gap, s in zip(cells, gaps, sums):
                cell = side[i] if i < len(side) else None
                effect = float(cell.get("effect", float("nan"))) if cell is not None else 0.0
                row.append(f"<em>(its summary lists {len(side)} {escape(kind)} site(s))</em>" if cell is None
                           else f"{escape(_site_name(kind, cell))}: {escape(_effect_text(effect, gap, s))}")
            rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>")
        firsts = [tuple(c[0].get(k) for k in ("layer", "head", "pos")) if c else None for c in cells]
        if all(firsts) and firsts[0] != firsts[1]:
            notes.append(f"Top {kind} site differs: A {_site_name(kind, cells[0][0])}, B {_site_name(kind, cells[1][0])}.")
    table = ("<table><tr><th>site type</th><th>A: site: effect</th><th>B: site: effect</th></tr>" + "".join(rows)
             + "</table>")
    return table, notes


def _gap(s: Mapping[str, Any]) -> float | None:
    """The clean-corrupted gap the report divides effects by (None when the effects are already normalised
    or the summary does not give both metrics), as in reports/plots_patching.py's finding."""
    clean, corrupt = s.get("clean_metric"), s.get("corrupted_metric")
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) and np.isfinite(x) for x in (clean, corrupt))
    return None if s.get("normalized") or not numbers or clean == corrupt else float(clean - corrupt)


def _effect_text(effect: float, gap: float | None, s: Mapping[str, Any]) -> str:
    """An effect in the report's own unit: its share of the clean-corrupted gap with the raw value in the task
    metric beside it ("0.98 of the gap (+24.1 logit difference)"), or the normalised effect as is."""
    if gap is None:
        return f"{effect:.2f} of the gap (normalised)" if s.get("normalized") else f"{effect:.3g}"
    return f"{effect / gap:.2f} of the gap ({effect:+.3g} {_words(s.get('metric', ''))})"


def prompts_differ(a: Run, b: Run, name: str) -> str:
    """Why runs A and B did not run analysis `name` on the same prompts ("" when they did, as far as
    their records tell: one model, seed, task, example count and sample prompt). A position indexes
    its own run's prompts, so positions of different prompts name different tokens."""
    pa, pb = a.provenance(name) or {}, b.provenance(name) or {}
    sa, sb = (pa.get("sample") or {}).get("prompt"), (pb.get("sample") or {}).get("prompt")
    model = [(r.manifest.get("model") or {}).get("name") for r in (a, b)]
    checks = [("seed", a.manifest.get("seed"), b.manifest.get("seed")),
              ("task", pa.get("task"), pb.get("task")), ("examples", pa.get("n_examples"), pb.get("n_examples"))]
    if sa is None or sb is None:  # no sample to compare: another model may tokenize (or sample) otherwise
        checks.insert(0, ("model", *model))  # (two checkpoints of one model, with equal samples, are compared)
    diffs = [f"{what} {x} vs {y}" for what, x, y in checks if x != y]
    if sa is not None and sb is not None and sa != sb:
        diffs.append("their sample prompts differ")
    if not diffs:
        return ""
    return ("A and B patched different prompts (" + ", ".join(diffs) + "), and a position names a token of the prompts "
            "its own run patched")


def settings_notes(a: Run, b: Run, names: list[str]) -> list[str]:
    """Every setting that differs between the runs: model, task, seed, --quick, --n-examples, budget,
    the commit and package versions (manifest.json), and per analysis the task it ran on with its source,
    its example count and what the budget changed (its section provenance, reports/provenance.py)."""
    ma, mb = a.manifest, b.manifest
    ca, cb = ma.get("config") or {}, mb.get("config") or {}
    rows = [("model", (ma.get("model") or {}).get("name"), (mb.get("model") or {}).get("name")),
            ("task", ca.get("task") or "default", cb.get("task") or "default"), ("seed", ma.get("seed"), mb.get("seed")),
            ("--quick", bool(ca.get("quick")), bool(cb.get("quick"))),
            ("--n-examples", ca.get("n_examples"), cb.get("n_examples")),
            ("budget (minutes)", ca.get("budget_minutes"), cb.get("budget_minutes")),
            ("commit", ma.get("git_sha"), mb.get("git_sha"))]
    va, vb = ma.get("versions") or {}, mb.get("versions") or {}
    if isinstance(va, dict) and isinstance(vb, dict):
        rows += [(f"{pkg} version", va.get(pkg), vb.get(pkg)) for pkg in sorted(set(va) | set(vb))]
    for name in names:
        pa, pb = a.provenance(name), b.provenance(name)
        if pa is None or pb is None:  # one side has no result: the findings table says why
            continue
        rows.append((f"{name} task", _task_text(pa), _task_text(pb)))
        rows.append((f"{name} examples", pa.get("n_examples"), pb.get("n_examples")))
        rows.append((f"{name} budget changes", _budget_text(pa), _budget_text(pb)))
    return [f"{what}: A {'not set' if x is None else x}, B {'not set' if y is None else y}."
            for what, x, y in rows if x != y]


def _task_text(record: Mapping[str, Any]) -> str:
    return f"{record.get('task') or 'not recorded'} ({record.get('source') or 'source not recorded'})"


def _budget_text(record: Mapping[str, Any]) -> str:
    changed = record.get("budget_changed") or {}
    return ", ".join(f"{k} {v[0]} -> {v[1]}" if isinstance(v, (list, tuple)) and len(v) == 2 else f"{k} {v}"
                     for k, v in changed.items()) or "none"


def interval(summary: Mapping[str, Any], key: str) -> tuple[float, float] | None:
    """The 95% interval the run recorded for summary[key], the number a finding reads: the chance guard's
    interval of the clean mean when it is that same mean (baseline_metric, metric_unevicted); for a probe's
    best accuracy the Wilson interval over its n examples, for its best R^2 the t interval over its folds."""
    value = summary.get(key)
    if not isinstance(value, (int, float)):
        return None
    chance = summary.get("chance")
    if isinstance(chance, Mapping) and isinstance(chance.get("mean"), (int, float)):
        ci = chance.get("ci")
        same = abs(chance["mean"] - value) <= 1e-6 + 1e-3 * abs(value)  # the guard's mean is this number
        if same and isinstance(ci, (list, tuple)) and len(ci) == 2 and all(isinstance(x, (int, float)) for x in ci):
            return float(ci[0]), float(ci[1])
    n = summary.get("n_examples")
    if key == "best_accuracy" and isinstance(n, int) and n > 0 and 0 <= value <= 1:
        return wilson(round(value * n), n)
    sd, folds = summary.get("best_std"), summary.get("cv")
    if key.startswith("best_") and isinstance(sd, (int, float)) and isinstance(folds, int):
        return t_interval(float(value), float(sd), folds)
    return None


def noise_verdict(va: float, vb: float, ia: tuple[float, float] | None, ib: tuple[float, float] | None) -> str:
    """Whether |B - A| lies within the runs' own uncertainty: smaller than the sum of the two 95% intervals'
    half-widths is "within noise" (a conservative test: such intervals may still differ at p < 0.05)."""
    if ia is None or ib is None:
        return NO_INTERVAL
    half = (ia[1] - ia[0]) / 2 + (ib[1] - ib[0]) / 2
    spans = f"95% CIs A [{ia[0]:.3g}, {ia[1]:.3g}], B [{ib[0]:.3g}, {ib[1]:.3g}]"
    if abs(vb - va) <= half:
        return f" (within noise: |B - A| = {abs(vb - va):.3g} is inside the combined half-widths {half:.3g}; {spans})."
    return f" (beyond noise: |B - A| = {abs(vb - va):.3g} exceeds the combined half-widths {half:.3g}; {spans})."


def headline_notes(a: Run, b: Run) -> list[str]:
    """The headline numbers the findings read (HEADLINES), where A and B differ by more than 5%, each with
    whether the difference lies within the runs' own 95% intervals."""
    notes = []
    for name, pattern in HEADLINES.items():
        sa, sb = a.summary(name) or {}, b.summary(name) or {}
        key = pattern.format(metric=sa.get("metric", "accuracy"))
        va, vb = sa.get(key), sb.get(key)
        numbers = isinstance(va, (int, float)) and isinstance(vb, (int, float))
        if numbers and key == pattern.format(metric=sb.get("metric", "accuracy")) and \
                abs(va - vb) > 0.05 * max(abs(va), abs(vb), 1e-9):
            n = f"n {sa.get('n_examples', '?')} vs {sb.get('n_examples', '?')}"
            notes.append(f"{name} {key.replace('_', ' ')}: A {va:.3g}, B {vb:.3g} ({n})"
                         + noise_verdict(va, vb, interval(sa, key), interval(sb, key)))
    return notes


def _finding_cell(run: Run, name: str) -> str:
    """One cell of the findings table (escaped): the finding, else why it is blank."""
    summary = run.summary(name)
    if summary is None:
        return f"<em>blank: {escape(run.why_blank(name))}</em>"
    text = finding(name, summary)
    return escape(text) if text else "<em>blank: its summary has none of the numbers this finding reads</em>"


def provenance_html(a: Run, b: Run, names: list[str]) -> str:
    """Both runs' provenance: per analysis its section provenance (task, source, n, sample, budget), then
    each run's model, seed, versions, commit and command (html_report._provenance)."""
    rows = []
    for name in names:
        cells = []
        for run in (a, b):
            record = run.provenance(name)
            lines = provenance_lines(record) if record is not None else [f"blank: {run.why_blank(name)}"]
            cells.append("<br>".join(escape(line) for line in lines))
        rows.append(f"<tr><th>{escape(name)}</th><td>{cells[0]}</td><td>{cells[1]}</td></tr>")
    infos = [_provenance(r.path) for r in (a, b)]
    for key in dict.fromkeys([*infos[0], *infos[1]]):
        rows.append(f"<tr><th>{escape(key)}</th>" + "".join(f"<td>{escape(i.get(key, ''))}</td>" for i in infos) + "</tr>")
    return ("<h2 id='provenance'>Provenance</h2><table class='side'><tr><th></th><th>A</th><th>B</th></tr>"
            + "".join(rows) + "</table>")


def _plain(note: str) -> str:
    return note.removeprefix(SAME).removeprefix(NOT_COMPARED)


def compare_html(a: Run, b: Run) -> str:
    """The page: settings that differ, the differences (each within or beyond noise where intervals are recorded),
    what is not compared and why (never among the differences), the findings side by side, the overlays and
    tables of the quantities compared, every figure of both reports A beside B, and both provenances."""
    names = list(dict.fromkeys([*((a.manifest.get("config") or {}).get("analyses") or []),
                                *((b.manifest.get("config") or {}).get("analyses") or [])]))
    notes: list[str] = []
    blocks = []
    for title, anchor, section in (("Head importance", "importance", importance_section),
                                   ("Pruning curves", "pruning", pruning_section),
                                   ("Position curves", "position", position_section),
                                   ("Top patching sites", "patching", patching_section)):
        body, found = section(a, b)
        notes += found
        if body:
            blocks.append(f"<h2 id='{anchor}'>{escape(title)}</h2>" + body
                          + "".join(f"<p class='finding'>{escape(_plain(n))}</p>" for n in found))
    notes += headline_notes(a, b)
    figures, figure_notes = figures_section(a, b, names)
    notes += figure_notes
    differ = [n for n in notes if not n.startswith((SAME, NOT_COMPARED))]
    refused = [_plain(n) for n in notes if n.startswith(NOT_COMPARED)]
    rows = "".join(f"<tr><th>{escape(name)}</th>" + "".join(f"<td>{_finding_cell(r, name)}</td>" for r in (a, b)) + "</tr>"
                   for name in names)
    head = (f"<tr><th></th><th>A: {escape(a.label)}<br><small>{escape(str(a.path))}</small></th>"
            f"<th>B: {escape(b.label)}<br><small>{escape(str(b.path))}</small></th></tr>")
    differences = "".join(f"<li>{escape(n)}</li>" for n in differ) or "<li>No difference above the thresholds.</li>"
    not_compared = "".join(f"<li>{escape(n)}</li>" for n in refused) or "<li>Nothing: every quantity above is compared.</li>"
    settings = settings_notes(a, b, names)
    setting_html = ("<h2 id='settings'>Settings that differ</h2><p>Differences in the results below may come from "
                    "these as much as from the models.</p><ul>" + "".join(f"<li>{escape(n)}</li>" for n in settings)
                    + "</ul>") if settings else "<h2 id='settings'>Settings</h2><p>The runs share every recorded setting.</p>"
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>headscope compare</title>"
            f"<style>{CSS}.side td{{vertical-align:top;width:45%}}{FIGURE_CSS}</style></head><body>"
            f"<h1>headscope compare</h1><p>A: {escape(a.label)} &nbsp; B: {escape(b.label)}</p>"
            + setting_html + f"<h2 id='differences'>Differences</h2><ul>{differences}</ul>"
            f"<h2 id='not-compared'>Not compared, and why</h2><ul>{not_compared}</ul>"
            f"<h2 id='findings'>Findings side by side</h2><table class='side'>{head}{rows}</table>"
            + "".join(blocks) + figures + provenance_html(a, b, names) + "</body></html>")


def compare_reports(out_a: str | Path, out_b: str | Path, out: str | Path | None = None, *, force: bool = False) -> Path:
    """Write the comparison page of two output folders; returns its path (default ./compare.html). An
    `out` that does not end in .html (or .htm) is refused before anything is read or written."""
    from headscope.reports.plots import setup_style

    target = Path(out) if out is not None else Path("compare.html")
    if target.suffix.lower() not in (".html", ".htm"):
        raise ConfigError(f"--out {str(target)!r} does not end in .html: the page is HTML, which a browser shows as "
                          f"source under another name; pass e.g. --out {str(target.with_suffix('.html'))!r}.")
    a, b = Run(out_a), Run(out_b)
    if target.exists() and not force:
        raise OutputExistsError(f"{str(target)!r} exists; pass --force to overwrite it or --out another file.")
    setup_style()
    page = compare_html(a, b)
    try:
        return io.write_text(target, page)
    except OSError as err:
        raise OutputError(f"Could not write {str(target)!r}: {err.strerror or err}.") from None
