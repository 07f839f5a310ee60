"""Exact activation patching, batched; and `run`, the `patching` analysis of `headscope report`.

Denoising runs the corrupted prompts and restores one clean activation (is it sufficient?);
noising runs the clean prompts and inserts one corrupted activation (is it necessary?). Each
cell of a site type (see patching/sites.py) is one patched run; the engine stacks many runs per
forward pass, and the source prompts ride along in the same forward passes as lead rows (so
no separate source run or cache): a sweep over every requested site type costs a few forward
passes instead of one per cell (transformer_lens.patching's approach). Values equal the
one-at-a-time results. For last-position decoder metrics each forward pass resumes at the
patched block from one captured pass (execution/resume.py), skipping the blocks before it.

Padded tasks (mixed-length prompts, left-padded): every run goes under the task's attention
mask (resumed or full passes, see engine.RESUME_PADDED) and each row's metric reads its own last
position. A (layer, pos) cell that is padding in a row is NaN there and left out of that cell's
mean (inputs.cell_means), so each cell's value and effect equal the analysis of the rows where
it is real, run alone; positions are the padded ones (the last one is every row's last token).

Result (name "patching"): df has one row per cell: site_type, layer, head, pos (padded),
position_from_end (-1: the last token; the same place in every left-padded prompt), token ("i: tok"
when every prompt where pos is real has that token there, else ""), value (the metric after the
patch), effect (value minus base), base (the unpatched run over the same rows), n_rows (the rows
where pos is a real token: every row without padding), share_of_gap (effect / (clean_metric - corrupted_metric),
the effect itself for a normalised metric; NaN where the gap is within noise, with share_note saying why) and with
attribution=True the
attribution-patching estimate `attribution` (metric units, as effect) and attribution_share_of_gap.
Where n_rows is below n_examples, value and base are
means over those rows only, so value minus the summary's baseline (every row) is not the effect. summary: metric,
direction, clean_metric, corrupted_metric (with clean_metric_ci, corrupted_metric_ci: 95% t intervals over the
metric_n prompts, unnormalised metrics only), baseline, n_heads and n_kv_heads (per layer), metric_at_last_position
(the metric reads each prompt's last token, the answer position), top_sites (10 per site type by |effect|, each with the 95%
t interval of its mean per-example effect, ci, over its n rows, and for a raw metric with a gap share_ci, the interval
of its share of the gap, a ratio of means by the delta method: top_sites_ci_method),
attribution_correlation (Pearson and Spearman per site type, and the least-squares slope of
attribution on exact with its 95% t interval over the cells, slope / slope_ci / slope_n; Spearman over the
non-zero cells, the top exact cell's rank by attribution and a large exact effect it misses: rank_checks,
none resting on a difference within rounding_floor, also in the summary: the effects' rounding in the model's dtype),
at_corrupted_token (per (layer, pos) site type and layer, the effect at each prompt's first position where
clean and corrupted differ, with where that sits from the end, where every differing position sits and what clean
token each end-aligned column of a top site holds on how many prompts (column_tokens): patching/aligned.py; also the table
`corrupted_token`); gap_within_noise only when the
clean-corrupted gap's paired 95% interval contains 0 or it is under the effect floor (chance.py).
Answers of several tokens (teacher-forced pieces at the end of their rows): every position cell counts from each
prompt's last token (-1 there), the pieces left out (patching/prompt_end.py); summary answer_pieces says so.
The table's `never_read` marks the writes after the last attention layer at positions other than the answer
position (sites.never_read_cells: 0 by construction on every decoder), and summary never_read counts them. On a
sliding-window model (models.layer_windows) `unreachable` marks the other position cells the windows keep from
the answer position (sites.window_reach: 0 by construction; none where every prompt fits the windows), and
sliding_windows gives the windows and how many cells that is.
"""
from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from headscope.analyses.core import chance
from headscope.analyses.core.config import configure
from headscope.analyses.core.contract import Needs, require
from headscope.analyses.core.result import Result, names_source
from headscope.analyses.core.task_files import takes_prompt
from headscope.analyses.core.tasks import Task
from headscope.analyses.patching import aligned, prompt_end
from headscope.analyses.patching.attribution_patching import attribution_table, correlation_with_exact, rounding_floor
from headscope.analyses.patching.configs import PatchingConfig
from headscope.analyses.patching.engine import index_mask, padding_mask, replace_hook, run_batched
from headscope.analyses.patching.inputs import (
    EFFECT_CI_METHOD,
    PatchMetric,
    cell_means,
    check_direction,
    clean_and_corrupted,
    effect_intervals,
    mask_padding,
    paired_rows,
    position_from_end,
    resolve_metric,
    share_intervals,
    task_padding,
    token_labels,
    token_notes,
)
from headscope.analyses.patching.sites import (
    SITE_TYPES,
    SiteType,
    absent,
    cell_frame,
    never_read_cells,
    site_types,
    unpatchable,
    unreachable_cells,
)
from headscope.hooks.sites import qkv_words, site
from headscope.models.hooked_model import layer_windows

