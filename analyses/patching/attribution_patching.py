"""Attribution patching (Nanda 2023): every patching effect from two forwards and one backward.

The effect of patching activation a from the source run into the base run is approximated to
first order: dM ~= (a_source - a_base) . dM/da, the gradient taken on the base run (the
corrupted run when denoising). One forward collects the source activations, one forward plus
one backward on the base run gives every site's gradient; each cell's estimate is that product
summed over the cell's elements and the batch (the metric is a batch mean). For a head output
this equals the product at hook_result, because d(z W_O) . g = dz . (g W_O^T).
Exact when the metric is linear in the patched activation (e.g. the last layer's head outputs
when the final norm is linear); poor for large early changes (MLP0), which is why the
correlation with exact patching is reported per site type.

Padded tasks: both runs go under the task's attention_mask, products at padded positions are
dropped (never multiplied: a padded activation must not reach the sum), and a position cell's
estimate is the mean over the rows where that position is real (as exact patching's cells).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from headscope.analyses.core.config import configure
from headscope.analyses.core.metrics import noise_floor
from headscope.analyses.core.result import Result, names_source
from headscope.analyses.core.task_files import takes_prompt
from headscope.analyses.core.tasks import Task
from headscope.analyses.patching import prompt_end
from headscope.analyses.patching.configs import PatchingConfig
from headscope.analyses.patching.engine import padding_mask
from headscope.analyses.patching.inputs import (
    PatchMetric,
    check_direction,
    clean_and_corrupted,
    mask_padding,
    paired_rows,
    resolve_metric,
    task_padding,
    token_labels,
)
from headscope.analyses.patching.sites import SiteType, cell_frame, site_types
from headscope.hooks.capture import capture
from headscope.hooks.sites import site

DEFAULT_SITES = ("resid_pre", "attn_out", "mlp_out", "head_out", "head_out_by_pos")


def _reduce(st: SiteType, prod: torch.Tensor) -> torch.Tensor:
    """Sum a [batch, ...] product over every axis that is not swept -> [batch, pos?, head?]."""
    keep = [a for a, swept in ((st.pos_axis, st.by_pos), (st.head_axis, st.by_head)) if swept]
    drop = [a + 1 for a in range(prod.ndim - 1) if a not in keep]
    return prod.sum(dim=drop) if drop else prod  # axes kept in their original (pos before head) order


def _real(st: SiteType, prod: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The product [batch, ...] with padded positions set to 0 (selected, not multiplied)."""
    if mask is None:
        return prod
    shape = [1] * prod.ndim
    shape[0], shape[st.pos_axis + 1] = mask.shape
    return torch.where(mask.bool().view(shape).to(prod.device), prod, torch.zeros((), dtype=prod.dtype, device=prod.device))


def attribution_scores(
    model,
    base: torch.Tensor,
    source: torch.Tensor,
    types: Sequence[SiteType],
    metric: PatchMetric,
    scale: float | torch.Tensor = 1.0,
    *,
    attention_mask: torch.Tensor | None = None,
    pieces: torch.Tensor | None = None,
) -> dict[str, tuple[list, torch.Tensor]]:
    """{site type: (cells, estimated effect [n_cells])} for patching source into base.

    scale divides the estimates (the normalised metric's clean - corrupt denominator): a float,
    or per-row differences [batch], whose mean over a cell's rows is then its denominator.
    attention_mask: the left padding [batch, pos] shared by base and source, or None. pieces: [batch]
    teacher-forced answer pieces per row (prompt_end.answer_pieces): positions then count from each
    prompt's last token, as exact patching's (None: from the end of the row).
    """
    rows = attribution_rows(model, base, source, types, metric, attention_mask=attention_mask)
    out = {}
    for name, (cells, est) in rows.items():
        if pieces is not None:
            cells, est = prompt_end.cell_values(cells, est, pieces)
        real = ~torch.isnan(est)  # [cell, batch]
        total = torch.nan_to_num(est.double()).sum(1)  # [cell]
        if isinstance(scale, torch.Tensor):
            denom = (scale.double().cpu().expand_as(real) * real).sum(1)
        else:
            denom = real.sum(1).double() * scale
        out[name] = (cells, (total / denom).float())
    return out


