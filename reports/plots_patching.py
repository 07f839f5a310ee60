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
(plots.quiet_reason) the maps are muted and say so. Causal traces of several prompts are drawn by
token role, shared across the restored kinds.

This module is the family's whole presentation (reports/families.py): after the figures, `GUIDE`
(how to read its section), `CAPTIONS` (each figure's, by stem) and `finding(summary)`, its headline.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from headscope.analyses.patching.attribution_patching import (
    MISS,
    interval_stated,
    nonzero_count,
    slope_with_interval,
)
from headscope.reports.findings import _at_chance, _chance, _ci, _num, _words, fisher_interval
from headscope.reports.patching_sites import (
    by_construction,
    depth,
    differ_offsets,
    differing_positions,
    entering,
    reaching,
    tied,
    writer,
)
from headscope.reports.plots import axes, color_scale, label, laid_out, quiet_reason, scale_ticks, symmetric_bound
from headscope.reports.plots_circuits import PARTIAL_VEIL

BY_POS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")
BY_HEAD = ("head_out", "q", "k", "v", "pattern")
KV_SITES = ("k", "v")  # their head index is the KV head (grouped-query attention shares one among query heads)
NORMALISED = "share of the clean-corrupted gap"


def position_labels(rows: pd.DataFrame, positions, n_prompts: int | None, n_positions: int | None = None) -> list[str]:
    """Tick labels for patched positions (left-padded: the last position is every prompt's last
    token): "i: token" when there is one prompt, else the place from the end, "-1 (last)", "-2", ...
    (the table's tokens are one prompt's, wrong under an average over prompts of other tokens)."""
    if n_prompts == 1:
        tokens = rows.drop_duplicates("pos").set_index("pos")["token"]
        return [label(tokens[p]) for p in positions]
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
    ax.set_xlabel(ax.get_xlabel() + f"\npale, with n: columns averaged over fewer than all {n_prompts} prompts")


def _position_axis(n_prompts: int | None) -> str:
    return ("position: token" if n_prompts == 1 else
            f"position from the end (mean over up to {n_prompts or 'the'} prompts: only those that reach it)")


def _heatmap(grid: pd.DataFrame, ax: Axes, title: str, label: str, bound: float | None = None,
             quiet: str | None = None) -> Axes:
    """Diverging heat map centred on 0 with limits -bound..bound (the panel's own max |value| when None),
    its colour bar ticked at fixed fractions of the bound (plots.scale_ticks: panels of one scale, one set
    of ticks, whatever their heights); a panel whose own max is under half the shared bound prints it in
    the title; `quiet` mutes the map and adds its reason to the title."""
    own = symmetric_bound(grid.to_numpy(dtype=float))
    bound = bound or own
    scale = color_scale(bound=bound, quiet=bool(quiet), is_signed=True)
    sns.heatmap(grid, ax=ax, **scale, cbar_kws={"label": label, **scale_ticks(bound)}, xticklabels=True, yticklabels=True)
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


def _normalised(df: pd.DataFrame, divisor: float, columns: tuple[str, ...] = ("effect",)) -> pd.DataFrame:
    return df.assign(**{c: df[c] / divisor for c in columns if c in df}) if divisor != 1.0 else df


def plot_layer_pos(data: pd.DataFrame, *, site_type: str = "resid_pre", column: str = "effect",
                   n_prompts: int | None = None, n_positions: int | None = None, label: str | None = None,
                   bound: float | None = None, quiet: str | None = None, ax: Axes | None = None) -> Axes:
    """Layer x position heatmap of one (layer, pos) site type (`data`: the exact table); positions
    labelled by position_labels."""
    ax = axes(ax)
    rows = data[data["site_type"] == site_type]
    grid = rows.pivot_table(index="layer", columns="pos", values=column, aggfunc="mean")
    partial = _partial_columns(rows, grid.columns, n_prompts)
    grid.columns = position_labels(rows, grid.columns, n_prompts, n_positions)
    _heatmap(grid, ax, f"patching {site_type}, by layer and position", label or column, bound, quiet)
    ax.set_xlabel(_position_axis(n_prompts))
    ax.set_ylabel("layer")
    _mute_partial(ax, partial, grid.shape[0], n_prompts)
    return ax


