"""Forward passes of the position sweep: answer metrics and attention statistics per row.

All rows (gold positions) of one sweep go through the model together, and sweeps of equal
prompt length share a pass up to 64 rows and 16,384 tokens (`batch_size` rows per pass when
given); under
torch.distributed each rank runs its block of those passes and the rows are gathered.
Decoders are run teacher-forced on prompt + answer, which gives in one pass the answer's
log-probability (summed over its tokens), the rank of its first token,
`exact` (greedy decoding would start with the answer: every answer token is the argmax), the
attention mass from the answer position (the prompt's last token) onto the gold span per layer
and head, and the sink mass per layer and head. `accuracy` is Liu et al.'s metric: greedy
decoding (KV cache) contains one accepted answer string; for a one-token answer it equals `exact`.
Encoders give the cosine similarity of the mean-pooled passage and query embeddings; their
gold mass is averaged over every query row (mean pooling reads every position). Each sweep's no-gold
prompt (Liu et al.'s baseline: the distractors alone) is scored once more, by the same metrics, in a
pass of its own (SweepOutput.no_gold).

Memory grows linearly with the prompt where the hook-free blocks run the model (execution.hook_free:
float32 GPT-2, Llama/Mistral/Qwen2, GPT-NeoX): the attention statistics are reduced from chunks of
query rows recomputed from q and k (hooks.reduce_patterns), the StreamingLLM masks go to the fused
kernel, only the answer positions are unembedded, and greedy decoding prefills its cache hook-free.
Elsewhere the bridge's patterns are read, one layer at a time.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from headscope.analyses.core.metrics import mean_pool
from headscope.analyses.position.prompts import PositionSweep
from headscope.analyses.position.sinks import keys_mass_sums, query_rows, sink_mass_sum, sink_rows, streaming_keep
from headscope.errors import ConfigError
from headscope.execution import distributed
from headscope.hooks.kv_states import generate_with_kv
from headscope.hooks.patterns import reduce_patterns
from headscope.models.hooked_model import layer_windows


@dataclass(frozen=True, kw_only=True)
class SweepOutput:
    """Per-row results of one sweep.

    metrics:   name -> [n_pos] float ("accuracy", "exact", "logprob", "rank", "copied" (the output is one of the
               context's values, any of them; NaN where the sweep records none); encoders "cosine").
    gold_mass: [n_pos, layer, head] attention from the answer position onto the gold span.
    sink_mass: [n_pos, layer, head] mean mass on the first n_sink keys over prompt query rows.
    masked:    condition -> metrics under a StreamingLLM mask ("sinks+window", "window").
    no_gold:   name -> [1] float, the metrics of the sweep's no-gold prompt (PositionSweep.no_gold_tokens: the same
               distractors, the gold item taken out); empty where the sweep has none.
    """

    metrics: Mapping[str, torch.Tensor]
    gold_mass: torch.Tensor
    sink_mass: torch.Tensor
    masked: Mapping[str, Mapping[str, torch.Tensor]]
    no_gold: Mapping[str, torch.Tensor] = field(default_factory=dict)
    # review 19b B1, a model with learned sinks only: [n_pos, layer, head] the mean mass over the keys of the same rows
    # (a row's sum; the learned sink takes the rest) and the mean of that mass x the row's uniform share of the sinks
    keys_mass: torch.Tensor | None = None
    keys_baseline: torch.Tensor | None = None


class AttentionStats:
    """A pattern reducer (hooks.reduce_patterns) keeping per layer and row the gold mass and the
    sink mass [batch, head], from chunks of query rows: memory never holds a layer's pattern.

    Decoders: gold = mass from the answer position (the prompt's last token, n_prompt - 1) onto
    the gold span; sink = the mean over prompt query rows q >= n_sink of the mass on keys < n_sink
    (sinks.sink_mass), on a sliding-window layer (`windows`, per layer: models.layer_windows) over those of
    them whose window holds the first token (sinks.sink_rows). Encoders: both averaged over every query row."""

    def __init__(self, spans: torch.Tensor, n_prompt: int, n_sink: int, *, causal: bool,
                 windows: Sequence[int | None] = (), learned_sinks: bool = False) -> None:
        self.spans, self.n_prompt, self.n_sink, self.causal = spans, n_prompt, n_sink, causal
        self.windows, self.learned = list(windows or ()), learned_sinks and causal  # review 19b B1
        self.keys: dict[int, torch.Tensor] = {}
        self.weighted: dict[int, torch.Tensor] = {}
        # the rows each layer's sink mass averages (sinks.sink_rows): a global layer's every prompt row from n_sink
        # (encoders: every row), a sliding-window layer's those of them that see the first token
        self.all_rows = query_rows(n_prompt, n_sink, causal=causal)
        self.rows = {layer: sink_rows(n_prompt, n_sink, w, causal=causal) for layer, w in enumerate(windows or ())
                     if w is not None}
        self.gold: dict[int, torch.Tensor] = {}
        self.sink: dict[int, torch.Tensor] = {}

    def __call__(self, layer: int, queries: torch.Tensor, pattern: torch.Tensor) -> None:
        # queries [c], pattern [batch, head, c, keys]
        keys = torch.arange(pattern.shape[-1], device=pattern.device)
        sp = self.spans.to(pattern.device)
        in_gold = ((keys >= sp[:, :1]) & (keys < sp[:, 1:])).to(pattern.dtype)  # [batch, keys]
        queries = queries.to(pattern.device)
        if self.causal:
            at = (queries == self.n_prompt - 1).nonzero()
            if at.numel():
                self._add(self.gold, layer, pattern[:, :, int(at[0, 0])] @ in_gold[:, :, None], 1.0)
        else:
            self._add(self.gold, layer, pattern.sum(2) @ in_gold[:, :, None], 1.0 / self.n_prompt)
        # the queries are the prompt's (reduce_patterns' query_positions); the layer's rows count
        rows = self.rows.get(layer, self.all_rows)
        self._add(self.sink, layer, sink_mass_sum(pattern, queries, self.n_sink, rows), 1.0 / len(rows))
        if self.learned:  # the mass reaching the keys of the same rows, and the uniform share of it (sinks.keys_mass_sums)
            window = self.windows[layer] if layer < len(self.windows) else None
            reach, share = keys_mass_sums(pattern, queries, rows, self.n_sink, window)
            self._add(self.keys, layer, reach, 1.0 / len(rows))
            self._add(self.weighted, layer, share, 1.0 / len(rows))

    @staticmethod
    def _add(store: dict, layer: int, value: torch.Tensor, weight: float) -> None:
        value = value.reshape(value.shape[0], value.shape[1]).double().cpu() * weight
        store[layer] = value if layer not in store else store[layer] + value

    def tables(self, n_layers: int) -> dict[str, torch.Tensor]:
        """{"gold": [batch, layer, head], "sink": [batch, layer, head]} (float32)."""
        out = {"gold": torch.stack([self.gold[i] for i in range(n_layers)], 1).float(),
               "sink": torch.stack([self.sink[i] for i in range(n_layers)], 1).float()}
        if self.learned:  # float64: the baseline's ratio is taken against these
            out.update(keys=torch.stack([self.keys[i] for i in range(n_layers)], 1),
                       weighted=torch.stack([self.weighted[i] for i in range(n_layers)], 1))
        return out


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


def greedy_contains(model: Any, tokens: torch.Tensor, answers: Sequence[tuple[str, ...]], max_new_tokens: int,
                    values: Sequence[tuple[str, ...]] | None = None) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """[batch] 1.0 where row i's greedy continuation contains one of answers[i] (Liu et al.'s metric); with `values`
    (each row's context values) also [batch] 1.0 where it contains any of them (NaN for a row without values)."""
    trace = generate_with_kv(model, tokens, max_new_tokens)
    new = trace.tokens[:, tokens.shape[1]:]  # [batch, new]
    texts = model.tokenizer.batch_decode(new.cpu(), skip_special_tokens=True)
    hit = torch.tensor([float(any(a in t for a in acc)) for t, acc in zip(texts, answers)])
    if values is None:
        return hit
    return hit, torch.tensor([float(any(v in t for v in vals)) if vals else float("nan") for t, vals in zip(texts, values)])


def copied_value(model: Any, first: torch.Tensor, values: Sequence[tuple[str, ...]]) -> torch.Tensor:
    """[batch] 1.0 where the argmax next token (first [batch, vocab] logits), decoded and stripped, is one of the
    row's context values (one-token answers, scored by `exact`); NaN for a row without values."""
    texts = model.tokenizer.batch_decode(first.argmax(-1)[:, None].cpu())
    return torch.tensor([float(t.strip() in {v.strip() for v in vals}) if vals else float("nan")
                         for t, vals in zip(texts, values)])


def streaming_logits(model: Any, inputs: torch.Tensor, *, n_sink: int, window: int, keep_sinks: bool,
                     logits_from: int) -> torch.Tensor:
    """Logits [batch, pos - logits_from, vocab] with every layer restricted to its sinks + recent
    window (or the window alone): reduce_patterns with no layer to reduce, so the hook-free pass with
    that mask where it applies (the fused kernel; no pattern held), else the bridge masking the scores."""
    keep = streaming_keep(inputs.shape[1], inputs.shape[1], n_sink, window, keep_sinks=keep_sinks)  # [pos, pos]
    return reduce_patterns(model, inputs, lambda *_: None, layers=(), keep=keep, logits_from=logits_from)


def max_rows_for(n_pos: int, max_rows: int = 64, tokens_per_pass: int = 16384) -> int:
    """Rows per pass: up to max_rows, fewer for long prompts (at most tokens_per_pass tokens a
    pass, so a 4k-token prompt runs 4 rows at a time and memory stays linear in its length)."""
    return max(1, min(max_rows, tokens_per_pass // max(1, n_pos)))


def row_batches(sweeps: Sequence[PositionSweep], batch_size: int | None, max_rows: int = 64) -> list[list[tuple[int, int]]]:
    """Forward-pass batches of (sweep, row) pairs; rows in one batch share prompt and answer length.

    batch_size None: whole sweeps (every position of an example together), several sweeps per
    pass up to max_rows rows, fewer for long prompts (max_rows_for); otherwise batch_size rows per pass.
    """
    groups: dict[tuple[int, int], list[int]] = {}
    for i, sw in enumerate(sweeps):
        groups.setdefault((sw.prompt_len, sw.answer_ids.numel()), []).append(i)
    batches: list[list[tuple[int, int]]] = []
    for (n_pos, _), idxs in groups.items():
        cap = max_rows_for(n_pos, max_rows)
        if batch_size is not None:
            rows = [(i, r) for i in idxs for r in range(len(sweeps[i].positions))]
            batches += [rows[k:k + max(1, batch_size)] for k in range(0, len(rows), max(1, batch_size))]
            continue
        packed: list[list[tuple[int, int]]] = [[]]
        for i in idxs:
            rows = [(i, r) for r in range(len(sweeps[i].positions))]
            if packed[-1] and len(packed[-1]) + len(rows) > cap:
                packed.append([])
            packed[-1] += rows
        batches += [b[k:k + cap] for b in packed for k in range(0, len(b), cap)]  # a sweep longer than cap: split
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


def _outputs(per: list[dict[str, torch.Tensor]], metrics: Sequence[str],
             no_gold: Sequence[Mapping[str, torch.Tensor]] = ()) -> list[SweepOutput]:
    outs = []
    for i, d in enumerate(per):
        masked = {c: {m.split(":")[1]: v for m, v in d.items() if m.startswith(c + ":")} for c in ("sinks+window", "window")}
        outs.append(SweepOutput(metrics={m: d[m] for m in metrics}, gold_mass=d["gold"], sink_mass=d["sink"],
                                keys_mass=d.get("keys"), keys_baseline=d.get("weighted"),
                                masked={c: v for c, v in masked.items() if v},
                                no_gold=no_gold[i] if i < len(no_gold) else {}))
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

    windows = layer_windows(model)  # a sliding-window layer's sink mass averages the rows that see the first token

    def score(batch: list[tuple[int, int]]) -> dict[str, torch.Tensor]:
        first = sweeps[batch[0][0]]
        n_prompt, n_answer = first.prompt_len, first.answer_ids.numel()
        tokens = _stack(sweeps, batch, "tokens")  # [batch, pos]
        answer_ids = torch.stack([sweeps[i].answer_ids for i, _ in batch])  # [batch, n_answer]
        inputs = torch.cat([tokens, answer_ids[:, :-1]], 1)  # [batch, pos + n_answer - 1]
        stats = AttentionStats(_stack(sweeps, batch, "gold_spans"), n_prompt, n_sink, causal=True, windows=windows,
                               learned_sinks=bool(getattr(model.facts, "learned_sinks", False)))
        # logits from the prompt's last position on: [batch, n_answer, vocab]
        logits = reduce_patterns(model, inputs, stats, query_positions=slice(0, n_prompt), logits_from=n_prompt - 1)
        res = {**answer_scores(logits, 1, answer_ids), **stats.tables(model.facts.n_layers)}
        values = [sweeps[i].values for i, _ in batch]
        if n_answer > 1 if generate is None else generate:
            answers = [sweeps[i].answers for i, _ in batch]
            res["accuracy"], res["copied"] = greedy_contains(model, tokens, answers, n_answer + extra_new_tokens, values)
        else:
            res["accuracy"], res["copied"] = res["exact"].clone(), copied_value(model, logits[:, 0], values)
        w = window(n_prompt)
        if w is not None:
            for cond, keep_sinks in (("sinks+window", True), ("window", False)):
                masked = streaming_logits(model, inputs, n_sink=n_sink, window=w, keep_sinks=keep_sinks,
                                          logits_from=n_prompt - 1)  # [batch, n_answer, vocab]
                res.update({f"{cond}:{k}": v for k, v in answer_scores(masked, 1, answer_ids).items()})
        return res

    def no_gold(i: int) -> dict[str, torch.Tensor]:
        """The answer metrics on sweep i's no-gold prompt (one row; no attention statistics: it has no gold span)."""
        sw = sweeps[i]
        tokens, n_prompt, answer_ids = sw.no_gold_tokens, sw.no_gold_tokens.shape[1], sw.answer_ids[None]  # [1, pos'], [1, n]
        inputs = torch.cat([tokens, answer_ids[:, :-1]], 1)  # [1, pos' + n_answer - 1]
        logits = reduce_patterns(model, inputs, lambda *_: None, layers=(), logits_from=n_prompt - 1)  # [1, n, vocab]
        res = answer_scores(logits, 1, answer_ids)
        if sw.answer_ids.numel() > 1 if generate is None else generate:
            res["accuracy"], res["copied"] = greedy_contains(model, tokens, [sw.answers], sw.answer_ids.numel()
                                                             + extra_new_tokens, [sw.values])
        else:
            res["accuracy"], res["copied"] = res["exact"].clone(), copied_value(model, logits[:, 0], [sw.values])
        return res

    batches = row_batches(sweeps, batch_size)
    results = distributed.map_sharded(score, batches, progress=progress, desc="position sweep")
    return _outputs(_scatter(sweeps, batches, results), ("accuracy", "exact", "logprob", "rank", "copied"),
                    _no_gold_rows(sweeps, no_gold))


def _no_gold_rows(sweeps: Sequence[PositionSweep],
                  score: Callable[[int], dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    """Each sweep's no-gold metrics ({name: [1]}; {} for a sweep without a no-gold prompt): score(i) for sweep i,
    one pass each, the sweeps sharded over ranks like the rows."""
    have = [i for i, sw in enumerate(sweeps) if sw.no_gold_tokens is not None]
    found = distributed.map_sharded(score, have)
    per: list[dict[str, torch.Tensor]] = [{} for _ in sweeps]
    for i, res in zip(have, found):
        per[i] = {k: v.float().cpu() for k, v in res.items()}
    return per


@torch.no_grad()
def run_encoder_sweeps(
    model: Any, sweeps: Sequence[PositionSweep], *, n_sink: int, batch_size: int | None = None, progress: bool = False,
) -> list[SweepOutput]:
    """Cosine(query, passage) of mean-pooled final hidden states for every row, plus attention stats."""
    if any(sw.query_tokens is None for sw in sweeps):
        raise ConfigError("encoder sweeps need query_tokens; build them with retrieval_sweeps.")
    queries = [mean_pool(model(sw.query_tokens), None)[0] for sw in sweeps]  # each [d_model]

    def score(batch: list[tuple[int, int]]) -> dict[str, torch.Tensor]:
        n_prompt = sweeps[batch[0][0]].prompt_len
        stats = AttentionStats(_stack(sweeps, batch, "gold_spans"), n_prompt, n_sink, causal=False)
        hidden = reduce_patterns(model, _stack(sweeps, batch, "tokens"), stats)  # [batch, pos, d_model]
        query = torch.stack([queries[i] for i, _ in batch])  # [batch, d_model]
        cos = torch.nn.functional.cosine_similarity(mean_pool(hidden, None), query, dim=-1)  # [batch]
        return {"cosine": cos.float().cpu(), **stats.tables(model.facts.n_layers)}

    def no_gold(i: int) -> dict[str, torch.Tensor]:
        """Cosine of the query with sweep i's no-gold passage (the distractors alone)."""
        hidden = reduce_patterns(model, sweeps[i].no_gold_tokens, lambda *_: None, layers=())  # [1, pos', d_model]
        query = queries[i][None]  # [1, d_model]
        return {"cosine": torch.nn.functional.cosine_similarity(mean_pool(hidden, None), query, dim=-1)}  # [1]

    batches = row_batches(sweeps, batch_size)
    results = distributed.map_sharded(score, batches, progress=progress, desc="position sweep")
    return _outputs(_scatter(sweeps, batches, results), ("cosine",), _no_gold_rows(sweeps, no_gold))
