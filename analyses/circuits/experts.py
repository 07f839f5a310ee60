"""Direct logit attribution split by expert on mixture-of-experts blocks (#34 review 11c C4).

DLA gives a whole MoE block one row (mlpN). Its output is the sum of its experts' weighted outputs
(and the gated shared expert's, Qwen2-MoE), which are the block's memories grouped by expert
(hooks.memories: the coefficients at site "mlp_post" are the router's weight times each expert's
activation, 0 where the router did not choose the expert). Each group's write sum_i m_i v_i at the
answer position goes through the same linearised final norm (dla.project) onto the same direction
as mlpN, so the experts' rows of one layer sum to its mlpN row up to float rounding (the memories'
products in the model's dtype against the block's own). Post-MLP norms (a norm of the whole MLP
output before the residual add) are read at their frozen scale as dla.frozen_norm does for heads: the scale
the norm had on the block's output (its mlp_out hook; where the model has none, the norm run on the memories' sum).
"""
from __future__ import annotations

import pandas as pd
import torch

from headscope import hooks
from headscope.analyses.circuits.dla import frozen_norm, project
from headscope.analyses.core import chance
from headscope.execution.block_shape import post_mlp_norm
from headscope.hooks import site


def expert_sites(model) -> list[str]:
    """The mixture-of-experts blocks' coefficient sites ("mlp_post") where the memories read the experts, and the
    router's weights ("expert_weights") on blocks whose experts have output biases (GPT-OSS: an expert's write is
    its neurons' plus its router weight times its bias), [] on a dense model."""
    from headscope.hooks.memories import expert_memories

    layers = [layer for layer in hooks.moe_layers(model) if expert_memories(model, layer)]
    return [site("mlp_post", layer) for layer in layers] + [
        site("expert_weights", layer) for layer in layers if hooks.mlp_memories(model, layer).expert_bias is not None]


