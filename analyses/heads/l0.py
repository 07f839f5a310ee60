"""L0 head pruning (Voita et al. 2019): Hard Concrete gates trained on a frozen model.

Each head gets a stochastic gate g = clip(sigmoid((log u - log(1 - u) + log alpha) / beta)
(r - l) + l, 0, 1), u ~ U(0, 1), applied to its output (z_h -> g_h z_h). Only log alpha is
trained, on loss = L_task + lambda L_C with L_C = sum_h sigmoid(log alpha_h - beta log(-l / r)),
the expected number of open gates. At test time g = clip(sigmoid(log alpha) (r - l) + l, 0, 1);
a head survives when its gate is > 0. A sweep over lambda traces heads kept against metric.

The gates are fitted on a train split and the sweep's metric and change are measured on the held-out examples
(#34 item 2: a mask fitted and scored on the same examples flatters itself); the training examples' change stays
as a secondary, in-sample figure. A task too small to split (under `min_split` examples) is fitted and scored
in-sample, and the table says why.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import torch
from tqdm.auto import tqdm

from headscope.analyses.core.chance import mean_intervals
from headscope.analyses.heads.importance import Scorer, evaluate_masks, run_gated
from headscope.analyses.heads.pruning import head_label, tolerance_band
from headscope.errors import ConfigError
from headscope.execution import batching, distributed
from headscope.execution.batching import rows_per_pass

BETA, LIMIT_L, LIMIT_R = 0.33, -0.1, 1.1  # Voita et al.'s temperature and stretch interval


@dataclass(frozen=True, kw_only=True)
class L0Config:
    """lambdas: penalty weights swept; steps / lr / batch_size: Adam on log alpha; init: initial
    log alpha (3.0 opens every gate fully at test time); holdout: the share of examples held out of training and
    scored (0: fit and score in-sample); min_split: fewer examples than this are too few to split (in-sample)."""

    lambdas: tuple[float, ...] = (0.001, 0.003, 0.01, 0.03, 0.1)
    steps: int = 200
    lr: float = 0.1
    batch_size: int = 32
    init: float = 3.0
    holdout: float = 0.5
    min_split: int = 16

    def __post_init__(self) -> None:
        if not 0.0 <= self.holdout < 1.0:
            raise ConfigError(f"L0 holdout must be a share in [0, 1), got {self.holdout!r}.")
        if self.min_split < 4:
            raise ConfigError(f"L0 min_split must be at least 4 (two examples each side), got {self.min_split!r}.")


SPLIT_SALT = 7919  # the split's generator is seeded apart from the training draws' (seed + SPLIT_SALT)


def split_examples(n: int, config: L0Config, seed: int) -> tuple[torch.Tensor, torch.Tensor | None, str]:
    """(training rows, held-out rows or None, why the fit is in-sample or ""): a random `holdout` share of the n
    examples (at least 2, leaving at least 2 to train on) held out, drawn from the run's seed; None where holdout is 0
    or n < min_split."""
    if config.holdout == 0.0:
        return torch.arange(n), None, "no held-out split asked (holdout 0)"
    if n < config.min_split:
        return torch.arange(n), None, f"only {n} examples, too few to hold some out (at least {config.min_split})"
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + SPLIT_SALT))
    k = min(n - 2, max(2, round(n * config.holdout)))
    return perm[k:].sort().values, perm[:k].sort().values, ""


def sample_gates(log_alpha: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Stochastic Hard Concrete gates for uniform noise u (same shape as, or broadcast with, log alpha)."""
    s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_alpha) / BETA)
    return (s * (LIMIT_R - LIMIT_L) + LIMIT_L).clamp(0.0, 1.0)


def deterministic_gates(log_alpha: torch.Tensor) -> torch.Tensor:
    """Deterministic test-time gates clip(sigmoid(log alpha) (r - l) + l, 0, 1)."""
    return (torch.sigmoid(log_alpha) * (LIMIT_R - LIMIT_L) + LIMIT_L).clamp(0.0, 1.0)


