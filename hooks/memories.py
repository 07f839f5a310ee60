"""MLP layers as key-value memories (Geva et al. 2021).

FF(x) = f(x K^T) V (+ b): keys K are the rows of the input weight (d_mlp x d_model), values V
the columns of the output weight, laid out as rows (d_mlp x d_model), and the memory
coefficients m = f(x K^T) are the activations at mlp.hook_post. For gated MLPs
(SwiGLU), m = act(x W_gate) * (x W_in); `keys` are the up-projection rows and `gate_keys` the
gate rows. Either way MLP(x) = sum_i m_i v_i + b_out.

Mixture-of-experts MLPs (Mixtral, Qwen2-MoE: a router, experts stored as stacked gate_up_proj
[expert, 2 d_expert, d_model] and down_proj [expert, d_model, d_expert], Qwen2-MoE's gated
shared expert): the memories are every expert's neurons, expert by expert (then the shared
expert's), indexed by (`expert`, `neuron`); a routed neuron's coefficient is the router's
weight on its expert times act(x . g_i) (x . k_i) on the tokens routed to that expert and 0 on
the others, a shared neuron's is sigmoid(shared gate) times its activation (DeepSeek-V2/V3's
`shared_experts`: its activation, ungated), so the sum of the
sub-updates m_i v_i is the MoE block's output as Hugging Face computes it (`moe_coefficients`;
`hooks.capture` reads site "mlp_post" this way on such models).
"""
from __future__ import annotations

import copy
import dataclasses
import weakref
from dataclasses import dataclass

import torch

from headscope.models import hooked_model
from headscope.models.hooked_model import raw_module


@dataclass(frozen=True, kw_only=True)
class MLPMemories:
    layer: int
    keys: torch.Tensor  # [d_mlp, d_model] rows of the input (up) weight
    values: torch.Tensor  # [d_mlp, d_model] columns of the output weight, one row per neuron
    gate_keys: torch.Tensor | None  # [d_mlp, d_model] rows of the gate weight (gated MLPs)
    key_bias: torch.Tensor | None  # [d_mlp]
    out_bias: torch.Tensor  # [d_model] (zeros where the model has none)
    expert: torch.Tensor | None = None  # [d_mlp] each memory's expert (MoE; n_experts: the shared expert)
    neuron: torch.Tensor | None = None  # [d_mlp] each memory's neuron within its expert (MoE)

    @property
    def gated(self) -> bool:
        return self.gate_keys is not None

    def output(self, coefficients: torch.Tensor) -> torch.Tensor:
        """sum_i m_i v_i + b: [..., d_mlp] coefficients -> [..., d_model] MLP output."""
        return coefficients @ self.values.to(coefficients.dtype) + self.out_bias.to(coefficients.dtype)

    def sub_updates(self, coefficients: torch.Tensor) -> torch.Tensor:
        """Each memory's contribution m_i v_i: [..., d_mlp] -> [..., d_mlp, d_model]."""
        return coefficients.unsqueeze(-1) * self.values.to(coefficients.dtype)


def mlp_memories(model, layer: int) -> MLPMemories:
    """Keys, values and biases of one MLP layer, for plain and gated MLPs and mixtures of experts
    (see the module doc)."""
    model.check_layer(layer)
    mlp = model.bridge.blocks[layer].mlp
    moe = _moe(mlp)
    if moe is not None:
        return _moe_memories(layer, *moe)
    w_in = mlp.W_in.detach()  # [d_model, d_mlp]
    w_out = mlp.W_out.detach()  # [d_mlp, d_model]
    w_gate = getattr(mlp, "W_gate", None)
    b_in = getattr(mlp, "b_in", None)
    b_out = getattr(mlp, "b_out", None)
    return MLPMemories(
        layer=layer,
        keys=w_in.T.contiguous(),
        values=w_out.contiguous(),
        gate_keys=None if w_gate is None else w_gate.detach().T.contiguous(),
        key_bias=None if b_in is None else b_in.detach(),
        out_bias=torch.zeros(w_out.shape[1], dtype=w_out.dtype, device=w_out.device) if b_out is None else b_out.detach(),
    )


