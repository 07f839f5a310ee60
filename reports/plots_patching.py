"""Figures of the `patching` analysis: heatmaps, attribution-vs-exact scatter, causal traces.

Axes-level functions take `ax=` and return the Axes; `figures(result)` draws every figure the
result's tables allow. Position axes are labelled "i: token" from the first prompt; token
strings are shown as text (mathtext `$` escaped), never interpreted. Colour scales show the share
of the clean-corrupted gap (1 = clean behaviour fully restored when denoising), the unit the guide
text uses; a raw metric is shown only where the summary has no gap to divide by. Every exact
map shares one diverging scale centred on 0 (a q or pattern site at 0.003 of the gap looks pale
next to head_out at 0.3, with its own max in the title); causal traces of several prompts are
drawn by token role, shared across the restored kinds.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from headscope.reports.plots import DIVERGING, symmetric_bound

BY_POS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")
BY_HEAD = ("head_out", "q", "k", "v", "pattern")


def _text(label: object) -> str:
    """A token label safe for matplotlib (a `$` would start mathtext)."""
    return str(label).replace("$", r"\$")


def _axes(ax: Axes | None) -> Axes:
    return ax if ax is not None else plt.subplots(figsize=(7, 4))[1]


KV_SITES = ("k", "v")  # their head index is the KV head (grouped-query attention shares one among query heads)
NORMALISED = "share of the clean-corrupted gap"


def _heatmap(grid: pd.DataFrame, ax: Axes, title: str, label: str, bound: float | None = None) -> Axes:
    """Diverging heat map centred on 0 with limits -bound..bound (the panel's own max |value| when None);
    a panel whose own max is under half the shared bound prints it in the title."""
    own = symmetric_bound(grid.to_numpy(dtype=float))
    bound = bound or own
    sns.heatmap(grid, ax=ax, cmap=DIVERGING, center=0, vmin=-bound, vmax=bound, cbar_kws={"label": label},
                xticklabels=True, yticklabels=True)
    if own < 0.5 * bound:
        title += f"\n(this panel's max |value| {own:.2g}; scale shared with every site: ±{bound:.2g})"
    ax.set_title(title, fontsize="medium")
    return ax


def scale(summary: dict) -> tuple[float, str]:
    """(divisor, colour-bar label) that turn a raw effect into the share of the clean-corrupted gap."""
    clean, corrupt = summary.get("clean_metric"), summary.get("corrupted_metric")
    denoise = summary.get("direction", "denoise") == "denoise"
    end = "1 = fully restored" if denoise else "-1 = fully destroyed"
    if summary.get("normalized"):
        return 1.0, f"normalised {summary.get('metric', 'metric')} ({end})"
    if isinstance(clean, (int, float)) and isinstance(corrupt, (int, float)) and clean != corrupt:
        return float(clean - corrupt), f"{NORMALISED} ({end})"
    return 1.0, f"effect ({summary.get('metric', 'metric')})"


def _normalised(df: pd.DataFrame, divisor: float, columns: tuple[str, ...] = ("effect",)) -> pd.DataFrame:
    return df.assign(**{c: df[c] / divisor for c in columns if c in df}) if divisor != 1.0 else df


def layer_pos_heatmap(df: pd.DataFrame, site_type: str = "resid_pre", *, column: str = "effect", ax: Axes | None = None,
                      label: str | None = None, bound: float | None = None) -> Axes:
    """Layer x position heatmap of one (layer, pos) site type, columns labelled with tokens."""
    ax = _axes(ax)
    rows = df[df["site_type"] == site_type]
    grid = rows.pivot_table(index="layer", columns="pos", values=column, aggfunc="mean")
    labels = rows.drop_duplicates("pos").set_index("pos")["token"]
    grid.columns = [_text(labels[p]) for p in grid.columns]
    _heatmap(grid, ax, f"patching {site_type}, by layer and position", label or column, bound)
    ax.set_xlabel("position: token (first prompt)")
    ax.set_ylabel("layer")
    return ax


def layer_head_heatmap(df: pd.DataFrame, site_type: str = "head_out", *, column: str = "effect", ax: Axes | None = None,
                       label: str | None = None, bound: float | None = None) -> Axes:
    """Layer x head heatmap of one (layer, head) site type; k and v are per KV head."""
    ax = _axes(ax)
    rows = df[(df["site_type"] == site_type) & df["pos"].isna()]
    grid = rows.pivot_table(index="layer", columns="head", values=column, aggfunc="mean")
    grid.columns = [int(h) for h in grid.columns]  # a head index, even after a float round trip through CSV
    unit = "KV head" if site_type in KV_SITES else "head"
    _heatmap(grid, ax, f"patching {site_type}, by layer and {unit}", label or column, bound)
    ax.set_xlabel(unit)
    ax.set_ylabel("layer")
    return ax


def head_pos_heatmap(df: pd.DataFrame, site_type: str = "head_out_by_pos", *, column: str = "effect",
                     ax: Axes | None = None, label: str | None = None, bound: float | None = None) -> Axes:
    """(layer, head) x position heatmap of per-position head patching, columns labelled with tokens."""
    ax = _axes(ax)
    rows = df[df["site_type"] == site_type]
    grid = rows.pivot_table(index=["layer", "head"], columns="pos", values=column, aggfunc="mean")
    labels = rows.drop_duplicates("pos").set_index("pos")["token"]
    grid.columns = [_text(labels[p]) for p in grid.columns]
    grid.index = [f"L{int(layer)}H{int(head)}" for layer, head in grid.index]
    _heatmap(grid, ax, f"patching {site_type}: every head by position", label or column, bound)
    ax.tick_params(axis="y", labelsize=max(4, min(9, 300 / max(1, len(grid)))))
    ax.set_xlabel("position: token (first prompt)")
    ax.set_ylabel("head (L layer H head)")
    return ax


def site_slopes(df: pd.DataFrame) -> dict[str, float]:
    """Least-squares slope of the attribution estimate on the exact effect, per site type (1 = same scale)."""
    out = {}
    for name, group in df.groupby("site_type", sort=False):
        x, y = group["effect"].to_numpy(dtype=float), group["attribution"].to_numpy(dtype=float)
        keep = np.isfinite(x) & np.isfinite(y)
        if keep.sum() >= 2 and np.ptp(x[keep]) > 0:
            out[str(name)] = float(np.polyfit(x[keep], y[keep], 1)[0])
    return out


def attribution_scatter(df: pd.DataFrame, *, ax: Axes | None = None, label: str = "exact patching effect") -> Axes:
    """Attribution-patching estimate against the exact effect, one point per cell, by site type; the
    identity line, and each site type's fitted slope in the legend (a high correlation can hide a 2x error)."""
    ax = _axes(ax)
    slopes = site_slopes(df)
    named = df.assign(site=[f"{t} (slope {slopes[t]:.2f})" if t in slopes else str(t) for t in df["site_type"]])
    sns.scatterplot(data=named, x="effect", y="attribution", hue="site", ax=ax, s=20, alpha=0.7)
    lo = float(min(df["effect"].min(), df["attribution"].min()))
    hi = float(max(df["effect"].max(), df["attribution"].max()))
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8, linestyle="--", label="y = x (exact)")
    ax.set_xlabel(f"exact: {label}")
    ax.set_ylabel("attribution-patching estimate (same units)")
    ax.set_title("attribution vs exact patching")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="x-small", title="site type")
    return ax