def plot_layer_head(data: pd.DataFrame, *, site_type: str = "head_out", column: str = "effect",
                    label: str | None = None, bound: float | None = None, quiet: str | None = None,
                    ax: Axes | None = None) -> Axes:
    """Layer x head heatmap of one (layer, head) site type (`data`: the exact table); k and v are per KV head."""
    ax = axes(ax)
    rows = data[(data["site_type"] == site_type) & data["pos"].isna()]
    grid = rows.pivot_table(index="layer", columns="head", values=column, aggfunc="mean")
    grid.columns = [int(h) for h in grid.columns]  # a head index, even after a float round trip through CSV
    unit = "KV head" if site_type in KV_SITES else "head"
    _heatmap(grid, ax, f"patching {site_type}, by layer and {unit}", label or column, bound, quiet)
    ax.set_xlabel(unit)
    ax.set_ylabel("layer")
    return ax


def plot_head_pos(data: pd.DataFrame, *, site_type: str = "head_out_by_pos", column: str = "effect",
                  n_prompts: int | None = None, n_positions: int | None = None, label: str | None = None,
                  bound: float | None = None, quiet: str | None = None, ax: Axes | None = None) -> Axes:
    """(layer, head) x position heatmap of per-position head patching (`data`: the exact table)."""
    ax = axes(ax)
    rows = data[data["site_type"] == site_type]
    grid = rows.pivot_table(index=["layer", "head"], columns="pos", values=column, aggfunc="mean")
    partial = _partial_columns(rows, grid.columns, n_prompts)
    grid.columns = position_labels(rows, grid.columns, n_prompts, n_positions)
    grid.index = [f"L{int(layer)}H{int(head)}" for layer, head in grid.index]
    _heatmap(grid, ax, f"patching {site_type}: every head by position", label or column, bound, quiet)
    ax.tick_params(axis="y", labelsize=max(4, min(9, 300 / max(1, len(grid)))))
    ax.set_xlabel(_position_axis(n_prompts))
    ax.set_ylabel("head (L layer H head)")
    _mute_partial(ax, partial, grid.shape[0], n_prompts)
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
            out[str(name)] = {**fit, "n_nonzero": nonzero}
    return out


def _slope_label(site: str, fit: Mapping[str, Any] | None) -> str:
    if fit is None:
        return site
    ci, n, nonzero = fit.get("slope_ci"), fit.get("slope_n"), fit.get("n_nonzero")
    if ci:
        return f"{site} (slope {fit['slope']:.2f}, 95% CI {ci[0]:.2f} to {ci[1]:.2f})"
    why = f"; no interval: {nonzero} of {n} cells non-zero" if nonzero is not None and n and nonzero < n else ""
    return f"{site} (slope {fit['slope']:.2f}{why})"


def plot_attribution_vs_exact(data: pd.DataFrame, *, label: str = "exact patching effect", floor: float = 0.0,
                              ax: Axes | None = None) -> Axes:
    """Attribution-patching estimate against the exact effect (`data`: the exact table with its
    attribution column), one point per cell, by site type; the identity line, and each site type's
    fitted slope with its 95% interval over the cells in the legend (a high correlation can hide a 2x error);
    floor: site_slopes' (cells within it count as zero)."""
    ax = axes(ax)
    slopes = site_slopes(data, floor)
    named = data.assign(site=[_slope_label(str(t), slopes.get(str(t))) for t in data["site_type"]])
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
                       quiet: str | None = None, ax: Axes | None = None) -> Axes:
    """Sender layer x sender head effect of path patching (`data`: the path_patching table; receivers
    jointly, or averaged), on the exact maps' shared scale when `bound` is given."""
    ax = axes(ax)
    grid = data.pivot_table(index="sender_layer", columns="sender_head", values="effect", aggfunc="mean")
    grid.columns = [int(h) for h in grid.columns]
    receiver = ", ".join(sorted(set(data["receiver"])))[:40]
    _heatmap(grid, ax, f"path patching: sender head -> {receiver}", label, bound, quiet)
    ax.set_xlabel("sender head")
    ax.set_ylabel("sender layer")
    return ax


