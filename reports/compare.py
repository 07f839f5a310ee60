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
from headscope.reports.findings import _words, finding, t_interval, wilson
from headscope.reports.html_report import CSS, _provenance
from headscope.reports.plots import color_scale, symmetric_bound
from headscope.reports.provenance import provenance_lines, section_provenance
from headscope.reports.render import escape, figure_png

SIDES = ("A", "B")
SAME = "(same) "  # prefix of a note that reports agreement: shown in its section, not listed as a difference
NO_INTERVAL = " (neither summary records an interval for it: whether this is beyond noise is not known)."
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


def importance_section(a: Run, b: Run) -> tuple[str, list[str]]:
    """Importance heat maps of A and B on one scale (and B - A on its own when the model shapes and
    quantities agree); notes on the top heads, ranked by the values each report's findings use."""
    found = [_importance_grid(a), _importance_grid(b)]
    if all(g is None for g in found):
        return "", []
    grids = [None if g is None else g[0] for g in found]
    whats = [None if g is None else g[1] for g in found]
    methods = [g[2] for g in found if g is not None]
    same = all(g is not None for g in grids) and grids[0].shape == grids[1].shape and whats[0] == whats[1]
    panels = [(f"{side}: {what}", g) for side, g, what in zip(SIDES, grids, whats) if g is not None]
    bound = symmetric_bound(*[g.to_numpy(dtype=float) for g in grids if g is not None])  # A and B: one scale
    if same:
        panels.append(("B - A", grids[1] - grids[0]))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 3.8), squeeze=False)
    for ax, (title, grid) in zip(axes[0], panels):
        diff = title == "B - A"
        limit = symmetric_bound(grid.to_numpy(dtype=float)) if diff else bound
        unsigned = not diff and all(m == "gradient" for m in methods)  # |dL/d gate|: sequential from 0
        sns.heatmap(grid, ax=ax, **color_scale(grid.to_numpy(dtype=float), bound=limit, is_signed=not unsigned),
                    cbar_kws={"label": "change in importance (B - A)" if diff else "importance (its own units)"},
                    xticklabels=True, yticklabels=True)
        ax.set(title=title, xlabel="head", ylabel="layer")
    fig.tight_layout()
    notes = []
    refusals = [None if g is None else _refuses_to_rank(run, g[2]) for g, run in zip(found, (a, b))]
    if same and any(refusals):
        why = "; ".join(f"{side} {r}" for side, r in zip(SIDES, refusals) if r)
        notes.append(SAME + f"Head importance ({whats[0]}): the top heads cannot be compared, because {why}, so "
                     f"{'neither report ranks' if all(refusals) else 'that report does not rank'} its heads; no shared "
                     "top heads or correlation is computed.")
    elif same:
        top = [set(map(tuple, g.stack().sort_values(ascending=False).index[:5])) for g in grids]
        shared = sorted(top[0] & top[1])
        r = float(np.corrcoef(grids[0].to_numpy().ravel(), grids[1].to_numpy().ravel())[0, 1])
        text = (f"Head importance ({whats[0]}): Pearson r = {r:.2f} between A and B; {len(shared)} of the top 5 heads "
                "are shared" + (f" ({', '.join(f'L{l}H{h}' for l, h in shared)})." if shared else "."))
        notes.append(text if r < 0.95 or len(shared) < 5 else SAME + text)
    elif all(g is not None for g in grids) and whats[0] != whats[1]:
        notes.append(f"Head importance: A shows {whats[0]}, B {whats[1]}; different quantities, no cell-by-cell difference.")
    elif any(g is None for g in grids):
        side = SIDES[grids.index(None)]
        notes.append(f"Head importance: {side} has none (no heads/results.csv with an importance column); only the other "
                     "run is drawn.")
    elif all(g is not None for g in grids):
        notes.append(f"Head importance: the models differ in shape ({grids[0].shape[0]}x{grids[0].shape[1]} vs "
                     f"{grids[1].shape[0]}x{grids[1].shape[1]} layers x heads); no cell-by-cell difference.")
    scale = ("one sequential scale from 0 (|dL/d gate|)" if all(m == "gradient" for m in methods)
             else "one diverging scale centred on 0")
    return _img(fig, f"head importance of A and B on {scale}"
                + (", and B - A on its own diverging scale centred on 0" if same else "")), notes


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


