"""Hook-free blocks for every architecture: the model's own Hugging Face decoder layers.

Where fast_blocks has no hand-written block (Qwen3's and OLMo 2's q/k norms, OLMo 2's and Gemma's
post-norms, mixture-of-experts MLPs, ...), a resumed or hook-free pass can still skip the bridge's
per-block cost: `plan` gives each block a copy of its Hugging Face layer whose submodules are the
raw Hugging Face modules under the bridge's components (parameters and buffers shared, so
in-place weight edits are seen; no hook point fires), called with the arguments the bridge
passed the layer (mask, position ids, rotary tables). The copy's attention runs PyTorch's fused
kernel (SDPA) unless the architecture needs eager attention (soft-capped scores, as Gemma 2; GPT-OSS's sinks),
whatever implementation the bridge forced on the model, so memory follows Hugging Face's SDPA
pass rather than the bridge's materialised patterns.

What the engines need inside such a block enters through light torch hooks on the copy's own
modules: the heads' z is the input of the attention's output projection (read for a capture,
edited for gates), the keys and values of this call go through a one-call stand-in for the KV
cache (prepending the captured keys and values before a resumed position), and the last block's
MLP branch is cut to the last position (the residual add broadcasts; a parallel block's attention
output is cut there too, as Falcon adds it into the MLP's output in place). q and k for patterns on
demand (`qk`) come from the layer run up to its attention function, with an attention
implementation (registered with Hugging Face's AttentionInterface) that raises with its inputs:
q and k after rotary and q/k norms, the layer's own mask, scale and score soft-cap. Positional
call arguments (GPT-2's blocks) are bound to the layer's parameter names. The last block's attention
still runs every query (that saving stays with the hand-written blocks). resume.supports checks
every use against a full pass before anything relies on it. The copies do not fire torch hooks
registered on the Hugging Face modules, so resumed passes use them only while
HookedModel.hook_free() (no hook point's hook, no user torch hook on any module of the bridge).

Any dtype: in bfloat16 and float16 these blocks are the model's own arithmetic except attention,
where SDPA rounds differently from the eager attention the bridge runs; tests hold them to twice
Hugging Face's own bfloat16-vs-float32 gap on the same inputs (resume.supports checks them to
8 eps of the logits' scale).
"""
from __future__ import annotations

import collections
import copy
import inspect
import types
from typing import Any

import torch
from transformers.modeling_utils import AttentionInterface

from headscope.execution import block_shape
from headscope.execution.fast_blocks import Block, ZEdit

CACHE_KEYS = ("cache", "past_key_values", "past_key_value", "layer_past")  # what the layer calls its KV cache
_QK = "headscope_qk"  # the attention implementation of a q/k call: hands q and k over, computes nothing


class _QKTaken(Exception):
    """Raised by the q/k attention function with the attention's inputs; ends the layer's call."""


def _take_qk(module, query, key, value, attention_mask, scaling=None, softcap=None, **kwargs):
    """An attention function (Hugging Face's AttentionInterface) that stops the layer with its
    inputs: q [n, head, q, d_head] and k [n, kv_head, keys, d_head] after rotary and q/k norms,
    the layer's own mask, scale and score soft-cap."""
    raise _QKTaken(query, key, attention_mask, scaling, softcap)


AttentionInterface.register(_QK, _take_qk)


def plan(model) -> list[Block] | None:
    """A Block per layer running its Hugging Face module, or None where a layer is not a plain
    decoder layer (no attention output projection or MLP, an unknown block shape)."""
    blocks = list(model.bridge.blocks)
    if not blocks:
        return None
    try:
        out = [_layer_block(block) for block in blocks]
    except (AttributeError, KeyError, TypeError):  # a layout without the expected modules
        return None
    return None if any(b is None for b in out) else out


def _unbridged(module: torch.nn.Module, made: dict[int, torch.nn.Module]) -> torch.nn.Module:
    """A copy of `module`'s Hugging Face tree with the raw module under every bridge component,
    its parameters and buffers shared and no hooks; made: id(bridge or raw module) -> copy."""
    raw = block_shape.raw(module)
    clone = copy.copy(raw)
    for name, value in list(vars(clone).items()):  # no hooks of the original's (ours go on the copy)
        if name.startswith(("_forward_", "_backward_")) and isinstance(value, dict):
            setattr(clone, name, collections.OrderedDict())
        elif isinstance(value, types.MethodType) and value.__self__ is raw:  # a method patched on the instance
            setattr(clone, name, types.MethodType(value.__func__, clone))  # (TL's Falcon forward): the copy's own
    clone._modules = {name: None if child is None else _unbridged(child, made) for name, child in raw._modules.items()}
    made[id(module)] = made[id(raw)] = clone
    return clone


