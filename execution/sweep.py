"""The sweep engine: many edited forward passes of one prompt batch, stacked along the batch axis.

A sweep is n runs over a base batch [B, pos]; run r is the base prompts under the edits (hooks)
hooks_for gives it. Exact patching sweeps cells (analyses/patching), head ablation and pruning
sweep head masks (analyses/heads): both run here. A pass of k runs tiles the base tokens k times
(row j * B + b is run j on prompt b, after any `lead` rows), and every hook sees activations
[n_lead + k * B, ...], which it views as [k, B, ...] to apply each run's own edit. Rows are
independent, so the results equal one plain forward pass per run (up to the float rounding of
batched matmuls). The lead rows (e.g. patching's source prompts) ride in front of every pass:
a hook at layer L reads their activation of layer L, so no source run or cache is kept.

How many runs a pass holds is a `ChunkSize`: rows per pass, from a memory budget
(execution.batching), halved for good when a pass runs out of memory.

For decoder metrics that read the last position (`layer_of` given), one pass is captured
(execution/resume.py, under `capture_hooks` when the runs share an edit) and each run resumes
at the block it first edits, layer_of(run): blocks before it are the captured run's. On top:
- a run whose edits at that block are all z edits enters as o(z') (the block's attention is not
  recomputed), or all resid_pre edits enters with the edited input;
- rows those edits leave bitwise unchanged are the captured run (no pass), and the others run
  from the first position any edit changed (earlier positions attend to the captured keys and
  values);
- consecutive runs of all-position z edits at different blocks share passes
  (resume.resume_mixed: each block runs once for every row that has reached it);
- runs that edit one position each (`pos_of`) are split into a few passes by position, each
  starting at its own first edited position, and those before the first position where lead and
  base tokens differ into one more (a copy of lead activations there changes nothing);
- a run with layer_of(run) >= n_layers equals the captured pass: its logits are the captured ones.
The savings that compare with the captured run (the last three) hold when it ran without edits
(no capture_hooks).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headscope.errors import ConfigError
from headscope.execution import batching, resume
from headscope.execution.rows import take
from headscope.hooks.sites import hook_point, split_block

HookFn = Callable[..., Any]
Hooks = Sequence[tuple[str, HookFn]]
HooksFor = Callable[[range], Hooks]  # runs of one pass -> hooks acting on [n_lead + len(runs) * B, ...]


class ChunkSize:
    """Rows per forward pass, shared by the loops of one sweep (and by an outer loop that splits
    the prompts); out-of-memory halves it for good, so later passes start at the size that fit."""

    def __init__(self, rows: int):
        if not isinstance(rows, int) or rows < 1:
            raise ConfigError(f"rows per pass must be an int >= 1, got {rows!r}.")
        self.rows = rows

    def items(self, rows_per_item: int) -> int:
        """Whole items (a run: rows_per_item rows) per pass; at least one (out-of-memory then says
        so, and an enclosing loop may split the rows)."""
        return max(1, self.rows // max(rows_per_item, 1))

    def halve(self, failed_items: int, rows_per_item: int) -> None:
        """A pass of failed_items items ran out of memory: at most half of it from now on."""
        self.rows = max(1, min(self.rows, failed_items * rows_per_item // 2))

    def on_oom(self, rows_per_item: int) -> Callable[[int], None]:
        """batching.run_chunks's on_oom for a loop over items of rows_per_item rows."""
        return lambda failed: self.halve(failed, rows_per_item)

    def __repr__(self) -> str:
        return f"ChunkSize(rows={self.rows})"


@dataclass(frozen=True, kw_only=True)
class Sweep:
    """What one sweep runs: the base prompts, each run's edits and the metric.

    tokens [B, pos]; lead [B_lead, pos] rows before the runs in every pass (None: none); attention_mask
    [B, pos] left padding (long, or None: no padding), shared by the lead rows (B_lead is 0 or B);
    metric: stacked output [n, ...] -> [n] when stacked_metric, else it is called on each run's B rows
    (and the lead's); layer_of(run): the first block run `run` edits (None: full passes only);
    pos_of(run): the one position it edits (None: several); capture_hooks: edits every run shares,
    under which the captured pass runs (runs then differ from it from layer_of(run) on, and
    hooks_for's hooks on earlier blocks are left out of resumed passes)."""

    tokens: torch.Tensor
    hooks_for: HooksFor
    metric: Callable[[torch.Tensor], torch.Tensor]
    stacked_metric: bool = False
    lead: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None
    layer_of: Callable[[int], int] | None = None
    pos_of: Callable[[int], int | None] | None = None
    capture_hooks: Hooks = ()
    dtype: torch.dtype = torch.float32  # of the metric values returned (float64 keeps a float64 model's)


