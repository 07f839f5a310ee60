"""Figures of the attribution analysis: tau distributions, token heatmap, permutation and
adversarial-attention scatters, HTML.

reports/plots.py's convention: `plot_<what>(data, *, ax=None, ...) -> Axes` over the Result's tidy
tables; `figures(result)` returns the analysis's figures by file stem; `token_html` renders token
highlighting with every string escaped.

This module is the family's whole presentation (reports/families.py): after the figures, `GUIDE`
(how to read its section), `CAPTIONS` (each figure's, by stem) and `finding(summary)`, its headline
(reports/attribution_words.py).
"""
from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import seaborn as sns

from headscope.analyses.attribution.convergence import ig_use
from headscope.analyses.core.result import Result
from headscope.errors import ConfigError
from headscope.reports.attribution_words import finding as finding  # the headline: families.py reads it here
from headscope.reports.attribution_words import gradient_rounds, loo_rounds
from headscope.reports.findings import FEW, _chance, _num, t_interval
from headscope.reports.plots import axes, color_scale, hatch_cells, laid_out, token_label

# the scores table ranks every token but these two (analyses/attribution/analysis.py): the first is
# BOS / [CLS] (or, with no BOS in front, the prompt's own first token) and the last the token that predicts
# (or [SEP]); the integrated-gradients baseline keeps
# both, so IG cannot score them, and the first is usually the attention sink that would top attention's ranking
SKIPPED = "first and last left out: BOS/[CLS] (else the prompt's first token) and the predicting token/[SEP]"
NON_ATTENTION = ("saliency", "grad_x_input", "integrated_gradients", "leave_one_out")
HEATMAP_ROWS = ("last_layer", "rollout", *NON_ATTENTION)


CLIPPED = "95% t CI clipped at ±1\n(arrowhead: it runs past)"


def plot_tau(data: pd.DataFrame, *, attention: Sequence[str] = ("last_layer", "rollout"),
             muted: Mapping[str, str] | None = None, ax=None):
    """Per-example Kendall tau (`data`: the Result's df) for each (attention kind, method) pair: box plots when
    every group has at least FEW examples; with fewer (quartiles and "outliers" of 4 points mean nothing) the
    points themselves, with their mean and its 95% t interval. `muted`: {method: why} for the methods the finding
    leaves out of its taus (review 14c B2: leave-one-out's rounding ties), drawn under a hatched grey veil, their
    tick label greyed with the reason."""
    ax = axes(ax, (8 + 0.5 * bool(muted), 4))
    df = data[data.attention.isin(attention)].dropna(subset=["tau"])
    words = {"saliency": "saliency", "grad_x_input": "gradient x input", "integrated_gradients": "integrated\ngradients",
             "leave_one_out": "leave-one-out"}
    df = df.assign(method=df["method"].map(lambda m: words.get(m, m)),
                   attention=df["attention"].map(lambda a: {"last_layer": "last layer", "rollout": "rollout"}.get(a, a)))
    sizes = df.groupby(["method", "attention"]).size()
    if len(sizes) and sizes.min() >= FEW:
        with warnings.catch_warnings():  # seaborn 0.13 passes boxplot's vert=, which Matplotlib 3.11 deprecates: not the
            warnings.filterwarnings("ignore", message=".*vert: bool", category=DeprecationWarning)  # user's (12c C4)
            warnings.filterwarnings("ignore", message=".*vert: bool", category=PendingDeprecationWarning)
            sns.boxplot(data=df, x="method", y="tau", hue="attention", ax=ax)
        title = "attention"
    else:
        _points_with_means(df, ax)
        title = f"attention (dots: examples;\ndiamond, bar: mean, 95% t CI;\nn = {sizes.min() if len(sizes) else 0}"
        title += f"-{sizes.max()})" if len(sizes) and sizes.max() != sizes.min() else ")"
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small", title=title, title_fontsize="small")
    _veil(ax, {words.get(m, m): why for m, why in (muted or {}).items()})
    ax.axhline(0, color="grey", lw=0.8, ls="--")
    ax.set_ylim(-1.05, 1.05)
    ax.set_xlabel("method compared with attention")
    ax.set_ylabel("Kendall tau (per example)")
    ax.set_title("Agreement of attention with other attributions")
    return ax


