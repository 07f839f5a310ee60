"""Writes that pass a norm of their own before the residual add: post-norm blocks (Gemma 2/3's and OLMo 2's
post_attention_layernorm and post_feedforward_layernorm).

Such a block adds n(a) to the stream, a = sum_h r_h + b_O its attention output (r_h = z_h W_O) and
n(x) = w * c(x) / s(x) + b (c: the mean taken out under LayerNorm, nothing under RMSNorm; w is 1 + weight where
the RMSNorm uses an offset, Gemma's). With its scale s frozen at the value it had on the whole of a, n is linear:
head h writes w * c(r_h) / s, and the heads' writes plus the rest (w * c(b_O) / s + b, 0 on Gemma and OLMo 2) sum
to n(a) exactly; an MLP's neurons likewise through the post-MLP norm. This is the reading
hs.direct_logit_attribution uses (analyses/circuits/dla.py), and what Activations.stack_head_results and
get_full_resid_decomposition return on such blocks (review 18d A1, 18b A1: the raw r_h were 6-25x off there).
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from headscope.errors import UnsupportedModelError
from headscope.models.hooked_model import is_parallel, raw_module
from headscope.models.readout import is_post_ln_block


def _post_norm(block: torch.nn.Module, name: str) -> torch.nn.Module | None:
    """The Hugging Face module under block's `name` ("ln1_post", "ln2_post") where the block is a sequential
    post-norm one; None for pre-norm and parallel blocks, scaled residual writes (Granite), OPT's post-LN
    blocks and blocks without an MLP (execution.block_shape.parts: none of its shapes)."""
    from transformer_lens.model_bridge.generalized_components.block import ScaledResidualBlockBridge

    children = block._modules
    if isinstance(block, ScaledResidualBlockBridge) or children.get("mlp") is None or is_post_ln_block(block) \
            or is_parallel(block):
        return None
    norm = children.get(name)
    return None if norm is None else raw_module(norm)


def post_attention_norm(block: torch.nn.Module) -> torch.nn.Module | None:
    """The norm a post-norm block applies to its whole attention output before the residual add (Gemma 2/3's
    post_attention_layernorm, OLMo 2's), or None."""
    return _post_norm(block, "ln1_post")


def post_mlp_norm(block: torch.nn.Module) -> torch.nn.Module | None:
    """The norm a post-norm block applies to its whole MLP output before the residual add (Gemma 2/3's and
    OLMo 2's post_feedforward_layernorm), or None."""
    return _post_norm(block, "ln2_post")


def post_norms(model) -> list[str]:
    """Which writes pass through a norm of their own before the residual add ("post-attention", "post-MLP":
    Gemma 2/3's and OLMo 2's post-norm blocks), [] for pre-norm and parallel blocks."""
    blocks = model.bridge.blocks
    return [name for name, norm in (("post-attention", post_attention_norm), ("post-MLP", post_mlp_norm))
            if any(norm(b) is not None for b in blocks)]


def has_post_norms(model) -> bool:
    """Whether any block of `model` passes its attention or MLP output through a norm of its own."""
    return bool(post_norms(model))


def frozen_norm(norm, pre: torch.Tensor, normed: torch.Tensor, *,
                offset: bool = False) -> Callable[[torch.Tensor], torch.Tensor]:
    """The linear map v -> w * c(v) / s of `norm` with its scale s frozen at the value it had on `pre`
    [*lead, d_model] (the whole output the norm read; normed = norm(pre)), as a function of
    [*lead, ..., d_model] (float32 out). s is read back from what the norm did: 1/s = <normed - b, w c(pre)> /
    |w c(pre)|^2 (exact for x -> w c(x) / s + b), so no eps is guessed. offset: the norm multiplies by
    1 + weight (Gemma; the bridge's cfg.rmsnorm_uses_offset)."""
    centre = "rms" not in type(norm).__name__.lower()  # LayerNorm centres, RMSNorm does not
    w = norm.weight.detach().float().to(pre.device)
    if offset:
        w = 1.0 + w
    b = getattr(norm, "bias", None)
    b = b.detach().float().to(pre.device) if isinstance(b, torch.Tensor) else 0.0

    def c(v: torch.Tensor) -> torch.Tensor:
        return v - v.mean(-1, keepdim=True) if centre else v

    wp = w * c(pre.float())  # [*lead, d_model]
    inv = ((normed.float().to(pre.device) - b) * wp).sum(-1) / (wp * wp).sum(-1).clamp_min(1e-30)  # [*lead]

    def apply(v: torch.Tensor) -> torch.Tensor:
        shape = inv.shape + (1,) * (v.dim() - inv.dim())
        return w * c(v.float()) * inv.view(shape)

    apply.bias = b  # type: ignore[attr-defined]  # what the frozen norm adds besides the writes
    return apply


def tolerance(dtype: torch.dtype) -> float:
    """How far (relative to the largest entry) the frozen norm may miss the norm's own output in `dtype`:
    a few rounding steps of it, at least 1e-4."""
    return max(1e-4, 8.0 * torch.finfo(dtype).eps) if dtype.is_floating_point else 1e-4


def through_norm(model, norm, writes: torch.Tensor, pre: torch.Tensor, normed: torch.Tensor | None,
                 what: str) -> torch.Tensor:
    """`writes` [*lead, parts, d_model] (parts summing to `pre` [*lead, d_model] less any bias) as they reach
    the stream through `norm` frozen at its scale on `pre`; `normed` is the norm's output (a cached hook),
    None: the norm run on `pre`. Returned in writes' dtype. A norm the frozen map does not reproduce (not of
    the form w * c(x) / s + b) is refused in one line (UnsupportedModelError naming `what`), never a wrong split."""
    if normed is None:
        weight = norm.weight
        with torch.no_grad():
            normed = norm(pre.to(device=weight.device, dtype=weight.dtype)).to(pre.device)
    offset = bool(getattr(model.bridge.cfg, "rmsnorm_uses_offset", False))
    apply = frozen_norm(norm, pre, normed, offset=offset)
    with torch.no_grad():
        rebuilt = apply(pre) + apply.bias  # [*lead, d_model]
        size = normed.float().abs().amax().clamp_min(1e-30)
        err = float((rebuilt - normed.float().to(rebuilt.device)).abs().amax() / size)
    if err > tolerance(writes.dtype):
        raise UnsupportedModelError(
            f"{what} cannot split {model.facts.name}'s {type(norm).__name__} exactly: frozen at its scale it gives "
            f"its output to a relative error of {err:.2g}, so the parts' writes through it are unknown.")
    return apply(writes).to(writes.dtype)
