"""Figures of the kv analysis: metric against cache budget, K/V norms by position, sink mass.

reports/plots.py's convention: `plot_<what>(data, *, ax=None, ...) -> Axes` over the Result's tidy tables.

The eviction band is a t interval over the prompts a budget evicts from (the finding's), so equal Results give
byte-identical PNGs.

This module is the family's whole presentation (reports/families.py): after the figures, `GUIDE`
(how to read its section), `CAPTIONS` (each figure's, by stem) and `finding(summary)`, its headline,
whose words live in reports/kv_words.py.
"""
from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import seaborn as sns
from matplotlib.ticker import NullLocator

from headscope.analyses.kv.analysis import sink_shares
from headscope.reports.findings import int_ranges, int_span
from headscope.reports.kv_cache_words import _span2
from headscope.reports.kv_words import finding as finding  # the headline: families.py reads it here
from headscope.reports.plots import (
    LAYERS,
    axes,
    blank_xticks,
    drawn,
    fit_labels,
    fit_title,
    keep_drawn_size,
    laid_out,
    quiet_reason,
    rethin_until_settled,
    thin_xtick_labels,
    wrap_to_width,
)

UNITS = {"logit_diff": "logit difference (logits)", "logprob": "answer log-probability (nats)",
         "accuracy": "accuracy (0-1)"}


def policy_label(policy: str, recent_share: float | None = None) -> str:
    """A policy's legend name; heavy hitters with its split (review 13a A1: H2O keeps a recent window beside them)."""
    name = str(policy).replace("_", " ")
    if policy != "heavy_hitters" or recent_share is None:
        return name
    if recent_share == 0:
        return f"{name} (no recent window)"
    return f"{name} (H2O: newest {100 * recent_share:.0f}%\n+ most attended rest)"


def coincident(series: Mapping[str, pd.Series], step: float) -> dict[str, list[str]]:
    """{policy: the later-drawn policies it lies under}: a policy each of whose points (budget -> change, in the
    metric's units) has a later-drawn policy's point at the same budget within `step` (one rounding step of the
    metric) is hidden under them (review 15a C5: heavy hitters within one bfloat16 step of the window or the sink
    window at every budget, its circles under their markers) - the pruning figure's rule (plots_heads._hidden_labels,
    review 12b B4), point by point."""
    names, out = list(series), {}
    for i, name in enumerate(names):
        covers = []
        for budget, value in series[name].items():
            over = next((b for b in names[i + 1:] if budget in series[b].index
                         and abs(float(series[b][budget]) - float(value)) <= step), None)
            if over is None:
                break
            covers += [over] if over not in covers else []
        else:
            if len(series[name]):
                out[name] = covers
    return out


CLIP_N = 3  # an interval over fewer prompts (t's 95% quantile is 12.7 for 2) never sets the eviction figure's y range
CUT_LISTED = 4  # the legend lists at most this many cut intervals
ZOOM_SHARE = 0.05  # the band thinner than this share of the y range: a second panel zoomed on it (reviews 17a/17b C)
ZOOM_BANDS = (5.0, 10.0)  # the zoom's half-height in band widths: at least the first, at most the second


def _main_limits(groups: Sequence[tuple[Any, pd.DataFrame]], band: float) -> tuple[float, float] | None:
    """The eviction panel's y range (units): every mean, 0, the band and the 95% intervals over CLIP_N prompts or more
    (review 17a C2: one sink-window interval over 2 prompts, [-26.2, +22.9], set a +-25 range and the band, +-0.037, was
    a pixel high); None (matplotlib's own) where no interval rests on CLIP_N prompts."""
    rows = pd.concat([g for _, g in groups]) if groups else pd.DataFrame()
    if not len(rows) or not (rows.n_evicting >= CLIP_N).any():
        return None
    wide = rows[rows.n_evicting >= CLIP_N]
    values = [0.0, band, -band, *(rows.change * rows.scale).dropna(), *(wide.ci_low * wide.scale).dropna(),
              *(wide.ci_high * wide.scale).dropna()]
    lo, hi = min(values), max(values)
    pad = 0.08 * (hi - lo or 1.0)
    return lo - pad, hi + pad


