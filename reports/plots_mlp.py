"""Figures of the mlp analysis: key-value agreement per layer, the task's largest sub-updates,
and the top-neuron table as escaped HTML (trigger prompts and tokens may hold markup).

reports/plots.py's convention: `plot_<what>(data, *, ax=None, ...) -> Axes` over the Result's tidy tables.

This module is the family's whole presentation (reports/families.py): after the figures, `GUIDE`
(how to read its section), `CAPTIONS` (each figure's, by stem) and `finding(summary)`, its headline.
"""
from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import seaborn as sns

from headscope.analyses.core import chance
from headscope.analyses.mlp.analysis import MIN_ROUTED
from headscope.reports.findings import _chance, _ci, _num, _pct, and_join, ci_pair, wilson
from headscope.reports.moe_words import sigmoid_routing_words
from headscope.reports.plots import axes, fit_title, label, laid_out, mute_drawn, quiet_reason
from headscope.reports.render import escape

# column: (legend label, colour, marker, line style); each measure and its own shuffled control share a colour
AGREEMENT = {"agreement": ("top trigger", "C0", "o", "-"),
             "agreement_shuffled": ("shuffled (control)", "C0", "s", ":"),
             "agreement_any": ("any of top k triggers", "C1", "X", "-"),
             "agreement_any_shuffled": ("any of top k, shuffled (its control)", "C1", "D", ":")}


def plot_agreement(data: pd.DataFrame, *, n: int | Mapping[Any, int] | None = None, over: str | None = None,
                   kinds: Mapping[Any, str] | None = None, ax=None):
    """Per layer (`data`: the agreement table): agreement with the top trigger and with any of the top-k,
    each beside its own shuffled control in the same colour, dotted (a table without
    agreement_any_shuffled, from an older run, draws the any-of-k line without one). n: the memories each
    fraction is over, one number or {layer: n} (the summary's n_memories_per_layer; on a mixture of experts
    every expert's neurons): each point then carries its Wilson 95% interval (count = fraction x n, exact)
    as an error bar, the measures set slightly apart so their bars do not hide one another. over: what n
    counts, in the title ("384 expert neurons (4 experts x 96)"; default "<n> neurons"). Lines join adjacent
    layers only: across a layer not analysed the points stand alone. kinds {layer: "MoE" / "dense"}: each layer's
    tick says its kind (a dense MLP among mixtures of experts)."""
    ax = axes(ax, (8, 4))
    data = data.sort_values("layer")
    layers = data.layer.to_numpy(dtype=float)
    sizes = ({int(k): int(v) for k, v in n.items()} if isinstance(n, Mapping) else
             {int(l): int(n) for l in data.layer} if n else {})
    sizes = sizes if all(int(l) in sizes for l in data.layer) else {}
    drawn = [c for c in AGREEMENT if c in data]
    for i, column in enumerate(drawn):
        name, colour, marker, style = AGREEMENT[column]
        y = data[column].to_numpy(dtype=float)  # [layer]
        yerr = None
        if sizes:
            bounds = np.array([wilson(int(round(v * sizes[int(l)])), sizes[int(l)])
                               for v, l in zip(y, data.layer)])  # [layer, 2]
            yerr = np.vstack([y - bounds[:, 0], bounds[:, 1] - y]).clip(min=0)  # [2, layer]
        shift = (i - (len(drawn) - 1) / 2) * 0.07 if sizes else 0.0
        bars = ax.errorbar(layers + shift, y, yerr=yerr, color=colour, marker=marker, linestyle=style, markersize=5,
                           capsize=3 if sizes else 0, label=name)
        bars.lines[0].set_data(*_broken(layers + shift, y, layers))  # no line across a missing layer
    if sizes and over is None:
        over = (f"{next(iter(sizes.values()))} neurons" if len(set(sizes.values())) == 1 else
                "each layer's neurons (" + ", ".join(f"L{l}: {v}" for l, v in sorted(sizes.items())) + ")")
    bars = f"\nbars: Wilson 95% CI over {over}" if sizes else ""  # its own line (figures() wraps it to the axes)
    ax.set(title="Key-value agreement (value's top token = trigger's next token)" + bars, ylim=(0, None),
           xlabel="layer" + (" (kind of MLP)" if kinds else ""), ylabel="fraction of neurons that agree (0-1)")
    ticks = sorted(data.layer.unique())
    ax.set_xticks(ticks, [f"{l}\n{kinds[l]}" if kinds and l in kinds else str(l) for l in ticks])
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small", title="next token of")
    return ax


