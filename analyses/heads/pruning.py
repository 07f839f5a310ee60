"""Iterative head pruning (Michel et al. 2019): the metric as heads are removed, least important first.

A step removes `step` x (all heads) heads, 10% by default. Orderings: "gradient" (gate-gradient
importance divided by its layer's L2 norm, as Michel et al. rank heads across layers; raw with
normalize=False), "ablation" (the raw single-head ablation drop) and "random" (one random order per
seed, giving a band). What each ranks by is recorded (`ordering_basis`, in the summary) and named
on the figure and in the finding: the importance figure shows raw |dL/d gate|, so the normalised
order can differ from its ranks. Without recomputation the order is fixed from the
unpruned model (the paper); with it, importance is recomputed on the pruned model after each
step (the HF "bertology" port). Removed heads are zeroed at hook_z (xi_h = 0). Curves whose
masks are all known in advance run as stacked copies, several masks per forward pass.

Recomputed zero-ablation orderings cost one pass per remaining head at every step (about
n_heads^2 x step / 2 passes in all). Above `exact_limit` heads (EXACT_LIMIT = 64: every zoo
model and GPT-2-style models up to 8 x 8 heads stay exact) each step ranks the remaining heads
by gate gradient on the pruned model (one backward pass) and verifies exactly, by zero
ablation, only the VERIFY x k lowest-ranked candidates (k: the heads the step removes; at least
k + 8), removing the k whose exact ablation costs least: 3 + 2k passes a step instead of all the
remaining heads (GPT-2 small, 144 heads: about 6x fewer passes; Llama 2 7B's 1,024: about 12x).

The tolerance (`tolerance_band`): a point counts while it stays no more than `tolerance` (1%) of a scale below the
unpruned metric. The scale is |unpruned| (logit difference, accuracy, cosine: their zero is a real scale, and a logit
difference's chance is that zero), except for a log-probability, whose zero is its ceiling: a model that solves the
task scores about -0.007, and 1% of that (0.00007 nats) is rounding (review 11b A6). Its scale is the span from
chance to unpruned, |unpruned - chance| (chance: the rows' k log(1/vocab) averaged, Scorer.chance: the uniform guess as a
fixed scale, the chance record's uniform_chance, not the guard's own-token baseline), whichever of the two is larger.
The count, its bootstrap interval, the line record, the curve shapes, the figure's band and compare
all take it from here; the summary's `pruning_tolerance` records it in the metric's units.

How many heads can go is a count with an uncertainty: `pruning_curves(per_example=True)` keeps each
example's metric at every point and `prunable_intervals` bootstraps the count over examples, the
order fixed (the finding states it as "k of n heads, 95% bootstrap interval a-b heads, over m examples").
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from headscope.analyses.core.chance import clear_of, se_interval, t_half_width
from headscope.analyses.heads.importance import (
    Scorer,
    ablation_importance,
    evaluate_masks,
    gate_gradients,
    normalize_per_layer,
)
from headscope.errors import ConfigError

ORDERINGS = ("gradient", "ablation", "random")
EXACT_LIMIT = 64  # heads above which recomputed ablation orderings rank by gradient and verify the top candidates
VERIFY = 2  # candidates verified exactly per head removed (cheap ranking)


@dataclass(frozen=True, kw_only=True)
class PruningConfig:
    """step: fraction of all heads removed per step; n_random: seeds of the random band;
    method: the ablation of the "ablation" ordering; normalize: per-layer L2 for "gradient";
    tolerance: drop allowed when counting prunable heads, a share of tolerance_band's scale; exact_limit: head count above
    which recomputed zero-ablation orderings use the cheap ranking with exact verification."""

    step: float = 0.1
    orderings: tuple[str, ...] = ORDERINGS
    recompute: tuple[bool, ...] = (False, True)
    n_random: int = 5
    method: str = "zero"
    normalize: bool = True
    tolerance: float = 0.01
    exact_limit: int = EXACT_LIMIT

    def __post_init__(self) -> None:
        if not 0 < self.step <= 1:
            raise ConfigError(f"step is the fraction of heads removed per step, in (0, 1]; got {self.step}.")
        unknown = set(self.orderings) - set(ORDERINGS)
        if unknown:
            raise ConfigError(f"Unknown pruning orderings {sorted(unknown)}; use some of {ORDERINGS}.")


def prune_counts(n_heads: int, step: float) -> list[int]:
    """Heads removed at each point of the curve: 0, k, 2k, ..., n_heads with k = round(step n)."""
    k = max(1, round(step * n_heads))
    return sorted(set(range(0, n_heads, k)) | {n_heads})


def ordering_basis(config: PruningConfig) -> dict[str, str]:
    """{ordering: what it ranks heads by, in a few words} for config.orderings ("random" says itself):
    the summary's `ordering_basis`, which the curve's legend and the finding name."""
    words = {
        "gradient": "|dL/d gate| / its layer's L2 norm" if config.normalize else "raw |dL/d gate|",
        "ablation": f"raw {config.method}-ablation drop",
    }
    return {o: words[o] for o in config.orderings if o in words}  # random needs no words


def head_label(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


def importance_for(model, scorer: Scorer, ordering: str, config: PruningConfig,
                   mask: torch.Tensor | None = None, *, seed: int = 0) -> tuple[torch.Tensor, float]:
    """([L, H] importance under the current mask (None = unpruned), higher = keep longer;
    the mean metric under that mask, from the same forward passes; seed: resample ablation's partners)."""
    if ordering == "gradient":
        importance, metric = gate_gradients(model, scorer, mask)
        return (normalize_per_layer(importance) if config.normalize else importance), metric
    if ordering == "ablation":
        scores = ablation_importance(model, scorer, method=config.method, base_mask=mask, seed=seed)
        return scores.importance, scores.baseline
    raise ConfigError(f"ordering {ordering!r} has no importance; use 'gradient' or 'ablation'.")


def pruning_curve(
    model, scorer: Scorer, *, ordering: str, recompute: bool = False, config: PruningConfig = PruningConfig(),
    importance: torch.Tensor | None = None, seed: int = 0, progress: bool = False, per_example: bool = False,
) -> pd.DataFrame | tuple[pd.DataFrame, torch.Tensor]:
    """One curve: columns ordering, recompute, seed, n_pruned, fraction_pruned, metric, pruned
    (heads removed at that step, "L0H3 L1H2"). `importance` [L, H] skips the first computation
    of a curve without recomputation. seed: the random ordering's draw and resample ablation's partners.
    per_example=True -> (curve, each example's metric at each point [points, n_examples] float64): free
    for fixed orders (the same passes); a recomputed curve evaluates its masks once more at the end,
    and its metric column is then the mean of those values (one engine for every curve)."""
    curve, values = _pruning_curve(model, scorer, ordering=ordering, recompute=recompute, config=config,
                                   importance=importance, seed=seed, progress=progress, per_example=per_example)
    return (curve, values) if per_example else curve


def _pruning_curve(model, scorer, *, ordering, recompute, config, importance, seed, progress,
                   per_example) -> tuple[pd.DataFrame, torch.Tensor | None]:
    f = model.facts
    n = f.n_layers * f.n_heads
    counts = prune_counts(n, config.step)
    if ordering == "random":
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
        return _fixed_curve(model, scorer, order, counts, "random", seed, progress, per_example)
    if not recompute:
        if importance is None:
            importance, _ = importance_for(model, scorer, ordering, config, seed=seed)
        order = torch.argsort(importance.flatten(), stable=True).tolist()  # least important first
        return _fixed_curve(model, scorer, order, counts, ordering, seed, progress, per_example)
    mask = torch.ones(f.n_layers, f.n_heads)
    rows, chosen, masks = [], [], []
    cheap = cheap_ranking(ordering, n, config)
    for prev, count in tqdm(list(zip(counts, counts[1:])), desc=f"pruning ({ordering}, recompute)",
                            disable=not progress, leave=False):
        removed = [divmod(i, f.n_heads) for i in chosen]  # the heads the previous step removed
        if cheap:
            chosen, metric = verified_step(model, scorer, mask, count - prev, normalize=config.normalize)
        else:
            importance, metric = importance_for(model, scorer, ordering, config, mask, seed=seed)  # metric at `mask`
            scores = importance.flatten().clone()
            scores[mask.flatten() == 0] = float("inf")  # already pruned
            chosen = torch.argsort(scores, stable=True)[: count - prev].tolist()
        rows.append(_row(ordering, True, seed, prev, n, metric, removed))
        masks.append(mask.clone())
        mask.view(-1)[chosen] = 0.0
    masks.append(mask)
    last = [divmod(i, f.n_heads) for i in chosen]
    if not per_example:
        metric = float(evaluate_masks(model, scorer, mask[None])[0])
        return pd.DataFrame([*rows, _row(ordering, True, seed, counts[-1], n, metric, last)]), None
    values = evaluate_masks(model, scorer, torch.stack(masks), per_example=True)  # [points, n_examples]
    curve = pd.DataFrame([*rows, _row(ordering, True, seed, counts[-1], n, 0.0, last)])
    curve["metric"] = values.mean(1).tolist()
    return curve, values


def cheap_ranking(ordering: str, n_heads: int, config: PruningConfig) -> bool:
    """Whether a recomputed `ordering` ranks by gradient and verifies exactly (zero ablation above exact_limit heads)."""
    return ordering == "ablation" and config.method == "zero" and n_heads > config.exact_limit


def verified_step(model, scorer: Scorer, mask: torch.Tensor, k: int, *, normalize: bool = True) -> tuple[list[int], float]:
    """One cheap-ranking step under `mask` [L, H]: the remaining heads ranked by gate gradient, the
    max(VERIFY k, k + 8) lowest zero-ablated exactly (stacked passes), and the k whose removal
    costs least. -> (flat indices of the k heads, the mean metric at `mask`)."""
    f = model.facts
    grads, _ = gate_gradients(model, scorer, mask)
    scores = (normalize_per_layer(grads) if normalize else grads).flatten().clone()
    alive = mask.flatten() > 0
    scores[~alive] = float("inf")
    n_cand = min(int(alive.sum()), max(VERIFY * k, k + 8))
    candidates = torch.argsort(scores, stable=True)[:n_cand]
    masks = mask.flatten().repeat(n_cand + 1, 1)  # [candidates + 1 (the mask itself), L * H]
    masks[torch.arange(n_cand), candidates] = 0.0
    values = evaluate_masks(model, scorer, masks.view(-1, f.n_layers, f.n_heads))
    drop = values[-1] - values[:-1]  # [candidates] exact importance under the mask
    keep = torch.argsort(drop, stable=True)[:k]
    return candidates[keep].tolist(), float(values[-1])


def _fixed_curve(model, scorer, order, counts, ordering, seed, progress,
                 per_example) -> tuple[pd.DataFrame, torch.Tensor | None]:
    f = model.facts
    n = len(order)
    masks = torch.ones(len(counts), n)  # [points, L * H]
    for i, count in enumerate(counts):
        masks[i, order[:count]] = 0.0
    values = evaluate_masks(model, scorer, masks.view(-1, f.n_layers, f.n_heads), progress=progress,
                            desc=f"pruning ({ordering})", per_example=per_example)  # [points] or [points, n_examples]
    means = values.mean(1) if per_example else values
    curve = pd.DataFrame([
        _row(ordering, False, seed, count, n, float(means[i]),
             [divmod(j, f.n_heads) for j in order[(counts[i - 1] if i else 0):count]])
        for i, count in enumerate(counts)
    ])
    return curve, (values if per_example else None)


def _row(ordering, recompute, seed, count, n, metric, heads) -> dict:
    return {
        "ordering": ordering, "recompute": recompute, "seed": seed, "n_pruned": count,
        "fraction_pruned": count / n, "metric": metric, "pruned": " ".join(head_label(l, h) for l, h in heads),
    }


def pruning_curves(
    model, scorer: Scorer, config: PruningConfig = PruningConfig(), *,
    importance: dict[str, torch.Tensor] | None = None, seed: int = 0, progress: bool = False,
    per_example: bool = False,
) -> pd.DataFrame | tuple[pd.DataFrame, pd.DataFrame]:
    """Every requested ordering x recompute (random: n_random seeds from `seed`), concatenated.
    `importance` maps "gradient"/"ablation" to precomputed unpruned importance [L, H].
    per_example=True -> (curves with ci_low / ci_high, the long table of each example's metric:
    ordering, recompute, seed, n_pruned, example, metric, which prunable_intervals bootstraps).
    ci_low / ci_high: the point's metric +- the Student-t 95% half-width of its change from the
    unpruned model, paired over examples (the sd of metric_i(point) - metric_i(unpruned)): what
    the 1% floor is judged on, so the band reads against the floor line (0 wide when unpruned)."""
    importance = importance or {}
    runs = []
    for ordering in config.orderings:
        if ordering == "random":
            runs += [dict(ordering="random", recompute=False, seed=seed + s) for s in range(config.n_random)]
        else:
            runs += [dict(ordering=ordering, recompute=r, importance=importance.get(ordering), seed=seed)
                     for r in config.recompute]
    done = [_pruning_curve(model, scorer, config=config, progress=progress, per_example=per_example,
                           **{"importance": None, **run}) for run in runs]
    curves = pd.concat([c for c, _ in done], ignore_index=True)
    if not per_example:
        return curves
    long = []
    for curve, values in done:  # values [points, n_examples]
        keys = curve[["ordering", "recompute", "seed", "n_pruned"]]
        block = keys.loc[keys.index.repeat(values.shape[1])].reset_index(drop=True)
        long.append(block.assign(example=list(range(values.shape[1])) * values.shape[0],
                                 metric=values.flatten().numpy()))
    sd = torch.cat([(v - v[:1]).std(1) if v.shape[1] > 1 else torch.full((v.shape[0],), float("nan"), dtype=v.dtype)
                    for _, v in done]).numpy()  # [all points] sample sd of the paired change from unpruned
    n_ex = done[0][1].shape[1]
    half = t_half_width(sd, n_ex)  # [all points], NaN for one example
    curves["ci_low"], curves["ci_high"] = curves["metric"] - half, curves["metric"] + half
    return curves, pd.concat(long, ignore_index=True)


def curve_key(ordering: str, recompute: bool) -> str:
    return f"{ordering}_recompute" if recompute else ordering


def tolerance_scale(unpruned: Any, chance: float | None = None) -> Any:
    """What the tolerance is a share of: max(|unpruned|, |unpruned - chance|), |unpruned| without a chance value
    (a float, or an array of unpruned values)."""
    size = np.abs(unpruned)
    return size if chance is None else np.maximum(size, np.abs(np.asarray(unpruned) - chance))


def tolerance_band(unpruned: float, tolerance: float = 0.01, chance: float | None = None) -> float:
    """The drop, in the metric's units, a pruned point may fall below unpruned and still count (module doc)."""
    return float(tolerance * tolerance_scale(float(unpruned), chance))


def tolerance_record(unpruned: float, tolerance: float = 0.01, chance: float | None = None,
                     vocab: int | None = None) -> dict[str, Any]:
    """summary["pruning_tolerance"]: {tolerance (the share), basis ("span": |unpruned - chance|, or "unpruned":
    |unpruned|), chance (None where the metric has none here), unpruned, band (tolerance_band, metric units)};
    with `vocab` (V, the model's vocabulary size) and a chance value, also vocab and answer_tokens (k, the answers'
    mean token count: chance = k log(1/V), importance.span_chance), so the finding can say how chance is computed."""
    span = chance is not None and abs(unpruned - chance) > abs(unpruned)
    out = {"tolerance": tolerance, "basis": "span" if span else "unpruned", "chance": chance,
           "unpruned": float(unpruned), "band": tolerance_band(unpruned, tolerance, chance)}
    if chance is not None and vocab is not None and vocab > 1:
        out.update(vocab=int(vocab), answer_tokens=round(-float(chance) / math.log(vocab), 6))
    return out


def max_prunable_fraction(curve: pd.DataFrame, baseline: float, tolerance: float = 0.01,
                          chance: float | None = None) -> float:
    """Largest fraction f such that every point of the curve up to f keeps
    metric >= baseline - tolerance_band(baseline, tolerance, chance)."""
    floor = baseline - tolerance_band(baseline, tolerance, chance)
    best = 0.0
    for frac, metric in curve.sort_values("fraction_pruned")[["fraction_pruned", "metric"]].itertuples(index=False):
        if metric < floor:
            break
        best = float(frac)
    return best


def prunable_summary(curves: pd.DataFrame, baseline: float, n_heads: int, tolerance: float = 0.01,
                     chance: float | None = None) -> dict[str, float]:
    """Per ordering (random: mean over seeds): max_fraction_prunable_<key> and heads_prunable_<key>."""
    out: dict[str, float] = {}
    for (ordering, recompute), group in curves.groupby(["ordering", "recompute"], sort=False):
        fracs = [max_prunable_fraction(g, baseline, tolerance, chance) for _, g in group.groupby("seed")]
        frac = sum(fracs) / len(fracs)
        key = curve_key(ordering, bool(recompute))
        out[f"max_fraction_prunable_{key}"] = round(frac, 6)
        out[f"heads_prunable_{key}"] = round(frac * n_heads, 3)
    return out


def curve_shapes(curves: pd.DataFrame, tolerance: float = 0.01, chance: float | None = None) -> dict[str, dict]:
    """What max_prunable_fraction's first crossing leaves out, per fixed ordering (not random: a band
    over seeds): pruning_shape_<key> = {tolerance, band (tolerance_band: metric units), basis (tolerance_record's),
    first_below, back_within, gain}, only for curves with something to say (a return into the band or a gain beyond
    it). Each part is a point {n_pruned, metric, change, change_rel (change / the tolerance's scale)} of the curve,
    against its own unpruned point:
    - first_below: the first point under the floor, unpruned - band;
    - back_within: when later points are back at or above the floor (the order is not monotone), the
      last of them, with `points` (how many) and `first` (the n_pruned of the earliest);
    - gain: the highest point above unpruned + band (pruning helps beyond the band),
      with `heads` (every head removed up to it) and, where the curve has ci_low / ci_high, `ci`
      [low, high] of its change (the paired 95% t-interval over examples) and `clear_of`, what that
      interval clears (chance.clear_of: "band" only where its lower bound is above the band, "zero"
      where it clears only 0, None where it reaches 0)."""
    out: dict[str, dict] = {}
    for (ordering, recompute), group in curves.groupby(["ordering", "recompute"], sort=False):
        if ordering == "random" or group["seed"].nunique() != 1:
            continue
        shape = _shape(group.sort_values("n_pruned").reset_index(drop=True), tolerance, chance)
        if "back_within" in shape or "gain" in shape:
            out[f"pruning_shape_{curve_key(ordering, bool(recompute))}"] = shape
    return out


def _point(g: pd.DataFrame, i: int, base: float, scale: float) -> dict:
    m = float(g["metric"].iloc[i])
    return {"n_pruned": int(g["n_pruned"].iloc[i]), "metric": m, "change": m - base,
            "change_rel": (m - base) / scale if scale else float("nan")}


def _shape(g: pd.DataFrame, tolerance: float, chance: float | None = None) -> dict:
    """curve_shapes for one curve `g` (rows in pruning order, row 0 unpruned)."""
    base = float(g["metric"].iloc[0])
    record = tolerance_record(base, tolerance, chance)
    band = record["band"]
    scale = float(tolerance_scale(base, chance))
    metric = g["metric"].to_numpy(dtype=float)
    shape: dict = {"tolerance": tolerance, "band": band, "basis": record["basis"]}
    below = np.flatnonzero(metric < base - band)
    if len(below):
        shape["first_below"] = _point(g, below[0], base, scale)
        back = [i for i in range(below[0] + 1, len(g)) if metric[i] >= base - band]
        if back:
            shape["back_within"] = {**_point(g, back[-1], base, scale), "points": len(back),
                                    "first": int(g["n_pruned"].iloc[back[0]])}
    above = [i for i in range(1, len(g)) if metric[i] > base + band]
    if above:
        best = max(above, key=lambda i: metric[i])
        gain = _point(g, best, base, scale)
        gain["heads"] = " ".join(p for p in g["pruned"].iloc[: best + 1] if p).split()
        if {"ci_low", "ci_high"} <= set(g.columns):
            gain["ci"] = [float(g["ci_low"].iloc[best]) - base, float(g["ci_high"].iloc[best]) - base]
            gain["clear_of"] = clear_of(*gain["ci"], band)  # "band": more than the tolerance above unpruned
        shape["gain"] = gain
    return shape


N_BOOT = 1000  # bootstrap resamples of the examples behind each prunable count
BOOT_METHOD = ("percentile bootstrap over examples (the pruning order fixed as computed on all examples; "
               "each resample re-scores the curve and its own unpruned baseline)")


def prunable_intervals(examples: pd.DataFrame, n_heads: int, tolerance: float = 0.01, *, n_boot: int = N_BOOT,
                       seed: int = 0, level: float = 0.95, chance: float | None = None) -> dict[str, dict]:
    """How sure the heads-prunable counts are: per ordering, prunable_ci_<key> = {heads, fraction,
    interval_heads [low, high], level, n_examples, n_boot, method}.

    A bootstrap over examples: each resample draws n examples with replacement (rng seeded with
    `seed`; the same draws for every curve, so orderings stay paired), takes each point's mean
    metric over the draw and that curve's own unpruned mean as the baseline, and counts the heads
    removed at the last point before the curve first falls below baseline - tolerance_band(baseline, tolerance,
    chance) (max_prunable_fraction's rule, the band's scale taken at the resample's own baseline). The interval
    is the (1 - level) / 2 and (1 + level) / 2 quantiles of those counts (numpy's "lower" and "higher": whole
    heads, never narrower than the draws). The order stays the one computed on all examples: the interval is the uncertainty of
    the metric along that order, not of the order itself (a new task sample also re-ranks the
    heads, so seeds can differ by more). Random orderings: the mean over seeds in each resample, which
    leaves out the spread between seeds, so their record also has each seed's own count (per_seed_heads,
    seeds) and the finding states those instead. Fixed orderings carry `line` (line_record): whether
    the count sits on its tolerance line. `heads` is the count on all examples (the mean over seeds for random).
    examples: the long table of pruning_curves(per_example=True)."""
    key_cols = ["ordering", "recompute", "seed"]
    n = int(examples["example"].max()) + 1
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n, size=(n_boot, n))  # [n_boot, n] example indices
    weights = np.zeros((n_boot, n))
    np.add.at(weights, (np.arange(n_boot)[:, None], draws), 1.0)  # [n_boot, n] times each example is drawn
    counts: dict[tuple[str, bool], list[np.ndarray]] = {}
    points: dict[tuple[str, bool], list[float]] = {}
    lines: dict[tuple[str, bool], dict[str, Any]] = {}  # fixed orders: the point nearest its line (line_record)
    seeds: dict[tuple[str, bool], list[int]] = {}
    for (ordering, recompute, _), group in examples.groupby(key_cols, sort=False):
        wide = group.pivot(index="n_pruned", columns="example", values="metric").sort_index()  # [points, n]
        pruned = wide.index.to_numpy()
        values = wide.to_numpy(dtype=np.float64)
        key = (ordering, bool(recompute))
        counts.setdefault(key, []).append(_prunable_heads(values @ weights.T / n, pruned, tolerance, chance))  # [n_boot]
        points.setdefault(key, []).append(float(_prunable_heads(values.mean(1, keepdims=True), pruned, tolerance,
                                                                chance)[0]))
        if ordering != "random":
            lines[key] = line_record(values, pruned, tolerance, chance)
        seeds.setdefault(key, []).append(int(group["seed"].iloc[0]))
    tail = (1.0 - level) / 2
    out = {}
    for (ordering, recompute), per_seed in counts.items():
        heads = np.mean(per_seed, axis=0)  # [n_boot] mean over seeds (one seed: itself)
        point = float(np.mean(points[(ordering, recompute)]))
        record = {
            "heads": round(point, 3), "fraction": round(point / n_heads, 6),
            "interval_heads": [float(np.quantile(heads, tail, method="lower")),
                               float(np.quantile(heads, 1.0 - tail, method="higher"))],
            "level": level, "n_examples": n, "n_boot": n_boot, "method": BOOT_METHOD,
        }
        if ordering == "random":  # each seed's own count: the seed spread the bootstrap of their mean leaves out
            record["per_seed_heads"] = points[(ordering, recompute)]
            record["seeds"] = seeds[(ordering, recompute)]
        else:
            record["line"] = lines[(ordering, recompute)]
        out[f"prunable_ci_{curve_key(ordering, recompute)}"] = record
    return out


