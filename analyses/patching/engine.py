"""Patching's entry to the sweep engine (execution/sweep.py): many patched forward passes stacked
along the batch dimension.

A sweep of N patched runs over a base prompt batch [B, pos] runs as ceil(N / K) forward passes
of K * B rows each (row k * B + b is run k on prompt b); K is sized from a memory budget (an
estimate of one row's peak activation memory), or set by the caller. The source prompts can
ride along as `lead` rows at the front of every forward pass: a hook at layer L then reads the
source activation of layer L from those rows, so an exact sweep needs no separate source run
and no stored cache. Results equal patching one index at a time (up to float rounding of
batched matmuls).

Also here: the padding check of patched batches, and the mask-based replacement hook that exact
patching and causal tracing share.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from tqdm.auto import tqdm

from headscope.analyses.core.metrics import Metric
from headscope.errors import ConfigError, ShapeMismatchError
from headscope.execution import batching, distributed, sweep
from headscope.execution.sweep import HookFn, HooksFor
from headscope.models.hooked_model import left_padding_starts

# Resume padded batches mid-model? The captured block calls hold each row's 4-d mask and rotary
# tables, gathered to the resumed rows; tests/analyses/test_padding_patching.py checks both this
# and the full bridge passes (False) against per-example runs. False is the fallback should a
# resumed pass ever mishandle padding.
RESUME_PADDED = True


def padding_mask(attention_mask: torch.Tensor | None, tokens: torch.Tensor) -> torch.Tensor | None:
    """attention_mask [B, pos] as a long mask on tokens' device; None when absent or without padding.
    Raises PaddingError (a TaskError) unless every row is left-padded (decoders are left-padded: each row's
    metric reads its last position)."""
    if attention_mask is None or bool(attention_mask.bool().all()):
        return None
    if tuple(attention_mask.shape) != tuple(tokens.shape):
        raise ShapeMismatchError(f"attention_mask {tuple(attention_mask.shape)} and tokens {tuple(tokens.shape)} "
                                 "differ in shape.")
    left_padding_starts(attention_mask, tokens.shape[0], what="patching reads each row's answer at the last position")
    return attention_mask.long().to(tokens.device)


def runs_per_forward(model, n_prompts: int, n_pos: int, memory_budget: int | None = None) -> int:
    """How many patched runs (each n_prompts rows of n_pos tokens) fit one forward pass:
    batching.rows_per_pass (memory_budget bytes, None: the device's default budget and the CPU
    pass cap) in whole runs, at least one when the budget holds one row (out-of-memory then
    halves the chunk); a budget below one row raises MemoryBudgetError.
    """
    return max(1, batching.rows_per_pass(model, n_pos, memory_budget=memory_budget) // n_prompts)


def run_batched(
    model,
    tokens: torch.Tensor,
    n_runs: int,
    hooks_for: HooksFor,
    metric: Metric,
    *,
    lead: torch.Tensor | None = None,
    batch_size: int | None = None,
    memory_budget: int | None = None,
    progress: bool = False,
    desc: str = "patching",
    stacked_metric: bool = False,
    layer_of: Callable[[int], int] | None = None,
    pos_of: Callable[[int], int | None] | None = None,
    attention_mask: torch.Tensor | None = None,
    resume_padded: bool | None = None,
) -> torch.Tensor:
    """Run n_runs patched forward passes over `tokens` [B, pos] (execution/sweep.py); returns the
    metric [n_runs, B].

    hooks_for(runs) gives the hooks of one chunk; each sees [len(runs) * B, ...] activations
    ordered run-major. lead: prompts [B, pos] (e.g. the source run) put before the runs in every
    forward pass, so hooks see [B + len(runs) * B, ...] and can read the lead rows' activation
    of the same layer (never patch them); the lead's metric is then returned as one extra last
    row. batch_size: patched runs per forward pass (None: sized from memory_budget bytes,
    default half the free GPU memory or 2 GiB on CPU; halved on out-of-memory). stacked_metric:
    the metric accepts the whole stacked output at once (one call per forward pass).
    layer_of(run): the first block run `run` edits, for a decoder metric that reads only the
    last position (runs then resume there from one captured pass); pos_of(run): the position
    it patches (None: all), runs in increasing position within a block. Under torch.distributed
    each rank runs its block of the runs (every run over all prompts) and the rows are summed
    across ranks, so every rank returns the whole [n_runs (+1), B]. attention_mask: [B, pos]
    (1 = real token) of left-padded prompts, shared by the lead rows (each clean/corrupted pair
    has one padding); every pass, full or resumed, runs under it. Padded batches resume
    mid-model only when resume_padded (None: RESUME_PADDED); otherwise they run full passes
    through the bridge, which honours the mask (position ids and padded keys). Metric values at
    cells that are padding in a row are whatever the run gives: callers mask them.
    """
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ConfigError(f"batch_size is the number of patched runs per forward pass; got {batch_size!r}, use an int >= 1.")
    tokens = model.check_tokens(tokens)
    n_prompts, n_pos = tokens.shape
    head = model.check_tokens(lead) if lead is not None else None  # [B, pos]
    n_lead = 0 if head is None else head.shape[0]
    mask = padding_mask(attention_mask, tokens)  # [B, pos] or None (no padding)
    if mask is not None and n_lead not in (0, n_prompts):
        raise ShapeMismatchError(f"a padded batch of {n_prompts} prompts needs as many lead rows (sharing its padding); "
                                 f"got {n_lead}.")
    if mask is not None and not (RESUME_PADDED if resume_padded is None else resume_padded):
        layer_of = None  # full passes under the mask
    mine = distributed.shard(n_runs)  # this rank's block of runs; rank 0 owns run 0 and the lead
    bar = tqdm(total=len(mine), desc=desc, disable=not (progress and distributed.is_main()), unit="run")

    def size(pos: int) -> sweep.ChunkSize:  # passes computing `pos` positions: whole runs of B rows
        return sweep.ChunkSize(n_prompts * (batch_size or runs_per_forward(model, n_prompts, pos, memory_budget)))

    spec = sweep.Sweep(tokens=tokens, hooks_for=hooks_for, metric=metric, stacked_metric=stacked_metric, lead=head,
                       attention_mask=mask, layer_of=layer_of, pos_of=pos_of)
    values, lead_values = sweep.run(model, spec, mine, size, done=bar.update)
    bar.close()
    out = torch.zeros(n_runs + (lead is not None), n_prompts)  # [run (+ lead), batch]
    out[mine.start:mine.stop] = values
    if lead_values is not None and distributed.is_main():
        out[-1] = lead_values
    return distributed.all_reduce_sum(out)  # each run was computed by exactly one rank


def replace_hook(source: torch.Tensor | None, mask: torch.Tensor, lead: int = 0) -> HookFn:
    """A hook putting `source` where `mask` [k, ...] (broadcastable to one row) is True.

    Run k of the chunk gets the source wherever mask[k] is True and keeps its own activation
    elsewhere. source: [B, ...], or per run [k, B, ...], or None to read it from the `lead`
    rows that run_batched put before the runs (same layer, same forward pass).
    """
    def hook(act: torch.Tensor, hook: Any) -> torch.Tensor:
        k = mask.shape[0]
        head, body = act[:lead], act[lead:]
        rows = body.view(k, -1, *act.shape[1:])  # [k, B, ...]
        src = head if source is None else source.to(act.device, act.dtype)  # act's device: sharded models
        patched = torch.where(mask.to(act.device).unsqueeze(1), src if src.ndim == rows.ndim else src.unsqueeze(0), rows)
        return torch.cat([head, patched.reshape(body.shape)]) if lead else patched.reshape(act.shape)

    return hook
def index_mask(
    n_runs: int,
    shape: Sequence[int],
    entries: Sequence[tuple[int, dict[int, int | None]]],
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """A bool mask [n_runs, *shape'] selecting, for run i, the cells given by its axis indices.

    shape: the activation's shape without batch; entries: (run i, {axis: index or None=all});
    axes named in no entry get size 1 (broadcast), so the mask stays small.
    """
    used = {axis for _, idx in entries for axis in idx}
    dims = [shape[a] if a in used else 1 for a in range(len(shape))]
    mask = torch.zeros(n_runs, *dims, dtype=torch.bool, device=device)
    for run, idx in entries:
        where: list[Any] = [run] + [slice(None)] * len(dims)
        for axis, value in idx.items():
            if value is not None:
                where[axis + 1] = value
        mask[tuple(where)] = True
    return mask
