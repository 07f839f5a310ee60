"""Whether a model normalises its keys before caching them, and what that fixes about their norms.

Qwen3 and Gemma 3 run an RMSNorm over each KV head's d_head entries of every key (`k_norm`), Cohere a
LayerNorm per KV head with one weight row per head ([n_kv_heads, d_head]), OLMo 2 one over all KV heads
together, before RoPE (a rotation, which keeps norms) and before the cache. A
normalised vector x / rms(x) has norm sqrt(n) over its n entries, so the cached key g * x / rms(x)
(g the norm's effective per-entry weight: Gemma's 1 + weight included) has a norm between
sqrt(n) x min|g| and sqrt(n) x max|g| (a bias b widens that by |b|), whatever the input: on such a
model the first key's norm cannot stand out, and a sink is made by the key's direction instead.

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

    @property
    def rms(self) -> bool:
        return "rms" in self.kind.lower()


@torch.no_grad()
def norm_range(module: torch.nn.Module, name: str, d_head: int) -> KeyNorm | None:
    """The KeyNorm of one Hugging Face norm module (see the module doc), or None when it takes no input of
    its weight's shape (a list of per-head norms). A weight of shape [n_heads, d_head] (Cohere's per-head
    LayerNorm, one weight row per KV head) is probed with x of shape [1, n_heads, d_head]: each head's row is
    normalised over its d_head entries, and the gain range is taken over every head's entries."""
    weight = getattr(module, "weight", None)
    shape = tuple(int(v) for v in weight.shape) if isinstance(weight, torch.Tensor) and weight.ndim else \
        (int((getattr(module, "normalized_shape", None) or (d_head,))[-1]),)
    dim = shape[-1]
    param = next(module.parameters(), None)
    like = dict(dtype=param.dtype, device=param.device) if param is not None else {}
    x = torch.ones(1, *shape, **like)  # [1, dim] or [1, n_heads, d_head]
    x[..., 1::2] = -1  # mean 0, rms 1 over the last dim
    try:
        up, down = module(x).float(), module(-x).float()  # x's shape
    except (RuntimeError, TypeError, ValueError):  # a norm that wants another layout (per-head module lists)
        return None
    if up.shape != x.shape:
        return None
    gain = ((up - down) / 2).abs().reshape(-1, dim)  # [heads, dim]
    shift = float(((up + down) / 2).reshape(-1, dim).norm(dim=-1).max())
    lo, hi = float(gain.min()), float(gain.max())
    return KeyNorm(module=name, kind=type(module).__name__, per_head=dim == d_head, dim=dim, gain=(lo, hi),
                   bounds=(max(0.0, math.sqrt(dim) * lo - shift), math.sqrt(dim) * hi + shift))


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