def causal_trace_heatmap(df: pd.DataFrame, kind: str = "mlp", *, ax: Axes | None = None, metric: str = "task metric",
                         roles: pd.DataFrame | None = None, bound: float | None = None) -> Axes:
    """Meng et al.'s figure: average indirect effect per (token, layer) for one restored kind, on a
    diverging scale centred on 0 (an effect can be negative) shared across kinds via `bound`. With
    `roles` (the per-role table, averaged over every prompt's positions of that role) the rows are the
    token roles, which mean the same in every prompt; otherwise positions labelled with the first
    prompt's tokens (right only for one prompt, or prompts that share their tokens)."""
    ax = _axes(ax)
    if roles is not None and len(roles):
        rows = roles[roles["kind"] == kind]
        grid = rows.pivot_table(index="role", columns="layer", values="ie", aggfunc="mean", sort=False)
        ylabel = "token role (mean over every prompt)"
    else:
        rows = df[(df["kind"] == kind) & df["pos"].notna()]
        grid = rows.pivot_table(index="pos", columns="layer", values="ie", aggfunc="mean")
        labels = rows.drop_duplicates("pos").set_index("pos")["token"]
        grid.index = [_text(labels[p]) for p in grid.index]
        ylabel = "position: token (first prompt)"
    bound = bound or symmetric_bound(grid.to_numpy(dtype=float))
    sns.heatmap(grid, ax=ax, cmap=DIVERGING, center=0, vmin=-bound, vmax=bound,
                cbar_kws={"label": f"average indirect effect ({metric})"}, yticklabels=True)
    ax.set_title(f"causal tracing: restoring {kind}")
    ax.set_xlabel("layer")
    ax.set_ylabel(ylabel)
    return ax


