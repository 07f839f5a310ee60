"""Which blocks of a model are mixtures of experts, in words: the report header's MLP layout, the heads finding's
"Blocks 0 and 2 are mixtures of experts" and the circuits finding's note on which mlpN components are whole MoE
blocks (review 11c A3: a dense layer among MoE layers, Qwen2/3-MoE's mlp_only_layers or DeepSeek's
first_k_dense_replace, was called a mixture of experts with the others)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from headscope.reports.findings import _ci, _num, and_join, ci_pair


def _names(layers: Sequence[Any]) -> str:
    """"0", "0 and 2", "0, 2 and 4" (findings.and_join of their names)."""
    return and_join([str(l) for l in layers])


def sigmoid_routing_words(e: Mapping[str, Any]) -> str:
    """DeepSeek-V3's router as Hugging Face's DeepseekV3TopkRouter computes it (review 15d A4): sigmoid scores; the
    choice on the scores plus e_score_correction_bias, among the experts of the best topk_group of n_group groups;
    the weights the unbiased scores, renormalised over the top k (norm_topk_prob) or not, times routed_scaling_factor.
    '' for a softmax router."""
    if e.get("scoring") != "sigmoid":
        return ""
    k, scale = e.get("top_k"), e.get("routed_scaling_factor")
    n_group, topk_group = e.get("n_group"), e.get("topk_group")
    groups = (f", within the best {topk_group} of {n_group} expert groups" if isinstance(n_group, int)
              and isinstance(topk_group, int) and topk_group < n_group else "")
    bias = " plus e_score_correction_bias (for the choice only)" if e.get("choice_bias") else ""
    renorm = {True: " renormalised to sum to 1", False: " not renormalised"}.get(e.get("renormalised"), "")
    scaled = ""
    if isinstance(scale, (int, float)) and scale != 1:
        scaled = f", times routed_scaling_factor {scale:g}" + (f" (so they sum to {scale:g})" if e.get("renormalised")
                                                                else "")
    return (f"by sigmoid score{bias}{groups}; weights: the chosen experts' sigmoid scores{renorm}{scaled}"
            if k else "")


def renormalised_words(e: Mapping[str, Any]) -> str:
    """" whose weights are renormalised to sum to 1" / " whose weights are not renormalised (each expert's softmax
    over all experts)" from the layout's `renormalised` (hooks.ExpertLayout), '' where unknown (review 12a);
    DeepSeek's sigmoid router: " by sigmoid score ..." (sigmoid_routing_words)."""
    sigmoid = sigmoid_routing_words(e)
    if sigmoid:
        return f" {sigmoid}"
    if e.get("scoring") == "softmax" and e.get("choice_bias"):  # Ernie 4.5-MoE (review 20e B)
        renorm = {True: " renormalised to sum to 1", False: " not renormalised"}.get(e.get("renormalised"), "")
        return (" by softmax probability plus e_score_correction_bias (for the choice only); weights: the chosen "
                f"experts' probabilities{renorm}")
    said = e.get("renormalised")
    if said is True:
        return " whose weights are renormalised to sum to 1"
    if said is False:
        return " whose weights are not renormalised (each its softmax probability over all experts)"
    return ""


def _expert_words(e: Mapping[str, Any]) -> str:
    """"mixture of experts (4 experts x 64, top-2 whose weights are renormalised to sum to 1, + a shared expert of
    96)"."""
    top = f", top-{e['top_k']}{renormalised_words(e)}" if e.get("top_k") else ""
    shared = (f", + a shared expert of {e['shared_width']}" + ("" if e.get("shared_gated", True) else " (ungated)")
              if e.get("shared_width") else "")
    return f"mixture of experts ({e['n_experts']} experts x {e['expert_width']}{top}{shared})"


def layout_clause(experts_per_layer: Mapping[str, Mapping[str, Any]] | None, n_layers: Any, d_mlp: Any) -> str:
    """The header's MLP layout: "layers 0 and 2: mixture of experts (4 experts x 64, top-2, + a shared expert of 96);
    layer 1: dense MLP (128)", "every layer: mixture of experts (...)"; "" for a dense model (or an older manifest)."""
    if not isinstance(experts_per_layer, Mapping) or not experts_per_layer or not isinstance(n_layers, int):
        return ""
    groups: dict[str, list[int]] = {}
    for layer in range(n_layers):
        e = experts_per_layer.get(str(layer))
        what = _expert_words(e) if isinstance(e, Mapping) else f"dense MLP ({d_mlp})"
        groups.setdefault(what, []).append(layer)
    if len(groups) == 1:
        return "every layer: " + next(iter(groups))
    return "; ".join(f"layer{'s' if len(ls) > 1 else ''} {_names(ls)}: {what}" for what, ls in groups.items())