def _broken(x: np.ndarray, y: np.ndarray, layers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(x, y) with a NaN between two layers that are not adjacent, so a line through them breaks there."""
    gap = np.flatnonzero(np.diff(layers) > 1) + 1  # indices after which a layer is missing
    return np.insert(x, gap, np.nan), np.insert(y, gap, np.nan)


LIGHTEST = 0.65  # the layer palette stops here: viridis beyond is light green to yellow, faint on white


def layer_colours(layers) -> dict:
    """{layer: colour}: the convention's ordinal layer palette (plots.LAYERS) from its dark end up to
    LIGHTEST, so the last layer's bars stay visible on white."""
    import matplotlib

    from headscope.reports.plots import LAYERS  # hue by layer: the convention's ordinal palette

    order = sorted(set(layers))
    cmap = matplotlib.colormaps[LAYERS]
    return {l: cmap(LIGHTEST * i / max(len(order) - 1, 1)) for i, l in enumerate(order)}


def neuron_labels(data: pd.DataFrame, n_examples: int | None = None, shared: Mapping[Any, int] | None = None) -> list[str]:
    """Each top neuron's label: L<layer>.N<neuron>, or on a mixture of experts (an `expert` column) L<layer>
    E<expert> n<neuron within the expert>, with on how many task examples the router chose that expert
    ("routed 1/16"; `n_routed`, of n_examples where given); shared {layer: its shared expert's index}: that
    expert, which every token uses, is labelled "L<layer> shared n<neuron>"; a dense layer's neuron among them
    (no expert) "L<layer> dense n<neuron>": one style on one axis (review 14a C4: "L1.N79" beside "L0 E0 n51")."""
    if "expert" not in data or "expert_neuron" not in data:
        return [f"L{layer}.N{n}" for layer, n in zip(data.layer, data.neuron)]
    shared = {int(k): int(v) for k, v in (shared or {}).items()}
    routed = data["n_routed"] if "n_routed" in data else [None] * len(data)
    return [f"L{layer} dense n{i}" if pd.isna(e) else
            f"L{layer} shared n{int(n)}" if shared.get(int(layer)) == int(e) else
            f"L{layer} E{int(e)} n{int(n)}" + ("" if r is None or pd.isna(r) else
                                    f" (routed {int(r)}" + (f"/{int(n_examples)})" if n_examples else ")"))
            for layer, i, e, n, r in zip(data.layer, data.neuron, data.expert, data.expert_neuron, routed)]


def _neuron_key(moe: bool, dense: bool) -> str:
    """The y label: one short word; what a bar's label means (L<layer> E<expert> n<neuron>, dense, shared) is the
    caption's (review 16b C3: three lines of label templates crowded the axis; 12a B3 before them)."""
    return "neuron"


def _label_height(text: str) -> float:
    """Inches a rotated y label's longest line takes at the style's label size (a character about 0.6 of the
    size wide), plus the title's and x label's room: the figure is at least this tall, so a seaborn
    notebook style's larger font keeps the label inside it."""
    from matplotlib import rcParams
    from matplotlib.font_manager import FontProperties

    points = FontProperties(size=rcParams["axes.labelsize"]).get_size_in_points()
    return 0.6 * points * max(len(line) for line in text.split("\n")) / 72 + 1.2


def plot_top_neurons(data: pd.DataFrame, *, task: str | None = None, n_examples: int | None = None,
                     shared: Mapping[Any, int] | None = None, post_norm: bool = False, ax=None):
    """Mean ||m_i v_i|| at the task's answer position for the top neurons (`data`: the top_neurons table),
    labelled by neuron_labels (experts and their routing on a mixture of experts; shared: each layer's shared
    expert), coloured by layer (layer_colours, outlined); `task`: its name, in the title; n_examples: the
    task's examples; post_norm: v_i is taken through the post-MLP norm's gain g (post-norm blocks)."""
    top_neurons = data
    moe = "expert" in top_neurons and "expert_neuron" in top_neurons
    dense = moe and bool(top_neurons.expert.isna().any())  # a dense layer's neurons among experts' (mlp_only_layers)
    ax = axes(ax, (7, max(3, 0.25 * len(data), _label_height(_neuron_key(moe, dense)))))
    data = top_neurons.assign(neuron_id=neuron_labels(top_neurons, n_examples, shared))
    sns.barplot(data=data, y="neuron_id", x="task_update_norm", hue="layer", dodge=False, ax=ax,
                palette=layer_colours(data.layer), edgecolor="black", linewidth=0.5)
    update = "m_i (g * v_i), g the post-MLP norm's gain," if post_norm else "m_i v_i"
    xlabel = (f"mean L2 norm of the update {update} at the answer (residual-stream units"
              + ("; 0 where not routed)" if moe else ")"))
    ax.set(xlabel=textwrap.fill(xlabel, 48, break_on_hyphens=False),  # two lines: one is wider than the axes
           ylabel=_neuron_key(moe, dense),
           title="Largest sub-updates on the task" + (f" '{label(task)}'" if task else ""))
    if ax.get_legend() is not None and data.layer.nunique() < 2:  # one layer: its labels name it (16b C3)
        ax.get_legend().remove()
    elif ax.get_legend() is not None:  # off the data
        sns.move_legend(ax, "upper left", bbox_to_anchor=(1.01, 1), fontsize="small", title="layer")
    return ax


def top_neurons_html(top_neurons: pd.DataFrame, columns=None) -> str:
    """The top-neuron table as an HTML table, every cell escaped; by default its layer, neuron (on a mixture of
    experts also expert, expert_neuron and n_routed), task_update_norm, value tokens, triggers and agreement."""
    if columns is None:
        moe = [c for c in ("expert", "expert_neuron", "n_routed") if c in top_neurons]
        columns = ("layer", "neuron", *moe, "task_update_norm", "value_tokens", "triggers", "trigger_next", "agrees")
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(f'{v:.3g}' if isinstance(v, float) else v)}</td>" for v in row) + "</tr>"
        for row in top_neurons[list(columns)].itertuples(index=False)
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def figures(result, **kwargs) -> dict:
    """{file stem: Figure} for an mlp Result."""
    out = {}
    s = result.summary or {}
    sizes = memory_sizes(s)  # what each agreement fraction is over
    experts = _experts(s)
    kinds = ({int(l): "MoE" if l in experts else "dense" for l in sizes}
             if experts and len(experts) < len(sizes) else None)  # a dense MLP among mixtures of experts
    ax = plot_agreement(result.tables["agreement"], n=sizes or None, over=_over(s, sizes), kinds=kinds)
    out["mlp_agreement"] = laid_out(ax)
    fit_title(ax)  # a title wider than its axes is cut at the figure's left edge and runs over the y label
    task = s.get("task") or (result.config or {}).get("task")
    n_examples = _num(s.get("n_task_examples"))
    shared = {l: e["n_experts"] for l, e in _experts(s).items() if e.get("shared_width")}  # its index: after the routed
    ax = plot_top_neurons(result.tables["top_neurons"], task=task, shared=shared,
                          n_examples=int(n_examples) if n_examples else None,
                          post_norm=bool(s.get("values_through_post_norm")))
    out["mlp_top_neurons"] = laid_out(mute_drawn(ax, quiet_reason(s)))  # at chance: a ranking of noise (review 14a C4)
    return out


