"""Figures of the circuits analysis: the logit lens (layer x position), DLA per head (layers x
heads), DLA of the embeddings, MLPs and bias terms, faithfulness against circuit size, MIB's
faithfulness curve (CPR, CMD) and the circuit graph of the strongest edges; on mixtures of experts, DLA per expert
(plots_experts.py).

reports/plots.py's convention: `plot_<what>(data, *, ax=None, ...) -> Axes` over the Result's tidy tables.

This module is the family's whole presentation (reports/families.py): after the figures, `GUIDE`
(how to read its section), `CAPTIONS` (each figure's, by stem) and `finding(summary)`, its headline.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.patches import Rectangle

from headscope.analyses.circuits.analysis import zero_components
from headscope.analyses.core import chance
from headscope.reports.circuits_words import finding as finding  # the headline: families.py reads it here
from headscope.reports.findings import ci_pair
from headscope.reports.moe_words import moe_layers
from headscope.reports.plots import (
    axes,
    color_scale,
    fit_bar_label,
    label,
    laid_out,
    mute_drawn,
    quiet_reason,
    symmetric_bound,
)
from headscope.reports.plots_experts import dla_units, experts_figure


def from_end(lens: pd.DataFrame) -> pd.DataFrame | None:
    """The lens table with "position" counted from each example's answer position (-1 = the answer
    position, -2 the one before, ...) when the examples have different lengths (their positions
    count real tokens from 0, so an absolute position means a different place in each prompt);
    None when every example has the same answer position (absolute positions line up)."""
    if "example" not in lens or not len(lens):
        return None
    answer = lens[lens.is_answer.astype(bool)] if "is_answer" in lens else lens.iloc[0:0]
    last = (answer if len(answer) else lens).groupby("example").position.max()  # [example] answer position
    if last.nunique() <= 1:
        return None
    return lens.assign(position=lens.position - lens.example.map(last) - 1)


PARTIAL_VEIL = 0.6  # how far a lens column averaged over fewer than all prompts is blended towards white


def _ticks_to_zero(low: float) -> list[float]:
    """Colour-bar ticks from `low` (< 0) up to 0 inclusive at round steps: 0 is always one of them."""
    from matplotlib.ticker import MaxNLocator

    steps = MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]).tick_values(low, 0.0)
    return [float(t) for t in steps if low - 1e-9 <= t <= 1e-9]


def _lens_scale(values: np.ndarray, value: str) -> tuple[dict[str, Any], str]:
    """(seaborn heatmap keywords, colour-bar label) of a lens grid by the convention (plots.py): a
    log-probability (<= 0) on the sequential map from its lowest (white) to 0 (red: certain), ending at
    0; a rank (0 = top-1) on the sequential map reversed, red at 0; a logit difference, signed, on the
    diverging map centred on 0."""
    from headscope.reports.plots import SEQUENTIAL

    finite = values[np.isfinite(values)]
    if value == "logit_diff":
        return color_scale(values, is_signed=True), "logit difference (logits; red toward the answer)"
    if value == "rank":
        top = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
        return {"cmap": f"{SEQUENTIAL}_r", "vmin": 0.0, "vmax": top}, "rank of the target (0 = top-1, red)"
    low = float(np.floor(finite.min())) if finite.size and finite.min() < 0 else -1.0
    low = low if low < 0 else -1.0
    return ({"cmap": SEQUENTIAL, "vmin": low, "vmax": 0.0},
            "log-probability of the target\n(nats; 0 = certain, red)")


def plot_lens(data: pd.DataFrame, *, value: str = "logprob", ax=None):
    """`data`: the lens table. Mean over examples of the lens target's log-probability (or "rank") at each layer (block
    input; the last row is the model's output) and position; prompts of different lengths are
    aligned at their answer position (`from_end`), so each column means the same place in every prompt.
    Columns far from the answer are then reached by the longer prompts only: each such column's tick
    says its n and the column is muted (a PARTIAL_VEIL white veil), the axis label says why. Colours
    by the convention (`_lens_scale`): a log-probability white (its lowest) to red at 0 (certain), the
    colour bar ending at 0 with 0 a tick."""
    ax, lens = axes(ax, (7, 4)), data
    aligned = from_end(lens)
    if aligned is not None:
        lens = aligned
    grid = lens.pivot_table(index="layer", columns="position", values=value, aggfunc="mean")
    n = lens.example.nunique() if "example" in lens else None
    counts = (lens.groupby("position").example.nunique().reindex(grid.columns) if n is not None
              else pd.Series(dtype=int))  # [position] prompts averaged in the column
    partial = [i for i, c in enumerate(counts) if c < n]  # columns only the longer prompts reach
    names = [f"{int(p)} (answer)" if aligned is not None and p == -1 else str(int(p)) for p in grid.columns]
    if partial:  # say in each such column how many prompts its mean is over
        names = [f"{name} (n={counts.iloc[i]})" if i in partial else name for i, name in enumerate(names)]
    grid.columns = names
    stages = lens.drop_duplicates("layer").set_index("layer").stage if "stage" in lens else None
    scale, label = _lens_scale(grid.to_numpy(dtype=float), value)
    sns.heatmap(grid, ax=ax, **scale, cbar_kws={"label": label})
    if value == "logprob":  # 0 (certain), the scale's end, is a tick
        bar = ax.collections[0].colorbar
        bar.set_ticks(_ticks_to_zero(scale["vmin"]), labels=[f"{t:g}" for t in _ticks_to_zero(scale["vmin"])])
    ax.invert_yaxis()
    if stages is not None:
        ax.set_yticklabels([stages.get(l, l) for l in grid.index], rotation=0)
    for i in partial:  # muted: a white veil over each column averaged over fewer than all prompts
        ax.add_patch(Rectangle((i, 0), 1, grid.shape[0], facecolor="white", alpha=PARTIAL_VEIL, lw=0, zorder=2,
                               label="fewer prompts"))
    xlabel = (f"position from the end (-1 = answer position; {n} prompts of mixed lengths)"
              if aligned is not None else "position (last = answer position)")
    if partial:
        xlabel += f"\npale, with n: columns averaged over fewer than all {n} prompts"
    ax.set(xlabel=xlabel, ylabel="stream read (top = output)", title="Logit lens")
    return ax


def plot_lens_logit_diff(data: pd.DataFrame, *, means: Mapping[str, Any] | None = None,
                         intervals: Mapping[str, Any] | None = None, ax=None):
    """`data`: the lens table. The lens's logit difference, answer minus wrong answer (logits), at each example's
    answer position, one row per stream read (block input; the top row the model's output), the rows at the
    heights of plot_lens's: each example a thin grey line (the spread), the mean over examples with its 95% t
    interval, 0 (no preference) a line. means, intervals: the summary's lens_mean_logit_diff_per_layer and
    lens_logit_diff_ci_per_layer (by layer); without them (older summaries) chance.mean_interval of the table's.
    The measure of the finding where the answers are few fixed tokens (is/are): there the answer's
    log-probability is high before any block, since a constant guess ranks such tokens near the top, while the
    difference starts near 0."""
    ax = axes(ax, (4, 4))
    at = data[data.is_answer.astype(bool)] if "is_answer" in data else data
    wide = at.pivot_table(index="example", columns="layer", values="logit_diff", aggfunc="first")  # [example, layer]
    layers = list(wide.columns)
    y = np.arange(len(layers)) + 0.5  # [layer]: heatmap row centres, the embeddings at the bottom
    for _, row in wide.iterrows():
        ax.plot(row.to_numpy(dtype=float), y, color="0.7", lw=0.8, zorder=1)
    values = wide.to_numpy(dtype=float)  # [example, layer]
    mean = np.nanmean(values, axis=0)
    ci = [chance.mean_interval(values[:, j]) for j in range(len(layers))]
    if means and intervals:  # the analysis's own numbers, as the finding reads them
        mean = np.array([m if means.get(str(l)) is None else float(means[str(l)]) for l, m in zip(layers, mean)])
        ci = [intervals.get(str(l), c) for l, c in zip(layers, ci)]
    err = np.array([[m - c[0], c[1] - m] if c else [0.0, 0.0] for m, c in zip(mean, ci)]).T  # [2, layer]
    n = int(np.isfinite(values).all(axis=1).sum())
    ax.errorbar(mean, y, xerr=err, fmt="o-", color="C3", ms=5, capsize=3, lw=1.5, zorder=3)
    ax.axvline(0.0, color="black", lw=0.8, ls="--", zorder=2)
    stages = at.drop_duplicates("layer").set_index("layer").stage if "stage" in at else None
    ax.set_yticks(y, [str(stages.get(l, l)) if stages is not None else str(l) for l in layers])
    ax.set_ylim(0, len(layers))
    ax.set(xlabel="lens logit difference (logits)\nanswer - wrong answer; 0: no preference",
           title=f"Answer minus wrong answer\n(red: mean, 95% t CI over n = {n};\ngrey: each example)")
    return ax


def lens_figure(data: pd.DataFrame, *, n_answers: int | None = None, means: Mapping[str, Any] | None = None,
                intervals: Mapping[str, Any] | None = None):
    """Figure-level: the lens heatmap (plot_lens) and, where the task has a wrong answer per example (a finite
    logit_diff at the answer positions), its logit difference beside it (plot_lens_logit_diff, with the
    summary's means and intervals), the rows aligned. `n_answers` (the summary's lens_n_answers): at
    FEW_ANSWERS or fewer the heatmap's title says its answer column is a constant guess's and the difference
    is the measure (review 8 B1). Returns the Figure."""
    import matplotlib.pyplot as plt

    from headscope.reports.circuits_words import FEW_ANSWERS

    at = data[data.is_answer.astype(bool)] if "is_answer" in data else data.iloc[0:0]
    if "logit_diff" not in at or not np.isfinite(at.logit_diff.to_numpy(dtype=float)).any():
        return plot_lens(data).figure
    fig, (heat, diff) = plt.subplots(1, 2, figsize=(11, 4.4), gridspec_kw={"width_ratios": [2.2, 1]})
    plot_lens(data, ax=heat)
    plot_lens_logit_diff(data, means=means, intervals=intervals, ax=diff)
    if n_answers is not None and n_answers <= FEW_ANSWERS:
        heat.set_title(f"Logit lens\nonly {n_answers} distinct answers: a constant guess already ranks them high;\n"
                       f"the logit difference (right) is the measure of the answer column")
    return fig


def plot_dla_heads(data: pd.DataFrame, *, quiet: str | None = None, cap: float | None = None, ax=None):
    """`data`: the dla_mean table. Mean DLA of each head, layers (rows) x heads (columns) like every head grid, on a diverging
    scale centred at 0 (red: writes toward the answer); `quiet` (plots.quiet_reason) mutes it and says why; `cap`: the
    model's final soft-cap (the colour bar's logits are before it)."""
    ax = axes(ax, (6, 4))
    heads = data[data.kind == "head"].astype({"layer": int, "head": int})
    grid = heads.pivot_table(index="layer", columns="head", values="contribution", aggfunc="mean")  # [layer, head]
    bound = symmetric_bound(grid.to_numpy(dtype=float))
    sns.heatmap(grid, ax=ax, **color_scale(bound=bound, is_signed=True, quiet=bool(quiet)),
                cbar_kws={"label": dla_units(cap)}, xticklabels=True, yticklabels=True)
    ax.set(xlabel="head", ylabel="layer", title="Direct logit attribution per head" + (f"\n{quiet}" if quiet else ""))
    if cap:  # the longer label re-wrapped to the bar's height
        fit_bar_label(ax.collections[0].colorbar.ax)
    return ax




def _t_bar(values) -> tuple[float, float]:
    """A bar's error bar: the 95% t interval of its mean over examples (the mean itself with one example)."""
    ci = chance.mean_interval(values)
    mean = float(np.mean(values))
    return (mean, mean) if ci is None else (ci[0], ci[1])


