"""Figures of the `patching` analysis: heatmaps, attribution-vs-exact scatter, causal traces.

reports/plots.py's convention: `plot_<what>(data, *, ax=None, ...) -> Axes` over the Result's tidy
tables; `figures(result)` draws every figure the tables allow. Positions are labelled "i: token"
for one prompt; for several (mixed lengths are left-padded, so position i means a different token
in each prompt) by their place from the end, "-1 (last)", "-2", ..., which means the same in every
prompt, never one prompt's tokens under an average. Token strings go through plots.label. Colour
scales show the share of the clean-corrupted gap (1 = clean behaviour fully restored when
denoising), the unit the guide text uses; a raw metric (the exact table's `effect`, patched minus
baseline, in metric units) is shown where the summary has no gap to divide by or says the gap is
within noise (summary["gap_within_noise"]: -0.002 of a -0.0024 gap is no "0.93 restored"). Every
exact map and the path-patching map share one diverging scale centred on 0 (a q or pattern site at
0.003 of the gap looks pale next to head_out at 0.3, with its own max in the title); at chance
(plots.quiet_reason) the maps are muted and say so; so are maps of a gap within noise (their scale no narrower than its 95%
interval) and panels whose every cell is within the rounding floor (the scale spans at least two floors; non-zero cells within
one are dotted grey). Causal traces of several prompts are drawn by
token role, shared across the restored kinds.

This module is the family's whole presentation (reports/families.py): after the figures, `GUIDE`
(how to read its section), `CAPTIONS` (each figure's, by stem) and `finding(summary)`, its headline,
whose words live in reports/patching_words.py.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from headscope.analyses.patching.attribution_patching import (
    NEGLIGIBLE,
    interval_stated,
    nonzero_count,
    slope_with_interval,
)
from headscope.reports.patching_sites import KV_SITES, differ_offsets
from headscope.reports.patching_words import cited_cells
from headscope.reports.patching_words import finding as finding  # the headline: families.py reads it here
from headscope.reports.plots import (
    axes,
    color_scale,
    drawn,
    fit_bar_label,
    fit_title,
    hatch_cells,
    keep_drawn_size,
    laid_out,
    quiet_reason,
    rethin_until_settled,
    scale_ticks,
    symmetric_bound,
    thin_xtick_labels,
    token_label,
    wrap_to_width,
)
from headscope.reports.plots_circuits import PARTIAL_VEIL

BY_POS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")
BY_HEAD = ("head_out", "q", "k", "v", "pattern")
NORMALISED = "share of the clean-corrupted gap"


def _position_token(text: str) -> str:
    """'3: ␣Sever' from the table's '3:  Sever' (patching/inputs.py labels a position "i: token"): the token's
    spaces shown as the explorer shows them (plots.token_label), the separator's left alone."""
    head, sep, rest = str(text).partition(": ")
    return f"{head}: {token_label(rest)}" if sep and head.isdigit() else token_label(text)


def position_labels(rows: pd.DataFrame, positions, n_prompts: int | None, n_positions: int | None = None) -> list[str]:
    """Tick labels for patched positions (left-padded: the last position is every prompt's last
    token): "i: token" when there is one prompt, else the place from the end, "-1 (last)", "-2", ...
    (the table's tokens are one prompt's, wrong under an average over prompts of other tokens)."""
    if n_prompts == 1:
        tokens = rows.drop_duplicates("pos").set_index("pos")["token"]
        return [_position_token(tokens[p]) for p in positions]
    end = int(n_positions) if n_positions else int(max(positions)) + 1
    return [f"{int(p) - end} (last)" if int(p) == end - 1 else str(int(p) - end) for p in positions]


def _partial_columns(rows: pd.DataFrame, positions, n_prompts: int | None) -> dict[int, int]:
    """{column index: prompts} of the position columns averaged over fewer than all n_prompts prompts
    (the exact table's n_rows: under left padding a position far from the end is real in the longer
    prompts only)."""
    if not n_prompts or n_prompts < 2 or "n_rows" not in rows:
        return {}
    counts = rows.groupby("pos")["n_rows"].max()
    return {i: int(counts[p]) for i, p in enumerate(positions) if p in counts and int(counts[p]) < n_prompts}


def _mute_partial(ax: Axes, partial: dict[int, int], n_rows: int, n_prompts: int | None) -> None:
    """As the logit lens (plots_circuits.plot_lens): a white veil over each column averaged over fewer
    than all prompts, its tick saying its n, and the axis label saying why."""
    if not partial:
        return
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    ax.set_xticks(ax.get_xticks(), [f"{t} (n={partial[i]})" if i in partial else t for i, t in enumerate(ticks)])
    for i in partial:
        ax.add_patch(Rectangle((i, 0), 1, n_rows, facecolor="white", alpha=PARTIAL_VEIL, lw=0, zorder=2,
                               label="fewer prompts"))
    ax.set_xlabel(ax.get_xlabel() + f"\nPale columns, with their n, are averaged over fewer than all {n_prompts} prompts.")


STEPS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)  # a thinned position axis labels every k-th place from the end
PAD = 4.0  # pixels between two tick labels at least
RUNS_SAID = 8  # runs of columns of one n named in the x label; more: their range only