@torch.no_grad()
def expert_rows(model, acts, positions: torch.Tensor, slots: torch.Tensor, directions: torch.Tensor,
                examples: torch.Tensor) -> pd.DataFrame:
    """One row per (example, MoE layer, expert): example, layer, expert (the shared expert is n_experts), shared,
    routed (the router chose the expert for that example's answer position; the shared expert always) and
    contribution (its write's DLA along `directions` [batch, d_model]).

    acts: the DLA sites (dla.dla_sites) at every position and `expert_sites` at the chunk's distinct answer
    positions; positions [batch] each row's answer position, slots [batch] its index among those captured."""
    rows = torch.arange(positions.shape[0])
    scale = acts["ln_final.hook_scale"][rows, positions.to(acts["ln_final.hook_scale"].device)] \
        if "ln_final.hook_scale" in acts else None  # [batch, 1]
    frames = []
    for name in (n for n in expert_sites(model) if n.endswith("hook_post")):
        layer = int(name.split(".")[1])
        memories = hooks.mlp_memories(model, layer)
        m = acts[name][rows.to(acts[name].device), slots.to(acts[name].device)].float()  # [batch, memories]
        experts = memories.expert.to(m.device)
        ids = experts.unique().tolist()
        values = memories.values.float().to(m.device)  # [memories, d_model]
        writes = torch.stack([m[:, experts == e] @ values[experts == e] for e in ids], dim=1)  # [batch, expert, d_model]
        if memories.expert_bias is not None:  # GPT-OSS: each expert's output bias times the router's weight on it
            mix = acts[site("expert_weights", layer)]
            mix = mix[rows.to(mix.device), slots.to(mix.device)].float().to(m.device)  # [batch, expert]
            writes = writes + mix[:, :, None] * memories.expert_bias.float().to(m.device)  # [batch, expert, d_model]
        writes = writes * float(getattr(model.bridge.blocks[layer], "residual_contribution_scale", 1.0))  # GraniteMoe
        norm = post_mlp_norm(model.bridge.blocks[layer])
        if norm is not None:  # the block's output passes a norm of its own before the residual add
            pre = writes.sum(1)  # [batch, d_model] the block's output before that norm (its memories' sum)
            out = acts.get(site("mlp_out", layer))  # the norm's output; dla_sites leaves it out where no hook has it
            if out is not None:
                normed = out[rows.to(out.device), positions.to(out.device)]  # [batch, d_model]
            else:  # the norm run on the memories' sum: the block's own output up to float rounding
                weight = norm.weight
                normed = norm(pre.to(device=weight.device, dtype=weight.dtype))
            offset = bool(getattr(model.bridge.cfg, "rmsnorm_uses_offset", False))
            writes = frozen_norm(norm, pre, normed.to(writes.device), offset=offset)(writes)
        value = project(model, writes.transpose(0, 1), scale, directions)  # [expert, batch]
        routed = torch.stack([(m[:, experts == e] != 0).any(-1) for e in ids], dim=1)  # [batch, expert]
        if memories.expert_bias is not None:  # the router's own choice (a chosen expert's neurons may all be 0)
            routed = mix[:, ids] != 0
        shared = hooks.expert_layout(model, layer).n_experts
        frames.append(pd.DataFrame({
            "example": examples.repeat_interleave(len(ids)).numpy(),
            "layer": layer,
            "expert": ids * len(rows),
            "shared": [e == shared for e in ids] * len(rows),
            "routed": routed.reshape(-1).cpu().numpy(),
            "contribution": value.T.reshape(-1).cpu().numpy(),
        }))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def expert_means(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (layer, expert): contribution (mean over examples), std, ci_low / ci_high (95% t interval),
    n (examples) and n_routed (examples whose answer position the router sent to the expert: the mean counts
    the others' zeros)."""
    out = []
    for (layer, expert), g in rows.groupby(["layer", "expert"], sort=True):
        x = g.contribution.to_numpy(dtype=float)
        ci = chance.mean_interval(x)
        out.append({"layer": int(layer), "expert": int(expert), "shared": bool(g.shared.iloc[0]),
                    "contribution": float(x.mean()), "std": float(x.std(ddof=1)) if len(x) > 1 else float("nan"),
                    "ci_low": float("nan") if ci is None else ci[0], "ci_high": float("nan") if ci is None else ci[1],
                    "n": int(len(x)), "n_routed": int(g.routed.sum())})
    return pd.DataFrame(out)


def top_expert(rows: pd.DataFrame, dla: pd.DataFrame) -> dict | None:
    """The finding's numbers: in the MoE layer whose mlpN has the largest |mean| DLA, the expert with the largest
    |mean| and the next one, each {"expert", "shared", "mean", "ci", "n", "n_routed"}, with layer, layer_mean, and
    the paired difference of their magnitudes over examples (difference, ci, tied: its 95% interval contains 0;
    None with one example); None without MoE rows."""
    from headscope.analyses.circuits.analysis import writer_intervals

    if not len(rows):
        return None
    mlps = dla[(dla.kind == "mlp") & dla.layer.isin(rows.layer.unique())]
    means = mlps.groupby("layer").contribution.mean()
    layer = int(means.abs().idxmax())
    own = rows[rows.layer == layer].assign(component=lambda f: "E" + f.expert.astype(str))
    order = own.groupby("component").contribution.mean().abs().sort_values(ascending=False).index.tolist()
    stats, pairs = writer_intervals(own, order[:2])
    first = own.drop_duplicates("component").set_index("component")
    routed = own.groupby("component").routed.sum()

    def one(c: str) -> dict:
        return {"expert": int(first.expert[c]), "shared": bool(first.shared[c]), "mean": stats[c]["mean"],
                "ci": stats[c]["ci"], "n": stats[c]["n"], "n_routed": int(routed[c])}

    out = {"layer": layer, "layer_mean": float(means[layer]), "top": one(order[0])}
    if len(order) > 1:
        pair = pairs[0]
        out |= {"next": one(order[1]), "difference": pair["difference"], "difference_ci": pair["ci"],
                "tied": pair["tied"]}
    return out