def figures(result, **kwargs) -> dict[str, Figure]:
    """Every figure the result's tables allow, by file stem."""
    out: dict[str, Figure] = {}
    tables, summary = dict(result.tables), dict(result.summary)
    divisor, label = scale(summary)
    quiet = quiet_reason(summary)
    where = {"n_prompts": summary.get("n_examples"), "n_positions": summary.get("n_positions")}
    exact = tables.get("exact")
    if exact is not None:
        exact = _normalised(exact, divisor, ("effect", "attribution"))
    paths = tables.get("path_patching")
    if paths is not None:
        paths = _normalised(paths, divisor)
    # one scale for every site's map and the path-patching map
    shared = symmetric_bound(*(t["effect"].to_numpy(dtype=float) for t in (exact, paths) if t is not None))

    def new(stem: str, draw, size: tuple[float, float] = (7, 4)) -> None:
        out[stem] = laid_out(draw(axes(None, (size[0], size[1] + 0.3 * bool(quiet)))))

    if exact is not None:
        present = set(exact["site_type"])
        common = {"label": label, "bound": shared, "quiet": quiet}
        for st in BY_POS:
            if st in present:
                new(f"exact_{st}", lambda ax, st=st: plot_layer_pos(exact, site_type=st, ax=ax, **where, **common))
        for st in BY_HEAD:
            if st in present:
                new(f"exact_{st}", lambda ax, st=st: plot_layer_head(exact, site_type=st, ax=ax, **common))
        if "head_out_by_pos" in present:
            n_rows = exact.loc[exact["site_type"] == "head_out_by_pos", ["layer", "head"]].drop_duplicates().shape[0]
            new("exact_head_out_by_pos", lambda ax: plot_head_pos(exact, ax=ax, **where, **common),
                (7, max(4.0, 0.16 * n_rows + 1.5)))
        if "attribution" in exact:
            rounding = (summary.get("rounding_floor") or {}).get("floor")
            floor = abs(float(rounding) / divisor) if isinstance(rounding, (int, float)) else 0.0  # the table's units
            new("attribution_vs_exact", lambda ax: plot_attribution_vs_exact(exact, ax=ax, label=label, floor=floor),
                (8, 4.5))
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
        new("path_patching", lambda ax: plot_path_patching(paths, ax=ax, label=label, bound=shared, quiet=quiet))
    return out


# Presentation (reports/families.py): the guide, the captions and the finding in words.

GUIDE = (  # how to read this section of the report
    "Where the computation happens. Each cell replaces one activation of the corrupted run by the "
    "clean run's (denoising) and shows how much of the clean behaviour returns (normalised logit "
    "difference: 1 = fully restored). Causal tracing restores states after noising the subject; "
    "attribution patching approximates every cell from one backward pass (its agreement with exact "
    "patching is reported)."
)
CAPTIONS = {  # what to read from each figure and its units, by figure stem
    "attribution_vs_exact": "Attribution-patching estimate (y) against the exact patching effect (x), both in normalised "
                            "logit difference; the dashed line is y = x and each site type's least-squares slope, with "
                            "its 95% interval over the cells, is in the legend (slope 0.5 = a 2x underestimate); a site "
                            "type whose exact effects are mostly zero gets no interval there, as in the finding.",
    "path_patching": "Path-patching effect (normalised logit difference) of each sender head on the receivers, layer x "
                     "head; red positive, blue negative, centred on 0.",
}
PREFIX_CAPTIONS = {  # figures named <prefix><site>: the caption then 'Site: <site>.'
    "exact_": "Exact activation patching: normalised logit difference after patching each cell (1 = clean behaviour fully "
              "restored, 0 = corrupted); red positive, blue negative, one scale shared by every site's map (a site whose "
              "own maximum is much smaller prints it in its title). Positions count from the end; a column that only the "
              "longer prompts reach is pale and its tick gives its n. ",
    "causal_tracing_": "Causal tracing: average indirect effect (task metric units) of restoring each state after noising "
                       "the subject, by token role (several prompts: Meng et al.'s groups, averaged over every prompt) or "
                       "position (one prompt) x layer; red positive, blue negative, one scale for every restored kind. ",
}


def _site(cell: Mapping[str, Any], kind: str, differ: frozenset = frozenset()) -> str:
    # a head by its name (L1H3), as every section names heads: the report links it to the explorer; differ: the
    # offsets from the end where clean and corrupted differ, named once by the finding (no token said there)
    where = [f"layer {cell.get('layer')}" if cell.get("head") is None else f"L{cell.get('layer')}H{cell['head']}"]
    if cell.get("pos") is not None:
        token = cell.get("token") or ""  # "": the prompts have different tokens there (patching's token column)
        end = cell.get("from_end")  # the figures' axis: the same place in every left-padded prompt
        at = f"position {end} from the end" if isinstance(end, int) else f"position {cell['pos']}"
        if isinstance(end, int):  # the token column's "i: " is the padded frame's index, not this axis
            token = re.sub(r"^\d+: ", "", token)
        named = isinstance(end, int) and end in differ
        where.append(f"{at} ({token!r})" if token else at if named else f"{at} (its token differs across prompts)")
    return f"{kind} at {', '.join(where)}"