def _n_runs(offsets: list[int], partial: dict[int, int]) -> list[str]:
    """['n = 1 at -64 to -60,', '2 at -59 to -36', 'and 7 at -14 to -12']: the partial columns' n (their index in
    `offsets` -> prompts), by runs of adjacent columns of one n, as pieces a line break may fall between (never
    inside a range); over RUNS_SAID runs, the range only."""
    runs: list[list[int]] = []  # [n, first offset, last offset]
    for i in sorted(partial):
        if runs and runs[-1][0] == partial[i] and offsets[i - 1] == runs[-1][2] and i - 1 in partial:
            runs[-1][2] = offsets[i]
        else:
            runs.append([partial[i], offsets[i], offsets[i]])
    if len(runs) > RUNS_SAID:
        counts = sorted(partial.values())
        return [f"n from {counts[0]} to {counts[-1]}", "(each column's n: exact.csv's n_rows)"]
    said = [f"{n} at {a}" if a == b else f"{n} at {a} to {b}" for n, a, b in runs]
    said = [f"{x}," for x in said[:-2]] + ([f"{said[-2]} and"] if len(said) > 1 else []) + [said[-1]]
    return [f"n = {said[0]}", *said[1:]]


def _lines(pieces: list[str], width: int = 90) -> list[str]:
    """The pieces joined by spaces into lines of at most `width` characters (a piece longer stands alone)."""
    lines: list[str] = []
    for piece in pieces:
        if lines and len(lines[-1]) + 1 + len(piece) <= width:
            lines[-1] += " " + piece
        else:
            lines.append(piece)
    return lines


def _legible_positions(ax: Axes, offsets: list[int], plain: list[str], keep: Sequence[int], partial: dict[int, int],
                       n_prompts: int | None, prompt_end: bool = False) -> bool:
    """Review 10a B1: prompts of 7 to 64 tokens gave one tick per place from the end, each pale column's tagged
    "(n=1)", printed over each other. Measured at the figure's layout: where the labels would run together they are
    drawn flat, without n, at every k-th place from the end (STEPS: the smallest k whose labels clear each other), the
    places `keep` names first (the answer position, the cells the finding names, where the prompts differ), each
    kept unless it runs into one named before it (plots.thin_xtick_labels); the pale columns' n goes to the x label
    by runs. Returns whether it thinned them. What it started from is kept on the axes, so that fit_position_ticks
    thins again at the figure's final layout."""
    fig = ax.figure
    if not hasattr(ax, "_position_ticks"):
        ax._position_ticks = (list(ax.get_xticks()), [t.get_text() for t in ax.get_xticklabels()],
                              ax.get_xticklabels()[0].get_rotation() if len(ax.get_xticklabels()) else 0.0,
                              ax.get_xlabel(), (offsets, plain, keep, partial, n_prompts, prompt_end))
    fig.tight_layout()  # the layout the figure is saved with (laid_out): measure the labels there
    drawn(fig)
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_text()]
    if all(a.x1 + PAD <= b.x0 for a, b in zip(boxes, boxes[1:])):
        return False
    plain = [text.removesuffix(" (last)") for text in plain]  # narrow: the x label says -1 is the last position
    ax.set_xticks(ax.get_xticks(), plain, rotation=0)
    drawn(fig)
    widths = [t.get_window_extent(renderer).width for t, o in zip(ax.get_xticklabels(), offsets) if o != -1]
    cell = ax.get_window_extent(renderer).width / max(1, len(offsets))
    step = next((k for k in STEPS if k * cell >= max(widths, default=0.0) + PAD), STEPS[-1])
    index = {o: i for i, o in enumerate(offsets)}
    order = [index[o] for o in keep if o in index] + [i for i in reversed(range(len(offsets))) if offsets[i] % step == 0]
    thin_xtick_labels(ax, PAD, order)
    note = [f"Pale columns are averaged over fewer than all {n_prompts} prompts:", *_n_runs(offsets, partial)] if partial else []
    ax.set_xlabel("\n".join([_position_axis(n_prompts, prompt_end) + LAST[prompt_end], *_lines(note)]))
    return True


def fit_position_ticks(ax: Axes) -> bool:
    """Review 17v C1: the position ticks were thinned at the first layout, then the colour bar's wrapped label
    narrowed the map and "-32-30-28" ran together. At the figure's final layout (after fit_title, fit_axis_labels
    and keep_drawn_size) the ticks and x label are put back as drawn and thinned again (_legible_positions, the
    same rule), then the labels fitted again, until the blanked ticks no longer change. Returns whether it thinned."""
    kept = getattr(ax, "_position_ticks", None)
    if kept is None:
        return False
    ticks, texts, rotation, xlabel, args = kept
    thinned = [False]

    def refit() -> None:
        ax.set_xticks(ticks, texts, rotation=rotation)
        ax.set_xlabel(xlabel)
        thinned[0] = _legible_positions(ax, *args)
        fit_axis_labels(ax)
        keep_drawn_size(ax)

    rethin_until_settled(ax, refit, 3)
    return thinned[0]


NBSP = "\u00a0"


