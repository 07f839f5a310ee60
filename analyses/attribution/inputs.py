"""The attribution analysis's inputs (analysis.py's `attribution`): each example's real tokens, padding dropped, in
groups of equal length; a generator seeded by its own tokens; the baseline token integrated gradients and "replace"
use, one whose embedding is not near zero; and the metric gradients differentiate with its targets (an encoder's
partner sentence's pooled embedding).
"""
from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch

from headscope.analyses.core import mask_read
from headscope.analyses.core.contract import one_token_answers
from headscope.analyses.core.metrics import mean_pool
from headscope.analyses.core.tasks import Task
from headscope.errors import ConfigError, TaskError

if TYPE_CHECKING:
    from headscope.analyses.attribution.analysis import AttributionConfig


def real_spans(task: Task) -> list[tuple[int, int]]:
    """(start, length) of each example's real tokens in task.tokens: left padding (decoders), right
    padding (encoders) or none. Padded examples are scored on their real tokens only, grouped by
    length, so every example's scores are those of the example run alone."""
    n = task.tokens.shape[1]
    if task.attention_mask is None:
        return [(0, n)] * len(task)
    mask = task.attention_mask.bool().cpu()  # [batch, pos]
    lengths = mask.sum(1)  # [batch]
    starts = mask.int().argmax(1)  # [batch] first real token
    pos = torch.arange(n)[None, :]  # [1, pos]
    if not torch.equal((pos >= starts[:, None]) & (pos < (starts + lengths)[:, None]), mask):
        raise TaskError("attribution needs each example's real tokens in one run (attention_mask 0...0 1...1 "
                        "or 1...1 0...0).")
    return list(zip(starts.tolist(), lengths.tolist()))


def real_tokens(task: Task, idx: Sequence[int], spans: Sequence[tuple[int, int]]) -> torch.Tensor:
    """[len(idx), n]: the real tokens of examples `idx`, all of one length n, padding dropped."""
    n = spans[idx[0]][1]
    return torch.stack([task.tokens[i, spans[i][0] : spans[i][0] + n] for i in idx])


def example_generator(seed: int, tokens: torch.Tensor) -> torch.Generator:
    """A generator seeded by `seed` and the example's own tokens [pos]: its random draws
    (permutations, adversarial noise) do not depend on which examples share its batch, its index or
    the padding, so an example scored in a data set draws what it draws alone."""
    digest = zlib.crc32(tokens.detach().cpu().to(torch.int64).numpy().astype("<i8").tobytes())
    return torch.Generator().manual_seed(seed * 100_003 + digest)


def length_groups(lengths: Sequence[int], chunk: int) -> Iterator[list[int]]:
    """Example indices grouped by equal length, in chunks of at most `chunk`."""
    by_length: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        by_length.setdefault(n, []).append(i)
    for idx in by_length.values():
        for start in range(0, len(idx), chunk):
            yield idx[start : start + chunk]


MIN_BASELINE_NORM = 0.5  # a baseline embedding needs at least this fraction of the median norm


def default_baseline_token(model) -> int:
    """The baseline token of baseline_choice (its note aside)."""
    return baseline_choice(model)[0]


def baseline_choice(model) -> tuple[int, str | None]:
    """(token, note): the first of pad, unk, eos, bos whose input embedding is not near zero, note None; where every
    one is near zero (review 19a C1: OLMo's init zeroes the pad row, and its one token is pad, eos and BOS), the token
    whose embedding is nearest the vocabulary's mean embedding among those of normal size, with a note naming it,
    and the special tokens, each once, with their roles.

    Why not near zero: a pad embedding is often exactly 0 (HF zeroes padding_idx and it is
    never trained) and rare specials decay towards 0. The first norm layer is scale-invariant,
    so on the straight path from 0 the model's output jumps within a tiny interval next to the
    baseline, and integrated gradients cannot converge there (the delta stays at
    f(x) - f(baseline) whatever the number of steps). Any token with a normal-sized embedding
    avoids that; candidates are tried in the usual order of "content-free" tokens, then the mean-like one.
    """
    from headscope.models.token_text import token_strings

    tok = model.tokenizer
    roles: dict[int, list[str]] = {}  # token -> its roles, in the order tried, each token once
    for role in ("pad", "unk", "eos", "bos"):
        if (c := getattr(tok, f"{role}_token_id", None)) is not None:
            roles.setdefault(int(c), []).append(role)
    weight = model.bridge.original_model.get_input_embeddings().weight.detach().float()  # [vocab, d_model]
    norms = weight.norm(dim=-1)  # [vocab]
    floor = MIN_BASELINE_NORM * float(norms.median())
    for cand in roles:
        if cand < norms.shape[0] and float(norms[cand]) >= floor and float(norms[cand]) > 0:
            return cand, None
    normal = ((norms >= floor) & (norms > 0)).nonzero().reshape(-1)  # [n] tokens of normal size
    if not len(normal):
        raise ConfigError(f"Every token has a near-zero input embedding (norm < {MIN_BASELINE_NORM} x the median), "
                          "which makes integrated gradients diverge; pass baseline_token= explicitly.")
    gap = (weight[normal] - weight.mean(0)).norm(dim=-1)  # [n] distance to the mean embedding
    pick = int(normal[int(gap.argmin())])
    specials = ", ".join(f"{token_strings(tok, [c])[0]!r} (id {c}: {', '.join(r)})" for c, r in roles.items())
    why = (f"{specials} {'have' if len(roles) > 1 else 'has'} a near-zero input embedding (norm < "
           f"{MIN_BASELINE_NORM} x the median)" if roles else "the tokenizer has no pad, unk, eos or bos token")
    return pick, (f"token {token_strings(tok, [pick])[0]!r} (id {pick}, the one whose input embedding is nearest the "
                  f"vocabulary's mean embedding), not a special token: {why}")