def attribution_rows(
    model,
    base: torch.Tensor,
    source: torch.Tensor,
    types: Sequence[SiteType],
    metric: PatchMetric,
    *,
    attention_mask: torch.Tensor | None = None,
) -> dict[str, tuple[list, torch.Tensor]]:
    """{site type: (cells, per-row estimated effect [n_cells, batch])}, NaN where a position cell is
    padding in a row. Each row's estimate is its own: rows' metrics are independent, so the
    gradient of their sum gives every row's gradient of its own metric."""
    mask = padding_mask(attention_mask, base)  # [batch, pos] or None
    layers = range(model.facts.n_layers)
    names = sorted({st.hook(layer) for st in types for layer in layers}
                   | {st.write_hook(layer) for st in types for layer in layers})
    src = capture(model, source, names, attention_mask=mask)  # no grad
    kept: dict[str, torch.Tensor] = {}

    def leaf(act: torch.Tensor, hook: Any) -> torch.Tensor:  # makes everything downstream differentiable
        return act.detach().requires_grad_(True)

    def keep(name: str):
        def hook(act: torch.Tensor, hook: Any) -> torch.Tensor:
            kept[name] = act
            return act  # returned, so that the bridge uses this (possibly reshaped) tensor downstream
        return hook

    with torch.enable_grad():
        out = model.run_with_hooks(base, fwd=[(site("embed"), leaf)] + [(n, keep(n)) for n in names],
                                   attention_mask=mask)
        value = metric.fn(out).sum()  # [batch] summed: each row's gradient is its own metric's
        grads = dict(zip(names, torch.autograd.grad(value, [kept[n] for n in names], allow_unused=True)))
    scores = {}
    n_pos = base.shape[1]
    for st in types:
        cells = st.cells(model, n_pos)
        per_layer = []
        for layer in range(model.facts.n_layers):
            name, writer = st.hook(layer), st.write_hook(layer)  # resid_mid's gradient is attn_out's
            grad = grads[writer] if grads[writer] is not None else torch.zeros_like(kept[writer])
            delta = src[name] - kept[name].detach()  # [batch, ...]
            prod = _real(st, (delta * grad.to(delta.device)).float(), mask)
            per_layer.append(_reduce(st, prod).reshape(prod.shape[0], -1).cpu())  # [batch, cells of the layer]
        est = torch.cat(per_layer, 1).T  # [cell, batch]: layer-major, pos before head
        scores[st.name] = (cells, mask_padding(est, [c[2] for c in cells], mask))
    return scores


def attribution_table(model, base, source, types, metric: PatchMetric, labels: list[str],
                      scale: float | torch.Tensor = 1.0, *, attention_mask: torch.Tensor | None = None,
                      pieces: torch.Tensor | None = None) -> pd.DataFrame:
    """attribution_scores as one tidy table (site_type, layer, head, pos, token, attribution)."""
    scores = attribution_scores(model, base, source, types, metric, scale, attention_mask=attention_mask,
                                pieces=pieces)
    frames = [cell_frame(st, cells, labels, attribution=values.numpy()) for st, (cells, values) in zip(types, scores.values())]
    return pd.concat(frames, ignore_index=True)


@takes_prompt
@names_source
def attribution_patching(
    model,
    task=None,
    config: PatchingConfig | None = None,
    *,
    corrupted_tokens: torch.Tensor | None = None,
    **config_overrides: Any,
) -> Result:
    """Attribution-patching estimates of every cell's patching effect (two forwards, one backward).

    config: a PatchingConfig (its sites, None: DEFAULT_SITES; direction; metric); config_overrides
    are its fields. The older form attribution_patching(model, task, sites) still works. task: a
    Task, zoo task name, task file or None (the patching default task). Returns a Result whose df
    has site_type, layer, head, pos, token, attribution (the estimated change of the metric, same
    units as exact patching's `effect`).
    """
    cfg = configure(PatchingConfig, config, config_overrides, name="attribution_patching", positional="sites")
    direction, metric, sites = cfg.direction, cfg.metric, DEFAULT_SITES if cfg.sites is None else cfg.sites
    if not isinstance(task, Task):
        from headscope.analyses.patching.analysis import default_task

        task = default_task(model, task, cfg)
    check_direction(direction)
    task, left_out = paired_rows(task, corrupted_tokens, "attribution patching")
    clean, corrupted = clean_and_corrupted(model, task, corrupted_tokens)
    mask = task_padding(task, clean)  # [batch, pos] or None
    pm = resolve_metric(task, metric)
    types = site_types(sites)
    base, source = (corrupted, clean) if direction == "denoise" else (clean, corrupted)
    scale: float | torch.Tensor = 1.0
    if pm.normalized:
        with torch.no_grad():
            scale = (pm.fn(model(clean, attention_mask=mask)) - pm.fn(model(corrupted, attention_mask=mask))).cpu()
    pieces = prompt_end.answer_pieces(task)  # answers of several tokens: positions from each prompt's last token
    shown = prompt_end.to_prompt_end(clean.cpu(), pieces)
    shown_mask = prompt_end.to_prompt_end(torch.ones_like(shown) if mask is None else mask.cpu().long(), pieces)
    df = attribution_table(model, base, source, types, pm, token_labels(model, shown, shown_mask), scale,
                           attention_mask=mask, pieces=pieces)
    summary = {"metric": pm.name, "direction": direction, "n_examples": int(clean.shape[0]), **left_out}
    return Result(name="patching", df=df, summary=summary, tables={"attribution": df},
                  config={"sites": [st.name for st in types], "direction": direction})