DEFAULT_SITES = ("resid_pre", "attn_out", "mlp_out", "head_out")
TOP_N = 10


def exact_sweep(
    model,
    base: torch.Tensor,
    source: torch.Tensor,
    types: Sequence[SiteType],
    metric: PatchMetric,
    *,
    batch_size: int | None = None,
    memory_budget: int | None = None,
    progress: bool = False,
    attention_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, tuple[list, torch.Tensor, dict[int, torch.Tensor]]]]:
    """Patch every cell of every site type from the `source` run into runs on `base` (both [B, pos]).

    One batched sweep for all types: the source prompts ride along as lead rows (their
    activations are the patch values), plus one unpatched base run for the baseline, and per site
    type and layer one null run: that site's hook at that layer patching nothing, so it takes the
    arithmetic path of the layer's patched runs (review 19c B1: a resumed pass through a hooked block
    rounds otherwise than the captured pass in bfloat16, 0.004 logits on every q/k cell). A cell's
    effect is its run minus its null run: a patch that changes nothing gives exactly 0.
    attention_mask: [B, pos] left padding shared by base and source (or None); a cell whose
    position is padding in a row is NaN there.
    Returns (base metric [B], source metric [B], {site type: (cells, metric values [n_cells, B],
    {layer: null run's metric [B]})}).
    """
    n_lead = source.shape[0]
    runs: list = [None]  # (site type, (layer, head, pos), null?) per run; run 0 the unpatched base run
    for st in types:
        cells = st.cells(model, base.shape[1])
        for layer in dict.fromkeys(c[0] for c in cells):
            mine = [c for c in cells if c[0] == layer]
            runs += [(st, (layer, None, mine[0][2]), True)] + [(st, c, False) for c in mine]

    def hooks_for(chunk: range):
        groups = defaultdict(list)  # (site type, layer) -> [(run in chunk, index)]; a null run adds none
        for i, run in enumerate(chunk):
            if runs[run] is not None:
                st, (layer, head, pos), null = runs[run]
                groups[st.name, layer].extend([] if null else [(i, st.index(head, pos))])
        hooks = []
        for (name, layer), entries in groups.items():
            st = SITE_TYPES[name]
            mask = index_mask(len(chunk), st.row_shape(model, base.shape[1]), entries, model.device)  # [k, ...]
            if st.writer is None:
                hooks.append((st.hook(layer), replace_hook(None, mask, lead=n_lead)))
            else:
                hooks += _resid_mid_hooks(layer, mask, n_lead)
        return hooks

    def layer_of(run: int) -> int:  # the first block a run patches (the unpatched run 0 joins run 1)
        return runs[max(run, 1)][1][0] if len(runs) > 1 else 0

    def pos_of(run: int) -> int | None:  # the position it patches (None: every position; a null run: its layer's first)
        return runs[max(run, 1)][1][2] if len(runs) > 1 else None

    values = run_batched(model, base, len(runs), hooks_for, metric.fn, lead=source, batch_size=batch_size,
                         memory_budget=memory_budget, progress=progress, stacked_metric=metric.stacked,
                         desc="patching", layer_of=layer_of if metric.last_position else None, pos_of=pos_of,
                         attention_mask=attention_mask)
    mask = padding_mask(attention_mask, base)  # [B, pos] or None
    out = {}
    for st in types:
        at = [i for i, r in enumerate(runs) if r is not None and r[0] is st and not r[2]]
        nulls = {r[1][0]: values[i] for i, r in enumerate(runs) if r is not None and r[0] is st and r[2]}
        cells = [runs[i][1] for i in at]
        out[st.name] = (cells, mask_padding(values[at], [c[2] for c in cells], mask), nulls)
    return values[0], values[-1], out


