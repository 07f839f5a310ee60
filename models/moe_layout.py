"""Mixture-of-experts MLPs read from a model's own modules (pure structure, no hooks): `moe_modules` finds a block's
router, experts and shared expert (the stacked layout: gate_up_proj [expert, 2 d_expert, d_model], down_proj
[expert, d_model, d_expert]); `expert_layout` its ExpertLayout (experts, width, top-k, shared expert, routing),
which HookedModel's repr, hooks.memories and the reports read."""
from __future__ import annotations

import copy
import dataclasses
import weakref
from dataclasses import dataclass

import torch

from headscope.models.hooked_model import raw_module


def moe_parts(mlp: torch.nn.Module):
    """(router, experts, shared expert or None, shared expert's gate or None), raw Hugging Face modules, for a
    mixture-of-experts MLP of any layout (its router named `gate`, or `router` as GPT-OSS's); None for a dense MLP.
    Structure only: whether the memories can read its weights is moe_modules'."""
    if mlp is None:
        return None
    block = raw_module(mlp)
    experts = getattr(block, "experts", None)
    router = getattr(block, "gate", None)
    router = getattr(block, "router", None) if router is None else router  # GPT-OSS's GptOssTopKRouter
    if experts is None or router is None:
        return None
    shared = getattr(block, "shared_expert", None)  # Qwen2-MoE's (gated by sigmoid(shared_expert_gate))
    if shared is None:  # DeepSeek-V2/V3's n_shared_experts as one MLP, added ungated (HF DeepseekV3MoE.forward)
        shared = getattr(block, "shared_experts", None)
    shared_gate = getattr(block, "shared_expert_gate", None)
    return (raw_module(router), raw_module(experts), None if shared is None else raw_module(shared),
            None if shared_gate is None else raw_module(shared_gate))


def moe_modules(mlp: torch.nn.Module):
    """moe_parts for a mixture-of-experts MLP of a layout the memories read: the stacked one (gate_up_proj [expert,
    2 d_expert, d_model], down_proj [expert, d_model, d_expert], no expert biases) or GPT-OSS's (`interleaved`);
    None for a dense MLP. Any other layout is an UnsupportedModelError in one line, never numbers from the wrong
    weights."""
    parts = moe_parts(mlp)
    if parts is None:
        return None
    experts = parts[1]
    if interleaved(experts):
        return parts
    up, down = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
    if (not isinstance(up, torch.Tensor) or not isinstance(down, torch.Tensor) or up.ndim != 3
            or getattr(experts, "is_transposed", False) or up.shape[1] != 2 * down.shape[2]
            or isinstance(getattr(experts, "gate_up_proj_bias", None), torch.Tensor)):
        from headscope.errors import UnsupportedModelError

        raise UnsupportedModelError(
            f"{type(raw_module(mlp)).__name__}: MLP memories read mixtures of experts with stacked gate_up_proj "
            f"[expert, 2 d_expert, d_model] and down_proj weights and no expert biases, or GPT-OSS's layout, only; "
            f"this one stores {_layout_words(experts)}.")
    return parts


def interleaved(experts) -> bool:
    """Whether `experts` is GPT-OSS's layout (GptOssExperts): gate_up_proj [expert, d_model, 2 d_expert] with gate
    and up interleaved along its last axis (gate_up[..., ::2], gate_up[..., 1::2]), gate_up_proj_bias [expert,
    2 d_expert], down_proj [expert, d_expert, d_model], down_proj_bias [expert, d_model] and a clamped SwiGLU
    (expert_activation). The memories read it exactly (hooks.memories): each expert's output bias is added times
    the router's weight on the expert."""
    up, down = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
    up_bias, down_bias = getattr(experts, "gate_up_proj_bias", None), getattr(experts, "down_proj_bias", None)
    if expert_activation(experts) is None or not all(isinstance(t, torch.Tensor) for t in (up, down, up_bias, down_bias)):
        return False
    n, d_model, two_e = up.shape if up.ndim == 3 else (None, None, None)
    return (up.ndim == 3 and down.ndim == 3 and two_e % 2 == 0 and tuple(down.shape) == (n, two_e // 2, d_model)
            and tuple(up_bias.shape) == (n, two_e) and tuple(down_bias.shape) == (n, d_model))


def _layout_words(experts) -> str:
    """What an expert layout the memories do not read holds, for the refusal."""
    up = getattr(experts, "gate_up_proj", None)
    words = [f"gate_up_proj {list(up.shape)}" if isinstance(up, torch.Tensor) else "no stacked gate_up_proj"]
    if isinstance(getattr(experts, "alpha", None), (int, float)) and isinstance(getattr(experts, "limit", None),
                                                                                  (int, float)):
        words.append("gate and up interleaved")  # GPT-OSS's _apply_gate: gate_up[..., ::2], gate_up[..., 1::2]
    if isinstance(getattr(experts, "gate_up_proj_bias", None), torch.Tensor):
        words.append("per-expert biases")
    act = expert_activation(experts)
    return ", ".join(words) + (f" and a {act}" if act else "")


def expert_activation(experts) -> str | None:
    """The experts' own activation where it is not the config's hidden_act (GPT-OSS's GptOssExperts._apply_gate:
    g = min(gate, limit), (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha g)): 'clamped SwiGLU (limit 7, alpha
    1.702, up + 1)'; None otherwise."""
    alpha, limit = getattr(experts, "alpha", None), getattr(experts, "limit", None)
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (alpha, limit)):
        return None
    return f"clamped SwiGLU (limit {limit:g}, alpha {alpha:g}, up + 1)"


