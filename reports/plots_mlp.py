"""Figures of the mlp analysis: key-value agreement per layer, the task's largest sub-updates,
and the top-neuron table as escaped HTML (trigger prompts and tokens may hold markup).

reports/plots.py's convention: `plot_<what>(data, *, ax=None, ...) -> Axes` over the Result's tidy tables.

This module is the family's whole presentation (reports/families.py): after the figures, `GUIDE`
(how to read its section), `CAPTIONS` (each figure's, by stem) and `finding(summary)`, its headline.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import seaborn as sns

from headscope.reports.findings import _chance, _num, _pct, wilson
from headscope.reports.plots import axes, label, laid_out
from headscope.reports.render import escape

# column: (legend label, colour, marker, line style); each measure and its own shuffled control share a colour
AGREEMENT = {"agreement": ("top trigger", "C0", "o", "-"),
             "agreement_shuffled": ("shuffled (control)", "C0", "s", ":"),
             "agreement_any": ("any of top k triggers", "C1", "X", "-"),
             "agreement_any_shuffled": ("any of top k, shuffled (its control)", "C1", "D", ":")}


def plot_agreement(data: pd.DataFrame, *, n: int | None = None, ax=None):
    """Per layer (`data`: the agreement table): agreement with the top trigger and with any of the top-k,
    each beside its own shuffled control in the same colour, dotted (a table without
    agreement_any_shuffled, from an older run, draws the any-of-k line without one). n: the neurons each
    fraction is over (the summary's n_neurons_per_layer): each point then carries its Wilson 95% interval
    (count = fraction x n, exact) as an error bar, the measures set slightly apart so their bars do not
    hide one another."""
    ax = axes(ax, (8, 4))
    data = data.sort_values("layer")
    layers = data.layer.to_numpy(dtype=float)
    n = int(n) if n else None
    drawn = [c for c in AGREEMENT if c in data]
    for i, column in enumerate(drawn):
        name, colour, marker, style = AGREEMENT[column]
        y = data[column].to_numpy(dtype=float)  # [layer]
        yerr = None
        if n:
            bounds = np.array([wilson(int(round(v * n)), n) for v in y])  # [layer, 2]
            yerr = np.vstack([y - bounds[:, 0], bounds[:, 1] - y]).clip(min=0)  # [2, layer]
        shift = (i - (len(drawn) - 1) / 2) * 0.07 if n else 0.0
        ax.errorbar(layers + shift, y, yerr=yerr, color=colour, marker=marker, linestyle=style, markersize=5,
                    capsize=3 if n else 0, label=name)
    bars = f"\n(bars: Wilson 95% CI over {n} neurons)" if n else ""  # its own line: the title fits beside the legend
    ax.set(title="Key-value agreement (value's top token = trigger's next token)" + bars, ylim=(0, None),
           xlabel="layer", ylabel="fraction of neurons that agree (0-1)")
    ax.set_xticks(sorted(data.layer.unique()))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small", title="next token of")
    return ax


LIGHTEST = 0.65  # the layer palette stops here: viridis beyond is light green to yellow, faint on white


def layer_colours(layers) -> dict:
    """{layer: colour}: the convention's ordinal layer palette (plots.LAYERS) from its dark end up to
    LIGHTEST, so the last layer's bars stay visible on white."""
    import matplotlib

    from headscope.reports.plots import LAYERS  # hue by layer: the convention's ordinal palette

    order = sorted(set(layers))
    cmap = matplotlib.colormaps[LAYERS]
    return {l: cmap(LIGHTEST * i / max(len(order) - 1, 1)) for i, l in enumerate(order)}


def plot_top_neurons(data: pd.DataFrame, *, task: str | None = None, ax=None):
    """Mean ||m_i v_i|| at the task's answer position for the top neurons (`data`: the top_neurons table),
    labelled L<layer>.N<neuron>, coloured by layer (layer_colours, outlined); `task`: its name, in the title."""
    ax, top_neurons = axes(ax, (7, max(3, 0.25 * len(data)))), data
    data = top_neurons.assign(neuron_id=[f"L{layer}.N{n}" for layer, n in zip(top_neurons.layer, top_neurons.neuron)])
    sns.barplot(data=data, y="neuron_id", x="task_update_norm", hue="layer", dodge=False, ax=ax,
                palette=layer_colours(data.layer), edgecolor="black", linewidth=0.5)
    ax.set(xlabel="mean L2 norm of the update m_i v_i at the answer", ylabel="neuron (L layer . N index)",
           title="Largest sub-updates on the task" + (f" '{label(task)}'" if task else ""))
    if ax.get_legend() is not None:  # off the data
        sns.move_legend(ax, "upper left", bbox_to_anchor=(1.01, 1), fontsize="small", title="layer")
    return ax


def top_neurons_html(top_neurons: pd.DataFrame, columns=("layer", "neuron", "task_update_norm", "value_tokens",
                                                          "triggers", "trigger_next", "agrees")) -> str:
    """The top-neuron table as an HTML table, every cell escaped."""
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(f'{v:.3g}' if isinstance(v, float) else v)}</td>" for v in row) + "</tr>"
        for row in top_neurons[list(columns)].itertuples(index=False)
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def figures(result, **kwargs) -> dict:
    """{file stem: Figure} for an mlp Result."""
    out = {}
    n = _num((result.summary or {}).get("n_neurons_per_layer"))  # what each agreement fraction is over
    out["mlp_agreement"] = laid_out(plot_agreement(result.tables["agreement"], n=int(n) if n else None))
    task = (result.summary or {}).get("task") or (result.config or {}).get("task")
    out["mlp_top_neurons"] = laid_out(plot_top_neurons(result.tables["top_neurons"], task=task))
    return out