def _moe(mlp: torch.nn.Module):
    """(router, experts, shared expert or None, shared expert's gate or None), raw Hugging Face
    modules, for a mixture-of-experts MLP of the stacked layout; None for a dense MLP. A layout
    this module does not know is an UnsupportedModelError, never numbers from the wrong weights."""
    if mlp is None:
        return None
    block = raw_module(mlp)
    experts = getattr(block, "experts", None)
    if experts is None or getattr(block, "gate", None) is None:
        return None
    experts = raw_module(experts)
    up, down = getattr(experts, "gate_up_proj", None), getattr(experts, "down_proj", None)
    if (not isinstance(up, torch.Tensor) or not isinstance(down, torch.Tensor) or up.ndim != 3
            or getattr(experts, "is_transposed", False) or up.shape[1] != 2 * down.shape[2]):
        from headscope.errors import UnsupportedModelError

        raise UnsupportedModelError(f"{type(block).__name__}: MLP memories know mixtures of experts with stacked "
                                    f"gate_up_proj [expert, 2 d_expert, d_model] and down_proj weights only.")
    shared = getattr(block, "shared_expert", None)  # Qwen2-MoE's (gated by sigmoid(shared_expert_gate))
    if shared is None:  # DeepSeek-V2/V3's n_shared_experts as one MLP, added ungated (HF DeepseekV3MoE.forward)
        shared = getattr(block, "shared_experts", None)
    shared_gate = getattr(block, "shared_expert_gate", None)
    return (raw_module(block.gate), experts, None if shared is None else raw_module(shared),
            None if shared_gate is None else raw_module(shared_gate))


def _moe_memories(layer: int, router, experts, shared, shared_gate) -> MLPMemories:
    up, down = experts.gate_up_proj.detach(), experts.down_proj.detach()  # [E, 2 d_e, d_model], [E, d_model, d_e]
    n_experts, d_e = up.shape[0], down.shape[2]
    gate_keys, keys, values = [up[:, :d_e].flatten(0, 1)], [up[:, d_e:].flatten(0, 1)], [down.transpose(1, 2).flatten(0, 1)]
    expert = [torch.arange(n_experts).repeat_interleave(d_e)]
    neuron = [torch.arange(d_e).repeat(n_experts)]
    if shared is not None:
        raw = {n: raw_module(getattr(shared, n)).weight.detach() for n in ("gate_proj", "up_proj", "down_proj")}
        gate_keys.append(raw["gate_proj"])
        keys.append(raw["up_proj"])
        values.append(raw["down_proj"].T)
        expert.append(torch.full((raw["up_proj"].shape[0],), n_experts))
        neuron.append(torch.arange(raw["up_proj"].shape[0]))
    values = torch.cat(values).contiguous()
    return MLPMemories(layer=layer, keys=torch.cat(keys).contiguous(), values=values,
                       gate_keys=torch.cat(gate_keys).contiguous(), key_bias=None,
                       out_bias=torch.zeros(values.shape[1], dtype=values.dtype, device=values.device),
                       expert=torch.cat(expert), neuron=torch.cat(neuron))


def is_moe(model, layer: int) -> bool:
    """Whether block `layer`'s MLP is a mixture of experts (memories per expert)."""
    return _moe(getattr(model.bridge.blocks[layer], "mlp", None)) is not None


def moe_layers(model) -> list[int]:
    """The layers whose MLP is a mixture of experts (is_moe), in order; [] on a dense model."""
    return [layer for layer in range(model.facts.n_layers) if is_moe(model, layer)]


def moe_coefficients(model, layer: int, x: torch.Tensor) -> torch.Tensor:
    """The memory coefficients [..., d_mlp] of a mixture-of-experts MLP from its input x
    [..., d_model] (see the module doc): per expert, only on the tokens routed to it, weighted by
    the router as Hugging Face's MoE block; the shared expert's scaled by its sigmoid gate (Qwen2-MoE) or as they
    are (DeepSeek's shared_experts, added ungated)."""
    router, experts, shared, shared_gate = _moe(model.bridge.blocks[layer].mlp)
    flat = x.reshape(-1, x.shape[-1])  # [N, d_model]
    up = experts.gate_up_proj  # [E, 2 d_e, d_model]
    n_experts = up.shape[0]
    mix = moe_routing(model, layer, flat)["expert_weights"].to(flat.dtype)  # [N, E] 0 where not chosen
    parts = []
    for e in range(n_experts):
        gate, lin = torch.nn.functional.linear(flat, up[e]).chunk(2, dim=-1)  # [N, d_e] each
        parts.append(experts.act_fn(gate) * lin * mix[:, e:e + 1])
    if shared is not None:
        h = shared.act_fn(shared.gate_proj(flat)) * shared.up_proj(flat)  # [N, d_shared]
        parts.append(h if shared_gate is None else h * torch.sigmoid(shared_gate(flat)))
    return torch.cat(parts, dim=-1).reshape(*x.shape[:-1], -1)