def plot_dla_components(data: pd.DataFrame, *, moe: list[int] | None = None, zero: list[str] | None = None,
                        cap: float | None = None, ax=None):
    """`data`: the dla table. DLA of the embeddings, each MLP, the attention biases and the final norm/unembedding bias
    terms (mean and 95% t interval over examples, the summary's dla_top_intervals). `moe` (the summary's moe_layers):
    those blocks' mlpN ticks read "mlpN (MoE)", a whole mixture-of-experts block (verify 11c: mlp0 and mlp2 were
    drawn like the dense mlp1). `zero` (the summary's dla_zero_components, 0 up to the run's rounding): a kind all
    of whose components are in it is left out (None, an older summary: float32's rule, zero_components). `cap`: the
    model's final soft-cap (the axis's logits are before it)."""
    ax = axes(ax, (8, 4))
    zero = set(zero_components(data) if zero is None else zero)
    rows = data[data.kind != "head"]
    silent = rows.groupby("kind", sort=False).component.apply(lambda c: bool(set(c) <= zero))
    zero = [str(k) for k, v in silent.items() if v]  # e.g. bias terms of a model without biases
    rows = rows[~rows.kind.isin(zero)]
    order = list(dict.fromkeys(rows.component))
    sns.barplot(data=rows, x="component", y="contribution", hue="kind", order=order, dodge=False, ax=ax,
                errorbar=_t_bar)  # the summary's 95% t interval over examples (dla_top_intervals)
    ax.axhline(0.0, color="grey", lw=1)
    if ax.get_legend() is not None:
        sns.move_legend(ax, "upper left", bbox_to_anchor=(1.01, 1.0), title="kind")
    if moe:
        marked = {f"mlp{layer}" for layer in moe}
        ax.set_xticks(range(len(order)), [f"{c} (MoE)" if c in marked else c for c in order])
    ax.tick_params(axis="x", labelrotation=60)
    ax.set(xlabel="", ylabel=dla_units(cap), title="Embeddings, MLPs and bias terms"
           + (f"\n(0 within rounding for every example, left out: {', '.join(zero)})" if zero else ""))
    return ax


