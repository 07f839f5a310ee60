"""Forward passes of the position sweep: answer metrics and attention statistics per row.

All rows (gold positions) of one sweep go through the model together, and sweeps of equal
prompt length share a pass up to 64 rows (`batch_size` rows per pass when given); under
torch.distributed each rank runs its block of those passes and the rows are gathered.
Decoders are run teacher-forced on prompt + answer, which gives in one pass the answer's
log-probability (summed over its tokens), the rank of its first token,
`exact` (greedy decoding would start with the answer: every answer token is the argmax), the
attention mass from the answer position (the prompt's last token) onto the gold span per layer
and head, and the sink mass per layer and head. `accuracy` is Liu et al.'s metric: greedy
decoding (KV cache) contains one accepted answer string; for a one-token answer it equals `exact`.
Encoders give the cosine similarity of the mean-pooled passage and query embeddings; their
gold mass is averaged over every query row (mean pooling reads every position).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headscope.analyses.core.metrics import mean_pool
from headscope.analyses.position.prompts import PositionSweep
from headscope.analyses.position.sinks import sink_mass, streaming_attention
from headscope.errors import ConfigError
from headscope.execution import distributed
from headscope.hooks.kv_states import generate_with_kv
from headscope.hooks.sites import site


@dataclass(frozen=True, kw_only=True)
class SweepOutput:
    """Per-row results of one sweep.

    metrics:   name -> [n_pos] float ("accuracy", "exact", "logprob", "rank"; encoders "cosine").
    gold_mass: [n_pos, layer, head] attention from the answer position onto the gold span.
    sink_mass: [n_pos, layer, head] mean mass on the first n_sink keys over prompt query rows.
    masked:    condition -> metrics under a StreamingLLM mask ("sinks+window", "window").
    """

    metrics: Mapping[str, torch.Tensor]
    gold_mass: torch.Tensor
    sink_mass: torch.Tensor
    masked: Mapping[str, Mapping[str, torch.Tensor]]


def attention_hooks(model: Any, spans: torch.Tensor, n_prompt: int, n_sink: int, store: dict) -> list:
    """hook_pattern hooks that reduce each layer to gold mass and sink mass [batch, head] in place."""
    causal = not model.facts.is_encoder

    def make(layer: int):
        def hook(pattern: torch.Tensor, hook: Any) -> None:  # [batch, head, q, k]
            keys = torch.arange(pattern.shape[-1], device=pattern.device)
            sp = spans.to(pattern.device)
            in_gold = (keys >= sp[:, :1]) & (keys < sp[:, 1:])  # [batch, k]
            rows = pattern[:, :, n_prompt - 1] if causal else pattern.mean(-2)  # [batch, head, k]
            store.setdefault("gold", {})[layer] = (rows * in_gold[:, None]).sum(-1).float().cpu()
            prompt_rows = pattern[:, :, :n_prompt]  # [batch, head, q, k]
            store.setdefault("sink", {})[layer] = sink_mass(prompt_rows, n_sink, causal=causal).float().cpu()

        return hook

    return [(site("pattern", layer), make(layer)) for layer in range(model.facts.n_layers)]


def answer_scores(logits: torch.Tensor, n_prompt: int, answer_ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """[batch, pos, vocab] teacher-forced logits, [batch, n_answer] answers -> logprob, rank (1 = top), exact, each [batch]."""
    n = answer_ids.shape[-1]
    pred = logits[:, n_prompt - 1: n_prompt - 1 + n].float()  # [batch, n_answer, vocab]
    target = answer_ids.to(pred.device).expand(pred.shape[0], n)  # [batch, n_answer]
    token_lp = pred.log_softmax(-1).gather(-1, target[..., None]).squeeze(-1)  # [batch, n_answer]
    first = pred[:, 0]  # [batch, vocab]
    rank = (first > first.gather(-1, target[:, :1])).sum(-1) + 1  # [batch]
    exact = (pred.argmax(-1) == target).all(-1)  # [batch]
    return {"logprob": token_lp.sum(-1).cpu(), "rank": rank.float().cpu(), "exact": exact.float().cpu()}


def greedy_contains(model: Any, tokens: torch.Tensor, answers: Sequence[tuple[str, ...]], max_new_tokens: int) -> torch.Tensor:
    """[batch] 1.0 where row i's greedy continuation contains one of answers[i] (Liu et al.'s metric)."""
    trace = generate_with_kv(model, tokens, max_new_tokens)
    new = trace.tokens[:, tokens.shape[1]:]  # [batch, new]
    texts = model.tokenizer.batch_decode(new.cpu(), skip_special_tokens=True)
    return torch.tensor([float(any(a in t for a in acc)) for t, acc in zip(texts, answers)])


def row_batches(sweeps: Sequence[PositionSweep], batch_size: int | None, max_rows: int = 64) -> list[list[tuple[int, int]]]:
    """Forward-pass batches of (sweep, row) pairs; rows in one batch share prompt and answer length.

    batch_size None: whole sweeps (every position of an example together), several sweeps per
    pass up to max_rows rows; otherwise batch_size rows per pass.
    """
    groups: dict[tuple[int, int], list[int]] = {}
    for i, sw in enumerate(sweeps):
        groups.setdefault((sw.prompt_len, sw.answer_ids.numel()), []).append(i)
    batches: list[list[tuple[int, int]]] = []
    for idxs in groups.values():
        if batch_size is not None:
            rows = [(i, r) for i in idxs for r in range(len(sweeps[i].positions))]
            batches += [rows[k:k + max(1, batch_size)] for k in range(0, len(rows), max(1, batch_size))]
            continue
        current: list[tuple[int, int]] = []
        for i in idxs:
            rows = [(i, r) for r in range(len(sweeps[i].positions))]
            if current and len(current) + len(rows) > max_rows:
                batches.append(current)
                current = []
            current += rows
        batches.append(current)
    return batches


def _scatter(sweeps: Sequence[PositionSweep], batches: list,
             results: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    """Per-batch results {name: [batch, ...]} back to per-sweep {name: [n_pos, ...]}."""
    per: list[dict[str, list]] = [{} for _ in sweeps]
    for batch, res in zip(batches, results):
        for j, (i, r) in enumerate(batch):
            for name, value in res.items():
                per[i].setdefault(name, [None] * len(sweeps[i].positions))[r] = value[j]
    return [{name: torch.stack(vals) for name, vals in d.items()} for d in per]


def _stack(sweeps: Sequence[PositionSweep], batch: list[tuple[int, int]], field: str) -> torch.Tensor:
    return torch.stack([getattr(sweeps[i], field)[r] for i, r in batch])


def _attention(model: Any, store: dict) -> dict[str, torch.Tensor]:
    n = model.facts.n_layers
    return {"gold": torch.stack([store["gold"][i] for i in range(n)], 1),  # [batch, layer, head]
            "sink": torch.stack([store["sink"][i] for i in range(n)], 1)}  # [batch, layer, head]


def _outputs(per: list[dict[str, torch.Tensor]], metrics: Sequence[str]) -> list[SweepOutput]:
    outs = []
    for d in per:
        masked = {c: {m.split(":")[1]: v for m, v in d.items() if m.startswith(c + ":")} for c in ("sinks+window", "window")}
        outs.append(SweepOutput(metrics={m: d[m] for m in metrics}, gold_mass=d["gold"], sink_mass=d["sink"],
                                masked={c: v for c, v in masked.items() if v}))
    return outs


@torch.no_grad()
def run_decoder_sweeps(
    model: Any, sweeps: Sequence[PositionSweep], *, n_sink: int, window: Callable[[int], int | None],
    batch_size: int | None = None, generate: bool | None = None, extra_new_tokens: int = 8, progress: bool = False,
) -> list[SweepOutput]:
    """Teacher-forced metrics and attention stats for every row of every sweep.

    window(prompt_len) gives the StreamingLLM window (None: no masked runs).
    """
    for sw in sweeps:
        if sw.answer_ids.numel() == 0:
            raise ConfigError("decoder sweeps need answer_ids (the answer continuation); "
                              "build them with a decoder prompt builder.")

    def score(batch: list[tuple[int, int]]) -> dict[str, torch.Tensor]:
        first = sweeps[batch[0][0]]
        n_prompt, n_answer = first.prompt_len, first.answer_ids.numel()
        tokens = _stack(sweeps, batch, "tokens")  # [batch, pos]
        answer_ids = torch.stack([sweeps[i].answer_ids for i, _ in batch])  # [batch, n_answer]
        inputs = torch.cat([tokens, answer_ids[:, :-1]], 1)  # [batch, pos + n_answer - 1]
        store: dict = {}
        with model.hooks(fwd=attention_hooks(model, _stack(sweeps, batch, "gold_spans"), n_prompt, n_sink, store)):
            logits = model(inputs)  # [batch, pos, vocab]
        res = {**answer_scores(logits, n_prompt, answer_ids), **_attention(model, store)}
        if n_answer > 1 if generate is None else generate:
            answers = [sweeps[i].answers for i, _ in batch]
            res["accuracy"] = greedy_contains(model, tokens, answers, n_answer + extra_new_tokens)
        else:
            res["accuracy"] = res["exact"].clone()
        w = window(n_prompt)
        if w is not None:
            for cond, keep_sinks in (("sinks+window", True), ("window", False)):
                with streaming_attention(model, n_sink=n_sink, window=w, keep_sinks=keep_sinks):
                    scores = answer_scores(model(inputs), n_prompt, answer_ids)
                res.update({f"{cond}:{k}": v for k, v in scores.items()})
        return res

    batches = row_batches(sweeps, batch_size)
    results = distributed.map_sharded(score, batches, progress=progress, desc="position sweep")
    return _outputs(_scatter(sweeps, batches, results), ("accuracy", "exact", "logprob", "rank"))


@torch.no_grad()
def run_encoder_sweeps(
    model: Any, sweeps: Sequence[PositionSweep], *, n_sink: int, batch_size: int | None = None, progress: bool = False,
) -> list[SweepOutput]:
    """Cosine(query, passage) of mean-pooled final hidden states for every row, plus attention stats."""
    if any(sw.query_tokens is None for sw in sweeps):
        raise ConfigError("encoder sweeps need query_tokens; build them with retrieval_sweeps.")
    queries = [mean_pool(model(sw.query_tokens), None)[0] for sw in sweeps]  # each [d_model]

    def score(batch: list[tuple[int, int]]) -> dict[str, torch.Tensor]:
        store: dict = {}
        n_prompt = sweeps[batch[0][0]].prompt_len
        with model.hooks(fwd=attention_hooks(model, _stack(sweeps, batch, "gold_spans"), n_prompt, n_sink, store)):
            hidden = model(_stack(sweeps, batch, "tokens"))  # [batch, pos, d_model]
        query = torch.stack([queries[i] for i, _ in batch])  # [batch, d_model]
        cos = torch.nn.functional.cosine_similarity(mean_pool(hidden, None), query, dim=-1)  # [batch]
        return {"cosine": cos.float().cpu(), **_attention(model, store)}

    batches = row_batches(sweeps, batch_size)
    results = distributed.map_sharded(score, batches, progress=progress, desc="position sweep")
    return _outputs(_scatter(sweeps, batches, results), ("cosine",))