NONZERO = 1e-3  # an exact effect below this fraction of the site type's largest counts as zero (and below the rounding floor)
IDENTITY_MARGIN = 2.0  # the rounding floor: this many times the largest effect of a cell that patches nothing


def rounding_floor(exact: pd.DataFrame, first: np.ndarray, dtype: torch.dtype, size: float,
                   gap: float | None = None) -> dict:
    """How large an exact effect rounding alone makes in the model's dtype, in the effect column's units:
    {"floor", "basis", "n_cells"}. Measured where it can be: a by-position cell before every prompt's
    first corrupted token (`first`: [batch] padded indices, -1 for none) patches an activation with
    itself (causal attention: the clean and corrupted runs agree there), so its exact effect is 0 and
    what it shows is the patched pass's rounding against its null run (exactly 0 since each cell subtracts the
    null run of its own path, review 19c B1; before, bfloat16 gave 1-2 steps of a mean there); the floor is
    IDENTITY_MARGIN x the largest such |effect|. Without such a cell, or where they are all exactly 0: one rounding step of the
    metric (metrics.noise_floor: eps(dtype) x max(1, size)), divided by |gap| for a normalised metric (its effects are shares)."""
    starts = np.asarray(first)[np.asarray(first) >= 0]
    pos = exact["pos"].to_numpy(dtype=float, na_value=np.nan)
    same = np.isfinite(pos) & (pos < starts.min()) if starts.size else np.zeros(len(exact), dtype=bool)
    same &= exact["head"].isna().to_numpy()  # per-position sites (resid, attn_out, mlp_out): one activation each
    seen = np.abs(exact.loc[same, "effect"].to_numpy(dtype=float))
    seen = seen[np.isfinite(seen)]
    if seen.size and float(seen.max()) > 0:
        return {"floor": IDENTITY_MARGIN * float(seen.max()), "basis": "measured", "n_cells": int(seen.size)}
    step = noise_floor(dtype, size)
    return {"floor": step / abs(gap) if gap else step, "basis": "one rounding step", "n_cells": int(seen.size)}


def _magnitudes(effects: np.ndarray) -> tuple[np.ndarray, float]:
    """The finite |effects| and the largest of them (0 when none): what both counts below measure against."""
    mag = np.abs(np.asarray(effects, dtype=float))
    mag = mag[np.isfinite(mag)]
    return mag, float(mag.max()) if mag.size else 0.0


def nonzero_count(effects: np.ndarray, floor: float = 0.0) -> int:
    """Cells whose |effect| exceeds NONZERO x the largest |effect| and the rounding floor (0 when none)."""
    mag, peak = _magnitudes(effects)
    return int((mag > max(NONZERO * peak, floor)).sum()) if peak > floor else 0


def within_rounding(effects: np.ndarray, floor: float) -> int:
    """Cells the rounding floor alone keeps from counting as non-zero: |effect| above NONZERO x the largest but
    within `floor` (bfloat16 runs: real but tiny effects, review 10a C5, which are not "no exact effect")."""
    mag, peak = _magnitudes(effects)
    return int(((mag > NONZERO * peak) & (mag <= floor)).sum()) if floor > 0 else 0


