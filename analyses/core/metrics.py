"""Metrics: map a forward pass to one number per example.

Decoders: the logit difference between the correct and the wrong answer at the last position (subtracted in float32
at least, whatever the model's dtype),
its normalised form (LD_patched - LD_corrupt) / (LD_clean - LD_corrupt), the answer's
log-probability, or accuracy. Answers of several tokens (Task.continuation, [batch, k]) are
scored over the last k positions: the log-probability of the whole continuation (the sum of each
token's log-probability given the prompt and the answer tokens before it), or accuracy when every
token is the argmax. Encoders: the cosine similarity of the mean-pooled embedding to
a reference embedding (e.g. the unmodified model's). Pooling, and so every cosine and contrastive loss
taken of a pooled embedding, is in float32 (at least) on the model's own hidden states: a bfloat16
cosine has steps of 2^-8 near 1 (the unpruned model's cosine with itself would read 0.99902), far
coarser than the changes of a head or a token (1e-5 to 1e-3), which the bfloat16 model itself resolves.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from headscope.analyses.core.tasks import Task
from headscope.errors import ConfigError

MetricFn = Callable[[torch.Tensor], torch.Tensor]  # model output -> [batch]
METRICS = ("logit_diff", "logprob", "accuracy", "cosine")


@dataclass(frozen=True, kw_only=True)
class Metric:
    """The one metric type: a named per-example score of a model output, higher is better.

    name: what is reported ("logit_diff", "logprob", ...); fn: output [batch, ...] -> [batch];
    last_position: fn reads only the last position of decoder logits, so a pass may return that
    position alone or resume mid-model. Calling a Metric calls fn. The families specialise it:
    patching's PatchMetric (patching/inputs.py) adds normalisation and stacked batches; heads'
    Scorer (heads/importance.py) carries its task's tokens and scores rows of stacked batches.
    """

    name: str
    fn: MetricFn
    last_position: bool = False

    @property
    def __name__(self) -> str:  # a Metric stands wherever a named function does (resolve_metric reads it)
        return self.name

    def __call__(self, out: torch.Tensor) -> torch.Tensor:
        return self.fn(out)


def noise_floor(dtype: torch.dtype, size: float | torch.Tensor) -> float | torch.Tensor:
    """One rounding step of a number of this size in `dtype`: eps(dtype) x max(1, |size|) (the spacing of floats
    near |size| is between eps/2 and eps of it), so two values of a metric computed in `dtype` from numbers of about
    `size` that are closer than this cannot be told apart. float32: 1.2e-7 for a size of 1; bfloat16: 0.0078 (0.089
    for logits of 11.4). A float size gives a float; a tensor of sizes [rows] gives a float32 step per row [rows].
    The heads floors, leave-one-out's logit ties (attribution) and patching's analytic floor all read it."""
    eps = float(torch.finfo(dtype).eps)
    if isinstance(size, torch.Tensor):
        return eps * size.float().abs().clamp_min(1.0)  # [rows]
    return eps * max(1.0, abs(float(size)))


def spacing(dtype: torch.dtype, x: torch.Tensor) -> torch.Tensor:
    """The spacing of `dtype`'s numbers at |x| (one rounding step there, elementwise, float32): eps(dtype) 2^(e - 1)
    where |x| = m 2^e, m in [0.5, 1). The logit lens's top-1 ties and the MoE routing margins read it."""
    _, exponent = torch.frexp(x.abs())
    return torch.finfo(dtype).eps * torch.pow(2.0, (exponent - 1).float())


def logit_diff(logits: torch.Tensor, answers: torch.Tensor, wrong: torch.Tensor) -> torch.Tensor:
    """[batch, pos, vocab] -> [batch]: logit(answer) - logit(wrong) at the last position (one-token answers),
    subtracted in at least float32: a bfloat16 subtraction rounds the difference to 8 bits again (review 17a B1:
    logits 8.9375 and 0.2158 gave 8.75 for 8.7217), a rounding the heads' null ablations and patching's self-patch
    floor cannot see (identical logits round identically), and circuits' metric never had."""
    if answers.ndim != 1:
        raise ConfigError("logit difference compares two next-token logits; answers of several tokens are "
                          "scored with 'logprob' or 'accuracy'.")
    last = logits[:, -1]  # [batch, vocab]
    wide = torch.promote_types(last.dtype, torch.float32)
    return last.gather(1, answers[:, None]).squeeze(1).to(wide) - last.gather(1, wrong[:, None]).squeeze(1).to(wide)