def fit_axis_labels(ax: Axes) -> bool:
    """Review 11c B3: on prompts of mixed lengths the x label's lines ("position from the end (...); -1 is the
    last", the pale columns' n) were wider than the heat map, and the colour bar's label, taller than the map,
    ran into their end. Measured at the figure's layout: each x label line wider than the map is re-wrapped to
    its width (never inside a range "at -64 to -60"), and a colour-bar label longer than its bar is broken before
    the parenthesis that ends it; then the figure is laid out again. Returns whether a label changed."""
    fig, label, changed = ax.figure, ax.xaxis.label, False
    drawn(fig)  # the colour bar's label first: breaking it lays the figure out anew
    renderer = fig.canvas.get_renderer()
    bar = next((c.colorbar for c in ax.collections if getattr(c, "colorbar", None) is not None), None)
    said = "" if bar is None else bar.ax.get_ylabel()
    if "\n" not in said and said.endswith(")") and " (" in said:  # "share of the ... gap (1 = fully restored)"
        text = bar.ax.yaxis.label
        if text.get_window_extent(renderer).height > bar.ax.get_window_extent(renderer).height:
            head, _, tail = said.rpartition(" (")
            bar.ax.set_ylabel(f"{head}\n({tail}")
            fig.tight_layout()
            changed = True
    first = label.get_text().split("\n")  # review 12c B1: the axis sentence, then the pale columns' note, each
    paragraphs = [first[0], " ".join(first[1:])] if len(first) > 1 else first  # wrapped whole every time
    for _ in range(5):  # a new layout narrows the map a little: wrap again until the lines fit it
        drawn(fig)
        renderer = fig.canvas.get_renderer()
        width = ax.get_window_extent(renderer).width

        def wide(line: str, renderer=renderer) -> float:
            return renderer.get_text_width_height_descent(line, label.get_fontproperties(), ismath=False)[0]

        old = label.get_text().split("\n")
        if all(wide(line) <= width for line in old):
            break
        lines = []
        for para in paragraphs:  # the axis, then the pale columns' note
            glued = para
            for word in (" at ", " to ", " = "):  # a range ("at -64 to -60") stays whole
                glued = glued.replace(word, word.replace(" ", NBSP))
            lines += [p.replace(NBSP, " ") for p in wrap_to_width(glued, wide, width, break_on_hyphens=False)]
        ax.set_xlabel("\n".join(lines))
        fig.tight_layout()
        changed = True
    if bar is not None:  # review 12c B1: a longer x label shortens the map and its bar; the bar's label stays on it
        drawn(fig)
        renderer = fig.canvas.get_renderer()
        text, tall = bar.ax.yaxis.label, bar.ax.get_window_extent(renderer).height
        if text.get_window_extent(renderer).height > tall:
            changed = fit_bar_label(bar.ax) or changed
    return changed


def _hatch_unreachable(ax: Axes, rows: pd.DataFrame, index, columns, say: bool = True) -> None:
    """Hatch grey the cells that are 0 by construction, so they do not read as a measured 0, and say why in the
    title: the exact table's `never_read` (review 12b A1: the last layer's writes before the answer position,
    on every decoder; hatched \\\\) and `unreachable` (review 9a B2: cells the sliding windows keep from the
    answer position; hatched //). say False: hatched only, the caption says why (a report's maps, review 16c C4)."""
    said = []
    for column, hatch, why in (("never_read", "\\\\", "a last-layer write before the answer is never read"),
                               ("unreachable", "//", "beyond the sliding windows' reach of the answer")):
        if column not in rows or not rows[column].astype(bool).any():
            continue
        grid = rows.assign(**{column: rows[column].astype(bool)}).pivot_table(
            index=index, columns="pos", values=column, aggfunc="max").reindex(columns=columns)
        hatch_cells(ax, grid.fillna(False).astype(bool).to_numpy(), hatch=hatch, zorder=3)
        said.append(f"hatched {hatch[0]}: {why}")
    if said and say:
        ax.set_title(ax.get_title() + f"\n(0 by construction; {'; '.join(said)})", fontsize="medium")


LAST = {False: "; -1 is the last position.", True: "; -1 is each prompt's last token."}  # the thinned axis's reminder


def _position_axis(n_prompts: int | None, prompt_end: bool = False) -> str:
    """The position axis's label; prompt_end (summary answer_pieces, review 11b C1): positions count from each
    prompt's last token and the answer's teacher-forced pieces are no position."""
    if prompt_end:
        return ("position from the prompt's end (the answer's teacher-forced pieces left out" +
                ("" if n_prompts == 1 else f"; mean over up to {n_prompts or 'the'} prompts: only those that reach it")
                + ")")
    return ("position: token" if n_prompts == 1 else
            f"position from the end (mean over up to {n_prompts or 'the'} prompts: only those that reach it)")


def _heatmap(grid: pd.DataFrame, ax: Axes, title: str, label: str, bound: float | None = None,
             quiet: str | None = None, floor: float = 0.0, notes: bool = True) -> Axes:
    """Diverging heat map centred on 0 with limits -bound..bound (the panel's own max |value| when None),
    its colour bar ticked at fixed fractions of the bound (plots.scale_ticks: panels of one scale, one set
    of ticks, whatever their heights); a panel whose own max is under half the shared bound prints it in
    the title; `quiet` mutes the map and adds its reason to the title. floor (the summary's rounding floor in
    the map's units; reviews 14a C2, 14b C3): non-zero cells within it are dotted grey (their sign is not
    measured), and a panel whose every cell is within it is muted and says ROUNDING ONLY, as the heads map does.
    notes False: the dotted cells' line is left to the caption (caption_for, review 16c C4: a 4-line title over a
    3-row map)."""
    values = grid.to_numpy(dtype=float)  # [rows, columns]
    own = symmetric_bound(values)
    bound = bound or own
    rounding = (abs(values) < floor) & (values != 0) if floor > 0 else None  # [rows, columns]
    only = rounding is not None and bool(rounding.any()) and bool((abs(values[values == values]) < floor).all())
    if only:
        quiet = "\n".join(x for x in (quiet, f"ROUNDING ONLY: muted colours (every cell within the rounding floor "
                                               f"±{floor:.2g}, one rounding step of the metric)") if x)
    scale = color_scale(bound=bound, quiet=bool(quiet), is_signed=True)
    sns.heatmap(grid, ax=ax, **scale, cbar_kws={"label": label, **scale_ticks(bound)}, xticklabels=True, yticklabels=True)
    if rounding is not None and rounding.any():
        hatch_cells(ax, rounding, hatch="..", zorder=2)
        if not only and notes:
            title += f"\n(dotted: within the rounding floor ±{floor:.2g}, sign not measured)"
    if own < 0.5 * bound:
        title += f"\n(this panel's max |value| {own:.2g}; scale shared with every site: ±{bound:.2g})"
    if quiet:
        title += f"\n{quiet}"
    ax.set_title(title, fontsize="medium")
    return ax


