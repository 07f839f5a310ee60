"""Eviction what-if: the Task's metric when the answer query sees only part of the KV cache.

The prompt's context (every position before the last) is prefilled with full attention; then
the cache keeps `budget` of those positions and the last token (the answer query) attends to the
kept ones and itself. This is implemented as a mask on the answer query's row of the attention
scores (hook_attn_scores, -inf on evicted keys) at every layer, which gives exactly what a real
cache crop gives (keys are cached after RoPE, and softmax ignores the order of keys): the test
checks it against a cropped Hugging Face cache. Policies:

- "sink_window": the first n_sink positions (attention sinks, Xiao et al. 2023) plus the most
  recent budget - n_sink;
- "window": the most recent `budget` positions;
- "heavy_hitters": per layer and KV head, the `budget` positions that received the most
  attention from the context's queries (H2O's accumulated attention, summed over the query heads
  that share the KV head).
"full" (no eviction) is the reference; budget >= the context length evicts nothing.
"""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm

import headscope.hooks as hooks
from headscope.analyses.core.metrics import accuracy, task_metric
from headscope.analyses.core.tasks import Task
from headscope.errors import ConfigError

POLICIES: tuple[str, ...] = ("sink_window", "window", "heavy_hitters")


@torch.no_grad()
def attention_received(model, tokens: torch.Tensor) -> torch.Tensor:
    """Attention each context key receives from the context's queries, per layer and KV head.

    Returns [layer, batch, kv_head, ctx] with ctx = pos - 1 (the answer query is excluded).
    """
    f = model.facts
    names = [hooks.site("pattern", layer) for layer in range(f.n_layers)]
    ctx = tokens.shape[1] - 1
    acts = hooks.capture(model, tokens, names, positions=slice(0, ctx))
    out = []
    for name in names:
        per_head = acts[name][..., :ctx].sum(2)  # [batch, head, ctx]
        out.append(per_head.reshape(per_head.shape[0], f.n_kv_heads, -1, ctx).sum(2))  # [batch, kv_head, ctx]
    return torch.stack(out)  # [layer, batch, kv_head, ctx]


def keep_mask(policy: str, *, n_layers: int, batch: int, n_kv_heads: int, ctx: int, budget: int,
              n_sink: int = 4, received: torch.Tensor | None = None) -> torch.Tensor:
    """Which context positions stay in the cache: bool [layer, batch, kv_head, ctx]."""
    if not isinstance(budget, int) or budget < 0:
        raise ConfigError(f"budget must be a non-negative int (cache positions kept), got {budget!r}.")
    shape = (n_layers, batch, n_kv_heads, ctx)
    pos = torch.arange(ctx)
    if policy == "full" or budget >= ctx:
        return torch.ones(shape, dtype=torch.bool)
    if policy == "window":
        keep = pos >= ctx - budget
    elif policy == "sink_window":
        sinks = min(n_sink, budget)
        keep = (pos < sinks) | (pos >= ctx - (budget - sinks))
    elif policy == "heavy_hitters":
        if received is None or tuple(received.shape) != shape:
            raise ConfigError(f"heavy_hitters needs received= attention of shape {shape}; use attention_received(model, tokens).")
        keep = torch.zeros(shape, dtype=torch.bool)
        keep.scatter_(-1, received.cpu().topk(budget, -1).indices, True)
        return keep
    else:
        raise ConfigError(f"unknown eviction policy {policy!r}; use one of {('full', *POLICIES)}.")
    return keep.expand(shape).clone()


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
def evicted_logits(model, tokens: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Model output [batch, pos, vocab] with the answer query restricted to the kept cache positions."""
    return model.run_with_hooks(tokens, fwd=evict_hooks(model, keep))


def default_budgets(ctx: int) -> list[int]:
    """Powers of two below the context length, then the context length itself."""
    return [b for b in (2 ** i for i in range(ctx.bit_length())) if b < ctx] + [ctx]


def eviction_sweep(model, task: Task, *, budgets: Sequence[int] | None = None, policies: Sequence[str] = POLICIES,
                   n_sink: int = 4, progress: bool = False) -> pd.DataFrame:
    """The Task metric per policy, budget and example (plus policy "full" at the whole context).

    Columns: policy, budget, example, metric (the Task's metric), correct (argmax == answer).
    """
    f = model.facts
    tokens = task.tokens
    batch, ctx = tokens.shape[0], tokens.shape[1] - 1
    budgets = default_budgets(ctx) if budgets is None else sorted(set(int(b) for b in budgets))
    metric = task_metric(task)
    received = attention_received(model, tokens) if "heavy_hitters" in policies else None
    runs = [("full", ctx)] + [(p, b) for p in policies for b in budgets]
    frames = []
    for policy, budget in tqdm(runs, desc="kv eviction", disable=not progress):
        keep = keep_mask(policy, n_layers=f.n_layers, batch=batch, n_kv_heads=f.n_kv_heads, ctx=ctx,
                         budget=budget, n_sink=n_sink, received=received)
        logits = evicted_logits(model, tokens, keep)  # [batch, pos, vocab]
        frames.append(pd.DataFrame({
            "policy": policy, "budget": budget, "example": range(batch),
            "metric": metric(logits).cpu().numpy(),
            "correct": accuracy(logits, task.answers.to(logits.device)).cpu().numpy(),
        }))
    return pd.concat(frames, ignore_index=True)
