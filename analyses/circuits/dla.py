"""Direct logit attribution: each residual writer's share of the final logit (difference).

The residual stream after the last block is a sum of writes: the embeddings, each head, each
attention layer's bias, each MLP. The final norm is linearised at the scale it actually used on
the whole stream (`ln_final.hook_scale`, frozen), so with direction d (W_U[:, answer], or
W_U[:, answer] - W_U[:, wrong]) and the norm's weight w and bias b:

    logit(d) = sum_c  centre(x_c) / scale . (w * d)   +   b . d   +   b_U . (answer - wrong)

exactly (LayerNorm's mean subtraction is linear: each write is centred, as TransformerLens's
fold_ln / center_writing_weights do; RMSNorm, and a final RMS norm, do not centre). This is what
TransformerLens 4.3's `direct_logit_attribution` computes on a bridge after
`enable_compatibility_mode()` (folded final norm, identity ln_final, centred writing weights,
value biases folded into b_O, centred unembedding), on the unprocessed model:

- heads: z less its position-independent part (the value bias b_V and the attention norm's bias
  through W_V), @ W_O: TransformerLens's fold_ln moves ln1's bias into b_V and
  fold_value_biases moves b_V into b_O, so its per-head results carry neither. Each layer's
  "attn_bias" row is the rest of hook_attn_out (b_O plus those constants through W_O), so
  heads + attn_bias = TransformerLens's "{l}_attn_out".
- the final-norm bias (b . d) and the unembedding bias are their own rows ("ln_final_bias",
  "b_U"); TransformerLens folds b into b_U and leaves b_U out of DLA.
- with a wrong answer the numbers equal TransformerLens's; for a single answer TransformerLens's
  center_unembed reads W_U[:, answer] - mean_v W_U[:, v] (pass that as the direction to compare).
- post-norm blocks (Gemma 2/3, OLMo 2: a norm of the whole attention output before the residual
  add; execution.block_shape decides): each head's write is its z @ W_O passed through that norm
  with the norm's scale frozen at the value it had on the whole attention output, w * r_h / s
  (RMSNorm(x) = w * x / rms(x)), so the heads sum to the normed attention output and attn_bias
  holds only the normed b_O (0 for Gemma 2). hook_mlp_out is already the normed MLP output.
- multi-head latent attention (DeepSeek-V2/V3): hook_z is o_proj's input split by v_head_dim and W_O the head's
  columns of o_proj, so each head row is exact; its values come from a normed latent, so no value bias is
  subtracted (attn_bias is o_proj's bias alone, 0 without one).
- "remainder" is whatever of the stream the listed writers do not sum to (0 up to rounding
  for GPT-2, Llama and NeoX blocks), so the rows always sum to the final logit (difference).
- a linear scale of the logits (`facts.logit_scale`: Granite's 1 / logits_scaling, Cohere's logit_scale)
  is in the directions and the b_U row, so the rows sum to the model's own logits; the embedding and
  residual multipliers (Granite) are already in hook_embed, hook_attn_out, hook_mlp_out and the head results.
- a final logit soft-cap (Gemma 2's final_logit_softcapping: cap * tanh(logits / cap) after the
  unembedding) is not linear, so no split of the capped logits into writers exists: the rows sum
  to the logit (difference) before the cap, the unembedding of the final normed stream, and the
  stack carries both it (logit_before_cap) and the model's capped output (logit).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from headscope.analyses.circuits.lens import final_softcap, unembed
from headscope.execution.block_shape import post_attention_norm
from headscope.hooks import head_result, site
from headscope.hooks.post_norm import frozen_norm, post_norms  # post_norms: the finding says which (dla.post_norms)
from headscope.models.readout import unembed_weight

KINDS = ("embed", "pos_embed", "head", "attn_bias", "mlp", "remainder", "ln_final_bias", "unembed_bias")


def dla_sites(model, available: set[str]) -> list[str]:
    """The hook names DLA reads (those this model computes): embeddings, hook_z, attn_out,
    mlp_out per block, the last resid_post and the final norm's scale."""
    n = model.facts.n_layers
    names = [site("embed"), site("pos_embed")]
    for l in range(n):
        names += [site("z", l), site("attn_out", l), site("mlp_out", l)]
    names.append(site("resid_post", n - 1))
    names = [x for x in names if x in available]
    return names + (["ln_final.hook_scale"] if "ln_final.hook_scale" in available else [])