def _overlay(frames: list[pd.DataFrame | None], key: str, x: str, y: str, xlabel: str, ylabel: str, title: str) -> Any:
    """Lines of A (solid) and B (dashed) on one axis, one colour per `key` value."""
    fig, ax = plt.subplots(figsize=(8, 4))
    keys = list(dict.fromkeys(k for f in frames if f is not None for k in f[key]))
    colours = dict(zip(keys, sns.color_palette(n_colors=max(1, len(keys)))))
    for side, frame, style in zip(SIDES, frames, ("-", "--")):
        if frame is None:
            continue
        for k, group in frame.groupby(key, sort=False):
            mean = group.groupby(x)[y].mean()
            ax.plot(mean.index, mean.to_numpy(), style, marker="o", markersize=3, color=colours[k], label=f"{side}: {k}")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    return fig


def pruning_section(a: Run, b: Run) -> tuple[str, list[str]]:
    curves = []
    for run in (a, b):
        c = run.table("heads", "curve")
        if c is not None and {"ordering", "recompute", "fraction_pruned", "metric"} <= set(c.columns):
            c = c.assign(order=c["ordering"] + np.where(c["recompute"].astype(str) == "True", " (recomputed)", ""))
        curves.append(c if c is not None and "order" in c else None)
    if all(c is None for c in curves):
        return "", []
    fig = _overlay(curves, "order", "fraction_pruned", "metric", "fraction of heads pruned",
                   "task metric (random: mean over seeds)", "pruning curves: A solid, B dashed")
    notes = []
    sums = [a.summary("heads") or {}, b.summary("heads") or {}]
    refused = chance_refusal(a, b, "heads")
    if refused:
        return _img(fig, "pruning curves"), [f"Prunable within 1%: {refused}."]
    for key in sorted(k for k in sums[0] if k.startswith("max_fraction_prunable_") and k in sums[1]):
        fa, fb = sums[0][key], sums[1][key]
        if isinstance(fa, (int, float)) and isinstance(fb, (int, float)) and abs(fa - fb) >= 0.05:
            order = key.removeprefix("max_fraction_prunable_")
            ia, ib = (_prunable_fraction_ci(sm, order) for sm in sums)
            notes.append(f"Prunable within 1% by {order.replace('_', ' ')}: "
                         f"A {100 * fa:.0f}%, B {100 * fb:.0f}%" + noise_verdict(fa, fb, ia, ib))
    return _img(fig, "pruning curves"), notes


def _prunable_fraction_ci(summary: dict, order: str) -> tuple[float, float] | None:
    """The bootstrap interval of a prunable count (prunable_ci_<order>: heads), as fractions of all heads."""
    ci, n = summary.get(f"prunable_ci_{order}"), summary.get("n_heads")
    bounds = ci.get("interval_heads") if isinstance(ci, dict) else None
    if not (isinstance(n, int) and n > 0 and isinstance(bounds, list) and len(bounds) == 2
            and all(isinstance(x, (int, float)) for x in bounds)):
        return None
    return bounds[0] / n, bounds[1] / n