def _veil(ax, muted: Mapping[str, str]) -> None:
    """A hatched grey veil over each muted method's group of ticks (`muted`: {tick text: why}), its tick label greyed
    with the reason under it (gid "muted"): drawn, so the reader sees what was measured, but marked as not read."""
    labels = ax.get_xticklabels()
    texts = [t.get_text() for t in labels]
    for j, text in enumerate(texts):
        if text in muted:
            ax.axvspan(j - 0.48, j + 0.48, facecolor="white", alpha=0.65, hatch="//", edgecolor="0.6", linewidth=0,
                       zorder=5, gid="muted")
    if any(t in muted for t in texts):
        ax.set_xticks(range(len(texts)), [f"{t}\n({muted[t]})" if t in muted else t for t in texts])
        for t in ax.get_xticklabels():
            if t.get_text().split("\n")[0] in muted:
                t.set_color(MUTED)


def _points_with_means(df: pd.DataFrame, ax) -> None:
    """Each group's taus as points (spread a little in x, in a fixed pattern) and its mean with the 95% t interval
    beside them, clipped to [-1, 1] (a tau's range; the finding's text clips it too) with an arrowhead at a clipped
    end (review 8 B3: with n = 3 the bar ran off the panel); methods along x in order of appearance, attention
    kinds side by side in colours C0, C1, ..."""
    methods, kinds = list(dict.fromkeys(df.method)), list(dict.fromkeys(df.attention))
    width = 0.8 / max(1, len(kinds))
    clipped = False  # any clipped end: one legend entry for them, after the kinds
    for i, kind in enumerate(kinds):
        for j, method in enumerate(methods):
            tau = df[(df.attention == kind) & (df.method == method)].tau.to_numpy(dtype=float)  # [examples]
            if not tau.size:
                continue
            centre = j + (i - (len(kinds) - 1) / 2) * width
            spread = np.linspace(-0.15, 0.15, tau.size) * width if tau.size > 1 else np.zeros(1)
            ax.scatter(centre - 0.1 * width + spread, tau, s=18, color=f"C{i}", alpha=0.6, edgecolor="none",
                       label=kind if j == 0 else None)
            interval = t_interval(float(tau.mean()), float(tau.std(ddof=1)) if tau.size > 1 else None, tau.size)
            x = centre + 0.3 * width
            err = None
            if interval is not None:  # a tau lies in [-1, 1]: the bar is clipped there, as the finding's text does
                lo, hi = max(-1.0, interval[0]), min(1.0, interval[1])
                err = [[tau.mean() - lo], [hi - tau.mean()]]
                for end, cut, marker in ((1.0, interval[1] > 1.0, "^"), (-1.0, interval[0] < -1.0, "v")):
                    if cut:  # an arrowhead at the clipped end: the t interval runs past it
                        ax.scatter([x], [end], marker=marker, s=40, color=f"C{i}", edgecolor="black", linewidth=0.6,
                                   zorder=4, gid="clipped")
                        clipped = True
            ax.errorbar([x], [tau.mean()], yerr=err, fmt="D", color=f"C{i}", ms=6, capsize=4,
                        lw=1.5, mec="black", mew=0.6)
    if clipped:  # a grey proxy: the arrowheads carry their group's colour
        ax.scatter([], [], marker="^", s=40, color="0.6", edgecolor="black", linewidth=0.6, label=CLIPPED, gid="clipped")
    ax.set_xticks(range(len(methods)), methods)