def _route(block, router, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, chosen experts) [N, top_k] each for flat MLP inputs [N, d_model], as Hugging Face's MoE block routes:
    a router that returns (logits, weights, indices) says them (transformers >= 5.1x); an older DeepSeek-V3 router
    returns its logits and the block chooses (route_tokens_to_experts, transformers 5.9)."""
    out = router(flat)
    if isinstance(out, tuple) and len(out) == 3:
        return out[1], out[2]
    chosen, weights = block.route_tokens_to_experts(out)
    return weights, chosen


def _setting(router, block, *names: str, default=None):
    """A routing setting from the router (newer transformers) or, failing that, its MoE block (transformers 5.9's
    DeepSeek-V3 keeps top_k, n_group, topk_group, norm_topk_prob and routed_scaling_factor there)."""
    for owner in (router, block):
        for name in names:
            value = getattr(owner, name, None)
            if value is not None:
                return value
    return default


def moe_routing(model, layer: int, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The router's choice on MLP input x [..., d_model] as Hugging Face's MoE block makes it (its own gate module):
    {"expert_indices": [..., top_k] the chosen experts, "expert_weights": [..., expert] each expert's weight in the
    mix, 0 where not chosen} (sites of those names where the bridge has no hook point: DeepSeek-V3, review 15d C5)."""
    router, experts, _, _ = _moe(model.bridge.blocks[layer].mlp)
    weights, chosen = _route(raw_module(model.bridge.blocks[layer].mlp), router, x.reshape(-1, x.shape[-1]))
    mix = torch.zeros(chosen.shape[0], experts.gate_up_proj.shape[0], dtype=weights.dtype, device=weights.device)
    mix.scatter_(1, chosen, weights)  # [N, expert]
    return {"expert_indices": chosen.reshape(*x.shape[:-1], -1), "expert_weights": mix.reshape(*x.shape[:-1], -1)}


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
    scoring: str | None = None  # "sigmoid" for DeepSeek-V3's router (else the softmax, not recorded)
    routed_scaling_factor: float | None = None  # DeepSeek: the top-k weights are multiplied by it
    n_group: int | None = None  # DeepSeek's group-limited choice: top-k among the best topk_group of n_group groups
    topk_group: int | None = None
    choice_bias: bool = False  # DeepSeek's e_score_correction_bias: added to the scores for the choice only

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
    sums = out[1].float().sum(-1)  # [8]
    return bool(torch.allclose(sums, torch.ones_like(sums), atol=4 * float(torch.finfo(weight.dtype).eps)))


def expert_layout(model, layer: int) -> ExpertLayout | None:
    """Block `layer`'s ExpertLayout; None for a dense MLP."""
    moe = _moe(model.bridge.blocks[layer].mlp)
    if moe is None:
        return None
    router, experts, shared, shared_gate = moe
    block = raw_module(model.bridge.blocks[layer].mlp)
    top_k = _setting(router, block, "top_k")
    n_experts = experts.gate_up_proj.shape[0]
    sigmoid = isinstance(getattr(router, "e_score_correction_bias", None), torch.Tensor)  # HF DeepseekV3TopkRouter
    return ExpertLayout(n_experts=n_experts, expert_width=experts.down_proj.shape[2],
                        top_k=None if top_k is None else int(top_k),
                        shared_width=0 if shared is None else raw_module(shared.up_proj).weight.shape[0],
                        renormalised=_renormalised(router, None if top_k is None else int(top_k), n_experts,
                                                   _setting(router, block, "norm_topk_prob")),
                        shared_gated=shared is not None and shared_gate is not None,
                        **(dict(scoring="sigmoid", choice_bias=True,
                                routed_scaling_factor=float(_setting(router, block, "routed_scaling_factor", default=1.0)),
                                n_group=int(_setting(router, block, "num_group", "n_group", default=1)),
                                topk_group=int(_setting(router, block, "topk_group", default=1))) if sigmoid else {}))


def n_memories(model, layer: int) -> int:
    """How many memories block `layer`'s MLP has: d_mlp, or every expert's neurons (MoE)."""
    layout = expert_layout(model, layer)
    if layout is None:
        return model.facts.d_mlp
    return layout.n_experts * layout.expert_width + layout.shared_width


hooked_model.EXPERT_LAYOUT = expert_layout  # the model's repr names each kind of MLP (review 16b C2)
