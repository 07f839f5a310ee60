"""Figures: one entry point that dispatches to each analysis's plotting module, and the helpers
every plotting module shares.

The convention (seaborn's), every `headscope.reports.plots_<analysis>` module:
- axes-level functions `plot_<what>(data, *, ax=None, ...) -> Axes`: `data` is one tidy DataFrame
  (the Result's df or one of its tables), every other argument keyword-only (the summary values the
  figure needs, such as `metric=` or `baseline=`, passed by name); a new figure when `ax` is None
  (`axes`);
- figure-level functions `<what>_figure(data, *, ...) -> Figure` where a figure has several panels;
- `figures(result) -> {file stem: Figure}` (found through the family's presentation record,
  reports/families.py), the only function that takes a Result: it picks the
  tables and summary values and calls the functions above. Pyplot figures: in a notebook they
  display inline at the end of the cell. Plotting never computes analysis results.

Colour convention, every figure: signed quantities (ablation and patching effects, direct logit
attribution, causal-tracing effects, circuit edges, the lens' logit difference) use DIVERGING,
red = positive, blue = negative, white = 0, with limits symmetric about 0; unsigned ones (gradient
magnitudes, attention weights, masses, role scores) a SEQUENTIAL map from 0 (`color_scale`: by the
quantity, else by the data). A log-probability (<= 0) is on SEQUENTIAL too, its scale ending at 0,
so red = certain and 0 is a tick. Lines told apart by layer (an ordinal index, not a value) use
LAYERS, a palette no value map uses. Panels that are compared (the patching sites, the causal traces
of MLP, attention and residual) share one scale, ticked alike (`scale_ticks`: the same values at the
same fractions of the bound), and a panel whose own maximum is much smaller says so in its title.
Where the values are noise (the model at chance on the task, summary["chance"], or every value under
the numerical noise floor) the map is MUTED (`quiet_reason`) and the title says why, so noise is
never drawn vivid. Values are in their own units; a normalised view is an option and its colour bar says so. Every
head grid is layers (rows) x heads (columns). The explorer's score grid (explorer_view.py) follows the
same convention. Text from tokens goes through `label` (mathtext `$`
and control bytes escaped).
"""
from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping
from typing import Any

# No matplotlib.use() here: importing headscope or plotting a Result never changes the user's
# backend (a notebook keeps its inline one, and its own figures keep rendering). The CLI, which
# only writes files, selects Agg for its own process (cli.main); a headless machine without a
# display falls back to Agg by itself.


DIVERGING = "RdBu_r"  # signed values: red positive, blue negative, centred on 0
SEQUENTIAL = "Reds"  # unsigned values: white at 0, red for large (the diverging map's positive half)
LAYERS = "viridis"  # hue by layer (lines, bars): ordinal, distinct from DIVERGING and SEQUENTIAL, never a value scale
MUTE = 0.7  # a muted map is the map blended this far towards white: noise stays pale


def laid_out(ax: Any) -> Any:
    """The Figure an axes-level plot drew on, laid out tight: what each `figures(result)` stores by stem."""
    ax.figure.tight_layout()
    return ax.figure


def drawn(fig: Any) -> Any:
    """`fig`'s renderer after a draw at its current state: the draw (fig.draw_without_rendering) is skipped where
    nothing changed since the last one (matplotlib's `stale` flag, set by every change to an artist, its text, the
    axes' positions, the figure's size), so that fitters called in turn measure one layout. A figure with a layout
    engine that runs at each draw (constrained) is always drawn again. Every fitter measures through it."""
    from matplotlib.layout_engine import PlaceHolderLayoutEngine

    engine = fig.get_layout_engine()
    if fig.stale or not (engine is None or isinstance(engine, PlaceHolderLayoutEngine)):
        fig.draw_without_rendering()
    return fig.canvas.get_renderer()


def wrap_to_width(line: str, wide: Callable[[str], float], width: float, least: int = 10, **wrap: Any) -> list[str]:
    """`line` re-wrapped (textwrap, with `wrap`'s options) until no part is wider than `width` as `wide` measures it:
    each try at fewer characters a line, scaled by how far the widest part overshoots, never under `least` (a part
    that still overshoots there stays); [line] where it fits. A word is never broken (review 16cv C1: "clean-corrupt /
    ed gap"): one wider than `width` stays whole on its line. fit_title, fit_labels and plots_patching's
    fit_axis_labels wrap by it."""
    wrap.setdefault("break_long_words", False)
    chars, parts = len(line), [line]
    while chars > least and any(wide(p) > width for p in parts):
        chars = min(chars - 1, int(chars * width / max(wide(p) for p in parts)))
        parts = textwrap.wrap(line, max(chars, least), **wrap)
    return parts


