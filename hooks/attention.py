"""Scaled dot-product attention written out, as the reference the hooked model is checked against.

softmax(q k^T * scale + mask) v, with grouped-query attention handled by repeating each KV head
over its group of query heads (the layout Hugging Face and TransformerLens use).
"""
from __future__ import annotations

import math

import torch

from headscope.errors import ConfigError


def expand_kv_heads(kv: torch.Tensor, n_heads: int, head_dim: int = 2) -> torch.Tensor:
    """Repeat KV heads so each query head sees its group's KV head: n_kv_heads -> n_heads."""
    n_kv = kv.shape[head_dim]
    if n_heads % n_kv:
        raise ConfigError(f"n_heads ({n_heads}) is not a multiple of n_kv_heads ({n_kv}).")
    return kv.repeat_interleave(n_heads // n_kv, dim=head_dim)


def scaled_dot_product(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [..., q_pos, d], k [..., k_pos, d], v [..., k_pos, d_v] -> (output [..., q_pos, d_v], weights [..., q_pos, k_pos])."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ k.transpose(-1, -2) * scale  # [..., q_pos, k_pos]
    if causal:
        n_q, n_k = scores.shape[-2:]
        allowed = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)
        scores = scores.masked_fill(~allowed, float("-inf"))
    weights = scores.softmax(-1)
    return weights @ v, weights
