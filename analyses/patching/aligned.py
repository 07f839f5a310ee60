"""Patching effects aligned on the corrupted token: each prompt's first position where the clean and
corrupted prompts differ.

The exact maps count positions from the end, the same place in every left-padded prompt. When the
prompts come from templates of different lengths, the one token the corruption changes sits at a
different place from the end in each template, and an end-aligned column averages it with other
tokens: a token that restores the whole gap in every prompt shows as 0.75 at -8 and 0.25 at -11.
Here each row's effect is read at its own first differing position (from the same sweep: no extra
pass), so the mean is over every prompt at that token.

Result: summary["at_corrupted_token"] = {"from_end": {offset: prompts} (where the corrupted token
sits, counted from the end, -1 the last token), "n": prompts with a difference, "positions_differ": [fewest,
most] positions that differ per prompt (the corrupted token is the first of them), "differ_from_end": {offset:
prompts} of every position where a clean prompt differs from its corrupted one, "column_tokens": {offset: {"token",
"n", "of"}} (the clean token most prompts have in each end-aligned column a top site sits in, on how many, of those
reaching it: at most one entry per top-site cell, whatever the prompts' length),
"sites": {site type: [{"layer", "effect" (mean per-example effect, the exact table's units), "ci" (95% t interval, None
under two rows), "n", "share_ci" (a raw metric with a gap: its share's interval, inputs.share_intervals),
 "end_aligned" (the layer's end-aligned cell of largest |effect|, its effect
and from_end)}]}} and the table `corrupted_token` (site_type, layer, effect, ci_low, ci_high, n_rows,
share_of_gap).
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd
import torch

from headscope.analyses.patching.inputs import PatchMetric, cell_means, effect_intervals, share_intervals


def first_difference(clean: torch.Tensor, corrupted: torch.Tensor) -> torch.Tensor:
    """[batch] padded index of each row's first position where clean and corrupted differ (-1: none)."""
    differ = (clean != corrupted).cpu()  # [batch, pos]
    first = differ.int().argmax(1)  # [batch]
    return torch.where(differ.any(1), first, torch.full_like(first, -1))


def nth_difference(clean: torch.Tensor, corrupted: torch.Tensor, k: int) -> torch.Tensor:
    """[batch] padded index of each row's k-th (0-based) position where clean and corrupted differ (-1: fewer)."""
    differ = (clean != corrupted).cpu()  # [batch, pos]
    rank = differ.long().cumsum(1)  # [batch, pos]: differing positions up to and including each
    hit = differ & (rank == k + 1)
    return torch.where(hit.any(1), hit.int().argmax(1), torch.full((differ.shape[0],), -1, dtype=torch.long))


def common_differences(clean: torch.Tensor, corrupted: torch.Tensor) -> int:
    """How many differing positions every row with a difference has (0: none differ): the orders each aligned over
    every such prompt (review 12b A2: a swap of two names changes two positions, and the second carries the gap)."""
    counts = [c for c in (clean != corrupted).sum(1).tolist() if c > 0]
    return int(min(counts)) if counts else 0


MAX_ORDERS = 8  # differing positions aligned one by one at most (a longer corruption: the first 8)


def positions_differ(clean: torch.Tensor, corrupted: torch.Tensor) -> list[int] | None:
    """[fewest, most] positions that differ between a clean prompt and its corrupted one, over the rows
    with a difference (None: no row differs): more than one means the aligned token is the first of several."""
    counts = [c for c in (clean != corrupted).sum(1).tolist() if c > 0]  # [batch] differing positions per row
    return [int(min(counts)), int(max(counts))] if counts else None


def differ_from_end(clean: torch.Tensor, corrupted: torch.Tensor) -> dict[str, int]:
    """{offset from the end: prompts} of every position where a clean prompt [batch, pos] differs from its
    corrupted one, nearest the start first: the places a finding names once (the padding of a pair is shared)."""
    rows, pos = torch.nonzero((clean != corrupted).cpu(), as_tuple=True)  # [k] each
    found = (pos - clean.shape[1]).tolist()
    return {str(o): found.count(o) for o in sorted(set(found))}