def _resid_mid_hooks(layer: int, mask: torch.Tensor, n_lead: int):
    """Set resid_mid (= resid_pre + attn_out) to the lead rows' value at the masked cells by
    rewriting attn_out to (lead resid_pre + lead attn_out) - this run's resid_pre."""
    pre: dict[str, torch.Tensor] = {}

    def keep(act: torch.Tensor, hook) -> None:
        pre["x"] = act  # [B_lead + k * B, pos, d_model]

    def write(act: torch.Tensor, hook) -> torch.Tensor:
        x = pre["x"]
        mid = x[:n_lead] + act[:n_lead]  # [B, pos, d_model]: the source run's resid_mid
        mine = x[n_lead:].view(mask.shape[0], n_lead, *act.shape[1:])  # [k, B, pos, d_model]
        # where this run's resid_pre is the source's, its attn_out itself: x + (mid - x) rounds off mid (review 19c B1)
        target = torch.where(mine == x[:n_lead], act[:n_lead].unsqueeze(0), mid.unsqueeze(0) - mine)
        body = replace_hook(target, mask)(act[n_lead:], hook)
        return torch.cat([act[:n_lead], body])

    return [(site("resid_pre", layer), keep), (site("attn_out", layer), write)]


@takes_prompt
@names_source
def activation_patching(
    model,
    task=None,
    config: PatchingConfig | None = None,
    *,
    corrupted_tokens: torch.Tensor | None = None,
    **config_overrides: Any,
) -> Result:
    """Exact activation patching over config.sites (names in patching/sites.py SITE_TYPES; None: the
    four main ones, DEFAULT_SITES).

    config: a PatchingConfig; config_overrides are its fields: sites, direction ("denoise":
    corrupted run, clean activation restored; "noise": clean run, corrupted activation inserted),
    metric ("logit_diff", "normalized_logit_diff", "logprob", "prob", "task" (the Task's own
    metric) or a callable output -> [batch]; None picks logit difference when the task has wrong
    answers), attribution (True adds attribution-patching estimates and their correlation with
    the exact effects), batch_size (patched runs per forward pass; None: sized from memory_budget
    bytes), progress. The older form activation_patching(model, task, sites) still works.
    task: a Task, a zoo task name, a task file or None (default_task); corrupted_tokens (data):
    [batch, pos] corrupted prompts when the Task has none.
    """
    cfg = configure(PatchingConfig, config, config_overrides, name="activation_patching", positional="sites")
    direction, metric, batch_size, memory_budget = cfg.direction, cfg.metric, cfg.batch_size, cfg.memory_budget
    sites, progress = DEFAULT_SITES if cfg.sites is None else cfg.sites, cfg.progress
    if not isinstance(task, Task):
        task = default_task(model, task, cfg)
    check_direction(direction)
    task, left_out = paired_rows(task, corrupted_tokens, "activation patching")
    clean, corrupted = clean_and_corrupted(model, task, corrupted_tokens)
    mask = task_padding(task, clean)  # [B, pos] or None
    pm = resolve_metric(task, metric)
    types = [st.check(model) for st in site_types(sites)]
    base, source_tokens = (corrupted, clean) if direction == "denoise" else (clean, corrupted)
    base_values, source_values, sweeps = exact_sweep(model, base, source_tokens, types, pm, batch_size=batch_size,
                                                     memory_budget=memory_budget, progress=progress,
                                                     attention_mask=mask)
    clean_rows, corrupt_rows = (source_values, base_values) if direction == "denoise" else (base_values, source_values)
    clean_value, corrupt_value = float(clean_rows.double().mean()), float(corrupt_rows.double().mean())
    baseline = float(pm.finish(float(base_values.double().mean()), clean_value, corrupt_value))
    # answers of several tokens: positions count from each prompt's last token, its answer pieces left out
    pieces = prompt_end.answer_pieces(task)  # [B]
    nulls = {name: null for name, (_, _, null) in sweeps.items()}  # {layer: [B]}: each layer's null run
    sweeps = {name: prompt_end.cell_values(cells, values, pieces) for name, (cells, values, _) in sweeps.items()}
    shown, shown_bad, shown_mask = _at_prompt_end(clean, corrupted, mask, pieces)
    labels = token_labels(model, shown, shown_mask)
    small = chance.gap_within_noise(clean_rows, corrupt_rows, pm.name)  # only such runs carry the flag
    # what share_of_gap divides by; none over a gap within noise, whose shares the finding calls not meaningful (review
    # 14b-v C5: exact.csv gave 1.0 at the cell the report refuses to rank)
    gap = None if small is not None else 1.0 if pm.normalized else (clean_value - corrupt_value) or None
    first = aligned.first_difference(shown, shown_bad)  # [B] each row's corrupted token (padded index)
    common = min(aligned.common_differences(shown, shown_bad), aligned.MAX_ORDERS)
    nth = [first] + [aligned.nth_difference(shown, shown_bad, k) for k in range(1, common)]  # [B] each
    frames, intervals, on_token = [], {}, {}
    by_order: list[dict] = [{} for _ in nth]
    for st in types:
        cells, values = sweeps[st.name]
        # review 19c B1: each cell against its layer's null run (same arithmetic path), [cell, B]
        unpatched = torch.stack([nulls[st.name][c[0]] for c in cells]) if cells else values
        means = cell_means(pm, values, unpatched, clean_rows, corrupt_rows)
        intervals[st.name] = effect_intervals(pm, values, unpatched, clean_rows, corrupt_rows)  # the sweep's rows
        # [cell, batch] per-example effects (NaN: padding): top_sites' paired differences from the top cell (19e B1)
        intervals[st.name]["effects"] = values.double().cpu().numpy() - unpatched.double().cpu().numpy()
        if gap and not pm.normalized:  # review 16c B5: the share's own interval (a ratio of means), not ci / gap
            shares = share_intervals(values, unpatched, clean_rows, corrupt_rows, whole_gap=True)
            intervals[st.name].update(share_low=shares["low"], share_high=shares["high"])
        frame = cell_frame(st, cells, labels, value=means["value"].numpy(), effect=means["effect"].numpy(),
                           base=means["base"].numpy())
        frame.insert(frame.columns.get_loc("token"), "position_from_end",
                     pd.array(position_from_end(clean.shape[1], [c[2] for c in cells]), dtype="Int64"))
        frame = frame.assign(n_rows=means["n_rows"].numpy())
        frames.append(frame.assign(share_of_gap=frame["effect"] / gap if gap else np.nan))
        if st.by_pos and not st.by_head:
            for k, at in enumerate(nth):  # review 12b A2: each differing position aligned over every prompt
                by_order[k][st.name] = aligned.at_corrupted_token(pm, st.name, cells, values, nulls[st.name], clean_rows,
                                                                  corrupt_rows, at, frame,
                                                                  share=bool(gap) and not pm.normalized)
            on_token[st.name] = by_order[0][st.name]
    df = pd.concat(frames, ignore_index=True)
    notes = token_notes(shown, shown_bad, shown_mask)  # [pos]: why a token label is blank (review 14b C5)
    df.insert(df.columns.get_loc("token") + 1, "token_note", [notes[p] if pd.notna(p) else "" for p in df["pos"]])
    summary = {
        "metric": pm.name,
        "normalized": pm.normalized,
        "direction": direction,
        "n_examples": int(clean.shape[0]),
        "n_positions": int(clean.shape[1]),
        # heads per layer and the KV heads they read (query head h reads KV head h // (n_heads / n_kv_heads)):
        # the finding says when tied heads share one (review 9b A2, multi-query attention)
        "n_heads": int(model.facts.n_heads), "n_kv_heads": int(model.facts.n_kv_heads),
        "metric_at_last_position": bool(pm.last_position),  # the answer position is -1 from the end
        "clean_metric": float(pm.finish(clean_value, clean_value, corrupt_value)),
        "corrupted_metric": float(pm.finish(corrupt_value, clean_value, corrupt_value)),
        "baseline": baseline,
        **_metric_intervals(pm, clean_rows, corrupt_rows),
        "top_sites": top_sites(df, intervals=intervals),
        "top_sites_ci_method": EFFECT_CI_METHOD,
        **left_out,
    }
    if on_token:
        summary["at_corrupted_token"] = {"from_end": aligned.offsets(first, clean.shape[1]),
                                         "n": int((first >= 0).sum()),
                                         "positions_differ": aligned.positions_differ(clean, corrupted),
                                         "differ_from_end": aligned.differ_from_end(shown, shown_bad),
                                         "column_tokens": aligned.column_tokens(model, shown, shown_mask,
                                                                                 _cited_offsets(summary)),
                                         "sites": on_token}
        if len(nth) > 1:
            summary["at_corrupted_token"]["orders"] = [
                {"order": k + 1, "from_end": aligned.offsets(at, clean.shape[1]), "n": int((at >= 0).sum()),
                 "sites": sites} for k, (at, sites) in enumerate(zip(nth, by_order))]
    if (pieces_said := prompt_end.record(pieces)) is not None:
        summary["answer_pieces"] = pieces_said
    windows = layer_windows(model)
    # review 12b A1: writes after the last attention before the prompt's last token, on every decoder: the metric reads
    # the last position, or an answer's pieces from there on (a logprob of several tokens), never earlier
    if pm.last_position or (task.continuation is not None and pm.name in ("logprob", "prob")):
        df["never_read"] = never_read_cells(df, model.facts.n_layers)
        if df["never_read"].any():
            summary["never_read"] = {"cells": int(df["never_read"].sum()),
                                     "of": int(df["position_from_end"].notna().sum()),
                                     "site_types": list(pd.unique(df.loc[df["never_read"], "site_type"]))}
    if any(windows) and pm.last_position:  # review 9a B2: cells the windows keep from the answer are 0 by construction
        df["unreachable"] = unreachable_cells(df, windows)
        summary["sliding_windows"] = {"windows": list(windows), "unreachable": int(df["unreachable"].sum()),
                                      "cells": int(df["position_from_end"].notna().sum())}
    if small is not None:
        summary["gap_within_noise"] = small
        df["share_note"] = SHARE_NOTE.format(reason=small["reason"])
    after = {kind: w for kind in ("q", "k", "v") if (w := qkv_words(model.facts, kind))}
    if after:  # review 18c C2: the q/k/v sites hold the normed, clamped per-head tensors (models/qkv_sites.py)
        summary["qkv_sites"] = after
    tables = {"exact": df}
    if on_token:
        tables["corrupted_token"] = aligned.table(on_token, gap, summary["at_corrupted_token"].get("orders"))
    # review 19c B1: the effects' rounding in the model's dtype, on every run (the finding and compare read it); a top
    # cell within it is marked, its interval no evidence of an effect
    floor = rounding_floor(df, first.numpy(), model.dtype, max(abs(clean_value), abs(corrupt_value)),
                           (clean_value - corrupt_value) if pm.normalized else None)
    summary["rounding_floor"] = floor
    for records in summary["top_sites"].values():
        for r in records:
            r["within_rounding"] = bool(abs(r["effect"]) <= floor["floor"])
    if cfg.attribution:
        scale = (clean_rows - corrupt_rows) if pm.normalized else 1.0
        attr = attribution_table(model, base, source_tokens, types, pm, labels, scale, attention_mask=mask,
                                 pieces=pieces)
        attr = attr.assign(share_of_gap=attr["attribution"] / gap if gap else np.nan)
        half = np.concatenate([(intervals[st.name]["high"] - intervals[st.name]["low"]) / 2 for st in types])
        df, summary["attribution_correlation"] = correlation_with_exact(df, attr, floor=floor["floor"], ci_half=half)
        df = df.assign(attribution_share_of_gap=df["attribution"] / gap if gap else np.nan)
        tables = {**tables, "exact": df, "attribution": attr}
    config = {"sites": [st.name for st in types], "direction": direction, "metric": pm.name}
    return Result(name="patching", df=df, summary=summary, tables=tables, config=config)