def ig_baselines(tokens: torch.Tensor, baseline_token: int, at: torch.Tensor | None = None) -> torch.Tensor:
    """[batch, pos]: every token but the first and last replaced by the baseline token; a masked LM's mask (`at`
    [batch]) is kept too, as a decoder's last token: the path moves the context, not the question."""
    out = tokens.clone()
    out[:, 1:-1] = baseline_token
    if at is not None:
        rows = torch.arange(len(tokens), device=tokens.device)
        out[rows, at.to(tokens.device)] = tokens[rows, at.to(tokens.device)]
    return out


def read_positions(model, task: Task, spans: Sequence[tuple[int, int]]) -> torch.Tensor | None:
    """[batch] each example's mask position among its real tokens where a masked LM is scored at its mask
    (mask_read.mask_positions: its masked-LM head, one-token answers, one mask in every prompt), else None."""
    at = mask_read.mask_positions(model, task)  # [batch] in the padded coordinates
    if at is None:
        return None
    return at - torch.tensor([start for start, _ in spans], dtype=torch.int64)


@torch.no_grad()
def partner_references(model, task: Task, spans: Sequence[tuple[int, int]]) -> torch.Tensor:
    """[batch, d_model]: for sentence i, the pooled embedding of sentence (i + 1) mod batch (real tokens only)."""
    if len(task) < 2:
        raise ConfigError("The encoder metric compares each sentence with another one; give at least 2 sentences or reference=.")
    pooled = torch.stack([mean_pool(model(real_tokens(task, [i], spans)), None)[0] for i in range(len(task))])  # [batch, d]
    return pooled.roll(-1, dims=0)


def gradient_targets(model, task: Task, kind: str, reference: torch.Tensor | None,
                     spans: Sequence[tuple[int, int]]) -> tuple[torch.Tensor, ...]:
    """Per-example tensors the metric needs, in forward_metric's argument order."""
    if kind == "cosine":
        ref = reference if reference is not None else partner_references(model, task, spans)
        return (ref.to(model.device),)
    one_token_answers(task, "attribution")
    answers = task.answers.to(model.device)
    if kind == "logprob":
        return (answers,)
    if task.wrong_answers is None:
        raise ConfigError(f"Task {task.name!r} has no wrong_answers for logit_diff; pass metric='logprob'.")
    return answers, task.wrong_answers.to(model.device)


def metric_kind(model, task: Task, cfg: AttributionConfig, at_mask: bool = False) -> str:
    """What gradients differentiate: "cosine" for encoders; the task's metric (or cfg.metric) for decoders and a
    masked LM scored at its mask (at_mask, read_positions)."""
    if model.facts.is_encoder and not at_mask:
        if cfg.metric not in (None, "cosine"):
            raise ConfigError("An encoder is scored by its pooled embedding unless it is a masked LM whose prompts each "
                              "hold exactly one mask token and give one-token answers (read at the mask); metric must be "
                              f"'cosine' (or None), got {cfg.metric!r}.")
        return "cosine"
    kind = cfg.metric or task.metric
    if kind == "cosine":
        raise ConfigError("The cosine metric is for encoders; use 'logit_diff' or 'logprob' for a decoder or a "
                          "masked LM scored at its mask.")
    return "logprob" if kind == "accuracy" else kind