RESIDUAL = {"resid_pre": 0, "resid_post": 1}  # resid_post of layer l is resid_pre of layer l + 1: one state


def _state(kind: str, cell: Mapping[str, Any]) -> tuple:
    """A key equal for cells that patch the same activation (resid_post l and resid_pre l + 1)."""
    if kind in RESIDUAL:
        return ("resid", int(cell.get("layer") or 0) + RESIDUAL[kind], cell.get("pos"))
    return (kind, cell.get("layer"), cell.get("head"), cell.get("pos"))


def _distinct_sites(cells: list) -> list:
    """The strongest cell, then the strongest of each other site type, each a different activation
    (the residual stream at one position is one site however many residual kinds name it)."""
    seen_states, seen_kinds, out = set(), set(), []
    for kind, cell in cells:
        state, family = _state(kind, cell), "resid" if kind in RESIDUAL else kind
        if state in seen_states or family in seen_kinds:
            continue
        seen_states.add(state)
        seen_kinds.add(family)
        out.append((kind, cell))
    return out


def _significant(r: float | None, n: int) -> bool:
    """Whether a Pearson r over n points differs from 0: its Fisher 95% interval excludes 0 (|r| = 1 on
    three or more points counts as significant; fewer than four points otherwise never do)."""
    if r is None:
        return False
    if abs(r) >= 1:
        return n >= 3
    interval = fisher_interval(r, n)
    return interval is not None and (interval[0] > 0 or interval[1] < 0)




def _ratio(slope: float) -> str:
    """A slope of attribution over exact in words ("about half the exact ones")."""
    if slope <= 0:
        return "point the opposite way to the exact ones"
    for lo, hi, words in ((0.4, 0.6, "about half"), (1.7, 2.3, "about twice")):
        if lo <= slope < hi:
            return f"are {words} the exact ones"
    return f"are about {slope:.2g} times the exact ones"


FAR = (0.8, 1.25)  # a slope outside this range, with a 95% interval that excludes 1, is a scale error worth saying


def _slope(kind: str, stats: Mapping[str, Any], rank: bool) -> str | None:
    """'At <kind> ... (least-squares slope b of attribution on exact, 95% CI [..], n = k cells).': far
    from 1 (FAR, interval excluding 1) its effects are that multiple of the exact ones, so (where r is
    significant and the report ranks sites, `rank`) it ranks but does not size; None without a slope and
    interval (older summaries, fewer than three cells)."""
    b, ci, n = _num(stats.get("slope")), stats.get("slope_ci"), stats.get("slope_n", stats.get("n"))
    if b is None or not isinstance(ci, (list, tuple)) or len(ci) != 2 or any(_num(c) is None for c in ci):
        return None
    said = f"least-squares slope {b:.2f} of attribution on exact{_ci(tuple(ci))}, n = {n} cells"
    if not ci[0] <= 1.0 <= ci[1] and not FAR[0] <= b <= FAR[1]:
        advice = ": use it to rank, not to size" if rank and _significant(_num(stats.get("pearson")), int(n or 0)) else ""
        return f"At {kind} attribution patching's effects {_ratio(b)} ({said}){advice}."
    close = "consistent with the exact size" if ci[0] <= 1.0 <= ci[1] else "close to the exact size"
    return f"At {kind} its sizes are {close} ({said})."


def _case(stats: Mapping[str, Any]) -> str:
    """Which reading of r the cells allow: "few" (under 3 non-zero exact effects), "sparse" (under SPARSE
    or half the cells non-zero), "one point" (significant r that is not without its largest cell, or flips
    sign), "mostly" (under half of |r| without it) or "plain" (r over every cell with its interval)."""
    r, n, nonzero = _num(stats.get("pearson")), int(_num(stats.get("n")) or 0), _num(stats.get("n_nonzero"))
    if nonzero is not None and nonzero < 3:
        return "few"
    if not interval_stated(n, None if nonzero is None else int(nonzero)):  # zeros are not independent evidence
        return "sparse"
    rest = _num(stats.get("pearson_without_top"))
    if rest is None or not _significant(r, n):
        return "plain"
    if not _significant(rest, n - 1) or rest * r < 0:
        return "one point"
    return "mostly" if abs(rest) < abs(r) / 2 else "plain"