def _note(unreported: str | None, width: int = 80) -> str:
    """A title line (wrapped at `width` characters: the axes' own, not the figure's) saying why faithfulness is
    not reported, or ""."""
    import textwrap

    return "\n" + textwrap.fill(f"NOT REPORTED: {unreported}", width) if unreported else ""


def plot_faithfulness(data: pd.DataFrame, *, target: float = 0.8, unreported: str | None = None, ax=None):
    """`data`: the faithfulness table. Faithfulness of the top-k circuit against k (log scale), with the range of the random
    circuits of the same size as a band and their mean as a dashed line. `unreported`: why the
    findings do not report faithfulness (at chance, or a clean-corrupted gap within noise: a share
    of a noise gap), put in the title and the curve drawn faint."""
    ax, sweep = axes(ax, (8, 4)), data
    top = sweep[sweep.circuit == "top"].sort_values("k")
    rand = sweep[sweep.circuit == "random"].groupby("k").faithfulness.agg(["min", "max", "mean"]).sort_index()
    x_top, x_rand = np.maximum(top.k.to_numpy(), 0.5), np.maximum(rand.index.to_numpy(), 0.5)
    if len(rand):
        ax.fill_between(x_rand, rand["min"], rand["max"], color="grey", alpha=0.3, label="random circuits (range)")
        ax.plot(x_rand, rand["mean"], color="grey", ls="--", lw=1)
    ax.plot(x_top, top.faithfulness, marker="o", color="C0", label="top-k edges", alpha=0.35 if unreported else 1.0)
    ax.axhline(target, color="C3", lw=1, ls=":", label=f"{target:.0%} of the gap")
    ax.axhline(0.0, color="black", lw=0.5)
    ax.set_xscale("log")
    # the note wrapped to the axes' width (the legend takes the figure's right): at 80 it ran over the y label
    ax.set(xlabel="edges in the circuit (k)", ylabel="faithfulness\n(fraction of clean - corrupted gap)",
           title="Circuit faithfulness" + (_note(unreported, 55)))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")  # off the data
    return ax