def line_record(values: np.ndarray, pruned: np.ndarray, tolerance: float, chance: float | None = None) -> dict[str, Any]:
    """How close the count of one fixed-order curve comes to turning on its tolerance line. values
    [points, n] each example's metric (row 0 unpruned), pruned [points] heads removed. The line is
    tolerance_band(unpruned, tolerance, chance) below the unpruned mean of the same examples, so a new sample of
    examples moves a point and its line together: only a point's change from unpruned, paired over examples, says whether
    it could fall on the other side (review 10b A3: a point's own spread over examples, its level's
    standard error, is no measure of that). Among the points that decide the count (every pruned point
    kept before the first crossing, and that first point past the line) the one whose paired 95% t
    interval of the change comes nearest the line, relative to its half-width: {n_pruned, past (it is the
    crossing), metric, line, tolerance, change (metric - unpruned), change_low, change_high (the paired 95%
    t interval of the change over examples), half_width, distance_rel (metric - line, as a fraction of the
    tolerance's scale, tolerance_scale), margin_rel (half_width as that fraction), band, basis, n_examples,
    on_the_line (the interval reaches the line: |distance| < half_width, so another sample of examples could
    move the count)}; {} for a curve of one point."""
    means = values.mean(1)  # [points]
    base = float(means[0])
    scale = float(tolerance_scale(base, chance)) or 1.0
    record = tolerance_record(base, tolerance, chance)
    line = base - record["band"]
    n = values.shape[1]
    below = np.flatnonzero(means < line)
    first = int(below[0]) if len(below) else len(means)
    candidates = list(range(1, min(first + 1, len(means))))
    if not candidates:
        return {}
    best = None
    for i in candidates:
        change = float(means[i]) - base
        half = float(t_half_width(float((values[i] - values[0]).std(ddof=1)), n)) if n > 1 else float("nan")
        distance = float(means[i]) - line  # = change + band
        rank = abs(distance) / half if n > 1 and half > 0 else float("inf")
        if best is None or rank < best[0]:
            best = (rank, {"n_pruned": int(pruned[i]), "past": i == first, "metric": float(means[i]), "line": line,
                           "tolerance": tolerance, "change": change, "change_low": change - half,
                           "change_high": change + half, "half_width": half, "distance_rel": distance / scale,
                           "margin_rel": half / scale, "band": record["band"], "basis": record["basis"],
                           "n_examples": n,
                           "on_the_line": bool(n > 1 and abs(distance) < half)})
    return best[1]


