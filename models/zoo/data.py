"""Seeded generators for the zoo's four synthetic tasks, in words.

Each task yields `Example`s: a prompt that starts with <bos> and ends where the answer is to be
predicted, the answer, a corrupted prompt of the same length whose answer differs, that answer,
and half-open token spans. Everything is a deterministic function of a numpy Generator, so a
seed fixes the data. The fact table is a function of FACTS_SEED only, so training and
evaluation see the same facts.

    kv         <bos> k17 v03 ; k44 v17 ; ... ; k44          -> v17   (queried pair uniform)
    induction  <bos> t1 .. tL t1 .. tj                       -> t(j+1)
    facts      <bos> bal ado lives_in                        -> paris (never in context)
    ioi        <bos> when Mary and John went to the shop , John gave a book to -> Mary

Training batches (dense supervision, several answers per sequence) are built in `batches.py`.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import combinations

import numpy as np

from headscope.errors import ConfigError
from headscope.models.zoo import vocab

TASKS: tuple[str, ...] = ("kv", "induction", "facts", "ioi")
FACTS_SEED = 20240611
N_SUBJECTS = 100
IOI_HELDOUT_FRACTION = 0.2
IOI_SPLIT_SEED = 7

# Seven templates of 14 words; "A" and "B" are the first mentions, "S" the repeated name.
IOI_TEMPLATES: tuple[str, ...] = (
    "when A and B went to the shop , S gave a book to",
    "after A and B went to the park , S handed a ball to",
    "while A and B were at the school , S gave a pen to",
    "then A and B met at the market , S sent a letter to",
    "once A and B sat in the garden , S threw a ball to",
    "as A and B walked to the station , S passed a map to",
    "A and B went to school . later , S gave a kite to",
)


@dataclass(frozen=True, kw_only=True)
class Example:
    """One prompt with its answer and a same-length corrupted counterpart (all in words)."""

    task: str
    prompt: tuple[str, ...]
    answer: str
    corrupted: tuple[str, ...]
    corrupted_answer: str
    spans: Mapping[str, tuple[int, int]] = field(default_factory=dict)


# ---------------------------------------------------------------------------------- kv
def kv_example(rng: np.random.Generator, *, n_pairs: int = 8, query: int | None = None) -> Example:
    """n_pairs distinct keys with distinct values, then one queried key (position uniform)."""
    if not 2 <= n_pairs <= min(vocab.N_KEYS, vocab.N_VALUES):
        raise ConfigError(f"n_pairs must be in [2, {vocab.N_KEYS}], got {n_pairs}")
    keys = rng.choice(vocab.N_KEYS, size=n_pairs, replace=False)
    values = rng.choice(vocab.N_VALUES, size=n_pairs, replace=False)
    q = int(rng.integers(n_pairs)) if query is None else query
    words = [vocab.BOS]
    for k, v in zip(keys, values):
        words += [vocab.KEYS[k], vocab.VALUES[v], vocab.SEP]
    other = int(rng.integers(n_pairs - 1))
    q_corrupt = other + (other >= q)  # another pair of the same context
    prompt = (*words, vocab.KEYS[keys[q]])
    corrupted = (*words, vocab.KEYS[keys[q_corrupt]])
    return Example(
        task="kv",
        prompt=prompt,
        answer=vocab.VALUES[values[q]],
        corrupted=corrupted,
        corrupted_answer=vocab.VALUES[values[q_corrupt]],
        spans={
            "gold": (1 + 3 * q, 3 + 3 * q),  # the queried pair: key and value
            "pairs": (1, 1 + 3 * n_pairs),
            "query": (len(prompt) - 1, len(prompt)),
        },
    )


# --------------------------------------------------------------------------- induction
def induction_example(
    rng: np.random.Generator, *, length: int = 24, position: int | None = None, corrupt: str = "copied"
) -> Example:
    """A random sequence of `length` distinct tokens, then its first `position` tokens again.

    The answer is token `position` of the sequence. corrupt="copied" (the default) changes that
    token in the first half, so copying gives a different answer (the corrupted answer): the
    induction head's value path carries the difference. corrupt="trigger" changes the token before
    it in the first half (the one the prompt ends with), so nothing in the context matches the
    query: the previous-token head -> induction head key path carries the difference; the wrong
    answer is then the token after the answer in the first half (copying one step too far).
    """
    pool = vocab.INDUCTION_POOL
    if not 2 <= length <= len(pool) - 1:
        raise ConfigError(f"length must be in [2, {len(pool) - 1}], got {length}")
    if corrupt not in ("copied", "trigger"):
        raise ConfigError(f"corrupt must be 'copied' or 'trigger', got {corrupt!r}")
    j = int(rng.integers(1, length)) if position is None else position
    if not 1 <= j < length:
        raise ConfigError(f"position must be in [1, {length - 1}], got {j}")
    idx = rng.choice(len(pool), size=length + 1, replace=False)  # last one: the corruption
    seq = [pool[i] for i in idx[:length]]
    replacement = pool[idx[length]]
    prompt = (vocab.BOS, *seq, *seq[:j])
    first = [*seq]
    first[j if corrupt == "copied" else j - 1] = replacement
    corrupted = (vocab.BOS, *first, *seq[:j])
    return Example(
        task="induction",
        prompt=prompt,
        answer=seq[j],
        corrupted=corrupted,
        corrupted_answer=replacement if corrupt == "copied" else seq[(j + 1) % length],
        spans={
            "source": (1 + j, 2 + j),  # the token to be copied
            "first": (1, 1 + length),
            "repeat": (1 + length, 1 + length + j),
        },
    )


# ------------------------------------------------------------------------------- facts
@dataclass(frozen=True, kw_only=True)
class FactTable:
    """subjects[i] is a (first, second) syllable pair; objects[i][relation] its object."""

    subjects: tuple[tuple[str, str], ...]
    objects: tuple[Mapping[str, str], ...]


@lru_cache(maxsize=1)
def fact_table() -> FactTable:
    """The zoo's facts: N_SUBJECTS two-token subjects x 3 relations, fixed by FACTS_SEED."""
    rng = np.random.default_rng(FACTS_SEED)
    combos = [(a, b) for a in vocab.SUBJECT_FIRST for b in vocab.SUBJECT_SECOND]
    chosen = sorted(rng.choice(len(combos), size=N_SUBJECTS, replace=False))
    subjects = tuple(combos[i] for i in chosen)
    objects = tuple(
        {rel: vocab.OBJECTS[rel][int(rng.integers(len(vocab.OBJECTS[rel])))] for rel in vocab.RELATIONS}
        for _ in subjects
    )
    return FactTable(subjects=subjects, objects=objects)