def memory_sizes(s: Mapping[str, Any]) -> dict[str, int]:
    """{layer: memories its agreement fractions are over}: n_memories_per_layer (every expert's neurons on a
    mixture of experts), else an older summary's n_neurons_per_layer for every layer; {} when neither."""
    per = s.get("n_memories_per_layer")
    if isinstance(per, Mapping) and per:
        return {str(k): int(v) for k, v in per.items() if _num(v)}
    if _stale_moe(s):  # its n_neurons_per_layer is one expert's width, not what the fractions are over
        return {}
    n = _num(s.get("n_neurons_per_layer"))
    return {str(k): int(n) for k in (s.get("agreement_per_layer") or {})} if n else {}


def best_layer(s: Mapping[str, Any]) -> str | None:
    """The layer the finding leads with: the highest agreement_per_layer (the first of equals); None without one.
    The one rule for "the highest layer" (the finding, its verdicts, and the layer `headscope compare` compares)."""
    agree = {k: v for k, v in (s.get("agreement_per_layer") or {}).items() if _num(v) is not None}
    return max(agree, key=lambda k: agree[k]) if agree else None


def _stale_moe(s: Mapping[str, Any]) -> bool:
    """A mixture-of-experts summary from before n_memories_per_layer: its fractions are over every expert's
    neurons but its counts, intervals and tests over one expert's width, so none of them is used."""
    return s.get("mixture_of_experts") is True and not isinstance(s.get("n_memories_per_layer"), Mapping)


STALE_MOE = ("These layers are mixtures of experts, and this run is from before headscope counted every expert's "
             "neurons: its counts, intervals and tests were over one expert's width, so only its fractions are given "
             "(rerun the mlp analysis for them).")