SHARE_NOTE = ("share_of_gap not given: the clean-corrupted gap is within noise ({reason}), so shares of it are not "
              "meaningful (the report ranks no site)")


def _metric_intervals(pm: PatchMetric, clean_rows: torch.Tensor, corrupt_rows: torch.Tensor) -> dict:
    """Review 12c C6: clean_metric_ci and corrupted_metric_ci, the 95% t intervals of the clean and corrupted runs' mean
    metric over the prompts [B] each, with metric_n (the prompts); {} for a normalised metric (its 1 and 0 are fixed)."""
    if pm.normalized:
        return {}
    return {"clean_metric_ci": chance.mean_interval(clean_rows.double().cpu().numpy()),
            "corrupted_metric_ci": chance.mean_interval(corrupt_rows.double().cpu().numpy()),
            "metric_n": int(clean_rows.shape[0])}


def _at_prompt_end(clean: torch.Tensor, corrupted: torch.Tensor, mask: torch.Tensor | None, pieces: torch.Tensor):
    """(clean, corrupted, mask) [B, pos] with each row moved right by its answer pieces (prompt_end.to_prompt_end):
    the tokens the position cells stand on once they count from each prompt's last token (unchanged without pieces)."""
    if not bool(pieces.any()):
        return clean, corrupted, mask
    real = torch.ones_like(clean) if mask is None else mask.to(clean.device).long()
    moved = [prompt_end.to_prompt_end(x.cpu(), pieces) for x in (clean, corrupted, real)]
    return moved[0], moved[1], moved[2]


