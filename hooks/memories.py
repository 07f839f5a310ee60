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

GPT-OSS's experts (models.moe_layout.interleaved: gate and up interleaved, per-expert biases, a clamped SwiGLU)
are read exactly too: keys and gate keys carry their biases (`key_bias`, `gate_key_bias`), a routed neuron's
coefficient is the router's weight times the experts' own activation of its (gate, up) pair, and each expert's
output bias b_e, which belongs to no neuron, is `expert_bias`: the block's output is sum_i m_i v_i + sum_e w_e b_e
(`routed_bias`, w the router's weights on the experts, site "expert_weights").
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from headscope.models.hooked_model import raw_module
from headscope.models.moe_layout import expert_layout, interleaved, moe_modules, moe_parts


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
    gate_key_bias: torch.Tensor | None = None  # [d_mlp] the gate rows' biases (GPT-OSS's experts)
    expert_bias: torch.Tensor | None = None  # [n_experts, d_model] each expert's output bias, times its router weight

    def routed_bias(self, expert_weights: torch.Tensor) -> torch.Tensor:
        """sum_e w_e b_e: [..., n_experts] router weights (0 where not chosen) -> [..., d_model]; the part of a
        GPT-OSS block's output that no neuron writes (zeros where the experts have no output biases)."""
        if self.expert_bias is None:
            return expert_weights.new_zeros(*expert_weights.shape[:-1], self.values.shape[1])
        return expert_weights @ self.expert_bias.to(expert_weights.dtype)

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
    moe = moe_modules(mlp)
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


def _moe_memories(layer: int, router, experts, shared, shared_gate) -> MLPMemories:
    if interleaved(experts):
        return _interleaved_memories(layer, experts)
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


def _interleaved_memories(layer: int, experts) -> MLPMemories:
    """GPT-OSS's experts as memories: gate_up_proj [E, d_model, 2 d_e] (gate on even columns, up on odd ones),
    down_proj [E, d_e, d_model], their biases kept (see the module doc)."""
    up, down = experts.gate_up_proj.detach(), experts.down_proj.detach()  # [E, d_model, 2 d_e], [E, d_e, d_model]
    bias = experts.gate_up_proj_bias.detach()  # [E, 2 d_e]
    n_experts, d_e = down.shape[0], down.shape[1]
    return MLPMemories(layer=layer, keys=up[..., 1::2].transpose(1, 2).flatten(0, 1).contiguous(),  # [E d_e, d_model]
                       values=down.flatten(0, 1).contiguous(),  # [E d_e, d_model]
                       gate_keys=up[..., ::2].transpose(1, 2).flatten(0, 1).contiguous(),
                       key_bias=bias[:, 1::2].flatten().contiguous(), gate_key_bias=bias[:, ::2].flatten().contiguous(),
                       out_bias=torch.zeros(down.shape[2], dtype=down.dtype, device=down.device),
                       expert_bias=experts.down_proj_bias.detach(),
                       expert=torch.arange(n_experts).repeat_interleave(d_e), neuron=torch.arange(d_e).repeat(n_experts))


def is_moe(model, layer: int) -> bool:
    """Whether block `layer`'s MLP is a mixture of experts (memories per expert where moe_modules reads its layout)."""
    return moe_parts(getattr(model.bridge.blocks[layer], "mlp", None)) is not None


def expert_memories(model, layer: int) -> bool:
    """Whether block `layer` is a mixture of experts whose memories moe_modules reads (site mlp_post then holds
    every expert's coefficients); False on a dense MLP and on a layout it refuses (mlp_post stays the hook's own
    value there)."""
    from headscope.errors import UnsupportedModelError

    try:
        return moe_modules(getattr(model.bridge.blocks[layer], "mlp", None)) is not None
    except UnsupportedModelError:
        return False


def memories_gap(model) -> str | None:
    """Why the MLP memories cannot be read on `model`: the first mixture-of-experts layer whose layout moe_modules
    refuses, in one line; None where every layer's can (review 19b A1: the mlp analysis failed late)."""
    from headscope.errors import UnsupportedModelError

    for layer, block in enumerate(getattr(getattr(model, "bridge", None), "blocks", None) or []):
        try:
            moe_modules(getattr(block, "mlp", None))
        except UnsupportedModelError as err:
            return f"layer {layer}: {err}"
    return None


def moe_layers(model) -> list[int]:
    """The layers whose MLP is a mixture of experts (is_moe), in order; [] on a dense model."""
    return [layer for layer in range(model.facts.n_layers) if is_moe(model, layer)]


def moe_coefficients(model, layer: int, x: torch.Tensor) -> torch.Tensor:
    """The memory coefficients [..., d_mlp] of a mixture-of-experts MLP from its input x
    [..., d_model] (see the module doc): per expert, only on the tokens routed to it, weighted by
    the router as Hugging Face's MoE block; the shared expert's scaled by its sigmoid gate (Qwen2-MoE) or as they
    are (DeepSeek's shared_experts, added ungated)."""
    router, experts, shared, shared_gate = moe_modules(model.bridge.blocks[layer].mlp)
    flat = x.reshape(-1, x.shape[-1])  # [N, d_model]
    up = experts.gate_up_proj  # [E, 2 d_e, d_model]; GPT-OSS: [E, d_model, 2 d_e] interleaved, biased
    n_experts = up.shape[0]
    mix = moe_routing(model, layer, flat)["expert_weights"].to(flat.dtype)  # [N, E] 0 where not chosen
    parts = []
    for e in range(n_experts):
        if interleaved(experts):  # GPT-OSS: its own clamped SwiGLU on (gate, up) = gate_up[..., ::2], [..., 1::2]
            parts.append(experts._apply_gate(flat @ up[e] + experts.gate_up_proj_bias[e]) * mix[:, e:e + 1])
            continue
        gate, lin = torch.nn.functional.linear(flat, up[e]).chunk(2, dim=-1)  # [N, d_e] each
        parts.append(experts.act_fn(gate) * lin * mix[:, e:e + 1])
    if shared is not None:
        h = shared.act_fn(shared.gate_proj(flat)) * shared.up_proj(flat)  # [N, d_shared]
        parts.append(h if shared_gate is None else h * torch.sigmoid(shared_gate(flat)))
    return torch.cat(parts, dim=-1).reshape(*x.shape[:-1], -1)


def _route(block, router, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights, chosen experts) [N, top_k] each for flat MLP inputs [N, d_model], as Hugging Face's MoE block routes:
    a router that returns (logits, weights, indices) says them (transformers >= 5.1x; 5.9's Ernie 4.5-MoE returns
    (logits, indices, weights)); an older DeepSeek-V3 or Glm4-MoE router returns its logits and the block chooses
    (route_tokens_to_experts, transformers 5.9)."""
    out = router(flat)
    if isinstance(out, tuple) and len(out) == 3:  # (logits, weights, indices); transformers 5.9's Ernie 4.5-MoE:
        weights = [t for t in out[1:] if t.is_floating_point()]  # (logits, indices, weights): told apart by dtype
        chosen = [t for t in out[1:] if not t.is_floating_point()]
        if len(weights) == 1 and len(chosen) == 1:
            return weights[0], chosen[0]
        return out[1], out[2]
    chosen, weights = block.route_tokens_to_experts(out)
    return weights, chosen


def moe_routing(model, layer: int, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The router's choice on MLP input x [..., d_model] as Hugging Face's MoE block makes it (its own gate module):
    {"expert_indices": [..., top_k] the chosen experts, "expert_weights": [..., expert] each expert's weight in the
    mix, 0 where not chosen} (sites of those names where the bridge has no hook point: DeepSeek-V3, review 15d C5)."""
    router, experts, _, _ = moe_parts(model.bridge.blocks[layer].mlp)  # routing reads no expert weights
    weights, chosen = _route(raw_module(model.bridge.blocks[layer].mlp), router, x.reshape(-1, x.shape[-1]))
    mix = torch.zeros(chosen.shape[0], experts.gate_up_proj.shape[0], dtype=weights.dtype, device=weights.device)
    mix.scatter_(1, chosen, weights)  # [N, expert]
    return {"expert_indices": chosen.reshape(*x.shape[:-1], -1), "expert_weights": mix.reshape(*x.shape[:-1], -1)}


def n_memories(model, layer: int) -> int:
    """How many memories block `layer`'s MLP has: d_mlp, or every expert's neurons (MoE)."""
    layout = expert_layout(model, layer)
    if layout is None:
        return model.facts.d_mlp
    return layout.n_experts * layout.expert_width + layout.shared_width