def _experts(s: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    per = s.get("experts_per_layer")
    return {str(k): v for k, v in per.items() if isinstance(v, Mapping)} if isinstance(per, Mapping) else {}


def unit(s: Mapping[str, Any], layer: str) -> str:
    """What a layer's memories are called: "expert neurons" on a mixture of experts, else "neurons"."""
    return "expert neurons" if str(layer) in _experts(s) else "neurons"


def _layout(e: Mapping[str, Any]) -> str:
    """"4 experts x 96, top-2 routing" (and "+ a shared expert of 64")."""
    shared = f" + a shared expert of {e['shared_width']}" if e.get("shared_width") else ""
    top = f", top-{e['top_k']} routing" if e.get("top_k") else ""
    return f"{e['n_experts']} experts x {e['expert_width']}{shared}{top}"


def _over(s: Mapping[str, Any], sizes: Mapping[str, int]) -> str | None:
    """The agreement figure's "over" words: "384 expert neurons (4 experts x 96, top-2 routing)" where every
    layer has the same memories, else None (plot_agreement lists each layer's n)."""
    if not sizes or len(set(sizes.values())) > 1:
        return None
    experts = _experts(s)
    layouts = {repr(sorted(experts[l].items())) if l in experts else None for l in sizes}
    n = next(iter(sizes.values()))
    if len(layouts) > 1 or None in layouts:
        return f"{n} neurons" if None in layouts and len(layouts) == 1 else None
    return f"{n} expert neurons ({_layout(experts[next(iter(sizes))])})"


def experts_sentence(s: Mapping[str, Any]) -> str:
    """How a mixture of experts' memories are counted ("" for dense MLPs): which layers, each layer's expert
    neurons and their layout, and that a neuron's coefficient is router-weighted (0 where not routed)."""
    experts, sizes = _experts(s), memory_sizes(s)
    if not experts:
        return ""
    groups: dict[str, list[str]] = {}
    for layer, e in experts.items():
        n = sizes.get(layer, e["n_experts"] * e["expert_width"] + (e.get("shared_width") or 0))
        groups.setdefault(f"{n} expert neurons ({_layout(e)})", []).append(layer)
    many = len(experts) > 1
    names = ", ".join(list(experts)[:-1]) + " and " + list(experts)[-1] if many else next(iter(experts))
    text = "; ".join((f"layer{'s' if len(ls) > 1 else ''} {', '.join(ls)}: " if len(groups) > 1 else "") + what
                     for what, ls in groups.items())
    owner = ("their memories are" if len(groups) > 1 else "each layer's memories are its" if many else
             "its memories are")
    shared = any(e.get("shared_width") for e in experts.values())
    return (f"Layer{'s' if many else ''} {names} {'are mixtures' if many else 'is a mixture'} of experts: "
            f"{owner} {text}, a neuron's coefficient "
            "being its expert's router weight times its activation, 0 on tokens not routed to that expert"
            + _weights(experts)
            + (_shared_words(experts) if shared else ".")
            + _dense(sizes, experts))


def _shared_words(experts: Mapping[str, Any]) -> str:
    """How a shared expert's neurons count: Qwen2-MoE's gated by sigmoid(shared_expert_gate), DeepSeek's ungated
    (HF DeepseekV3MoE adds shared_experts(x) as it is); older manifests without shared_gated: the gated words."""
    gated = {bool(e.get("shared_gated", True)) for e in experts.values() if e.get("shared_width")}
    if gated == {False}:
        return " (the shared expert's: its activation, ungated, on every token)."
    if gated == {True}:
        return " (the shared expert's: its sigmoid gate times its activation, on every token)."
    return " (a shared expert's: its activation, times its sigmoid gate where it has one, on every token)."


def _weights(experts: Mapping[str, Any]) -> str:
    """' (the router's top-k weights renormalised to sum to 1)' or ' (... not renormalised: ...)' where every layer's
    layout says the same; '' where none says (review 12a: Qwen3-MoE renormalises, Qwen2-MoE's default does not)."""
    sigmoid = {sigmoid_routing_words(e) for e in experts.values()}
    if sigmoid != {""}:  # DeepSeek's sigmoid router (review 15d A4: its weights sum to routed_scaling_factor, not 1)
        return f" (the router picks its top-k experts {sigmoid.pop()})" if len(sigmoid) == 1 else ""
    said = {e.get("renormalised") for e in experts.values()} - {None}
    if len(said) != 1:
        return ""
    return (" (the router's top-k weights are renormalised to sum to 1)" if said == {True}
            else " (the router's top-k weights are not renormalised: each is its softmax probability over all experts)")


def _dense(sizes: Mapping[str, int], experts: Mapping[str, Any]) -> str:
    """" Layer 1 is a dense MLP (128 neurons)." for the analysed layers that are not mixtures of experts (Qwen2-MoE's
    mlp_only_layers, DeepSeek's first_k_dense_replace), "" when there are none."""
    dense = [l for l in sizes if l not in experts]
    if not dense:
        return ""
    widths = {sizes[l] for l in dense}
    what = (f"{next(iter(widths))} neurons" if len(widths) == 1 else
            ", ".join(f"layer {l}: {sizes[l]} neurons" for l in dense))
    return (" " + _layers(dense).capitalize() + (" are dense MLPs" if len(dense) > 1 else " is a dense MLP")
            + f" ({what}).")


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
                     "fraction's Wilson 95% interval over the layer's neurons (on a mixture of experts, every "
                     "expert's neurons).",
    "mlp_top_neurons": "The neurons whose updates m_i v_i are largest at the task's answer position (L2 norm, residual "
                       "stream units, mean over the task's examples), coloured by layer. On a mixture of experts a "
                       "neuron is one expert's (L layer E expert n neuron) and its update is 0 on the examples not "
                       "routed to its expert, so its mean mixes how strongly it writes with how often its expert is "
                       "chosen: each label says on how many examples it was routed, and a dense layer's neurons (L "
                       "layer dense n neuron), on every example, tend to rank above experts' (the finding names "
                       "the largest expert neurons by their mean over their routed examples, with its interval, for "
                       f"experts routed on at least {MIN_ROUTED} examples). On a dense model a "
                       "label is L<layer>.N<neuron>, e.g. L1.N79. On a post-norm model (Gemma 2/3, "
                       "OLMo 2) v_i is taken through the post-MLP norm's gain, its shared scale left out.",
}


POST_NORM = ("Value vectors taken through the post-MLP norm's gain (the norm's shared scale is left out: it does not "
             "change rankings).")  # post-norm blocks (Gemma 2/3, OLMo 2): the summary's values_through_post_norm
POST_LN = ("The blocks are post-LN: value vectors are taken through their own block's LayerNorm (centred, times its "
           "gain; its shared scale left out), not through the later blocks' LayerNorms that the write also passes on "
           "its way to the logits.")  # review 16d A5: the summary's values_through_post_ln (OPT)


def _measured_only(s: Mapping[str, Any]) -> str:
    """At chance: what was measured (neurons, prefixes, task updates), no layer ranked, no comparison with
    the control, no share of answer-promoting updates."""
    sizes, layers = memory_sizes(s), len(s.get("agreement_per_layer") or {})
    updates = _num(s.get("n_task_updates"))
    first = next(iter(sizes), None)
    counted = (f"{sizes[first]} {unit(s, first)} per layer" if sizes and len(set(sizes.values())) == 1 else
               "each layer's neurons (" + ", ".join(f"layer {l}: {n}" for l, n in sizes.items()) + ")" if sizes else
               "each layer's neurons")
    moe = STALE_MOE if _stale_moe(s) else experts_sentence(s)
    return ((moe + " " if moe else "") + "Measured: key-value agreement of " + counted
            + (f" in {layers} layers" if layers else "") + f" over {s.get('n_prefixes', '?')} prefixes against a "
            "shuffled control, and which tokens the largest task updates promote"
            + (f" ({updates:.0f} updates)" if updates else "") + "; no layer is ranked at chance."
            + (" " + POST_NORM if s.get("values_through_post_norm") else "")
            + (" " + POST_LN if s.get("values_through_post_ln") else ""))


ALPHA = chance.ALPHA  # an alias for importers; the finding reads chance.ALPHA at each call, as control_verdicts does


def _count_map(s: Mapping[str, Any], key: str, sizes: Mapping[str, int]) -> dict[str, int]:
    """{layer: agreeing neurons}: the recorded counts, else each share times its layer's n (exact: shares
    are k / n)."""
    counts = s.get(f"{key}_count_per_layer")
    if isinstance(counts, Mapping) and counts:
        return {str(k): int(v) for k, v in counts.items() if _num(v) is not None}
    return {str(k): round(_num(v) * sizes[str(k)]) for k, v in (s.get(f"{key}_per_layer") or {}).items()
            if _num(v) is not None and str(k) in sizes}