def _setting(router, block, *names: str, default=None):
    """A routing setting from the router (newer transformers) or, failing that, its MoE block (transformers 5.9's
    DeepSeek-V3 keeps top_k, n_group, topk_group, norm_topk_prob and routed_scaling_factor there)."""
    for owner in (router, block):
        for name in names:
            value = getattr(owner, name, None)
            if value is not None:
                return value
    return default


@dataclass(frozen=True, kw_only=True)
class ExpertLayout:
    """The shape of a mixture-of-experts MLP's memories: n_experts routed experts of expert_width
    neurons each (top_k chosen per token; None where the router does not say), then a shared expert
    of shared_width neurons (0: none). renormalised: whether the top_k router weights are renormalised to sum
    to 1 (Qwen2/3-MoE's config norm_topk_prob, Mixtral's always) or left as the softmax over every expert;
    None where it cannot be told (review 12a: a Qwen3-MoE report never said which weights a coefficient uses)."""

    n_experts: int
    expert_width: int
    top_k: int | None
    shared_width: int = 0
    renormalised: bool | None = None
    shared_gated: bool = False  # Qwen2-MoE's sigmoid(shared_expert_gate); DeepSeek's shared_experts are ungated
    scoring: str | None = None  # "sigmoid" for DeepSeek-V3's router, "softmax" where a choice bias is added to it
    # (Ernie 4.5-MoE); None: a plain softmax, not recorded
    routed_scaling_factor: float | None = None  # DeepSeek: the top-k weights are multiplied by it
    n_group: int | None = None  # DeepSeek's group-limited choice: top-k among the best topk_group of n_group groups
    topk_group: int | None = None
    choice_bias: bool = False  # DeepSeek's, Glm4-MoE's, Ernie's e_score_correction_bias: added for the choice only

    def as_dict(self) -> dict:
        """The layout for a summary or manifest: shared_gated only with a shared expert, the sigmoid router's fields
        only on one (a softmax router's record stays as before review 15d)."""
        return {k: v for k, v in dataclasses.asdict(self).items()
                if k in _ALWAYS or (k == "shared_gated" and self.shared_width) or self.scoring is not None}


_ALWAYS = ("n_experts", "expert_width", "top_k", "shared_width", "renormalised")
_MEASURED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # router module -> its measured renormalisation


@torch.no_grad()
def _renormalised(router, top_k: int | None, n_experts: int, said: bool | None = None) -> bool | None:
    """The router's norm_topk_prob (from the model's config) where it has one; else measured once per router (cached:
    expert_layout runs for every MoE layer on every chunk) on a copy of it, so the model's own router never runs on
    made-up inputs (one that keeps statistics, aux-loss or load counters, keeps them): its top-k weights for 8 random
    inputs summing to 1 (Mixtral's router renormalises with no setting for it); None where it cannot be run or
    top_k covers every expert (then the softmax sums to 1 either way)."""
    said = getattr(router, "norm_topk_prob", said)
    if isinstance(said, bool):
        return said
    weight = getattr(router, "weight", None)
    if not top_k or top_k >= n_experts or not isinstance(weight, torch.Tensor) or weight.ndim != 2:
        return None
    if router not in _MEASURED:
        _MEASURED[router] = _measure_renormalised(router, weight)
    return _MEASURED[router]


def _measure_renormalised(router, weight: torch.Tensor) -> bool | None:
    x = torch.randn(8, weight.shape[1], generator=torch.Generator().manual_seed(0)).to(weight)  # [8, d_model]
    try:
        out = copy.deepcopy(router)(x)
    except Exception:  # a router of another signature: not told rather than guessed
        return None
    if not isinstance(out, tuple) or len(out) != 3:
        return None
    weights = [t for t in out[1:] if t.is_floating_point()]  # (logits, weights, indices); 5.9's Ernie: indices first
    if len(weights) != 1:
        return None
    sums = weights[0].float().sum(-1)  # [8]
    return bool(torch.allclose(sums, torch.ones_like(sums), atol=4 * float(torch.finfo(weight.dtype).eps)))