# Presentation (reports/families.py): the guide, the captions and the finding in words.

GUIDE = (  # how to read this section of the report
    "MLP layers as key-value memories (Geva et al. 2021): for each neuron, the prompts that "
    "trigger it most and the tokens its value vector promotes. Agreement is the fraction of "
    "neurons whose promoted token matches what follows their triggers, read against the same with "
    "triggers shuffled across neurons (the control). Geva et al. found it higher in upper layers of "
    "their trained models; the finding says whether this model's layers differ at all."
)
CAPTIONS = {  # what to read from each figure and its units, by figure stem
    "mlp_agreement": "Per layer, the fraction of neurons (0-1) whose value vector's top token is the token after their "
                     "strongest trigger (top trigger) and after any of their top-k triggers (any of top k), each with its "
                     "own control in the same colour, dotted: the same with triggers shuffled across neurons; bars: each "
                     "fraction's Wilson 95% interval over the layer's neurons.",
    "mlp_top_neurons": "The neurons whose updates m_i v_i are largest at the task's answer position (L2 norm, residual "
                       "stream units), coloured by layer.",
}


def _measured_only(s: Mapping[str, Any]) -> str:
    """At chance: what was measured (neurons, prefixes, task updates), no layer ranked, no comparison with
    the control, no share of answer-promoting updates."""
    n, layers = _num(s.get("n_neurons_per_layer")), len(s.get("agreement_per_layer") or {})
    updates = _num(s.get("n_task_updates"))
    return ("Measured: key-value agreement of " + (f"{n:.0f} neurons per layer" if n else "each layer's neurons")
            + (f" in {layers} layers" if layers else "") + f" over {s.get('n_prefixes', '?')} prefixes against a "
            "shuffled control, and which tokens the largest task updates promote"
            + (f" ({updates:.0f} updates)" if updates else "") + "; no layer is ranked at chance.")


ALPHA = 0.05  # the level at which a Fisher test's p is called a difference


def _count_map(s: Mapping[str, Any], key: str, n: int) -> dict[str, int]:
    """{layer: agreeing neurons}: the recorded counts, else each share times n (exact: shares are k / n)."""
    counts = s.get(f"{key}_count_per_layer")
    if isinstance(counts, Mapping) and counts:
        return {str(k): int(v) for k, v in counts.items() if _num(v) is not None}
    return {str(k): round(_num(v) * n) for k, v in (s.get(f"{key}_per_layer") or {}).items() if _num(v) is not None}


def _tests(s: Mapping[str, Any], agree: Mapping[str, float], n: int) -> dict | None:
    """The summary's Fisher tests (agreement_tests), else the same computed from its counts; None without n."""
    if not n:
        return None
    from headscope.analyses.mlp.analysis import agreement_tests

    recorded = s.get("agreement_tests")
    if isinstance(recorded, Mapping) and isinstance(recorded.get("control_p_per_layer"), Mapping):
        return dict(recorded)
    return agreement_tests(_count_map(s, "agreement", n), _count_map(s, "agreement_shuffled", n), n)


def _p(p: float) -> str:
    return f"p = {p:.2g}" if p >= 0.001 else "p < 0.001"