def _tests(s: Mapping[str, Any], sizes: Mapping[str, int]) -> dict | None:
    """The summary's Fisher tests (agreement_tests), else the same computed from its counts; None without n."""
    if not sizes:
        return None
    from headscope.analyses.mlp.analysis import agreement_tests, control_verdicts

    recorded = s.get("agreement_tests")
    if isinstance(recorded, Mapping) and isinstance(recorded.get("control_p_per_layer"), Mapping):
        if "above_control_layers" in recorded:
            return dict(recorded)
        control_p = {str(l): p for l, p in recorded["control_p_per_layer"].items()}  # an older summary: correct it here
        return {**recorded, **control_verdicts(control_p, _count_map(s, "agreement", sizes),
                                               _count_map(s, "agreement_shuffled", sizes), chance.ALPHA)}
    return agreement_tests(_count_map(s, "agreement", sizes), _count_map(s, "agreement_shuffled", sizes), sizes)


def _p(p: float) -> str:
    return f"p = {p:.2g}" if p >= 0.001 else "p < 0.001"


def _layers(names: list[str]) -> str:
    """Layer indices in words: "layer 0", "layers 0 and 1", "layers 0, 1 and 2", "none" (a bare "0" reads as a count)."""
    if not names:
        return "none"
    if len(names) == 1:
        return f"layer {names[0]}"
    return f"layers {', '.join(names[:-1])} and {names[-1]}"


def _against_wrong(s: Mapping[str, Any], count: int) -> str | None:
    """With wrong answers: the updates holding the answer and not the wrong answer among their top tokens, the
    reverse (each with its Wilson interval) and both, and the exact two-sided sign test of the first two; None
    without those counts (no wrong answers, or an older summary). A neuron that promotes "a verb here" holds both
    answers, so the answer's share alone is no evidence of the task."""
    right, wrong, both = (_num(s.get(f"n_task_updates_{k}")) for k in ("answer_only", "wrong_only", "both"))
    if right is None or wrong is None or both is None:
        return None
    right, wrong, both = int(right), int(wrong), int(both)
    top = _num(s.get("top_k_tokens"))
    where = f"top {top:.0f} promoted tokens" if top else "top promoted tokens"

    def share(k: int) -> str:
        lo, hi = wilson(k, count)
        return f"{k} ({_pct(k / count)}, Wilson 95% CI {_pct(lo)}-{_pct(hi)})"

    text = (f"Of the {count} largest task updates, {share(right)} put the answer and not the wrong answer among their "
            f"{where}, {share(wrong)} the reverse, {both} both")
    if right + wrong:
        from scipy.stats import binomtest

        p = binomtest(right, right + wrong).pvalue  # the sign test: answer only against wrong answer only, p = 1/2
        verdict = ("more single out the answer" if p < chance.ALPHA and right > wrong else
                   "more single out the wrong answer" if p < chance.ALPHA else "neither is singled out more often")
        text += f" ({right} against {wrong}: {verdict}, exact two-sided sign test, {_p(p)})"
    return text + "."


def _corrected(pooled: float, n_layers: int) -> tuple[int, float, str]:
    """(n_layers, the pooled p Bonferroni-corrected for picking the best of them, "differ" | "differ, marginally" |
    "cannot be told apart"): a corrected p from alpha / 5 up to alpha is "marginally", as probes' chance verdict
    (review 16a B1: "the layers differ" at p_Bonferroni = 0.047, "cannot be told apart" at 0.066 in bfloat16)."""
    corrected = min(1.0, n_layers * pooled)
    return n_layers, corrected, ("cannot be told apart" if corrected >= chance.ALPHA else
                                 "differ, marginally" if corrected >= chance.ALPHA / 5 else "differ")


def between_layers(s: Mapping[str, Any]) -> str | None:
    """The mlp finding's between-layer verdict in words, 'layer 1 against the others pooled: the layers cannot be told
    apart (p = 0.044, p_Bonferroni = 0.13 over 3 layers)', or None where the finding states none (at chance, no
    counts, one layer): what `headscope compare` sets side by side (review 12b A8: the verdict flipped unlisted)."""
    if _chance(s) is not None:
        return None
    sizes, best = memory_sizes(s), best_layer(s)
    if best is None or _stale_moe(s):
        return None
    tests = _tests(s, sizes)
    pooled = None if tests is None else tests.get("best_vs_others_p")
    if (pooled is None or tests.get("best_layer") != best or best not in sizes
            or best not in tests["control_p_per_layer"]):  # as finding: no _tested sentences there
        return None
    others = [l for l in _count_map(s, "agreement", sizes) if l != best and l in sizes]
    n_layers, corrected, differ = _corrected(pooled, len(others) + 1)
    return (f"layer {best} against the others pooled: the layers {differ} ({_p(pooled)}, "
            f"{_p(corrected).replace('p ', 'p_Bonferroni ', 1)} over {n_layers} layers)")


def control_layers(s: Mapping[str, Any]) -> str | None:
    """The mlp finding's per-layer control verdict in words ("layer 3", "none"), or None where the finding states
    none (at chance, no counts, one layer): what `headscope compare` sets side by side (review 13b A3: "layer 3" in
    float32, "none" in bfloat16, unlisted)."""
    if _chance(s) is not None or _stale_moe(s):
        return None
    sizes, best = memory_sizes(s), best_layer(s)
    if best is None:
        return None
    tests = _tests(s, sizes)
    if tests is None or best not in tests["control_p_per_layer"] or best not in sizes or len(tests["control_p_per_layer"]) < 2:
        return None
    return _layers(list(tests["above_control_layers"]))  # after Bonferroni correction, as the finding (13b A3)