def _r_without_top(pair: pd.DataFrame) -> float | None:
    """Pearson r of the cells without the one of largest |effect| (None when fewer than 3 remain or one is constant)."""
    rest = pair.drop(index=pair["effect"].abs().idxmax())
    if len(rest) < 3 or rest.nunique().min() < 2:
        return None
    return float(rest["effect"].corr(rest["attribution"]))


def _slope_without_top(pair: pd.DataFrame) -> float | None:
    """The least-squares slope of the cells without the one of largest |effect| (review 12a: one cell at 0.999
    of the gap beside eleven under 0.04 sets the slope as it sets r); None under 3 cells left."""
    rest = pair.drop(index=pair["effect"].abs().idxmax())
    return slope_with_interval(rest["effect"].to_numpy(), rest["attribution"].to_numpy())["slope"] if len(rest) >= 3 else None


def slope_with_interval(exact: np.ndarray, attribution: np.ndarray, alpha: float = 0.05) -> dict:
    """Least-squares slope of attribution (y) on the exact effect (x) over the finite cells, with its
    two-sided (1 - alpha) t interval (standard error sqrt(SSR / (n - 2) / Sxx), n - 2 degrees of
    freedom): {"slope" (None when x is constant), "slope_ci" (None under 3 cells), "slope_n"}. A slope
    of 0.5 is attribution patching estimating half the exact effect, which a correlation cannot show."""
    x, y = np.asarray(exact, dtype=np.float64), np.asarray(attribution, dtype=np.float64)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    n = int(len(x))
    sxx = float(((x - x.mean()) ** 2).sum()) if n else 0.0
    if n < 2 or sxx <= 0.0:
        return {"slope": None, "slope_ci": None, "slope_n": n}
    slope = float(((x - x.mean()) * (y - y.mean())).sum() / sxx)
    ci = None
    if n > 2:
        from scipy import stats

        resid = y - y.mean() - slope * (x - x.mean())
        half = float(stats.t.ppf(1 - alpha / 2, n - 2)) * math.sqrt(float((resid ** 2).sum()) / (n - 2) / sxx)
        ci = [slope - half, slope + half]
    return {"slope": slope, "slope_ci": ci, "slope_n": n}


NEGLIGIBLE = 1e-3  # a site type whose every exact effect is below this share of the clean-corrupted gap has nothing to rank
SPARSE = 10  # fewer non-zero exact effects than this (or under half the cells): no interval is stated for r or the slope
MISS = 5.0  # attribution under 1/MISS of an exact effect (or of the opposite sign) misses it
LARGE = 0.25  # ... when that exact effect is at least this fraction of the site type's largest


def interval_stated(n: int, n_nonzero: int | None) -> bool:
    """Whether r's and the slope's intervals over the cells are reported (the finding and the figure both
    ask here): not when under SPARSE or half the cells have a non-zero exact effect, as the zero cells are
    not independent evidence."""
    return n_nonzero is None or not (n_nonzero < SPARSE or n_nonzero < n / 2)


def _cell(row: pd.Series) -> dict:
    """A JSON-ready record of one joined cell: where it is, its exact effect and attribution estimate."""
    def whole(key: str):
        v = row.get(key)
        return None if v is None or pd.isna(v) else int(v)

    return {"layer": whole("layer"), "head": whole("head"), "pos": whole("pos"), "from_end": whole("position_from_end"),
            "effect": float(row["effect"]), "attribution": float(row["attribution"])}