def _cut_intervals(ax, groups, colours, limits: tuple[float, float]) -> list[str]:
    """A triangle at the axis where an interval (over fewer than CLIP_N prompts) runs past `limits`, in its policy's
    colour; returns each cut interval in words for the legend: 'sink window at 32: [-26.2, +22.9] (n = 2)'."""
    from headscope.reports.kv_numbers import _span_units

    cut = []
    for colour, (policy, g) in zip(colours, groups):
        for r in g.itertuples():
            lo, hi = r.ci_low * r.scale, r.ci_high * r.scale
            if not (lo < limits[0] or hi > limits[1]):
                continue
            for end, y, mark in ((lo, limits[0], "v"), (hi, limits[1], "^")):
                if (end < y) if mark == "v" else (end > y):
                    ax.plot([r.budget], [y], marker=mark, color=colour, ms=8, ls="none", clip_on=False, zorder=4)
            cut.append(f"{policy_label(str(policy))} at {r.budget}: [{_span_units(lo, hi).replace(' to ', ', ')}] "
                       f"(n = {r.n_evicting})")
    if len(cut) > CUT_LISTED:  # the rest in the finding, which states every budget's interval
        cut = cut[:CUT_LISTED - 1] + [f"and {len(cut) - CUT_LISTED + 1} more (the finding gives them)"]
    return cut


def _zoom_panel(zoom, groups, colours, styles, band: pd.Series, *, what: str, unit: str) -> None:
    """The second panel (review 17b C1): the same points and intervals on a y range of a few band widths about 0, so the
    band (1% of each budget's scale) is readable; its half-height ZOOM_BANDS[0] band widths, or enough for each
    policy's closest mean over 2 prompts or more, at most ZOOM_BANDS[1]. Points beyond it leave the panel (the caption
    says so)."""
    width = float(band.max())
    closest = [float((g.change * g.scale)[g.n_evicting >= 2].abs().min()) for _, g in groups if (g.n_evicting >= 2).any()]
    half = max(ZOOM_BANDS[0] * width, min(1.25 * max(closest, default=0.0), ZOOM_BANDS[1] * width))
    for colour, marker, style, (_, g) in zip(colours, "osD^v", styles, groups):
        zoom.plot(g.budget, g.change * g.scale, color=colour, marker=marker, lw=1.5, **style)
        zoom.fill_between(g.budget, g.ci_low * g.scale, g.ci_high * g.scale, color=colour, alpha=0.2, lw=0)
    zoom.axhline(0, color="grey", ls="--", lw=1)
    zoom.fill_between(band.index, -band.to_numpy(), band.to_numpy(), color="grey", alpha=0.3, lw=0)
    zoom.set_ylim(-half, half)
    units = unit[unit.rfind("(") + 1:-1] if unit.endswith(")") else unit  # "logits" of "logit difference (logits)"
    zoom.set_ylabel(f"policy - full cache,\nzoomed ({units})")
    zoom.set_title(f"zoomed on the grey band (1% of {what}, at most {width:.2g} {units})", fontsize="small")