def _prunable_heads(means: np.ndarray, pruned: np.ndarray, tolerance: float, chance: float | None = None) -> np.ndarray:
    """means [points, m] (row 0 unpruned, points in pruning order), pruned [points] heads removed ->
    [m] heads removed at the last point before the first one under row 0 - the tolerance band at row 0."""
    floor = means[0] - tolerance * tolerance_scale(means[0], chance)  # [m]
    below = means < floor  # [points, m]
    first = np.where(below.any(0), below.argmax(0), len(pruned))  # [m] first point under the floor
    return pruned[np.maximum(first - 1, 0)].astype(np.float64)


def best_head_per_layer(model, scorer: Scorer, importance: torch.Tensor, *, baseline: float | None = None,
                        progress: bool = False) -> pd.DataFrame:
    """Michel et al. Tables 2-3: in one layer at a time keep only one head (others zeroed).

    Per layer: the most important head by `importance` and its metric; the oracle best single
    head (every head tried, all in stacked passes) and its metric; the worst single head kept alone
    (worst_head, worst_change, worst_change_se: how much keeping any one head alone can cost); and the
    metric with the whole layer's attention removed. Changes are relative to the unpruned baseline; each has its standard
    error over examples (<change>_se: the sd of each example's change from its own unpruned metric
    / sqrt(n), from the same passes; NaN for one example) and n_examples, for the figure's error bars.
    """
    f = model.facts
    n_layers, n_heads = f.n_layers, f.n_heads
    masks = torch.ones(n_layers * n_heads + n_layers + 1, n_layers, n_heads)  # last: unpruned
    for l in range(n_layers):
        for h in range(n_heads):
            masks[l * n_heads + h, l] = 0.0
            masks[l * n_heads + h, l, h] = 1.0
        masks[n_layers * n_heads + l, l] = 0.0
    each = evaluate_masks(model, scorer, masks, progress=progress, desc="best head per layer",
                          per_example=True)  # [masks, n_examples]
    values = each.mean(1)  # [masks]
    n_ex = each.shape[1]
    se = ((each - each[-1:]).std(1) / n_ex ** 0.5 if n_ex > 1 else torch.full_like(values, float("nan")))  # [masks]
    base = float(values[-1]) if baseline is None else baseline
    single = values[: n_layers * n_heads].view(n_layers, n_heads)  # [L, H] metric keeping only that head
    rows = []
    for l in range(n_layers):
        top = int(importance[l].argmax())
        oracle, worst = int(single[l].argmax()), int(single[l].argmin())
        rows.append({
            "layer": l, "head": top, "metric": float(single[l, top]), "change": float(single[l, top]) - base,
            "oracle_head": oracle, "oracle_metric": float(single[l, oracle]),
            "oracle_change": float(single[l, oracle]) - base,
            "layer_removed_metric": float(values[n_layers * n_heads + l]),
            "layer_removed_change": float(values[n_layers * n_heads + l]) - base,
            "change_se": float(se[l * n_heads + top]), "oracle_change_se": float(se[l * n_heads + oracle]),
            "layer_removed_change_se": float(se[n_layers * n_heads + l]), "n_examples": n_ex,
            "worst_head": worst, "worst_change": float(single[l, worst]) - base,
            "worst_change_se": float(se[l * n_heads + worst]),
        })
    return pd.DataFrame(rows)