def expected_open(log_alpha: torch.Tensor) -> torch.Tensor:
    """L_C = sum_h P(gate_h != 0) = sum_h sigmoid(log alpha_h - beta log(-l / r))."""
    return torch.sigmoid(log_alpha - BETA * math.log(-LIMIT_L / LIMIT_R)).sum()


def train_gates(model, scorer: Scorer, lam: float, config: L0Config = L0Config(), *, seed: int = 0,
                progress: bool = False, examples: torch.Tensor | None = None) -> torch.Tensor:
    """Train log alpha [L, H] for one lambda on the frozen model; returns it (detached, on CPU)."""
    return train_gate_sweep(model, scorer, (lam,), config, seed=seed, progress=progress, examples=examples)[0]


def train_gate_sweep(model, scorer: Scorer, lambdas: Sequence[float], config: L0Config = L0Config(), *,
                     seed: int = 0, progress: bool = False, examples: torch.Tensor | None = None) -> torch.Tensor:
    """Train log alpha for each lambda on the frozen model: [k, L, H] (detached, on CPU). `examples`: the rows
    of the scorer's task to train on (the train split; None: every row).

    Each step draws a minibatch of examples and one noise sample per example and head from one
    generator seeded with `seed` (the run's), so every lambda sees the same minibatches and noise, as
    separate runs would. The lambdas' copies of the minibatch run stacked along the batch axis
    in one pass (as many as the memory budget allows, halved on out-of-memory): each copy's loss
    depends on its own log alpha only and Adam is elementwise, so this is the separate runs'
    arithmetic, up to the float rounding of larger batched passes. Only the gates receive
    gradients (torch.autograd.grad); the model's weights are never touched. Under
    torch.distributed every rank draws the same minibatch, runs its block of it (every rank with
    the same batch and lambdas per pass, the smallest any rank can hold), and the gradients are
    all-reduced before the (identical) Adam step.
    """
    if not len(lambdas):
        raise ConfigError("L0 training needs at least one lambda; pass e.g. lambdas=(0.01,).")
    pos = scorer.tokens.shape[1]
    examples = torch.arange(scorer.tokens.shape[0]) if examples is None else examples.cpu()  # [n_train]
    n = len(examples)
    batch = min(n, config.batch_size, rows_per_pass(model, pos, logits_cap=True))
    try:
        per_pass = rows_per_pass(model, pos, grad=True, logits_cap=True) if len(lambdas) > 1 else batch
    except batching.MemoryBudgetError:  # the estimate for a backward pass is rough: one lambda at a time
        per_pass = batch
    copies = max(1, min(len(lambdas), per_pass // batch))  # lambdas per pass
    batch, copies = (min(v) for v in zip(*distributed.gather_objects((batch, copies))))  # the same on every rank
    parts = batching.run_chunks(lambda chunk: _train(model, scorer, lambdas[chunk.start:chunk.stop], config, batch,
                                                     seed, progress, examples), len(lambdas), copies)
    return torch.cat([part for _, part in parts])


def _train(model, scorer: Scorer, lambdas: Sequence[float], config: L0Config, batch: int, seed: int,
           progress: bool, examples: torch.Tensor) -> torch.Tensor:
    """train_gate_sweep for lambdas that share each pass, minibatches drawn from `examples` [n_train]. -> [c, L, H]"""
    f, n, c = model.facts, len(examples), len(lambdas)
    gen = torch.Generator().manual_seed(seed)
    log_alpha = torch.full((c, f.n_layers, f.n_heads), float(config.init), device=model.device, requires_grad=True)
    opt = torch.optim.Adam([log_alpha], lr=config.lr)
    label = ", ".join(f"{lam:g}" for lam in lambdas)
    with torch.enable_grad():
        for _ in tqdm(range(config.steps), desc=f"L0 gates (lambda={label})",
                      disable=not (progress and distributed.is_main()), leave=False):
            rows = examples[torch.randperm(n, generator=gen)[:batch]].to(model.device)  # [b]
            u = torch.rand((batch, f.n_layers, f.n_heads), generator=gen).clamp(1e-6, 1 - 1e-6).to(model.device)
            part = distributed.shard(batch)  # this rank's rows of the minibatch (all of it single-process)
            mine = rows[part.start:part.stop]  # [b_rank]
            if distributed.is_main():
                loss = sum(lam * expected_open(log_alpha[i]) for i, lam in enumerate(lambdas))
            else:
                loss = log_alpha.sum() * 0.0
            if len(mine):
                gates = sample_gates(log_alpha[:, None], u[None, part.start:part.stop])  # [c, b_rank, L, H]
                stacked = mine.repeat(c)  # [c * b_rank], copy-major
                out = run_gated(model, scorer.tokens[stacked], gates.flatten(0, 1), last_only=scorer.last_position,
                                attention_mask=None if scorer.attention_mask is None else scorer.attention_mask[stacked])
                loss = loss + scorer.objective(out, stacked).sum() / batch
            (grad,) = torch.autograd.grad(loss, [log_alpha])
            log_alpha.grad = distributed.all_reduce_sum(grad)  # every rank takes the same Adam step
            opt.step()
            opt.zero_grad(set_to_none=True)
    return log_alpha.detach().cpu()


def l0_sweep(model, scorer: Scorer, config: L0Config = L0Config(), *, seed: int = 0,
             progress: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Train gates for every lambda on the train split (split_examples); returns (sweep, gates).

    sweep: lambda, heads_kept, fraction_kept, surviving (names, "L0H3 L2H1") and, on the held-out examples (every
    example where the fit is in-sample), unpruned (the unpruned model's mean metric), metric (test-time gates),
    metric_binary (kept heads at 1, the others removed), change (metric_binary - unpruned, paired over the examples)
    with change_ci_low / change_ci_high (its 95% t interval; NaN under 2 examples), gates_change with
    gates_change_ci_low / _high (the same for the test-time gates, metric - unpruned: review 17a C4, the figure's
    bars) and n_examples; split ("held_out"
    or "in_sample"), in_sample_reason ("" when held out), n_train (the examples the gates were fitted on),
    held_out (their row numbers, "3 5 8"; "" in-sample) and change_in_sample with change_in_sample_ci_low / _high
    (the kept heads' change on the training examples: secondary, flattering), unpruned_in_sample and
    metric_binary_in_sample (the training examples' means, on which l0_choice picks the reported lambda). gates:
    lambda, layer, head, log_alpha, gate, kept.
    """
    f = model.facts
    n_all = scorer.tokens.shape[0]
    train, held, reason = split_examples(n_all, config, seed)
    alphas = train_gate_sweep(model, scorer, config.lambdas, config, seed=seed, progress=progress,
                              examples=train)  # [k, L, H]
    soft = deterministic_gates(alphas)  # [k, L, H]
    hard = (soft > 0).float()  # [k, L, H]
    ones = torch.ones(1, f.n_layers, f.n_heads)
    per = evaluate_masks(model, scorer, torch.cat([ones, soft, hard]), desc="L0 evaluation", progress=progress,
                         per_example=True).cpu()  # [1 + 2k, n_examples], the unpruned model first
    scored = per[:, held] if held is not None else per  # [1 + 2k, n_scored]
    fitted = per[:, train]  # [1 + 2k, n_train]
    fitted_means = fitted.mean(1)  # [1 + 2k] the training examples' unpruned and pruned means (l0_choice reads these)
    values = scored[1:].mean(1)  # [2k]
    k, n = len(alphas), scored.shape[1]
    change = mean_intervals((scored[1 + k:] - scored[:1]).numpy())  # [k] each: the kept heads' paired change
    gated = mean_intervals((scored[1:1 + k] - scored[:1]).numpy())  # [k] each: the test-time gates' paired change
    inside = mean_intervals((fitted[1 + k:] - fitted[:1]).numpy())  # [k] the same on the training examples
    shared = {"unpruned": float(scored[0].mean()), "n_examples": n, "split": "in_sample" if held is None else "held_out",
              "in_sample_reason": reason, "n_train": len(train), "unpruned_in_sample": float(fitted_means[0]),
              "held_out": "" if held is None else " ".join(str(int(i)) for i in held)}
    sweep, gates = [], []
    for i, lam in enumerate(config.lambdas):
        kept = [(l, h) for l in range(f.n_layers) for h in range(f.n_heads) if hard[i, l, h] > 0]
        sweep.append({
            "lambda": lam, "heads_kept": len(kept), "fraction_kept": len(kept) / (f.n_layers * f.n_heads),
            "metric": float(values[i]), "metric_binary": float(values[k + i]),
            "metric_binary_in_sample": float(fitted_means[1 + k + i]),
            "change": float(change["mean"][i]), "change_ci_low": float(change["low"][i]),
            "change_ci_high": float(change["high"][i]), "gates_change": float(gated["mean"][i]),
            "gates_change_ci_low": float(gated["low"][i]), "gates_change_ci_high": float(gated["high"][i]), **shared,
            "change_in_sample": float(inside["mean"][i]), "change_in_sample_ci_low": float(inside["low"][i]),
            "change_in_sample_ci_high": float(inside["high"][i]),
            "surviving": " ".join(head_label(l, h) for l, h in kept),
        })
        gates += [
            {"lambda": lam, "layer": l, "head": h, "log_alpha": float(alphas[i][l, h]),
             "gate": float(soft[i, l, h]), "kept": bool(hard[i, l, h] > 0)}
            for l in range(f.n_layers) for h in range(f.n_heads)
        ]
    return pd.DataFrame(sweep), pd.DataFrame(gates)


def l0_choice(sweep: pd.DataFrame, tolerance: float = 0.01, chance: float | None = None) -> dict:
    """The L0 point the finding reports, chosen on the training examples and scored on the held-out ones (choosing
    and scoring on one split flatters the choice): the fewest heads kept whose metric_binary_in_sample stays within
    tolerance_band(unpruned_in_sample, tolerance, chance) below unpruned_in_sample. Returns
    {l0_min_heads_within_tolerance (None where no lambda stays within), l0_within_tolerance: that row's lambda, heads,
    held-out metric, change with its 95% CI and n, in_sample (no split), chosen_on ("training examples", or
    "in_sample" where there is no split), band_in_sample (the band it was chosen against), band and held_out_within
    (its held-out metric within the band below the held-out unpruned), the in-sample change with its CI}; the held-out
    columns (unpruned, metric_binary, change) never decide which row."""
    if not len(sweep):
        return {"l0_min_heads_within_tolerance": None}
    inside = sweep["unpruned_in_sample"].astype(float)
    bands = inside.map(lambda u: tolerance_band(u, tolerance, chance))
    ok = sweep.loc[sweep["metric_binary_in_sample"] >= inside - bands, "heads_kept"]
    if not len(ok):
        return {"l0_min_heads_within_tolerance": None}
    i = ok.idxmin()  # the fewest heads; the first lambda among equal counts
    row = sweep.loc[i]
    band = tolerance_band(float(row["unpruned"]), tolerance, chance)
    held = row["split"] != "in_sample"
    return {"l0_min_heads_within_tolerance": int(row["heads_kept"]), "l0_within_tolerance": {
        "heads": int(row["heads_kept"]), "lambda": float(row["lambda"]), "metric": float(row["metric_binary"]),
        "change": float(row["change"]), "ci": [float(row["change_ci_low"]), float(row["change_ci_high"])],
        "n_examples": int(row["n_examples"]), "in_sample": not held, "in_sample_reason": str(row["in_sample_reason"]),
        "n_train": int(row["n_train"]), "chosen_on": "training examples" if held else "in_sample",
        "band_in_sample": float(bands[i]), "band": band,
        "held_out_within": bool(float(row["metric_binary"]) >= float(row["unpruned"]) - band),
        "in_sample_change": float(row["change_in_sample"]),
        "in_sample_ci": [float(row["change_in_sample_ci_low"]), float(row["change_in_sample_ci_high"])]}}