def _cited_offsets(summary: dict) -> set[int]:
    """The end-aligned columns a finding can cite: the from_end of every top-site record (a bounded set, TOP_N a type)."""
    return {int(r["from_end"]) for records in summary["top_sites"].values() for r in records if "from_end" in r}


def top_sites(df: pd.DataFrame, n: int = TOP_N, column: str = "effect",
              intervals: dict[str, dict[str, np.ndarray]] | None = None) -> dict[str, list[dict]]:
    """The n cells with the largest |column| per site type, as JSON-ready records. intervals: per site
    type, effect_intervals' arrays in the type's row order; each record then carries "ci" ([low, high],
    None under two rows) and "n" (the rows)."""
    kinds, score = df["site_type"].to_numpy(), np.abs(df[column].to_numpy(dtype=float))
    layer, head, pos = (df[c].to_numpy(dtype=float, na_value=np.nan) for c in ("layer", "head", "pos"))
    token, value = df["token"].to_numpy(), df[column].to_numpy(dtype=float)
    ends = df["position_from_end"].to_numpy(dtype=float, na_value=np.nan) if "position_from_end" in df else None
    out = {}
    for name in pd.unique(kinds):
        rows = np.flatnonzero(kinds == name)
        top = rows[np.argsort(-score[rows], kind="stable")[:n]]  # largest first, ties in table order
        out[str(name)] = [
            {
                "layer": int(layer[i]),
                "head": None if np.isnan(head[i]) else int(head[i]),
                "pos": None if np.isnan(pos[i]) else int(pos[i]),
                "token": str(token[i]),
                **({} if ends is None or np.isnan(ends[i]) else {"from_end": int(ends[i])}),
                column: float(value[i]),
                **({} if intervals is None or str(name) not in intervals else _interval(intervals[str(name)], i - rows[0])),
                **({} if intervals is None or str(name) not in intervals or i == top[0]
                   else _vs_top(intervals[str(name)], top[0] - rows[0], i - rows[0])),
            }
            for i in top
        ]
    return out


