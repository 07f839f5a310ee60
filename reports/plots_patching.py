"""Figures of the `patching` analysis: heatmaps, attribution-vs-exact scatter, causal traces.

Axes-level functions take `ax=` and return the Axes; `figures(result)` draws every figure the
result's tables allow. Position axes are labelled "i: token" from the first prompt; token
strings are shown as text (mathtext `$` escaped), never interpreted.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure

BY_POS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")
BY_HEAD = ("head_out", "q", "k", "v", "pattern")


def _text(label: object) -> str:
    """A token label safe for matplotlib (a `$` would start mathtext)."""
    return str(label).replace("$", r"\$")


def _axes(ax: Axes | None) -> Axes:
    return ax if ax is not None else plt.subplots(figsize=(7, 4))[1]


def _heatmap(grid: pd.DataFrame, ax: Axes, title: str, label: str) -> Axes:
    sns.heatmap(grid, ax=ax, cmap="RdBu_r", center=0, cbar_kws={"label": label})
    ax.set_title(title)
    return ax


def layer_pos_heatmap(df: pd.DataFrame, site_type: str = "resid_pre", *, column: str = "effect", ax: Axes | None = None) -> Axes:
    """Layer x position heatmap of one (layer, pos) site type, columns labelled with tokens."""
    ax = _axes(ax)
    rows = df[df["site_type"] == site_type]
    grid = rows.pivot_table(index="layer", columns="pos", values=column, aggfunc="mean")
    labels = rows.drop_duplicates("pos").set_index("pos")["token"]
    grid.columns = [_text(labels[p]) for p in grid.columns]
    _heatmap(grid, ax, f"{site_type}: patching {column}", column)
    ax.set_xlabel("position")
    return ax


def layer_head_heatmap(df: pd.DataFrame, site_type: str = "head_out", *, column: str = "effect", ax: Axes | None = None) -> Axes:
    """Layer x head heatmap of one (layer, head) site type."""
    ax = _axes(ax)
    rows = df[(df["site_type"] == site_type) & df["pos"].isna()]
    grid = rows.pivot_table(index="layer", columns="head", values=column, aggfunc="mean")
    _heatmap(grid, ax, f"{site_type}: patching {column}", column)
    return ax


def head_pos_heatmap(df: pd.DataFrame, site_type: str = "head_out_by_pos", *, column: str = "effect",
                     ax: Axes | None = None) -> Axes:
    """(layer, head) x position heatmap of per-position head patching, columns labelled with tokens."""
    ax = _axes(ax)
    rows = df[df["site_type"] == site_type]
    grid = rows.pivot_table(index=["layer", "head"], columns="pos", values=column, aggfunc="mean")
    labels = rows.drop_duplicates("pos").set_index("pos")["token"]
    grid.columns = [_text(labels[p]) for p in grid.columns]
    grid.index = [f"L{layer}H{head}" for layer, head in grid.index]
    _heatmap(grid, ax, f"{site_type}: patching {column}", column)
    ax.set_xlabel("position")
    return ax


def attribution_scatter(df: pd.DataFrame, *, ax: Axes | None = None) -> Axes:
    """Attribution-patching estimate against the exact effect, one point per cell, by site type."""
    ax = _axes(ax)
    sns.scatterplot(data=df, x="effect", y="attribution", hue="site_type", ax=ax, s=20, alpha=0.7)
    lo = float(min(df["effect"].min(), df["attribution"].min()))
    hi = float(max(df["effect"].max(), df["attribution"].max()))
    ax.plot([lo, hi], [lo, hi], color="grey", linewidth=0.8, linestyle="--")
    ax.set_xlabel("exact patching effect")
    ax.set_ylabel("attribution patching estimate")
    ax.set_title("attribution vs exact patching")
    return ax


def causal_trace_heatmap(df: pd.DataFrame, kind: str = "mlp", *, ax: Axes | None = None) -> Axes:
    """Meng et al.'s figure: average indirect effect per (position, layer) for one restored kind."""
    ax = _axes(ax)
    rows = df[(df["kind"] == kind) & df["pos"].notna()]
    grid = rows.pivot_table(index="pos", columns="layer", values="ie", aggfunc="mean")
    labels = rows.drop_duplicates("pos").set_index("pos")["token"]
    grid.index = [_text(labels[p]) for p in grid.index]
    sns.heatmap(grid, ax=ax, cmap="Purples" if kind == "mlp" else "Greens" if kind == "attn" else "Blues",
                cbar_kws={"label": "average indirect effect"})
    ax.set_title(f"causal tracing: restoring {kind}")
    ax.set_ylabel("position")
    return ax


def path_heatmap(df: pd.DataFrame, *, ax: Axes | None = None) -> Axes:
    """Sender layer x sender head effect of path patching (receivers jointly, or averaged)."""
    ax = _axes(ax)
    grid = df.pivot_table(index="sender_layer", columns="sender_head", values="effect", aggfunc="mean")
    receiver = ", ".join(sorted(set(df["receiver"])))[:40]
    return _heatmap(grid, ax, f"path patching -> {receiver}", "effect")


def figures(result, **kwargs) -> dict[str, Figure]:
    """Every figure the result's tables allow, by file stem."""
    out: dict[str, Figure] = {}
    tables = dict(result.tables)
    exact = tables.get("exact")

    def new(stem: str, draw) -> None:
        fig, ax = plt.subplots(figsize=(7, 4))
        draw(ax)
        fig.tight_layout()
        out[stem] = fig

    if exact is not None:
        present = set(exact["site_type"])
        for st in BY_POS:
            if st in present:
                new(f"exact_{st}", lambda ax, st=st: layer_pos_heatmap(exact, st, ax=ax))
        for st in BY_HEAD:
            if st in present:
                new(f"exact_{st}", lambda ax, st=st: layer_head_heatmap(exact, st, ax=ax))
        if "head_out_by_pos" in present:
            new("exact_head_out_by_pos", lambda ax: head_pos_heatmap(exact, ax=ax))
        if "attribution" in exact:
            new("attribution_vs_exact", lambda ax: attribution_scatter(exact, ax=ax))
    trace = tables.get("causal_tracing")
    if trace is not None:
        for kind in dict.fromkeys(trace["kind"]):
            new(f"causal_tracing_{kind}", lambda ax, kind=kind: causal_trace_heatmap(trace, kind, ax=ax))
    paths = tables.get("path_patching")
    if paths is not None:
        new("path_patching", lambda ax: path_heatmap(paths, ax=ax))
    return out