def plot_mib(data: pd.DataFrame, *, cpr: float | None = None, cmd: float | None = None,
             unreported: str | None = None, cpr_ci=None, cmd_ci=None, ax=None):
    """`data`: the mib table. MIB's faithfulness curve: f of the top p of the edges against p (0.1% ... 100%, log-scaled
    x for legibility; MIB's areas are over linear p), the area under it (CPR) shaded; cpr_ci, cmd_ci: the
    summary's bootstrap intervals, named in the legend. `unreported` (why the findings withhold CPR/CMD: at
    chance, or a clean-corrupted gap within noise): in the title, the curve faint and the legend without the
    numbers (review 14b A4: "CPR 0.583, 95% CI 0.190-0.890" over a gap of -0.0117 logits)."""
    ax, mib = axes(ax, (8, 4)), data
    x, f = mib.fraction.to_numpy() * 100, mib.faithfulness.to_numpy()

    def ci(interval) -> str:
        return f", 95% CI {interval[0]:.3f}-{interval[1]:.3f}" if ci_pair(interval) else ""

    if unreported:  # a ratio over noise: no number in the legend
        cpr = cmd = None
    ax.fill_between(x, 0.0, f, color="C0", alpha=0.08 if unreported else 0.2,
                    label="CPR: area under f" + (f" = {cpr:.3f}{ci(cpr_ci)}" if cpr is not None else
                                                 " (not reported)" if unreported else ""))
    ax.plot(x, f, marker="o", color="C0", label="top-p% edges", alpha=0.35 if unreported else 1.0)
    ax.axhline(1.0, color="C3", lw=1, ls=":",
               label="f = 1" + (f" (CMD: area between = {cmd:.3f}{ci(cmd_ci)})" if cmd is not None else ""))
    ax.axhline(0.0, color="black", lw=0.5)
    ax.set_xscale("log")
    # the legend goes under the axes, not beside them, so the log axis keeps the figure's width and its labels
    # 0.1%, 0.2%, 0.5%, 1% stand apart upright (review 13a B2: on an axes narrowed by a legend at the right,
    # rotated 45 degrees, they touched)
    ax.set_xticks(x, [f"{v:g}%" for v in x], fontsize="small")
    ax.minorticks_off()
    ax.set(xlabel="edges in the circuit (% of all; MIB's fractions)", ylabel="faithfulness f (1 = full model)",
           title="MIB faithfulness: f = (m(C) - m(empty)) / (m(full) - m(empty))"
           + (_note(unreported)))
    # anchored below the x label in points (a fraction of the axes moves with its height: a longer title overlapped)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), borderaxespad=4.0, fontsize="small", ncol=2)
    return ax


PARALLEL = "parallel blocks: each MLP reads its block's input, not its heads' output"


def _node_xy(name: str, n_heads: int, parallel: bool = False) -> tuple[float, float]:
    """Layout: x = layer (input at -1, logits after the last layer), heads stacked at y = head,
    the MLP at y = -1: just right of its layer's heads (x = layer + 0.5, after them: a sequential block
    reads them), or beside them at x = layer on `parallel` blocks (GPT-NeoX, GPT-J, Phi), where the MLP
    reads the block's input as the heads do (review 8 B2: drawn after them it suggested an order)."""
    base = name.split(".")[0]
    if base == "input":
        return -1.0, (n_heads - 1) / 2
    if base == "logits":
        return float("nan"), (n_heads - 1) / 2
    layer = int(base[1:])
    if base.startswith("m"):
        return (float(layer) if parallel else layer + 0.5), -1.0
    head = name.split(".")[1]
    if head.startswith("kv"):  # a GQA key-value head: left of the layer's query heads, half a row lower
        return layer - 0.35, float(head[2:]) - 0.3
    return float(layer), float(head.lstrip("h"))


# the graph's drawing order: edges under the nodes, node labels (on an opaque white box) over both, so no
# edge crosses a label; its receivers' kinds: a head's query, key or value input, an MLP or the logits
EDGE_Z, NODE_Z, LABEL_Z = 1, 3, 4
LABEL_SIZE = 8  # points
STYLES = {"q": ":", "k": "--"}  # every other kind solid
# each kind of a head's input bends its own way, so the key and value edges from one sender into one head
# (or key-value head) run apart instead of on top of each other
BENDS = {"q": 0.15, "k": 0.35, "v": -0.15}  # connectionstyle arc3 rad; MLP and logits 0.15


