"""Held-out accuracy of a zoo model on each task, computed with the Hugging Face model directly.

    kv         8 pairs (by default), argmax at the query == the queried value
    induction  sequences of 24 tokens repeated; per-token accuracy over the second half
               (every token after the first, which is the only one not predictable by copying)
    facts      argmax == the object
    ioi        argmax == the indirect object, on name pairs never used in training
Argmax is over the whole vocabulary. Examples come from fresh generators seeded by `seed`.
"""
from __future__ import annotations

import numpy as np
import torch

from headscope.models.zoo import batches, data, vocab

TARGETS: dict[str, float] = {"kv": 0.90, "induction": 0.95, "facts": 0.90, "ioi": 0.95}
EVAL_SEED = 1_000_003
INDUCTION_LENGTH = 24


@torch.no_grad()
def _last_token_accuracy(model, exs: list[data.Example], chunk: int = 256) -> float:
    correct = 0
    for start in range(0, len(exs), chunk):
        part = exs[start : start + chunk]
        tokens = torch.tensor([vocab.ids(e.prompt) for e in part])  # [batch, pos]
        answers = torch.tensor(vocab.ids([e.answer for e in part]))  # [batch]
        logits = model(input_ids=tokens).logits[:, -1]  # [batch, vocab]
        correct += int((logits.argmax(-1) == answers).sum())
    return correct / len(exs)


@torch.no_grad()
def induction_accuracy(model, *, n: int, seed: int, length: int = INDUCTION_LENGTH) -> float:
    """Per-token accuracy over the second half of n repeated random sequences."""
    rng = np.random.default_rng([seed, data.TASKS.index("induction"), length])
    b = batches.induction_batch(rng, batch=n, len_min=length, len_max=length)
    logits = model(input_ids=b.tokens).logits  # [batch, pos, vocab]
    mask = b.targets != batches.IGNORE  # [batch, pos]
    return float((logits.argmax(-1)[mask] == b.targets[mask]).float().mean())


def task_accuracy(model, task: str, *, n: int = 1000, seed: int = EVAL_SEED, n_pairs: int = 8) -> float:
    """Held-out accuracy of `model` (a HF causal LM on the zoo vocabulary) on one task."""
    was_training = model.training
    model.eval()
    try:
        if task == "induction":
            return induction_accuracy(model, n=n, seed=seed)
        kw = {"kv": {"n_pairs": n_pairs}, "ioi": {"split": "eval"}}.get(task, {})
        return _last_token_accuracy(model, list(data.examples(task, n, seed=seed, **kw)))
    finally:
        model.train(was_training)


def evaluate(model, *, n: int = 1000, seed: int = EVAL_SEED) -> dict[str, float]:
    """Accuracy on the four tasks (the card's headline numbers)."""
    return {task: task_accuracy(model, task, n=n, seed=seed) for task in data.TASKS}


def kv_by_pairs(model, *, n: int = 500, seed: int = EVAL_SEED, pairs=(4, 8, 16, 24)) -> dict[str, float]:
    """kv accuracy as the number of pairs grows (context for the position analyses)."""
    return {f"kv_{p}": task_accuracy(model, "kv", n=n, seed=seed, n_pairs=p) for p in pairs}