def path_heatmap(df: pd.DataFrame, *, ax: Axes | None = None, label: str = "effect") -> Axes:
    """Sender layer x sender head effect of path patching (receivers jointly, or averaged)."""
    ax = _axes(ax)
    grid = df.pivot_table(index="sender_layer", columns="sender_head", values="effect", aggfunc="mean")
    grid.columns = [int(h) for h in grid.columns]
    receiver = ", ".join(sorted(set(df["receiver"])))[:40]
    _heatmap(grid, ax, f"path patching: sender head -> {receiver}", label)
    ax.set_xlabel("sender head")
    ax.set_ylabel("sender layer")
    return ax


def figures(result, **kwargs) -> dict[str, Figure]:
    """Every figure the result's tables allow, by file stem."""
    out: dict[str, Figure] = {}
    tables = dict(result.tables)
    divisor, label = scale(dict(result.summary))
    exact = tables.get("exact")
    if exact is not None:
        exact = _normalised(exact, divisor, ("effect", "attribution"))

    def new(stem: str, draw, size: tuple[float, float] = (7, 4)) -> None:
        fig, ax = plt.subplots(figsize=size)
        draw(ax)
        fig.tight_layout()
        out[stem] = fig

    if exact is not None:
        present = set(exact["site_type"])
        shared = symmetric_bound(exact["effect"].to_numpy(dtype=float))  # one scale for every site's map
        for st in BY_POS:
            if st in present:
                new(f"exact_{st}", lambda ax, st=st: layer_pos_heatmap(exact, st, ax=ax, label=label, bound=shared))
        for st in BY_HEAD:
            if st in present:
                new(f"exact_{st}", lambda ax, st=st: layer_head_heatmap(exact, st, ax=ax, label=label, bound=shared))
        if "head_out_by_pos" in present:
            n_rows = exact.loc[exact["site_type"] == "head_out_by_pos", ["layer", "head"]].drop_duplicates().shape[0]
            new("exact_head_out_by_pos", lambda ax: head_pos_heatmap(exact, ax=ax, label=label, bound=shared),
                (7, max(4.0, 0.16 * n_rows + 1.5)))
        if "attribution" in exact:
            new("attribution_vs_exact", lambda ax: attribution_scatter(exact, ax=ax, label=label), (8, 4.5))
    trace = tables.get("causal_tracing")
    if trace is not None:
        info = dict(result.summary).get("causal_tracing", {})
        metric = info.get("metric", "task metric")
        roles = tables.get("causal_tracing_roles") if info.get("n_examples", 1) > 1 else None
        shown = trace if roles is None else roles
        ct_bound = symmetric_bound(shown.loc[shown["kind"].isin(set(trace["kind"])), "ie"].to_numpy(dtype=float))
        for kind in dict.fromkeys(trace["kind"]):
            new(f"causal_tracing_{kind}", lambda ax, kind=kind: causal_trace_heatmap(
                trace, kind, ax=ax, metric=metric, roles=roles, bound=ct_bound))
    paths = tables.get("path_patching")
    if paths is not None:
        new("path_patching", lambda ax: path_heatmap(_normalised(paths, divisor), ax=ax, label=label))
    return out