def _tested(s: Mapping[str, Any], tests: Mapping[str, Any], best: str, hits: int, sizes: Mapping[str, int]) -> list[str]:
    """Sentences: the best layer against its own shuffled control, every layer against its control, and the
    best layer against the others (pooled and each), all by Fisher's exact test on k of n neurons (each
    layer's own n: on a mixture of experts every expert's neurons)."""
    control = _count_map(s, "agreement_shuffled", sizes)
    n = sizes[best]
    p_best, n_tests = tests["control_p_per_layer"][best], len(tests["control_p_per_layer"])
    bonf = tests["control_p_bonferroni_per_layer"]
    # review 13b A3: each layer is one of n_tests tests against its control, so a layer is called above it only
    # after Bonferroni correction, and "no key-value memory the test can detect" is said only when none is
    above, loose = list(tests["above_control_layers"]), list(tests["above_control_uncorrected_only"])
    fixed = f", {_p(bonf[best]).replace('p ', 'p_Bonferroni ', 1)} over {n_tests} layers" if n_tests > 1 else ""
    test = f"Fisher's exact test, two-sided, {_p(p_best)}{fixed}"
    out = [f"Against its own shuffled control ({control.get(best, 0)} of {n} {unit(s, best)}, "
           f"{_pct(control.get(best, 0) / n)}), layer {best} "
           + (f"agrees more ({test})." if best in above
              else f"agrees more before correction only ({test})" if best in loose
              else f"agrees less ({test})" if bonf[best] < chance.ALPHA and hits < control.get(best, 0)
              else f"cannot be told from it ({test})")]
    if not above:
        out[-1] += (": these MLPs show no key-value memory on this corpus that the test can detect"
                    + (" after correction for the layers tested." if loose else "."))
    elif best not in above:
        out[-1] += "."
    counts = _count_map(s, "agreement", sizes)
    if n_tests > 1:
        only = "; ".join(f"layer {l} ({counts.get(l, 0)} of {sizes.get(l, '?')}, its control {control.get(l, 0)}) "
                         f"{_p(tests['control_p_per_layer'][l])}, {_p(bonf[l]).replace('p ', 'p_Bonferroni ', 1)}"
                         for l in loose)
        out.append(f"Layers above their own control at p_Bonferroni < {chance.ALPHA:g} (Fisher's p x {n_tests} layers): "
                   + _layers(above) + (f"; above it only before correction: {only}" if only else "") + ".")
    pooled, each = tests.get("best_vs_others_p"), tests.get("best_vs_layer_p") or {}
    if pooled is not None and tests.get("best_layer") == best:
        others = [l for l in counts if l != best and l in sizes]
        k_others = sum(counts[l] for l in others)
        pairs = "; ".join(f"layer {l} ({counts[l]} of {sizes[l]}) {_p(p)}" for l, p in list(each.items())[:6] if l in sizes)
        # review 12b C2: the best of L layers is picked after looking, so its pooled p is Bonferroni-corrected (x L)
        n_layers, corrected, differ = _corrected(pooled, len(others) + 1)
        fix = (f" ({_p(corrected).replace('p ', 'p_Bonferroni ', 1)} for picking the best of {n_layers} layers)"
               if n_layers > 1 else "")
        out.append(f"Between layers: layer {best} against the others pooled ({k_others} of {sum(sizes[l] for l in others)}) "
                   f"{_p(pooled)}{fix}, so the layers {differ}"
                   + (f" (corrected p between {chance.ALPHA / 5:g} and {chance.ALPHA:g})" if "marginally" in differ else "")
                   + (f"; against each, uncorrected, {pairs}" if pairs else "")
                   + " (Fisher's exact test; the best layer is picked after looking, so the verdict reads the "
                   "Bonferroni-corrected p).")
    return out


