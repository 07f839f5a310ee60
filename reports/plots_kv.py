"""Figures of the kv analysis: metric against cache budget, K/V norms by position, sink mass.

reports/plots.py's convention: `plot_<what>(data, *, ax=None, ...) -> Axes` over the Result's tidy tables.

The eviction band is a bootstrap over examples with a fixed seed, so equal Results give byte-identical PNGs.

This module is the family's whole presentation (reports/families.py): after the figures, `GUIDE`
(how to read its section), `CAPTIONS` (each figure's, by stem) and `finding(summary)`, its headline.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
import seaborn as sns

from headscope.reports.findings import _chance, _num, _words
from headscope.reports.plots import LAYERS, axes, laid_out

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
    sns.lineplot(data=data[data.kind == kind], x="position", y="norm", hue="layer", errorbar=None, ax=ax, palette=LAYERS)
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
        out[stem] = laid_out(draw())
    return out


# Presentation (reports/families.py): the guide, the captions and the finding in words.

GUIDE = (  # how to read this section of the report
    "The KV cache: bytes per token and at full context, what grouped-query attention saves, the "
    "key and value norms by position (sink keys stand out at the start), and how the metric holds "
    "up when the cache keeps only sinks plus a recent window, a window alone, or heavy hitters."
)
CAPTIONS = {  # what to read from each figure and its units, by figure stem
    "kv_eviction": "Task metric at the answer (y, in the task metric's units) against the number of cached positions kept "
                   "(x, log2), per eviction policy, with a 95% bootstrap band over examples; dashed: the full cache; "
                   "dotted: the whole context, a budget that saves nothing.",
    "kv_norms": "Mean L2 norm of the cached keys by position, one line per layer (mean over KV heads).",
    "kv_sinks": "Per layer, attention mass (0-1) on the first position against the uniform-attention mass.",
}


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def finding(s: Mapping[str, Any]) -> str:
    """Cache size, GQA saving and the smallest budget per policy within 1% of the full cache."""
    parts = []
    per_token, full_ctx = _num(s.get("bytes_per_token")), _num(s.get("bytes_at_n_ctx"))
    if per_token is not None:
        parts.append(f"The KV cache takes {_bytes(per_token)} per token ({s.get('dtype', '')})"
                     + (f", {_bytes(full_ctx)} at full context." if full_ctx is not None else "."))
    saving = _num(s.get("gqa_saving"))
    if saving is not None and saving > 1:
        parts.append(f"Grouped-query attention stores {saving:.3g}x less than full multi-head attention would.")
    full = _num(s.get("metric_unevicted"))
    budgets = s.get("metric_per_policy_budget") or {}
    if full is not None and _chance(s) is not None:
        parts.append(f"Full-cache metric {full:.3g}.")
    elif full is not None and budgets:
        context = _num(s.get("context_positions")) or max((int(b) for v in budgets.values() for b in v), default=None)
        ok, saving = [], False
        for policy, by_budget in budgets.items():
            kept = sorted(int(b) for b, v in by_budget.items() if _num(v) is not None and v >= full - 0.01 * abs(full))
            name = policy.replace("_", " ")
            if not kept:
                ok.append(f"{name} never")
            elif context is not None and kept[0] >= context:
                ok.append(f"{name} only with the whole context")
            else:
                saving = True
                ok.append(f"{name} from {kept[0]} positions" + (f" of {context:.0f}" if context else ""))
        n = s.get("n_examples")
        parts.append(f"Full-cache {_words(s.get('metric', 'metric'))} {full:.3g}"
                     + (f" (mean over {n} examples)" if n is not None else "") + "; within 1% of it: " + ", ".join(ok) + ".")
        if not saving:
            parts.append("No eviction policy saves anything here: every policy needs the whole context"
                         + (f" ({context:.0f} positions)" if context else "") + " to stay within 1% (or never gets there).")
    return " ".join(parts)
