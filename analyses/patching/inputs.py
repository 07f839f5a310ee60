"""Inputs shared by the patching analyses: the clean/corrupted pair, the metric, token labels.

Every check here fails with a message that names the problem and the fix: corrupted prompts
missing or of another length, answers missing, an unknown metric or direction.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from headscope.analyses.core import metrics as M
from headscope.analyses.core.metrics import Metric
from headscope.analyses.core.tasks import Task
from headscope.errors import ShapeMismatchError, TaskError

METRICS = ("logit_diff", "normalized_logit_diff", "logprob", "prob", "task")
DIRECTIONS = ("denoise", "noise")


@dataclass(frozen=True, kw_only=True)
class PatchMetric:
    """A per-example metric; `normalized` asks for (m - m_corrupt) / (m_clean - m_corrupt) of means."""

    name: str
    fn: Metric
    normalized: bool = False
    stacked: bool = False  # fn also takes k stacked copies of the batch ([k * batch, ...] -> [k * batch])
    last_position: bool = False  # fn reads only the last position of decoder logits (runs may resume mid-model)

    def finish(self, mean_value, clean: float, corrupt: float):
        """The reported number: the mean metric, normalised if asked for."""
        return M.normalized(mean_value, clean, corrupt) if self.normalized else mean_value


def _tiled(ids: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Answer ids [batch] repeated to match an output of k stacked copies of the batch."""
    return ids.to(out.device).repeat(out.shape[0] // ids.shape[0])


def _need_answers(task: Task, what: str) -> torch.Tensor:
    if task.answers is None:
        raise TaskError(
            f"Task {task.name!r} has no answers, but the {what} metric reads the answer's logit; "
            "build the Task with answers= (one token id per prompt) or pass a callable metric."
        )
    return task.answers


def resolve_metric(task: Task, metric: str | Metric | None) -> PatchMetric:
    """The metric by name (see METRICS), a callable (output -> [batch]), or None for the default.

    Default: logit difference when the task has wrong answers, else answer log-probability.
    """
    if metric is None:
        metric = "logit_diff" if task.wrong_answers is not None else "logprob"
    if callable(metric):
        return PatchMetric(name=getattr(metric, "__name__", "custom"), fn=metric)
    if metric not in METRICS:
        raise TaskError(f"Unknown patching metric {metric!r}; use one of {METRICS} or a callable output -> [batch].")
    if metric == "task":
        return PatchMetric(name=task.metric, fn=M.task_metric(task), last_position=task.metric != "cosine")
    answers = _need_answers(task, metric)
    if metric in ("logprob", "prob"):
        def logprob(out: torch.Tensor) -> torch.Tensor:
            lp = M.answer_logprob(out, _tiled(answers, out))  # [batch]
            return lp if metric == "logprob" else lp.exp()

        return PatchMetric(name=metric, fn=logprob, stacked=True, last_position=True)
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


def clean_and_corrupted(model, task: Task, corrupted_tokens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The checked (clean, corrupted) token pair, each [batch, pos], on the model's device."""
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


def token_labels(model, tokens: torch.Tensor) -> list[str]:
    """Position labels "i: token" from the first prompt (raw strings; escape them for HTML)."""
    return [f"{i}: {tok}" for i, tok in enumerate(model.to_str_tokens(tokens[0]))]
