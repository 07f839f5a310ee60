"""Figures of the kv analysis: metric against cache budget, K/V norms by position, sink mass.

reports/plots.py's convention: `plot_<what>(data, *, ax=None, ...) -> Axes` over the Result's tidy tables.

The eviction band is a bootstrap over examples with a fixed seed, so equal Results give byte-identical PNGs."""
from __future__ import annotations

import pandas as pd
import seaborn as sns

from headscope.reports.plots import axes

UNITS = {"logit_diff": "logit difference (logits)", "logprob": "answer log-probability (nats)",
         "accuracy": "accuracy (0-1)"}


def plot_eviction(data: pd.DataFrame, *, metric: str | None = None, ax=None):
    """The Task metric (`data`: the Result's df; mean, seeded bootstrap 95% CI over examples) against the
    cache budget, one line per policy."""
    ax, df = axes(ax, (7.5, 4)), data
    evicted = df[df.policy != "full"]
    sns.lineplot(data=evicted, x="budget", y="metric", hue="policy", style="policy", markers=True, ax=ax,
                 errorbar=("ci", 95), n_boot=1000, seed=0)
    full = df[df.policy == "full"].metric.mean()
    ax.axhline(full, color="grey", ls="--", lw=1, label="full cache")
    whole = df[df.policy == "full"].budget.max()  # a budget this large keeps everything: it saves nothing
    if pd.notna(whole):
        ax.axvline(whole, color="grey", ls=":", lw=1, label=f"whole context ({int(whole)})")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="cache budget (context positions kept, log scale)",
           ylabel=f"{UNITS.get(str(metric), 'task metric')} at the answer",
           title="Eviction what-if (band: bootstrap 95% CI over examples)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small", title="policy")
    return ax


def plot_norms(data: pd.DataFrame, *, kind: str = "key", ax=None):
    """Mean norm of the cached keys (or values) by position (`data`: the norms table), one line per layer (mean over KV heads)."""
    ax = axes(ax, (7.5, 4))
    sns.lineplot(data=data[data.kind == kind], x="position", y="norm", hue="layer", errorbar=None, ax=ax, palette="viridis")
    ax.set(title=f"Cached {kind} norms (mean over KV heads)", xlabel="position in the context",
           ylabel=f"L2 norm of the cached {kind}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small", title="layer")
    return ax


def plot_sinks(data: pd.DataFrame, *, ax=None):
    """Attention mass on the first position per layer against its uniform baseline (`data`: the sinks table)."""
    ax = axes(ax, (7.5, 4))
    long = data.melt(id_vars="layer", value_vars=["sink_mass", "uniform_mass"], var_name="attention", value_name="mass")
    long["attention"] = long["attention"].map({"sink_mass": "measured", "uniform_mass": "if uniform"})
    sns.barplot(data=long, x="layer", y="mass", hue="attention", ax=ax)
    ax.set(title="Attention sink: mass on the first position", ylabel="attention mass on position 0 (0-1)")
    ax.set_ylim(0, min(1.0, 1.15 * float(long["mass"].max()) or 1.0))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small", title="attention")
    return ax


def figures(result, **kwargs) -> dict:
    """{file stem: Figure} for a kv Result."""
    out = {}
    for stem, draw in (("kv_eviction", lambda: plot_eviction(result.df, metric=result.summary.get("metric"))),
                       ("kv_norms", lambda: plot_norms(result.tables["norms"])),
                       ("kv_sinks", lambda: plot_sinks(result.tables["sinks"]))):
        ax = draw()
        ax.figure.tight_layout()
        out[stem] = ax.figure
    return out
