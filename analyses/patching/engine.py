"""The batching engine: many patched forward passes stacked along the batch dimension.

A sweep of N patched runs over a base prompt batch [B, pos] is run as ceil(N / K) forward
passes of K * B rows each: the base tokens are tiled K times (row k * B + b is run k on prompt
b) and every hook sees activations of shape [K * B, ...], which it views as [K, B, ...] to apply
run k's own edit. K is sized from a memory budget (an estimate of one row's peak activation
memory), or set by the caller. Because every row computes exactly what a lone forward pass
would, the results equal patching one index at a time (up to float rounding of batched matmuls).
The source prompts can ride along as `lead` rows at the front of every forward pass: a hook at
layer L then reads the source activation of layer L from those rows, so an exact sweep needs no
separate source run and no stored cache.

Also here: the mask-based replacement hook that exact patching and causal tracing share.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from tqdm.auto import tqdm

from headscope.analyses.core.metrics import Metric
from headscope.errors import ConfigError, ShapeMismatchError
from headscope.execution import batching, distributed, resume
from headscope.execution.rows import take
from headscope.hooks.sites import hook_point, split_block
from headscope.models.hooked_model import left_padding_starts

HookFn = Callable[..., Any]
Hooks = Sequence[tuple[str, HookFn]]
HooksFor = Callable[[range], Hooks]  # runs of one chunk -> hooks acting on [len(runs) * batch, ...]
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


def chunks(n_runs: int, per_forward: int) -> list[range]:
    """Split range(n_runs) into equal-sized consecutive chunks of at most per_forward runs."""
    n_chunks = max(1, math.ceil(n_runs / per_forward))
    size = math.ceil(n_runs / n_chunks)
    return [range(start, min(start + size, n_runs)) for start in range(0, n_runs, size)]


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
    """Run n_runs patched forward passes over `tokens` [B, pos]; returns the metric [n_runs, B].

    hooks_for(runs) gives the hooks of one chunk; each sees [len(runs) * B, ...] activations
    ordered run-major. lead: prompts [B, pos] (e.g. the source run) put before the runs in every
    forward pass, so hooks see [B + len(runs) * B, ...] and can read the lead rows' activation
    of the same layer (never patch them); the lead's metric is then returned as one extra last
    row. batch_size: patched runs per forward pass (None: sized from memory_budget bytes,
    default half the free GPU memory or 2 GiB on CPU). stacked_metric: the metric accepts the
    whole stacked output at once (one call per forward pass). layer_of(run): the first block
    run `run` edits, for a decoder metric that reads only the last position; consecutive runs
    with the same block form a segment that resumes there from one captured pass
    (hooks/resume). pos_of(run): the position it patches (None: all), runs in increasing
    position within a segment; a large segment is then split by position so that each pass
    also skips the positions before its first patched one. Consecutive segments of all-position
    z edits (head sweeps) share passes (resume.resume_mixed), sized for the positions from the
    first one where lead and base tokens differ (before it both runs are equal, so an edit
    copying lead activations changes nothing there). A chunk that runs out of memory is
    retried at half the size, and later chunks keep the smaller size. Under
    torch.distributed each rank runs its block of the runs (every run over all prompts) and the
    rows are summed across ranks, so every rank returns the whole [n_runs (+1), B].
    attention_mask: [B, pos] (1 = real token) of left-padded prompts, shared by the lead rows
    (each clean/corrupted pair has one padding); every pass, full or resumed, runs under it.
    Padded batches resume mid-model only when resume_padded (None: RESUME_PADDED); otherwise they run
    full passes through the bridge, which honours the mask (position ids and padded keys). Metric
    values at cells that are padding in a row are whatever the run gives: callers mask them.
    """
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ConfigError(f"batch_size is the number of patched runs per forward pass; got {batch_size!r}, use an int >= 1.")
    tokens = model.check_tokens(tokens)
    n_prompts, n_pos = tokens.shape
    head = model.check_tokens(lead) if lead is not None else tokens[:0]  # [B or 0, pos]
    n_lead = head.shape[0]
    mask = padding_mask(attention_mask, tokens)  # [B, pos] or None (no padding)
    if mask is not None and n_lead not in (0, n_prompts):
        raise ShapeMismatchError(f"a padded batch of {n_prompts} prompts needs as many lead rows (sharing its padding); "
                                 f"got {n_lead}.")
    if mask is not None and not (RESUME_PADDED if resume_padded is None else resume_padded):
        layer_of = None  # full passes under the mask
    mine = distributed.shard(n_runs)  # this rank's block of runs; rank 0 owns run 0 and the lead
    out = torch.zeros(n_runs + (lead is not None), n_prompts)  # [run (+ lead), batch]
    bar = tqdm(total=len(mine), desc=desc, disable=not (progress and distributed.is_main()), unit="run")
    support = resume.supports(model) if layer_of is not None else resume.Support(False, False, False)
    computed = n_pos  # positions a merged head pass computes: those from where lead and base tokens differ
    if support.ok and support.prefix and n_lead and n_lead == n_prompts:
        differ = (head != tokens).any(0).nonzero()
        computed = n_pos - int(differ[0]) if len(differ) else 1
    per_forward = {merged: batch_size or runs_per_forward(model, n_prompts, pos, memory_budget)
                   for merged, pos in ((False, n_pos), (True, computed))}

    def stacked_mask(k: int) -> torch.Tensor | None:  # [B_lead + k * B, pos]: lead, then base k times
        return None if mask is None else torch.cat([mask[:n_lead], mask.repeat(k, 1)])

    ckpt = None
    if support.ok:
        with torch.no_grad():  # rows: lead, then base
            ckpt = resume.capture(model, torch.cat([head, tokens]), attention_mask=stacked_mask(1),
                                  z_layers=range(model.facts.n_layers) if support.shortcut else ())
    last = model.facts.n_layers - 1

    def stacked_rows(k: int) -> torch.Tensor:  # captured rows of a pass of k runs: lead, then base k times
        return torch.cat([torch.arange(n_lead), n_lead + torch.arange(n_prompts).repeat(k)]).to(model.device)

    def forward(chunk: range, merged: bool = False) -> torch.Tensor:  # local offsets -> [B_lead + k * B] metric values
        runs = range(mine.start + chunk.start, mine.start + chunk.stop)
        result = None
        if merged:  # runs of several blocks, each block's edits applied to its own runs' rows
            parts = [(layer_of(sub.start), hooks_for(sub), stacked_rows(len(sub)),
                      n_lead + (sub.start - runs.start) * n_prompts) for sub in _by_block(runs, layer_of)]
            result = _resumed_mixed(model, ckpt, support, parts, stacked_rows(len(runs)), n_lead)
        if result is None:
            hooks = hooks_for(runs)
            start = _first_block(hooks) if ckpt is not None else None
            if start is None:
                stacked = torch.cat([head, tokens.repeat(len(runs), 1)])  # [B_lead + k * B, pos]
                result = model.run_with_hooks(stacked, fwd=hooks, attention_mask=stacked_mask(len(runs)))
            else:
                result = _resumed(model, ckpt, support, start, stacked_rows(len(runs)), hooks, last)
        if stacked_metric:
            values = metric(result).float().cpu()  # [B_lead + k * B]
        else:
            parts = [metric(result[:n_lead]).float().cpu()] if n_lead else []
            parts += [metric(result[n_lead + i * n_prompts:n_lead + (i + 1) * n_prompts]).float().cpu()
                      for i in range(len(runs))]
            values = torch.cat(parts)
        bar.update(len(runs))
        return values

    size = {merged: max(1, k) for merged, k in per_forward.items()}  # runs per pass; shrinks for good on out-of-memory

    def shrink(merged: bool):
        def halve(failed: int) -> None:
            size[merged] = max(1, min(size[merged], failed // 2))
        return halve

    key = None if ckpt is None else (lambda i: layer_of(mine.start + i))
    segments = [(seg, False) for seg in _by_block(range(len(mine)), key)]
    if ckpt is not None and support.shortcut and support.fast:  # all-position z edits of several blocks: one pass
        segments = _merge_z_segments([seg for seg, _ in segments],
                                     lambda i: hooks_for(range(mine.start + i, mine.start + i + 1)),
                                     lambda i: layer_of(mine.start + i),
                                     lambda i: None if pos_of is None else pos_of(mine.start + i))
    first = True
    with torch.no_grad():
        for seg, merged in segments:
            subs = [seg]
            if ckpt is not None and support.prefix and pos_of is not None and pos_of(mine.start + seg.start) is not None:
                n_sub = max(1, min(4, len(seg) * n_prompts * n_pos // 500))  # passes that skip earlier positions
                subs = chunks(len(seg), math.ceil(len(seg) / n_sub))
                subs = [range(seg.start + r.start, seg.start + r.stop) for r in subs]
            for sub in subs:
                n_chunk = len(chunks(len(sub), size[merged])[0]) if len(sub) else 1  # equal-sized forward passes
                parts = batching.run_chunks(
                    lambda c, sub=sub, merged=merged: forward(range(sub.start + c.start, sub.start + c.stop), merged),
                    len(sub), n_chunk, on_oom=shrink(merged))
                for chunk, values in parts:
                    lo = mine.start + sub.start + chunk.start
                    out[lo:lo + len(chunk)] = values[n_lead:].view(len(chunk), n_prompts)
                    if first and n_lead and distributed.is_main():
                        out[-1] = values[:n_lead]
                    first = False
    bar.close()
    return distributed.all_reduce_sum(out)  # each run was computed by exactly one rank


def _resumed(model, ckpt, support, start: int, rows: torch.Tensor, hooks: list, last: int) -> torch.Tensor:
    """One stacked pass resumed at block `start` (hooks/resume) -> last-position logits.

    Hooks at block `start` that all edit z (supports(model).shortcut) or all edit resid_pre are applied
    here to the captured activation: a z edit then skips the block's attention. When no other
    hook remains, only the rows the edits changed run (the others are the captured run, e.g.
    the lead rows), from the first position they changed.
    """
    cut = not any(_mlp_side(name, last) for name, _ in hooks)  # hooks on the last MLP need every position
    here = [(name, fn) for name, fn in hooks if split_block(name)[0] == start]
    rest = [(name, fn) for name, fn in hooks if split_block(name)[0] != start]
    names = {name for name, _ in here}
    z_name, pre_name = f"blocks.{start}.attn.hook_z", f"blocks.{start}.hook_resid_pre"
    z = hidden = None
    if support.shortcut and names == {z_name}:
        before = take(ckpt.z[start], rows)  # [n, pos, head, d_head]
        z = edited = _apply(model, here, before.clone())  # hooks may edit in place
    elif support.prefix and names == {pre_name} and not rest:
        before = take(ckpt.resid[start], rows)  # [n, pos, d_model]
        hidden = edited = _apply(model, here, before.clone())
    else:
        return resume.resume(model, ckpt, start, rows, fwd=hooks, last_only=cut, fast=support.fast)
    if rest or not cut:
        return resume.resume(model, ckpt, start, rows, hidden=hidden, fwd=rest, z=z, last_only=cut, fast=support.fast)
    # Only the edits run: a row the edit leaves bitwise unchanged (a lead row, a cell whose source
    # value equals the base's) is the captured run, and so are positions before the first change.
    moved, first = _changes(edited, before)
    logits = ckpt.logits[rows.to(ckpt.logits.device)].unsqueeze(1)  # [n, 1, d_vocab]
    if not len(moved):
        return logits
    from_pos = first if support.prefix else 0
    edited = edited[moved.to(edited.device)]
    got = resume.resume(model, ckpt, start, rows[moved.to(rows.device)], last_only=True, from_pos=from_pos, fast=support.fast,
                        hidden=None if hidden is None else edited, z=None if z is None else edited)
    return logits.index_copy(0, moved.to(logits.device), got.to(logits.dtype))


def _merge_z_segments(segments: list[range], hooks_of: Callable[[int], Hooks], layer_of: Callable[[int], int],
                      pos_of: Callable[[int], int | None]) -> list[tuple[range, bool]]:
    """Consecutive segments whose runs edit their block's z at every position, merged (flag
    True): their passes go through resume.resume_mixed (each block runs once for the rows that
    reached it)."""
    def z_only(seg: range) -> bool:
        run = seg.stop - 1  # a patched run (the unpatched run 0 has no hooks)
        names = {name for name, _ in hooks_of(run)}
        return pos_of(run) is None and names == {f"blocks.{layer_of(run)}.attn.hook_z"}

    merged: list[range] = []
    for seg, simple in ((seg, z_only(seg)) for seg in segments):
        if merged and simple and merged[-1][1]:
            merged[-1] = (range(merged[-1][0].start, seg.stop), True)
        else:
            merged.append((seg, simple))
    return [(seg, simple and seg.start != seg.stop) for seg, simple in merged]


def _resumed_mixed(model, ckpt, support, parts: list, rows: torch.Tensor, n_lead: int) -> torch.Tensor | None:
    """A pass over runs of several blocks (parts: (block, its runs' hooks, their stacked rows,
    where their first base row sits in the pass)), each block's z edits applied to its own
    runs' captured z; each changed row enters at its block (resume.resume_mixed), the others
    are the captured run. -> last-position logits [len(rows), 1, d_vocab], or None when a hook
    is not a z edit of its block or touches a lead row (the caller then runs the usual way)."""
    logits = ckpt.logits[rows.to(ckpt.logits.device)].unsqueeze(1)  # [n, 1, d_vocab]
    groups, where, first = [], [], ckpt.z[0].shape[1] - 1
    for block, hooks, at, offset in parts:
        if any(name != f"blocks.{block}.attn.hook_z" for name, _ in hooks):
            return None
        before = take(ckpt.z[block], at)  # [n_part, pos, head, d_head]
        edited = _apply(model, hooks, before.clone())  # hooks may edit in place
        moved, changed_at = _changes(edited, before)
        if len(moved) and int(moved[0]) < n_lead:
            return None
        if len(moved):
            first = min(first, changed_at)
            groups.append((block, at[moved.to(at.device)], edited[moved.to(edited.device)]))
            where.append(moved - n_lead + offset)  # their rows in the pass
    if not groups:
        return logits
    got = resume.resume_mixed(model, ckpt, groups, from_pos=first if support.prefix else 0)
    return logits.index_copy(0, torch.cat(where).to(logits.device), got.to(logits.dtype))


def _changes(edited: torch.Tensor, before: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Where an edit changed the activation [n, pos, ...] bitwise: the rows [m] (on CPU) and the
    first position any of them changed (meaningless when m = 0)."""
    diff = (edited != before).flatten(2).any(2).cpu()  # [n, pos]
    changed = diff.any(0).nonzero()
    return diff.any(1).nonzero().squeeze(1), int(changed[0]) if len(changed) else 0


