"""Iterative head pruning (Michel et al. 2019): the metric as heads are removed, least important first.

A step removes `step` x (all heads) heads, 10% by default. Orderings: "gradient" (gate-gradient
importance, normalised per layer), "ablation" (single-head ablation drop) and "random" (one
random order per seed, giving a band). Without recomputation the order is fixed from the
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
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from tqdm.auto import tqdm

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
    tolerance: relative drop allowed when counting prunable heads; exact_limit: head count above
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
    importance: torch.Tensor | None = None, seed: int = 0, progress: bool = False,
) -> pd.DataFrame:
    """One curve: columns ordering, recompute, seed, n_pruned, fraction_pruned, metric, pruned
    (heads removed at that step, "L0H3 L1H2"). `importance` [L, H] skips the first computation
    of a curve without recomputation. seed: the random ordering's draw and resample ablation's partners."""
    f = model.facts
    n = f.n_layers * f.n_heads
    counts = prune_counts(n, config.step)
    if ordering == "random":
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
        return _fixed_curve(model, scorer, order, counts, "random", seed, progress)
    if not recompute:
        if importance is None:
            importance, _ = importance_for(model, scorer, ordering, config, seed=seed)
        order = torch.argsort(importance.flatten(), stable=True).tolist()  # least important first
        return _fixed_curve(model, scorer, order, counts, ordering, seed, progress)
    mask = torch.ones(f.n_layers, f.n_heads)
    rows, chosen = [], []
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
        mask.view(-1)[chosen] = 0.0
    metric = float(evaluate_masks(model, scorer, mask[None])[0])
    rows.append(_row(ordering, True, seed, counts[-1], n, metric, [divmod(i, f.n_heads) for i in chosen]))
    return pd.DataFrame(rows)


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


def _fixed_curve(model, scorer, order, counts, ordering, seed, progress) -> pd.DataFrame:
    f = model.facts
    n = len(order)
    masks = torch.ones(len(counts), n)  # [points, L * H]
    for i, count in enumerate(counts):
        masks[i, order[:count]] = 0.0
    values = evaluate_masks(model, scorer, masks.view(-1, f.n_layers, f.n_heads), progress=progress,
                            desc=f"pruning ({ordering})")
    return pd.DataFrame([
        _row(ordering, False, seed, count, n, float(values[i]),
             [divmod(j, f.n_heads) for j in order[(counts[i - 1] if i else 0):count]])
        for i, count in enumerate(counts)
    ])


def _row(ordering, recompute, seed, count, n, metric, heads) -> dict:
    return {
        "ordering": ordering, "recompute": recompute, "seed": seed, "n_pruned": count,
        "fraction_pruned": count / n, "metric": metric, "pruned": " ".join(head_label(l, h) for l, h in heads),
    }


def pruning_curves(
    model, scorer: Scorer, config: PruningConfig = PruningConfig(), *,
    importance: dict[str, torch.Tensor] | None = None, seed: int = 0, progress: bool = False,
) -> pd.DataFrame:
    """Every requested ordering x recompute (random: n_random seeds from `seed`), concatenated.
    `importance` maps "gradient"/"ablation" to precomputed unpruned importance [L, H]."""
    importance = importance or {}
    frames = []
    for ordering in config.orderings:
        if ordering == "random":
            frames += [pruning_curve(model, scorer, ordering="random", config=config, seed=seed + s, progress=progress)
                       for s in range(config.n_random)]
            continue
        for recompute in config.recompute:
            frames.append(pruning_curve(model, scorer, ordering=ordering, recompute=recompute, config=config,
                                        importance=importance.get(ordering), seed=seed, progress=progress))
    return pd.concat(frames, ignore_index=True)


def curve_key(ordering: str, recompute: bool) -> str:
    return f"{ordering}_recompute" if recompute else ordering


def max_prunable_fraction(curve: pd.DataFrame, baseline: float, tolerance: float = 0.01) -> float:
    """Largest fraction f such that every point of the curve up to f keeps
    metric >= baseline - tolerance x |baseline| (within 1% relative by default)."""
    floor = baseline - tolerance * abs(baseline)
    best = 0.0
    for frac, metric in curve.sort_values("fraction_pruned")[["fraction_pruned", "metric"]].itertuples(index=False):
        if metric < floor:
            break
        best = float(frac)
    return best


def prunable_summary(curves: pd.DataFrame, baseline: float, n_heads: int, tolerance: float = 0.01) -> dict[str, float]:
    """Per ordering (random: mean over seeds): max_fraction_prunable_<key> and heads_prunable_<key>."""
    out: dict[str, float] = {}
    for (ordering, recompute), group in curves.groupby(["ordering", "recompute"], sort=False):
        fracs = [max_prunable_fraction(g, baseline, tolerance) for _, g in group.groupby("seed")]
        frac = sum(fracs) / len(fracs)
        key = curve_key(ordering, bool(recompute))
        out[f"max_fraction_prunable_{key}"] = round(frac, 6)
        out[f"heads_prunable_{key}"] = round(frac * n_heads, 3)
    return out


def best_head_per_layer(model, scorer: Scorer, importance: torch.Tensor, *, baseline: float | None = None,
                        progress: bool = False) -> pd.DataFrame:
    """Michel et al. Tables 2-3: in one layer at a time keep only one head (others zeroed).

    Per layer: the most important head by `importance` and its metric; the oracle best single
    head (every head tried, all in stacked passes) and its metric; and the metric with the whole
    layer's attention removed. Changes are relative to the unpruned baseline.
    """
    f = model.facts
    n_layers, n_heads = f.n_layers, f.n_heads
    masks = torch.ones(n_layers * n_heads + n_layers + 1, n_layers, n_heads)  # last: unpruned
    for l in range(n_layers):
        for h in range(n_heads):
            masks[l * n_heads + h, l] = 0.0
            masks[l * n_heads + h, l, h] = 1.0
        masks[n_layers * n_heads + l, l] = 0.0
    values = evaluate_masks(model, scorer, masks, progress=progress, desc="best head per layer")
    base = float(values[-1]) if baseline is None else baseline
    single = values[: n_layers * n_heads].view(n_layers, n_heads)  # [L, H] metric keeping only that head
    rows = []
    for l in range(n_layers):
        top = int(importance[l].argmax())
        oracle = int(single[l].argmax())
        rows.append({
            "layer": l, "head": top, "metric": float(single[l, top]), "change": float(single[l, top]) - base,
            "oracle_head": oracle, "oracle_metric": float(single[l, oracle]),
            "oracle_change": float(single[l, oracle]) - base,
            "layer_removed_metric": float(values[n_layers * n_heads + l]),
            "layer_removed_change": float(values[n_layers * n_heads + l]) - base,
        })
    return pd.DataFrame(rows)