def expert_layout(model, layer: int) -> ExpertLayout | None:
    """Block `layer`'s ExpertLayout; None for a dense MLP."""
    moe = moe_parts(model.bridge.blocks[layer].mlp)  # any layout: the memories' own check is moe_modules'
    if moe is None:
        return None
    router, experts, shared, shared_gate = moe
    block = raw_module(model.bridge.blocks[layer].mlp)
    top_k = _setting(router, block, "top_k")
    n_experts = experts.gate_up_proj.shape[0]
    width = getattr(experts, "intermediate_size", None)  # GPT-OSS: down_proj [expert, d_expert, d_model]
    width = int(width) if isinstance(width, int) and isinstance(getattr(experts, "gate_up_proj_bias", None),
                                                                torch.Tensor) else experts.down_proj.shape[2]
    sigmoid = isinstance(getattr(router, "e_score_correction_bias", None), torch.Tensor)  # HF DeepseekV3TopkRouter
    statics = getattr(router, "moe_statics", None)  # Ernie 4.5-MoE: softmax, then a correction bias for the choice
    softmax_bias = isinstance(getattr(statics, "e_score_correction_bias", None), torch.Tensor)
    return ExpertLayout(n_experts=n_experts, expert_width=width,
                        top_k=None if top_k is None else int(top_k),
                        shared_width=0 if shared is None else raw_module(shared.up_proj).weight.shape[0],
                        renormalised=_renormalised(router, None if top_k is None else int(top_k), n_experts,
                                                   _setting(router, block, "norm_topk_prob")),
                        shared_gated=shared is not None and shared_gate is not None,
                        **(dict(scoring="sigmoid", choice_bias=True,
                                routed_scaling_factor=float(_setting(router, block, "routed_scaling_factor", default=1.0)),
                                n_group=int(_setting(router, block, "num_group", "n_group", default=1)),
                                topk_group=int(_setting(router, block, "topk_group", default=1))) if sigmoid else
                           dict(scoring="softmax", choice_bias=True) if softmax_bias else {}))


def choice_scores(model, layer: int, logits: torch.Tensor) -> tuple[torch.Tensor, str, torch.dtype]:
    """(scores [..., expert], what they are, the dtype the router computes them in) that block `layer`'s router ranks to
    choose its top-k experts, from its logits [..., expert] (site router_logits), as Hugging Face's router computes
    them: DeepSeek-V3's and Glm4-MoE's sigmoid(logits) + e_score_correction_bias, -inf outside the topk_group groups
    it keeps (groups ranked by the sum of their two best scores); Ernie 4.5-MoE's softmax(logits) + moe_statics'
    correction bias, in float32; the logits themselves elsewhere (a softmax or a top-k softmax keeps their order), in
    the model's dtype. Ranking the raw logits instead names the wrong pair of experts wherever a correction bias
    reorders them (review 20e A1)."""
    router, _, _, _ = moe_parts(model.bridge.blocks[layer].mlp)
    block = raw_module(model.bridge.blocks[layer].mlp)
    statics = getattr(router, "moe_statics", None)  # Ernie 4.5-MoE: softmax, then the correction bias for the choice
    if isinstance(getattr(statics, "e_score_correction_bias", None), torch.Tensor):
        bias = statics.e_score_correction_bias.detach().reshape(-1).float().to(logits.device)  # [expert]
        return (torch.softmax(logits.float(), dim=-1) + bias, "softmax of the logits plus the correction bias",
                torch.float32)
    bias = getattr(router, "e_score_correction_bias", None)
    if not isinstance(bias, torch.Tensor):
        return logits, "logits", model.dtype
    scores = logits.float().sigmoid() + bias.detach().float().to(logits.device)  # [..., expert]
    groups = int(_setting(router, block, "num_group", "n_group", default=1) or 1)
    keep = int(_setting(router, block, "topk_group", default=groups) or groups)
    if groups > 1 and keep < groups:
        flat = scores.reshape(-1, groups, scores.shape[-1] // groups)  # [N, group, expert in group]
        best = flat.topk(min(2, flat.shape[-1]), dim=-1).values.sum(-1)  # [N, group]
        chosen = torch.zeros_like(best).scatter_(1, best.topk(keep, dim=-1).indices, 1.0).bool()  # [N, group]
        flat = flat.masked_fill(~chosen[..., None], float("-inf"))
        scores = flat.reshape(scores.shape)
    return scores, "sigmoid of the logits plus the correction bias" + (
        f", within the {keep} of {groups} groups it keeps" if groups > 1 and keep < groups else ""), torch.float32