def moe_layers(s: Mapping[str, Any]) -> list[int] | None:
    """The summary's mixture-of-experts blocks (`moe_layers`), None where it does not record them."""
    layers = s.get("moe_layers")
    return [int(l) for l in layers] if isinstance(layers, (list, tuple)) else None


def blocks_subject(s: Mapping[str, Any]) -> str:
    """"Blocks 0 and 2 are mixtures of experts" where only some are, "Block 1 is a mixture of experts", else (every
    block, or an older summary without `moe_layers`) "The blocks are mixtures of experts"."""
    layers, n = moe_layers(s), s.get("n_layers")
    if not layers or (isinstance(n, int) and len(layers) >= n):
        return "The blocks are mixtures of experts"
    return (f"Block {layers[0]} is a mixture of experts" if len(layers) == 1 else
            f"Blocks {_names(layers)} are mixtures of experts")


def mlp_components_sentence(s: Mapping[str, Any]) -> str:
    """Which DLA/patching components mlpN are whole mixture-of-experts blocks (every routed expert and the shared
    one together) and which dense MLPs, once per finding; "" for a dense model."""
    layers, n = moe_layers(s), s.get("n_layers")
    if not layers:
        return ""
    moe = _names([f"mlp{l}" for l in layers])
    many = len(layers) > 1
    text = (f"The MLP component{'s' if many else ''} {moe} "
            f"{'are whole mixture-of-experts blocks' if many else 'is a whole mixture-of-experts block'}"
            " (every expert the router chose and any shared expert together)")
    dense = [l for l in range(n) if l not in layers] if isinstance(n, int) else []
    if dense:
        text += "; " + _names([f"mlp{l}" for l in dense]) + (" are dense MLPs" if len(dense) > 1 else " is a dense MLP")
    return text + "."


def top_expert_sentence(s: Mapping[str, Any]) -> str:
    """The circuits finding's per-expert DLA (summary dla_top_expert, analyses/circuits/experts.top_expert): which
    expert of the MoE block with the largest DLA writes the most along the answer direction, with its interval, n
    and routing, when the paired difference against the next expert's magnitude excludes 0; else that the two tie
    (review 11c C4). "" without the entry (a dense model, an older summary)."""
    top = s.get("dla_top_expert")
    if not isinstance(top, Mapping) or not isinstance(top.get("top"), Mapping):
        return ""

    def name(e: Mapping[str, Any]) -> str:
        return "the shared expert" if e.get("shared") else f"expert {e.get('expert')}"

    def one(e: Mapping[str, Any]) -> str:
        n = e.get("n")
        routed = "on every example" if e.get("shared") else f"routed on {e.get('n_routed')} of {n} examples"
        return f"{e['mean']:+.2f}{_ci(ci_pair(e.get('ci')))}, n = {n}, {routed}"

    layer, first, second = top.get("layer"), top["top"], top.get("next")
    mean = _num(top.get("layer_mean"))
    head = f"Split by expert (dla_experts_mean.csv), mlp{layer}'s " + (f"{mean:+.2f}" if mean is not None else "DLA")
    if not isinstance(second, Mapping):
        return f"{head} is {name(first)}'s alone ({one(first)})."
    diff = f"|{name(first)}| - |{name(second)}| = {top['difference']:+.2f}{_ci(ci_pair(top.get('difference_ci')))}"
    if top.get("tied") is False:
        return (f"{head} comes most from {name(first)} ({one(first)}), clear of {name(second)} ({one(second)}; "
                f"{diff}).")
    why = "too few examples for an interval" if top.get("tied") is None else "the interval contains 0"
    return (f"{head}: {name(first)} ({one(first)}) and {name(second)} ({one(second)}) tie ({diff}; {why}), so "
            f"neither is named as the expert that writes the answer.")
