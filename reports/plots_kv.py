"""Figures of the kv analysis: metric against cache budget, K/V norms by position, sink mass.

The eviction band is a bootstrap over examples with a fixed seed, so equal Results give byte-identical PNGs."""
from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

UNITS = {"logit_diff": "logit difference (logits)", "logprob": "answer log-probability (nats)",
         "accuracy": "accuracy (0-1)"}


def eviction_plot(df: pd.DataFrame, ax=None, metric: str | None = None):
    """The Task metric (mean, seeded bootstrap 95% CI over examples) against the cache budget, one line per policy."""
    ax = ax or plt.gca()
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


def norms_plot(norms: pd.DataFrame, ax=None, kind: str = "key"):
    """Mean norm of the cached keys (or values) by position, one line per layer (mean over KV heads)."""
    ax = ax or plt.gca()
    sns.lineplot(data=norms[norms.kind == kind], x="position", y="norm", hue="layer", errorbar=None, ax=ax, palette="viridis")
    ax.set(title=f"Cached {kind} norms (mean over KV heads)", xlabel="position in the context",
           ylabel=f"L2 norm of the cached {kind}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small", title="layer")
    return ax


def sinks_plot(sinks: pd.DataFrame, ax=None):
    """Attention mass on the first position per layer against its uniform baseline."""
    ax = ax or plt.gca()
    long = sinks.melt(id_vars="layer", value_vars=["sink_mass", "uniform_mass"], var_name="attention", value_name="mass")
    long["attention"] = long["attention"].map({"sink_mass": "measured", "uniform_mass": "if uniform"})
    sns.barplot(data=long, x="layer", y="mass", hue="attention", ax=ax)
    ax.set(title="Attention sink: mass on the first position", ylabel="attention mass on position 0 (0-1)")
    ax.set_ylim(0, min(1.0, 1.15 * float(long["mass"].max()) or 1.0))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small", title="attention")
    return ax


def figures(result, **kwargs) -> dict:
    """{file stem: Figure} for a kv Result."""
    out = {}
    for stem, draw in (("kv_eviction", lambda ax: eviction_plot(result.df, ax, result.summary.get("metric"))),
                       ("kv_norms", lambda ax: norms_plot(result.tables["norms"], ax)),
                       ("kv_sinks", lambda ax: sinks_plot(result.tables["sinks"], ax))):
        fig, ax = plt.subplots(figsize=(7.5, 4))
        draw(ax)
        fig.tight_layout()
        out[stem] = fig
    return out