def _vs_top(arrays: dict[str, np.ndarray], first: int, cell: int) -> dict:
    """{"vs_top": [low, high]}: the 95% paired t interval of the top cell's effect minus this cell's over the examples
    where both are real (review 19e B1: a tie with the top cell is a paired difference reaching 0, as the heads
    finding's; each inside the other's interval named a wide weak cell and left out tight ones just below); {} where
    the arrays carry no per-example effects or fewer than 2 shared examples."""
    effects = arrays.get("effects")
    if effects is None:
        return {}
    d = effects[first] - effects[cell]  # [batch], NaN where either is padding
    out = chance.mean_intervals(d[None], where=np.isfinite(d)[None])  # in the raw metric's units
    pair = _pair(out["low"][0], out["high"][0])
    return {} if pair is None else {"vs_top": pair}


def _interval(arrays: dict[str, np.ndarray], cell: int) -> dict:
    """{"ci": [low, high] or None, "n": rows} of one cell of effect_intervals' arrays, and "share_ci" (the share of
    the gap's interval, share_intervals') where the arrays carry share_low / share_high (a raw metric with a gap)."""
    out = {"ci": _pair(arrays["low"][cell], arrays["high"][cell]), "n": int(arrays["n"][cell])}
    if "share_low" in arrays:
        out["share_ci"] = _pair(arrays["share_low"][cell], arrays["share_high"][cell])
    return out