def plot_token_heatmap(data: pd.DataFrame, *, example: int | None = None, ax=None):
    """Rows: methods; columns: the ranked tokens of one example (`data`: the scores table: every token
    but the first and the last, which the analysis leaves out of every ranking, see SKIPPED); cells:
    each method's share of importance (>= 0, summing to 1 over the row) on the sequential map from 0."""
    example = int(data.example.iloc[0]) if example is None else example
    one = data[(data.example == example) & data.method.isin(HEATMAP_ROWS)]
    if one.empty:
        raise ConfigError(f"No scores for example {example}; choose one of {sorted(data.example.unique())[:10]}...")
    grid = one.pivot_table(index="method", columns="position", values="score").reindex(
        [m for m in HEATMAP_ROWS if m in set(one.method)])
    labels = one.drop_duplicates("position").set_index("position").token.reindex(grid.columns)
    ax = axes(ax, (max(6, 0.3 * grid.shape[1]), 3))
    sns.heatmap(grid, ax=ax, **color_scale(grid.to_numpy(dtype=float), is_signed=False),
                xticklabels=[token_label(t) for t in labels], cbar_kws={"label": "share of importance (0-1)"})
    ax.set_xlabel(f"token ({SKIPPED})")
    ax.set_ylabel("")
    ax.set_title(f"Token importance by method, example {example}")
    if "masked" in one:  # review 9a A3: a sliding window's structural zeros are not "0 importance"
        masked = one.pivot_table(index="method", columns="position", values="masked", aggfunc="max").reindex(
            index=grid.index, columns=grid.columns).fillna(False).astype(bool).to_numpy()
        hatch_cells(ax, masked)
        if masked.any():
            ax.set_title(f"Token importance by method, example {example}\n(hatched grey: outside the last layer's "
                         "sliding window, 0 by the mask)", fontsize=9)
    return ax


CHANGE_WORDS = {"tvd": "total variation distance, 0-1", "1-cosine": "1 - cosine similarity, 0-2"}


def _power_of_ten(peak: float) -> int:
    """The exponent k to write an axis as value / 10^k when its largest |value| is under 0.01 (0 otherwise),
    so tick labels are plain numbers and the label states the factor (no offset text in the corner)."""
    return int(np.floor(np.log10(peak))) if 0 < peak < 0.01 else 0


def _bound(saturated: Mapping[str, Any] | None) -> float | None:
    """The saturation record's bound on the TVD a change of one logit can cause (permutation.saturation's
    tvd_per_logit), when the summary says most outputs are saturated; None otherwise or when malformed."""
    if not isinstance(saturated, Mapping) or saturated.get("is_saturated") is not True:
        return None
    value = _num(saturated.get("tvd_per_logit"))
    return value if value is not None and np.isfinite(value) and value > 0 else None


def _floor(rounding: Mapping[str, Any] | None) -> float | None:
    """The summary's permutation_rounding_floor's floor (a 1 - cosine), None when absent or malformed."""
    value = _num(rounding.get("floor")) if isinstance(rounding, Mapping) else None
    return value if value is not None and np.isfinite(value) and value > 0 else None


HEADROOM = 1.1  # the y axis's top over its highest point (review 11a B5: the top point was cut in half)
VISIBLE = 0.01  # the rounding band is drawn where it is at least this share of the highest point


