"""Training batches for the zoo tasks: token ids with densely supervised next-token targets.

Dense supervision gives many answers per sequence, which is what makes the in-context tasks
learnable on a CPU budget:
    kv         n pairs, then several of them queried again ("k v ;" each); every queried value
               is a target. A repeated key followed by its value is exactly an induction
               pattern, so kv and induction train the same previous-token + induction circuit.
    induction  every token of the second half after its first is a target.
    facts      the object; ioi: the indirect object (training name pairs only).
Rows are right-padded with <pad>; padded and unsupervised positions have target -100.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from headscope.models.zoo import data, vocab

IGNORE = -100
_PAD = vocab.WORD_TO_ID[vocab.PAD]
_BOS = vocab.WORD_TO_ID[vocab.BOS]
_SEP = vocab.WORD_TO_ID[vocab.SEP]
_KEY_IDS = np.array(vocab.ids(vocab.KEYS))
_VALUE_IDS = np.array(vocab.ids(vocab.VALUES))
_POOL_IDS = np.array(vocab.ids(vocab.INDUCTION_POOL))


@dataclass(frozen=True, kw_only=True)
class Batch:
    tokens: torch.Tensor  # [batch, pos] int64
    targets: torch.Tensor  # [batch, pos] int64, IGNORE where unsupervised


def _pad(rows: list[tuple[list[int], list[int]]]) -> Batch:
    width = max(len(tok) for tok, _ in rows)
    tokens = np.full((len(rows), width), _PAD, dtype=np.int64)  # [batch, pos]
    targets = np.full((len(rows), width), IGNORE, dtype=np.int64)  # [batch, pos]
    for i, (tok, tgt) in enumerate(rows):
        tokens[i, : len(tok)] = tok
        targets[i, : len(tgt)] = tgt
    return Batch(tokens=torch.from_numpy(tokens), targets=torch.from_numpy(targets))


def kv_batch(
    rng: np.random.Generator, *, batch: int, n_min: int, n_max: int, n_queries: int
) -> Batch:
    """Rows of n ~ U[n_min, n_max] pairs, then min(n, n_queries) distinct pairs re-queried."""
    rows = []
    for _ in range(batch):
        n = int(rng.integers(n_min, n_max + 1))
        keys = _KEY_IDS[rng.choice(len(_KEY_IDS), size=n, replace=False)]
        values = _VALUE_IDS[rng.choice(len(_VALUE_IDS), size=n, replace=False)]
        tok = [_BOS]
        for k, v in zip(keys, values):
            tok += [int(k), int(v), _SEP]
        tgt = [IGNORE] * len(tok)
        for q in rng.choice(n, size=min(n, n_queries), replace=False):
            tok += [int(keys[q]), int(values[q]), _SEP]
            tgt += [int(values[q]), IGNORE, IGNORE]
        rows.append((tok[:-1], tgt[:-1]))
    return _pad(rows)


def induction_batch(
    rng: np.random.Generator, *, batch: int, len_min: int, len_max: int
) -> Batch:
    """Rows <bos> s s with s of L ~ U[len_min, len_max] distinct tokens; second half supervised."""
    rows = []
    for _ in range(batch):
        length = int(rng.integers(len_min, len_max + 1))
        seq = _POOL_IDS[rng.choice(len(_POOL_IDS), size=length, replace=False)].tolist()
        tok = [_BOS, *seq, *seq]
        tgt = [IGNORE] * (1 + length) + seq[1:] + [IGNORE]
        rows.append((tok, tgt))
    return _pad(rows)


def example_batch(rng: np.random.Generator, task: str, *, batch: int, **kw) -> Batch:
    """Rows of single `data` examples (facts, ioi), each supervised at its answer only."""
    maker = {"facts": data.facts_example, "ioi": data.ioi_example}[task]
    rows = []
    for _ in range(batch):
        ex = maker(rng, **kw)
        tok = vocab.ids(ex.prompt)
        tgt = [IGNORE] * (len(tok) - 1) + vocab.ids([ex.answer])
        rows.append((tok, tgt))
    return _pad(rows)