def facts_example(rng: np.random.Generator) -> Example:
    """A subject and a relation; the answer (the object) is recalled from the weights."""
    table = fact_table()
    s = int(rng.integers(len(table.subjects)))
    rel = vocab.RELATIONS[int(rng.integers(len(vocab.RELATIONS)))]
    answer = table.objects[s][rel]
    candidates = [i for i, objs in enumerate(table.objects) if objs[rel] != answer]
    s2 = candidates[int(rng.integers(len(candidates)))]
    return Example(
        task="facts",
        prompt=(vocab.BOS, *table.subjects[s], rel),
        answer=answer,
        corrupted=(vocab.BOS, *table.subjects[s2], rel),
        corrupted_answer=table.objects[s2][rel],
        spans={"subject": (1, 3), "relation": (3, 4)},
    )


# --------------------------------------------------------------------------------- ioi
@lru_cache(maxsize=1)
def ioi_name_pairs() -> dict[str, tuple[tuple[str, str], ...]]:
    """Unordered name pairs split into "train" and held-out "eval" (fixed by IOI_SPLIT_SEED)."""
    pairs = list(combinations(vocab.NAMES, 2))
    rng = np.random.default_rng(IOI_SPLIT_SEED)
    order = rng.permutation(len(pairs))
    n_eval = int(round(IOI_HELDOUT_FRACTION * len(pairs)))
    eval_idx = set(order[:n_eval].tolist())
    return {
        "train": tuple(p for i, p in enumerate(pairs) if i not in eval_idx),
        "eval": tuple(p for i, p in enumerate(pairs) if i in eval_idx),
    }


def ioi_example(
    rng: np.random.Generator, *, split: str = "eval", template: int | None = None
) -> Example:
    """Two names, one repeated (S); the answer is the other (IO). Both orders of first mention.

    The corrupted prompt repeats IO instead of S, so its answer is S (same length).
    `split` picks name pairs never seen in training ("eval") or the training pairs ("train").
    """
    pairs = ioi_name_pairs()[split]
    a, b = pairs[int(rng.integers(len(pairs)))]
    io, s = (a, b) if rng.integers(2) == 0 else (b, a)
    io_first = bool(rng.integers(2))
    t = int(rng.integers(len(IOI_TEMPLATES))) if template is None else template
    words = IOI_TEMPLATES[t].split()
    first, second = (io, s) if io_first else (s, io)
    pos_a, pos_b, pos_s = (1 + words.index(x) for x in ("A", "B", "S"))

    def fill(repeated: str) -> tuple[str, ...]:
        swap = {"A": first, "B": second, "S": repeated}
        return (vocab.BOS, *(swap.get(w, w) for w in words))

    prompt = fill(s)
    return Example(
        task="ioi",
        prompt=prompt,
        answer=io,
        corrupted=fill(io),
        corrupted_answer=s,
        spans={
            "names": (pos_a, pos_b + 1),
            "io": (pos_a, pos_a + 1) if io_first else (pos_b, pos_b + 1),
            "s1": (pos_b, pos_b + 1) if io_first else (pos_a, pos_a + 1),
            "s2": (pos_s, pos_s + 1),
        },
    )


# ----------------------------------------------------------------------------- dispatch
def examples(task: str, n: int, *, seed: int, **kw) -> Iterator[Example]:
    """n examples of `task` from a fresh Generator seeded by (seed, task)."""
    makers = {"kv": kv_example, "induction": induction_example, "facts": facts_example, "ioi": ioi_example}
    if task not in makers:
        raise ConfigError(f"unknown zoo task {task!r}; valid tasks: {', '.join(TASKS)}")
    rng = np.random.default_rng([seed, TASKS.index(task)])
    for _ in range(n):
        yield makers[task](rng, **kw)