def chunks(n_runs: int, per_pass: int) -> list[range]:
    """Split range(n_runs) into equal-sized consecutive chunks of at most per_pass runs."""
    n_chunks = max(1, math.ceil(n_runs / per_pass))
    size = math.ceil(n_runs / n_chunks)
    return [range(start, min(start + size, n_runs)) for start in range(0, n_runs, size)]


def run(model, sweep: Sweep, runs: range, size: Callable[[int], ChunkSize], *,
        done: Callable[[int], None] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The runs `runs` of `sweep` -> (metric [len(runs), B] on CPU in sweep.dtype, the lead rows' metric
    [B_lead] or None without lead rows).

    size(n_pos): the ChunkSize of passes computing n_pos positions (called once for full passes,
    once for merged head passes that start where lead and base tokens first differ). done(k):
    called after each pass of k runs (progress bars)."""
    tokens, lead, mask = sweep.tokens, sweep.lead, sweep.attention_mask
    n_prompts, n_pos = tokens.shape
    head = lead if lead is not None else tokens[:0]  # [B_lead or 0, pos]
    n_lead = head.shape[0]
    layer_of = sweep.layer_of
    out = torch.zeros(len(runs), n_prompts, dtype=sweep.dtype)  # [run, batch]
    lead_values = None
    support = resume.supports(model) if layer_of is not None else resume.Support(False, False, False)
    plain = not sweep.capture_hooks  # the captured pass is the unedited model: bitwise comparisons hold
    # lead and base tokens agree before position `same`: an edit copying lead activations there changes nothing
    same = 0
    if support.ok and support.prefix and n_lead and n_lead == n_prompts:
        differ = (head != tokens).any(0).nonzero()
        same = int(differ[0]) if len(differ) else n_pos
    computed = max(1, n_pos - same)  # positions a merged head pass computes
    sizes = {False: size(n_pos), True: size(computed)}  # each kind of pass keeps its own size

    def stacked_mask(k: int) -> torch.Tensor | None:  # [B_lead + k * B, pos]: lead, then base k times
        return None if mask is None else torch.cat([mask[:n_lead], mask.repeat(k, 1)])

    ckpt = None
    if support.ok:
        with torch.no_grad():  # rows: lead, then base
            ckpt = resume.capture(model, torch.cat([head, tokens]), attention_mask=stacked_mask(1),
                                  fwd=list(sweep.capture_hooks),
                                  z_layers=range(model.facts.n_layers) if support.shortcut else ())
    passes = _Passes(model, ckpt, support, n_lead, n_prompts, plain)

    def at(i: int) -> int:  # local offset -> run
        return runs.start + i

    def forward(chunk: range, merged: bool = False) -> torch.Tensor:  # local offsets -> [B_lead + k * B] metric values
        span = range(at(chunk.start), at(chunk.stop))
        result = None
        if merged:  # runs of several blocks, each block's edits applied to its own runs' rows
            parts = [(layer_of(sub.start), sweep.hooks_for(sub), passes.rows(len(sub)),
                      n_lead + (sub.start - span.start) * n_prompts) for sub in _by_block(span, layer_of)]
            result = passes.mixed(parts, passes.rows(len(span)))
        if result is None:
            hooks = list(sweep.hooks_for(span))
            start = None if ckpt is None else passes.start(layer_of(span.start), hooks)
            if start is None:
                stacked = torch.cat([head, tokens.repeat(len(span), 1)])  # [B_lead + k * B, pos]
                result = model.run_with_hooks(stacked, fwd=hooks, attention_mask=stacked_mask(len(span)))
            else:
                result = passes.resumed(start, passes.rows(len(span)), [(n, f) for n, f in hooks
                                                                        if split_block(n)[0] >= start])
        if sweep.stacked_metric:
            values = sweep.metric(result).to(sweep.dtype).cpu()  # [B_lead + k * B]
        else:
            parts = [sweep.metric(result[:n_lead]).to(sweep.dtype).cpu()] if n_lead else []
            parts += [sweep.metric(result[n_lead + i * n_prompts:n_lead + (i + 1) * n_prompts]).to(sweep.dtype).cpu()
                      for i in range(len(span))]
            values = torch.cat(parts)
        if done is not None:
            done(len(span))
        return values

    key = None if ckpt is None else (lambda i: layer_of(at(i)))
    segments = [(seg, False) for seg in _by_block(range(len(runs)), key)]
    if ckpt is not None and support.shortcut and support.fast and plain:  # all-position z edits of several blocks
        segments = _merge_z_segments([seg for seg, _ in segments],
                                     lambda i: sweep.hooks_for(range(at(i), at(i) + 1)),
                                     lambda i: layer_of(at(i)),
                                     lambda i: None if sweep.pos_of is None else sweep.pos_of(at(i)))
    pos_of = sweep.pos_of
    with torch.no_grad():
        for seg, merged in segments:
            chunk_size = sizes[merged]
            subs = [seg]
            if ckpt is not None and support.prefix and plain and pos_of is not None and pos_of(at(seg.start)) is not None:
                subs = by_position(seg, lambda i: pos_of(at(i)), same, n_prompts * n_pos)
            for sub in subs:
                n_chunk = len(chunks(len(sub), chunk_size.items(n_prompts))[0]) if len(sub) else 1  # equal-sized passes
                parts = batching.run_chunks(
                    lambda c, sub=sub, merged=merged: forward(range(sub.start + c.start, sub.start + c.stop), merged),
                    len(sub), n_chunk, on_oom=chunk_size.on_oom(n_prompts))
                for chunk, values in parts:
                    lo = sub.start + chunk.start
                    out[lo:lo + len(chunk)] = values[n_lead:].view(len(chunk), n_prompts)
                    if lead_values is None and n_lead:
                        lead_values = values[:n_lead]
    return out, lead_values


class _Passes:
    """The resumed passes of one sweep, from its captured pass `ckpt`."""

    def __init__(self, model, ckpt, support: resume.Support, n_lead: int, n_prompts: int, plain: bool):
        self.model, self.ckpt, self.support = model, ckpt, support
        self.n_lead, self.n_prompts, self.plain = n_lead, n_prompts, plain
        self.last = model.facts.n_layers - 1

    def rows(self, k: int) -> torch.Tensor:
        """The captured rows of a pass of k runs: lead, then base k times."""
        return torch.cat([torch.arange(self.n_lead), self.n_lead + torch.arange(self.n_prompts).repeat(k)]).to(
            self.model.device)

    def start(self, layer: int, hooks: Hooks) -> int | None:
        """The block a pass of runs first editing `layer` resumes at: on an unedited capture the
        first block a hook acts in (n_layers when none: the captured pass), else `layer` (earlier
        hooks are the capture's own); None: a full pass (a hook outside the blocks)."""
        blocks = [split_block(name) for name, _ in hooks]
        if any(b is None for b in blocks):
            return None
        if self.plain:
            return min((b[0] for b in blocks), default=self.last + 1)
        return layer

    def resumed(self, start: int, rows: torch.Tensor, hooks: list) -> torch.Tensor:
        """One stacked pass resumed at block `start` -> last-position logits [n, 1, d_vocab].

        Hooks at block `start` that all edit z (support.shortcut) or all edit resid_pre are applied
        here to the captured activation: a z edit then skips the block's attention. When no other
        hook remains (and the capture ran unedited), only the rows the edits changed run (the
        others are the captured run, e.g. the lead rows), from the first position they changed.
        """
        model, ckpt, support = self.model, self.ckpt, self.support
        logits = ckpt.logits[rows.to(ckpt.logits.device)].unsqueeze(1)  # [n, 1, d_vocab]
        if start > self.last:
            return logits
        cut = not any(_mlp_side(name, self.last) for name, _ in hooks)  # hooks on the last MLP need every position
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
        if rest or not cut or not self.plain:
            return resume.resume(model, ckpt, start, rows, hidden=hidden, fwd=rest, z=z, last_only=cut, fast=support.fast)
        # Only the edits run: a row the edit leaves bitwise unchanged (a lead row, a cell whose source
        # value equals the base's) is the captured run, and so are positions before the first change.
        moved, first = _changes(edited, before)
        if not len(moved):
            return logits
        from_pos = first if support.prefix else 0
        edited = edited[moved.to(edited.device)]
        got = resume.resume(model, ckpt, start, rows[moved.to(rows.device)], last_only=True, from_pos=from_pos,
                            fast=support.fast, hidden=None if hidden is None else edited, z=None if z is None else edited)
        return logits.index_copy(0, moved.to(logits.device), got.to(logits.dtype))

    def mixed(self, parts: list, rows: torch.Tensor) -> torch.Tensor | None:
        """A pass over runs of several blocks (parts: (block, its runs' hooks, their stacked rows,
        where their first base row sits in the pass)), each block's z edits applied to its own
        runs' captured z; each changed row enters at its block (resume.resume_mixed), the others
        are the captured run. -> last-position logits [len(rows), 1, d_vocab], or None when a hook
        is not a z edit of its block or touches a lead row (the caller then runs the usual way)."""
        model, ckpt, n_lead = self.model, self.ckpt, self.n_lead
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
        got = resume.resume_mixed(model, ckpt, groups, from_pos=first if self.support.prefix else 0)
        return logits.index_copy(0, torch.cat(where).to(logits.device), got.to(logits.dtype))


def by_position(seg: range, pos_of: Callable[[int], int | None], same: int, tokens: int) -> list[range]:
    """A segment of runs that edit one position each, in increasing position, split into passes that
    each compute from their first edited position on: the leading runs before position `same` (where
    lead and base tokens agree, so a copy of lead activations changes nothing and costs no pass) as
    one piece, then the others in up to 4 equal pieces (more for more runs x tokens of a run)."""
    k = next((i for i in seg if pos_of(i) is None or pos_of(i) >= same), seg.stop)
    rest = range(k, seg.stop)
    n_sub = max(1, min(4, len(rest) * tokens // 500))
    pieces = [range(k + r.start, k + r.stop) for r in chunks(len(rest), math.ceil(len(rest) / n_sub))] if rest else []
    return ([range(seg.start, k)] if k > seg.start else []) + pieces


def _merge_z_segments(segments: list[range], hooks_of: Callable[[int], Hooks], layer_of: Callable[[int], int],
                      pos_of: Callable[[int], int | None]) -> list[tuple[range, bool]]:
    """Consecutive segments whose runs edit their block's z at every position, merged (flag
    True): their passes go through resume.resume_mixed (each block runs once for the rows that
    reached it)."""
    def z_only(seg: range) -> bool:
        run = seg.stop - 1  # a run with edits (patching's unpatched run 0 has no hooks)
        names = {name for name, _ in hooks_of(run)}
        return pos_of(run) is None and names == {f"blocks.{layer_of(run)}.attn.hook_z"}

    merged: list[range] = []
    for seg, simple in ((seg, z_only(seg)) for seg in segments):
        if merged and simple and merged[-1][1]:
            merged[-1] = (range(merged[-1][0].start, seg.stop), True)
        else:
            merged.append((seg, simple))
    return [(seg, simple and seg.start != seg.stop) for seg, simple in merged]


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


def _mlp_side(name: str, last: int) -> bool:
    """Does hook `name` act on block `last` after its attention (where resume cuts to the last position)?"""
    block = split_block(name)
    return block is not None and block[0] == last and not (
        block[1].startswith("attn.") or block[1] in ("hook_resid_pre", "hook_attn_out", "hook_attn_in", "hook_in"))


def _by_block(runs: range, layer_of: Callable[[int], int] | None) -> list[range]:
    """`runs` split where the block they edit changes (one piece when layer_of is None)."""
    if layer_of is None or not runs:
        return [runs]
    cuts = [r for r in range(runs.start + 1, runs.stop) if layer_of(r) != layer_of(r - 1)]
    bounds = [runs.start, *cuts, runs.stop]
    return [range(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