def plot_permutation(data: pd.DataFrame, *, output_change: str = "change", saturated: Mapping[str, Any] | None = None,
                     rounding: Mapping[str, Any] | None = None, ax=None):
    """Median output change over attention permutations against the maximum attention weight
    (`data`: the permutation table). The y axis is in the change's own units from 0, its factor written
    in the axis label when the values are tiny (never matplotlib's offset text, which reads as part of the
    value). `saturated` (the summary's record, permutation.saturation): where most outputs are saturated,
    the most TVD a change of one logit can cause, e x the median 1 - p(top token), is drawn as a line:
    points under it are what a saturated output allows, not evidence that the layer does nothing. `rounding`
    (the summary's permutation_rounding_floor, encoders): the 1 - cosine under which a change is rounding of the
    cosine in its dtype, shaded from 0 where it is at least VISIBLE of the highest point (review 11a B1: four
    float32 ulps were stretched to the axis's height as if a trend). The top of the axis sits HEADROOM over the
    highest point or line, so none is cut."""
    from matplotlib.ticker import FuncFormatter

    bound = _bound(saturated) if output_change == "tvd" else None
    floor = _floor(rounding) if output_change == "1-cosine" else None
    highest = float(np.nanmax(data["median_change"].to_numpy(dtype=float))) if len(data) else 0.0
    if floor is not None and floor < VISIBLE * highest:  # a band too thin to see at this scale: no band, no key
        floor = None
    ax = axes(ax, (6 + 3 * (bound is not None or floor is not None), 4))  # room for a key beside the data
    if floor is not None:
        dtype = rounding.get("dtype", "?")
        ax.axhspan(0.0, floor, color="0.85", zorder=0, gid="rounding",
                   label=f"within {dtype} rounding:\n1 - cosine under {rounding.get('ulps', '?')} rounding\n"
                         f"steps of a cosine near 1\n({floor:.2g})")
    sns.scatterplot(data=data, x="max_attention", y="median_change", ax=ax)
    if bound is not None:
        headroom = _num(saturated.get("median_headroom"))
        said = f"e x median 1 - p(top) = e x {headroom:.2g}" if headroom is not None else "e x median 1 - p(top)"
        ax.axhline(bound, color="C3", lw=1, ls="--",
                   label=f"saturated output: a change of up to\n1 logit in the top token's odds moves\nthe TVD by at most "
                         f"{bound:.2g}\n({said})")
    if bound is not None or floor is not None:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="x-small")
    values = data["median_change"].to_numpy(dtype=float) if len(data) else np.zeros(0)
    finite = np.abs(values[np.isfinite(values)])
    peak = max([float(finite.max()) if finite.size else 0.0, bound or 0.0, floor or 0.0])
    k = _power_of_ten(peak)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 10.0 ** k:.3g}"))  # no offset text
    if finite.size and (values[np.isfinite(values)] >= 0).all() and peak > 0:
        ax.set_ylim(0.0, HEADROOM * peak)  # a distance: from 0, with room over its highest point
    layer = int(data.layer.iloc[0]) if len(data) else -1
    unit = CHANGE_WORDS.get(output_change, output_change)
    ax.set_xlabel(f"max attention (layer {layer}, head mean)")
    ax.set_ylabel(f"median {output_change} over permutations\n({unit})" + (f"\ntick values x 1e{k}" if k else ""))
    ax.set_title("Permuting attention weights")
    return ax


def plot_adversarial(data: pd.DataFrame, *, epsilon: float | str = "epsilon", ax=None):
    """Jain & Wallace's adversarial attention (`data`: the permutation table): the largest JSD from the
    model's attention found with the output change within `epsilon`, against the maximum attention weight."""
    if "adversarial_jsd" not in data:
        raise ConfigError("This result has no adversarial attention (it ran with adversarial_steps=0).")
    ax = axes(ax, (6, 4))
    sns.scatterplot(data=data, x="max_attention", y="adversarial_jsd", ax=ax)
    ax.axhline(np.log(2), color="grey", lw=0.8, ls="--", label="ln 2 (maximum JSD)")
    ax.set_ylim(-0.02, 0.72)
    layer = int(data.layer.iloc[0]) if len(data) else -1
    ax.set_xlabel(f"max attention (layer {layer}, head mean)")
    ax.set_ylabel("JSD of adversarial attention (nats)")
    ax.set_title(f"Adversarial attention with output change <= {epsilon}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")  # off the data
    return ax


def figures(result: Result, **kwargs) -> dict:
    """The attribution figures by file stem."""
    s, perm = result.summary, result.tables["permutation"]
    rule = ig_use(s)  # an example whose IG did not converge is not drawn as IG's ranking (the finding says so)
    df, scores = rule.rows(result.df), rule.rows(result.tables["scores"])

    def tau():
        ax = plot_tau(df, muted=loo_muted(s))
        said = {"none": "\n(integrated gradients left out: it did not converge)",
                "converged": f"\n(integrated gradients: its {rule.n_converged} converged examples only)"}.get(rule.mode, "")
        ax.set_title(ax.get_title() + said)
        return ax

    def noted(draw):  # what the finding withholds, or reads with a caveat, the figure says too (review 13b B1)
        def drawn():
            ax = draw()
            if note := withheld_note(s, short=True):
                ax.set_title(f"{ax.get_title()}\n({note})")
                if _chance(s) is not None:
                    ax.title.set_color(MUTED)
            return ax
        return drawn

    plots = [("tau", tau), ("token_heatmap", lambda: plot_token_heatmap(scores)),
             ("permutation", lambda: plot_permutation(perm, output_change=s.get("output_change", "change"),
                                                      saturated=s.get("saturated"),
                                                      rounding=s.get("permutation_rounding_floor")))]
    if "adversarial_jsd" in perm:
        plots.append(("adversarial", lambda: plot_adversarial(perm, epsilon=s.get("adversarial_epsilon", "epsilon"))))
    out = {}
    for stem, draw in plots:
        ax = noted(draw)()
        if stem == "token_heatmap":
            _fit_heatmap_text(ax)
        out[stem] = laid_out(ax)
    return out