def scale(summary: dict) -> tuple[float, str]:
    """(divisor, colour-bar label) that turn a raw effect into the share of the clean-corrupted gap."""
    clean, corrupt = summary.get("clean_metric"), summary.get("corrupted_metric")
    denoise = summary.get("direction", "denoise") == "denoise"
    end = "1 = fully restored" if denoise else "-1 = fully destroyed"
    if summary.get("normalized"):
        return 1.0, f"normalised {summary.get('metric', 'metric')} ({end})"
    if summary.get("gap_within_noise"):  # a share of a gap that is noise is no measurement: the raw effect
        return 1.0, f"raw effect ({summary.get('metric', 'metric')}), gap within noise"
    if isinstance(clean, (int, float)) and isinstance(corrupt, (int, float)) and clean != corrupt:
        return float(clean - corrupt), f"{NORMALISED} ({end})"
    return 1.0, f"effect ({summary.get('metric', 'metric')})"


FLOOR_SPAN = 2.0  # a map's scale spans at least this many rounding floors: one rounding step is never full colour


def gap_noise(summary: Mapping[str, Any]) -> float:
    """Where the clean-corrupted gap is within noise (summary gap_within_noise), how far its 95% interval reaches from
    0 (the larger |end|; |gap| where no interval is recorded), in the metric's units: raw effects within it are not
    told from noise; 0.0 where the gap is measured."""
    info = summary.get("gap_within_noise")
    if not isinstance(info, Mapping):
        return 0.0
    ci = info.get("ci")
    ends = [abs(float(x)) for x in ci if isinstance(x, (int, float))] if isinstance(ci, (list, tuple)) else []
    gap = info.get("gap")
    return max(ends) if ends else abs(float(gap)) if isinstance(gap, (int, float)) else 0.0


def _normalised(df: pd.DataFrame, divisor: float, columns: tuple[str, ...] = ("effect",)) -> pd.DataFrame:
    return df.assign(**{c: df[c] / divisor for c in columns if c in df}) if divisor != 1.0 else df


def _offsets(positions, n_positions: int | None) -> list[int]:
    """Each padded position's place from the end (-1 the last), as position_labels counts it."""
    end = int(n_positions) if n_positions else int(max(positions)) + 1
    return [int(p) - end for p in positions]


DIFFER_SAID = 6  # places where clean and corrupted differ named in a map's title; more: counted


def _say_differ(ax: Axes, differ: Sequence[int], positions, n_positions: int | None) -> None:
    """Review 14b C5: the position axis is numeric, so a reader could not see that -4 was the swapped word. The
    title names the map's places from the end where clean and corrupted prompts differ (summary differ_from_end)."""
    shown = set(_offsets(positions, n_positions)) if len(positions) else set()
    places = [int(o) for o in differ if int(o) in shown]
    if not places:
        return
    said = ", ".join(str(o) for o in places[:DIFFER_SAID]) + (f" and {len(places) - DIFFER_SAID} more"
                                                            if len(places) > DIFFER_SAID else "")
    ax.set_title(ax.get_title() + f"\n(clean and corrupted prompts differ at {said} from the end)", fontsize="medium")


def plot_layer_pos(data: pd.DataFrame, *, site_type: str = "resid_pre", column: str = "effect",
                   n_prompts: int | None = None, n_positions: int | None = None, label: str | None = None,
                   bound: float | None = None, quiet: str | None = None, keep: Sequence[int] = (),
                   prompt_end: bool = False, floor: float = 0.0, differ: Sequence[int] = (), notes: bool = True,
                   ax: Axes | None = None) -> Axes:
    """Layer x position heatmap of one (layer, pos) site type (`data`: the exact table); positions
    labelled by position_labels, thinned where they would run together (_legible_positions, keeping the answer
    position and the places from the end in `keep` labelled first); `differ`: the places from the end where clean
    and corrupted prompts differ, named in the title (_say_differ). notes False (a report's maps): the title is the
    map's name alone, and the dotted cells, the hatches and `differ` are said in the caption (caption_for)."""
    ax = axes(ax)
    rows = data[data["site_type"] == site_type]
    grid = rows.pivot_table(index="layer", columns="pos", values=column, aggfunc="mean")
    partial = _partial_columns(rows, grid.columns, n_prompts)
    positions = grid.columns
    plain = position_labels(rows, grid.columns, n_prompts, n_positions)
    grid.columns = plain
    _heatmap(grid, ax, f"patching {site_type}, by layer and position", label or column, bound, quiet, floor, notes)
    _hatch_unreachable(ax, rows, "layer", positions, notes)
    _say_differ(ax, differ if notes else (), positions, n_positions)
    ax.set_xlabel(_position_axis(n_prompts, prompt_end))
    ax.set_ylabel("layer")
    _mute_partial(ax, partial, grid.shape[0], n_prompts)
    _legible_positions(ax, _offsets(positions, n_positions), plain, [-1, *keep], partial, n_prompts, prompt_end)
    return ax


