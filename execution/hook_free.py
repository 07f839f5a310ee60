"""The hook-free forward pass: a plain `model(tokens)` and on-demand attention patterns.

The TransformerBridge reimplements attention and materialises every layer's [batch, head, q, k]
pattern, so a plain pass through it costs several times Hugging Face's SDPA pass in memory. Where
the hook-free blocks (fast_blocks, else the model's own layers, hf_blocks) reproduce a model's
pass (resume.supports(model).fast_capture: any dtype, each layer with its own mask), a pass
with no hook attached runs them instead, with the fused attention kernel: the bridge embeds the
tokens and builds the masks and rotary tables (resume._block_calls: each layer its own, so
Gemma 2/3's sliding and full layers both apply), every block runs as plain
tensor code, and the bridge's final norm and unembedding give the logits (as resume.last_logits,
at every position). A layer's attention inputs (post-rotary q and k, mask, scale) can be handed
to a callback on the way (hooks/patterns recomputes the requested patterns from them), and the
pass can stop after a layer when only its attention is wanted.

Registered with models.hooked_model on import (models cannot import execution); HookedModel.forward
calls it only while no hook is attached (HookedModel.hook_free), so hooks always see the bridge's pass.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from headscope.execution import resume
from headscope.models.hooked_model import register_hook_free_pass

# (q [n, head, pos, d_head], k [n, kv_head, pos, d_head] after rotary, mask [n or 1, 1, pos, pos]
# additive or bool, or None for causal, scale, score soft-cap or None) -> None
OnAttention = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None", float, "float | None"], None]


def applies(model) -> bool:
    """The hook-free blocks reproduce this model's whole pass (checked once per model, while no
    hook is attached; see resume.supports)."""
    if model.facts.is_encoder or not model.hook_free() or resume._fast_plan(model) is None:
        return False
    return resume.supports(model).fast_capture


def hook_free_pass(model, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                   attention: Mapping[int, OnAttention] | None = None,
                   stop_after: int | None = None, keep: torch.Tensor | None = None,
                   cache: Any = None, logits_from: int = 0) -> torch.Tensor | None:
    """Logits [batch, pos - logits_from, d_vocab] of a pass of `tokens` [batch, pos] through the
    hook-free blocks, or None where they do not apply (the caller then runs the bridge).
    attention: layer -> callback given that layer's attention inputs (see OnAttention) before the
    block runs. stop_after: return right after layer stop_after's callback, without running that
    block or any later one (the return value is then the block's input [batch, pos, d_model], not
    logits). keep: bool [pos, pos] (query, key) or [n or 1, 1, pos, pos]: every layer's queries see
    only the keys it allows besides what the model's own mask allows (the callbacks get the
    combined mask). cache: a Hugging Face cache to fill with every layer's keys and values (a
    prefill; keys after rotary, as the model's own pass stores them). logits_from: the first
    position whose logits are wanted (the unembedding of a long prompt is its largest tensor).
    Differentiable."""
    if not applies(model):
        return None
    plans = resume._fast_plan(model)
    # the bridge up to the blocks (embedding, masks, rotary tables), called as the bridge itself:
    # not a second model(...) call
    got = resume._block_calls(model, tokens, attention_mask,
                              lambda t, m: model.bridge_forward(t, attention_mask=m))
    calls = None if got is None else _prepared(got[1], keep)
    if calls is None:
        return None
    x = got[0]  # [batch, pos, d_model]
    attention = attention or {}
    for i, block in enumerate(plans):
        rest, kwargs = calls[i]
        if i in attention:
            got = None if block.qk is None else block.qk(x, rest, kwargs)
            if got is None:
                return None
            attention[i](*got)
        if i == stop_after:
            return x
        if cache is None:
            x = block.full(x, rest, kwargs, None, False)  # [batch, pos, d_model]
        else:
            out = resume.record_block(block, x, rest, kwargs, cache, i)
            x = None if out is None else out[0]
        if x is None:  # arguments the blocks do not handle
            return None
    return resume.logits_of(model, x[:, logits_from:])  # [batch, pos', d_vocab]


_NO = object()  # _mask_of's answer where `keep` cannot apply (no 4-d mask)


def _prepared(calls: list[tuple[tuple, dict]], keep: torch.Tensor | None) -> list[tuple[tuple, dict]] | None:
    """Every layer's call arguments for the hook-free blocks: no KV cache (the blocks fill one
    themselves), the 4-d mask combined with `keep`, and dropped where it is only causal; each
    distinct mask (one per attention type) done once. None where `keep` cannot apply."""
    done: dict[int, Any] = {}
    out = []
    for rest, kwargs in calls:
        rest, kwargs = resume._with_cache(rest, kwargs, None)
        mask = _square_mask(rest, kwargs)
        if id(mask) not in done:
            done[id(mask)] = _mask_of(mask, keep)
        new = done[id(mask)]
        if new is _NO:
            return None
        out.append((rest, kwargs) if mask is None else _swap(rest, kwargs, mask, new))
    return out


def _mask_of(mask: torch.Tensor | None, keep: torch.Tensor | None) -> Any:
    """The mask the blocks get for a layer's 4-d mask: with `keep`, then None where causal."""
    if keep is not None:
        if mask is None:
            return _NO
        mask = _with_keep(mask, keep)
    return None if mask is None or _is_causal(mask) else mask


def _square_mask(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The blocks' one 4-d mask [n or 1, 1, pos, pos] among their call arguments, or None."""
    masks = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor) and v.ndim == 4]
    return masks[0] if len(masks) == 1 and masks[0].shape[-1] == masks[0].shape[-2] else None


def _swap(args: tuple, kwargs: dict, old: torch.Tensor, new: torch.Tensor | None) -> tuple[tuple, dict]:
    """The call arguments with the tensor `old` replaced by `new`."""
    return tuple(new if v is old else v for v in args), {k: (new if v is old else v) for k, v in kwargs.items()}


def _with_keep(mask: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The 4-d mask also hiding the keys `keep` (bool [pos, pos] or 4-d) does not allow."""
    allowed = keep.to(mask.device).bool()
    allowed = allowed[None, None] if allowed.ndim == 2 else allowed
    return (mask & allowed if mask.dtype == torch.bool
            else mask.masked_fill(~allowed, torch.finfo(mask.dtype).min))


def _is_causal(mask: torch.Tensor) -> bool:
    """The 4-d mask [n or 1, 1, pos, pos] is exactly the causal mask (no padding, no sliding window
    that bites): the blocks then get None and run the fused kernel's causal mode, which skips the
    scores above the diagonal (fast_blocks), and the pattern callbacks get mask None (causal)."""
    causal = torch.ones(mask.shape[-2:], dtype=torch.bool, device=mask.device).tril()  # [pos, pos]
    if mask.dtype != torch.bool:
        causal = torch.zeros(causal.shape, dtype=mask.dtype, device=mask.device).masked_fill_(
            ~causal, torch.finfo(mask.dtype).min)  # Hugging Face's additive form
    return torch.equal(mask, causal.expand_as(mask))


register_hook_free_pass(hook_free_pass)