def plot_eviction(data: pd.DataFrame, *, metric: str | None = None, ax=None, recent_share: float | None = None,
                  chance: float | None = None, quiet: str | None = None, step: float = 0.0, cap: int | None = None):
    """What the kv finding measures (review 10a B3): per policy and budget, the change of the prompts that budget
    evicts from against those same prompts' own full cache, mean(policy - full) in the metric's own units with its 95%
    t interval (analyses/kv/holding.budget_changes, the finding's numbers times their scale), on the sweep `data` (the
    Result's df); 0 is the full cache, the grey band the finding's 1% of each budget's scale (|full|, or on a
    log-probability with `chance` the span from chance: holding.change_scale). Review 14a C1: a percentage of a
    full-cache mean that is 0 within noise ran to +-20,000%; units stay finite. quiet (plots.quiet_reason: the model
    at chance): a title line and muted colours. A budget that evicts from no prompt has no point (it
    equals the full cache by construction): averaging kept-whole prompts in, as a mean over all prompts does,
    would halve a loss evicted from half the prompts. A policy within `step` (one rounding step of the metric,
    metrics.noise_floor) of a later-drawn one at every budget (`coincident`) is drawn over it, dashed with open
    markers, its legend entry saying it equals that one within rounding. Under each budget's tick: n, the prompts it evicts from,
    of all; a tick whose label would run into its neighbour's (close budgets on the log axis) is left unlabelled
    and the x label lists it with its count (plots.thin_xtick_labels). cap: the most positions a layer's cache holds
    where every layer slides (window - 1, review 17c C2): the dotted line, the budget that saves nothing, is there
    instead of at the longest context.
    Reviews 17a C2 / 17b C1: the y range is set by the means and the intervals over CLIP_N prompts or more; a wider
    interval over fewer is cut at the axis, a triangle there, the legend giving its ends; on a figure of its own (ax
    None) where the band is still thinner than ZOOM_SHARE of the range, a second panel below (`ax._zoom`) shows it
    zoomed, and carries the budget ticks."""
    from headscope.analyses.kv.holding import TOLERANCE as BAND
    from headscope.analyses.kv.holding import budget_changes

    new_figure = ax is None
    ax, df = axes(ax, (8.5, 4)), data
    full_rows = df[df.policy == "full"]
    whole = full_rows.budget.max()  # a budget this large keeps everything: it saves nothing
    if "context" not in df and not {"kept", "cached"} <= set(df):
        df = df.assign(context=whole)  # no lengths: every prompt as long as the full cache's budget
    table = budget_changes(df, chance=chance) if len(df[df.policy != "full"]) else pd.DataFrame()
    colours = sns.color_palette(n_colors=max(1, table.policy.nunique() if len(table) else 1))
    if quiet:
        colours = [sns.desaturate(c, 0.3) for c in colours]  # plots.quiet_reason: muted at chance
    groups = [(p, g[g.n_evicting > 0].sort_values("budget")) for p, g in table.groupby("policy", sort=False)] \
        if len(table) else []
    under = coincident({str(p): pd.Series((g.change * g.scale).to_numpy(), index=g.budget.to_numpy()) for p, g in groups},
                       step)
    styles = []
    for colour, marker, (policy, g) in zip(colours, "osD^v", groups):
        label, style = policy_label(str(policy), recent_share), {}
        if str(policy) in under:  # would lie hidden under a later line: drawn over it, dashed, open markers
            over = " or ".join(policy_label(o) for o in under[str(policy)])
            label += f"\n(drawn dashed: within one rounding\nstep, {step:.2g}, of {over}\nat every budget)"
            style = dict(ls="--", mfc="none", ms=9, mew=1.5, zorder=3)
        styles.append(style)
        ax.plot(g.budget, g.change * g.scale, color=colour, marker=marker, lw=1.5,  # mean(policy - full), units
                label=label, alpha=0.6 if quiet else 1.0, **style)
        ax.fill_between(g.budget, g.ci_low * g.scale, g.ci_high * g.scale, color=colour, alpha=0.2, lw=0)
    ax.axhline(0, color="grey", ls="--", lw=1, label="full cache (the same prompts)")
    band, what = pd.Series(dtype=float), "the span from chance" if chance is not None else "|full-cache mean|"
    if len(table) and "scale" in table:
        band = table[table.n_evicting > 0].groupby("budget").scale.max().sort_index() * BAND  # [budget] in units
        ax.fill_between(band.index, -band.to_numpy(), band.to_numpy(), color="grey", alpha=0.15, lw=0,
                        label=f"within {100 * BAND:.0f}% of {what}")
    if cap is not None and (pd.isna(whole) or cap < whole):
        ax.axvline(cap, color="grey", ls=":", lw=1, label=f"the cache's cap ({int(cap)}:\nsliding window - 1)")
    elif pd.notna(whole):
        ax.axvline(whole, color="grey", ls=":", lw=1, label=f"longest context ({int(whole)})")
    limits = _main_limits(groups, float(band.max()) if len(band) else 0.0) if groups and "scale" in table else None
    if limits is not None:
        ax.set_ylim(*limits)
        cut = _cut_intervals(ax, groups, colours, limits)
        if cut:  # review 17a C2: said where it is cut, with its ends
            ax.plot([], [], marker="^", color="black", ls="none",
                    label="interval cut at the axis\n(fewer than 3 prompts):\n" + "\n".join(cut))
    ax.set_xscale("log", base=2)
    xlabel = "cache budget (positions per layer)"  # review 16dv C2: short; log2 and the units in the caption
    unit = UNITS.get(str(metric), "task metric")
    title = "Eviction what-if over the prompts\neach budget evicts from"  # band: 95% t interval (the caption)
    ax.set(xlabel=xlabel, ylabel=f"policy - full cache,\n{unit}",
           title=title + (f"\n{quiet}" if quiet else ""))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small", title="policy")
    ticked = ax
    low, high = limits if limits is not None else ax.get_ylim()
    span = high - low
    thin = len(band) and 2 * float(band.max()) < ZOOM_SHARE * span  # review 17b C1: the band a pixel or two high
    if thin and (not new_figure or quiet):  # no zoom at chance (no band to read) or on a caller's axes: the
        for text in ax.get_legend().get_texts():  # legend says the band is too thin to see
            if text.get_text().startswith(f"within {100 * BAND:.0f}%"):
                text.set_text(text.get_text() + f"\n(+-{float(band.max()):.2g}: thinner than a line here)")
    elif thin:
        ax.figure.set_size_inches(8.5, 6.4)
        grid = ax.figure.add_gridspec(2, 1, height_ratios=[3, 2])
        ax.set_subplotspec(grid[0])
        zoom = ax.figure.add_subplot(grid[1], sharex=ax)
        _zoom_panel(zoom, groups, colours, styles, band, what=what, unit=unit)
        ax.tick_params(labelbottom=False)
        ax.set_xlabel("")
        ax._zoom = ticked = zoom
        fit_title(zoom)
    if len(table):  # under each budget: how many prompts it evicts anything from, of all
        grid = sorted(int(b) for b in table.budget.unique())
        count = table.groupby("budget").n_evicting.max()
        n_all = int(full_rows.example.nunique())
        grid, hidden = drawn_budgets(grid, count)
        texts = [f"{b}\n{int(count[b])}/{n_all}" for b in grid]
        ticked.set_xticks(grid, texts)
        ticked.xaxis.set_minor_locator(NullLocator())
        if hidden:  # review 18a C3: budgets above one that evicts nothing cannot evict either: not on the axis
            line = cap if cap is not None and (pd.isna(whole) or cap < whole) else whole  # the dotted line stays in
            ticked.set_xlim(min(grid) / 1.25, max([*grid, *([line] if pd.notna(line) else [])]) * 1.25)
        xlabel += "\nunder it: evicted / all prompts"
        if hidden:
            xlabel += (f"\nnot drawn: budget(s) {', '.join(map(str, hidden))}, above {grid[-1]}, evict from no prompt "
                       "(every prompt kept whole)")
        ticked.set_xlabel(xlabel)
        ticked._budget_ticks = (xlabel, texts)  # fit_budget_ticks redoes the thinning at the figure's final layout
        fit_budget_ticks(ticked, layout=new_figure)
    return ax