class _OneCall:
    """The KV cache a layer sees in one hook-free call: prepends `past` (keys and values
    [n, kv_head, p, d_head] each, or None) and keeps this call's own keys and values."""

    def __init__(self, past: tuple[torch.Tensor, torch.Tensor] | None):
        self.past, self.new = past, None

    def update(self, k: torch.Tensor, v: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        self.new = (k, v)
        if self.past is None:
            return k, v
        return torch.cat([self.past[0], k], dim=2), torch.cat([self.past[1], v], dim=2)


def _layer_block(block: torch.nn.Module) -> Block | None:
    made: dict[int, torch.nn.Module] = {}
    layer = _unbridged(block, made)
    attn = made[id(block.attn)]
    o_proj = made[id(block_shape.raw(block.attn.o))]  # GPT-2: the bridge's o wraps c_proj from outside
    parts = block_shape.parts(block, lambda m: made[id(m)])
    if parts is None:
        return None
    d_head = int(getattr(attn, "head_dim", None) or attn.head_size)  # GPT-NeoX: head_size
    config = copy.copy(attn.config)  # the copy's own attention implementation
    # SDPA cannot soft-cap scores, nor add GPT-OSS's learned sink logit (its `sinks`: review 19b C1)
    eager = getattr(config, "attn_logit_softcapping", None) is not None or isinstance(getattr(attn, "sinks", None),
                                                                                    torch.Tensor)
    config._attn_implementation = "eager" if eager else "sdpa"
    attn.config = config
    qk_config = copy.copy(config)
    qk_config._attn_implementation = _QK
    params = [p for p in inspect.signature(type(layer).forward).parameters.values()  # the class's: an instance's
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][2:]  # patch takes *args; after self, hidden
    names = [p.name for p in params]
    cache_key = next((k for k in CACHE_KEYS if k in names), None)
    state: dict[str, Any] = {"edit": None, "z": None, "last": False}

    def on_z(module, args):  # the output projection's input: the heads' z [n, q, head * d_head]
        z = args[0]
        if state["edit"] is not None:
            z = state["edit"](z.view(*z.shape[:2], -1, d_head)).flatten(2)
        state["z"] = z
        return (z,) + tuple(args[1:])

    def cut(module, args):  # the MLP branch at the last position only
        return ((args[0][:, -1:],) + tuple(args[1:])) if state["last"] else None

    def cut_out(module, args, out):  # a parallel block's attention output there too (Falcon adds it in place)
        return block_shape.last_of(out) if state["last"] else None

    o_proj.register_forward_pre_hook(on_z)
    made[id(block_shape.mlp_entry(block))].register_forward_pre_hook(cut)
    if parts.parallel:
        attn.register_forward_hook(cut_out)

    def named(args: tuple, kwargs: dict) -> dict | None:
        """The call's arguments by name (GPT-2's blocks get theirs positionally), or None."""
        if len(args) > len(names):
            return None
        return {**dict(zip(names, args)), **kwargs}

    def call(x: torch.Tensor, args: tuple, kwargs: dict, past, last_query: bool, edit_z: ZEdit | None):
        """-> (output [n, q, d_model], z [n, q, head * d_head], this call's k and v) or None."""
        kwargs = named(args, kwargs)
        key = next((k for k in CACHE_KEYS if k in (kwargs or ())), cache_key)
        if kwargs is None or key is None:
            return None  # no cache argument to hand keys through
        if eager and kwargs.get("attention_mask") is None:  # eager attention needs its (causal) mask
            n_keys = x.shape[1] + (0 if past is None else past[0].shape[2])
            allowed = torch.ones(x.shape[1], n_keys, dtype=torch.bool, device=x.device).tril(n_keys - x.shape[1])
            kwargs["attention_mask"] = torch.zeros(allowed.shape, dtype=x.dtype, device=x.device).masked_fill_(
                ~allowed, torch.finfo(x.dtype).min)[None, None]  # [1, 1, q, keys] additive
        if kwargs.get("output_attentions"):  # the copy returns no patterns; Falcon's would run eager on a None mask
            kwargs["output_attentions"] = False
        cache = _OneCall(past)
        kwargs = {**kwargs, key: cache}
        state.update(edit=edit_z, last=last_query)
        try:
            out = layer(x, **kwargs)
        finally:
            z, state["z"] = state["z"], None
            state.update(edit=None, last=False)
        out = out[0] if isinstance(out, tuple) else out
        if cache.new is None or z is None:
            return None
        return out, z, *cache.new

    def full(x, args, kwargs, past, last_query, edit_z=None):
        got = call(x, args, kwargs, past, last_query, edit_z)
        if got is None:
            return None
        return got[0][:, -1:] if last_query else got[0]  # [n, q or 1, d_model]

    def record(x, args, kwargs):
        got = call(x, args, kwargs, None, False, None)
        if got is None:
            return None
        out, z, k, v = got
        return out, z.view(*z.shape[:2], -1, d_head), k, v

    def after(a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return block_shape.residual(a, x, parts, in_place=True)

    def qk(x: torch.Tensor, args: tuple, kwargs: dict):
        """The layer's attention inputs, as its attention function receives them (the layer runs
        up to there, with an attention implementation that stops it): (q [n, head, q, d_head], k
        [n, kv_head, q, d_head], mask [n or 1, 1, q, q] additive or bool or None for causal, scale,
        score soft-cap or None), or None (unhandled arguments)."""
        kwargs = named(args, kwargs)
        if kwargs is None:
            return None
        key = next((k for k in CACHE_KEYS if k in kwargs), cache_key)
        if key is not None:
            kwargs[key] = _OneCall(None)
        attn.config = qk_config
        try:
            layer(x, **kwargs)
        except _QKTaken as taken:
            q, k, mask, scale, softcap = taken.args
        except Exception:  # noqa: BLE001 - attention code of its own (Falcon's: eager unless "sdpa", no interface)
            return None  # fails on the stand-in implementation: the bridge's pass instead
        else:
            return None
        finally:
            attn.config = config
        if isinstance(mask, torch.Tensor):
            mask = mask[..., :k.shape[2]] if mask.ndim == 4 else None
            if mask is None:
                return None  # a 2-d padding mask or other form: the bridge's job
        elif mask is not None:
            return None
        return q, k, mask, float(scale if scale is not None else d_head ** -0.5), softcap

    # a learned sink logit (GPT-OSS's `sinks`) takes part of each row's softmax: patterns from q and k alone would
    # sum to 1, so they come from the bridge's pass there (review 19b C1)
    return Block(full, after, record, None if isinstance(getattr(attn, "sinks", None), torch.Tensor) else qk)