def column_tokens(model, tokens: torch.Tensor, mask: torch.Tensor | None = None,
                  offsets: Iterable[int] | None = None) -> dict[str, dict]:
    """What each end-aligned column holds: {offset from the end: {"token": the clean token most prompts have there
    (text; a tie: the lowest id), "n": the prompts with it, "of": the prompts where the position is a real token}}
    over the clean prompts [batch, pos] (mask [batch, pos], 1 for real tokens; None: every position real). A finding
    says from it whether a cell's column is one token or a mixture (review 13: "averaging whatever tokens").
    offsets: only these columns (offsets from the end, -1 the last; the summary's: those of its top sites, the
    cells a finding can cite, so the record does not grow with the prompt's length); None: every column."""
    real = torch.ones_like(tokens, dtype=torch.bool) if mask is None else mask.bool().to(tokens.device)
    n_pos, found = tokens.shape[1], []
    wanted = range(n_pos) if offsets is None else sorted({n_pos + int(o) for o in offsets if -n_pos <= int(o) < 0})
    for p in wanted:
        col = tokens[real[:, p], p]  # [k] the real rows' tokens there
        if len(col):
            values, counts = col.unique(return_counts=True)
            k = int(counts.argmax())  # the first largest count: the lowest id among ties
            found.append((p, int(values[k]), int(counts[k]), len(col)))
    if not found:
        return {}
    texts = model.to_str_tokens(torch.tensor([i for _, i, _, _ in found]))
    return {str(p - n_pos): {"token": str(t), "n": n, "of": of} for (p, _, n, of), t in zip(found, texts)}


def at_corrupted_token(pm: PatchMetric, name: str, cells: list, values: torch.Tensor, base: torch.Tensor | dict,
                       clean: torch.Tensor, corrupt: torch.Tensor, first: torch.Tensor,
                       frame: pd.DataFrame, share: bool = False) -> list[dict]:
    """Per layer of one (layer, pos) site type: the effect at each row's corrupted token (first [batch]),
    from the sweep's per-row values [cell, batch] (NaN where padding); frame: the type's exact rows.
    share: each record also carries share_ci, its share of the run's gap's interval (inputs.share_intervals).
    base: the unpatched metric [batch], or {layer: [batch]} (each layer's null run, exact_sweep)."""
    index = {(layer, pos): i for i, (layer, _, pos) in enumerate(cells)}
    layers = sorted({layer for layer, _, _ in cells})
    rows = torch.arange(values.shape[1])
    aligned = torch.full((len(layers), values.shape[1]), float("nan"), dtype=values.dtype)  # [layer, batch]
    for k, layer in enumerate(layers):
        for r, p in zip(rows.tolist(), first.tolist()):
            if p >= 0 and (layer, p) in index:
                aligned[k, r] = values[index[layer, p], r]
    if isinstance(base, dict):
        base = torch.stack([base[layer] for layer in layers])  # [layer, batch]
    means = cell_means(pm, aligned, base, clean, corrupt)
    ci = effect_intervals(pm, aligned, base, clean, corrupt)
    shares = share_intervals(aligned, base, clean, corrupt, whole_gap=True) if share else None
    out = []
    for k, layer in enumerate(layers):
        mine = frame[frame["layer"] == layer]
        top = mine.loc[mine["effect"].abs().idxmax()] if len(mine) and mine["effect"].notna().any() else None
        low, high = float(ci["low"][k]), float(ci["high"][k])
        out.append({
            "layer": int(layer),
            "effect": float(means["effect"][k]),
            "ci": [low, high] if np.isfinite(low) and np.isfinite(high) else None,
            "n": int(ci["n"][k]),
            **({} if shares is None else {"share_ci": _pair(shares["low"][k], shares["high"][k])}),
            "end_aligned": None if top is None else {"effect": float(top["effect"]),
                                                     "from_end": int(top["position_from_end"])},
        })
    return out


def _pair(low: float, high: float) -> list[float] | None:
    low, high = float(low), float(high)
    return [low, high] if np.isfinite(low) and np.isfinite(high) else None


def offsets(first: torch.Tensor, n_pos: int) -> dict[str, int]:
    """{offset from the end: prompts} of the corrupted token (rows without a difference left out)."""
    found = [p - n_pos for p in first.tolist() if p >= 0]
    return {str(o): found.count(o) for o in sorted(set(found), key=lambda o: -found.count(o))}


def table(sites: dict[str, list[dict]], gap: float | None, orders: list[dict] | None = None) -> pd.DataFrame:
    """The `corrupted_token` table: one row per (differing position, site type, layer); differing_position 1 is the
    first (orders: the summary's per-order records, else `sites` is the first's); share_of_gap = effect / gap."""
    by_order = orders or [{"order": 1, "sites": sites}]
    rows = [{"differing_position": o["order"], "site_type": name, "layer": r["layer"], "effect": r["effect"],
             "ci_low": r["ci"][0] if r["ci"] else np.nan, "ci_high": r["ci"][1] if r["ci"] else np.nan,
             "n_rows": r["n"], "share_of_gap": r["effect"] / gap if gap else np.nan}
            for o in by_order for name, records in o["sites"].items() for r in records]
    return pd.DataFrame(rows, columns=["differing_position", "site_type", "layer", "effect", "ci_low", "ci_high",
                                       "n_rows", "share_of_gap"])