def _correlation(kind: str, stats: Mapping[str, Any]) -> str:
    """'<kind> r (n points, CI)', or that r rests on too few non-zero points to mean anything, or on
    few (under SPARSE or half the cells: stated on them with Spearman and the slope the summary holds, no
    interval that counts the zero cells as independent), or that one point carries it: r is significant,
    and without its largest cell it is not, flips sign, or falls to under half of |r| (the rest still
    significant: "mostly carried" by that cell)."""
    r, n, nonzero = _num(stats.get("pearson")), int(_num(stats.get("n")) or 0), _num(stats.get("n_nonzero"))
    case, rest = _case(stats), _num(stats.get("pearson_without_top"))
    if case == "few":
        return (f"{kind} r = {r:.3f} rests on {nonzero:.0f} non-zero exact effect(s) of {n} cells, "
                "so it says nothing about agreement")
    if case == "sparse":
        rho, slope, rho_nz = _num(stats.get("spearman")), _num(stats.get("slope")), _num(stats.get("spearman_nonzero"))
        spearman = (f"Spearman {rho_nz:.2f} over the {nonzero:.0f} non-zero cells ({rho:.2f} over all {n}, inflated by "
                    f"the {n - nonzero:.0f} tied zeros)" if rho_nz is not None and rho is not None
                    else f"Spearman {rho:.2f} over all {n} cells, {n - nonzero:.0f} of them tied at zero"
                    if rho is not None else "")
        extra = [spearman,
                 f"slope {slope:.2f}, attribution over exact" if slope is not None else "",
                 f"without its largest cell r = {rest:.3f}" if rest is not None and r is not None
                 and (rest * r < 0 or abs(rest) < abs(r) / 2) else "",
                 f"no interval for r or the slope: the other {n - nonzero:.0f} cells have no exact effect"]
        return f"{kind} r = {r:.3f} rests on its {nonzero:.0f} non-zero cells of {n} ({'; '.join(e for e in extra if e)})"
    if case == "plain":
        return f"{kind} r = {r:.3f} (n = {n} cells{_ci(fisher_interval(r, n), '.3f')})"
    without = f"without it r = {rest:.3f} (n = {n - 1} cells{_ci(fisher_interval(rest, n - 1), '.3f')})"
    if case == "one point":
        return f"{kind} r = {r:.3f} is driven by its largest cell: {without}, so the agreement rests on one point"
    return f"{kind} r = {r:.3f} is mostly carried by its largest cell: {without}, a much weaker agreement"