def _pair(low: float, high: float) -> list[float] | None:
    low, high = float(low), float(high)
    return [low, high] if np.isfinite(low) and np.isfinite(high) else None


FULL_SITES = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "head_out", "head_out_by_pos",
              "q", "k", "v", "pattern")
QUICK_SITES = ("resid_pre", "attn_out", "mlp_out", "head_out")


NO_SUBJECT = ("the task marks no subject span to noise, and the model's tokenizer does not cover the zoo vocabulary "
              "for the zoo facts task, the one traced instead (causal tracing runs only on prompts with a subject span)")


def _trace_task(model, task, n_examples: int, seed: int):
    """The task causal tracing runs on: this one if it marks a subject, else the zoo facts task (None: neither,
    NO_SUBJECT)."""
    if "subject" in task.spans:
        return task
    from headscope.analyses.core.tasks import zoo

    try:
        return zoo(model, "facts", n_examples=n_examples, seed=seed)
    except ValueError:  # not a zoo tokenizer: no subject-marked prompts to trace
        return None


def traces(model, task) -> bool:
    """Whether causal tracing has prompts to run on for `task` (a subject span, or the zoo facts task): what the cost
    model charges it for (review 17a A2: a task without one was charged, and its budget's cut of trace_samples recorded
    as a changed setting, for a part that never runs)."""
    return task is None or _trace_task(model, task, 1, 0) is not None


