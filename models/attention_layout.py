"""Two facts of a model's attention that change how position and norm findings read (review 17a C3), for
ModelFacts, the report's header and print(model):

- partial rotary: rotary turns only the first r of each head's d_head dims (StableLM's partial_rotary_factor
  0.25, Pythia's rotary_pct, GPT-J's rotary_dim); the other dims carry no position;
- q/k norms: a norm of q and of k before the scores (StableLM's per-head LayerNorm, Qwen3's and Gemma 3's
  per-head RMSNorm, OLMo 2's RMSNorm over the whole q and k projections);
- clip_qkv: OLMo / OLMoE clamp every entry of q, k and v to +-clip after the projection (and the norm).
"""
from __future__ import annotations

from typing import Any

import torch

Q_NORMS = ("q_norm", "q_layernorm")  # what Hugging Face's attention modules call their q norm


def rotary_dims(attn: torch.nn.Module, config: Any, d_head: int) -> int | None:
    """The dims of each head that rotary turns where fewer than d_head (partial rotary), else None. attn: the
    Hugging Face attention module (its rotary_ndims or rotary_dim), config: its config
    (rope_parameters' or its own partial_rotary_factor, rotary_pct) where the module names none."""
    dims = getattr(attn, "rotary_ndims", None) or getattr(attn, "rotary_dim", None)
    if not isinstance(dims, int) or isinstance(dims, bool):
        rope = getattr(config, "rope_parameters", None) or {}
        factor = (rope.get("partial_rotary_factor") if isinstance(rope, dict) else None) \
            or getattr(config, "partial_rotary_factor", None) or getattr(config, "rotary_pct", None)
        dims = int(d_head * factor) if isinstance(factor, (int, float)) else None
    return dims if isinstance(dims, int) and not isinstance(dims, bool) and 0 < dims < d_head else None


def qk_norm(attn: torch.nn.Module, d_head: int) -> str | None:
    """'LayerNorm per head', 'RMSNorm per head' or 'RMSNorm over all heads' (OLMo 2: one norm over the whole q
    projection) where the attention normalises q and k before its scores, else None."""
    norm = next((attn._modules[n] for n in Q_NORMS if attn._modules.get(n) is not None), None)
    if norm is None:
        return None
    while isinstance(getattr(norm, "original_component", None), torch.nn.Module):  # a bridge component
        norm = norm.original_component
    kind = "RMSNorm" if "rms" in type(norm).__name__.lower() else "LayerNorm"
    weight = next(norm.parameters(), None)
    if weight is None:
        return kind
    return f"{kind} per head" if int(weight.shape[-1]) == d_head else f"{kind} over all heads"


def interleaved_rotary(attn: torch.nn.Module, d_head: int, rotary: int | None) -> bool:
    """Whether the attention's rotary embedding turns interleaved pairs of dims (2i, 2i + 1: GPT-J style, Glm4's and
    GLM-4-MoE's apply_rotary_pos_emb) rather than halves (i, i + r/2: Llama's), read off what its modeling module's
    own apply_rotary_pos_emb does to the first dim at a quarter turn (cos 0, sin 1); False where it cannot be called
    that way (another signature: GPT-J's own module, MLA)."""
    import sys

    apply = getattr(sys.modules.get(type(attn).__module__), "apply_rotary_pos_emb", None)
    r = rotary or d_head
    if not callable(apply) or r < 4:
        return False
    q = torch.zeros(1, 1, 1, d_head)  # [batch, head, pos, d_head]: the first dim only
    q[..., 0] = 1.0
    try:
        out = apply(q, q.clone(), torch.zeros(1, 1, r), torch.ones(1, 1, r))[0].reshape(-1)  # [d_head]
    except Exception:  # noqa: BLE001 - another signature: not told rather than guessed
        return False
    return bool(out[1].abs() > 0.5 and out[r // 2].abs() < 0.5)


def attention_words(rotary: Any, d_head: Any, norm: Any, clip: Any = None, interleaved: Any = False) -> list[str]:
    """Header phrases: ['partial rotary (4 of each head's 16 dims turned, 12 position-free)', 'q/k LayerNorm per
    head (after hook_q/hook_k, before hook_rot_q/hook_rot_k)', 'q, k, v clamped to +-2 (clip_qkv)'], or fewer where a
    fact does not hold (or is not recorded: older manifests)."""
    words = []
    if isinstance(rotary, int) and isinstance(d_head, int) and 0 < rotary < d_head:
        words.append(f"partial rotary ({rotary} of each head's {d_head} dims turned, {d_head - rotary} position-free)")
    if interleaved is True:  # review 20d B: Glm4's pairs are dims (2i, 2i + 1), not (i, i + r/2)
        words.append("rotary on interleaved pairs of dims (2i, 2i + 1; GPT-J style)")
    if isinstance(norm, str) and norm:  # review 20 A2: a per-head norm runs after hook_q/hook_k (hooks.sites)
        words.append(f"q/k {norm}" + (" (after hook_q/hook_k, before hook_rot_q/hook_rot_k)"
                                      if norm.endswith("per head") else ""))
    if isinstance(clip, (int, float)) and not isinstance(clip, bool):
        words.append(f"q, k, v clamped to +-{clip:g} (clip_qkv)")
    return words
