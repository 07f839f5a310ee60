"""Figures of the mlp analysis: key-value agreement per layer, the Task's largest sub-updates,
and the top-neuron table as escaped HTML (trigger prompts and tokens may hold markup).

reports/plots.py's convention: `plot_<what>(data, *, ax=None, ...) -> Axes` over the Result's tidy tables."""
from __future__ import annotations

import pandas as pd
import seaborn as sns

from headscope.reports.plots import axes
from headscope.reports.render import escape


def plot_agreement(data: pd.DataFrame, *, ax=None):
    """Per layer (`data`: the agreement table): agreement with the top trigger, with any of the top-k,
    and the shuffled baseline."""
    ax, agreement = axes(ax, (8, 4)), data
    names = {"agreement": "top trigger", "agreement_any": "any of top k triggers", "agreement_shuffled": "shuffled (control)"}
    long = agreement.melt(id_vars="layer", value_vars=list(names), var_name="measure", value_name="fraction")
    long["measure"] = long["measure"].map(names)
    sns.lineplot(data=long, x="layer", y="fraction", hue="measure", style="measure", markers=True, ax=ax)
    ax.set(title="Key-value agreement (value's top token = trigger's next token)", ylim=(0, None),
           ylabel="fraction of neurons that agree (0-1)")
    ax.set_xticks(sorted(agreement.layer.unique()))
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small", title="next token of")
    return ax


def plot_top_neurons(data: pd.DataFrame, *, ax=None):
    """Mean ||m_i v_i|| at the Task's answer position for the top neurons (`data`: the top_neurons table),
    labelled L<layer>.N<neuron>."""
    ax, top_neurons = axes(ax, (7, max(3, 0.25 * len(data)))), data
    data = top_neurons.assign(neuron_id=[f"L{layer}.N{n}" for layer, n in zip(top_neurons.layer, top_neurons.neuron)])
    sns.barplot(data=data, y="neuron_id", x="task_update_norm", hue="layer", dodge=False, ax=ax, palette="viridis")
    ax.set(xlabel="mean L2 norm of the update m_i v_i at the answer", ylabel="neuron (L layer . N index)",
           title="Largest sub-updates on the Task")
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
    for stem, draw in (("mlp_agreement", plot_agreement), ("mlp_top_neurons", plot_top_neurons)):
        ax = draw(result.tables[stem.removeprefix("mlp_")])
        ax.figure.tight_layout()
        out[stem] = ax.figure
    return out