def fit_title(ax: Any) -> bool:
    """Re-wrap each line of `ax`'s title that is wider than the axes (measured on its figure at the current size
    and layout), then lay the figure out again: a centred title then stays over its axes, clear of a colour bar's
    label beside them (review 9b B3: a two-line title ran under it). Returns whether the title changed."""
    fig, title = ax.figure, ax.title
    drawn(fig)
    renderer = fig.canvas.get_renderer()
    width = ax.get_window_extent(renderer).width

    def wide(line: str) -> float:
        return renderer.get_text_width_height_descent(line, title.get_fontproperties(), ismath=False)[0]

    text = "\n".join(part for line in title.get_text().split("\n") for part in wrap_to_width(line, wide, width))
    if text == title.get_text():
        return False
    title.set_text(text)
    fig.tight_layout()
    return True


MIN_MAP_INCHES = 1.6  # a map's drawn height and width never under this (176 px at the saved 110 dpi)


def keep_drawn_size(ax: Any, height: float = MIN_MAP_INCHES, width: float = MIN_MAP_INCHES) -> bool:
    """Review 14bv C1: a figure of fixed size whose title and x label grew (bf16: 11 title lines) left its map 12 px
    high, ticks and colour-bar labels overprinted. Measured at the figure's layout, the figure grows by what the axes
    lack of `height` x `width` inches and is laid out again (text keeps its size, so the axes get the growth).
    Returns whether it grew."""
    fig, grown = ax.figure, False
    for _ in range(4):  # a new layout may re-place the text a little: measure again
        drawn(fig)
        box = ax.get_window_extent(fig.canvas.get_renderer())
        short = (max(0.0, width - box.width / fig.dpi), max(0.0, height - box.height / fig.dpi))  # inches
        if max(short) < 0.01:
            break
        w, h = fig.get_size_inches()
        fig.set_size_inches(w + short[0], h + short[1])
        fig.tight_layout()
        grown = True
    return grown


BAR_LABEL_POINTS = 8.0  # a colour bar's label is never drawn smaller (review 16c C4: shrunk to fit, it read ~5 pt)


def fit_bar_label(bar: Any) -> bool:
    """A colour-bar label taller than its bar (review 16c C4): at BAR_LABEL_POINTS or more, its lines re-wrapped to the
    bar's height; where still taller, the figure grows in height until the bar is as tall (plots.keep_drawn_size).
    Never shrunk. Returns whether anything changed."""
    fig, text = bar.figure, bar.yaxis.label
    text.set_fontsize(max(BAR_LABEL_POINTS, text.get_fontsize()))
    drawn(fig)
    renderer = fig.canvas.get_renderer()
    tall = bar.get_window_extent(renderer).height

    def long(line: str) -> float:  # a rotated label's length is its text's width
        return renderer.get_text_width_height_descent(line, text.get_fontproperties(), ismath=False)[0]

    written = text.get_text()
    wrapped = "\n".join(part for line in written.split("\n")
                         for part in wrap_to_width(line, long, tall, 12, break_on_hyphens=False))
    if wrapped != written:
        bar.set_ylabel(wrapped)
    fig.tight_layout()
    drawn(fig)
    needed = (text.get_window_extent(renderer).height + 4) / fig.dpi  # inches, a few pixels clear
    keep_drawn_size(bar, height=needed, width=0.0)
    return True


LABEL_CHARS = 20  # fit_labels wraps a y label into lines of this many characters at the fewest: phrases, not words


