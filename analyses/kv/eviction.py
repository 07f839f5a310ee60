"""Eviction what-if: the Task's metric when the answer query sees only part of the KV cache.

The prompt's context (every position before the last) is prefilled with full attention; then
the cache keeps `budget` of those positions and the last token (the answer query) attends to the
kept ones and itself. This is implemented as a mask on the answer query's row of the attention
scores (hook_attn_scores, -inf on evicted keys) at every layer, which gives exactly what a real
cache crop gives (keys are cached after RoPE, and softmax ignores the order of keys): the test
checks it against a cropped Hugging Face cache. Where TransformerLens hands attention to the Hugging
Face module and discards score edits (OPT, GPT-J: hooks/edits.py) the mask would do nothing, so the
sweep refuses in one line (require_masking) and the report skips kv with that reason. Policies:

- "sink_window": the first n_sink positions (attention sinks, Xiao et al. 2023) plus the most
  recent budget - n_sink;
- "window": the most recent `budget` positions;
- "heavy_hitters": H2O (Zhang et al. 2023): per layer and KV head, a recent window of the newest
  ceil(recent_share x budget) positions (RECENT_SHARE, half by default, as H2O's equal split) plus the
  rest of the budget as the positions that received the most attention from the context's queries
  (H2O's accumulated attention, summed over the query heads that share the KV head). Without the
  window (review 13a A1) accumulated attention under a causal mask is smallest for the newest
  positions (few queries see them), so the policy would evict the newest tokens first.
  Multi-head latent attention (DeepSeek; review 15d A6) caches one latent per position for all heads, so a
  crop keeps or drops a position for every head at once: there heavy hitters rank the attention summed
  over all heads and keep one set per layer (as one KV group), a cache MLA can hold.
"full" (no eviction) is the reference; budget >= the context length evicts nothing.

Sliding-window layers (Gemma 2's local layers, Mistral's; models.layer_windows) already hold only
the last window - 1 context positions for the answer query (their mask hides the rest and Hugging
Face's cache drops them), so the budget applies to what each layer holds: a windowed layer keeps the
policy's positions among its own (window: the last min(budget, window - 1); sink_window: sinks
outside the window are gone already; heavy_hitters: its recent window, then the heaviest of the other
positions inside the sliding window), and a budget >= window - 1 evicts nothing there. The sweep counts per prompt the
layer-positions the full cache holds (`cached`: every global layer's context, each windowed layer's
window) and those the policy keeps (`kept`), so what eviction saves counts only what it removes.

The context is prefilled once (hooks.kv_states.prefill: the hook-free pass where it applies, so
memory grows linearly with the prompt) and each policy and budget decodes the answer query alone
on that cache (answer_step); where a sliding-window cache drops early positions, each run is a
whole pass instead (evicted_logits). Heavy hitters' received attention is summed a chunk of
queries at a time (hooks.reduce_patterns).

Padded tasks (mixed lengths, left-padded: every answer query is the last position) run as one
batch with the task's attention mask: each row's context is its real tokens only (positions and
budgets count from its first real token), padding is never a cached entry (never kept, never
counted as received attention), so every row's metric equals that of its prompt run alone.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm

import headscope.hooks as hooks
from headscope.analyses.core.contract import one_token_answers
from headscope.analyses.core.metrics import accuracy, task_metric
from headscope.analyses.core.tasks import Task
from headscope.errors import ConfigError
from headscope.hooks.edits import edits_discarded, require_edits
from headscope.hooks.kv_states import cached_forward, holds_prefix, prefill, prefix_cache
from headscope.models.hooked_model import layer_windows, left_padding_starts, visible_keys

POLICIES: tuple[str, ...] = ("sink_window", "window", "heavy_hitters")
RECENT_SHARE = 0.5  # H2O's split: half the budget the most recent positions, half the heavy hitters


def recent_count(budget: int, recent_share: float = RECENT_SHARE) -> int:
    """Positions of heavy hitters' recent window at this budget: ceil(recent_share x budget) (budget 1, half: 1)."""
    return min(budget, math.ceil(recent_share * budget - 1e-9))