def finding(s: Mapping[str, Any]) -> str:
    """At chance: what was measured only. Key-value agreement per layer against its shuffled control;
    with the neuron count, both as k of n neurons with Wilson intervals, and "no better than the control" when the best layer's
    interval reaches down to the control's best."""
    if _chance(s) is not None:
        return _measured_only(s)
    agree = {k: _num(v) for k, v in (s.get("agreement_per_layer") or {}).items() if _num(v) is not None}
    shuffled = [v for v in (_num(x) for x in (s.get("agreement_shuffled_per_layer") or {}).values()) if v is not None]
    sizes = memory_sizes(s)  # {layer: memories}: d_mlp, or every expert's neurons
    moe = STALE_MOE if _stale_moe(s) else experts_sentence(s)
    parts = [moe] if moe else []
    if agree:
        best = best_layer(s)
        n = sizes.get(best, 0)
        counted = _num((s.get("agreement_count_per_layer") or {}).get(best))  # the recorded count (newer summaries)
        hits = int(counted) if counted is not None and n else round(agree[best] * n)
        interval = wilson(hits, n) if n else None
        size = (f" ({hits} of {n} {unit(s, best)}, Wilson 95% CI {_pct(interval[0])}-{_pct(interval[1])})"
                if interval else "")
        tied = [k for k in agree if k != best and interval and agree[k] >= interval[0]]  # inside the peak's interval
        where = (f"in layer {best}" if not tied else
                 f"in layer {best}, with layer{'s' if len(tied) > 1 else ''} {', '.join(map(str, tied))} inside its interval "
                 "(no one layer stands out)")
        parts.append(f"Agreement between a neuron's promoted token and what follows its triggers is highest at "
                     f"{_pct(agree[best])}{size} {where} (over {s.get('n_prefixes', '?')} prefixes)")
        tests = _tests(s, sizes)  # None without sizes (a stale MoE summary's recorded tests are not used either)
        if tests is not None and best in tests["control_p_per_layer"] and best in sizes:
            parts[-1] += "."
            parts.extend(_tested(s, tests, best, hits, sizes))
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
            against = _against_wrong(s, int(count))
            if against:
                parts.append(against)
            else:
                lo, hi = wilson(k, int(count))
                parts.append(f"{k} of {count:.0f} top task updates ({_pct(frac)}, Wilson 95% CI {_pct(lo)}-{_pct(hi)}) "
                             "promote the answer token.")
            per = _num(s.get("n_top_updates"))
            if examples and per:  # the updates are not independent draws: say how they cluster
                parts.append(f"They are the top {per:.0f} per example and layer over {examples:.0f} task examples; the "
                             + ("intervals and the test treat them as independent, so they overstate the evidence"
                                if against else "interval treats them as independent, so it is too narrow")
                             + " when one example's updates agree.")
        else:
            parts.append(f"{_pct(frac)} of the top task updates" + (f" (on {examples:.0f} task examples)" if examples else "")
                         + " promote the answer token.")
    named = _named_experts(s)
    if named:
        parts.append(named)
    if s.get("values_through_post_norm"):
        parts.append(POST_NORM)
    if s.get("values_through_post_ln"):
        parts.append(POST_LN)
    if words := squared_words(s):
        parts.append(words)
    if words := negative_trigger_words(s):
        parts.append(words)
    return " ".join(parts)


def negative_trigger_words(s: Mapping[str, Any]) -> str:
    """Review 20b B1 (redone): on an ungated MLP whose activation is positive below 0 (Apertus's xIELU), how many
    neurons' top trigger has a negative pre-activation k_i . x per layer (the summary's negative_top_triggers_per_layer):
    a trigger ranked by its coefficient may be a prefix the key points away from; '' where not recorded."""
    counts = s.get("negative_top_triggers_per_layer")
    if not isinstance(counts, Mapping) or not counts:
        return ""
    sizes = s.get("n_memories_per_layer") or {}
    said = [f"{int(v)}" + (f" of {int(sizes[str(l)])}" if _num(sizes.get(str(l))) else "") + f" at layer {l}"
            for l, v in counts.items() if _num(v) is not None]
    act = s.get("mlp_act") or "this MLP's activation"
    return (f"{act} is positive for negative inputs too (not monotone), so a neuron's coefficient m_i = {act}(k_i . x) "
            f"can be large where its key points away from the prefix: the top trigger has a negative pre-activation "
            f"k_i . x for {and_join(said)} neurons, and those triggers are not what the key detects in Geva et al.'s "
            "sense.")


def squared_words(s: Mapping[str, Any]) -> str:
    """Review 18e C1: on a squared activation (the summary's mlp_act, Nemotron's relu2) say that each coefficient is
    m_i = relu(k_i . x)^2, so triggers and coefficients are squares of Geva et al.'s k_i . x; '' otherwise."""
    from headscope.models.config_facts import SQUARED

    act = s.get("mlp_act")
    if act not in SQUARED or s.get("gated_mlp"):
        return ""
    formula = SQUARED[act].replace("(x)", "(k_i . x)")
    return (f"This MLP's activation is {act} without a gate: each neuron's coefficient is m_i = {formula}, so "
            "its triggers are ranked and its updates m_i v_i weighted by that square, not by Geva et al.'s k_i . x "
            "(a pre-activation of 3 gives 9).")


def _named_experts(s: Mapping[str, Any]) -> str:
    """On a mixture of experts, the neurons with the largest mean update at the answer, each with on how many task
    examples its expert was routed (its mean counts the zeros of the others; review 11c C3), then how close the
    router's choices came to a rounding step (routing_words); "" for dense models or older summaries."""
    top = [t for t in s.get("top_neurons") or [] if isinstance(t, Mapping)]
    if not _experts(s) or not top:
        return ""
    n = _num(s.get("n_task_examples"))
    of = f" of {n:.0f}" if n else ""

    def one(t: Mapping[str, Any]) -> str:
        if "expert" not in t:
            return f"layer {t['layer']} neuron {t['neuron']} ({t['task_update_norm']:.3g}, a dense MLP)"
        if t.get("shared"):
            return (f"layer {t['layer']}'s shared expert's neuron {t['expert_neuron']} ({t['task_update_norm']:.3g}, "
                    "on every example)")
        return (f"layer {t['layer']} expert {t['expert']}'s neuron {t['expert_neuron']} ({t['task_update_norm']:.3g}, "
                f"routed on {t['n_routed']}{of} examples{rounded_count(s, t)})")

    text = "The largest mean updates ||m_i v_i|| at the answer are " + and_join([one(t) for t in top]) + "."
    text += routed_words(s, top, of)
    routing = routing_words(s)
    return text + (" " + routing if routing else "")


