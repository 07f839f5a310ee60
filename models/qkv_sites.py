"""hook_q / hook_k / hook_v hold what attention uses per head, on models that normalise or clamp after the projection.

OLMo 2 and OLMoE run one RMSNorm over the whole q (and k) projection, all heads together, and OLMo / OLMoE clamp
q, k and v to +-clip_qkv after it (MPT clamps its fused Wqkv output to +-attn_config.clip_qkv, the same per entry);
Hugging Face's attention then splits heads. TransformerLens's bridge fires
hook_q/k/v on the raw projections (`q.hook_out`) and normalises and clamps after the hook, so (review 18c A1)
hook_q was not the query attention used (off by up to 1.05 on OLMoE), `pattern @ hook_v != hook_z` where the clamp
acts, and patching one head's q moved every head's query (the norm mixes heads after the hook): per-head q/k
patching was not per head.

`qkv_as_attention_uses` moves the norm and the clamp before the hooks: each q/k/v LinearBridge runs the projection,
the attention's own norm bridge (its hooks and hook_q_normed / hook_k_normed fire as before) and the clamp, then
hook_out; the attention bridge skips its own whole-projection norm for that call (the clamp it applies again is a
no-op on clamped values, and clamps a patched-in value as Hugging Face would). hook_q/k/v are then the per-head
tensors that enter RoPE and attention, Hugging Face's values. TransformerLens's split-input path (circuits' edges:
`use_split_qkv_input`), which projects without calling the LinearBridge, keeps the bridge's own order.
"""
from __future__ import annotations

import types
from typing import Any

import torch


def clip_qkv(bridge_or_attn: Any, config: Any = None) -> float | None:
    """The clamp Hugging Face applies to q, k and v, else None: the attention module's own `clip_qkv` (MPT's
    MptAttention copies config.attn_config.clip_qkv there and clamps only where it is truthy, review 19a A1), else
    its config's (or `config`'s) clip_qkv (OLMo, OLMoE; clamped wherever it is not None) or attn_config.clip_qkv."""
    attn = getattr(bridge_or_attn, "original_component", bridge_or_attn)
    own = _number(getattr(attn, "clip_qkv", None))
    if own is not None:
        return own or None  # HF's `if self.clip_qkv:`: 0 clamps nothing
    config = getattr(attn, "config", None) or config
    clip = getattr(config, "clip_qkv", None)
    return _number(clip if clip is not None else getattr(getattr(config, "attn_config", None), "clip_qkv", None))


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def qkv_as_attention_uses(bridge: Any) -> list[int]:
    """Install the reordering (module doc) on every attention bridge with a whole-projection q/k norm or a clip_qkv;
    returns the layers it changed. Methods bound to the instances (not torch hooks, which would count as attached
    hooks and turn the hook-free passes off; a deep copy rebinds them to the copy)."""
    changed = []
    for layer, block in enumerate(getattr(bridge, "blocks", [])):
        attn = getattr(block, "attn", None)
        if attn is None or getattr(attn, "original_component", None) is None:
            continue
        whole = getattr(attn, "_qk_norm_phase", None) == "pre_reshape"
        clip = clip_qkv(attn)
        if not whole and clip is None:
            continue
        # a bridge component hands unknown attribute writes to the module it wraps: object.__setattr__ keeps them here
        object.__setattr__(attn, "_hs_normed", set())  # names of the norms already run in this call's projections
        for kind in ("q", "k", "v"):
            linear = getattr(attn, kind, None)
            if linear is None or not hasattr(linear, "hook_out"):
                continue
            object.__setattr__(linear, "_hs_attn", attn)
            object.__setattr__(linear, "_hs_norm", f"{kind}_norm" if whole and kind != "v" else None)
            object.__setattr__(linear, "_hs_clip", clip)
            object.__setattr__(linear, "forward", types.MethodType(_projection_forward, linear))
        object.__setattr__(attn, "forward", types.MethodType(_attention_forward, attn))
        if whole:
            object.__setattr__(attn, "_apply_pre_reshape_qk_norm", types.MethodType(_pre_reshape_norm, attn))
        changed.append(layer)
    return changed


def _attention_forward(attn: Any, *args: Any, **kwargs: Any) -> Any:
    attn._hs_normed.clear()  # nothing left over from a projection called outside a pass
    return type(attn).forward(attn, *args, **kwargs)


def _pre_reshape_norm(attn: Any, tensor: torch.Tensor, norm_module: Any, hook: Any, head_dim: int) -> torch.Tensor:
    """The bridge's whole-projection norm step: skipped where the projection ran the norm already (its hooks fired
    there); else (the split-input path) the bridge's own."""
    for name in ("q_norm", "k_norm"):
        if getattr(attn, name, None) is norm_module and name in attn._hs_normed:
            attn._hs_normed.discard(name)
            return tensor
    return type(attn)._apply_pre_reshape_qk_norm(tensor, norm_module, hook, head_dim)


def _projection_forward(linear: Any, input: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """LinearBridge.forward with the norm (whole projection) and the clamp between the projection and hook_out."""
    if linear._suppress_next_hook_in:
        object.__setattr__(linear, "_suppress_next_hook_in", False)
    else:
        input = linear.hook_in(input)
    output = linear.original_component(input, *args, **kwargs)  # [batch, pos, heads * d_head]
    attn = linear._hs_attn
    if linear._hs_norm is not None:
        output = getattr(attn, linear._hs_norm)(output)  # the norm bridge: its own hooks fire
        normed_hook = getattr(attn, f"hook_{linear._hs_norm[0]}_normed", None)
        if normed_hook is not None:
            output = normed_hook(output)
        attn._hs_normed.add(linear._hs_norm)
    if linear._hs_clip is not None:
        output = output.clamp(min=-linear._hs_clip, max=linear._hs_clip)
    output = linear.hook_out(output)
    object.__setattr__(linear, "_fired_hook_out", True)
    return output