# What the analysis needs from a task and a model (analyses/core/contract.py), checked before it runs.
NEEDS = Needs(answers=True, corrupted=True, decoder=True, continuation=True,
              what="patches between clean and corrupted runs and measures next-token answers")


def default_task(model, task=None, config: PatchingConfig | None = None) -> Task:
    """`task` as a Task (a Task, zoo task name, task file or data set); None: the zoo "ioi" task, and
    on other decoders IOI over single-token names (or corrupted induction on tiny vocabularies)."""
    from headscope.analyses.core import default_tasks
    from headscope.analyses.core.task_files import resolve_task

    config = config or PatchingConfig()
    n = config.examples(32, 8)
    if task is None:
        task = default_tasks.zoo_or(model, "ioi", lambda: default_tasks.logit_diff_task(model, n, config.seed, corrupt=True),
                                    n, config.seed)
    return resolve_task(model, task, default="ioi", n_examples=n, seed=config.seed)


def run(model, task: Task | str | None = None, config: PatchingConfig | None = None) -> Result:
    """`headscope patching`: exact patching of every site type with attribution estimates
    (default task: zoo "ioi"; other decoders: default_tasks.logit_diff_task), direct-path patching
    of every head into the logits, and causal tracing on the zoo facts task (or the given task,
    if it marks a "subject" span). Site types the model never computes are left out, each with why in
    summary["sites_absent"] (resid_mid on parallel blocks), as the finding says (activation_patching, asked
    for one, raises SiteError). Encoders raise UnsupportedModelError (NEEDS: the metrics read next-token answers)."""
    from headscope.analyses.patching.causal_tracing import causal_tracing
    from headscope.analyses.patching.path_patching import PATHS, PATHS_WHY, path_patching
    from headscope.hooks.sites import available_sites
    from headscope.models.readout import post_ln_reason

    config = config or PatchingConfig.preset()
    require(NEEDS, model, "patching")  # encoders: UnsupportedModelError (the report skips them beforehand)
    n = config.examples(32, 8)
    task = default_task(model, task, config)
    available = set(available_sites(model))
    # site types this model never computes are left out and said why (sites_absent), whether they come from the
    # defaults or from config.sites (which the report's budget sets too: cost.fewer_sites keeps resid_mid)
    wanted = site_types(config.sites or (QUICK_SITES if config.quick else FULL_SITES))
    left = {st.name: absent(model, st) for st in wanted if unpatchable(model, st, available)}
    names = [st.name for st in wanted if st.name not in left]
    result = activation_patching(model, task, dataclasses.replace(config, sites=tuple(names), attribution=True))
    summary, tables = dict(result.summary), dict(result.tables)
    if left:
        summary["sites_absent"] = left
    refused = post_ln_reason(model, PATHS, PATHS_WHY) if config.path_patching else None
    if refused:  # review 16d A2: post-LN OPT, one line in the finding instead of a wrong head
        summary["path_patching"] = {"not_run": refused}
    elif config.path_patching:
        paths = path_patching(model, task, receivers="logits", direction="denoise", seed=config.seed,
                              progress=config.progress)
        summary["path_patching"] = paths.summary
        tables.update(paths.tables)
    samples = config.trace_samples if config.trace_samples is not None else (3 if config.quick else 10)
    trace_task = _trace_task(model, task, n, config.seed) if samples else None
    if trace_task is not None:
        trace = causal_tracing(model, trace_task, n_samples=samples, seed=config.seed, progress=config.progress)
        summary["causal_tracing"] = {**trace.summary, "task": trace_task.name}
        tables.update(trace.tables)
    else:  # review 17a A2: said, as path patching's refusal is, so the section does not describe a part that never ran
        summary["causal_tracing"] = {"not_run": "trace_samples is 0" if not samples else NO_SUBJECT}
    config_out = {**result.config, "seed": config.seed, "n_examples": n, "task": task.name, "quick": config.quick}
    return Result(name="patching", df=result.df, summary=summary, tables=tables, config=config_out)