def _apply(model, hooks: list, act: torch.Tensor) -> torch.Tensor:
    """Hooks of one hook point applied in order, as the hook point would."""
    for name, fn in hooks:
        edited = fn(act, hook_point(model, name))
        act = act if edited is None else edited
    return act


def _first_block(hooks: Hooks) -> int | None:
    """The first block the hooks act in; None if a hook sits outside the blocks (e.g. hook_embed)."""
    blocks = [split_block(name) for name, _ in hooks]
    if not blocks or any(b is None for b in blocks):
        return None
    return min(layer for layer, _ in blocks)


def _mlp_side(name: str, last: int) -> bool:
    """Does hook `name` act on block `last` after its attention (where resume cuts to the last position)?"""
    block = split_block(name)
    return block is not None and block[0] == last and not (
        block[1].startswith("attn.") or block[1] in ("hook_resid_pre", "hook_attn_out", "hook_attn_in", "hook_in"))


def _by_block(runs: range, layer_of: Callable[[int], int] | None) -> list[range]:
    """`runs` split where the block they edit changes (one piece when layer_of is None; the
    unpatched run 0 joins run 1)."""
    if layer_of is None or not runs:
        return [runs]
    cuts = [r for r in range(runs.start + 1, runs.stop) if layer_of(r) != layer_of(r - 1)]
    bounds = [runs.start, *cuts, runs.stop]
    return [range(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


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