def _fit_heatmap_text(ax: Any) -> None:
    """Review 17c C1: the heatmap's title of up to three lines (the window's hatch note, the at-chance note) ran over
    its colour bar, whose label ran up into it: the title re-wrapped to the map's width (plots.fit_title), then the bar's
    label wrapped to the bar's height, the figure growing where it cannot (plots.fit_bar_label)."""
    from headscope.reports.plots import fit_bar_label, fit_title

    fit_title(ax)
    bars = [other for other in ax.figure.axes if other is not ax and other.yaxis.label.get_text()]
    for bar in bars:
        fit_bar_label(bar)


def token_html(tokens: Sequence[str], scores: Sequence[float], *, label: str = "") -> str:
    """One line of tokens on a diverging colour map centred on 0 (red positive, blue negative, opacity
    |score| / max |score|; tokens_view.token_line). Every token string (and the label) is HTML-escaped,
    so tokens like `<script>` show as text."""
    from headscope.reports.tokens_view import token_line

    return token_line(list(tokens), list(scores), label=label)


def example_html(result: Result, *, example: int | None = None, methods: Sequence[str] = HEATMAP_ROWS) -> str:
    """Token highlighting of one example's ranked tokens (the scores table: the first and last tokens
    are not ranked), one line per method; `hs.show_tokens(result)` shows every token's raw scores."""
    scores = result.tables["scores"]
    example = int(scores.example.iloc[0]) if example is None else example
    lines = []
    for method in methods:
        one = scores[(scores.example == example) & (scores.method == method)].sort_values("position")
        if len(one):
            lines.append(token_html(list(one.token), list(one.score), label=method))
    return "\n".join(lines)


PERMUTATION_CAPTIONS = {  # the permutation caption by the summary's output_change (review 11a B2)
    "tvd": "Per example: median output change (total variation distance of the next-token distribution, 0-1) when the "
           "layer's attention is permuted, against its maximum attention weight. Where the output is saturated (the "
           "finding says so), a change of up to one logit in the top token's odds keeps the distance under the red "
           "dashed line: a point under it cannot tell an effect from none, a point above it shows the layer moving the "
           "output. Read the finding's change of the task metric too.",
    "1-cosine": "Per example: median output change (1 - cosine of the pooled embedding with the unpermuted one, 0-2) "
                "when the layer's attention is permuted, against its maximum attention weight. Where the points come "
                "near the cosine's rounding in the dtype it was computed in, a grey band from 0 marks it: points "
                "inside it are rounding, not an effect of the layer.",
}


MUTED = "0.45"  # the title of a figure whose numbers the finding withholds


def loo_muted(s: Mapping[str, Any]) -> dict[str, str]:
    """{"leave_one_out" / "grad_x_input": why} where the finding leaves it out of its taus because most of its scores are
    rounding ties (attribution_words.loo_rounds; review 14c B2: tau.png drew it like the other methods), else {}."""
    out = {}
    for method, key, rounds in (("leave_one_out", "loo_rounding", loo_rounds(s)),
                                ("grad_x_input", "gradient_rounding", gradient_rounds(s))):  # review 18e A1
        if rounds:
            entry = s[key]
            k, m = _num(entry.get("n_within")), _num(entry.get("n_scores"))
            count = f"{k:.0f} of {m:.0f} " if k is not None and m is not None else "most "
            out[method] = f"not read:\n{count}scores\nare rounding ties"
    return out