def fit_labels(ax: Any) -> bool:
    """The one rule of every figure for a y label and a title (reviews 14c C1, 14av C1: a y label taller than its axes
    ran into the title above them). Measured at the figure's layout: (1) the title's lines re-wrapped to the axes'
    width (`fit_title`), first, since a title of more lines leaves the axes shorter; (2) where the y label is taller
    than the axes, its lines re-wrapped to their height (lines of LABEL_CHARS characters at the fewest), which keeps
    the figure's size; (3) where wrapping cannot fit (a part still longer than the height, or the narrower axes would
    crowd x tick labels that were apart: ticks thinned at this width), the label is kept as written and the figure
    grows in height, never in width, until the axes are as tall as it (`keep_drawn_size`). The label then ends below
    the title. Returns whether anything changed."""
    fig, label = ax.figure, ax.yaxis.label
    changed = fit_title(ax)
    if not label.get_text() or not label.get_visible():
        return changed
    drawn(fig)
    renderer = fig.canvas.get_renderer()
    height = ax.get_window_extent(renderer).height
    if label.get_window_extent(renderer).height <= height + 0.5:
        return changed

    def tall(line: str) -> float:  # a rotated label's length is its text's width
        return renderer.get_text_width_height_descent(line, label.get_fontproperties(), ismath=False)[0]

    written, crowded = label.get_text(), _touching_xticks(ax, renderer)
    text = "\n".join(part for line in written.split("\n") for part in wrap_to_width(line, tall, height, LABEL_CHARS))
    if text != written:
        label.set_text(text)
        fig.tight_layout()
        drawn(fig)
        fits = label.get_window_extent(renderer).height <= ax.get_window_extent(renderer).height + 0.5
        if not fits or _touching_xticks(ax, renderer) > crowded:
            label.set_text(written)  # wrapping cannot fit: grow instead
            fig.tight_layout()
        changed = True
    drawn(fig)
    needed = (label.get_window_extent(renderer).height + 4) / fig.dpi  # inches, a few pixels clear
    return keep_drawn_size(ax, height=needed, width=0.0) or changed


def _touching_xticks(ax: Any, renderer: Any) -> int:
    """How many neighbouring pairs of `ax`'s shown x tick labels touch, as drawn."""
    lo, hi = sorted(ax.get_xlim())
    boxes = sorted((t.get_window_extent(renderer) for x, t in zip(ax.get_xticks(), ax.get_xticklabels())
                    if t.get_text() and t.get_visible() and lo <= x <= hi), key=lambda b: b.x0)
    return sum(a.x1 > b.x0 for a, b in zip(boxes, boxes[1:]))


def fit_figure_labels(fig: Any) -> Any:
    """`fit_labels` on each of `fig`'s axes whose y label is taller than it or touches its title (colour bars
    excepted): what every figure `plot_result` returns has passed. Returns `fig`."""
    drawn(fig)
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        label = ax.yaxis.label
        if getattr(ax, "_colorbar", None) is not None or not label.get_text() or not label.get_visible():
            continue
        box, said = ax.get_window_extent(renderer), label.get_window_extent(renderer)
        if said.height > box.height + 0.5 or (ax.title.get_text() and said.overlaps(ax.title.get_window_extent(renderer))):
            fit_labels(ax)
    return fig


def thin_xtick_labels(ax: Any, pad: float = 4.0, order: Any = None) -> list[int]:
    """Blank the x tick labels that would run into a kept one, measured on `ax`'s figure at its current size and
    layout, `pad` pixels apart at least; the ticks stay. `order`: the tick indices to keep in priority order (each
    kept unless it runs into one kept before it; a label not in it is blanked: the cells a finding names first, then
    every k-th); by default left to right, the first kept. Labels set as fixed text (set_xticks(ticks, labels)).
    Returns the blanked ticks' indices, so that the caller can say elsewhere what they would have read. Later layouts
    that only widen the axes keep it true."""
    fig = ax.figure
    drawn(fig)  # positions and text of the ticks as they will be drawn
    renderer = fig.canvas.get_renderer()
    ticks = list(ax.get_xticks())
    texts = [t.get_text() for t in ax.get_xticklabels()]
    lo, hi = sorted(ax.get_xlim())
    boxes = [t.get_window_extent(renderer) if text and lo <= x <= hi else None
             for x, text, t in zip(ticks, texts, ax.get_xticklabels())]
    shown = [i for i, b in enumerate(boxes) if b is not None]
    tried = sorted(shown, key=lambda i: boxes[i].x0) if order is None else [i for i in dict.fromkeys(order) if i in shown]
    kept: list[int] = []
    for i in tried:
        if all(boxes[i].x0 >= boxes[j].x1 + pad or boxes[i].x1 + pad <= boxes[j].x0 for j in kept):
            kept.append(i)
    blanked = [i for i in shown if i not in kept]
    if blanked:
        ax.set_xticks(ticks, ["" if i in blanked else text for i, text in enumerate(texts)])
    return sorted(blanked)


def blank_xticks(ax: Any) -> list[int]:
    """The indices of `ax`'s x tick labels that are blank (thinned, or written empty)."""
    return [i for i, t in enumerate(ax.get_xticklabels()) if not t.get_text()]


def rethin_until_settled(ax: Any, refit: Callable[[], Any], tries: int, blanked: list[int] | None = None) -> None:
    """The re-thinning step that plots_patching.fit_position_ticks and plots_kv.fit_budget_ticks share: `refit()` (their
    thinning and label fitting at the figure's current layout) up to `tries` times, until the x tick labels it leaves
    blank (`blank_xticks`) are those the call before left; `blanked`: those before the first call (None: it runs at least
    twice)."""
    for _ in range(tries):
        refit()
        now = blank_xticks(ax)
        if now == blanked:
            return
        blanked = now


