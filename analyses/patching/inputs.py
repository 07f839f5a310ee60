"""Inputs shared by the patching analyses: the clean/corrupted pair, its padding, the metric,
token labels, and per-cell means over the rows where a cell is real.

Every check here fails with a message that names the problem and the fix: corrupted prompts
missing or of another length, answers missing, an unknown metric or direction.

Padded tasks (prompts of mixed lengths, left-padded; each clean/corrupted pair shares one
padding): every run goes under the task's attention_mask and every metric reads each row's own
last position. A position-swept cell that is padding in a row has no meaning there: its per-row
value is NaN and the cell's mean covers the rows where it is real (`cell_means`), normalised
with those rows' clean and corrupted means, so it equals the same analysis of those rows alone.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from headscope.analyses.core import metrics as M
from headscope.analyses.core.chance import mean_intervals, t_half_width
from headscope.analyses.core.metrics import Metric
from headscope.analyses.core.tasks import Task
from headscope.analyses.patching.engine import padding_mask
from headscope.errors import ShapeMismatchError, TaskError

METRICS = ("logit_diff", "normalized_logit_diff", "logprob", "prob", "task")
DIRECTIONS = ("denoise", "noise")


@dataclass(frozen=True, kw_only=True)
class PatchMetric(Metric):
    """The patching Metric: `normalized` asks for (m - m_corrupt) / (m_clean - m_corrupt) of means;
    `stacked`: fn also takes k stacked copies of the batch ([k * batch, ...] -> [k * batch])."""

    normalized: bool = False
    stacked: bool = False

    def finish(self, mean_value, clean: float, corrupt: float):
        """The reported number: the mean metric, normalised if asked for."""
        return M.normalized(mean_value, clean, corrupt) if self.normalized else mean_value


def _tiled(ids: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Answer ids [batch] (or continuations [batch, k]) repeated to match an output of stacked copies of the batch."""
    return ids.to(out.device).repeat(out.shape[0] // ids.shape[0], *([1] * (ids.ndim - 1)))


def _need_answers(task: Task, what: str) -> torch.Tensor:
    if task.answers is None:
        raise TaskError(
            f"Task {task.name!r} has no answers, but the {what} metric reads the answer's logit; "
            "build the Task with answers= (one token id per prompt) or pass a callable metric."
        )
    return task.answer_tokens  # [batch], or [batch, k] for answers of several tokens


def resolve_metric(task: Task, metric: str | Metric | None) -> PatchMetric:
    """The metric by name (see METRICS), a callable (output -> [batch]), or None for the default.

    Default: logit difference when the task has wrong answers, else answer log-probability.
    """
    if metric is None:
        metric = "logit_diff" if task.wrong_answers is not None else "logprob"
    if isinstance(metric, PatchMetric):
        return metric
    if isinstance(metric, Metric):  # the one Metric type: its name and last-position promise are kept
        return PatchMetric(name=metric.name, fn=metric.fn, last_position=metric.last_position)
    if callable(metric):
        return PatchMetric(name=getattr(metric, "__name__", "custom"), fn=metric)
    if metric not in METRICS:
        raise TaskError(f"Unknown patching metric {metric!r}; use one of {METRICS} or a callable output -> [batch].")
    if metric == "task":
        return PatchMetric(name=task.metric, fn=M.task_metric(task),
                           last_position=task.metric != "cosine" and task.continuation is None)
    answers = _need_answers(task, metric)
    if metric in ("logprob", "prob"):
        def logprob(out: torch.Tensor) -> torch.Tensor:
            lp = M.answer_logprob(out, _tiled(answers, out))  # [batch]
            return lp if metric == "logprob" else lp.exp()

        return PatchMetric(name=metric, fn=logprob, stacked=True, last_position=task.continuation is None)
    if task.continuation is not None:
        raise TaskError(
            f"Task {task.name!r} has answers of several tokens, which the {metric} metric cannot compare "
            "(it reads one next-token logit); use metric='logprob' (the whole continuation's log-probability)."
        )
    if task.wrong_answers is None:
        raise TaskError(
            f"Task {task.name!r} has no wrong_answers, which the {metric} metric needs; "
            "add wrong_answers= or use metric='logprob'."
        )
    wrong = task.wrong_answers
    return PatchMetric(
        name=metric,
        fn=lambda out: M.logit_diff(out, _tiled(answers, out), _tiled(wrong, out)),
        normalized=metric == "normalized_logit_diff",
        stacked=True,
        last_position=True,
    )


def check_direction(direction: str) -> str:
    if direction not in DIRECTIONS:
        raise TaskError(
            f"Unknown direction {direction!r}: use 'denoise' (corrupted run, restore clean activations) "
            "or 'noise' (clean run, insert corrupted activations)."
        )
    return direction


def paired_rows(task: Task, corrupted_tokens: torch.Tensor | None, what: str) -> tuple[Task, dict]:
    """(the rows of `task` with a clean/corrupted pair, the summary's record of the rows left out):
    a user's corrupted prompt of another token length than its prompt is no pair (Task.paired), so
    the patching analyses leave its row out (a TaskError when no row is left)."""
    if corrupted_tokens is not None or task.paired is None:
        return task, {}
    kept, left_out = task.pairs(what)
    return kept, {"pairs_left_out": left_out, "pairs_left_out_rows": task.unpaired_rows}


def clean_and_corrupted(model, task: Task, corrupted_tokens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The checked (clean, corrupted) token pair, each [batch, pos], on the model's device."""
    if corrupted_tokens is None and task.unpaired:
        raise TaskError(f"Task {task.name!r}: rows {task.unpaired} have no corrupted pair; patch `task.pairs()[0]`.")
    if model.facts.is_encoder:
        raise TaskError(
            f"{model.facts.name} is an encoder; activation patching here measures next-token answers "
            "and needs a decoder (e.g. zoo/synth-llama)."
        )
    corrupted = task.corrupted_tokens if corrupted_tokens is None else corrupted_tokens
    if corrupted is None:
        raise TaskError(
            f"Task {task.name!r} has no corrupted_tokens; patching moves activations between a clean and "
            "a corrupted run, so build the Task with corrupted_tokens= of the same shape."
        )
    if corrupted.shape != task.tokens.shape:
        raise ShapeMismatchError(
            f"clean tokens {tuple(task.tokens.shape)} and corrupted tokens {tuple(corrupted.shape)} differ "
            "in shape; patching needs aligned positions, so pad or trim them to the same length."
        )
    return model.check_tokens(task.tokens), model.check_tokens(corrupted)


def task_padding(task: Task, tokens: torch.Tensor) -> torch.Tensor | None:
    """The task's attention_mask [batch, pos] on tokens' device, or None without padding (TaskError
    unless left-padded: each row's metric reads its last position)."""
    return padding_mask(task.attention_mask, tokens)


def mask_padding(values: torch.Tensor, positions, mask: torch.Tensor | None) -> torch.Tensor:
    """values [cell, batch] with NaN where cell i's position (positions[i]; None: every position)
    is padding in that row: the cell has no meaning there (see the module docstring)."""
    if mask is None:
        return values
    pos = torch.tensor([-1 if p is None else p for p in positions], dtype=torch.long)  # [cell]
    real = mask.bool().cpu().T[pos] | (pos < 0)[:, None]  # [cell, batch]
    return values.masked_fill(~real, float("nan"))


def cell_means(pm: PatchMetric, values: torch.Tensor, base: torch.Tensor, clean: torch.Tensor,
               corrupt: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per cell (values [cell, batch], NaN where the cell is padding in a row), each mean over the
    rows where the cell is real (every row without padding): {"value": pm.finish(mean values, mean
    clean, mean corrupt), "base": pm.finish(mean base, ...), the unpatched run over those same rows,
    "effect": value - base, "n_rows": how many rows}. base: per-row [batch] or per cell [cell, batch]; clean,
    corrupt: per-row [batch].
    Values [cell] in float64 (n_rows int64). Where a position is padding in some rows, `base` is not
    the summary's baseline (a mean over every row), so value - baseline is not the effect there."""
    real = ~torch.isnan(values)  # [cell, batch]
    n_rows = real.sum(1)  # [cell]
    weight = real.double() / n_rows[:, None].clamp_min(1)  # [cell, batch]

    def mean(x: torch.Tensor) -> torch.Tensor:  # [cell]: (masked) mean over rows
        return (torch.nan_to_num(x.double()).expand_as(weight) * weight).sum(1)

    clean_mean, corrupt_mean = mean(clean), mean(corrupt)
    value = pm.finish(mean(values), clean_mean, corrupt_mean)
    unpatched = pm.finish(mean(base), clean_mean, corrupt_mean)
    return {"value": value, "base": unpatched, "effect": value - unpatched, "n_rows": n_rows}


def token_labels(model, tokens: torch.Tensor, mask: torch.Tensor | None = None) -> list[str]:
    """Position labels "i: token" (raw strings; escape them for HTML): the token every prompt has at
    padded position i (among the prompts where i is a real token), else "" (prompts differ there, e.g.
    mixed lengths under left padding, or different names): a table's token is never one prompt's
    standing in for others. position_from_end (every left-padded prompt's same place) locates a cell."""
    real = torch.ones_like(tokens, dtype=torch.bool) if mask is None else mask.bool().to(tokens.device)
    first = tokens.gather(0, real.int().argmax(0, keepdim=True))[0]  # [pos]: a row's token where i is real
    same = (((tokens == first) | ~real).all(0) & real.any(0)).tolist()  # [pos]: every real row agrees
    strings = model.to_str_tokens(first)
    return [f"{i}: {tok}" if ok else "" for i, (tok, ok) in enumerate(zip(strings, same))]


def token_notes(clean: torch.Tensor, corrupted: torch.Tensor, mask: torch.Tensor | None = None) -> list[str]:
    """Per padded position (clean, corrupted [batch, pos]; mask [batch, pos] or None) what its token label cannot say
    (review 14b C5: exact.csv's token was blank at -4, the swapped word carrying the whole effect, without why):
    "varies across the k prompts that reach it" where their clean tokens differ (token_labels leaves it blank),
    "clean and corrupted differ here in j of k" where a prompt's corrupted token differs, both joined by "; ";
    "padding in every prompt" where no prompt reaches it; "" where the label says it all."""
    real = torch.ones_like(clean, dtype=torch.bool) if mask is None else mask.bool().to(clean.device)
    first = clean.gather(0, real.int().argmax(0, keepdim=True))[0]  # [pos]
    same = ((clean == first) | ~real).all(0).tolist()  # [pos]
    reach = real.sum(0).tolist()  # [pos]: prompts with a real token there
    swapped = ((clean != corrupted.to(clean.device)) & real).sum(0).tolist()  # [pos]
    notes = []
    for k, agree, j in zip(reach, same, swapped):
        bits = ([] if agree else [f"varies across the {k} prompts that reach it"]) + (
            [f"clean and corrupted differ here in {j} of {k}"] if j else [])
        notes.append("; ".join(bits) if k else "padding in every prompt")
    return notes


def position_from_end(n_pos: int, positions) -> list[int | None]:
    """Each padded position counted from the end (-1: every prompt's last token, where the answer is
    read; under left padding the same place in every prompt); None stays None (every position)."""
    return [None if p is None else int(p) - n_pos for p in positions]


EFFECT_CI_METHOD = ("95% Student-t interval of the mean per-example effect (patched minus unpatched metric of each "
                    "row where the cell is real) over those n rows; a share of the clean-corrupted gap (a normalised "
                    "metric's effect, and share_ci beside a raw one) is a ratio of means, sum of effects over sum of "
                    "gaps: its interval is the delta method's with their covariance (t quantile, n - 1 df), so a cell "
                    "that restores the same share of every prompt's gap has a zero-width one")


def _rows(base: torch.Tensor) -> np.ndarray:
    """The unpatched metric as float64 [1 or cell, batch]: one run for every cell [batch], or each cell's own
    [cell, batch] (exact patching's null run of the cell's layer, review 19c B1)."""
    b = base.double().cpu().numpy()
    return b if b.ndim == 2 else b[None]


def effect_intervals(pm: PatchMetric, values: torch.Tensor, base: torch.Tensor, clean: torch.Tensor,
                     corrupt: torch.Tensor, level: float = 0.95) -> dict[str, np.ndarray]:
    """Per cell (values [cell, batch], NaN where padding; base [batch] or [cell, batch]; clean, corrupt [batch]) the Student-t
    interval of the mean per-example effect values - base over the rows where the cell is real: its
    mean equals cell_means' effect. A normalised metric's effect is a ratio of means, (mean v - mean
    base) / (mean clean - mean corrupt) over those rows: its interval is share_intervals' (review 16c B5:
    dividing by the mean gap as if fixed made the interval track how the prompts' gaps differ).
    Returns {"low", "high"} float64 [cell] (NaN under two rows) and "n" int64 [cell]."""
    v = values.double().cpu().numpy()  # [cell, batch]
    real = ~np.isnan(v)  # NaN marks padding; an infinite effect is kept (its interval is not finite)
    if pm.normalized:
        out = share_intervals(values, base, clean, corrupt, whole_gap=False, level=level)
        return {"low": out["low"], "high": out["high"], "n": real.sum(1).astype(np.int64)}
    out = mean_intervals(v - _rows(base), where=real, alpha=1 - level)
    return {"low": out["low"], "high": out["high"], "n": out["n"]}


def share_intervals(values: torch.Tensor, base: torch.Tensor, clean: torch.Tensor, corrupt: torch.Tensor, *,
                    whole_gap: bool, level: float = 0.95) -> dict[str, np.ndarray]:
    """Per cell (values [cell, batch], NaN where padding; base, clean, corrupt [batch]) the 95% interval of its share
    of the gap R = a / b, a = mean of e = values - base over the rows S where the cell is real, b = mean of the gap
    g = clean - corrupt over S (whole_gap False: a normalised metric, cell_means) or over every row (whole_gap True:
    a raw metric's share_of_gap divides by the run's gap). Delta method with the covariance of a and b:
    Var R = (Var a - 2 R Cov(a, b) + R^2 Var b) / b^2, Var a = s_e^2 / n_S, Var b = s_g^2 / n_b, Cov = s_eg / n_b
    (sample moments over S, s_g over b's rows); where b's rows are S this is the sample variance of e - R g over n_S.
    R +- t(n_S - 1) * sqrt(Var R). Returns {"share", "low", "high"} float64 [cell] (low, high NaN under two rows)."""
    v = values.double().cpu().numpy()  # [cell, batch]
    real = ~np.isnan(v)
    e = np.where(real, v - _rows(base), 0.0)  # [cell, batch]
    g_all = clean.double().cpu().numpy() - corrupt.double().cpu().numpy()  # [batch]
    g = np.where(real, g_all[None], 0.0)  # [cell, batch]
    n = real.sum(1)  # [cell]
    count = np.maximum(n, 1)
    a = e.sum(1) / count  # [cell]
    b = np.full(len(v), g_all.mean()) if whole_gap else g.sum(1) / count  # [cell]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = a / b  # [cell]
        dof = np.maximum(n - 1, 1)
        d = np.where(real, e - ratio[:, None] * g, 0.0)  # [cell, batch]: e - R g
        same = (n == real.shape[1]) | (not whole_gap)  # [cell]: b's rows are S
        var_same = (np.where(real, d - d.sum(1, keepdims=True) / count[:, None], 0.0) ** 2).sum(1) / dof / count
        ce, cg = (np.where(real, x - x.sum(1, keepdims=True) / count[:, None], 0.0) for x in (e, g))
        n_b = real.shape[1]
        var_b = ((g_all - g_all.mean()) ** 2).sum() / max(n_b - 1, 1) / n_b
        var_mixed = (ce ** 2).sum(1) / dof / count - 2 * ratio * (ce * cg).sum(1) / dof / n_b + ratio ** 2 * var_b
        var = np.where(same, var_same, np.maximum(var_mixed, 0.0)) / b ** 2
        half = t_half_width(np.sqrt(var) * np.sqrt(count), n, alpha=1 - level)
    return {"share": ratio, "low": ratio - half, "high": ratio + half}