def position_section(a: Run, b: Run) -> tuple[str, list[str]]:
    curves = []
    for run in (a, b):
        c = run.table("position", "curve")
        ok = c is not None and {"condition", "metric", "position", "mean"} <= set(c.columns)
        primary = (run.summary("position") or {}).get("primary_metric", "accuracy")
        curves.append(c[(c["condition"] == "full") & (c["metric"] == primary)] if ok else None)  # one scale per axis
    if all(c is None for c in curves):
        return "", []
    fig = _overlay(curves, "metric", "position", "mean", "gold position (slot)", "primary metric (mean over examples)",
                   "position curves: A solid, B dashed")
    notes = []
    primaries = [(r.summary("position") or {}).get("primary_metric", "accuracy") for r in (a, b)]
    label = f"Middle/ends ratio of {primaries[0]} (the metric plotted)"
    refused = chance_refusal(a, b, "position")
    ratios = [((r.summary("position") or {}).get("ratio_middle_to_ends") or {}).get(m) for r, m in zip((a, b), primaries)]
    if refused:
        notes.append(f"{label}: {refused}.")
    elif primaries[0] != primaries[1]:
        notes.append(f"Middle/ends ratio: not compared: A plots {primaries[0]}, B {primaries[1]}.")
    elif all(isinstance(r, (int, float)) for r in ratios) and abs(ratios[0] - ratios[1]) >= 0.05:
        notes.append(f"{label}: A {ratios[0]:.2f}, B {ratios[1]:.2f}" + NO_INTERVAL)
    return _img(fig, f"position curves of {' and '.join(dict.fromkeys(primaries))}, A solid, B dashed"), notes


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
                [f"Top patching sites: {refused} (its report ranks no site)."])
    sums = [r.summary("patching") or {} for r in (a, b)]
    noisy = [side for side, s in zip(SIDES, sums) if isinstance(s.get("gap_within_noise"), Mapping)]
    if noisy:
        why = f"not compared: {' and '.join(noisy)} {'has a' if len(noisy) == 1 else 'have'} clean-corrupted gap within noise"
        return (f"<p><em>blank: top patching sites {escape(why)}</em></p>",
                [f"Top patching sites: {why} (its report ranks no site)."])
    gaps = [_gap(s) for s in sums]
    differ = prompts_differ(a, b, "patching")
    for kind in kinds:
        cells = [t.get(kind, [])[:n] for t in tops]
        if differ and any(c.get("pos") is not None for side in cells for c in side):
            blank = f"<em>blank: positions are not compared: {escape(differ)}</em>"
            rows.append(f"<tr><td>{escape(kind)}</td><td>{blank}</td><td>{blank}</td></tr>")
            notes.append(SAME + f"Top {kind} sites are not compared: {differ}.")
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


def compare_html(a: Run, b: Run) -> str:
    names = list(dict.fromkeys([*((a.manifest.get("config") or {}).get("analyses") or []),
                                *((b.manifest.get("config") or {}).get("analyses") or [])]))
    notes: list[str] = []
    blocks = []
    for title, anchor, section in (("Head importance", "importance", importance_section),
                                   ("Pruning curves", "pruning", pruning_section),
                                   ("Position curves", "position", position_section),
                                   ("Top patching sites", "patching", patching_section)):
        body, found = section(a, b)
        notes += [n for n in found if not n.startswith(SAME)]
        if body:
            blocks.append(f"<h2 id='{anchor}'>{escape(title)}</h2>" + body
                          + "".join(f"<p class='finding'>{escape(n.removeprefix(SAME))}</p>" for n in found))
    notes += headline_notes(a, b)
    rows = "".join(f"<tr><th>{escape(name)}</th>" + "".join(f"<td>{_finding_cell(r, name)}</td>" for r in (a, b)) + "</tr>"
                   for name in names)
    head = (f"<tr><th></th><th>A: {escape(a.label)}<br><small>{escape(str(a.path))}</small></th>"
            f"<th>B: {escape(b.label)}<br><small>{escape(str(b.path))}</small></th></tr>")
    differences = "".join(f"<li>{escape(n)}</li>" for n in notes) or "<li>No difference above the thresholds.</li>"
    settings = settings_notes(a, b, names)
    setting_html = ("<h2 id='settings'>Settings that differ</h2><p>Differences in the results below may come from "
                    "these as much as from the models.</p><ul>" + "".join(f"<li>{escape(n)}</li>" for n in settings)
                    + "</ul>") if settings else "<h2 id='settings'>Settings</h2><p>The runs share every recorded setting.</p>"
    return ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>headscope compare</title>"
            f"<style>{CSS}.side td{{vertical-align:top;width:45%}}</style></head><body>"
            f"<h1>headscope compare</h1><p>A: {escape(a.label)} &nbsp; B: {escape(b.label)}</p>"
            + setting_html + f"<h2 id='differences'>Differences</h2><ul>{differences}</ul>"
            f"<h2 id='findings'>Findings side by side</h2><table class='side'>{head}{rows}</table>"
            + "".join(blocks) + provenance_html(a, b, names) + "</body></html>")


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
