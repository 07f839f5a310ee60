"""KV states: the keys and values a decoder caches, per layer and KV head.

`kv_states` reads them from one forward pass; `generate_with_kv` runs cached greedy generation
and records the K and V each step appends. Both read the Hugging Face cache object that the
bridged model fills, so keys are exactly what the cache stores (after RoPE on rotary models)
for every architecture. The prompt's pass (`prefill`) runs the hook-free blocks where they apply
(the fused attention kernel: memory linear in the prompt's length) and fills the same cache.
Layout: [batch, kv_head, pos, d_head]. On multi-head latent attention (DeepSeek) the bridge's cache holds the
per-head K and V expanded from the latent, not Hugging Face's latent cache (analyses/kv's cache_anatomy counts
that one; review 15d C3).
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headscope.errors import ConfigError, ContextLengthError, UnsupportedModelError
from headscope.models.hooked_model import hook_free_pass


@dataclass(frozen=True, kw_only=True)
class KVStates:
    keys: list[torch.Tensor]  # per layer: [batch, kv_head, pos, d_head]
    values: list[torch.Tensor]  # per layer: [batch, kv_head, pos, d_head]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


@dataclass(frozen=True, kw_only=True)
class GenerationTrace:
    tokens: torch.Tensor  # [batch, prompt + new]
    steps: list[KVStates]  # step 0: the prompt's K/V; step i > 0: the one position appended
    cache: Any  # the Hugging Face cache object after the last step

    def stacked(self) -> KVStates:
        """All steps concatenated along pos: what the cache holds at the end."""
        n_layers = len(self.steps[0].keys)
        cat = lambda field, layer: torch.cat([getattr(s, field)[layer] for s in self.steps], dim=2)  # noqa: E731
        return KVStates(
            keys=[cat("keys", layer) for layer in range(n_layers)],
            values=[cat("values", layer) for layer in range(n_layers)],
        )


def _require_decoder(model, what: str) -> None:
    if model.facts.is_encoder:
        raise ConfigError(f"{what} needs a decoder with a KV cache; {model.facts.name} is an encoder.")


def new_cache(model) -> Any:
    """An empty Hugging Face DynamicCache for the model."""
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.bridge.original_model.config)
    except TypeError:  # older transformers
        return DynamicCache()


def holds_prefix(cache: Any, length: int) -> bool:
    """Does every layer of `cache` still hold positions [0, length)? A sliding-window layer keeps
    only its last positions once a prompt outgrows the window."""
    return all(lay.keys is not None and lay.keys.shape[2] == lay.get_seq_length() >= length for lay in cache.layers)


def prefix_cache(model, cache: Any, length: int, *, rows: torch.Tensor | None = None) -> Any:
    """A new cache holding positions [0, length) of `cache` (left untouched), for batch rows
    `rows` [n] of it (repeats allowed; None: every row once)."""
    if length > 0 and not holds_prefix(cache, length):
        raise ConfigError(
            f"The cache no longer holds positions 0..{length - 1} (a sliding-window layer keeps only its last "
            f"positions); run those positions again instead of reusing the cache."
        )
    out = new_cache(model)
    if length > 0:
        for layer in range(model.facts.n_layers):
            lay = cache.layers[layer]
            keys, values = lay.keys[:, :, :length], lay.values[:, :, :length]  # [batch, kv_head, pos, d_head]
            if rows is not None:
                rows = rows.to(keys.device)
                keys, values = keys.index_select(0, rows), values.index_select(0, rows)  # [n, kv_head, pos, d_head]
            out.update(keys, values, layer)
    return out


def _cache_slice(cache: Any, n_layers: int, start: int) -> KVStates:
    """Positions start: of every layer's cached K and V."""
    layers = [cache.layers[layer] for layer in range(n_layers)]
    return KVStates(
        keys=[lay.keys[:, :, start:].clone() for lay in layers],
        values=[lay.values[:, :, start:].clone() for lay in layers],
    )