def final_norm(model) -> tuple[str | None, torch.Tensor | None, torch.Tensor | None]:
    """(kind, weight, bias) of the final norm: kind "LN" (centres), "RMS" or None (no norm);
    the weight as it multiplies the normalised stream (1 + w where the norm uses an offset)."""
    cfg = model.bridge.cfg
    norm = getattr(cfg, "normalization_type", None)
    if norm not in ("LN", "LNPre", "RMS", "RMSPre"):
        return None, None, None
    kind = "LN" if norm in ("LN", "LNPre") and not getattr(cfg, "final_rms", False) else "RMS"
    ln = getattr(model.bridge, "ln_final", None)
    weight = getattr(ln, "weight", None) if ln is not None else None
    bias = getattr(ln, "bias", None) if ln is not None else None
    if isinstance(weight, torch.Tensor) and getattr(cfg, "rmsnorm_uses_offset", False):
        weight = 1.0 + weight
    return (kind, weight.detach() if isinstance(weight, torch.Tensor) else None,
            bias.detach() if isinstance(bias, torch.Tensor) else None)


def unembed_directions(model, answers: torch.Tensor, wrong: torch.Tensor | None = None) -> torch.Tensor:
    """[batch, d_model]: (W_U[:, answer] (- W_U[:, wrong])) x facts.logit_scale (Granite's 1 / logits_scaling)."""
    w_u = unembed_weight(model).detach()  # [d_model, vocab]: P^T W_U through project_out (OPT-350m's)
    d = w_u[:, answers.to(w_u.device)].T
    d = d if wrong is None else d - w_u[:, wrong.to(w_u.device)].T
    scale = model.facts.logit_scale
    return d if scale == 1.0 else d * scale


