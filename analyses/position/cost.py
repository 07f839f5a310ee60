"""What the position analysis costs (analyses/core/budget.py), and its sweeps in the order they give way.

Its own prompts (zoo_kv, json_kv, word_kv: built from no data) are built as the run will build them and counted:
their tokens, pairs and answers (review 11c A2: an estimate of min(n_ctx, 2048) x n_items / 10 tokens had priced 3
UUID pairs at 77 tokens where they took 397). Prompts from data (qa, retrieval) and a model without a tokenizer:
about min(n_ctx, 2048) tokens, scaled down by n_items when set below the maximum of 20 pairs (10 when quick), with
`context` that many tokens (an upper bound). One row per example and gold position (5 by default), each run plainly
and, with a window, under two StreamingLLM masks (3 row passes), and one row per example for its no-gold prompt
(Liu et al.'s baseline), plus, where a several-token answer is decoded greedily on decoders, a prefill and
one-token steps (each STEP_POSITIONS positions of a pass). Knobs, in order: the masked runs (window 0), half the pairs
down to 3 (shorter prompts), the examples down to 4, the gold at the first, middle and last slots only, the greedy
decoding. The pairs knob halves the pairs the prompts have (a fitted json_kv run's, not the maximum; on an encoder
only a set n_items, since each record's own distractor count is not read here) and keeps a
fitted run's format (prompts.kv_sweeps_in_context); `prompts_fit` is the cost model's check: a cut whose prompts
would not fit the context is not taken (budget.fit), so a budget never fails an analysis the uncut preset runs.
"""
from __future__ import annotations

import dataclasses
import weakref
from typing import Any, NamedTuple

import numpy as np

from headscope.analyses.core.budget import STEP_POSITIONS, Cost, CostModel, n_rows

FULL, QUICK = 32, 8
MIN_EXAMPLES = 4


MIN_ITEMS = 3  # the pairs knob stops here: gold at the first, middle and last slot still differ


def _max_items(config) -> int:
    return 10 if config.quick else 20


class Built(NamedTuple):
    """What the prompts a config builds hold: pairs, the longest prompt, the longest answer, tokens with decoding."""

    n_items: int
    prompt_tokens: int
    answer_tokens: int
    total_tokens: int  # prompt, answer and greedy decoding's extra tokens (prompts.sweep_tokens)


_BUILT: weakref.WeakKeyDictionary[Any, dict[tuple, Built]] = weakref.WeakKeyDictionary()  # model -> {settings: Built}


def built(model, config) -> Built | None:
    """The prompts `config` builds on this model, counted (None where they come from data, qa and retrieval, or
    the model has no tokenizer: an estimate's stand-in). Cached per model and the settings the prompts read."""
    if getattr(model, "tokenizer", None) is None or model.facts.is_encoder:
        return None
    from headscope.analyses.position import prompts
    from headscope.analyses.position.analysis import build_sweeps, sweep_kind

    kind = sweep_kind(model, config.sweep)
    if kind not in ("zoo_kv", "json_kv", "word_kv"):
        return None
    key = (kind, config.n_items, config.context, config.quick, config.n_examples, config.seed, config.positions,
           config.query_aware)
    cache = _BUILT.setdefault(model, {})
    if key not in cache:
        sweeps = build_sweeps(model, dataclasses.replace(config, sweep=kind))
        cache[key] = Built(n_items=sweeps[0].n_items, prompt_tokens=max(sw.prompt_len for sw in sweeps),
                           answer_tokens=max(sw.answer_ids.numel() for sw in sweeps),
                           total_tokens=prompts.sweep_tokens(sweeps))
    return cache[key]


def prompts_fit(model, task, config) -> bool:
    """Whether the prompts of `config` fit the model's context (answer and greedy decoding included); True
    where they are not built here (budget.fit's check: a knob's cut that fails it is not taken)."""
    b = built(model, config)
    return b is None or b.total_tokens <= int(model.facts.n_ctx)


def estimate(model, task, config) -> Cost:
    n = n_rows(None, config, FULL, QUICK)
    positions = len(config.positions) if config.positions else 5
    runs = 1 + (2 if config.window != 0 else 0)
    parts = {"sweeps": n * (positions * runs + 1)}  # + each example's no-gold prompt, run once without masks
    steps = decode_steps(model, config)
    if steps:  # a prefill, then one-token steps
        parts["generation"] = n * (positions + 1) * (1 + steps * STEP_POSITIONS / _n_pos(model, config))
    return Cost(parts=parts, n_pos=_n_pos(model, config))


def decode_steps(model, config) -> int:
    """Greedy decoding's steps per row (runs.greedy_contains: the answer and 8 more tokens), 0 when it
    does not run: an answer of one token (zoo prompts) unless `generate` asks; json_kv's answers are
    Liu et al.'s UUID values, counted on this tokenizer; other sweeps' answers counted as 8 tokens."""
    if model.facts.is_encoder or config.generate is False:
        return 0
    from headscope.analyses.position import prompts
    from headscope.analyses.position.analysis import sweep_kind

    b = built(model, config)
    kind = sweep_kind(model, config.sweep)
    answer = b.answer_tokens if b is not None else {"zoo_kv": 1, "json_kv": None}.get(kind, 8)
    if answer is None:
        _, value = prompts.kv_records(np.random.default_rng(0), 1)[0]  # a UUID value, as the prompts' answers
        answer = len(prompts.encode(model.tokenizer, value))
    return answer + 8 if (answer > 1 or config.generate) else 0


def _n_pos(model, config) -> int:
    """A prompt's tokens: the longest the run builds, or an upper bound (see the module doc)."""
    b = built(model, config)
    if b is not None:
        return b.prompt_tokens
    if config.context is not None and config.n_items is None:  # prompts filled to `context` tokens
        return max(16, min(int(model.facts.n_ctx), config.context))
    full = min(int(model.facts.n_ctx), 2048)
    items = config.n_items or _max_items(config)
    return max(16, round(full * min(1.0, items / _max_items(config))))


def no_masked_runs(config, model):
    return dataclasses.replace(config, window=0) if config.window != 0 else None


def fewer_items(config, model):
    if config.context is not None and config.n_items is None:  # half the prompt length
        return dataclasses.replace(config, context=config.context // 2) if config.context // 2 >= 256 else None
    if model.facts.is_encoder and config.n_items is None:  # every record's own sentences, a count the cost model does
        return None  # not read: a cut past a record's distractors would be refused (records.retrieval_sweeps)
    b = built(model, config)  # the pairs the prompts have (a fitted run's may be fewer than the maximum)
    items = b.n_items if b is not None else config.n_items or _max_items(config)
    # halved, down to MIN_ITEMS: a first, middle and last slot
    return dataclasses.replace(config, n_items=max(MIN_ITEMS, items // 2)) if items > MIN_ITEMS else None


def fewer_examples(config, model):
    n = config.examples(FULL, QUICK)
    return dataclasses.replace(config, n_examples=max(MIN_EXAMPLES, n // 2)) if n > MIN_EXAMPLES else None


def fewer_positions(config, model):
    """Gold at the first, middle and last slot only (once the pairs are set)."""
    if config.n_items is None or (config.positions is not None and len(config.positions) <= 3):
        return None
    n = config.n_items
    return dataclasses.replace(config, positions=tuple(sorted({1, (n + 1) // 2, n})))


def no_generation(config, model):
    return dataclasses.replace(config, generate=False) if config.generate is not False else None


COST = CostModel(estimate=estimate, knobs=(no_masked_runs, fewer_items, fewer_examples, fewer_positions, no_generation),
                 check=prompts_fit)
