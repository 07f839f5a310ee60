"""How the residual stream reaches the logits, and where no linear read of it exists (review 16d A4, A5).

- project_out (OPT-350m style: word_embed_proj_dim < hidden_size): the final stream [d_model] is mapped
  by the linear project_out [d_embed, d_model] before the unembedding, so the unembedding as a map of
  the stream is P^T W_U [d_model, d_vocab] (`unembed_weight`); `final_readout` runs the model's own
  final norm (where it has one), project_out and unembedding.
- post-LN blocks (OPT with do_layer_norm_before=False: out = LN2(h + MLP(h)), h = LN1(x + attn(x)),
  no final norm): every write is normalised with the whole stream after its add, so no sum of
  per-component terms equals the logits and the logit lens has no final norm to apply. Lens, DLA,
  decompose_resid / logit_attrs / apply_ln_to_stack and path patching refuse there in one line
  (`post_ln_reason`, `refuse_post_ln`); lens, DLA and apply_ln also where the bridge hooks no final norm
  (pre-LN OPT: `readout_reason`, `refuse_readout`).
"""
from __future__ import annotations

from typing import Any

import torch

from headscope.errors import UnsupportedModelError


def is_post_ln_block(block: torch.nn.Module) -> bool:
    """The block normalises the residual stream after each add (HF OPTDecoderLayer with do_layer_norm_before=False)."""
    from headscope.models.hooked_model import raw_module

    return getattr(raw_module(block), "do_layer_norm_before", True) is False


POST_LN = ("its blocks are post-LN (do_layer_norm_before=False: each block's LayerNorm normalises the whole residual "
           "stream after every add, and no final norm follows)")
NO_SUM = ", so a write reaches the logits only through every later LayerNorm and no sum of per-component terms equals the logits"
HIDDEN_NORM = ("TransformerLens's bridge exposes no hook for its final norm (OPT's final_layer_norm runs inside the "
               "Hugging Face decoder), whose scale the lens and DLA read")
_NORMS = {"LN", "LNPre", "RMS", "RMSPre"}


def readout_gap(model: Any) -> str | None:
    """Why the stream has no linear read into the logits on `model` (POST_LN, or HIDDEN_NORM: a final norm the
    bridge does not hook, pre-LN OPT), else None."""
    if getattr(model.facts, "post_ln", False):
        return POST_LN + NO_SUM
    bridge = getattr(model, "bridge", None)
    cfg = getattr(bridge, "cfg", None)
    if cfg is not None and getattr(cfg, "normalization_type", None) in _NORMS and getattr(bridge, "ln_final", None) is None:
        return HIDDEN_NORM
    return None


def post_ln_reason(model: Any, what: str, why: str = NO_SUM) -> str | None:
    """One line: why `what` cannot run on a post-LN model (facts.post_ln), else None; `why` ends it."""
    return f"{what} cannot run on {model.facts.name}: {POST_LN}{why}" if getattr(model.facts, "post_ln", False) else None


def readout_reason(model: Any, what: str) -> str | None:
    """One line: why `what` (the lens, DLA, a decomposition through the final norm) cannot run on `model`, else None."""
    gap = readout_gap(model)
    return f"{what} cannot run on {model.facts.name}: {gap}" if gap else None


def refuse_post_ln(model: Any, what: str, why: str = NO_SUM) -> None:
    """UnsupportedModelError with post_ln_reason before any work; nothing on other models."""
    reason = post_ln_reason(model, what, why)
    if reason:
        raise UnsupportedModelError(reason + ".")


def refuse_readout(model: Any, what: str) -> None:
    """UnsupportedModelError with readout_reason before any work; nothing where the read exists."""
    reason = readout_reason(model, what)
    if reason:
        raise UnsupportedModelError(reason + ".")


def project_out(model: Any) -> torch.nn.Module | None:
    """The model's projection of the final stream before the unembedding (OPT's project_out), or None."""
    module = getattr(model.bridge, "project_out", None)
    return module if isinstance(module, torch.nn.Module) else None


def unembed_weight(model: Any) -> torch.Tensor:
    """[d_model, d_vocab]: the unembedding as a map of the final stream, P^T W_U with project_out's weight
    P [d_embed, d_model] where the model has one (its bias, if any, is a constant, in `unembed_bias`), else W_U."""
    w_u = model.bridge.W_U  # [d_embed or d_model, d_vocab]
    proj = project_out(model)
    if proj is None:
        return w_u
    p = proj.weight  # [d_embed, d_model]
    return (p.T.float() @ w_u.float().to(p.device)).to(w_u.dtype)  # [d_model, d_vocab]


def unembed_bias(model: Any) -> torch.Tensor | None:
    """[d_vocab]: b_U plus project_out's bias through W_U where it has one; None where neither exists."""
    b_u = getattr(model.bridge, "b_U", None)
    b_u = b_u if isinstance(b_u, torch.Tensor) else None
    proj = project_out(model)
    bias = getattr(proj, "bias", None) if proj is not None else None
    if not isinstance(bias, torch.Tensor):
        return b_u
    extra = (bias.float() @ model.bridge.W_U.float()).to(model.bridge.W_U.dtype)
    return extra if b_u is None else b_u + extra.to(b_u.device)


def final_readout(model: Any, x: torch.Tensor) -> torch.Tensor:
    """Logits [..., d_vocab] before any logit scale or soft-cap from the last block's output x [..., d_model]:
    the bridge's final norm (pre-LN OPT: the HF decoder's final_layer_norm; none on post-LN OPT), project_out where
    the model has one, its unembedding."""
    ln = getattr(model.bridge, "ln_final", None)
    if ln is None:  # pre-LN OPT: the final norm runs inside the HF decoder, unhooked (None on post-LN OPT)
        decoder = getattr(getattr(getattr(model.bridge, "original_model", None), "model", None), "decoder", None)
        ln = getattr(decoder, "final_layer_norm", None)
    if ln is not None:
        x = ln(x)
    proj = project_out(model)
    if proj is not None:
        x = proj(x)
    return model.bridge.unembed(x)