def node_name(name: str) -> str:
    """The report's name of an edge-graph node: a{l}.h{h} -> L{l}H{h} (as every head elsewhere),
    a{l}.kv{g} -> L{l}KV{g} (key-value head g), m{l} -> mlp{l}; input and logits unchanged. The edges
    table keeps the edge graph's own names (TransformerLens / EAP)."""
    base, _, rest = name.partition(".")
    if base[:1] == "a" and base[1:].isdigit() and rest:
        head = rest.split(".")[0]
        return f"L{base[1:]}KV{head[2:]}" if head.startswith("kv") else f"L{base[1:]}H{head.lstrip('h')}"
    if base[:1] == "m" and base[1:].isdigit():
        return f"mlp{base[1:]}"
    return name
KIND_NAMES = {"q": "q (query)", "k": "k (key)", "v": "v (value)", "mlp": "MLP", "logits": "logits"}


def _kind(receiver: str) -> str:
    """The kind of an edge's receiver: "q", "k", "v" (a head's input), "mlp" or "logits"."""
    if receiver.count(".") == 2:
        return receiver.rsplit(".", 1)[1]
    return "logits" if receiver == "logits" else "mlp"


def plot_circuit_graph(data: pd.DataFrame, *, n_edges: int = 30, quiet: str | None = None, parallel: bool = False,
                       ax=None):
    """`data`: the edges table. The strongest edges as lines from sender to receiver (width by |score|, red positive, blue
    negative); heads as points at (layer, head), MLPs as squares, the input and logits at the ends.
    A receiver is drawn at its component (a head's q/k/v input at the head; on GQA models a key or
    value input of key-value head g at (layer - 0.35, g - 0.3), labelled below right). Nodes carry the report's
    names (node_name: L0H3, L0KV1, mlp0). Integer head
    and layer ticks; a key of three line widths in |score| units, the signs drawn and the line style of
    each receiver kind drawn (dotted q, dashed k, solid v / MLP / logits), only those; node labels over
    the edges on a white box. `quiet` (plots.quiet_reason):
    grey edges and a title that says they rank noise, not the strongest writers. `parallel` (the summary's
    edges_parallel_blocks): each MLP beside its layer's heads (`_node_xy`) and the key's title says why (PARALLEL)."""
    ax, edges = axes(ax, (8, 5)), data
    top = edges.reindex(edges.score.abs().sort_values(ascending=False).index).head(n_edges)
    names = list(top.sender) + list(top.receiver)
    heads = [int(n.split(".")[1].lstrip("hkv")) for n in names if n.startswith("a")]
    layers = [int(n.split(".")[0][1:]) for n in names if n[0] in "am" and n != "logits" and n.split(".")[0][1:].isdigit()]
    n_heads = max(heads, default=0) + 1
    x_logits = max(layers, default=0) + 1.5

    def xy(name: str) -> tuple[float, float]:
        x, y = _node_xy(name, n_heads, parallel)
        return (x_logits if np.isnan(x) else x), y

    peak = float(top.score.abs().max()) if len(top) else 1.0

    def width(v: float) -> float:
        return 0.5 + 4.5 * abs(v) / (peak or 1.0)

    used = []  # the receiver kinds drawn, in order: the key lists these and no other
    for s, r, v in zip(top.sender, top.receiver, top.score):
        (x0, y0), (x1, y1) = xy(s), xy(r)
        kind = _kind(r)
        used.append(kind)
        colour = (("#e8a0a0" if v > 0 else "#a0b8e0") if quiet  # muted red / blue
                  else ("C3" if v > 0 else "C0"))
        # opaque: crossing edges never blend into a colour the key does not define (red over blue is purple);
        # widest first (top is sorted by |score|), so a thinner edge stays visible on top of a wider one
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0), zorder=EDGE_Z, arrowprops=dict(
            arrowstyle="-|>", lw=width(v), color=colour, alpha=1.0,
            connectionstyle=f"arc3,rad={BENDS.get(kind, 0.15)}", linestyle=STYLES.get(kind, "-")))
    drawn = {n.rsplit(".", 1)[0] if n.count(".") == 2 else n for n in names}
    for node in sorted(drawn):
        x, y = xy(node)
        marker = "s" if node.startswith("m") else ("D" if node in ("input", "logits") else "o")
        ax.scatter([x], [y], marker=marker, s=60, color="black", zorder=NODE_Z)
        kv = ".kv" in node  # a KV head's label below right (its edges all arrive from the left), a query head's above
        where = (dict(xytext=(0, -7), ha="center", va="top") if node == "logits"  # below: the plot's right edge is near
                 else dict(xytext=(5, -5 if kv else 3), ha="left", va="top" if kv else "bottom"))
        ax.annotate(label(node_name(node)), (x, y), textcoords="offset points", **where, fontsize=LABEL_SIZE,
                    zorder=LABEL_Z, bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=1.0))
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    ax.yaxis.set_major_locator(MaxNLocator(integer=True))  # heads and layers are whole numbers
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if len(top):  # the width key: |score| at the peak, half of it and the smallest drawn
        keys = sorted({peak, peak / 2, float(top.score.abs().min())}, reverse=True)
        handles = [Line2D([], [], color="grey", lw=width(k), label=f"|score| {k:.2g}") for k in keys]
        pos, neg = ("#e8a0a0", "#a0b8e0") if quiet else ("C3", "C0")
        signs = [("positive", pos, (top.score > 0).any()), ("negative", neg, (top.score < 0).any())]
        handles += [Line2D([], [], color=c, lw=2, label=name) for name, c, shown in signs if shown]
        kinds = [k for k in KIND_NAMES if k in used]  # each drawn kind once
        solid = [KIND_NAMES[k] for k in kinds if k not in STYLES]
        handles += [Line2D([], [], color="black", lw=1.2, ls=STYLES[k], label=f"into {KIND_NAMES[k]}")
                    for k in kinds if k in STYLES]
        if solid:
            handles.append(Line2D([], [], color="black", lw=1.2, ls="-", label="into " + " / ".join(solid)))
        key = "edges: width = |score|" + ("\n" + PARALLEL.replace(": ", ":\n").replace(", ", ",\n") if parallel else "")
        ax.legend(handles=handles, title=key, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small",
                  title_fontsize="small")
    what = (f"Circuit: the {len(top)} largest |score| edges, noise not a circuit\n{quiet}" if quiet
            else f"Circuit: {len(top)} strongest edges")
    mlps = "\nparallel blocks: each MLP beside its layer's heads" if parallel else ""
    ax.set(xlabel=f"layer (input left, logits right; MLPs at y = -1){mlps}", ylabel="head", title=what)
    return ax