def cached_forward(model, step_input: torch.Tensor, cache: Any, start: int, *,
                   attention_mask: torch.Tensor | None = None, fwd: Sequence = ()) -> tuple[torch.Tensor, Any]:
    """One forward over step_input [batch, n] at positions start..start+n-1, extending `cache`.
    attention_mask [batch, start + n] (left padding, 1 = real token): the cached and new positions'
    mask; each row's positions then count from its first real token. fwd: hooks for this pass. step_input moves to
    the model's device (kv's eviction sweep keeps its tokens on the CPU; on CUDA the embedding refused them)."""
    step_input = step_input.to(model.device)
    kw: dict[str, Any] = {}
    if attention_mask is None:
        position_ids = torch.arange(start, start + step_input.shape[1], device=step_input.device)
        position_ids = position_ids.expand(step_input.shape[0], -1)
    else:
        attention_mask = attention_mask.to(step_input.device)
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)[:, start:]  # [batch, n]
        kw["attention_mask"] = attention_mask
    with warnings.catch_warnings(), model.hooks(fwd=list(fwd)):
        # transformers >= 5.2x renames past_key_values to cache; TransformerLens 4.3 still passes the
        # old name (load_model routes it), so the deprecation notice is noise for our users
        warnings.filterwarnings("ignore", message=r".*past_key_values.* is deprecated", category=FutureWarning)
        logits, cache = model.bridge(
            step_input, return_type="logits_and_cache", use_cache=True, past_key_values=cache,
            position_ids=position_ids, **kw,
        )
    if cache is None or cache.layers[0].keys is None:
        raise UnsupportedModelError(
            f"{model.facts.name}: the bridged model filled no KV cache; this architecture's attention "
            f"bridge does not support cached decoding in this transformers/TransformerLens combination."
        )
    return logits, cache


@torch.no_grad()
def kv_states(model, tokens: torch.Tensor) -> KVStates:
    """K and V of every layer from one forward pass over `tokens` [batch, pos] (no padding)."""
    _require_decoder(model, "kv_states")
    tokens = model.check_tokens(tokens)
    _, cache = prefill(model, tokens)
    return _cache_slice(cache, model.facts.n_layers, 0)


@torch.no_grad()
def prefill(model, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, Any]:
    """(logits [batch, 1, d_vocab] at the last position, a new cache holding every position of
    tokens [batch, pos]): the hook-free pass where it applies (no pattern materialised: memory
    linear in the length; models.hooked_model.hook_free_pass), else the bridge's cached forward.
    attention_mask [batch, pos]: left padding, as cached_forward."""
    cache = new_cache(model)
    if attention_mask is not None:
        attention_mask = attention_mask.to(model.device)
    logits = hook_free_pass(model, tokens, attention_mask, cache=cache, logits_from=tokens.shape[1] - 1)
    if logits is not None:
        return logits, cache
    logits, cache = cached_forward(model, tokens, new_cache(model), 0, attention_mask=attention_mask)
    return logits[:, -1:], cache


@torch.no_grad()
def generate_with_kv(model, tokens: torch.Tensor, max_new_tokens: int) -> GenerationTrace:
    """Greedy decoding with a KV cache, recording the K/V each step appends.

    tokens: [batch, pos] prompt without padding. Returns the full token sequence, the per-step
    KV states and the final cache.
    """
    _require_decoder(model, "generate_with_kv")
    if max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
    tokens = model.check_tokens(tokens)
    total = tokens.shape[1] + max_new_tokens
    if model.facts.fixed_context and total > model.facts.n_ctx:
        raise ContextLengthError(
            f"prompt ({tokens.shape[1]}) + max_new_tokens ({max_new_tokens}) = {total} exceeds the "
            f"context of {model.facts.n_ctx}; generate fewer tokens or shorten the prompt."
        )
    cache = None
    steps: list[KVStates] = []
    out, step_input = tokens, tokens  # step_input: the prompt, then [batch, 1]
    for _ in range(max_new_tokens):
        start = out.shape[1] - step_input.shape[1]
        if cache is None:
            logits, cache = prefill(model, step_input)
        else:
            logits, cache = cached_forward(model, step_input, cache, start)
        steps.append(_cache_slice(cache, model.facts.n_layers, start))
        step_input = logits[:, -1].argmax(-1, keepdim=True)  # [batch, 1]
        out = torch.cat([out, step_input], dim=1)
    return GenerationTrace(tokens=out, steps=steps, cache=cache)