def rank_checks(pair: pd.DataFrame, floor: float = 0.0) -> dict:
    """{"spearman_nonzero" (Spearman over the cells with a non-zero exact effect, None under 3 or constant),
    "top_exact" (the cell of largest |exact effect|, with "attribution_rank": its rank by |attribution|, 1 =
    first, counting only attributions larger by more than `floor`, and "tied": how many other cells' |exact
    effect| lie within its 95% interval's half-width (column effect_ci_half, when given) or the floor),
    "missed" (the cell of largest |exact effect| at least LARGE of the largest, where attribution is under
    1/MISS of it or of the opposite sign, and differs from it by more than the floor, whose 95% interval
    excludes 0 (|effect| above its effect_ci_half, when given); None when there is none)}. pair: the joined
    rows of one site type; floor: the effects' rounding (rounding_floor), 0 in float32 where NONZERO rules.
    Every exact effect within the floor: nothing is ranked (all None)."""
    effect, attr = pair["effect"].astype(float), pair["attribution"].astype(float)
    peak = float(effect.abs().max()) if len(pair) else 0.0
    if not peak > floor:
        return {"spearman_nonzero": None, "top_exact": None, "missed": None}
    nonzero = pair[effect.abs() > max(NONZERO * peak, floor)]
    rho = None
    if len(nonzero) >= 3 and nonzero[["effect", "attribution"]].nunique().min() >= 2:
        rho = float(nonzero["effect"].astype(float).corr(nonzero["attribution"].astype(float), method="spearman"))
    top_index = effect.abs().idxmax()
    top = pair.loc[top_index]
    rank = 1 + int((attr.abs() > abs(float(top["attribution"])) + floor).sum())
    half = float(top["effect_ci_half"]) if "effect_ci_half" in pair and np.isfinite(top["effect_ci_half"]) else 0.0
    tied = int((effect.drop(index=top_index).abs() >= peak - max(half, floor)).sum())
    ratio = attr / effect.where(effect != 0)
    halves = pair["effect_ci_half"].astype(float).fillna(0.0) if "effect_ci_half" in pair else 0.0
    # a miss is an effect distinguishable from 0 (its 95% interval excludes 0): review 13c A1 named cells of 0.3%
    # of the gap with p = 0.13 and 0.33 as "missed"
    missed = pair[(effect.abs() >= LARGE * peak) & (ratio < 1 / MISS) & ((effect - attr).abs() > floor)
                  & (effect.abs() > halves)]
    miss = None if missed.empty else _cell(missed.loc[missed["effect"].abs().idxmax()])
    return {"spearman_nonzero": rho, "top_exact": {**_cell(top), "attribution_rank": rank, "tied": tied},
            "missed": miss}


def correlation_with_exact(exact: pd.DataFrame, attribution: pd.DataFrame, *, floor: float = 0.0,
                           ci_half: np.ndarray | None = None) -> tuple[pd.DataFrame, dict]:
    """Join exact effects with attribution estimates; Pearson and Spearman r and the slope per site type.

    Returns (joined table, {site type: {"pearson", "spearman", "n", "n_nonzero", "n_within_rounding", "pearson_without_top",
    "slope", "slope_ci", "slope_n", "slope_without_top", "spearman_nonzero", "top_exact", "missed"}}); r is None where either
    column is constant. n_nonzero counts the
    cells whose |exact effect| exceeds NONZERO of the largest: an r over one such cell among zeros is
    fixed by that cell and says nothing; pearson_without_top is r with the largest-|effect| cell left
    out (a 47.8 beside effects under 0.6 makes r = 1.000 whatever the rest do). slope: attribution on
    exact by least squares over every cell, with its 95% t interval (slope_with_interval): a high r
    with slope 0.5 ranks cells right and sizes them at half. spearman_nonzero, top_exact and missed:
    rank_checks (ties among zero cells raise or lower Spearman; a reversed top site or a missed large effect is
    what a ranking by attribution would get wrong). floor: the exact effects' rounding in the model's
    dtype (rounding_floor): no cell within it counts as non-zero, and no verdict rests on a difference
    within it. ci_half: [rows of exact] each effect's 95% interval half-width (a top cell within it of
    another is tied, and not said to be misranked).
    """
    keys = ["site_type", "layer", "head", "pos"]
    exact = exact.assign(effect_ci_half=np.nan if ci_half is None else np.asarray(ci_half, dtype=float))
    joined = exact.merge(attribution[keys + ["attribution"]], on=keys, how="inner")
    stats = {}
    for name, group in joined.groupby("site_type", sort=False):
        pair = group[["effect", "attribution"]].astype(float)
        constant = pair.nunique().min() < 2
        stats[str(name)] = {
            "pearson": None if constant else float(pair["effect"].corr(pair["attribution"])),
            "spearman": None if constant else float(pair["effect"].corr(pair["attribution"], method="spearman")),
            "n": int(len(group)),
            "n_nonzero": int(nonzero_count(pair["effect"].to_numpy(), floor)),
            "n_within_rounding": within_rounding(pair["effect"].to_numpy(), floor),
            "pearson_without_top": None if constant else _r_without_top(pair),
            **slope_with_interval(pair["effect"].to_numpy(), pair["attribution"].to_numpy()),
            "slope_without_top": _slope_without_top(pair),
            **rank_checks(group, floor),
        }
    return joined.drop(columns="effect_ci_half"), stats