def drawn_budgets(grid: Sequence[int], count: Mapping[int, Any]) -> tuple[list[int], list[int]]:
    """(the budgets the eviction figure draws, those it leaves out): every budget up to the first from which no budget
    evicts from any prompt (`count`: each budget's prompts evicted from, its largest over the policies), that one
    kept, marked 0/n; the larger ones, which evict nothing either (review 18a C3: on a model whose every layer slides
    over 12 keys, budgets 16, 32 and 38 took 3 of 7 ticks), left out."""
    grid = sorted(int(b) for b in grid)
    first = next((i for i in range(len(grid)) if all(int(count[b]) == 0 for b in grid[i:])), None)
    if first is None:
        return grid, []
    return grid[:first + 1], grid[first + 1:]


def balanced(parts: list[str]) -> list[str]:
    """The words of wrapped `parts` in as many lines, as even in length as textwrap makes them (review 16dv C2: a
    wrap to the axes' width left "log2)" or "all" alone on its last line)."""
    text = " ".join(parts)
    for chars in range(-(-len(text) // max(1, len(parts))), len(text) + 1):
        even = textwrap.wrap(text, chars)
        if len(even) <= len(parts):
            return even
    return parts


def fit_budget_ticks(ax, *, layout: bool = True) -> None:
    """Review 16d C1: the eviction figure's budget tick labels ("16\n14/16", "32\n2/16") apart and its x label
    clear of the legend, measured at the layout the figure is saved with (layout: tight_layout first; `figures`
    calls it again after fit_labels, whose wrapped y label narrows the axes). Each x label line is wrapped to
    the axes' width, so it never reaches under the legend beside them; a tick label that would run into its
    neighbour's (thin_xtick_labels, 4 px apart) is blanked and the x label lists it with its count."""
    xlabel, texts = getattr(ax, "_budget_ticks", (None, None))
    if xlabel is None:
        return
    fig = ax.figure

    def refit() -> None:
        if layout:
            fig.tight_layout()
        blanked = [i for i, t in enumerate(ax.get_xticklabels()) if i < len(texts) and texts[i] and not t.get_text()]
        lines = xlabel.split("\n")
        if blanked:  # close budgets (16 and 19 on a log axis): their labels would run together
            # review 16dv C2: a budget and its count stay on one line (a no-break space while wrapping)
            lines.append("unlabelled ticks: " + ", ".join(texts[i].replace("\n", "\u00a0(") + ")" for i in blanked))
        renderer = drawn(fig)
        width = ax.get_window_extent(renderer).width
        label = ax.xaxis.label

        def wide(text: str) -> float:
            label.set_text(text)
            return label.get_window_extent(renderer).width

        ax.set_xlabel("\n".join(part for line in lines for part in balanced(wrap_to_width(line, wide, width)))
                      .replace("\u00a0", " "))
        if layout:
            fig.tight_layout()
        thin_xtick_labels(ax)  # a new blank: the x label lists it, and the axes narrow; fit again

    rethin_until_settled(ax, refit, 4, blank_xticks(ax))


NORMS_HEIGHT = 2.2  # inches: the norms plot's drawn height at the least, however many lines its title and x label take
SAME = 0.005  # two layers' norm lines within this fraction of the largest norm at every position lie on each other


def plot_norms(data: pd.DataFrame, *, kind: str = "key", key_norm: Mapping[str, Any] | None = None,
               n_prompts: int | None = None, latent: Sequence[int] | None = None,
               key_clamp: Mapping[str, Any] | None = None, ax=None):
    """Mean norm of the cached keys (or values) by position (`data`: the norms table), one line per layer
    (mean over KV heads), on a y axis from 0 (a norm is read as a ratio: a zoomed axis makes a few percent look
    like structure). Each point that fewer than half of the section's `n_prompts` prompts reach (its own
    `n_prompts` in the table: far positions average only the longest prompts, and a sliding-window layer's
    cache only each prompt's last window, so reach need not fall with position) is drawn on a faint dotted line
    only; the solid line breaks there, and the x label says where and counts the section's prompts (without
    `n_prompts`, the most that reach any point).
    key_norm (the kv summary's, where the model normalises its keys before caching): the key figure's title
    says so and, for a norm per head, a grey band shows the range its weight allows. latent (the kv summary's, on
    multi-head latent attention): the model caches one latent per position, not these per-head keys, which the
    title and axis say (review 15d C3). key_clamp (the kv summary's, a clip_qkv and no key norm): the key figure's
    title gives the clamp and the head bound it sets (review 19a B1)."""
    ax = axes(ax, (8.5, 4))
    df = data[data.kind == kind]
    means = df.groupby(["layer", "position"], as_index=False).agg(
        norm=("norm", "mean"), **({"n": ("n_prompts", "max")} if "n_prompts" in df else {}))
    total = n_prompts or (int(means.n.max()) if "n" in means and len(means) else None)
    few = (2 * means.n < total) if total and "n" in means else pd.Series(False, index=means.index)  # review 9a B1
    colours = sns.color_palette(LAYERS, means.layer.nunique())
    top = float(means.norm.max()) if len(means) else 0.0
    under = coincident({str(k): pd.Series(g.norm.to_numpy(), index=g.position.to_numpy())
                        for k, g in means.groupby("layer")}, SAME * top)  # {layer: the later layers it lies under}
    turns = {k: i for i, k in enumerate(under)}  # hidden layers' dashes interleave: each colour shows in turn
    for colour, (layer, g) in zip(colours, means.groupby("layer")):
        muted = few[g.index]
        hidden = (dict(ls=(3 * turns[str(layer)], (3, 3 * len(under))), lw=2.5, zorder=3)  # review 16av-C2: on top
                  if str(layer) in under else {})
        if muted.any():
            ax.plot(g.position, g.norm, color=colour, lw=1, ls=":", alpha=0.4)
        ax.plot(g.position, g.norm.where(~muted), color=colour, label=str(layer), **{"lw": 1.5, **hidden})
    where = "position in the context (from each prompt's first token)"
    starts = means.groupby("layer").position.min()
    late = starts[starts > 0]  # a sliding-window layer's cache keeps only each prompt's last window
    if len(late):  # review 18b C4: "layer(s) 0 from 1, 1 from 1" read as a count or a layer
        by_start: dict[int, list[str]] = {}
        for k, v in late.items():
            by_start.setdefault(int(v), []).append(str(int(k)))
        where += ("\n" + "; ".join(f"layer(s) {', '.join(ks)} from position {v} on" for v, ks in by_start.items())
                  + ": a sliding window, each prompt's cache holds only its last positions, so an early position is "
                  "reached only by the prompts short enough to keep it")
    if few.any():
        thin = means[few]
        positions = int_ranges(sorted({int(p) for p in thin.position}))
        where += (f"\nfaint, dotted (the solid line breaks): points fewer than half of the {total} prompts reach "
                  f"(n = {int_span(int(thin.n.min()), int(thin.n.max()))}; positions {positions})")
    title = f"Cached {kind} norms (mean over KV heads)"
    what = f"the cached {kind}"
    if latent:  # review 15d C3: MLA caches the latent; these are the per-head keys or values expanded from it
        title = (f"Per-head {kind} norms, expanded from the cached latent (mean over heads)\n"
                 f"the cache holds one latent of {latent[0]} + {latent[1]} numbers per position, not these")
        what = f"the per-head {kind} (expanded from the latent)"
    legend_title = "layer"
    if under:  # review 17v C2: said in the legend, by the dashes it explains (the title was 6 lines over the plot)
        same = sorted({int(k) for k in under} | {int(c) for v in under.values() for c in v})
        legend_title += f"\n{int_ranges(same)} coincide (within\n{100 * SAME:g}% of the largest norm):\ndashed on top"
    if kind == "key" and isinstance(key_clamp, Mapping) and key_clamp.get("head_bound") is not None:
        title += (f"\nkeys clamped to +-{float(key_clamp['clip_qkv']):g} (clip_qkv) before caching: one head's key "
                  f"norm <= {float(key_clamp['head_bound']):.3g}")
    if kind == "key" and isinstance(key_norm, Mapping):
        name, bounds = key_norm.get("module", "k_norm"), key_norm.get("bounds") or []
        layers = sorted(int(v) for v in key_norm.get("layers") or [])
        who = "keys are" if set(layers) >= set(means.layer.unique()) else f"layer(s) {', '.join(map(str, layers))}:"
        if key_norm.get("per_head", True):  # one line each: fit_title_parts wraps them, evenly, to the axes' width
            title += f"\n{who} normalised ({name}) before caching: their norms are set by its weight, not a sink signal"
        else:  # review 8 A1: a norm over all heads bounds a key's total over them, not one head's norm
            title += (f"\n{who} normalised over all KV heads together ({name}): a key's total is bounded, one head's "
                      f"norm only by that total")
            if key_norm.get("clip_qkv") is not None and key_norm.get("head_bound") is not None:  # review 18c A5
                title += (f"\nand clamped to +-{float(key_norm['clip_qkv']):g} (clip_qkv): one head's key norm "
                          f"<= {float(key_norm['head_bound']):.3g}")
        if key_norm.get("per_head", True) and len(bounds) == 2:
            lo, hi = float(bounds[0]), max(float(bounds[1]), 1.002 * float(bounds[0]))  # a constant weight: a thin band
            if hi - lo < 0.02 * max(hi, 1e-12):  # review 16av-C2: a band this thin does not show; a wide grey line does
                ax.axhline(lo, color="grey", alpha=0.35, lw=8, zorder=0,
                           label=f"{name} allows {_span2(*bounds)}\n(one value: the wide grey line)")
            else:
                ax.axhspan(lo, hi, color="grey", alpha=0.25, lw=0, label=f"{name} allows {_span2(*bounds)}")
            top = max(top, hi)
    ax.set(title=title, xlabel=where, ylabel=f"L2 norm of {what}")
    ax.set_ylim(0, 1.1 * top or 1.0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small", title=legend_title)
    ax._title_parts, ax._xlabel_parts = title.split("\n"), where.split("\n")
    fit_title_parts(ax)
    return ax


def fit_title_parts(ax) -> None:
    """Review 17v C2: each line the plot wrote for its title and x label (`ax._title_parts`, `ax._xlabel_parts`)
    wrapped to the axes' width as measured at the figure's layout, in lines as even as textwrap makes them (`balanced`),
    so no word is left alone on a line ("caching:", "signal"); nothing where the plot recorded no parts."""
    titles, xlabels = getattr(ax, "_title_parts", None), getattr(ax, "_xlabel_parts", None)
    if not titles and not xlabels:
        return
    fig = ax.figure
    for _ in range(2):  # a new title height moves the axes a little: measure again
        fig.tight_layout()
        drawn(fig)
        renderer = fig.canvas.get_renderer()
        width = ax.get_window_extent(renderer).width
        for parts, text, setter in ((titles, ax.title, ax.set_title), (xlabels, ax.xaxis.label, ax.set_xlabel)):
            if not parts:
                continue

            def wide(line: str, text=text, renderer=renderer) -> float:
                return renderer.get_text_width_height_descent(line, text.get_fontproperties(), ismath=False)[0]

            setter("\n".join(part for line in parts for part in balanced(wrap_to_width(line, wide, width))))
    fig.tight_layout()
    keep_drawn_size(ax, height=NORMS_HEIGHT, width=0.0)  # the plot never squeezed under its text (review 17v C2)


def plot_sinks(data: pd.DataFrame, *, ax=None):
    """Attention mass on the first position per layer against its baseline (`data`: the sinks table; baseline_mass,
    uniform or ALiBi's as `baseline` says, or an older run's uniform_mass / flat_mass: kv.sink_shares), the measured
    bars with their 95% t interval over prompts (ci_low / ci_high, where present)."""
    import numpy as np

    ax = axes(ax, (7.5, 4))
    x = np.arange(len(data))  # [layer]
    base, kind, _ = sink_shares(data)
    measured, uniform = data["sink_mass"].to_numpy(dtype=float), base.to_numpy(dtype=float)
    colours = sns.color_palette(n_colors=2)
    err = None
    if {"ci_low", "ci_high"} <= set(data) and data[["ci_low", "ci_high"]].notna().all().all():
        err = np.stack([measured - data["ci_low"].to_numpy(dtype=float), data["ci_high"].to_numpy(dtype=float) - measured])
    ax.bar(x - 0.2, measured, width=0.4, color=colours[0], label="measured (95% CI over prompts)" if err is not None
           else "measured", yerr=err, capsize=3, ecolor="black")
    alibi = kind == "alibi"  # review 16c B1: an ALiBi model's baseline is its bias alone (analyses.kv.sink_stats)
    ax.bar(x + 0.2, uniform, width=0.4, color=colours[1], label="ALiBi's bias alone\n(equal scores)" if alibi else
           "if uniform over the\nmass reaching the keys" if kind == "keys" else "if uniform")  # review 19b B1
    learned = 1 - data["keys_mass"].to_numpy(dtype=float) if kind == "keys" and "keys_mass" in data else None
    if learned is not None:  # the learned sink's share of each row, mean over the prompts
        ax.plot(x, learned, "k_", markersize=14, label="learned sink\n(share of a row)")
    ax.set_xticks(x, [str(int(v)) for v in data["layer"]])
    top = max(float(np.nanmax(measured + (err[1] if err is not None else 0))), float(np.nanmax(uniform)),
              float(np.nanmax(learned)) if learned is not None else 0.0)
    ax.set(title="Attention sink: mass on the first position", xlabel="layer",
           ylabel="attention mass on position 0 (0-1)")
    ax.set_ylim(0, min(1.0, 1.15 * top) or 1.0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small", title="attention")
    return ax


def _rounding_step(result) -> float:
    """One rounding step of the kv metric in the run's dtype (metrics.noise_floor at the largest |full-cache metric|);
    0 where the dtype is not recorded."""
    import torch

    from headscope.analyses.core.metrics import noise_floor

    dtype = getattr(torch, str(result.summary.get("dtype") or ""), None)
    df = result.df
    if not isinstance(dtype, torch.dtype) or not len(df) or "metric" not in df:
        return 0.0
    size = float(df.loc[df.policy == "full", "metric"].abs().max()) if (df.policy == "full").any() else 1.0
    return float(noise_floor(dtype, size if size == size else 1.0))


def eviction_cap(result) -> int | None:
    """window - 1 of the widest sliding window where every layer slides (the summary's sliding_windows, one per layer:
    n_layers, else as many as sink_mass_per_layer), the most positions any layer's cache holds; None where a layer is
    global or the summary does not say."""
    windows = result.summary.get("sliding_windows") or {}
    n_layers = result.summary.get("n_layers") or len(result.summary.get("sink_mass_per_layer") or ())
    if not windows or not n_layers or len(windows) < int(n_layers):
        return None
    return max(int(w) for w in windows.values()) - 1


def figures(result, **kwargs) -> dict:
    """{file stem: Figure} for a kv Result."""
    out = {}
    hold = result.summary.get("holding_budgets") or {}
    for stem, draw in (("kv_eviction", lambda: plot_eviction(result.df, metric=result.summary.get("metric"),
                                                           recent_share=result.summary.get("recent_share"),
                                                           chance=hold.get("chance"),
                                                           quiet=quiet_reason(result.summary),
                                                           step=_rounding_step(result), cap=eviction_cap(result))),
                       ("kv_norms", lambda: plot_norms(result.tables["norms"], key_norm=result.summary.get("key_norm"),
                                                      n_prompts=result.summary.get("n_examples"),
                                                      latent=result.summary.get("latent"),
                                                      key_clamp=result.summary.get("key_clamp"))),
                       ("kv_sinks", lambda: plot_sinks(result.tables["sinks"]))):
        if stem == "kv_eviction" and result.summary.get("eviction_skipped"):
            continue  # review 16dv B1: not run (the finding says why)
        out[stem] = laid_out(draw())
        if stem == "kv_norms":
            fit_title_parts(out[stem].axes[0])  # at the figure's final layout (review 17v C2)
        if stem == "kv_eviction":
            fit_labels(out[stem].axes[0])
            if getattr(out[stem].axes[0], "_zoom", None) is not None:
                fit_title(out[stem].axes[0]._zoom)
            ticked = next((a for a in out[stem].axes if getattr(a, "_budget_ticks", None)), out[stem].axes[0])
            fit_budget_ticks(ticked)  # at the layout fit_labels left (review 16d C1); the zoom panel's, where drawn
    return out


# Presentation (reports/families.py): the guide, the captions and the finding in words.

GUIDE = (  # how to read this section of the report
    "The KV cache: bytes per token and at full context, what grouped-query attention saves, the "
    "key and value norms by position (whether the first keys, attention sinks, stand out: the finding "
    "says), and how the metric holds up when the cache keeps only sinks plus a recent window, a window alone, or heavy "
    "hitters as H2O keeps them (a recent window of half the budget plus the most attended of the older positions)."
)


def guide_for(summary: Mapping[str, Any]) -> str:
    """The guide for this run: a model without a fixed context (ALiBi; summary no_fixed_context, no full-context size)
    is sized at the longest prompt run, so the guide says that, not "at full context" (review 16cv C2)."""
    if summary.get("no_fixed_context") and summary.get("bytes_at_n_ctx") is None:
        return GUIDE.replace("at full context", "at the longest prompt run", 1)
    return GUIDE


CAPTIONS = {  # what to read from each figure and its units, by figure stem
    "kv_eviction": "What the finding states: per eviction policy, the change of the task metric at the answer over the "
                   "prompts each budget evicts anything from, against those same prompts' own full cache (y: mean of "
                   "policy - full cache in the metric's own units, never a % of a mean that may be 0; band: its 95% t "
                   "interval over them), against "
                   "the number of cached positions each layer keeps (x, log2; under each budget, n: the prompts it "
                   "evicts from, of all; a budget that evicts from none has no point, a prompt kept whole equals the "
                   "full cache). Dashed: 0, the full cache; grey band: within 1%, the finding's tolerance, in units (1% of the "
                   "same prompts' |full-cache mean|, or on a log-probability of the span from chance to it); dotted: "
                   "the longest context, a budget that saves nothing for any prompt (where every layer slides: the "
                   "cache's cap, window - 1). Heavy hitters is H2O's policy: the "
                   "newest positions (the share in its legend, half by default) plus the rest of the budget as the "
                   "older positions the context's queries attended to most. "
                   "A sliding-window layer already holds at most window - 1 past positions: window and heavy hitters "
                   "evict from it only below that, and sinks outside its window are gone already (the finding names "
                   "those layers where a window is shorter than the longest prompt). A budget too close to its left "
                   "neighbour for its own label keeps its tick and is "
                   "listed with its count in the x label. The y range is set by the means and the intervals over 3 "
                   "prompts or more: a wider interval over fewer (t's 95% quantile is 12.7 for 2 prompts) is cut at the "
                   "axis, a triangle there, and the legend gives its ends. Where the grey band is still thinner than 5% "
                   "of that range, a second panel below zooms on it (5 to 10 band widths about 0, points beyond leave "
                   "it) and carries the budget ticks; at chance there is no zoom and the legend gives the band's width.",
    "kv_norms": "Mean L2 norm of the cached keys by position, one line per layer (mean over KV heads and the prompts "
                "that reach the position); faint, dotted (the solid line breaks there): each point that fewer than half "
                "of the section's prompts reach, judged point by point (a windowed cache's reach need not fall with "
                "position). A "
                "sliding-window layer's line starts late: its cache holds only each prompt's last window of positions. "
                "The y axis starts at 0. On a model that normalises each head's keys before caching (a k_norm: Qwen3, "
                "Gemma 3) their norms are set by the norm's weight, which the title says (grey band: the range the norm "
                "allows; a wide grey line where it allows one value): the lines show the normalisation, not a sink. "
                "Layers whose lines lie within 0.5% of the largest norm of a later layer's at every position are drawn "
                "dashed on top of it, and the legend's title names them. A norm over all KV heads together (OLMo 2) "
                "bounds a key's total over its heads, not one head's norm, so there the lines can still show a sink. "
                "On multi-head latent attention (DeepSeek) the cache holds one latent per position; the lines are the "
                "per-head keys expanded from it, as the title says.",
    "kv_sinks": "Per layer, attention mass (0-1) on the first position against the uniform-attention mass (on an "
                "ALiBi model the mass its position bias alone gives with every score equal), with its 95% t interval "
                "over prompts; the finding names the layers that are sinks. On a sliding-window layer both bars average "
                "only the queries whose window holds the first token (queries 1 to window - 1), each counting only "
                "the keys inside its window; a global layer's average every query after the first.",
}