def unreported(summary) -> str | None:
    """Why the circuit's faithfulness is not reported (this module's finding says so): at chance there is
    no behaviour to recover, and with a clean-corrupted gap within noise faithfulness divides by noise."""
    quiet = quiet_reason(summary)
    if quiet:
        return quiet.split(":")[0].lower() + " (no behaviour for a circuit to recover)"
    small = (summary or {}).get("gap_within_noise")
    if small:
        why = small.get("reason") if isinstance(small, dict) else None
        return "clean-corrupted gap within noise" + (f": {why}" if why else "")
    return None


def figures(result, **kwargs) -> dict:
    """{file stem: Figure} for a circuits Result (whichever of its tables are present)."""
    tables, s = result.tables, result.summary
    quiet, off = quiet_reason(s), unreported(s)
    cap = s.get("dla_final_softcap")  # review 18d C2: the DLA figures' logits are before the model's final soft-cap
    draws = {
        "circuits_lens": ("lens", lambda data: lens_figure(
            data, n_answers=s.get("lens_n_answers"), means=s.get("lens_mean_logit_diff_per_layer"),
            intervals=s.get("lens_logit_diff_ci_per_layer")).axes[0]),
        "circuits_dla_heads": ("dla_mean", lambda data: plot_dla_heads(data, quiet=quiet, cap=cap)),
        "circuits_dla_components": ("dla", lambda data: mute_drawn(plot_dla_components(
            data, moe=moe_layers(s), zero=s.get("dla_zero_components"), cap=cap), quiet)),  # review 14a C4: muted
        "circuits_dla_experts": ("dla_experts_mean", lambda data: experts_figure(
            data, dla=tables.get("dla"), quiet=quiet, cap=cap).axes[0]),
        "circuits_faithfulness": ("faithfulness", lambda data: plot_faithfulness(data, unreported=off)),
        "circuits_mib": ("mib", lambda data: plot_mib(data, cpr=s.get("mib_cpr"), cmd=s.get("mib_cmd"), unreported=off,
                                                      cpr_ci=s.get("mib_cpr_ci"), cmd_ci=s.get("mib_cmd_ci"))),
        "circuits_graph": ("edges", lambda data: plot_circuit_graph(data, quiet=quiet,
                                                                    parallel=bool(s.get("edges_parallel_blocks")))),
    }
    out = {}
    for stem, (table, draw) in draws.items():
        if table in tables and len(tables[table]):
            out[stem] = laid_out(draw(tables[table]))
    return out


# Presentation (reports/families.py): the guide, the captions and the finding in words.