def plot_layer_head(data: pd.DataFrame, *, site_type: str = "head_out", column: str = "effect",
                    label: str | None = None, bound: float | None = None, quiet: str | None = None,
                    floor: float = 0.0, notes: bool = True, ax: Axes | None = None) -> Axes:
    """Layer x head heatmap of one (layer, head) site type (`data`: the exact table); k and v are per KV head; notes
    as plot_layer_pos."""
    ax = axes(ax)
    rows = data[(data["site_type"] == site_type) & data["pos"].isna()]
    grid = rows.pivot_table(index="layer", columns="head", values=column, aggfunc="mean")
    grid.columns = [int(h) for h in grid.columns]  # a head index, even after a float round trip through CSV
    unit = "KV head" if site_type in KV_SITES else "head"
    _heatmap(grid, ax, f"patching {site_type}, by layer and {unit}", label or column, bound, quiet, floor, notes)
    ax.set_xlabel(unit)
    ax.set_ylabel("layer")
    return ax


def plot_head_pos(data: pd.DataFrame, *, site_type: str = "head_out_by_pos", column: str = "effect",
                  n_prompts: int | None = None, n_positions: int | None = None, label: str | None = None,
                  bound: float | None = None, quiet: str | None = None, keep: Sequence[int] = (),
                  prompt_end: bool = False, floor: float = 0.0, differ: Sequence[int] = (), notes: bool = True,
                  ax: Axes | None = None) -> Axes:
    """(layer, head) x position heatmap of per-position head patching (`data`: the exact table); positions thinned
    and `differ` named (`notes`) as in plot_layer_pos."""
    ax = axes(ax)
    rows = data[data["site_type"] == site_type]
    grid = rows.pivot_table(index=["layer", "head"], columns="pos", values=column, aggfunc="mean")
    partial = _partial_columns(rows, grid.columns, n_prompts)
    positions = grid.columns
    plain = position_labels(rows, grid.columns, n_prompts, n_positions)
    grid.columns = plain
    grid.index = [f"L{int(layer)}H{int(head)}" for layer, head in grid.index]
    _heatmap(grid, ax, f"patching {site_type}: every head by position", label or column, bound, quiet, floor, notes)
    _hatch_unreachable(ax, rows, ["layer", "head"], positions, notes)
    _say_differ(ax, differ if notes else (), positions, n_positions)
    ax.tick_params(axis="y", labelsize=max(4, min(9, 300 / max(1, len(grid)))))
    ax.set_xlabel(_position_axis(n_prompts, prompt_end))
    ax.set_ylabel("head (L layer H head)")
    _mute_partial(ax, partial, grid.shape[0], n_prompts)
    _legible_positions(ax, _offsets(positions, n_positions), plain, [-1, *keep], partial, n_prompts, prompt_end)
    return ax


def site_slopes(df: pd.DataFrame, floor: float = 0.0) -> dict[str, dict]:
    """Least-squares slope of the attribution estimate on the exact effect per site type (1 = same scale),
    with its 95% t interval over the cells: the summary's slope_with_interval, {site: {"slope", "slope_ci",
    "slope_n", "n_nonzero"}} for the site types whose exact effects vary. slope_ci is None where the finding
    states none either (attribution_patching.interval_stated: too few non-zero exact effects). floor: the
    effects' rounding in the model's dtype, in df's units (the summary's rounding_floor): as the finding counts."""
    out = {}
    for name, group in df.groupby("site_type", sort=False):
        effect = group["effect"].to_numpy(dtype=float)
        fit = slope_with_interval(effect, group["attribution"].to_numpy(dtype=float))
        nonzero = nonzero_count(effect, floor)
        if fit["slope"] is not None:
            if not interval_stated(len(group), nonzero):
                fit = {**fit, "slope_ci": None}
            out[str(name)] = {**fit, "n_nonzero": nonzero, "floor": floor}
    return out


def _slope_label(site: str, fit: Mapping[str, Any] | None) -> str:
    """The legend's entry of a site type: its slope with the interval, or why none; review 14b B6: where the rounding
    floor keeps every cell from counting, no slope (it would fit rounding) and the floor named."""
    if fit is None:
        return site
    ci, n, nonzero, floor = fit.get("slope_ci"), fit.get("slope_n"), fit.get("n_nonzero"), fit.get("floor") or 0.0
    if ci:
        return f"{site} (slope {fit['slope']:.2f}, 95% CI {ci[0]:.2f} to {ci[1]:.2f})"
    if floor and nonzero == 0:
        return f"{site} (no slope: none of {n} cells above the rounding floor {floor:.2g})"
    counted = f"above the rounding floor {floor:.2g}" if floor else "non-zero"
    why = f"; no interval: {nonzero} of {n} cells {counted}" if nonzero is not None and n and nonzero < n else ""
    return f"{site} (slope {fit['slope']:.2f}{why})"


