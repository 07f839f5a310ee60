"""Figures of the kv analysis: metric against cache budget, K/V norms by position, sink mass."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns


def eviction_plot(df: pd.DataFrame, ax=None):
    """The Task metric (mean, 95% CI over examples) against the cache budget, one line per policy."""
    ax = ax or plt.gca()
    evicted = df[df.policy != "full"]
    sns.lineplot(data=evicted, x="budget", y="metric", hue="policy", style="policy", markers=True, ax=ax)
    full = df[df.policy == "full"].metric.mean()
    ax.axhline(full, color="grey", ls="--", lw=1, label="full cache")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="cache budget (context positions kept)", ylabel="task metric at the answer", title="Eviction what-if")
    ax.legend()
    return ax


def norms_plot(norms: pd.DataFrame, ax=None, kind: str = "key"):
    """Mean norm of the cached keys (or values) by position, one line per layer (mean over KV heads)."""
    ax = ax or plt.gca()
    sns.lineplot(data=norms[norms.kind == kind], x="position", y="norm", hue="layer", errorbar=None, ax=ax, palette="viridis")
    ax.set(title=f"Cached {kind} norms", ylabel=f"||{kind[0]}||")
    return ax


def sinks_plot(sinks: pd.DataFrame, ax=None):
    """Attention mass on the first position per layer against its uniform baseline."""
    ax = ax or plt.gca()
    long = sinks.melt(id_vars="layer", value_vars=["sink_mass", "uniform_mass"], var_name="", value_name="mass")
    sns.barplot(data=long, x="layer", y="mass", hue="", ax=ax)
    ax.set(title="Attention sink: mass on the first position", ylabel="attention mass")
    return ax


def figures(result, **kwargs) -> dict:
    """{file stem: Figure} for a kv Result."""
    out = {}
    for stem, draw in (("kv_eviction", lambda ax: eviction_plot(result.df, ax)),
                       ("kv_norms", lambda ax: norms_plot(result.tables["norms"], ax)),
                       ("kv_sinks", lambda ax: sinks_plot(result.tables["sinks"], ax))):
        fig, ax = plt.subplots(figsize=(6, 4))
        draw(ax)
        fig.tight_layout()
        out[stem] = fig
    return out
