"""The top heads' attention patterns on one example, drawn from the explorer's data (reports/explorer.py).

Heads are ranked by one of the explorer's per-head scores (its default: importance when the heads
analysis ran), signed and largest first, as the heads finding ranks them (review 18w C1: a head whose removal helps
is no top head); with the heads run's facts (heads_facts) the title says which shown heads' 95% intervals include 0
and which tie within rounding; each panel is a query x key heat map of attention weights (0-1), tokens as text
(plots.label). `top_heads_figure` is figure-level (one panel per head) and returns the Figure; its
data is the explorer's dict, the one figure not drawn from a Result's tables. Scores in panel
titles have 3 significant digits, so a small non-zero score never reads 0.00. Weights are unsigned:
the convention's sequential map (plots.color_scale), white at 0 to red at 1. The colour bar has its
own column of the layout, so a panel title wider than its panel (short examples, long score names)
is spaced from it like from the next panel. When the heads analysis
is at chance (`quiet`, plots.quiet_reason of its summary) an importance ranking is noise: the
heads are chosen by a pattern statistic instead (PATTERN_SCORES, the first the data has) and the
title says so; without one the panels are muted and titled as heads chosen by noise.
On a sliding-window layer (the data's `windows`) a key outside a query's window is hatched grey, masked and not
zero attention, as the explorer hatches it (reviews 18a C1, 18d C1), and the title names the windows. Ranked by a
role score (ROLE_BARS) of which no head passes the role's threshold, the title says the heads are only the highest
scores, none a role head (review 18a B3).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from headscope.analyses.heads.roles import POSITIONAL_SHARE, ROLE_THRESHOLDS
from headscope.models.hooked_model import and_join, visible_keys
from headscope.reports.explorer import pattern_from_data
from headscope.reports.plots import color_scale, hatch_cells, label, token_label, wrap_to_width

MAX_LABELS = 48  # tick labels per axis; longer examples label every k-th token
# scores read from the attention patterns alone (no task metric), used instead of importance at chance
PATTERN_SCORES = ("previous_token", "induction", "sink", "positional")
ROLE_BARS = {**ROLE_THRESHOLDS, "positional": POSITIONAL_SHARE}  # a role score's threshold for its label (heads/roles.py)
MASKED_WORDS = "hatched: keys outside the window (masked, not zero attention)"


def _chosen_by(data: Mapping[str, Any], score: str | None, quiet: str | None) -> tuple[str | None, str | None]:
    """(score to rank by, why it replaced the default or None). At chance a task-metric score
    (importance) ranks noise, so a pattern statistic the data has is used instead."""
    name = score or data.get("default_score") or next(iter(data.get("scores") or {}), None)
    if not quiet or name is None or not str(name).startswith("importance"):
        return name, None
    for other in PATTERN_SCORES:
        if other in (data.get("scores") or {}):
            return other, f"{name} is noise at chance"
    return name, None


def top_heads(data: Mapping[str, Any], score: str | None = None, k: int = 4) -> list[tuple[int, int, float]]:
    """(layer, head, score) of the k heads with the largest score (the explorer's default score), signed, as the
    heads finding ranks them: a head whose removal helps (a negative importance) is no top head (review 18w C1).
    Heads scoring 0 or less are left out, and a boundary tie is not broken by head index: when the k-th and
    the next head tie, the tied heads are all dropped (none when everything ties, e.g. a score that is
    rounding everywhere), so the panels never present an arbitrary order as a ranking."""
    name = score or data.get("default_score") or next(iter(data.get("scores") or {}), None)
    grid = (data.get("scores") or {}).get(name)
    if grid is None:
        return []
    cells = [(layer, head, float(v)) for layer, row in enumerate(grid) for head, v in enumerate(row)
             if isinstance(v, (int, float)) and np.isfinite(v)]
    ranked = sorted((c for c in cells if c[2] > 0), key=lambda c: (-c[2], c[0], c[1]))
    if len(ranked) > k and ranked[k - 1][2] == ranked[k][2]:
        tie = ranked[k][2]
        return [c for c in ranked[:k] if c[2] != tie]
    return ranked[:k]


def heads_facts(folder: Any) -> dict[str, Any] | None:
    """{"summary": the heads summary, "intervals": {method: {head: [low, high]}}} of a report folder's heads run (each
    head's importance -+ the 95% t half-width of its standard error over the summary's n_examples, as the heads finding
    gives the first two heads' intervals); None without one. What `importance_words` reads."""
    import json
    from pathlib import Path

    import pandas as pd

    from headscope.analyses.core.chance import se_interval

    heads = Path(folder) / "heads"
    try:
        summary = json.loads((heads / "summary.json").read_text())
        table = pd.read_csv(heads / "results.csv")
    except (OSError, ValueError):
        return None
    n = int(summary.get("n_examples") or 0) if isinstance(summary, dict) else 0
    intervals: dict[str, dict[str, list[float]]] = {}
    if n >= 2 and {"method", "head_name", "importance", "importance_se"} <= set(table.columns):
        for row in table.itertuples():
            ci = se_interval(row.importance, row.importance_se, n)
            if ci is not None:
                intervals.setdefault(str(row.method), {})[str(row.head_name)] = ci
    return {"summary": summary, "intervals": intervals}


def importance_words(name: str | None, heads: list[tuple[int, int, float]], facts: Mapping[str, Any] | None) -> str:
    """'only L0H1's 95% interval excludes 0: L0H3, L0H0 are not distinguishable from 0 at 95%; L0H3, L1H1 tied within
    rounding' for the shown heads ranked by importance (<method>), from the heads run's `facts` (heads_facts): the
    heads finding's own intervals and its ties within rounding (tied_top_groups_<method>); '' when every shown head's
    interval excludes 0 and none ties, or without facts (review 18w C1)."""
    found = re.fullmatch(r"importance \((\w+)\)", str(name))
    if not found or not facts:
        return ""
    method = found.group(1)
    shown = [f"L{layer}H{head}" for layer, head, _ in heads]
    ci = (facts.get("intervals") or {}).get(method) or {}
    said = []
    within = [h for h in shown if h in ci and ci[h][0] <= 0 <= ci[h][1]]
    clear = [h for h in shown if h in ci and h not in within]
    if within:
        if not clear:
            said.append(f"no shown head's 95% interval excludes 0 ({len(shown)} heads: not distinguishable from 0)")
        else:
            said.append(f"only {and_join(clear)}'s 95% interval{'' if len(clear) == 1 else 's'} exclude"
                        f"{'s' if len(clear) == 1 else ''} 0: {and_join(within)} "
                        f"{'is' if len(within) == 1 else 'are'} not distinguishable from 0 at 95%")
    summary = facts.get("summary") if isinstance(facts.get("summary"), Mapping) else {}  # a damaged file: no ties
    for group in summary.get(f"tied_top_groups_{method}") or []:
        tied = [str(h) for h in group if str(h) in shown]
        if len(tied) > 1:
            said.append(f"{and_join(tied)} tied within rounding (their order is arbitrary)")
        elif tied:  # a tie across the cut: the head left out is as large as the one shown
            said.append(f"{tied[0]} tied within rounding with {and_join([str(h) for h in group if str(h) != tied[0]])}"
                        f" (not shown)")
    return "; ".join(said)


def masked_keys(data: Mapping[str, Any], example: int, layer: int) -> np.ndarray:
    """[query, key] bool: the keys of `layer`'s sliding window (data's `windows`) that a query cannot see on one
    example, at each shown token's place in the prompt (`positions` of a cut example); all False on a global layer."""
    ex = data["examples"][example]
    n = len(ex["tokens"])
    windows = data.get("windows") or []
    window = windows[layer] if layer < len(windows) else None
    if not window:
        return np.zeros((n, n), bool)
    pos = np.asarray(ex.get("positions") or range(n))  # [token]
    causal = pos[None, :] <= pos[:, None]  # [q, k]
    return causal & ~visible_keys(pos[:, None], pos[None, :], int(window)).numpy()


def window_line(data: Mapping[str, Any], layers: list[int]) -> str:
    """'layers 0, 1 slide over 12 keys; hatched: keys outside the window (masked, not zero attention)' for the
    shown `layers` that slide (data's `windows`); '' when none does."""
    windows = data.get("windows") or []
    by_size: dict[int, list[int]] = {}
    for layer in sorted(set(layers)):
        if layer < len(windows) and windows[layer]:
            by_size.setdefault(int(windows[layer]), []).append(layer)
    said = [f"layer{'s' if len(ls) > 1 else ''} {', '.join(map(str, ls))} slide{'' if len(ls) > 1 else 's'} over {w} keys"
            for w, ls in sorted(by_size.items())]
    return "; ".join(said) + f"; {MASKED_WORDS}" if said else ""


def role_bar_words(data: Mapping[str, Any], name: str | None) -> str:
    """'none passes the role threshold 0.5' where `name` is a role score (ROLE_BARS) no head reaches (induction: no
    head but a decoder's layer 0, which is never labelled), else ''."""
    bar = ROLE_BARS.get(str(name))
    grid = (data.get("scores") or {}).get(name)
    if bar is None or grid is None:
        return ""
    skip = 1 if name == "induction" and not data.get("is_encoder") else 0
    passing = [v for layer, row in enumerate(grid) if layer >= skip for v in row
               if isinstance(v, (int, float)) and np.isfinite(v) and v >= bar]
    return "" if passing else f"none passes the role threshold {bar:g}"


def top_heads_figure(data: Mapping[str, Any], *, score: str | None = None, k: int = 4, example: int = 0,
                     quiet: str | None = None, facts: Mapping[str, Any] | None = None) -> Figure | None:
    """One panel per top head: its attention pattern (query row x key column) on one example; None without data.
    `quiet`: why the heads analysis's scores are noise (plots.quiet_reason), see the module's docstring. `facts`: the
    heads run's intervals and ties (heads_facts): ranked by importance, the title says which shown heads' intervals
    include 0 and which tie within rounding (importance_words), and then calls them the largest, not the top heads.

    Drawn with imshow and a constrained layout (one layout pass): seaborn's heatmap draws the
    figure again to check its tick labels, which made this the report's slowest figure. Past
    MAX_LABELS tokens every k-th token is labelled."""
    name, why = _chosen_by(data, score, quiet)
    heads = top_heads(data, name, k)
    if not heads or not data.get("examples"):
        return None
    tokens = [token_label(t) for t in data["examples"][example]["tokens"]]
    size = max(3.0, 0.16 * len(tokens) + 1.2)
    # the colour bar in a column of its own (width 0.15 in): constrained layout then keeps every panel's
    # title (which may be wider than its panel) clear of it, as it keeps the panels clear of each other
    fig, axes = plt.subplots(1, len(heads) + 1, figsize=(size * len(heads) + 0.9, size + 0.6), squeeze=False,
                             layout="constrained", width_ratios=[size] * len(heads) + [0.15])
    *panels, bar = axes[0]
    noise = bool(quiet) and why is None and str(name).startswith("importance")  # ranked by noise, no alternative
    every = max(1, -(-len(tokens) // MAX_LABELS))
    ticks = list(range(0, len(tokens), every))
    scale = color_scale(bound=1.0, is_signed=False, quiet=noise)  # weights 0-1: white at 0, red at 1
    image = None
    for ax, (layer, head, value) in zip(panels, heads):
        pattern = np.array(pattern_from_data(data, example, layer, head))  # [query, key]
        masked = masked_keys(data, example, layer)  # [query, key] outside the window: hatched, not drawn as 0
        n = len(tokens)  # cells span [k, k + 1] x [q, q + 1], as in a seaborn map (plots.hatch_cells)
        image = ax.imshow(np.ma.masked_array(pattern, masked), vmin=scale["vmin"], vmax=scale["vmax"],
                          cmap=scale["cmap"], interpolation="nearest", extent=(0, n, n, 0))
        hatch_cells(ax, masked)
        ax.grid(False)  # the report's whitegrid style would draw lines across the cells
        ax.set_xticks([i + 0.5 for i in ticks], [tokens[i] for i in ticks], rotation=90)
        ax.set_yticks([i + 0.5 for i in ticks], [tokens[i] for i in ticks])
        ax.tick_params(labelsize=max(4, min(8, 200 / len(ticks))), length=0)
        ax.set_title(f"L{layer}H{head} ({label(name)} {value:.3g})", fontsize="small")
        ax.set_xlabel("key (attended to)")
        ax.set_ylabel("query" if ax is panels[0] else "")
    none = role_bar_words(data, name)  # review 18a B3: the highest scores of a role no head has are no role heads
    weak = importance_words(name, heads, facts)  # review 18w C1: intervals that include 0, ties within rounding
    top = f"the {len(heads)} largest {name} scores" if none or weak else f"top {len(heads)} heads by {name}"
    notes = "; ".join(x for x in (f"a pattern statistic: {why}" if why else "", none, weak) if x)
    if noise:
        title = (f"{len(heads)} heads chosen by noise ({name} at chance), not the most important: attention on "
                 f"example {example + 1}\n{quiet}")
    else:
        title = f"{top}{f' ({notes})' if notes else ''}: attention on example {example + 1}"
    slid = window_line(data, [layer for layer, _, _ in heads]) if any(
        masked_keys(data, example, layer).any() for layer, _, _ in heads) else ""
    title += f"\n{slid}" if slid else ""
    fig.suptitle(title, fontsize="medium")
    renderer, props = fig.canvas.get_renderer(), fig._suptitle.get_fontproperties()
    fig._suptitle.set_text("\n".join(  # each line no wider than the figure (a long line would be clipped at its edges)
        part for line in title.split("\n") for part in wrap_to_width(
            line, lambda t: renderer.get_text_width_height_descent(t, props, ismath=False)[0], 0.98 * fig.bbox.width)))
    fig.colorbar(image, cax=bar, label="attention weight (0-1)")
    bar.set_label("<colorbar>")  # what matplotlib names the colour bars it makes itself
    return fig


CAPTIONS = {  # what to read from the figure and its units, by figure stem
    "top_attention": "The top heads' attention patterns on one example: row = query token, column = key token, "
                     "colour = attention weight (0-1). On a sliding-window layer a hatched grey cell is a key outside "
                     "the query's window (masked, not zero attention). Heads ranked by a role score that no head "
                     "reaches the role's threshold for are only the highest scores, not role heads; the title says so. "
                     "Ranked by importance, the heads are the heads finding's order (largest first, signed: a head "
                     "whose removal helps is not shown); the title says which shown heads' 95% intervals include 0 "
                     "and which tie within rounding.",
}