def _value_bias(model, layer: int) -> torch.Tensor | None:
    """[n_heads, d_head]: the part of each head's values that is the same at every position, the
    value bias b_V plus the bias of the norm feeding the attention through W_V (ln1's b @ W_V).
    Attention weights sum to 1, so it reaches the output as a constant; TransformerLens folds it
    into b_O (fold_ln then fold_value_biases). GQA's KV-head vectors are repeated per query head;
    None when the layer has neither bias."""
    if getattr(model.facts, "mla", None):  # MLA: values are kv_b_proj(RMSNorm(latent)), no constant part
        return None
    block = model.bridge.blocks[layer]
    attn = block.attn
    const = None
    b_v = getattr(attn, "b_V", None)
    if isinstance(b_v, torch.Tensor):
        const = b_v.detach()
    ln1 = getattr(block, "ln1", None)
    b_ln = getattr(ln1, "bias", None) if ln1 is not None else None
    if isinstance(b_ln, torch.Tensor):
        w_v = attn.W_V.detach()  # [kv_head, d_model, d_head]
        through = torch.einsum("m,hmd->hd", b_ln.detach().to(w_v.dtype), w_v)
        const = through if const is None else const + through
    if const is None:
        return None
    n_heads = model.facts.n_heads
    if const.shape[0] != n_heads:
        const = const.repeat_interleave(n_heads // const.shape[0], dim=0)
    return const


def attn_bias_parts(model) -> dict | None:
    """What the attn_bias rows hold besides b_O, for the finding (review 15b B1): {"value": the terms each
    head's row leaves out (its position-independent values through W_O: "b_V", "ln1's bias through W_V"),
    "b_O": whether the attention has an output bias}; None where no head has such a term (post-norm blocks
    included: there attn_bias is the normed b_O alone)."""
    if post_norms(model) or getattr(model.facts, "mla", None):  # MLA: no position-independent values (_value_bias)
        return None
    value, has_b_o = [], False
    for block in model.bridge.blocks:
        attn, ln1 = block.attn, getattr(block, "ln1", None)
        has_b_o = has_b_o or isinstance(getattr(attn, "b_O", None), torch.Tensor)
        if isinstance(getattr(attn, "b_V", None), torch.Tensor) and "b_V" not in value:
            value.append("b_V")
        if ln1 is not None and isinstance(getattr(ln1, "bias", None), torch.Tensor) and "ln1's bias through W_V" not in value:
            value.append("ln1's bias through W_V")
    return {"value": value, "b_O": has_b_o} if value else None


def project(model, writes: torch.Tensor, scale: torch.Tensor | None, directions: torch.Tensor) -> torch.Tensor:
    """[component, batch]: writes [component, batch, d_model] through the final norm linearised at its frozen
    scale [batch, 1] (each write centred under LayerNorm, divided by the scale, times the norm's weight) onto
    directions [batch, d_model]; scale None: a model without a final norm."""
    kind, weight, _ = final_norm(model)
    writes = writes.float()
    if kind is not None:
        if kind == "LN":
            writes = writes - writes.mean(-1, keepdim=True)
        writes = writes / scale.float().to(writes.device)
    d = directions.float().to(writes.device)
    d_eff = d if weight is None else d * weight.float().to(d.device)
    return (writes * d_eff).sum(-1)


@dataclass(frozen=True)
class DLAStack:
    """contributions [component, batch] with aligned labels, kinds, layers, heads (-1: none, e.g.
    the embeddings, the remainder and the final-norm and unembedding bias terms);
    logit [batch]: the model's final logit (difference) along the same tokens, its output;
    logit_before_cap [batch]: the same before the model's final soft-cap (softcap: its cap, None
    without one, and then equal to logit), what the contributions sum to;
    logit_size [batch]: |logit(answer)| + |logit(wrong)| before the cap, the size the model's logits are
    rounded at (the reconstruction check's tolerance scales with it)."""

    contributions: torch.Tensor
    labels: list[str]
    kinds: list[str]
    layers: list[int]
    heads: list[int]
    logit: torch.Tensor
    logit_before_cap: torch.Tensor
    softcap: float | None = None
    logit_size: torch.Tensor | None = None


@torch.no_grad()
def dla_stack(model, acts, positions: torch.Tensor, directions: torch.Tensor,
              answers: torch.Tensor | None = None, wrong: torch.Tensor | None = None,
              output: torch.Tensor | None = None) -> DLAStack:
    """Per-writer contributions at one position per example (`positions` [batch]) along
    `directions` [batch, d_model] (unembedding directions before the final norm's weight).
    acts: Activations of `dla_sites`. answers/wrong give the unembedding-bias row and, with
    `output` (logits [batch, pos, vocab]), the model's logit (difference) to compare with."""
    n_layers = model.facts.n_layers
    rows = torch.arange(positions.shape[0])

    def at(t: torch.Tensor) -> torch.Tensor:  # [batch, pos, ...] -> [batch, ...] at the positions
        return t[rows.to(t.device), positions.to(t.device)]

    comps, labels, kinds, layers, heads = [], [], [], [], []

    def add(x, label, kind, layer=-1, head=-1):
        comps.append(x.float())
        labels.append(label)
        kinds.append(kind)
        layers.append(layer)
        heads.append(head)

    for kind in ("embed", "pos_embed"):
        if site(kind) in acts:
            add(at(acts[site(kind)]), kind, kind)
    for l in range(n_layers):
        z = at(acts[site("z", l)])  # [batch, head, d_head]
        b_v = _value_bias(model, l)
        if b_v is not None:
            z = z - b_v.to(device=z.device, dtype=z.dtype)
        res = head_result(model, l, z[:, None])[:, 0]  # [batch, head, d_model]
        norm = post_attention_norm(model.bridge.blocks[l])
        if norm is not None:  # the heads write through the norm of the whole attention output
            whole = head_result(model, l, at(acts[site("z", l)])[:, None])[:, 0].sum(1)  # [batch, d_model]
            b_o = getattr(model.bridge.blocks[l].attn, "b_O", None)
            if isinstance(b_o, torch.Tensor):
                whole = whole + b_o.detach().to(whole)
            offset = bool(getattr(model.bridge.cfg, "rmsnorm_uses_offset", False))
            res = frozen_norm(norm, whole, at(acts[site("attn_out", l)]), offset=offset)(res)
        for h in range(res.shape[1]):
            add(res[:, h], f"L{l}H{h}", "head", l, h)
        add(at(acts[site("attn_out", l)]) - res.sum(1), f"attn_bias{l}", "attn_bias", l)
        if site("mlp_out", l) in acts:
            add(at(acts[site("mlp_out", l)]), f"mlp{l}", "mlp", l)
    stack = torch.stack(comps)  # [component, batch, d_model]
    resid = at(acts[site("resid_post", n_layers - 1)]).float()
    stack = torch.cat([stack, (resid - stack.sum(0))[None]])
    labels, kinds, layers, heads = labels + ["remainder"], kinds + ["remainder"], layers + [-1], heads + [-1]

    kind, _, bias = final_norm(model)
    d = directions.float().to(stack.device)  # [batch, d_model]
    scale = at(acts["ln_final.hook_scale"]) if kind is not None else None  # [batch, 1]
    contrib = project(model, stack, scale, d)  # [component, batch]
    extra = []
    if bias is not None:
        extra.append(((d * bias.float().to(d.device)).sum(-1), "ln_final_bias", "ln_final_bias"))
    b_u = getattr(model.bridge, "b_U", None)
    if isinstance(b_u, torch.Tensor) and answers is not None:
        b = b_u.detach().float()
        ub = (b[answers.to(b.device)] - (b[wrong.to(b.device)] if wrong is not None else 0.0)) * model.facts.logit_scale
        extra.append((ub.to(contrib.device), "unembed_bias", "b_U"))
    for value, k, label in extra:
        contrib = torch.cat([contrib, value[None]])
        labels, kinds, layers, heads = labels + [label], kinds + [k], layers + [-1], heads + [-1]
    logit = torch.full((positions.shape[0],), float("nan"))
    cap = final_softcap(model)
    before, size = logit, torch.full_like(logit, float("nan"))
    if output is not None and answers is not None:
        raw = at(output).float()  # [batch, vocab]
        logit = _along(raw, answers, wrong)  # the model's output (capped, where it caps)
        before = logit
        if cap is not None:  # the unembedding of the final normed stream, before the cap
            normed = model.bridge.ln_final(at(acts[site("resid_post", n_layers - 1)])[:, None])  # [batch, 1, d_model]
            raw = unembed(model, normed)[:, 0].float()
            before = _along(raw, answers, wrong)
        size = _along(raw.abs(), answers, None)
        if wrong is not None:
            size = size + _along(raw.abs(), wrong, None)
    return DLAStack(contributions=contrib.cpu(), labels=labels, kinds=kinds, layers=layers, heads=heads,
                    logit=logit.cpu(), logit_before_cap=before.cpu(), softcap=cap, logit_size=size.cpu())


def _along(logits: torch.Tensor, answers: torch.Tensor, wrong: torch.Tensor | None) -> torch.Tensor:
    """[batch]: logits [batch, vocab] at the answers, less those at the wrong answers."""
    out = logits.gather(1, answers.to(logits.device)[:, None])[:, 0]
    return out if wrong is None else out - logits.gather(1, wrong.to(logits.device)[:, None])[:, 0]