def axes(ax: Any = None, size: tuple[float, float] = (7, 4)) -> Any:
    """`ax`, or the Axes of a new figure of `size` inches: the one axes helper of every plot_ function."""
    import matplotlib.pyplot as plt

    return ax if ax is not None else plt.subplots(figsize=size)[1]


def label(text: Any) -> str:
    """A token (or any user string) as matplotlib text that shows what it is: a `$` would start
    mathtext, and control bytes (a byte-level tokenizer's '\\x02', a newline) have no glyph, so they
    are written as Python escapes ('\\\\x02', '\\\\n')."""
    out = []
    for ch in str(text):
        if ch == "$":
            out.append(r"\$")
        elif ch == " " or ch.isprintable():
            out.append(ch)
        else:
            out.append(repr(ch)[1:-1])  # '\x02', '\n', '\u200b'
    return "".join(out)


def token_label(token: Any) -> str:
    """A token as a tick label: `label`, with each space shown as "␣" (review 10a B2: a byte-level BPE's
    " Sever" must read apart from the word piece "al", and a token that is only a space must not be a blank
    label; a newline "↵", a tab "⇥"), as the explorer shows it (tokens_view.visible_token)."""
    from headscope.reports.tokens_view import visible_token

    return label(visible_token(token))


def symmetric_bound(*arrays: Any) -> float:
    """max |value| over the arrays (NaN ignored), 1 when there is none or it is 0: vmin = -bound, vmax = bound."""
    import numpy as np

    values = [np.abs(np.asarray(a, dtype=float)) for a in arrays]
    peak = max((float(np.nanmax(v)) for v in values if v.size and np.isfinite(v).any()), default=0.0)
    return peak if peak > 0 else 1.0


def signed(*arrays: Any) -> bool:
    """Whether any finite value is below 0 (signed data: diverging map), else unsigned (sequential from 0)."""
    import numpy as np

    return any(bool((np.asarray(a, dtype=float)[np.isfinite(np.asarray(a, dtype=float))] < 0).any()) for a in arrays)


def muted(cmap: str) -> Any:
    """`cmap` blended MUTE of the way towards white: the same hues, none vivid."""
    import matplotlib as mpl
    import numpy as np
    from matplotlib.colors import ListedColormap

    colours = mpl.colormaps[cmap](np.linspace(0, 1, 256))
    colours[:, :3] = colours[:, :3] * (1 - MUTE) + MUTE
    return ListedColormap(colours, name=f"{cmap}_muted")


def line_colours(n: int, *, quiet: bool = False) -> list[tuple[float, float, float]]:
    """n line colours of seaborn's palette; `quiet` blends them MUTE of the way towards white, as
    `muted` does a map: lines drawn at chance are pale, like muted heat maps."""
    import seaborn as sns

    colours = sns.color_palette(n_colors=n)
    return [tuple(c * (1 - MUTE) + MUTE for c in rgb) for rgb in colours] if quiet else list(colours)


def mute_drawn(ax: Any, reason: str | None, *, say: bool = True) -> Any:
    """An axes already drawn, marked as `quiet_reason` marks a map (`reason`: its line; None leaves the axes as it is):
    every line, marker, bar, band and error bar blended MUTE of the way towards white (its legend's keys too), and
    `reason` put above the title (review 14a B1, C4: line and bar figures drawn in full colour at chance beside
    muted maps)."""
    if not reason:
        return ax
    from matplotlib.colors import to_rgba

    def pale(colour: Any) -> Any:
        if isinstance(colour, str) and colour.lower() == "none":
            return colour
        r, g, b, a = to_rgba(colour)
        return (r * (1 - MUTE) + MUTE, g * (1 - MUTE) + MUTE, b * (1 - MUTE) + MUTE, a)

    from matplotlib.collections import Collection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    def mute(artist: Any) -> None:
        if isinstance(artist, Line2D):
            artist.set_color(pale(artist.get_color()))
            artist.set_markerfacecolor(pale(artist.get_markerfacecolor()))
            artist.set_markeredgecolor(pale(artist.get_markeredgecolor()))
        elif isinstance(artist, Patch):
            artist.set_facecolor(pale(artist.get_facecolor()))
        elif isinstance(artist, Collection):
            if len(artist.get_facecolors()):
                artist.set_facecolor([pale(c) for c in artist.get_facecolors()])
            if len(artist.get_edgecolors()):
                artist.set_edgecolor([pale(c) for c in artist.get_edgecolors()])

    legend = ax.get_legend()
    for artist in [*ax.lines, *ax.patches, *ax.collections, *(legend.legend_handles if legend is not None else [])]:
        mute(artist)
    if say:  # say=False: a panel beside one that says it
        ax.set_title(f"{reason}\n{ax.get_title()}" if ax.get_title() else reason)
    return ax