def plot_attribution_vs_exact(data: pd.DataFrame, *, label: str = "exact patching effect", floor: float = 0.0,
                              negligible: float | None = None, ax: Axes | None = None) -> Axes:
    """Attribution-patching estimate against the exact effect (`data`: the exact table with its
    attribution column), one point per cell, by site type; the identity line, and each site type's
    fitted slope with its 95% interval over the cells in the legend (a high correlation can hide a 2x error);
    floor: site_slopes' (cells within it count as zero); negligible: where data is in shares of the gap,
    NEGLIGIBLE: a site type whose every |exact effect| is below it gets no slope (review 12b B2: slopes of rounding)."""
    ax = axes(ax)
    slopes = site_slopes(data, floor)
    if negligible is not None:
        peaks = data.assign(size=data["effect"].abs()).groupby("site_type")["size"].max()
        quiet = {str(k) for k, v in peaks.items() if v < negligible}
        slopes = {k: v for k, v in slopes.items() if k not in quiet}
    else:
        quiet = set()
    named = data.assign(site=[f"{t} (exact effects all below {negligible:g} of the gap: no slope)" if str(t) in quiet
                              else _slope_label(str(t), slopes.get(str(t))) for t in data["site_type"]])
    sns.scatterplot(data=named, x="effect", y="attribution", hue="site", ax=ax, s=20, alpha=0.7)
    lo = float(min(data["effect"].min(), data["attribution"].min()))
    hi = float(max(data["effect"].max(), data["attribution"].max()))
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8, linestyle="--", label="y = x (exact)")
    ax.set_xlabel(f"exact: {label}")
    ax.set_ylabel("attribution-patching estimate (same units)")
    ax.set_title("attribution vs exact patching")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="x-small", title="site type")
    return ax


def plot_causal_trace(data: pd.DataFrame, *, kind: str = "mlp", metric: str = "task metric",
                      roles: pd.DataFrame | None = None, n_prompts: int | None = 1, bound: float | None = None,
                      ax: Axes | None = None) -> Axes:
    """Meng et al.'s figure (`data`: the causal_tracing table): average indirect effect per (token,
    layer) for one restored kind, on a diverging scale centred on 0 (an effect can be negative) shared
    across kinds via `bound`. With `roles` (the per-role table, averaged over every prompt's positions
    of that role) the rows are the token roles, which mean the same in every prompt; otherwise the
    positions, labelled by position_labels (one prompt's tokens only when `n_prompts` is 1)."""
    ax = axes(ax)
    if roles is not None and len(roles):
        rows = roles[roles["kind"] == kind]
        grid = rows.pivot_table(index="role", columns="layer", values="ie", aggfunc="mean", sort=False)
        ylabel = "token role (mean over every prompt)"
    else:
        rows = data[(data["kind"] == kind) & data["pos"].notna()]
        grid = rows.pivot_table(index="pos", columns="layer", values="ie", aggfunc="mean")
        grid.index = position_labels(rows, grid.index, n_prompts)
        ylabel = _position_axis(n_prompts)
    bound = bound or symmetric_bound(grid.to_numpy(dtype=float))
    sns.heatmap(grid, ax=ax, **color_scale(bound=bound, is_signed=True),
                cbar_kws={"label": f"average indirect effect ({metric})", **scale_ticks(bound)}, yticklabels=True)
    ax.set_title(f"causal tracing: restoring {kind}")
    ax.set_xlabel("layer")
    ax.set_ylabel(ylabel)
    return ax


def plot_path_patching(data: pd.DataFrame, *, label: str = "effect", bound: float | None = None,
                       quiet: str | None = None, floor: float = 0.0, ax: Axes | None = None) -> Axes:
    """Sender layer x sender head effect of path patching (`data`: the path_patching table; receivers
    jointly, or averaged), on the exact maps' shared scale when `bound` is given."""
    ax = axes(ax)
    grid = data.pivot_table(index="sender_layer", columns="sender_head", values="effect", aggfunc="mean")
    grid.columns = [int(h) for h in grid.columns]
    receiver = ", ".join(sorted(set(data["receiver"])))[:40]
    n = int(data["n_rows"].max()) if "n_rows" in data and data["n_rows"].notna().any() else None  # review 12c B3
    _heatmap(grid, ax, f"path patching: sender head -> {receiver}" + (f", n = {n} prompts" if n else ""),
             label, bound, quiet, floor)
    ax.set_xlabel("sender head")
    ax.set_ylabel("sender layer")
    return ax