SMALL_SHARE = 0.1  # a head's own effect under this share of its layer's joint removal: small beside it


def layer_redundancy(best: pd.DataFrame, ablation: torch.Tensor | None, baseline: float) -> list[dict]:
    """The layers whose heads are redundant (review 9b A2: any one of four layer-0 heads was enough while removing
    all four cost the whole metric): removing the whole layer costs at least SMALL_SHARE of |baseline| with its 95%
    t interval (from change_se over n_examples) clear of 0, while every head's own zero/mean/resample ablation
    (`ablation` [L, H], metric units) and keeping any one head alone (worst_change) each move the metric by under
    SMALL_SHARE of that cost. [] without an ablation importance (the gradient's units are not the metric's)."""
    if ablation is None or best is None or not {"layer_removed_change", "worst_change"} <= set(best.columns):
        return []
    out = []
    for row in best.itertuples():
        joint, n = float(row.layer_removed_change), int(row.n_examples)
        se = float(row.layer_removed_change_se)
        ci = se_interval(joint, se, n)  # se = sd / sqrt(n)
        if not (ci is not None and (ci[0] > 0 or ci[1] < 0) and abs(joint) >= SMALL_SHARE * abs(baseline)):
            continue
        own = ablation[int(row.layer)].double().abs()  # [H]
        if float(own.max()) >= SMALL_SHARE * abs(joint) or abs(float(row.worst_change)) >= SMALL_SHARE * abs(joint):
            continue
        out.append({"layer": int(row.layer), "n_heads": int(own.numel()), "layer_removed_change": joint,
                    "layer_removed_change_se": se, "n_examples": n, "max_ablation_head": int(own.argmax()),
                    "max_ablation": float(ablation[int(row.layer)].flatten()[int(own.argmax())]),
                    "worst_head": int(row.worst_head), "worst_change": float(row.worst_change),
                    "worst_change_se": float(row.worst_change_se)})
    return out