def hatch_cells(ax: Any, mask: Any, hatch: str = "//", **style: Any) -> None:
    """Hatch grey the heat-map cells where `mask` ([rows, columns] bool) is True: a value 0 by construction (a
    sliding window's masked keys, cells beyond its reach, a score it makes unmeasurable), not a measured 0.
    hatch: its pattern (two kinds of such cells in one map: two patterns); style: more Rectangle keywords (zorder)."""
    from matplotlib.patches import Rectangle

    for i, j in zip(*mask.nonzero()):
        ax.add_patch(Rectangle((j, i), 1, 1, facecolor="0.85", hatch=hatch, edgecolor="0.6", linewidth=0, **style))


def color_scale(*arrays: Any, bound: float | None = None, quiet: bool = False,
                is_signed: bool | None = None) -> dict[str, Any]:
    """seaborn heatmap keywords for the convention: signed data on DIVERGING centred on 0 from -bound
    to bound, unsigned on SEQUENTIAL from 0 to bound (bound: max |value| when None); muted when `quiet`.
    `is_signed`: whether the quantity is signed (an ablation effect stays signed when every value
    happens to be >= 0); None decides from the data (`signed`)."""
    bound = bound or symmetric_bound(*arrays)
    if signed(*arrays) if is_signed is None else is_signed:
        # centred by the symmetric limits: seaborn's `center` would rebuild the map with set_bad, which Matplotlib
        # 3.11 flags as pending deprecation, a warning in the user's notebook for each map (review 12c C4)
        return {"cmap": muted(DIVERGING) if quiet else DIVERGING, "vmin": -bound, "vmax": bound}
    return {"cmap": muted(SEQUENTIAL) if quiet else SEQUENTIAL, "vmin": 0.0, "vmax": bound}


def scale_ticks(bound: float, *, is_signed: bool = True) -> dict[str, Any]:
    """Colour-bar keywords (seaborn's cbar_kws) that tick a scale at fixed fractions of its bound,
    -bound, -bound/2, 0, bound/2, bound (signed) or 0, bound/4, ..., bound (unsigned), written to two
    significant digits with no offset: panels that share a bound then share their ticks whatever their
    height (matplotlib's own locator picks ticks by the colour bar's length, so a taller panel of the
    same scale was ticked at ±0.25 steps and a shorter one at ±0.5)."""
    fractions = (-1.0, -0.5, 0.0, 0.5, 1.0) if is_signed else (0.0, 0.25, 0.5, 0.75, 1.0)
    return {"ticks": [f * bound if f else 0.0 for f in fractions], "format": "%.2g"}


def quiet_reason(summary: Mapping[str, Any] | None) -> str | None:
    """Why an analysis's effects are noise, as a title line, or None: the model is at chance on the
    task (summary["chance"], analyses/core/chance.py)."""
    entry = (summary or {}).get("chance")
    if isinstance(entry, Mapping) and entry.get("at_chance") is True:
        from headscope.analyses.core.chance import does_not_copy

        if does_not_copy(entry):  # a copy task it does not do (chance.copy_task)
            return "NOT DOING THE TASK: muted colours (it copies none of the context's values; noise, not task behaviour)"
        if entry.get("below_chance") is True:  # worse than guessing: no behaviour to locate either
            if entry.get("prompt_independent") is True:  # the corrupted prompts give as much (chance.corrupted_baseline)
                return "BELOW CHANCE: muted colours (an answer preference the prompt does not change; no task behaviour)"
            return "BELOW CHANCE: muted colours (the model prefers wrong answers; no task behaviour)"
        return "AT CHANCE: muted colours (noise, not task behaviour)"
    return None


def setup_style() -> None:
    import seaborn as sns

    sns.set_theme(context="notebook", style="whitegrid")


def plot_result(result: Any, **kwargs: Any) -> dict:
    """{figure stem: Figure} for a Result, from its analysis's plotting module."""
    from headscope.reports.families import presentation

    setup_style()
    shown = presentation(result.name)
    return {} if shown is None else {stem: fit_figure_labels(fig) for stem, fig in shown.figures(result, **kwargs).items()}