GUIDE = (  # how to read this section of the report
    "Where the answer is written. The logit lens reads each block's input through the model's own "
    "final norm and unembedding: by layer and position, the log-probability of the token that comes next (the "
    "prompt's own next token, and at the answer position the answer), the logit difference "
    "answer minus wrong answer by layer (where the task has wrong answers), and the first "
    "layer where the answer is top-1. Direct logit attribution splits the final logit difference (answer minus "
    "wrong answer; the answer's logit where the task has no wrong answers) into embeddings, heads, MLPs and bias "
    "terms, with the final norm frozen at its actual scale (and on models "
    "with post-norm blocks, as OLMo 2 and Gemma 2/3, each write through its layer's own norm, frozen likewise), so the "
    "parts add up exactly (where the model soft-caps its final logits, as Gemma 2, to the logit (difference) "
    "before the cap: the finding gives both). Edge attribution's faithfulness and MIB's CPR/CMD are ratios over the "
    "clean-corrupted gap of that metric: where the gap is within noise (patching's rule) they are not reported."
)
CAPTIONS = {  # what to read from each figure and its units, by figure stem
    "circuits_lens": "Logit lens: the log-probability (nats, <= 0) of the token that comes next at each position, "
                     "read from each block's input through the final norm and unembedding: the prompt's own next "
                     "token, and at the answer position (-1) the answer; layer x position, white (the lowest "
                     "shown) to red at 0 (certain: p = 1); row l_pre is the input of block l (after l blocks), "
                     "final_post the output (every row through the model's own logit scale and final soft-cap where it "
                     "has them, as Granite's logits_scaling and Gemma 2's cap, so final_post is the model's own "
                     "output). Prompts of mixed lengths are aligned at "
                     "the answer position (columns count from the end); a column that only the longer prompts reach "
                     "is muted and its tick gives the number of prompts n its mean is over. Right, where the task has a "
                     "wrong answer per example: the lens's logit difference, answer minus wrong answer (logits), at the "
                     "answer position, one row per stream read as on the left: each example grey, the mean red with its "
                     "95% t interval over examples, 0 (dashed) no preference. Where the answers are a few fixed tokens "
                     "(is/are) a constant guess ranks them near the top before any block, so the answer column is red "
                     "from the embeddings on; the title then says so and the logit difference, which starts near 0, is "
                     "the measure the finding reads.",
    "circuits_dla_heads": "Direct logit attribution per head (logits), layer x head: each head's write into the "
                          "answer-minus-wrong logit direction (the answer's own logit direction where the task has no "
                          "wrong answers), with the final norm frozen (on models with a norm after attention, as OLMo 2 "
                          "and Gemma 2/3, each head's write taken through its layer's "
                          "post-attention norm, frozen at its actual scale); red toward the answer, blue away.",
    "circuits_dla_components": "Direct logit attribution per component (logits): embeddings, MLPs, each layer's "
                               "attn_bias (its heads' position-independent write: the attention's output bias and the "
                               "value terms the head rows leave out, as TransformerLens's fold_value_biases places "
                               "them) and norm biases; with the heads (the per-head map) they add up to the final "
                               "logit difference (the "
                               "answer's logit where the task has no wrong answers; before the model's final logit "
                               "soft-cap, where it has one: Gemma 2's and 3's). "
                               "Bars: mean over examples; error bars: its 95% t interval over examples (writers whose "
                               "intervals overlap may not differ). Kinds that are 0 within rounding for every example "
                               "(below 1e-5 of the largest writer, e.g. bias terms of a model without biases) are left "
                               "out and named in the title. On a mixture-of-experts model a tick \"mlpN (MoE)\" is the "
                               "whole block (every expert the router chose and any shared expert); plain mlpN a dense MLP.",
    "circuits_dla_experts": "Direct logit attribution per expert (logits) of each mixture-of-experts block (one panel "
                            "per MoE layer, every panel on one scale symmetric about 0): each expert's write (its "
                            "neurons' and, where experts have output biases as GPT-OSS's, its bias times the router's "
                            "weight on it) into the answer-minus-wrong logit direction (the answer's own without wrong "
                            "answers), mean over "
                            "examples (bar: red toward the answer, blue away) with its 95% t interval; an example the router "
                            "did not send to the expert counts 0, "
                            "and each tick gives the examples routed to it of n. The shared expert (Qwen2-MoE) is "
                            "hatched and ticked \"shared\"; the grey bar right of the dotted line is the layer's total, "
                            "its mlpN row of the components figure, which the experts' bars add up to. With more than 16 "
                            "experts or 8 MoE layers, one map instead: MoE layer (rows) x expert (columns), each cell "
                            "an expert's mean on the diverging scale centred on 0, never-routed experts hatched, the "
                            "shared expert's and the total's columns right of the line.",
    "circuits_faithfulness": "Faithfulness (y, the fraction of the clean-corrupted gap of the task metric, the logit "
                             "difference answer minus wrong answer or the answer's logit where the task has no wrong "
                             "answers, that the circuit recovers; 1 = all) of the top-k edge circuit against its size k "
                             "(x, log scale); grey: the range of random circuits of the same size, dotted: the 80% target.",
    "circuits_mib": "MIB's faithfulness curve (Mueller et al. 2025): f = (m(C) - m(empty)) / (m(full) - m(empty)) of the "
                    "top p% of the edges (x, log scale) for p = 0.1 ... 100; shaded: CPR, the area under f over linear p "
                    "(higher is better); CMD is the area between f and 1 (lower is better); the legend gives each with its 95% "
                    "bootstrap interval over examples. m: the logit difference answer minus wrong answer (the answer's logit "
                    "where the task has no wrong answers).",
    "circuits_graph": "The strongest edges of the circuit, sender to receiver: x = layer (input left, logits right), "
                      "y = head (MLPs at -1: after their layer's heads, at x = layer + 0.5, on sequential blocks; beside "
                      "them, at the heads' x, on parallel blocks, where each MLP reads its block's input, not its heads' "
                      "output (the key then says \"parallel blocks\"); key-value heads KV just left of and below their "
                      "layer's query heads); "
                      "nodes named as elsewhere in the report (L0H3, mlp0); width = |edge score| (estimated change "
                      "of the task metric), red positive, blue negative; "
                      "line style by what the edge feeds (dotted: a query, dashed: a key, solid: a value, an MLP or "
                      "the logits), the key listing only the kinds drawn.",
}
PREFIX_CAPTIONS = {  # figures named <prefix><site>: the caption then 'Site: <site>.'
    "logit_lens": "Logit lens: the answer read from each block's input through the final norm and unembedding. ",
    "dla": "Direct logit attribution: each component's contribution (logits) to the final logit difference (the answer's "
           "logit where the task has no wrong answers). ",
}