def withheld_note(s: Mapping[str, Any], *, short: bool = False) -> str:
    """What the finding does with the numbers these figures draw, where it does not read them plainly (review 13b B1:
    tau.png drew the taus the finding withheld, with intervals clear of 0, and no word about it): at chance 'not read:
    the finding withholds these (the model is at chance on task t, n examples)'; too wide to tell (chance's
    "undetermined") 'read with a caveat: n examples cannot tell the model from chance on task t'; '' otherwise."""
    entry = s.get("chance") if isinstance(s, Mapping) else None
    if not isinstance(entry, Mapping):
        return ""
    n, task = _num(entry.get("n_examples")), entry.get("task")
    on = f" on task {task}" if isinstance(task, str) and task else ""
    count = f", {n:.0f} examples" if n is not None else ""
    if _chance(s) is not None:
        where = "below" if entry.get("below_chance") is True else "at"
        return (f"not read: the finding withholds these (model {where} chance{on}{count})" if short else
                f"Not read: the finding withholds what this figure draws, since the model is {where} chance{on}{count}; "
                "intervals clear of 0 here are not findings.")
    if entry.get("undetermined") is True and n is not None:
        return (f"read with a caveat: {n:.0f} examples cannot tell the model from chance{on}" if short else
                f"Read with a caveat: {n:.0f} examples cannot tell the model from chance{on} (the finding says so).")
    return ""


def caption_for(stem: str, summary: Mapping[str, Any] | None) -> str | None:
    """A figure's caption for this run's summary where it depends on it (the permutation figure's units follow the
    summary's output_change; every figure opens with what the finding withholds or reads with a caveat,
    withheld_note), else None (CAPTIONS' then holds)."""
    if not isinstance(summary, Mapping):
        return None
    own = PERMUTATION_CAPTIONS.get(summary.get("output_change")) if stem == "permutation" else None
    note = withheld_note(summary)
    if note and stem in CAPTIONS:
        return f"{note} {own or CAPTIONS[stem]}"
    return own


__all__ = ["plot_tau", "plot_token_heatmap", "plot_permutation", "plot_adversarial", "figures", "token_html", "example_html",
           "GUIDE", "CAPTIONS", "caption_for", "finding"]


# Presentation (reports/families.py): the guide, the captions and the finding in words.

GUIDE = (  # how to read this section of the report
    "Does attention explain the prediction? For each example, token importance by attention, "
    "rollout, gradients, integrated gradients and leave-one-out, and Kendall's tau between "
    "attention and each other method (Jain & Wallace 2019). Weak tau and small output changes "
    "under permuted attention mean attention weights are a poor stand-in for importance; so does "
    "adversarial attention with a JSD near ln 2 (the maximum) that leaves the output unchanged."
)
CAPTIONS = {  # what to read from each figure and its units, by figure stem
    "tau": "Kendall tau (-1 to 1) per example between attention and each other attribution; 0 is no agreement. "
           "Box plots from 10 examples per box; with fewer, each example's tau as a dot and the mean (diamond) with its "
           "95% t interval, clipped to [-1, 1] as in the finding (an arrowhead marks an end where the interval runs past). "
           "A method under a hatched grey veil is drawn but not read: the finding leaves it out (leave-one-out or "
           "gradient x input where most of its scores are rounding ties, so its taus would rank rounding).",
    "token_heatmap": "One example: each method's share of importance per token (rows sum to 1 over the tokens "
                     "shown). The first token (the BOS or [CLS] where prompts start with one, else the prompt's own first "
                     "token) and the last (the one that predicts, or [SEP]) are not "
                     "shown: the analysis leaves them out of every ranking, since the integrated-gradients baseline "
                     "keeps them (IG cannot score them) and the first is usually an attention sink, which would top "
                     "attention's ranking for a reason no other method shares. On a model whose last layer slides, hatched grey "
                     "cells are tokens outside its window: 0 by the mask, not measured as unimportant.",
    "permutation": "Per example: median output change when the layer's attention is permuted, against its maximum "
                   "attention weight, in the units the y axis names: on a decoder the total variation distance of the "
                   "next-token distribution (0-1), on an encoder 1 - cosine of the pooled embedding with the unpermuted "
                   "one (0-2). On a decoder whose output is saturated (the finding says so) a change of up to one logit keeps "
                   "the distance near 0, so a point near 0 cannot tell an effect from none (a point well above it still "
                   "shows one): read the finding's change of the task metric too. On an encoder whose "
                   "points come near the cosine's rounding, a grey band from 0 marks it.",
    "adversarial": "Per example: the largest Jensen-Shannon divergence (nats, max ln 2) from the model's attention found "
                   "while the output stays within epsilon; a saturated output stays within it under almost any attention.",
}
