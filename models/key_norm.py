"""Whether a model normalises its keys before caching them, and what that fixes about their norms.

Qwen3 and Gemma 3 run an RMSNorm over each KV head's d_head entries of every key (`k_norm`), Cohere and
Chameleon a LayerNorm per KV head with one weight row per head ([n_kv_heads, d_head]), StableLM a ModuleList
of one LayerNorm per KV head (`k_layernorm.norms`), OLMo 2 one over all KV heads together, before RoPE (a
rotation, which keeps norms) and before the cache. A normalised vector x / rms(x) has norm sqrt(n) over its
n entries, so the cached key g * x / rms(x) (g the norm's effective per-entry weight: Gemma's 1 + weight
included) has a norm between sqrt(n) x min|g| and sqrt(n) x max|g| (a bias b widens that by |b| each way:
the triangle inequality), whatever the input: on such a model the first key's norm cannot stand out, and a
sink is made by the key's direction instead.

The effective weight is read by running the Hugging Face norm module itself on +x and -x with x the
alternating +-1 vector (mean 0, rms 1), so RMSNorm, LayerNorm and Gemma's (1 + weight) need no case
of their own: (y(x) - y(-x)) / 2 = g * x and (y(x) + y(-x)) / 2 = b.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from headscope.models.hooked_model import raw_module

NAMES = ("k_norm", "k_layernorm")  # the attribute Hugging Face's attention modules give a key norm


@dataclass(frozen=True, kw_only=True)
class KeyNorm:
    """One layer's key norm: its attribute name and class, whether it runs per KV head (else over all KV
    heads together), the entries it normalises, its effective |weight| range and the norm range it allows."""

    module: str  # "k_norm"
    kind: str  # the Hugging Face class, e.g. "Qwen3RMSNorm"
    per_head: bool
    dim: int
    gain: tuple[float, float]  # min and max |effective weight|
    bounds: tuple[float, float]  # every output's L2 norm over `dim` entries lies in [low, high]
    bias: float = 0.0  # the largest head's bias norm |b_h| (0: no bias), which widens the bounds both ways

    @property
    def rms(self) -> bool:
        return "rms" in self.kind.lower()


def _per_head_norms(module: torch.nn.Module) -> list[torch.nn.Module] | None:
    """The per-head norms of a module that holds one norm per KV head in a ModuleList (StableLM's
    `StableLmLayerNormPerHead.norms`, whose forward splits its input along the heads axis), else None."""
    for child in module.children():
        if isinstance(child, torch.nn.ModuleList) and len(child) and all(
                isinstance(getattr(m, "weight", None), torch.Tensor) or hasattr(m, "normalized_shape") for m in child):
            return list(child)
    return None


@torch.no_grad()
def _probe(module: torch.nn.Module, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(|gain|, bias) of one norm module, each [heads, dim], from its outputs on +x and -x (x of `shape`,
    the alternating +-1 vector along the last dim); None when the module refuses that layout."""
    param = next(module.parameters(), None)
    like = dict(dtype=param.dtype, device=param.device) if param is not None else {}
    x = torch.ones(1, *shape, **like)  # [1, dim] or [1, n_heads, d_head]
    x[..., 1::2] = -1  # mean 0, rms 1 over the last dim
    try:
        up, down = module(x).float(), module(-x).float()  # x's shape
    except (RuntimeError, TypeError, ValueError):  # a norm that wants another layout
        return None
    if up.shape != x.shape:
        return None
    dim = shape[-1]
    return ((up - down) / 2).abs().reshape(-1, dim), ((up + down) / 2).reshape(-1, dim)


def _shape(module: torch.nn.Module, d_head: int) -> tuple[int, ...]:
    """The input a norm's weight fixes ([dim] or [n_heads, d_head]); [normalized_shape[-1]] or [d_head] without one."""
    weight = getattr(module, "weight", None)
    if isinstance(weight, torch.Tensor) and weight.ndim:
        return tuple(int(v) for v in weight.shape)
    return (int((getattr(module, "normalized_shape", None) or (d_head,))[-1]),)


def norm_range(module: torch.nn.Module, name: str, d_head: int) -> KeyNorm | None:
    """The KeyNorm of one Hugging Face norm module (see the module doc), or None when it takes no input of
    its weight's shape. A weight of shape [n_heads, d_head] (Cohere's and Chameleon's per-head LayerNorm, one
    weight row per KV head) is probed with x of shape [1, n_heads, d_head]; a ModuleList of one norm per KV
    head (StableLM's `k_layernorm.norms`, review 17a A1) is read norm by norm. Each head h's output
    g_h * x_hat + b_h (x_hat of norm sqrt(dim)) has, by the triangle inequality, a norm in
    [sqrt(dim) min|g_h| - |b_h|, sqrt(dim) max|g_h| + |b_h|]; the bounds are the union over heads."""
    heads = _per_head_norms(module)
    probes = [_probe(m, _shape(m, d_head)) for m in heads] if heads else [_probe(module, _shape(module, d_head))]
    if any(p is None for p in probes):
        return None
    gain = torch.cat([g for g, _ in probes])  # [heads, dim]
    shift = torch.cat([b for _, b in probes]).norm(dim=-1)  # [heads]: |b_h|
    dim = int(gain.shape[-1])
    root = math.sqrt(dim)
    low = float((root * gain.min(dim=-1).values - shift).clamp(min=0).min())
    high = float((root * gain.max(dim=-1).values + shift).max())
    kind = type(module).__name__ + (f"({type(heads[0]).__name__})" if heads else "")  # e.g. "...PerHead(LayerNorm)"
    return KeyNorm(module=name, kind=kind, per_head=dim == d_head, dim=dim, gain=(float(gain.min()), float(gain.max())),
                   bounds=(low, high), bias=float(shift.max()))


def key_norms(model) -> list[KeyNorm | None]:
    """Per layer, the norm its attention applies to the keys before caching them (None: none; the
    keys' norms are free). Read from the Hugging Face attention module under each bridge block."""
    out: list[KeyNorm | None] = []
    for block in model.bridge.blocks:
        attn = raw_module(block.attn) if hasattr(block, "attn") else None
        found = None
        for name in NAMES:
            child = getattr(attn, name, None)
            if isinstance(child, torch.nn.Module):
                found = norm_range(raw_module(child), name, model.facts.d_head)
                break
        out.append(found)
    return out