def figures(result, **kwargs) -> dict[str, Figure]:
    """Every figure the result's tables allow, by file stem."""
    out: dict[str, Figure] = {}
    tables, summary = dict(result.tables), dict(result.summary)
    divisor, label = scale(summary)
    quiet = quiet_reason(summary)
    where = {"n_prompts": summary.get("n_examples"), "n_positions": summary.get("n_positions"),
             "prompt_end": bool(summary.get("answer_pieces"))}  # review 11b C1: -1 is each prompt's last token
    exact = tables.get("exact")
    if exact is not None:
        exact = _normalised(exact, divisor, ("effect", "attribution"))
    paths = tables.get("path_patching")
    if paths is not None:
        paths = _normalised(paths, divisor)
    # one scale for every site's map and the path-patching map, never narrower than the rounding floor or, where the
    # gap is within noise, than that noise (reviews 14a C2, 14b C3: 0.0029 drawn dark red under a gap CI of ±0.0068)
    rounding = (summary.get("rounding_floor") or {}).get("floor")
    floor = abs(float(rounding) / divisor) if isinstance(rounding, (int, float)) else 0.0  # the table's units
    noise = gap_noise(summary) / abs(divisor)
    shared = max(symmetric_bound(*(t["effect"].to_numpy(dtype=float) for t in (exact, paths) if t is not None)),
                 FLOOR_SPAN * floor, noise)
    if noise and not quiet:
        quiet = f"GAP WITHIN NOISE: muted colours (its 95% CI reaches ±{noise:.2g}; the scale is no narrower)"

    def new(stem: str, draw, size: tuple[float, float] = (7, 4)) -> None:
        ax = draw(axes(None, (size[0], size[1] + 0.3 * bool(quiet))))
        out[stem] = laid_out(ax)
        fit_title(ax)  # a title wider than its map runs under the colour bar's label (review 9b B3)
        fit_axis_labels(ax)  # an x label wider than its map runs into the colour bar's label (review 11c B3)
        keep_drawn_size(ax)  # long titles and labels never crush the map (review 14bv C1)
        fit_position_ticks(ax)  # thinned again at the final size (review 17v C1)

    if exact is not None:
        present = set(exact["site_type"])
        common = {"label": label, "bound": shared, "quiet": quiet, "floor": floor, "notes": False}  # notes: caption_for
        cited, differ = cited_cells(summary), list(differ_offsets(summary))

        def keep(st: str) -> list[int]:  # the places the finding names keep their ticks (review 10a B1)
            return [c["from_end"] for k, c in cited if k == st and isinstance(c.get("from_end"), int)] + differ

        for st in BY_POS:
            if st in present:
                new(f"exact_{st}", lambda ax, st=st: plot_layer_pos(exact, site_type=st, ax=ax, keep=keep(st), **where,
                                                                    differ=differ, **common))
        for st in BY_HEAD:
            if st in present:
                new(f"exact_{st}", lambda ax, st=st: plot_layer_head(exact, site_type=st, ax=ax, **common))
        if "head_out_by_pos" in present:
            n_rows = exact.loc[exact["site_type"] == "head_out_by_pos", ["layer", "head"]].drop_duplicates().shape[0]
            new("exact_head_out_by_pos", lambda ax: plot_head_pos(exact, ax=ax, keep=keep("head_out_by_pos"), **where,
                                                                  differ=differ, **common),
                (7, max(4.0, 0.16 * n_rows + 1.5)))
        if "attribution" in exact:
            shares = bool(summary.get("normalized")) or (divisor != 1.0 and not summary.get("gap_within_noise"))
            new("attribution_vs_exact", lambda ax: plot_attribution_vs_exact(
                exact, ax=ax, label=label, floor=floor, negligible=NEGLIGIBLE if shares else None), (8, 4.5))
    trace = tables.get("causal_tracing")
    if trace is not None:
        info = summary.get("causal_tracing", {})
        metric = info.get("metric", "task metric")
        roles = tables.get("causal_tracing_roles") if info.get("n_examples", 1) > 1 else None
        shown = trace if roles is None else roles
        ct_bound = symmetric_bound(shown.loc[shown["kind"].isin(set(trace["kind"])), "ie"].to_numpy(dtype=float))
        for kind in dict.fromkeys(trace["kind"]):
            new(f"causal_tracing_{kind}", lambda ax, kind=kind: plot_causal_trace(
                trace, kind=kind, ax=ax, metric=metric, roles=roles, n_prompts=info.get("n_examples"), bound=ct_bound))
    if paths is not None:
        new("path_patching", lambda ax: plot_path_patching(paths, ax=ax, label=label, bound=shared, quiet=quiet,
                                                           floor=floor))
    return out


# Presentation (reports/families.py): the guide, the captions and the finding in words.

TRACING = "Causal tracing restores states after noising the subject; "
GUIDE = (  # how to read this section of the report
    "Where the computation happens. Each cell replaces one activation of the corrupted run by the "
    "clean run's (denoising) and shows how much of the clean behaviour returns (the normalised metric: "
    "the share of the clean-corrupted gap in the task's metric, e.g. logit difference; 1 = fully restored). "
    + TRACING +
    "attribution patching approximates every cell from one backward pass (its agreement with exact "
    "patching is reported)."
)
def guide_for(summary: Mapping[str, Any]) -> str:
    """The guide for this run: where causal tracing did not run, it says so and why (summary causal_tracing.not_run;
    an older summary without any causal_tracing record: not run) instead of describing it (review 17a A2)."""
    trace = summary.get("causal_tracing")
    if isinstance(trace, Mapping) and "not_run" not in trace:
        return GUIDE
    why = trace.get("not_run") if isinstance(trace, Mapping) else None
    return GUIDE.replace(TRACING, "Causal tracing (restoring states after noising the subject) was not run"
                         + (f": {why}; " if why else "; "), 1)


CAPTIONS = {  # what to read from each figure and its units, by figure stem
    "attribution_vs_exact": "Attribution-patching estimate (y) against the exact patching effect (x), both as shares "
                            "of the clean-corrupted gap in the task's metric; the dashed line is y = x and each site type's "
                            "least-squares slope, with "
                            "its 95% interval over the cells, is in the legend (slope 0.5 = a 2x underestimate); a site "
                            "type whose exact effects are mostly zero gets no interval there, as in the finding.",
    "path_patching": "Path-patching effect (share of the clean-corrupted gap in the task's metric) of each sender head "
                     "on the receivers, layer x "
                     "head; red positive, blue negative, centred on 0.",
}
PREFIX_CAPTIONS = {  # figures named <prefix><site>: the caption then 'Site: <site>.'
    "exact_": "Exact activation patching: the task's metric after patching each cell as a share of the "
              "clean-corrupted gap (1 = clean behaviour fully restored, 0 = corrupted); red positive, blue negative, "
              "one scale shared by every site's map (a site whose "
              "own maximum is much smaller prints it in its title). Positions count from the end; a column that only the "
              "longer prompts reach is pale and its tick gives its n (where the ticks would run together, only every "
              "k-th place, the answer position and the places the finding names are labelled, and the x label gives "
              "the pale columns' n). A grey cell hatched \\ is a write of the last layer before the answer "
              "position: no attention follows it, so on any decoder its 0 is by construction, not a finding. On a "
              "sliding-window model a grey cell hatched / lies more than the windows' reach (the sum of window - 1 over "
              "the layers from it to the end) before the answer position: it cannot reach the answer, so its 0 is by "
              "construction too. A grey dotted cell is non-zero but within the run's rounding floor (one rounding step "
              "of the metric): its sign is not measured. The scale is never narrower than two rounding floors nor, where "
              "the clean-corrupted gap is within noise, than its interval; such maps are muted and say so. ",
    "causal_tracing_": "Causal tracing: average indirect effect (task metric units) of restoring each state after noising "
                       "the subject, by token role (several prompts: Meng et al.'s groups, averaged over every prompt) or "
                       "position (one prompt) x layer; red positive, blue negative, one scale for every restored kind. ",
}


