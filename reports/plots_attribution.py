"""Figures of the attribution analysis: tau distributions, token heatmap, permutation and
adversarial-attention scatters, HTML.

reports/plots.py's convention: `plot_<what>(data, *, ax=None, ...) -> Axes` over the Result's tidy
tables; `figures(result)` returns the analysis's figures by file stem; `token_html` renders token
highlighting with every string escaped.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import seaborn as sns

from headscope.analyses.core.result import Result
from headscope.errors import ConfigError
from headscope.reports.plots import axes, color_scale, label

NON_ATTENTION = ("saliency", "grad_x_input", "integrated_gradients", "leave_one_out")
HEATMAP_ROWS = ("last_layer", "rollout", *NON_ATTENTION)


def plot_tau(data: pd.DataFrame, *, attention: Sequence[str] = ("last_layer", "rollout"), ax=None):
    """Box plot of per-example Kendall tau (`data`: the Result's df) for each (attention kind, method) pair."""
    ax = axes(ax, (8, 4))
    df = data[data.attention.isin(attention)].dropna(subset=["tau"])
    words = {"saliency": "saliency", "grad_x_input": "gradient x input", "integrated_gradients": "integrated\ngradients",
             "leave_one_out": "leave-one-out"}
    df = df.assign(method=df["method"].map(lambda m: words.get(m, m)),
                   attention=df["attention"].map(lambda a: {"last_layer": "last layer", "rollout": "rollout"}.get(a, a)))
    sns.boxplot(data=df, x="method", y="tau", hue="attention", ax=ax)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small", title="attention")
    ax.axhline(0, color="grey", lw=0.8, ls="--")
    ax.set_ylim(-1.05, 1.05)
    ax.set_xlabel("method compared with attention")
    ax.set_ylabel("Kendall tau (per example)")
    ax.set_title("Agreement of attention with other attributions")
    return ax


def plot_token_heatmap(data: pd.DataFrame, *, example: int | None = None, ax=None):
    """Rows: methods; columns: the ranked tokens of one example (`data`: the scores table); cells:
    normalised importance, on a sequential map from 0 when every score is >= 0, else diverging about 0."""
    example = int(data.example.iloc[0]) if example is None else example
    one = data[(data.example == example) & data.method.isin(HEATMAP_ROWS)]
    if one.empty:
        raise ConfigError(f"No scores for example {example}; choose one of {sorted(data.example.unique())[:10]}...")
    grid = one.pivot_table(index="method", columns="position", values="score").reindex(
        [m for m in HEATMAP_ROWS if m in set(one.method)])
    labels = one.drop_duplicates("position").set_index("position").token.reindex(grid.columns)
    ax = axes(ax, (max(6, 0.3 * grid.shape[1]), 3))
    sns.heatmap(grid, ax=ax, **color_scale(grid.to_numpy(dtype=float)), xticklabels=[label(t) for t in labels],
                cbar_kws={"label": "share of importance"})
    ax.set_xlabel("token")
    ax.set_ylabel("")
    ax.set_title(f"Token importance by method, example {example}")
    return ax


def plot_permutation(data: pd.DataFrame, *, output_change: str = "change", ax=None):
    """Median output change over attention permutations against the maximum attention weight
    (`data`: the permutation table)."""
    ax = axes(ax, (6, 4))
    sns.scatterplot(data=data, x="max_attention", y="median_change", ax=ax)
    layer = int(data.layer.iloc[0]) if len(data) else -1
    ax.set_xlabel(f"max attention (layer {layer}, head mean)")
    ax.set_ylabel(f"median output {output_change} over permutations")
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
    plots = [("tau", lambda: plot_tau(result.df)), ("token_heatmap", lambda: plot_token_heatmap(result.tables["scores"])),
             ("permutation", lambda: plot_permutation(perm, output_change=s.get("output_change", "change")))]
    if "adversarial_jsd" in perm:
        plots.append(("adversarial", lambda: plot_adversarial(perm, epsilon=s.get("adversarial_epsilon", "epsilon"))))
    out = {}
    for stem, draw in plots:
        ax = draw()
        ax.figure.tight_layout()
        out[stem] = ax.figure
    return out


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


__all__ = ["plot_tau", "plot_token_heatmap", "plot_permutation", "plot_adversarial", "figures", "token_html", "example_html"]