def _read(logits: torch.Tensor, answers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(logits [batch, k, vocab] of the last k positions, ids [batch, k] (-1 -> 0), real [batch, k] bool)
    for answers [batch] (k = 1) or continuations [batch, k] (-1 before a shorter answer)."""
    ids = answers[:, None] if answers.ndim == 1 else answers  # [batch, k]
    k = ids.shape[1]
    if logits.shape[1] < k:
        raise ConfigError(f"the answers have {k} tokens but the output has {logits.shape[1]} position(s); "
                          "answers of several tokens need the logits of the last k positions.")
    return logits[:, -k:], ids.clamp_min(0), ids >= 0


def answer_logprob(logits: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    """[batch, pos, vocab] -> [batch]: log p(answer) at the last position; for a continuation
    [batch, k], the sum over its tokens of log p(token | prompt, the tokens before it). Computed in at least
    float32: a bfloat16 log-softmax rounds its sum of exponentials near 1 to steps of 2^-7, so a saturated
    answer's log-probability came out as 0 or -0.0078 per token (review 11b A2: -0.0122 read as -0.0078, and
    the heads null ablations, which move the logits by one rounding step, never changed it)."""
    return answer_logprob_per_token(logits, answers).sum(1)


def answer_logprob_per_token(logits: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    """[batch, pos, vocab] -> [batch, k]: each answer token's log-probability (answer_logprob's terms; 0 before a
    shorter continuation), in at least float32."""
    last, ids, real = _read(logits, answers)
    lp = last.log_softmax(-1, dtype=torch.promote_types(last.dtype, torch.float32))
    lp = lp.gather(2, ids[..., None]).squeeze(2)  # [batch, k]
    return lp.masked_fill(~real, 0.0)


def vocab_mean_logprob(logits: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    """[batch, pos, vocab] -> [batch]: the model's mean log-probability over its whole vocabulary at each answer
    position, summed over the answer's tokens (answer_logprob's positions). The chance line of a log-probability:
    by Jensen (E log p <= log E p = log 1/V) every token of a model with uneven logits averages below log(1/V), so an
    answer is dispreferred only where it falls below this, not below log(1/V) (review 13a A2)."""
    last, _, real = _read(logits, answers)
    lp = last.log_softmax(-1, dtype=torch.promote_types(last.dtype, torch.float32))  # [batch, k, vocab]
    return lp.mean(-1).masked_fill(~real, 0.0).sum(1)


def accuracy(logits: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    """[batch, pos, vocab] -> [batch] of 0.0/1.0: is the answer the argmax at the last position (for a
    continuation [batch, k]: is every token of it the argmax, i.e. would greedy decoding produce it)."""
    last, ids, real = _read(logits, answers)
    return ((last.argmax(-1) == ids) | ~real).all(1).float()


def normalized(value: torch.Tensor, clean: torch.Tensor | float, corrupt: torch.Tensor | float) -> torch.Tensor:
    """(value - corrupt) / (clean - corrupt): 1 = clean behaviour restored, 0 = corrupt behaviour."""
    return (value - corrupt) / (clean - corrupt)


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """[batch, pos, d] -> [batch, d]: the mean over real tokens (sentence-transformers pooling), in float32
    or wider whatever the model's dtype (the encoder metric's one upcast: see the module docstring)."""
    hidden = hidden.to(torch.promote_types(hidden.dtype, torch.float32))  # differentiable: gradients reach bf16 states
    if attention_mask is None:
        return hidden.mean(1)
    mask = attention_mask.to(hidden.dtype).unsqueeze(-1)  # [batch, pos, 1]
    return (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)


def cosine_to_reference(hidden: torch.Tensor, reference: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """[batch, pos, d] hidden states vs [batch, d] reference pooled embeddings -> [batch] cosine (float32)."""
    pooled = mean_pool(hidden, attention_mask)  # [batch, d] float32
    return torch.nn.functional.cosine_similarity(pooled, reference.to(pooled.dtype), dim=-1)


def task_metric(task: Task, *, reference: torch.Tensor | None = None, kind: str | None = None) -> Metric:
    """The per-example metric of a Task (or `kind` to override), as a Metric of the model output.

    "cosine" needs `reference` [batch, d]: pooled embeddings of the unmodified model.
    """
    kind = kind or task.metric
    if kind not in METRICS:
        raise ConfigError(f"Unknown metric {kind!r}; use one of {METRICS}.")
    last = kind != "cosine" and task.continuation is None  # next-token answers read the last position only
    if kind == "logit_diff":
        if task.wrong_answers is None:
            raise ConfigError(f"Task {task.name!r} has no wrong_answers; use metric 'logprob' or add them.")
        return Metric(name=kind, last_position=last, fn=lambda out: logit_diff(
            out, task.answer_tokens.to(out.device), task.wrong_answers.to(out.device)))
    if kind == "logprob":
        return Metric(name=kind, last_position=last, fn=lambda out: answer_logprob(out, task.answer_tokens.to(out.device)))
    if kind == "accuracy":
        return Metric(name=kind, last_position=last, fn=lambda out: accuracy(out, task.answer_tokens.to(out.device)))
    if reference is None:
        raise ConfigError("The cosine metric needs reference= pooled embeddings of the unmodified model.")
    mask = task.attention_mask
    return Metric(name=kind, fn=lambda out: cosine_to_reference(
        out, reference.to(out.device), None if mask is None else mask.to(out.device)))
