"""What the position analysis costs (analyses/core/budget.py), and its sweeps in the order they give way.

Its own prompts: Liu et al.'s key-value task fitted to the context window (as many pairs as fit,
at most 20, 10 when quick), so a prompt is about min(n_ctx, 2048) tokens, scaled down by n_items
when set below that maximum (with `context`, prompts of that many tokens, halved by the pairs
knob; zoo and retrieval prompts are shorter: an upper bound). One row per example and gold
position (5 by default), each run plainly and, with a window, under two StreamingLLM masks (3 row
passes), plus, where a several-token answer is decoded greedily on decoders, a prefill and
one-token steps (each STEP_POSITIONS positions of a pass). Knobs, in order: the masked runs
(window 0), half the pairs down to 3 (shorter prompts), the examples down to 4, the gold at the first,
middle and last slots only, the greedy decoding.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from headscope.analyses.core.budget import STEP_POSITIONS, Cost, CostModel, n_rows

FULL, QUICK = 32, 8
MIN_EXAMPLES = 4


MIN_ITEMS = 3  # the pairs knob stops here: gold at the first, middle and last slot still differ


def _max_items(config) -> int:
    return 10 if config.quick else 20


def estimate(model, task, config) -> Cost:
    n = n_rows(None, config, FULL, QUICK)
    positions = len(config.positions) if config.positions else 5
    runs = 1 + (2 if config.window != 0 else 0)
    parts = {"sweeps": n * positions * runs}
    steps = decode_steps(model, config)
    if steps:  # a prefill, then one-token steps
        parts["generation"] = n * positions * (1 + steps * STEP_POSITIONS / _n_pos(model, config))
    return Cost(parts=parts, n_pos=_n_pos(model, config))


def decode_steps(model, config) -> int:
    """Greedy decoding's steps per row (runs.greedy_contains: the answer and 8 more tokens), 0 when it
    does not run: an answer of one token (zoo prompts) unless `generate` asks; json_kv's answers are
    Liu et al.'s UUID values, counted on this tokenizer; other sweeps' answers counted as 8 tokens."""
    if model.facts.is_encoder or config.generate is False:
        return 0
    from headscope.analyses.position import prompts
    from headscope.analyses.position.analysis import sweep_kind

    kind = sweep_kind(model, config.sweep)
    answer = {"zoo_kv": 1, "json_kv": None}.get(kind, 8)
    if answer is None:
        _, value = prompts.kv_records(np.random.default_rng(0), 1)[0]  # a UUID value, as the prompts' answers
        answer = len(prompts.encode(model.tokenizer, value))
    return answer + 8 if (answer > 1 or config.generate) else 0


def _n_pos(model, config) -> int:
    """A prompt's tokens (an upper bound; see the module doc)."""
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
    items = config.n_items or _max_items(config)  # halved, down to MIN_ITEMS: a first, middle and last slot
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


COST = CostModel(estimate=estimate, knobs=(no_masked_runs, fewer_items, fewer_examples, fewer_positions, no_generation))