def routed_words(s: Mapping[str, Any], top: list[Mapping[str, Any]], of: str) -> str:
    """Why routed experts' neurons rank as they do (their means count 0 on the examples not routed to their expert,
    so a dense layer's neurons, on every example, tend to rank first: not by construction, an expert routed on every
    example loses nothing) and the largest by the mean over the routed examples, each with its 95% interval and n,
    among experts routed on at least routed_min examples, naming those left out (top_expert_neurons_routed,
    experts_routed_too_few; reviews 16b B1, 17v B1); "" where not recorded."""
    best = [t for t in s.get("top_expert_neurons_routed") or [] if isinstance(t, Mapping)]
    few = [t for t in s.get("experts_routed_too_few") or [] if isinstance(t, Mapping)]
    if not best and not few:
        return ""
    dense = any("expert" not in t for t in top)
    why = ("so a dense layer's neurons, which write on every example, tend to rank above them" if dense else
           "so the ranking mixes how strongly a neuron writes with how often its expert is chosen")
    cis = [ci_pair(t.get("ci")) for t in best]
    cis = [None if ci is None else (max(0.0, ci[0]), ci[1]) for ci in cis]  # a norm is never negative (review 18v B4)
    clipped = any(t.get("ci_clipped") or (ci_pair(t.get("ci")) or (0.0,))[0] < 0 for t in best)
    said = [f"layer {t['layer']} expert {t['expert']}'s neuron {t['expert_neuron']} ({t['task_update_norm_routed']:.3g}"
            f"{_ci(ci)}, over the {t['n_routed']}{of} examples routed to it{rounded_count(s, t)})"
            for t, ci in zip(best, cis)]
    least = _num(s.get("routed_min"))
    among = f" among experts routed on at least {least:.0f}{of} examples" if least is not None else ""
    left = ""
    if few:
        names = [f"layer {t['layer']} expert {t['expert']} ({t['n_routed']})" for t in few]
        shown = and_join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        left = f" (not ranked, routed on fewer: {shown})"
    if not best:
        return (f" These means count 0 for a routed expert's neuron on the examples not routed to its expert, {why}; "
                f"no expert is routed on enough examples to rank its neurons by their routed mean{left}.")
    one = len({(t["layer"], t["expert"]) for t in best}) == 1 and len(best) > 1
    order = ""
    if len(best) > 1 and all(ci is not None for ci in cis):  # review 18v B4: no order where the intervals overlap
        order = (": their 95% intervals overlap, so their order is not shown" if cis[0][0] <= max(ci[1] for ci in cis[1:])
                 else ": the first's 95% interval lies above the others'")
    note = " (t intervals over the routed examples, clipped at 0: a norm is never negative)" if clipped else ""
    return (f" These means count 0 for a routed expert's neuron on the examples not routed to its expert, {why}; by "
            f"the mean over its routed examples alone{among}{left} the largest {'is' if len(said) == 1 else 'are'} "
            f"{and_join(said)}{', all of one expert' if one else ''}{order}{note}.")


def rounded_count(s: Mapping[str, Any], t: Mapping[str, Any]) -> str:
    """Review 18c B1: ', 8-9 up to bfloat16 rounding' after an expert's routed count where the router's top-k choice at
    the answer lies within one rounding step on examples where that expert is the last chosen (the count may fall by
    them) or the next one (it may rise): the summary's routing_near_ties; '' elsewhere."""
    ties = (s.get("routing_near_ties") or {}).get(str(t.get("layer")))
    n, expert = _num(t.get("n_routed")), t.get("expert")
    if not isinstance(ties, list) or n is None or expert is None:
        return ""
    down = sum(1 for x in ties if isinstance(x, Mapping) and x.get("chosen") == expert)
    up = sum(1 for x in ties if isinstance(x, Mapping) and x.get("next") == expert)
    if not down and not up:
        return ""
    return f", {n - down:.0f}-{n + up:.0f} up to {s.get('routing_dtype') or 'the dtype'}'s rounding"


def routing_words(s: Mapping[str, Any]) -> str:
    """In half precision, on how many examples the router's top-k choice at the answer position is within one
    rounding step of the scores it ranks (the k-th and the next at most one step of their dtype apart, as
    analyses/mlp routing_margins counts them: review 16b B2; the logits, or where the router chooses on a sigmoid or
    softmax plus a correction bias, those: review 20e A1), per MoE layer (review 11c C2); "" in float32 or where the
    summary does not record it."""
    near, dtype = s.get("routing_within_rounding"), s.get("routing_dtype")
    if not isinstance(near, Mapping) or not near or not dtype:
        return ""
    n = _num(s.get("n_task_examples"))
    ks = {e.get("top_k") for l, e in _experts(s).items() if str(l) in near}
    choice = f"top-{ks.pop()} choice" if len(ks) == 1 and None not in ks else "top-k choice"
    kinds = {str(v) for v in (s.get("routing_score") or {}).values() if not str(v).startswith("logits")}
    what = f" ({'; '.join(sorted(kinds))})" if kinds else ""
    if not any(_num(v) for v in near.values()):
        return (f"In {dtype}, no example's {choice} of experts at the answer position is within one rounding step of "
                f"the router {'scores it ranks' + what if kinds else 'logits'} "
                f"({_layers([str(l) for l in near])}" + (f", {n:.0f} examples)." if n else ")."))
    counts = [f"{int(v)}{f' of {n:.0f}' if n else ''} examples at layer {l}" for l, v in near.items()]
    unit = "score" if kinds else "logit"
    return (f"In {dtype}, the router's {choice} at the answer position is within one rounding step of "
            f"{'the scores it ranks' + what if kinds else 'its logits'} "
            f"(the last chosen and the next {unit} at most one step apart) on {and_join(counts)}: a per-expert "
            "claim there may rest on a choice that rounding made, routed counts included (each count that such a "
            "choice could move gives its range).")