@torch.no_grad()
def kept_split(policy: str, budget: int, *, n_sink: int = 4, recent_share: float = RECENT_SHARE) -> dict[str, int]:
    """What `policy` keeps at `budget` of a prompt whose context is longer than the budget, on a global layer (keep_mask's
    rule in counts): {"first": the first positions (sink_window's sinks), "recent": the newest positions,
    "most_attended": the older positions of largest accumulated attention (heavy_hitters)}; the rest is evicted."""
    if policy == "window":
        return {"first": 0, "recent": int(budget), "most_attended": 0}
    if policy == "sink_window":
        sinks = min(n_sink, budget)
        return {"first": int(sinks), "recent": int(budget - sinks), "most_attended": 0}
    if policy == "heavy_hitters":
        recent = recent_count(budget, recent_share)
        return {"first": 0, "recent": int(recent), "most_attended": int(budget - recent)}
    raise ConfigError(f"unknown eviction policy {policy!r}; choose from {', '.join(POLICIES)}.")


def attention_received(model, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Attention each context key receives from the context's queries, per layer and KV head.

    Returns [layer, batch, kv_head, ctx] with ctx = pos - 1 (the answer query is excluded); with a
    (left-padding) attention_mask, padded queries and keys receive and give nothing (0). The
    patterns are summed a chunk of queries at a time (hooks.reduce_patterns).
    """
    f = model.facts
    ctx = tokens.shape[1] - 1
    real = None if attention_mask is None else attention_mask[:, :ctx].bool()  # [batch, ctx]
    sums: dict[int, torch.Tensor] = {}

    def reduce(layer: int, queries: torch.Tensor, pattern: torch.Tensor) -> None:  # pattern [batch, head, c, keys]
        pattern = pattern[..., :ctx]
        if real is not None:  # real queries to real keys only (torch.where: no NaN from padded rows)
            r = real.to(pattern.device)
            both = r[:, None, queries.to(r.device), None] & r[:, None, None, :]
            pattern = torch.where(both, pattern, 0.0)
        got = pattern.sum(2)  # [batch, head, ctx]
        sums[layer] = got if layer not in sums else sums[layer] + got

    hooks.reduce_patterns(model, tokens, reduce, query_positions=slice(0, ctx), attention_mask=attention_mask,
                          logits_from=tokens.shape[1] - 1)
    out = [sums[layer] for layer in range(f.n_layers)]  # each [batch, head, ctx]
    return torch.stack([h.reshape(h.shape[0], f.n_kv_heads, -1, ctx).sum(2) for h in out])  # [layer, batch, kv_head, ctx]


def held_positions(n_layers: int, ctx: int, windows: Sequence[int | None] | None = None) -> torch.Tensor:
    """bool [layer, ctx]: the context positions each layer holds for the answer query (at position ctx):
    every one for a global layer, the last window - 1 for a sliding-window layer (models.visible_keys)."""
    held = torch.ones(n_layers, ctx, dtype=torch.bool)
    for layer, w in enumerate(windows or ()):
        held[layer] = visible_keys(ctx, torch.arange(ctx), w)
    return held


def keep_mask(policy: str, *, n_layers: int, batch: int, n_kv_heads: int, ctx: int, budget: int,
              n_sink: int = 4, received: torch.Tensor | None = None, start: torch.Tensor | None = None,
              windows: Sequence[int | None] | None = None, recent_share: float = RECENT_SHARE) -> torch.Tensor:
    """Which context positions stay in the cache: bool [layer, batch, kv_head, ctx]. start: [batch]
    each row's first real position (left padding; None: 0): a row's context is positions start..ctx-1,
    counted from 0 there, and padding is never kept. windows: per layer its sliding window (None:
    global): a windowed layer keeps only positions it holds (held_positions), heavy hitters ranked
    among those. recent_share: the share of heavy hitters' budget kept as its recent window (recent_count)."""
    if not isinstance(budget, int) or budget < 0:
        raise ConfigError(f"budget must be a non-negative int (cache positions kept), got {budget!r}.")
    if policy not in ("full", *POLICIES):
        raise ConfigError(f"unknown eviction policy {policy!r}; use one of {('full', *POLICIES)}.")
    if not isinstance(recent_share, (int, float)) or not 0 <= recent_share <= 1:
        raise ConfigError(f"recent_share must be a share between 0 and 1 (heavy hitters' recent window), got {recent_share!r}.")
    shape = (n_layers, batch, n_kv_heads, ctx)
    start = torch.zeros(batch, dtype=torch.int64) if start is None else start.cpu().to(torch.int64)
    pos = torch.arange(ctx)[None, :] - start[:, None]  # [batch, ctx]: position within the row, < 0 on padding
    length = (ctx - start)[:, None]  # [batch, 1]: each row's context length
    real = pos >= 0
    held = real[None, :, None, :] & held_positions(n_layers, ctx, windows)[:, None, None, :]  # [layer, batch, 1, ctx]
    if policy == "full":
        keep = real
    elif policy == "window":
        keep = real & (pos >= length - budget)
    elif policy == "sink_window":
        sinks = min(n_sink, budget)
        keep = real & ((pos < sinks) | (pos >= length - (budget - sinks)))
    else:  # heavy_hitters
        if received is None or tuple(received.shape) != shape:
            raise ConfigError(f"heavy_hitters needs received= attention of shape {shape}; use attention_received(model, tokens).")
        recent = recent_count(budget, recent_share)
        newest = (real & (pos >= length - recent))[None, :, None, :] & held  # [layer, batch, 1, ctx]: the recent window
        ranked = received.cpu().masked_fill(~held | newest, float("-inf"))  # padding, a window's drop, the recent: last
        keep = newest.expand(shape).clone()
        if budget > recent:
            top = ranked.topk(min(budget - recent, ctx), -1)
            keep.scatter_(-1, top.indices, top.values > float("-inf"))
            keep |= newest  # scatter_ may have written False over a recent position ranked -inf
        return keep & held  # budget >= what a layer holds: all of it
    return (keep[None, :, None, :] & held).expand(shape).clone()


def require_masking(model) -> None:
    """UnsupportedModelError in one line where TransformerLens discards hook_attn_scores edits (OPT, GPT-J, ...:
    hooks/edits.py): the mask would evict nothing and every policy would equal the full cache (review 16d A1)."""
    require_edits(model, "the kv eviction what-if (a mask on the answer query's attention scores)")


def eviction_skipped(model) -> str | None:
    """Review 16dv B1: the one line kv_analysis records (summary["eviction_skipped"]) where TransformerLens discards
    hook_attn_scores edits, so only the eviction sweep is skipped; None where the mask takes effect."""
    why = edits_discarded(model, "scores")
    return f"{why}, so a mask on the answer query's attention scores would change nothing" if why else None


def evict_hooks(model, keep: torch.Tensor) -> list:
    """hook_attn_scores hooks that hide evicted keys from the last query: keep [layer, batch, kv_head, ctx]."""
    group = model.facts.n_heads // model.facts.n_kv_heads

    def make(layer: int):
        def hook(scores: torch.Tensor, hook) -> torch.Tensor:  # [batch, head, q, k]
            ctx = keep.shape[-1]
            hidden = ~keep[layer].to(scores.device).repeat_interleave(group, dim=1)  # [batch, head, ctx]
            scores = scores.clone()
            scores[:, :, -1, :ctx] = scores[:, :, -1, :ctx].masked_fill(hidden, float("-inf"))
            return scores
        return hook

    return [(hooks.site("scores", layer), make(layer)) for layer in range(model.facts.n_layers)]


@torch.no_grad()
def evicted_logits(model, tokens: torch.Tensor, keep: torch.Tensor,
                   attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Model output [batch, pos, vocab] with the answer query restricted to the kept cache positions."""
    kw = {} if attention_mask is None else {"attention_mask": attention_mask}
    return model.run_with_hooks(tokens, fwd=evict_hooks(model, keep), **kw)


@torch.no_grad()
def context_cache(model, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None):
    """The cache of the context (every position but the last) from one prefill, or None where it
    cannot serve every eviction run (a sliding-window layer keeps only its last positions)."""
    ctx = tokens.shape[1] - 1
    if ctx < 1:
        return None
    _, cache = prefill(model, tokens[:, :ctx], None if attention_mask is None else attention_mask[:, :ctx])
    return cache if holds_prefix(cache, ctx) else None


@torch.no_grad()
def answer_step(model, context, tokens: torch.Tensor, keep: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Logits [batch, 1, vocab] of the last token (the answer query) decoded on the cached context
    with the evicted keys hidden (evict_hooks): the same numbers as evicted_logits' last position,
    for one token's pass instead of the whole prompt's. `context` (context_cache) is left as it is."""
    ctx = tokens.shape[1] - 1
    cache = prefix_cache(model, context, ctx)  # views: the step appends to its own copy
    logits, _ = cached_forward(model, tokens[:, ctx:], cache, ctx, attention_mask=attention_mask,
                               fwd=evict_hooks(model, keep))
    return logits


def shared_cache(model) -> bool:
    """Does the model cache one latent per position for all heads (multi-head latent attention, kv_lora_rank)?"""
    return isinstance(getattr(model.bridge.original_model.config, "kv_lora_rank", None), int)


def default_budgets(ctx: int) -> list[int]:
    """Powers of two below the context length, then the context length itself."""
    return [b for b in (2 ** i for i in range(ctx.bit_length())) if b < ctx] + [ctx]


@torch.no_grad()
def eviction_sweep(model, task: Task, *, budgets: Sequence[int] | None = None, policies: Sequence[str] = POLICIES,
                   n_sink: int = 4, recent_share: float = RECENT_SHARE, progress: bool = False) -> pd.DataFrame:
    """The Task metric per policy, budget and example (plus policy "full" at the whole context).

    Columns: policy, budget, example, context (the prompt's context length: a budget at or above it
    evicts nothing from that prompt), cached (layer-positions the full cache holds for the answer query,
    summed over layers: a sliding-window layer holds at most window - 1), kept (those the policy keeps;
    kept < cached: the run evicts something), metric (the Task's metric), correct (argmax == answer).
    Padded tasks: budgets count real cache entries; a row whose context is within the budget keeps
    all of it ("full" lists the longest context as its budget).
    """
    one_token_answers(task, "kv eviction")
    require_masking(model)
    f = model.facts
    tokens, mask = task.tokens, task.attention_mask
    batch, ctx = tokens.shape[0], tokens.shape[1] - 1
    start = left_padding_starts(mask, batch, what="the kv eviction what-if reads each answer at the last position")
    budgets = default_budgets(ctx) if budgets is None else sorted(set(int(b) for b in budgets))
    metric = task_metric(task)
    received = attention_received(model, tokens, mask) if "heavy_hitters" in policies else None
    shared = shared_cache(model)  # MLA: one cached latent per position for all heads (the module doc)
    groups = 1 if shared else f.n_kv_heads
    if received is not None and shared:
        received = received.sum(2, keepdim=True)  # [layer, batch, 1, ctx]
    context = context_cache(model, tokens, mask)
    context_len = (ctx - start.cpu().to(torch.int64)).numpy()  # [batch] each prompt's context length
    windows = layer_windows(model)  # sliding-window layers hold only their window (the module doc)
    runs = [("full", ctx)] + [(p, b) for p in policies for b in budgets]
    frames, cached = [], None
    for policy, budget in tqdm(runs, desc="kv eviction", disable=not progress):
        keep = keep_mask(policy, n_layers=f.n_layers, batch=batch, n_kv_heads=groups, ctx=ctx,
                         budget=budget, n_sink=n_sink, received=received, start=start, windows=windows,
                         recent_share=recent_share).expand(-1, -1, f.n_kv_heads, -1)  # [layer, batch, kv_head, ctx]
        kept = keep.sum((0, 3)).double().mean(1).numpy()  # [batch] layer-positions (mean over KV heads)
        cached = kept if cached is None else cached  # the first run is "full"
        if context is None:
            logits = evicted_logits(model, tokens, keep, mask)  # [batch, pos, vocab]
        else:
            logits = answer_step(model, context, tokens, keep, mask)  # [batch, 1, vocab]
        frames.append(pd.DataFrame({
            "policy": policy, "budget": budget, "example": range(batch), "context": context_len,
            "cached": cached, "kept": kept, "metric": metric(logits).float().cpu().numpy(),  # (numpy has no bfloat16)
            "correct": accuracy(logits, task.answers.to(logits.device)).cpu().numpy(),
        }))
    return pd.concat(frames, ignore_index=True)