# the run's own wording where it has no wrong answers (dla_direction "answer"; review 14b A3: "logit difference" of a
# task without one), in place of CAPTIONS' either-or: (CAPTIONS' phrase, the answer-only one), by figure stem
_ANSWER_ONLY = {
    "circuits_dla_heads": ("answer-minus-wrong logit direction (the answer's own logit direction where the task has no "
                           "wrong answers)", "answer's logit direction (its unembedding: the task has no wrong answers)"),
    "circuits_dla_components": ("final logit difference (the answer's logit where the task has no wrong answers;",
                                "final answer logit (the task has no wrong answers;"),
    "circuits_dla_experts": ("answer-minus-wrong logit direction (the answer's own without wrong answers)",
                             "answer's logit direction (the task has no wrong answers)"),
    "circuits_faithfulness": ("the logit difference answer minus wrong answer or the answer's logit where the task has no "
                              "wrong answers,", "the answer's logit (the task has no wrong answers),"),
    "circuits_mib": ("m: the logit difference answer minus wrong answer (the answer's logit where the task has no "
                     "wrong answers).", "m: the answer's logit (the task has no wrong answers)."),
}


_ATTN_BIAS = ("each layer's attn_bias (its heads' position-independent write: the attention's output bias and the "
              "value terms the head rows leave out, as TransformerLens's fold_value_biases places them)")


def _attn_bias_words(parts: Any) -> str:
    """The DLA components caption's attn_bias as this model has it (summary dla_attn_bias_parts; review 15b B1: on
    GPT-J, with no attention bias, it is ln1's bias through W_V W_O alone), '' where not recorded."""
    if not isinstance(parts, Mapping) or not parts.get("value"):
        return ""
    what = " and ".join(f"{v} and W_O" for v in parts["value"])
    if parts.get("b_O"):
        return f"each layer's attn_bias (the attention's output bias b_O plus {what}, terms the head rows leave out)"
    return (f"each layer's attn_bias ({what}: a term the head rows leave out; this model's attention has no output "
            "bias, so attn_bias is not an attention bias)")


_UNITS = {"circuits_dla_heads": "Direct logit attribution per head (logits)",
          "circuits_dla_components": "Direct logit attribution per component (logits)"}


def _capped_units(summary: Mapping[str, Any]) -> str:
    """The DLA figures' units where the model soft-caps its final logits (review 18d C2): '(logits before the model's
    final soft-cap 6 tanh(x / 6); heads and components together add up to the mean logit difference before the cap,
    9.61, not to the model's output after it, 6.87)'."""
    cap, before, final = (summary.get(k) for k in ("dla_final_softcap", "dla_logit_before_softcap", "dla_final_logit"))
    what = "answer logit" if summary.get("dla_direction") == "answer" else "logit difference"
    sums = (f"; heads and components together add up to the mean {what} before the cap, {before:.3g}, not to the "
            f"model's output after it, {final:.3g}"
            if isinstance(before, (int, float)) and isinstance(final, (int, float)) else "")
    return f"(logits before the model's final soft-cap {cap:g} tanh(x / {cap:g}){sums})"


def caption_for(stem: str, summary: Mapping[str, Any] | None) -> str | None:
    """A figure's caption for this run where it depends on it (families.py), else None (CAPTIONS' holds): the metric
    named for what it is (the answer's logit where the task has no wrong answers), and the faithfulness and MIB
    figures opening with why the findings withhold them (`unreported`: at chance, a clean-corrupted gap within
    noise)."""
    if not isinstance(summary, Mapping) or stem not in CAPTIONS:
        return None
    text = CAPTIONS[stem]
    if summary.get("dla_direction") == "answer" and stem in _ANSWER_ONLY:
        text = text.replace(*_ANSWER_ONLY[stem])
    if stem == "circuits_dla_components" and (bias := _attn_bias_words(summary.get("dla_attn_bias_parts"))):
        text = text.replace(_ATTN_BIAS, bias)
    if stem in _UNITS and isinstance(summary.get("dla_final_softcap"), (int, float)):  # review 18d C2
        text = text.replace(_UNITS[stem], _UNITS[stem].replace("(logits)", _capped_units(summary)))
        text = text.replace("soft-cap, where it has one: Gemma 2's and 3's)", "soft-cap)")
    off = unreported(summary) if stem in ("circuits_faithfulness", "circuits_mib") else None
    if off:
        text = f"Not reported in the findings: {off}. {text}"
    return text if text != CAPTIONS[stem] else None