def _and(words: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _measured_only(s: Mapping[str, Any]) -> str:
    """At chance: which sites were patched, over how many examples and cells, without any site's share
    of the gap, any ranking or attribution patching's correlation with exact patching."""
    sites = sorted(set(s.get("top_sites") or {}) | set(s.get("attribution_correlation") or {}))
    corr = s.get("attribution_correlation") if isinstance(s.get("attribution_correlation"), Mapping) else {}
    cells = sum(int(_num(v.get("n")) or 0) for v in corr.values() if isinstance(v, Mapping))
    said = (f"Measured: exact activation patching ({s.get('direction', 'denoise')}, {s.get('n_examples', '?')} examples)"
            + (f" at {_and([k.replace('_', ' ') for k in sites])}" if sites else "")
            + (f", and attribution patching against it over {cells} cells" if cells else "")
            + "; no site is ranked and no agreement is read at chance.")
    trace = s.get("causal_tracing")
    ends = (_num(trace.get("clean_metric")), _num(trace.get("corrupted_metric"))) if isinstance(trace, Mapping) else (None,)
    if None not in ends:
        said += (f" Causal tracing: metric {trace['clean_metric']:.3g} on the clean prompts, {trace['corrupted_metric']:.3g} "
                 f"with the {trace.get('span', 'subject')} noised.")
    return said


def _effect_ci(cell: Mapping[str, Any], gap: float | None) -> str:
    """', 95% CI [lo, hi] over n examples' of a top site's effect (its recorded t interval over the
    per-example effects, divided by the gap when the finding states a share of it); '' without one."""
    ci, n = cell.get("ci"), _num(cell.get("n"))
    if not isinstance(ci, (list, tuple)) or len(ci) != 2 or any(_num(c) is None for c in ci):
        return f", n = {n:.0f} examples" if n else ""
    lo, hi = sorted((ci[0] / gap, ci[1] / gap)) if gap else (ci[0], ci[1])
    return f", 95% CI [{lo:.2f}, {hi:.2f}] over {n:.0f} examples" if n else f", 95% CI [{lo:.2f}, {hi:.2f}]"


def _where(kind: str, cell: Mapping[str, Any]) -> str:
    """'<kind> at layer l, position -k from the end' or '<kind> at LlHh' (a rank check's cell)."""
    head, end = cell.get("head"), cell.get("from_end")
    at = f"layer {cell.get('layer')}" if head is None else f"L{cell.get('layer')}H{head}"
    return f"{kind} at {at}" + (f", position {end} from the end" if isinstance(end, int) else "")


def _size(x: float, gap: float | None) -> str:
    return f"{x / gap:.2f} of the gap" if gap else f"{x:.3g}"


def _ranking(kind: str, stats: Mapping[str, Any], gap: float | None) -> str | None:
    """What a ranking by attribution patching gets wrong at one site type: its top exact site ranked below
    first (not said when that site is tied: another cell's exact effect lies within its 95% interval or the
    rounding floor, so there is no top to misrank; the rank already ignores attribution differences within
    the floor: rank_checks), and a large exact effect it misses (under 1/MISS of it); None when neither."""
    top, miss = stats.get("top_exact"), stats.get("missed")
    said = []
    under = f"under 1/{MISS:g} of it"
    if (isinstance(top, Mapping) and isinstance(top.get("attribution_rank"), int) and top["attribution_rank"] > 1
            and not top.get("tied")):
        same = isinstance(miss, Mapping) and all(miss.get(k) == top.get(k) for k in ("layer", "head", "pos"))
        said.append(f"the top exact site ({_where(kind, top).split(' at ', 1)[1]}: exact {_size(top['effect'], gap)}) "
                    f"ranks only {_ordinal(top['attribution_rank'])}, at {_size(top['attribution'], gap)}"
                    + (f", {under}" if same else ""))
        miss = None if same else miss
    if isinstance(miss, Mapping):
        said.append(f"it misses {_where(kind, miss).split(' at ', 1)[1]} (attribution {_size(miss['attribution'], gap)} "
                    f"against exact {_size(miss['effect'], gap)}: {under})")
    return "; ".join(said) or None


def _ordinal(k: int) -> str:
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def _offsets(places: Mapping[str, Any]) -> str:
    """'-8 from the end in 6 prompts and -11 in 2'."""
    items = sorted(((int(o), int(k)) for o, k in places.items()), key=lambda ok: (-ok[1], -ok[0]))  # most prompts first
    said = [f"{o} from the end in {k} prompt{'s' * (k != 1)}" if i == 0 else f"{o} in {k}" for i, (o, k) in enumerate(items)]
    return _and(said)


def _corrupted_token(s: Mapping[str, Any], gap: float | None) -> str | None:
    """The effect aligned on each prompt's corrupted token (its first position that differs from the clean
    prompt), named where it exceeds every end-aligned cell of its site type and layer (templates of different
    lengths put that token at different places from the end, and the end-aligned columns split its effect);
    where the token's place differs across prompts, that is said in any case."""
    info = s.get("at_corrupted_token")
    if not isinstance(info, Mapping) or not isinstance(info.get("sites"), Mapping):
        return None
    places = info.get("from_end") or {}
    split = len(places) > 1
    records = [(kind, r) for kind, rows in info["sites"].items() for r in rows if _num(r.get("effect")) is not None]
    if not records:
        return None
    kind, best = max(records, key=lambda kr: abs(kr[1]["effect"]))
    end = best.get("end_aligned") or {}
    larger = abs(best["effect"]) > 1.05 * abs(_num(end.get("effect")) or 0.0)
    token = "each prompt's first position that differs from its clean prompt"
    span = info.get("positions_differ")
    several = isinstance(span, (list, tuple)) and len(span) == 2 and all(_num(x) is not None for x in span) \
        and max(span) > 1  # review 6 (A9): the aligned token is the first of several that differ
    if several:
        count = f"{span[0]:.0f}" if span[0] == span[1] else f"{span[0]:.0f} to {span[1]:.0f}"
        token = f"{count} positions differ per prompt"
    name = "the first position where the prompts differ" if several else "the corrupted token"
    where = f"{token}, at {_offsets(places)}, so end-aligned cells split its effect" if split else token
    if not larger:
        return (f"{name[0].upper()}{name[1:]} ({token}) sits at {_offsets(places)}: end-aligned cells split its effect."
                if split else None)
    size = (f"{best['effect'] / gap:.2f} of the clean-corrupted gap" if gap else f"{best['effect']:.3g}") + _effect_ci(best, gap)
    other = (f" (the largest end-aligned cell of that layer, at {end['from_end']} from the end, "
             f"{_size(end['effect'], gap)})" if isinstance(end.get("from_end"), int) else "")
    return f"Aligned on {name} ({where}): {kind} at layer {best['layer']} moves {size}{other}."


ANSWER = "the answer position (-1 from the end, where the metric is read)"


def _sites(s: Mapping[str, Any], cells: list, gap: float | None, metric: str) -> list[str]:
    """The sentences on the top sites (cells: every (kind, record), largest |effect| first): the positions where
    clean and corrupted differ, once; the lead, where the information enters (the largest residual cell away from
    the answer position) when the metric is read at the last position, else the strongest cell; what reaches the
    answer position and the attention that writes it there; the residual cells there that carry the whole gap
    by construction, once (patching_sites.py); then the strongest cell of each site type not yet named."""
    differ = frozenset(differ_offsets(s))
    normalized = bool(s.get("normalized"))
    said = [differing_positions(s)]

    def name(kc: tuple) -> str:
        return _site(kc[1], kc[0], differ)

    def share(cell: Mapping[str, Any]) -> str:  # the effect as a share of the clean-corrupted gap (1 = fully restored)
        effect = cell["effect"]
        text = f"{effect / gap:.2f} of the clean-corrupted gap" if gap else f"{effect:.2f}"
        return text + _effect_ci(cell, gap) + (f" ({effect:+.3g} {metric})" if gap else "")

    def brief(kc: tuple) -> str:  # '<site> (0.86, 95% CI [..] over n examples)', and a tie with its type's next cell
        kind, c = kc
        return f"{name(kc)} ({c['effect'] / gap if gap else c['effect']:.2f}{_effect_ci(c, gap)})" + _tie(s, kc, gap)

    answer = s.get("metric_at_last_position", True) is not False  # older summaries: every default metric is
    whole = by_construction(cells, gap, normalized) if answer else []
    trivial = {_state(k, c) for k, c in whole}
    rest = [kc for kc in cells if _state(kc[0], kc[1]) not in trivial]
    enter = entering(rest, gap, normalized) if answer else None
    lead = enter or (rest or cells)[0]
    run = f"Patching ({s.get('direction', 'denoise')}, {s.get('n_examples', '?')} examples)"
    if enter:
        where = (", where the information enters (clean and corrupted differ there)," if depth(*lead) == 0
                 or lead[1].get("from_end") in differ else ",")
        said.append(f"Away from the answer position{where} {run[0].lower()}{run[1:]} moves the metric most at the "
                    f"{name(lead)}: {share(lead[1])}.")
    else:
        said.append(f"{run} moves the metric most at the {name(lead)}: {share(lead[1])}.")
    if gap and abs(cells[0][1]["effect"] / gap) < 0.05:
        said.append("No single site moves more than 5% of the gap: the effect is spread out or the task is not solved.")
    reach = reaching(rest, whole, gap, normalized) if answer else None
    write = writer(rest, gap, normalized) if answer else None
    it = "It" if enter else "The information"
    if reach and write:
        said.append(f"{it} has reached the answer position at the {brief(reach)}, moved there by attention: {brief(write)}.")
    elif reach or write:
        said.append(f"{it} has reached the answer position at the {brief(reach)}." if reach
                    else f"Attention moves it to the answer position: {brief(write)}.")
    if whole:
        first, kinds = whole[0], {k for k, _ in whole}
        layers = _and([str(c["layer"]) for _, c in whole]) if len(kinds) == 1 else ""
        also = "" if len(whole) == 1 else (f"; on this run at {first[0]} layers {layers}" if layers else
                                            "; on this run at " + _and([f"{k} at layer {c['layer']}" for k, c in whole]))
        said.append(f"The residual stream at {ANSWER} carries the whole gap from the {first[0]} at layer "
                    f"{first[1]['layer']} on ({share(first[1])}{also}): once the information has arrived there this "
                    "holds by construction (every later computation at that position reads it; only later attention from "
                    "other positions goes around it), so it says nothing about where the information enters or how it "
                    "moves.")
    named = [kc for kc in (lead, reach, write) if kc] + whole
    seen = {"resid" if k in RESIDUAL or k == "resid_mid" else k for k, _ in named}
    runners = []
    for kind, c in _distinct_sites([kc for kc in rest if all(kc[1] is not x[1] for x in named)]):
        family = "resid" if kind in RESIDUAL or kind == "resid_mid" else kind
        if family not in seen and len(runners) < 2:
            seen.add(family)
            runners.append(brief((kind, c)))
    if runners:
        said.append("Next, at other sites: " + "; ".join(runners) + ".")
    return [x for x in said if x]


def _tie(s: Mapping[str, Any], kc: tuple, gap: float | None) -> str:
    """', tied with <its site type's next cell> (share, CI)' where the two are within each other's 95% intervals."""
    kind, cell = kc
    rows = [c for c in (s.get("top_sites") or {}).get(kind) or [] if _num(c.get("effect")) is not None]
    at = next((i for i, c in enumerate(rows) if c is cell), None)
    if at is None or at + 1 >= len(rows) or not tied(cell, rows[at + 1]):
        return ""
    other = rows[at + 1]
    return (f", tied with {_where(kind, other).split(' at ', 1)[1]} ({other['effect'] / gap if gap else other['effect']:.2f}"
            f"{_effect_ci(other, gap)})")


def finding(s: Mapping[str, Any]) -> str:
    """The strongest patching sites, attribution patching's agreement and causal tracing's peaks; at
    chance the clean and corrupted metrics and what was measured only."""
    if "skipped" in s:
        return f"Skipped: {s['skipped']}"
    parts = []
    clean, corrupt = _num(s.get("clean_metric")), _num(s.get("corrupted_metric"))
    gap = None if s.get("normalized") or clean is None or corrupt is None or clean == corrupt else clean - corrupt
    metric = _words(s.get("metric", ""))
    if gap is not None:
        parts.append(f"Clean prompts give a {metric} of {clean:.3g}, corrupted ones {corrupt:.3g}.")
        if _at_chance(s, s.get("metric"), clean):
            parts.append("The model is at chance on the clean prompts (logit difference near 0): there is no behaviour to "
                         "restore, so the patching maps show noise.")
    if _chance(s) is not None:  # shares of a gap between two chance-level metrics are noise: what was measured only
        return " ".join(parts + [_measured_only(s)])
    top = s.get("top_sites") or {}
    cells = [(kind, c) for kind, rows in top.items() for c in rows if _num(c.get("effect")) is not None]
    small = s.get("gap_within_noise")
    if isinstance(small, Mapping) and cells:  # a share of a gap that is noise is not a measurement
        cells = []
        parts.append(f"The clean-corrupted gap is within noise ({small.get('reason', 'no reason recorded')}): effects "
                     "normalised by it (shares of the gap) are not meaningful, so no site is ranked.")
    if cells:
        cells.sort(key=lambda kc: -abs(kc[1]["effect"]))
        parts.extend(_sites(s, cells, gap, metric))
        aligned = _corrupted_token(s, gap)
        if aligned:
            parts.append(aligned)
    corr = s.get("attribution_correlation")
    if isinstance(corr, Mapping):
        said = [_correlation(k, v) for k, v in corr.items() if isinstance(v, Mapping) and _num(v.get("pearson")) is not None]
        if said:
            parts.append("Attribution patching vs exact (Pearson r): " + "; ".join(said) + ".")
            rank = bool(cells)  # sites are ranked (not at chance, nor over a gap within noise)
            wrong = {k: _ranking(k, v, gap) for k, v in corr.items() if isinstance(v, Mapping)} if rank else {}
            wrong = {k: w for k, w in wrong.items() if w}
            slopes = [_slope(k, v, rank and k not in wrong) for k, v in corr.items() if isinstance(v, Mapping)
                      and _num(v.get("pearson")) is not None and _case(v) == "plain"]
            slopes = [x for x in slopes if x]
            parts.append(" ".join(slopes) if slopes
                         else "A high r can hide a scale error: see the per-site slopes in the figure.")
            if wrong:
                parts.append("Ranked by attribution patching, sites come out wrong: " + "; ".join(
                    f"at {k}, {w}" for k, w in wrong.items()) + ". Do not rank sites by it on this model at "
                    + _and(list(wrong)) + ".")
    trace = s.get("causal_tracing")
    if isinstance(trace, Mapping):
        clean, corrupt = _num(trace.get("clean_metric")), _num(trace.get("corrupted_metric"))
        if clean is not None and corrupt is not None:
            n = trace.get("n_examples")
            parts.append(f"Causal tracing: noising the {trace.get('span', 'subject')} drops the metric from {clean:.3g} "
                         f"to {corrupt:.3g}" + (f" (mean over {n} prompts)." if n is not None else "."))
    return " ".join(parts)