SHARE_WORDS = {  # each caption's words for a share of the gap, as CAPTIONS / PREFIX_CAPTIONS say them
    "exact_": "the task's metric after patching each cell as a share of the clean-corrupted gap (1 = clean behaviour "
              "fully restored, 0 = corrupted)",
    "path_patching": "(share of the clean-corrupted gap in the task's metric)",
    "attribution_vs_exact": "both as shares of the clean-corrupted gap in the task's metric",
}


def _run_notes(stem: str, summary: Mapping[str, Any]) -> str:
    """What a report's exact map leaves out of its title (review 16c C4: 4 title lines over a 3-row map), for its
    caption: this run's rounding floor in the map's units (the dotted cells') and, on a map by position, the places
    from the end where clean and corrupted prompts differ ("" where neither applies)."""
    said = ""
    rounding = (summary.get("rounding_floor") or {}).get("floor")
    if isinstance(rounding, (int, float)) and rounding:
        said += f" This run's rounding floor: ±{abs(float(rounding) / scale(summary)[0]):.2g} in the map's units."
    if stem[len("exact_"):] in (*BY_POS, "head_out_by_pos"):
        places = [int(o) for o in differ_offsets(summary)]
        if places:
            more = f" and {len(places) - DIFFER_SAID} more" if len(places) > DIFFER_SAID else ""
            said += (f" Clean and corrupted prompts differ at {', '.join(map(str, places[:DIFFER_SAID]))}{more} "
                     "from the end.")
    return said + _aligned_note(summary)


def _aligned_note(summary: Mapping[str, Any]) -> str:
    """Review 19e C1: where the corrupted token sits at different places from the end, the finding's values at each
    prompt's corrupted token (at_corrupted_token, up to 1.00 at resid_pre) are no cell of the end-aligned maps, whose
    shared scale (+-0.53) they may exceed: the caption says so, with the largest in the map's units ("" otherwise)."""
    info = summary.get("at_corrupted_token")
    if not isinstance(info, Mapping) or len(info.get("from_end") or {}) < 2 or not isinstance(info.get("sites"), Mapping):
        return ""
    sizes = [abs(float(r["effect"])) for rows in info["sites"].values() if isinstance(rows, list) for r in rows
             if isinstance(r, Mapping) and isinstance(r.get("effect"), (int, float)) and math.isfinite(r["effect"])]
    if not sizes:
        return ""
    return (f" The finding's effects at each prompt's corrupted token (up to {max(sizes) / abs(scale(summary)[0]):.2f} in the "
            "map's units) are aligned on that token, which sits at different places from the end, so they are not "
            "cells of these end-aligned maps and may exceed their scale.")


def caption_for(stem: str, summary: Mapping[str, Any] | None) -> str | None:
    """Review 14bv C3: where the maps draw raw effects (scale: a gap within noise, or none recorded) the captions
    say so, in the metric's words, instead of "a share of the clean-corrupted gap"; an exact map's caption ends with
    what its title leaves out (_run_notes); None where neither applies."""
    if not isinstance(summary, Mapping):
        return None
    notes = _run_notes(stem, summary) if stem.startswith("exact_") else ""
    after = (summary.get("qkv_sites") or {}).get(stem[len("exact_"):]) if stem.startswith("exact_") else None
    if isinstance(after, str):  # review 18c C2: OLMoE's q/k norm over all heads and clip_qkv come before the site
        notes += (f" The {stem[len('exact_'):]} site holds each head's tensor {after}, so a cell patches that head "
                  "alone.")
    if summary.get("normalized") or scale(summary)[0] != 1.0:
        kind = stem[len("exact_"):].replace("_", " ")
        return PREFIX_CAPTIONS["exact_"] + f"Site: {kind}." + notes if notes else None
    from headscope.reports.findings import _words

    metric = _words(summary.get("metric", "metric"))
    why = ("the clean-corrupted gap is within noise, so a share of it would measure nothing"
           if summary.get("gap_within_noise") else "no clean-corrupted gap is recorded to divide by")
    raw = {"exact_": f"the change in the {metric} when each cell is patched (the raw effect in the metric's units, "
                     f"not a share of the clean-corrupted gap: {why})",
           "path_patching": f"(the raw change in the {metric}, not a share of the clean-corrupted gap: {why})",
           "attribution_vs_exact": f"both as raw changes in the {metric} (not shares of the clean-corrupted gap: {why})"}
    if stem.startswith("exact_"):
        kind = stem[len("exact_"):].replace("_", " ")
        return PREFIX_CAPTIONS["exact_"].replace(SHARE_WORDS["exact_"], raw["exact_"]) + f"Site: {kind}." + notes
    if stem in SHARE_WORDS:
        return CAPTIONS[stem].replace(SHARE_WORDS[stem], raw[stem])
    return None