def _tested(s: Mapping[str, Any], tests: Mapping[str, Any], best: str, hits: int, n: int) -> list[str]:
    """Sentences: the best layer against its own shuffled control, every layer against its control, and the
    best layer against the others (pooled and each), all by Fisher's exact test on k of n neurons."""
    control = _count_map(s, "agreement_shuffled", n)
    p_best = tests["control_p_per_layer"][best]
    out = [f"Against its own shuffled control ({control.get(best, 0)} of {n} neurons, "
           f"{_pct(control.get(best, 0) / n)}), layer {best} "
           + (f"agrees more (Fisher's exact test, two-sided, {_p(p_best)})." if p_best < ALPHA and hits > control.get(best, 0)
              else f"agrees less (Fisher's exact test, two-sided, {_p(p_best)})" if p_best < ALPHA
              else f"cannot be told from it (Fisher's exact test, two-sided, {_p(p_best)})")]
    if p_best >= ALPHA or hits <= control.get(best, 0):
        out[-1] += ": these MLPs show no key-value memory on this corpus that the test can detect."
    counts = _count_map(s, "agreement", n)
    above = [l for l, p in tests["control_p_per_layer"].items() if p < ALPHA and counts.get(l, 0) > control.get(l, 0)]
    if len(tests["control_p_per_layer"]) > 1:
        out.append(f"Layers above their own control at p < {ALPHA:g}: " + (", ".join(above) if above else "none") + ".")
    pooled, each = tests.get("best_vs_others_p"), tests.get("best_vs_layer_p") or {}
    if pooled is not None and tests.get("best_layer") == best:
        others = [l for l in counts if l != best]
        k_others = sum(counts[l] for l in others)
        pairs = "; ".join(f"layer {l} ({counts[l]} of {n}) {_p(p)}" for l, p in list(each.items())[:6])
        differ = "differ" if pooled < ALPHA else "cannot be told apart"
        out.append(f"Between layers: layer {best} against the others pooled ({k_others} of {n * len(others)}) "
                   f"{_p(pooled)}, so the layers {differ}" + (f"; against each, {pairs}" if pairs else "")
                   + " (Fisher's exact test; the best layer is picked after looking, so these p are optimistic).")
    return out


def finding(s: Mapping[str, Any]) -> str:
    """At chance: what was measured only. Key-value agreement per layer against its shuffled control;
    with the neuron count, both as k of n neurons with Wilson intervals, and "no better than the control" when the best layer's
    interval reaches down to the control's best."""
    if _chance(s) is not None:
        return _measured_only(s)
    agree = {k: _num(v) for k, v in (s.get("agreement_per_layer") or {}).items() if _num(v) is not None}
    shuffled = [v for v in (_num(x) for x in (s.get("agreement_shuffled_per_layer") or {}).values()) if v is not None]
    n = int(_num(s.get("n_neurons_per_layer")) or 0)
    parts = []
    if agree:
        best = max(agree, key=lambda k: agree[k])
        counted = _num((s.get("agreement_count_per_layer") or {}).get(best))  # the recorded count (newer summaries)
        hits = int(counted) if counted is not None else round(agree[best] * n)
        interval = wilson(hits, n) if n else None
        size = (f" ({hits} of {n} neurons, Wilson 95% CI {_pct(interval[0])}-{_pct(interval[1])})"
                if interval else "")
        tied = [k for k in agree if k != best and interval and agree[k] >= interval[0]]  # inside the peak's interval
        where = (f"in layer {best}" if not tied else
                 f"in layer {best}, with layer{'s' if len(tied) > 1 else ''} {', '.join(map(str, tied))} inside its interval "
                 "(no one layer stands out)")
        parts.append(f"Agreement between a neuron's promoted token and what follows its triggers is highest at "
                     f"{_pct(agree[best])}{size} {where} (over {s.get('n_prefixes', '?')} prefixes)")
        tests = _tests(s, agree, n)
        if tests is not None and best in tests["control_p_per_layer"]:
            parts[-1] += "."
            parts.extend(_tested(s, tests, best, hits, n))
        else:  # no counts (an older summary): the control's share beside the best, and the interval check
            control = max(shuffled) if shuffled else None
            parts[-1] += f"; the shuffled control reaches {_pct(control)}." if control is not None else "."
            if control is not None and (interval[0] <= control if interval else agree[best] <= control + 0.02):
                parts.append("That is no better than the control: these MLPs show no key-value memory on this corpus.")
    frac = _num(s.get("answer_promoted_fraction"))
    if frac is not None:
        count = _num(s.get("n_task_updates"))  # how many updates the fraction is over (newer summaries)
        examples = _num((s.get("chance") or {}).get("n_examples")) if isinstance(s.get("chance"), Mapping) else None
        examples = _num(s.get("n_task_examples")) or examples
        if count:
            promoting = _num(s.get("n_task_updates_promoting"))
            k = int(promoting) if promoting is not None else round(frac * count)
            lo, hi = wilson(k, int(count))
            parts.append(f"{k} of {count:.0f} top task updates ({_pct(frac)}, Wilson 95% CI {_pct(lo)}-{_pct(hi)}) "
                         "promote the answer token.")
            per = _num(s.get("n_top_updates"))
            if examples and per:  # the updates are not independent draws: say how they cluster
                parts.append(f"They are the top {per:.0f} per example and layer over {examples:.0f} task examples; the "
                             "interval treats them as independent, so it is too narrow when one example's updates agree.")
        else:
            parts.append(f"{_pct(frac)} of the top task updates" + (f" (on {examples:.0f} task examples)" if examples else "")
                         + " promote the answer token.")
    return " ".join(parts)
